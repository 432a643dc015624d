"""Op-level benchmark: a trace's eager latency on this machine, from its op signatures alone.

For each distinct op signature of a trace (op, each argument's shape, stride and dtype,
typed scalars), `op_bench` makes inputs on a local device,
times the op cold — input sets rotated so that, up to `cold_bytes` in all, each
call finds its operands out of cache — and sums calls x seconds per call over
the trace. It needs no weights: a trace counted from a config alone (under
FakeTensorMode) is enough, and it may be called under FakeTensorMode (inputs
are made real). It checks predict.py: the op-level sum is what the ops cost
here one by one, with their dispatch, without the model's Python between them.

Arguments come back from the record's args (trace_args.py): a tensor becomes one of
its shape, strides (as_strided on a storage that holds them: a strided view stays
strided) and dtype (integers zero, so indices are valid; booleans True; floats
random); a scalar keeps its value, a dtype, layout or memory format its torch
object. An op that cannot be rebuilt so (a quantized weight's storage, another
value such as a device, a call that fails) is timed as a proxy: a copy that moves
the record's bytes per call; the result counts those. Records without arguments
(views, metadata) cost one view call each.

Times are cached per signature, device and clock: `cache_info()`, `cache_clear()`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from perfcounter.devices.calibrate import measurable_device
from perfcounter.devices.op_rates import check_clock, last_level_cache_bytes, time_calls
from perfcounter.pricing.predict import op_class
from perfcounter.trace import Trace
from perfcounter.trace_args import Const, Keyword, TensorArg, contiguous, signature

MiB = 1 << 20
MAX_SETS = 64  # input sets rotated at most, whatever the size
VIEW_ARGS = (contiguous((64,)), (-1,))  # what a view record's call is timed as


class Signature(NamedTuple):
    """What an op's time depends on: the cache key (scalars typed: 1 and 1.0 differ)."""

    op: str
    args: tuple  # ("t", shape, stride, dtype) per tensor, (type name, value) per scalar
    dtype: str
    device: str
    clock: str


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    currsize: int


_CACHE: dict[Signature, tuple[float, bool]] = {}  # signature -> (seconds per call, proxy)
_STATS = {"hits": 0, "misses": 0}


def cache_info() -> CacheInfo:
    """Hits, misses and size of the per-signature time cache."""
    return CacheInfo(_STATS["hits"], _STATS["misses"], len(_CACHE))


def cache_clear() -> None:
    """Forget every cached time (and the hit and miss counts)."""
    _CACHE.clear()
    _STATS.update(hits=0, misses=0)


def _overload(name: str):
    """torch.ops.aten.mm.default for 'aten.mm.default' (None when there is none)."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return None


def _typed(x):
    """A hashable key of one argument, scalars typed (1 and 1.0 hash alike)."""
    kind = type(x)
    if kind is TensorArg:
        return ("t", x.shape, x.stride, x.dtype)
    if kind is tuple:
        return ("[", tuple(_typed(v) for v in x))
    if kind is Keyword:
        return ("keyword", x.name, _typed(x.value))
    return (kind.__name__, x.text if kind is Const else x)


_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


def _rebuildable(x) -> bool:
    """Whether an argument can be made here: no quantized storage, no value but a dtype,
    layout or memory format."""
    kind = type(x)
    if kind is TensorArg:
        return not x.tag
    if kind is tuple:
        return all(_rebuildable(v) for v in x)
    if kind is Keyword:
        return _rebuildable(x.value)
    if kind is Const:
        name = x.text.removeprefix("torch.")
        return x.text.startswith("torch.") and isinstance(getattr(torch, name, None), _TORCH_VALUES)
    return True


def _tensor(t: TensorArg, device: str):
    """A tensor of t's shape, strides and dtype (see the module doc)."""
    dtype = getattr(torch, t.dtype, None)
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    stride = t.stride or contiguous(t.shape).stride
    size = 1 + sum((n - 1) * st for n, st in zip(t.shape, stride)) if all(t.shape) else 0
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.rand(size, device=device).to(dtype)
    elif dtype == torch.bool:
        base = torch.ones(size, dtype=dtype, device=device)
    else:
        base = torch.zeros(size, dtype=dtype, device=device)
    return base.as_strided(t.shape, stride)


def _value(x, device: str):
    kind = type(x)
    if kind is TensorArg:
        return _tensor(x, device)
    if kind is tuple:
        return [_value(v, device) for v in x]
    if kind is Const:
        return getattr(torch, x.text.removeprefix("torch."))
    return x


