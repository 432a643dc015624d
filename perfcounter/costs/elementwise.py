"""Cost formulas for elementwise ops (part of the costs registry).

An elementwise op does a fixed mix of primitive operations per output element;
the table below says which. Ops whose count depends on an argument (add's
alpha, pow's exponent, clamp's bounds, gelu's approximation) or on the dtype
(a complex multiply is 6 real FLOPs) have their own formula. Each op is
registered with its in-place form (add and add_) where torch has one.

SiLU carries `per_element="silu"`: a device spec that prices SiLU per element
(roofline.py) replaces its FLOP time.
"""
from __future__ import annotations

import torch

from perfcounter.costs._core import Cost, aten, first_shape, is_complex, kinds, numel, register
from perfcounter.quant import ops as quant_ops  # noqa: F401  (defines perfcounter.fp8_cast)


def _outputs(out_shape) -> int:
    """Output elements of an elementwise op (0 when the caller gave no output shape)."""
    return numel(first_shape(out_shape)) if out_shape is not None else 0


def _per_element(**counts):
    """A formula: `counts` primitive ops for every output element."""

    def cost(*args, out_shape=None, **kw) -> Cost:
        n = _outputs(out_shape)
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
    (("div", "reciprocal", "remainder", "fmod", "floor_divide"), dict(div=1)),
    (("sqrt", "rsqrt"), dict(sqrt=1)),
    (("exp", "exp2", "expm1", "log", "log2", "log10", "log1p"), dict(exp=1)),
    (("sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "atan2",
      "erf", "erfc", "erfinv", "sigmoid", "softplus", "hardtanh"), dict(special=1)),
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
for _names, _counts in _TABLE:
    register(*_both(*_names))(_per_element(**_counts))

register(*_both("silu"), per_element="silu")(_per_element(special=1, mul=1))  # x · sigmoid(x)


@register(*_both("add"))
def add_cost(a, b=None, *args, alpha=1, out_shape=None, **kw) -> Cost:
    """One add per output element, plus one mul when alpha scales the second operand."""
    n = numel(first_shape(out_shape))
    return Cost(kinds(add=n, mul=n if alpha != 1 else 0))


@register(*_both("mul"))
def mul_cost(a, b=None, *args, out_shape=None, **kw) -> Cost:
    """One mul per output element; complex × complex (a+bi)(c+di) = (ac-bd) + (ad+bc)i:
    4 mul + 2 add (6 real FLOPs); complex × real: 2 mul.

    NB: an operand is complex when its Shape's dtype is (a plain tuple is real) or when
    it is a Python complex scalar."""
    n = _outputs(out_shape)
    both, one = is_complex(a) and is_complex(b), is_complex(a) or is_complex(b)
    if both:
        return Cost(kinds(mul=4 * n, add=2 * n))
    return Cost(kinds(mul=2 * n if one else n))


@register(aten.polar)
def polar_cost(abs, angle, *args, out_shape=None, **kw) -> Cost:
    """abs·cos(angle) + i·abs·sin(angle) per element: 2 special (cos, sin), 2 mul (RoPE tables)."""
    n = _outputs(out_shape)
    return Cost(kinds(special=2 * n, mul=2 * n))


@register(*_both("pow"))
def pow_cost(base, exponent, *args, out_shape=None, **kw) -> Cost:
    """x**e per element: e=2 one mul, e=3 two muls, e=0.5 one sqrt, e=-0.5 sqrt+div,
    e=-1 one div, e=1 nothing; otherwise exp(e·log x): 2 exp + 1 mul."""
    n = numel(first_shape(out_shape))
    cheap = {2: kinds(mul=n), 3: kinds(mul=2 * n), 0.5: kinds(sqrt=n), -0.5: kinds(sqrt=n, div=n),
             -1: kinds(div=n), 1: kinds()}
    if isinstance(exponent, (int, float)) and exponent in cheap:
        return Cost(cheap[exponent])
    return Cost(kinds(exp=2 * n, mul=n))


@register(*_both("clamp"))
def clamp_cost(x, min=None, max=None, *args, out_shape=None, **kw) -> Cost:
    """One cmp per element per bound given."""
    n = numel(first_shape(out_shape))
    return Cost(kinds(cmp=n * ((min is not None) + (max is not None))))


@register(*_both("gelu"))
def gelu_cost(x, *args, approximate="none", out_shape=None, **kw) -> Cost:
    """erf form 0.5·x·(1 + erf(x/√2)): 1 special, 3 mul, 1 add per element;
    tanh form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): 1 special, 6 mul, 2 add."""
    n = numel(first_shape(out_shape))
    if approximate == "tanh":
        return Cost(kinds(special=n, mul=6 * n, add=2 * n))
    return Cost(kinds(special=n, mul=3 * n, add=n))


@register(aten.arange)
def arange_cost(*args, out_shape=None, **kw) -> Cost:
    """start + i·step per element: one mul and one add (written, not read)."""
    n = numel(first_shape(out_shape))
    return Cost(kinds(add=n, mul=n))


@register(torch.ops.perfcounter.fp8_cast)
def fp8_cast_cost(x, scale=None, *args, out_shape=None, **kw) -> Cost:
    """x · (1 / scale) saturated to ±448 as float8 (quant/ops.py): per element 1 mul and 2 cmp,
    plus 1 div (the reciprocal, once). NB: the conversion to float8 itself is not counted."""
    n = _outputs(out_shape)
    return Cost(kinds(mul=n, cmp=2 * n, div=1))
