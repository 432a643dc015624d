"""serve with quantized weights and KV caches: memory by hand, the step table against counting
the quantized model, the CLI's flags and refusals."""
import dataclasses
import json

import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.cli.main import build_parser
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.predict import gemv_weight
from perfcounter.quant.quantize import SCHEME_CHOICES, WeightScheme, parse_scheme
from perfcounter.cli import serve as command
from perfcounter.serve import (
    cache_clear,
    cache_info,
    deployment,
    kv_bytes_per_token,
    memory_plan,
    serve,
    step_table,
    synthetic,
)
from perfcounter.serve.memory import weight_bytes
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import features

# head_dim 32 / 4 = 8; wqkv [64, 32], wo [32, 32], w1 / w3 [64, 32], w2 [32, 64], output [64, 32]
TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
TINY_JSON = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
             "dim": 32, "intermediate_size": 64}
HELD_OUT = ([(64, 64)], [(1, 300), (1, 17), (48, 0), (12, 100)], [(200, 37), (1, 3)])
LLAMA3_8B = ModelArgs.from_name("llama-3-8b")


def test_kv_bytes_per_token_by_hand():
    # bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B
    assert kv_bytes_per_token(LLAMA3_8B, torch.bfloat16) == 131_072
    # int8 / fp8 (quantize.kv_cache_bytes): 1 B an element + a bf16 scale per token and KV
    # head: 2 x 32 x 8 x (128 x 1 + 2) = 66,560 B, 0.508 of bf16
    assert kv_bytes_per_token(LLAMA3_8B, torch.bfloat16, "int8") == 66_560
    assert kv_bytes_per_token(LLAMA3_8B, torch.bfloat16, "fp8") == 66_560
    # under float32 activations the scale is 4 B: 2 x 32 x 8 x (128 + 4) = 67,584
    assert kv_bytes_per_token(LLAMA3_8B, torch.float32, "int8") == 67_584


def test_int4_weight_bytes_by_hand():
    s = WeightScheme("int4", 32)
    # int4-32 [N, K]: N K / 2 + (K / 32) N x 2 (scale, zero) x 2 B (WeightScheme.nbytes)
    # TINY: wqkv 64 x 32 / 2 + 1 x 64 x 4 = 1,280; wo 512 + 128 = 640; w1, w3 1,280 each;
    # w2 1,024 + 2 x 32 x 4 = 1,280: 5,760 a layer + 2 norms x 32 x 2 B = 5,888;
    # embedding 64 x 32 x 2 = 4,096, final norm 64, output (quantized too) 1,280
    linears = s.nbytes(64, 32) + s.nbytes(32, 32) + 2 * s.nbytes(64, 32) + s.nbytes(32, 64)
    assert linears == 5_760
    assert weight_bytes(TINY, torch.bfloat16, s) == 2 * 5_888 + 4_096 + 64 + 1_280 == 17_216
    # Llama-3-8B: per layer wqkv 12,582,912 + 3,145,728, wo 8,388,608 + 2,097,152, w1 / w3 / w2
    # 29,360,128 + 7,340,032 each, norms 16,384: 136,331,264 x 32 = 4,362,600,448; embedding
    # 128,256 x 4,096 x 2 = 1,050,673,152; final norm 8,192; output 262,668,288 + 65,667,072
    assert weight_bytes(LLAMA3_8B, torch.bfloat16, s) == 5_741_617_152
    # float: the parameters x 2 B, as before
    assert weight_bytes(LLAMA3_8B, torch.bfloat16) == 8_030_261_248 * 2


def test_plan_holds_the_larger_kv_cache():
    spec = get_device_spec("h100-sxm")
    bf16 = memory_plan(LLAMA3_8B, torch.bfloat16, spec)
    quant = memory_plan(LLAMA3_8B, torch.bfloat16, spec, weights=parse_scheme("int4-32"),
                        kv="int8")
    # workspace 8,192 x (4,096 + max(2 x 4,096 + 2 x 1,024, 3 x 14,336)) x 2 + 256 x 128,256
    # x 4 = 903,086,080; 0.9 x 85.52e9 (81559 MiB) = 76.968e9 usable; bf16:
    # (76.968e9 - 16,060,522,496 - 903,086,080) / (16 x 131,072) = 28,612.3
    assert bf16.kv_blocks == 28_612
    # int4-32 + int8 KV (a scale per token and head): (76.968e9 - 5,741,617,152
    # - 903,086,080) / (16 x 66,560) = 66,033.7 -> 66,033 blocks x 16 = 1,056,528 tokens
    assert quant.weight_bytes == 5_741_617_152 and quant.kv_bytes_per_token == 66_560
    assert quant.kv_blocks == 66_033 and quant.kv_tokens == 1_056_528


