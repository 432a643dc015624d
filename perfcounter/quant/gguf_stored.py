"""GGUF weights priced as stored: each tensor at its quant type's size, from gguf's own tables.

A GGUF file stores most weights in blocks (Q4_1: 32 weights in 20 bytes; Q8_0: 32 in
34; Q4_K: 256 in 144 ...). transformers dequantizes them on load, so the model that runs
holds float tensors, and counted as it runs a GGUF is priced at that float dtype (the
built-in SmolLM2-135M Q4_1 file: 538 MB in float32 for 96.6 MB stored). `price_as`:
- "stored" (the default for a GGUF): every weight of an nn.Linear or nn.Embedding is priced
  at its GGUF tensor's bytes — block count · bytes per block, both read from the gguf
  package's `GGML_QUANT_SIZES` — through subclass_linear.py (one op per layer call: a
  linear reads its weight's stored bytes, an embedding its rows' share). Weights of other
  modules (norms) keep the bytes of the dtype they run in;
- "executed": the dequantized model as it runs (every weight at its float dtype).
FLOPs are the same either way: the matmul runs at the activation dtype.

`annotate(model, path, layout)` marks a loaded model's weights ("ours": perfcounter's
Transformer as loading.py converts a GGUF, q/k/v fused into wqkv; "hf": transformers'
model, names mapped to GGUF's by gguf's own `get_tensor_name_map`).
`config_only.count_gguf` counts a GGUF from its metadata alone (FakeTensorMode), as
`perfcounter count --config FILE.gguf` does. The gguf package is imported only here, only when a GGUF is read.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from perfcounter._util import did_you_mean
from perfcounter.quant.stored import STORED, set_stored_nbytes

PRICE_AS = ("stored", "executed")

# perfcounter's Transformer (loading.py's layout) by gguf tensor kind: MODEL_TENSOR name ->
# our parameter prefix; q, k and v are concatenated into one wqkv
_OURS = {"TOKEN_EMBD": "tok_embeddings", "OUTPUT_NORM": "norm", "OUTPUT": "output",
         "ATTN_NORM": "layers.{bid}.attention_norm", "FFN_NORM": "layers.{bid}.ffn_norm",
         "ATTN_Q": "layers.{bid}.attention.wqkv", "ATTN_K": "layers.{bid}.attention.wqkv",
         "ATTN_V": "layers.{bid}.attention.wqkv", "ATTN_OUT": "layers.{bid}.attention.wo",
         "FFN_GATE": "layers.{bid}.feed_forward.w1", "FFN_UP": "layers.{bid}.feed_forward.w3",
         "FFN_DOWN": "layers.{bid}.feed_forward.w2", "FFN_GATE_INP": "layers.{bid}.feed_forward.gate"}


class GGUFTensor(NamedTuple):
    """One tensor of a GGUF file as stored."""
    name: str  # "blk.0.attn_q.weight"
    qtype: str  # "Q4_1"
    n_elements: int
    nbytes: int  # n_elements / block size · bytes per block


def check_price_as(value) -> str:
    """value itself when it is one of PRICE_AS; else a one-line ValueError."""
    if value not in PRICE_AS:
        raise ValueError(f"price_as {value!r} is not valid; valid: {', '.join(PRICE_AS)}"
                         f"{did_you_mean(str(value), PRICE_AS, n=1, quote=True)}")
    return value


def tensor_nbytes(qtype: str, n_elements: int) -> int:
    """Bytes of n_elements weights of GGUF type `qtype` ("Q4_1"), from gguf's block table:
    (n_elements / block size) blocks of `type size` bytes each."""
    import gguf  # deferred: optional (the gguf extra)
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    except KeyError:
        known = [t.name for t in gguf.GGML_QUANT_SIZES]
        raise ValueError(f"unknown GGUF quant type {qtype!r}; gguf {gguf.__name__} knows "
                         f"{', '.join(known)}") from None
    if n_elements % block:
        raise ValueError(f"{n_elements} weights of {qtype} do not fill whole blocks of {block}")
    return n_elements // block * type_size


def read_tensors(path) -> tuple[str, int, dict[str, GGUFTensor]]:
    """(architecture, block count, {tensor name: GGUFTensor}) of a GGUF file (its header
    only; the data stay on disk)."""
    import gguf  # deferred: optional (the gguf extra)
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    field = reader.fields.get(f"{arch}.block_count")
    blocks = int(field.contents()) if field is not None else 0
    tensors = {}
    for t in reader.tensors:
        n = int(t.n_elements)
        tensors[t.name] = GGUFTensor(t.name, t.tensor_type.name, n, tensor_nbytes(t.tensor_type.name, n))
    return arch, blocks, tensors


def _our_names(arch: str, blocks: int) -> dict[str, str]:
    """{GGUF tensor name: our parameter name} for perfcounter's Transformer."""
    import gguf  # deferred: optional (the gguf extra)
    out = {}
    for kind, ours in _OURS.items():
        fmt = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]]
        for bid in range(blocks if "{bid}" in fmt else 1):
            for suffix in (".weight", ".bias"):
                out[fmt.format(bid=bid) + suffix] = ours.format(bid=bid) + suffix
    return out


