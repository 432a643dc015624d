"""TransformerPerformanceCounter: count labelled phases of an inference.

    counter = TransformerPerformanceCounter(device_spec="h100-sxm")
    with counter.count("prefill", num_tokens=prompt_len):
        model(x)
    for _ in range(n):
        with counter.count("decode", num_tokens=1):   # accumulates
            model(tok)
    print(counter.print_summary(labels=["prefill", "decode"]))
    counter.to_json("performance_stats.json")

The names are those of torchao's removed prototype profiler. Differences, on
purpose: a repeated label accumulates (numbers summed, steps counted) where
torchao overwrote it; the measured latency excludes the counter's own
bookkeeping (both figures are kept); utilizations are fractions; a block run
on fake or meta tensors has no latency (None, shown "n/a"); a block that
raises records nothing.

JSON: to_json writes torchao's layout atomically — {label: stats dict}, each
with every key of torchao's PerformanceStats.to_dict() and ours beside them,
among them "device" and a "perfcounter" block (schema, version, io_model,
depth, and the run information a caller adds), so that no label can collide
with them. from_json reads that, the version-1 envelope ({"schema", "version",
"counts": {label: ...}}) and torchao's own files (their figures as given).

Timing: a timer from `timer_cls` (timer.py) per block: PerformanceTimer
(time.perf_counter) or CUDAPerformanceTimer (CUDA events, the device
synchronized); by default the CUDA one when CUDA is initialized. The
bookkeeping time the mode measures in itself is CPU time; on CUDA it overlaps
kernels still in flight, so the net latency is then a lower bound. What it
measures is its per-op work after each op returns; dispatching ops to Python
at all and the module hooks (together 1.2-1.3x a plain CPU decode step of a
small model: README, Overhead) stay in the net latency.
"""
from __future__ import annotations

import dataclasses
import json
import os
from contextlib import contextmanager

from perfcounter._util import VERSION, atomic_write, did_you_mean, sum_or_none
from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.counting.module_path import check_depth
from perfcounter.counts_doc import (META_KEY, SCHEMA, SCHEMA_VERSION, read_counts,
                                    read_counts_file)
from perfcounter.devices import get_device_spec
from perfcounter.pricing.regimes import check_regime
from perfcounter.report.phase import Comparison, format_stats
from perfcounter.stats import PerformanceStats
from perfcounter.stats_dict import Totals
from perfcounter.timer import check_timer_cls, default_timer_cls
from perfcounter.trace import Block, Trace, build_trace, check_io_model

SUMMARY_LABEL = "Performance Summary"


class CountArgumentError(TypeError, ValueError):
    """A count() argument of the wrong type (caught as TypeError or ValueError)."""


class NestedCountError(RuntimeError):
    """count() entered while another count() of the same counter is open."""


def _resolve_spec(spec):
    """A DeviceSpec from a spec, a registry name or a YAML path (None stays None)."""
    if isinstance(spec, (str, os.PathLike)):
        return get_device_spec(os.fspath(spec))
    if spec is not None and not (hasattr(spec, "bandwidth") and hasattr(spec, "flops_per_s")):
        raise CountArgumentError(f"device_spec must be a DeviceSpec, a registry name or a YAML "
                                 f"path, got {spec!r} ({type(spec).__name__})")
    return spec


@dataclasses.dataclass(slots=True)
class _Pending:
    """One label's blocks counted but not yet built into its stats."""

    blocks: list[Block]
    num_tokens: int
    net: float | None  # measured seconds, bookkeeping excluded (None: not measured)
    raw: float | None  # measured seconds, bookkeeping included
    timing: str  # how it was measured


