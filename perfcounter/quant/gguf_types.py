"""A model priced as if stored in a llama.cpp GGUF file of a given file type, config only.

    count_config("llama-2-7b", gguf_type="Q4_K_M")      # priced as llama.cpp's Q4_K_M file
    perfcounter count --model llama-2-7b --gguf_type Q4_K_M --device_spec rtx-4090

A GGUF "file type" (llama.cpp's `llama-quantize` argument: Q4_0, Q4_K_M, ...) is not one
type for every tensor: llama.cpp picks each tensor's type by its role and layer
(`llama_tensor_get_type`, src/llama-quant.cpp). `tensor_types` follows those rules for
perfcounter's Transformer (dense: llama, mistral, qwen2 shapes):
- every weight of a linear or the embedding at the file type's base type (Q4_0 for Q4_0,
  Q4_K for Q4_K_S and Q4_K_M, ...);
- the output projection (or, tied, the embedding it shares) at Q6_K, unless the base is Q8_0
  or its rows are no multiple of 256 (Q8_0 then);
- Q4_K_M and Q5_K_M: attn_v and ffn_down at Q6_K in the layers `more_bits` names (the first
  and last eighth, and every third layer between: half the layers of Llama-2-7B);
- Q4_K_S: attn_v in the first 4 layers and ffn_down in the first eighth at Q5_K;
- an 80-layer model with grouped KV heads (llama.cpp's 70B type): attn_v at Q5_K where it
  would be Q4_K;
- a K-quant (256-weight super-blocks) on a tensor whose rows are no multiple of 256 falls
  back to a 32-weight block type (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), or F16 where
  32 does not divide them either.
Each weight is then priced at its tensor's stored bytes (gguf_stored.tensor_nbytes: gguf's
own block table) through the stored-bytes path a loaded GGUF uses (gguf_stored.annotate),
q, k and v summed into our fused wqkv. FLOPs, norms and biases are unchanged: the model runs
at its float dtype. Checked against a llama.cpp file (the built-in SmolLM2 Q4_1: every
tensor's type and bytes) and published sizes (tests/test_gguf_types.py). Mixture-of-experts
models are refused (their rules differ, and our experts are not per-expert linears).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from perfcounter._util import did_you_mean
from perfcounter.quant.gguf_stored import stored_weights, tensor_nbytes
from perfcounter.quant.stored import set_stored_nbytes

# file type -> (base type, the more-bits type for attn_v / ffn_down, or None)
FILE_TYPES = {"Q4_0": ("Q4_0", None), "Q4_1": ("Q4_1", None), "Q5_0": ("Q5_0", None),
              "Q5_1": ("Q5_1", None), "Q8_0": ("Q8_0", None), "Q4_K_S": ("Q4_K", None),
              "Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_S": ("Q5_K", None), "Q5_K_M": ("Q5_K", "Q6_K"),
              "Q6_K": ("Q6_K", None)}
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # rows not a multiple of 256
SUPER_BLOCK = 256  # a K-quant's weights per super-block
_LAYER_ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def check_file_type(value) -> str:
    """The file type named (any case: "q4_k_m" -> "Q4_K_M"); else a one-line ValueError."""
    key = str(value).strip().upper()
    if key not in FILE_TYPES:
        raise ValueError(f"gguf_type {value!r} is not valid; valid: {', '.join(FILE_TYPES)}"
                         f"{did_you_mean(key, FILE_TYPES, n=1, quote=True)}")
    return key


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
    layer between them."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _fits(qtype: str, row: int) -> str:
    """qtype, or llama.cpp's fallback where a row of `row` weights does not fill its blocks: a
    K-quant's 32-weight type, F16 where that does not fit either."""
    if not qtype.endswith("K") or row % SUPER_BLOCK == 0:
        if row % 32:
            raise ValueError(f"rows of {row} weights do not fill {qtype}'s blocks of 32")
        return qtype
    return _K_FALLBACK[qtype] if row % 32 == 0 else "F16"


def tensor_types(args, file_type: str) -> dict[str, str]:
    """{GGUF role ("output", "token_embd", "blk.{i}.attn_v", ...): its type} for our
    Transformer's `args` (models.args.ModelArgs) stored as `file_type`."""
    file_type = check_file_type(file_type)
    if args.num_experts:
        raise ValueError(f"gguf_type prices dense models; this one routes over "
                         f"{args.num_experts} experts")
    base, more = FILE_TYPES[file_type]
    n, dim = args.n_layer, args.dim
    out = "Q8_0" if base == "Q8_0" or dim % SUPER_BLOCK else "Q6_K"
    types = {"output": out, "token_embd": out if args.tie_embeddings else _fits(base, dim)}
    seventy_b = n == 80 and args.n_local_heads != args.n_head
    for i in range(n):
        v = down = base
        if more and more_bits(i, n):
            v = down = more
        if file_type == "Q4_K_S":
            v = "Q5_K" if i < 4 else base
            down = "Q5_K" if i < n // 8 else base
        if seventy_b and v == "Q4_K":
            v = "Q5_K"
        rows_in = {"attn_q": dim, "attn_k": dim, "attn_v": dim, "ffn_gate": dim, "ffn_up": dim,
                   "attn_output": args.n_head * args.head_dim,
                   "ffn_down": args.intermediate_size}
        chosen = {"attn_v": v, "ffn_down": down}
        for role, row in rows_in.items():
            types[f"blk.{i}.{role}"] = _fits(chosen.get(role, base), row)
    return types


