"""How long `perfcounter plan` takes: a deployment search of Llama-3.1-70B on 8 x H100.

    python benchmarks/bench_plan.py                      # the default search, on this machine's cores
    python benchmarks/bench_plan.py --workers 1          # in one process
    python benchmarks/bench_plan.py --ray                # on a local Ray

The search is perfcounter.plan.plan's default space (weights bf16, fp8, int8, int4-128; KV
cache bf16 or fp8; every TP x PP x DP on 8 GPUs; max_num_seqs 16-256) for a workload of
--num_requests requests at --qps (prompt 512, output 128 tokens) and the SLO TTFT 1 s, TPOT
50 ms. It prints the candidates enumerated and simulated, the wall time of the whole search
(step tables counted, every candidate served), the step tables counted, this machine's load
average before and after (other work on the machine slows the search; the figure is this
run's, not a bound), and the recommendation.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.plan import plan  # noqa: E402
from perfcounter.plan.execute import groups  # noqa: E402
from perfcounter.plan.render import plan_text  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--devices", default="h100-sxm:8")
    p.add_argument("--qps", type=float, default=4.0)
    p.add_argument("--num_requests", type=int, default=100)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--ray", action="store_true")
    p.add_argument("--text", action="store_true", help="also print plan's own output")
    a = p.parse_args()
    load_before = os.getloadavg()
    start = time.perf_counter()
    result = plan(a.model, a.devices, slo="ttft=1s,tpot=50ms", qps=a.qps,
                  num_requests=a.num_requests, prompt_length="512", max_new_tokens="128",
                  backend="ray" if a.ray else "processes", workers=a.workers)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    kept = [c for c, ok in zip(result.candidates, result.fits) if ok]
    print(f"search: {a.model} on {a.devices}, {a.qps:g} requests/s x {a.num_requests}, "
          f"{result.backend} ({a.workers or os.cpu_count()} workers)" if not a.ray else
          f"search: {a.model} on {a.devices} on Ray")
    print(f"candidates: {len(result.candidates)} enumerated, {result.simulated} simulated; "
          f"step tables counted: {len(groups(kept))}")
    print(f"wall: {wall:.1f} s ({wall / max(result.simulated, 1) * 1e3:.0f} ms a simulated "
          "candidate)")
    print("load average (1, 5, 15 min): before {:.2f} {:.2f} {:.2f}, after {:.2f} {:.2f} {:.2f}; "
          "cores: {}".format(*load_before, *load_after, os.cpu_count()))
    i = result.recommended
    print("recommended: " + ("none" if i is None else result.commands[i]))
    if a.text:
        print(plan_text(result))


if __name__ == "__main__":
    main()
