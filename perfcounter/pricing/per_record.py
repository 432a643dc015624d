"""Each op record's share of a phase's prediction, for views that split a phase by record:
a simulation placing modules on several devices, plots by module kind.

predict.py prices a phase as a whole in its execution regime. Eager, every record is priced
alone (op_predictions) and the shares are those figures. Compiled and CUDA graphs, the
matmul and attention kernels ("extern") keep their own figures, and the fused kernels
between them (one fused group per phase, its fused IO) are shared out among the
records they absorbed by those records' bytes (by their calls when none moves a byte);
CUDA graphs' launch, one per step, is shared among all records by their work. The shares
add up to the phase's prediction less its host-link transfers (predict adds those apart),
to the rounding of a float sum.
"""
from __future__ import annotations

from typing import NamedTuple

from perfcounter.pricing.achievable import compiled_step_s, overhead
from perfcounter.pricing.predict import EXTERN, op_class, op_predictions, predict


class RecordTime(NamedTuple):
    """A record's predicted seconds: the fixed costs it pays, and its kernels' work."""

    overhead_s: float
    work_s: float

    @property
    def latency_s(self) -> float:
        return self.overhead_s + self.work_s


def per_step_overhead_s(trace, spec, execution: str) -> float:
    """The launches a phase pays once per step, not per kernel: CUDA graphs' graph launch;
    compiled, the program's entry (the spec's compiled_step) and the fused kernel each step
    starts with (when anything is fused), at the share of the host's launches the phase shows
    (Prediction.host_shown: below 1 where a GPU's kernels hide them); eager none. A placement
    pays them on every device it uses (each device launches its own)."""
    steps = max(trace.steps, 1)
    if execution == "cudagraphs":
        return steps * overhead(spec, "cudagraphs")
    if execution != "compiled":
        return 0.0
    fused = any(r.bytes and op_class(r.op, r.args) not in EXTERN
                and not r.op.startswith("prim.") for r in trace.records)
    once = (overhead(spec, "compiled") if fused else 0.0) \
        + compiled_step_s(spec)
    return steps * once * (predict(trace, spec, execution).host_shown if once else 1.0)


def record_predictions(trace, spec, execution: str = "eager", *,
                       per_step: bool = True) -> list[RecordTime]:
    """One RecordTime per trace.records entry (metadata ops, prim.*: zero), summing to
    predict(trace, spec, execution).latency_s - host_link_s (see the module doc);
    per_step=False leaves out per_step_overhead_s (a placement charges it per device)."""
    ops = {id(p.record): p for p in op_predictions(trace, spec, execution)}
    zero = RecordTime(0.0, 0.0)
    if execution == "eager":
        return [zero if (p := ops.get(id(r))) is None else RecordTime(p.overhead_s, p.work_s)
                for r in trace.records]
    whole = predict(trace, spec, execution)
    extern = {k: p for k, p in ops.items() if p.op_class in EXTERN}
    fused = {k: p for k, p in ops.items() if p.op_class not in EXTERN and p.record.bytes}
    # what the fused group costs: the phase's figures less the extern kernels' (their launches
    # at the share of the host's time the phase shows: compiled on a GPU, module doc of predict)
    shown = whole.host_shown
    fused_overhead = whole.overhead_s - sum(p.overhead_s * shown for p in extern.values())
    fused_work = whole.work_s - sum(p.work_s for p in extern.values())
    launch = whole.by_class.get("graph launch", 0.0)  # cudagraphs: in fused_overhead
    if not per_step:  # the launches a step pays once, charged by the caller
        fused_overhead -= per_step_overhead_s(trace, spec, execution)
        launch = 0.0
    weight = {k: p.record.bytes for k, p in fused.items()}
    if fused and not sum(weight.values()):
        weight = {k: p.record.calls for k, p in fused.items()}
    total = sum(weight.values()) or 1
    out = []
    for r in trace.records:
        k = id(r)
        if k in extern:
            out.append(RecordTime(extern[k].overhead_s * shown, extern[k].work_s))
        elif k in fused:
            share = weight[k] / total
            out.append(RecordTime((fused_overhead - launch) * share, fused_work * share))
        else:
            out.append(zero)
    if launch and out:  # one graph per step, shared by every kernel's work
        work = sum(t.work_s for t in out)
        out = [RecordTime(t.overhead_s + (launch * t.work_s / work if work else
                                          launch / len(out)), t.work_s) for t in out]
    return out
