"""Published serving measurements beside `perfcounter serve`, each row served as it ran.

    python benchmarks/bench_serving_published.py                # every row it can price
    python benchmarks/bench_serving_published.py --only trtllm017
    python benchmarks/bench_serving_published.py --max_requests 0       # every request the source ran

Reads `benchmarks/data/published_serving.yaml` (sourced rows, `benchmarks/published_serving.py`)
and serves each row through perfcounter's Python API (`perfcounter.serve`: deployment(), serve(),
synthetic(); docs/serve.md) on the row's registry device, at its precision (fp8: W8A8
`quantize="fp8"` with an fp8 KV cache, as TensorRT-LLM's FP8 checkpoints store both), with the
engine it ran on (`engine=` of deployment(): that engine's regime, admission and limits; where
deployment() has no `engine` keyword, CUDA graphs and serve's own limits). Nothing is fitted to a
row: the device's sourced figures and the pricing defaults price every step.

How a row is served (lengths, counts and rates are the row's):
- static (gptSessionBenchmark): `batch` requests at once, `max_num_seqs` = batch and all of the
  device's memory (STATIC_MEMORY), so the batch runs together to its end; throughput = batch x output / the run. Batch-1 first-token latency:
  one request of one output token (one prefill step).
- flood (trtllm-bench throughput, request rate inf): `num_requests` requests at once, at most
  MAX_REQUESTS (--max_requests; 0: all): the source's 30,000 requests of 128/128 tokens read
  0.8 % more throughput than 3,000 (29,557 against 29,333 tokens/s, Llama-3.1-8B FP8 on an
  H100) in 7x the time; the engine's scheduler chooses the batch; output tokens over the run.
- poisson: `num_requests` requests at `request_rate` a second (seed 0); the row's statistic
  (mean / median) of TTFT, ITL or TPOT.
- concurrency: a closed loop of `batch` requests in flight (where the source states no count,
  4 requests a slot, at least CONCURRENCY_REQUESTS); a decode rate is 1 / the mean TPOT.

measured ÷ predicted: of the throughput for throughput rows, of the latency for latency rows (a
decode rate is a latency: predicted rate ÷ measured rate). Goals: on one GPU 0.9-1.1 for a
throughput and 0.85-1.2 for a latency; on several GPUs 0.8-1.25 for either.
Rows on several GPUs are priced once deployment() takes `tensor_parallel_size`; until then they
are listed "not priced: needs tensor_parallel_size". Rows whose lengths the source does not state,
with no preset, or with no registry device are listed with the reason.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.format import format_table  # noqa: E402
from perfcounter.serve import deployment, serve, synthetic  # noqa: E402
from perfcounter.serve.options import keyword_names  # noqa: E402
from published_serving import DATA_FILE, load_rows  # noqa: E402

THROUGHPUT_GOAL, LATENCY_GOAL = (0.9, 1.1), (0.85, 1.2)  # a row on one GPU
MULTI_GPU_GOAL = (0.8, 1.25)  # a row on several GPUs, any metric
# the row's precision as deployment()'s keywords
PRECISION = {"bf16": {"precision": "bfloat16"}, "fp16": {"precision": "float16"},
             "fp8": {"precision": "bfloat16", "quantize": "fp8", "kv_dtype": "fp8"},
             "int8": {"precision": "bfloat16", "quantize": "int8"}}
# a closed loop's requests where the source states no count: 4 a slot in flight, at least 8
CONCURRENCY_REQUESTS = 8
MAX_REQUESTS = 3000  # a flood's or a Poisson row's requests at most (the module doc says why)
FLOOD = 1e9  # requests a second: every request at once
# A static engine (gptSessionBenchmark) allocates its batch's KV cache outright, with no share
# of the memory held back for a paged pool: its rows are served with all of the device's memory
STATIC_MEMORY = 1.0


def api_takes(name: str) -> bool:
    """Whether deployment() takes the keyword `name` (engine=, tensor_parallel_size=): a
    parameter of its own or one of its option groups' (serve/options.py)."""
    return name in inspect.signature(deployment).parameters or name in keyword_names()


def skip_reason(row) -> str:
    if row.preset is None:
        return "no perfcounter preset stands for the model"
    if row.device_spec is None:
        return f"{row.device}: not in the registry"
    if row.prompt_len is None or row.output_len is None:
        return "lengths not stated by the source"
    if row.precision not in PRECISION:
        return f"{row.precision}: no scheme of perfcounter's stands for it"
    if row.metric == "output_ktokens_per_s_per_node":
        return "a disaggregated deployment over nodes (not priced by serve)"
    if multi_gpu(row) and not api_takes("tensor_parallel_size"):
        return "needs tensor_parallel_size"
    return ""


def deployment_of(row):
    """The row's deployment: its preset, device and precision, the engine it ran on; a static
    batch runs `batch` sequences in the whole memory (STATIC_MEMORY)."""
    options = dict(PRECISION[row.precision])
    if row.workload == "static":
        options.update(max_num_seqs=row.batch, gpu_memory_utilization=STATIC_MEMORY)
    if api_takes("engine"):
        options["engine"] = row.engine_profile
    else:
        options["execution"] = "cudagraphs"
    if multi_gpu(row):
        options.update(tensor_parallel_size=row.tensor_parallel,
                       pipeline_parallel_size=row.pipeline_parallel,
                       enable_expert_parallel=row.expert_parallel)
    return deployment(row.preset, row.device_spec, **options)


