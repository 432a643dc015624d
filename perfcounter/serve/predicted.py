"""A step's seconds as perfcounter predicts them in an execution regime (pricing/predict.py).

`PredictionPricer(spec, execution)` sits on pricing.py's seam beside the roofline bound:
`record_costs(trace)` gives each record (fixed, compute, memory) as `op_predictions` prices
it (fixed: its calls x the regime's overhead per call, plus a float GEMV's weight rows x the
time per row, plus on a GPU its kernels' fixed device time); its energy and host link are
the roofline's (the same bytes and FLOPs cross the same link). A step of the scheduler costs
what `predict(step_trace, spec, execution).latency_s` says:

- eager: every op call (views included) pays the eager overhead, every group
  max(compute, memory) (+ GEMV rows); on an asynchronous device (a GPU) the host's
  dispatch shows only where it exceeds the kernels' work: max(Σ overhead, Σ work).
- compiled: matmuls and attention (predict.EXTERN) one kernel each, priced as above with
  the compiled overhead; the rest fused: the step's fused IO (trace.py: what crosses a
  fused kernel's boundary) at the elementwise rate, its FLOPs at predict.vector_flops, one
  compiled kernel launch per extern kernel and one more, and the compiled program's entry
  (compiled_step); on an asynchronous device the launches show only where they exceed the
  kernels' work, as eager's dispatch.
- cudagraphs: as compiled, no launch per kernel, one graph launch per step.

The step table of a prediction (`PredictedTable`) cannot be affine in the step's features
as the roofline's is: a matmul of up to SKINNY_ROWS rows is a GEMV with its own rates, a few
rows are charged a row block, a calibrated spec's rates follow the rows and the working set,
and eager dispatch hides behind the kernels. So it keeps the counts' affine figures per
record group (steps.py) and prices them at every step: one record per group and layer,
its rows (M) fitted from the counted steps, the step's compulsory bytes and fused IO from
the counts' fit. Rates are looked up once per (rows of each matmul, cold) and cached, unless the spec has
measured curves (rates by working set: looked up at every step, slower). What differs from
predicting the counted step's trace: a group is priced as one record (in an engine the
pieces' attention is one varlen kernel), where predict prices each piece's attention
alone; with curves, at the group's bytes per call. Compiled and CUDA graphs, the regimes an
engine serves in, also launch that attention as one kernel a layer, which pays one fixed
device time (achievable.kernel_s) and is followed by one fused kernel, where our model's
eager program calls SDPA once a piece (eager keeps a kernel a call: at a batch of 73 decodes
a kernel a piece would add 2 x 73 x 32 kernels to a Llama-3-8B step, 12.6 ms at 2.7 us).
tests/test_serve_predicted.py holds the table to predict() on counted steps within 1 %
(their attention pieces merged into one call where the table merges them).

A placement (placement.py) prices each device's share with a PredictedTable of the records
placed there (`repeats`: how many layers of each record group run on that device): its
calls, work and view calls are the device's; of the step's compulsory bytes it holds what
its matmuls and attention stream plus the rest shared by its fused records' bytes (all its
bytes where nothing is fused), as per_record.py shares a compiled phase. That decides its
cold or warm rates; its fused kernels move the step's fused IO shared the same way; compiled, it pays its extern kernels and one fused kernel more, CUDA graphs one
graph launch a step. With every record on one device it is the single-device table.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from perfcounter.pricing.achievable import (check_execution, compiled_step_s,
                                            dynamic_program, gemv_row_s, kernel_s, overhead,
                                            program_dtype, rate, rows_flops)
from perfcounter.pricing.predict import (ASYNCHRONOUS, EXTERN, ROW_BLOCK, SKINNY_ROWS,
                                         gemv_weight, has_explicit_mask, matmul_rows, op_class,
                                         op_predictions, predict, vector_flops)
from perfcounter.pricing.roofline import is_integer_dtype
from perfcounter.serve.pricing import PricedTable, RooflinePricer
from perfcounter.serve.steps import EXPERTS, StepCounts, StepModelError, fit, group_key
from perfcounter.trace import ROLES, Trace

_CALLS, _FLOPS, _EXECUTED, _BYTES = 0, 1, 2, 10  # figure columns (steps._figures)
_STREAMED = (_BYTES + ROLES.index("weight"), _BYTES + ROLES.index("kv_cache"))


class PredictionPricer:
    """Each record as perfcounter's prediction in `execution` prices it (module doc)."""

    def __init__(self, spec, execution: str = "eager"):
        self.execution = check_execution(execution)
        # an engine's compiled step without a graph runs one program compiled for any batch
        # and token count: the dynamic program's launch and entry (achievable.dynamic_program)
        self.spec = dynamic_program(spec) if execution == "compiled" else spec
        self.bound = RooflinePricer(spec)
        self.key, self.static_w = self.bound.key, self.bound.static_w
        self.label = f"predicted, {execution}"

    def record_costs(self, trace: Trace) -> list[tuple[float, float, float]]:
        """(overhead + a GEMV's weight rows + its kernels' fixed time, compute, memory) per
        record, as op_predictions
        prices each alone; metadata (prim.*) records cost nothing. NB: compiled and
        cudagraphs fuse the records other than matmuls and attention: those are (0, 0, 0)
        here, their fused group and launches a step's figure (step_seconds)."""
        preds = iter(op_predictions(trace, self.spec, self.execution))
        out = []
        for r in trace.records:
            p = None if r.op.startswith("prim.") else next(preds)
            if p is None or (self.execution != "eager" and p.op_class not in EXTERN):
                out.append((0.0, 0.0, 0.0))
            else:
                out.append((p.overhead_s + p.rows_s + p.fixed_s, p.compute_s, p.memory_s))
        return out

    def record_energy_j(self, trace: Trace) -> list[float] | None:
        return self.bound.record_energy_j(trace)

    def host_link(self, trace: Trace) -> tuple[float, float]:
        return self.bound.host_link(trace)

    def step_seconds(self, trace: Trace) -> float:
        """A counted step's predicted seconds: predict(trace, spec, execution).latency_s;
        compiled and CUDA graphs, of the step as an engine runs it (varlen_attention)."""
        if self.execution != "eager":
            trace = varlen_attention(trace)
        return predict(trace, self.spec, self.execution).latency_s

    def make_table(self, counts: StepCounts) -> "PredictedTable":
        return PredictedTable(counts, self)


