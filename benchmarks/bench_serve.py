"""How fast `perfcounter serve` simulates: the step table, 10,000 requests, a 20-point QPS sweep.

    python benchmarks/bench_serve.py [--model llama-3-8b] [--device_spec h100-sxm]
        [--execution cudagraphs|compiled|eager|bound] [--engine vllm|trtllm|sglang]
        [--max_num_seqs 256]

Prints the machine's load (os.getloadavg) beside each figure, the time to build the
Llama-3-8B step table (counted and priced once), to simulate 10,000 requests at a
stable rate with the table built (and the CPU time it took: on a loaded machine the wall
time measures the neighbours too), to run a 20-point QPS sweep of 1,000 requests a point,
and the process's peak resident memory. Goals: 10,000 requests in <= 10 s after the table
is built, <= 1 GB; the 20-point sweep in <= 60 s. --max_num_seqs holds the batch limit of
the figures in docs/serve.md (256) whatever the engine's default on the device.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device_spec", default="h100-sxm")
    p.add_argument("--execution", default="cudagraphs",
                   help="the regime steps are priced in (bound: the roofline)")
    p.add_argument("--engine", default="vllm", help="the engine profile (serve/engines.py)")
    p.add_argument("--max_num_seqs", type=int, default=256,
                   help="batch limit (256: the figures' workload; the engine's own: give it)")
    p.add_argument("--num_requests", type=int, default=10_000)
    p.add_argument("--prompt_length", default="uniform:128-1024")
    p.add_argument("--max_new_tokens", default="uniform:32-512")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")  # a spec's missing float32 pJ/FLOP, said once per run
    from perfcounter.serve import ServeError, deployment, serve, synthetic
    try:
        t = time.perf_counter()
        dep = deployment(args.model, args.device_spec, execution=args.execution,
                         engine=args.engine, max_num_seqs=args.max_num_seqs)
        built = time.perf_counter() - t
    except ServeError as e:
        print(f"bench_serve: {e}", file=sys.stderr)
        return 2
    print(dep.engine_line)
    print(f"{args.model} on {dep.name}; step costs: {dep.table.label}")
    print(f"step table (count + price): {built:.2f} s  [{_load()}]")

    def make(qps, n):
        return synthetic(n, args.prompt_length, args.max_new_tokens, qps=qps, seed=0)

    capacity = serve(dep, make(1e9, 2000)).metrics["request_throughput"]
    qps = 0.8 * capacity
    t, cpu = time.perf_counter(), time.process_time()
    result = serve(dep, make(qps, args.num_requests), slo="ttft=200ms,tpot=50ms")
    took, cpu = time.perf_counter() - t, time.process_time() - cpu
    m = result.metrics
    print(f"{args.num_requests:,} requests at {qps:.1f} qps (0.8 x saturated {capacity:.1f}/s): "
          f"{took:.2f} s ({cpu:.2f} s of CPU), {m['steps']:,} steps, mean batch {m['mean_batch_size']:.1f}, "
          f"p99 TTFT {m['p99_ttft_ms']:.1f} ms, p99 TPOT {m['p99_tpot_ms']:.2f} ms  [{_load()}]")
    t = time.perf_counter()
    for i in range(20):
        serve(dep, make(capacity * (i + 1) / 20, 1000))
    print(f"20-point QPS sweep, 1,000 requests a point: {time.perf_counter() - t:.2f} s  "
          f"[{_load()}]")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory: {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
