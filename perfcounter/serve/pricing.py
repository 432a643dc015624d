"""A step's seconds and joules on a device: the pricer seam and the priced step table.

The seam is the pricer. `pricer.record_costs(trace)` gives each record of a counted
trace (fixed_s, compute_s, memory_s); a step costs

    Σ_groups fixed + max(Σ compute, Σ memory)  +  host link

where a group holds one op of every piece of the step (steps.py: in an engine the
pieces' attention is one varlen kernel, one roofline). `RooflinePricer` is the
roofline bound: fixed 0, executed FLOPs / peak at the op's dtype, bytes / bandwidth
(roofline.op_costs, per-element costs of the spec included), the host link as
roofline.py charges it (the step's inputs in, its output back). Its output says
"step costs: roofline bound". A prediction with an execution regime (eager,
compiled, cudagraphs) is predicted.py's `PredictionPricer`, the same three methods
and its own table. A placement mapping (placement.py) prices each device's share with
a PricedTable of the records placed there, plus the transfers perfcounter.simulation
charges at the placement's boundaries.

`pricer.make_table(counts)` prices the counted steps once. `PricedTable(counts, pricer)`
(the roofline's) prices the counted one-layer FIT traces, sums each group (times the
layers it stands for) and fits compute, memory, fixed, host-link and energy coefficients
over the step features, so that pricing a step in the scheduler's loop is two small
matrix-vector products. `step_table(args, dtype, pricer)` builds it once per (model,
dtype, pricer: its device and regime) and caches it: the counts per (model, dtype), the
priced table per pricer key as well (`cache_info()`, `cache_clear()`).
"""
from __future__ import annotations

import dataclasses

from typing import NamedTuple

import numpy as np
import torch

from perfcounter.models.args import ModelArgs
from perfcounter.pricing.energy import PJ, record_energies
from perfcounter.pricing.roofline import crosses_host_link, host_link_bytes, op_costs
from perfcounter.serve.steps import FEATURES, StepCounts, count_table, fit, group_key
from perfcounter.trace import Trace

ROOFLINE_LABEL = "roofline bound"


class RooflinePricer:
    """Each record at the device's roofline: (0, executed FLOPs / peak, bytes / bandwidth)."""

    label = ROOFLINE_LABEL
    execution = "bound"

    def __init__(self, spec):
        self.spec = spec
        # its name and dtype, and every figure (two specs of one name may differ)
        self.key = f"{spec.name}:{spec.dtype}:{hash(repr(spec)):x}"
        self.static_w = float(spec.static_w or 0.0)

    def make_table(self, counts: StepCounts) -> "PricedTable":
        return PricedTable(counts, self)

    def record_costs(self, trace: Trace) -> list[tuple[float, float, float]]:
        return [(0.0, c.compute_s, c.memory_s) for c in op_costs(trace, self.spec)]

    def record_energy_j(self, trace: Trace) -> list[float] | None:
        """Dynamic joules per record (compute + memory); None when the spec lacks a figure."""
        out = []
        for e in record_energies(trace.records, self.spec):
            if e.compute_pj is None or e.memory_pj is None:
                return None
            out.append(e.compute_j + e.memory_j)
        return out

    def host_link(self, trace: Trace) -> tuple[float, float]:
        """(seconds, joules) of the step's inputs in and output back over the host link."""
        spec = self.spec
        if not crosses_host_link(spec):
            return 0.0, 0.0
        seconds = joules = 0.0
        for nbytes, bw, pj in zip(host_link_bytes(trace),
                                  (spec.host_to_device_bw, spec.device_to_host_bw),
                                  (spec.host_to_device_pj_per_bit, spec.device_to_host_pj_per_bit)):
            seconds += nbytes / bw if bw else 0.0
            joules += nbytes * 8 * (pj or 0.0) * PJ
        return seconds, joules


