"""Op-level benchmark: a trace's eager latency on this machine, from its op signatures alone.

For each distinct op signature of a trace (op, argument shapes, dtype, strides:
every input is made contiguous), `op_bench` makes inputs on a local device,
times the op cold — input sets rotated so that, up to `cold_bytes` in all, each
call finds its operands out of cache — and sums calls x seconds per call over
the trace. It needs no weights: a trace counted from a config alone (under
FakeTensorMode) is enough, and it may be called under FakeTensorMode (inputs
are made real). It checks predict.py: the op-level sum is what the ops cost
here one by one, with their dispatch, without the model's Python between them.

Arguments come back from the record's signature ("[1, 576], [576, 960], dim=1")
read against the op's schema: a Tensor argument becomes a tensor of that shape
(integer indices of zeros, masks of True, the rest of the record's dtype); a
scalar keeps its value. An op that cannot be rebuilt so (an argument that is
not a Python literal, a call that fails) is timed as a proxy: a copy that moves
the record's bytes per call; the result counts those. Records without a shape
signature (views, metadata) cost one view call each.

Times are cached per signature, device and clock: `cache_info()`, `cache_clear()`.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from perfcounter.devices.calibrate import measurable_device
from perfcounter.devices.op_rates import check_clock, last_level_cache_bytes, time_calls
from perfcounter.pricing.predict import op_class
from perfcounter.trace import Trace

MiB = 1 << 20
MAX_SETS = 64  # input sets rotated at most, whatever the size


class Signature(NamedTuple):
    """What an op's time depends on: the cache key (scalars typed: 1 and 1.0 differ)."""

    op: str
    args: tuple  # ("t", shape, strides) per tensor, (type name, value) per scalar
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


def _parse(shapes: str):
    """(positional values, {keyword: value}) of a record's signature; None when some
    argument is not a Python literal."""
    try:
        call = ast.parse(f"f({shapes})", mode="eval").body
        return ([ast.literal_eval(a) for a in call.args],
                {k.arg: ast.literal_eval(k.value) for k in call.keywords})
    except (SyntaxError, ValueError, TypeError):
        return None


def _is_tensor_type(arg, many: bool = False) -> bool:
    text = str(arg.type)
    return text.startswith("List[Tensor") or text.startswith("List[Optional[Tensor") if many \
        else text in ("Tensor", "Optional[Tensor]")


def _freeze(value):
    """Lists as tuples, all the way down (a cache key must hash)."""
    return tuple(_freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


def _strides(shape) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def _spec(op, shapes: str, dtype: str, device: str, clock: str = "wall"):
    """(Signature, builder of one input set) of a record; (Signature, None) when the op
    cannot be rebuilt from its signature."""
    parsed, overload = _parse(shapes), _overload(op)
    if parsed is None or overload is None:
        return Signature(op, (("raw", shapes),), dtype, device, clock), None
    args, kwargs = parsed
    schema = {a.name: a for a in overload._schema.arguments}
    order = list(overload._schema.arguments)
    if len(args) > len(order) or any(k not in schema for k in kwargs):
        return Signature(op, (("raw", shapes),), dtype, device, clock), None
    floating = getattr(torch, dtype, None) if dtype else None
    floating = floating if isinstance(floating, torch.dtype) else torch.float32
    slots = [(order[i], v) for i, v in enumerate(args)] + [(schema[k], v) for k, v in kwargs.items()]

    def kind(arg, value):
        if _is_tensor_type(arg) and isinstance(value, list) and all(isinstance(d, int) for d in value):
            return ("t", tuple(value), _strides(value))
        if _is_tensor_type(arg, many=True) and isinstance(value, list):
            return ("ts", tuple(("t", tuple(v), _strides(v)) if isinstance(v, list) else
                                (type(v).__name__, v) for v in value))
        return (type(value).__name__, _freeze(value))

    key = tuple(kind(a, v) for a, v in slots)

    def tensor(arg_name: str, shape):
        if arg_name in ("index", "indices", "indices_or_sections") or "index" in arg_name:
            return torch.zeros(shape, dtype=torch.long, device=device)
        if "mask" in arg_name or arg_name == "condition":
            return torch.ones(shape, dtype=torch.bool, device=device)
        return torch.rand(shape, device=device).to(floating)

    def build():
        values = {}
        for (arg, value), k in zip(slots, key):
            if k[0] == "t":
                values[arg.name] = tensor(arg.name, k[1])
            elif k[0] == "ts":
                values[arg.name] = [tensor(arg.name, s[1]) if s[0] == "t" else s[1] for s in k[1]]
            else:
                values[arg.name] = value
        positional = [values[a.name] for a in order[:len(args)]]
        named = {k: values[k] for k in kwargs}
        return lambda: overload(*positional, **named)

    return Signature(op, key, dtype, device, clock), build


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


def time_op(op: str, shapes: str, dtype: str, nbytes: int, *, device="cpu",
            min_time: float = 0.01, cold_bytes: int | None = None,
            clock: str = "wall") -> tuple[float, bool]:
    """(seconds per call, timed as a proxy) of one op signature on `device`, cold; cached."""
    dev = str(measurable_device(device, "benchmark ops on"))
    sig, build = _spec(op, shapes, dtype, dev, check_clock(clock))
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
    view_s, _ = time_op("aten.view.default", "[64], [-1]", "float32", 0, device=dev,
                        min_time=min_time, cold_bytes=1, clock=clock)
    total, by_class, proxies, seen = 0.0, {}, 0, set()
    for r in trace.records:
        if r.op.startswith("prim."):  # metadata queries, not op calls
            continue
        calls = max(r.calls, 1)
        if not r.shapes:
            seconds, proxy = view_s, False
        else:
            seconds, proxy = time_op(r.op, r.shapes, r.dtype, r.bytes // calls, device=dev,
                                     min_time=min_time, cold_bytes=cold_bytes, clock=clock)
            key = (r.op, r.shapes, r.dtype)
            if key not in seen:
                seen.add(key)
                proxies += proxy
        cls = op_class(r.op, r.shapes)
        by_class[cls] = by_class.get(cls, 0.0) + r.calls * seconds
        total += r.calls * seconds
    return OpBenchResult(total, by_class, len(seen), proxies, dev)
