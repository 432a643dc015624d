"""Weight-only quantization (gpt-fast's int8 and int4) and quantized KV caches for our model.

    quantize_model(model, "int4-32")      # every nn.Linear (the output too) and MoE expert
    quantize_kv_cache(model, "int8")      # the caches setup_caches makes from now on
    model_size_bytes(model)               # gpt-fast's _get_model_size
    loading.fake_model(args, weights="int8", kv="int8", dtype=torch.bfloat16)  # no weights

Schemes (`--quantize`): `int8` — an int8 weight per element and one scale per output
channel in the model's dtype (gpt-fast's WeightOnlyInt8Linear); `int4` / `int4-G` — 4-bit
weights, two a byte, with a bfloat16 scale and zero point per group of G input columns,
G in 32, 64, 128, 256 (gpt-fast's WeightOnlyInt4Linear; `int4` alone is G = 128, gpt-fast's
default; `--weight_dtype int4 --group_size 32` says `int4-32`); `fp8` — W8A8 as TensorRT-LLM's
FP8 (fp8.py: float8_e4m3fn weights and activations, a float32 scale per tensor; no checkpoint
format, so --quantize only). KV caches (`--kv_dtype`): `int8` or `fp8` (float8 e4m3) with one
scale per token and KV head.

What the counter sees. Both linears run a fused kernel on the CPU —
`aten._weight_int8pack_mm`, `aten._weight_int4pack_mm_for_cpu` — that reads the stored
weight and its scales once and writes the output, so both IO models charge the weight as
stored (int8: N·K + 2·N bytes; int4: N·K/2 + 4·N·K/G) and FLOPs are the matmul's at the
activations' dtype. Elsewhere (CUDA, or an int4 layer whose out_features is no multiple of
16) the linear runs gpt-fast's eager code instead, `kernel = "dequant"`: it makes a
dequantized copy of the weight, which both IO models then charge (as activation bytes).
Attention over a quantized cache is one fused op (quant/ops.py:
torch.ops.perfcounter.quantized_kv_sdpa) that reads the quantized keys, values and their scales.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from perfcounter.quant import experts as moe
from perfcounter.quant.fp8 import Float8Linear
from perfcounter.quant.ops import (INT4_GROUP_SIZES, KV_DTYPES, dequantize_int4, int4_cpu_layout,
                                    int4_scale_dtype, quantize_int4_groupwise,
                                    quantize_int8_per_channel, quantize_per_token)
from perfcounter.quant.stored import stored_nbytes

aten = torch.ops.aten
DEFAULT_GROUP_SIZE = 128  # gpt-fast's default for int4
FLOAT_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
               "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
SCHEME_CHOICES = ("int8", "int4", *(f"int4-{g}" for g in INT4_GROUP_SIZES), "fp8")


class QuantizeError(ValueError):
    """A quantization scheme, group size or model that does not fit."""


@dataclass(frozen=True)
class WeightScheme:
    """How a linear's weight is stored: int8 per output channel, int4 per group, fp8 (W8A8)."""

    kind: str  # "int8", "int4" or "fp8"
    group_size: Optional[int] = None  # int4 only

    @property
    def name(self) -> str:
        return f"int4-{self.group_size}" if self.kind == "int4" else self.kind

    def nbytes(self, out_features: int, in_features: int, scale_itemsize: int = 2) -> int:
        """Bytes stored for one [out, in] weight: int8 N·K + a scale per row (scale_itemsize
        bytes); int4 N·K/2 + a bfloat16 scale and zero per group of G (4·N·K/G); fp8 N·K + one
        float32 scale (4)."""
        n, k = out_features, in_features
        if self.kind != "int4":
            return n * k + (4 if self.kind == "fp8" else n * scale_itemsize)
        return n * k // 2 + (k // self.group_size) * n * 2 * 2


