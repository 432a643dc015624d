"""Cost formulas for softmax and normalization layers (part of the costs registry).

Softmax, log-softmax, RMSNorm and LayerNorm work row by row over the last
(normalized) dimensions: per row of n elements a few reductions (n-1 ops
each) and a few elementwise passes (n ops each). The counts below follow the
numerically stable forms that PyTorch's kernels compute (softmax subtracts
the row maximum first).

Per-element pricing. A device spec may price softmax / SiLU / RMSNorm in ns per
element instead of per FLOP (UPMEM's profiles do; roofline.py applies it). The
ops that implement those functions carry `per_element=` here:
- "softmax": aten._softmax, aten._safe_softmax, and aten.softmax (a composite
  that decomposes to _softmax; it carries the tag but no formula, so that its
  FLOPs are never counted twice);
- "rmsnorm": aten._fused_rms_norm, and aten.rms_norm (a composite, no formula);
- "silu" sits with the elementwise ops.
Norms written out op by op (HF's LlamaRMSNorm) are matched by module name in
roofline.py, not here.
"""
from __future__ import annotations

from perfcounter.costs._core import CMP, Cost, aten, kinds, numel, register, rows


@register(aten._softmax, per_element="softmax")
def softmax_cost(x, dim, half_to_float=False, out_shape=None, **kw) -> Cost:
    """Per row of n: n-1 cmp (max), n adds (minus max), n exp, n-1 adds (sum), n div."""
    n = x[dim] if x else 1
    r = rows(x, n)
    return Cost(kinds(cmp=r * (n - 1), add=r * n + r * (n - 1), exp=r * n, div=r * n))


@register(aten._safe_softmax, per_element="softmax")
def safe_softmax_cost(x, dim, dtype=None, out_shape=None, **kw) -> Cost:
    """Softmax that gives 0 for rows masked entirely (the math attention path): softmax,
    plus per element 1 cmp (is it -inf) and 1 select, and per row n-1 cmp (all masked)."""
    n = x[dim] if x else 1
    r = rows(x, n)
    soft = softmax_cost(x, dim)
    return Cost(soft.kinds[:CMP] + (soft.kinds[CMP] + 2 * r * n + r * (n - 1),) + soft.kinds[CMP + 1:])


register(aten.softmax, per_element="softmax")  # composite: counted as the _softmax it runs


@register(aten._log_softmax)
def log_softmax_cost(x, dim, half_to_float=False, out_shape=None, **kw) -> Cost:
    """Per row of n: n-1 cmp, n adds (minus max), n exp, n-1 adds (sum), 1 log, n adds (minus log-sum)."""
    n = x[dim] if x else 1
    r = rows(x, n)
    return Cost(kinds(cmp=r * (n - 1), add=r * n + r * (n - 1) + r * n, exp=r * n + r))


@register(aten._fused_rms_norm, per_element="rmsnorm")
def rms_norm_cost(x, normalized_shape, weight=None, eps=None, out_shape=None, **kw) -> Cost:
    """x · rsqrt(mean(x²) + eps) [· w]: per row of n: n mul (square), n-1 add, 1 div (mean),
    1 add (eps), 1 rsqrt, n mul (scale) [+ n mul (weight)]."""
    n = numel(normalized_shape)
    r = rows(x, n)
    big = numel(x)
    return Cost(kinds(mul=2 * big + (big if weight is not None else 0),
                      add=r * (n - 1) + r, div=r, sqrt=r))


register(aten.rms_norm, per_element="rmsnorm")  # composite: counted as the ops it runs


@register(aten.native_layer_norm)
def layer_norm_cost(x, normalized_shape, weight=None, bias=None, eps=0.0, out_shape=None, **kw) -> Cost:
    """Per row of n: mean (n-1 add, 1 div), variance (n sub, n mul, n-1 add, 1 div),
    +eps, rsqrt, normalize (n sub, n mul) [+ n mul weight] [+ n add bias].

    NB: the per-row mean and 1/std it also returns are by-products, not counted again."""
    n = numel(normalized_shape)
    r = rows(x, n)
    big = numel(x)
    add = 2 * r * (n - 1) + 2 * big + r + (big if bias is not None else 0)
    mul = 2 * big + (big if weight is not None else 0)
    return Cost(kinds(add=add, mul=mul, div=2 * r, sqrt=r))
