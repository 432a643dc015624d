"""THE pricing rule: a step's (or a phase's) figures (figures.py) on a device in a regime.

    price(figures, spec, execution) -> Prediction

The regimes are named once (regimes.py's REGIMES: the bound and devices/spec.py's
EXECUTIONS) and checked once (regimes.check_regime, re-exported here). "bound" is the least
any regime can take; the others are
perfcounter's predictions (predict.py's module doc says what each charges and where each rate
comes from). Every group of the figures is priced as

    calls x overhead(execution) + max(flops / F, bytes / B) [+ a GEMV's weight rows x the time
        per row] [+ calls x a GPU kernel's fixed time]

eager: each group so, the dispatch hidden behind the kernels' work on an asynchronous device;
compiled and cudagraphs: matmuls and attention (EXTERN) so, the rest one fused group moving
the step's fused IO at the elementwise rate (compiled: a launch per kernel, an entry per step,
hidden behind the kernels on an asynchronous device; cudagraphs: one graph launch a step).

The rates each group is priced at are rates.py's (looked up once per group structure in a
serving loop). The bound ("bound", bound.py): no fixed cost, every rate at the highest any
regime could use for that group, its FLOPs the executed ones and the fewest bytes any regime
moves; so bound <= every regime's price (tests/test_bound_bounds.py holds it on random steps).

Collectives (op class "collective": all-reduce, all-gather, send/recv, all-to-all on a link)
take their link's seconds (pricing/collectives.py's call_seconds: record_seconds' rule, from
the figures' (kind, ranks) and bytes a call) in every regime, the bound included: neither an
extern kernel nor fused, they add to the step's work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcounter.pricing.achievable import ASYNCHRONOUS, compiled_step_s, overhead
from perfcounter.pricing import links
from perfcounter.pricing.collectives import call_seconds
from perfcounter.pricing.bound import bound_parts
from perfcounter.pricing.figures import Figures
from perfcounter.pricing.rates import fused_rate, group_rates, structure
from perfcounter.pricing.regimes import REGIMES, check_regime  # noqa: F401 (re-exported)
from perfcounter.pricing.roofline import crosses_host_link

@dataclass(slots=True)
class Prediction:
    """A phase's (or step's) price on one device; seconds unless named otherwise. (Not
    frozen: a frozen dataclass takes 2 us more to build, a fifth of a serving step's bound.)"""

    execution: str
    overhead_s: float  # Σ fixed costs
    work_s: float  # Σ max(compute, memory) (+ GEMV rows) over ops or fused groups
    host_link_s: float
    by_class: dict  # op class -> seconds (overhead included); "fused" for compiled groups
    basis: str  # where the rates came from: "curve", "efficiency", "default", "peak" (joined)
    op_calls: int  # op calls priced (compiled, CUDA graphs: kernels, extern and fused)
    strided_s: float = 0.0  # eager: work on strided views at the stated share (module doc)
    host_shown: float = 1.0  # compiled: the share of the host's launches the phase shows
    # (below 1 where an asynchronous device's kernels hide them, module doc)
    fixed_s: float = 0.0  # of work_s: the kernels' fixed device time on a GPU (kernel_s)
    groups: "GroupCosts | None" = field(default=None, compare=False, repr=False)

    @property
    def latency_s(self) -> float:
        return self.overhead_s + self.work_s + self.host_link_s

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "execution": self.execution,
                "overhead_s": self.overhead_s, "work_s": self.work_s,
                "host_link_s": self.host_link_s, "by_class": dict(self.by_class),
                "basis": self.basis, "op_calls": self.op_calls, "strided_s": self.strided_s,
                "fixed_s": self.fixed_s}


@dataclass(frozen=True)
class GroupCosts:
    """Each group's seconds in a regime (eager: all; compiled: the extern ones' alone)."""

    cls: tuple
    overhead_s: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    rows_s: np.ndarray
    fixed_s: np.ndarray
    basis: tuple
    strided: np.ndarray


def streams_cold(fig: Figures, spec) -> bool:
    """True when one step's distinct bytes exceed the spec's cache (unknown cache: True)."""
    if not spec.cache_bytes:
        return True
    return fig.compulsory_bytes / max(fig.steps, 1) > spec.cache_bytes


def host_link_s(fig: Figures, spec, cache: dict | None = None) -> float:
    """Seconds of the step's inputs in and its output back over the host link (roofline.py)."""
    crosses = None if cache is None else cache.get("host link")
    if crosses is None:
        crosses = crosses_host_link(spec)
        if cache is not None:
            cache["host link"] = crosses
    if not crosses:
        return 0.0
    return links.host_link_s(spec, fig.to_device_bytes, fig.to_host_bytes)