def parse_scheme(text) -> Optional[WeightScheme]:
    """--quantize: None or 'none' (float), int8, int4 (G = 128), int4-G or int4-gG, fp8 (float8)."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return None
    key = str(text).strip().lower().replace("-g", "-").replace(".g", "-")
    if key in ("int8", "fp8", "float8"):
        return WeightScheme("int8" if key == "int8" else "fp8")
    if key == "int4":
        return WeightScheme("int4", DEFAULT_GROUP_SIZE)
    if key.startswith("int4-") and key[5:].isdigit() and int(key[5:]) in INT4_GROUP_SIZES:
        return WeightScheme("int4", int(key[5:]))
    raise QuantizeError(f"unknown --quantize scheme {text!r}; valid: {', '.join(SCHEME_CHOICES)}")


def weight_scheme(weight_dtype=None, group_size=None) -> Optional[WeightScheme]:
    """--weight_dtype (a float dtype: no quantization; int8; int4) and --group_size (int4)."""
    name = None if weight_dtype is None else str(weight_dtype).strip().lower()
    if group_size is not None and name != "int4":
        raise QuantizeError(f"--group_size {group_size} applies to --weight_dtype int4 only "
                            f"(int8 has one scale per output channel), got --weight_dtype {name}")
    if name is None or name in FLOAT_NAMES:
        return None
    if name == "int8":
        return WeightScheme("int8")
    if name != "int4":
        raise QuantizeError(f"unknown --weight_dtype {weight_dtype!r}; valid: int8, int4, "
                            f"{', '.join(FLOAT_NAMES)}")
    group = DEFAULT_GROUP_SIZE if group_size is None else group_size
    if group not in INT4_GROUP_SIZES:
        raise QuantizeError(f"--group_size {group_size!r} is not one torch's int4 kernels take; "
                            f"valid: {', '.join(map(str, INT4_GROUP_SIZES))}")
    return WeightScheme("int4", group)


def resolve_scheme(quantize=None, weight_dtype=None, group_size=None) -> Optional[WeightScheme]:
    """One scheme from --quantize and --weight_dtype/--group_size; both given must agree."""
    a, b = parse_scheme(quantize), weight_scheme(weight_dtype, group_size)
    if quantize is not None and weight_dtype is not None and a != b:
        raise QuantizeError(f"--quantize {quantize} and --weight_dtype {weight_dtype}"
                            f"{'' if group_size is None else f' --group_size {group_size}'} "
                            "disagree; give one of them")
    return a if quantize is not None else b


def parse_kv_dtype(text) -> Optional[str]:
    """--kv_dtype: None or a float dtype name (the cache in the activations' dtype), int8, fp8."""
    if text is None or str(text).strip().lower() in FLOAT_NAMES:
        return None
    key = str(text).strip().lower()
    if key not in KV_DTYPES:
        raise QuantizeError(f"unknown --kv_dtype {text!r}; valid: {', '.join(KV_DTYPES)}, "
                            f"{', '.join(FLOAT_NAMES)}")
    return key


# -- the modules ---------------------------------------------------------------------------
def _param(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)  # a parameter: the counter's `weight` role


class WeightOnlyInt8Linear(nn.Module):
    """y = x @ (int8 weight [N, K])ᵀ · scales [N] (+ bias)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 scale_dtype=torch.bfloat16, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param(torch.empty(out_features, in_features, dtype=torch.int8, device=device))
        self.scales = _param(torch.empty(out_features, dtype=scale_dtype, device=device))
        self.bias = _param(torch.empty(out_features, dtype=scale_dtype, device=device)) if bias \
            else None
        self.kernel = "fused"  # "dequant": gpt-fast's eager F.linear(x, w.to(x.dtype)) * scales

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "fused" and x.device.type == "cpu":
            scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
            y = aten._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight, scales)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.weight.to(x.dtype)) * self.scales
        return y if self.bias is None else y + self.bias


class WeightOnlyInt4Linear(nn.Module):
    """y = x @ (int4 weight, two a byte)ᵀ with a scale and zero per group of `group_size`."""

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = False, *,
                 bias_dtype=torch.bfloat16, scale_dtype=torch.bfloat16, device=None):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.weight = _param(torch.empty(out_features, in_features // 2, dtype=torch.uint8,
                                         device=device))
        self.scales_and_zeros = _param(torch.empty(in_features // group_size, out_features, 2,
                                                   dtype=scale_dtype, device=device))
        self.bias = _param(torch.empty(out_features, dtype=bias_dtype, device=device)) if bias \
            else None
        self.kernel = "dequant"  # "fused" once `weight` is in the CPU kernel's tiled layout

    def use_cpu_kernel(self, *, convert: bool = True) -> None:
        """Tile `weight` for aten._weight_int4pack_mm_for_cpu (same bytes); convert=False for
        weights with no values (fake, meta). Needs out_features % 16 == 0 and a CPU weight."""
        if self.kernel == "fused" or self.out_features % 16 or self.weight.device.type != "cpu":
            return
        if convert:
            self.weight = _param(int4_cpu_layout(self.weight.data))
        self.kernel = "fused"

    def forward(self, x: Tensor) -> Tensor:
        sz = self.scales_and_zeros
        sz = sz if sz.dtype == x.dtype else sz.to(x.dtype)
        if self.kernel == "fused" and x.device.type == "cpu":
            y = aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features), self.weight,
                                                 self.group_size, sz)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, dequantize_int4(self.weight, sz, self.group_size, x.dtype))
        return y if self.bias is None else y + self.bias


QUANTIZED = (WeightOnlyInt8Linear, WeightOnlyInt4Linear, Float8Linear)


class QuantizedKVCache(nn.Module):
    """A static KV cache of int8 or float8 values, a scale per token and head beside them:
    k_cache / v_cache [B, H_kv, max_seq, D], k_scales / v_scales [B, H_kv, max_seq, 1]."""

    def __init__(self, max_batch_size: int, max_seq_length: int, n_heads: int, head_dim: int,
                 dtype: torch.dtype, kind: str = "int8"):
        super().__init__()
        self.kind = kind
        shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        qdtype = KV_DTYPES[kind][0]
        for name in ("k_cache", "v_cache"):
            self.register_buffer(name, torch.zeros(shape, dtype=qdtype), persistent=False)
        for name in ("k_scales", "v_scales"):
            self.register_buffer(name, torch.zeros(*shape[:3], 1, dtype=dtype), persistent=False)

    def update(self, input_pos: Tensor, k_val: Tensor, v_val: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [S], k_val / v_val: [B, H_kv, S, D] -> the quantized caches
        for cache, scales, val in ((self.k_cache, self.k_scales, k_val),
                                   (self.v_cache, self.v_scales, v_val)):
            q, scale = quantize_per_token(val, self.kind)
            if q.dtype != torch.int8:  # index_copy_ has no float8 kernel: copy the bytes
                cache, q = cache.view(torch.uint8), q.view(torch.uint8)
            cache.index_copy_(2, input_pos, q)
            scales.index_copy_(2, input_pos, scale)
        return self.k_cache, self.v_cache

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask=None, dropout_p: float = 0.0,
                  enable_gqa: bool = False) -> Tensor:
        """Attention over this cache (Attention.forward calls it in place of SDPA)."""
        return torch.ops.perfcounter.quantized_kv_sdpa(q, k, v, self.k_scales, self.v_scales,
                                                       attn_mask, enable_gqa)


# -- whole models ----------------------------------------------------------------------------
def _linears(model: nn.Module) -> list[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute, path, module) of every nn.Linear, in module order."""
    return [(parent, name, f"{path}.{name}" if path else name, child)
            for path, parent in model.named_modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear)]


