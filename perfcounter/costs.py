"""Op cost registry: what each aten op computes, by kind, and which bytes it touches.

One dict, `COSTS`, keyed by aten `OpOverloadPacket`, filled by `@register(...)`,
which refuses duplicates. A formula takes shapes, not tensors — the op's
arguments with every tensor replaced by its shape tuple (lists of tensors by
lists of shapes), plus `out_shape` (a shape, or a tuple of them) — so a test
can call it with plain tuples. It returns a `Cost`: primitive counts by kind
(trace.KINDS: add, mul, div, sqrt, exp, special, cmp) and, where an op touches
less than whole tensors (an embedding reads rows, an index_copy_ writes
positions), the elements it really reads or writes.

Conventions:
- FLOPs = the sum of the primitive counts; a multiply-accumulate is 1 mul +
  1 add = 2 FLOPs, as in torch.utils.flop_counter (matmul = 2·M·N·K).
- Attention is dense (both matmuls over every score, as torch and torchao
  count it); `executed` is what a kernel that skips causally masked blocks
  computes. Softmax inside attention is counted too.
- Copies, casts, factories and views compute nothing (0 FLOPs); views and
  metadata ops also move nothing (see `op_kind` in mode.py). Random number
  generation itself is not counted, only the arithmetic that shapes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from perfcounter.trace import KINDS

aten = torch.ops.aten
ADD, MUL, DIV, SQRT, EXP, SPECIAL, CMP = range(len(KINDS))


@dataclass(frozen=True, slots=True)
class Cost:
    """What one call computes and touches.

    kinds: primitive counts by trace.KINDS (dense convention for attention).
    executed: FLOPs really computed when a kernel skips masked work, else None.
    read_elems: per tensor argument (in flattened order), elements read, or
        None for "all of it"; the whole tuple None when every input is read whole.
    write_elems: elements written into the op's written argument, or None for
        all of it (out-of-place outputs are always written whole).
    """

    kinds: tuple[int, ...] = (0,) * len(KINDS)
    executed: int | None = None
    read_elems: tuple[int | None, ...] | None = None
    write_elems: int | None = None

    @property
    def flops(self) -> int:
        return sum(self.kinds)


def kinds(add=0, mul=0, div=0, sqrt=0, exp=0, special=0, cmp=0) -> tuple[int, ...]:
    return (int(add), int(mul), int(div), int(sqrt), int(exp), int(special), int(cmp))


ZERO = Cost()
COSTS: dict[torch._ops.OpOverloadPacket, Callable[..., Cost]] = {}


def register(*ops):
    """Register one formula for several op packets; a packet registered twice is an error."""

    def wrap(fn):
        for op in ops:
            if op in COSTS:
                raise ValueError(f"cost formula for {op} registered twice "
                                 f"({COSTS[op].__name__} and {fn.__name__})")
            COSTS[op] = fn
        return fn

    return wrap


def numel(shape) -> int:
    return math.prod(shape)


def _first(out_shape):
    """The first output's shape (ops returning a tuple list it first)."""
    if out_shape and isinstance(out_shape[0], (tuple, list)):
        return tuple(out_shape[0])
    return out_shape


# --- matmul ---------------------------------------------------------------------


@register(aten.mm)
def mm_cost(a, b, *args, out_shape=None, **kw) -> Cost:
    """[M, K] @ [K, N]: M·N·K multiply-accumulates."""
    m, k = a
    n = b[1]
    return Cost(kinds(add=m * n * k, mul=m * n * k))


@register(aten.addmm)
def addmm_cost(bias, a, b, *args, out_shape=None, **kw) -> Cost:
    """bias + [M, K] @ [K, N]: the matmul plus M·N bias adds.

    NB: beta/alpha other than 1 would add multiplies; linear layers never set them."""
    m, k = a
    n = b[1]
    return Cost(kinds(add=m * n * k + m * n, mul=m * n * k))


@register(aten.linear)
def linear_cost(x, w, bias=None, *args, out_shape=None, **kw) -> Cost:
    """x [..., K] @ w[N, K]ᵀ (+ bias): M·N·K multiply-accumulates (+ M·N adds), M = numel(x)/K.

    NB: reaches the counter only under inference_mode (elsewhere it arrives as t + mm/addmm)."""
    k = x[-1]
    m = numel(x) // k if k else 0
    n = w[0]
    return Cost(kinds(add=m * n * k + (m * n if bias is not None else 0), mul=m * n * k))


@register(aten.bmm)
def bmm_cost(a, b, *args, out_shape=None, **kw) -> Cost:
    """[B, M, K] @ [B, K, N]: B·M·N·K multiply-accumulates."""
    bs, m, k = a
    n = b[2]
    return Cost(kinds(add=bs * m * n * k, mul=bs * m * n * k))


