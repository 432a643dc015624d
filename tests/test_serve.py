"""serve's scheduler and metrics: vanishing load, concurrency 1, Little's law, memory, saturation."""
import numpy as np
import pytest
import torch

from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.serve import (ServeError, deployment, kv_bytes_per_token, memory_plan, serve,
                               synthetic)
from perfcounter.serve.metrics import parse_slo
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.scheduler import EngineConfig, simulate_engine
from perfcounter.serve.workload import Workload

TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)


@pytest.fixture(scope="module")
def dep():
    # the roofline bound: the scheduler's semantics, steps whose cost follows their work
    # (test_serve_predicted.py prices them in the execution regimes)
    return deployment(TINY, "h100-sxm", max_num_seqs=64, max_num_batched_tokens=512,
                      execution="bound")


def fixed(n, prompt, output, arrival=None, cached=0):
    arrival = np.zeros(n) if arrival is None else np.asarray(arrival, float)
    return Workload(arrival, np.full(n, prompt), np.full(n, output), np.full(n, cached))


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_vanishing_rate_ttft_is_the_prefill_step_and_tpot_the_decode_steps(dep):
    # requests 1000 s apart: each meets an idle engine. TTFT = the step of one 100-token
    # piece (prompt 100 <= budget 512: one chunk); TPOT = the mean of the decode steps at
    # contexts 100, 101, 102 (a token emitted per step; the 4th token ends the request)
    result = serve(dep, fixed(3, 100, 4, arrival=[0, 1000, 2000]))
    table = dep.table
    prefill = table.price([(100, 0)])
    decodes = [table.price([(1, 100 + i)]) for i in range(3)]
    # (times are differences of float seconds near 1000 s: 1e-6 relative)
    assert result.metrics["mean_ttft_ms"] == pytest.approx(prefill * 1e3, rel=1e-6)
    assert result.metrics["mean_tpot_ms"] == pytest.approx(sum(decodes) / 3 * 1e3, rel=1e-6)
    assert result.metrics["mean_batch_size"] == 1 and result.metrics["preemptions"] == 0


def test_concurrency_one_equals_a_generation_priced_step_by_step(dep):
    # one request in flight: prefill 24 tokens, then decode steps at contexts 24 .. 28;
    # each step counted on its own (both layers) and priced gives the same end-to-end time
    w = synthetic(3, 24, 6, concurrency=1)
    result = serve(dep, w)
    counted = dep.table.price_trace(count_step(TINY, [Piece(24, 0)]))
    counted += sum(dep.table.price_trace(count_step(TINY, [Piece(1, 24 + i)])) for i in range(5))
    assert result.metrics["mean_e2el_ms"] == pytest.approx(counted * 1e3, rel=1e-9)
    assert result.metrics["duration"] == pytest.approx(3 * counted, rel=1e-9)  # back to back


def test_littles_law(dep):
    # a long stable run: mean requests in the system (time average over the arrivals'
    # window, integrated from each request's arrival and finish) = arrival rate x mean
    # end-to-end latency, within 2 %
    capacity = serve(dep, synthetic(200, "uniform:16-200", "uniform:8-64", qps=1e9)).metrics
    qps = 0.6 * capacity["request_throughput"]
    result = serve(dep, synthetic(4000, "uniform:16-200", "uniform:8-64", qps=qps, seed=3))
    run, m = result.run, result.metrics
    assert not m["overloaded"]
    last = result.workload.arrival.max()
    inside = [min(r.finish, last) - r.arrival for r in run.requests if r.arrival < last]
    mean_in_system = sum(inside) / last
    rate = (len(result.workload) - 1) / last
    assert mean_in_system == pytest.approx(rate * m["mean_e2el_ms"] / 1e3, rel=0.02)


def test_kv_bytes_per_token_and_capacity_by_hand():
    args = ModelArgs.from_name("llama-3-70b")
    # 80 layers x 8 KV heads x 128 x 2 (K and V) x 2 B = 327,680
    assert kv_bytes_per_token(args, torch.bfloat16) == 327_680
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)  # 81559 MiB = 85.52e9 B
    plan = memory_plan(args, torch.bfloat16, spec)
    # 70,553,706,496 parameters x 2 B = 141.1 GB > 85.52 GB x 0.9: it does not fit
    assert plan.weight_bytes == 141_107_412_992 and not plan.fits
    big = memory_plan(args, torch.bfloat16, spec, device_bytes=400e9)
    # 400 GB x 0.9 = 360 GB - 141,107,412,992 weights - 1,674,838,016 workspace
    # (8,192 x (8,192 + max(2 x 8,192 + 2 x 1,024, 3 x 28,672)) x 2 B + 256 x 128,256 x 4 B
    # = 1,543,503,872 + 131,334,144) = 217,217,748,992 B / (16 x 327,680 = 5,242,880)
    # = 41,430.99 -> 41,430 blocks, 662,880 tokens
    assert big.workspace_bytes == 1_674_838_016
    assert big.kv_blocks == 41_430 and big.kv_tokens == 662_880
    # a 4,096-token context holds 256 blocks: 41,430 // 256 = 161 sequences; 64 sequences
    # could hold 41,430 // 64 x 16 = 10,352 tokens each, beyond the model's 8,192
    assert big.max_batch(4096) == 161 and big.max_context(64) == 8192


