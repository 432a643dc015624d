"""PerformanceCounterMode on real ops and tiny models: FLOPs, bytes by role, modules."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.models.tokenizer import cache_keyword
from perfcounter.trace import ROLES
from records_snapshot import _tiny

W, KV, ACT, INP, BUF = range(5)


@pytest.fixture(scope="module")
def tiny_llama():
    return _tiny("llama")


@pytest.fixture(scope="module")
def tiny_model_factory():
    return _tiny


def count(fn, *, grad=torch.no_grad, depth=10):
    mode = PerformanceCounterMode(depth=depth)
    with grad(), mode:
        fn()
    return mode.trace()


def _counted(trace) -> list:
    """The records that count something (views are 0 FLOPs, 0 bytes), comparable."""
    return sorted((r.op, r.module, r.shapes, r.calls, r.flops, r.executed_flops, r.read, r.written)
                  for r in trace.records if r.flops or r.bytes)


def one(trace, op):
    recs = [r for r in trace.records if r.op.startswith(op)]
    assert len(recs) == 1, [r.op for r in trace.records]
    return recs[0]


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_linear_without_bias(grad):
    x, w = torch.randn(6, 8), torch.nn.Parameter(torch.randn(5, 8))
    t = count(lambda: F.linear(x, w), grad=grad)
    assert t.flops == 480  # 2 * 6 * 8 * 5
    # reads x (6*8*4 = 192 B, input) and w (5*8*4 = 160 B, weight); writes 6*5*4 = 120 B
    assert t.per_op_read == [160, 0, 0, 192, 0]
    assert t.per_op_written == [0, 0, 120, 0, 0]


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_linear_module_with_bias(grad):
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(6, 8)
    t = count(lambda: lin(x), grad=grad)
    assert t.flops == 510  # 2 * 6 * 8 * 5 + 6 * 5
    assert t.per_op_read == [180, 0, 0, 192, 0]  # weight 160 + bias 20, input 192
    assert {r.module for r in t.records if r.flops} == {"Linear"}


def test_mm_and_bmm_bytes_by_hand():
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    t = count(lambda: a @ b)
    assert t.flops == 240  # 2 * 4 * 6 * 5
    assert t.per_op_bytes == (24 + 30 + 20) * 4  # (MK + KN + MN) * 4 B
    a3, b3 = torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    t = count(lambda: torch.bmm(a3, b3))
    assert t.flops == 720 and t.per_op_bytes == 3 * (24 + 30 + 20) * 4


def test_view_chain_moves_nothing():
    x = torch.randn(4, 6)
    t = count(lambda: x.view(2, 12).t().unsqueeze(0).expand(3, 12, 2)[1:].transpose(1, 2))
    assert t.per_op_bytes == 0 and t.flops == 0
    assert sum(r.calls for r in t.records) >= 5


def test_inplace_add_reads_and_writes_target_and_slices_count_region():
    x, y = torch.randn(8, 4), torch.randn(2, 4)
    t = count(lambda: x[2:4].add_(y))
    # reads the 2x4 slice of x and y (32 + 32 B), writes the slice (32 B): never the 128 B storage
    assert t.per_op_read == [0, 0, 0, 64, 0]
    assert t.per_op_written == [0, 0, 0, 32, 0]
    assert one(t, "aten.add_").flops == 8


def test_tensor_passed_twice_is_read_once():
    x = torch.randn(10)
    t = count(lambda: x * x)
    assert t.per_op_read == [0, 0, 0, 40, 0]  # one read of 10 * 4 B


def test_softmax_silu_rmsnorm():
    x = torch.randn(2, 5)
    t = count(lambda: torch.softmax(x, -1))
    assert t.flops == 8 + 18 + 10 + 10  # cmp 2*4, add 2*5+2*4, exp 10, div 10
    t = count(lambda: F.silu(x))
    assert t.kinds == {"add": 0, "mul": 10, "div": 0, "sqrt": 0, "exp": 0, "special": 10, "cmp": 0}
    norm = torch.nn.RMSNorm(5, eps=1e-6)
    t = count(lambda: norm(x))
    # whatever the decomposition, per row of 5: 5 squares, 5 scale muls, 5 weight muls -> 30 mul
    assert t.kinds["mul"] == 30 and t.kinds["sqrt"] == 2


def test_rope_rotation_by_hand():
    # q [1, 1, 2, 4] rotated as in Llama: q*cos + rotate_half(q)*sin
    q, cos, sin = torch.randn(1, 1, 2, 4), torch.randn(2, 4), torch.randn(2, 4)

    def rope():
        half = torch.cat((-q[..., 2:], q[..., :2]), dim=-1)
        return q * cos + half * sin

    t = count(rope)
    # neg on 4 elements (add kind), 2 muls of 8 and 1 add of 8 -> add 12, mul 16
    assert t.kinds["add"] == 12 and t.kinds["mul"] == 16 and t.flops == 28


def test_embedding_reads_rows_not_table():
    emb = torch.nn.Embedding(1000, 16)
    ids = torch.tensor([[1, 2, 3]])
    t = count(lambda: emb(ids))
    assert t.per_op_read == [3 * 16 * 4, 0, 0, 3 * 8, 0]  # 3 rows of 16 floats, 3 int64 ids
    assert t.per_op_written == [0, 0, 3 * 16 * 4, 0, 0]


def test_sdpa_causal_and_not_and_gqa():
    q = torch.randn(1, 4, 8, 16)
    k = v = torch.randn(1, 4, 8, 16)
    dense = count(lambda: F.scaled_dot_product_attention(q, k, v))
    causal = count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    scores = 4 * 8 * 8
    per_score = (16 + 16 + 2) + (16 + 16 + 1) + 1 + 1  # add, mul, exp, cmp = 69
    assert dense.flops == scores * per_score + 4 * 8 * 16  # + one div per output element
    assert causal.flops == dense.flops  # dense convention kept in total_flops
    assert causal.executed_flops == 4 * 36 * per_score + 4 * 8 * 16  # 36 = 1+2+...+8 pairs per head
    kg = vg = torch.randn(1, 2, 8, 16)
    gqa = count(lambda: F.scaled_dot_product_attention(q, kg, vg, enable_gqa=True))
    assert gqa.flops == dense.flops
    # q is an input (4*8*16*4 = 2048 B); k is v, read once (2*8*16*4 = 1024 B), and a buffer
    # that existed before the block and is read as keys/values is KV cache
    assert gqa.per_op_read == [0, 1024, 0, 2048, 0]


def test_sdpa_under_inference_mode_runs_the_kernel_no_grad_runs():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 4, 8, 16)
    k = v = torch.randn(1, 4, 8, 16)
    run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    kernel = count(run)  # no_grad: the composite decomposes before the mode sees it
    inference = count(run, grad=torch.inference_mode)  # the composite reaches the mode: its own
    assert _counted(inference) == _counted(kernel)  # decomposition picks the same kernel
    attn = one(inference, "aten._scaled_dot_product_flash_attention_for_cpu")
    # reads q, k (= v, once): 2 * 4*8*16*4 = 4096 B; writes the output, 2048 B, and the
    # kernel's 4*8 float log-sum-exp, 128 B
    assert sum(attn.read) == 4096 and sum(attn.written) == 2048 + 128
    with sdpa_kernel(SDPBackend.MATH):  # no fused kernel: the math ops are counted one by one
        math = count(run, grad=torch.inference_mode)
    assert not [r for r in math.records if "scaled_dot_product" in r.op]
    assert any(r.op.startswith(("aten.bmm", "aten.matmul", "aten.mm")) for r in math.records)
    assert math.flops >= 2 * 2 * 4 * 8 * 8 * 16  # at least q·kᵀ and p·v


def test_torch_flop_counter_misses_cpu_flash_attention_we_do_not():
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.randn(1, 2, 8, 16)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        F.scaled_dot_product_attention(q, q, q)
    t = count(lambda: F.scaled_dot_product_attention(q, q, q))
    assert t.flops > 4 * 2 * 8 * 8 * 16  # at least the two matmuls
    assert fc.get_total_flops() in (0, 4 * 2 * 8 * 8 * 16)  # torch: 0 for the CPU kernel today


def test_static_cache_update_writes_new_positions_and_attention_reads_buffer():
    cache = torch.zeros(1, 2, 16, 8)
    new = torch.randn(1, 2, 1, 8)
    pos = torch.tensor([3])
    q = torch.randn(1, 2, 1, 8)
    mode = PerformanceCounterMode()
    with torch.no_grad(), mode:
        cache.index_copy_(2, pos, new)
        F.scaled_dot_product_attention(q, cache, cache)
    t = mode.trace()
    upd = one(t, "aten.index_copy_")
    assert upd.written[KV] == 1 * 2 * 1 * 8 * 4  # only the new position: 64 B
    assert upd.read[KV] == 0  # the cache is a write-only destination
    attn = one(t, "aten._scaled_dot_product")
    assert attn.read[KV] == 2 * 16 * 8 * 4 * 2 // 2  # the whole 1 KiB buffer, read once (k is v)
    # valid positions: 1 of 16 written so far -> 1/16 of the buffer read
    assert t.kv_cache_valid_read == 1024 // 16


def test_dynamic_cache_concat_is_kv():
    old = torch.randn(1, 2, 4, 8)
    q = torch.randn(1, 2, 1, 8)
    mode = PerformanceCounterMode()
    with torch.no_grad(), mode:
        k = torch.cat([old, torch.randn(1, 2, 1, 8)], dim=-2)
        F.scaled_dot_product_attention(q, k, k)
    with torch.no_grad(), mode:  # next step: the cache grows again
        k2 = torch.cat([k, torch.randn(1, 2, 1, 8)], dim=-2)
    cat = one(mode.trace(), "aten.cat")
    assert cat.read[KV] == 1 * 2 * 5 * 8 * 4  # the old cache, 5 positions
    assert cat.written[KV] == 1 * 2 * 6 * 8 * 4


def test_a_dead_caches_address_is_not_kv_in_the_next_block():
    q = torch.randn(1, 2, 1, 8)
    mode = PerformanceCounterMode()
    for _ in range(50):  # the allocator hands freed addresses out again, sooner or later
        cache = torch.zeros(1, 2, 16, 8)
        with torch.no_grad(), mode:
            F.scaled_dot_product_attention(q, cache, cache)  # cache becomes KV cache
        del cache
        x = torch.randn(1, 2, 16, 8)
        with torch.no_grad(), mode:
            x * 2
        assert mode.trace().per_op_read == [0, 0, 0, 1024, 0]  # an input (2*16*8*4 B), never KV


def test_tied_weights_count_once_in_compulsory():
    emb = torch.nn.Embedding(100, 8)
    head = torch.nn.Linear(8, 100, bias=False)
    head.weight = emb.weight
    ids = torch.tensor([[1, 2]])
    mode = PerformanceCounterMode()
    with torch.no_grad(), mode:
        head(emb(ids))
    t = mode.trace()
    assert t.per_op_read[W] == 2 * 8 * 4 + 100 * 8 * 4  # rows, then the whole table
    assert t.compulsory_read[W] == 100 * 8 * 4  # the one storage, once


def test_outputs_identical_and_works_under_inference_and_fake(tiny_llama):
    model, ids = tiny_llama
    with torch.no_grad():
        ref = model(ids).logits
    for grad in (torch.no_grad, torch.inference_mode):
        mode = PerformanceCounterMode()
        with grad(), mode:
            out = model(ids).logits
        assert torch.equal(out, ref)
        assert mode.get_total_flops() > 0


def test_llama_projection_flops_and_bytes(tiny_llama):
    model, ids = tiny_llama
    b, s = ids.shape
    cfg = model.config
    t = count(lambda: model(ids))
    h, i, kvd = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * cfg.head_dim
    shapes = {"q_proj": (h, h), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (h, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    for layer in range(cfg.num_hidden_layers):
        for name, (fin, fout) in shapes.items():
            parent = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            recs = [r for r in t.records if r.flops and r.module.endswith(f"layers.{layer}.{parent}.{name}")]
            assert sum(r.flops for r in recs) == 2 * b * s * fin * fout, name
            nbytes = sum(r.bytes for r in recs)
            assert nbytes == (b * s * fin + fin * fout + b * s * fout) * 4, name
            assert sum(r.read[W] for r in recs) == fin * fout * 4


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_no_uncounted_ops_prefill_and_decode(arch, tiny_model_factory):
    from transformers import StaticCache

    model, ids = tiny_model_factory(arch)
    key = cache_keyword(model)
    for grad in (torch.no_grad, torch.inference_mode):
        mode = PerformanceCounterMode()
        with grad():
            with mode:
                out = model(ids, use_cache=True)
            assert mode.uncounted_ops == {}
            with mode:
                model(ids[:, :1], use_cache=True, **{key: getattr(out, key)})
            assert mode.uncounted_ops == {}
            assert mode.trace().per_op_read[KV] > 0
            cache = StaticCache(config=model.config, max_cache_len=16)
            with mode:
                model(ids, use_cache=True, **{key: cache})
            with mode:
                model(ids[:, :1], use_cache=True, **{key: cache})
            assert mode.uncounted_ops == {}
            assert mode.coverage == (1.0, 1.0)
            assert 0 < mode.trace().kv_cache_valid_read < mode.trace().per_op_read[KV]


def test_plan_cache_is_typed_and_has_an_api():
    """A plan is made once per typed signature: aten.full([3], 1.0) writes float32 (12 B),
    aten.full([3], 1) int64 (24 B); 1 and 1.0 hash alike, so the key carries the type."""
    from perfcounter.counting.op_plan import PLANS

    PLANS.cache_clear()
    assert PLANS.cache_info() == (0, 0, 0)
    mode = PerformanceCounterMode()
    with mode:
        torch.full([3], 1.0)
        torch.full([3], 1)
        torch.full([3], 1.0)
    full = [r for r in mode.trace().records if r.op == "aten.full.default"]
    per_call = {r.dtype: (r.calls, r.written[ACT] // r.calls) for r in full}
    assert per_call == {"float32": (2, 12), "": (1, 24)}  # 3 * 4 B and 3 * 8 B (int64, no float)
    hits, misses, size = PLANS.cache_info()
    assert (hits, misses) == (1, 2) and size == 2
    # mul.Scalar on int64 [3]: * 2 stays int64 (24 B written), * 2.0 promotes to float32 (12 B)
    mode = PerformanceCounterMode()
    with mode:
        torch.ops.aten.mul.Scalar(torch.arange(3), 2)
        torch.ops.aten.mul.Scalar(torch.arange(3), 2.0)
    mul = [r for r in mode.trace().records if r.op == "aten.mul.Scalar"]
    assert sorted((r.dtype, r.written[ACT]) for r in mul) == [("float32", 12), ("int64", 24)]


def test_llama2_7b_config_under_fake_tensors():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008,
                      vocab_size=32000, num_attention_heads=32, num_key_value_heads=32)
    default = torch.get_default_dtype()
    with FakeTensorMode():
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = LlamaForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(default)
        ids = torch.randint(0, 32000, (1, 6))
        mode = PerformanceCounterMode()
        with torch.no_grad(), mode:
            model(ids)
    # 2 * 6 tokens * 6,607,343,616 non-embedding params + attention = 79.31 GFLOPs (seed 004)
    assert mode.get_total_flops() == pytest.approx(79.31e9, rel=0.01)
    assert mode.trace().per_op_read[W] == pytest.approx(6_607_343_616 * 2 + 6 * 4096 * 2, rel=1e-6)


def test_uncounted_op_counts_bytes_lists_and_warns_once():
    x = torch.randn(16)
    mode = PerformanceCounterMode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad(), mode:
            torch.special.i0(x)
            torch.special.i0(x)
    assert mode.uncounted_ops == {"aten.i0.default": 2}
    assert sum(1 for w in caught if "aten.i0.default" in str(w.message)) <= 1
    assert mode.trace().per_op_bytes == 2 * (64 + 64)
    assert mode.coverage[0] < 1.0


def test_torchao_getters():
    lin = torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False))
    x = torch.randn(2, 8)
    mode = PerformanceCounterMode(depth=2)
    with torch.no_grad(), mode:
        lin(x)
    aten = torch.ops.aten
    assert mode.get_total_flops() == 128  # 2 * 2 * 8 * 4
    assert mode.get_flop_counts()["Global"] == {aten.mm: 128}
    assert mode.get_flop_counts()["Sequential.0"] == {aten.mm: 128}
    assert mode.get_summary_flop_counts() == {"Global": 128, "Sequential": 128, "Sequential.0": 128}
    assert mode.get_io_counts()["Global"] == {aten.mm: (16 + 32 + 8) * 4}
    assert mode.get_total_io() == (16 + 32 + 8) * 4


def test_depth_truncates_module_paths(tiny_llama):
    model, ids = tiny_llama
    t = count(lambda: model(ids), depth=3)
    assert max(len(r.module.split(".")) for r in t.records) == 3


class _Scale(torch.nn.Module):
    """A function wrapped as a module object, made once and called from inside a model
    that never registers it (as `kernels` wraps transformers' apply_rotary_pos_emb)."""

    def forward(self, x):
        return x * 2.0


_SCALE = _Scale()


class _CallsScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.proj(_SCALE(x))  # the orphan runs before the first child: segment 0


def test_a_module_no_child_of_the_model_counts_with_its_caller():
    m, x = _CallsScale(), torch.ones(3, 4)
    t = count(lambda: m(x))
    mul = one(t, "aten.mul.Tensor")
    # the 3 x 4 multiply is _CallsScale's own op, before proj ran: its scope (path, segment 0)
    assert (mul.module, mul.flops) == ("_CallsScale", 12)
    assert {r.module for r in t.records} == {"_CallsScale", "_CallsScale.proj"}
    assert "_Scale" not in t.modules and "_Scale" not in {r.module.split(".")[0] for r in t.records}


def test_flex_attention_counted_once():
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 128, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = count(lambda: flex_attention(q, q, q))
    flex = [r for r in t.records if "flex" in r.op]
    assert len(flex) == 1 and flex[0].flops >= 4 * 2 * 128 * 128 * 16


def test_mode_refuses_nesting_and_bad_arguments():
    mode = PerformanceCounterMode()
    with pytest.raises(RuntimeError, match="already counting"):
        with mode, mode:
            pass
    with pytest.raises(ValueError, match="depth"):
        PerformanceCounterMode(depth=0)
    with pytest.raises(ValueError, match="io_model"):
        PerformanceCounterMode(io_model="fused")


def test_roles_are_named():
    assert ROLES == ("weight", "kv_cache", "activation", "input", "buffer")


def test_compulsory_merges_regions_of_one_storage():
    x = torch.randn(8)
    y = torch.randn(1, 4)

    def run():
        a = x[:4] + 1  # reads bytes 0-16 of x
        b = x[4:] + 1  # reads bytes 16-32
        c = x[:4] * 2  # bytes 0-16 again
        d = y.expand(5, 4) * 1  # a broadcast view: 80 B per op, 16 B of storage
        return a, b, c, d

    t = count(run)
    assert t.per_op_read[INP] == 16 * 3 + 80  # every op reads its region
    assert t.compulsory_read[INP] == 32 + 16  # x once (two halves merged), y's storage once
    assert t.compulsory_written[ACT] == 16 * 3 + 80  # four new tensors, written once each


def test_compulsory_cache_made_in_block_is_kv_once():
    new = torch.randn(1, 2, 3, 8)
    q = torch.randn(1, 2, 3, 8)
    pos = torch.arange(3)

    def run():
        cache = torch.zeros(1, 2, 16, 8)  # made in the block: written whole (1 KiB)
        cache.index_copy_(2, pos, new)  # then 3 positions (192 B)
        F.scaled_dot_product_attention(q, cache, cache)  # read whole, twice (k is v)

    t = count(run)
    # the buffer is KV cache throughout: written once whole (the new positions fall inside
    # it), read once whole; 1 * 2 * 16 * 8 * 4 = 1024 B
    assert t.compulsory_written[KV] == 1024
    assert t.compulsory_read[KV] == 1024
    assert t.compulsory_read[INP] == 2 * 192 + 24  # new, q, and 3 int64 positions


def test_torchao_constructor_and_pretty_summary(capsys):
    lin = torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False))
    x = torch.randn(2, 8)
    with torch.no_grad(), PerformanceCounterMode(display=True, depth=10, debug=False) as mode:
        lin(x)
    printed = capsys.readouterr().out
    # 2 * 2 * 8 * 4 = 128 FLOPs under Sequential and Sequential.0
    assert mode.pretty_summary_counts() == "Sequential: 128.00FLOPs\n Sequential.0: 128.00FLOPs"
    assert printed.strip() == mode.pretty_summary_counts()
    assert mode.pretty_summary_counts("io", depth=1) == "Sequential: 224.00B"  # (16 + 32 + 8) * 4


