"""PerformanceStats: one phase's numbers and everything derived from them.

A phase is a Trace (what was counted), how many tokens it produced, how long it took when
it was measured, and optionally the device it is priced on. Every derived figure (torchao's
throughputs and utilizations, the roofline latency, the energy) is computed from those, so
`stats.on(other_spec)` re-costs a phase for another device without running the model again.

Conventions:
- total_flops is dense (2 per multiply-accumulate, attention unmasked), as in
  torch and torchao; the roofline, arithmetic intensity and energy use the
  executed FLOPs (what causal kernels really compute).
- total_io follows the io model: "per_op" (every op reads its inputs and
  writes its outputs) or "compulsory" (each storage once). The per-op
  breakdowns (io_counts, io_summary, modules) are always per-op bytes.
- Utilizations are fractions (0.0113 is 1.13 %); reports print percents.
- A latency that was not measured (meta or fake tensors, a re-costed phase)
  is None, and so is every figure derived from it.
- Per-op breakdowns (flop_counts, get_flop_counts) show a fused attention
  kernel's matmuls under its own op (torch's SDPA formula) and its softmax
  under "sdpa_softmax" (costs/attention.py); total_flops holds both. Every
  module that ran is a key of both the FLOPs and the bytes breakdowns.

torchao's dataclass fields are accepted too: `PerformanceStats(label=,
num_tokens=, latency=, total_flops=, total_io=, flops_summary=, io_summary=,
flop_counts=, io_counts=, device_bandwidth=, device_flops_per_s=)` holds those
figures as given (`Totals`), with torchao's derived properties (None without a
device). Such stats have no per-op records: the figures that need them
(executed FLOPs, kinds, roles, roofline, energy, modules) are None or empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from perfcounter.counting.breakdown import add_row, empty_row, flop_counts, io_counts
from perfcounter.counting.module_kinds import SCOPES, record_scopes
from perfcounter.counting.module_path import check_depth
from perfcounter.devices import get_device_spec
from perfcounter.pricing.energy import Energy, energy
from perfcounter.pricing.predict import phase_program, predict
from perfcounter.pricing.regimes import check_regime
from perfcounter.pricing.roofline import Roofline, op_costs, peak_flops, roofline
from perfcounter.report.phase import format_stats
from perfcounter.report.profile import profile
from perfcounter.stats_dict import (TORCHAO_FIELDS, Totals, check_number, stats_from_dict,
                                    stats_to_dict)
from perfcounter.trace import ROLES, Trace, check_io_model


def _div(a, b):
    return None if a is None or not b else a / b


@dataclass(frozen=True, init=False)
class PerformanceStats:
    """One phase (possibly several steps of one label) and its derived metrics.

    PerformanceStats(label, num_tokens, latency, trace, device_spec, io_model, raw_latency,
    timing) from a counted trace, or with torchao's keyword fields (total_flops=,
    total_io=, ..., device_bandwidth=, device_flops_per_s=) from numbers."""

    label: str
    num_tokens: int
    latency: float | None  # measured seconds, counting overhead excluded; None if not measured
    trace: Trace | None = field(default=None, repr=False)  # None: built from torchao's totals
    device_spec: object | None = None  # a DeviceSpec
    io_model: str = "per_op"
    raw_latency: float | None = None  # measured seconds including the counter's own work
    timing: str = ""  # how latency was measured
    totals: Totals | None = field(default=None, repr=False)  # torchao's figures, when given
    execution: str = "eager"  # the program latency measured (and predictions price by default)

    def __init__(self, label: str, num_tokens: int, latency: float | None = None,
                 trace: Trace | None = None, device_spec=None, io_model: str = "per_op",
                 raw_latency: float | None = None, timing: str = "",
                 totals: Totals | None = None, execution: str = "eager", *, total_flops=None,
                 total_io=None,
                 flops_summary=None, io_summary=None, flop_counts=None, io_counts=None,
                 device_bandwidth=None, device_flops_per_s=None):
        given = {k: v for k, v in (("total_flops", total_flops), ("total_io", total_io),
                                   ("flops_summary", flops_summary), ("io_summary", io_summary),
                                   ("flop_counts", flop_counts), ("io_counts", io_counts),
                                   ("device_bandwidth", device_bandwidth),
                                   ("device_flops_per_s", device_flops_per_s)) if v is not None}
        if given:
            if trace is not None or totals is not None:
                raise TypeError(f"PerformanceStats takes a trace or torchao's figures "
                                f"({', '.join(given)}), not both")
            if device_spec is not None and ("device_bandwidth" in given
                                            or "device_flops_per_s" in given):
                raise TypeError("give device_spec or device_bandwidth= / device_flops_per_s=, "
                                "not both")
            missing = [k for k in ("total_flops", "total_io") if k not in given]
            if missing:
                raise TypeError(f"PerformanceStats from torchao's figures needs "
                                f"{' and '.join(k + '=' for k in missing)}")
            for k in ("total_flops", "total_io", "device_bandwidth", "device_flops_per_s"):
                check_number(given.get(k), k, none_ok=k.startswith("device"))
            for k in ("flops_summary", "io_summary", "flop_counts", "io_counts"):
                if not isinstance(given.get(k, {}), dict):
                    raise TypeError(f"{k} must be a dict, got {type(given[k]).__name__}")
            totals = Totals(**given)
        elif trace is None and totals is None:
            raise TypeError("PerformanceStats needs a trace, or torchao's total_flops= and "
                            "total_io=")
        if trace is not None and not isinstance(trace, Trace):
            raise TypeError(f"trace must be a perfcounter Trace, got {type(trace).__name__}; "
                            "torchao's fields (total_flops=, total_io=, ...) are keywords")
        check_number(latency, "latency")
        values = dict(label=label, num_tokens=num_tokens, latency=latency, trace=trace,
                      device_spec=device_spec, io_model=check_io_model(io_model),
                      raw_latency=raw_latency, timing=timing, totals=totals,
                      execution=check_regime(execution, bound=False))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    # -- torchao's dict-like access (its DictMixin) -----------------------------
    def __getitem__(self, key: str):
        """stats['total_flops']."""
        if not isinstance(key, str) or key.startswith("_") or not hasattr(self, key):
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key) -> bool:
        return isinstance(key, str) and not key.startswith("_") and hasattr(self, key)

    def __iter__(self):
        """torchao's field names."""
        return iter(TORCHAO_FIELDS)

    # -- torchao fields -------------------------------------------------------
    @property
    def total_flops(self) -> int:
        if self.totals is not None:
            return self.totals.total_flops
        return self.trace.flops

    @property
    def total_io(self) -> int:
        if self.totals is not None:
            return self.totals.total_io
        return self.trace.per_op_bytes if self.io_model == "per_op" else self.trace.compulsory_bytes

    @cached_property
    def flop_counts(self) -> dict[str, dict[str, int]]:
        """FLOPs by module path (every parent included) and op; 'Global' = all. A fused
        attention's softmax is under 'sdpa_softmax' (see the module doc)."""
        if self.totals is not None:
            return self.totals.flop_counts
        return flop_counts(self.trace.records)

    @cached_property
    def io_counts(self) -> dict[str, dict[str, int]]:
        """Per-op bytes by module path (every parent included) and op."""
        if self.totals is not None:
            return self.totals.io_counts
        return io_counts(self.trace.records)

    @property
    def flops_summary(self) -> dict[str, int]:
        if self.totals is not None:
            return self.totals.flops_summary
        return {m: sum(ops.values()) for m, ops in self.flop_counts.items()}

    @property
    def io_summary(self) -> dict[str, int]:
        if self.totals is not None:
            return self.totals.io_summary
        return {m: sum(ops.values()) for m, ops in self.io_counts.items()}

    @property
    def device_bandwidth(self) -> float | None:
        if self.totals is not None and self.device_spec is None:
            return self.totals.device_bandwidth
        return getattr(self.device_spec, "bandwidth", None)

    @property
    def device_flops_per_s(self) -> float | None:
        if self.totals is not None and self.device_spec is None:
            return self.totals.device_flops_per_s
        return getattr(self.device_spec, "flops_per_s", None)

    @property
    def token_throughput(self) -> float | None:
        return _div(self.num_tokens, self.latency)

    @property
    def achieved_flops_per_s(self) -> float | None:
        return _div(self.total_flops, self.latency)

    @property
    def achieved_bandwidth(self) -> float | None:
        return _div(self.total_io, self.latency)

    @property
    def theoretical_io_latency(self) -> float | None:
        return _div(self.total_io, self.device_bandwidth)

    @cached_property
    def theoretical_compute_latency(self) -> float | None:
        """Σ dense FLOPs / peak FLOP/s of each op's dtype (torchao's total_flops /
        device_flops_per_s for stats built from totals)."""
        if not self.device_flops_per_s:
            return None
        if self.trace is None:
            return self.total_flops / self.device_flops_per_s
        peaks: dict[str, float] = {}
        total = 0.0
        for r in self.trace.records:
            if r.flops:
                if r.dtype not in peaks:
                    peaks[r.dtype] = peak_flops(self.device_spec, r.dtype)
                total += r.flops / peaks[r.dtype]
        return total

    @property
    def bandwidth_utilization(self) -> float | None:
        return _div(self.achieved_bandwidth, self.device_bandwidth)

    @property
    def flops_utilization(self) -> float | None:
        return _div(self.achieved_flops_per_s, self.device_flops_per_s)

    # -- counting (None or empty for stats built from torchao's totals) -------------
    @property
    def executed_flops(self) -> int | None:
        return None if self.trace is None else self.trace.executed_flops

    @property
    def flops_by_kind(self) -> dict[str, int] | None:
        return None if self.trace is None else self.trace.kinds

    @property
    def io_by_role(self) -> dict[str, dict[str, int]] | None:
        """Bytes read and written by tensor role, in the io model."""
        t = self.trace
        if t is None:
            return None
        read, written = ((t.per_op_read, t.per_op_written) if self.io_model == "per_op"
                         else (t.compulsory_read, t.compulsory_written))
        return {"read": dict(zip(ROLES, read)), "written": dict(zip(ROLES, written))}

    @property
    def per_op_io(self) -> int | None:
        return None if self.trace is None else self.trace.per_op_bytes

    @property
    def compulsory_io(self) -> int | None:
        return None if self.trace is None else self.trace.compulsory_bytes

    @property
    def kv_cache_valid_read(self) -> int | None:
        return None if self.trace is None else self.trace.kv_cache_valid_read

    @property
    def arithmetic_intensity(self) -> float | None:
        """Executed FLOPs per byte of the io model."""
        return _div(self.executed_flops, self.total_io)

    @property
    def steps(self) -> int:
        return 1 if self.trace is None else self.trace.steps

    @property
    def uncounted_ops(self) -> dict[str, int]:
        return {} if self.trace is None else dict(self.trace.uncounted_ops)

    @property
    def coverage(self) -> dict[str, float] | None:
        if self.trace is None:
            return None
        by_bytes, by_calls = self.trace.coverage
        return {"bytes": by_bytes, "calls": by_calls}

    @property
    def overhead_s(self) -> float:
        """Seconds spent in the counter's own bookkeeping (excluded from latency)."""
        return 0.0 if self.trace is None else self.trace.overhead_s

    # -- device models -------------------------------------------------------
    @property
    def priced(self) -> bool:
        """True when the device spec has the bandwidth and peak a roofline needs."""
        spec = self.device_spec
        return (self.trace is not None and spec is not None and bool(spec.bandwidth)
                and bool(spec.flops_per_s))

    @cached_property
    def roofline(self) -> Roofline | None:
        return roofline(self.trace, self.device_spec, self.io_model) if self.priced else None

    @property
    def roofline_latency(self) -> float | None:
        return None if self.roofline is None else self.roofline.latency_s

    @property
    def bound(self) -> str | None:
        return None if self.roofline is None else self.roofline.bound

    @property
    def roofline_token_throughput(self) -> float | None:
        return _div(self.num_tokens, self.roofline_latency)

    def prediction(self, execution: str | None = None):
        """The predicted latency (predict.py: per-op overhead + achievable rates; a
        prediction, where the roofline is a bound) run `execution` (EXECUTIONS; None: the
        phase's own; a prefill runs as predict.phase_program says), or None when the phase
        is not priced."""
        regime, spec = phase_program(self.device_spec, execution or self.execution, self.label)
        return predict(self.trace, spec, regime) if self.priced else None

    @cached_property
    def predicted_latency(self) -> float | None:
        """Seconds the phase's program (`execution`) is predicted to take (see prediction())."""
        p = self.prediction()
        return None if p is None else p.latency_s

    @property
    def measured_over_predicted(self) -> float | None:
        """Measured latency ÷ predicted (its execution); None when either is missing."""
        return _div(self.latency, self.predicted_latency)

    @cached_property
    def energy(self) -> Energy | None:
        if not self.priced:
            return None
        return energy(self.trace, self.device_spec, self.total_io, self.roofline, lambda: self.predicted_latency)

    @property
    def energy_j(self) -> float | None:
        return None if self.energy is None else self.energy.total_j

    @property
    def energy_per_token_j(self) -> float | None:
        return None if self.energy is None else self.energy.per_token_j(self.num_tokens)

    def on(self, device_spec, io_model: str | None = None, execution: str | None = None):
        """This phase on another device (spec, name or YAML path), run `execution` (None: its own)."""
        if self.trace is None:
            raise ValueError(f"phase {self.label!r} was built from torchao's totals: it has no "
                             "per-op records to price on another device")
        if isinstance(device_spec, str):
            device_spec = get_device_spec(device_spec)
        where = f"not measured on {getattr(device_spec, 'name', 'this device')}"
        return PerformanceStats(self.label, self.num_tokens, None, self.trace, device_spec,
                                io_model or self.io_model, None, where, None,
                                execution or self.execution)

    # -- breakdowns ----------------------------------------------------------
    def modules(self, depth: int | None = None) -> dict[str, dict]:
        """Totals per module path, every record rolled up to each parent prefix;
        paths deeper than `depth` components are folded into their parent."""
        check_depth(depth, none_ok=True)
        if self.trace is None:
            return {}
        costs = op_costs(self.trace, self.device_spec) if self.priced else None
        out: dict[str, dict] = {}
        for i, r in enumerate(self.trace.records):
            if not r.module:
                continue
            parts = r.module.split(".")
            n = len(parts) if depth is None else min(depth, len(parts))
            for k in range(1, n + 1):
                add_row(out, ".".join(parts[:k]), r, costs[i] if costs else None)
        return out

    def scopes(self) -> dict[str, dict]:
        """Totals per llm-profiler scope: transformer, embedding, attn, mlp, lm_head."""
        if self.trace is None:
            return {}
        costs = op_costs(self.trace, self.device_spec) if self.priced else None
        out = {s: empty_row(costs is not None) for s in SCOPES}
        for i, r in enumerate(self.trace.records):
            for scope in record_scopes(r.module):
                add_row(out, scope, r, costs[i] if costs else None)
        return out

    def profile(self, scope: str | None = "transformer", attr: str = "FLOPS") -> int:
        """llm-profiler's query on this phase: FLOPS, ADD, MULT, DIV, SQRT, PARAMS, ACT or
        CACHE of a scope ("transformer", "attn", "mlp", a module class, path or glob);
        perfcounter/report/profile.py says what each means next to llm-profiler's meaning."""
        return profile(self, scope, attr)

    # -- data ----------------------------------------------------------------
    def to_dict(self) -> dict:
        """torchao's keys (every field and derived property of its PerformanceStats) and
        ours beside them, plain JSON types; from_dict() reads it back."""
        return stats_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "stats") -> "PerformanceStats":
        """Rebuild a phase from to_dict(), or from torchao's to_dict() (no "trace": its
        figures as given); derived figures are recomputed. A malformed dict is a
        ValueError naming `source` and the field."""
        return stats_from_dict(cls, d, source)

    def __str__(self) -> str:
        return format_stats(self)