def quantized_scheme(model: nn.Module) -> Optional[WeightScheme]:
    """The scheme a model's linears are quantized with, or None (float)."""
    for m in model.modules():  # a linear or a MoE's stacked expert weight (experts.py)
        if isinstance(m, (WeightOnlyInt8Linear, moe.Int8Experts)):
            return WeightScheme("int8")
        if isinstance(m, (Float8Linear, moe.Float8Experts)):
            return WeightScheme("fp8")
        if isinstance(m, (WeightOnlyInt4Linear, moe.Int4Experts)):
            return WeightScheme("int4", m.group_size)
    return None


def check_group_size(model: nn.Module, scheme: WeightScheme) -> None:
    """Every linear's (and expert weight's) in_features must be a multiple of the group size."""
    if scheme.kind != "int4":
        return
    widths = {path: m.in_features for _, _, path, m in _linears(model)}
    widths.update({f"{path}.{n}": k for _, _, path, m in moe.float_experts(model)
                   for n, k in moe.widths(m).items()})
    bad = [(p, k) for p, k in widths.items() if k % scheme.group_size]
    if bad:
        fits = [g for g in INT4_GROUP_SIZES if all(k % g == 0 for k in widths.values())]
        raise QuantizeError(f"--quantize {scheme.name}: group size {scheme.group_size} does not "
                            f"divide in_features={bad[0][1]} of {bad[0][0]}; valid group sizes "
                            f"for this model: {', '.join(map(str, fits)) or 'none'}")