@register(aten.baddbmm)
def baddbmm_cost(bias, a, b, *args, out_shape=None, **kw) -> Cost:
    """bias + [B, M, K] @ [B, K, N]: the batched matmul plus B·M·N adds."""
    bs, m, k = a
    n = b[2]
    return Cost(kinds(add=bs * m * n * k + bs * m * n, mul=bs * m * n * k))


@register(aten.convolution, aten._convolution)
def conv_cost(x, w, bias, *args, out_shape=None, **kw) -> Cost:
    """Convolution: every output element takes Cin/groups · prod(kernel) MACs (+1 add with bias).

    NB: uses torch.utils.flop_counter's count (2 FLOPs per MAC) split into mul and add."""
    from torch.utils.flop_counter import conv_flop_count

    transposed = bool(args[4]) if len(args) > 4 else False
    macs = conv_flop_count(list(x), list(w), list(_first(out_shape)), transposed) // 2
    extra = numel(_first(out_shape)) if bias is not None else 0
    return Cost(kinds(add=macs + extra, mul=macs))


# --- attention ------------------------------------------------------------------


def causal_pairs(s_q: int, s_k: int) -> int:
    """Query-key pairs left by torch's causal mask (top-left aligned: query i sees keys 0..i)."""
    full = max(0, min(s_q, s_k))  # rows i < s_k see i + 1 keys
    return full * (full + 1) // 2 + (s_q - full) * s_k


def attention_cost(q, k, v, is_causal=False, has_mask=False) -> Cost:
    """softmax(q·kᵀ·scale [+ mask]) · v for q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv].

    Per score: D MACs (q·k), 1 scale mul, 1 cmp (running max), 1 add (minus max),
    1 exp, 1 add (row sum), [1 add for an additive mask], Dv MACs (p·v); then one
    div per output element. Dense over all Sq·Sk scores (torch's convention);
    `executed` keeps only the pairs a causal kernel computes.
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
    if is_causal:
        kept = b * hq * causal_pairs(sq, sk)
        executed = kept * sum(per_score) + out_div
    return Cost(dense, executed=executed)


@register(aten._scaled_dot_product_flash_attention_for_cpu)
def sdpa_cpu_flash_cost(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None,
                        out_shape=None, **kw) -> Cost:
    """The CPU flash kernel; torch.utils.flop_counter counts 0 for it."""
    return attention_cost(q, k, v, is_causal, attn_mask is not None)


@register(aten.scaled_dot_product_attention)
def sdpa_composite_cost(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                        enable_gqa=False, out_shape=None, **kw) -> Cost:
    """F.scaled_dot_product_attention itself, priced whole when a fused kernel runs it
    (the mode decomposes it when the math path would run, so those ops count one by one).
    NB: a fused kernel's auxiliary output (the B·H·Sq log-sum-exp) is not in its bytes."""
    return attention_cost(q, k, v, is_causal, attn_mask is not None)


@register(aten._scaled_dot_product_flash_attention)
def sdpa_flash_cost(q, k, v, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kw) -> Cost:
    """The CUDA flash kernel (no mask argument)."""
    return attention_cost(q, k, v, is_causal, False)


@register(aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention)
def sdpa_efficient_cost(q, k, v, attn_bias=None, compute_lse=False, dropout_p=0.0, is_causal=False,
                        *args, out_shape=None, **kw) -> Cost:
    """Memory-efficient and cuDNN kernels (optional additive bias)."""
    return attention_cost(q, k, v, is_causal, attn_bias is not None)


@register(aten._flash_attention_forward)
def flash_forward_cost(q, k, v, cu_q=None, cu_k=None, max_q=0, max_k=0, dropout_p=0.0,
                       is_causal=False, *args, out_shape=None, **kw) -> Cost:
    """Raw flash forward: q [B, S, H, D] layout (dense batch only)."""
    b, sq, hq, d = q
    _, sk, hkv, _ = k
    return attention_cost((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, v[-1]), is_causal, False)


@register(aten._efficient_attention_forward)
def efficient_forward_cost(q, k, v, bias=None, cu_q=None, cu_k=None, max_q=None, max_k=None,
                           dropout_p=0.0, custom_mask_type=0, *args, out_shape=None, **kw) -> Cost:
    """Raw memory-efficient forward: q [B, S, H, D]; mask type 1/2 is causal."""
    b, sq, hq, d = q
    _, sk, hkv, _ = k
    return attention_cost((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, v[-1]),
                          custom_mask_type in (1, 2), bias is not None)


def _flex_attention_cost(q, k, v, score_mod=None, block_mask=None, *args, out_shape=None, **kw) -> Cost:
    """flex_attention (a higher-order op): priced as dense attention.

    NB: the block mask's sparsity lives in tensor values, which a shape formula
    cannot see; a block-sparse kernel computes less than this."""
    return attention_cost(q, k, v)


