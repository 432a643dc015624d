"""Execution regimes (eager, compiled, cudagraphs) on a toy trace, a GEMV priced by its
weight's dtype, a GEMV's cost per weight row: every expected time derived by hand."""
import pytest
import torch

from perfcounter.devices import DeviceSpec, DeviceSpecError
from perfcounter.pricing import predict as P
from perfcounter.pricing.achievable import DEFAULT_EFFICIENCY, DEFAULT_OVERHEAD_S
from perfcounter.pricing.per_record import per_step_overhead_s, record_predictions
from perfcounter.trace import OpRecord, Trace, args_from_text

ROLES = ("weight", "kv_cache", "activation", "input", "buffer")
EFF = {"gemv": 0.5, "gemm": 0.8, "attention": 0.25, "elementwise": 0.5, "reduction": 0.4,
       "indexing": 0.2, "gemv_int8": 0.4, "gemv_int4": 0.25}


def spec(**kw) -> DeviceSpec:
    # 1 GB/s and 1 GFLOP/s peaks: every rate is its efficiency x 1e9
    args = dict(device_type="cpu", name="toy", bandwidth=1e9, dtype=torch.float32,
                flops_by_dtype={torch.float32: 1e9, torch.bfloat16: 1e12},
                op_overhead_s={"eager": 1e-6, "compiled": 0.5e-6, "cudagraphs": 10e-6},
                op_efficiency=EFF)
    return DeviceSpec(**{**args, **kw})


def rec(op, shapes, calls, flops, read, written, dtype="float32") -> OpRecord:
    return OpRecord(op, "m", dtype, args_from_text(shapes, dtype), calls, flops, flops,
                    read=[read.get(r, 0) for r in ROLES], written=[written.get(r, 0) for r in ROLES])


def toy() -> Trace:
    """Two decode steps: per step one GEMV, five adds, one attention call."""
    return Trace(records=[
        # gemv: 2 calls of x[1,100] @ W[100,200]: 40,000 FLOPs each; W 80,000 B each call,
        # x 400 B read, y 800 B written each
        rec("aten.mm.default", "[1, 100], [100, 200]", 2, 80_000,
            {"weight": 160_000, "activation": 800}, {"activation": 1_600}),
        # 10 adds of 200 floats: 2,000 FLOPs, 16,000 B read, 8,000 B written
        rec("aten.add.Tensor", "[1, 200], [1, 200]", 10, 2_000,
            {"activation": 16_000}, {"activation": 8_000}),
        # attention: 2 calls, 1,024 FLOPs; KV 8,192 B and q 256 B read, 256 B written
        rec("aten._scaled_dot_product_flash_attention_for_cpu.default",
            "[1, 2, 1, 8], [1, 2, 16, 8], [1, 2, 16, 8]", 2, 1_024,
            {"activation": 256, "kv_cache": 8_192}, {"activation": 256}),
    ], compulsory_read=[80_000, 4_096, 3_000, 0, 0], compulsory_written=[0, 0, 2_000, 0, 0],
        steps=2)


# the work of each kernel, us (no cache size: every byte at the cold rate = efficiency x 1 GB/s)
GEMV_WORK = 162_400 / 0.5e9 * 1e6  # max(80,000 / 0.5e9 = 160, 162,400 B / 0.5e9 = 324.8)
ATTN_WORK = 8_704 / 0.25e9 * 1e6  # max(1,024 / 0.25e9 = 4.096, 8,704 / 0.25e9 = 34.816)
ADDS_WORK = 24_000 / 0.5e9 * 1e6  # max(2,000 / 0.5e9 = 4, 24,000 / 0.5e9 = 48)
# fused (compiled, cudagraphs): compulsory 89,096 read + 2,000 written = 91,096 B less what the
# GEMV and attention stream (weight 160,000 + KV 8,192 > 91,096: none left) = 0 B; the adds'
# 2,000 FLOPs at the elementwise rate 0.5e9 = 4 us; on a GPU at the vector units' rate, the
# float32 peak 1e9 (predict.vector_flops: the elementwise rate is an add's, bound by its
# bytes) = 2 us
FUSED_WORK = 2_000 / 0.5e9 * 1e6
GPU_FUSED_WORK = 2_000 / 1e9 * 1e6
# a GPU spec's kernels without their fixed device time (achievable.kernel_s), where a test
# prices the host's launches alone
NO_KERNEL = {"kernel": 0.0}