def _new_module(linear: nn.Linear, scheme: WeightScheme, tile: bool) -> nn.Module:
    w = linear.weight
    n, k = w.shape
    bias = linear.bias is not None
    if scheme.kind == "fp8":
        return Float8Linear.from_linear(linear)
    if scheme.kind == "int8":
        new = WeightOnlyInt8Linear(k, n, bias, scale_dtype=w.dtype, device=w.device)
    else:  # a 16-bit model's scales in its own dtype (no cast per call), else gpt-fast's bf16
        new = WeightOnlyInt4Linear(k, n, scheme.group_size, bias, bias_dtype=w.dtype,
                                   scale_dtype=int4_scale_dtype(w.dtype), device=w.device)
    if w.is_meta:  # to be loaded (the stored layout), then use_kernels
        return new
    if isinstance(w, torch._subclasses.FakeTensor):
        if scheme.kind == "int4" and tile:
            new.use_cpu_kernel(convert=False)  # no values to tile; the bytes are the same
        return new
    with torch.no_grad():
        if scheme.kind == "int8":
            q, scales = quantize_int8_per_channel(w.detach(), w.dtype)
            new.weight, new.scales = _param(q), _param(scales)
        else:
            q, sz = quantize_int4_groupwise(w.detach(), scheme.group_size,
                                            int4_scale_dtype(w.dtype))
            new.weight, new.scales_and_zeros = _param(q), _param(sz)
            if tile:
                new.use_cpu_kernel()
        if bias:
            new.bias = _param(linear.bias.detach().clone())
    return new


def quantize_model(model: nn.Module, scheme, *, tile: bool = True, keep=()) -> nn.Module:
    """Replace every nn.Linear of `model` (the output layer included, untied from the
    embedding) and every mixture of experts' stacked weights (experts.py) by their quantized
    modules, in place; `scheme` a WeightScheme or its name.
    Real weights are quantized; fake or meta ones become empty tensors of the stored layout
    (fake tensors must be made inside their FakeTensorMode: fake_model does that; meta ones
    are for load_state_dict, then use_kernels). tile=False keeps int4 weights in the stored
    layout (scripts/quantize.py saves that) instead of the CPU kernel's. keep: paths of
    linears left in float ("output": gpt-fast's published table was measured that way)."""
    scheme = parse_scheme(scheme) if not isinstance(scheme, WeightScheme) else scheme
    if scheme is None:
        return model
    have = quantized_scheme(model)
    if have is not None:
        if have == scheme:
            return model
        raise QuantizeError(f"--quantize {scheme.name}: the model is already quantized "
                            f"({have.name}); quantize a float checkpoint (valid on this one: "
                            f"{have.name} or none)")
    check_group_size(model, scheme)
    for parent, name, path, m in _linears(model) + moe.float_experts(model):
        if path not in keep:
            setattr(parent, name, _new_module(m, scheme, tile) if isinstance(m, nn.Linear) else
                    moe.quantize_experts(m, scheme.kind, scheme.group_size, tile=tile))
    return model


def use_kernels(model: nn.Module) -> nn.Module:
    """After loading stored int4 weights: tile them for the CPU kernel where it applies."""
    for m in model.modules():
        if isinstance(m, (WeightOnlyInt4Linear, moe.Int4Experts)):
            m.use_cpu_kernel()
    return model


