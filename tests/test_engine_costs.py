"""What a step and a request cost an engine outside the model's kernels (issue 44, item 2):
the sampler's kernels by the requests' sampling parameters (serve/sampler.py), the host's time
a step and a sequence, added or hidden behind the GPU's previous step (async scheduling,
scheduler.step_seconds), a first token's cost, and the ITL that batch, context and chunked
prefill make; each expected value derived by hand."""
import dataclasses

import numpy as np
import pytest

from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.achievable import overhead
from perfcounter.pricing.price import price
from perfcounter.serve import ServeError, deployment, serve
from perfcounter.serve.engines import PROFILES
from perfcounter.serve.sampler import SamplerCost, kernels, parse_sampling, sampler_figures
from perfcounter.serve.scheduler import EngineConfig, simulate_engine, step_seconds
from perfcounter.serve.steps import features
from perfcounter.serve.workload import Workload

TINY = ModelArgs(block_size=1024, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
ML_ENERGY = "temperature=0.8,top_p=0.95,repetition_penalty=1.1"  # its harness's requests


def fixed(arrival, prompt, output):
    n = len(arrival)
    return Workload(np.array(arrival, dtype=float), np.array(prompt), np.array(output),
                    np.zeros(n, dtype=np.int64), None, "fixed")


def toy_spec():
    """h100-sxm at 1 TB/s, elementwise kernels at half of it, reductions at a quarter, 2 us a
    kernel's fixed device time."""
    return dataclasses.replace(get_device_spec("h100-sxm"), name="h100-toy-sampler",
                               bandwidth=1e12, op_curves={},
                               op_efficiency={"elementwise": 0.5, "reduction": 0.25,
                                              "indexing": 0.1},
                               op_overhead_s={"kernel": 2e-6})


def test_sampler_bytes_follow_the_requests_parameters():
    def total(text):
        ks = kernels(parse_sampling(text))
        return sum(k.bytes_per_entry for k in ks), sum(k.kernels for k in ks)
    # greedy: fp32 copy 2 read + 4 written, argmax 4 read: 10 B in 2 kernels
    assert total("greedy") == (10, 2)
    # temperature: 6 + div_ 8 + softmax 16 + exponential_ 4 + div_ 12 + argmax 4 = 50 B, 6
    assert total("temperature=0.8") == (50, 6)
    # + top_p: sort 172 (10 kernels) + softmax 16 + cumsum 8 + le 5 + masked_fill_ 9 +
    # scatter 24 (2) = 234 B, 16 kernels: 284 B, 22 kernels
    assert total("temperature=0.8,top_p=0.95") == (284, 22)
    # + penalties: (zeros 8 + scatter_add_ 0 + gt 9) x 2 + repetition 10 + frequency 12 + 12
    # + presence 5 + 12 = 85 B in 11 kernels: 369 B, 33 kernels
    assert total(ML_ENERGY) == (369, 33)
    # top_k alone: 50 + topk 4 + lt 5 + masked_fill_ 9 = 68 B, 9 kernels
    assert total("temperature=0.8,top_k=50") == (68, 9)
    assert parse_sampling(None) is None and kernels(None) == ()


@pytest.mark.parametrize("bad, match", [("temperature=-1", r"temperature=-1\.0: expected a "
                                                           r"number in \[0, 100\]"),
                                        ("top_q=0.9", "'top_q'.*expected 'greedy' or NAME=VALUE"),
                                        ("top_p=nope", "top_p='nope'"),
                                        ("top_p=1.5", r"top_p=1\.5")])
def test_bad_sampling_is_refused_in_one_line(bad, match):
    with pytest.raises(ServeError, match=match):
        parse_sampling(bad)
    with pytest.raises(ServeError, match=match):  # before any counting
        deployment(TINY, "h100-sxm", sampling=bad)


def test_sampler_seconds_by_hand():
    spec = toy_spec()
    cost = SamplerCost(spec, 1000, kernels(parse_sampling("greedy")))
    # 10 sequences of 1,000 entries: the fp32 copy moves 6 x 10,000 = 60,000 B at 0.5 TB/s
    # (1.2e-7 s), argmax 40,000 B at 0.25 TB/s (1.6e-7 s); 2 kernels x 2 us = 4e-6 s
    assert cost(10) == pytest.approx(1.2e-7 + 1.6e-7 + 4e-6, rel=1e-9)
    assert cost(0) == 0.0 and cost.bytes(10) == 100_000 and cost.cache_info() == 1
    # their memory traffic's joules: 100,000 B x 8 bits x 7 pJ = 5.6e-6 J
    assert SamplerCost(dataclasses.replace(spec, mem_pj_per_bit=7.0), 1000,
                       cost.kernels).joules(10) == pytest.approx(5.6e-6, rel=1e-12)


def test_a_step_charges_the_samplers_joules_within_the_cap():
    dep = deployment(TINY, "h100-sxm", sampling=ML_ENERGY)
    run = simulate_engine(fixed([0.0], [16], [2]), dep.table, dep.engine)
    table, sampler = dep.table, dep.engine.sampler
    f = features([(16, 0)])
    seconds = run.steps.seconds[0]
    # the prefill step: the table's dynamic joules + 1 sequence's sampler bytes x 8 x pJ/bit,
    # + the static W over its seconds, capped at the board's limit
    expected = min(table.dynamic_j(f) + sampler.joules(1) + table.power.static_w * seconds,
                   (table.power.cap_w or float("inf")) * seconds)
    assert sampler.joules(1) == pytest.approx(369 * 64 * 8 * dep.spec.mem_pj_per_bit * 1e-12)
    assert run.steps.energy_j[0] == pytest.approx(expected, rel=1e-12)


def test_host_time_adds_or_hides_behind_the_previous_step():
    sampler = lambda seqs: 1e-4 * seqs  # noqa: E731  (a toy sampler: 0.1 ms a sequence)
    sync = EngineConfig(kv_blocks=64, step_overhead_s=1e-3, seq_overhead_s=5e-4,
                        sampler=sampler)
    # GPU 10 ms + sampler 4 x 0.1 ms = 10.4 ms; host 1 + 4 x 0.5 = 3 ms, added: 13.4 ms
    assert step_seconds(sync, 10e-3, 4, None) == pytest.approx((13.4e-3, 10.4e-3))
    assert step_seconds(sync, 10e-3, 4, 10e-3) == pytest.approx((13.4e-3, 10.4e-3))
    overlap = dataclasses.replace(sync, async_scheduling=True)
    # after a 10 ms GPU step the 3 ms host work is hidden: 10.4 ms
    assert step_seconds(overlap, 10e-3, 4, 10e-3) == pytest.approx((10.4e-3, 10.4e-3))
    # after a 2 ms one, 3 - 2 = 1 ms shows: 11.4 ms; after an idle engine all 3 ms: 13.4 ms
    assert step_seconds(overlap, 10e-3, 4, 2e-3) == pytest.approx((11.4e-3, 10.4e-3))
    assert step_seconds(overlap, 10e-3, 4, None) == pytest.approx((13.4e-3, 10.4e-3))


def test_profiles_say_who_overlaps_and_who_samples_with_torch_ops():
    h100 = get_device_spec("h100-sxm")
    got = {e: (p.settings(h100)["async_scheduling"], p.settings(h100)["sampler"])
           for e, p in PROFILES.items()}
    assert got == {"vllm": (False, "torch"), "trtllm": (True, "fused"), "sglang": (True, "fused")}
    # a fused sampler is not priced, whatever the requests ask
    assert deployment(TINY, "h100-sxm", engine="sglang", sampling=ML_ENERGY).engine.sampler is None
    assert deployment(TINY, "h100-sxm", sampling=ML_ENERGY).engine.sampler.vocab == 64


def test_one_request_ttft_is_its_host_cost_the_prefill_step_and_its_launch():
    dep = deployment(TINY, "h100-sxm", request_overhead_s=2e-3, step_overhead_s=5e-4,
                     seq_overhead_s=1e-4, sampling="greedy")
    table, spec = dep.table, dep.spec
    assert dep.execution == "cudagraphs"
    run = serve(dep, fixed([0.0], [128], [1])).run
    prefill = table.price([(128, 0)])  # the step table's prefill of 128 tokens
    # its price holds one graph launch, the regime's cost a step on the device
    launch = price(table.figures(features([(128, 0)])), spec, "cudagraphs").by_class["graph launch"]
    assert launch == overhead(spec, "cudagraphs") > 0
    # greedy over 64 entries: 640 B in 2 kernels, priced on the device
    sample = dep.engine.sampler(1)
    greedy = sampler_figures(kernels(parse_sampling("greedy")), 64, 1)
    assert float(greedy.bytes.sum()) == 640 and sample == price(greedy, spec, "eager").work_s
    # TTFT = the request's host cost 2 ms + the step's host 0.5 ms + 1 sequence x 0.1 ms
    #        + the prefill step (its launch included) + the sampler's kernels
    ttft = run.requests[0].first_token - run.requests[0].arrival
    assert ttft == pytest.approx(2e-3 + 5e-4 + 1e-4 + prefill + sample, rel=1e-12)


def test_itl_grows_with_batch_and_context_as_the_costs_say():
    dep = deployment(TINY, "h100-sxm", seq_overhead_s=1e-4, sampling=ML_ENERGY,
                     max_num_seqs=64, max_num_batched_tokens=4096)
    table, cfg = dep.table, dep.engine

    def itl(batch, prompt):  # every request prefilled in the first step, then 2 decodes
        run = simulate_engine(fixed([0.0] * batch, [prompt] * batch, [3] * batch), table, cfg)
        return np.frombuffer(run.itl)
    # a decode step of B sequences after a prompt of P (+1 generated at the 2nd gap)
    for batch, prompt in ((2, 16), (8, 16), (8, 64)):
        gaps = itl(batch, prompt)
        first = table.price([(1, prompt)] * batch) + 1e-4 * batch + cfg.sampler(batch)
        second = table.price([(1, prompt + 1)] * batch) + 1e-4 * batch + cfg.sampler(batch)
        assert sorted(set(np.round(gaps, 15))) == pytest.approx(sorted({first, second}))
    # from 2 to 8 sequences the host adds 6 x 0.1 ms and the sampler 6 x 369 B x 64 entries
    sampler = dep.engine.sampler
    assert sampler.bytes(8) - sampler.bytes(2) == 6 * 369 * 64
    # the decode kernel reads each sequence's cached keys and values: 2 layers x K and V x 2
    # KV heads x 8 dims x 2 B = 128 B a position; 8 sequences at 64 positions read
    # 8 x 48 x 128 = 49,152 B more than at 16
    attention = np.array([k == "attention" for k in table.kind])

    def kv(ctx):
        return float(table.figures(features([(1, ctx)] * 8)).streamed[attention].sum())
    assert kv(64) - kv(16) == 8 * 48 * 128
    assert itl(8, 64).min() > itl(8, 16).max() > itl(2, 16).max()


def test_chunked_prefill_makes_the_decodes_tail():
    # A (8 prompt, 20 outputs) and B (200 prompt, 2 outputs) at t = 0, 64 tokens a step:
    # step 1 A's 8 + B's 56; steps 2-4 A's decode + B's chunks of 63, 63, 18; then A alone
    dep = deployment(TINY, "h100-sxm", max_num_batched_tokens=64, max_num_seqs=8)
    run = simulate_engine(fixed([0.0, 0.0], [8, 200], [20, 2]), dep.table, dep.engine)
    steps = np.frombuffer(run.steps.seconds)
    mixed = [dep.table.price([(1, 8 + i), (m, 56 + 63 * i)]) for i, m in enumerate((63, 63, 18))]
    assert list(steps[1:4]) == pytest.approx(mixed)
    # every gap in the order emitted: A's in steps 2-4, then A's and B's (its 2nd token) in
    # step 5, then A's alone: step 6 decodes A after 8 + 4 emitted = 12 positions
    gaps = np.frombuffer(run.itl)
    assert len(gaps) == 19 + 1 and list(gaps[:3]) == pytest.approx(mixed)
    both = dep.table.price([(1, 11), (1, 200)])
    assert [gaps[3], gaps[4], steps[4]] == pytest.approx([both] * 3)
    assert gaps[5] == pytest.approx(dep.table.price([(1, 12)]))
    # the chunks' steps are the tail: the median gap is a decode alone, p90 a mixed step
    assert steps[5:].min() <= np.median(gaps) <= steps[5:].max() < min(mixed)
    assert np.percentile(gaps, 90) > np.median(gaps) and max(gaps) == pytest.approx(max(mixed))


def test_a_result_with_a_sampler_writes_plain_json():
    import json
    dep = deployment(TINY, "h100-sxm", sampling="greedy", async_scheduling=True)
    engine = json.loads(json.dumps(serve(dep, fixed([0.0], [16], [2])).to_dict()))["engine"]
    # greedy: 10 B an entry over the 64 entries of TINY's vocabulary, in 2 kernels
    assert engine["sampler"] == "10 B an entry x 64 entries in 2 kernels on h100-sxm"
    assert engine["async_scheduling"] is True and engine["seq_overhead_s"] == 0.0
