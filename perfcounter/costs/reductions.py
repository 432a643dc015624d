"""Cost formulas for reductions, scans, sorting, search and sampling (part of the costs registry).

A reduction of n inputs to m outputs does n-m binary operations (a sum of n
numbers is n-1 adds). Sorting and heap selection are counted in comparisons,
n·⌈log2 n⌉ for a comparison sort, the bound a sort cannot beat. Drawing random
numbers is not counted; only the arithmetic that shapes them is. MoE routing
(histc over the chosen experts) and generate's stop check (isin over the
end-of-sequence ids) live here too.
"""
from __future__ import annotations

import torch

from perfcounter.costs._core import (ADD, CMP, DIV, MUL, Cost, aten, first_shape, kinds, log2_ceil,
                                      numel, register, rows)
from perfcounter.quant import ops as quant_ops  # noqa: F401  (defines perfcounter.fp8_scale)
from perfcounter.trace import KINDS


def _reduction(kind: int, extra=None):
    """A formula for a reduction whose every step is one `kind` (plus `extra` per output)."""

    def cost(x, *args, out_shape=None, **kw) -> Cost:
        n, m = numel(x), numel(first_shape(out_shape)) if out_shape is not None else 1
        counts = [0] * len(KINDS)
        if args and isinstance(args[0], tuple):  # the binary form, max(a, b): one per element
            counts[kind] = m
            return Cost(tuple(counts))
        counts[kind] = max(n - m, 0)
        if extra is not None:
            for k, per_out in extra.items():
                counts[k] += per_out * m
        return Cost(tuple(counts))

    cost.__doc__ = f"n inputs to m outputs: n-m {KINDS[kind]} (binary forms: m)" + (
        "" if extra is None else " plus " + ", ".join(f"{v} {KINDS[k]} per output" for k, v in extra.items()))
    cost.__name__ = f"reduction_{KINDS[kind]}"
    return cost


register(aten.sum, aten.nansum)(_reduction(ADD))
register(aten.mean)(_reduction(ADD, {DIV: 1}))
register(aten.prod)(_reduction(MUL))
register(aten.amax, aten.amin, aten.max, aten.min, aten.argmax, aten.argmin,
         aten.any, aten.all, aten.aminmax)(_reduction(CMP))


@register(aten.linalg_vector_norm)
def vector_norm_cost(x, ord=2, dim=None, keepdim=False, *args, out_shape=None, **kw) -> Cost:
    """2-norm: n mul (square), n-m add, m sqrt. NB: other orders are priced the same."""
    n, m = numel(x), numel(first_shape(out_shape))
    return Cost(kinds(mul=n, add=n - m, sqrt=m))


@register(torch.ops.perfcounter.fp8_scale)
def fp8_scale_cost(x, *args, out_shape=None, **kw) -> Cost:
    """max|x| / 448 over n elements (an fp8 activation's per-tensor scale, quant/ops.py): n cmp
    (abs, as aten.abs is priced), n-1 cmp (max), 1 div."""
    n = numel(x)
    return Cost(kinds(cmp=2 * n - 1 if n else 0, div=1))


@register(aten.var, aten.std, aten.var_mean, aten.std_mean)
def var_cost(x, *args, out_shape=None, **kw) -> Cost:
    """Per output of a group of g = n/m: mean (g-1 add, 1 div), g sub, g mul, g-1 add, 1 div [+1 sqrt].

    NB: var and std are priced alike (the sqrt is counted for both)."""
    n, m = numel(x), numel(first_shape(out_shape))
    return Cost(kinds(add=2 * (n - m) + n, mul=n, div=2 * m, sqrt=m))


@register(aten.cumsum, aten.cumprod, aten.logcumsumexp)
def cumulative_cost(x, *args, out_shape=None, **kw) -> Cost:
    """One add (cumprod: mul) per element. NB: logcumsumexp priced as cumsum."""
    return Cost(kinds(add=numel(x)))


# --- sorting, selection, search -----------------------------------------------------


@register(aten.topk)
def topk_cost(x, k, dim=-1, *args, out_shape=None, **kw) -> Cost:
    """Each element is compared into a size-k heap: n·⌈log2 k⌉ cmp."""
    return Cost(kinds(cmp=numel(x) * log2_ceil(k)))


@register(aten.sort)
def sort_cost(x, dim=-1, descending=False, *args, out_shape=None, **kw) -> Cost:
    """Comparison sort of each row of n along `dim`: n·⌈log2 n⌉ cmp per row.

    NB: sort.stable passes dim by keyword; both overloads land here."""
    n = x[dim] if x else 1
    return Cost(kinds(cmp=numel(x) * log2_ceil(n)))


@register(aten.histc)
def histc_cost(x, bins=100, min=0, max=0, *args, out_shape=None, **kw) -> Cost:
    """Histogram of n elements (MoE routing counts tokens per expert): per element 2 cmp (inside
    [min, max]), 1 add (x - min), 1 mul (· bins/(max-min)), 1 cmp (floor to a bin, the top edge
    into the last bin), 1 add (the bin's count); with min == max the range is the data's own:
    2·(n-1) cmp more (its min and max).

    NB: 6 FLOPs per element; the scale bins/(max-min) is computed once per call, not counted."""
    n = numel(x)
    cmp = 3 * n + (2 * (n - 1) if min == max and n > 1 else 0)
    return Cost(kinds(add=2 * n, mul=n, cmp=cmp))


def _isin_tensor_tensor(n: int, m: int) -> int:
    """Comparisons of isin(n elements, m test elements), by torch's own choice of algorithm."""
    if m < 10.0 * pow(n, 0.145):  # compare every pair: == then any()
        return n * m
    # sort the test elements, binary-search each element, check the hit
    return m * log2_ceil(m) + n * log2_ceil(m) + n


@register(aten.isin)
def isin_cost(elements, test_elements, *args, out_shape=None, **kw) -> Cost:
    """isin(elements [n], test_elements [m]): n·m cmp (every pair) while m < 10·n^0.145, as torch
    chooses; past that, torch sorts: m·⌈log2 m⌉ (sort) + n·⌈log2 m⌉ (search) + n (hit) cmp.
    A scalar on either side: one cmp per element of the other.

    NB: `invert` (a not per element) is folded into the compare; generate's stop check
    (one token per row against a few end-of-sequence ids) is the every-pair case."""
    n = numel(elements) if isinstance(elements, tuple) else 1
    m = numel(test_elements) if isinstance(test_elements, tuple) else 1
    if not isinstance(elements, tuple) or not isinstance(test_elements, tuple):
        return Cost(kinds(cmp=n * m))
    return Cost(kinds(cmp=_isin_tensor_tensor(n, m)))


# --- sampling -----------------------------------------------------------------------


@register(aten.multinomial)
def multinomial_cost(probs, num_samples, *args, out_shape=None, **kw) -> Cost:
    """Per row of n: n adds (cumulative sum), n div (normalize), ⌈log2 n⌉ cmp per sample (search)."""
    n = probs[-1]
    r = rows(probs, n)
    return Cost(kinds(add=r * n, div=r * n, cmp=r * num_samples * log2_ceil(n)))


@register(aten.exponential_, write_only=True)
def exponential_cost(x, *args, out_shape=None, **kw) -> Cost:
    """-log(u)/λ per element: 1 exp (log), 1 div. NB: drawing u is not counted."""
    return Cost(kinds(exp=numel(x), div=numel(x)))
