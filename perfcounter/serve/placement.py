"""Steps under a placement mapping (`--mapping`): each device's share plus the boundary transfers.

A mapping is `perfcounter simulate`'s (UPMEM's notation; perfcounter.simulation.placement):
which device runs each module of perfcounter's model (`tok_embeddings`, `TransformerBlock`,
`attention`, `wqkv`, `feed_forward`, `output`, globs such as `layers.1?.*`; transformers'
names as simulate reads them: q_proj, k_proj and v_proj on different devices split the fused
wqkv as simulate splits it, split_counts.py). A step on it costs, in the regime asked
(`execution`, as a single device's steps are priced)

    bound:     Σ_devices (its records' step-table figures at its roofline) / (peak_fraction x tp)
    predicted: Σ_devices (its records' step-table figures predicted on it in eager, compiled
               or cudagraphs: its achievable rates and overheads) / tp
    + the transfers at the placement's boundaries

Its joules: each device's share (its GPUs busy for its share's seconds, power.step_joules:
static + its dynamic joules, capped at its limit under the power model) and its static power
while the step runs elsewhere, + the transfers' joules.

The first term is the step table (steps.py) split by device: each record group of a layer
is priced, layer by layer, on the device that layer's module ran on, with that device's
share of the repeats: at the roofline bound (pricing.PricedTable), as simulate prices ops,
or as perfcounter predicts the device's share in the regime (predicted.PredictedTable:
its calls, views included, each pay that device's overhead; compiled and CUDA graphs fuse
the device's own records, one graph launch a device), as simulate's prediction replays
them; peak_fraction scales the bound only (a prediction uses achievable rates).
The second is perfcounter.simulation's own replay of each counted FIT step's whole-model
trace (layers expanded from the one-layer count): a module entered on another device
receives its input (activations [tokens, dim] at the step's dtype), the step's input
(token ids, positions) enters from the host and its logits go back, over the link the
mapping's devices give (links.py: a device<->device link, else device->host->device), and
a tensor-parallel block all-reduces. Those bytes are affine in the step's features, so the
transfer seconds and joules are fitted as the table's figures are (exactly).

Memory (`placement_memory`): each device holds the weights of the modules that run on it;
the KV cache of a layer lives where its attention runs, so the KV blocks are the fewest
that any device holding attention layers can store (its memory x utilisation - its
weights - the activation workspace, over its layers' KV bytes a token). A device without a
memory size is refused (give `vram_GB` in a device file, FILE.yaml:ENTRY). Weights are
the bytes the counted modules hold (ModuleInfo.param_bytes: quantized, as stored), a KV
token the cache's stored bytes (memory.kv_bytes_per_token, scales included).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import NamedTuple

import numpy as np

from perfcounter.models.layer_paths import at_layer, layer_of
from perfcounter.models.loading import fake_model
from perfcounter.pricing.power import idle_joules, power_of, step_joules
from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import (
    MemoryPlan,
    kv_bytes_per_token,
    workspace_bytes,
)
from perfcounter.serve.predicted import PredictedTable, PredictionPricer
from perfcounter.serve.pricing import PricedTable, RooflinePricer
from perfcounter.serve.split_counts import fused_parents, split_counts
from perfcounter.serve.steps import fit
from perfcounter.simulation.hf_names import names_qkv, split_modules, split_qkv
from perfcounter.simulation.placement import (
    Mapping,
    MappingError,
    Plan,
    default_host,
    resolve_device,
)
from perfcounter.simulation.run import simulate
from perfcounter.simulation.timeline import elementwise_spec
from perfcounter.trace import Trace

class ModuleRef(NamedTuple):
    """A module as a mapping sees it: its path and class."""

    path: str
    cls: str


def model_modules(args) -> list[ModuleRef]:
    """Every module of perfcounter's model for `args` as a step's trace lists them (no
    counting: a one-layer fake model, its layer repeated)."""
    one = dataclasses.replace(args, n_layer=1)
    model, _ = fake_model(one)
    root = type(model).__name__
    out = [ModuleRef(root, root)]
    for name, mod in model.named_modules():
        if not name or type(mod).__name__ == "ModuleList":
            continue
        path = f"{root}.{name}"
        n = args.n_layer if layer_of(path) == 0 else 1
        out += [ModuleRef(at_layer(path, i), type(mod).__name__) for i in range(n)]
    return out


def whole_trace(one: Trace, n_layer: int) -> tuple[Trace, dict]:
    """A one-layer step trace with its layer repeated n_layer times (records, modules, each
    parent's children; a parent's own ops keep their place between its children), and
    {parent path: {segment in `one`: its segment in the whole trace}}."""
    records = []
    for r in one.records:
        copies = range(n_layer) if layer_of(r.module) == 0 else (None,)
        records += [r if i is None else dataclasses.replace(r, module=at_layer(r.module, i))
                    for i in copies]
    modules, segment = [], {}
    for m in one.modules:
        if layer_of(m.path) == 0:
            modules += [dataclasses.replace(m, path=at_layer(m.path, i),
                                            children=[at_layer(c, i) for c in m.children])
                        for i in range(n_layer)]
            continue
        children, moved = [], {}
        for k, c in enumerate(m.children, 1):
            children += [at_layer(c, i) for i in range(n_layer)] if layer_of(c) == 0 else [c]
            moved[k] = len(children)  # the segment after child k is after its last copy
        segment[m.path] = moved
        modules.append(dataclasses.replace(m, children=children))
    records = [dataclasses.replace(r, segment=segment[r.module].get(r.segment, r.segment))
               if r.module in segment else r for r in records]
    return dataclasses.replace(one, records=records, modules=modules), segment


class _OnDevice(RooflinePricer):
    """A device's share of a placed step: its roofline, no host link of its own (the
    placement's transfers are charged once, by the simulation's replay)."""

    has_host_link = False

    def host_link(self, trace: Trace) -> tuple[float, float]:
        return 0.0, 0.0


class _PredictedOnDevice(PredictionPricer):
    """A device's share of a placed step as predicted in a regime, no host link of its own."""

    has_host_link = False

    def __init__(self, spec, execution: str):
        super().__init__(spec, execution)
        self.bound = _OnDevice(spec)


