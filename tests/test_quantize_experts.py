"""Quantized mixture-of-experts weights (perfcounter/quant/experts.py): a tiny mixtral-like model
(E = 4 experts, top-2, dim 64, intermediate 128, 2 layers) quantized int8, int4-32 and fp8 — its
experts' stored bytes, a decode step's weight bytes (each touched expert read once as stored),
FLOPs as the float model's, a real run's counts equal to a fake run of the same routing, outputs
close to the float model's, checkpoints, parameter counts and `perfcounter count`, by hand.

Per expert, w1 and w3 are [N, K] = [128, 64] and w2 [64, 128] (8,192 elements each):
  int8:    8,192 B + a bf16 scale per row: w1, w3 8,192 + 256 = 8,448; w2 8,192 + 128 = 8,320
  int4-32: 4,096 B of nibbles + (K/32)·N·2·2 B: w1, w3 4,096 + 2·128·4 = 5,120; w2 4,096 + 4·64·4
           = 5,120
  fp8:     8,192 B + one float32 scale: 8,196 each
so an expert is 25,216 B (int8), 15,360 B (int4-32), 24,588 B (fp8), 49,152 B (bf16)."""
import copy
import dataclasses
import json

import pytest
import torch

from conftest import randomize_, tiny_args
from perfcounter import PerformanceCounterMode, TransformerPerformanceCounter, get_device_spec
from perfcounter.cli.main import main as cli_main
from perfcounter.counting.op_data import ExpertLoad
from perfcounter.generation.config_only import count_config_only, greedy_generate, routed
from perfcounter.generation.derive import count_generation
from perfcounter.models.args import ModelArgs
from perfcounter.models.loading import build_model, fake_model
from perfcounter.models.model import Transformer, count_params
from perfcounter.quant import experts as moe
from perfcounter.quant import quantize as q
from perfcounter.quant.stored import stored_nbytes
from perfcounter.serve import step_table
from perfcounter.serve.memory import weight_bytes
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import counted_features
from perfcounter.trace import ROLES

W = ROLES.index("weight")
PER_EXPERT = {None: 49_152, "int8": 25_216, "int4-32": 15_360, "fp8": 24_588}
SCHEMES = ("int8", "int4-32", "fp8")
KERNELS = {"int8": "aten._weight_int8pack_mm.default",
           "int4-32": "aten._weight_int4pack_mm_for_cpu.default", "fp8": "aten._scaled_mm.default"}


def mix_args(**overrides) -> ModelArgs:
    return tiny_args(**{"dim": 64, "intermediate_size": 128, "num_experts": 4,
                        "num_activated_experts": 2, **overrides})


def count(fn):
    with torch.no_grad(), PerformanceCounterMode() as mode:
        fn()
    return mode.trace()


