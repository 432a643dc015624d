"""Weight-only quantization (int8, int4 groupwise), quantized KV caches and gpt-fast's model size:
every layout's bytes derived by hand, FLOPs at the executed dtype, checkpoints written by
scripts/quantize.py, and bad input ending in one line that names the value and what is valid."""
import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import randomize_, tiny_args
from perfcounter import PerformanceCounterMode, TransformerPerformanceCounter
from perfcounter.quant import ops as quant_ops
from perfcounter.quant import quantize as q
from perfcounter.cli.main import main as cli_main
from perfcounter.models.loading import fake_model, load_model, save_checkpoint
from perfcounter.models.model import Transformer
from perfcounter.models.args import ModelArgs
from perfcounter.cli.sweep import sweep
from perfcounter.trace import ROLES

REPO = Path(__file__).resolve().parents[1]
W, KV, ACT = ROLES.index("weight"), ROLES.index("kv_cache"), ROLES.index("activation")


def _load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_script("generate", REPO / "generate.py")
script = _load_script("quantize_script", REPO / "scripts" / "quantize.py")


def count(fn):
    with torch.no_grad(), PerformanceCounterMode() as mode:
        fn()
    return mode.trace()


def quant_args(**overrides):
    # dim 64, 4 heads of 16, 2 KV heads: wqkv [128, 64], wo [64, 64], w1 / w3 [128, 64],
    # w2 [64, 128], output [64, 64]; every K a multiple of 32, every N of 16 (the CPU int4 kernel)
    return tiny_args(dim=64, intermediate_size=128, **overrides)


# -- layouts, by hand ----------------------------------------------------------------------------

def test_layout_bytes():
    # int8: N·K + a 2-byte scale per row = 12·64 + 12·2 = 792
    assert q.WeightScheme("int8").nbytes(12, 64) == 792
    # int4 G=32: N·K/2 + (K/G)·N·2 values·2 bytes = 16·32 + 2·16·4 = 640
    assert q.WeightScheme("int4", 32).nbytes(16, 64) == 640
    # KV int8, 2 layers, B 1, 2 heads, 6 positions, D 16, 4-byte scales: 2·(2·1·2·6)·(16 + 4) = 960
    assert q.kv_cache_bytes(2, 1, 2, 6, 16, kv="int8", itemsize=4) == 960
    assert q.kv_cache_bytes(2, 1, 2, 6, 16, itemsize=4) == 3072  # float32: 2·24·16·4


def test_int8_linear_reads_its_stored_bytes_once():
    lin = q.quantize_model(nn.Sequential(nn.Linear(64, 32, bias=False)), "int8")[0]
    assert isinstance(lin, q.WeightOnlyInt8Linear) and lin.kernel == "fused"
    x = torch.randn(1, 3, 64)
    t = count(lambda: lin(x))
    # weight: 32·64 int8 + 32 float32 scales = 2048 + 128 = 2176, in both IO models
    assert t.per_op_read[W] == t.compulsory_read[W] == 2176
    assert t.flops == 2 * 3 * 32 * 64 + 3 * 32  # MACs + one scale mul per output = 12,384
    assert t.per_op_written[ACT] == 3 * 32 * 4  # the output, 384 B
    assert {r.dtype for r in t.records if r.flops} == {"float32"}  # executed at x's dtype


def test_int4_linear_reads_its_stored_bytes_once():
    lin = q.quantize_model(nn.Sequential(nn.Linear(64, 32, bias=False)).to(torch.bfloat16), "int4-32")[0]
    assert lin.kernel == "fused"
    x = torch.randn(1, 3, 64, dtype=torch.bfloat16)
    t = count(lambda: lin(x))
    # 32·64/2 = 1024 B of nibbles + (64/32)·32·2·2 = 256 B of scales and zeros = 1280
    assert t.per_op_read[W] == t.compulsory_read[W] == 1280
    assert t.flops == 2 * 3 * 32 * 64  # 12,288: the float matmul's
    assert {r.op for r in t.records if r.flops} == {"aten._weight_int4pack_mm_for_cpu.default"}