class PlacementPricer:
    """Steps under `mapping` (see the module doc), priced in `execution` ("bound": the
    roofline; "eager", "compiled", "cudagraphs": the prediction). Options as
    perfcounter.simulate takes them: host, devices ({name: DeviceSpec} before the
    registry), allow_unmatched, default_device, peak_fraction (the bound only),
    device_link, interconnect."""

    def __init__(self, mapping, args, *, execution="bound", host=None, devices=None,
                 allow_unmatched=False, default_device=None, peak_fraction=None,
                 device_link=None, interconnect=None):
        if peak_fraction is not None and execution != "bound":
            raise ServeError(f"peak_fraction scales the roofline bound; a prediction "
                             f"({execution}) prices each device at its achievable rates "
                             "(give execution='bound', or no peak_fraction)")
        try:
            self.mapping = Mapping.load(mapping)
            if host is None:
                host = default_host()
            elif isinstance(host, str):
                host = resolve_device(host, None, where="--host", extra=devices)
            modules = model_modules(args)
            if names_qkv(self.mapping.to_dict()):  # q_proj, k_proj, v_proj: wqkv's parts
                modules = split_modules(modules)
            plan = Plan(self.mapping, modules, host, default_device=default_device,
                        peak_fraction=peak_fraction, extra=devices)
            unmatched = self.mapping.unmatched(plan.used, modules)
        except MappingError as e:
            raise ServeError(f"--mapping: {e}") from None
        if unmatched and not allow_unmatched:
            raise ServeError(f"--mapping: {unmatched[0]} (perfcounter's model: "
                             f"{len(modules)} modules; --allow_unmatched warns instead)")
        for dev in plan.devices.values():  # the host's memory is checked if it holds weights
            if not dev.is_host and not dev.spec.vram:
                raise ServeError(_no_memory(dev.spec))
        self.args, self.host, self.devices = args, host, plan.devices
        self.options = {"host": host, "devices": devices, "allow_unmatched": allow_unmatched,
                        "default_device": default_device, "peak_fraction": peak_fraction,
                        "device_link": device_link, "interconnect": interconnect}
        text = json.dumps(self.mapping.to_dict(), sort_keys=True)
        self.key = (f"mapping {text} host {host.name} " +
                    " ".join(f"{k}:{hash(repr(d.spec)):x}" for k, d in plan.devices.items()) +
                    f" {peak_fraction!r} {default_device!r} {device_link!r} {interconnect!r}")
        self.static_w = 0.0  # known once the table says which devices run
        self.regime(execution, into=self)

    def regime(self, execution: str, into=None) -> "PlacementPricer":
        """This placement priced in `execution` (a copy, unless `into`)."""
        out = copy.copy(self) if into is None else into
        out.execution = execution
        out.label = "roofline bound under a placement" if execution == "bound" else \
            f"predicted, {execution}, under a placement"
        return out

    def make_table(self, counts) -> PlacedTable:
        return PlacedTable(counts, self)


