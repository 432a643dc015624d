"""The op registry's primitives: `Cost`, `kinds`, shapes with dtypes, `OpInfo` and `register`.

Every family file (matmul.py, attention.py, …) imports from here and registers
its ops; the package's `__init__` imports the family files, which fills the
registry. Nothing here imports a family file, so there is no import cycle.

What the registry knows of an op, all in one `OpInfo`:
- `formula`: shapes and dtypes -> `Cost` (None: the op's FLOPs are not counted,
  its bytes are, and its name lands in `uncounted_ops`);
- byte semantics the dispatch mode reads: `write_only` (overwrites its
  destination without reading it), `cache_write` (a write into a buffer marks it
  KV cache), `join` (cat/stack: the output of a join onto a KV cache is KV cache),
  `factory` (zeros/empty/full/…_like: a fresh buffer that may become KV cache),
  `attention` (SDPA kernels: arguments 1 and 2 are keys and values); `extern` (a
  property: attention or a matmul-family formula, one kernel each when compiled);
- `per_element`: the function the op implements when a device prices it per
  element instead of per FLOP ("softmax", "silu", "rmsnorm"; see roofline.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch

from perfcounter.trace import KINDS

aten = torch.ops.aten
ADD, MUL, DIV, SQRT, EXP, SPECIAL, CMP = range(len(KINDS))
PER_ELEMENT = ("softmax", "silu", "rmsnorm")
Packet = torch._ops.OpOverloadPacket
HigherOrderOperator = torch._ops.HigherOrderOperator


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
    """Primitive counts in trace.KINDS order, by name."""
    return (int(add), int(mul), int(div), int(sqrt), int(exp), int(special), int(cmp))


ZERO = Cost()


# --- what a formula sees of a tensor ------------------------------------------------


class Shape(tuple):
    """A tensor's shape that also carries its dtype; equal to the plain tuple.

    Formulas take shapes and dtypes, not tensors: a test passes plain tuples (no
    dtype: a real dtype is assumed), the mode passes `shape_tree(args)`."""

    def __new__(cls, dims, dtype: torch.dtype | None = None):
        self = super().__new__(cls, dims)
        self.dtype = dtype
        return self


def shape_tree(x):
    """An op's arguments (or outputs) as a formula sees them: every tensor becomes
    its `Shape` (dims and dtype), lists and tuples keep their structure."""
    if isinstance(x, torch.Tensor):
        return Shape(x.shape, x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(shape_tree(v) for v in x)
    return x


def dtype_of(shape) -> torch.dtype | None:
    """The dtype a shape carries, or None (a plain tuple, a scalar, None)."""
    return getattr(shape, "dtype", None)


def is_complex(x) -> bool:
    """A complex operand: a Shape of a complex dtype, or a Python complex scalar."""
    if isinstance(x, complex):
        return True
    dtype = dtype_of(x)
    return dtype is not None and dtype.is_complex


def numel(shape) -> int:
    """Elements of a shape (1 for the empty shape of a 0-d tensor)."""
    return math.prod(shape)


def first_shape(out_shape):
    """The first output's shape (ops returning a tuple list it first)."""
    if out_shape and isinstance(out_shape[0], (tuple, list)):
        return tuple(out_shape[0])
    return out_shape


def rows(shape, n_last: int) -> int:
    """How many rows of n_last elements a shape holds."""
    return numel(shape) // n_last if n_last else 0


def log2_ceil(n: int) -> int:
    """⌈log2 n⌉, at least 1: comparisons per element of a sort or a heap of n."""
    return max(1, math.ceil(math.log2(max(n, 2))))


# --- the registry -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpInfo:
    """All the registry knows of one op packet (see the module docstring)."""

    formula: Callable[..., Cost] | None = None
    write_only: bool = False
    cache_write: bool = False
    join: bool = False
    factory: bool = False
    attention: bool = False
    per_element: str | None = None

    @property
    def extern(self) -> bool:
        """Whether a compiler keeps the op a kernel of its own (an attention kernel, a
        matmul-family formula: mm, addmm, bmm, linear, convolutions...) rather than fusing it
        with its neighbours; pricing/predict.py's EXTERN classes are these ops."""
        return self.attention or (self.formula is not None
                                  and self.formula.__module__.rsplit(".", 1)[-1] == "matmul")


OPS: dict[Packet | HigherOrderOperator, OpInfo] = {}
COSTS: dict[Packet | HigherOrderOperator, Callable[..., Cost]] = {}  # the ops with a formula
_BY_NAME: dict[str, Packet | HigherOrderOperator] = {}  # "aten.mm" -> aten.mm


def op_name(op) -> str:
    """'aten.mm' for a packet, 'flex_attention' for a higher-order op."""
    return op.name() if isinstance(op, HigherOrderOperator) else str(op)


def _check_target(op) -> None:
    if isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"register({op}): that is one overload of an op, which the registry never "
                        f"matches; pass the packet, register({op._overloadpacket}), so that every "
                        f"overload is counted")
    if not isinstance(op, (Packet, HigherOrderOperator)):
        raise TypeError(f"register({op!r}): expected an aten OpOverloadPacket (aten.mm) or a "
                        f"HigherOrderOperator, got {type(op).__name__}")


def register(*ops, write_only=False, cache_write=False, join=False, factory=False,
             attention=False, per_element=None):
    """Register ops with their flags now; the returned decorator attaches their formula.

    `@register(aten.mm, aten.bmm)` over a function: the ops and their formula.
    `register(aten.set_, write_only=True)` as a statement: flags only; the op
    keeps no formula (its FLOPs stay uncounted). An op registered twice, or a
    formula attached twice, is an error."""
    if not ops:
        raise TypeError("register() needs at least one op")
    if per_element not in (None, *PER_ELEMENT):
        raise ValueError(f"per_element={per_element!r}; expected None or one of {', '.join(PER_ELEMENT)}")
    for op in ops:
        _check_target(op)
    for i, op in enumerate(ops):
        if op in OPS or op in ops[:i]:
            first = OPS[op].formula if op in OPS else None
            raise ValueError(f"{op_name(op)} registered twice (first with formula "
                             f"{first.__name__ if first else 'none'})")
    info = OpInfo(None, bool(write_only), bool(cache_write), bool(join), bool(factory),
                  bool(attention), per_element)
    for op in ops:
        OPS[op] = info
        _BY_NAME[op_name(op)] = op

    def attach(fn: Callable[..., Cost]) -> Callable[..., Cost]:
        for op in ops:
            if OPS[op].formula is not None:
                raise ValueError(f"cost formula for {op_name(op)} registered twice "
                                 f"({OPS[op].formula.__name__} and {fn.__name__})")
        for op in ops:
            OPS[op] = replace(OPS[op], formula=fn)
            COSTS[op] = fn
        return fn

    return attach


def op_info(op) -> OpInfo | None:
    """What the registry knows of an op packet (or higher-order op), or None."""
    return OPS.get(op)


def op_info_by_name(name: str) -> OpInfo | None:
    """The same by a record's op name: 'aten.mm.default', 'aten.mm' or 'flex_attention'."""
    op = _BY_NAME.get(name)
    if op is None and name.count(".") >= 2:
        op = _BY_NAME.get(name.rsplit(".", 1)[0])  # drop the overload name
    return None if op is None else OPS[op]