@pytest.mark.parametrize("weights, kv", [("int4-32", "int8"), ("int8", "fp8")])
def test_held_out_quantized_steps_match_counting(weights, kv):
    scheme = parse_scheme(weights)
    table = step_table(TINY, torch.bfloat16, RooflinePricer(get_device_spec("h100-sxm")),
                       weights=scheme, kv=kv)
    assert (table.counts.weights, table.counts.kv) == (weights, kv)
    for shape in HELD_OUT:
        counted = count_step(TINY, [Piece(*p) for p in shape], weights=scheme, kv=kv)
        model = table.counts.totals(features(shape))
        for name, want in (("flops", counted.flops), ("bytes", counted.per_op_bytes)):
            assert model[name] == pytest.approx(want, rel=1e-9), name
        # the KV cache read by attention is the quantized one: 1 B an element + its scales
        assert any(r.op.startswith("perfcounter.quantized_kv_sdpa") for r in counted.records)


def test_decode_weight_bytes_drop_by_the_weight_ratio():
    pricer = RooflinePricer(get_device_spec("h100-sxm"))
    bf16 = step_table(TINY, torch.bfloat16, pricer)
    int4 = step_table(TINY, torch.bfloat16, pricer, weights=parse_scheme("int4-32"))
    decode = features([(1, 100)])
    # bf16: 2 layers x (9,216 linear params x 2 B + 128 B norms) + output 4,096 + final norm
    # 64 + one embedding row 64 = 41,344; int4-32: 2 x (5,760 + 128) + 1,280 + 64 + 64 = 13,184
    # (the linears' 2 B an element -> 0.5 + 4 / 32 = 0.625 B: a ratio of 0.3125)
    assert bf16.counts.totals(decode)["read"][0] == pytest.approx(41_344)
    assert int4.counts.totals(decode)["read"][0] == pytest.approx(13_184)
    assert bf16.seconds(decode) > int4.seconds(decode)  # fewer bytes at the memory roofline
    # a prediction prices these GEMVs by their weight's dtype (predict.gemv_weight)
    linear = [k for k in int4.counts.keys if k.op.startswith("aten._weight_int4pack_mm")]
    assert linear and all(gemv_weight(int4.counts.sample[k])[0] == "gemv_int4" for k in linear)


def test_deployment_serves_quantized_and_says_so():
    dep = deployment(TINY, "h100-sxm", quantize="int4-32", kv_dtype="int8",
                     execution="cudagraphs")
    assert dep.precision == "bfloat16, weights int4-32, KV int8"
    result = serve(dep, synthetic(20, 64, 8, qps=5, seed=0))
    d = result.to_dict()
    assert d["weights"] == "int4-32" and d["kv_dtype"] == "int8"
    # 2 layers x K and V x 2 KV heads x 8 x 1 B: vLLM's scales are per tensor (engines.py)
    assert d["memory"]["kv_bytes_per_token"] == 2 * 2 * 2 * 8
    assert result.metrics["completed"] == 20


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_quant") / "tiny.json"
    path.write_text(json.dumps(TINY_JSON))
    return path


def run(*argv):
    try:
        args = build_parser().parse_args(["serve", "--device_spec", "h100-sxm",
                                          *(str(a) for a in argv)])
    except SystemExit as exc:
        return exc.code
    return command.run(args)


def test_cli_plan_shows_the_larger_kv_capacity(capsys, config):
    assert run("--model", config, "--plan") == 0
    plain = capsys.readouterr().out
    assert run("--model", config, "--plan", "--weight_dtype", "int4", "--group_size", "32",
               "--kv_dtype", "int8") == 0
    quant = capsys.readouterr().out
    assert "(bfloat16, weights int4-32, KV int8)" in quant
    # KV a token: bf16 2 x 2 x 2 x 8 x 2 = 128 B; int8 2 x 2 x 2 x 8 x 1 B = 64 B (vLLM's
    # scales: one a layer's K and V)
    assert "128 B a token" in plain and "64 B a token" in quant

    def tokens(text):
        line = next(x for x in text.splitlines() if "KV cache" in x)
        return int(line.split("= ")[1].split(" tokens")[0].replace(",", ""))
    assert tokens(quant) > tokens(plain) * 1.5


