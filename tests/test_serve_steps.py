"""serve's step table against counting: held-out mixed steps, layers, chunked prefill, pricing."""
import dataclasses

import numpy as np
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.counting.op_data import ExpertLoad
from perfcounter.models.args import ModelArgs
from perfcounter.serve import (
    cache_clear,
    cache_info,
    deployment,
    serve,
    step_table,
    synthetic,
)
from perfcounter.serve.errors import ServeError
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import counted_features, expected_experts, features

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
    # one piece: each group is one record, so the table's price is the counted step's bound
    # (pricing/price.py): max(Σ executed FLOPs / peak, the fewest bytes any regime moves /
    # bandwidth) + the host link; the fewest here: the matmuls' and attention's bytes + the
    # fused IO (compiled), below the compulsory bytes and the per-op roofline's
    from perfcounter.pricing.figures import figures_of
    from perfcounter.pricing.roofline import peak_flops
    single = count_step(TINY, [Piece(100, 0)])
    fig, _ = figures_of(single)
    ext = np.array([k in ("matmul", "attention") for k in fig.kind])
    least = fig.bytes[ext].sum() + single.fused_bytes
    assert least < single.compulsory_bytes < fig.bytes.sum()
    compute = sum(r.executed_flops / peak_flops(spec, r.dtype) for r in single.records)
    want = max(compute, least / spec.bandwidth) + roofline(single, spec).host_link_s
    assert table.price([(100, 0)]) == pytest.approx(want, rel=1e-9)
    assert want < roofline(single, spec).latency_s


def test_seconds_and_energy_are_positive_and_grow_with_work(table):
    small, large = features([(1, 10)]), features([(1, 10)] * 64 + [(256, 0)])
    assert 0 < table.seconds(small) < table.seconds(large)
    assert 0 < table.energy_j(small, table.seconds(small)) < table.energy_j(large, 1.0)


# mixtral-like: 8 experts, 2 a token; an expert's w1, w3 [64, 32] and w2 [32, 64] in bf16:
# 3 x 32 x 64 x 2 B = 12,288 B a layer
MOE = dataclasses.replace(TINY, num_experts=8, num_activated_experts=2)
MOE_HELD_OUT = HELD_OUT + ([(2, 5)], [(1, 5), (1, 9), (1, 20)])


def test_expected_experts_by_hand():
    # E (1 - (1 - k/E)^T), E = 8, k = 2: T = 1: 8 x 0.25 = 2; T = 2: 8 x (1 - 0.5625) = 3.5;
    # T = 3: 8 x (1 - 27/64) = 4.625; T = 64: 8 x (1 - 0.75^64) = 8 - 8.1e-8
    assert [expected_experts(t, 8, 2) for t in (1, 2, 3)] == [2.0, 3.5, 4.625]
    assert expected_experts(64, 8, 2) == pytest.approx(8.0, abs=1e-6)
    assert expected_experts(0, 8, 2) == 0.0 and expected_experts(5, 0, 0) == 0.0


@pytest.fixture(scope="module")
def moe_table(spec):
    return step_table(MOE, torch.bfloat16, RooflinePricer(spec))


@pytest.mark.parametrize("shape", MOE_HELD_OUT)
def test_mixture_of_experts_held_out_steps(moe_table, shape):
    counts = moe_table.counts
    counted = count_step(MOE, [Piece(*p) for p in shape])  # both layers counted
    seen = counted_features(shape, None, counts.experts)  # experts as counting spreads them
    priced = counts.features(shape)  # experts at the expectation under uniform routing
    # FLOPs: exact either way (the experts compute the T x k routed rows, whoever gets them)
    for f in (seen, priced):
        assert counts.totals(f)["flops"] == pytest.approx(counted.flops, rel=1e-9)
    # bytes: exact with the experts the count touched (balanced: min(T x 2, 8));
    assert counts.totals(seen)["bytes"] == pytest.approx(counted.per_op_bytes, rel=1e-9)
    # the table prices the expectation instead, which differs from that count by the expert
    # weights of (expected - counted) experts a layer, nothing else: NB the count without
    # data is the most experts T tokens can touch (an upper bound), the expectation what
    # independent uniform routing touches on average (real routers are skewed: fewer)
    tokens = sum(n for n, _ in shape)
    diff = (expected_experts(tokens, 8, 2) - min(2 * tokens, 8)) * 12_288 * 2  # x 2 layers
    assert counts.totals(priced)["read"][0] - counts.totals(seen)["read"][0] == \
        pytest.approx(diff, abs=1e-3)


def test_mixture_of_experts_step_by_hand(moe_table):
    # (2 new after 5): T = 2 tokens, 4 routed rows; counted: 4 experts read, expected 3.5:
    # the table's weight reads are 0.5 x 12,288 x 2 layers = 12,288 B below the count's
    counted = count_step(MOE, [Piece(2, 5)])
    priced = moe_table.counts.totals(moe_table.counts.features([(2, 5)]))
    weight = sum(r.read[0] for r in counted.records)
    assert weight - priced["read"][0] == pytest.approx(12_288, abs=1e-3)
    # a decode touches k = 2 experts either way: the table's price is the counted step's
    one = count_step(MOE, [Piece(1, 40)])
    assert moe_table.price([(1, 40)]) == pytest.approx(moe_table.price_trace(one), rel=1e-9)