def test_eager_pays_every_op_call():
    p = P.predict(toy(), spec(), "eager")
    # 2 + 10 + 2 = 14 op calls at 1 us
    assert p.overhead_s * 1e6 == pytest.approx(14)
    assert p.latency_s * 1e6 == pytest.approx(14 + GEMV_WORK + ADDS_WORK + ATTN_WORK)


def test_compiled_fuses_the_elementwise_chain_and_pays_each_kernel():
    p = P.predict(toy(), spec(), "compiled")
    # kernels: 2 GEMV + 2 attention + one fused kernel per step and after each extern call
    # (2 + 4 = 6), each 0.5 us: (4 + 6) x 0.5 = 5 us
    assert p.overhead_s * 1e6 == pytest.approx(5)
    assert p.latency_s * 1e6 == pytest.approx(5 + GEMV_WORK + ATTN_WORK + FUSED_WORK)
    assert p.op_calls == 2 + 2 + 6  # the extern kernels + the fused ones


def test_cudagraphs_pays_one_launch_per_step_and_none_per_kernel():
    p = P.predict(toy(), spec(), "cudagraphs")
    # 2 steps x 10 us; the kernels' work as compiled
    assert p.overhead_s * 1e6 == pytest.approx(20)
    assert p.latency_s * 1e6 == pytest.approx(20 + GEMV_WORK + ATTN_WORK + FUSED_WORK)
    assert p.by_class["graph launch"] * 1e6 == pytest.approx(20)


def test_a_compiled_step_pays_its_entry_once_a_step():
    # compiled_step 30 us: the 10 launches x 0.5 us = 5 us and 2 steps x 30 us = 60 us
    s = spec(op_overhead_s={"eager": 1e-6, "compiled": 0.5e-6, "compiled_step": 30e-6,
                            "cudagraphs": 10e-6})
    p = P.predict(toy(), s, "compiled")
    assert p.overhead_s * 1e6 == pytest.approx(65)
    assert p.latency_s * 1e6 == pytest.approx(65 + GEMV_WORK + ATTN_WORK + FUSED_WORK)
    # a CUDA graph replays the step: no entry of the compiled program, 2 graph launches x 10 us
    assert P.predict(toy(), s, "cudagraphs").overhead_s * 1e6 == pytest.approx(20)


def test_compiled_on_a_gpu_overlaps_the_launches_with_the_kernels():
    work = GEMV_WORK + ATTN_WORK + GPU_FUSED_WORK  # 324.8 + 34.816 + 2 = 361.616 us
    # 10 launches x 100 us + 2 steps x 50 us = 1,100 us of host time; the kernels run
    # meanwhile: the step takes the host's 1,100 us, 738.384 of them showing beside the work
    gpu = spec(device_type="cuda", op_overhead_s={"compiled": 100e-6, "compiled_step": 50e-6,
                                             **NO_KERNEL})
    p = P.predict(toy(), gpu, "compiled")
    assert p.latency_s * 1e6 == pytest.approx(1100)
    assert p.overhead_s * 1e6 == pytest.approx(1100 - work)
    assert sum(p.by_class.values()) == pytest.approx(p.latency_s)
    # 10 x 1 us of launches hide behind 361.616 us of kernels
    fast = spec(device_type="cuda", op_overhead_s={"compiled": 1e-6, **NO_KERNEL})
    assert P.predict(toy(), fast, "compiled").latency_s * 1e6 == pytest.approx(work)
    # a CPU runs its compiled kernels on the launching thread: 1,100 + 363.616 us (its fused
    # arithmetic at the elementwise rate: 4 us)
    cpu = spec(op_overhead_s={"compiled": 100e-6, "compiled_step": 50e-6})
    assert P.predict(toy(), cpu, "compiled").latency_s * 1e6 == pytest.approx(
        1100 + GEMV_WORK + ATTN_WORK + FUSED_WORK)


