"""A rank of a sharded model (parallel/sharding.py) counted from its sharded shapes, its
collectives as ops (costs/collectives.py), and their price on a link (pricing/collectives.py)."""
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.generation.config_only import count_config
from perfcounter.models.args import ModelArgs
from perfcounter.parallel.sharding import ParallelConfig, ParallelError, rank_args
from perfcounter.pricing import collectives, links
from perfcounter.trace import ROLES, OpRecord
from perfcounter.trace_args import TensorArg

WEIGHT, ACT = ROLES.index("weight"), ROLES.index("activation")
# 2 layers, dim 64, 4 heads of 16, 4 KV heads, intermediate 128, vocab 256
TOY = ModelArgs(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_local_heads=4, dim=64,
                intermediate_size=128)
ALL_REDUCE, ALL_GATHER = "perfcounter.all_reduce.default", "perfcounter.all_gather.default"


def prefill(args, tp=1, prompt=8):
    rank = rank_args(args, ParallelConfig(tensor_parallel_size=tp))
    return count_config(rank, batch_size=1, prompt_length=prompt, new_tokens=2).counts["prefill"].trace


def total(trace, op=None, module=None, role=None, field="flops"):
    out = 0
    for r in trace.records:
        if (op is None or r.op == op) and (module is None or r.module.endswith(module)):
            out += getattr(r, field) if role is None else r.read[role]
    return out


@pytest.fixture(scope="module")
def toy_traces():
    return {tp: prefill(TOY, tp) for tp in (1, 2, 4)}


def test_rank_shapes_are_the_sharded_ones():
    r = rank_args(ModelArgs.from_name("llama-3.1-70b"), ParallelConfig(tensor_parallel_size=8))
    # 64 heads / 8, 8 KV heads / 8, 28672 / 8, 128256 (a multiple of 64) / 8
    assert (r.n_head, r.n_local_heads, r.intermediate_size, r.vocab_size) == (8, 1, 3584, 16032)
    assert (r.dim, r.head_dim, r.n_layer) == (8192, 128, 80)  # replicated
    r16 = rank_args(ModelArgs.from_name("llama-3.1-70b"), ParallelConfig(tensor_parallel_size=16))
    assert (r16.n_head, r16.n_local_heads) == (4, 1)  # 8 KV heads < 16 ranks: one each, replicated
    # 49152 padded to a multiple of 64 is itself; 151936 / 64 = 2374, so / 2 = 75968
    assert rank_args(ModelArgs.from_name("qwen2.5-7b"),
                     ParallelConfig(tensor_parallel_size=2)).vocab_size == 152064 // 2


def test_one_rank_is_the_model_itself():
    assert rank_args(TOY) is TOY
    assert rank_args(TOY, ParallelConfig(data_parallel_size=4)) is TOY  # replicas: whole model


def test_linear_flops_and_weight_bytes_are_the_unsharded_ones_over_tp(toy_traces):
    one = toy_traces[1]
    # per layer, 8 tokens: wqkv 2*8*64*192 = 196608, wo 2*8*64*64 = 65536,
    # w1 w3 w2 3 * 2*8*64*128 = 393216 -> 655360; x 2 layers + head 2*8*64*256 = 262144
    assert total(one, "aten.mm.default") == 2 * 655360 + 262144 == 1572864
    # linear weights, bf16: layer 64*192 + 64*64 + 3*64*128 = 40960 params, x2 + head 16384
    assert total(one, "aten.mm.default", role=WEIGHT) == 2 * (2 * 40960 + 16384) == 196608
    for tp in (2, 4):
        assert total(toy_traces[tp], "aten.mm.default") == 1572864 // tp
        assert total(toy_traces[tp], "aten.mm.default", role=WEIGHT) == 196608 // tp
        for norm in ("attention_norm", "ffn_norm", ".norm"):  # replicated: exact
            assert total(toy_traces[tp], module=norm, role=WEIGHT) == \
                total(one, module=norm, role=WEIGHT) > 0


def test_kv_heads_fewer_than_tp_are_replicated():
    gqa = ModelArgs(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_local_heads=2, dim=64,
                    intermediate_size=128)
    trace = prefill(gqa, tp=4)
    # a rank: 1 query head + 1 KV head (2 KV heads < 4 ranks): wqkv out 16 + 2*16 = 48,
    # 2*8*64*48 = 49152 a layer
    wqkv = [r for r in trace.records if r.op == "aten.mm.default" and r.module.endswith("wqkv")]
    assert sum(r.flops for r in wqkv) == 2 * 49152


