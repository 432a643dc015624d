"""Cost formulas called with plain shapes; every expected value derived by hand."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import flop_registry

from perfcounter import costs
from perfcounter.costs import COSTS, Cost, attention_cost, causal_pairs, kinds, register
from perfcounter.trace import KINDS

aten = torch.ops.aten


def by_kind(cost: Cost) -> dict:
    return {k: v for k, v in zip(KINDS, cost.kinds) if v}


def test_mm_is_two_flops_per_mac():
    c = COSTS[aten.mm]((4, 6), (6, 5), out_shape=(4, 5))
    assert c.flops == 240  # 2 * 4 * 6 * 5
    assert by_kind(c) == {"add": 120, "mul": 120}  # 4 * 6 * 5 MACs


def test_addmm_adds_bias():
    c = COSTS[aten.addmm]((5,), (4, 6), (6, 5), out_shape=(4, 5))
    assert c.flops == 260  # 2 * 4 * 6 * 5 + 4 * 5 bias adds


def test_bmm_and_baddbmm():
    assert COSTS[aten.bmm]((3, 4, 6), (3, 6, 5), out_shape=(3, 4, 5)).flops == 720  # 2*3*4*6*5
    assert COSTS[aten.baddbmm]((3, 4, 5), (3, 4, 6), (3, 6, 5), out_shape=(3, 4, 5)).flops == 780  # + 3*4*5


def test_linear_with_and_without_bias():
    # x [2, 3, 8] @ w[5, 8]^T: M = 6 rows, 6 * 5 * 8 = 240 MACs
    assert COSTS[aten.linear]((2, 3, 8), (5, 8), out_shape=(2, 3, 5)).flops == 480
    assert COSTS[aten.linear]((2, 3, 8), (5, 8), (5,), out_shape=(2, 3, 5)).flops == 510  # + 6 * 5


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64), st.integers(1, 8))
def test_matmuls_agree_with_torch_flop_counter(m, k, n, b):
    assert COSTS[aten.mm]((m, k), (k, n)).flops == flop_registry[aten.mm]((m, k), (k, n))
    assert COSTS[aten.bmm]((b, m, k), (b, k, n)).flops == flop_registry[aten.bmm]((b, m, k), (b, k, n))


def test_attention_dense_counts():
    # q [1, 2, 3, 4], k/v [1, 2, 5, 4]: 1*2*3*5 = 30 scores
    c = attention_cost((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    # per score: add 4 + 4 + 2 = 10, mul 4 + 4 + 1 = 9, exp 1, cmp 1; div 1*2*3*4 = 24 outputs
    assert by_kind(c) == {"add": 300, "mul": 270, "exp": 30, "cmp": 30, "div": 24}
    assert c.flops == 300 + 270 + 30 + 30 + 24
    assert c.executed is None
    # the two matmuls alone are torch's count: 4 * b * h * sq * sk * d = 4 * 30 * 4 = 480
    assert flop_registry[aten._scaled_dot_product_flash_attention]((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)) == 480


def test_attention_causal_executes_only_unmasked_pairs():
    assert causal_pairs(4, 4) == 10  # 1 + 2 + 3 + 4
    assert causal_pairs(2, 5) == 3  # top-left aligned: 1 + 2
    c = attention_cost((1, 1, 4, 2), (1, 1, 4, 2), (1, 1, 4, 2), is_causal=True)
    per_score = (2 + 2 + 2) + (2 + 2 + 1) + 1 + 1  # add, mul, exp, cmp = 13
    assert c.flops == 16 * per_score + 4 * 2  # dense: 16 scores, 8 output divs
    assert c.executed == 10 * per_score + 4 * 2


def test_attention_gqa_uses_query_heads():
    # 8 query heads sharing 2 KV heads: the same count as 8 full heads
    gqa = attention_cost((1, 8, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    mha = attention_cost((1, 8, 3, 4), (1, 8, 5, 4), (1, 8, 5, 4))
    assert gqa == mha


def test_cpu_flash_kernel_is_counted():
    q = (1, 2, 3, 4)
    c = COSTS[aten._scaled_dot_product_flash_attention_for_cpu](q, q, q, 0.0, True)
    assert c.flops > 0 and c.executed < c.flops


def test_softmax_per_row():
    # 2 rows of 5: cmp 2*4, add 2*5 + 2*4, exp 10, div 10
    c = COSTS[aten._softmax]((2, 5), -1, False, out_shape=(2, 5))
    assert by_kind(c) == {"cmp": 8, "add": 18, "exp": 10, "div": 10}


def test_safe_softmax_adds_the_masked_row_check():
    # softmax as above, plus cmp: 10 (== -inf) + 10 (select) + 2*4 (all masked per row) = 28
    c = COSTS[aten._safe_softmax]((2, 5), -1, out_shape=(2, 5))
    assert by_kind(c) == {"cmp": 8 + 28, "add": 18, "exp": 10, "div": 10}


def test_rms_norm():
    # 3 rows of 4 with weight: mul 3*12 = 36, add 3*3 + 3 = 12, div 3, sqrt 3
    c = COSTS[aten._fused_rms_norm]((3, 4), [4], (4,), 1e-6, out_shape=((3, 4), (3, 1)))
    assert by_kind(c) == {"mul": 36, "add": 12, "div": 3, "sqrt": 3}


def test_elementwise_kinds():
    out = (2, 3)
    assert by_kind(COSTS[aten.silu]((2, 3), out_shape=out)) == {"special": 6, "mul": 6}
    assert by_kind(COSTS[aten.add]((2, 3), (2, 3), out_shape=out)) == {"add": 6}
    assert by_kind(COSTS[aten.add]((2, 3), (2, 3), alpha=2, out_shape=out)) == {"add": 6, "mul": 6}
    assert by_kind(COSTS[aten.rsqrt]((2, 3), out_shape=out)) == {"sqrt": 6}
    assert by_kind(COSTS[aten.pow]((2, 3), 2, out_shape=out)) == {"mul": 6}
    assert by_kind(COSTS[aten.pow]((2, 3), 1.7, out_shape=out)) == {"exp": 12, "mul": 6}
    assert by_kind(COSTS[aten.where]((2, 3), (2, 3), (2, 3), out_shape=out)) == {"cmp": 6}
    assert by_kind(COSTS[aten.gelu]((2, 3), out_shape=out)) == {"special": 6, "mul": 18, "add": 6}


def test_reductions():
    assert by_kind(COSTS[aten.sum]((4, 5), [-1], out_shape=(4,))) == {"add": 16}  # 20 - 4
    assert by_kind(COSTS[aten.mean]((4, 5), [-1], True, out_shape=(4, 1))) == {"add": 16, "div": 4}
    assert by_kind(COSTS[aten.amax]((4, 5), [-1], out_shape=(4,))) == {"cmp": 16}
    assert by_kind(COSTS[aten.max]((4, 5), (4, 5), out_shape=(4, 5))) == {"cmp": 20}  # binary form


def test_sampling_ops():
    assert by_kind(COSTS[aten.topk]((2, 100), 8, out_shape=((2, 8), (2, 8)))) == {"cmp": 600}  # 200 * 3
    # 1 row of 16: 16 adds, 16 div, 1 sample * log2(16) = 4 cmp
    assert by_kind(COSTS[aten.multinomial]((1, 16), 1, out_shape=(1, 1))) == {"add": 16, "div": 16, "cmp": 4}
    assert by_kind(COSTS[aten.argmax]((1, 16), -1, out_shape=(1,))) == {"cmp": 15}


def test_gathers_touch_rows_not_tables():
    emb = COSTS[aten.embedding]((32000, 4096), (1, 6), out_shape=(1, 6, 4096))
    assert emb.read_elems == (6 * 4096, None) and emb.flops == 0
    sel = COSTS[aten.index_select]((10, 4), 0, (3,), out_shape=(3, 4))
    assert sel.read_elems == (12, None)  # 3 rows of 4


def test_cache_writes_touch_new_positions_only():
    # cache [1, 2, 16, 8], one new position: 1 * 2 * 1 * 8 = 16 elements
    c = COSTS[aten.index_copy_]((1, 2, 16, 8), 2, (1,), (1, 2, 1, 8))
    assert c.write_elems == 16
    c = COSTS[aten.index_put_]((1, 2, 16, 8), [None, None, (3,)], (1, 2, 3, 8))
    assert c.write_elems == 48  # 1 * 2 * 3 * 8


def test_registry_refuses_duplicates():
    with pytest.raises(ValueError, match="registered twice"):
        register(aten.mm)(lambda *a, **k: costs.ZERO)


def test_kinds_builder():
    assert kinds(add=1, cmp=2) == (1, 0, 0, 0, 0, 0, 2)