def test_each_record_shares_a_gpus_overlapped_compiled_launches():
    # as test_compiled_on_a_gpu_overlaps...: 1,100 us of host time, 738.384 us of it showing:
    # every launch shows at 738.384 / 1,100 = 0.67126. The GEMV's 2 launches x 100 us: 134.25
    # us, the attention's the same; the adds take the fused kernels' 6 launches and the 2
    # entries: (600 + 100) x 0.67126 = 469.88 us
    gpu = spec(device_type="cuda", op_overhead_s={"compiled": 100e-6, "compiled_step": 50e-6,
                                             **NO_KERNEL})
    gemv, adds, attn = record_predictions(toy(), gpu, "compiled")
    shown = (1100 - (GEMV_WORK + ATTN_WORK + GPU_FUSED_WORK)) / 1100
    assert gemv.overhead_s * 1e6 == pytest.approx(200 * shown)
    assert attn.overhead_s * 1e6 == pytest.approx(200 * shown)
    assert adds.overhead_s * 1e6 == pytest.approx(700 * shown)
    assert sum(t.latency_s for t in (gemv, adds, attn)) * 1e6 == pytest.approx(1100)
    # a placement charges the per-step part itself (the 2 fused kernels and 2 entries a step
    # pays once: 2 x (100 + 50) = 300 us, 300 x 0.67126 showing): the records keep the rest,
    # 400 x 0.67126 for adds
    assert P.predict(toy(), gpu, "compiled").host_shown == pytest.approx(shown)
    assert per_step_overhead_s(toy(), gpu, "compiled") * 1e6 == pytest.approx(300 * shown)
    _, adds, _ = record_predictions(toy(), gpu, "compiled", per_step=False)
    assert adds.overhead_s * 1e6 == pytest.approx(400 * shown)


def test_a_gpus_dispatch_pays_its_warm_figure_when_the_weights_stream():
    # eager_cold is a CPU's: the weights streaming through its caches evict the host's state.
    # A GPU streams them through its own memory: its host dispatch stays warm.
    overheads = {"eager": 8e-6, "eager_cold": 11e-6}
    assert P.overhead(spec(op_overhead_s=overheads), "eager", cold=True) == 11e-6
    assert P.overhead(spec(device_type="cuda", op_overhead_s=overheads), "eager",
                      cold=True) == 8e-6


def test_a_gemms_bandwidth_past_the_largest_square_matmul_is_the_gemvs():
    # gemv streams 100 GB/s (warm) / 50 (cold) at 1 MB, 1,000 / 900 GB/s at 100 MB; the only
    # gemm point is at 1 MB, 5 TFLOP/s. A 100 MB gemm streams at the gemv's 1,000 / 900 GB/s
    # and computes at the gemm point's 5 TFLOP/s (no larger point); at 10 MB, half way in
    # log size: sqrt(100 x 1,000) = 316.2 GB/s warm, sqrt(50 x 900) = 212.1 cold
    curves = {"gemv": {"float32": [(1e6, 100e9, 50e9, 1e12), (1e8, 1000e9, 900e9, 2e12)]},
              "gemm": {"float32": [(1e6, 100e9, 50e9, 5e12)]}}
    s = spec(op_curves=curves, op_efficiency={})
    r = P.rate(s, "gemm", "float32", 1e8)
    assert (r.warm_bytes_per_s, r.cold_bytes_per_s, r.flops_per_s) == pytest.approx(
        (1000e9, 900e9, 5e12))
    r = P.rate(s, "gemm", "float32", 1e7)
    assert (r.warm_bytes_per_s, r.cold_bytes_per_s) == pytest.approx((316.23e9, 212.13e9),
                                                                      rel=1e-4)


def test_a_gpus_attention_streams_at_its_own_default_share():
    # no efficiency for attention (EFF without it), 1 GB/s and 1 GFLOP/s (float32) peaks: on a
    # GPU its bytes stream at the stated 0.79 (an H200's SDPA: 3,519 GB/s of 4,800 in a 38.1 us
    # kernel, less the fixed 2.7 us), its FLOPs at the default 0.5
    eff = {k: v for k, v in EFF.items() if k != "attention"}
    h200 = 128.002 * 2**20 / (128.002 * 2**20 / 3518.8e9 - 2.7e-6) / 4.8e12
    assert P.DEFAULT_STREAM_EFFICIENCY["cuda"]["attention"] == pytest.approx(h200, abs=0.005)
    r = P.rate(spec(device_type="cuda", op_efficiency=eff), "attention", "float32", 1e6)
    assert (r.flops_per_s, r.warm_bytes_per_s, r.cold_bytes_per_s) == pytest.approx(
        (0.5e9, 0.79e9, 0.79e9))
    # its elementwise bytes at 0.9 (an H200's add, an A100's and an RTX 4090's copies), FLOPs 0.8
    no_add = {k: v for k, v in EFF.items() if k != "elementwise"}
    r = P.rate(spec(device_type="cuda", op_efficiency=no_add), "elementwise", "float32", 1e6)
    assert (r.flops_per_s, r.cold_bytes_per_s) == pytest.approx((0.8e9, 0.9e9))
    # a CPU: the default 0.5 on both sides; a spec's own efficiency: its figure on both
    r = P.rate(spec(op_efficiency=eff), "attention", "float32", 1e6)
    assert (r.flops_per_s, r.cold_bytes_per_s) == pytest.approx((0.5e9, 0.5e9))
    r = P.rate(spec(device_type="cuda"), "attention", "float32", 1e6)
    assert (r.flops_per_s, r.cold_bytes_per_s) == pytest.approx((0.25e9, 0.25e9))