def test_collectives_are_records_with_their_bytes(toy_traces):
    two = toy_traces[2]
    # 5 all-reduces of [1, 8, 64] bf16 = 1024 B: the embedding's, and attention's and the
    # MLP's in each of 2 layers; each reads and writes its tensor
    reduces = [r for r in two.records if r.op == ALL_REDUCE]
    assert sum(r.calls for r in reduces) == 5
    assert sum(r.written[ACT] for r in reduces) == sum(r.read[ACT] for r in reduces) == 5 * 1024
    assert sum(r.flops for r in reduces) == 0
    modules = {r.module for r in reduces}
    assert {"Transformer", "Transformer.layers.0.attention", "Transformer.layers.1.feed_forward"} \
        <= modules
    # the head's all-gather: [1, 8, 128] read (2048 B), [1, 8, 256] written (4096 B)
    (gather,) = [r for r in two.records if r.op == ALL_GATHER]
    assert (sum(gather.read), sum(gather.written), gather.module) == (2048, 4096, "Transformer")
    assert not any(r.op.startswith("perfcounter.all") for r in toy_traces[1].records)


@pytest.mark.parametrize("tp, message", [
    (3, "--tensor_parallel_size 3 does not divide the 4 attention heads of the model; "
        "valid: 1, 2, 4"),
])
def test_bad_tensor_parallel_size_is_one_line(tp, message):
    with pytest.raises(ParallelError) as e:
        rank_args(TOY, ParallelConfig(tensor_parallel_size=tp))
    assert str(e.value) == message


def test_expert_parallel_on_a_dense_model_is_refused():
    with pytest.raises(ParallelError, match="is dense"):
        rank_args(TOY, ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True))
    with pytest.raises(ParallelError, match="integer >= 1"):
        ParallelConfig(tensor_parallel_size=0)


