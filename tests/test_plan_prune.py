"""The pruned deployment search (plan/bounds.py, dedupe.py, prune.py): its bounds by hand and
held below what serve gives, a candidate's figures from another's run equal to serving it,
and on random small questions the same recommendation and front as the exhaustive search."""
import json
import random

import numpy as np
import pytest
import torch

from perfcounter.cli.main import main
from perfcounter.models.args import ModelArgs
from perfcounter.plan import dedupe, plan
from perfcounter.plan import evaluate as ev
from perfcounter.plan.bounds import Bounds, bounds, max_bandwidth, step_seconds
from perfcounter.plan.candidates import Candidate
from perfcounter.plan.pool import parse_devices
from perfcounter.plan.prune import Incumbents, why_left_out
from perfcounter.serve.workload import Workload

TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("prune") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_a_requests_bounds_by_hand():
    w = Workload(np.array([0.0, 1.0, 2.0]), np.array([100, 300, 50]), np.array([1, 5, 3]),
                 np.zeros(3, dtype=np.int64))
    b = bounds(w, {"ttft": 0.05, "tpot": 0.02}, 0.9, 128, 2, 0.01, 0.01)
    # prompts in ceil(P / 128) steps of >= 10 ms: 1, 3, 1 -> TTFT >= 10, 30, 10 ms; E2EL
    # >= TTFT + (O - 1) x 10 ms = 10, 70, 30 ms; the run >= max(0.01, 1.07, 2.03) - 0 = 2.03 s
    # 9 output tokens / 2.03 s / 2 GPUs = 2.2167; all 3 meet TTFT <= 50 ms, TPOT >= 10 <= 20 ms
    assert b.output_throughput_per_gpu == pytest.approx(9 / 2.03 / 2)
    assert b.goodput_per_gpu == pytest.approx(3 / 2.03 / 2) and b.meets_slo
    assert b.tpot_ms == pytest.approx(10.0)
    # TTFT <= 20 ms: the 300-token prompt (>= 30 ms) misses: 2 of 3 < 90 %, goodput 2 / 2.03 / 2
    tight = bounds(w, {"ttft": 0.02}, 0.9, 128, 2, 0.01, 0.01)
    assert not tight.meets_slo and tight.goodput_per_gpu == pytest.approx(2 / 2.03 / 2)
    # disaggregated: prompts at 10 ms a step on the prefill pool, tokens at 30 ms on the decode
    # pool: E2EL >= 10, 30 + 4 x 30 = 150, 10 + 2 x 30 = 70 ms -> the run >= 2.07 s
    pools = bounds(w, {"tpot": 0.02}, 0.9, 128, 4, 0.01, 0.03)
    assert pools.output_throughput_per_gpu == pytest.approx(9 / 2.07 / 4)
    assert pools.tpot_ms == pytest.approx(30.0) and not pools.meets_slo  # 2 of 3 have a TPOT


def test_a_steps_bound_by_hand():
    toy = ModelArgs(block_size=1024, vocab_size=64, n_layer=4, n_head=8, n_local_heads=8, dim=64,
                    intermediate_size=128)
    h100 = parse_devices("h100-sxm:1")[0].spec
    # no measured curves; the stated efficiencies (<= 1) leave the bandwidth, 3.35 TB/s
    assert max_bandwidth(h100) == h100.bandwidth == 3.35e12
    # 182,016 B of weights (TOY at int8, test_plan.py) less the embedding at 4 B an element,
    # 64 x 64 x 4 = 16,384: 165,632 B read a step at most 3.35 TB/s, x 0.98 (the fit's 1 %)
    assert step_seconds(toy, 182_016, h100) == pytest.approx(0.98 * 165_632 / 3.35e12)
    assert step_seconds(toy, 182_016, h100, 2) == pytest.approx(2 * 0.98 * 165_632 / 3.35e12)
    moe = ModelArgs(block_size=1024, vocab_size=64, n_layer=4, n_head=8, n_local_heads=8,
                    dim=64, intermediate_size=128, num_experts=4, num_activated_experts=2)
    assert step_seconds(moe, 182_016, h100) == 0.0  # a step reads the experts routed to


def test_dominance_is_strict_and_the_goodput_bound_names_the_best():
    inc = Incumbents(0.9)
    inc.add(3, {"median_tpot_ms": 20.0, "output_throughput_per_gpu": 100.0,
                "slo_met_fraction": 1.0, "goodput_per_gpu": 0.5, "overloaded": False})
    # at least 100 tok/s/GPU at no more than 20 ms, one strictly: (20, 100) is not dominated
    assert inc.dominating(20.0, 100.0) is None and inc.dominating(20.0, 99.0) == 3
    assert why_left_out(inc, 25.0, 90.0, 0.6, True) is None  # might beat 0.5 goodput/GPU
    assert "below #3's 0.5" in why_left_out(inc, 25.0, 90.0, 0.4, True)
    assert "SLO out of reach" in why_left_out(inc, 25.0, 90.0, 9.0, False)
    assert why_left_out(inc, 15.0, 90.0, 0.1, False) is None  # might be on the front


