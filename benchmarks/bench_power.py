"""Predicted serving power and J/token beside measured ones: `perfcounter serve` for
Llama-3.1-8B (bf16) on one H100 SXM at max_num_seqs 8, 32, 128 and 512, against the ML.ENERGY
Leaderboard v3.0's rows (vLLM 0.11.1, NVML power of the GPU over the run's steady state).

    python benchmarks/bench_power.py [--requests_per_slot 8] [--without_engine_costs]
    python benchmarks/bench_power.py --breakdown      # a decode step's parts at each rung

Served as ML.ENERGY ran it (github.com/ml-energy/benchmark, mlenergy/llm): every request
sent at once (request rate inf), vLLM holding max_num_seqs of them (a closed loop of
max_num_seqs in flight: serve's concurrency), max_num_batched_tokens 8192, the engine's
CUDA graphs (vLLM's default), async scheduling (the harness's configs/vllm/lm-arena-chat/
meta-llama/Llama-3.1-8B-Instruct/H100/monolithic.config.yaml: async-scheduling: true) and its
requests' sampling parameters (mlenergy/benchmark/llm/benchmark.py at ml-energy/benchmark@c1d6557:
top_p 0.95 and temperature 0.8 by default, repetition_penalty 1.1 in every chat request's body),
whose sampler kernels serve/sampler.py prices (--without_engine_costs: neither, as priced before
issue 44's item 2). Nothing is fitted to a row: the rows are the referee. Lengths:

- output: each row's measured avg_output_len L (the model's own answers, up to 4,096 tokens),
  drawn uniform:1-(2L-1) (mean L) so that requests end at different steps, as a chat's do;
- prompt: not published. The harness (mlenergy/llm/datasets.py, LMArenaHumanPreferenceDataset)
  makes one request a turn of lmarena-ai/arena-human-preference-100k, turn t's prompt being
  the conversation's first 2t - 1 messages. No token statistics are published for that set;
  assumed: those of LMSYS-Chat-1M, the same arena's conversations (Zheng et al. 2023,
  arXiv:2309.11998, Table 1: 69.5 tokens a prompt, 214.5 a response, 2.0 turns a
  conversation): a 2-turn conversation gives prompts of 69.5 and 69.5 + 214.5 + 69.5 = 353.5
  tokens, mean 211.5: uniform:1-422;
- requests: --requests_per_slot x max_num_seqs, at least 256 (the harness asks for at least
  2 x max_num_seqs; ML.ENERGY averages the steady state, this run its whole duration, ramp
  and tail included).

Each row is served twice: with the power model (pricing/power.py: idle_W 121.7 W + the
steps' dynamic joules over their seconds, capped at 700 W) and with the dynamic model alone
(idle_W left out: the pJ/FLOP and pJ/bit energies only, what perfcounter priced before).
Ratios are measured / predicted (goal 0.85-1.2; p90 ITL 0.75-1.33; p99 printed, no goal).
The machine's load is printed beside. --breakdown prices one decode step of each rung's mean
batch at its mean context (prompt + half the output) by part: matmuls (the weights' stream),
attention (the KV cache's), the fused rest, the graph's launch, the sampler's kernels and the
host's time, beside the measured median ITL and the step the measured throughput implies
(batch / tok/s).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.devices import get_device_spec  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.serve import deployment, serve, synthetic  # noqa: E402

SOURCE = ("ML.ENERGY Leaderboard v3.0, github.com/ml-energy/leaderboard @0cd52da "
          "public/data/models/meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json, H100, 1 GPU")
# max_num_seqs: (avg_output_len, avg_power_watts, energy_per_token_joules, output tok/s,
#                median_itl_ms, p90_itl_ms, avg_batch_size)
MEASURED = {8: (388.677734375, 486.4380535594687, 0.4547982611462042, 1069.5688508868182,
                7.316111586987972, 7.704039663076401, 7.978201634877384),
            32: (390.3291015625, 559.7134507541415, 0.16505510741316592, 3391.070167571773,
                 8.906599134206772, 10.384867712855337, 31.911504424778762),
            128: (404.58984375, 669.2439022030471, 0.09510991243206074, 7036.531577937304,
                  16.482017002999783, 20.042716525495052, 127.62),
            512: (396.67138671875, 688.2983232359837, 0.07019449941326047, 9805.587745326337,
                  47.40760399727151, 59.06887900782748, 510.8688524590164)}
P99_ITL_MS = {8: 10.866769570857286, 32: 18.416078612208267, 128: 46.433303505182266,
              512: 106.78900223167149}  # the same rows' p99_itl_ms
PROMPT = "uniform:1-422"  # mean 211.5 tokens (the module doc's assumption)
GOAL = (0.85, 1.2)
# the harness's requests and scheduler (the module doc)
ENGINE = {"sampling": "temperature=0.8,top_p=0.95,repetition_penalty=1.1",
          "async_scheduling": True}


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def served(spec, seqs: int, output_len: float, per_slot: int, engine: dict = ENGINE) -> dict:
    dep = deployment("llama-3.1-8b", spec, max_num_seqs=seqs, max_num_batched_tokens=8192,
                     **engine)
    top = 2 * round(output_len) - 1
    w = synthetic(max(256, per_slot * seqs), PROMPT, f"uniform:1-{top}", concurrency=seqs,
                  seed=0)
    return serve(dep, w).metrics


def breakdown(spec, out=print) -> None:
    """One decode step of each rung's measured mean batch at the mean context by part (ms)."""
    from perfcounter.pricing.price import price
    from perfcounter.serve.steps import features
    rows = []
    for seqs, (length, *_, tps, itl, _, batch) in MEASURED.items():
        dep = deployment("llama-3.1-8b", spec, max_num_seqs=seqs, max_num_batched_tokens=8192,
                         **ENGINE)
        b, ctx = round(batch), round(211.5 + length / 2)
        fig = dep.table.figures(features([(1, ctx)] * b))
        parts = price(fig, spec, dep.execution).by_class
        matmul = sum(v for k, v in parts.items() if k in ("gemv", "gemm"))
        sampler = dep.engine.sampler(b)
        host = dep.engine.step_overhead_s + dep.engine.seq_overhead_s * b
        step = dep.table.seconds(features([(1, ctx)] * b)) + sampler
        ms = {k: f"{parts.get(k, 0) * 1e3:.2f}" for k in ("attention", "fused", "collective")}
        rows.append([seqs, b, ctx, f"{matmul * 1e3:.2f}", ms["attention"], ms["fused"],
                     f"{parts.get('graph launch', 0) * 1e3:.3f}", ms["collective"],
                     f"{sampler * 1e3:.2f}",
                     f"{host * 1e3:.2f}", f"{step * 1e3:.2f}", f"{itl:.2f}",
                     f"{batch / tps * 1e3:.2f}", f"{itl / (step * 1e3):.2f}"])
    out(format_table(rows, ["seqs", "batch", "context", "matmuls", "attention", "fused",
                            "launch", "collectives", "sampler", "host", "decode step",
                            "median ITL meas", "batch / tok/s meas", "ITL meas / step"],
                     markdown=True))
    out(f"ms; a decode step of the measured mean batch at context 211.5 + output / 2; {load()}")