def collective_s(fig: Figures, spec, cache: dict | None = None) -> np.ndarray:
    """Each group's seconds on the link: a collective's calls x one call's
    (collectives.call_seconds, the bytes a call writes), 0 for every other group. cache: a
    dict kept for one spec (a serving table's), holding each call's seconds by (kind, bytes,
    ranks): a serving loop prices the same calls at every step."""
    out = np.zeros(len(fig))
    for g, c in enumerate(fig.collective):
        if c is not None and fig.calls[g]:
            kind, ranks = c
            nbytes = fig.link_bytes[g] / fig.calls[g]
            if cache is None:
                one = call_seconds(kind, nbytes, ranks, spec)
            else:
                key = ("collective", kind, float(nbytes), ranks)
                one = cache.get(key)
                if one is None:
                    one = cache[key] = call_seconds(kind, nbytes, ranks, spec)
            out[g] = fig.calls[g] * one
    return out


def price(fig: Figures, spec, execution: str, *, cache: dict | None = None,
          detail: bool = True) -> Prediction:
    """The price of figures `fig` on `spec` run `execution` (REGIMES; the module doc).
    cache: see group_rates; detail=False leaves by_class, basis and groups out (a serving
    loop: the same seconds)."""
    check_regime(execution)
    link = host_link_s(fig, spec, cache)
    shape = structure(fig, cache)
    on_link = collective_s(fig, spec, cache) if shape.any_linked else None
    linked_s = float(on_link @ shape.ones) if on_link is not None else 0.0
    if execution == "bound":
        compute, memory = bound_parts(fig, spec, shape, lambda: streams_cold(fig, spec), cache)
        if not detail:
            return Prediction("bound", 0.0, max(compute, memory) + linked_s, link, {}, "", 0)
        return Prediction("bound", 0.0, max(compute, memory) + linked_s, link,
                          {"compute": compute, "memory": memory, "collective": linked_s},
                          "peak", int(fig.calls @ shape.ones))
    cold = streams_cold(fig, spec)
    work = _group_work(fig, group_rates(fig, spec, cold, cache), shape, on_link, linked_s)
    if execution == "eager":
        return _eager(fig, spec, cold, work, link, detail)
    return _compiled(fig, spec, execution, cold, work, link, cache, detail)


@dataclass(slots=True)
class _GroupWork:
    """Each group's device time before any fixed cost of a regime (seconds, one a group):
    compute and memory at the group's rates, a GEMV's weight rows, a GPU kernel's fixed time,
    and `total` = max(compute, memory) + rows + fixed, a collective's its link's (collective_s)."""

    rates: object  # rates.Rates: the class, basis and strided share of each group
    shape: object  # rates.Structure
    compute: np.ndarray
    memory: np.ndarray
    rows_s: np.ndarray
    fixed: np.ndarray
    total: np.ndarray
    linked_s: float  # Σ the collectives' seconds on the link


def _group_work(fig: Figures, rt, shape, on_link, linked_s: float) -> _GroupWork:
    """Each group's work at rates `rt` (group_rates): dense FLOPs where the group computes
    them all, else the executed ones; a kernel's fixed time where it moves or computes."""
    flops = np.where(fig.dense, fig.flops, fig.executed_flops)
    compute = flops * rt.per_flop
    memory = fig.bytes * rt.per_byte
    moves = (fig.bytes > 0) | (fig.executed_flops > 0)
    fixed = fig.calls * rt.kernel * moves
    rows_s = fig.calls * rt.row_s
    total = np.maximum(compute, memory) + rows_s + fixed
    if on_link is not None:  # a collective's time is its link's, in every regime
        total[shape.linked] = on_link[shape.linked]
    return _GroupWork(rt, shape, compute, memory, rows_s, fixed, total, linked_s)


def _eager(fig: Figures, spec, cold: bool, w: _GroupWork, link: float,
           detail: bool) -> Prediction:
    """Eager: every group at its work plus its calls' dispatch; on an asynchronous device the
    dispatch shows only where it outlasts the kernels (each op its share)."""
    rt, shape = w.rates, w.shape
    per_call = overhead(spec, "eager", cold, fig.program_dtype)
    over = fig.calls * per_call
    total = float(w.total @ shape.ones)
    dispatch = float(over @ shape.ones) + fig.view_calls * per_call
    shown = 1.0
    if spec.device_type in ASYNCHRONOUS:  # the host dispatches ahead of the kernels
        shown = max(dispatch - total, 0.0) / dispatch if dispatch else 0.0
    if not detail:
        return Prediction("eager", dispatch * shown, total, link, {}, "", 0)
    by_class: dict = {}
    for c, s in zip(rt.cls, over * shown + w.total):
        by_class[c] = by_class.get(c, 0.0) + float(s)
    return Prediction("eager", dispatch * shown, total, link, by_class,
                      "+".join(sorted(set(rt.basis) - {""})), int(fig.calls.sum()),
                      float(w.total[rt.strided].sum()), fixed_s=float(w.fixed.sum()),
                      groups=GroupCosts(rt.cls, over * shown, w.compute, w.memory, w.rows_s,
                                        w.fixed, rt.basis, rt.strided))


@dataclass(slots=True)
class _Fused:
    """A compiled step's fused groups as one: its kernels (one a step and one after each
    extern kernel), their seconds (fixed time included) and where their rate came from."""

    present: bool  # any fusable group moves bytes
    ext_calls: float  # the extern kernels' calls
    kernels: float
    seconds: float
    fixed_s: float
    basis: str | None