def test_a_short_runs_optimistic_figures_by_hand():
    from perfcounter.plan.prune import estimate_reason
    inc = Incumbents(0.9)
    inc.add(2, {"median_tpot_ms": 10.0, "output_throughput_per_gpu": 100.0,
                "slo_met_fraction": 1.0, "goodput_per_gpu": 1.0, "overloaded": False})
    b = Bounds(0.001, 1.0, 50.0, 0.8, True, 0.8)
    # TPOT >= max(1 ms bound, 20 ms x (1 - 0.3) = 14 ms) at <= 50 tok/s/GPU (its bound): #2's
    # (10 ms, 100) dominates; goodput <= min(0.8, min(1, 0.95 + 0.3) x 0.8 requests/s/GPU)
    # = 0.8 < #2's 1.0: left out
    assert "dominated by #2" in estimate_reason(inc, b, (20.0, 0.95), 8)
    assert estimate_reason(inc, b, (14.0, 0.95), 8) is None  # 14 x 0.7 = 9.8 ms < 10 ms
    rich = Bounds(0.001, 1.0, 50.0, 2.0, True, 2.0)  # might reach 2.0 > 1.0 goodput/GPU
    assert estimate_reason(inc, rich, (20.0, 0.95), 8) is None
    # met by half the short run's requests: 0.5 < 0.9 - 0.3, the SLO out of reach
    assert "SLO out of reach" in estimate_reason(inc, rich, (20.0, 0.5), 8)


def _served(tiny, c, job):
    figures = ev.evaluate(c, job)
    return figures, ev.last_run(c, job)


def test_a_batch_limit_never_reached_gives_the_same_run(tiny):
    job = ev.Job(tiny, qps=20.0, num_requests=16, prompt_length="32", max_new_tokens="4",
                 slo="ttft=50ms,tpot=2ms")
    big = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 1, False, 64)
    figures, result = _served(tiny, big, job)
    peak = max(result.run.steps.seqs)
    assert peak < 16 and dedupe.unconstrained(result, 3)  # 36 tokens: 3 blocks of 16
    small = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 1, False, 16)
    base, reused = dedupe.reusable(small, job, {7: (big, result)}, 3)
    derived = dedupe.derive(small, job, base, reused)
    assert derived.pop("same_run_as") == 7
    assert derived == ev.evaluate(small, job)  # bit for bit: == on every float
    tight = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 1, False, int(peak))
    assert dedupe.reusable(tight, job, {7: (big, result)}, 3) is None  # S' = P: may bind


def test_replicas_each_serving_alone_give_the_same_run(tiny):
    # a request every 2 s of 4 tokens on a tiny model: each ends long before the next
    job = ev.Job(tiny, qps=0.5, num_requests=8, prompt_length="16", max_new_tokens="4",
                 slo="ttft=50ms,tpot=2ms")
    one = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 1, False, 8)
    _, result = _served(tiny, one, job)
    assert dedupe.alone(result)
    four = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 4, False, 8)
    base, reused = dedupe.reusable(four, job, {0: (one, result)}, 2)
    derived = dedupe.derive(four, job, base, reused)
    del derived["same_run_as"]
    served = ev.evaluate(four, job)
    assert derived == served
    assert served["output_throughput_per_gpu"] * 4 == pytest.approx(
        ev.evaluate(one, job)["output_throughput_per_gpu"])  # the same run on 4x the GPUs


def test_the_bounds_hold_below_what_serve_gives(tiny):
    from perfcounter.plan.options import PlanOptions
    from perfcounter.plan.search import _bounded, _memory_fits, _question
    search = dict(slo="ttft=50ms,tpot=2ms", qps=50.0, num_requests=24,
                  prompt_length="uniform:16-48", max_new_tokens="8", quantizations=("none",),
                  kv_cache_dtypes=("none",), max_num_seqs=(4, 16),
                  pipeline_parallel_size=(1, 2))  # TP, PP, DP and 1P:1D on 2 GPUs
    result = plan(tiny, "h100-sxm:2", backend="serial", exhaustive=True, **search)
    assert {c.pipeline_parallel_size for c in result.candidates} == {1, 2}
    assert any(c.disaggregated for c in result.candidates)
    options = PlanOptions.of(**search)
    q = _question(tiny, "h100-sxm:2", options)
    fits, _, found = _memory_fits(q, result.candidates, options.engine)
    for i, c, b in _bounded(q, 0.9, result.candidates, [i for i, ok in enumerate(fits) if ok],
                            found):
        f = result.figures[i]
        assert isinstance(b, Bounds) and b.step_s > 0
        assert f["output_throughput_per_gpu"] <= b.output_throughput_per_gpu
        assert (f["goodput_per_gpu"] or 0.0) <= b.goodput_per_gpu
        if f["median_tpot_ms"] is not None:
            assert f["median_tpot_ms"] >= b.tpot_ms
        if f["slo_met_fraction"] >= 0.9:
            assert b.meets_slo


