"""The highest request rate a deployment holds under an SLO (`--find_max_qps`).

1. The steady throughput mu: a flood of the workload's requests (every one at time 0;
   at least FLOOD_SEQS x max_num_seqs of them, the workload's requests repeated, so that
   the batch is full for most of the run) and its completions counted between the 20th
   and the 80th percentile of finish times t20 and t80 (the batch filling and draining
   left out): mu = requests finishing in (t20, t80] / (t80 - t20). Above mu the queue
   grows without bound, so mu is the upper
   bound of the search (and the answer when the SLO holds there).
2. A probe at rate q serves `make(q, PROBE_REQUESTS)` (the workload at rate q, at least
   PROBE_REQUESTS requests long) and meets the SLO when the run is not overloaded
   (metrics.overload) and at least `attainment` of its requests, the first WARMUP of them
   by arrival left out (they find an empty engine), meet every target. A short run's
   attainment near saturation depends on its arrivals' draw: Llama-like tiny models at
   ttft=0.3ms,tpot=0.1ms found 16.9k, 15.7k and 17.4k qps at 500, 1,000 and 2,000 requests,
   15.8k, 16.2k and 16.4k at 4,000, 8,000 and 16,000 (tests/test_serve_search.py holds a
   doubling from 4,000 within 5 %): probes run at least 4,000.
3. If mu meets the SLO, mu is the answer ("limited by throughput"); otherwise bisection
   between 0 and mu until the bracket is within TOLERANCE of its top (at most ITERATIONS
   probes): the answer is the highest rate that met. A tighter SLO never gives a higher
   rate (each probe it fails the looser one may pass, never the reverse).

A trace file is replayed at rate q with its arrival times scaled by (its own rate / q),
its own rate being (requests - 1) / (last arrival - first arrival), and repeated (each copy
one mean gap after the one before) to PROBE_REQUESTS requests at least; a closed loop
(--concurrency) has no rate to search and is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcounter.serve.errors import ServeError
from perfcounter.serve.metrics import parse_slo, per_request
from perfcounter.serve.workload import Workload

FLOOD_SEQS = 4  # a flood holds at least this many batches of max_num_seqs requests
WARMUP = 0.1  # share of the requests, first by arrival, left out of the attainment
TOLERANCE = 0.005  # bracket width at which the bisection stops, relative to its top
ITERATIONS = 16
FLOOD_MAX = 20_000  # requests a flood is capped at (the simulation's time)
PROBE_REQUESTS = 4_000  # the fewest requests a probe runs (module doc: where the answer settles)


@dataclass
class Search:
    """The search's answer and what it tried: rate (None: not even the lowest tried),
    mu, whether mu bound it, and (rate, met) of each probe."""

    rate: float | None
    throughput: float
    limited_by_throughput: bool
    probes: list
    results: list  # ServeResult of each probe, in order


def flood(w: Workload, at_least: int) -> Workload:
    """Every request of `w` at time 0, repeated until there are at least `at_least`."""
    reps = max(1, -(-at_least // len(w)))
    n = min(len(w) * reps, max(len(w), FLOOD_MAX))
    tile = lambda a: np.tile(a, reps)[:n]  # noqa: E731
    return Workload(np.zeros(n), tile(w.prompt), tile(w.output), tile(w.cached), None,
                    f"flood of {n} requests")


def steady_throughput(run) -> float:
    """Requests a second finishing after the 20th and by the 80th percentile of finish
    times t20, t80: their count / (t80 - t20) (a batch finishing together counts once)."""
    finish = np.sort(np.array([r.finish for r in run.requests]))
    t20, t80 = finish[int(0.2 * len(finish))], finish[int(0.8 * len(finish)) - 1]
    done = np.searchsorted(finish, t80, side="right") - np.searchsorted(finish, t20, "right")
    if t80 <= t20 or done <= 0:
        return len(finish) / run.end
    return float(done / (t80 - t20))


def attained(result, slo: dict, warmup: float = WARMUP) -> float:
    """Share of the requests after the first `warmup` share (by arrival) meeting `slo`."""
    rq = per_request(result.run)
    order = np.argsort(rq["arrival"], kind="stable")
    keep = order[int(warmup * len(order)):]
    good = np.ones(len(keep), dtype=bool)
    for name, limit in slo.items():
        values = np.nan_to_num(rq[name][keep], nan=0.0)  # a one-token request has no TPOT
        good &= values <= limit
    return float(good.mean()) if len(good) else 0.0


def scaled_trace(w: Workload, qps: float, at_least: int = 0) -> Workload:
    """A trace replayed at `qps`: its arrivals scaled by (its own rate / qps), the trace
    repeated (each copy one mean gap after the last arrival of the one before) until it
    holds at least `at_least` requests."""
    span = float(w.arrival[-1] - w.arrival[0])
    if len(w) < 2 or span <= 0:
        raise ServeError("--find_max_qps with --trace_file scales the trace's arrival times; "
                         "this trace's requests all arrive at once (no rate to scale)")
    own = (len(w) - 1) / span
    reps = max(1, -(-at_least // len(w)))
    offsets = np.repeat(np.arange(reps) * (span + 1 / own), len(w))
    arrival = np.tile(w.arrival - w.arrival[0], reps) + offsets
    return Workload(arrival * (own / qps), np.tile(w.prompt, reps), np.tile(w.output, reps),
                    np.tile(w.cached, reps), None,
                    f"{w.source} at qps {qps:g}" + (f", repeated {reps} times" if reps > 1
                                                    else ""))


def find_max_qps(dep, make, slo, *, attainment: float = 0.9, serve=None,
                 probe_requests: int = PROBE_REQUESTS) -> Search:
    """The search of the module doc; `make(qps, at_least)` builds the workload at a rate
    with at least `at_least` requests (a trace: its own), `serve` is api.serve (passed in:
    api imports this module); probe_requests: the fewest requests a probe runs."""
    if not 0 < attainment <= 1:
        raise ServeError(f"--slo_attainment {attainment}: expected a fraction in (0, 1]")
    slo = parse_slo(slo)
    base = make(1.0, probe_requests)
    if base.concurrency is not None:
        raise ServeError("--find_max_qps searches an arrival rate; --concurrency is a closed "
                         "loop, which has none (leave it out)")
    at_least = FLOOD_SEQS * dep.engine.max_num_seqs
    mu = steady_throughput(serve(dep, flood(base, at_least)).run)
    probes, results = [], []

    def meets(q: float) -> bool:
        result = serve(dep, make(q, probe_requests), slo=slo)
        ok = not result.metrics["overloaded"] and attained(result, slo) >= attainment
        probes.append((q, ok))
        results.append(result)
        return ok

    if meets(mu):
        return Search(mu, mu, True, probes, results)
    lo, hi, best = 0.0, mu, None
    for _ in range(ITERATIONS):
        if best is not None and hi - lo <= TOLERANCE * hi:
            break
        mid = (lo + hi) / 2
        if meets(mid):
            lo, best = mid, mid
        else:
            hi = mid
    return Search(best, mu, False, probes, results)