def experts_of(model):
    return [layer.feed_forward.cond_ffn for layer in model.layers]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_stored_bytes_per_scheme(scheme):
    model = q.quantize_model(randomize_(Transformer(mix_args()), std=0.05).to(torch.bfloat16),
                             scheme)
    ffn = experts_of(model)[0]
    assert isinstance(ffn, moe.QuantizedExperts) and q.quantized_scheme(model) == \
        q.parse_scheme(scheme)
    stored = sum(stored_nbytes(p) for p in ffn.parameters())
    # int8: E·N·K + E·N·2 B: w1, w3 4·128·64 + 4·128·2 = 33,792; w2 4·64·128 + 4·64·2 = 33,280
    # int4-32: E·N·K/2 + E·(K/32)·N·2·2 B: w1, w3 16,384 + 4·2·128·4 = 20,480; w2 16,384 + 4·4·64·4
    # fp8: E·N·K + 4·E B: 32,784 each. All three: 4 experts · PER_EXPERT
    assert stored == {"int8": 2 * 33_792 + 33_280, "int4-32": 3 * 20_480,
                      "fp8": 3 * 32_784}[scheme] == 4 * PER_EXPERT[scheme]
    one = q.parse_scheme(scheme)
    assert stored == 4 * (2 * one.nbytes(128, 64) + one.nbytes(64, 128))  # E linears' bytes
    if scheme == "int4-32":
        assert all(ffn_w.kernel == "fused" for ffn_w in (ffn.w1, ffn.w2, ffn.w3))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_sizes_and_parameter_counts_as_stored(scheme):
    args = mix_args()
    float_model, _ = fake_model(args, dtype=torch.bfloat16)
    model, _ = fake_model(args, dtype=torch.bfloat16, weights=scheme)
    # parameters stay N·K whatever the storage: active, total as the float model's
    assert count_params(model) == count_params(float_model)
    # every expert of both layers stored smaller: 2 layers · 4 experts · (49,152 - PER_EXPERT)
    saved = 8 * (PER_EXPERT[None] - PER_EXPERT[scheme])
    linears = q.model_size_bytes(float_model) - q.model_size_bytes(model) - saved
    dense, _ = fake_model(tiny_args(dim=64, intermediate_size=128), dtype=torch.bfloat16)
    dense_q, _ = fake_model(tiny_args(dim=64, intermediate_size=128), dtype=torch.bfloat16,
                            weights=scheme)
    float_wb, wb = weight_bytes(args, torch.bfloat16), weight_bytes(args, torch.bfloat16, scheme)
    assert float_wb - wb == saved + linears  # serve's memory fit: the same stored bytes
    assert linears > 0 and linears < q.model_size_bytes(dense) - q.model_size_bytes(dense_q)


def _decode(model, fake_mode=None):
    def step():
        model.setup_caches(1, 8)
        return count(lambda: model(torch.zeros(1, 1, dtype=torch.int64), torch.tensor([4])))
    if fake_mode is None:
        return step()
    with fake_mode:
        return step()


def _experts(trace):
    return [r for r in trace.records if "cond_ffn" in r.module]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_decode_reads_each_touched_expert_once_as_stored(scheme):
    base = _decode(*fake_model(mix_args(), dtype=torch.bfloat16))
    t = _decode(*fake_model(mix_args(), dtype=torch.bfloat16, weights=scheme))
    # one token, top-2: 2 experts a layer, 2 layers: int8 4 · 25,216 = 100,864;
    # int4-32 4 · 15,360 = 61,440; fp8 4 · 24,588 = 98,352 (bf16: 196,608)
    assert sum(r.read[W] for r in _experts(t)) == 4 * PER_EXPERT[scheme]
    assert sum(r.read[W] for r in _experts(base)) == 4 * PER_EXPERT[None]
    kernels = [r for r in _experts(t) if r.op == KERNELS[scheme]]
    assert sum(r.calls for r in kernels) == 3 * 2 * 2  # w1, w3, w2 of 2 experts, 2 layers
    assert sum(r.read[W] for r in kernels) == 4 * PER_EXPERT[scheme]
    # FLOPs: the float matmuls' 2·M·N·K = 2·1·128·64 per weight, 3 weights, 4 expert-rows =
    # 196,608, at bf16; int8 and fp8 add a scale mul per output (128 + 128 + 64) · 4 = 1,280
    matmuls = sum(r.flops for r in kernels)
    assert matmuls == 196_608 + (0 if scheme == "int4-32" else 1_280)
    if scheme != "fp8":  # the experts' FLOPs are the float model's (+ int8's scale muls)
        assert sum(r.flops for r in _experts(t)) == \
            sum(r.flops for r in _experts(base)) + (0 if scheme == "int4-32" else 1_280)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_real_run_counts_as_a_fake_run_of_the_same_routing(scheme):
    args = mix_args()
    real = q.quantize_model(randomize_(Transformer(args), std=0.05).to(torch.bfloat16), scheme)
    ffn = experts_of(real)[0]
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 2], [2, 3], [0, 2]])  # rows per expert 2, 0, 3, 1
    t_real = count(lambda: ffn(x, idx))
    fake, fake_mode = fake_model(args, dtype=torch.bfloat16, weights=scheme)
    fake_ffn = experts_of(fake)[0]
    fake_ffn.routing = ExpertLoad([2, 0, 3, 1])
    assert fake_ffn.rows_per_expert(6) == [2, 0, 3, 1]
    with fake_mode:
        fx, fidx = torch.empty(3, 64, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.int64)
        t_fake = count(lambda: fake_ffn(fx, fidx))
    # 3 experts read, each once: 3 · PER_EXPERT, in both IO models
    for t in (t_real, t_fake):
        assert t.per_op_read[W] == t.compulsory_read[W] == 3 * PER_EXPERT[scheme]

    def work(t):  # the kernels' and SwiGLU's FLOPs (the real run's routing compares are data)
        return sorted((r.op, r.calls, r.flops) for r in t.records
                      if r.flops and not r.op.startswith("aten.eq"))
    assert work(t_real) == work(t_fake)
    # 2·6 rows·(128·64·3) = 294,912 matmul FLOPs (+ int8 / fp8 scale muls: 6 · 320 = 1,920)
    assert sum(f for op, _, f in work(t_fake) if op == KERNELS[scheme]) == \
        294_912 + (0 if scheme == "int4-32" else 1_920)


