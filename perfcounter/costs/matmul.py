"""Cost formulas for matrix products and convolutions (part of the costs registry).

A multiply-accumulate (MAC) is 1 mul + 1 add = 2 FLOPs, as in
torch.utils.flop_counter: [M, K] @ [K, N] is M·N·K MACs = 2·M·N·K FLOPs.
Scaling by alpha / beta (addmm, baddbmm) and bias adds come on top, per output
element. Grouped matmuls (MoE experts) and convolutions are counted from
shapes alone: which rows go to which expert is data, but every row goes to
exactly one, so the total does not depend on it.
"""
from __future__ import annotations

from perfcounter.costs._core import Cost, aten, first_shape, kinds, numel, register


@register(aten.mm)
def mm_cost(a, b, *args, out_shape=None, **kw) -> Cost:
    """[M, K] @ [K, N]: M·N·K multiply-accumulates."""
    m, k = a
    n = b[1]
    return Cost(kinds(add=m * n * k, mul=m * n * k))


@register(aten.bmm)
def bmm_cost(a, b, *args, out_shape=None, **kw) -> Cost:
    """[B, M, K] @ [B, K, N]: B·M·N·K multiply-accumulates."""
    bs, m, k = a
    n = b[2]
    return Cost(kinds(add=bs * m * n * k, mul=bs * m * n * k))


def _scaled_product(macs: int, outs: int, beta, alpha) -> Cost:
    """beta·bias + alpha·(a @ b) with `macs` MACs and `outs` output elements.

    Per output element: 1 add for the bias unless beta == 0, 1 mul for beta
    unless beta is 0 or 1, 1 mul for alpha unless alpha == 1. With beta == 0
    the bias is not read at all (torch ignores it, NaN included)."""
    add = macs + (outs if beta != 0 else 0)
    mul = macs + (outs if beta not in (0, 1) else 0) + (outs if alpha != 1 else 0)
    return Cost(kinds(add=add, mul=mul), read_elems=(0, None, None) if beta == 0 else None)


@register(aten.addmm)
def addmm_cost(bias, a, b, *args, beta=1, alpha=1, out_shape=None, **kw) -> Cost:
    """beta·bias + alpha·([M, K] @ [K, N]): M·N·K MACs, M·N bias adds, the scalings per output.

    NB: beta = 0 reads no bias and adds nothing (read_elems 0 for the bias)."""
    m, k = a
    n = b[1]
    return _scaled_product(m * n * k, m * n, beta, alpha)


@register(aten.baddbmm)
def baddbmm_cost(bias, a, b, *args, beta=1, alpha=1, out_shape=None, **kw) -> Cost:
    """beta·bias + alpha·([B, M, K] @ [B, K, N]): B·M·N·K MACs, B·M·N bias adds, the scalings.

    NB: beta = 0 (attention scores into an empty buffer) reads no bias and adds nothing."""
    bs, m, k = a
    n = b[2]
    return _scaled_product(bs * m * n * k, bs * m * n, beta, alpha)


@register(aten.linear)
def linear_cost(x, w, bias=None, *args, out_shape=None, **kw) -> Cost:
    """x [..., K] @ w[N, K]ᵀ (+ bias): M·N·K multiply-accumulates (+ M·N adds), M = numel(x)/K.

    NB: a composite: the counting mode runs its decomposition (t + mm/addmm) in every grad
    mode and never prices it whole; this is for callers that see linear itself."""
    k = x[-1]
    m = numel(x) // k if k else 0
    n = w[0]
    return Cost(kinds(add=m * n * k + (m * n if bias is not None else 0), mul=m * n * k))


@register(aten._grouped_mm)
def grouped_mm_cost(a, b, offs=None, bias=None, *args, groups_hit=None, rows=None, out_shape=None,
                    **kw) -> Cost:
    """Grouped matmul (MoE experts): M·K·N multiply-accumulates, however `offs` splits the rows.

    [M, K] x [E, K, N] -> [M, N]: each row meets one expert's [K, N]: M·K·N.
    [E, M, K] x [K, N] -> [M, N]: each column group meets one [M, K]: M·K·N.
    [M, K] x [K, N] -> [E, M, N]: groups split K; each k is used once: M·K·N.
    [E, M, K] x [E, K, N] -> [E, M, N]: a batched matmul, E·M·K·N.
    NB: for [M, K] x [E, K, N] the mode passes what `offs` says (op_data.py): `rows`, the
    rows up to offs[-1] (the kernel skips the rest), and `groups_hit`, the experts that got
    rows: only their K·N weights are read."""
    read_elems = None
    if len(a) == 3 and len(b) == 3:
        e, m, k = a
        macs = e * m * k * b[2]
    elif len(a) == 3:  # 3-D x 2-D
        _, m, k = a
        macs = m * k * b[1]
    else:  # 2-D x 3-D or 2-D x 2-D
        m, k = a
        skipped = rows is not None and rows < m
        if skipped:
            m = rows
        macs = m * k * b[-1]
        if len(b) == 3 and (skipped or groups_hit is not None and groups_hit < b[0]):
            read_elems = (m * k if skipped else None,
                          b[0] * b[1] * b[2] if groups_hit is None else groups_hit * b[1] * b[2])
    return Cost(kinds(add=macs, mul=macs), read_elems=read_elems)