class PredictedTable:
    """A step's predicted seconds and joules from the counts' figures (module doc); the
    roofline bound of the same counts is `bound` (its joules and host link are used)."""

    def __init__(self, counts: StepCounts, pricer: PredictionPricer, repeats=None):
        """repeats(record): as PricedTable's (default: the whole model; a placement: one
        device's share, the module doc)."""
        self.counts, self.pricer = counts, pricer
        self.label, self.static_w = pricer.label, pricer.static_w
        self.bound = PricedTable(counts, pricer.bound, repeats=repeats)
        self.layers = counts.layers if repeats is None else \
            np.array([repeats(counts.sample[k]) for k in counts.keys], dtype=float)
        self.has_energy = self.bound.has_energy
        spec, self.execution = pricer.spec, pricer.execution
        self.samples = [counts.sample[k] for k in counts.keys]
        self.dtype = program_dtype(self.samples)  # the host's cost per call is its dtype's
        self.classes = [op_class(s.op, s.args) for s in self.samples]
        self.matmul = np.array([c in ("gemv", "gemm") for c in self.classes])
        self.extern = np.array([c in EXTERN for c in self.classes])
        self.attention = np.array([c == "attention" for c in self.classes])
        self.dense = np.array([c == "attention" and has_explicit_mask(s.args)
                               for c, s in zip(self.classes, self.samples)])
        self.weights = [gemv_weight(s) if m else None for s, m in zip(self.samples, self.matmul)]
        self.rows, self.idle_calls, self.per_expert = _rows_and_idle_calls(
            counts, self.matmul, repeats or counts.repeats)
        self.by_curves = bool(spec.op_curves)  # rates by working set: no cache of rates
        self.asynchronous = spec.device_type in ASYNCHRONOUS
        self._rates: dict = {}

    # -- rates of one group, as op_predictions takes them for one record --------------------
    def _group_rates(self, g: int, rows: int, cold: bool, working_set: float):
        """(seconds per FLOP, seconds per byte, weight-row and fixed kernel seconds per call)
        of group g."""
        spec, s, cls = self.pricer.spec, self.samples[g], self.classes[g]
        rate_cls, row_s, scale = cls, 0.0, 1.0
        if self.matmul[g]:
            cls = "gemv" if rows <= SKINNY_ROWS else "gemm"
            weight_cls, weight_rows = self.weights[g]
            if weight_cls == "gemv" and not is_integer_dtype(s.dtype):
                row_s = weight_rows * gemv_row_s(spec, s.dtype, rows)
            rate_cls = weight_cls if cls == "gemv" else cls
        rt = rate(spec, rate_cls, s.dtype, working_set)
        achieved = rt.flops_per_s
        if self.matmul[g] and rows > 1:
            by_rows = None if is_integer_dtype(s.dtype) else rows_flops(spec, s.dtype, rows)
            if by_rows is not None:
                achieved = by_rows
            elif cls == "gemv" and rows < ROW_BLOCK:
                scale = ROW_BLOCK / rows
        bandwidth = rt.cold_bytes_per_s if cold else rt.warm_bytes_per_s
        return scale / achieved, 1.0 / bandwidth, row_s + kernel_s(spec, rt.basis)

    def _rates_at(self, rows: np.ndarray, cold: bool, per_call: np.ndarray) -> np.ndarray:
        """[3, groups]: seconds per FLOP, per byte, weight-row and fixed kernel seconds per
        call."""
        key = (tuple(rows[self.matmul].tolist()), cold)
        out = None if self.by_curves else self._rates.get(key)
        if out is None:
            out = np.array([self._group_rates(g, int(rows[g]), cold, float(per_call[g]))
                            for g in range(len(self.samples))]).T
            if not self.by_curves:
                self._rates[key] = out
        return out

    def _fused_rate(self, dtype: str, cold: bool, working_set: float) -> tuple:
        """(FLOP/s, bytes/s, fixed seconds a kernel) of the fused kernels."""
        key = ("fused", dtype, cold)
        out = None if self.by_curves else self._rates.get(key)
        if out is None:
            rt = rate(self.pricer.spec, "elementwise", dtype, working_set)
            out = (vector_flops(self.pricer.spec, rt),
                   rt.cold_bytes_per_s if cold else rt.warm_bytes_per_s,
                   kernel_s(self.pricer.spec, rt.basis))
            if not self.by_curves:
                self._rates[key] = out
        return out

    # -- a step -------------------------------------------------------------------------------
    def seconds(self, f: np.ndarray) -> float:
        """Predicted seconds of a step with features f (steps.features)."""
        spec, layers, ext = self.pricer.spec, self.layers, self.extern
        fig = self.counts.coef @ f  # [groups, figures] of one layer
        calls, nbytes = fig[:, _CALLS], fig[:, _BYTES:].sum(axis=1)
        flops = np.where(self.dense, fig[:, _FLOPS], fig[:, _EXECUTED])
        streamed_by = fig[:, _STREAMED].sum(axis=1)  # weight and KV reads a layer
        fused = ~ext & (nbytes > 0)
        rest = float(self.counts.compulsory @ f) \
            - float((streamed_by * self.counts.layers)[ext].sum())
        fused_io = self.counts.fused
        fused_io = rest if fused_io is None or not fused_io.any() else float(fused_io @ f)
        by = fused if fused.any() else nbytes > 0  # no fused record: shared by all bytes
        whole = float((nbytes * self.counts.layers)[by].sum())
        share = float((nbytes * layers)[by].sum()) / whole if whole else 1.0
        streamed = float((streamed_by * layers)[ext].sum())
        compulsory = streamed + rest * share  # this table's records' distinct bytes
        fused &= layers > 0
        cold = not spec.cache_bytes or compulsory > spec.cache_bytes
        rows = np.rint(self.rows @ f)
        if self.per_expert.any():  # each touched expert's own kernel: its share of the rows
            k = self.counts.args.num_activated_experts
            rows[self.per_expert] = max(1.0, round(f[1] * k / max(f[EXPERTS], 1.0)))
        per_call = nbytes / np.maximum(calls, 1.0)
        per_flop, per_byte, row_s = self._rates_at(rows, cold, per_call)
        # the kernels a layer runs: compiled and CUDA graphs, an engine's: the pieces' attention
        # one varlen kernel (module doc); eager, PyTorch's: one a call
        kernels = calls if self.execution == "eager" else \
            np.where(self.attention, np.minimum(calls, 1.0), calls)
        work = (np.maximum(flops * per_flop, nbytes * per_byte) + kernels * row_s) * layers
        calls, kernels = calls * layers, kernels * layers
        host = float(self.bound.base @ f)  # the roofline's fixed part is its host link
        if self.execution == "eager":
            per_call = overhead(spec, "eager", cold, self.dtype)
            dispatch = (calls.sum() + float(self.idle_calls @ f)) * per_call
            total = float(work.sum())
            if self.asynchronous:  # the host dispatches ahead of the kernels
                dispatch = max(dispatch - total, 0.0)
            return dispatch + total + host
        ext_calls = float(kernels[ext].sum())
        work_s = float(work[ext].sum())
        compiled = self.execution == "compiled"
        launches = ext_calls * overhead(spec, "compiled", cold) if compiled else 0.0
        if fused.any():
            fused_bytes = max(0.0, fused_io * share)
            fused_flops = float((fig[:, _EXECUTED] * layers)[fused].sum())
            dtype = self.samples[int(np.flatnonzero(fused)[np.argmax(nbytes[fused])])].dtype
            flops_per_s, bandwidth, fixed = self._fused_rate(dtype, cold,
                                                             fused_bytes / (ext_calls + 1))
            work_s += max(fused_flops / flops_per_s, fused_bytes / bandwidth) \
                + (ext_calls + 1) * fixed
            launches += (ext_calls + 1) * overhead(spec, "compiled") if compiled else 0.0
        if not compiled:  # CUDA graphs: one launch of the step's graph
            return work_s + overhead(spec, "cudagraphs") + host
        launches += compiled_step_s(spec)  # the program's entry
        if self.asynchronous:  # the host launches ahead of the kernels
            launches = max(launches - work_s, 0.0)
        return work_s + launches + host

    def energy_j(self, f: np.ndarray, seconds: float) -> float:
        """Joules of a step: the bound's dynamic joules (the same bytes and FLOPs) + static W
        x its predicted seconds."""
        return float(self.bound.joules @ f) + self.static_w * seconds

    def price(self, pieces) -> float:
        return self.seconds(self.counts.features(pieces))

    def price_trace(self, trace: Trace) -> float:
        """A counted step trace as perfcounter predicts it (predict.predict)."""
        return self.pricer.step_seconds(trace)


def varlen_attention(trace: Trace) -> Trace:
    """`trace` with each module's attention pieces (one SDPA call a piece in our model) as one
    call: the varlen kernel an engine launches once a layer (module doc)."""
    merged: dict = {}
    records = []
    for r in trace.records:
        if r.op.startswith("prim.") or op_class(r.op, r.args) != "attention":
            records.append(r)
            continue
        key = (group_key(r), r.module)
        if key in merged:
            merged[key].add(r)
        else:
            merged[key] = r.copy()
            records.append(merged[key])
    for r in merged.values():
        r.calls = 1
    return dataclasses.replace(trace, records=records)


def _rows_and_idle_calls(counts: StepCounts, matmul: np.ndarray, repeats):
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

__all__ = ["PredictedTable", "PredictionPricer"]