@pytest.mark.parametrize("dtype, stored", [(torch.float16, torch.float16),
                                           (torch.bfloat16, torch.bfloat16),
                                           (torch.float32, torch.bfloat16)])
def test_int4_scales_are_stored_in_a_16_bit_models_own_dtype(dtype, stored):
    lin = q.quantize_model(nn.Sequential(nn.Linear(64, 32, bias=False)).to(dtype), "int4-32")[0]
    assert lin.scales_and_zeros.dtype == stored
    x = torch.randn(1, 1, 64, dtype=dtype)
    t = count(lambda: lin(x))
    casts = [r for r in t.records if r.op == "aten._to_copy.default"]
    if dtype == torch.float32:  # gpt-fast's bf16 scales, cast per call: (64/32)·32·2 values
        # read as bf16 (256 B) and written as float32 (512 B)
        assert [(r.read[W], r.written[ACT]) for r in casts] == [(256, 512)]
    else:  # a 16-bit model's kernel reads them as stored: 1,024 B nibbles + 256 B, no cast
        assert casts == [] and t.per_op_read[W] == 1280


def test_int4_without_the_cpu_kernel_dequantizes_eagerly():
    lin = nn.Linear(64, 8, bias=False)  # out_features 8: not a multiple of 16, no CPU kernel
    qlin = q.quantize_model(nn.Sequential(copy.deepcopy(lin)), "int4-32")[0]
    assert qlin.kernel == "dequant"
    x = torch.randn(2, 64)
    w = quant_ops.dequantize_int4(qlin.weight, qlin.scales_and_zeros, 32, torch.float32)
    assert torch.equal(qlin(x), x @ w.t()) and (w - lin.weight).abs().max() < 0.01  # step/2
    t = count(lambda: qlin(x))
    # eager reads the 256 B of nibbles twice (& 15, // 16) and the 2·8 scales and zeros (32 B
    # each); compulsory once: 8·32 + 2·8·4 = 320 B stored
    assert (t.per_op_read[W], t.compulsory_read[W]) == (2 * 256 + 64, 320)
    assert t.per_op_written[ACT] >= 8 * 64 * 4  # the dequantized float32 copy, 2,048 B


@pytest.mark.parametrize("scheme, atol", [("int8", 0.002), ("int4-32", 0.02), ("int4-64", 0.02)])
def test_quantized_model_runs_close_to_float(scheme, atol):
    model = randomize_(Transformer(quant_args()), std=0.05)
    x = torch.randint(0, 64, (1, 5))

    def logits(m):
        m.setup_caches(1, 8)
        with torch.no_grad():
            return m(x, torch.arange(5))

    assert (logits(q.quantize_model(copy.deepcopy(model), scheme)) - logits(model)).abs().max() < atol


def test_flops_at_the_executed_dtype_bytes_as_stored():
    args = quant_args()
    model = randomize_(Transformer(args), std=0.05)
    x = torch.randint(0, 64, (1, 4))

    def prefill(m):
        m.setup_caches(1, 6)
        return count(lambda: m(x, torch.arange(4)))

    base = prefill(model)
    int8 = prefill(q.quantize_model(copy.deepcopy(model), "int8"))
    int4 = prefill(q.quantize_model(copy.deepcopy(model), "int4-32"))
    assert int4.flops == base.flops
    # int8 adds one scale mul per output: 4 tokens · (rows 128+64+128+128+64 = 512 per layer · 2
    # layers + 64 output rows = 1,088) = 4,352
    assert int8.flops == base.flops + 4 * 1088
    # linear elements per layer 8,192 + 4,096 + 3·8,192 = 36,864, ·2 layers = 73,728, + the
    # output's 4,096 = 77,824; five norms of 64 float32 = 1,280 B; 4 embedding rows 4·64·4 = 1,024 B
    linear, other = 77_824, 5 * 64 * 4 + 4 * 64 * 4
    assert base.compulsory_read[W] == linear * 4 + other  # 313,600
    assert int8.compulsory_read[W] == linear + 1088 * 4 + other  # 1 B each + f32 scales: 84,480
    assert int4.compulsory_read[W] == linear // 2 + linear // 32 * 4 + other  # 50,944


