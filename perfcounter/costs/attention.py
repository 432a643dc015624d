"""Cost formulas for fused attention kernels (part of the costs registry).

Every backend counts: the math path (decomposed into bmm, softmax, … by the
mode), the composite `scaled_dot_product_attention` when a fused kernel runs
it, CPU flash, CUDA flash, memory-efficient, cuDNN, the raw flash / efficient
forwards and flex attention. All are registered with `attention=True` (but
flex, whose keys and values the mode does not promote): their arguments 1 and
2 are keys and values, which marks those buffers KV cache.

Conventions: attention is dense (both matmuls over every score, as torch and
torchao count it); `executed` is what a kernel that skips causally masked
blocks computes. Softmax inside attention is counted too, score by score, so
a fused kernel costs what the math path's bmm + softmax + bmm cost. Per-op
breakdowns (get_flop_counts, flop_counts) split a fused kernel in two: its
matmuls under its own op key, equal to torch.utils.flop_counter's SDPA
formula (`attention_matmul_flops`), and its softmax under `SDPA_SOFTMAX`.
"""
from __future__ import annotations

import torch

from perfcounter.costs._core import DIV, EXP, MUL, OPS, Cost, aten, kinds, op_name, register
from perfcounter.quant import ops as quant_ops  # noqa: F401  (defines torch.ops.perfcounter.quantized_kv_sdpa)


def causal_pairs(s_q: int, s_k: int) -> int:
    """Query-key pairs left by torch's causal mask (top-left aligned: query i sees keys 0..i)."""
    full = max(0, min(s_q, s_k))  # rows i < s_k see i + 1 keys
    return full * (full + 1) // 2 + (s_q - full) * s_k


def window_pairs(s_q: int, valid: int, window: int | None = None) -> int:
    """Query-key pairs of s_q causal queries that are the last of `valid` keys (bottom-right
    aligned: query i sits at position valid - s_q + i and sees the keys up to it), each
    seeing at most `window` keys (a sliding window), never fewer than one.

    NB: with s_q == valid this is causal_pairs(s_q, s_q). Closed form: query i sees
    clamp(valid - s_q + 1 + i, 1, window) keys, an arithmetic run clamped at both ends."""
    first, last = valid - s_q + 1, valid  # keys seen by the first and the last query, unclamped
    high = last if window is None else window
    below = max(0, min(last, 0) - first + 1)  # queries that would see < 1 key: 1 each
    above = max(0, last - max(first, high + 1) + 1)  # queries past the window: window each
    lo, hi = max(first, 1), min(last, high)
    middle = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
    return below + middle + above * high


def attention_cost(q, k, v, is_causal=False, has_mask=False, kept_pairs=None) -> Cost:
    """softmax(q·kᵀ·scale [+ mask]) · v for q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv].

    Per score: D MACs (q·k), 1 scale mul, 1 cmp (running max), 1 add (minus max),
    1 exp, 1 add (row sum), [1 add for an additive mask], Dv MACs (p·v); then one
    div per output element. Dense over all Sq·Sk scores (torch's convention);
    `executed` keeps only the pairs a causal kernel computes, or the `kept_pairs` of an
    explicit mask (over all batches and query heads).
    NB: grouped-query attention (Hkv < Hq) computes over Hq heads: KV heads are
    broadcast, not recomputed."""
    b, hq, sq, d = q[-4:] if len(q) == 4 else (1, *q[-3:])
    sk = k[-2]
    dv = v[-1]
    scores = b * hq * sq * sk
    per_score = kinds(add=d + dv + 2 + (1 if has_mask else 0), mul=d + dv + 1, exp=1, cmp=1)
    dense = tuple(scores * c for c in per_score)
    out_div = b * hq * sq * dv
    dense = dense[:DIV] + (dense[DIV] + out_div,) + dense[DIV + 1:]
    executed = None
    if kept_pairs is not None:
        executed = kept_pairs * sum(per_score) + out_div
    elif is_causal:
        kept = b * hq * causal_pairs(sq, sk)
        executed = kept * sum(per_score) + out_div
    return Cost(dense, executed=executed)


@register(aten._scaled_dot_product_flash_attention_for_cpu, attention=True)
def sdpa_cpu_flash_cost(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None,
                        kept_pairs=None, out_shape=None, **kw) -> Cost:
    """The CPU flash kernel; torch.utils.flop_counter counts 0 for it."""
    return attention_cost(q, k, v, is_causal, attn_mask is not None, kept_pairs)


