"""Formulas added for issue 11 (convolutions, MoE, routing, complex numbers, scaled matmuls),
called with plain shapes and checked on real ops in the counter; expected values by hand."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from perfcounter.costs import COSTS, Cost, Shape, shape_tree
from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.trace import KINDS

aten = torch.ops.aten
W, KV, ACT, INP = range(4)


def by_kind(cost: Cost) -> dict:
    return {k: v for k, v in zip(KINDS, cost.kinds) if v}


def count(fn):
    mode = PerformanceCounterMode()
    with torch.no_grad(), mode:
        fn()
    return mode.trace()


def torch_flops(fn) -> int:
    with FlopCounterMode(display=False) as f:
        fn()
    return f.get_total_flops()


# --- convolutions: forward unless the schema says transposed ------------------------


def test_depthwise_conv1d_mamba_style():
    # x [1, 8, 10], w [8, 1, 4], groups = 8, padding = k - 1 = 3: out [1, 8, 13]
    # 13 * 8 outputs, each 1 * 4 MACs: 416 MACs = 832 FLOPs; bias: + 104 adds
    c = COSTS[aten.convolution]((1, 8, 10), (8, 1, 4), (8,), [1], [3], [1], False, [0], 8,
                                out_shape=(1, 8, 13))
    assert by_kind(c) == {"mul": 416, "add": 416 + 104}
    x, w = torch.randn(1, 8, 10), torch.randn(8, 1, 4)
    conv = lambda: F.conv1d(x, w, padding=3, groups=8)  # noqa: E731
    assert count(conv).flops == 832 == torch_flops(conv)  # 4x less than the transposed count


def test_patch_embedding_conv2d():
    # x [1, 3, 32, 32], w [16, 3, 16, 16], stride 16: out [1, 16, 2, 2]
    # 64 outputs, each 3 * 16 * 16 = 768 MACs: 49152 MACs = 98304 FLOPs (not 256x that)
    x, w = torch.randn(1, 3, 32, 32), torch.randn(16, 3, 16, 16)
    conv = lambda: F.conv2d(x, w, stride=16)  # noqa: E731
    assert count(conv).flops == 98304 == torch_flops(conv)
    c = COSTS[aten.conv2d]((1, 3, 32, 32), (16, 3, 16, 16), (16,), [16, 16], out_shape=(1, 16, 2, 2))
    assert c.flops == 98304 + 64  # the op priced whole, with 64 bias adds


@pytest.mark.parametrize("groups", [1, 2])
def test_transposed_conv_matches_torch(groups):
    # x [1, 4, 5, 5], w [4, 6 / groups, 3, 3], stride 2: out [1, 6, 11, 11]; each of the
    # 100 inputs scatters into 6/groups * 9 outputs: groups 1: 100 * 54 = 5400 MACs,
    # groups 2: 100 * 27 = 2700 MACs
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 6 // groups, 3, 3)
    conv = lambda: F.conv_transpose2d(x, w, stride=2, groups=groups)  # noqa: E731
    macs = 5400 if groups == 1 else 2700
    assert count(conv).flops == 2 * macs == torch_flops(conv)
    assert COSTS[aten.conv_transpose2d]((1, 4, 5, 5), tuple(w.shape), None, [2],
                                        out_shape=(1, 6, 11, 11)).flops == 2 * macs


# --- MoE: grouped matmul and routing -----------------------------------------------


def _grouped_mm_examples():
    bf = dict(dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, **bf)  # noqa: E731
    offs = lambda *o: torch.tensor(o, dtype=torch.int32)  # noqa: E731
    # (a, b, offs, the same product as a loop of plain matmuls, MACs by hand)
    a, b = r(7, 8), r(3, 8, 16)  # 7 tokens' rows over 3 experts: 7 * 8 * 16 = 896
    yield a, b, offs(2, 5, 7), lambda: torch.cat([a[0:2] @ b[0], a[2:5] @ b[1], a[5:7] @ b[2]]), 896
    a3 = r(3, 2, 8)  # batched: 3 * 2 * 8 * 16 = 768
    yield a3, b, None, lambda: torch.bmm(a3, b), 768
    a2, b2 = r(4, 16), r(16, 16)  # groups split K: 4 * 16 * 16 = 1024
    yield a2, b2, offs(4, 8, 16), lambda: torch.stack(
        [a2[:, 0:4] @ b2[0:4], a2[:, 4:8] @ b2[4:8], a2[:, 8:16] @ b2[8:16]]), 1024
    b3 = r(8, 48)  # groups split N: 2 * 8 * 48 = 768
    yield a3, b3, offs(16, 32, 48), lambda: torch.cat(
        [a3[0] @ b3[:, 0:16], a3[1] @ b3[:, 16:32], a3[2] @ b3[:, 32:48]], 1), 768


@pytest.mark.parametrize("case", range(4))
def test_grouped_mm_equals_a_loop_of_matmuls(case):
    a, b, offs, loop, macs = list(_grouped_mm_examples())[case]
    out = torch._grouped_mm(a, b, offs=offs)
    assert torch.equal(out, loop())  # the shapes mean what the formula assumes
    grouped = count(lambda: torch._grouped_mm(a, b, offs=offs))
    looped = [r for r in count(loop).records if r.op.startswith(("aten.mm", "aten.bmm"))]
    assert grouped.flops == 2 * macs == sum(r.flops for r in looped)
    assert grouped.uncounted_ops == {}


def test_mixtral_experts_grouped_mm_equals_batched_mm():
    # transformers' default experts path (_grouped_mm) against batched_mm on one tiny
    # Mixtral: the expert matmuls count the same FLOPs, and nothing is left uncounted
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                     num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 100, (2, 5))
    expert_flops = {}
    for impl, op in (("grouped_mm", "aten._grouped_mm"), ("batched_mm", "aten.bmm"),
                     ("eager", "aten.mm")):
        model.set_experts_implementation(impl)
        t = count(lambda: model(ids))
        assert t.uncounted_ops == {}
        expert_flops[impl] = sum(r.flops for r in t.records if r.op.startswith(op + ".")
                                 and ".experts" in r.module + ".")
    # 10 tokens x top-2 = 20 rows, gate_up [64 -> 256] and down [128 -> 64]:
    # 2 * 20 * (64 * 256 + 128 * 64) = 983040
    assert expert_flops == {"grouped_mm": 983040, "batched_mm": 983040, "eager": 983040}


def test_grouped_mm_formula_ignores_offs_content():
    # [M=6, K=4] x [E=2, K=4, N=8]: 6 * 4 * 8 = 192 MACs however the rows are split
    c = COSTS[aten._grouped_mm]((6, 4), (2, 4, 8), (2,), out_shape=(6, 8))
    assert by_kind(c) == {"add": 192, "mul": 192} and c.read_elems is None


def test_grouped_mm_reads_the_experts_that_got_rows():
    # offs says what the mode passes: 1 of 2 experts got rows: one [4, 8] weight read;
    # rows = 4 of 6 (the kernel skips rows past offs[-1]): 4 * 4 * 8 = 128 MACs
    c = COSTS[aten._grouped_mm]((6, 4), (2, 4, 8), (2,), groups_hit=1, rows=4, out_shape=(6, 8))
    assert by_kind(c) == {"add": 128, "mul": 128} and c.read_elems == (16, 32)
    a, b = torch.randn(6, 4), torch.randn(3, 4, 8)
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)  # expert 1 gets no row
    t = count(lambda: torch._grouped_mm(a, b, offs=offs))
    assert t.flops == 2 * 6 * 4 * 8
    # a (6*4*4 = 96 B) and offs (12 B) are inputs; b is read for 2 experts: 2*4*8*4 = 256 B
    assert t.per_op_read[INP] == 96 + 12 + 256


def test_grouped_mm_runs_on_fake_tensors_of_any_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # the meta kernel wants bf16
        with FakeTensorMode():
            a, b = torch.randn(6, 4, dtype=dtype), torch.randn(2, 4, 8, dtype=dtype)
            offs = torch.tensor([3, 6], dtype=torch.int32)
            mode = PerformanceCounterMode()
            with mode:
                out = torch._grouped_mm(a, b, offs=offs)
        assert out.shape == (6, 8) and out.dtype == dtype
        assert mode.get_total_flops() == 2 * 6 * 4 * 8 and mode.uncounted_ops == {}


def test_expert_load_splits_rows_by_largest_remainder():
    from perfcounter.counting.op_data import ExpertLoad
    assert ExpertLoad().rows_per_expert(6, 4) == [2, 2, 1, 1]  # balanced
    assert ExpertLoad().experts_hit(2, 8) == 2
    load = ExpertLoad.parse("4,2,1,1")  # shares .5, .25, .125, .125
    assert load.rows_per_expert(6, 4) == [3, 1, 1, 1]  # 3, 1.5, .75, .75: the 2 left to .75s
    assert load.rows_per_expert(2, 4) == [1, 1, 0, 0]  # 1, .5, .25, .25: 1 left to the .5
    assert load.experts_hit(2, 4) == 2 and str(load) == "0.5,0.25,0.125,0.125"
    assert ExpertLoad.parse(None) == ExpertLoad.parse("balanced") == ExpertLoad()
    with pytest.raises(ValueError, match="expected 'balanced' or comma-separated weights"):
        ExpertLoad.parse("many")
    with pytest.raises(ValueError, match="this layer routes over 8 experts"):
        load.experts_hit(6, 8)


def test_histc_routing():
    # 3 tokens x top-2 = 6 expert ids into 4 bins, range [0, 3]: per element 2 add, 1 mul, 3 cmp
    c = COSTS[aten.histc]((3, 2), 4, 0, 3, out_shape=(4,))
    assert by_kind(c) == {"add": 12, "mul": 6, "cmp": 18}  # 6 FLOPs per element
    auto = COSTS[aten.histc]((3, 2), 4, 0, 0, out_shape=(4,))  # min == max: the data's range
    assert by_kind(auto) == {"add": 12, "mul": 6, "cmp": 18 + 10}  # + 2 * (6 - 1)
    ids = torch.tensor([[0, 1], [3, 1], [2, 0]]).float()
    t = count(lambda: torch.histc(ids, bins=4, min=0, max=3))
    assert t.flops == 36 and t.uncounted_ops == {}


def test_index_add_reads_and_writes_rows():
    # x [10, 4] += source [3, 4] at 3 rows: 12 adds; alpha 2: + 12 muls
    c = COSTS[aten.index_add_]((10, 4), 0, (3,), (3, 4), out_shape=(10, 4))
    assert by_kind(c) == {"add": 12} and c.read_elems == (12, None, None) and c.write_elems == 12
    assert by_kind(COSTS[aten.index_add_]((10, 4), 0, (3,), (3, 4), alpha=2)) == {"add": 12, "mul": 12}
    x, idx, src = torch.zeros(10, 4), torch.tensor([1, 5, 7]), torch.ones(3, 4)
    t = count(lambda: x.index_add_(0, idx, src))
    assert t.flops == 12
    # reads rows of x 12 * 4 = 48 B, idx 3 * 8 = 24 B, src 48 B; writes the 48 B of rows
    assert t.per_op_read[INP] == 120 and t.per_op_written[INP] == 48


# --- generate's stop check, complex numbers -----------------------------------------


def test_isin_every_pair_then_sorting():
    # 2 tokens vs 3 end-of-sequence ids: 3 < 10 * 2^0.145 = 11.06: 2 * 3 = 6 cmp
    assert by_kind(COSTS[aten.isin]((2, 1), (3,), out_shape=(2, 1))) == {"cmp": 6}
    # 4 vs 1000: 1000 >= 10 * 4^0.145 = 12.2: sort 1000 * 10 + search 4 * 10 + hit 4 = 10044
    assert by_kind(COSTS[aten.isin]((4,), (1000,), out_shape=(4,))) == {"cmp": 10044}
    assert by_kind(COSTS[aten.isin]((5,), 3, out_shape=(5,))) == {"cmp": 5}  # a scalar test
    tok, eos = torch.tensor([[5], [2]]), torch.tensor([2, 7, 9])
    t = count(lambda: torch.isin(tok, eos))
    assert t.flops == 6 and t.uncounted_ops == {}


def test_polar():
    # abs·cos, abs·sin for 2 * 3 elements: 12 special, 12 mul
    assert by_kind(COSTS[aten.polar]((2, 3), (2, 3), out_shape=(2, 3))) == {"special": 12, "mul": 12}
    t = count(lambda: torch.polar(torch.ones(2, 3), torch.zeros(2, 3)))
    assert t.flops == 24 and t.uncounted_ops == {}


def test_complex_multiply_is_six_real_flops():
    c64, f32 = torch.complex64, torch.float32
    out = Shape((2, 3), c64)
    # 6 elements: complex x complex 4 mul + 2 add each = 36; complex x real 2 mul each = 12
    assert by_kind(COSTS[aten.mul](Shape((2, 3), c64), Shape((2, 3), c64), out_shape=out)) == {
        "mul": 24, "add": 12}
    assert by_kind(COSTS[aten.mul](Shape((2, 3), c64), Shape((2, 3), f32), out_shape=out)) == {"mul": 12}
    assert by_kind(COSTS[aten.mul](Shape((2, 3), f32), 1j, out_shape=out)) == {"mul": 12}
    assert by_kind(COSTS[aten.mul](Shape((2, 3), c64), 1j, out_shape=out)) == {"mul": 24, "add": 12}
    assert by_kind(COSTS[aten.mul]((2, 3), (2, 3), out_shape=(2, 3))) == {"mul": 6}  # plain: real
    # what the counter passes, made from real tensors by shape_tree
    z = torch.ones(2, 3, dtype=c64)
    args = shape_tree((z, z))
    assert COSTS[aten.mul](*args, out_shape=shape_tree(z)).flops == 36


# --- matmuls with alpha / beta --------------------------------------------------------


def test_baddbmm_alpha_beta():
    bias, a, b, out = (3, 4, 5), (3, 4, 6), (3, 6, 5), (3, 4, 5)
    f = COSTS[aten.baddbmm]
    # 3*4*5*6 = 360 MACs, 60 outputs
    assert f(bias, a, b, out_shape=out).flops == 780  # 720 + 60 bias adds
    assert by_kind(f(bias, a, b, alpha=0.125, out_shape=out)) == {"add": 420, "mul": 420}  # + 60 alpha
    assert f(bias, a, b, beta=0.5, alpha=0.125, out_shape=out).flops == 900  # + 60 beta muls
    c = f(bias, a, b, beta=0, alpha=0.125, out_shape=out)  # bias ignored: no add, not read
    assert by_kind(c) == {"add": 360, "mul": 420} and c.read_elems == (0, None, None)


def test_addmm_alpha_beta():
    f = COSTS[aten.addmm]  # [4, 6] @ [6, 5]: 120 MACs, 20 outputs
    assert f((5,), (4, 6), (6, 5), out_shape=(4, 5)).flops == 260
    assert f((5,), (4, 6), (6, 5), alpha=2, out_shape=(4, 5)).flops == 280
    c = f((5,), (4, 6), (6, 5), beta=0, out_shape=(4, 5))
    assert c.flops == 240 and c.read_elems == (0, None, None)


def test_baddbmm_beta_zero_reads_no_bias_in_the_counter():
    bias, a, b = torch.randn(3, 4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    # a 3*4*6*4 = 288 B, b 3*6*5*4 = 360 B, bias 3*4*5*4 = 240 B
    full = count(lambda: torch.baddbmm(bias, a, b))
    assert full.per_op_read[INP] == 888 and full.flops == 780
    scores = count(lambda: torch.baddbmm(bias, a, b, beta=0, alpha=0.5))
    assert scores.per_op_read[INP] == 648 and scores.flops == 780  # 720 + 60 alpha muls
    assert scores.compulsory_read[INP] == 648


# --- attention: what a kernel that skips masked blocks computes ------------------------


def test_window_pairs_by_hand():
    from perfcounter.costs import causal_pairs, window_pairs
    assert window_pairs(5, 5) == causal_pairs(5, 5) == 15  # 1 + 2 + 3 + 4 + 5
    assert window_pairs(5, 5, 2) == 9  # 1 + 2 + 2 + 2 + 2
    assert window_pairs(1, 7) == 7 and window_pairs(1, 7, 4) == 4  # decode at position 6
    assert window_pairs(2, 7) == 6 + 7  # the last two of 7 positions


def test_explicit_mask_executes_the_pairs_it_keeps():
    # q [1, 2, 4, 8], k = v [1, 2, 6, 8]; per score 8 + 8 + 3 adds (max, sum, mask),
    # 8 + 8 + 1 muls, 1 exp, 1 cmp = 38; then 2 * 4 * 8 = 64 output divs
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8)
    mask = torch.ones(1, 1, 4, 6, dtype=torch.bool).tril(2)  # rows keep 3, 4, 5, 6 keys
    mask[..., 0] = False  # a padded first key: 2, 3, 4, 5 = 14 pairs per head
    attention = lambda m: [r for r in count(  # noqa: E731
        lambda: F.scaled_dot_product_attention(q, k, k, attn_mask=m)).records
        if r.op.startswith("aten._scaled_dot_product")]
    (attn,) = attention(mask)  # the bool mask is made additive first, by other ops
    assert attn.flops == 2 * 4 * 6 * 38 + 64  # dense, as torch counts it
    assert attn.executed_flops == 2 * 14 * 38 + 64
    additive = torch.zeros(4, 6).masked_fill(~mask[0, 0], float("-inf"))  # the same, additive
    assert attention(additive)[0].executed_flops == attn.executed_flops


def test_sort_counts_along_its_dim():
    # rows of 50 along the last dim: 2 * 3 * 50 = 300 elements * ceil(log2 50) = 6
    assert by_kind(COSTS[aten.sort]((2, 3, 50), -1, False, out_shape=((2, 3, 50), (2, 3, 50)))) == {
        "cmp": 1800}
    # sort.stable passes dim by keyword: 16 elements, rows of 8 along dim 0: 16 * 3
    assert by_kind(COSTS[aten.sort]((8, 2), stable=True, dim=0)) == {"cmp": 48}


def test_complex_multiply_in_the_counter():
    z = torch.ones(2, 3, dtype=torch.complex64)
    assert count(lambda: z * z).flops == 36  # 6 elements * (4 mul + 2 add)
