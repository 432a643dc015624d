"""predict.py: per-op predictions on a toy trace, derived by hand class by class; fusion
for compiled runs; rates from curves; old calibration files; bad efficiencies."""
import math
from dataclasses import replace

import pytest
import torch

from perfcounter.pricing import achievable as A, predict as P
from perfcounter.cli.main import main
from perfcounter.devices import DeviceSpec, DeviceSpecError, load_device_specs
from perfcounter.devices import op_rates
from perfcounter.devices.op_rates import MAX_CALLS, fill_operands, time_calls
from perfcounter.devices.spec_file import write_device_specs
from perfcounter.devices.spec import OP_CLASSES
from perfcounter.stats import PerformanceStats
from perfcounter.trace import OpRecord, Trace, args_from_text
from perfcounter.trace_args import TensorArg, contiguous

F32, BF16 = "float32", "bfloat16"
EFF = {"gemv": 0.5, "gemm": 0.8, "attention": 0.25, "elementwise": 0.5, "reduction": 0.4,
       "indexing": 0.2}


def toy_spec(**kw) -> DeviceSpec:
    # 1 GB/s and 1 GFLOP/s peaks make every rate below eff x 1e9
    args = dict(device_type="cpu", name="toy", bandwidth=1e9, dtype=torch.float32,
                flops_by_dtype={torch.float32: 1e9},
                op_overhead_s={"eager": 1e-6, "compiled": 0.5e-6}, op_efficiency=EFF)
    return DeviceSpec(**{**args, **kw})


def rec(op, shapes, calls, flops, read, written) -> OpRecord:
    """read / written: {role: bytes}."""
    roles = ("weight", "kv_cache", "activation", "input", "buffer")
    return OpRecord(op, "m", F32 if shapes else "", args_from_text(shapes, F32),
                    calls, flops, flops,
                    read=[read.get(r, 0) for r in roles], written=[written.get(r, 0) for r in roles])


def toy_trace() -> Trace:
    records = [
        # gemv (1 row): 2 calls, each 2*1*100*200 = 40,000 FLOPs, weight 100*200*4 = 80,000 B,
        # x 400 B read, y 800 B written
        rec("aten.mm.default", "[1, 100], [100, 200]", 2, 80_000,
            {"weight": 160_000, "activation": 800}, {"activation": 1_600}),
        # gemm (64 rows): 2*64*100*200 = 2,560,000 FLOPs; x 25,600 + w 80,000 read, 51,200 written
        rec("aten.mm.default", "[64, 100], [100, 200]", 1, 2_560_000,
            {"weight": 80_000, "activation": 25_600}, {"activation": 51_200}),
        # elementwise: 10 adds of 200 floats: 2,000 FLOPs, 16,000 B read, 8,000 B written
        rec("aten.add.Tensor", "[1, 200], [1, 200]", 10, 2_000,
            {"activation": 16_000}, {"activation": 8_000}),
        # attention: 4*2*1*16*8 = 1,024 FLOPs; q 256 B, k and v 4,096 B each, out 256 B
        rec("aten._scaled_dot_product_flash_attention_for_cpu.default",
            "[1, 2, 1, 8], [1, 2, 16, 8], [1, 2, 16, 8]", 1, 1_024,
            {"activation": 256, "kv_cache": 8_192}, {"activation": 256}),
        # reduction: softmax of [4, 16]: 320 FLOPs, 256 B read, 256 B written
        rec("aten._softmax.default", "[4, 16], -1, False", 1, 320,
            {"activation": 256}, {"activation": 256}),
        # indexing: 3 rows of 100 floats (1,200 B) and 3 int64 ids (24 B) read, 1,200 B written
        rec("aten.embedding.default", "[1000, 100], [1, 3]", 1, 0,
            {"weight": 1_200, "input": 24}, {"activation": 1_200}),
        rec("aten.view.default", "", 5, 0, {}, {}),  # views: overhead only
        rec("prim.device.default", "", 100, 0, {}, {}),  # metadata: nothing
    ]
    # each storage once: weights 160,000 + 80,000 + 1,200, KV 8,192, activations 4,000 read
    # and 6,000 written, ids 24 -> 253,416 read + 6,000 written = 259,416 B
    return Trace(records=records, compulsory_read=[241_200, 8_192, 4_000, 24, 0],
                 compulsory_written=[0, 0, 6_000, 0, 0])