@register(aten.scaled_dot_product_attention, attention=True)
def sdpa_composite_cost(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                        enable_gqa=False, kept_pairs=None, out_shape=None, **kw) -> Cost:
    """F.scaled_dot_product_attention itself, for a caller that sees the composite whole.

    NB: the counting mode never prices it whole: it runs the composite's own decomposition
    (as autograd does under no_grad), so the kernel it picks is what is counted."""
    return attention_cost(q, k, v, is_causal, attn_mask is not None, kept_pairs)


@register(aten._scaled_dot_product_flash_attention, attention=True)
def sdpa_flash_cost(q, k, v, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kw) -> Cost:
    """The CUDA flash kernel (no mask argument)."""
    return attention_cost(q, k, v, is_causal, False)


@register(aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
          attention=True)
def sdpa_efficient_cost(q, k, v, attn_bias=None, compute_lse=False, dropout_p=0.0, is_causal=False,
                        *args, kept_pairs=None, out_shape=None, **kw) -> Cost:
    """Memory-efficient and cuDNN kernels (optional additive bias)."""
    return attention_cost(q, k, v, is_causal, attn_bias is not None, kept_pairs)


@register(aten._flash_attention_forward, attention=True)
def flash_forward_cost(q, k, v, cu_q=None, cu_k=None, max_q=0, max_k=0, dropout_p=0.0,
                       is_causal=False, *args, out_shape=None, **kw) -> Cost:
    """Raw flash forward: q [B, S, H, D] layout (dense batch only)."""
    b, sq, hq, d = q
    _, sk, hkv, _ = k
    return attention_cost((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, v[-1]), is_causal, False)


@register(aten._efficient_attention_forward, attention=True)
def efficient_forward_cost(q, k, v, bias=None, cu_q=None, cu_k=None, max_q=None, max_k=None,
                           dropout_p=0.0, custom_mask_type=0, *args, out_shape=None, **kw) -> Cost:
    """Raw memory-efficient forward: q [B, S, H, D]; mask type 1/2 is causal."""
    b, sq, hq, d = q
    _, sk, hkv, _ = k
    return attention_cost((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, v[-1]),
                          custom_mask_type in (1, 2), bias is not None)


@register(torch.ops.perfcounter.quantized_kv_sdpa, attention=True)
def quantized_kv_sdpa_cost(q, k, v, k_scale=None, v_scale=None, attn_mask=None, enable_gqa=False,
                           *args, kept_pairs=None, out_shape=None, **kw) -> Cost:
    """Attention over an int8 / float8 KV cache with per-token scales (quant/ops.py): SDPA's.

    NB: the scales are read (bytes), the dequantizing multiplies are not counted (a fused
    kernel does them in registers), so attention FLOPs equal those of a float cache."""
    return attention_cost(q, k, v, False, attn_mask is not None, kept_pairs)


def flex_attention_cost(q, k, v, score_mod=None, block_mask=None, *args, out_shape=None, **kw) -> Cost:
    """flex_attention (a higher-order op): priced as dense attention.

    NB: the block mask's sparsity lives in tensor values, which a shape formula
    cannot see; a block-sparse kernel computes less than this."""
    return attention_cost(q, k, v)


try:
    from torch._higher_order_ops.flex_attention import flex_attention as _flex_hop
except ImportError:  # older torch without flex attention
    _flex_hop = None
if _flex_hop is not None:
    register(_flex_hop)(flex_attention_cost)


class OpKey(str):
    """A key of the per-op breakdowns that is no aten op but reads like one: a str that
    also has the `__name__` code written for torch's op packets looks at."""

    @property
    def __name__(self) -> str:
        return str(self)


SDPA_SOFTMAX = OpKey("sdpa_softmax")  # the softmax share of fused attention kernels

# "aten._scaled_dot_product_flash_attention_for_cpu", ...: the ops attention_cost prices
FUSED_ATTENTION = frozenset(
    op_name(op) for op, info in OPS.items()
    if info.formula in (sdpa_cpu_flash_cost, sdpa_composite_cost, sdpa_flash_cost,
                        sdpa_efficient_cost, flash_forward_cost, efficient_forward_cost,
                        quantized_kv_sdpa_cost, flex_attention_cost))


def attention_matmul_flops(op_kinds) -> int:
    """The matmul share of a fused attention's dense primitive counts (attention_cost's
    layout): 2·scores·(D + Dv) = 2·(mul − exp), torch's SDPA formula; the rest is softmax.

    NB: per score attention_cost counts D + Dv + 1 muls (the +1 is the scale) and one exp."""
    return 2 * (op_kinds[MUL] - op_kinds[EXP])