def workload_of(row, max_requests: int | None):
    """The row's requests (see the module doc) and how many."""
    p, o = row.prompt_len, row.output_len
    if row.workload == "static":
        return synthetic(row.batch, p, o, qps=FLOOD, seed=0)
    if row.workload == "concurrency":
        n = row.num_requests or max(CONCURRENCY_REQUESTS, 4 * row.batch)
        return synthetic(n, p, o, concurrency=row.batch, seed=0)
    n = row.num_requests or 1000
    if max_requests is not None:
        n = min(n, max_requests)
    rate = FLOOD if row.workload == "flood" else row.request_rate
    return synthetic(n, p, o, qps=rate, seed=0)


def predicted_figure(row, m: dict) -> float:
    """The row's metric from serve's metrics (vLLM's field names)."""
    stat = row.statistic or "mean"
    if row.metric == "output_tokens_per_s":
        return m["output_throughput"]
    if row.metric == "output_tokens_per_s_per_gpu":
        return m["output_throughput"] / row.gpus
    if row.metric == "decode_tokens_per_s":
        return 1e3 / m["mean_tpot_ms"]
    return m[f"{stat}_{row.metric}"]  # ttft_ms, tpot_ms, itl_ms


def ratio_of(row, predicted: float) -> float:
    """measured ÷ predicted: of the throughput, or of the latency (a decode rate's inverse)."""
    if row.metric == "decode_tokens_per_s":
        return predicted / row.figure
    return row.figure / predicted


def multi_gpu(row) -> bool:
    return row.gpus > 1 or row.expert_parallel


def goal_of(row) -> tuple[float, float]:
    if multi_gpu(row):
        return MULTI_GPU_GOAL
    return THROUGHPUT_GOAL if row.is_throughput else LATENCY_GOAL


def price_row(row, max_requests: int | None = None) -> dict:
    """Serve the row as it ran: {predicted, ratio, goal, within, priced_as, preemptions, ...}."""
    dep = deployment_of(row)
    workload = workload_of(row, max_requests)
    m = serve(dep, workload).metrics
    predicted = predicted_figure(row, m)
    r = ratio_of(row, predicted)
    lo, hi = goal_of(row)
    return {"id": row.id, "predicted": predicted, "ratio": r, "goal": (lo, hi),
            "within": lo <= r <= hi, "priced_as": f"{dep.execution}", "requests": len(workload),
            "mean_batch": m.get("mean_batch_size"), "preemptions": m.get("preemptions", 0),
            "throughput": row.is_throughput, "gpus": row.gpus}


def summaries(results: list[dict]) -> list[tuple[str, list[dict]]]:
    """The priced rows by goal: one GPU's throughputs, one GPU's latencies, several GPUs."""
    one = [r for r in results if r["gpus"] == 1 and r["goal"] != MULTI_GPU_GOAL]
    return [("one GPU, throughput rows", [r for r in one if r["throughput"]]),
            ("one GPU, latency rows", [r for r in one if not r["throughput"]]),
            ("several GPUs, every row", [r for r in results if r["goal"] == MULTI_GPU_GOAL])]


def main(*, only: str | None = None, max_requests: int | None = MAX_REQUESTS, path=DATA_FILE,
         out=print) -> list[dict]:
    rows = [r for r in load_rows(path) if only is None or only in r.id]
    results, table, skipped = [], [], []
    engine = "engine= as the row ran" if api_takes("engine") else "cudagraphs (no engine=)"
    t0 = time.perf_counter()
    for row in rows:
        reason = skip_reason(row)
        if reason:
            skipped.append((row, reason))
            continue
        try:
            got = price_row(row, max_requests)
        except ValueError as e:  # serve refuses the deployment (ServeError, ParallelError)
            skipped.append((row, f"refused by serve: {e}"))
            continue
        results.append(got)
        lo, hi = got["goal"]
        table.append([row.id, str(row.gpus), f"{row.engine_profile}, {got['priced_as']}",
                      row.workload,
                      f"{got['requests']:,}", f"{row.figure:g} {row.unit}",
                      f"{got['predicted']:.4g} {row.unit}", f"{got['ratio']:.2f}",
                      f"{lo:g}-{hi:g}", "yes" if got["within"] else "no",
                      f"{got['mean_batch']:.0f}" if got["mean_batch"] is not None else "n/a",
                      f"{got['preemptions']:,}"])
    head = ["row", "GPUs", "engine, regime", "workload", "requests", "measured", "predicted",
            "meas/pred", "goal", "within", "mean batch", "preempted"]
    out(format_table(table, head, markdown=True))
    out("")
    for label, part in summaries(results):
        if part:
            ratios = sorted(r["ratio"] for r in part)
            lo, hi = part[0]["goal"]
            out(f"{label}: {sum(r['within'] for r in part)} of {len(part)} within {lo:g}-{hi:g} "
                f"(meas/pred {ratios[0]:.2f}-{ratios[-1]:.2f}, median "
                f"{ratios[len(ratios) // 2]:.2f})")
    out(f"priced: {len(results)} rows with {engine} in {time.perf_counter() - t0:.1f} s; "
        f"not priced: {len(skipped)}")
    for row, reason in skipped:
        out(f"not priced: {row.id}: {reason}")
    return results


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # a spec's missing float32 pJ/FLOP, said once per run
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None, help="rows whose id contains this text")
    p.add_argument("--max_requests", type=int, default=MAX_REQUESTS,
                   help=f"serve at most this many requests of a flood or a Poisson row "
                        f"(default {MAX_REQUESTS}; 0: every request the source ran)")
    a = p.parse_args()
    if a.max_requests < 0:
        p.error(f"--max_requests {a.max_requests}: expected an integer >= 0 (0: no cap)")
    main(only=a.only, max_requests=a.max_requests or None)
