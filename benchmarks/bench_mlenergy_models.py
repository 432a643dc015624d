"""The ML.ENERGY Leaderboard v3.0's H100 rows of the 2025 architectures beside `perfcounter
serve` on transformers' modeling code (serve/hf_model.py): Qwen3-8B/32B, Qwen3-30B-A3B and
235B-A22B (bf16, FP8 blocks), gpt-oss-20b/120b (MXFP4 experts as shipped), Gemma 3 27B (sliding
windows), Llama 4 Scout (chunked attention, experts) and DeepSeek-V3 (MLA, FP8, on B200).

    python benchmarks/bench_mlenergy_models.py [--only gpt-oss] [--requests_per_slot 2]

Rows: github.com/ml-energy/leaderboard @0cd52da public/data/models/<model>__<task>.json (vLLM
0.11.1, NVML power over the steady state), as handed to us in
../shared/reference/ml-energy-v3/rows.yaml, copied below (ROWS). The rows the project holds back
(the other rungs of the ladder) are not here. Rows run with expert parallelism (Qwen3-30B-A3B
on 2 GPUs, Qwen3-235B, Llama 4 Scout; DeepSeek-V3.1 on B200), reported tensor_parallel 1 x
expert_parallel N, ran as vLLM's tensor parallelism over the N GPUs with the experts spread
over them (vLLM's EP over the TP ranks): the harness passes --tensor-parallel-size N unless
the model's config names data-parallel-size (ml-energy/benchmark @c1d6557,
mlenergy/benchmark/llm/benchmark.py, "If the config file mentioned DP, we're doing that;
otherwise TP"), and these models' configs (configs/vllm/<task>/<model>/H100/
monolithic.config.yaml) name enable-expert-parallel and no data-parallel-size. They are
served so: tensor_parallel_size N with enable_expert_parallel, one engine of max_num_seqs.

Served as bench_power.py serves the Llama rows (the harness, github.com/ml-energy/benchmark:
every request at once, vLLM holding max_num_seqs of them: a closed loop of max_num_seqs in
flight; max_num_batched_tokens 8192; CUDA graphs; async scheduling and the requests' sampling
parameters, top_p 0.95, temperature 0.8 and repetition_penalty 1.1, whose sampler kernels
serve/sampler.py prices, as bench_power.py's module doc sources them for every model's config
of the harness; --without_engine_costs: neither): outputs uniform:1-(2L-1) for the row's
measured mean L; prompts not published, assumed: lm-arena-chat as bench_power.py assumes
(LMSYS-Chat-1M's 69.5-token prompts and 214.5-token answers over 2 turns: uniform:1-422);
gpqa (a multiple-choice question with its four answers and the harness's instruction; no
token statistics published) uniform:1-600, mean 300 tokens: an assumption, not a source.
Nothing is fitted to a row. Ratios are measured / predicted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_power import ENGINE  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.serve import deployment, serve, synthetic  # noqa: E402

PROMPTS = {"lm-arena-chat": "uniform:1-422", "gpqa": "uniform:1-600"}
# (preset, task, GPUs, TP, EP, max_num_seqs, avg output, output tok/s, median ITL ms,
#  average W over the GPUs, J per output token), as the leaderboard's files give them
ROWS = [
    ("qwen3-8b", "lm-arena-chat", 1, 1, 1, 8, 646.6, 961.7, 8.20, 427.0, 0.4440),
    ("qwen3-8b", "lm-arena-chat", 1, 1, 1, 32, 646.8, 2927.9, 10.57, 478.1, 0.1633),
    ("qwen3-8b", "lm-arena-chat", 1, 1, 1, 128, 641.4, 5930.3, 20.70, 573.0, 0.0966),
    ("qwen3-8b", "lm-arena-chat", 1, 1, 1, 512, 645.1, 8534.6, 47.16, 615.6, 0.0721),
    ("qwen3-32b", "lm-arena-chat", 1, 1, 1, 8, 637.7, 312.0, 25.21, 538.4, 1.7257),
    ("qwen3-32b", "lm-arena-chat", 1, 1, 1, 32, 629.3, 960.5, 28.81, 599.4, 0.6240),
    ("qwen3-32b", "lm-arena-chat", 2, 2, 1, 8, 631.0, 522.5, 15.06, 850.1, 1.6271),
    ("qwen3-32b", "lm-arena-chat", 2, 2, 1, 32, 641.7, 1706.1, 17.91, 944.5, 0.5536),
    ("qwen3-32b", "lm-arena-chat", 2, 2, 1, 128, 624.1, 3905.3, 29.66, 1073.7, 0.2749),
    ("qwen3-30b-a3b", "lm-arena-chat", 1, 1, 1, 8, 927.4, 611.3, 12.85, 399.3, 0.6531),
    ("qwen3-30b-a3b", "lm-arena-chat", 1, 1, 1, 32, 921.7, 1393.8, 22.57, 467.9, 0.3357),
    ("qwen3-30b-a3b", "lm-arena-chat", 2, 1, 2, 8, 900.9, 830.8, 9.36, 683.7, 0.8230),
    ("gpt-oss-20b", "gpqa", 1, 1, 1, 8, 2142.4, 1225.4, 6.65, 436.8, 0.3565),
    ("gpt-oss-20b", "gpqa", 1, 1, 1, 32, 2183.4, 3397.6, 9.24, 530.8, 0.1562),
    ("gpt-oss-20b", "gpqa", 1, 1, 1, 128, 2427.8, 7293.8, 17.09, 571.5, 0.0784),
    ("gpt-oss-20b", "gpqa", 1, 1, 1, 512, 2235.4, 11923.4, 36.23, 579.2, 0.0486),
    ("gpt-oss-120b", "gpqa", 1, 1, 1, 8, 1780.7, 803.9, 9.86, 550.0, 0.6841),
    ("gpt-oss-120b", "gpqa", 1, 1, 1, 32, 1757.9, 1744.9, 17.96, 655.9, 0.3759),
    ("gpt-oss-120b", "gpqa", 2, 2, 1, 8, 1760.2, 1105.2, 7.18, 864.2, 0.7819),
    ("gpt-oss-120b", "gpqa", 2, 2, 1, 32, 1773.5, 2606.6, 12.08, 1086.5, 0.4168),
    ("gpt-oss-120b", "gpqa", 2, 2, 1, 128, 1756.5, 5427.6, 22.50, 1208.4, 0.2226),
    ("gpt-oss-120b", "gpqa", 2, 2, 1, 512, 1747.7, 10143.1, 48.84, 1163.9, 0.1147),
    ("gemma-3-27b", "lm-arena-chat", 1, 1, 1, 8, 719.1, 337.8, 23.43, 510.4, 1.5108),
    ("gemma-3-27b", "lm-arena-chat", 1, 1, 1, 32, 714.3, 1088.2, 28.28, 571.4, 0.5251),
    ("gemma-3-27b", "lm-arena-chat", 2, 2, 1, 8, 711.2, 525.0, 15.07, 813.0, 1.5487),
    ("gemma-3-27b", "lm-arena-chat", 2, 2, 1, 32, 709.9, 1686.9, 18.40, 935.2, 0.5544),
    ("gemma-3-27b", "lm-arena-chat", 2, 2, 1, 128, 705.3, 3714.0, 32.00, 1137.1, 0.3062),
    # expert parallelism: reported tensor_parallel 1 x expert_parallel N on N GPUs, run as
    # vLLM's TP N with EP over the TP ranks (the module doc), max_num_seqs in flight in all
    # (Little's law on the rows: 388 tok/s x 20.2 ms = 7.8 in flight at max_num_seqs 8)
    ("qwen3-30b-a3b", "lm-arena-chat", 2, 1, 2, 32, 926.6, 2026.0, 15.39, 833.1, 0.4112),
    ("qwen3-30b-a3b", "lm-arena-chat", 2, 1, 2, 128, 918.6, 4546.2, 27.42, 899.7, 0.1979),
    ("qwen3-30b-a3b", "lm-arena-chat", 2, 1, 2, 512, 927.0, 9650.0, 47.39, 953.2, 0.0988),
    ("qwen3-235b-a22b", "lm-arena-chat", 8, 1, 8, 8, 864.4, 387.9, 20.24, 2828.5, 7.2926),
    ("qwen3-235b-a22b", "lm-arena-chat", 8, 1, 8, 32, 864.9, 907.6, 34.71, 3472.2, 3.8255),
    ("qwen3-235b-a22b", "lm-arena-chat", 8, 1, 8, 128, 863.0, 2626.4, 46.64, 3903.5, 1.4862),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 4, 1, 4, 8, 855.3, 223.8, 35.24, 2120.1, 9.4714),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 4, 1, 4, 32, 889.3, 731.6, 42.75, 2201.6, 3.0094),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 4, 1, 4, 128, 862.5, 2294.9, 53.13, 2526.3, 1.1008),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 8, 1, 8, 8, 876.7, 315.8, 24.74, 3596.4, 11.3896),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 8, 1, 8, 32, 872.3, 1016.9, 30.16, 3705.9, 3.6444),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 8, 1, 8, 128, 878.6, 2840.0, 42.14, 3874.1, 1.3641),
    ("qwen3-235b-a22b-fp8", "lm-arena-chat", 8, 1, 8, 512, 881.4, 5342.0, 75.84, 3960.9, 0.7415),
    ("llama-4-scout", "lm-arena-chat", 4, 1, 4, 8, 396.1, 322.0, 24.15, 1280.6, 3.9773),
    ("llama-4-scout", "lm-arena-chat", 4, 1, 4, 32, 401.2, 928.8, 32.99, 1606.0, 1.7291),
    ("llama-4-scout", "lm-arena-chat", 4, 1, 4, 128, 402.7, 2805.6, 42.13, 1834.8, 0.6540),
    ("llama-4-scout", "lm-arena-chat", 4, 1, 4, 512, 402.3, 5596.0, 69.11, 1881.4, 0.3362),
    ("llama-4-scout", "lm-arena-chat", 8, 1, 8, 8, 405.7, 379.2, 20.29, 1999.7, 5.2734),
    ("llama-4-scout", "lm-arena-chat", 8, 1, 8, 32, 409.0, 1243.0, 23.91, 2559.4, 2.0590),
    ("llama-4-scout", "lm-arena-chat", 8, 1, 8, 128, 397.3, 3702.7, 30.29, 2991.3, 0.8079),
    ("llama-4-scout", "lm-arena-chat", 8, 1, 8, 512, 403.3, 6852.8, 55.77, 3098.3, 0.4521),
    # DeepSeek-V3.1 (DeepSeek-V3's shapes and FP8 checkpoint) on B200, the only GPU it ran on
    ("deepseek-v3", "lm-arena-chat", 8, 1, 8, 8, 846.4, 449.9, 16.84, 3853.8, 8.5655),
    ("deepseek-v3", "lm-arena-chat", 8, 1, 8, 32, 850.5, 1091.4, 26.72, 4790.5, 4.3894),
    ("deepseek-v3", "lm-arena-chat", 8, 1, 8, 128, 849.8, 2906.8, 38.84, 5628.6, 1.9364),
    ("deepseek-v3", "lm-arena-chat", 8, 1, 8, 512, 849.2, 5587.9, 64.14, 5383.8, 0.9635),
]
DEVICE = {"deepseek-v3": "b200"}  # else h100-sxm
GOALS = {"throughput": (0.8, 1.25), "itl": (0.8, 1.25)}  # issue 45's goal for these rows


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def served(row, per_slot: int, engine: dict = ENGINE) -> dict:
    preset, task, gpus, tp, ep, seqs, length = row[:7]
    parallel = dict(tensor_parallel_size=tp * ep, enable_expert_parallel=ep > 1)
    dep = deployment(preset, DEVICE.get(preset, "h100-sxm"), max_num_seqs=seqs,
                     max_num_batched_tokens=8192, **parallel, **engine)
    top = 2 * round(length) - 1
    w = synthetic(max(64, per_slot * seqs), PROMPTS[task], f"uniform:1-{top}",
                  concurrency=seqs, seed=0)
    return serve(dep, w).metrics


def main(*, only: str | None = None, requests_per_slot: int = 2, engine_costs: bool = True,
         out=print) -> list:
    warnings.simplefilter("ignore")
    engine = ENGINE if engine_costs else {}
    out(f"ML.ENERGY v3.0 H100 rows against perfcounter serve (h100-sxm, vLLM profile, "
        f"{engine or 'without its sampler or host costs'}); {load()}")
    table, results = [], []
    for row in ROWS:
        preset, task, gpus, tp, ep, seqs, _, tps, itl, watts, jpt = row
        if only and only not in preset:
            continue
        label = [preset, task, f"{gpus} (TP {tp * ep}{' + EP' if ep > 1 else ''})", seqs]
        t0 = time.perf_counter()
        m = served(row, requests_per_slot, engine)
        took = time.perf_counter() - t0
        r = {"preset": preset, "seqs": seqs, "gpus": gpus,
             "throughput": tps / m["output_throughput"], "itl": itl / m["median_itl_ms"],
             "power": watts / m["mean_power_w"] if m.get("mean_power_w") else None,
             "j": jpt / m["j_per_output_token"] if m.get("j_per_output_token") else None}
        results.append(r)
        table.append(label + [f"{tps:,.0f} / {m['output_throughput']:,.0f}",
                              f"{r['throughput']:.2f}",
                              f"{itl:.1f} / {m['median_itl_ms']:.1f}", f"{r['itl']:.2f}",
                              f"{watts:.0f} / {m.get('mean_power_w') or 0:.0f}",
                              f"{r['power']:.2f}" if r["power"] else "n/a",
                              f"{r['j']:.2f}" if r["j"] else "n/a", f"{took:.0f}"])
    out(format_table(table, ["preset", "task", "GPUs", "seqs", "tok/s meas / pred", "ratio",
                             "median ITL ms meas / pred", "ratio", "W meas / pred", "ratio",
                             "J/tok ratio", "s"], markdown=True))
    for what, (lo, hi) in GOALS.items():
        within = sum(lo <= r[what] <= hi for r in results)
        out(f"{what} within {lo}-{hi}: {within} of {len(results)} priced rows")
    out(f"ratios are measured / predicted; {load()}")
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="rows whose preset contains this")
    ap.add_argument("--requests_per_slot", type=int, default=2,
                    help="requests per max_num_seqs slot (at least 64 in all)")
    ap.add_argument("--without_engine_costs", action="store_true",
                    help="no sampler kernels nor async scheduling (as priced before)")
    a = ap.parse_args()
    if a.requests_per_slot < 1:
        ap.error(f"--requests_per_slot {a.requests_per_slot}: expected >= 1")
    main(only=a.only, requests_per_slot=a.requests_per_slot,
         engine_costs=not a.without_engine_costs)
