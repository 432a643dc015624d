"""How long `perfcounter plan` takes: a deployment search of Llama-3.1-70B on 8 x H100.

    python benchmarks/bench_plan.py                  # the default search, on this machine's cores
    python benchmarks/bench_plan.py --check          # and the exhaustive one: the same answer?
    python benchmarks/bench_plan.py --workers 1      # in one process
    python benchmarks/bench_plan.py --devices h100-sxm:64 --aggregated_only --no_pool_question

The search is perfcounter.plan.plan's default space (weights bf16, fp8, int8, int4-128; KV
cache bf16 or fp8; TP 1-8 x DP on the 8 GPUs of one node, and disaggregated prefill:decode
pools; max_num_seqs 16-256) for a workload of --num_requests requests at --qps (prompt
--prompt_length, output --max_new_tokens tokens) and the SLO TTFT 1 s, TPOT 50 ms, pruned
(plan/prune.py) unless --exhaustive; --aggregated_only leaves the disaggregated ones out (a
pool of 64 GPUs enumerates more than plan's 4,096 with them). It prints the load average
before, the candidates enumerated, left out as unfit, pruned (by rule), taken from a run
simulated for another and simulated, the step tables used, the wall time of the
whole search, the CPU seconds of this process and its workers together and the load average
after: other work on the machine slows the wall time, the CPU seconds / cores are what the
search takes on idle cores. Then the recommendation, and the CPU seconds of counting one step table (the
recommendation's) afresh in this process. --check also runs the exhaustive search
(every candidate that fits simulated), prints the same lines for it, and whether the
recommendation and the front are the same (exit code 1 if not).

Step tables are kept on disk between runs (perfcounter/serve/counts_cache.py); the search is
timed cold, in a folder of its own that starts empty (each table counted and saved), and with
--warm again as a person's next question finds it: this process's caches emptied and every
table read back from that folder (a line for each: the tables saved and read).

First it asks a bounded pool question, issue 46's (SmolLM2-135M on 4,096 H100s, 5 requests/s
x 50 requests; --pool_devices, --pool_model): a pool of thousands of GPUs is answered, or
refused with its bound named (plan/candidates.py MAX_CANDIDATES), before any table is
counted; the line says which, its wall time (the question's target: within 10 s) and the
load average around it.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.plan import PlanError, plan  # noqa: E402
from perfcounter.plan.execute import counts_group, default_workers  # noqa: E402
from perfcounter.plan.render import plan_text, pruned_text  # noqa: E402
from perfcounter.serve import cache_clear, counts_cache  # noqa: E402


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def pool_question(model: str, devices: str, workers: int) -> None:
    """The bounded pool question (module doc): answered or refused, in how long, under what
    load."""
    load_before = os.getloadavg()
    start = time.perf_counter()
    try:
        result = plan(model, devices, slo="ttft=1s,tpot=50ms", qps=5.0, num_requests=50,
                      workers=workers)
        said = (f"answered: {len(result.candidates)} candidates, recommended "
                + ("none" if result.recommended is None else f"#{result.recommended}"))
    except PlanError as e:
        said = f"refused: {e}"
    wall = time.perf_counter() - start
    print(f"bounded pool question: {model} on {devices}, 5 requests/s x 50 requests: {wall:.2f} "
          f"s wall (target: within 10 s); load average (1 min) before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}")
    print(f"  {said}")


def search(a, workers: int, exhaustive: bool):
    """One search of the question, timed; its lines printed."""
    name = "exhaustive" if exhaustive else "pruned"
    before, cpu_before = load(), cpu_seconds()
    start = time.perf_counter()
    result = plan(a.model, a.devices, slo=a.slo, qps=a.qps, num_requests=a.num_requests,
                  prompt_length=a.prompt_length, max_new_tokens=a.max_new_tokens,
                  workers=workers, exhaustive=exhaustive, disaggregated=not a.aggregated_only)
    wall = time.perf_counter() - start
    cpu = cpu_seconds() - cpu_before
    unfit = result.fits.count(False)
    tables = {counts_group(c) for c, f, ok in zip(result.candidates, result.figures,
                                                   result.fits)
              if ok and not (f and f.get("pruned_by") == "bound")}  # a table's counts a task
    print(f"{name} search: {a.model} on {a.devices}, {a.qps:g} requests/s x {a.num_requests} "
          f"requests (prompt {a.prompt_length}, output {a.max_new_tokens}), {workers} worker "
          f"processes; load average (1, 5, 15 min) before: {before}; cores: {os.cpu_count()}")
    print(f"  candidates: {len(result.candidates)} enumerated, {unfit} unfit, "
          f"{pruned_text(result)}{result.simulated} simulated; step tables: "
          f"{len(tables)} (counted, or read back from the disk cache)")
    print(f"  wall: {wall:.1f} s; CPU: {cpu:.1f} s in all processes ({cpu / workers:.1f} s a "
          f"core of {workers}); load average after: {load()}")
    saved = len(list(counts_cache.folder().glob("*.pkl"))) if counts_cache.enabled() else 0
    print(f"  step tables in the disk cache after: {saved} ({'on' if counts_cache.enabled() else 'off'}"
          f", {counts_cache.folder()})")
    i = result.recommended
    print("  recommended: " + ("none" if i is None else f"#{i} {result.commands[i]}"))
    print(f"  front: {result.front}")
    if a.text:
        print(plan_text(result))
    return result


def one_table(result) -> None:
    """The CPU seconds of counting and pricing one step table (the recommendation's, or the
    first candidate's): what each of the search's `counts made` costs."""
    from perfcounter.plan import evaluate as ev
    i = result.recommended if result.recommended is not None else result.fits.index(True)
    c = result.candidates[i]
    cache_clear()
    kept = os.environ.get(counts_cache.ENV)
    os.environ[counts_cache.ENV] = "0"  # counted, not read back
    before = cpu_seconds()
    ev.deployment(result.job.model, c.device, **ev.deployment_kwargs(c, result.job))
    if kept is None:
        del os.environ[counts_cache.ENV]
    else:
        os.environ[counts_cache.ENV] = kept
    print(f"one step table (#{i}'s) counted and priced: {cpu_seconds() - before:.2f} s CPU; "
          f"load average {load()}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--devices", default="h100-sxm:8")
    p.add_argument("--qps", type=float, default=4.0)
    p.add_argument("--num_requests", type=int, default=100)
    p.add_argument("--prompt_length", default="512")
    p.add_argument("--max_new_tokens", default="128")
    p.add_argument("--slo", default="ttft=1s,tpot=50ms")
    p.add_argument("--aggregated_only", action="store_true",
                   help="no disaggregated candidates (a pool of 64 enumerates too many)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--exhaustive", action="store_true", help="the exhaustive search alone")
    p.add_argument("--check", action="store_true",
                   help="also the exhaustive search: the same recommendation and front?")
    p.add_argument("--text", action="store_true", help="also print plan's own output")
    p.add_argument("--warm", action="store_true",
                   help="also the search again, its step tables read back from the disk cache")
    p.add_argument("--pool_model", default="smollm2-135m")
    p.add_argument("--pool_devices", default="h100-sxm:4096",
                   help="the bounded pool question's pool (module doc)")
    p.add_argument("--no_pool_question", action="store_true")
    a = p.parse_args()
    workers = a.workers or default_workers()
    if counts_cache.enabled():  # cold: a folder of its own, empty (the module doc)
        os.environ["PERFCOUNTER_HOME"] = tempfile.mkdtemp(prefix="bench_plan-")
    if not a.no_pool_question:
        pool_question(a.pool_model, a.pool_devices, workers)
    result = search(a, workers, a.exhaustive)
    if a.warm:
        cache_clear()
        print("again, warm (the step tables read back from the disk cache):")
        warm = search(a, workers, a.exhaustive)
        same = (result.recommended, result.front) == (warm.recommended, warm.front)
        print(f"  the same recommendation and front as cold: {'yes' if same else 'NO'}")
    one_table(result)
    if not a.check or a.exhaustive:
        return 0
    every = search(a, workers, True)
    same = (result.recommended, result.front) == (every.recommended, every.front)
    print(f"the same recommendation and front as the exhaustive search: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