def test_regime_overheads_have_stated_defaults_for_every_device_type():
    bare = spec(op_overhead_s={}, op_efficiency={})
    for execution in ("eager", "compiled", "cudagraphs"):
        assert P.overhead(bare, execution) == DEFAULT_OVERHEAD_S["cpu"][execution]
    # a spec without cudagraphs: 2 steps x the stated CPU default 20 us
    p = P.predict(toy(), bare, "cudagraphs")
    assert p.overhead_s == pytest.approx(2 * DEFAULT_OVERHEAD_S["cpu"]["cudagraphs"])
    with pytest.raises(ValueError, match="unknown execution 'graphs'; valid: bound, eager, "
                                         "compiled, cudagraphs"):
        P.predict(toy(), bare, "graphs")


def gemv_record(weight_bytes: int, dtype="bfloat16") -> Trace:
    # x[1,1024] @ W[1024,1024]: 2 x 1024 x 1024 = 2,097,152 FLOPs, 1,048,576 weights
    return Trace(records=[rec("aten.mm.default", "[1, 1024], [1024, 1024]", 1, 2_097_152,
                              {"weight": weight_bytes}, {}, dtype)],
                 compulsory_read=[weight_bytes, 0, 0, 0, 0])


@pytest.mark.parametrize("weight_bytes, cls, efficiency", [
    (2 * 1_048_576, "gemv", 0.5),  # bf16: 16 bits per weight
    (1_048_576 + 4_096, "gemv_int8", 0.4),  # int8 + a bf16 scale per row: 8.03 bits
    (524_288 + 65_536, "gemv_int4", 0.25),  # int4 + group-32 scales and zeros: 4.5 bits
])
def test_gemv_efficiency_by_weight_dtype(weight_bytes, cls, efficiency):
    (p,) = P.op_predictions(gemv_record(weight_bytes), spec(op_overhead_s={"eager": 0.0}))
    assert p.op_class == cls
    # memory: weight_bytes / (efficiency x 1e9); compute 2,097,152 FLOPs / (eff x 1e12) is less
    assert p.latency_s == pytest.approx(weight_bytes / (efficiency * 1e9))


def test_quantized_gemv_efficiency_defaults_are_stated_and_below_the_float_one():
    bare = spec(op_overhead_s={"eager": 0.0}, op_efficiency={})
    (p,) = P.op_predictions(gemv_record(1_048_576 + 4_096), bare)
    assert p.basis == "default"
    assert p.latency_s == pytest.approx((1_048_576 + 4_096) / (DEFAULT_EFFICIENCY["gemv_int8"]
                                                               * 1e9))
    assert DEFAULT_EFFICIENCY["gemv_int4"] < DEFAULT_EFFICIENCY["gemv_int8"] \
        < DEFAULT_EFFICIENCY["gemv"]
    with pytest.raises(DeviceSpecError, match="op_efficiency has unknown key 'gemv_int2'"):
        spec(op_efficiency={"gemv_int2": 0.5})


def test_a_float_gemv_pays_its_weight_rows():
    # 100 ns per weight row; the toy GEMV has N = 200 rows, 2 calls: 2 x 200 x 0.1 = 40 us
    s = spec(op_overhead_s={"eager": 0.0, "gemv_row_float32": 1e-7})
    (p, *_) = P.op_predictions(toy(), s)
    assert p.rows_s * 1e6 == pytest.approx(40)
    assert p.latency_s * 1e6 == pytest.approx(GEMV_WORK + 40)
    # a bfloat16 GEMV finds no bfloat16 figure: no row cost; an int8 one never pays it
    (q,) = P.op_predictions(gemv_record(2 * 1_048_576), s)
    assert q.rows_s == 0.0


