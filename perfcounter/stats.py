"""PerformanceStats: one phase's numbers and everything derived from them.

A phase is a Trace (what was counted), how many tokens it produced, how long it
took when it was measured, and optionally the device it is priced on. Every
derived figure — torchao's throughputs and utilizations, the roofline latency,
the energy — is computed from those, so `stats.on(other_spec)` re-costs a
phase for another device without running the model again.

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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from perfcounter.energy import Energy, energy
from perfcounter.report import format_stats
from perfcounter.roofline import Roofline, op_costs, op_packet, peak_flops, roofline
from perfcounter.trace import ROLES, Trace, check_io_model

GLOBAL = "Global"

# llm-profiler style scopes, matched on exact module path components
SCOPE_NAMES = {
    "embedding": frozenset({"embed_tokens", "tok_embeddings", "wte", "word_embeddings",
                            "embed_in"}),
    "attn": frozenset({"self_attn", "attention", "attn", "self_attention"}),
    "mlp": frozenset({"mlp", "feed_forward", "ffn", "block_sparse_moe"}),
    # the output head, only as a direct child of the root model
    "lm_head": frozenset({"lm_head", "output", "embed_out"}),
}
SCOPES = ("transformer", "embedding", "attn", "mlp", "lm_head")


def record_scopes(module: str) -> list[str]:
    """The scopes a module path belongs to ('transformer' = all but lm_head)."""
    if not module:
        return []
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in SCOPE_NAMES["lm_head"]:
        return ["lm_head"]
    found = ["transformer"]
    for scope in ("embedding", "attn", "mlp"):
        if any(p in SCOPE_NAMES[scope] for p in parts):
            found.append(scope)
    return found


def spec_from_dict(d: dict):
    """A DeviceSpec from DeviceSpec.to_dict(): see DeviceSpec.from_dict."""
    from perfcounter.devices import DeviceSpec
    return DeviceSpec.from_dict(d)


def _div(a, b):
    return None if a is None or not b else a / b


def sum_or_none(*values):
    """Σ values, or None when any is None: a phase that was not measured has no total."""
    return None if any(v is None for v in values) else sum(values)


def check_depth(depth, *, none_ok: bool = False):
    """depth itself when it is a positive int (or None, with none_ok); else a ValueError."""
    if depth is None and none_ok:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int{' or None' if none_ok else ''}, "
                         f"got {depth!r}")
    return depth


def by_module_and_op(records, value, op_key=op_packet) -> dict[str, dict]:
    """{module path or 'Global': {op packet: Σ value(record)}}: torchao's flop_counts shape,
    each record counted under 'Global' and under every prefix of its module path.
    op_key(record.op) names the op ('aten.mm'; the mode's getters use torch's packets)."""
    out: dict[str, dict] = {GLOBAL: {}}
    keys: dict[str, object] = {}
    for r in records:
        v = value(r)
        if not v:
            continue
        op = keys.get(r.op)
        if op is None:
            op = keys[r.op] = op_key(r.op)
        paths = [GLOBAL]
        if r.module:
            parts = r.module.split(".")
            paths += [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for p in paths:
            ops = out.setdefault(p, {})
            ops[op] = ops.get(op, 0) + v
    return out


@dataclass(frozen=True)
class PerformanceStats:
    """One phase (possibly several steps of one label) and its derived metrics."""

    label: str
    num_tokens: int
    latency: float | None  # measured seconds, counting overhead excluded; None if not measured
    trace: Trace = field(repr=False)
    device_spec: object | None = None  # a DeviceSpec
    io_model: str = "per_op"
    raw_latency: float | None = None  # measured seconds including the counter's own work
    timing: str = ""  # how latency was measured

    def __post_init__(self):
        check_io_model(self.io_model)

    def __getitem__(self, key: str):
        """torchao's dict-like access: stats['total_flops']."""
        if not isinstance(key, str) or key.startswith("_") or not hasattr(self, key):
            raise KeyError(key)
        return getattr(self, key)

    # -- torchao fields -------------------------------------------------------
    @property
    def total_flops(self) -> int:
        return self.trace.flops

    @property
    def total_io(self) -> int:
        return self.trace.per_op_bytes if self.io_model == "per_op" else self.trace.compulsory_bytes

    @cached_property
    def flop_counts(self) -> dict[str, dict[str, int]]:
        """FLOPs by module path (every parent included) and op; 'Global' = all."""
        return by_module_and_op(self.trace.records, lambda r: r.flops)

    @cached_property
    def io_counts(self) -> dict[str, dict[str, int]]:
        """Per-op bytes by module path (every parent included) and op."""
        return by_module_and_op(self.trace.records, lambda r: r.bytes)

    @property
    def flops_summary(self) -> dict[str, int]:
        return {m: sum(ops.values()) for m, ops in self.flop_counts.items()}

    @property
    def io_summary(self) -> dict[str, int]:
        return {m: sum(ops.values()) for m, ops in self.io_counts.items()}

    @property
    def device_bandwidth(self) -> float | None:
        return getattr(self.device_spec, "bandwidth", None)

    @property
    def device_flops_per_s(self) -> float | None:
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
        """Σ dense FLOPs / peak FLOP/s of each op's dtype."""
        if not self.device_flops_per_s:
            return None
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

    # -- counting ------------------------------------------------------------
    @property
    def executed_flops(self) -> int:
        return self.trace.executed_flops

    @property
    def flops_by_kind(self) -> dict[str, int]:
        return self.trace.kinds

    @property
    def io_by_role(self) -> dict[str, dict[str, int]]:
        """Bytes read and written by tensor role, in the io model."""
        t = self.trace
        read, written = ((t.per_op_read, t.per_op_written) if self.io_model == "per_op"
                         else (t.compulsory_read, t.compulsory_written))
        return {"read": dict(zip(ROLES, read)), "written": dict(zip(ROLES, written))}

    @property
    def per_op_io(self) -> int:
        return self.trace.per_op_bytes

    @property
    def compulsory_io(self) -> int:
        return self.trace.compulsory_bytes

    @property
    def kv_cache_valid_read(self) -> int:
        return self.trace.kv_cache_valid_read

    @property
    def arithmetic_intensity(self) -> float | None:
        """Executed FLOPs per byte of the io model."""
        return _div(self.executed_flops, self.total_io)

    @property
    def steps(self) -> int:
        return self.trace.steps

    @property
    def uncounted_ops(self) -> dict[str, int]:
        return dict(self.trace.uncounted_ops)

    @property
    def coverage(self) -> dict[str, float]:
        by_bytes, by_calls = self.trace.coverage
        return {"bytes": by_bytes, "calls": by_calls}

    @property
    def overhead_s(self) -> float:
        """Seconds spent in the counter's own bookkeeping (excluded from latency)."""
        return self.trace.overhead_s

    # -- device models -------------------------------------------------------
    @property
    def priced(self) -> bool:
        """True when the device spec has the bandwidth and peak a roofline needs."""
        spec = self.device_spec
        return spec is not None and bool(spec.bandwidth) and bool(spec.flops_per_s)

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

    @cached_property
    def energy(self) -> Energy | None:
        if not self.priced:
            return None
        return energy(self.trace, self.device_spec, self.total_io, self.roofline)

    @property
    def energy_j(self) -> float | None:
        return None if self.energy is None else self.energy.total_j

    @property
    def energy_per_token_j(self) -> float | None:
        return None if self.energy is None else self.energy.per_token_j(self.num_tokens)

    def on(self, device_spec, io_model: str | None = None) -> "PerformanceStats":
        """The same phase priced on another device (a DeviceSpec, a registry
        name or a YAML path). Nothing was measured there: latency is None."""
        if isinstance(device_spec, str):
            from perfcounter.devices import get_device_spec
            device_spec = get_device_spec(device_spec)
        return PerformanceStats(self.label, self.num_tokens, None, self.trace, device_spec,
                                io_model or self.io_model, None,
                                f"not measured on {getattr(device_spec, 'name', 'this device')}")

    # -- breakdowns ----------------------------------------------------------
    def modules(self, depth: int | None = None) -> dict[str, dict]:
        """Totals per module path, every record rolled up to each parent prefix;
        paths deeper than `depth` components are folded into their parent."""
        check_depth(depth, none_ok=True)
        costs = op_costs(self.trace, self.device_spec) if self.priced else None
        out: dict[str, dict] = {}
        for i, r in enumerate(self.trace.records):
            if not r.module:
                continue
            parts = r.module.split(".")
            n = len(parts) if depth is None else min(depth, len(parts))
            for k in range(1, n + 1):
                self._add_row(out, ".".join(parts[:k]), r, costs[i] if costs else None)
        return out

    def scopes(self) -> dict[str, dict]:
        """Totals per llm-profiler scope: transformer, embedding, attn, mlp, lm_head."""
        costs = op_costs(self.trace, self.device_spec) if self.priced else None
        out = {s: self._empty_row(costs is not None) for s in SCOPES}
        for i, r in enumerate(self.trace.records):
            for scope in record_scopes(r.module):
                self._add_row(out, scope, r, costs[i] if costs else None)
        return out

    @staticmethod
    def _empty_row(with_roofline: bool) -> dict:
        row = {"calls": 0, "flops": 0, "executed_flops": 0, "bytes_read": 0, "bytes_written": 0}
        if with_roofline:
            row["roofline_s"] = 0.0
        return row

    @classmethod
    def _add_row(cls, out: dict, key: str, r, cost) -> None:
        row = out.setdefault(key, cls._empty_row(cost is not None))
        row["calls"] += r.calls
        row["flops"] += r.flops
        row["executed_flops"] += r.executed_flops
        row["bytes_read"] += sum(r.read)
        row["bytes_written"] += sum(r.written)
        if cost is not None:
            row["roofline_s"] += cost.latency_s

    # -- data ----------------------------------------------------------------
    def to_dict(self) -> dict:
        """torchao's keys and ours, plain JSON types; from_dict() reads it back."""
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
            "roofline": None if self.roofline is None else self.roofline.to_dict(),
            "energy_j": self.energy_j, "energy_per_token_j": self.energy_per_token_j,
            "energy": None if self.energy is None else self.energy.to_dict(),
            "uncounted_ops": self.uncounted_ops, "coverage": self.coverage,
            "device": None if spec is None else spec.to_dict(),
            "trace": self.trace.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "PerformanceStats":
        """Rebuild a phase from to_dict(); derived figures are recomputed."""
        spec = None if d.get("device") is None else spec_from_dict(d["device"])
        return cls(d["label"], d["num_tokens"], d["latency"], Trace.from_dict(d["trace"]),
                   spec, d["io_model"], d["raw_latency"], d["timing"])

    def __str__(self) -> str:
        return format_stats(self)
