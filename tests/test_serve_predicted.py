"""serve's steps priced in the execution regimes: the table against predict() on counted steps,
per-regime fixed costs derived by hand, the vanishing-rate TTFT, the cache per regime."""
import dataclasses

import numpy as np
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.achievable import compiled_step_s, dynamic_program, overhead, rate
from perfcounter.pricing.predict import EXTERN, op_predictions, predict
from perfcounter.pricing.roofline import roofline
from perfcounter.serve import cache_info, deployment, serve, step_table
from perfcounter.pricing.figures import figures_of
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.table import engine_trace
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import features
from perfcounter.serve.workload import Workload
from perfcounter.trace import Trace

# head_dim 32 / 4 = 8; q 32, k and v 2 x 8 = 16 each
TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
REGIMES = ("eager", "compiled", "cudagraphs")
ALL = ("bound", *REGIMES)  # pricing.price.REGIMES
STEPS = ([(100, 0)], [(1, 5)], [(64, 64)], [(1, 300), (1, 17), (48, 0), (12, 100)], [(1, 1000)],
         [(200, 37), (1, 3)])


def toy(base: str, **overhead_s):
    """A registry spec with stated fixed costs (its own name: the cache keys on it)."""
    spec = get_device_spec(base, dtype=torch.bfloat16)
    return dataclasses.replace(spec, name=f"{base}-toy-{len(overhead_s)}",
                               op_overhead_s={**spec.op_overhead_s, **overhead_s})


def counted(shape) -> Trace:
    return count_step(TINY, [Piece(*p) for p in shape])


def engine_program(spec, execution: str):
    """The spec an engine's step is priced on: compiled without a graph, one program compiled
    for any batch and token count (achievable.dynamic_program); else the spec."""
    return dynamic_program(spec) if execution == "compiled" else spec


def test_an_engines_compiled_step_pays_the_dynamic_programs_launches():
    # h100-sxm states no compiled figure: 15 + 1.8 = 16.8 us a launch, 69 + 34 = 103 us a
    # step for the engine's compiled program; CUDA graphs and eager keep the spec's
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    compiled = PredictionPricer(spec, "compiled").spec
    assert overhead(compiled, "compiled") == pytest.approx(16.8e-6)
    assert compiled_step_s(compiled) == pytest.approx(103e-6)
    assert PredictionPricer(spec, "cudagraphs").spec is spec
    assert PredictionPricer(spec, "eager").spec is spec


# measured curves (rates by working set, log-log between points: [bytes, warm B/s, cold B/s,
# FLOP/s]), which a varlen attention kernel reads at its bytes a call, and a cache that a
# step's distinct bytes may fit
CURVES = {c: {"bfloat16": [[1e4, 8e11, 3e11, 1e12], [1e8, 6e11, 2e11, 4e12]]}
          for c in ("gemv", "gemm", "attention", "elementwise")}


def device(name: str):
    if name == "curved-cpu":
        return dataclasses.replace(get_device_spec("xeon-8480", dtype=torch.bfloat16),
                                   name=name, op_curves=CURVES, cache_bytes=1e6)
    return get_device_spec(name, dtype=torch.bfloat16)


@pytest.mark.parametrize("device_name", ["h100-sxm", "generic-cpu", "curved-cpu"])
@pytest.mark.parametrize("execution", ALL)
def test_table_equals_predict_on_counted_steps(execution, device_name):
    # one rule (pricing.price.price): a table's step and predict() of the counted step as the
    # engine runs it (engine_trace: a group's pieces one record; compiled and CUDA graphs, a
    # layer's attention pieces one varlen kernel) are equal; rel=1e-12 allows only the order of
    # a float sum (the table sums a group x its layers, predict each layer's record)
    spec = device(device_name)
    pricer = RooflinePricer(spec) if execution == "bound" else PredictionPricer(spec, execution)
    table = step_table(TINY, torch.bfloat16, pricer)
    assert table.label == ("roofline bound" if execution == "bound"
                           else f"predicted, {execution}")
    program = engine_program(spec, execution)
    for shape in STEPS:
        trace = engine_trace(counted(shape), execution)
        want = predict(trace, program, execution).latency_s
        assert table.price(shape) == pytest.approx(want, rel=1e-12), shape
        assert table.price_trace(counted(shape)) == pytest.approx(want, rel=1e-12), shape
        # and the figures themselves: the counted ones, group for group; the step's
        # compulsory bytes, fitted as a whole (steps.py: a few activation bytes of a step are
        # not affine), within the fit's 1 %
        fig, _ = figures_of(trace)
        mine = table.figures(table.counts.features(shape))
        assert mine.compulsory_bytes == pytest.approx(fig.compulsory_bytes, rel=0.01)
        assert mine.fused_bytes == fig.fused_bytes
        live = (fig.bytes > 0) | (fig.executed_flops > 0)
        for name in ("calls", "flops", "executed_flops", "bytes", "streamed"):
            assert getattr(mine, name).sum() == getattr(fig, name)[live].sum(), name
        assert mine.view_calls == fig.calls[~live].sum()  # views: dispatched, nothing moved
        assert (mine.to_device_bytes, mine.to_host_bytes) == (fig.to_device_bytes,
                                                              fig.to_host_bytes)


