"""fp8 (W8A8, TensorRT-LLM's FP8): the scheme's name and its refusal of bad names, an fp8
linear's stored bytes and FLOPs, the activation quantization's bytes, aten._scaled_mm's formula,
and a toy fp8 GEMM priced at its device's fp8 peak: every number derived by hand."""
import json
import warnings

import pytest
import torch
from conftest import tiny_args
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from perfcounter import PerformanceCounterMode, TransformerPerformanceCounter
from perfcounter._util import PerfcounterWarning
from perfcounter.cli.main import main as cli_main
from perfcounter.costs.elementwise import fp8_cast_cost
from perfcounter.costs.matmul import scaled_mm_cost
from perfcounter.costs.reductions import fp8_scale_cost
from perfcounter.devices import DeviceSpec
from perfcounter.generation.config_only import greedy_generate
from perfcounter.generation.derive import count_generation
from perfcounter.models.loading import fake_model
from perfcounter.pricing import predict as P
from perfcounter.pricing.achievable import DEFAULT_EFFICIENCY
from perfcounter.pricing.roofline import roofline
from perfcounter.quant import quantize as q
from perfcounter.quant.fp8 import Float8Linear
from perfcounter.trace import KINDS, ROLES, OpRecord, Trace, args_from_text

W = ROLES.index("weight")
VALID = "valid: int8, int4, int4-32, int4-64, int4-128, int4-256, fp8"


def kinds(**counts) -> tuple:
    return tuple(counts.get(k, 0) for k in KINDS)


# -- the scheme ------------------------------------------------------------------------------

def test_scheme_name_and_stored_bytes():
    for text in ("fp8", "FP8", " float8 "):
        assert q.parse_scheme(text) == q.WeightScheme("fp8")
    assert q.parse_scheme("fp8").name == "fp8"
    # N·K weights of one byte + one float32 scale per tensor: 5·6 + 4 = 34
    assert q.WeightScheme("fp8").nbytes(5, 6) == 34
    assert q.resolve_scheme("fp8") == q.WeightScheme("fp8")


@pytest.mark.parametrize("bad", ["fp9", "fp8-32", "e5m2", "float8_e5m2"])
def test_bad_scheme_names_are_refused_in_one_line(bad):
    with pytest.raises(q.QuantizeError) as e:
        q.parse_scheme(bad)
    assert str(e.value) == f"unknown --quantize scheme {bad!r}; {VALID}"