def _spec(op, args: tuple, dtype: str, device: str, clock: str = "wall"):
    """(Signature, builder of one input set) of a record's args; (Signature, None) when
    the op cannot be rebuilt from them."""
    overload = _overload(op)
    positional = [a for a in args if type(a) is not Keyword]
    named = {a.name: a.value for a in args if type(a) is Keyword}
    names = {a.name for a in overload._schema.arguments} if overload is not None else set()
    if (overload is None or not _rebuildable(args) or len(positional) > len(names)
            or any(k not in names for k in named)):
        return Signature(op, (("raw", signature(args)),), dtype, device, clock), None

    def build():
        values = [_value(a, device) for a in positional]
        keywords = {k: _value(v, device) for k, v in named.items()}
        return lambda: overload(*values, **keywords)

    return Signature(op, tuple(_typed(a) for a in args), dtype, device, clock), build


def _proxy(nbytes: int, device: str):
    """A copy moving `nbytes` (half read, half written): the time of an op not rebuilt."""
    n = max(1, nbytes // 8)
    src, dst = torch.rand(n, device=device), torch.empty(n, device=device)
    return lambda: dst.copy_(src)


@dataclass
class OpBenchResult:
    """A trace timed op by op: seconds in all and by op class; how many signatures were
    timed as a proxy (see the module doc)."""

    latency_s: float
    by_class: dict = field(default_factory=dict)
    signatures: int = 0
    proxies: int = 0
    device: str = "cpu"

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "by_class": dict(self.by_class),
                "signatures": self.signatures, "proxies": self.proxies, "device": self.device}


def time_op(op: str, args: tuple, dtype: str, nbytes: int, *, device="cpu",
            min_time: float = 0.01, cold_bytes: int | None = None,
            clock: str = "wall") -> tuple[float, bool]:
    """(seconds per call, timed as a proxy) of one op with `args` (OpRecord.args) on
    `device`, cold; cached."""
    dev = str(measurable_device(device, "benchmark ops on"))
    sig, build = _spec(op, args, dtype, dev, check_clock(clock))
    if sig in _CACHE:
        _STATS["hits"] += 1
        return _CACHE[sig]
    _STATS["misses"] += 1
    if cold_bytes is None:
        cold_bytes = min(512 * MiB, int(1.5 * (last_level_cache_bytes() or 32 * MiB)))
    sets = max(1, min(MAX_SETS, math.ceil(cold_bytes / max(nbytes, 1))))
    with unset_fake_temporarily(), torch.no_grad():
        calls, proxy = None, build is None
        if build is not None:
            try:
                calls = [build() for _ in range(sets)]
                calls[0]()
            except Exception:  # a signature that does not rebuild: priced as a proxy
                calls, proxy = None, True
        if calls is None:
            calls = [_proxy(nbytes, dev) for _ in range(min(sets, 8))]
        turn = iter(range(1 << 62))
        seconds = time_calls(lambda: calls[next(turn) % len(calls)], torch.device(dev),
                             min_time, clock)
    _CACHE[sig] = (seconds, proxy)
    return seconds, proxy


def op_bench(trace: Trace, device="cpu", *, min_time: float = 0.01,
             cold_bytes: int | None = None, clock: str = "wall") -> OpBenchResult:
    """The eager latency of `trace` on `device` (a local CPU or a present GPU), op by op;
    op times read from `clock` ("wall" or "cpu", see op_rates.CLOCKS)."""
    dev = str(measurable_device(device, "benchmark ops on"))
    check_clock(clock)
    view_s, _ = time_op("aten.view.default", VIEW_ARGS, "float32", 0, device=dev,
                        min_time=min_time, cold_bytes=1, clock=clock)
    total, by_class, proxies, seen = 0.0, {}, 0, set()
    for r in trace.records:
        if r.op.startswith("prim."):  # metadata queries, not op calls
            continue
        calls = max(r.calls, 1)
        if not r.args:
            seconds, proxy = view_s, False
        else:
            seconds, proxy = time_op(r.op, r.args, r.dtype, r.bytes // calls, device=dev,
                                     min_time=min_time, cold_bytes=cold_bytes, clock=clock)
            key = (r.op, r.shapes, r.args, r.dtype)
            if key not in seen:
                seen.add(key)
                proxies += proxy
        cls = op_class(r.op, r.args)
        by_class[cls] = by_class.get(cls, 0.0) + r.calls * seconds
        total += r.calls * seconds
    return OpBenchResult(total, by_class, len(seen), proxies, dev)