# --- inference_mode: composites run their own decomposition -----------------------------


def test_eval_dropout_returns_its_input_in_both_grad_modes():
    drop = torch.nn.Dropout(0.1).eval()
    x = torch.randn(4, 8)
    for grad in (torch.no_grad, torch.inference_mode):
        mode = PerformanceCounterMode()
        with grad(), mode:
            y = drop(x)
        assert y is x  # no copy (the Python decomposition of dropout clones in eval)
        assert mode.trace().per_op_bytes == 0, grad.__name__


def test_short_paths_of_to_and_reshape_count_as_their_decomposition():
    x = torch.randn(2, 5, 8)
    for grad in (torch.no_grad, torch.inference_mode):
        mode = PerformanceCounterMode()
        with grad(), mode:
            y = x * 2  # an inference tensor under inference_mode
            same, flat, wide = y.to(torch.float32), y.reshape(10, 8), y.to(torch.float64)
        assert same is y and flat.data_ptr() == y.data_ptr()  # the tensor itself; a view
        ops = sorted((r.op, r.calls, r.bytes) for r in mode.trace().records)
        # mul: reads 320 B, writes 320 B; the cast to float64 reads 320 B and writes 640 B;
        # the reshape is one view, the cast to float32 nothing
        assert ops == [("aten._to_copy.default", 1, 960), ("aten.mul.Tensor", 1, 640),
                       ("aten.view.default", 1, 0)], grad.__name__


