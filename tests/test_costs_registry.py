"""The costs registry: one way in, targets checked as torch does, all of an op in one OpInfo."""
import pytest
import torch

from perfcounter import costs
from perfcounter.costs import COSTS, OPS, OpInfo, Shape, op_info, op_info_by_name, register, shape_tree
from perfcounter.costs import _core
from perfcounter.pricing.roofline import per_element_tag

aten = torch.ops.aten


@pytest.fixture
def scratch_registry():
    """Lets a test register ops, and puts the registry back as it was afterwards."""
    saved = dict(_core.OPS), dict(_core.COSTS), dict(_core._BY_NAME)
    yield
    for live, old in zip((_core.OPS, _core.COSTS, _core._BY_NAME), saved):
        live.clear()
        live.update(old)


def test_public_names_stay():
    # the names that mode, op_plan, roofline and the tests use
    for name in ("COSTS", "OPS", "Cost", "ZERO", "register", "kinds", "numel", "op_info",
                 "op_info_by_name", "attention_cost", "causal_pairs", "conv_cost", "mm_cost"):
        assert hasattr(costs, name), name
    assert costs.numel((2, 3, 4)) == 24
    assert costs.kinds(mul=2) == (0, 2, 0, 0, 0, 0, 0)


def test_op_info_holds_formula_and_flags():
    info = op_info(aten.mm)
    assert isinstance(info, OpInfo) and info.formula is costs.mm_cost
    assert not (info.write_only or info.cache_write or info.join or info.factory or info.attention)
    assert op_info(aten.copy_) == OpInfo(costs.data_movement_cost, write_only=True, cache_write=True)
    assert op_info(aten.i0) is None  # unknown op
    with pytest.raises(AttributeError):  # slots: no stray fields
        object.__setattr__(info, "typo", 1)


def test_op_info_by_record_name():
    assert op_info_by_name("aten.mm.default") is op_info(aten.mm)
    assert op_info_by_name("aten.mm") is op_info(aten.mm)
    assert op_info_by_name("aten.add.Tensor").formula is costs.add_cost
    assert op_info_by_name("aten.silu_.default").per_element == "silu"
    assert op_info_by_name("flex_attention").formula is costs.flex_attention_cost
    assert op_info_by_name("aten.i0.default") is None
    assert op_info_by_name("not an op") is None


# The byte semantics as the dispatch mode kept them in private sets before they
# moved into the registry; the mode reads them from OpInfo now, so they must not move.
WRITE_ONLY = {aten.copy_, aten.fill_, aten.zero_, aten.index_copy_, aten.index_put_,
              aten.scatter_, aten.exponential_, aten.uniform_, aten.normal_, aten.random_,
              aten.bernoulli_, aten.set_, aten.resize_}
CACHE_WRITES = {aten.copy_, aten.index_copy_, aten.index_put_, aten.slice_scatter, aten.scatter_}
JOINS = {aten.cat, aten.stack}
FACTORIES = {aten.zeros, aten.empty, aten.full, aten.ones, aten.empty_strided,
             aten.new_zeros, aten.new_empty, aten.new_full, aten.new_ones,
             aten.zeros_like, aten.empty_like, aten.full_like, aten.ones_like}
ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu,
             aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
             aten._scaled_dot_product_cudnn_attention, aten._flash_attention_forward,
             aten.scaled_dot_product_attention, aten._efficient_attention_forward,
             torch.ops.perfcounter.quantized_kv_sdpa}  # since: attention over a quantized KV cache


@pytest.mark.parametrize("flag, ops", [("write_only", WRITE_ONLY), ("cache_write", CACHE_WRITES),
                                       ("join", JOINS), ("factory", FACTORIES),
                                       ("attention", ATTENTION)])
def test_flags_are_the_modes_former_sets(flag, ops):
    assert {op for op, info in OPS.items() if getattr(info, flag)} == ops


