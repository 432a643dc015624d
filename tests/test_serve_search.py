"""--find_max_qps (serve/search.py): on a toy device whose step time is known by hand the
found rate is the hand-derived one; a tighter SLO never gives a higher rate; the answer
holds when the run doubles; traces are scaled, closed loops refused."""
import dataclasses

import numpy as np
import pytest

from perfcounter.models.args import ModelArgs
from perfcounter.serve import ServeError, deployment, find_max_qps, synthetic
from perfcounter.serve.scheduler import EngineConfig
from perfcounter.serve.search import flood, scaled_trace, steady_throughput
from perfcounter.serve.workload import Workload

TINY = ModelArgs(block_size=1024, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)


@pytest.fixture(scope="module")
def dep():
    return deployment(TINY, "h100-sxm", max_num_seqs=64, max_num_batched_tokens=512)


class ToyTable:
    """A device whose every step takes `step` seconds, whatever it holds."""

    def __init__(self, step: float):
        self.step, self.static_w, self.label = step, 0.0, "toy"
        self.counts = type("Counts", (), {"window": None, "experts": 0})()

    def seconds(self, f):
        return self.step

    def energy_j(self, f, seconds):
        return 0.0


def toy(dep, seqs: int, step: float = 0.01):
    return dataclasses.replace(dep, table=ToyTable(step),
                               engine=EngineConfig(100_000, 512, seqs))


def even(n: int, prompt: int = 4, output: int = 1):
    """make(qps, at_least): n requests evenly spaced at qps (no randomness)."""
    return lambda q, at_least=0: Workload(np.arange(n) / q, np.full(n, prompt),
                                          np.full(n, output), np.zeros(n, dtype=np.int64),
                                          None, f"qps {q:g}")


@pytest.mark.parametrize("seqs, expected", [(1, 100.0), (4, 400.0)])
def test_a_toy_device_found_rate_is_the_hand_derived_one(dep, seqs, expected):
    # every step 10 ms; a request of 4 prompt tokens and 1 output token is one step; at most
    # `seqs` a step: the engine completes seqs / 10 ms = 100 (1 a step) or 400 (4) requests a
    # second. Evenly spaced arrivals at that rate wait at most one step: TTFT <= 20 ms, so the
    # SLO holds up to the throughput, and the answer is the throughput itself
    found = find_max_qps(toy(dep, seqs), even(200), "ttft=20ms")
    assert found.throughput == pytest.approx(expected, rel=1e-9)
    assert found.rate == pytest.approx(expected, rel=1e-9) and found.limited_by_throughput
    # a TTFT under one step (10 ms) is met at no rate
    assert find_max_qps(toy(dep, seqs), even(200), "ttft=5ms").rate is None


def test_steady_throughput_counts_a_batch_finishing_together_once(dep):
    # 200 requests in groups of 4 finishing every 10 ms: t20 = 0.11 s (group 11),
    # t80 = 0.40 s (group 40); groups 12..40 = 29 groups x 4 = 116 requests / 0.29 s = 400
    from perfcounter.serve import serve
    run = serve(toy(dep, 4), flood(even(200)(1.0), 16)).run
    assert steady_throughput(run) == pytest.approx(400.0, rel=1e-9)


def test_a_tighter_slo_never_gives_a_higher_rate(dep):
    make = lambda q, at_least=0: synthetic(max(300, at_least), "uniform:16-200",  # noqa: E731
                                           "uniform:8-64", qps=q, seed=0)
    # (300-request probes: the property holds at any length)
    rates = [find_max_qps(dep, make, slo, probe_requests=300).rate or 0.0 for slo in (
        "ttft=1ms,tpot=0.2ms", "ttft=0.3ms,tpot=0.1ms", "ttft=0.2ms,tpot=0.1ms",
        "ttft=0.1ms,tpot=0.05ms")]
    assert rates == sorted(rates, reverse=True) and rates[0] > 0


@pytest.mark.slow  # two searches of 4,000- and 8,000-request probes: ~30 s here
def test_doubling_the_requests_moves_the_answer_at_most_5_percent(dep):
    def search(n):
        make = lambda q, at_least=0: synthetic(max(n, at_least), "uniform:16-200",  # noqa
                                               "uniform:8-64", qps=q, seed=0)
        return find_max_qps(dep, make, "ttft=0.3ms,tpot=0.1ms").rate
    a, b = search(4000), search(8000)
    assert abs(b - a) <= 0.05 * a


def test_a_trace_is_scaled_and_a_closed_loop_refused(dep):
    trace = Workload(np.array([0.0, 1.0, 2.0, 4.0]), np.full(4, 8), np.full(4, 2),
                     np.zeros(4, dtype=np.int64), None, "t.jsonl")
    # its own rate: 3 gaps over 4 s = 0.75/s; at 3/s the arrivals are 4x closer
    assert scaled_trace(trace, 3.0).arrival.tolist() == [0.0, 0.25, 0.5, 1.0]
    # repeated to 8 requests: the second copy one mean gap (4 / 3 s) after the first's last
    # arrival, 4 + 4/3 = 16/3 s, scaled by 1/4: 4/3 s
    twice = scaled_trace(trace, 3.0, at_least=6)
    assert len(twice) == 8 and twice.arrival[4] == pytest.approx(4 / 3)
    assert twice.arrival[7] == pytest.approx((16 / 3 + 4) / 4)
    at_once = dataclasses.replace(trace, arrival=np.zeros(4))
    with pytest.raises(ServeError, match="all arrive at once"):
        scaled_trace(at_once, 3.0)
    closed = lambda q, at_least=0: synthetic(10, 8, 2, concurrency=2)  # noqa: E731
    with pytest.raises(ServeError, match="--concurrency is a closed loop"):
        find_max_qps(dep, closed, "ttft=1s")