@pytest.mark.parametrize("fn", [
    lambda x, w: F.linear(x, w, w[:, 0]),  # linear with bias, 3-D input
    lambda x, w: torch.matmul(x, w.t()),
    lambda x, w: F.one_hot(x.argmax(-1), 8),  # a Python decomposition counts otherwise
    lambda x, w: torch.where(x > 0),  # nonzero, then unbind
    lambda x, w: F.scaled_dot_product_attention(  # a bool mask, made additive first
        x[None], x[None], x[None], attn_mask=torch.ones(5, 5, dtype=torch.bool).tril()),
], ids=["linear", "matmul", "one_hot", "where", "sdpa_bool_mask"])
def test_both_grad_modes_count_a_composite_alike(fn):
    x, w = torch.randn(2, 5, 8), torch.nn.Parameter(torch.randn(6, 8))
    counted = []
    for grad in (torch.no_grad, torch.inference_mode):
        with grad():
            reference = fn(x, w)
            mode = PerformanceCounterMode()
            with mode:
                result = fn(x, w)
        result, reference = (result, reference) if isinstance(result, tuple) else \
            ((result,), (reference,))
        assert all(torch.equal(a, b) for a, b in zip(result, reference)), grad.__name__
        counted.append(_counted(mode.trace()))
    assert counted[0] == counted[1] and counted[0]