@pytest.mark.parametrize("execution", REGIMES)
def test_one_piece_steps_equal_predict_of_the_step_as_counted(execution):
    # a step of one piece: nothing to merge but compiled's one varlen kernel a layer, which
    # one piece's attention already is; so eager, the counted trace itself
    spec = get_device_spec("generic-cpu", dtype=torch.bfloat16)
    table = step_table(TINY, torch.bfloat16, PredictionPricer(spec, execution))
    for shape in (s for s in STEPS if len(s) == 1):
        assert table.price(shape) == pytest.approx(
            predict(counted(shape), spec, execution).latency_s, rel=1e-12), shape


def test_eager_every_op_call_pays_its_dispatch():
    # a CPU runs its ops one after another: 1 s of dispatch per op call, views included.
    # A second decode adds per layer: K and V written (index_copy_ x 2), its attention, the
    # attention output's detach and transpose = 5 calls; x 2 layers = 10 s
    slow, free = toy("generic-cpu", eager=1.0), toy("generic-cpu", eager=0.0, eager_cold=0.0)
    one, two = [(1, 5)], [(1, 5), (1, 9)]
    dispatch = {}
    for shape in (one, two):
        dispatch[len(shape)] = (step_table(TINY, torch.bfloat16, PredictionPricer(slow)).price(shape)
                                - step_table(TINY, torch.bfloat16, PredictionPricer(free)).price(shape))
    assert dispatch[2] - dispatch[1] == pytest.approx(10.0, rel=1e-9)
    calls = sum(r.calls for r in counted(one).records if not r.op.startswith("prim."))
    assert dispatch[1] == pytest.approx(calls, rel=1e-9)  # 210 op calls
    # a GPU queues kernels ahead: its dispatch shows only beyond the kernels' work
    gpu = toy("h100-sxm", eager=1e-15)
    table = step_table(TINY, torch.bfloat16, PredictionPricer(gpu))
    work = sum(p.work_s for p in op_predictions(counted(one), gpu, "eager"))
    host = roofline(counted(one), gpu).host_link_s  # the step's tokens in, its logits back
    assert table.price(one) == pytest.approx(work + host, rel=1e-6)


def test_compiled_fused_group_and_kernel_launches():
    # extern kernels of a decode step: 2 layers x (wqkv, wo, w1, w2, w3, attention) + the
    # output = 13; compiled: each pays a launch (13), and the fused kernels between them one
    # each, 13 + 1 = 14: 27 launches. A second decode's attention joins the first's in one
    # varlen kernel a layer, as an engine launches it: 27 again (our eager model calls SDPA
    # once a piece: 15 + 16 = 31 launches of that program)
    # (without the GPU's fixed time a kernel and the compiled step's entry: launches alone)
    alone = {"kernel": 0.0, "compiled_step": 0.0}
    slow, free = toy("h100-sxm", compiled=1.0, **alone), toy("h100-sxm", compiled=0.0, **alone)
    launches = [step_table(TINY, torch.bfloat16, PredictionPricer(slow, "compiled")).price(s)
                - step_table(TINY, torch.bfloat16, PredictionPricer(free, "compiled")).price(s)
                for s in ([(1, 5)], [(1, 5), (1, 9)])]
    assert launches == pytest.approx([27.0, 27.0], rel=1e-9)
    # no fixed cost: the extern kernels' work + the fused rest at the elementwise rate: the
    # step's fused IO (counting/storage.py), 2,872 B, well below what the compulsory bytes
    # less what the extern kernels stream would charge: weights per layer
    # (32 x 64 + 32 x 32 + 3 x 32 x 64) x 2 B = 18,432, x 2 layers + the output's 64 x 32 x 2
    # = 40,960; KV at context 5: 2 (K, V) x 2 heads x 6 positions x 8 x 2 B x 2 layers = 768
    trace = counted([(1, 5)])
    extern = sum(p.work_s for p in op_predictions(trace, free, "compiled")
                 if p.op_class in EXTERN)
    fused_bytes = trace.fused_bytes
    assert fused_bytes == 2_872 < trace.compulsory_bytes - 40_960 - 768
    rt = rate(free, "elementwise", "bfloat16", fused_bytes / 14)
    fused_flops = sum(p.record.executed_flops for p in op_predictions(trace, free, "compiled")
                      if p.op_class not in EXTERN)
    fused = max(fused_bytes / rt.cold_bytes_per_s, fused_flops / rt.flops_per_s)
    host = roofline(trace, free).host_link_s  # the step's tokens in, its logits back
    table = step_table(TINY, torch.bfloat16, PredictionPricer(free, "compiled"))
    assert table.price([(1, 5)]) == pytest.approx(extern + fused + host, rel=1e-3)


