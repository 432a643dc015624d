"""PerformanceStats and the roofline, from traces written by hand.

The reference phase is one bf16 matmul x[4, 6] @ w[6, 5]:
  FLOPs = 2 * M * N * K = 2 * 4 * 5 * 6 = 240
  bytes = (M*K + K*N + M*N) * 2 = (24 + 30 + 20) * 2 = 148
(x is an input, w a weight, the output an activation). The toy device moves
100 B/s and computes 1000 FLOP/s in bf16, 500 FLOP/s in fp32.
"""
import math

import pytest
import torch

from perfcounter.devices import DeviceSpec
from perfcounter.pricing.roofline import largest_numel, roofline
from perfcounter.stats import PerformanceStats
from perfcounter._util import sum_or_none
from perfcounter.stats_dict import spec_from_dict
from perfcounter.counting.breakdown import by_module_and_op
from perfcounter.counting.module_kinds import record_scopes
from perfcounter.counting.module_path import check_depth
from perfcounter.trace import ROLES, OpRecord, Trace, args_from_text


def mm_record(m, k, n, module="M.lin", dtype="bfloat16", elem=2, calls=1):
    """x[m, k] (input) @ w[k, n] (weight) -> [m, n] (activation), `calls` times."""
    flops = 2 * m * n * k * calls
    return OpRecord("aten.mm.default", module, dtype, args_from_text(f"[{m}, {k}], [{k}, {n}]", dtype),
                    calls,
                    flops, flops, [flops // 2, flops // 2, 0, 0, 0, 0, 0],
                    [k * n * elem * calls, 0, 0, m * k * elem * calls, 0],
                    [0, 0, m * n * elem * calls, 0, 0])


def trace_of(*records, compulsory_read=None, compulsory_written=None):
    read = compulsory_read or [sum(r.read[i] for r in records) for i in range(len(ROLES))]
    written = compulsory_written or [sum(r.written[i] for r in records) for i in range(len(ROLES))]
    return Trace(records=list(records), compulsory_read=read, compulsory_written=written)


@pytest.fixture
def toy():
    return DeviceSpec(device_type="cuda", name="toy", bandwidth=100.0, flops_per_s=1000.0,
                      dtype=torch.bfloat16, flops_by_dtype={"float32": 500.0},
                      mem_pj_per_bit=1.0, pj_per_flop_by_dtype={"bfloat16": 0.5})


def test_matmul_without_device():
    s = PerformanceStats("prefill", 4, 0.5, trace_of(mm_record(4, 6, 5)))
    assert s.total_flops == 240  # 2 * 4 * 5 * 6
    assert s.total_io == 148  # (24 + 30 + 20) * 2
    assert s.token_throughput == 8.0  # 4 tokens / 0.5 s
    assert s.achieved_flops_per_s == 480.0  # 240 / 0.5
    assert s.achieved_bandwidth == 296.0  # 148 / 0.5
    for name in ("device_bandwidth", "device_flops_per_s", "theoretical_io_latency",
                 "theoretical_compute_latency", "bandwidth_utilization", "flops_utilization",
                 "roofline", "roofline_latency", "bound", "energy", "energy_j",
                 "energy_per_token_j"):
        assert getattr(s, name) is None, name
    assert s.flops_by_kind["mul"] == 120 and s.flops_by_kind["add"] == 120  # 4*5*6 each
    assert s.io_by_role == {"read": {"weight": 60, "kv_cache": 0, "activation": 0, "input": 48, "buffer": 0},
                            "written": {"weight": 0, "kv_cache": 0, "activation": 40, "input": 0, "buffer": 0}}
    assert s.arithmetic_intensity == pytest.approx(240 / 148)


def test_matmul_on_a_device(toy):
    s = PerformanceStats("prefill", 4, 0.5, trace_of(mm_record(4, 6, 5)), toy)
    assert s.device_bandwidth == 100.0 and s.device_flops_per_s == 1000.0
    assert s.theoretical_io_latency == pytest.approx(1.48)  # 148 B / 100 B/s
    assert s.theoretical_compute_latency == pytest.approx(0.24)  # 240 / 1000
    assert s.bandwidth_utilization == pytest.approx(2.96)  # 296 / 100, a fraction
    assert s.flops_utilization == pytest.approx(0.48)  # 480 / 1000
    assert s.roofline_latency == pytest.approx(1.48)  # max(0.24, 1.48)
    assert s.bound == "memory"
    assert s.roofline_token_throughput == pytest.approx(4 / 1.48)
    # energy: 240 FLOPs * 0.5 pJ + 148 B * 8 * 1 pJ/bit = 120 + 1184 = 1304 pJ
    assert s.energy.compute_j == pytest.approx(120e-12)
    assert s.energy.memory_j == pytest.approx(1184e-12)
    assert s.energy_j == pytest.approx(1304e-12)
    assert s.energy_per_token_j == pytest.approx(326e-12)  # 1304 / 4


def test_compute_bound_and_per_dtype_peak(toy):
    # fp32 matmul 64x64x64: 2 * 64^3 = 524,288 FLOPs at 500 FLOP/s = 1048.576 s;
    # bytes 3 * 4096 * 4 = 49,152 at 100 B/s = 491.52 s -> compute-bound
    s = PerformanceStats("p", 64, None, trace_of(mm_record(64, 64, 64, dtype="float32", elem=4)),
                         toy)
    assert s.total_flops == 524_288
    assert s.roofline.compute_s == pytest.approx(1048.576)
    assert s.roofline.memory_s == pytest.approx(491.52)
    assert s.roofline_latency == pytest.approx(1048.576)
    assert s.bound == "compute"
    assert s.theoretical_compute_latency == pytest.approx(1048.576)


def test_roofline_sums_ops_and_compulsory_is_one_max(toy):
    # two records: A = 4x6x5 bf16 (0.24 s compute, 1.48 s memory),
    # B = 64^3 fp32 (1048.576 s compute, 491.52 s memory)
    a, b = mm_record(4, 6, 5), mm_record(64, 64, 64, module="M.other", dtype="float32", elem=4)
    t = trace_of(a, b, compulsory_read=[1000, 0, 0, 0, 0], compulsory_written=[0, 0, 500, 0, 0])
    per_op = PerformanceStats("p", 1, None, t, toy)
    assert per_op.roofline_latency == pytest.approx(1.48 + 1048.576)  # Σ max per op
    assert per_op.bound == "compute"  # 1048.576 s compute-bound vs 1.48 s memory-bound
    comp = PerformanceStats("p", 1, None, t, toy, io_model="compulsory")
    assert comp.total_io == 1500
    # max(Σ compute 0.24 + 1048.576, 1500 B / 100 B/s = 15 s)
    assert comp.roofline_latency == pytest.approx(1048.816)
    assert comp.io_by_role["read"]["weight"] == 1000


def test_unmeasured_latency_gives_none(toy):
    s = PerformanceStats("p", 4, None, trace_of(mm_record(4, 6, 5)), toy,
                         timing="not measured: fake or meta tensors")
    assert s.token_throughput is None and s.achieved_bandwidth is None
    assert s.bandwidth_utilization is None and s.flops_utilization is None
    assert s.roofline_latency == pytest.approx(1.48)  # the model still prices it


def test_zero_latency_and_zero_tokens_do_not_divide():
    s = PerformanceStats("p", 0, 0.0, trace_of(mm_record(4, 6, 5)))
    assert s.token_throughput is None and s.achieved_flops_per_s is None


def test_flop_and_io_counts_roll_up_to_every_parent():
    t = trace_of(mm_record(4, 6, 5, module="M.layers.0.mlp"),
                 mm_record(4, 6, 5, module="M.layers.1.mlp"),
                 mm_record(1, 6, 5, module=""))  # outside any module: Global only
    s = PerformanceStats("p", 4, 1.0, t)
    fc = s.flop_counts
    assert fc["Global"] == {"aten.mm": 540}  # 240 + 240 + 2*1*5*6
    assert fc["M"] == {"aten.mm": 480} and fc["M.layers"] == {"aten.mm": 480}
    assert fc["M.layers.0.mlp"] == {"aten.mm": 240}
    assert s.flops_summary["M.layers.1"] == 240
    assert s.io_summary["Global"] == 148 + 148 + (6 + 30 + 5) * 2  # 378


def test_modules_table_and_depth():
    t = trace_of(mm_record(4, 6, 5, module="M.layers.0.mlp"), mm_record(4, 6, 5, module="M.head"))
    s = PerformanceStats("p", 4, 1.0, t)
    rows = s.modules(depth=2)
    assert set(rows) == {"M", "M.layers", "M.head"}
    assert rows["M"]["flops"] == 480 and rows["M.layers"]["bytes_read"] == 108  # 60 + 48
    assert "roofline_s" not in rows["M"]
    with pytest.raises(ValueError, match="depth"):
        s.modules(depth=0)


def test_scopes_follow_llm_profiler_names():
    assert record_scopes("LlamaForCausalLM.model.layers.0.self_attn.q_proj") == \
        ["transformer", "attn"]
    assert record_scopes("Transformer.layers.3.feed_forward.w1") == ["transformer", "mlp"]
    assert record_scopes("LlamaForCausalLM.model.embed_tokens") == ["transformer", "embedding"]
    assert record_scopes("LlamaForCausalLM.lm_head") == ["lm_head"]
    assert record_scopes("Transformer.output") == ["lm_head"]
    # "output" deeper in the tree is not the output head
    assert record_scopes("Bert.layers.0.attention.output") == ["transformer", "attn"]
    assert record_scopes("") == []
    t = trace_of(mm_record(4, 6, 5, module="L.model.layers.0.self_attn.q_proj"),
                 mm_record(4, 6, 5, module="L.model.layers.0.mlp.up_proj"),
                 mm_record(4, 6, 5, module="L.lm_head"))
    sc = PerformanceStats("p", 4, 1.0, t).scopes()
    assert sc["transformer"]["flops"] == 480 and sc["attn"]["flops"] == 240
    assert sc["mlp"]["flops"] == 240 and sc["lm_head"]["flops"] == 240
    assert sc["embedding"]["calls"] == 0


def test_on_recosts_without_measured_latency(toy):
    s = PerformanceStats("decode", 4, 0.5, trace_of(mm_record(4, 6, 5)))
    fast = DeviceSpec(device_type="cuda", name="fast", bandwidth=1000.0, flops_per_s=1e6,
                      dtype=torch.bfloat16)
    on_toy, on_fast = s.on(toy), s.on(fast)
    assert on_toy.roofline_latency == pytest.approx(1.48)
    assert on_fast.roofline_latency == pytest.approx(0.148)  # 148 / 1000
    assert on_fast.latency is None and on_fast.flops_utilization is None
    assert on_fast.trace is s.trace and on_fast.total_flops == 240
    assert s.on(toy, io_model="compulsory").io_model == "compulsory"


def test_on_accepts_a_registry_name():
    s = PerformanceStats("p", 4, None, trace_of(mm_record(4, 6, 5)))
    h100 = s.on("h100-sxm")
    assert h100.device_spec.name == "h100-sxm"
    assert h100.roofline_latency > 0


def test_unknown_io_model():
    with pytest.raises(ValueError, match="per_op, compulsory"):
        PerformanceStats("p", 1, None, Trace(), io_model="perop")


def test_dict_round_trip_and_item_access(toy):
    s = PerformanceStats("prefill", 4, 0.5, trace_of(mm_record(4, 6, 5)), toy, "per_op", 0.6,
                         "time.perf_counter")
    d = s.to_dict()
    assert d["total_flops"] == 240 and d["bandwidth_utilization"] == pytest.approx(2.96)
    back = PerformanceStats.from_dict(d)
    assert back.to_dict() == d
    assert back.device_spec == toy
    assert s["total_io"] == 148
    with pytest.raises(KeyError):
        s["nope"]


def test_spec_from_dict_drops_subclass_fields(toy):
    d = toy.to_dict() | {"use_tensorcores": True}
    assert spec_from_dict(d) == toy


# -- per-element costs and the host link -----------------------------------------

def test_largest_numel_reads_the_mode_signature():
    assert largest_numel(args_from_text("[1, 4, 6, 6], -1, False", "float32")) == 144  # 1*4*6*6
    assert largest_numel(args_from_text("[4096], [1, 6, 4096]", "float32")) == 24576  # 6 * 4096
    assert largest_numel(()) == 0


def test_per_element_costs_replace_flops():
    spec = DeviceSpec(device_type="pim", name="pe", bandwidth=1e12, flops_per_s=1e12,
                      dtype=torch.bfloat16, softmax_ns_per_element=0.1,
                      silu_ns_per_element=0.15, rmsnorm_ns_per_element=0.275)
    softmax = OpRecord("aten._softmax.default", "M.attn", "bfloat16",
                       args_from_text("[1, 4, 6, 6], -1, False", "bfloat16"),
                       2, 1000, 1000, read=[0, 0, 576, 0, 0], written=[0, 0, 576, 0, 0])
    silu = OpRecord("aten.silu.default", "M.mlp", "bfloat16", args_from_text("[1, 6, 48]", "bfloat16"),
                    1, 288, 288,
                    read=[0, 0, 576, 0, 0], written=[0, 0, 576, 0, 0])
    # a norm written out op by op: pow (no weight) and the weight multiply
    pow_ = OpRecord("aten.pow.Tensor_Scalar", "M.layers.0.input_layernorm", "float32",
                    args_from_text("[1, 6, 32], 2", "float32"),
                                   1, 192, 192, read=[0, 0, 768, 0, 0], written=[0, 0, 768, 0, 0])
    scale = OpRecord("aten.mul.Tensor", "M.layers.0.input_layernorm", "bfloat16",
                     args_from_text("[32], [1, 6, 32]", "bfloat16"),
                                    1, 192, 192, read=[64, 0, 384, 0, 0],
                     written=[0, 0, 384, 0, 0])
    line = roofline(Trace(records=[softmax, silu, pow_, scale]), spec)
    # softmax 2 calls * 144 elements * 0.1 ns = 28.8 ns; SiLU 288 * 0.15 ns = 43.2 ns;
    # RMSNorm 192 elements * 0.275 ns = 52.8 ns; the pow keeps memory time only
    assert line.compute_s == pytest.approx((28.8 + 43.2 + 52.8) * 1e-9)
    # memory: (1152 + 1152 + 1536 + 832) B / 1e12 B/s = 4.672 ns; every op is compute-bound
    # except the pow (1.536 ns memory, 0 compute)
    assert line.memory_s == pytest.approx(4.672e-9)
    assert line.ops_s == pytest.approx((28.8 + 43.2 + 1.536 + 52.8) * 1e-9)


def test_host_link_for_a_device_behind_one():
    spec = DeviceSpec(device_type="pim", name="link", bandwidth=100.0, flops_per_s=1000.0,
                      dtype=torch.bfloat16, host_to_device_bw=10.0, device_to_host_bw=20.0)
    s = PerformanceStats("p", 4, None, trace_of(mm_record(4, 6, 5)), spec)
    line = s.roofline
    assert (line.host_to_device_bytes, line.device_to_host_bytes) == (48, 40)  # x in, out back
    assert line.host_link_s == pytest.approx(48 / 10 + 40 / 20)  # 6.8 s
    assert s.roofline_latency == pytest.approx(1.48 + 6.8)
    cpu = DeviceSpec(device_type="cpu", name="cpu", bandwidth=100.0, flops_per_s=1000.0,
                     dtype=torch.bfloat16, host_to_device_bw=10.0)
    on_cpu = PerformanceStats("p", 4, None, trace_of(mm_record(4, 6, 5)), cpu)
    assert on_cpu.roofline.host_link_s == 0  # the host is the device


def test_spec_without_bandwidth_is_not_priced():
    spec = DeviceSpec(device_type="cuda", name="partial", flops_per_s=1000.0, dtype=torch.bfloat16)
    s = PerformanceStats("p", 4, 1.0, trace_of(mm_record(4, 6, 5)), spec)
    assert s.roofline is None and s.energy_j is None and s.bandwidth_utilization is None
    assert math.isclose(s.flops_utilization, 0.24)  # 240 FLOP/s achieved / 1000


def test_by_module_and_op_rolls_records_up_every_parent():
    recs = [mm_record(4, 6, 5, module="M.a"), mm_record(4, 6, 5, module="M.b.c"),
            OpRecord("aten.add.Tensor", "", "bfloat16", args_from_text("[4]", "bfloat16"), 1, 4, 4)]
    # 240 FLOPs per matmul; the add outside any module counts under Global only
    assert by_module_and_op(recs, lambda r: r.flops) == {
        "Global": {"aten.mm": 480, "aten.add": 4}, "M": {"aten.mm": 480},
        "M.a": {"aten.mm": 240}, "M.b": {"aten.mm": 240}, "M.b.c": {"aten.mm": 240}}
    # zeros add no op, but every module that ran stays a key (FLOPs and bytes share keys)
    assert by_module_and_op(recs, lambda r: 0) == {
        "Global": {}, "M": {}, "M.a": {}, "M.b": {}, "M.b.c": {}}


def test_depth_check_and_none_propagating_sums():
    assert check_depth(3) == 3 and check_depth(None, none_ok=True) is None
    for bad in (0, -1, True, 2.5, None):
        with pytest.raises(ValueError, match="depth must be a positive int, got"):
            check_depth(bad)
    with pytest.raises(ValueError, match="depth must be a positive int or None, got 0"):
        check_depth(0, none_ok=True)
    with pytest.raises(ValueError, match="positive int or None"):
        PerformanceStats("p", 1, None, trace_of(mm_record(4, 6, 5))).modules(depth=0)
    assert sum_or_none(0.5, 0.25) == 0.75 and sum_or_none() == 0
    assert sum_or_none(0.5, None) is None  # a phase that was not measured has no total
