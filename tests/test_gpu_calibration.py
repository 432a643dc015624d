"""What a GPU calibration measures differently, checked where no GPU is: the launches a
compiled step is divided by, the working sets sized from a GPU's L2, kernel timing that is
host timing on a CPU, and the CPU's own figures left as they were."""
import pytest
import torch

from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.devices import calibrate as Cal
from perfcounter.devices import op_rates, overheads
from perfcounter.pricing import predict as P
from test_regimes import spec, toy

MiB = 1 << 20


def test_compiled_launches_are_the_ones_the_compiled_regime_charges():
    # toy(): 2 GEMV + 2 attention calls (extern) in 2 steps: 4 extern launches, a fused
    # kernel beside each (4) and one at each step's end (2): 10
    assert P.compiled_launches(toy()) == 10
    # the compiled prediction's overhead is those 10 launches x 0.5 us
    assert P.predict(toy(), spec(), "compiled").overhead_s == 10 * 0.5e-6
    # the tiny transformer calibrate compiles: 4 layers x (qkv, attention, wo, w1, w3, w2)
    # + the output projection = 25 extern calls: 2 x 25 + 1 step = 51
    _, step = op_rates.tiny_decode_step("cpu")
    with torch.no_grad(), PerformanceCounterMode() as mode:
        step()
    assert P.compiled_launches(mode.trace()) == 51


def test_a_compiled_launch_is_the_extra_time_of_a_deeper_step():
    # the tiny transformer's launches: 2 x (6 extern calls a layer x L + the output
    # projection) + 1 step = 12 L + 3: 27 at 2 layers, 99 at 8
    launches = [overheads.compiled_launches(trace) for trace in tiny_traces()]
    assert launches == [27, 99]
    # steps timed 0.605 ms and 1.685 ms: (1.685 - 0.605) ms / (99 - 27) = 15 us a launch;
    # the shallow step's rest: 0.605 ms - 27 x 15 us = 0.2 ms a step
    got = overheads.compiled_fit(launches, [0.605e-3, 1.685e-3])
    assert got["compiled"] == pytest.approx(15e-6)
    assert got["compiled_step"] == pytest.approx(0.2e-3)
    # a deeper step no slower (noise): the shallow step over its launches, no step figure
    got = overheads.compiled_fit(launches, [0.54e-3, 0.5e-3])
    assert got["compiled"] == pytest.approx(0.54e-3 / 27) and got["compiled_step"] == 0.0


def tiny_traces():
    """The counted decode step of the tiny transformer at each of COMPILED_DEPTHS."""
    traces = []
    for n_layer in overheads.COMPILED_DEPTHS:
        _, step = overheads.tiny_decode_step("cpu", n_layer)
        with torch.no_grad(), overheads.PerformanceCounterMode() as mode:
            step()
        traces.append(mode.trace())
    return traces


def test_a_gpu_times_attention_and_matmul_rows_at_a_long_prompts_size():
    # attention FLOP/s up to 2,048 tokens on a GPU (512 on a CPU: 4 x 32 x 512^2 x 64 = 2.1
    # GFLOPs a call); matmul rows to 4,096 on a GPU, past the CPU's 1,024
    assert op_rates.attention_length("cpu") == 512
    assert op_rates.attention_length("cuda") == 2048
    assert op_rates.ROWS[-1] == 1024 and op_rates.GPU_ROWS == (2048, 4096)


def test_a_gpus_triad_and_curves_reach_past_its_l2(monkeypatch):
    # an H200's L2 (60 MiB): 6 x 60 = 360 MiB per triad array; the pool of three is 1,080 MiB,
    # a quarter of it 270 MiB, so the curves' 128 MiB working set (2x L2) is measured
    monkeypatch.setattr(Cal, "_cache_bytes", lambda device: 60 * MiB)
    assert Cal.default_array_bytes("cuda") == 360 * MiB
    # a small L2 still gets 64 MiB; a huge one at most 1 GiB
    monkeypatch.setattr(Cal, "_cache_bytes", lambda device: 4 * MiB)
    assert Cal.default_array_bytes("cuda") == 64 * MiB
    monkeypatch.setattr(Cal, "_cache_bytes", lambda device: 512 * MiB)
    assert Cal.default_array_bytes("cuda") == 1024 * MiB