def test_eager_on_a_gpu_overlaps_the_hosts_dispatch_with_the_kernels():
    work = GEMV_WORK + ADDS_WORK + ATTN_WORK  # 324.8 + 48 + 34.816 = 407.616 us
    # 14 op calls x 100 us = 1,400 us of dispatch: the kernels run meanwhile, 992.384 us show
    gpu = spec(device_type="cuda", op_overhead_s={"eager": 100e-6, **NO_KERNEL})
    p = P.predict(toy(), gpu, "eager")
    assert p.overhead_s * 1e6 == pytest.approx(1400 - work)
    assert p.latency_s * 1e6 == pytest.approx(1400)
    # 1 us a call: 14 us of dispatch hide behind 407.616 us of kernels
    assert P.predict(toy(), spec(device_type="cuda", op_overhead_s={"eager": 1e-6, **NO_KERNEL}),
                     "eager").overhead_s == 0.0
    # a CPU runs the ops on the dispatching thread: every microsecond shows
    assert P.predict(toy(), spec(op_overhead_s={"eager": 100e-6}), "eager").latency_s * 1e6 \
        == pytest.approx(1400 + work)


def test_the_time_per_weight_row_grows_with_activation_rows_in_log_rows():
    # 80 ns at 1 row, 120 ns at 16: 4 rows lie half way in log rows (log 4 / log 16 = 0.5):
    # 100 ns; beyond 16 rows the 16 rows' figure
    s = spec(op_overhead_s={"gemv_row_float32": 80e-9, "gemv_row16_float32": 120e-9})
    assert P.gemv_row_s(s, "float32", 1) == pytest.approx(80e-9)
    assert P.gemv_row_s(s, "float32", 4) == pytest.approx(100e-9)
    assert P.gemv_row_s(s, "float32", 64) == pytest.approx(120e-9)
    # a matmul of 64 rows (gemm) of W[100, 200]: 200 weight rows x 120 ns = 24 us beside its work
    trace = Trace(records=[rec("aten.mm.default", "[64, 100], [100, 200]", 1, 2_560_000,
                               {"weight": 80_000, "activation": 25_600}, {"activation": 51_200})])
    (p,) = P.op_predictions(trace, spec(op_overhead_s={"eager": 0.0, **s.op_overhead_s}))
    assert p.op_class == "gemm" and p.rows_s * 1e6 == pytest.approx(24)


# -- each record's share of a prediction (simulations and plots split a phase by record) ----
def test_each_record_shares_the_prediction_in_every_regime():
    trace, s = toy(), spec()
    gemv, adds, attn = record_predictions(trace, s, "eager")
    # eager: each record alone, its calls x 1 us + its work
    assert gemv.latency_s * 1e6 == pytest.approx(2 + GEMV_WORK)
    assert adds.latency_s * 1e6 == pytest.approx(10 + ADDS_WORK)
    assert attn.latency_s * 1e6 == pytest.approx(2 + ATTN_WORK)
    gemv, adds, attn = record_predictions(trace, s, "compiled")
    # compiled: the extern kernels keep 2 calls x 0.5 us + their work; the adds, the only
    # fused record, take the fused kernels' 6 x 0.5 = 3 us and FUSED_WORK
    assert gemv.latency_s * 1e6 == pytest.approx(1 + GEMV_WORK)
    assert attn.latency_s * 1e6 == pytest.approx(1 + ATTN_WORK)
    assert adds.overhead_s * 1e6 == pytest.approx(3)
    assert adds.work_s * 1e6 == pytest.approx(FUSED_WORK)
    # CUDA graphs: 2 launches x 10 us = 20 us shared by work (324.8 : 4 : 34.816 us)
    times = record_predictions(trace, s, "cudagraphs")
    work = GEMV_WORK + FUSED_WORK + ATTN_WORK
    assert times[0].overhead_s * 1e6 == pytest.approx(20 * GEMV_WORK / work)
    for execution in ("eager", "compiled", "cudagraphs"):
        whole = P.predict(trace, s, execution)
        assert sum(t.latency_s for t in record_predictions(trace, s, execution)) \
            == pytest.approx(whole.latency_s - whole.host_link_s)