def _hf_names(arch: str, blocks: int, names) -> dict[str, str]:
    """{GGUF tensor name: transformers parameter name} through gguf's own name map."""
    import gguf  # deferred: optional (the gguf extra)
    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        return {}
    table = gguf.get_tensor_name_map(by_name[arch], blocks)
    out = {}
    for name in names:
        found = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if found is not None:
            out.setdefault(found, name)
    return out


def annotate(model: torch.nn.Module, path, layout: str = "ours") -> int:
    """Mark the weights of `model`'s nn.Linear and nn.Embedding layers with their stored
    bytes in the GGUF file at `path` (layout "ours" or "hf", see the module doc); returns
    how many weights were marked. Weights of layers the file has no tensor for are left
    at their float size."""
    if layout not in ("ours", "hf"):
        raise ValueError(f"layout {layout!r} is not valid; valid: ours, hf")
    params = dict(model.named_parameters(remove_duplicate=False))
    stored, to_ours, tensors = _stored_as_named(path, layout, params)
    stored = {name: nbytes for name, nbytes in stored.items() if name in params}
    if "output.weight" not in tensors:  # tied: the output layer is the embedding
        for ours in ("output.weight", "lm_head.weight"):
            emb = to_ours.get("token_embd.weight")
            if ours in params and emb in stored and params[ours] is params[emb]:
                stored[ours] = stored[emb]
    layers = (torch.nn.Linear, torch.nn.Embedding)
    weights = {id(m.weight) for m in model.modules() if isinstance(m, layers)}
    marked = 0
    for name, nbytes in stored.items():
        p = params[name]
        if id(p) in weights:
            set_stored_nbytes(p, nbytes)
            marked += 1
    return marked


def _stored_as_named(path, layout: str, params) -> tuple[dict, dict, dict]:
    """({our (or transformers') parameter name: its bytes in the file}, the name map, the
    file's tensors): q, k and v summed into our fused wqkv."""
    arch, blocks, tensors = read_tensors(path)
    to_ours = _our_names(arch, blocks) if layout == "ours" else _hf_names(arch, blocks, params)
    stored: dict[str, int] = {}
    for name, t in tensors.items():
        ours = to_ours.get(name)
        if ours is not None:
            stored[ours] = stored.get(ours, 0) + t.nbytes
    return stored, to_ours, tensors


def stored_weights(path) -> dict[str, int]:
    """{our Transformer's weight name: its bytes in the GGUF file at `path`} (biases left
    out: they run at the model's dtype, as annotate leaves them)."""
    stored = _stored_as_named(path, "ours", {})[0]
    return {name: nbytes for name, nbytes in stored.items() if name.endswith(".weight")}


def stored_summary(model: torch.nn.Module) -> tuple[int, int, int]:
    """(weights marked, their stored bytes, their bytes as the model runs them)."""
    seen, n, stored, executed = set(), 0, 0, 0
    for p in model.parameters():
        if id(p) not in seen and p in STORED:
            seen.add(id(p))
            n, stored, executed = n + 1, stored + STORED[p], executed + p.numel() * p.element_size()
    return n, stored, executed


def describe(model: torch.nn.Module, path, price_as: str) -> str:
    """One line on how a loaded GGUF's weights are priced: stored vs as run, in MB."""
    tensors = read_tensors(path)[2]
    stored = sum(t.nbytes for t in tensors.values())
    kinds = sorted({t.qtype for t in tensors.values()})
    seen, run = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            run += p.numel() * p.element_size()
    n = stored_summary(model)[0]
    how = (f"as stored ({n} layer weights at their GGUF bytes)" if price_as == "stored"
           else "as executed (dequantized)")
    return (f"GGUF weights ({', '.join(kinds)}) priced {how}: {stored / 1e6:.1f} MB stored, "
            f"{run / 1e6:.1f} MB as run (--price_as stored|executed)")