def _replay(trace: Trace, pricer: PlacementPricer):
    """simulate()'s replay of one whole-model step: (where each (module, segment) ran: the
    placement the replay reports, PhaseResult.record_devices; transfer seconds, transfer
    joules)."""
    sim = simulate(trace, pricer.mapping, detail=True, execution=None, **pricer.options)
    phase = next(iter(sim.phases.values()))
    replayed = split_qkv({"": (trace, 0)}, pricer.mapping.to_dict())[""][0]  # as simulate
    where, views = {}, {}
    for r, device in zip(replayed.records, phase.record_devices, strict=True):
        if device is not None:  # a view: where the step that pays its calls runs
            (where if r.bytes or r.flops or r.executed_flops else views)[
                (r.module, r.segment)] = device
    where = {**views, **where}
    moved = [row for row in phase.log if row.transfer]
    return where, sum(r.duration_s for r in moved), sum(r.energy_j for r in moved)


class PlacedTable:
    """A step's seconds and joules under a placement (the module doc), with the step
    table's interface (seconds, energy_j, price, counts, label, static_w)."""

    def __init__(self, counts, pricer: PlacementPricer):
        self.counts, self.pricer, self.label = counts, pricer, pricer.label
        n = counts.args.n_layer
        where, moved_s, moved_j, segments = {}, [], [], {}
        for one in counts.fit_traces:
            whole, segments = whole_trace(one, n)
            ran, s, j = _replay(whole, pricer)
            where.update(ran)
            moved_s.append([s])
            moved_j.append([j])
        self.where = where  # (module path, segment) -> device key
        # q, k, v named: the fused projection's parts ran where the mapping puts them; on
        # different devices the step's counts are split as simulate splits the trace
        # (split_counts.py), on one device the projection is the one kernel counted there
        parents = fused_parents(where)
        split = any(len(d) > 1 for d in parents.values())
        self.together = {} if split else {p: next(iter(d)) for p, d in parents.items()}
        self.priced = priced = split_counts(counts) if split else counts
        xs = counts.xs
        self.transfer_s = fit(xs, np.array(moved_s), "transfer seconds")[0]  # [features]
        self.transfer_j = fit(xs, np.array(moved_j), "transfer joules")[0]
        self.parts = []  # (device key, its scale: 1 / (peak_fraction x tp) or 1 / tp, the
        used = sorted(set(where.values()))  # PricedTable or PredictedTable of its share)
        for key in used:
            dev = pricer.devices[key]

            def share(r, key=key):
                paths = [at_layer(r.module, i) for i in range(n)] \
                    if layer_of(r.module) == 0 else [r.module]
                seg = segments.get(r.module, {}).get(r.segment, r.segment)
                return sum((where.get((p, seg)) or self.together.get(p, "host")) == key
                           for p in paths)
            if pricer.execution == "bound":
                on = _OnDevice(elementwise_spec(dev.spec, "roofline"))
                part = (key, 1.0 / (dev.fraction * dev.tp), PricedTable(priced, on, share))
            else:
                on = _PredictedOnDevice(dev.spec, pricer.execution)
                part = (key, 1.0 / dev.tp, PredictedTable(priced, on, share))
            self.parts.append(part)
        self.has_energy = all(t.has_energy for _, _, t in self.parts)
        self.power = {k: power_of(pricer.devices[k].spec) for k in used}
        self.static_w = sum(self.power[k].static_w * pricer.devices[k].tp for k in used)
        pricer.static_w = self.static_w

    def device_seconds(self, f: np.ndarray) -> dict[str, float]:
        """Each device's busy seconds in a step of features f."""
        return {key: scale * t.seconds(f) for key, scale, t in self.parts}

    def seconds(self, f: np.ndarray) -> float:
        return float(sum(self.device_seconds(f).values()) + self.transfer_s @ f)

    def energy_j(self, f: np.ndarray, seconds: float) -> float:
        """Joules of the step (module doc): each device's tp GPUs busy for its share's seconds
        and idle the rest of `seconds`, + the transfers' joules."""
        joules = float(self.transfer_j @ f)
        for key, scale, t in self.parts:
            tp, power, busy = self.pricer.devices[key].tp, self.power[key], scale * t.seconds(f)
            joules += tp * (step_joules(t.dynamic_j(f) / tp, busy, power)
                            + idle_joules(seconds - busy, power.static_w))
        return joules

    def price(self, pieces) -> float:
        return self.seconds(self.counts.features(pieces))


