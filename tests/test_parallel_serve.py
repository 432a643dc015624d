"""Deployments on many devices: one rank's memory (Llama-3.1-70B at TP 2, 4, 8 by hand), the
smallest TP that fits, serve's TP / DP / PP keywords, refusals before any work."""
import dataclasses
import math

import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.parallel import (LinkError, ParallelConfig, ParallelError, fits_text, rank_args,
                                  smallest_fit)
from perfcounter.serve.replicas import join, split
from perfcounter.serve import deployment, serve, synthetic
from perfcounter.serve.memory import kv_bytes_per_token, memory_plan, weight_bytes

L70 = ModelArgs.from_name("llama-3.1-70b")
BF16 = torch.bfloat16
LIMITS = dict(max_num_batched_tokens=8192, max_num_seqs=256)
TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)

# One rank's parameters, d = 8192, head_dim 128, 80 layers, vocab 128256 (a multiple of 64):
#   layer = d (q + 2 kv) + q d + 3 d I / TP + 2 d (norms, replicated)
#   TP1: 8192 x 18432 + 3 x 8192 x 28672 + 16384 = 855,654,400; x 80 = 68,452,352,000
#        + embedding and head 2 x 128256 x 8192 = 2,101,346,304 + final norm 8192
#        = 70,553,706,496 params = 141,107,412,992 B
#   TP2: q 4096, kv 512: 8192 x 9216 + 3 x 8192 x 14336 + 16384 = 427,835,392; x 80
#        = 34,226,831,360 + 2 x 64128 x 8192 = 1,050,673,152 + 8192 = 35,277,512,704 params
#   TP4: q 2048, kv 256: 8192 x 4608 + 3 x 8192 x 7168 + 16384 = 213,925,888; x 80
#        = 17,114,071,040 + 2 x 32064 x 8192 = 525,336,576 + 8192 = 17,639,415,808
#   TP8: q 1024, kv 128 (1 of 8 KV heads): 8192 x 2304 + 3 x 8192 x 3584 + 16384
#        = 106,971,136; x 80 = 8,557,690,880 + 2 x 16032 x 8192 = 262,668,288 + 8192
#        = 8,820,367,360
WEIGHTS = {1: 141_107_412_992, 2: 2 * 35_277_512_704, 4: 2 * 17_639_415_808,
           8: 2 * 8_820_367_360}
# KV a token a rank: 2 x 80 layers x KV heads (8 / TP) x 128 x 2 B
KV = {1: 327_680, 2: 163_840, 4: 81_920, 8: 40_960}


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_llama_70b_rank_memory_by_hand(tp):
    rank = rank_args(L70, ParallelConfig(tensor_parallel_size=tp))
    assert weight_bytes(rank, BF16) == WEIGHTS[tp]
    assert kv_bytes_per_token(rank, BF16) == KV[tp]
    # 81559 MiB as reported = 85.52e9 B; 0.9 of it usable = 76.968e9 B
    spec = get_device_spec("h100-sxm", dtype=BF16)
    plan = memory_plan(rank, BF16, spec, **LIMITS)
    blocks = max(0, math.floor((76.968e9 - WEIGHTS[tp] - plan.workspace_bytes) / (16 * KV[tp])))
    assert plan.kv_blocks == blocks
    assert plan.fits == (tp > 1)  # 141 GB of weights alone exceed 76.97 GB usable
    if tp == 2:  # 76.968e9 - 70.555e9 - 0.905e9 workspace = 5.508e9 B / (16 x 163,840) = 2,101
        assert plan.kv_blocks == 2101


def test_smallest_tensor_parallel_size_named():
    spec = get_device_spec("a100-sxm4-80gb", dtype=BF16)
    fits = smallest_fit(L70, lambda rank, q: memory_plan(rank, BF16, spec, weights=q, **LIMITS),
                        quantizations=(None, "int4"))
    assert [(f.tensor_parallel_size, f.quantization) for f in fits] == [(2, None), (1, "int4")]
    assert fits_text(fits, "bfloat16").startswith(
        "smallest fit: --tensor_parallel_size 2 (bfloat16, 70.56 GB of weights a rank); "
        "--tensor_parallel_size 1 --quantize int4 (")


def test_tp1_deployment_is_the_single_device_one():
    base = deployment(TINY, "h100-sxm", execution="bound")
    one = deployment(TINY, "h100-sxm", execution="bound", tensor_parallel_size=1)
    assert one.args is base.args and one.name == base.name == "h100-sxm"
    w = synthetic(20, 64, 16, qps=50, seed=0)
    assert serve(one, w).to_dict() == serve(base, w).to_dict()