def test_kernel_timing_is_host_timing_on_a_cpu(monkeypatch):
    ticks = iter(range(1000))
    # each reading 1 ms after the last: every call, kernel=True or not, reads 1 ms
    monkeypatch.setitem(op_rates.CLOCKS, "wall", lambda: next(ticks) * 1e-3)
    assert op_rates.time_calls(lambda: lambda: None, "cpu", 0.0, "wall",
                               kernel=True) == pytest.approx(1e-3)
    assert op_rates.graph_timer("cpu") is None
    assert op_rates.host_call_s("cpu") > 0  # a CPU curve still takes one call's Python off


def test_a_cpu_calibration_keeps_its_figures():
    cal = Cal.calibrate(array_bytes=1 * MiB, repeats=1, matmul_n=32, dtypes=("float32",),
                        min_time=0.01, rounds=1, retries=0)
    assert "cudagraphs" not in cal.overhead_s  # no graphs on a CPU: the stated default
    # a compiled step's launches and entry, measured on the CPU as on a GPU (compiled_fit):
    # both present and positive (how long a launch takes here is the machine's, not a test's)
    assert 0 < cal.overhead_s["compiled"] < float("inf") and "compiled_step" in cal.overhead_s
    assert cal.matmul_n == 32
    assert "compiled_dynamic" not in cal.overhead_s  # a CPU's prefill: its kernels bind


def test_a_gpu_calibrations_dynamic_program_is_written_and_named_per_launch_and_step():
    cal = Cal.Calibration(device="cuda:0", processor="GPU", threads=16, array_bytes=MiB,
                          repeats=1, clock="wall", matmul_n=32, bandwidth=1e12,
                          flops={torch.bfloat16: 1e15}, memory_bytes=None, overhead_s={
                              "eager": 7e-6, "eager_bfloat16": 8e-6, "compiled": 15e-6,
                              "compiled_step": 80e-6, "compiled_dynamic": 17e-6,
                              "compiled_dynamic_step": 110e-6})
    spec_ = cal.to_spec()
    assert spec_.op_overhead_s["compiled_dynamic"] == 17e-6
    lines = "\n".join(Cal.describe(cal))
    assert "overhead per kernel launch, a program for any input length, compiled_dynamic: " \
        "17.00 us" in lines
    assert "overhead per step, a program for any input length, compiled_dynamic_step: " \
        "110.00 us" in lines
    # a compiled prefill pays them: phase_program's spec
    assert P.phase_program(spec_, "compiled", "prefill")[1].op_overhead_s["compiled"] == 17e-6


def test_a_prefill_under_cuda_graphs_is_priced_compiled():
    from perfcounter.stats import PerformanceStats
    s = {label: PerformanceStats(label, 2, trace=toy(), device_spec=spec())
         for label in ("prefill", "draft_prefill", "decode")}
    # a prefill asked "cudagraphs" runs compiled: 10 launches x 0.5 us (test above), no graph
    for label in ("prefill", "draft_prefill"):
        assert s[label].prediction("cudagraphs").execution == "compiled"
        assert s[label].prediction("cudagraphs").overhead_s == pytest.approx(10 * 0.5e-6)
    # a decode step is one graph: 2 steps x 10 us
    assert s["decode"].prediction("cudagraphs").overhead_s == pytest.approx(2 * 10e-6)
    assert P.phase_regime("eager", "prefill") == "eager"
    with pytest.raises(ValueError, match="unknown execution 'graphs'"):
        P.phase_regime("graphs", "decode")


def test_the_ops_that_run_alone_are_the_compiled_regimes_extern_kernels():
    from perfcounter.costs import runs_alone
    _, step = op_rates.tiny_decode_step("cpu")
    with torch.no_grad(), PerformanceCounterMode() as mode:
        step()
    for r in mode.trace().records + toy().records:
        assert runs_alone(r.op) == (P.op_class(r.op, r.args) in P.EXTERN), r.op