def main(*, requests_per_slot: int = 8, engine_costs: bool = True, out=print) -> list[dict]:
    warnings.simplefilter("ignore")
    h100 = get_device_spec("h100-sxm")
    dynamic = dataclasses.replace(h100, idle_w=None)  # the pJ energies alone
    engine = ENGINE if engine_costs else {}
    out(f"Llama-3.1-8B bf16 on {h100.name}: idle_W {h100.idle_w:g}, tdp_W {h100.tdp_w:g}; "
        f"prompt {PROMPT}; engine {engine or 'without its sampler or host costs'}; {load()}")
    out(f"measured: {SOURCE}")
    rows, table = [], []
    for seqs, (length, watts, jpt, tps, itl, p90, _) in MEASURED.items():
        t0 = time.perf_counter()
        m = served(h100, seqs, length, requests_per_slot, engine)
        d = served(dynamic, seqs, length, requests_per_slot, engine)
        took = time.perf_counter() - t0
        r = {"max_num_seqs": seqs, "tok_s": m["output_throughput"], "measured_tok_s": tps,
             "power_w": m["mean_power_w"], "measured_w": watts,
             "j_per_token": m["j_per_output_token"], "measured_j": jpt,
             "dynamic_w": d["mean_power_w"], "dynamic_j": d["j_per_output_token"],
             "idle_share": (m["energy_j"] - d["energy_j"]) / m["energy_j"], "seconds": took,
             "itl_ratio": itl / m["median_itl_ms"], "p90_ratio": p90 / m["p90_itl_ms"],
             "p99_ratio": P99_ITL_MS[seqs] / m["p99_itl_ms"]}
        rows.append(r)
        table.append([seqs, f"{tps:,.0f} / {r['tok_s']:,.0f}", f"{tps / r['tok_s']:.2f}",
                      f"{itl:.1f} / {m['median_itl_ms']:.1f}", f"{r['itl_ratio']:.2f}",
                      f"{p90:.1f} / {m['p90_itl_ms']:.1f}", f"{r['p90_ratio']:.2f}",
                      f"{r['p99_ratio']:.2f}",
                      f"{watts:.0f}", f"{r['power_w']:.0f}", f"{watts / r['power_w']:.2f}",
                      f"{jpt:.4f}", f"{r['j_per_token']:.4f}",
                      f"{jpt / r['j_per_token']:.2f}",
                      f"{r['dynamic_w']:.0f}", f"{jpt / r['dynamic_j']:.2f}",
                      f"{r['idle_share']:.0%}", f"{took:.1f}"])
    out(format_table(table, ["seqs", "tok/s meas / pred", "ratio", "median ITL ms meas / pred",
                             "ratio", "p90 ITL ms meas / pred", "ratio", "p99 ITL ratio",
                             "W meas", "W pred",
                             "W ratio", "J/tok meas", "J/tok pred", "J/tok ratio",
                             "W dynamic only", "J/tok ratio dynamic only", "static share", "s"],
                     markdown=True))
    within = sum(GOAL[0] <= r["measured_w"] / r["power_w"] <= GOAL[1] for r in rows)
    out(f"\npower within {GOAL[0]}-{GOAL[1]}: {within} of {len(rows)} rows; "
        f"ratios are measured / predicted; {load()}")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests_per_slot", type=int, default=8,
                    help="requests per max_num_seqs slot (at least 256 in all)")
    ap.add_argument("--without_engine_costs", action="store_true",
                    help="no sampler kernels nor async scheduling (as priced before)")
    ap.add_argument("--breakdown", action="store_true",
                    help="a decode step's parts at each rung instead of the runs")
    a = ap.parse_args()
    if a.requests_per_slot < 2:
        ap.error(f"--requests_per_slot {a.requests_per_slot}: expected >= 2 (the harness sends "
                 "at least 2 x max_num_seqs requests)")
    if a.breakdown:
        warnings.simplefilter("ignore")
        breakdown(get_device_spec("h100-sxm"))
    else:
        main(requests_per_slot=a.requests_per_slot, engine_costs=not a.without_engine_costs)