def test_tensor_parallel_deployment_is_one_rank_priced_for_all():
    one = deployment(TINY, "h100-sxm", execution="bound")
    dep = deployment(TINY, "h100-sxm", execution="bound", tensor_parallel_size=2)
    assert dep.name == "2 x h100-sxm (TP2)" and dep.parallel.gpus == 2
    assert (dep.args.n_head, dep.args.n_local_heads, dep.args.intermediate_size) == (2, 1, 32)
    assert dep.usd_per_hour == pytest.approx(2 * one.usd_per_hour)
    ops = {k.op for k in dep.table.counts.keys}
    assert {"perfcounter.all_reduce.default", "perfcounter.all_gather.default"} <= ops
    assert not any(op.startswith("perfcounter.all") for op in {k.op for k in one.table.counts.keys})


def test_data_parallel_replicas_split_the_stream():
    w = synthetic(9, 64, 16, qps=5, seed=1)
    parts = split(w, 2)
    assert [len(p) for p in parts] == [5, 4]  # requests 0,2,4,6,8 and 1,3,5,7
    assert list(parts[1].prompt) == list(w.prompt[1::2])
    one = deployment(TINY, "h100-sxm", execution="bound", max_num_seqs=2)
    dp = deployment(TINY, "h100-sxm", execution="bound", max_num_seqs=2, data_parallel_size=3)
    flood = synthetic(30, 64, 16, qps=1e9, seed=0)
    r = serve(dp, flood)
    assert r.metrics["completed"] == 30 and dp.usd_per_hour == pytest.approx(3 * one.usd_per_hour)
    # 2 sequences at a time: each replica serves a third of the flood, sooner than one alone
    assert r.metrics["duration"] < 0.5 * serve(one, flood).metrics["duration"]


def test_join_orders_requests_and_steps():
    dep = deployment(TINY, "h100-sxm", execution="bound")
    from perfcounter.serve.scheduler import simulate_engine
    w = synthetic(6, 32, 4, qps=100, seed=2)
    runs = [simulate_engine(p, dep.table, dep.engine) for p in split(w, 2)]
    run = join(runs, len(w))
    assert [r.index for r in run.requests] == list(range(6))
    assert [r.prompt for r in run.requests] == list(w.prompt)
    starts = list(run.steps.start)
    assert starts == sorted(starts) and len(starts) == sum(len(r.steps.start) for r in runs)


def test_pipeline_stages_take_a_step_through_every_stage():
    one = deployment(TINY, "h100-sxm", execution="bound")
    pp = deployment(TINY, "h100-sxm", execution="bound", pipeline_parallel_size=2)
    assert pp.args.n_layer == 1 and pp.plan.kv_blocks > 0
    w = synthetic(1, 64, 8, qps=1, seed=0)  # one request: one stream, the other idles
    tpot_pp = serve(pp, w).metrics["mean_tpot_ms"]
    stage = pp.table.seconds(pp.table.counts.features([(1, 64)])) * 1e3
    assert tpot_pp > 2 * stage  # two stages in turn and a hop between them
    assert serve(one, w).metrics["completed"] == 1


@pytest.mark.parametrize("kw, match", [
    (dict(tensor_parallel_size=3), "--tensor_parallel_size 3 does not divide the 4 attention"),
    (dict(enable_expert_parallel=True, tensor_parallel_size=2), "is dense"),
    (dict(tensor_parallel_size=0), "expected an integer >= 1"),
    (dict(pipeline_parallel_size=3), "at most one stage each"),
])
def test_bad_parallel_input_is_refused_before_counting(kw, match):
    with pytest.raises(ParallelError, match=match):
        deployment(TINY, "h100-sxm", **kw)


def test_a_device_without_a_link_is_refused():
    with pytest.raises(LinkError, match="no link to another device"):
        deployment(TINY, "generic-cpu", tensor_parallel_size=2)


def test_a_pipeline_hop_between_nodes_takes_the_node_link():
    from perfcounter.pricing.links import node_link, stage_links, within
    from perfcounter.serve.replicas import hop_seconds
    h100 = get_device_spec("h100-sxm")  # 8 GPUs a node, NVLink 450 GB/s, node link 50 GB/s
    # TP 4 x PP 4: stages on ranks 0-3, 4-7 | 8-11, 12-15: the hop 1 -> 2 crosses the node
    assert stage_links(h100, 4, 4) == [within(h100, 2), node_link(h100), within(h100, 2)]
    # TP 8 x PP 2: one stage a node; TP 2 x PP 4: all 8 ranks in one node
    assert stage_links(h100, 8, 2) == [node_link(h100)]
    assert stage_links(h100, 2, 4) == [within(h100, 2)] * 3
    # one token of dim 64 at 2 B = 128 B a hop: over the node link ("network": 0.8 x 50 GB/s,
    # 5 us a message) 128 / 40e9 + 5e-6 s; over NVLink 128 / (0.8 x 450e9) + 0.6e-6 s
    args = dataclasses.replace(TINY, dim=64)
    f = [1.0, 1.0]  # features: step, tokens
    nvlink, network = 128 / 360e9 + 0.6e-6, 128 / 40e9 + 5e-6
    assert hop_seconds(h100, args, 2, 8, 2)(f) == pytest.approx(network, rel=1e-9)
    assert hop_seconds(h100, args, 2, 4, 4)(f) == pytest.approx(2 * nvlink + network, rel=1e-9)