@pytest.mark.parametrize("flags, expected", [
    (["--quantize", "int5"], "unknown --quantize scheme 'int5'"),
    (["--kv_dtype", "int4"], "unknown --kv_dtype 'int4'"),
    (["--weight_dtype", "int8", "--group_size", "32"], "applies to --weight_dtype int4 only"),
    (["--quantize", "int8", "--weight_dtype", "int4"], "disagree"),
    (["--quantize", "int4-64"], "group size 64 does not divide in_features=32"),
])
def test_bad_quantization_one_line_before_any_work(capsys, config, flags, expected):
    cache_clear()
    code = run("--model", config, "--qps", "1", "--num_requests", "5", *flags)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and expected in err, err
    assert cache_info().misses == 0  # refused before any step table was counted


# every linear's in_features (256, 512) a multiple of every int4 group size
WIDE = ModelArgs(block_size=1024, vocab_size=64, n_layer=1, n_head=4, n_local_heads=2, dim=256,
                 intermediate_size=512)


@pytest.mark.parametrize("name", SCHEME_CHOICES)
def test_every_scheme_quantize_takes_serves(name):
    # whatever schemes quantize.parse_scheme accepts, serve accepts: stored bytes fit, a
    # decode reads fewer weight bytes than in bf16 and its FLOPs are counted
    dep = deployment(WIDE, "h100-sxm", quantize=name, execution="bound")
    scheme = parse_scheme(name)
    assert dep.weights == scheme and dep.plan.weight_bytes == weight_bytes(WIDE, torch.bfloat16,
                                                                           scheme)
    plain = deployment(WIDE, "h100-sxm", execution="bound")
    decode = features([(1, 50)])
    assert dep.plan.weight_bytes < plain.plan.weight_bytes
    assert dep.table.counts.totals(decode)["read"][0] < plain.table.counts.totals(decode)["read"][0]
    counted = count_step(WIDE, [Piece(1, 50)], weights=scheme)
    assert dep.table.counts.totals(decode)["flops"] == pytest.approx(counted.flops, rel=1e-9)


def test_llama3_8b_decode_weight_bytes_by_hand():
    pricer = RooflinePricer(get_device_spec("h100-sxm"))
    bf16 = step_table(LLAMA3_8B, torch.bfloat16, pricer).counts
    int4 = step_table(LLAMA3_8B, torch.bfloat16, pricer, weights=parse_scheme("int4")).counts
    decode = features([(1, 512)])
    # bf16: every weight but the embedding table (16,060,522,496 - 1,050,673,152) + the one
    # embedding row a token reads (4,096 x 2 B) = 15,009,857,536 B
    assert bf16.totals(decode)["read"][0] == pytest.approx(15_009_857_536)
    # int4 (G = 128): a layer wqkv 12,582,912 + 786,432, wo 8,388,608 + 524,288, w1 / w3 / w2
    # 29,360,128 + 1,835,008 each, norms 16,384: 115,884,032 x 32 = 3,708,289,024; output
    # 262,668,288 + 16,416,768; final norm and the embedding row 8,192 each: 3,987,390,464 B,
    # 0.2657 of bf16 (the linears' (0.5 + 4/128) / 2 = 0.2656)
    assert int4.totals(decode)["read"][0] == pytest.approx(3_987_390_464)
    assert int4.totals(decode)["flops"] == pytest.approx(bf16.totals(decode)["flops"], rel=1e-3)


@pytest.mark.parametrize("weights", ["int8", "int4-32"])
def test_quantized_experts_are_predicted_as_predict_prices_the_counted_step(weights):
    # a mixture of experts' quantized experts run one kernel per touched expert on its share of
    # the rows (quant/experts.py): calls of one group with different rows in a step (24 tokens,
    # 48 routed rows over 8 experts: 6 each; (1, 5) + (1, 9) + (1, 20): 6 rows, 1 each). The
    # table prices each call at T k / experts touched rows: as predict() prices the counted
    # step, where the rows T k spreads evenly (counting without data) agree with that share
    from perfcounter.serve.predicted import PredictionPricer
    from perfcounter.serve.steps import counted_features
    moe = dataclasses.replace(TINY, num_experts=8, num_activated_experts=2)
    scheme = parse_scheme(weights)
    for execution in ("eager", "cudagraphs"):
        table = step_table(moe, torch.bfloat16, PredictionPricer(get_device_spec("h100-sxm"),
                                                                 execution), weights=scheme)
        assert table.per_expert.any()
        for shape in ([(24, 0)], [(1, 5), (1, 9), (1, 20)], [(1, 300)]):
            counted = count_step(moe, [Piece(*p) for p in shape], weights=scheme)
            seen = counted_features(shape, None, table.counts.experts)
            assert table.seconds(seen) == pytest.approx(table.price_trace(counted), rel=1e-6)