def quantize_kv_cache(model: nn.Module, kind: Optional[str]) -> nn.Module:
    """Make the caches our Transformer's setup_caches allocates quantized ('int8', 'fp8')."""
    kind = parse_kv_dtype(kind)
    if kind is not None:
        if not hasattr(model, "make_kv_cache"):
            raise QuantizeError(f"--kv_dtype {kind}: only perfcounter's own model has a "
                                f"quantized KV cache, not {type(model).__name__}")
        model.make_kv_cache = functools.partial(QuantizedKVCache, kind=kind)
    return model


# -- sizes -------------------------------------------------------------------------------------
def model_size_bytes(model: nn.Module, max_batch_size: Optional[int] = None,
                     max_seq_length: Optional[int] = None) -> int:
    """gpt-fast's _get_model_size: bytes of the parameters and buffers of each top-level child
    but the embedding — KV caches included, at their allocated length. A child that holds
    the embedding itself (transformers' `model.model`) is looked into the same way. A fake
    model of ours with no caches yet (a derived config-only count) gets them first, for
    max_batch_size x max_seq_length (free: fake tensors)."""
    first = next(model.parameters(), None)
    if getattr(model, "max_seq_length", 0) < 0 and max_seq_length and \
            isinstance(first, torch._subclasses.FakeTensor):
        with first.fake_mode:
            model.setup_caches(max_batch_size or 1, max_seq_length)
    total = 0
    for child in model.children():
        if isinstance(child, nn.Embedding):
            continue
        if any(isinstance(m, nn.Embedding) for m in child.modules()):
            total += model_size_bytes(child, max_batch_size, max_seq_length)
            continue
        total += sum(stored_nbytes(t)  # as stored: a GGUF's blocks, a torchao subclass's parts
                     for t in itertools.chain(child.parameters(), child.buffers()))
    return total


def kv_cache_bytes(n_layer: int, batch: int, n_kv_heads: int, seq: int, head_dim: int, *,
                   kv: Optional[str] = None, itemsize: int = 2) -> int:
    """Bytes of K and V caches for `seq` positions: float at `itemsize` bytes, or int8 / fp8
    (1 byte) plus a scale of `itemsize` bytes per token and head."""
    tokens = n_layer * batch * n_kv_heads * seq
    per_token = head_dim * itemsize if kv is None else head_dim + itemsize
    return 2 * tokens * per_token


# -- checkpoints -------------------------------------------------------------------------------
def scheme_of_state(state: dict, source="checkpoint") -> Optional[WeightScheme]:
    """The scheme a state dict was quantized with (its `.scales` / `.scales_and_zeros`
    tensors), or None for float weights; gpt-fast's CUDA-tiled int4 is refused."""
    groups = set()
    for key, sz in state.items():
        if key.endswith(".scales_and_zeros"):
            w = state.get(key[: -len("scales_and_zeros")] + "weight")
            if w is None or w.dtype != torch.uint8 or sz.dim() != w.dim() + 1 or w.dim() > 3:
                raise QuantizeError(f"{source}: {key} is not the int4 layout scripts/quantize.py "
                                    "writes (uint8 [N, K/2] weight, [K/G, N, 2] scales and zeros; "
                                    "gpt-fast's CUDA-tiled int4 is not read); requantize it")
            groups.add(2 * w.shape[-1] // sz.shape[-3])  # experts: [E, N, K/2], [E, K/G, N, 2]
    if len(groups) > 1:
        raise QuantizeError(f"{source}: int4 group sizes differ between layers: {sorted(groups)}")
    int8 = any(k.endswith(".scales") and state.get(k[:-len("scales")] + "weight",
                                                   torch.empty(0)).dtype == torch.int8
               for k in state)
    if groups and int8:
        raise QuantizeError(f"{source}: both int8 and int4 layers; one scheme per checkpoint")
    return WeightScheme("int4", groups.pop()) if groups else WeightScheme("int8") if int8 else None