def test_per_element_tags_are_roofline_s_former_name_sets():
    tagged = {str(op): info.per_element for op, info in OPS.items() if info.per_element}
    assert tagged == {"aten._softmax": "softmax", "aten.softmax": "softmax",
                      "aten._safe_softmax": "softmax", "aten.silu": "silu", "aten.silu_": "silu",
                      "aten.rms_norm": "rmsnorm", "aten._fused_rms_norm": "rmsnorm"}
    assert per_element_tag("aten._softmax.default") == "softmax"
    assert per_element_tag("aten.rms_norm.default") == "rmsnorm"
    assert per_element_tag("aten.mm.default") is None


def test_flag_only_ops_stay_formula_less():
    # composites tagged for per-element pricing: counted through the ops they run
    for op in (aten.softmax, aten.rms_norm):
        assert op_info(op).formula is None and op not in COSTS
    # every op with a formula is in both maps, with the same function
    assert {op: info.formula for op, info in OPS.items() if info.formula} == COSTS
    # a formula-less entry only makes sense with a flag or a tag
    for op, info in OPS.items():
        if info.formula is None:
            assert (info.write_only or info.cache_write or info.join or info.factory
                    or info.attention or info.per_element), op


def test_every_formula_says_what_it_counts():
    for op, fn in COSTS.items():
        assert fn.__doc__ and fn.__doc__.strip(), (op, fn.__name__)


def test_register_refuses_an_overload_with_a_clear_message():
    with pytest.raises(TypeError, match=r"aten\.mm\.default.*register\(aten\.mm\)"):
        register(aten.mm.default)
    with pytest.raises(TypeError, match="OpOverloadPacket"):
        register("aten.mm")
    with pytest.raises(TypeError, match="at least one op"):
        register()
    with pytest.raises(ValueError, match="per_element='gelu'"):
        register(aten.i0, per_element="gelu")
    assert op_info(aten.i0) is None  # nothing registered by a refused call


def test_register_refuses_duplicates_with_or_without_formula(scratch_registry):
    with pytest.raises(ValueError, match="aten.mm registered twice"):
        register(aten.mm)
    with pytest.raises(ValueError, match="aten.set_ registered twice"):
        register(aten.set_, write_only=True)
    with pytest.raises(ValueError, match="registered twice"):
        register(aten.i0, aten.i0)


def test_register_as_a_statement_keeps_no_formula(scratch_registry):
    attach = register(aten.i0, write_only=True)  # flags only: FLOPs stay uncounted
    assert op_info(aten.i0) == OpInfo(None, write_only=True)
    assert aten.i0 not in COSTS and op_info_by_name("aten.i0.default").write_only

    def i0_cost(x, out_shape=None, **kw):
        """test formula"""
        return costs.ZERO

    attach(i0_cost)  # the same registration's decorator may still attach a formula, once
    assert COSTS[aten.i0] is i0_cost and op_info(aten.i0).formula is i0_cost
    with pytest.raises(ValueError, match="registered twice"):
        attach(i0_cost)


def test_register_takes_higher_order_ops(scratch_registry):
    from torch._higher_order_ops.flex_attention import flex_attention
    assert op_info(flex_attention).formula is costs.flex_attention_cost
    with pytest.raises(ValueError, match="flex_attention registered twice"):
        register(flex_attention)


def test_shapes_carry_dtypes_and_compare_as_tuples():
    s = Shape((2, 3), torch.complex64)
    assert s == (2, 3) and s.dtype == torch.complex64 and costs.dtype_of((2, 3)) is None
    args = shape_tree((torch.zeros(2, 3), [torch.zeros(4, dtype=torch.int64), None], 1.5))
    assert args == ((2, 3), [(4,), None], 1.5)
    assert args[0].dtype == torch.float32 and args[1][0].dtype == torch.int64
    assert costs.is_complex(1j) and not costs.is_complex(2.0) and not costs.is_complex(None)