@pytest.mark.parametrize("make_x, bias, whole", [
    (lambda: torch.randn(2, 5, 8), False, True),  # t, view, mm, _unsafe_view
    (lambda: torch.randn(2, 5, 8), True, True),  # view, t, addmm, view
    (lambda: torch.randn(5, 8), True, True),  # t, addmm
    (lambda: torch.randn(2, 8, 5).transpose(1, 2), False, False),  # a copy first: decomposed
], ids=["3d", "3d_bias", "2d_bias", "transposed"])
def test_linear_under_inference_mode_is_counted_whole_once_learned(make_x, bias, whole):
    torch.manual_seed(0)
    w, b = torch.nn.Parameter(torch.randn(6, 8)), torch.nn.Parameter(torch.randn(6))
    xs = [make_x() for _ in range(3)]  # one signature, three calls: the first one learns
    counted, outputs = [], []
    for grad in (torch.no_grad, torch.inference_mode):
        mode = PerformanceCounterMode()
        with grad(), mode:
            outputs.append([F.linear(x, w, b if bias else None) for x in xs])
        counted.append(sorted((r.op, r.module, r.shapes, r.calls, r.flops, r.read, r.written)
                              for r in mode.trace().records))  # views included
    with torch.inference_mode():
        plain = [F.linear(x, w, b if bias else None) for x in xs]
    assert counted[0] == counted[1] and counted[0]  # every record, as no_grad counts it
    assert all(torch.equal(a, c) and torch.equal(b_, c) for a, b_, c in zip(*outputs, plain))
    # one signature: whole after its first call (2 calls whole), or decomposed every time
    assert tuple(mode._mode.linears.cache_info()) == ((1, 0, 2) if whole else (0, 1, 0))