def test_capacity_of_the_tiny_model_on_80_gb(dep):
    # 85.52e9 (81559 MiB) x 0.9 = 76.968e9 - 22,688 params x 2 B - workspace 512 x (32 +
    # max(2 x 32 + 2 x 16, 3 x 64)) x 2 B - 64 x 64 x 4 B = 76.968e9 - 45,376 - 229,376
    # - 16,384; KV 2 x 2 x 2 x 8 x 2 B = 128 B a token: 37,581,889 blocks of 16
    kv = 76.968e9 - 45_376 - 229_376 - 16_384
    assert dep.plan.kv_bytes_per_token == 128
    assert dep.plan.kv_blocks == int(kv // (16 * 128))


def test_preemption_starts_when_the_kv_cache_is_exceeded(dep):
    # 8 requests of 32 + 64 tokens hold ceil(96 / 16) = 6 blocks each at the end: 48 in all
    w = fixed(8, 32, 64)
    assert simulate_engine(w, dep.table, EngineConfig(48, 512, 64)).preemptions == 0
    run = simulate_engine(w, dep.table, EngineConfig(20, 512, 64))
    assert run.preemptions > 0
    assert all(r.generated == 64 for r in run.requests)  # every request still completes
    with pytest.raises(ServeError, match="never fit"):
        simulate_engine(fixed(1, 32, 64), dep.table, EngineConfig(5, 512, 64))  # 6 > 5 blocks


def test_saturation_and_the_overload_line(dep):
    # a flood of identical requests: at most max_num_seqs = 64 decode together; output
    # throughput cannot pass 64 tokens per decode step of 64 sequences at the shortest
    # context (prefill steps share the time), and rates beyond it serve no more
    flood = serve(dep, synthetic(2000, 64, 64, qps=1e9)).metrics
    bound = 64 / dep.table.price([(1, 64)] * 64)
    assert 0.5 * bound < flood["output_throughput"] <= bound
    twice = serve(dep, synthetic(2000, 64, 64, qps=2 * flood["request_throughput"])).metrics
    assert twice["output_throughput"] == pytest.approx(flood["output_throughput"], rel=0.05)
    assert flood["peak_batch_size"] == 64
    assert flood["overloaded"] and flood["overload"].startswith("overload: ")
    assert "\n" not in flood["overload"] and flood["p99_ttft_ms"] is None
    calm = serve(dep, synthetic(300, 64, 64, qps=flood["request_throughput"] / 4)).metrics
    assert not calm["overloaded"] and calm["p99_ttft_ms"] > 0


def test_deterministic_under_seed(dep):
    def run(seed):
        return serve(dep, synthetic(300, "uniform:10-300", "normal:40,10", qps=50,
                                    seed=seed, burstiness=0.5)).metrics
    assert run(7) == run(7)
    assert run(7)["mean_e2el_ms"] != run(8)["mean_e2el_ms"]


def test_goodput_energy_and_cost(dep):
    slo = parse_slo("ttft=1s,tpot=50ms")
    assert slo == {"ttft": 1.0, "tpot": 0.05}
    d = deployment(TINY, "h100-sxm", usd_per_hour=3.6)
    m = serve(d, synthetic(50, 32, 16, qps=5), slo=slo, usd_per_kwh=0.2).metrics
    assert m["request_goodput"] == pytest.approx(m["request_throughput"])  # every request meets it
    # $ 3.6 an hour = $ 0.001 a second: duration x 0.001 / output tokens x 1e6
    assert m["usd_per_1m_output_tokens"] == pytest.approx(m["duration"] * 1e-3 / (50 * 16) * 1e6)
    assert m["usd_per_1m_output_tokens_energy"] == pytest.approx(
        0.2 * m["energy_j"] / 3.6e6 / 800 * 1e6)
    assert m["j_per_output_token"] == pytest.approx(m["energy_j"] / 800)
    assert m["j_per_request"] == pytest.approx(m["energy_j"] / 50)


def test_the_listed_price_and_its_override(dep):
    # h100-sxm lists $6.88 a GPU-hour (AWS p5.48xlarge $55.04 / 8, its source in the spec)
    assert dep.usd_per_hour == 6.88 and "p5.48xlarge" in dep.usd_source
    m = serve(dep, synthetic(20, 32, 8, qps=5)).metrics
    # $6.88 / 3,600 s x duration / 160 output tokens x 1e6
    assert m["usd_per_1m_output_tokens"] == pytest.approx(
        6.88 / 3600 * m["duration"] / 160 * 1e6)
    d = deployment(TINY, "h100-sxm", usd_per_hour=2.0, execution="bound")
    assert (d.usd_per_hour, d.usd_source) == (2.0, "--usd_per_hour")
    assert deployment(TINY, "h100-pcie", execution="bound").usd_per_hour is None  # none listed


def test_prefix_hits_skip_compute(dep):
    cold = serve(dep, fixed(1, 320, 2)).metrics["mean_ttft_ms"]
    # 256 of 320 prompt tokens cached: the prefill computes 64 tokens after 256
    warm = serve(dep, fixed(1, 320, 2, cached=256)).metrics["mean_ttft_ms"]
    assert warm == pytest.approx(dep.table.price([(64, 256)]) * 1e3)
    assert warm < cold