# --- convolutions -------------------------------------------------------------------


def _conv(x, w, bias, transposed: bool, out_shape) -> Cost:
    """MACs of a convolution with input x [N, Cin, *S], weight w, output out_shape.

    Forward, w [Cout, Cin/groups, *k]: every output element takes Cin/groups ·
    prod(k) MACs, so numel(out) · prod(w[1:]). Transposed, w [Cin, Cout/groups,
    *k]: every input element scatters into Cout/groups · prod(k) outputs, so
    numel(x) · prod(w[1:]). Either way torch.utils.flop_counter's count / 2."""
    out = first_shape(out_shape)
    macs = numel(x if transposed else out) * numel(w[1:])
    extra = numel(out) if bias is not None else 0
    return Cost(kinds(add=macs + extra, mul=macs))


@register(aten.convolution, aten._convolution)
def conv_cost(x, w, bias=None, stride=None, padding=None, dilation=None, transposed=False,
              *args, out_shape=None, **kw) -> Cost:
    """Convolution (forward or transposed, by the schema's `transposed` flag): MACs (+1 add per
    output element with bias).

    NB: stride, padding, dilation and groups act through the output shape and the weight's
    shape (w[1] = Cin/groups), which is all the count needs."""
    return _conv(x, w, bias, bool(transposed), out_shape)


@register(aten.conv1d, aten.conv2d, aten.conv3d)
def convnd_cost(x, w, bias=None, *args, out_shape=None, **kw) -> Cost:
    """conv1d/2d/3d, priced whole when they reach the counter: a forward convolution.

    NB: also the `padding="same"` overloads; the output shape carries the padding."""
    return _conv(x, w, bias, False, out_shape)


@register(aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d)
def conv_transpose_cost(x, w, bias=None, *args, out_shape=None, **kw) -> Cost:
    """conv_transpose1d/2d/3d, priced whole when they reach the counter: a transposed
    convolution, numel(x) · Cout/groups · prod(k) MACs."""
    return _conv(x, w, bias, True, out_shape)


@register(aten._scaled_mm)
def scaled_mm_cost(a, b, scale_a=None, scale_b=None, bias=None, *args, out_shape=None,
                   **kw) -> Cost:
    """fp8 [M, K] @ fp8 [K, N] (fp8.Float8Linear: W8A8) with scales: M·N·K MACs (2·M·N·K
    FLOPs, at a's dtype: float8), the scales on the accumulator (1 mul per output element
    when both are per tensor, else 2), 1 add per output element for a bias.

    NB: the conversion to the output's dtype happens in the epilogue and is not counted."""
    m, k = a
    n = b[1]
    per_tensor = all(s is None or numel(s) == 1 for s in (scale_a, scale_b))
    outs = m * n
    return Cost(kinds(add=m * n * k + (outs if bias is not None else 0),
                      mul=m * n * k + outs * (1 if per_tensor else 2)))


# --- weight-only quantized matmuls (perfcounter/quant/quantize.py) -------------------------------


@register(aten._weight_int8pack_mm)
def int8_weight_mm_cost(x, w, scales, *args, out_shape=None, **kw) -> Cost:
    """x [M, K] @ int8 w [N, K]ᵀ, times scales [N]: M·N·K MACs + M·N muls, at x's dtype.

    NB: the weight is read as stored (1 byte an element) with its scales; converting
    each weight to x's dtype happens in registers and is not counted."""
    m, k = x
    n = w[0]
    return Cost(kinds(add=m * n * k, mul=m * n * k + m * n))


@register(aten._weight_int4pack_mm, aten._weight_int4pack_mm_for_cpu,
          aten._weight_int4pack_mm_with_scales_and_zeros)
def int4_weight_mm_cost(x, w, group_size=None, *args, out_shape=None, **kw) -> Cost:
    """x [M, K] @ int4 w (packed, N·K/2 bytes)ᵀ with groupwise scales and zeros: M·N·K MACs at
    x's dtype; N is the output's last dim.

    NB: (q - 8)·scale + zero per weight happens in registers and is not counted, so the
    FLOPs equal the float matmul's."""
    m, k = x
    n = first_shape(out_shape)[-1]
    return Cost(kinds(add=m * n * k, mul=m * n * k))