def test_op_classes_come_from_the_registry():
    assert P.op_class("aten.mm.default", args_from_text("[1, 100], [100, 200]", F32)) == "gemv"
    assert P.op_class("aten.mm.default", args_from_text("[16, 100], [100, 200]", F32)) == "gemv"  # M <= 16
    assert P.op_class("aten.mm.default", args_from_text("[17, 100], [100, 200]", F32)) == "gemm"
    assert P.op_class("aten.bmm.default", args_from_text("[8, 1, 64], [8, 64, 19]", F32)) == "gemv"
    assert P.op_class("aten.addmm.default", args_from_text("[200], [64, 100], [100, 200]", F32)) == "gemm"
    assert P.op_class("aten._scaled_dot_product_flash_attention_for_cpu.default") == "attention"
    assert P.op_class("aten._softmax.default") == "reduction"
    assert P.op_class("aten.sum.dim_IntList") == "reduction"
    assert P.op_class("aten.embedding.default") == "indexing"
    assert P.op_class("aten.index_copy_.default") == "indexing"
    assert P.op_class("aten.silu.default") == "elementwise"
    assert P.op_class("aten.copy_.default") == "elementwise"


def test_eager_prediction_class_by_class():
    ops = {p.op_class: p for p in P.op_predictions(toy_trace(), toy_spec())}
    us = {cls: p.latency_s * 1e6 for cls, p in ops.items()}
    # gemv: 2 x 1 us + max(80,000 / 0.5e9 = 160 us, 162,400 / 0.5e9 = 324.8 us)
    assert us["gemv"] == pytest.approx(2 + 324.8)
    # gemm: 1 us + max(2,560,000 / 0.8e9 = 3,200 us, 156,800 / 0.8e9 = 196 us)
    assert us["gemm"] == pytest.approx(1 + 3200)
    # attention: 1 us + max(1,024 / 0.25e9 = 4.096 us, 8,704 / 0.25e9 = 34.816 us)
    assert us["attention"] == pytest.approx(1 + 34.816)
    # reduction: 1 us + max(320 / 0.4e9 = 0.8 us, 512 / 0.4e9 = 1.28 us)
    assert us["reduction"] == pytest.approx(1 + 1.28)
    # indexing: 1 us + max(0, 2,424 / 0.2e9 = 12.12 us)
    assert us["indexing"] == pytest.approx(1 + 12.12)
    pred = P.predict(toy_trace(), toy_spec())
    # elementwise: the adds 10 x 1 us + max(2,000 / 0.5e9 = 4 us, 24,000 / 0.5e9 = 48 us) = 58 us,
    # plus the 5 views at 1 us each; prim.device costs nothing
    assert pred.by_class["elementwise"] * 1e6 == pytest.approx(58 + 5)
    assert pred.latency_s * 1e6 == pytest.approx(326.8 + 3201 + 35.816 + 2.28 + 13.12 + 63)
    assert pred.op_calls == 2 + 1 + 10 + 1 + 1 + 1 + 5 and pred.basis == "efficiency"


def test_compiled_prediction_fuses_what_is_not_a_matmul_or_attention():
    pred = P.predict(toy_trace(), toy_spec(), "compiled")
    us = {cls: v * 1e6 for cls, v in pred.by_class.items()}
    # extern kernels as in eager, at 0.5 us a call
    assert us["gemv"] == pytest.approx(2 * 0.5 + 324.8)
    assert us["gemm"] == pytest.approx(0.5 + 3200)
    assert us["attention"] == pytest.approx(0.5 + 34.816)
    # fused: compulsory 259,416 B - what the extern kernels stream (weights 160,000 + 80,000,
    # KV 8,192) = 11,224 B at 0.5e9 B/s = 22.448 us (> 2,320 FLOPs / 0.5e9 = 4.64 us), plus
    # one kernel per step and after each of the 4 extern calls: 5 x 0.5 us
    assert us["fused"] == pytest.approx(22.448 + 2.5)
    assert set(us) == {"gemv", "gemm", "attention", "fused"}
    assert pred.latency_s * 1e6 == pytest.approx(325.8 + 3200.5 + 35.316 + 24.948)


