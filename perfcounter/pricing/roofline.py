"""Roofline latency of a counted phase on a device, without running it there.

Per op record:  compute = executed_flops / peak(dtype of the op)
                memory  = bytes / bandwidth
                latency = max(compute, memory)
and the phase's roofline latency is the sum over its records (io_model
"per_op": every op waits for its own memory traffic), or, for io_model
"compulsory" (perfect fusion), max(Σ compute, compulsory bytes / bandwidth).
Host-link transfers are added on top for devices that sit behind a link.

Per-element costs. A spec may give softmax / SiLU / RMSNorm costs in ns per
element (UPMEM's profiles do); they replace the FLOP side of the ops that
implement those functions, as the costs registry tags them (`per_element=`):
- softmax: aten._softmax, aten.softmax, aten._safe_softmax records;
- SiLU:    aten.silu, aten.silu_ records;
- RMSNorm: aten.rms_norm / aten._fused_rms_norm records, and norms written
  out op by op (HF's LlamaRMSNorm, gpt-fast's RMSNorm): inside a module whose
  last path component ends in "norm" (input_layernorm, ffn_norm, norm, …),
  the record that reads the norm's weight is priced as the RMSNorm and the
  module's other records keep their memory time but no compute time.
The element count of a call is the numel of the record's largest tensor
argument (the normalized / activated tensor).
Softmax inside a fused attention kernel (SDPA) stays in that kernel's FLOPs.

Host link. A device that is not the host (device_type other than "cpu") and
whose spec gives host-link figures receives the phase's inputs (compulsory
bytes of role "input": token ids, positions, masks) host→device and returns
its output (the bytes written by the phase's last op that writes any: logits,
or the sampled token when sampling runs inside the phase) device→host.

Collectives. One rank of a sharded model (perfcounter/parallel) records its all-reduces,
gathers, sends and all-to-alls as ops; each also costs its link's seconds
(collectives.record_seconds: the ring or tree on the spec's link, none for a send/recv that
overlaps compute), added on top as the host link is: the bound of a rank that talks.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfcounter.costs import op_info_by_name
from perfcounter.pricing.collectives import trace_collectives_s
from perfcounter.pricing.links import host_link_s
from perfcounter.counting.module_kinds import NORM, own_kind
from perfcounter.trace import ROLES, OpRecord, Trace, check_io_model
from perfcounter.trace_args import tensor_args

_INPUT = ROLES.index("input")
_WEIGHT = ROLES.index("weight")


def largest_numel(args: tuple) -> int:
    """Numel of the largest tensor among an op's args (OpRecord.args); 0 without one."""
    return max((t.numel for t in tensor_args(args)), default=0)


def is_integer_dtype(dtype: str) -> bool:
    """Integer and bool ops (positions, masks, token ids) have no peak of their own."""
    return dtype.startswith(("int", "uint", "bool"))


def peak_flops(spec, dtype: str) -> float:
    """The spec's peak FLOP/s for an op's dtype. Integer ops and ops without a
    tensor use the spec's compute-dtype peak silently; a float dtype the spec
    lacks uses it too, with the spec's warning. An int8 / int4 record (a quantized
    matmul, subclass_linear.py: W8A8) runs at the spec's integer peak where it lists one."""
    if dtype in ("int8", "int4"):
        try:
            return float(spec.peak_flops(dtype, strict=True))
        except (KeyError, ValueError, TypeError):
            pass
    elif dtype and not is_integer_dtype(dtype):
        try:
            return float(spec.peak_flops(dtype))
        except (KeyError, ValueError, TypeError):
            pass
    return float(spec.flops_per_s)


@dataclass(frozen=True)
class OpCost:
    """One record's roofline: seconds of compute and of memory traffic."""

    record: OpRecord
    compute_s: float
    memory_s: float
    rule: str  # "flops", "softmax", "silu", "rmsnorm", "rmsnorm-part"

    @property
    def latency_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def per_element_tag(op: str) -> str | None:
    """The function an op implements for per-element pricing ("softmax", "silu",
    "rmsnorm"), as the costs registry tags it (`per_element=`), or None."""
    info = op_info_by_name(op)
    return info.per_element if info is not None else None


def _compute_rule(record: OpRecord, spec, norm_anchor: bool, in_norm: bool):
    """(rule, ns per element) for a record, or ("flops", None)."""
    tag = per_element_tag(record.op)
    softmax = spec.softmax_ns_per_element
    silu = spec.silu_ns_per_element
    rmsnorm = spec.rmsnorm_ns_per_element
    if softmax is not None and tag == "softmax":
        return "softmax", softmax
    if silu is not None and tag == "silu":
        return "silu", silu
    if rmsnorm is not None and (tag == "rmsnorm" or norm_anchor):
        return "rmsnorm", rmsnorm
    if rmsnorm is not None and in_norm:
        return "rmsnorm-part", 0.0
    return "flops", None