def test_cudagraphs_one_launch_per_step():
    slow, free = toy("h100-sxm", cudagraphs=1.0), toy("h100-sxm", cudagraphs=0.0)
    for shape in ([(1, 5)], [(1, 5), (1, 9)], [(64, 64), (1, 3)]):
        launch = (step_table(TINY, torch.bfloat16, PredictionPricer(slow, "cudagraphs")).price(shape)
                  - step_table(TINY, torch.bfloat16, PredictionPricer(free, "cudagraphs")).price(shape))
        assert launch == pytest.approx(1.0, rel=1e-9), shape  # one graph, however many kernels


@pytest.mark.parametrize("execution", REGIMES)
def test_vanishing_rate_ttft_is_the_predicted_prefill_step(execution):
    # requests 1000 s apart: each meets an idle engine; TTFT = the step of one 100-token
    # piece, as perfcounter predicts it in the regime asked
    dep = deployment(TINY, "h100-sxm", max_num_seqs=64, max_num_batched_tokens=512,
                     execution=execution)
    w = Workload(np.array([0.0, 1000.0, 2000.0]), np.full(3, 100), np.full(3, 4), np.zeros(3))
    result = serve(dep, w)
    want = predict(counted([(100, 0)]), engine_program(dep.spec, execution),
                   execution).latency_s
    assert result.metrics["mean_ttft_ms"] == pytest.approx(want * 1e3, rel=1e-3)
    assert result.to_dict()["execution"] == execution
    assert result.to_dict()["step_costs"] == f"predicted, {execution}"


def test_regimes_order_and_the_bound_stays_available():
    dep = deployment(TINY, "h100-sxm", execution="cudagraphs")
    w = Workload(np.array([0.0]), np.array([100]), np.array([4]), np.zeros(1))
    ttft = {e: serve(dep, w, execution=e).metrics["mean_ttft_ms"] for e in (*REGIMES, "bound")}
    # the bound is below every prediction; a tiny model is all fixed costs: eager's 8 us a
    # call > compiled's launches > one graph launch
    assert ttft["bound"] < ttft["cudagraphs"] < ttft["compiled"] < ttft["eager"]
    bound = serve(dep, w, execution="bound").to_dict()
    assert bound["step_costs"] == "roofline bound" and bound["execution"] == "bound"


def test_the_cache_keys_on_the_regime():
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    tables = [step_table(TINY, torch.bfloat16, PredictionPricer(spec, e)) for e in REGIMES]
    bound = step_table(TINY, torch.bfloat16, RooflinePricer(spec))
    assert len({id(t) for t in (*tables, bound)}) == 4
    assert all(t.counts is bound.counts for t in tables)  # counted once, priced per regime
    before = cache_info()
    assert step_table(TINY, torch.bfloat16, PredictionPricer(spec, "compiled")) is tables[1]
    assert cache_info().hits == before.hits + 1 and cache_info().misses == before.misses


def test_compulsory_bytes_of_the_whole_model_from_one_and_two_layers():
    # three layers: the one-layer count + 2 x the second layer's share
    three = dataclasses.replace(TINY, n_layer=3)
    table = step_table(three, torch.bfloat16, RooflinePricer(get_device_spec("h100-sxm")))
    for shape in STEPS[:4]:
        want = count_step(three, [Piece(*p) for p in shape]).compulsory_bytes
        # a few activation bytes of a step are not affine: 0.1 % at a 64-token chunk
        assert table.counts.compulsory @ features(shape) == pytest.approx(want, rel=0.01)
