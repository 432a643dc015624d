"""pricing/price.py: one rule for every consumer; collectives priced on their link in every
regime, the bound included; a trace's figures (figures.py) one group a record."""
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.generation.config_only import count_config
from perfcounter.models.args import ModelArgs
from perfcounter.parallel.sharding import ParallelConfig, rank_args
from perfcounter.pricing import collectives
from perfcounter.pricing.figures import figures_of
from perfcounter.pricing.predict import predict
from perfcounter.pricing.price import REGIMES, price

# 2 layers, dim 64, 4 heads of 16, 4 KV heads, intermediate 128, vocab 256
TOY = ModelArgs(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_local_heads=4, dim=64,
                intermediate_size=128)


@pytest.fixture(scope="module")
def rank_trace():
    rank = rank_args(TOY, ParallelConfig(tensor_parallel_size=2))
    return count_config(rank, batch_size=1, prompt_length=8, new_tokens=2).counts["prefill"].trace


def test_a_trace_is_one_group_a_record(rank_trace):
    fig, records = figures_of(rank_trace)
    assert len(fig) == len(records) == sum(not r.op.startswith("prim.")
                                           for r in rank_trace.records)
    assert fig.bytes.sum() == sum(r.bytes for r in records)
    assert fig.compulsory_bytes == rank_trace.compulsory_bytes


@pytest.mark.parametrize("execution", REGIMES)
def test_collectives_take_their_links_seconds_in_every_regime(rank_trace, execution):
    # a rank of TP 2: the vocab-parallel embedding all-reduces its [8, 64] x 2 B = 1,024 B,
    # each layer its attention's and its MLP's output (4 x 1,024 B), the head all-gathers its
    # logits (the last one's [1, 256] x 2 B... as counted: 4,096 B): 6 collectives, each priced
    # by collectives.record_seconds; the rest as without them
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    fig, records = figures_of(rank_trace)
    linked = [r for r in records if collectives.is_collective(r.op)]
    assert len(linked) == 6
    assert sum(sum(r.written) for r in linked) == 5 * 1_024 + 4_096
    want = sum(collectives.record_seconds(r, spec) for r in linked)
    assert want > 0
    p = price(fig, spec, execution)
    assert p.latency_s == pytest.approx(predict(rank_trace, spec, execution).latency_s,
                                        rel=1e-12)
    if execution == "eager":  # each call also dispatched (its share the kernels do not hide)
        assert p.by_class["collective"] >= want
        return
    assert p.by_class["collective"] == pytest.approx(want, rel=1e-12)
    if execution == "compiled":  # device work: the host's launches hide behind it, or it
        return  # behind them (this tiny step is host-bound)
    # CUDA graphs and the bound: without them, the same step less exactly their seconds
    fig.calls[[i for i, c in enumerate(fig.collective) if c is not None]] = 0
    assert price(fig, spec, execution).latency_s == pytest.approx(p.latency_s - want, rel=1e-9)


def test_the_bound_is_below_every_regime_with_collectives(rank_trace):
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    fig, _ = figures_of(rank_trace)
    bound = price(fig, spec, "bound").latency_s
    assert all(bound <= price(fig, spec, e).latency_s for e in REGIMES[1:])


def test_the_roofline_of_a_rank_adds_its_collectives_on_the_link(rank_trace):
    # h100-sxm's NVLink: 450 GB/s a way x 0.8 bus efficiency = 360e9 B/s, 0.6 us a ring step.
    # 5 all-reduces of 1,024 B over 2 ranks: 2(2-1)/2 x 1,024 / 360e9 + 2(2-1) x 0.6e-6
    #   = 2.8444e-9 + 1.2e-6 = 1.2028444e-6 s each;
    # 1 all-gather of 4,096 B: (2-1)/2 x 4,096 / 360e9 + (2-1) x 0.6e-6 = 6.056889e-7 s;
    # 5 x 1.2028444e-6 + 6.056889e-7 = 6.6199111e-6 s on top of the ops' roofline
    from perfcounter.pricing.roofline import roofline
    from perfcounter.report.phase import format_stats
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    line = roofline(rank_trace, spec)
    assert line.collective_s == pytest.approx(6.6199111e-6, rel=1e-6)
    assert line.latency_s == pytest.approx(line.ops_s + line.host_link_s + 6.6199111e-6)
    assert line.to_dict()["collective_s"] == line.collective_s
    # one device, no collectives: the roofline as before, its dict without the key
    one = count_config(TOY, batch_size=1, prompt_length=8, new_tokens=2).counts["prefill"]
    assert "collective_s" not in roofline(one.trace, spec).to_dict()
    # the report says it on the roofline line
    stats = count_config(rank_args(TOY, ParallelConfig(tensor_parallel_size=2)), batch_size=1,
                         prompt_length=8, new_tokens=2, device_spec=spec).counts["prefill"]
    assert "collectives 6.62 µs on the link)" in format_stats(stats)