def op_costs(trace: Trace, spec) -> list[OpCost]:
    """The roofline of every record of a trace on a device."""
    bandwidth = float(spec.bandwidth)
    peaks: dict[str, float] = {}
    # in a norm written op by op, the record reading the weight stands for the
    # whole RMSNorm; a norm module that ran a fused rms_norm op needs no anchor
    anchored = {r.module for r in trace.records
                if own_kind(r.module) == NORM and per_element_tag(r.op) == "rmsnorm"}
    costs = []
    for r in trace.records:
        in_norm = own_kind(r.module) == NORM and r.module not in anchored
        anchor = in_norm and r.read[_WEIGHT] > 0
        rule, ns = _compute_rule(r, spec, anchor, in_norm)
        if ns is None:
            compute = 0.0
            if r.executed_flops:
                if r.dtype not in peaks:
                    peaks[r.dtype] = peak_flops(spec, r.dtype)
                compute = r.executed_flops / peaks[r.dtype]
        else:
            compute = r.calls * largest_numel(r.args) * ns * 1e-9
        costs.append(OpCost(r, compute, r.bytes / bandwidth, rule))
    return costs


def crosses_host_link(spec) -> bool:
    """True when the device sits behind a host link that the spec describes."""
    if spec is None or spec.device_type == "cpu":
        return False
    return any(v is not None for v in (spec.host_to_device_bw, spec.host_to_device_pj_per_bit,
                                        spec.device_to_host_bw, spec.device_to_host_pj_per_bit))


def host_link_bytes(trace: Trace) -> tuple[int, int]:
    """(bytes host→device, bytes device→host) of a phase; see the module doc."""
    to_device = trace.compulsory_read[_INPUT]
    to_host = 0
    for r in reversed(trace.records):
        if sum(r.written):
            to_host = sum(r.written)
            break
    return to_device, to_host


@dataclass(frozen=True)
class Roofline:
    """A phase's roofline on one device; every figure in seconds or bytes."""

    compute_s: float  # Σ compute side over records
    memory_s: float  # bytes of the io model / bandwidth
    ops_s: float  # the roofline over the ops (see the module doc)
    memory_bound_s: float  # share of ops_s spent in memory-bound records
    host_to_device_bytes: int
    device_to_host_bytes: int
    host_link_s: float
    io_model: str
    collective_s: float = 0.0  # a rank's collectives on its link (the module doc)

    @property
    def latency_s(self) -> float:
        return self.ops_s + self.host_link_s + self.collective_s

    @property
    def bound(self) -> str:
        """'memory' or 'compute': the side the op roofline spends most time on."""
        if self.io_model == "compulsory":
            return "memory" if self.memory_s >= self.compute_s else "compute"
        return "memory" if self.memory_bound_s >= self.ops_s - self.memory_bound_s else "compute"

    def to_dict(self) -> dict:
        return {
            "latency_s": self.latency_s, "bound": self.bound,
            "compute_s": self.compute_s, "memory_s": self.memory_s,
            "ops_s": self.ops_s, "host_link_s": self.host_link_s,
            "host_to_device_bytes": self.host_to_device_bytes,
            "device_to_host_bytes": self.device_to_host_bytes,
            "io_model": self.io_model,
            **({"collective_s": self.collective_s} if self.collective_s else {}),
        }


def roofline(trace: Trace, spec, io_model: str = "per_op") -> Roofline:
    """The roofline latency of a trace on a device under an io model."""
    check_io_model(io_model)
    costs = op_costs(trace, spec)
    compute = sum(c.compute_s for c in costs)
    if io_model == "per_op":
        memory = sum(c.memory_s for c in costs)
        ops = sum(c.latency_s for c in costs)
        memory_bound = sum(c.latency_s for c in costs if c.bound == "memory")
    else:
        memory = trace.compulsory_bytes / float(spec.bandwidth)
        ops = max(compute, memory)
        memory_bound = ops if memory >= compute else 0.0
    to_device, to_host, link = 0, 0, 0.0
    if crosses_host_link(spec):
        to_device, to_host = host_link_bytes(trace)
        link = host_link_s(spec, to_device, to_host)
    return Roofline(compute, memory, ops, memory_bound, to_device, to_host, link, io_model,
                    trace_collectives_s(trace, spec))