def test_rates_from_curves_interpolate_in_log_size_and_stream_cold_past_the_cache():
    # gemv float32: at 1e3 B warm 2e9 / cold 1e9 B/s, at 1e5 B warm 4e9 / cold 2e9 B/s;
    # 1e4 B lies half way in log size: warm sqrt(2e9 * 4e9) = 2.828e9, cold 1.414e9
    curves = {"gemv": {"float32": [(1e3, 2e9, 1e9, 1e10), (1e5, 4e9, 2e9, 1e10)]}}
    trace = Trace(records=[rec("aten.mm.default", "[1, 50], [50, 50]", 1, 5_000,
                               {"weight": 10_000}, {})], compulsory_read=[10_000, 0, 0, 0, 0])
    r = P.rate(toy_spec(op_curves=curves), "gemv", F32, 1e4)
    assert (r.warm_bytes_per_s, r.cold_bytes_per_s) == pytest.approx((2e9 * 2 ** .5, 1e9 * 2 ** .5))
    for cache, seconds in ((1e3, 1e4 / (1e9 * 2 ** .5)),  # the phase exceeds the cache: cold
                           (1e6, 1e4 / (2e9 * 2 ** .5))):  # it fits: warm
        spec = toy_spec(op_curves=curves, cache_bytes=cache, op_overhead_s={"eager": 0.0})
        (p,) = P.op_predictions(trace, spec)
        assert p.latency_s == pytest.approx(seconds) and p.basis == "curve"
    # beyond the measured sizes the end points hold
    assert P.rate(toy_spec(op_curves=curves), "gemv", F32, 1e9).warm_bytes_per_s == 4e9


def test_a_step_that_streams_past_the_cache_finds_its_activations_cold_too():
    # elementwise float32, one point (it holds at every size): warm 4e9 B/s, cold 1e9, 1e10 FLOP/s
    curves = {"elementwise": {"float32": [(1e4, 4e9, 1e9, 1e10)]}}
    # an add of activations: 8,000 B read + 4,000 B written = 12,000 B (1,000 FLOPs: 0.1 us);
    # the step reads 1,000,000 B of weights besides: 1,012,000 distinct bytes
    trace = Trace(records=[rec("aten.add.Tensor", "[1000], [1000]", 1, 1_000,
                               {"activation": 8_000}, {"activation": 4_000})],
                  compulsory_read=[1_000_000, 0, 8_000, 0, 0],
                  compulsory_written=[0, 0, 4_000, 0, 0])
    for cache, bandwidth in ((1e5, 1e9),  # the step exceeds the cache: the add reads cold
                             (1e7, 4e9)):  # it fits: warm
        spec = toy_spec(op_curves=curves, cache_bytes=cache,
                        op_overhead_s={"eager": 0.0, "compiled": 0.0})
        (p,) = P.op_predictions(trace, spec)
        assert p.latency_s == pytest.approx(12_000 / bandwidth)  # 12 us cold, 3 us warm
        # compiled: one fused kernel moves the step's 1,012,000 compulsory bytes (no extern
        # kernel streams any of them) at the same rate: 1,012 us cold, 253 us warm
        assert P.predict(trace, spec, "compiled").work_s == pytest.approx(1_012_000 / bandwidth)