def test_a_tensor_made_in_the_block_is_an_activation():
    x = torch.randn(3, 4)
    for grad in (torch.no_grad, torch.inference_mode):
        t = count(lambda: x[torch.tensor([2, 0])], grad=grad)
        rec = one(t, "aten.index")
        # x's 2 rows (2 * 4 * 4 = 32 B) are an input; the index (2 int64 = 16 B), made by
        # torch.tensor inside the block, an activation, whatever address it got
        assert rec.read == [0, 0, 16, 32, 0], grad.__name__


def test_eager_experts_under_fake_tensors_say_what_to_do():
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    with FakeTensorMode():
        x = torch.randn(4)
        with pytest.raises(DynamicOutputShapeException) as caught, PerformanceCounterMode():
            torch.nonzero(x)
    assert "experts_implementation='eager'" in str(caught.value.__notes__)


# --- attention masks: what a causal kernel executes ------------------------------------


@pytest.mark.parametrize("window, pairs", [(None, 21), (4, 18)])
def test_our_model_passes_its_mask_structure(window, pairs):
    """tiny_args: 2 layers, batch 2, 4 heads of 8; a 6-token prompt into a 10-position cache.
    Per score 8 + 8 + 3 adds, 8 + 8 + 1 muls, 1 exp, 1 cmp = 38 FLOPs; dense: 6 x 10 scores
    a head. Causal: 1 + 2 + ... + 6 = 21 pairs; a window of 4: 1 + 2 + 3 + 4 + 4 + 4 = 18.
    Real tensors read the mask; fake tensors take the structure from the Attention module."""
    from conftest import randomize_, tiny_args

    from perfcounter.generation.config_only import count_config_only, greedy_generate
    from perfcounter.counter import TransformerPerformanceCounter
    from perfcounter.models.model import Transformer

    args = tiny_args(sliding_window=window)
    torch.manual_seed(0)
    real = TransformerPerformanceCounter()
    model = randomize_(Transformer(args))
    greedy_generate(model, torch.randint(0, 64, (2, 6)), 4, phase=real.count)
    fake = TransformerPerformanceCounter()
    count_config_only(args, fake, batch_size=2, prompt_length=6, max_new_tokens=4,
                      dtype=torch.float32)
    for counter in (real, fake):
        prefill = counter.counts["prefill"]
        skipped = 2 * 2 * 4 * (6 * 10 - pairs) * 38  # layers x batch x heads x masked pairs
        assert prefill.total_flops - prefill.executed_flops == skipped
    assert fake.counts["decode"].executed_flops == real.counts["decode"].executed_flops


