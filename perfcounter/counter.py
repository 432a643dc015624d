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
on fake or meta tensors has no latency (None, shown "n/a"); to_json writes a
versioned envelope atomically and from_json reads it back.

Timing: time.perf_counter around the block; when CUDA is initialized, the
device is synchronized before and after and CUDA events time the block.
The bookkeeping time the mode measures in itself is CPU time; on CUDA it
overlaps kernels still in flight, so the net latency is then a lower bound.
What it measures is its per-op work after each op returns; dispatching ops
to Python at all and the module hooks (together 1.2-1.3x a plain CPU decode
step of a small model: README, Overhead) stay in the net latency.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from contextlib import contextmanager

import torch

from perfcounter._util import atomic_write, did_you_mean
from perfcounter.report import Comparison, format_stats
from perfcounter.stats import PerformanceStats, check_depth, spec_from_dict, sum_or_none
from perfcounter.trace import Block, Trace, build_trace, check_io_model

SCHEMA = "perfcounter.counts"
SCHEMA_VERSION = 1
SUMMARY_LABEL = "Performance Summary"


class CountArgumentError(TypeError, ValueError):
    """A count() argument of the wrong type (caught as TypeError or ValueError)."""


class NestedCountError(RuntimeError):
    """count() entered while another count() of the same counter is open."""


def _resolve_spec(spec):
    """A DeviceSpec from a spec, a registry name or a YAML path (None stays None)."""
    if isinstance(spec, (str, os.PathLike)):
        from perfcounter.devices import get_device_spec
        return get_device_spec(os.fspath(spec))
    if spec is not None and not (hasattr(spec, "bandwidth") and hasattr(spec, "flops_per_s")):
        raise CountArgumentError(f"device_spec must be a DeviceSpec, a registry name or a YAML "
                                 f"path, got {spec!r} ({type(spec).__name__})")
    return spec


def _fake_mode_active() -> bool:
    """True when a FakeTensorMode is on the dispatch stack (no real execution)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


class _RealityProbe:
    """Tells whether a block really executes: no FakeTensorMode active, and the
    first module called in it holds (or, without weights, receives) neither
    meta nor fake tensors. The probe's global forward pre-hook removes itself
    at its first answer, so it costs one hook call per block."""

    def __enter__(self):
        self.real = not _fake_mode_active()
        self._handle = None
        if self.real:
            self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._look)
        return self

    def _look(self, module, args):
        from torch._subclasses.fake_tensor import is_fake
        tensors = itertools.chain(module.parameters(), module.buffers(),
                                  (a for a in args if isinstance(a, torch.Tensor)))
        t = next(tensors, None)
        if t is not None:
            self.real = not (t.is_meta or is_fake(t))
            self._remove()

    def _remove(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __exit__(self, *exc):
        self._remove()


class _Timer:
    """Wall time of a block; CUDA events and synchronization when CUDA is in use."""

    def __init__(self):
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.method = "cuda events, synchronized" if self.cuda else "time.perf_counter"

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self._begin = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._begin.record()
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            torch.cuda.synchronize()
            return self._begin.elapsed_time(self._end) * 1e-3
        return time.perf_counter() - self._t0


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

    def __init__(self, device_spec=None, depth: int = 10, io_model: str = "per_op"):
        from perfcounter.mode import PerformanceCounterMode
        # A dispatch mode imports torch._dynamo on its first op (~1.4 s); do it
        # here so that the first timed block does not pay for it.
        import torch._dynamo  # noqa: F401
        self._depth = check_depth(depth)
        self.device_spec = _resolve_spec(device_spec)
        self.io_model = check_io_model(io_model)
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
        if self._open is not None:
            raise NestedCountError(
                f"count({label!r}) entered inside count({self._open!r}) of the same counter; "
                "close the first block, or use a second TransformerPerformanceCounter")
        self._open = label
        try:
            timer = _Timer()
            with self.mode, _RealityProbe() as probe:
                timer.start()
                yield self
                raw = timer.stop()
            block = self.mode.last_block()
        finally:
            self._open = None
        if probe.real:
            self._pend(label, num_tokens, block, raw, timer.method)
        else:
            self._pend(label, num_tokens, block, None, "not measured: fake or meta tensors")

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
    def _current(self, stats: PerformanceStats) -> PerformanceStats:
        """A phase priced on the counter's current device spec and io model."""
        if stats.device_spec is self.device_spec and stats.io_model == self.io_model:
            return stats
        return dataclasses.replace(stats, device_spec=self.device_spec, io_model=self.io_model)

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
        trace, raw, net, tokens = Trace(steps=0), 0.0, 0.0, 0
        for s in phases:
            trace = trace.merge(s.trace)
            tokens += s.num_tokens
            net = sum_or_none(net, s.latency)
            raw = sum_or_none(raw, s.raw_latency)
        timing = ", ".join(sorted({s.timing for s in phases}))
        return PerformanceStats(SUMMARY_LABEL, tokens, net, trace, self.device_spec,
                                self.io_model, raw, timing)

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
    def to_dict(self) -> dict[str, dict]:
        """{label: stats dict} with op names as strings (torchao's shape)."""
        return {label: s.to_dict() for label, s in self.counts.items()}

    def to_json(self, path=None) -> dict:
        """The versioned document; written atomically to `path` when given."""
        summary = self.stats_summary.to_dict() if self._phases else None
        if summary is not None:
            del summary["trace"]
        from perfcounter import __version__
        doc = {"schema": SCHEMA, "version": SCHEMA_VERSION, "perfcounter": __version__,
               "io_model": self.io_model, "depth": self._depth,
               "device": None if self.device_spec is None else self.device_spec.to_dict(),
               "counts": self.to_dict(), "summary": summary}
        if path is not None:
            atomic_write(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return doc

    @classmethod
    def from_dict(cls, doc: dict, source: str = "document") -> "TransformerPerformanceCounter":
        """A counter holding the phases of a to_json() document."""
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ValueError(f"{source}: not a perfcounter counts document "
                             f"(expected \"schema\": {SCHEMA!r})")
        if doc.get("version") != SCHEMA_VERSION:
            raise ValueError(f"{source}: schema version {doc.get('version')!r} is not supported "
                             f"(this perfcounter reads version {SCHEMA_VERSION})")
        try:
            counter = cls(depth=doc["depth"], io_model=doc["io_model"])
            if doc["device"] is not None:
                counter.device_spec = spec_from_dict(doc["device"])
            for label, d in doc["counts"].items():
                stats = PerformanceStats.from_dict(d)
                counter._phases[label] = dataclasses.replace(stats, device_spec=counter.device_spec)
        except KeyError as e:
            raise ValueError(f"{source}: field {e} is missing; the document is incomplete "
                             f"(written by perfcounter {doc.get('perfcounter', '?')})") from None
        return counter

    @classmethod
    def from_json(cls, path) -> "TransformerPerformanceCounter":
        path = os.fspath(path)
        with open(path, encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(doc, source=path)