def test_cli_refuses_a_bad_scheme_one_line_exit_2(capsys):
    assert cli_main(argv=["count", "--model", "llama-2-7b", "--quantize", "fp9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"perfcounter count: error: unknown --quantize scheme 'fp9'; {VALID}"]


def test_count_says_the_linears_run_in_fp8(tmp_path, capsys):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_args(dim=64, intermediate_size=128).__dict__))
    assert cli_main(argv=["count", "--model", str(config), "--quantize", "fp8", "--precision",
                          "bf16", "--prompt_length", "4", "--max_new_tokens", "2"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("weights fp8"))
    assert "FLOPs at bfloat16;" in line and line.endswith("at float8_e4m3fn (W8A8)")


# -- the formulas ------------------------------------------------------------------------------

def test_scaled_mm_formula():
    # [4, 6] @ [6, 5]: 4·5·6 = 120 MACs = 240 FLOPs; per-tensor scales: 1 mul per output (20)
    assert scaled_mm_cost((4, 6), (6, 5), (), ()).kinds == kinds(add=120, mul=140)
    # a bias: 20 adds more
    assert scaled_mm_cost((4, 6), (6, 5), (), (), (5,)).kinds == kinds(add=140, mul=140)
    # row-wise scales [4, 1] and [1, 5]: 2 muls per output (40)
    assert scaled_mm_cost((4, 6), (6, 5), (4, 1), (1, 5)).kinds == kinds(add=120, mul=160)


def test_activation_quantization_formulas():
    # abs-max of 24 elements: 24 cmp (abs) + 23 cmp (max) + 1 div (/ 448)
    assert fp8_scale_cost((4, 6), out_shape=()).kinds == kinds(cmp=47, div=1)
    # the cast of 24 elements: 24 mul, 48 cmp (saturate both ways), 1 div (the reciprocal)
    assert fp8_cast_cost((4, 6), (), out_shape=(4, 6)).kinds == kinds(mul=24, cmp=48, div=1)


# -- an fp8 linear, counted ----------------------------------------------------------------------

def _count_linear(fake: bool):
    # x [4, 6] bfloat16 -> y [4, 5]: M 4, K 6, N 5
    torch.manual_seed(0)
    with FakeTensorMode() if fake else torch.device("cpu"):
        lin = nn.Linear(6, 5, bias=False, dtype=torch.bfloat16)
        qlin = Float8Linear.from_linear(lin)
        x = torch.randn(4, 6, dtype=torch.bfloat16)
        with torch.no_grad(), PerformanceCounterMode() as mode:
            y = qlin(x)
    return lin, qlin, x, y, mode.trace()


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_fp8_linear_bytes_and_flops(fake):
    _, qlin, _, y, trace = _count_linear(fake)
    assert qlin.weight.dtype == torch.float8_e4m3fn and qlin.weight_scale.shape == ()
    assert y.shape == (4, 5) and y.dtype == torch.bfloat16
    recs = {r.op: r for r in trace.records if sum(r.read) or sum(r.written)}  # views move 0 B
    assert list(recs) == ["perfcounter.fp8_scale.default", "perfcounter.fp8_cast.default",
                          "aten._scaled_mm.default"]
    scale, cast, mm = recs.values()
    # abs-max: reads x, 4·6 bf16 = 48 B; writes one float32 scale, 4 B; 47 cmp + 1 div
    assert (sum(scale.read), sum(scale.written), scale.flops) == (48, 4, 48)
    # cast: reads x (48 B) and the scale (4 B), writes 24 fp8 bytes; 24 mul + 48 cmp + 1 div
    assert (sum(cast.read), sum(cast.written), cast.flops) == (52, 24, 73)
    # matmul: the weight as stored, 5·6 fp8 bytes + its 4-byte scale = 34 B of weight; the fp8
    # activation 24 B and its scale 4 B; writes y, 4·5 bf16 = 40 B;
    # 2·4·5·6 = 240 FLOPs + 20 scale muls = 260, at float8_e4m3fn
    assert mm.dtype == "float8_e4m3fn"
    assert mm.read[W] == 34 and sum(mm.read) == 34 + 28 and sum(mm.written) == 40
    assert mm.flops == 260


def test_fp8_linear_runs_close_to_float_on_a_cpu():
    lin, _, x, y, _ = _count_linear(False)
    ref = lin(x).float()
    # e4m3 keeps 3 mantissa bits: each operand within 2^-4 relative, so y within ~1/8 of max|y|
    assert (y.float() - ref).abs().max() <= 0.125 * ref.abs().max()


def test_quantize_model_and_its_scheme():
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3, bias=False))
    q.quantize_model(model, "fp8")
    assert all(isinstance(m, Float8Linear) for m in model)
    assert q.quantized_scheme(model) == q.WeightScheme("fp8")
    assert model[0].bias is not None and model[1].bias is None
    # stored: (5·6 + 4) + 5 float32 bias values (20) + (3·5 + 4) = 73 bytes
    assert q.model_size_bytes(model) == 34 + 20 + 19


def test_a_config_only_fp8_model_derived_as_counted():
    # dim 64, 3 layers: wqkv [128, 64], wo [64, 64], w1 / w3 [128, 64], w2 [64, 128] a layer,
    # output [64, 64]; fp8 weights and KV cache, bfloat16 activations, 5 decode steps
    args = tiny_args(dim=64, intermediate_size=128, n_layer=3)

    def run(**kw):
        counter = TransformerPerformanceCounter(depth=10)
        count_generation(args, counter, prompt_length=4, max_new_tokens=6, dtype=torch.bfloat16,
                         generate=greedy_generate, make_model=lambda a: fake_model(
                             a, weights="fp8", kv="fp8", dtype=torch.bfloat16), **kw)
        return counter

    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfcounterWarning)  # no derivation falls back
        derived = run()
    counted = run(every_layer=True, every_step=True)
    for label in ("prefill", "decode"):
        a, b = derived.counts[label].trace, counted.counts[label].trace
        assert (a.flops, a.per_op_bytes, a.compulsory_read, a.compulsory_written,
                a.fused_read, a.fused_written) == \
            (b.flops, b.per_op_bytes, b.compulsory_read, b.compulsory_written,
             b.fused_read, b.fused_written)
    # a decode step reads each weight once: linears 3·36,864 + 4,096 = 114,688 fp8 bytes and
    # 16 float32 scales (64 B), 7 bf16 norms of 64 (896 B), one bf16 embedding row (128 B)
    decode = derived.counts["decode"].trace
    assert decode.steps == 5 and decode.compulsory_read[W] == 5 * (114_688 + 64 + 896 + 128)


