"""A phase as plain data: PerformanceStats to and from JSON-ready dicts, torchao's layout kept.

`stats_to_dict(stats)` writes torchao's keys (every field and derived property of its
PerformanceStats) and ours beside them; `stats_from_dict(cls, d)` reads either back (a dict
without "trace" is torchao's: its figures are held as given, `Totals`). Also the checks the
constructor applies to given figures (`check_number`) and to fields read (`typed_field`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from perfcounter.devices import DeviceSpec
from perfcounter.trace import Trace

# torchao's PerformanceStats: its dataclass fields, then its derived properties
TORCHAO_FIELDS = ("label", "num_tokens", "latency", "total_flops", "total_io", "flops_summary",
                  "io_summary", "flop_counts", "io_counts", "device_bandwidth",
                  "device_flops_per_s")
TORCHAO_PROPERTIES = ("token_throughput", "achieved_flops_per_s", "achieved_bandwidth",
                      "theoretical_io_latency", "theoretical_compute_latency",
                      "bandwidth_utilization", "flops_utilization")

def spec_from_dict(d: dict):
    """A DeviceSpec from DeviceSpec.to_dict(): see DeviceSpec.from_dict."""
    return DeviceSpec.from_dict(d)


@dataclass(frozen=True)
class Totals:
    """torchao's figures given as numbers: a PerformanceStats built without a trace."""

    total_flops: float
    total_io: float
    flops_summary: dict = field(default_factory=dict)
    io_summary: dict = field(default_factory=dict)
    flop_counts: dict = field(default_factory=dict)
    io_counts: dict = field(default_factory=dict)
    device_bandwidth: float | None = None
    device_flops_per_s: float | None = None


def check_number(value, name: str, *, none_ok: bool = True):
    """value when it is a finite real number >= 0 (or None with none_ok); else a ValueError."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0{' or None' if none_ok else ''}, "
                         f"got {value!r}")
    return value


def typed_field(d: dict, key: str, kind: type):
    """d[key] when it is a `kind` (an int is not a bool); else a ValueError naming the key."""
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {key!r} must be {kind.__name__}, got {type(value).__name__} "
                         f"{value!r:.40}")
    return value


def stats_to_dict(self) -> dict:
    """torchao's keys (every field and derived property of its PerformanceStats) and
    ours beside them, plain JSON types; from_dict() reads it back."""
    spec = self.device_spec
    return {
        "label": self.label, "num_tokens": self.num_tokens, "steps": self.steps,
        "latency": self.latency, "raw_latency": self.raw_latency, "timing": self.timing,
        "overhead_s": self.overhead_s, "io_model": self.io_model,
        "total_flops": self.total_flops, "executed_flops": self.executed_flops,
        "total_io": self.total_io, "per_op_io": self.per_op_io,
        "compulsory_io": self.compulsory_io, "kv_cache_valid_read": self.kv_cache_valid_read,
        "flops_summary": self.flops_summary, "io_summary": self.io_summary,
        "flop_counts": self.flop_counts, "io_counts": self.io_counts,
        "flops_by_kind": self.flops_by_kind, "io_by_role": self.io_by_role,
        "device_bandwidth": self.device_bandwidth,
        "device_flops_per_s": self.device_flops_per_s,
        "token_throughput": self.token_throughput,
        "achieved_flops_per_s": self.achieved_flops_per_s,
        "achieved_bandwidth": self.achieved_bandwidth,
        "theoretical_io_latency": self.theoretical_io_latency,
        "theoretical_compute_latency": self.theoretical_compute_latency,
        "bandwidth_utilization": self.bandwidth_utilization,
        "flops_utilization": self.flops_utilization,
        "arithmetic_intensity": self.arithmetic_intensity,
        "roofline_latency": self.roofline_latency, "bound": self.bound,
        "roofline_latency_s": self.roofline_latency,
        "predicted_latency_s": self.predicted_latency, "measured_latency_s": self.latency,
        "execution": self.execution,
        "prediction": None if not self.priced else self.prediction().to_dict(),
        "roofline": None if self.roofline is None else self.roofline.to_dict(),
        "energy_j": self.energy_j, "energy_per_token_j": self.energy_per_token_j,
        "energy": None if self.energy is None else self.energy.to_dict(),
        "uncounted_ops": self.uncounted_ops, "coverage": self.coverage,
        "device": None if spec is None else spec.to_dict(),
        "trace": None if self.trace is None else self.trace.to_dict(),
    }

def stats_from_dict(cls, d: dict, source: str = "stats"):
    """Rebuild a phase from to_dict(), or from torchao's to_dict() (no "trace": its
    figures as given); derived figures are recomputed. A malformed dict is a
    ValueError naming `source` and the field."""
    if not isinstance(d, dict):
        raise ValueError(f"{source}: expected an object of stats fields, got "
                         f"{type(d).__name__}")
    try:
        device = d.get("device")
        if device is not None and not isinstance(device, dict):
            raise ValueError(f"field 'device' must be an object (DeviceSpec.to_dict()) or "
                             f"null, got {type(device).__name__} {device!r:.40}")
        spec = None if device is None else spec_from_dict(device)
        common = dict(label=typed_field(d, "label", str), latency=d.get("latency"),
                      num_tokens=typed_field(d, "num_tokens", int))
        if d.get("trace") is None:  # torchao's layout, or stats built from totals
            given = {k: d[k] for k in TORCHAO_FIELDS[3:] if d.get(k) is not None}
            if spec is not None:
                given.pop("device_bandwidth", None)
                given.pop("device_flops_per_s", None)
            return cls(**common, device_spec=spec, **given)
        trace = d["trace"]
        if not isinstance(trace, dict):
            raise ValueError(f"field 'trace' must be an object, got {type(trace).__name__}")
        return cls(**common, trace=Trace.from_dict(trace), device_spec=spec,
                   io_model=d.get("io_model", "per_op"), raw_latency=d.get("raw_latency"),
                   timing=d.get("timing", ""), execution=d.get("execution", "eager"))
    except KeyError as e:
        raise ValueError(f"{source}: field {e} is missing") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{source}: {e}") from None