def _fused(fig: Figures, spec, shape, cold: bool, cache: dict | None, detail: bool) -> _Fused:
    """The fused groups: neither extern nor collectives, moving bytes; they move the fused
    IO, else (not counted) the compulsory bytes the extern kernels do not already stream."""
    present = bool(fig.bytes @ shape.fusable_f > 0)  # (bytes are never negative)
    fused_bytes = 0.0
    if present:
        fused_bytes = fig.fused_bytes or \
            max(0.0, fig.compulsory_bytes - float(fig.streamed @ shape.extern_f))
    ext_calls = float(fig.calls @ shape.extern_f)
    kernels = ext_calls + max(fig.steps, 1)
    fused = (fig.bytes > 0) * shape.fusable_f
    dtype = fig.dtype[int(np.argmax(fig.bytes * fused))] if present else ""
    if not present:
        basis = fused_rate(spec, dtype, cold, 0.0, None)[3] if detail else None
        return _Fused(False, ext_calls, kernels, 0.0, 0.0, basis)
    flops_per_s, bandwidth, per_kernel, basis, _ = fused_rate(
        spec, dtype, cold, fused_bytes / kernels, cache)
    fixed = kernels * per_kernel
    seconds = max(float(fig.executed_flops @ fused) / flops_per_s,
                  fused_bytes / bandwidth) + fixed
    return _Fused(True, ext_calls, kernels, seconds, fixed, basis)


def _launches(fig: Figures, spec, execution: str, f: _Fused, per_call: float) -> dict:
    """The host's seconds a step, by what it launches: cudagraphs one graph a step, no launch
    per kernel; compiled a launch per kernel (`per_call` an extern one) and the compiled
    program's entry per step."""
    steps = max(fig.steps, 1)
    if execution == "cudagraphs":
        return {"graph launch": steps * overhead(spec, "cudagraphs")}
    fused = (steps + f.ext_calls) * overhead(spec, "compiled") if f.present else 0.0
    return {"extern": f.ext_calls * per_call, "fused": fused + steps * compiled_step_s(spec)}


def _compiled(fig: Figures, spec, execution: str, cold: bool, w: _GroupWork, link: float,
              cache: dict | None, detail: bool) -> Prediction:
    """Compiled and cudagraphs: the extern groups at their work, the rest one fused group,
    the host's launches (compiled, asynchronous device: hidden behind the kernels)."""
    f = _fused(fig, spec, w.shape, cold, cache, detail)
    per_call = 0.0 if execution == "cudagraphs" else \
        overhead(spec, execution, cold, fig.program_dtype)
    host = _launches(fig, spec, execution, f, per_call)
    total = float(w.total @ w.shape.extern_f) + f.seconds + w.linked_s
    launches = sum(host.values())
    shown = 1.0  # the share of the host's time that the step's time shows
    if execution == "compiled" and spec.device_type in ASYNCHRONOUS and launches:
        shown = max(launches - total, 0.0) / launches  # launches overlap the kernels
    if not detail:
        return Prediction(execution, launches * shown, total, link, {}, "", 0, host_shown=shown)
    extern = w.shape.extern
    over = np.where(extern, fig.calls * per_call, 0.0)
    zero = np.zeros(len(fig))
    rt = w.rates
    groups = GroupCosts(rt.cls, over, np.where(extern, w.compute, zero),
                        np.where(extern, w.memory, zero), np.where(extern, w.rows_s, zero),
                        np.where(extern, w.fixed, zero), rt.basis, rt.strided)
    basis = (set(rt.basis) | {f.basis}) - {"", None}
    return Prediction(execution, launches * shown, total, link,
                      _compiled_by_class(execution, w, over, f, host, shown),
                      "+".join(sorted(basis)), int(f.ext_calls + (f.kernels if f.present else 0)),
                      host_shown=shown, fixed_s=float(w.fixed[extern].sum()) + f.fixed_s,
                      groups=groups)


def _compiled_by_class(execution: str, w: _GroupWork, over: np.ndarray, f: _Fused, host: dict,
                       shown: float) -> dict:
    """A compiled step's seconds by op class: the extern groups' (compiled: their launches'
    shown share too), the host's other launches, "fused" and "collective"."""
    by_class: dict = {}
    for c, t, o, e in zip(w.rates.cls, w.total, over, w.shape.extern):
        if e:
            by_class[c] = by_class.get(c, 0.0) + float(t)
            if execution == "compiled":
                by_class[c] += float(o) * shown
    for k, t in host.items():
        if k != "extern":
            by_class[k] = by_class.get(k, 0.0) + t * shown
    by_class["fused"] = by_class.get("fused", 0.0) + f.seconds
    if w.shape.any_linked:
        by_class["collective"] = w.linked_s
    return by_class


__all__ = ["REGIMES", "GroupCosts", "Prediction", "check_regime", "group_rates",
           "host_link_s", "price", "streams_cold"]