class TransformerPerformanceCounter:
    """Counts FLOPs and bytes of labelled phases and prices them on a device."""

    def __init__(self, device_spec=None, depth: int = 10, io_model: str = "per_op", *,
                 timer_cls=None, execution: str | None = None):
        """timer_cls: PerformanceTimer, CUDAPerformanceTimer or a subclass (made per block as
        timer_cls(name=label, depth=depth, mode=self.mode)); None: the CUDA one when CUDA
        is initialized, else PerformanceTimer. execution: the program (eager, compiled,
        cudagraphs) predictions price where no run measured a phase (None: eager)."""
        self._depth = check_depth(depth)
        self.device_spec = _resolve_spec(device_spec)
        self.io_model = check_io_model(io_model)
        self.execution = execution
        self.timer_cls = check_timer_cls(timer_cls)
        self.mode = PerformanceCounterMode(depth=depth)
        self._built: dict[str, PerformanceStats] = {}
        self._pending: dict[str, _Pending] = {}  # blocks not yet turned into stats
        self._open: str | None = None

    # -- counting ------------------------------------------------------------
    @contextmanager
    def count(self, label: str, num_tokens: int):
        """Count the block as phase `label` that produced `num_tokens` tokens.
        The same label again adds to that phase."""
        if not isinstance(label, str) or not label:
            raise CountArgumentError(f"label must be a non-empty str, got {label!r}")
        if isinstance(num_tokens, bool) or not hasattr(num_tokens, "__index__"):
            raise CountArgumentError(
                f"num_tokens must be an int >= 0, got {num_tokens!r} ({type(num_tokens).__name__})")
        num_tokens = num_tokens.__index__()
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens}")
        old = self._built.get(label)
        if old is not None and old.trace is None:
            raise CountArgumentError(f"phase {label!r} holds torchao's totals (read from a file), "
                                     "which counted blocks cannot add to; count under another label")
        if self._open is not None:
            raise NestedCountError(
                f"count({label!r}) entered inside count({self._open!r}) of the same counter; "
                "close the first block, or use a second TransformerPerformanceCounter")
        self._open = label
        try:
            timer = (self.timer_cls or default_timer_cls())(name=label, depth=self._depth,
                                                              mode=self.mode)
            with timer:
                yield self
            block = self.mode.last_block()
        finally:
            self._open = None
        self._pend(label, num_tokens, block, timer.raw_latency, timer.timing)

    # Blocks of one label are kept raw and turned into one Trace when the stats are
    # read (each decode step would otherwise pay for building and merging a Trace).
    _MAX_PENDING = 64  # bounds the memory raw blocks hold (a log entry per op call)

    def _pend(self, label: str, num_tokens: int, block: Block, raw: float | None, timing: str):
        net = None if raw is None else max(raw - block.overhead_s, 0.0)
        p = self._pending.get(label)
        if p is None:
            self._pending[label] = _Pending([block], num_tokens, net, raw, timing)
            return
        p.blocks.append(block)
        p.num_tokens += num_tokens
        p.net = sum_or_none(p.net, net)
        p.raw = sum_or_none(p.raw, raw)
        if net is None:
            p.timing = timing
        if len(p.blocks) >= self._MAX_PENDING:
            self._build(label)

    def _build(self, label: str) -> None:
        p = self._pending.pop(label)
        self._add(label, p.num_tokens, build_trace(p.blocks), p.raw, p.timing, p.net)

    @property
    def _phases(self) -> dict[str, PerformanceStats]:
        """Stats per label, every pending block built in."""
        for label in list(self._pending):
            self._build(label)
        return self._built

    def add(self, label: str, trace: Trace, *, num_tokens: int, latency: float | None = None,
            raw_latency: float | None = None, timing: str = "not measured") -> PerformanceStats:
        """Add a phase counted elsewhere (a Trace: derived, loaded, built from blocks) as
        `label`; the same label again adds up, as with count(). latency: seconds of the
        phase without the counter's bookkeeping (default: raw_latency less the trace's
        overhead); timing: how it was measured. Phases counted before it are built first."""
        if not isinstance(label, str) or not label:
            raise CountArgumentError(f"label must be a non-empty str, got {label!r}")
        if not isinstance(trace, Trace):
            raise CountArgumentError(f"trace must be a perfcounter Trace, got {type(trace).__name__}")
        if isinstance(num_tokens, bool) or not hasattr(num_tokens, "__index__") or num_tokens < 0:
            raise CountArgumentError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        for pending in list(self._pending):  # keep the order phases were counted in
            self._build(pending)
        self._add(label, num_tokens.__index__(), trace, raw_latency, timing, latency)
        return self._built[label]

    def set_measured(self, label: str, seconds: float, *, timing: str,
                     execution: str = "eager") -> PerformanceStats:
        """Make `seconds`, measured apart from the counting (uncounted runs of the same phase,
        `timing` says how), the phase's one measured latency, run as `execution` (the program
        predictions beside it price); every report and document then shows that figure."""
        stats = self._lookup(label)
        self._built[label] = dataclasses.replace(stats, latency=seconds, raw_latency=None,
                                                 timing=timing, execution=execution)
        return self._built[label]

    def _add(self, label: str, num_tokens: int, trace: Trace, raw: float | None, timing: str,
             net: float | None = None):
        if net is None and raw is not None:
            net = max(raw - trace.overhead_s, 0.0)
        old = self._built.get(label)
        if old is not None:
            trace = old.trace.merge(trace)
            num_tokens += old.num_tokens
            net = sum_or_none(net, old.latency)
            raw = sum_or_none(raw, old.raw_latency)
            if net is None:
                timing = old.timing if old.latency is None else timing
        self._built[label] = PerformanceStats(label, num_tokens, net, trace, self.device_spec,
                                               self.io_model, raw, timing)

    # -- torchao's accessors --------------------------------------------------
    @property
    def execution(self) -> str | None:
        """The program unmeasured phases are predicted as (see __init__)."""
        return self._execution

    @execution.setter
    def execution(self, value: str | None) -> None:
        self._execution = None if value is None else check_regime(value, bound=False)

    def _current(self, stats: PerformanceStats) -> PerformanceStats:
        """A phase priced on the counter's current device spec and io model, and predicted
        as the counter's execution when no run measured it (a phase read from torchao's
        totals keeps its own figures)."""
        if stats.totals is not None:
            return stats
        changes = {}
        if stats.device_spec is not self.device_spec or stats.io_model != self.io_model:
            changes.update(device_spec=self.device_spec, io_model=self.io_model)
        if self._execution is not None and stats.latency is None \
                and stats.execution != self._execution:
            changes["execution"] = self._execution
        return dataclasses.replace(stats, **changes) if changes else stats

    @property
    def counts(self) -> dict[str, PerformanceStats]:
        return {label: self._current(s) for label, s in self._phases.items()}

    def get_counts(self) -> dict[str, PerformanceStats]:
        return self.counts

    @property
    def total_flops(self) -> int:
        return sum(s.total_flops for s in self.counts.values())

    @property
    def total_io(self) -> int:
        return sum(s.total_io for s in self.counts.values())

    @property
    def total_tokens(self) -> int:
        return sum(s.num_tokens for s in self._phases.values())

    @property
    def total_time(self) -> float | None:
        """Σ measured latencies; None when a phase was not measured."""
        return sum_or_none(*(s.latency for s in self._phases.values()))

    def _summarize_stat(self, key: str) -> dict:
        return {label: getattr(s, key) for label, s in self.counts.items()}

    @property
    def flops_summary(self) -> dict:
        return self._summarize_stat("flops_summary")

    @property
    def io_summary(self) -> dict:
        return self._summarize_stat("io_summary")

    @property
    def flop_counts_summary(self) -> dict:
        return self._summarize_stat("flop_counts")

    @property
    def io_counts_summary(self) -> dict:
        return self._summarize_stat("io_counts")

    def _lookup(self, label: str) -> PerformanceStats:
        if label not in self._phases:
            known = ", ".join(map(repr, self._phases)) or "none yet"
            raise KeyError(f"no phase labelled {label!r} (counted: {known})"
                           f"{did_you_mean(label, self._phases, quote=True)}")
        return self._current(self._phases[label])

    def summary(self, labels: list[str] | None = None) -> PerformanceStats:
        """All phases (or the given labels) as one: numbers and steps summed."""
        phases = [self._lookup(lb) for lb in (labels if labels is not None else self._phases)]
        if any(s.trace is None for s in phases):
            return _sum_totals(phases, self.device_spec)
        trace, raw, net, tokens = Trace(steps=0), 0.0, 0.0, 0
        for s in phases:
            trace = trace.merge(s.trace)
            tokens += s.num_tokens
            net = sum_or_none(net, s.latency)
            raw = sum_or_none(raw, s.raw_latency)
        timing = ", ".join(sorted({s.timing for s in phases}))
        runs = {s.execution for s in phases}  # one program measured: predicted as such
        return PerformanceStats(SUMMARY_LABEL, tokens, net, trace, self.device_spec,
                                self.io_model, raw, timing, None,
                                runs.pop() if len(runs) == 1 else "eager")

    @property
    def stats_summary(self) -> PerformanceStats:
        return self.summary()

    def print_summary(self, labels: list[str] | None = None, show: bool = False, *,
                      module_depth: int | None = 4) -> str:
        """The report of each labelled phase, or of all phases summed when no
        labels are given; printed too when show=True."""
        if labels is None:
            texts = [format_stats(self.stats_summary, module_depth=module_depth)]
        else:
            texts = [format_stats(self._lookup(lb), module_depth=module_depth) for lb in labels]
        text = "\n".join(texts)
        if show:
            print(text, flush=True)
        return text

    def compare(self, devices, labels: list[str] | None = None, io_model: str | None = None):
        """Every phase priced on each device (names, YAML paths or DeviceSpecs):
        roofline latency, bound, tokens/s and energy per token."""
        if isinstance(devices, (str, os.PathLike)) or not hasattr(devices, "__iter__"):
            devices = [devices]
        specs = [_resolve_spec(d) for d in devices]
        labels = list(self._phases) if labels is None else list(labels)
        io_model = check_io_model(io_model or self.io_model)
        rows = [(spec, self._lookup(lb).on(spec, io_model)) for spec in specs for lb in labels]
        return Comparison(rows)

    # -- data ----------------------------------------------------------------
    def _meta(self, run: dict | None = None) -> dict:
        meta = {"schema": SCHEMA, "version": SCHEMA_VERSION, "release": VERSION,
                "io_model": self.io_model, "depth": self._depth}
        if run is not None:
            meta["run"] = run
        return meta

    def to_dict(self, *, run: dict | None = None) -> dict[str, dict]:
        """torchao's layout: {label: stats dict}, op names as strings, every key of torchao's
        PerformanceStats and ours beside them, with a "perfcounter" block (schema, version,
        io_model, depth, and `run`: what the caller says of the run)."""
        return {label: {**s.to_dict(), META_KEY: self._meta(run)}
                for label, s in self.counts.items()}

    def to_json(self, path=None, *, run: dict | None = None) -> dict:
        """to_dict(); written atomically to `path` (as indented JSON) when given."""
        doc = self.to_dict(run=run)
        if path is not None:
            atomic_write(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return doc

    @classmethod
    def from_dict(cls, doc: dict, source: str = "document") -> "TransformerPerformanceCounter":
        """A counter holding the phases of a to_json() document (this layout, the version-1
        envelope, or torchao's own). A malformed document is a ValueError naming `source`."""
        read = read_counts(doc, source)
        counter = cls(depth=read.depth, io_model=read.io_model)
        counter.device_spec = read.device_spec
        counter._built.update(read.phases)
        return counter

    @classmethod
    def from_json(cls, path) -> "TransformerPerformanceCounter":
        """A counter from a file to_json() (or torchao's to_json()) wrote."""
        path = os.fspath(path)
        return cls.from_dict(read_counts_file(path), source=path)


def _sum_totals(phases: list[PerformanceStats], device_spec) -> PerformanceStats:
    """The summary of phases some of which hold torchao's totals only: figures summed."""
    def add(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = add(out.get(k, {}), v) if isinstance(v, dict) else out.get(k, 0) + v
        return out

    summed = {"flops_summary": {}, "io_summary": {}, "flop_counts": {}, "io_counts": {}}
    for s in phases:
        for key in summed:
            summed[key] = add(summed[key], getattr(s, key))
    first = phases[0] if phases else None
    device = {} if device_spec is not None or first is None else {
        "device_bandwidth": first.device_bandwidth, "device_flops_per_s": first.device_flops_per_s}
    totals = Totals(sum(s.total_flops for s in phases), sum(s.total_io for s in phases),
                    **summed, **device)
    return PerformanceStats(SUMMARY_LABEL, sum(s.num_tokens for s in phases),
                            sum_or_none(*(s.latency for s in phases)), device_spec=device_spec,
                            totals=totals, timing=", ".join(sorted({s.timing for s in phases})))
