"""Cost formulas for elementwise ops, copies and factories (part of the costs registry).

An elementwise op does a fixed mix of primitive operations per output element;
the table below says which. Copies, casts and factory ops compute nothing but
still move bytes (the mode counts those from the tensors). Registered into
`perfcounter.costs.COSTS` when that module is imported.
"""
from __future__ import annotations

import torch

from perfcounter.costs import ZERO, Cost, _first, kinds, numel, register

aten = torch.ops.aten


def _per_element(**counts):
    """A formula: `counts` primitive ops for every output element."""

    def cost(*args, out_shape=None, **kw) -> Cost:
        n = numel(_first(out_shape)) if out_shape is not None else 0
        return Cost(kinds(**{k: v * n for k, v in counts.items()}))

    cost.__doc__ = "Per output element: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + "."
    cost.__name__ = "per_element_" + "_".join(counts)
    return cost


def _both(*names):
    """An op packet and its in-place form (add and add_), where both exist."""
    ops = []
    for name in names:
        for n in (name, name + "_"):
            if hasattr(aten, n):
                ops.append(getattr(aten, n))
    return ops


# NB on the classification: neg and abs are priced as one add / one cmp; sign,
# floor, ceil, round and trunc as one cmp; remainder/fmod as one div; rsqrt as
# one sqrt (DESIGN: sqrt includes rsqrt); log and friends as one exp.
_TABLE = [
    (("sub", "rsub", "neg"), dict(add=1)),
    (("mul",), dict(mul=1)),
    (("div", "reciprocal", "remainder", "fmod", "floor_divide"), dict(div=1)),
    (("sqrt", "rsqrt"), dict(sqrt=1)),
    (("exp", "exp2", "expm1", "log", "log2", "log10", "log1p"), dict(exp=1)),
    (("sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "atan2",
      "erf", "erfc", "erfinv", "sigmoid", "softplus", "hardtanh"), dict(special=1)),
    (("silu",), dict(special=1, mul=1)),  # x · sigmoid(x)
    (("mish",), dict(special=2, mul=1)),  # x · tanh(softplus(x))
    (("relu", "abs", "sign", "sgn", "floor", "ceil", "round", "trunc", "clamp_min", "clamp_max",
      "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum", "fmax", "fmin",
      "logical_not", "logical_and", "logical_or", "logical_xor", "isnan", "isinf", "isfinite",
      "bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "masked_fill", "where",
      "tril", "triu", "leaky_relu", "hardsigmoid", "threshold"), dict(cmp=1)),
    (("addcmul",), dict(add=1, mul=2)),  # x + v · a · b
    (("addcdiv",), dict(add=1, mul=1, div=1)),  # x + v · a / b
    (("lerp",), dict(add=2, mul=1)),  # x + w · (y - x)
    (("hardswish",), dict(cmp=2, mul=1, div=1, add=1)),  # x · relu6(x + 3) / 6
]
for names, counts in _TABLE:
    register(*_both(*names))(_per_element(**counts))


@register(*_both("add"))
def add_cost(a, b=None, *args, alpha=1, out_shape=None, **kw) -> Cost:
    """One add per output element, plus one mul when alpha scales the second operand."""
    n = numel(_first(out_shape))
    return Cost(kinds(add=n, mul=n if alpha != 1 else 0))


@register(*_both("pow"))
def pow_cost(base, exponent, *args, out_shape=None, **kw) -> Cost:
    """x**e per element: e=2 one mul, e=3 two muls, e=0.5 one sqrt, e=-0.5 sqrt+div,
    e=-1 one div, e=1 nothing; otherwise exp(e·log x): 2 exp + 1 mul."""
    n = numel(_first(out_shape))
    cheap = {2: kinds(mul=n), 3: kinds(mul=2 * n), 0.5: kinds(sqrt=n), -0.5: kinds(sqrt=n, div=n),
             -1: kinds(div=n), 1: kinds()}
    if isinstance(exponent, (int, float)) and exponent in cheap:
        return Cost(cheap[exponent])
    return Cost(kinds(exp=2 * n, mul=n))


@register(*_both("clamp"))
def clamp_cost(x, min=None, max=None, *args, out_shape=None, **kw) -> Cost:
    """One cmp per element per bound given."""
    n = numel(_first(out_shape))
    return Cost(kinds(cmp=n * ((min is not None) + (max is not None))))


@register(*_both("gelu"))
def gelu_cost(x, *args, approximate="none", out_shape=None, **kw) -> Cost:
    """erf form 0.5·x·(1 + erf(x/√2)): 1 special, 3 mul, 1 add per element;
    tanh form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): 1 special, 6 mul, 2 add."""
    n = numel(_first(out_shape))
    if approximate == "tanh":
        return Cost(kinds(special=n, mul=6 * n, add=2 * n))
    return Cost(kinds(special=n, mul=3 * n, add=n))


@register(aten.arange)
def arange_cost(*args, out_shape=None, **kw) -> Cost:
    """start + i·step per element: one mul and one add (written, not read)."""
    n = numel(_first(out_shape))
    return Cost(kinds(add=n, mul=n))


def data_movement_cost(*args, out_shape=None, **kw) -> Cost:
    """Copies, casts, concatenation, padding, factory fills: no arithmetic; the
    mode counts the bytes they read and write."""
    return ZERO


register(
    aten._to_copy, aten.clone, aten.copy_, aten.copy, aten._copy_from, aten.cat, aten.stack,
    aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter,
    aten.repeat, aten.repeat_interleave, aten.roll, aten.flip, aten.constant_pad_nd,
    aten.fill_, aten.fill, aten.zero_, aten.zeros, aten.ones, aten.full, aten.zeros_like,
    aten.ones_like, aten.full_like, aten.new_zeros, aten.new_ones, aten.new_full,
    aten.scalar_tensor, aten.lift_fresh_copy, aten._local_scalar_dense, aten.expand_copy,
    aten.index_copy, aten.scatter, aten.uniform_, aten.normal_, aten.random_, aten.bernoulli_,
    aten.rand, aten.randn, aten.randint, aten.rand_like, aten.randn_like, aten.bernoulli,
    aten.masked_select, aten.nonzero, aten.unique_consecutive, aten._unique2, aten.tensor_split,
    aten.unfold, aten.tril_indices, aten.triu_indices, aten.one_hot, aten.equal,
    aten._assert_tensor_metadata, aten.resize_, aten.set_,
    # composites the mode prices whole when they copy (a view when they do not)
    aten.to, aten.reshape, aten.contiguous, aten.flatten, aten.type_as,
)(data_movement_cost)


def _allocation(*args, out_shape=None, **kw) -> Cost:
    """Allocates without writing: no arithmetic and no bytes."""
    return Cost(write_elems=0)


register(aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
         aten.new_empty_strided, aten.empty_permuted)(_allocation)