def test_a_matmul_of_more_rows_than_measured_runs_at_the_most_rows_rate():
    # 64 rows, beyond ROWS' 32: 32 rows' 8e8 FLOP/s (not the gemm class's 0.8e9 x 1e9 peak);
    # 2*64*100*200 = 2,560,000 FLOPs / 8e8 = 3,200 us, over 156,800 B / 0.8e9 = 196 us; + 1 us
    trace = Trace(records=[rec("aten.mm.default", "[64, 100], [100, 200]", 1, 2_560_000,
                               {"weight": 80_000, "activation": 25_600},
                               {"activation": 51_200})])
    spec = toy_spec(matmul_rows={"float32": {2: 1e8, 8: 4e8, 32: 8e8}},
                    op_efficiency={**EFF, "gemm": 0.4})
    # without the table: the class's 0.4 x 1e9 = 4e8 FLOP/s, 6,400 us
    assert P.predict(trace, toy_spec(op_efficiency={**EFF, "gemm": 0.4})).latency_s * 1e6 == \
        pytest.approx(1 + 6400)
    assert P.predict(trace, spec).latency_s * 1e6 == pytest.approx(1 + 3200)


def test_matmul_rows_sum_the_times_of_both_inner_dims(monkeypatch):
    # a 16 MiB float32 pool: each weight a quarter of it, 4 MiB: K = 2048 -> N = 4 MiB / (2048 * 4)
    # = 512; K = 8192 -> N = 128. Both calls do 2 * M * 512 * 2048 = 2 * M * 128 * 8192
    # = 2,097,152 M FLOPs; timed 1 ms and 3 ms: 4,194,304 M / 4 ms = 1,048,576,000 M FLOP/s
    def fake_time_calls(make, device, min_time, clock="wall", kernel=False):
        return 1e-3 if make()().shape[1] == 512 else 3e-3
    monkeypatch.setattr(op_rates, "time_calls", fake_time_calls)
    monkeypatch.setattr(op_rates, "host_call_s", lambda device, clock="wall": 0.0)
    table = op_rates.matmul_rows(torch.zeros(4 << 20), [torch.float32], torch.device("cpu"), 0.1)
    assert list(table["float32"]) == list(op_rates.ROWS)
    assert table["float32"][2] == pytest.approx(2 * 1_048_576_000)
    assert table["float32"][16] == pytest.approx(16 * 1_048_576_000)


def test_gemv_is_calibrated_at_two_inner_dims_of_the_same_bytes():
    # 16 MiB of float32 weight: K = 2 ** round(log2(sqrt(4 Mi elements))) = 2048, N = 2048;
    # wide: K = 4 * 2048 = 8192, N = 4 Mi / 8192 = 512; bytes (x + W + y) * 4
    (normal,), _, normal_bytes, _ = op_rates._operands("gemv", 16 << 20, torch.float32, "cpu")
    (wide,), _, wide_bytes, _ = op_rates._operands("gemv", 16 << 20, torch.float32, "cpu", True)
    assert (normal, wide) == ((2048, 2048), (512, 8192))
    assert (normal_bytes, wide_bytes) == ((2048 + 2048 * 2048 + 2048) * 4,
                                          (8192 + 512 * 8192 + 512) * 4)


def test_time_calls_stops_at_max_calls_for_a_tiny_op():
    made = []

    def make():
        made.append(1)
        return lambda: None
    # a do-nothing call takes well under 1 s / MAX_CALLS: the cap ends the loop, not min_time
    time_calls(make, torch.device("cpu"), min_time=1.0)
    assert len(made) == 1 + MAX_CALLS  # the warm-up, then MAX_CALLS timed calls


def test_calibration_operands_are_normal_numbers_in_float32_and_bfloat16():
    pool = torch.zeros(1003)  # not a whole number of blocks: the tail is filled too
    fill_operands(pool, block_bytes=400)
    for view in (pool, pool.view(torch.bfloat16)):  # no zeros, denormals, infinities or NaNs
        assert 0.5 <= view.float().min() and view.float().max() <= 1.51


