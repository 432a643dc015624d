"""Quantization arithmetic on tensors, and perfcounter's own kernels (custom ops).

The arithmetic (no modules; quantize.py builds the modules from it):
- int8 per output channel, symmetric: q = round(w / s), s = max|w| / 127 per row;
- int4 per group of G input columns, asymmetric as gpt-fast stores it: q in 0..15,
  w ≈ (q - 8)·scale + zero, scale = (max - min) / 15, zero = min + 8·scale; stored as
  two nibbles a byte (`pack_nibbles`: the even column in the low nibble) with
  `scales_and_zeros` [K/G, N, 2] in bfloat16, the layout torch's int4 kernels take;
- KV cache int8 or float8 (e4m3) per token and head: s = max|x| / 127 (or / 448);
- fp8 (W8A8, TensorRT-LLM's FP8): a float8_e4m3fn weight with one float32 scale per tensor,
  s = max|w| / 448 (`quantize_fp8_per_tensor`); activations the same per call, by two ops.

    torch.ops.perfcounter.quantized_kv_sdpa(q, k, v, k_scale, v_scale, attn_mask, enable_gqa)

Attention over a quantized KV cache (int8 or float8 keys and values, one scale per
token and KV head, quantize.QuantizedKVCache). A fused kernel reads the quantized
cache and its scales once and dequantizes in registers; this op is that kernel as the
counter prices it: one record that reads q, the quantized k and v, their scales and
the mask, and writes the output (costs/attention.py has its formula, op_data.py its
mask pairs). Its real implementation dequantizes and calls
`F.scaled_dot_product_attention`; what runs inside a custom op is not counted, so the
dequantized copy it makes on the CPU is not charged (a fused kernel makes none). Under
FakeTensorMode it only gives the output's shape.

    torch.ops.perfcounter.fp8_scale(x)         # max|x| / 448, a float32 scalar: one pass
    torch.ops.perfcounter.fp8_cast(x, scale)   # x / scale saturated to float8_e4m3fn

A dynamic per-tensor activation quantization as two kernels run it (vLLM's
scaled_fp8_quant with no static scale: an abs-max reduction, then a scaled cast): the
counter sees one record each, reading x and writing 4 B, then reading x and its scale and
writing one byte an element (costs/reductions.py, costs/elementwise.py).

This module imports torch only, so that the op registry (costs/) can import it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4 kernels take
KV_DTYPES = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}  # dtype, max |q|
_TINY = 1e-8  # smallest scale: an all-zero row or group stays zero
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def quantize_int8_per_channel(w: Tensor, scale_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """w [N, K] float -> (q [N, K] int8, scales [N] in scale_dtype), w ≈ q · scales[:, None]."""
    scales = (w.float().abs().amax(dim=1) / 127).clamp(min=_TINY)
    q = (w.float() / scales[:, None]).round().clamp(-128, 127).to(torch.int8)
    return q, scales.to(scale_dtype)


def quantize_int4_groupwise(w: Tensor, group_size: int,
                            scale_dtype=torch.bfloat16) -> tuple[Tensor, Tensor]:
    """w [N, K] float -> (nibbles [N, K/2] uint8, scales_and_zeros [K/G, N, 2] scale_dtype)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # [N, K/G]
    scale = ((hi - lo) / 15).clamp(min=_TINY)
    q = ((groups - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8)
    zero = lo + 8 * scale
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1)  # [K/G, N, 2]
    return pack_nibbles(q.reshape(n, k)), scales_and_zeros.contiguous().to(scale_dtype)


def pack_nibbles(q: Tensor) -> Tensor:
    """[N, K] values 0..15 -> [N, K/2] uint8, column 2j in the low nibble of byte j."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: Tensor) -> Tensor:
    """[N, K/2] uint8 -> [N, K] uint8 values 0..15 (pack_nibbles undone)."""
    low = packed & 15
    high = torch.div(packed, 16, rounding_mode="floor")
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(packed: Tensor, scales_and_zeros: Tensor, group_size: int,
                    dtype: torch.dtype) -> Tensor:
    """Nibbles [N, K/2] and scales_and_zeros [K/G, N, 2] -> w [N, K] in dtype."""
    q = unpack_nibbles(packed).to(dtype)
    n, k = q.shape
    scale = scales_and_zeros[..., 0].t().to(dtype)[..., None]  # [N, K/G, 1]
    zero = scales_and_zeros[..., 1].t().to(dtype)[..., None]
    return ((q.view(n, k // group_size, group_size) - 8) * scale + zero).view(n, k)


def int4_scale_dtype(dtype: torch.dtype) -> torch.dtype:
    """int4 scales and zeros are stored in a 16-bit model's own dtype, so that its kernel reads
    them as they are; a float32 model keeps them in bfloat16 (gpt-fast's layout, half the
    bytes), cast to float32 per call."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def int4_cpu_layout(packed: Tensor) -> Tensor:
    """Nibbles [N, K/2] -> the tiled [N, K/2] uint8 that aten._weight_int4pack_mm_for_cpu
    reads (N a multiple of 16)."""
    values = unpack_nibbles(packed).to(torch.int32)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 1)


def quantize_per_token(x: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (q [..., D] int8 or float8_e4m3fn, scale [..., 1] in x's dtype)."""
    qdtype, qmax = KV_DTYPES[kind]
    scale = (x.abs().amax(dim=-1, keepdim=True) / qmax).clamp(min=_TINY)
    y = x / scale
    if qdtype == torch.int8:
        y = y.round().clamp(-128, 127)
    return y.to(qdtype), scale


def quantize_fp8_per_tensor(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] float -> (q [N, K] float8_e4m3fn, scale [] float32), w ≈ q · scale."""
    scale = fp8_scale(w)
    return fp8_cast(w, scale), scale


@torch.library.custom_op("perfcounter::fp8_scale", mutates_args=())
def fp8_scale(x: Tensor) -> Tensor:
    """max|x| / 448 over every element of x, a float32 scalar (at least _TINY)."""
    return (x.detach().abs().amax().float() / FP8_MAX).clamp(min=_TINY)


@fp8_scale.register_fake
def _fp8_scale_shape(x):
    return x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("perfcounter::fp8_cast", mutates_args=())
def fp8_cast(x: Tensor, scale: Tensor) -> Tensor:
    """x · (1 / scale), saturated to ±448, as float8_e4m3fn (x's shape)."""
    return (x.float() * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8)


@fp8_cast.register_fake
def _fp8_cast_shape(x, scale):
    return x.new_empty(x.shape, dtype=FP8)


@torch.library.custom_op("perfcounter::quantized_kv_sdpa", mutates_args=())
def quantized_kv_sdpa(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor,
                      attn_mask: Optional[Tensor] = None, enable_gqa: bool = False) -> Tensor:
    """softmax(q·(k·k_scale)ᵀ/√D + mask)·(v·v_scale): q [B, Hq, Sq, D], k / v [B, Hkv, Sk, D]
    quantized, k_scale / v_scale [B, Hkv, Sk, 1] in q's dtype."""
    keys = k.to(q.dtype) * k_scale
    values = v.to(q.dtype) * v_scale
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask,
                                          enable_gqa=enable_gqa)


@quantized_kv_sdpa.register_fake
def _quantized_kv_sdpa_shape(q, k, v, k_scale, v_scale, attn_mask=None, enable_gqa=False):
    return q.new_empty(*q.shape[:-1], v.shape[-1])