def test_real_and_fake_decode_steps_read_the_same_weight_bytes():
    args = mix_args()
    real = q.quantize_model(randomize_(Transformer(args), std=0.05).to(torch.bfloat16), "int4-32")
    t_real, t_fake = _decode(real), _decode(*fake_model(args, dtype=torch.bfloat16,
                                                        weights="int4-32"))
    assert t_real.compulsory_read[W] == t_fake.compulsory_read[W]
    assert t_real.per_op_read[W] == t_fake.per_op_read[W]


@pytest.mark.parametrize("scheme, atol", [("int8", 0.002), ("int4-32", 0.02), ("fp8", 0.02)])
def test_quantized_experts_run_close_to_float(scheme, atol):
    model = randomize_(Transformer(mix_args()), std=0.05)
    x = torch.randint(0, 64, (1, 5))

    def logits(m):
        m.setup_caches(1, 8)
        with torch.no_grad():
            return m(x, torch.arange(5))

    quantized = q.quantize_model(copy.deepcopy(model), scheme)
    assert all(isinstance(f, moe.QuantizedExperts) for f in experts_of(quantized))
    assert (logits(quantized) - logits(model)).abs().max() < atol


@pytest.mark.parametrize("scheme", ["int8", "int4-32"])
def test_a_checkpoint_saved_quantized_loads_its_experts(scheme):
    args = mix_args()
    model = randomize_(Transformer(args), std=0.05)
    state = q.quantize_model(copy.deepcopy(model), scheme, tile=False).state_dict()
    # stored layout: int8 [E, N, K] + [E, N]; int4 [E, N, K/2] nibbles + [E, K/G, N, 2]
    w1 = "layers.0.feed_forward.cond_ffn.w1."
    assert tuple(state[w1 + "weight"].shape) == ((4, 128, 64) if scheme == "int8" else (4, 128, 32))
    assert q.scheme_of_state(state) == q.parse_scheme(scheme)
    loaded = build_model(args, state, "test")
    expected = q.quantize_model(copy.deepcopy(model), scheme)  # tiled for the CPU kernel
    assert experts_of(loaded)[0].w1.kernel == "fused"
    x = torch.randint(0, 64, (1, 5))
    outs = []
    for m in (loaded, expected):
        m.setup_caches(1, 8)
        with torch.no_grad():
            outs.append(m(x, torch.arange(5)))
    assert torch.equal(*outs)