def test_a_gpus_kernels_pay_a_fixed_device_time_beside_their_bytes():
    # each kernel of a GPU occupies it 2 us beside its bytes ("kernel": 2e-6), where its
    # rates are efficiencies (the toy's), not a measured curve. CUDA graphs: the 2 GEMV, 2
    # attention and 2 + 4 = 6 fused kernels (one per step and after each extern call, as
    # compiled launches them) = 10 kernels x 2 us = 20 us more work than without
    fixed = {"eager": 1e-6, "compiled": 0.5e-6, "cudagraphs": 10e-6}
    gpu = spec(device_type="cuda", op_overhead_s={**fixed, "kernel": 2e-6})
    bare = spec(device_type="cuda", op_overhead_s={**fixed, **NO_KERNEL})
    graphs = P.predict(toy(), gpu, "cudagraphs")
    assert graphs.work_s * 1e6 == pytest.approx(GEMV_WORK + ATTN_WORK + GPU_FUSED_WORK + 20)
    assert (graphs.latency_s - P.predict(toy(), bare, "cudagraphs").latency_s) * 1e6 \
        == pytest.approx(20)
    assert graphs.op_calls == 10 and graphs.fixed_s * 1e6 == pytest.approx(20)
    assert "20.00 µs of the work is the kernels' fixed device time (2.00 µs a kernel)" \
        in P.describe_basis(gpu, graphs)
    # eager: every op call that moves bytes is a kernel: 2 + 10 + 2 = 14 x 2 us = 28 us; the
    # 14 us of dispatch hide behind the 407.616 + 28 us of kernels
    eager = P.predict(toy(), gpu, "eager")
    assert eager.work_s * 1e6 == pytest.approx(GEMV_WORK + ADDS_WORK + ATTN_WORK + 28)
    assert eager.fixed_s * 1e6 == pytest.approx(28)
    assert eager.overhead_s == 0.0
    (gemv, adds, attn) = P.op_predictions(toy(), gpu, "eager")
    assert (gemv.fixed_s, adds.fixed_s, attn.fixed_s) == pytest.approx((4e-6, 20e-6, 4e-6))
    # a GPU without its own figure pays the stated default; a CPU's op runs on the thread
    # that calls it: no kernel time beside its call overhead
    assert P.op_predictions(toy(), spec(device_type="cuda"), "eager")[0].fixed_s \
        == pytest.approx(2 * P.DEFAULT_KERNEL_S["cuda"])
    assert all(p.fixed_s == 0.0 for p in P.op_predictions(toy(), spec(), "eager"))


def test_a_measured_curve_holds_its_kernels_fixed_time():
    # a calibrated GPU's curves were timed kernel by kernel: a small working set's rate
    # already holds the fixed time (an H200's add of 64 KiB: 3.3 us), so none is added
    curve = {"float32": [[1e3, 1e9, 1e9, 1e9], [1e9, 1e9, 1e9, 1e9]]}
    curves = {c: curve for c in ("gemv", "gemm", "attention", "elementwise", "reduction",
                                 "indexing")}
    gpu = spec(device_type="cuda", op_curves=curves, op_efficiency={},
               op_overhead_s={"eager": 1e-6, "kernel": 2e-6})
    assert all(p.fixed_s == 0.0 for p in P.op_predictions(toy(), gpu, "eager"))


def test_a_spec_names_every_figure_its_predictions_take_and_where_it_comes_from():
    from perfcounter.pricing.achievable import prediction_inputs
    figures = {name: (value, where) for name, value, where in prediction_inputs(
        spec(device_type="cuda", op_overhead_s={"eager": 5e-6}))}
    # the toy's own efficiencies (EFF): gemv 0.5, gemv_int4 0.25; gemv_fp8 has none: the
    # stated default; strided: the contiguous elementwise rate x 3/5
    assert figures["gemv"] == ("0.5 of peak", "sourced (op_efficiency)")
    assert figures["gemv_int4"] == ("0.25 of peak", "sourced (op_efficiency)")
    assert figures["gemv_fp8"][1] == "stated default (DEFAULT_EFFICIENCY)"
    assert figures["strided"] == ("0.6 of elementwise", "stated share (STRIDED_SHARE)")
    # its eager figure, the rest stated defaults: a GPU's compiled launch, step and kernel
    assert figures["eager"] == ("5 us an op call", "sourced (op_overhead_us)")
    assert figures["compiled"] == ("15 us a kernel launch", "stated default (DEFAULT_OVERHEAD_S)")
    assert figures["compiled_step"] == ("69 us a compiled step", "stated default (DEFAULT_STEP_S)")
    assert figures["kernel"] == ("2.7 us a kernel, device time",
                                 "stated default (DEFAULT_KERNEL_S)")
    # a CPU runs no kernels of its own: no kernel figure, and no compiled step stated
    cpu = {name: where for name, _, where in prediction_inputs(spec())}
    assert "kernel" not in cpu and cpu["compiled_step"] == "none stated"


