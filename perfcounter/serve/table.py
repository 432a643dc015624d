"""The step table: a step's figures by record group as affine functions of its features, priced
by pricing/price.py at every step (no pricing rule here).

`StepTable(counts, pricer)` holds, per record group of the counts (steps.py: one op of every
layer and piece), what pricing.figures.Figures needs: its kind, dtype, weight and mask (from
the group's counted sample) and its calls, FLOPs, bytes, weight and KV reads, a collective's
bytes (counts.coef, per layer, times the layers the group repeats); a matmul's rows M and the
calls of views (eager dispatches them) fitted over the counted steps; the step's compulsory
bytes and fused IO (counts.compulsory, counts.fused) and the bytes of its host link (fitted
here). `seconds(f)` builds the figures of a step of features f, rounded to whole bytes,
FLOPs and calls (the counted figures are integers: at a counted step the table's figures are
the counted ones) and returns `price(figures, spec, execution).latency_s`.

What an engine runs, not a rule: compiled and CUDA graphs launch a layer's attention pieces as
one varlen kernel (a group's calls 1 a layer), where our eager model calls SDPA once a piece.

A placement (placement.py) prices each device's share with a table of the records placed
there (`repeats`: how many layers of each group run on that device): its calls, work and
view calls are the device's; of the step's compulsory bytes it holds what its matmuls and
attention stream plus the rest shared by its fused records' bytes (all its bytes where
nothing is fused), as per_record.py shares a compiled phase; its fused kernels move the
step's fused IO shared the same way. With every record on one device it is the
single-device table.

Energy (joules) is the roofline's dynamic energy of the same bytes and FLOPs (energy.py, fitted
per step as the figures are) + static W x the step's priced seconds.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from perfcounter.pricing.achievable import program_dtype
from perfcounter.pricing.collectives import record_call
from perfcounter.pricing.figures import Figures, figures_of, record_kind
from perfcounter.pricing.op_classes import (COLLECTIVE, gemv_weight, has_explicit_mask,
                                            matmul_rows)
from perfcounter.pricing.price import price
from perfcounter.pricing.roofline import host_link_bytes
from perfcounter.serve.steps import EXPERTS, StepCounts, StepModelError, fit, group_key
from perfcounter.trace import ROLES, Trace

_CALLS, _FLOPS, _EXECUTED, _BYTES = 0, 1, 2, 10  # figure columns (steps._figures)
_WRITTEN = _BYTES + len(ROLES)
_STREAMED = [_BYTES + ROLES.index("weight"), _BYTES + ROLES.index("kv_cache")]
SECONDS_CACHED = 1 << 16  # distinct steps a table keeps priced (then it starts over)


class StepTable:
    """A step's seconds and joules from the counts' figures (module doc)."""

    def __init__(self, counts: StepCounts, pricer, repeats=None):
        """pricer: its spec, execution (pricing.price.REGIMES), label, static_w, and
        record_energy_j / host_link (the roofline's energy and link: RooflinePricer).
        repeats(record): how many times a record of a one-layer trace stands in what this
        table prices (default counts.repeats: the whole model; a placement: a device's share)."""
        self.counts, self.pricer = counts, pricer
        self.spec, self.execution = pricer.spec, pricer.execution
        self.label = pricer.label
        self.static_w = float(getattr(pricer, "static_w", 0.0) or 0.0)
        self.whole = repeats is None
        repeats = counts.repeats if repeats is None else repeats
        self.layers = counts.layers if self.whole else \
            np.array([repeats(counts.sample[k]) for k in counts.keys], dtype=float)
        samples = [counts.sample[k] for k in counts.keys]
        self.kind = tuple(record_kind(s.op, s.args) for s in samples)
        self.dtype = tuple(s.dtype for s in samples)
        self.weight = tuple(gemv_weight(s) if k == "matmul" else None
                            for s, k in zip(samples, self.kind))
        self.collective = tuple(record_call(s)[::2] if k == COLLECTIVE else None
                                for s, k in zip(samples, self.kind))
        self.linked = np.array([c is not None for c in self.collective])
        self.dense = np.array([k == "attention" and has_explicit_mask(s.args)
                               for s, k in zip(samples, self.kind)], dtype=bool)
        self.attention = np.array([k == "attention" for k in self.kind])
        self.matmul = np.array([k == "matmul" for k in self.kind])
        # matmuls and attention: what a compiled step's fused rest does not hold
        self.extern = self.matmul | self.attention
        self.program_dtype = program_dtype(counts.fit_traces[0].records)
        self.rows, self.view_calls, self.per_expert = _rows_and_view_calls(
            counts, self.matmul, repeats)
        self._no_link = np.zeros(len(samples))
        self.any_per_expert = bool(self.per_expert.any())
        self.any_linked = bool(self.linked.any())
        self.varlen = self.execution in ("compiled", "cudagraphs") and bool(self.attention.any())
        xs = counts.xs
        link, energy, self.has_energy = _link_and_energy(counts, pricer, repeats)
        self.link = fit(xs, link, "host-link bytes")  # [2, features]
        self.joules = fit(xs, energy, "joules")[0]  # [features]
        # every figure of a step in one matrix [rows, features], one product a step: per group
        # and layer calls, FLOPs, executed FLOPs, bytes, weight and KV reads, bytes written (a
        # collective's message); then each group's rows M, the view calls, the compulsory
        # bytes, the fused IO and the host link's bytes in and out
        coef, groups = counts.coef, len(samples)
        fused = counts.fused if counts.fused is not None else np.zeros(len(counts.compulsory))
        self._all = np.concatenate([
            np.stack([coef[:, _CALLS], coef[:, _FLOPS], coef[:, _EXECUTED],
                      coef[:, _BYTES:].sum(axis=1), coef[:, _STREAMED].sum(axis=1),
                      coef[:, _WRITTEN:].sum(axis=1)], axis=1).reshape(groups * 6, -1),
            self.rows, self.view_calls[None], counts.compulsory[None], fused[None], self.link])
        self._groups = groups
        # the whole model's table: each group's figures x its layers in the matrix itself
        self._scaled = self._all.copy()
        if self.whole:
            self._scaled[:6 * groups] *= np.repeat(self.layers, 6)[:, None]
        self._rates: dict = {}  # price()'s cache of rates (group_rates)
        self._seconds: dict = {}  # seconds(f) by f's float64 bytes (price() is pure)

    def figures(self, f: np.ndarray) -> Figures:
        """The figures of a step with features f (steps.features), whole model or this
        table's share of it."""
        counts, layers, g = self.counts, self.layers, self._groups
        if self.whole:  # each group's figures x its layers (integers: rounded after scaling)
            every = np.rint(self._scaled @ f)
            fig = every[:6 * g].reshape(g, 6)
            rows, (view_calls, compulsory, fused_io, to_device, to_host) = \
                every[6 * g:7 * g], every[7 * g:].tolist()
            calls = fig[:, 0]
            if self.varlen:  # a layer's attention pieces one varlen kernel: one call a layer
                calls = np.where(self.attention, np.minimum(calls, layers), calls)
            if self.any_per_expert:
                k = counts.args.num_activated_experts
                rows[self.per_expert] = max(1.0, round(f[1] * k / max(f[EXPERTS], 1.0)))
            return Figures(self.kind, self.dtype, self.weight, self.dense, calls, fig[:, 1],
                           fig[:, 2], fig[:, 3], fig[:, 4], rows, self.collective,
                           fig[:, 5] * self.linked if self.any_linked else self._no_link,
                           compulsory, fused_io, 1, view_calls, self.program_dtype, to_device,
                           to_host)
        every = np.rint(self._all @ f)
        fig = every[:6 * g].reshape(g, 6)  # of one layer
        rows, (view_calls, compulsory, fused_io, to_device, to_host) = \
            every[6 * g:7 * g], every[7 * g:].tolist()
        calls, nbytes, streamed = fig[:, 0], fig[:, 3], fig[:, 4]
        if self.varlen:  # compiled, CUDA graphs: a layer's attention pieces one varlen kernel
            calls = np.where(self.attention, np.minimum(calls, 1.0), calls)
        if not self.whole:  # a device's share of the step's distinct bytes (module doc)
            rest = compulsory - float((streamed * counts.layers)[self.extern].sum())
            fused = ~self.extern & (nbytes > 0)
            by = fused if fused.any() else nbytes > 0
            whole = float((nbytes * counts.layers)[by].sum())
            share = float((nbytes * layers)[by].sum()) / whole if whole else 1.0
            compulsory = float((streamed * layers)[self.extern].sum()) + rest * share
            fused_io = max(0.0, (fused_io or rest) * share)
        if self.per_expert.any():  # each touched expert's own kernel: its share of the rows
            k = counts.args.num_activated_experts
            rows[self.per_expert] = max(1.0, round(f[1] * k / max(f[EXPERTS], 1.0)))
        return Figures(
            self.kind, self.dtype, self.weight, self.dense, calls * layers,
            fig[:, 1] * layers, fig[:, 2] * layers, nbytes * layers, streamed * layers, rows,
            self.collective,
            fig[:, 5] * layers * self.linked if self.any_linked else self._no_link,
            compulsory, fused_io, 1, view_calls, self.program_dtype, to_device, to_host)

    def seconds(self, f: np.ndarray) -> float:
        """Seconds of a step with features f: price() of its figures, once per distinct f (a
        run's steps repeat their features: ~25 calls a distinct one serving Llama-3.1-70B)."""
        key = np.asarray(f, dtype=np.float64).tobytes()
        seconds = self._seconds.get(key)
        if seconds is None:
            if len(self._seconds) >= SECONDS_CACHED:
                self._seconds.clear()
            seconds = self._seconds[key] = price(self.figures(f), self.spec, self.execution,
                                                 cache=self._rates, detail=False).latency_s
        return seconds

    def energy_j(self, f: np.ndarray, seconds: float) -> float:
        """Joules of that step: dynamic (compute, memory, host link) + static W x seconds."""
        return float(self.joules @ f) + self.static_w * seconds

    def price(self, pieces) -> float:
        return self.seconds(self.counts.features(pieces))

    def price_trace(self, trace: Trace) -> float:
        """A counted step trace priced as this table prices a step (engine_trace's records,
        price() of their figures): held equal to `price` of the same step in the tests."""
        return price(figures_of(engine_trace(trace, self.execution))[0], self.spec,
                     self.execution).latency_s


def engine_trace(trace: Trace, execution: str) -> Trace:
    """`trace` as an engine runs the step (the module doc): the records of one group and
    module (steps.group_key: the same op of every piece) one record; compiled and CUDA
    graphs, a layer's attention pieces one varlen kernel (one call)."""
    merged: dict = {}
    records = []
    for r in trace.records:
        if r.op.startswith("prim."):
            records.append(r)
            continue
        key = (group_key(r), r.module)
        if key in merged:
            merged[key].add(r)
        else:
            merged[key] = r.copy()
            records.append(merged[key])
    if execution in ("compiled", "cudagraphs"):
        for r in merged.values():
            if record_kind(r.op, r.args) == "attention":
                r.calls = 1
    return dataclasses.replace(trace, records=records)


def _link_and_energy(counts: StepCounts, pricer, repeats):
    """([shapes, 2] host-link bytes in and out, [shapes, 1] dynamic joules, whether every
    record has an energy figure) of the counted FIT steps."""
    shapes = len(counts.fit_traces)
    link, joules, has_energy = np.zeros((shapes, 2)), np.zeros((shapes, 1)), True
    for s, trace in enumerate(counts.fit_traces):
        live = [r for r in trace.records if r.bytes or r.flops or r.executed_flops]
        sub = Trace(records=live, compulsory_read=trace.compulsory_read,
                    compulsory_written=trace.compulsory_written)
        energy = pricer.record_energy_j(sub)
        if energy is None:
            has_energy = False
        else:
            joules[s, 0] += sum(e * repeats(r) for r, e in zip(live, energy))
        joules[s, 0] += pricer.host_link(sub)[1]
        if pricer.has_host_link:  # a placement's device: the replay charges the transfers
            link[s] = host_link_bytes(sub)
    return link, joules, has_energy


def _rows_and_view_calls(counts: StepCounts, matmul: np.ndarray, repeats):
    """([groups, features] each matmul group's rows M, fitted over the counted steps;
    [features] the calls of records that move and compute nothing: views, which an eager
    run still dispatches, each `repeats(record)` times: the whole model or a device's share;
    [groups] the groups whose calls in one step have different rows: a mixture of experts'
    quantized experts, one kernel per touched expert on its share of the rows (quant/experts.py),
    priced at T k / experts touched rows a call, T k rows over the step's experts feature)."""
    index = {k: g for g, k in enumerate(counts.keys)}
    shapes = len(counts.fit_traces)
    rows, idle = np.zeros((shapes, len(index))), np.zeros((shapes, 1))
    per_expert = np.zeros(len(index), dtype=bool)
    for s, trace in enumerate(counts.fit_traces):
        seen = set()
        for r in trace.records:
            if r.op.startswith("prim."):
                continue
            if not (r.bytes or r.flops or r.executed_flops):
                idle[s, 0] += r.calls * repeats(r)
                continue
            g = index[group_key(r)]
            if matmul[g]:
                m = matmul_rows(r.op, r.args)
                if g in seen and rows[s, g] != m:  # (a MoE's grouped GEMMs share their rows)
                    if not counts.experts:
                        raise StepModelError(f"{r.op} in {r.module}: several matmuls of one "
                                             "group in a step with different rows; a "
                                             "prediction needs each one's rows")
                    per_expert[g] = True
                seen.add(g)
                rows[s, g] = m
    xs = counts.xs
    if counts.experts:  # an expert's rows (T k over the experts hit) are no affine figure
        for g in np.flatnonzero(matmul & ~per_expert):
            try:
                fit(xs, rows[:, [g]], "matmul rows")
            except StepModelError:
                per_expert[g] = True
    rows[:, per_expert] = 0.0  # priced from the step's tokens and experts instead
    return fit(xs, rows, "matmul rows"), fit(xs, idle, "view calls")[0], per_expert


__all__ = ["StepTable", "engine_trace"]