class PricedTable:
    """A step's seconds and dynamic joules as functions of its features (module doc)."""

    def __init__(self, counts: StepCounts, pricer, repeats=None):
        """repeats(record): how many times a record of a one-layer trace stands in what this
        table prices (default counts.repeats: the whole model; a placement: one device's
        share, placement.py)."""
        self.counts, self.pricer = counts, pricer
        repeats = counts.repeats if repeats is None else repeats
        self.label = pricer.label
        self.static_w = float(getattr(pricer, "static_w", 0.0) or 0.0)
        index = {k: g for g, k in enumerate(counts.keys)}
        groups, shapes = len(index), len(counts.fit_traces)
        comp, mem = np.zeros((shapes, groups)), np.zeros((shapes, groups))
        base, joules = np.zeros((shapes, 1)), np.zeros((shapes, 1))
        self.has_energy = True
        for s, trace in enumerate(counts.fit_traces):
            live = [r for r in trace.records if r.bytes or r.flops or r.executed_flops]
            sub = Trace(records=live, compulsory_read=trace.compulsory_read,
                        compulsory_written=trace.compulsory_written)
            energy = pricer.record_energy_j(sub)
            if energy is None:
                self.has_energy = False
            for i, (r, (fixed, c, m)) in enumerate(zip(live, pricer.record_costs(sub))):
                k, n = index[group_key(r)], repeats(r)
                comp[s, k] += c * n
                mem[s, k] += m * n
                base[s, 0] += fixed * n
                if energy is not None:
                    joules[s, 0] += energy[i] * n
            link_s, link_j = pricer.host_link(sub)
            base[s, 0] += link_s
            joules[s, 0] += link_j
        xs = counts.xs
        self.compute = fit(xs, comp, "compute seconds")  # [groups, features]
        self.memory = fit(xs, mem, "memory seconds")
        self.base = fit(xs, base, "fixed and host-link seconds")[0]  # [features]
        self.joules = fit(xs, joules, "joules")[0]

    def seconds(self, f: np.ndarray) -> float:
        """Seconds of a step with features f (steps.features)."""
        return float(self.base @ f + np.maximum(self.compute @ f, self.memory @ f).sum())

    def energy_j(self, f: np.ndarray, seconds: float) -> float:
        """Joules of that step: dynamic (compute, memory, host link) + static W x seconds."""
        return float(self.joules @ f) + self.static_w * seconds

    def price(self, pieces) -> float:
        return self.seconds(self.counts.features(pieces))

    def price_trace(self, trace: Trace) -> float:
        """The same rule applied to a counted step trace (records grouped as the table does)."""
        live = [r for r in trace.records if r.bytes or r.flops or r.executed_flops]
        sub = Trace(records=live, compulsory_read=trace.compulsory_read,
                    compulsory_written=trace.compulsory_written)
        groups: dict = {}
        total = 0.0
        for r, (fixed, c, m) in zip(live, self.pricer.record_costs(sub)):
            key = (group_key(r), r.module)
            acc = groups.setdefault(key, [0.0, 0.0])
            acc[0] += c
            acc[1] += m
            total += fixed
        return total + sum(max(c, m) for c, m in groups.values()) + self.pricer.host_link(sub)[0]


# -- the cache: one table per (model, dtype) and pricer -------------------------------------
class CountsKey(NamedTuple):
    model: str  # repr of the ModelArgs: every field that shapes a step
    dtype: str
    weights: str | None = None  # the quantize scheme's name (None: float weights)
    kv: str | None = None  # the KV cache's quantized dtype (None: float)


class TableKey(NamedTuple):
    counts: CountsKey
    device: str  # the pricer's key: its device spec's name and dtype
    execution: str  # the regime it prices: "bound" (the roofline) or a prediction's
    load: str = "balanced"  # the experts' routing a step is priced at (ExpertLoad)


_COUNTS: dict[CountsKey, StepCounts] = {}
_TABLES: dict[TableKey, PricedTable] = {}
_STATS = {"hits": 0, "misses": 0}


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    counts: int  # step counts held (per model and dtype)
    tables: int  # priced tables held (per model, dtype, device and regime)


def cache_info() -> CacheInfo:
    return CacheInfo(_STATS["hits"], _STATS["misses"], len(_COUNTS), len(_TABLES))


def cache_clear() -> None:
    _COUNTS.clear()
    _TABLES.clear()
    _STATS.update(hits=0, misses=0)


def step_table(args: ModelArgs, dtype: torch.dtype, pricer, *, weights=None,
               kv=None, load=None) -> PricedTable:
    """The priced step table of `args` at `dtype` under `pricer` (its key names the device
    and the regime), counted once per (model, dtype, weights, kv) and priced once per
    pricer and routing. weights: a quantize.WeightScheme (None: float); kv: "int8", "fp8" or
    None; load: a mixture of experts' ExpertLoad its steps are priced at (None: balanced)."""
    ckey = CountsKey(repr(args) + repr(sorted(vars(args).items())), str(dtype),
                     getattr(weights, "name", weights), kv)
    key = TableKey(ckey, pricer.key, pricer.execution, str(load or "balanced"))
    table = _TABLES.get(key)
    if table is not None:
        _STATS["hits"] += 1
        return table
    _STATS["misses"] += 1
    counts = _COUNTS.get(ckey)
    if counts is None:
        counts = _COUNTS[ckey] = count_table(args, dtype, weights=weights, kv=kv)
    if load is not None and load.shares is not None:
        counts = dataclasses.replace(counts, load=load)
    table = _TABLES[key] = pricer.make_table(counts)
    return table


__all__ = ["FEATURES", "ROOFLINE_LABEL", "PricedTable", "RooflinePricer", "cache_clear",
           "cache_info", "step_table"]