def _weights(args) -> dict[str, list[tuple[str, int]]]:
    """{our parameter name: [(its GGUF role, weights)]}: q, k and v make our fused wqkv."""
    q, kv = args.n_head * args.head_dim, args.n_local_heads * args.head_dim
    dim, hidden = args.dim, args.intermediate_size
    out = {}
    for i in range(args.n_layer):
        at, ff = f"layers.{i}.attention", f"layers.{i}.feed_forward"
        out[f"{at}.wqkv.weight"] = [(f"blk.{i}.attn_q", q * dim), (f"blk.{i}.attn_k", kv * dim),
                                    (f"blk.{i}.attn_v", kv * dim)]
        out[f"{at}.wo.weight"] = [(f"blk.{i}.attn_output", dim * q)]
        out[f"{ff}.w1.weight"] = [(f"blk.{i}.ffn_gate", hidden * dim)]
        out[f"{ff}.w3.weight"] = [(f"blk.{i}.ffn_up", hidden * dim)]
        out[f"{ff}.w2.weight"] = [(f"blk.{i}.ffn_down", dim * hidden)]
    out["tok_embeddings.weight"] = [("token_embd", args.vocab_size * dim)]
    if not args.tie_embeddings:
        out["output.weight"] = [("output", args.vocab_size * dim)]
    return out


def file_params(args, stored) -> int:
    """The weights of the parameters named in `stored` (a file's linears and embedding, the
    output unless tied): the rest (norms, biases) stays at the model's dtype."""
    return sum(n for name, parts in _weights(args).items() if name in stored for _, n in parts)


def stored_bytes(args, file_type: str) -> dict[str, int]:
    """{our parameter name: its bytes as stored in a `file_type` GGUF} (module doc)."""
    types = tensor_types(args, file_type)
    return {name: sum(tensor_nbytes(types[role], n) for role, n in parts)
            for name, parts in _weights(args).items()}


def annotate_file_type(model: torch.nn.Module, args, file_type: str) -> int:
    """Mark our Transformer's linear and embedding weights with their bytes as stored in a
    `file_type` GGUF (module doc); returns the bytes marked."""
    return GgufFile.of_type(file_type, args).annotate(model, range(args.n_layer))


@dataclass(frozen=True, eq=False)
class GgufFile:
    """Our model `args` (models.args.ModelArgs) with its weights as stored in a llama.cpp GGUF
    (`stored`: our weight name -> bytes): a file type's, by llama.cpp's rules (of_type), or
    a file's own (of_file); what `perfcounter serve` counts its step tables with."""

    name: str  # the file type ("Q4_K_M") or the file's name: labels and cache keys show it
    args: object
    stored: dict

    @classmethod
    def of_type(cls, file_type: str, args) -> "GgufFile":
        return cls(file_type, args, stored_bytes(args, file_type))

    @classmethod
    def of_file(cls, path, args) -> "GgufFile":
        """A file's own tensors (gguf_stored.stored_weights), named after the file."""
        return cls(Path(path).name, args, stored_weights(path))

    def kinds(self) -> tuple[tuple[int, ...], ...]:
        """The model's layers grouped by their weights' bytes as stored, each group in layer
        order and the groups by their first layer (Q4_K_M on 32 layers: the 16 `more_bits`
        layers and the other 16; Q4_0: one group of every layer)."""
        groups: dict[tuple, list[int]] = {}
        for i in range(self.args.n_layer):
            at = f"layers.{i}."
            sig = tuple(sorted((k[len(at):], v) for k, v in self.stored.items()
                               if k.startswith(at)))
            groups.setdefault(sig, []).append(i)
        return tuple(tuple(g) for g in groups.values())

    def stored_as(self, generate):
        """`generate`, the whole model's weights first marked as this file stores them."""
        def as_stored(model, prompt, max_new_tokens, **kw):
            self.annotate(model, range(self.args.n_layer))
            return generate(model, prompt, max_new_tokens, **kw)
        return as_stored

    def layer_bytes(self, layer: int) -> int:
        """The stored bytes of the whole model's layer `layer`."""
        return sum(v for k, v in self.stored.items() if k.startswith(f"layers.{layer}."))

    def annotate(self, model: torch.nn.Module, layers) -> int:
        """Mark `model` (our Transformer of len(layers) layers) as stored: its layer j with the
        bytes of the whole model's layer layers[j], its embedding and output as the file stores
        them; returns the bytes marked."""
        params = dict(model.named_parameters(remove_duplicate=False))
        marks = {k: v for k, v in self.stored.items() if not k.startswith("layers.")}
        for j, i in enumerate(layers):
            marks.update({f"layers.{j}.{k.split('.', 2)[2]}": v for k, v in self.stored.items()
                          if k.startswith(f"layers.{i}.")})
        for name, nbytes in marks.items():
            set_stored_nbytes(params[name], nbytes)
        return sum(marks.values())


def check_gguf_type(resolved, gguf_type, *, hf=None, quantize=None) -> str:
    """The file type gguf_type names for our model `resolved` (models.args.ModelArgs), else
    a one-line ValueError (transformers' models, hf, beside a quantize scheme, MoE)."""
    if hf or not all(hasattr(resolved, a) for a in ("n_local_heads", "tie_embeddings")):
        raise ValueError("gguf_type prices perfcounter's own model: give a preset or our "
                         "ModelArgs without hf")
    if quantize is not None:
        raise ValueError(f"gguf_type {gguf_type} and quantize {getattr(quantize, 'name', quantize)}"
                         " both say how the weights are stored; give one of them")
    file_type = check_file_type(gguf_type)
    return tensor_types(resolved, file_type) and file_type  # a model it cannot store fails


def stored_as(args, gguf_type: str, generate):
    """`generate`, our model's weights first marked as stored in a `gguf_type` file."""
    return GgufFile.of_type(gguf_type, args).stored_as(generate)