def test_a_compiled_function_is_counted_as_its_eager_ops():
    """A counted block runs compiled code eagerly (compiler stance force_eager, restored
    after): the records are the eager run's, and Dynamo never traces the mode's own frames
    (no warning)."""
    lin = torch.nn.Linear(8, 8)
    fn = torch.compile(lambda x: torch.relu(lin(x)) * 2, backend="eager")
    x = torch.randn(2, 8)
    fn(x)  # compiled outside the counter
    eager, compiled = PerformanceCounterMode(), PerformanceCounterMode()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        with eager:
            torch.relu(lin(x)) * 2
        with compiled:
            fn(x)
    assert [(r.op, r.flops, r.bytes) for r in compiled.trace().records] == \
        [(r.op, r.flops, r.bytes) for r in eager.trace().records]
    # addmm 2*M*N*K + M*N (bias) = 2*2*8*8 + 2*8 = 272; relu 16; mul 16: 304
    assert compiled.get_total_flops() == 304
    assert torch._dynamo.eval_frame._stance.stance == "default"  # restored


def test_a_counter_is_freed_without_the_cyclic_collector(tiny_llama):
    # no reference cycle (mode <-> module tracker): dropping the last reference frees the
    # counter and what it holds at once, not at the next full collection
    import gc
    import weakref

    from perfcounter import TransformerPerformanceCounter

    model, ids = tiny_llama
    gc.collect()
    gc.disable()
    try:
        counter = TransformerPerformanceCounter()
        with torch.no_grad(), counter.count("prefill", num_tokens=ids.numel()):
            model(ids)
        counter.counts  # stats built
        gone = weakref.ref(counter)
        del counter
        assert gone() is None
    finally:
        gc.enable()
