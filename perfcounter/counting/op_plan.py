"""How the counter handles each aten op, decided once: its kind, and its plan per signature.

`classify(func)` says once per op how the dispatch mode treats it (`OpKind`):
count it, skip it as a view, run a composite's own decomposition under the
mode, or count it with a few numbers read from its data (`DATA`, op_data.py).

Composites (CompositeImplicitAutograd) reach the mode only under
inference_mode; under no_grad autograd has already decomposed them. The mode
runs the same C++ decomposition that autograd (and the uncounted
inference_mode run) would, so outputs are bitwise those of the uncounted run,
a view stays a view (eval-mode dropout returns its input), and the ops counted
are the same in both grad modes.

`plan_for(func, args, kwargs, out, kind)` returns the `OpPlan` of one call: all
that is constant across calls with the same op, shapes, dtypes and other
arguments — the FLOPs (from perfcounter.costs), which tensors are read and how
many bytes (`Read`), which are written in place (`Write`), which outputs are new
storages (`Output`), whether a compiler keeps it a kernel of its own (`extern`: a matmul
or attention; storage.py's fused IO) — and the call's tensors in argument order. Plans are kept
in `PLANS` (`cache_info()`, `cache_clear()`), keyed by a typed signature (each
tensor's shape, stride and dtype: a plan keeps the arguments as data, `arg_data`); scalar
arguments carry their type, since 1 and 1.0 hash alike but write different dtypes;
a DATA op's numbers are part of its key and reach its formula as keywords.
"""
from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from perfcounter import costs
from perfcounter._util import PerfcounterWarning
from perfcounter.counting import op_data
from perfcounter.counting.storage import (ACTIVATION, FRESH, JOINED, SKIP, flat_tensors,
                                          reported_role)
from perfcounter.trace import ROLES
from perfcounter.trace_args import Const, Keyword, plain, signature, tensor_arg

aten = torch.ops.aten
Tensor = torch.Tensor


class OpKind(enum.IntEnum):
    COUNT = 0  # priced by its formula (or its bytes only, when it has none)
    VIEW = 1  # moves no data (a view, or metadata)
    DYNAMIC = 2  # output shape depends on data: the key includes the output shapes
    HOP = 3  # a higher-order operator (flex attention)
    DATA = 4  # its plan reads a few numbers from the data (op_data.py): in the key
    DECOMPOSE = 5  # a composite reaching the mode (inference_mode): its C++ decomposition runs
    FRESH = 6  # lift_fresh: torch.tensor(...) made in the phase: a new activation, no bytes


class Handling(NamedTuple):
    kind: OpKind
    call: object  # what to call to run the op (an OpOverload's C++ callable when it has one)
    name: str  # "aten.mm.default"


# views whose schema does not say so
_EXTRA_VIEWS = {aten._unsafe_view, aten._reshape_alias, aten.detach_, aten.t_, aten.transpose_,
                aten.squeeze_, aten.unsqueeze_, aten.as_strided_, aten.swapdims_, aten.swapaxes_}
# id(op) -> Handling: ops live as long as the process, and an OpOverload hashes in Python
HANDLING: dict[int, Handling] = {}


def classify(func) -> Handling:
    """Decide once per op how the mode treats it."""
    if isinstance(func, torch._ops.HigherOrderOperator):
        kind = OpKind.HOP
    elif func._overloadpacket is aten.lift_fresh:
        kind = OpKind.FRESH
    elif _is_composite(func):
        kind = OpKind.DECOMPOSE
    elif func._overloadpacket in op_data.DATA_OPS:
        kind = OpKind.DATA
    elif func._overloadpacket in costs.COSTS:
        kind = OpKind.COUNT
    elif func._overloadpacket in _EXTRA_VIEWS or _is_view(func) or _is_metadata(func):
        kind = OpKind.VIEW
    else:
        kind = OpKind.COUNT
    if kind == OpKind.COUNT and torch.Tag.dynamic_output_shape in func.tags:
        kind = OpKind.DYNAMIC
    call = op_data.CALLS.get(getattr(func, "_overloadpacket", None))
    if call is None:
        call = func._op if type(func) is torch._ops.OpOverload else func  # one Python frame less
    handling = HANDLING[id(func)] = Handling(kind, call, str(func))
    return handling


def _to_same_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):
    """x.to(dtype) when it returns x itself, as its decomposition does without dispatching
    anything (so no_grad counts nothing either); None: decompose it."""
    if not copy and dtype == x.dtype and memory_format in (None, torch.preserve_format):
        return x, None
    return None


def _reshape_contiguous(x, shape):
    """x.reshape(shape) of a contiguous dense inference tensor: the aten.view its decomposition
    makes (an inference tensor keeps no view links that the dispatch keys skipped here would
    set); None (a copy may follow, or a normal tensor): decompose it."""
    if x.is_inference() and x.layout == torch.strided and x.is_contiguous():
        return aten.view.default(x, shape), "aten.view.default"
    return None


# composite overload -> (args) -> (output, view op it recorded or None), or None: decompose
SHORTCUTS = {aten.to.dtype: _to_same_dtype, aten.reshape.default: _reshape_contiguous}