# -- KV cache ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_kv_cache_decode_bytes_with_scales(kind):
    model = q.quantize_kv_cache(randomize_(Transformer(quant_args()), std=0.05), kind)
    counter = TransformerPerformanceCounter(device_spec="h100-sxm")
    ids = torch.randint(0, 64, (1, 4))
    model.setup_caches(1, 6)  # 6 positions
    with torch.no_grad():
        model(ids, torch.arange(4))
        with counter.count("decode", num_tokens=1):
            out = model(ids[:, :1], torch.tensor([4]))
    assert torch.isfinite(out).all()
    t = counter.counts["decode"].trace
    # read per layer: k and v 1·2·6·16 = 192 B each (1 byte) + their scales 1·2·6·1·4 B = 48 each:
    # 480; two layers 960
    assert t.compulsory_read[KV] == 960
    # written per layer: one position of k and v, 2·16 = 32 B each, + scales 2·4 = 8 each: 80; ·2
    assert t.compulsory_written[KV] == t.per_op_written[KV] == 160
    att = [r for r in t.records if "quantized_kv_sdpa" in r.op]
    assert len(att) == 2 and all(r.calls == 1 for r in att)  # one record per layer


def test_kv_attention_flops_equal_a_float_cache():
    model = randomize_(Transformer(quant_args()), std=0.05)
    quantized = q.quantize_kv_cache(copy.deepcopy(model), "int8")
    x = torch.randint(0, 64, (1, 4))
    flops = []
    for m in (model, quantized):
        m.setup_caches(1, 6)
        t = count(lambda: m(x, torch.arange(4)))
        att = [r for r in t.records if "attention" in r.op or "sdpa" in r.op]
        flops.append((sum(r.flops for r in att), sum(r.executed_flops for r in att)))
    assert flops[0] == flops[1]


# -- model size (gpt-fast's _get_model_size) ------------------------------------------------------

def test_model_size_of_a_tiny_model():
    model = Transformer(quant_args())
    model.setup_caches(1, 8)
    # per layer 36,864 linear + 2·64 norm weights = 36,992 params, ·2 layers · 4 B = 295,936;
    # KV 2 layers · (k, v) · 1·2·8·16 · 4 B = 4,096; final norm 256; output 64·64·4 = 16,384;
    # the embedding and the model's own buffers (RoPE table, mask) are left out: 316,672
    assert q.model_size_bytes(model) == 316_672


# Llama-2-7B, batch 1, 5 + 200 tokens... gpt-fast allocates 208 positions (5 + 200 rounded up to
# 8): KV = 2 · 32 layers · 208 · 4096 · 2 B = 109,051,904. Linear weights 32 · (12288 + 4096 +
# 3·11008) · 4096 + 32000 · 4096 = 6,607,077,376; scale rows 32 · 42,496 + 32,000 = 1,391,872;
# norm weights 65 · 4096 = 266,240 (bf16).
LLAMA_KV = 109_051_904
LLAMA_SIZES = {
    None: (6_607_077_376 + 266_240) * 2 + LLAMA_KV,  # 13,323,739,136
    "int8": 6_607_077_376 + 1_391_872 * 2 + 266_240 * 2 + LLAMA_KV,  # 6,719,445,504
    "int4-32": 6_607_077_376 // 2 + 6_607_077_376 // 32 * 4 + 266_240 * 2 + LLAMA_KV,  # 4,239,007,744
}
PUBLISHED = {None: 13.32e9, "int8": 6.87e9, "int4-32": 4.38e9}  # gpt-fast's README, implied