# -- pricing -----------------------------------------------------------------------------------

def toy_spec(**kw) -> DeviceSpec:
    # bf16 peak 1 TFLOP/s, fp8 2 TFLOP/s, 1 TB/s; no fixed cost (none a kernel either);
    # GEMM at half its peak
    args = {"device_type": "cuda", "name": "toy-fp8", "bandwidth": 1e12, "dtype": torch.bfloat16,
            "flops_by_dtype": {torch.bfloat16: 1e12, torch.float8_e4m3fn: 2e12},
            "op_overhead_s": {"eager": 0.0, "compiled": 0.0, "cudagraphs": 0.0, "kernel": 0.0},
            "op_efficiency": {"gemm": 0.5}}
    return DeviceSpec(**{**args, **kw})


def scaled_mm_trace(m: int, dtype: str = "float8_e4m3fn") -> Trace:
    # x [m, 1024] fp8 @ W [1024, 1024] fp8: 2·m·1024·1024 FLOPs + m·1024 scale muls;
    # reads W (1,048,576 B) + its scale (4) as weight, x (m·1024 B) + its scale (4);
    # writes y, m·1024 bf16 = 2·m·1024 B
    flops = 2 * m * 1024 * 1024 + m * 1024
    read = [1_048_580, 0, m * 1024 + 4, 0, 0]
    rec = OpRecord("aten._scaled_mm.default", "m", dtype,
                   args_from_text(f"[{m}, 1024], [1024, 1024]", dtype), 1, flops, flops,
                   read=read, written=[0, 0, 2 * m * 1024, 0, 0])
    return Trace(records=[rec], compulsory_read=read, compulsory_written=[0, 0, 2 * m * 1024, 0, 0])


def test_a_toy_fp8_gemm_is_priced_at_the_fp8_peak():
    spec = toy_spec()
    # 256 rows: 2·256·1024·1024 + 256·1024 = 537,133,056 FLOPs; bytes 1,048,580 + 262,148 +
    # 524,288 = 1,835,016
    (p,) = P.op_predictions(scaled_mm_trace(256), spec)
    assert p.op_class == "gemm"
    # compute 537,133,056 / (0.5 x 2e12) = 537.133 us; memory 1,835,016 / (0.5 x 1e12) = 3.67 us
    assert p.latency_s * 1e6 == pytest.approx(537.133056)
    # the bound: at the fp8 peak, 537,133,056 / 2e12 = 268.57 us
    assert roofline(scaled_mm_trace(256), spec).latency_s * 1e6 == pytest.approx(268.566528)
    # the same record in bfloat16 runs at the bf16 peak: twice the time
    (b,) = P.op_predictions(scaled_mm_trace(256, "bfloat16"), spec)
    assert b.latency_s == pytest.approx(2 * p.latency_s)


def test_an_fp8_gemv_has_its_own_stated_efficiency():
    spec = toy_spec(bandwidth=1e9)
    (p,) = P.op_predictions(scaled_mm_trace(1), spec)
    # one row: W8A8 streams its weight as an fp8 GEMV, not as the weight-only int8 kernel
    assert p.op_class == "gemv_fp8" and p.basis == "default"
    # bytes 1,048,580 + 1,028 + 2,048 = 1,051,656 at 0.81 x 1 GB/s (no silent 100 %)
    e = DEFAULT_EFFICIENCY["gemv_fp8"]
    assert e == 0.81 and DEFAULT_EFFICIENCY["gemv_int8"] < e < 1
    assert p.latency_s == pytest.approx(1_051_656 / (e * 1e9))
    # a spec's own sourced figure replaces the default
    (own,) = P.op_predictions(scaled_mm_trace(1), toy_spec(bandwidth=1e9, op_efficiency={
        "gemv_fp8": 0.5}))
    assert own.basis == "efficiency" and own.latency_s == pytest.approx(1_051_656 / 0.5e9)