def _is_composite(func) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    except RuntimeError:  # prim:: ops are not in the dispatcher's table
        return False


def _is_metadata(func) -> bool:
    """Ops that return no tensor (size, stride, device, ...): they move no data."""
    return all("Tensor" not in str(r.type) for r in func._schema.returns)


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


class Place(enum.IntEnum):
    """Where a read lands in its storage, for the compulsory model."""
    REGION = 0  # one contiguous region from the tensor's offset
    ROWS = 1  # scattered rows (embedding, gather): no offset
    BROADCAST = 2  # a broadcast view: never more than its storage


class Read(NamedTuple):
    index: int  # position in the call's tensors
    nbytes: int
    itemsize: int
    place: Place


class Write(NamedTuple):
    """An argument the op writes in place (or an out= argument)."""
    index: int
    nbytes: int
    scattered: bool  # only some elements (index_put_, scatter_): no offset


class Output(NamedTuple):
    """A returned tensor in a new storage."""
    index: int  # position among the flattened outputs
    nbytes: int


@dataclass(frozen=True, slots=True, eq=False)
class OpPlan:
    """What is constant across calls of one op with one argument signature."""

    name: str  # "aten.mm.default"
    dtype: str  # compute dtype ("bfloat16"), "" when no tensor
    args: tuple  # the arguments as data (trace_args): tensors' shape, stride and dtype
    shapes: str  # their display text "[6, 4096], [4096, 4096]" (trace_args.signature)
    cost: costs.Cost
    has_formula: bool
    reads: tuple[Read, ...]
    writes: tuple[Write, ...]
    outputs: tuple[Output, ...]
    out_role: int  # ACTIVATION, or FRESH (a factory), or JOINED (cat/stack)
    cache_write: bool  # a write into a buffer marks it KV cache
    attention: bool  # tensors 1 and 2 are keys and values
    dups: tuple[tuple[int, int], ...]  # reads that may be one tensor passed twice (x * x)
    extern: bool = False  # one kernel of its own when compiled (matmul, attention): costs.OpInfo
    contributions: dict = field(default_factory=dict)  # roles -> bytes by ROLES, see below

    @property
    def flops(self) -> int:
        return self.cost.flops

    @property
    def executed_flops(self) -> int:
        return self.cost.executed if self.cost.executed is not None else self.cost.flops

    def contribution(self, roles: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One call's (bytes read, bytes written) by ROLES, given the role each of its
        tensors had: reads, then in-place writes, then outputs (SKIP: read once already)."""
        found = self.contributions.get(roles)
        if found is None:
            read, written = [0] * len(ROLES), [0] * len(ROLES)
            sizes = ([r.nbytes for r in self.reads], [w.nbytes for w in self.writes]
                     + [o.nbytes for o in self.outputs])
            n_reads = len(self.reads)
            for pos, role in enumerate(roles):
                if role == SKIP:
                    continue
                if pos < n_reads:
                    read[reported_role(role)] += sizes[0][pos]
                else:
                    written[reported_role(role)] += sizes[1][pos - n_reads]
            found = self.contributions[roles] = (tuple(read), tuple(written))
        return found


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    currsize: int


class PlanCache:
    """Plans by typed signature, shared by every counter (a plan depends on shapes only)."""

    MAX_SIZE = 200_000

    def __init__(self):
        self.plans: dict[tuple, OpPlan] = {}
        self.lookups = 0
        self.misses = 0

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self.lookups - self.misses, self.misses, len(self.plans))

    def cache_clear(self) -> None:
        self.plans.clear()
        self.lookups = self.misses = 0


PLANS = PlanCache()


def plan_for(func, args, kwargs, out, kind, data: tuple = ()) -> tuple[OpPlan, list]:
    """The plan of one call and the call's tensors in argument order; `data`: a DATA op's
    (name, value) pairs, passed to its formula as keywords."""
    tensors = []
    key = [id(func)]
    values = args
    if kwargs:
        key.append(tuple(kwargs))  # the names; their values follow the positional ones
        values = (*args, *kwargs.values())
    head = len(key)
    try:
        _key_of(values, key, tensors, True)  # the hot path: strides read directly
    except RuntimeError:  # a layout without strides (sparse): () for those
        del key[head:]
        tensors.clear()
        _key_of(values, key, tensors, False)
    if kind == OpKind.DYNAMIC:
        key.extend(t.shape for t in flat_tensors(out))
    elif data:
        key.append(data)
    PLANS.lookups += 1
    try:
        key = tuple(key)
        plan = PLANS.plans.get(key)
    except TypeError:  # an unhashable argument: plan this call afresh
        key, plan = None, None
    if plan is None:
        PLANS.misses += 1
        plan = _make_plan(func, args, kwargs, out, tensors, data)
        if key is not None:
            if len(PLANS.plans) >= PLANS.MAX_SIZE:
                PLANS.plans.clear()
            PLANS.plans[key] = plan
    return plan, tensors


def _make_plan(func, args, kwargs, out, tensors, data=()) -> OpPlan:
    name = str(func)
    packet = getattr(func, "_overloadpacket", func)
    info = costs.op_info(packet)
    formula = info.formula if info is not None else None
    flat_args = _schema_args(func, args, kwargs, len(tensors))
    out_tensors = flat_tensors(out)
    dtype = next((_dtype_name(t.dtype) for t in [*tensors, *out_tensors] if t.is_floating_point()),
                 _dtype_name(tensors[0].dtype) if tensors else "")
    cost, has_formula = costs.ZERO, formula is not None
    if formula is not None:
        try:
            cost = formula(*costs.shape_tree(args), out_shape=costs.shape_tree(out),
                           **{k: costs.shape_tree(v) for k, v in kwargs.items()},
                           **dict(data))
        except Exception as e:  # a formula that cannot price these arguments
            has_formula = False
            warnings.warn(f"perfcounter: cost formula for {name} failed on "
                          f"{signature(arg_data(args, kwargs))}: {e!r}; counting its bytes only", PerfcounterWarning, stacklevel=4)
    write_only = info is not None and info.write_only
    reads, writes = [], []
    for i, t in enumerate(tensors):
        written, arg_name = flat_args[i]
        itemsize, numel = t.element_size(), t.numel()
        if written:
            scattered = cost.write_elems is not None
            writes.append(Write(i, (cost.write_elems if scattered else numel) * itemsize, scattered))
            if write_only or arg_name == "out":
                continue
        elems = cost.read_elems[i] if cost.read_elems and i < len(cost.read_elems) else None
        place = (Place.ROWS if elems is not None else Place.BROADCAST
                 if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)) else Place.REGION)
        reads.append(Read(i, (numel if elems is None else elems) * itemsize, itemsize, place))
    schema = getattr(func, "_schema", None)
    aliased = [r.alias_info is not None for r in schema.returns] if schema is not None else []
    outputs = []
    for j, o in enumerate(out_tensors):
        if aliased and (aliased[0] if len(aliased) == 1 else j < len(aliased) and aliased[j]):
            continue  # a view of an input, or the in-place target itself
        n = o.numel() if cost.write_elems is None or writes else cost.write_elems
        outputs.append(Output(j, n * o.element_size()))
    out_role = (FRESH if info is not None and info.factory else
                JOINED if info is not None and info.join else ACTIVATION)
    dups = tuple((a.index, b.index) for k, a in enumerate(reads) for b in reads[k + 1:]
                 if tensors[a.index].shape == tensors[b.index].shape
                 and tensors[a.index].dtype == tensors[b.index].dtype)
    data_args = arg_data(args, kwargs)
    return OpPlan(name, dtype, data_args, signature(data_args), cost, has_formula, tuple(reads),
                  tuple(writes), tuple(outputs), out_role,
                  info is not None and info.cache_write, info is not None and info.attention, dups,
                  info is not None and info.extern)


def _key_of(values, key: list, tensors: list, strided: bool) -> None:
    """Append each argument's part of a plan key (a tensor: shape, stride, dtype; a list:
    its length and items; else type and value) to `key`, and its tensors to `tensors`;
    strided=False: strides through _stride, for layouts without them."""
    for a in values:
        if isinstance(a, Tensor):
            tensors.append(a)
            key.append(a.shape)
            key.append(a.stride() if strided else _stride(a))
            key.append(a.dtype)
        elif type(a) is list or type(a) is tuple:
            key.append(len(a))
            for b in a:
                if isinstance(b, Tensor):
                    tensors.append(b)
                    key.append(b.shape)
                    key.append(b.stride() if strided else _stride(b))
                    key.append(b.dtype)
                else:
                    key.append(type(b))
                    key.append(b)
        else:
            key.append(type(a))
            key.append(a)


def _stride(t: Tensor) -> tuple[int, ...]:
    """t's strides; () for a layout without them (sparse)."""
    try:
        return t.stride()
    except RuntimeError:
        return ()


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def arg_data(args, kwargs) -> tuple:
    """The call's arguments as data (trace_args.py): each tensor's shape, stride (dims of
    size 1 canonical) and dtype, lists as tuples, keywords after the positional ones, plain
    scalars as their values."""

    def data(x):
        if isinstance(x, Tensor):
            return tensor_arg(x.shape, _stride(x), _dtype_name(x.dtype))
        if isinstance(x, (list, tuple)):
            return tuple(data(v) for v in x)
        return x if plain(x) else Const(repr(x))

    return (*[data(a) for a in args], *[Keyword(k, data(v)) for k, v in kwargs.items()])


def _schema_args(func, args, kwargs, n_tensors) -> list[tuple[bool, str]]:
    """For each tensor in flattened argument order: (is written by the op, argument name)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return [(False, "")] * n_tensors
    by_name = {a.name: a for a in schema.arguments}
    result = []
    pairs = list(zip(schema.arguments, args)) + [(by_name.get(k), v) for k, v in kwargs.items()]
    for arg, value in pairs:
        written = bool(arg is not None and arg.alias_info is not None and arg.alias_info.is_write)
        result += [(written, arg.name if arg is not None else "")] * len(flat_tensors(value))
    return result + [(False, "")] * (n_tensors - len(result))