@pytest.mark.parametrize("scheme", list(LLAMA_SIZES))
@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_llama_2_7b_model_size_as_derived_and_near_published(scheme):
    model, _ = fake_model(ModelArgs.from_name("llama-2-7b"), weights=scheme, dtype=torch.bfloat16)
    size = q.model_size_bytes(model, 1, 208)
    assert size == LLAMA_SIZES[scheme]
    assert abs(size / PUBLISHED[scheme] - 1) < 0.04  # 0.03 %, 2.2 %, 3.2 % under
    if scheme is not None:  # the output layer kept bf16: +131,008,000 / +180,224,000 B
        kept, _ = fake_model(ModelArgs.from_name("llama-2-7b"), weights=scheme, keep=("output",),
                             dtype=torch.bfloat16)
        assert abs(q.model_size_bytes(kept, 1, 208) / PUBLISHED[scheme] - 1) < 0.01


def test_generate_config_only_prints_the_model_size(capsys, tmp_path):
    out = gen.main(model="llama-2-7b", quantize="int8", prompt_length=5, max_new_tokens=200,
                   device_spec="a100-sxm4-80gb", quiet=False, save_path=tmp_path / "s.json")
    # 5 + 200 = 205 positions here (gpt-fast rounds up to 208): 3 positions · 2 · 32 · 4096 · 2 B less
    assert out["model_size_bytes"] == LLAMA_SIZES["int8"] - 3 * 2 * 32 * 4096 * 2
    assert abs(out["model_size_bytes"] / LLAMA_SIZES["int8"] - 1) < 0.01
    assert "Model size: 6.72 GB (int8 weights" in capsys.readouterr().out
    run = json.loads((tmp_path / "s.json").read_text())["decode"]["perfcounter"]["run"]
    assert run["model_size_bytes"] == out["model_size_bytes"] and run["quantize"] == "int8"


# -- checkpoints (scripts/quantize.py) ---------------------------------------------------------

@pytest.mark.parametrize("mode, groupsize, name", [("int8", None, "model_int8.pth"),
                                                   ("int4", 32, "model_int4.g32.pth")])
def test_quantized_checkpoint_loads_and_runs_as_quantized_in_memory(tmp_path, mode, groupsize, name):
    args = quant_args(tie_embeddings=True)
    model = randomize_(Transformer(args), std=0.05)
    save_checkpoint(tmp_path, args, model.state_dict())
    path = script.main(checkpoint_path=tmp_path, mode=mode, groupsize=groupsize)
    assert path == tmp_path / name
    loaded = load_model(path).model
    expected = q.quantize_model(copy.deepcopy(model), f"{mode}-{groupsize}" if groupsize else mode)
    assert type(loaded.output) is type(expected.output)  # the tied output quantized apart
    x = torch.randint(0, 64, (1, 5))
    outs = []
    for m in (loaded, expected):
        m.setup_caches(1, 8)
        with torch.no_grad():
            outs.append(m(x, torch.arange(5)))
    assert torch.equal(*outs)
    with pytest.raises(q.QuantizeError, match=rf"already quantized \({q.parse_scheme(name[6:-4]).name}"
                                              r"\); --mode int4-32 needs a float checkpoint"):
        script.main(checkpoint_path=path, mode="int4", groupsize=32)


def test_int4_on_an_int8_checkpoint_in_generate(tmp_path):
    args = quant_args()
    save_checkpoint(tmp_path, args, Transformer(args).state_dict())
    path = script.main(checkpoint_path=tmp_path, mode="int8")
    with pytest.raises(gen.GenerateArgumentError,
                       match=r"--quantize int4-32: the model is already quantized \(int8\); "
                             r"quantize a float checkpoint \(valid on this one: int8 or none\)"):
        gen.main(checkpoint_path=path, quantize="int4-32", prompt_length=3, max_new_tokens=2,
                 quiet=True)


# -- bad input ------------------------------------------------------------------------------------

