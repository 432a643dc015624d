"""A step's seconds and joules on a device: the pricers and the cache of priced step tables.

A pricer names a device spec and a regime (pricing.price.REGIMES); its `make_table(counts)`
is a table.StepTable, whose every step is `pricing.price.price(figures, spec, execution)`
of the step's figures. `RooflinePricer(spec)` prices the bound ("bound": the least any regime
can take, docs/predictions.md#the-bound: the step's executed FLOPs at the peak FLOP/s, the
fewest bytes any regime moves at the peak bandwidth, the larger of the two, + the host
link); its output says "step costs: roofline bound". A prediction in a regime (eager,
compiled, cudagraphs) is predicted.py's `PredictionPricer`. Both give a step's energy as the
roofline's dynamic joules of its bytes and FLOPs (energy.py) and the host link's, which the
table fits over the step features. A placement mapping (placement.py) prices each device's
share with a table of the records placed there, plus the transfers perfcounter.simulation
charges at the placement's boundaries.

`step_table(args, dtype, pricer)` builds a table once per (model, dtype, pricer: its device
and regime) and caches it: the counts per (model, dtype), the priced table per pricer key as
well (`cache_info()`, `cache_clear()`); the counts are also kept on disk between runs
(counts_cache.py: read back by a later run, or by plan's worker processes, instead of counted).
"""
from __future__ import annotations

import dataclasses

from typing import NamedTuple

import torch

from perfcounter.models.args import ModelArgs
from perfcounter.pricing.energy import record_energies
from perfcounter.pricing.links import host_link, transfer
from perfcounter.pricing.power import power_of
from perfcounter.pricing.roofline import crosses_host_link, host_link_bytes
from perfcounter.quant.gguf_types import GgufFile
from perfcounter.serve import counts_cache
from perfcounter.serve.steps import FEATURES, StepCounts, count_table
from perfcounter.serve.steps_hf import count_hf_table
from perfcounter.serve.table import StepTable
from perfcounter.trace import Trace

ROOFLINE_LABEL = "roofline bound"


class RooflinePricer:
    """Steps at the bound on `spec` (the module doc); its energy and host link are every
    pricer's."""

    label = ROOFLINE_LABEL
    execution = "bound"
    has_host_link = True  # a placement's device has none of its own (placement.py)

    def __init__(self, spec):
        self.spec = spec
        # its name and dtype, and every figure (two specs of one name may differ)
        self.key = f"{spec.name}:{spec.dtype}:{hash(repr(spec)):x}"
        self.static_w = power_of(spec).static_w  # W idle (pricing/power.py)

    def make_table(self, counts: StepCounts) -> StepTable:
        return StepTable(counts, self)

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
        for nbytes, direction in zip(host_link_bytes(trace), ("host_to_device", "device_to_host")):
            link = host_link(spec, direction)
            if link is not None:
                t, e = transfer(nbytes, link)
                seconds, joules = seconds + t, joules + e
        return seconds, joules


PricedTable = StepTable  # the bound's table is the step table


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
_TABLES: dict[TableKey, StepTable] = {}
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
               kv=None, load=None) -> StepTable:
    """The priced step table of `args` at `dtype` under `pricer` (its key names the device
    and the regime), counted once per (model, dtype, weights, kv) and priced once per
    pricer and routing. weights: a quantize.WeightScheme (None: float); kv: "int8", "fp8" or
    None; load: a mixture of experts' ExpertLoad its steps are priced at (None: balanced)."""
    fields = repr(sorted(vars(args).items())) if isinstance(args, ModelArgs) else args.config_json
    ckey = CountsKey(repr(args) + fields, str(dtype),
                     getattr(weights, "name", weights), kv)
    key = TableKey(ckey, pricer.key, pricer.execution, str(load or "balanced"))
    table = _TABLES.get(key)
    if table is not None:
        _STATS["hits"] += 1
        return table
    _STATS["misses"] += 1
    counts = _COUNTS.get(ckey)
    if counts is None:
        kept = not isinstance(weights, GgufFile)  # a file's counts follow its contents
        counts = counts_cache.load(ckey) if kept else None
        if counts is None:
            count = count_table if isinstance(args, ModelArgs) else count_hf_table  # HfArgs
            counts = count(args, dtype, weights=weights, kv=kv)
            if kept:
                counts_cache.save(ckey, counts)
        _COUNTS[ckey] = counts
    if load is not None and load.shares is not None:
        counts = dataclasses.replace(counts, load=load)
    table = _TABLES[key] = pricer.make_table(counts)
    return table


__all__ = ["FEATURES", "ROOFLINE_LABEL", "PricedTable", "RooflinePricer", "StepTable",
           "cache_clear", "cache_info", "step_table"]