def test_count_cli_prices_the_experts_as_stored(tmp_path, capsys):
    path = tmp_path / "tiny-mixtral.json"
    path.write_text(json.dumps(dataclasses.asdict(mix_args())))
    assert cli_main(argv=["count", "--model", str(path), "--quantize", "int4-32", "--prompt_length",
                     "4", "--max_new_tokens", "2", "--json"]) == 0
    out = capsys.readouterr()
    # stored, bf16 where not quantized: embedding 64·64·2 = 8,192; a layer: wqkv [128, 64]
    # 4,096 + 2·128·4 = 5,120, wo 2,048 + 512 = 2,560, gate [4, 64] 128 + 32 = 160, experts
    # 4 · 15,360 = 61,440, norms 2·64·2 = 256: 69,536, ·2 = 139,072; final norm 128; output 2,560:
    # 149,952 B (with the experts left bf16: 149,952 + 2·4·(49,152 - 15,360) = 420,288)
    assert "weights int4-32 (149.95 kB as stored)" in out.err
    decode = json.loads(out.out)["decode"]
    # one decode step reads: the embedding row 128, a layer wqkv 5,120 + wo 2,560 + the gate
    # (no CPU kernel at N = 4: nibbles read twice, 2·128 + 32 = 288) + 2 experts 30,720 + norms
    # 256 = 38,944, ·2 = 77,888; final norm 128, output 2,560: 80,704 B
    assert decode["io_by_role"]["read"]["weight"] == 80_704


def test_serve_step_table_prices_quantized_experts_as_counted():
    args = dataclasses.replace(mix_args(), block_size=512)
    scheme = q.parse_scheme("int4-32")
    table = step_table(args, torch.bfloat16, RooflinePricer(get_device_spec("h100-sxm")),
                       weights=scheme)
    for shape in ([(1, 40)], [(2, 5)], [(1, 300), (1, 17), (48, 0), (12, 100)]):
        counted = count_step(args, [Piece(*p) for p in shape], weights=scheme)
        model = table.counts.totals(counted_features(shape, None, table.counts.experts))
        for name, want in (("flops", counted.flops), ("bytes", counted.per_op_bytes)):
            assert model[name] == pytest.approx(want, rel=1e-9), name
    # a decode (1 token, 2 experts a layer) reads the 80,704 B of the count CLI's decode step;
    # (2 new after 5): 4 routed rows over all 4 experts, 2 layers · 4 · 15,360 B
    one = count_step(args, [Piece(1, 40)], weights=scheme)
    assert sum(r.read[W] for r in one.records) == 80_704
    two = count_step(args, [Piece(2, 5)], weights=scheme)
    assert sum(r.read[W] for r in _experts(two)) == 2 * 4 * PER_EXPERT["int4-32"]  # 122,880


@pytest.mark.parametrize("load", [None, ExpertLoad([4, 2, 1, 1])], ids=["balanced", "skewed"])
def test_config_only_derived_equals_every_layer_and_step(load):
    args = mix_args(n_layer=3)

    def make(a):
        built = fake_model(a, dtype=torch.bfloat16, weights="int4-32")
        return built if load is None else routed(built, load)

    every, derived = TransformerPerformanceCounter(), TransformerPerformanceCounter()
    sizes = dict(batch_size=2, prompt_length=5, max_new_tokens=6, generate=greedy_generate,
                 make_model=make)
    count_config_only(args, every, **sizes)
    count_generation(args, derived, **sizes)
    for label in ("prefill", "decode"):
        a, b = every.counts[label].trace, derived.counts[label].trace
        assert (a.flops, a.per_op_read, a.per_op_written, a.compulsory_read) == \
            (b.flops, b.per_op_read, b.per_op_written, b.compulsory_read)
    # the experts' weights as stored: a prefill of 2·5 tokens, 20 routed rows, reads every expert
    # of each layer once: 3 layers · 4 · 15,360 = 184,320
    prefill = every.counts["prefill"].trace
    assert sum(r.read[W] for r in _experts(prefill)) == 3 * 4 * PER_EXPERT["int4-32"]


def test_group_size_must_divide_the_experts_widths():
    # w2's K is the intermediate size, 96: 96 % 64 != 0 (the linears' K, 64, would take 64)
    args = mix_args(intermediate_size=96)
    with pytest.raises(q.QuantizeError, match=r"group size 64 does not divide in_features=96 of "
                                              r"layers.0.feed_forward.cond_ffn.w2; valid group "
                                              r"sizes for this model: 32$"):
        fake_model(args, weights="int4-64")