VALID = "valid: int8, int4, int4-32, int4-64, int4-128, int4-256, fp8"


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantize="int3"), f"unknown --quantize scheme 'int3'; {VALID}"),
    (dict(quantize="int4-16"), f"unknown --quantize scheme 'int4-16'; {VALID}"),
    (dict(weight_dtype="int2"), "unknown --weight_dtype 'int2'; valid: int8, int4, bf16"),
    (dict(weight_dtype="int4", group_size=48), "--group_size 48 is not one torch's int4 kernels "
                                               "take; valid: 32, 64, 128, 256"),
    (dict(weight_dtype="int8", group_size=32), "--group_size 32 applies to --weight_dtype int4 only"),
    (dict(quantize="int8", weight_dtype="int4"), "--quantize int8 and --weight_dtype int4 disagree"),
    (dict(kv_dtype="int4"), "unknown --kv_dtype 'int4'; valid: int8, fp8, bf16"),
    (dict(act_dtype="int8"), "unknown --act_dtype 'int8'; valid: bf16"),
    (dict(act_dtype="fp16", precision="bfloat16"), "--act_dtype fp16 and --precision bfloat16 "
                                                   "disagree"),
    (dict(model="smollm2-135m", quantize="int4-256"),
     "--quantize int4-256: group size 256 does not divide in_features=576 of output; valid group "
     "sizes for this model: 32, 64"),
])
def test_generate_quantization_arguments(kwargs, message):
    base = dict(model="llama-2-7b", prompt_length=2, max_new_tokens=2, quiet=True)
    with pytest.raises(gen.GenerateArgumentError, match=message.replace("(", r"\(")
                       .replace(")", r"\)")):
        gen.main(**{**base, **kwargs})


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_cli_errors_are_one_line_exit_2(capsys):
    assert cli_main(argv=["count", "--model", "smollm2-135m", "--quantize", "int4-256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["perfcounter count: error: --quantize int4-256: group size 256 does not divide "
                   "in_features=576 of output; valid group sizes for this model: 32, 64"]
    run = subprocess.run([sys.executable, "generate.py", "--model", "llama-2-7b", "--quantize",
                          "int3", "--prompt_length", "2", "--max_new_tokens", "2", "--quiet"],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == f"generate.py: error: unknown --quantize scheme " \
                                                  f"'int3'; {VALID}"


# -- what-if bit widths from a config alone ----------------------------------------------------------

def test_count_config_and_sweep_price_the_stated_layout(tmp_path):
    from perfcounter import count_config
    args = quant_args()
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(args.__dict__))
    base = count_config(config, prompt_length=4, new_tokens=3, dtype=torch.float32)
    what_if = count_config(config, prompt_length=4, new_tokens=3, dtype=torch.float32,
                           quantize=q.weight_scheme("int4", 32), kv_dtype="int8")
    linear, other = 77_824, 5 * 64 * 4  # as in test_flops_at_the_executed_dtype_bytes_as_stored
    decode = [c.counts["decode"].trace for c in (base, what_if)]
    # a decode step reads each weight once (one embedding row 256 B); two steps
    assert decode[0].compulsory_read[W] == 2 * (linear * 4 + other + 256)
    assert decode[1].compulsory_read[W] == 2 * (linear // 2 + linear // 32 * 4 + other + 256)
    rows = sweep([str(config)], [1], [4], [3], ["h100-sxm"], dtype=torch.float32,
                 quantize=[None, "int8"], kv_dtypes=[None, "int8"])
    assert [(r["weights"], r["kv_dtype"]) for r in rows[::2]] == [
        ("float", "float"), ("float", "int8"), ("int8", "float"), ("int8", "int8")]
    # stored weights: float 4 B a parameter; int8 1 B a linear weight + 4 B scales per row
    params = linear + 5 * 64 + 64 * 64  # + the embedding table
    assert rows[0]["weights_bytes"] == params * 4
    assert rows[4]["weights_bytes"] == linear + 1088 * 4 + (5 * 64 + 64 * 64) * 4
    # KV over 7 positions: float (k, v) 2 · 2 layers · 1 · 2 heads · 7 · 16 · 4 B = 3,584;
    # int8 2 · (2 · 1 · 2 · 7) · (16 + 4 B of scale) = 1,120
    assert [rows[i]["kv_cache_bytes"] for i in (0, 2)] == [3584, 1120]