def test_the_command_line_says_what_it_pruned_and_exhaustive_simulates_all(tiny, tmp_path,
                                                                            capsys):
    argv = ["plan", "--model", tiny, "--devices", "h100-sxm:4", "--qps", "200",
            "--num_requests", "40", "--prompt_length", "32", "--max_new_tokens", "8",
            "--quantize", "none", "--kv_dtype", "none", "--max_num_seqs", "4,64",
            "--slo", "ttft=50ms,tpot=2ms", "--workers", "1", "--aggregated_only"]
    assert main(argv=[*argv, "--save_path", str(tmp_path / "p.json")]) == 0
    pruned = json.loads((tmp_path / "p.json").read_text())
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("candidates:"))
    # 1 + 2 + 4 GPUs (TP 1 DP 1, 2, 4; TP 2 DP 1, 2; TP 4) x 2 batch limits = 12
    assert line.startswith("candidates: 12 enumerated, 0 left out (no KV cache fits a rank), ")
    assert f"{pruned['simulated']} simulated on a process pool" in line
    assert main(argv=[*argv, "--exhaustive", "--save_path", str(tmp_path / "e.json")]) == 0
    every = json.loads((tmp_path / "e.json").read_text())
    assert every["exhaustive"] and every["simulated"] == every["enumerated"] == 12
    assert not pruned["exhaustive"] and pruned["simulated"] < 12
    assert (pruned["recommended"], pruned["pareto_front"]) == \
        (every["recommended"], every["pareto_front"])
    left_out = [r for r in pruned["candidates"] if "pruned" in r or "same_run_as" in r]
    assert len(left_out) == 12 - pruned["simulated"]
    assert all(r.get("pruned_by") in ("bound", "halving") or "same_run_as" in r for r in left_out)


# 4 layers as wide as an 8B's (32 heads, 8 KV heads: TP 1-8): a step's weights (1.7 GB) are
# most of its time on an H100, so bounds can prune; counted as fast as the tiny model
WIDE = {"block_size": 4096, "vocab_size": 1024, "n_layer": 4, "n_head": 32, "n_local_heads": 8,
        "dim": 4096, "intermediate_size": 14336}


@pytest.mark.slow
def test_the_pruned_search_gives_the_same_figures_on_a_process_pool_and_ray(tmp_path):
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps(WIDE))
    search = dict(slo="ttft=20ms,tpot=2ms", qps=100.0, num_requests=48, prompt_length="200",
                  max_new_tokens="8", quantizations=("none",), kv_cache_dtypes=("none",),
                  max_num_seqs=(4, 64))
    serial = plan(str(wide), "h100-sxm:4", backend="serial", **search)
    pooled = plan(str(wide), "h100-sxm:4", backend="processes", workers=2, **search)
    assert serial.pruned and serial.figures == pooled.figures  # bit for bit, pruned alike
    assert (serial.front, serial.recommended) == (pooled.front, pooled.recommended)
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:  # a Ray actor a worker, each keeping its groups' tables
        on_ray = plan(str(wide), "h100-sxm:4", backend="ray", **search)
    finally:
        ray.shutdown()
    assert on_ray.figures == serial.figures


def _question(rng: random.Random) -> tuple[str, dict]:
    gpus = rng.choice([1, 2, 4, 4, 8, 8])
    devices = f"h100-sxm:{gpus}" if rng.random() < 0.7 else \
        f"h100-sxm:{gpus},a100-sxm4-80gb:{rng.choice([1, 2])}"
    return devices, dict(
        slo=f"ttft={rng.choice([5, 20, 100])}ms,tpot={rng.choice([0.5, 1, 2, 5])}ms",
        qps=rng.choice([10.0, 100.0, 500.0, 2000.0]), num_requests=rng.choice([16, 32, 48, 64]),
        prompt_length=rng.choice(["16", "uniform:8-64", "200", "uniform:100-900"]),
        max_new_tokens=str(rng.choice([1, 2, 4, 8, 16])), quantizations=("none",),
        kv_cache_dtypes=rng.choice([("none",), ("none", "fp8")]),
        max_num_seqs=rng.choice([(2, 8), (4, 64), (1, 16, 256)]),
        slo_attainment=rng.choice([0.5, 0.9, 1.0]), seed=rng.randrange(100),
        disaggregated=rng.random() < 0.5, backend="serial")


@pytest.mark.slow
def test_twenty_random_questions_pruned_as_exhaustive(tmp_path):
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps(WIDE))
    rng, rules = random.Random(1), set()
    for n in range(20):
        devices, question = _question(rng)
        every = plan(str(wide), devices, exhaustive=True, **question)
        pruned = plan(str(wide), devices, **question)
        assert (pruned.recommended, pruned.front) == (every.recommended, every.front), \
            (n, devices, question)
        for i in pruned.front + [pruned.recommended] * (pruned.recommended is not None):
            kept = {k: v for k, v in pruned.figures[i].items() if k != "same_run_as"}
            assert kept == every.figures[i]  # the front and the pick from whole runs
        rules |= set(pruned.pruned) | ({"same run"} if pruned.same_run else set())
    assert rules == {"bound", "halving", "same run"}  # every rule left some candidate out
