"""Energy of a counted phase on a device, in joules, and its breakdown.

    compute   = Σ_records executed_flops · pJ/FLOP(dtype of the record)
    memory    = bytes of the io model · 8 · memory pJ/bit
                (+ a sharded model's collectives: the bytes each rank sends on its link
                · 8 · the link's pJ/bit, pricing/collectives.py; 0 where the link has none)
    host link = bytes host→device · 8 · pJ/bit  +  bytes device→host · 8 · pJ/bit
                (only for a device behind a host link; which bytes cross is
                decided in roofline.py: the phase's inputs in, its output back)
    static    = the device's static W (pricing/power.py) · the phase's time on that device

All in pJ, times 1e-12 for joules. Executed FLOPs (not the dense convention)
are priced because that is what the hardware does. The phase's time is the
modelled time on the target device, not the measured time on the machine that
ran the count, so that re-costing a trace for another device stays consistent:
under the power model (a GPU with an idle figure) the predicted time, which the
caller passes (stats.py: the phase's prediction in its regime), the total capped
at the board's limit x that time; under the dynamic model (PIM parts, UPMEM's
profiles, devices without an idle figure) the roofline time, static W the
entry's static_W, no cap, as before the power model. `mean_power_w` = total /
that time.

A component whose figure the spec lacks is None (shown "n/a"). The total needs
compute and memory; host link and static count as 0 when unknown.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from perfcounter.pricing.collectives import is_collective, record_joules
from perfcounter.pricing.power import DYNAMIC, mean_power_w, power_of
from perfcounter.pricing.roofline import Roofline, is_integer_dtype
from perfcounter.trace import Trace

PJ = 1e-12


@dataclass(frozen=True)
class Energy:
    """Joules of one phase on one device, by component."""

    compute_j: float | None
    memory_j: float | None
    host_link_j: float | None
    static_j: float | None
    seconds: float | None = None  # the phase's time its static power and mean power are over
    cap_w: float | None = None  # the board's limit (the power model); None: no cap
    model: str = DYNAMIC  # pricing/power.py's model of the device

    @property
    def total_j(self) -> float | None:
        if self.compute_j is None or self.memory_j is None:
            return None
        total = self.compute_j + self.memory_j + (self.host_link_j or 0.0) + (self.static_j or 0.0)
        if self.cap_w is not None and self.seconds:
            total = min(total, self.cap_w * self.seconds)
        return total

    @property
    def mean_power_w(self) -> float | None:
        """total_j / seconds: the phase's average power on the device."""
        return mean_power_w(self.total_j, self.seconds)

    def per_token_j(self, num_tokens: int) -> float | None:
        total = self.total_j
        return None if total is None or not num_tokens else total / num_tokens

    def to_dict(self) -> dict:
        return {"total_j": self.total_j, "compute_j": self.compute_j,
                "memory_j": self.memory_j, "host_link_j": self.host_link_j,
                "static_j": self.static_j, "seconds": self.seconds,
                "mean_power_w": self.mean_power_w, "cap_w": self.cap_w,
                "energy_model": self.model}


def record_pj_per_flop(spec, dtype: str) -> float | None:
    """pJ/FLOP at an op's dtype; integer ops and ops without a tensor are
    priced at the spec's compute dtype."""
    if dtype and not is_integer_dtype(dtype):
        try:
            return spec.pj_per_flop(dtype)
        except (KeyError, ValueError, TypeError):
            pass
    return spec.pj_per_flop(None)


class RecordEnergy(NamedTuple):
    """One record's dynamic energy on a device, in pJ; None where the spec lacks the figure."""

    compute_pj: float | None  # executed FLOPs · pJ/FLOP of the record's dtype (0 without FLOPs)
    memory_pj: float | None  # bytes read + written · 8 · memory pJ/bit

    @property
    def compute_j(self) -> float | None:
        return None if self.compute_pj is None else self.compute_pj * PJ

    @property
    def memory_j(self) -> float | None:
        return None if self.memory_pj is None else self.memory_pj * PJ


def record_energies(records, spec) -> list[RecordEnergy]:
    """Each record's compute and memory energy on a device, in record order: the one place
    a record is priced in pJ (the phase's compute energy, plots' bars, the simulator's
    steps and the serving steps all sum these)."""
    mem_pj = getattr(spec, "mem_pj_per_bit", None)
    cache: dict[str, float | None] = {}
    out = []
    for r in records:
        compute = 0.0
        if r.executed_flops:
            if r.dtype not in cache:
                cache[r.dtype] = record_pj_per_flop(spec, r.dtype)
            pj = cache[r.dtype]
            compute = None if pj is None else r.executed_flops * pj
        memory = None if mem_pj is None else r.bytes * 8 * mem_pj
        if memory is not None and is_collective(getattr(r, "op", "")):  # + its link traffic
            memory += record_joules(r, spec) / PJ
        out.append(RecordEnergy(compute, memory))
    return out


def compute_energy_j(trace: Trace, spec) -> float | None:
    """Σ executed FLOPs · pJ/FLOP of their dtype, in J; None when unknown."""
    total_pj = 0.0
    for e in record_energies(trace.records, spec):
        if e.compute_pj is None:
            return None
        total_pj += e.compute_pj  # in order, as a loop (sum() compensates since 3.12)
    return total_pj * PJ


def energy(trace: Trace, spec, io_bytes: int, line: Roofline, seconds=None) -> Energy:
    """A phase's energy on a device given its io-model bytes and roofline; `seconds`: its
    predicted time, or a function that gives it (asked only under the power model; None: the
    roofline's time)."""
    compute = compute_energy_j(trace, spec)
    mem_pj = spec.mem_pj_per_bit
    memory = None if mem_pj is None else io_bytes * 8 * mem_pj * PJ + sum(
        record_joules(r, spec) for r in trace.records if is_collective(r.op))
    host = 0.0
    for nbytes, pj in ((line.host_to_device_bytes, spec.host_to_device_pj_per_bit),
                       (line.device_to_host_bytes, spec.device_to_host_pj_per_bit)):
        if not nbytes:
            continue
        if pj is None:
            host = None
            break
        host += nbytes * 8 * pj * PJ
    power = power_of(spec)
    if power.model == DYNAMIC:
        t = line.latency_s
        static = None if spec.static_w is None else spec.static_w * t
    else:
        t = seconds() if callable(seconds) else seconds
        t = line.latency_s if t is None else t
        static = power.static_w * t
    return Energy(compute, memory, host, static, t, power.cap_w, power.model)