def _no_memory(spec) -> str:
    """How a device without a memory size is refused: how to give it one, its figures kept."""
    entry = (f"devices: {{{spec.name}-mine: {{device_type: {spec.device_type}, bandwidth_GBs: "
             f"{spec.bandwidth / 1e9:g}, tflops: {spec.flops_per_s / 1e12:g}, vram_GB: <GB>, "
             "source: <where the size comes from>}}")
    return (f"--mapping: device {spec.name!r} has no memory size (vram_GB; none is published "
            f"for it); give one in a device file, e.g. my.yaml holding `{entry}`, and map to "
            f"my.yaml:{spec.name}-mine")


class DeviceMemory(NamedTuple):
    """One device of a placement: its memory and what it holds (bytes)."""

    device: str
    memory_bytes: float  # its memory x tp
    weight_bytes: int
    kv_bytes_per_token: int  # of the layers whose attention runs on it (0: none)
    kv_blocks: int | None  # blocks it can hold (None: it holds no KV cache)


def placement_memory(table: PlacedTable, dtype, *, gpu_memory_utilization: float,
                     block_size: int, max_num_batched_tokens: int,
                     max_num_seqs: int) -> tuple[MemoryPlan, list[DeviceMemory]]:
    """The memory plan of a placement (the module doc) and each device's row."""
    args, pricer = table.counts.args, table.pricer
    if not 0 < gpu_memory_utilization <= 1:
        raise ServeError(f"--gpu_memory_utilization {gpu_memory_utilization}: expected a "
                         "fraction in (0, 1]")
    on = {}
    for (path, _), key in table.where.items():
        on.setdefault(path, key)
    for path, key in table.together.items():  # q, k, v on one device: the fused projection
        on.setdefault(path, key)
    kv_dtype = table.counts.kv
    per_layer_kv = kv_bytes_per_token(args, dtype, kv_dtype) // args.n_layer
    weights, kv = {k: 0 for k, _, _ in table.parts}, {k: 0 for k, _, _ in table.parts}
    for m in model_modules(args):
        key = on.get(m.path)
        if key is None:
            continue
        if m.cls == "Attention":
            kv[key] += per_layer_kv
    for info in table.priced.fit_traces[0].modules:  # wqkv's parts where it is split
        paths = [at_layer(info.path, i) for i in range(args.n_layer)] \
            if layer_of(info.path) == 0 else [info.path]
        for p in paths:
            if p in on:
                weights[on[p]] += info.param_bytes  # as stored (quantized: data and scales)
    work = workspace_bytes(args, dtype, max_num_batched_tokens, max_num_seqs)
    rows, blocks = [], []
    for key, held_weights in weights.items():
        dev = pricer.devices[key]
        if not dev.spec.vram:
            raise ServeError(_no_memory(dev.spec))
        memory = float(dev.spec.vram) * dev.tp
        left = memory * gpu_memory_utilization - held_weights - (work if kv[key] else 0)
        held = max(0, math.floor(left / (block_size * kv[key]))) if kv[key] else None
        if held is None and left < 0:
            held = 0  # its weights alone do not fit: nothing can be served
        rows.append(DeviceMemory(key, memory, held_weights, kv[key], held))
        if held is not None:
            blocks.append(held)
    binding = [r for r in rows if r.kv_bytes_per_token]
    # the plan's figures are those of the devices holding the KV cache (rows: every device)
    plan = MemoryPlan(sum(r.memory_bytes for r in binding), gpu_memory_utilization,
                      sum(r.weight_bytes for r in binding), work * len(binding),
                      kv_bytes_per_token(args, dtype, kv_dtype), block_size, min(blocks, default=0),
                      args.block_size)
    return plan, rows
