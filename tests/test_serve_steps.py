"""serve's step table against counting: held-out mixed steps, layers, chunked prefill, pricing."""
import dataclasses

import numpy as np
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.serve import cache_clear, cache_info, step_table
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import StepModelError, count_table, features

# head_dim 32 / 4 = 8; q 32, k and v 2 x 8 = 16 each
TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
LINEARS = ("wqkv", "wo", "w1", "w2", "w3")
HELD_OUT = ([(64, 64)], [(1, 300), (1, 17), (48, 0), (12, 100)], [(1, 1000)], [(200, 37), (1, 3)])


@pytest.fixture(scope="module")
def spec():
    return get_device_spec("h100-sxm", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def table(spec):
    cache_clear()
    return step_table(TINY, torch.bfloat16, RooflinePricer(spec))


@pytest.mark.parametrize("shape", HELD_OUT)
def test_held_out_mixed_steps_match_counting(table, shape):
    counted = count_step(TINY, [Piece(*p) for p in shape])  # both layers counted
    model = table.counts.totals(features(shape))
    for name, want in (("flops", counted.flops), ("executed_flops", counted.executed_flops),
                       ("bytes", counted.per_op_bytes)):
        assert model[name] == pytest.approx(want, rel=0.01), name
        assert model[name] == pytest.approx(want, rel=1e-9), name  # the model holds exactly


def test_one_layer_counted_and_scaled_equals_two_layers(table):
    # count_table counts a one-layer copy; TINY has 2 layers: the layer groups repeat twice
    assert {k.module for k in table.counts.keys if ".layers.*" in k.module}
    assert set(table.counts.layers) == {1.0, 2.0}
    trace = table.counts.trace_at([(16, 8), (1, 40)])
    assert any(".layers.1." in r.module for r in trace.records)
    counted = count_step(TINY, [Piece(16, 8), Piece(1, 40)])
    assert trace.flops == counted.flops and trace.per_op_bytes == counted.per_op_bytes


def test_table_is_cached_per_model_dtype_and_pricer(spec, table):
    before = cache_info()
    again = step_table(TINY, torch.bfloat16, RooflinePricer(spec))
    assert again is table
    assert cache_info().hits == before.hits + 1 and cache_info().misses == before.misses
    other = step_table(TINY, torch.bfloat16, RooflinePricer(get_device_spec("a100-sxm4-80gb")))
    assert other.counts is table.counts  # counted once, priced twice
    assert cache_info().tables == before.tables + 1 and cache_info().counts == before.counts


def test_chunked_prefill_same_linear_flops_and_reads_earlier_chunks(table):
    whole = count_step(TINY, [Piece(4096, 0)])
    chunks = [count_step(TINY, [Piece(512, 512 * k)]) for k in range(8)]

    def linear_flops(trace):
        return sum(r.flops for r in trace.records if r.module.rsplit(".", 1)[-1] in LINEARS)

    # per token and layer 2 x (32 x 64 + 32 x 32 + 2 x 32 x 64 + 64 x 32) = 18,432 FLOPs;
    # x 4,096 tokens x 2 layers = 150,994,944
    assert linear_flops(whole) == 150_994_944
    assert sum(linear_flops(c) for c in chunks) == 150_994_944
    # chunk k's attention reads the keys and values of the k earlier chunks and its own:
    # 2 (K, V) x 2 KV heads x 512 (k + 1) positions x 8 x 2 B per layer
    for k, trace in enumerate(chunks):
        read = sum(r.read[1] for r in trace.records if "attention" in r.op)
        assert read == 2 * 2 * 512 * (k + 1) * 8 * 2 * 2  # x 2 layers


def test_step_price_equals_pricing_the_counted_step(spec, table):
    from perfcounter.pricing.roofline import roofline
    for shape in HELD_OUT:
        counted = count_step(TINY, [Piece(*p) for p in shape])
        assert table.price(shape) == pytest.approx(table.price_trace(counted), rel=1e-9)
    # one piece: each group is one record, so the table's price is perfcounter's roofline
    single = count_step(TINY, [Piece(100, 0)])
    assert table.price([(100, 0)]) == pytest.approx(roofline(single, spec).latency_s, rel=1e-9)


def test_seconds_and_energy_are_positive_and_grow_with_work(table):
    small, large = features([(1, 10)]), features([(1, 10)] * 64 + [(256, 0)])
    assert 0 < table.seconds(small) < table.seconds(large)
    assert 0 < table.energy_j(small, table.seconds(small)) < table.energy_j(large, 1.0)


def test_mixture_of_experts_is_refused():
    moe = dataclasses.replace(TINY, num_experts=4, num_activated_experts=2)
    with pytest.raises(StepModelError, match="mixture of experts"):
        count_table(moe)


def test_features_by_hand():
    # pieces (3 new after 5) and (1 new after 9): T = 4, B = 2, K = 8 + 10 = 18,
    # dense = 3 x 8 + 1 x 10 = 34, causal = (3 x 5 + 3 x 4 / 2) + 10 = 21 + 10 = 31
    assert list(features([(3, 5), (1, 9)])) == [1, 4, 2, 18, 34, 31]
    assert np.all(features([]) == [1, 0, 0, 0, 0, 0])