try:
    from torch._higher_order_ops.flex_attention import flex_attention as _flex_hop
    register(_flex_hop)(_flex_attention_cost)
except ImportError:  # older torch without flex attention
    pass


# --- normalization, softmax ---------------------------------------------------------


def _rows(shape, n_last: int) -> int:
    return numel(shape) // n_last if n_last else 0


@register(aten._softmax)
def softmax_cost(x, dim, half_to_float=False, out_shape=None, **kw) -> Cost:
    """Per row of n: n-1 cmp (max), n adds (minus max), n exp, n-1 adds (sum), n div."""
    n = x[dim] if x else 1
    r = _rows(x, n)
    return Cost(kinds(cmp=r * (n - 1), add=r * n + r * (n - 1), exp=r * n, div=r * n))


@register(aten._safe_softmax)
def safe_softmax_cost(x, dim, dtype=None, out_shape=None, **kw) -> Cost:
    """Softmax that gives 0 for rows masked entirely (the math attention path): softmax,
    plus per element 1 cmp (is it -inf) and 1 select, and per row n-1 cmp (all masked)."""
    n = x[dim] if x else 1
    r = _rows(x, n)
    soft = softmax_cost(x, dim)
    return Cost(soft.kinds[:CMP] + (soft.kinds[CMP] + 2 * r * n + r * (n - 1),) + soft.kinds[CMP + 1:])


@register(aten._log_softmax)
def log_softmax_cost(x, dim, half_to_float=False, out_shape=None, **kw) -> Cost:
    """Per row of n: n-1 cmp, n adds (minus max), n exp, n-1 adds (sum), 1 log, n adds (minus log-sum)."""
    n = x[dim] if x else 1
    r = _rows(x, n)
    return Cost(kinds(cmp=r * (n - 1), add=r * n + r * (n - 1) + r * n, exp=r * n + r))


@register(aten._fused_rms_norm)
def rms_norm_cost(x, normalized_shape, weight=None, eps=None, out_shape=None, **kw) -> Cost:
    """x · rsqrt(mean(x²) + eps) [· w]: per row of n: n mul (square), n-1 add, 1 div (mean),
    1 add (eps), 1 rsqrt, n mul (scale) [+ n mul (weight)]."""
    n = numel(normalized_shape)
    r = _rows(x, n)
    big = numel(x)
    return Cost(kinds(mul=2 * big + (big if weight is not None else 0),
                      add=r * (n - 1) + r, div=r, sqrt=r))


@register(aten.native_layer_norm)
def layer_norm_cost(x, normalized_shape, weight=None, bias=None, eps=0.0, out_shape=None, **kw) -> Cost:
    """Per row of n: mean (n-1 add, 1 div), variance (n sub, n mul, n-1 add, 1 div),
    +eps, rsqrt, normalize (n sub, n mul) [+ n mul weight] [+ n add bias]."""
    n = numel(normalized_shape)
    r = _rows(x, n)
    big = numel(x)
    add = 2 * r * (n - 1) + 2 * big + r + (big if bias is not None else 0)
    mul = 2 * big + (big if weight is not None else 0)
    return Cost(kinds(add=add, mul=mul, div=2 * r, sqrt=r))


# --- reductions -------------------------------------------------------------------


def _reduction(kind: int, extra=None):
    def cost(x, *args, out_shape=None, **kw) -> Cost:
        n, m = numel(x), numel(_first(out_shape)) if out_shape is not None else 1
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
    return cost


register(aten.sum, aten.nansum)(_reduction(ADD))
register(aten.mean)(_reduction(ADD, {DIV: 1}))
register(aten.prod)(_reduction(MUL))
register(aten.amax, aten.amin, aten.max, aten.min, aten.argmax, aten.argmin,
         aten.any, aten.all, aten.aminmax)(_reduction(CMP))


@register(aten.linalg_vector_norm)
def vector_norm_cost(x, ord=2, dim=None, keepdim=False, *args, out_shape=None, **kw) -> Cost:
    """2-norm: n mul (square), n-m add, m sqrt. NB: other orders are priced the same."""
    n, m = numel(x), numel(_first(out_shape))
    return Cost(kinds(mul=n, add=n - m, sqrt=m))


@register(aten.var, aten.std, aten.var_mean, aten.std_mean)
def var_cost(x, *args, out_shape=None, **kw) -> Cost:
    """Per output of a group of g = n/m: mean (g-1 add, 1 div), g sub, g mul, g-1 add, 1 div [+1 sqrt]."""
    n, m = numel(x), numel(_first(out_shape))
    return Cost(kinds(add=2 * (n - m) + n, mul=n, div=2 * m, sqrt=m))


