"""A step's seconds as perfcounter predicts them in an execution regime (pricing/predict.py).

`PredictionPricer(spec, execution)` names the device and the regime ("eager", "compiled",
"cudagraphs") a step table (table.py) prices its steps in: every step is
`pricing.price.price(figures, spec, execution)` of that step's figures, the rule predict()
applies to a counted trace; no rule of its own. Its energy and host link are the roofline's
(the same bytes and FLOPs cross the same link: RooflinePricer).

What an engine runs, beside the rule: its compiled step without a graph is one program
compiled for any batch and token count (achievable.dynamic_program: that program's launch
and entry), and compiled and CUDA graphs launch a layer's attention pieces as one varlen
kernel (table.engine_trace; our eager model calls SDPA once a piece: at a batch of 73 decodes
a kernel a piece would add 2 x 73 x 32 kernels to a Llama-3-8B step, 12.6 ms at 2.7 us).
tests/test_serve_predicted.py holds a table's step equal to predict() of the counted step
as the engine runs it (engine_trace), in every regime.
"""
from __future__ import annotations

from perfcounter.pricing.achievable import dynamic_program
from perfcounter.pricing.regimes import check_regime
from perfcounter.pricing.predict import predict
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.steps import StepCounts
from perfcounter.serve.table import StepTable, engine_trace
from perfcounter.trace import Trace


class PredictionPricer:
    """Steps as perfcounter's prediction in `execution` prices them (module doc)."""

    has_host_link = True

    def __init__(self, spec, execution: str = "eager"):
        self.execution = check_regime(execution, bound=False)
        # an engine's compiled step without a graph runs one program compiled for any batch
        # and token count: the dynamic program's launch and entry (achievable.dynamic_program)
        self.spec = dynamic_program(spec) if execution == "compiled" else spec
        self.bound = RooflinePricer(spec)
        self.key, self.static_w = self.bound.key, self.bound.static_w
        self.label = f"predicted, {execution}"

    def record_energy_j(self, trace: Trace) -> list[float] | None:
        return self.bound.record_energy_j(trace)

    def host_link(self, trace: Trace) -> tuple[float, float]:
        return self.bound.host_link(trace)

    def step_seconds(self, trace: Trace) -> float:
        """A counted step's predicted seconds as an engine runs it: predict() of
        engine_trace(trace)."""
        return predict(engine_trace(trace, self.execution), self.spec, self.execution).latency_s

    def make_table(self, counts: StepCounts) -> StepTable:
        return StepTable(counts, self)


PredictedTable = StepTable  # a prediction's table is the step table


def varlen_attention(trace: Trace) -> Trace:
    """`trace` as a compiled engine runs it (table.engine_trace): a layer's attention pieces
    one varlen kernel."""
    return engine_trace(trace, "compiled")


__all__ = ["PredictedTable", "PredictionPricer", "varlen_attention"]
