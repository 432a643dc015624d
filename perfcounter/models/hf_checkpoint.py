"""Hugging Face checkpoints in our Transformer's terms: config.json -> ModelArgs, weights -> our names.

llama, mistral, qwen2 and mixtral configs are read (`model_args_from_hf`), with
what our Transformer cannot run refused by name; weights (one safetensors file,
sharded safetensors or pytorch_model.bin) are merged (`read_hf_weights`) and
converted (`convert_hf_state_dict`): q/k rows re-ordered from rotate-half to
gpt-fast's interleaved pairs, q/k/v fused into wqkv, experts stacked.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from perfcounter.models.args import ROPE_SCALING_KEYS, ModelArgs
from perfcounter.models.checkpoint_files import (CheckpointError, CheckpointNotFoundError,
                                                 read_json, read_pth, read_safetensors)

HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "mixtral")


# our ModelArgs field -> the Hugging Face config key it is read from (for error messages)
_HF_KEYS = {"block_size": "max_position_embeddings", "vocab_size": "vocab_size",
            "n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "dim": "hidden_size",
            "intermediate_size": "intermediate_size", "n_local_heads": "num_key_value_heads",
            "head_dim": "head_dim", "rope_base": "rope_theta", "norm_eps": "rms_norm_eps",
            "rope_scaling": "rope_scaling", "sliding_window": "sliding_window",
            "num_experts": "num_local_experts", "num_activated_experts": "num_experts_per_tok"}


def model_args_from_hf(cfg: dict, source) -> ModelArgs:
    """ModelArgs from a Hugging Face config (file or `config.to_dict()`)."""
    mtype = cfg.get("model_type")
    if mtype not in HF_MODEL_TYPES:
        raise CheckpointError(f"{source}: model_type {mtype!r} is not supported; "
                              f"supported: {', '.join(HF_MODEL_TYPES)}")

    def positive_int(key, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: {key!r} must be a positive integer, got {value!r}")
        return value

    def need(key):
        if cfg.get(key) is None:
            raise CheckpointError(f"{source}: missing {key!r}, expected in a {mtype} config.json")
        return positive_int(key, cfg[key])

    def optional(key):
        value = cfg.get(key)
        return None if value is None else positive_int(key, value)

    def unsupported(what):
        raise CheckpointError(f"{source}: {what} is not supported by perfcounter's Transformer")

    if cfg.get("hidden_act", "silu") != "silu":
        unsupported(f"hidden_act={cfg['hidden_act']!r} (only 'silu')")
    if cfg.get("mlp_bias"):
        unsupported("mlp_bias=true")
    if mtype == "llama" and cfg.get("attention_bias"):
        unsupported("attention_bias=true for llama (bias on o_proj)")
    if mtype == "qwen2" and cfg.get("use_sliding_window"):
        unsupported("use_sliding_window=true (per-layer windows)")
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise CheckpointError(f"{source}: {key!r} must be an object such as "
                                  f"{{\"rope_type\": \"llama3\", \"factor\": 8.0, ...}}, got "
                                  f"{type(cfg[key]).__name__} {cfg[key]!r:.40}")
    rope = cfg.get("rope_parameters") or {}  # transformers >= 5 keeps theta and scaling here
    scaling = cfg.get("rope_scaling") or rope
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "llama3":
        missing = [k for k in ROPE_SCALING_KEYS if k not in scaling]
        if missing:
            raise CheckpointError(f"{source}: the llama3 rope scaling block lacks "
                                  f"{', '.join(missing)}; it needs {', '.join(ROPE_SCALING_KEYS)}")
        rope_scaling = {k: scaling[k] for k in ROPE_SCALING_KEYS}
    elif rope_type == "default":
        rope_scaling = None
    else:
        unsupported(f"rope scaling {rope_type!r} (only 'llama3')")
    dim, n_head = need("hidden_size"), need("num_attention_heads")
    window = optional("sliding_window") if mtype in ("mistral", "mixtral") else None
    try:
        return ModelArgs(
            block_size=optional("max_position_embeddings") or 2048,
            vocab_size=need("vocab_size"), n_layer=need("num_hidden_layers"), n_head=n_head,
            dim=dim, intermediate_size=need("intermediate_size"),
            n_local_heads=optional("num_key_value_heads") or n_head,
            head_dim=optional("head_dim") or dim // n_head,
            rope_base=cfg.get("rope_theta", rope.get("rope_theta", 10000.0)),
            norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_scaling=rope_scaling,
            attention_bias=mtype == "qwen2",
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), sliding_window=window,
            num_experts=cfg.get("num_local_experts") or 0,
            num_activated_experts=cfg.get("num_experts_per_tok") or 0)
    except (TypeError, ValueError) as e:
        message = str(e)
        for ours, theirs in _HF_KEYS.items():  # name the config's keys, not ours
            message = message.replace(f"ModelArgs.{ours} ", f"{theirs!r} ")
        raise CheckpointError(f"{source}: {message}") from None


INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def hf_weight_files(folder: Path) -> list[Path]:
    """The files holding a Hugging Face folder's tensors, found without reading any: an
    index's shards (each named inside the folder and present), else the one weights file."""
    for index_name in INDEXES:
        index = folder / index_name
        if index.is_file():
            weight_map = read_json(index).get("weight_map", {})
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: 'weight_map' must be a non-empty "
                                      "object of tensor name -> shard file name")
            files = [folder / _shard_name(s, index) for s in sorted(set(map(str, weight_map.values())))]
            for file in files:
                if not file.is_file():
                    raise CheckpointNotFoundError(f"{file}: no such file (a shard {index_name} "
                                                  "names)")
            return files
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise CheckpointNotFoundError(f"{folder}: no weights; expected model.safetensors, "
                                  "model.safetensors.index.json or pytorch_model.bin")