def test_a_datasheet_device_without_efficiencies_uses_the_stated_defaults():
    spec = toy_spec(op_efficiency={}, op_overhead_s={})
    r = P.rate(spec, "gemm", F32, 1e6)
    assert r.basis == "default" and r.flops_per_s == P.DEFAULT_EFFICIENCY["gemm"] * 1e9
    assert P.overhead(spec, "eager") == P.DEFAULT_OVERHEAD_S["cpu"]["eager"]
    stats = PerformanceStats("decode", 1, 0.01, toy_trace(), spec)
    assert stats.predicted_latency == pytest.approx(P.predict(toy_trace(), spec).latency_s)
    assert stats.predicted_latency > stats.roofline_latency  # a prediction, not the bound
    assert stats.to_dict()["predicted_latency_s"] == stats.predicted_latency
    assert "Measured ÷ predicted" in str(stats)


def test_an_old_calibration_file_loads_and_warns_naming_the_missing_field(tmp_path):
    old = DeviceSpec(device_type="cpu", name="old-cal", bandwidth=20e9, dtype=torch.float32,
                     flops_by_dtype={torch.float32: 1e11},
                     source={"bandwidth": "measured by `perfcounter calibrate` on box, 2024",
                             "flops_by_dtype": "measured by `perfcounter calibrate` on box"})
    path = write_device_specs(tmp_path / "cal.yaml", [old])
    assert "op_curves" not in path.read_text()
    (spec,) = load_device_specs(path)
    with pytest.warns(UserWarning) as warned:
        pred = P.predict(toy_trace(), spec)
    messages = [str(w.message) for w in warned]
    assert any("has no op_curves" in m for m in messages)
    assert any("has no op_overhead_s" in m for m in messages)
    assert all("\n" not in m for m in messages)
    assert pred.basis == "peak"  # the measured triad and matmul figures, as they are


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, "high"])
def test_a_bad_efficiency_is_refused_naming_the_value(bad):
    with pytest.raises(DeviceSpecError, match=r"op_efficiency\[gemv\] must be a number in "
                                              r"\(0, 1\], got"):
        toy_spec(op_efficiency={"gemv": bad})


