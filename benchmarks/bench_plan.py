"""How long `perfcounter plan` takes: a deployment search of Llama-3.1-70B on 8 x H100.

    python benchmarks/bench_plan.py                  # the default search, on this machine's cores
    python benchmarks/bench_plan.py --workers 1          # in one process

The search is perfcounter.plan.plan's default space (weights bf16, fp8, int8, int4-128; KV
cache bf16 or fp8; TP 1-8 x DP on the 8 GPUs of one node, and disaggregated prefill:decode
pools; max_num_seqs 16-256) for a workload of --num_requests requests at --qps (prompt 512,
output 128 tokens) and the SLO TTFT 1 s, TPOT 50 ms. It prints the candidates enumerated and
simulated, the step tables counted, the wall time of the whole search (tables counted, every
candidate served), the CPU seconds of this process and its workers together, and the
machine's load average before and after: other work on the machine slows the wall time, the
CPU seconds / cores are what the search takes on idle cores. Then the recommendation.

First it asks a bounded pool question, issue 46's (SmolLM2-135M on 4,096 H100s, 5 requests/s
x 50 requests; --pool_devices, --pool_model): a pool of thousands of GPUs is answered, or
refused with its bound named (plan/candidates.py MAX_CANDIDATES), before any table is
counted; the line says which, its wall time (the question's target: within 10 s) and the
load average around it. It prints; it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.plan import PlanError, plan  # noqa: E402
from perfcounter.plan.execute import default_workers, groups  # noqa: E402
from perfcounter.plan.render import plan_text  # noqa: E402


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--devices", default="h100-sxm:8")
    p.add_argument("--qps", type=float, default=4.0)
    p.add_argument("--num_requests", type=int, default=100)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--text", action="store_true", help="also print plan's own output")
    p.add_argument("--pool_model", default="smollm2-135m")
    p.add_argument("--pool_devices", default="h100-sxm:4096",
                   help="the bounded pool question's pool (module doc)")
    a = p.parse_args()
    workers = a.workers or default_workers()
    pool_question(a.pool_model, a.pool_devices, workers)
    load_before, cpu_before = os.getloadavg(), cpu_seconds()
    start = time.perf_counter()
    result = plan(a.model, a.devices, slo="ttft=1s,tpot=50ms", qps=a.qps,
                  num_requests=a.num_requests, prompt_length="512", max_new_tokens="128",
                  workers=workers)
    wall = time.perf_counter() - start
    cpu, load_after = cpu_seconds() - cpu_before, os.getloadavg()
    kept = [c for c, ok in zip(result.candidates, result.fits) if ok]
    disagg = sum(c.disaggregated for c in kept)
    print(f"search: {a.model} on {a.devices}, {a.qps:g} requests/s x {a.num_requests} "
          f"requests, {workers} worker processes")
    print(f"candidates: {len(result.candidates)} enumerated, {result.simulated} simulated "
          f"({disagg} disaggregated); step tables counted: {len(groups(kept))}")
    print(f"wall: {wall:.1f} s; CPU: {cpu:.1f} s in all processes ({cpu / workers:.1f} s "
          f"a core of {workers})")
    print("load average (1, 5, 15 min): before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f}; "
          "cores: {}".format(*load_before, *load_after, os.cpu_count()))
    i = result.recommended
    print("recommended: " + ("none" if i is None else result.commands[i]))
    if a.text:
        print(plan_text(result))


if __name__ == "__main__":
    main()