def read_hf_weights(folder: Path) -> dict:
    """All tensors of a Hugging Face model folder, shards merged."""
    state = {}
    for file in hf_weight_files(folder):
        state.update(read_safetensors(file)[0] if file.suffix == ".safetensors"
                     else read_pth(file))
    return state


def _shard_name(shard: str, index: Path) -> str:
    """A shard's file name as the index gives it, refused when it leaves the folder
    (an absolute path, '..'); a shard may still be a symlink, as in the Hub's cache."""
    parts = Path(shard).parts
    if not parts or Path(shard).is_absolute() or ".." in parts or "\\" in shard:
        raise CheckpointError(f"{index}: shard {shard!r} is outside the model folder; the "
                              "'weight_map' must name files in the folder itself")
    return shard


def _interleave(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    # rows per head [2, D/2] (rotate-half halves) -> [D/2, 2] (adjacent pairs); weight or bias
    return w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


_HF_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_HF_RENAMES = {"self_attn.o_proj.weight": "attention.wo.weight",
               "mlp.gate_proj.weight": "feed_forward.w1.weight",
               "mlp.up_proj.weight": "feed_forward.w3.weight",
               "mlp.down_proj.weight": "feed_forward.w2.weight",
               "input_layernorm.weight": "attention_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "block_sparse_moe.gate.weight": "feed_forward.gate.weight",
               "mlp.gate.weight": "feed_forward.gate.weight"}


def convert_hf_state_dict(hf: dict, args: ModelArgs, source) -> dict:
    """A Hugging Face Llama-family state dict in our Transformer's names and layout."""
    hf = {k.removeprefix("model."): v for k, v in hf.items() if "rotary_emb" not in k}
    out = {"tok_embeddings.weight": hf.pop("embed_tokens.weight", None),
           "norm.weight": hf.pop("norm.weight", None)}
    if "lm_head.weight" in hf:
        out["output.weight"] = hf.pop("lm_head.weight")
    layers: dict[int, dict] = {}
    for key in list(hf):
        m = _HF_LAYER.fullmatch(key)
        if m:
            layers.setdefault(int(m[1]), {})[m[2]] = hf.pop(key)
    if hf:
        raise CheckpointError(f"{source}: unexpected tensors {sorted(hf)[:4]} for {args!r}")
    for i, t in sorted(layers.items()):
        try:
            _convert_layer(out, f"layers.{i}.", t, args, source)
        except RuntimeError as e:  # tensors that cannot be stacked or split as the config says
            raise CheckpointError(f"{source}: the tensors of layer {i} do not fit {args!r} "
                                  f"({e})") from None
    return {k: v for k, v in out.items() if v is not None}


def _convert_layer(out: dict, p: str, t: dict, args: ModelArgs, source) -> None:
    """One Hugging Face layer's tensors `t` into `out` under prefix `p`, in our layout."""
    hd = args.head_dim
    for kind in ("weight", "bias"):
        q, k, v = (t.pop(f"self_attn.{x}_proj.{kind}", None) for x in "qkv")
        if q is not None and k is not None and v is not None:
            for x, w, heads in (("q", q, args.n_head), ("k", k, args.n_local_heads),
                                ("v", v, args.n_local_heads)):
                want = (heads * hd, args.dim) if kind == "weight" else (heads * hd,)
                if tuple(w.shape) != want:
                    raise CheckpointError(
                        f"{source}: {p}self_attn.{x}_proj.{kind} has shape {tuple(w.shape)}, "
                        f"the config says {want} ({heads} heads of {hd}, hidden size "
                        f"{args.dim})")
            out[p + f"attention.wqkv.{kind}"] = torch.cat(
                [_interleave(q, args.n_head, hd), _interleave(k, args.n_local_heads, hd), v])
    if "mlp.experts.gate_up_proj" in t:  # transformers >= 5 in memory: [E, 2I, dim]
        out[p + "feed_forward.cond_ffn.w1"], out[p + "feed_forward.cond_ffn.w3"] = (
            w.contiguous() for w in t.pop("mlp.experts.gate_up_proj").chunk(2, dim=1))
        out[p + "feed_forward.cond_ffn.w2"] = t.pop("mlp.experts.down_proj")
    for w in ("w1", "w2", "w3"):  # files: one tensor per expert
        names = [f"block_sparse_moe.experts.{e}.{w}.weight" for e in range(args.num_experts)]
        if names and all(n in t for n in names):
            out[p + f"feed_forward.cond_ffn.{w}"] = torch.stack([t.pop(n) for n in names])
    for name in list(t):
        if name in _HF_RENAMES:
            out[p + _HF_RENAMES[name]] = t.pop(name)
    if t:
        raise CheckpointError(f"{source}: unexpected tensors {[p + n for n in sorted(t)][:4]} "
                              f"for {args!r}")