def test_skewed_routing_touches_fewer_experts_by_hand(spec):
    # 8 experts, 2 a token, weights 4,2,1,1,1,1,1,1 (sum 12): shares 1/3, 1/6, then 1/12 each;
    # a token picks expert e with probability 2 s_e: 2/3, 1/3, 1/6 (x6). One token: 2/3 + 1/3
    # + 6/6 = 2 = k. Two tokens: Σ 1 - (1 - p)^2 = 8/9 + 5/9 + 6 x 11/36 = 1.4444 + 1.8333
    # = 3.2778 (uniform: 3.5)
    load = ExpertLoad.parse("4,2,1,1,1,1,1,1")
    assert expected_experts(1, 8, 2, load) == pytest.approx(2.0)
    assert expected_experts(2, 8, 2, load) == pytest.approx(8 / 9 + 5 / 9 + 6 * 11 / 36)
    assert expected_experts(2, 8, 2, ExpertLoad()) == 3.5  # balanced: the uniform formula
    skewed = step_table(MOE, torch.bfloat16, RooflinePricer(spec), load=load)
    balanced = step_table(MOE, torch.bfloat16, RooflinePricer(spec))
    assert skewed.counts.experts_touched(2) == pytest.approx(3.2778, abs=1e-4)
    assert balanced.counts.experts_touched(2) == 3.5  # its own table, not the skewed one's
    # a 2-token step reads (3.5 - 3.2778) x 12,288 B x 2 layers fewer expert weights
    f_s, f_b = skewed.counts.features([(2, 5)]), balanced.counts.features([(2, 5)])
    diff = balanced.counts.totals(f_b)["read"][0] - skewed.counts.totals(f_s)["read"][0]
    assert diff == pytest.approx((3.5 - (8 / 9 + 5 / 9 + 6 * 11 / 36)) * 12_288 * 2, abs=1e-3)
    # checked before any work: one weight per expert, none over 1/k of the rows, a dense model
    for bad, why in (("1,1", "has 2 weights, but this model routes over 8 experts"),
                     ("9,1,1,1,1,1,1,1", "share 0.562 of the routed rows exceeds 1/k = 0.5")):
        with pytest.raises(ServeError, match=why):
            deployment(MOE, "h100-sxm", expert_load=bad)
    with pytest.raises(ServeError, match="this model has no experts"):
        deployment(TINY, "h100-sxm", expert_load="1,1")


def test_features_by_hand():
    # pieces (3 new after 5) and (1 new after 9): T = 4, B = 2, K = 8 + 10 = 18,
    # dense = 3 x 8 + 1 x 10 = 34, causal = (3 x 5 + 3 x 4 / 2) + 10 = 21 + 10 = 31
    # and no experts: 0 (with 8 experts, 2 a token: 8 x (1 - 0.75^4) = 5.46875)
    # a transformers model's features (steps_hf.py) are 0 for perfcounter's model
    assert list(features([(3, 5), (1, 9)])) == [1, 4, 2, 18, 34, 31, 0] + [0] * 8
    assert features([(3, 5), (1, 9)], experts=(8, 2))[6] == 5.46875
    assert np.all(features([]) == [1, 0, 0, 0, 0, 0, 0] + [0] * 8)


def test_windowed_and_mla_features_by_hand():
    # sliding window w = 4: (3 new after 5) holds and reads min(8, 4 - 1 + 3) = 6 keys,
    # (1 after 9) min(10, 3 + 1) = 4: local_kv 10; local_dense 3 x 6 + 1 x 4 = 22; pairs:
    # each query sees at most 4 keys: 4 + 4 + 4 (the 3 queries) + 4 = 16
    f = features([(3, 5), (1, 9)], local=("sliding", 4))
    assert list(f[7:11]) == [10, 22, 16, 0]
    # a chunk of C = 8: (3 after 5) reads from position 0, 8 keys; (1 after 9) from 8, 2 keys
    # (positions 8, 9): local_kv 10, dense 3 x 8 + 2 = 26, causal 21 + 2 = 23
    assert list(features([(3, 5), (1, 9)], local=("chunked", 8))[7:10]) == [10, 26, 23]
    # MLA: one decode piece (1 after 9): decodes 1, its keys 10, a decode and a prefill ran;
    # one token alone in a step is its own indicator (the 4th extra feature)
    assert list(features([(3, 5), (1, 9)], mla=True)[10:]) == [0, 1, 10, 1, 1]
    assert list(features([(1, 9)], mla=True)[10:]) == [1, 1, 10, 1, 0]


def test_mixture_of_experts_serves_one_request_at_a_time():
    dep = deployment(MOE, "h100-sxm", execution="cudagraphs")
    result = serve(dep, synthetic(3, 64, 8, concurrency=1, seed=0))
    # one request at a time: after its 64-token prefill, 7 decodes at contexts 64..70, each
    # touching k = 2 experts a layer; TPOT is their mean price
    want = np.mean([dep.table.price([(1, c)]) for c in range(64, 71)]) * 1e3
    assert result.metrics["mean_tpot_ms"] == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("execution", ["eager", "cudagraphs"])
def test_mixture_of_experts_predicted_as_predict_prices_the_counted_step(spec, execution):
    # at the experts the count touched, the prediction's table prices a held-out step as
    # predict() prices its counted trace (the grouped GEMMs of w1, w3 and w2 are one group)
    table = step_table(MOE, torch.bfloat16, PredictionPricer(spec, execution))
    for shape in ([(1, 300), (1, 17), (48, 0), (12, 100)], [(2, 5)]):
        counted = count_step(MOE, [Piece(*p) for p in shape])
        seen = counted_features(shape, None, table.counts.experts)
        assert table.seconds(seen) == pytest.approx(table.price_trace(counted), rel=1e-4)
