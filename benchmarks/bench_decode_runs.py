"""How much the scheduler's decode stretches (serve/decode_runs.py) save: one
deployment's workload simulated with them and stepping one request at a time, side by side,
the CPU seconds of a run (median of --repeats, alternating), the steps, the mean batch, and
whether the two runs are the same, bit for bit; with the machine's load.

    python benchmarks/bench_decode_runs.py                      # 70B TP8 int4: 4 and 100 requests/s
    python benchmarks/bench_decode_runs.py --model llama-3.1-8b --tensor_parallel_size 1 --quantize none
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.serve import deployment, synthetic  # noqa: E402
from perfcounter.serve import scheduler  # noqa: E402
from perfcounter.serve.scheduler import simulate_engine  # noqa: E402

CASES = ((4.0, 32, 100), (100.0, 256, 1000))  # requests/s, max_num_seqs, requests


def _same(a, b) -> bool:
    return ([dataclasses.astuple(r) for r in a.requests] ==
            [dataclasses.astuple(r) for r in b.requests] and a.itl == b.itl and
            all(getattr(a.steps, c.name) == getattr(b.steps, c.name)
                for c in dataclasses.fields(a.steps)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--device_spec", default="h100-sxm")
    p.add_argument("--tensor_parallel_size", type=int, default=8)
    p.add_argument("--quantize", default="int4-128")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    print(f"{a.model} on {a.device_spec}, TP {a.tensor_parallel_size}, weights {a.quantize}, "
          f"CUDA graphs; prompt 512, output 128 tokens; cores: {os.cpu_count()}; load "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for qps, seqs, n in CASES:
        dep = deployment(a.model, a.device_spec, tensor_parallel_size=a.tensor_parallel_size,
                         quantize=None if a.quantize == "none" else a.quantize,
                         execution="cudagraphs", max_num_seqs=seqs)
        w = synthetic(n, 512, 128, qps=qps, seed=0)
        simulate_engine(w, dep.table, dep.engine)  # the table's prices cached
        took = {True: [], False: []}
        runs = {}
        for _ in range(a.repeats):
            for fast in (False, True):
                scheduler.DECODE_RUNS = fast
                t = time.process_time()
                runs[fast] = simulate_engine(w, dep.table, dep.engine)
                took[fast].append(time.process_time() - t)
        scheduler.DECODE_RUNS = True
        run = runs[True]
        slow, fast = statistics.median(took[False]), statistics.median(took[True])
        print(f"  {qps:g} requests/s x {n}, max_num_seqs {seqs}: {len(run.steps.start)} steps, "
              f"mean batch {sum(run.steps.seqs) / len(run.steps.seqs):.1f}; a run "
              f"{fast:.3f} s CPU with stretches, {slow:.3f} s step by step ({slow / fast:.2f}x); "
              f"the same run: {'yes' if _same(runs[True], runs[False]) else 'NO'}")
    print("load after " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