# -- pricing on a link ------------------------------------------------------------------
def record(op, nbytes, ranks, calls=1):
    written = [0] * len(ROLES)
    written[ACT] = nbytes * calls
    return OpRecord(op, "Transformer.layers.0.attention", "bfloat16",
                    (TensorArg((nbytes // 2,), (1,), "bfloat16"), ranks), calls,
                    written=written, read=list(written))


def test_ring_all_reduce_by_hand():
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    link = links.within(spec, 8)
    # NVLink 450 GB/s one way x 0.8 = 360 GB/s busbw; 0.6 us a step
    assert (link.kind, link.busbw, link.latency_s) == ("nvlink", 360e9, 0.6e-6)
    # 2 * 7/8 * 360e6 B / 360e9 B/s = 1.75 ms; + 2 * 7 * 0.6 us = 8.4 us
    r = record(ALL_REDUCE, 360_000_000, 8, calls=3)
    assert collectives.record_seconds(r, spec) == pytest.approx(3 * (1.75e-3 + 8.4e-6), rel=1e-12)
    assert collectives.all_reduce_s(360e6, 8, link)[1] == "ring"


def test_all_gather_send_and_tree_by_hand():
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    nv = links.within(spec, 4)
    # all-gather of a 4 MB output over 4: 3/4 * 4e6 / 360e9 + 3 * 0.6e-6
    assert collectives.record_seconds(record(ALL_GATHER, 4_000_000, 4), spec) == \
        pytest.approx(3e6 / 360e9 + 1.8e-6, rel=1e-12)
    assert collectives.collective_s("send_recv", 1e6, 2, nv) == pytest.approx(1e6 / 360e9 + 0.6e-6)
    # 16 ranks cross nodes: InfiniBand 50 GB/s x 0.8 = 40 GB/s, 5 us a step; the ring's
    # 2 * 15 = 30 steps against the tree's 2 * log2 16 = 8: NCCL's tree
    net = links.within(spec, 16)
    assert (net.kind, net.busbw) == ("network", 40e9)
    seconds, algo = collectives.all_reduce_s(1e6, 16, net)
    assert algo == "tree"
    assert seconds == pytest.approx(2 * 15 / 16 * 1e6 / 40e9 + 8 * 5e-6, rel=1e-12)


def test_link_energy_and_a_device_without_a_link():
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    pj = spec.interconnect_pj_per_bit
    r = record(ALL_REDUCE, 1_000_000, 4)
    # a ring all-reduce sends 2 * 3/4 * 1e6 = 1.5e6 B a rank
    expected = 0.0 if pj is None else 1.5e6 * 8 * pj * 1e-12
    assert collectives.record_joules(r, spec) == pytest.approx(expected)
    cpu = get_device_spec("generic-cpu")
    with pytest.raises(collectives.LinkError, match="no link to another device"):
        collectives.check_link(cpu, 2)
    assert collectives.check_link(cpu, 1) is None


# a mixture of 8 experts, 2 a token, on the toy's shapes
MOE = ModelArgs(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_local_heads=4, dim=64,
                intermediate_size=128, num_experts=8, num_activated_experts=2)
ALL_TO_ALL = "perfcounter.all_to_all.default"


def test_expert_parallel_rank_holds_its_experts_and_dispatches_its_rows():
    def experts(trace, field):
        rs = [r for r in trace.records if r.module.endswith("cond_ffn")]
        return sum(r.read[WEIGHT] for r in rs) if field == "weight" else \
            sum(r.flops for r in rs if r.op == "aten.bmm.default")
    one = prefill(MOE)
    rank = rank_args(MOE, ParallelConfig(data_parallel_size=4, enable_expert_parallel=True))
    assert (rank.num_experts, rank.routed_top_k, rank.intermediate_size) == (2, 2, 128)
    ep = count_config(rank, batch_size=1, prompt_length=8, new_tokens=2).counts["prefill"].trace
    # 8 tokens x 2 = 16 rows either way: 3 matmuls x 2 x 16 x 64 x 128 = 786432 a layer
    assert experts(one, "flops") == experts(ep, "flops") == 2 * 786432
    # weights read: 8 experts x 3 x 128 x 64 x 2 B = 393216 a layer; a rank's 2 experts: / 4
    assert experts(one, "weight") == 2 * 393216 and experts(ep, "weight") == 2 * 98304
    # dispatch and combine: [16, 64] bf16 = 2048 B each, in each of 2 layers; no all-reduce
    a2a = [r for r in ep.records if r.op == ALL_TO_ALL]
    assert sum(r.calls for r in a2a) == 4 and sum(r.written[ACT] for r in a2a) == 4 * 2048
    assert not any(r.op == ALL_REDUCE for r in ep.records)
    with pytest.raises(ParallelError, match="over TP x DP = 3 ranks, which does not divide"):
        rank_args(MOE, ParallelConfig(data_parallel_size=3, enable_expert_parallel=True))


def test_link_energy_is_charged_with_memory(toy_traces):
    import dataclasses

    from perfcounter.pricing.energy import record_energies
    spec = dataclasses.replace(get_device_spec("h100-sxm", dtype=torch.bfloat16),
                               interconnect_pj_per_bit=5.0)
    (r,) = [r for r in toy_traces[2].records
            if r.op == ALL_REDUCE and r.module.endswith("layers.0.attention")]
    # 1024 B summed over 2 ranks: a ring sends 2 x 1/2 x 1024 = 1024 B = 8192 bits x 5 pJ
    (e,) = record_energies([r], spec)
    assert e.memory_pj == pytest.approx(r.bytes * 8 * spec.mem_pj_per_bit + 8192 * 5.0)


def test_node_links_are_spec_figures():
    from dataclasses import replace

    from perfcounter.devices.dtypes import DeviceSpecError
    a100 = get_device_spec("a100-sxm4-80gb", dtype=torch.bfloat16)
    # DGX A100: one 200 Gb/s HDR port a GPU = 25 GB/s; x 0.8 = 20 GB/s busbw across nodes
    net = links.within(a100, 16)
    assert (net.kind, net.bandwidth, net.busbw, net.latency_s) == ("network", 25e9, 20e9, 5e-6)
    # 16 ranks, 1 MB all-reduce: NCCL's tree, 2 * 15/16 * 1e6 / 20e9 + 2 * log2(16) * 5 us
    seconds, algo = collectives.all_reduce_s(1e6, 16, net)
    assert algo == "tree" and seconds == pytest.approx(93.75e-6 + 40e-6, rel=1e-12)
    # a node of 4: 8 ranks already cross nodes; 4 do not
    four = replace(a100, gpus_per_node=4)
    assert links.within(four, 8).kind == "network" and links.within(four, 4).kind == "nvlink"
    # a spec without node figures: 8 a node, 400 Gb/s NDR (links.NODE_LINK_BW)
    bare = replace(a100, node_link_bw=None, gpus_per_node=None)
    assert links.within(bare, 16).bandwidth == 50e9 and links.within(bare, 8).kind == "nvlink"
    with pytest.raises(DeviceSpecError, match="gpus_per_node must be a whole number"):
        replace(a100, gpus_per_node=2.5)