def test_a_bad_efficiency_in_a_file_names_the_file_and_entry(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("devices:\n  x:\n    device_type: cpu\n    bandwidth_GBs: 10\n"
                    "    tflops: {float32: 1}\n    dtype: float32\n"
                    "    op_efficiency: {gemv: 0}\n    source: test\n")
    with pytest.raises(DeviceSpecError) as err:
        load_device_specs(path)
    assert str(path) in str(err.value) and "entry 'x'" in str(err.value)
    assert "op_efficiency[gemv] must be a number in (0, 1], got 0" in str(err.value)
    with pytest.raises(DeviceSpecError, match="unknown key 'gemvv'; did you mean gemv"):
        toy_spec(op_efficiency={"gemvv": 0.5})


def test_curves_round_trip_through_yaml_in_their_units(tmp_path):
    fields = ("bandwidth", "flops_by_dtype", "op_overhead_s", "op_efficiency", "op_curves",
              "cache_bytes")
    spec = toy_spec(op_curves={"gemm": {"bf16": [[1e6, 1e10, 5e9, 1e11]]}}, cache_bytes=32e6,
                    source={f: "a test" for f in fields})
    (back,) = load_device_specs(write_device_specs(tmp_path / "c.yaml", [spec]))
    assert back.op_curves == {"gemm": {"bfloat16": ((1e6, 1e10, 5e9, 1e11),)}}
    assert back.op_overhead_s == spec.op_overhead_s and back.cache_bytes == 32e6
    assert "op_overhead_us" in (tmp_path / "c.yaml").read_text()
    assert math.isclose(DeviceSpec.from_dict(spec.to_dict()).op_efficiency["gemv"], 0.5)


def test_calibrate_on_cuda_without_a_gpu_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv=["calibrate", "--device", "cuda", "--no-write"]) == 2
    err = capsys.readouterr().err
    assert err == ("perfcounter calibrate: error: cannot calibrate device 'cuda': no CUDA GPU "
                   "is available here (valid: cpu)\n")


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_calibrate_measures_curves_and_overheads_that_predict_reads(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(argv=["calibrate", "--array-mb", "1", "--repeats", "1", "--matmul-n", "32",
                      "--min-time", "0.01", "--dtypes", "float32", "--clock", "cpu",
                      "--out", str(out)]) == 0
    assert "overhead per op call, eager" in capsys.readouterr().out
    (spec,) = load_device_specs(out)
    assert set(spec.op_curves) == set(OP_CLASSES)
    assert set(spec.op_overhead_s) == {"eager", "eager_cold", "compiled", "compiled_step",
                                      "gemv_row_float32", "gemv_row16_float32"}
    # every row of ROWS timed; one a busy machine makes dip below fewer rows' FLOP/s is
    # left out (drop_flagged) and named in the file's checks, never silently
    rows = list(spec.matmul_rows["float32"])
    dropped = " ".join(spec.calibration_check.get("dropped", ()))
    assert rows == [m for m in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if m in rows]
    for m in {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024} - set(rows):
        assert f"matmul float32 {m} rows:" in dropped
    assert P.predict(toy_trace(), spec).basis == "curve"


def test_a_skinny_matmul_of_2_to_8_rows_is_charged_8_rows():
    # 2 rows: 2*2*100*200 = 80,000 FLOPs charged as 8 rows: 320,000 / 0.5e9 = 640 us, over
    # the 80,000 weight bytes / 0.5e9 = 160 us; plus 1 us of overhead
    trace = Trace(records=[rec("aten.mm.default", "[2, 100], [100, 200]", 1, 80_000,
                               {"weight": 80_000}, {})])
    assert P.predict(trace, toy_spec()).latency_s * 1e6 == pytest.approx(641)


ROWS = {"float32": {2: 1e8, 8: 4e8, 32: 8e8}}


def test_matmul_flops_by_rows_interpolate_in_time_per_row():
    spec = toy_spec(matmul_rows=ROWS, flops_by_dtype={torch.float32: 1e9, torch.bfloat16: 2e9})
    assert P.rows_flops(spec, F32, 8) == 4e8  # measured
    # 4 rows: 2 rows take 2 / 1e8 = 2e-8 s per (N*K*2) unit and 8 rows 8 / 4e8 = 2e-8:
    # 4 rows take as long, 4 / 2e-8 = 2e8 FLOP/s
    assert P.rows_flops(spec, F32, 4) == pytest.approx(2e8)
    # 16 rows: 8 / 4e8 = 2e-8 and 32 / 8e8 = 4e-8, a third of the way: 2.667e-8; 16 / that = 6e8
    assert P.rows_flops(spec, F32, 16) == pytest.approx(6e8)
    assert P.rows_flops(spec, F32, 1) == pytest.approx(5e7)  # below the fewest: same time
    assert P.rows_flops(spec, F32, 33) == 8e8  # beyond the most rows: the most rows' figure
    assert P.rows_flops(toy_spec(), F32, 8) is None  # no table
    # bfloat16 not measured: float32's, scaled by the peaks 2e9 / 1e9
    assert P.rows_flops(spec, "bfloat16", 8) == pytest.approx(8e8)


def test_a_matmul_of_few_rows_is_priced_at_its_measured_rate():
    # 4 rows: 2*4*100*200 = 160,000 FLOPs at 2e8 FLOP/s = 800 us, over the 80,000 weight
    # bytes / 0.5e9 = 160 us; plus 1 us of overhead
    trace = Trace(records=[rec("aten.mm.default", "[4, 100], [100, 200]", 1, 160_000,
                               {"weight": 80_000}, {})])
    assert P.predict(trace, toy_spec(matmul_rows=ROWS)).latency_s * 1e6 == pytest.approx(801)
    # 24 rows (gemm class): 8 / 4e8 = 2e-8 s and 32 / 8e8 = 4e-8 s, two thirds of the way:
    # 3.333e-8, 24 / that = 7.2e8 FLOP/s; 2*24*100*200 = 960,000 FLOPs / 7.2e8 = 1,333.3 us
    trace = Trace(records=[rec("aten.mm.default", "[24, 100], [100, 200]", 1, 960_000,
                               {"weight": 80_000}, {})])
    assert P.predict(trace, toy_spec(matmul_rows=ROWS)).latency_s * 1e6 == \
        pytest.approx(1 + 960_000 / 7.2e8 * 1e6)


def test_matmul_rows_are_checked_and_survive_json_and_yaml(tmp_path):
    with pytest.raises(DeviceSpecError, match=r"matmul_rows\[float32\] rows must be integers "
                                              r">= 1, got 0"):
        toy_spec(matmul_rows={"float32": {0: 1e9}})
    with pytest.raises(DeviceSpecError, match=r"matmul_rows\[float32\]\[8\] must be"):
        toy_spec(matmul_rows={"float32": {8: -1.0}})
    fields = ("bandwidth", "flops_by_dtype", "op_overhead_s", "op_efficiency", "matmul_rows")
    spec = toy_spec(matmul_rows={"float32": {8: 4e8, 2: 1e8}}, source={f: "a test" for f in fields})
    assert list(spec.matmul_rows["float32"]) == [2, 8]  # sorted by rows
    assert DeviceSpec.from_dict({**spec.to_dict(), "matmul_rows": {"float32": {"2": 1e8, "8": 4e8}}}
                                ).matmul_rows == spec.matmul_rows  # JSON keys are strings
    (back,) = load_device_specs(write_device_specs(tmp_path / "r.yaml", [spec]))
    assert back.matmul_rows == {"float32": {2: 1e8, 8: 4e8}}


def test_attention_with_an_explicit_mask_is_priced_dense():
    # q [1,2,4,8], k and v [1,2,4,8]: dense 4*2*4*4*8 = 1,024 FLOPs; a causal mask keeps 10 of
    # 16 pairs (executed 640). With a [1,1,4,4] mask the kernel computes every block:
    # 1,024 / 0.25e9 = 4.096 us; without one it skips: 640 / 0.25e9 = 2.56 us (bytes: none)
    def trace(shapes):
        r = OpRecord("aten._scaled_dot_product_flash_attention_for_cpu.default", "m", F32,
                     args_from_text(shapes, F32),
                     1, 1_024, 640, read=[0] * 5, written=[0] * 5)
        return Trace(records=[r])
    spec = toy_spec(op_overhead_s={"eager": 0.0})
    masked = "[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], 0.0, False, [1, 1, 4, 4]"
    assert P.has_explicit_mask(args_from_text(masked, F32))
    assert not P.has_explicit_mask(args_from_text("[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], 0.0, True", F32))
    assert P.predict(trace(masked), spec).latency_s * 1e6 == pytest.approx(4.096)
    assert P.predict(trace("[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], 0.0, True"),
                     spec).latency_s * 1e6 == pytest.approx(2.56)


def test_eager_overhead_is_the_cold_one_when_the_step_streams_past_the_cache():
    # 5 views cost overhead only: 5 x 3 us when the step's 10,000 B exceed a 1,000 B cache,
    # 5 x 1 us when they fit in 1e6 B
    trace = Trace(records=[rec("aten.view.default", "", 5, 0, {}, {})],
                  compulsory_read=[10_000, 0, 0, 0, 0])
    overheads = {"eager": 1e-6, "eager_cold": 3e-6, "compiled": 0.5e-6}
    for cache, us in ((1e3, 15), (1e6, 5)):
        spec = toy_spec(op_overhead_s=overheads, cache_bytes=cache)
        assert P.predict(trace, spec).latency_s * 1e6 == pytest.approx(us)
        assert P.predict(trace, spec, "compiled").overhead_s == 0.0  # views fuse


def test_a_bfloat16_program_pays_its_own_dtypes_eager_cost_per_call():
    # 3 bfloat16 views and 2 float32 ones: the program computes in bfloat16 (3 of 5 calls),
    # so every call pays eager_bfloat16: 5 x 2 us = 10 us in the cache; past it (10,000 B
    # over a 1,000 B cache) the cold step adds float32's cold share, eager_cold - eager =
    # 3 - 1 = 2 us: 5 x (2 + 2) = 20 us. A float32 program: 5 x 1 and 5 x 3 us, as before.
    def trace(main_dtype):
        view = rec("aten.view.default", "", 1, 0, {}, {})
        return Trace(records=[replace(view, dtype=main_dtype, calls=3),
                              replace(view, dtype=F32, calls=2)],
                     compulsory_read=[10_000, 0, 0, 0, 0])
    overheads = {"eager": 1e-6, "eager_cold": 3e-6, "eager_bfloat16": 2e-6}
    assert A.program_dtype(trace(BF16).records) == BF16
    for main_dtype, (cold_us, warm_us) in ((BF16, (20, 10)), (F32, (15, 5))):
        for cache, us in ((1e3, cold_us), (1e6, warm_us)):
            spec = toy_spec(op_overhead_s=overheads, cache_bytes=cache, flops_by_dtype={
                torch.float32: 1e9, torch.bfloat16: 1e9})
            assert P.predict(trace(main_dtype), spec).latency_s * 1e6 == pytest.approx(us)
    # a GPU's host pays its warm figure, its own dtype's: 5 x 2 us
    gpu = toy_spec(op_overhead_s=overheads, cache_bytes=1e3, device_type="cuda")
    assert A.overhead(gpu, "eager", cold=True, dtype=BF16) == 2e-6
    assert A.overhead(gpu, "compiled", dtype=BF16) == A.DEFAULT_OVERHEAD_S["cuda"]["compiled"]


def test_elementwise_on_a_strided_view_is_priced_at_its_share_and_named():
    # a multiply of two [4, 8] halves of [4, 16] rows (strides (16, 1)): 32 FLOPs, 384 B
    # (the counter counts a view's elements); the same on dense [4, 8] tensors
    half = TensorArg((4, 8), (16, 1), F32)
    assert half.gapped and not contiguous((4, 8)).gapped
    assert not TensorArg((4, 8), (0, 1), F32).gapped  # a broadcast row is no strided view

    def trace(args):
        return Trace(records=[OpRecord("aten.mul.Tensor", "m", F32, args, 1, 32, 32,
                                       read=[0, 0, 256, 0, 0], written=[0, 0, 128, 0, 0])])
    spec = toy_spec()
    dense = P.predict(trace((contiguous((4, 8)), contiguous((4, 8)))), spec)
    strided = P.predict(trace((half, half)), spec)
    # dense: max(32 / 0.5e9, 384 / 0.5e9) = 768 ns of work (EFF elementwise 0.5 of 1 GB/s);
    # strided, no strided figure: the elementwise rate x 3/5 (each cache line half used: 2 x
    # 2 x 128 B read + 128 B written = 640 B moved for 384 counted): 384 / 0.3e9 = 1,280 ns
    assert dense.work_s == pytest.approx(768e-9) and dense.strided_s == 0
    assert strided.work_s == pytest.approx(1280e-9)
    assert strided.strided_s == pytest.approx(strided.work_s)
    assert strided.by_class == {"strided": pytest.approx(1e-6 + 1280e-9)}  # + 1 us per call
    assert "strided views at the stated 60% of the contiguous rate" in P.describe_basis(spec, strided)
    # a spec with no elementwise figure at all: the stated default 0.8 x 3/5 = 0.48
    bare = toy_spec(op_efficiency={})
    assert P.predict(trace((half, half)), bare).work_s == pytest.approx(384 / 0.48e9)
    # a measured strided curve replaces the share, and nothing is named
    curve = {"strided": {"float32": [(384.0, 0.2e9, 0.2e9, 1e9)]}}
    measured = P.predict(trace((half, half)), toy_spec(op_curves=curve))
    assert measured.work_s == pytest.approx(384 / 0.2e9) and measured.strided_s == 0
    assert "strided" not in P.describe_basis(spec, dense)