def test_a_prefill_compiled_for_any_prompt_length_pays_its_dynamic_programs_launches():
    # the toy's 2 steps on a GPU whose host binds: 10 launches and 2 entries. Calibrated, the
    # dynamic program's own figures: 10 x 120 + 2 x 80 = 1,360 us (static: 10 x 100 + 2 x 50)
    gpu = spec(device_type="cuda", op_overhead_s={
        "compiled": 100e-6, "compiled_step": 50e-6, "compiled_dynamic": 120e-6,
        "compiled_dynamic_step": 80e-6, **NO_KERNEL})
    regime, program = P.phase_program(gpu, "cudagraphs", "prefill")  # a prefill runs compiled
    assert regime == "compiled"
    assert P.predict(toy(), program, regime).latency_s * 1e6 == pytest.approx(1360)
    assert P.phase_program(gpu, "compiled", "decode") == ("compiled", gpu)  # a fixed shape
    assert P.phase_program(gpu, "eager", "prefill") == ("eager", gpu)
    # a registry entry (no compiled figure of its own): the defaults plus DEFAULT_DYNAMIC_S,
    # 15 + 1.8 = 16.8 us a launch and 69 + 34 = 103 us a step: 10 x 16.8 + 2 x 103 = 374 us
    # of host time, above the kernels' 361.616 us (GEMV + attention + fused on a GPU)
    registry = spec(device_type="cuda", op_overhead_s=NO_KERNEL)
    _, program = P.phase_program(registry, "compiled", "prefill")
    assert P.overhead(program, "compiled") == pytest.approx(16.8e-6)
    assert P.compiled_step_s(program) == pytest.approx(103e-6)
    assert P.predict(toy(), program, "compiled").latency_s * 1e6 == pytest.approx(374)
    # an engine's own launch figure (from C++) and a CPU's compiled prefill: the spec as is
    engine = spec(device_type="cuda", op_overhead_s={"compiled": 3e-6, "compiled_step": 0.0})
    assert P.phase_program(engine, "compiled", "prefill")[1] is engine
    cpu = spec()
    assert P.phase_program(cpu, "compiled", "prefill")[1] is cpu


def test_the_regimes_are_named_and_checked_once():
    import subprocess
    from pathlib import Path

    from perfcounter.cli import flags
    from perfcounter.devices.spec import EXECUTIONS
    from perfcounter.pricing import achievable
    from perfcounter.pricing.price import REGIMES, check_regime
    assert EXECUTIONS == ("eager", "compiled", "cudagraphs") and REGIMES == ("bound", *EXECUTIONS)
    assert flags.EXECUTIONS is EXECUTIONS and P.REGIMES is REGIMES  # imported, not copied
    root = Path(__file__).resolve().parents[1]
    lines = subprocess.run(["grep", "-rn", r"EXECUTIONS =\|REGIMES =", "perfcounter"], cwd=root,
                           capture_output=True, text=True).stdout.splitlines()
    assert sorted(line.split(":")[0] for line in lines) == ["perfcounter/devices/op_keys.py",
                                                             "perfcounter/pricing/regimes.py"]
    # one check: the bound among the regimes, or (bound=False) the programs a prediction prices
    assert [check_regime(r) for r in REGIMES] == list(REGIMES)
    assert check_regime("eager", bound=False) == "eager"
    with pytest.raises(ValueError, match="unknown execution 'bound'; valid: eager, compiled, "
                                         "cudagraphs$"):
        check_regime("bound", bound=False)
    # what refuses a name elsewhere is that check (its message)
    for refuse in (lambda e: achievable.overhead(spec(), e), lambda e: P.overhead(spec(), e),
                   lambda e: P.phase_regime(e, "decode")):
        with pytest.raises(ValueError, match="unknown execution 'kernel'; valid: eager, "
                                             "compiled, cudagraphs$"):
            refuse("kernel")  # an op_overhead_s key, not a regime
