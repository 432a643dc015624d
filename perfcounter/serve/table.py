"""The step table: a step's figures by record group as affine functions of its features, priced
by pricing/price.py at every step (no pricing rule here).

`StepTable(counts, pricer)` holds, per record group of the counts (steps.py: one op of every
layer and piece), what pricing.figures.Figures needs: its kind, dtype, weight, mask and
collective (figures_of its counted sample) and its calls, FLOPs, bytes, weight and KV reads, a
collective's bytes (ROWS: counts.coef's columns read by name, group_rows; per layer, times the
layers the group repeats); a matmul's rows M and the calls of views (eager dispatches them)
fitted over the counted steps; the step's compulsory bytes and fused IO (counts.compulsory,
counts.fused) and the bytes of its host link (fitted here). `seconds(f)` builds the figures of
a step of features f, rounded to whole bytes, FLOPs and calls (the counted figures are
integers: at a counted step the table's figures are the counted ones) and returns
`price(figures, spec, execution).latency_s`.

What an engine runs, not a rule: compiled and CUDA graphs (VARLEN) launch a layer's attention
pieces as one varlen kernel (varlen_calls: a group's calls 1 a layer; engine_trace: a layer's
record one call), where our eager model calls SDPA once a piece.

A placement (placement.py) prices each device's share with a table of the records placed
there (`repeats`: how many layers of each group run on that device): its calls, work and
view calls are the device's; of the step's compulsory bytes it holds what its matmuls and
attention stream plus the rest shared by its fused records' bytes (all its bytes where
nothing is fused), as per_record.py shares a compiled phase; its fused kernels move the
step's fused IO shared the same way. With every record on one device it is the
single-device table.

Energy (joules) is the roofline's dynamic energy of the same bytes and FLOPs (energy.py, fitted
per step as the figures are, `dynamic_j`) with the device's static power over the step's
seconds, capped per step at its board's limit under the power model (pricing/power.py's
step_joules: the one rule; `static_w` is the W the device draws idle, as metrics.py charges it).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from perfcounter.generation.figures import Figures as RecordFigures
from perfcounter.pricing.achievable import program_dtype
from perfcounter.pricing.figures import Figures, figures_of, record_kind
from perfcounter.pricing.op_classes import matmul_rows
from perfcounter.pricing.power import power_of, step_joules
from perfcounter.pricing.price import price
from perfcounter.pricing.roofline import host_link_bytes
from perfcounter.serve.steps import EXPERTS, StepCounts, StepModelError, fit, group_key
from perfcounter.trace import ROLES, Trace

# counts.coef's columns by name: a record's figures as steps.py packs them (generation/figures.py's
# Figures.values(): calls, FLOPs, executed FLOPs, primitive counts by KINDS, bytes read and
# written by ROLES), read back from the column numbers themselves: a field added there moves them
_COLUMNS = RecordFigures.from_values(range(len(RecordFigures().values())))
_STREAMED = (_COLUMNS.read[ROLES.index("weight")], _COLUMNS.read[ROLES.index("kv_cache")])
# a group's rows in the table's matrix, named by the pricing Figures' fields they become
ROWS = ("calls", "flops", "executed_flops", "bytes", "streamed", "link_bytes")
_CALLS, _FLOPS, _EXECUTED = ROWS.index("calls"), ROWS.index("flops"), ROWS.index("executed_flops")
_BYTES, _STREAMED_ROW, _LINK = ROWS.index("bytes"), ROWS.index("streamed"), ROWS.index("link_bytes")
_N = len(ROWS)
VARLEN = ("compiled", "cudagraphs")  # regimes whose engine runs a layer's attention as one kernel
SECONDS_CACHED = 1 << 16  # distinct steps a table keeps priced (then it starts over)


def group_rows(coef: np.ndarray) -> np.ndarray:
    """[groups, ROWS, features] from counts.coef [groups, a record's figures, features]: its
    calls, FLOPs and executed FLOPs, bytes read and written, weight and KV-cache reads (what a
    compiled step's matmuls and attention stream) and bytes written (a collective's message)."""
    def total(columns):
        return coef[:, list(columns)].sum(axis=1)
    rows = {"calls": coef[:, _COLUMNS.calls], "flops": coef[:, _COLUMNS.flops],
            "executed_flops": coef[:, _COLUMNS.executed_flops],
            "bytes": total(_COLUMNS.read + _COLUMNS.written), "streamed": total(_STREAMED),
            "link_bytes": total(_COLUMNS.written)}
    return np.stack([rows[name] for name in ROWS], axis=1)


def varlen_calls(calls: np.ndarray, attention: np.ndarray, layers) -> np.ndarray:
    """calls as a VARLEN engine launches them: each attention group's pieces one kernel a
    layer (at most `layers` calls: a group's layers, or 1 for one layer's figures)."""
    return np.where(attention, np.minimum(calls, layers), calls)


class StepTable:
    """A step's seconds and joules from the counts' figures (module doc)."""

    def __init__(self, counts: StepCounts, pricer, repeats=None):
        """pricer: its spec, execution (pricing.price.REGIMES), label, and record_energy_j /
        host_link (the roofline's energy and link: RooflinePricer); the spec's power model
        (pricing/power.py) prices a step's joules.
        repeats(record): how many times a record of a one-layer trace stands in what this
        table prices (default counts.repeats: the whole model; a placement: a device's share)."""
        self.counts, self.pricer = counts, pricer
        self.spec, self.execution = pricer.spec, pricer.execution
        self.label = pricer.label
        self.power = power_of(self.spec)
        self.static_w = self.power.static_w
        self.whole = repeats is None
        repeats = counts.repeats if repeats is None else repeats
        self.layers = counts.layers if self.whole else \
            np.array([repeats(counts.sample[k]) for k in counts.keys], dtype=float)
        samples = [counts.sample[k] for k in counts.keys]
        # each group's kind, dtype, weight, mask and collective: its sample's, as figures_of
        # gives a record's (no metadata record is a group: a group moves or computes)
        sampled, records = figures_of(Trace(records=samples))
        assert len(records) == len(samples), "a metadata record (prim.*) as a step group"
        self.kind, self.dtype, self.weight = sampled.kind, sampled.dtype, sampled.weight
        self.dense, self.collective = sampled.dense, sampled.collective
        self.linked = np.array([c is not None for c in self.collective])
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
        self.varlen = self.execution in VARLEN and bool(self.attention.any())
        xs = counts.xs
        link, energy, self.has_energy = _link_and_energy(counts, pricer, repeats)
        self.link = fit(xs, link, "host-link bytes")  # [2, features]
        self.joules = fit(xs, energy, "joules")[0]  # [features]
        # every figure of a step in one matrix [rows, features], one product a step: each of
        # ROWS for every group (group_rows: per layer), then each group's rows M, the view
        # calls, the compulsory bytes, the fused IO and the host link's bytes in and out
        groups = len(samples)
        fused = counts.fused if counts.fused is not None else np.zeros(len(counts.compulsory))
        self._all = np.concatenate([
            group_rows(counts.coef).transpose(1, 0, 2).reshape(_N * groups, -1),
            self.rows, self.view_calls[None], counts.compulsory[None], fused[None], self.link])
        self._groups = groups
        # the whole model's table: each group's figures x its layers in the matrix itself
        self._scaled = self._all.copy()
        if self.whole:
            self._scaled[:_N * groups] *= np.tile(self.layers, _N)[:, None]
        self._rates: dict = {}  # price()'s cache of rates (group_rates)
        self._seconds: dict = {}  # seconds(f) by f's float64 bytes (price() is pure)

    def figures(self, f: np.ndarray) -> Figures:
        """The figures of a step with features f (steps.features), whole model or this
        table's share of it."""
        counts, layers, g = self.counts, self.layers, self._groups
        # the whole model: each group's figures x its layers (integers: rounded after scaling)
        every = np.rint((self._scaled if self.whole else self._all) @ f)
        fig = every[:_N * g].reshape(_N, g)  # [ROWS, groups]
        rows, (view_calls, compulsory, fused_io, to_device, to_host) = \
            every[_N * g:(_N + 1) * g], every[(_N + 1) * g:].tolist()
        calls, flops, executed = fig[_CALLS], fig[_FLOPS], fig[_EXECUTED]
        nbytes, streamed, link = fig[_BYTES], fig[_STREAMED_ROW], fig[_LINK]
        if self.whole:
            if self.varlen:
                calls = varlen_calls(calls, self.attention, layers)
        else:  # of one layer: a device's share of the step's distinct bytes (module doc)
            if self.varlen:
                calls = varlen_calls(calls, self.attention, 1.0)
            rest = compulsory - float((streamed * counts.layers)[self.extern].sum())
            fused = ~self.extern & (nbytes > 0)
            by = fused if fused.any() else nbytes > 0
            whole = float((nbytes * counts.layers)[by].sum())
            share = float((nbytes * layers)[by].sum()) / whole if whole else 1.0
            compulsory = float((streamed * layers)[self.extern].sum()) + rest * share
            fused_io = max(0.0, (fused_io or rest) * share)
            calls, flops, executed = calls * layers, flops * layers, executed * layers
            nbytes, streamed, link = nbytes * layers, streamed * layers, link * layers
        if self.any_per_expert:  # each touched expert's own kernel: its share of the rows
            k = counts.args.num_activated_experts
            rows[self.per_expert] = max(1.0, round(f[1] * k / max(f[EXPERTS], 1.0)))
        fig = Figures(
            kind=self.kind, dtype=self.dtype, weight=self.weight, dense=self.dense, calls=calls,
            flops=flops, executed_flops=executed, bytes=nbytes, streamed=streamed, rows=rows,
            collective=self.collective,
            link_bytes=link * self.linked if self.any_linked else self._no_link,
            compulsory_bytes=compulsory, fused_bytes=fused_io, view_calls=view_calls)
        # NB: 15 keywords at most (steps: its default, 1): CPython 3.11 passes a call's 16th
        # keyword on through a dict, 2 us more a step (a tenth of a bound step's seconds())
        fig.program_dtype, fig.to_device_bytes, fig.to_host_bytes = \
            self.program_dtype, to_device, to_host
        return fig

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

    def dynamic_j(self, f: np.ndarray) -> float:
        """Dynamic joules of a step with features f (compute, memory, host link)."""
        return float(self.joules @ f)

    def energy_j(self, f: np.ndarray, seconds: float, extra_j: float = 0.0) -> float:
        """Joules of that step over `seconds`: dynamic (+ `extra_j`, work beside the table's:
        the sampler's kernels) + static W x seconds, capped at the board's limit x seconds
        under the power model (power.step_joules)."""
        return step_joules(float(self.joules @ f) + extra_j, seconds, self.power)

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
    if execution in VARLEN:  # one kernel a layer (varlen_calls): a record is one layer's
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