@register(aten.cumsum, aten.cumprod, aten.logcumsumexp)
def cumulative_cost(x, *args, out_shape=None, **kw) -> Cost:
    """One add (cumprod: mul) per element. NB: logcumsumexp priced as cumsum."""
    return Cost(kinds(add=numel(x)))


# --- sampling ---------------------------------------------------------------------


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


@register(aten.topk)
def topk_cost(x, k, dim=-1, *args, out_shape=None, **kw) -> Cost:
    """Each element is compared into a size-k heap: n·⌈log2 k⌉ cmp."""
    return Cost(kinds(cmp=numel(x) * _log2(k)))


@register(aten.sort)
def sort_cost(x, *args, out_shape=None, **kw) -> Cost:
    """Comparison sort of each row of n: n·⌈log2 n⌉ cmp per row."""
    dim = args[1] if len(args) > 1 and isinstance(args[1], int) else -1
    n = x[dim] if x else 1
    return Cost(kinds(cmp=numel(x) * _log2(n)))


@register(aten.multinomial)
def multinomial_cost(probs, num_samples, *args, out_shape=None, **kw) -> Cost:
    """Per row of n: n adds (cumulative sum), n div (normalize), ⌈log2 n⌉ cmp per sample (search)."""
    n = probs[-1]
    r = numel(probs) // n
    return Cost(kinds(add=r * n, div=r * n, cmp=r * num_samples * _log2(n)))


@register(aten.exponential_)
def exponential_cost(x, *args, out_shape=None, **kw) -> Cost:
    """-log(u)/λ per element: 1 exp (log), 1 div. NB: drawing u is not counted."""
    return Cost(kinds(exp=numel(x), div=numel(x)))


# --- gathers and scatters: elements touched, not whole tensors ----------------------


@register(aten.embedding)
def embedding_cost(weight, indices, *args, out_shape=None, **kw) -> Cost:
    """Reads one row per index, never the whole table; no arithmetic."""
    return Cost(read_elems=(numel(indices) * weight[-1], None))


@register(aten.index_select)
def index_select_cost(x, dim, index, *args, out_shape=None, **kw) -> Cost:
    """Reads the selected slices of x: len(index) · (numel / size[dim])."""
    row = numel(x) // x[dim] if x and x[dim] else 0
    return Cost(read_elems=(numel(index) * row, None))


@register(aten.gather)
def gather_cost(x, dim, index, *args, out_shape=None, **kw) -> Cost:
    """Reads one element of x per index."""
    return Cost(read_elems=(numel(index), None))


@register(aten.index_copy_)
def index_copy_cost(x, dim, index, source, *args, out_shape=None, **kw) -> Cost:
    """Writes only the indexed positions (a KV-cache update): numel(source) elements."""
    return Cost(write_elems=numel(source))


def _indexed_numel(x, indices) -> int:
    """Elements addressed by x[indices]: the broadcast index shape times every dim
    the indices leave whole (None entries and trailing dims). NB: integer indices."""
    index_shapes = [s for s in indices if s is not None]
    if not index_shapes:
        return numel(x)
    broadcast = torch.broadcast_shapes(*[torch.Size(s) for s in index_shapes])
    kept = [size for i, size in enumerate(x) if i >= len(indices) or indices[i] is None]
    return numel(broadcast) * numel(kept)


@register(aten.index_put_, aten.index_put)
def index_put_cost(x, indices, values, accumulate=False, *args, out_shape=None, **kw) -> Cost:
    """x[indices] = values (or += with accumulate): writes the indexed elements only.

    NB: the out-of-place index_put writes its whole output; only index_put_ is partial."""
    n = _indexed_numel(x, indices)
    return Cost(kinds(add=n if accumulate else 0), write_elems=n)


@register(aten.index)
def index_cost(x, indices, *args, out_shape=None, **kw) -> Cost:
    """x[indices]: reads the addressed elements only."""
    return Cost(read_elems=(numel(_first(out_shape)),) + (None,) * sum(i is not None for i in indices))


@register(aten.scatter_)
def scatter_cost(x, dim, index, *args, out_shape=None, **kw) -> Cost:
    """In-place scatter writes one element per index."""
    return Cost(write_elems=numel(index))


@register(aten.scatter_add_)
def scatter_add_cost(x, dim, index, src, *args, out_shape=None, **kw) -> Cost:
    """In-place scatter-add reads and writes one element per index, with one add each."""
    n = numel(index)
    return Cost(kinds(add=n), read_elems=(n, None, None), write_elems=n)


# The elementwise ops, copies and factories live in their own file; importing it
# fills the same registry.
from perfcounter import elementwise  # noqa: E402,F401
