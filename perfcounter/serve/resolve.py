"""A deployment's inputs resolved before any work: the model (a preset, ModelArgs, a
config.json or a .gguf's metadata), the precision, the stored weights and KV cache, the
device spec, a mixture of experts' routing and a llama.cpp file's types; each refused in
one line (ServeError) naming the value and what is valid."""
from __future__ import annotations

from pathlib import Path

import torch

from perfcounter.counting.op_data import ExpertLoad
from perfcounter.devices import get_device_spec
from perfcounter.generation.config_only import gguf_config, resolve_config
from perfcounter.generation.run import PRECISIONS
from perfcounter.models.args import ModelArgs
from perfcounter.models.hf_checkpoint import model_args_from_hf
from perfcounter.models.loading import CheckpointError
from perfcounter.quant.gguf_types import GgufFile, check_gguf_type
from perfcounter.quant.quantize import WeightScheme, parse_kv_dtype, parse_scheme
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import OURS, HfArgs
from perfcounter.serve.memory import weight_bytes


def resolve_model(model) -> ModelArgs | HfArgs:
    """ModelArgs from a preset name, ModelArgs, a config.json (ours or one of an architecture
    perfcounter's model holds: hf_model.OURS) or a .gguf file's metadata; any other
    transformers causal LM (a preset, a config.json, a model folder) as an HfArgs."""
    if isinstance(model, HfArgs):
        return model
    try:
        resolved = gguf_config(model) if is_gguf(model) else resolve_config(model)
    except (KeyError, ValueError, OSError, CheckpointError) as e:
        raise ServeError(str(e).strip("'\"")) from None
    if isinstance(resolved, ModelArgs):
        return resolved
    if resolved.model_type not in OURS and not is_gguf(model):
        # a multimodal checkpoint's config.json (Gemma 3, Llama 4): its language model's, as
        # its preset is (hf_presets.counted_config: get_text_config())
        return HfArgs.of(resolved.get_text_config(), str(model))
    try:
        return model_args_from_hf(resolved.to_dict(), str(model))
    except (KeyError, ValueError) as e:
        raise ServeError(f"{model}: serve prices perfcounter's model, which cannot hold this "
                         f"config ({e})") from None


def resolve_precision(precision) -> torch.dtype:
    if isinstance(precision, torch.dtype):
        return precision
    if precision not in PRECISIONS:
        raise ServeError(f"--precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def resolve_quantization(quantize=None, kv_dtype=None, args: ModelArgs | None = None,
                         dtype: torch.dtype = torch.bfloat16) -> tuple:
    """(WeightScheme or None, "int8" / "fp8" or None) from a scheme (or its name, as
    --quantize takes it) and a KV dtype name; with `args`, the scheme is also held to the
    model (int4's group size must divide every linear's in_features). ServeError else."""
    if isinstance(args, HfArgs) and (quantize is not None or kv_dtype is not None):
        given = "--quantize" if quantize is not None else "--kv_dtype"
        raise ServeError(f"{given}: {args.name} ({args.model_type}) is priced as its checkpoint "
                         "stores it; --quantize and --kv_dtype price perfcounter's own "
                         "architectures (llama, mistral, qwen2, mixtral)")
    try:
        scheme = quantize if isinstance(quantize, WeightScheme) else parse_scheme(quantize)
        kv = parse_kv_dtype(kv_dtype)
        if scheme is not None and args is not None:
            weight_bytes(args, dtype, scheme)  # quantizes a one-layer fake model: refuses misfits
    except ValueError as e:  # QuantizeError
        raise ServeError(str(e)) from None
    return scheme, kv


def precision_label(dtype: torch.dtype, weights=None, kv: str | None = None) -> str:
    """'bfloat16', or 'bfloat16, weights int4-32, KV int8' when stored quantized."""
    parts = [str(dtype).replace("torch.", "")]
    if weights is not None:
        parts.append(f"weights {weights.name}")
    if kv is not None:
        parts.append(f"KV {kv}")
    return ", ".join(parts)


def resolve_spec(device_spec, dtype: torch.dtype):
    """A DeviceSpec as given, or the registry's entry of that name at `dtype`."""
    if not isinstance(device_spec, str):
        return device_spec
    try:
        return get_device_spec(device_spec, dtype=dtype)
    except (KeyError, ValueError) as e:
        raise ServeError(str(e).strip("'\"")) from None


def resolve_expert_load(value, args: ModelArgs) -> ExpertLoad | None:
    """`value` (ExpertLoad.parse's: None, "balanced", "4,2,1,1") checked against the model's
    experts before any work: one weight per expert, none above 1/k of the rows; None when
    balanced. A skewed load on a model without experts is refused (ServeError)."""
    try:
        load = ExpertLoad.parse(value)
        if load.shares is None:
            return None
        if not args.num_experts:
            raise ValueError(f"--expert_load {value}: this model has no experts (a dense "
                             "feed-forward); leave it out")
        load.expected_hit(1, args.num_experts, args.num_activated_experts)  # checks the shares
    except ValueError as e:
        raise ServeError(str(e).replace("expert_load", "--expert_load", 1)
                         if not str(e).startswith("--") else str(e)) from None
    return load


def is_gguf(model) -> bool:
    return isinstance(model, (str, Path)) and str(model).endswith(".gguf")


def gguf_file(model, args: ModelArgs, gguf_type, scheme, mapping) -> GgufFile:
    """The weights of a .gguf `model` as its file stores them, or of `args` as stored in a
    llama.cpp file of `gguf_type`; ServeError (one line) for both at once, either beside a
    quantize scheme or a mapping (a placement's table repeats one layer on its devices, and
    a file's layers differ), a mixture of experts."""
    if is_gguf(model) and gguf_type is not None:
        raise ServeError("--gguf_type prices a preset as a file type; a .gguf model is a file "
                         "of its own types: drop --gguf_type")
    given = "--gguf_type" if gguf_type is not None else "a .gguf model"
    if mapping is not None:
        raise ServeError(f"{given} and --mapping: a placement's step table repeats one layer "
                         "on its devices, and a file's layers differ; give one of them")
    if scheme is not None and is_gguf(model):
        raise ServeError(f"--quantize {scheme.name} and a .gguf model: its weights are stored "
                         "as the file stores them; drop --quantize")
    if is_gguf(model) and args.num_experts:
        raise ServeError(f"{model}: a mixture of experts stored as a GGUF is not priced by "
                         "serve (its experts are no linears of ours); give its preset")
    try:
        if is_gguf(model):
            return GgufFile.of_file(model, args)
        return GgufFile.of_type(check_gguf_type(args, gguf_type, quantize=scheme), args)
    except ValueError as e:
        raise ServeError(str(e).replace("gguf_type", "--gguf_type", 1)
                         .replace("quantize", "--quantize", 1)) from None
