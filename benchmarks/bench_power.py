"""Predicted serving power and J/token beside measured ones: `perfcounter serve` for
Llama-3.1-8B (bf16) on one H100 SXM at max_num_seqs 8, 32, 128 and 512, against the ML.ENERGY
Leaderboard v3.0's rows (vLLM 0.11.1, NVML power of the GPU over the run's steady state).

    python benchmarks/bench_power.py [--requests_per_slot 8]

Served as ML.ENERGY ran it (github.com/ml-energy/benchmark, mlenergy/llm): every request
sent at once (request rate inf), vLLM holding max_num_seqs of them (a closed loop of
max_num_seqs in flight: serve's concurrency), max_num_batched_tokens 8192, the engine's
CUDA graphs (vLLM's default). Nothing is fitted to a row: the rows are the referee. Lengths:

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
Ratios are measured / predicted (goal 0.85-1.2). The machine's load is printed beside.
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
# max_num_seqs: (avg_output_len, avg_power_watts, energy_per_token_joules, output tok/s)
MEASURED = {8: (388.677734375, 486.4380535594687, 0.4547982611462042, 1069.5688508868182),
            32: (390.3291015625, 559.7134507541415, 0.16505510741316592, 3391.070167571773),
            128: (404.58984375, 669.2439022030471, 0.09510991243206074, 7036.531577937304),
            512: (396.67138671875, 688.2983232359837, 0.07019449941326047, 9805.587745326337)}
PROMPT = "uniform:1-422"  # mean 211.5 tokens (the module doc's assumption)
GOAL = (0.85, 1.2)


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def served(spec, seqs: int, output_len: float, per_slot: int) -> dict:
    dep = deployment("llama-3.1-8b", spec, max_num_seqs=seqs, max_num_batched_tokens=8192)
    top = 2 * round(output_len) - 1
    w = synthetic(max(256, per_slot * seqs), PROMPT, f"uniform:1-{top}", concurrency=seqs,
                  seed=0)
    return serve(dep, w).metrics


def main(*, requests_per_slot: int = 8, out=print) -> list[dict]:
    warnings.simplefilter("ignore")
    h100 = get_device_spec("h100-sxm")
    dynamic = dataclasses.replace(h100, idle_w=None)  # the pJ energies alone
    out(f"Llama-3.1-8B bf16 on {h100.name}: idle_W {h100.idle_w:g}, tdp_W {h100.tdp_w:g}; "
        f"prompt {PROMPT}; {load()}")
    out(f"measured: {SOURCE}")
    rows, table = [], []
    for seqs, (length, watts, jpt, tps) in MEASURED.items():
        t0 = time.perf_counter()
        m = served(h100, seqs, length, requests_per_slot)
        d = served(dynamic, seqs, length, requests_per_slot)
        took = time.perf_counter() - t0
        r = {"max_num_seqs": seqs, "tok_s": m["output_throughput"], "measured_tok_s": tps,
             "power_w": m["mean_power_w"], "measured_w": watts,
             "j_per_token": m["j_per_output_token"], "measured_j": jpt,
             "dynamic_w": d["mean_power_w"], "dynamic_j": d["j_per_output_token"],
             "idle_share": (m["energy_j"] - d["energy_j"]) / m["energy_j"], "seconds": took}
        rows.append(r)
        table.append([seqs, f"{tps:,.0f} / {r['tok_s']:,.0f}", f"{watts:.0f}",
                      f"{r['power_w']:.0f}", f"{watts / r['power_w']:.2f}",
                      f"{jpt:.4f}", f"{r['j_per_token']:.4f}",
                      f"{jpt / r['j_per_token']:.2f}",
                      f"{r['dynamic_w']:.0f}", f"{jpt / r['dynamic_j']:.2f}",
                      f"{r['idle_share']:.0%}", f"{took:.1f}"])
    out(format_table(table, ["seqs", "tok/s meas / pred", "W meas", "W pred", "W ratio",
                             "J/tok meas", "J/tok pred", "J/tok ratio", "W dynamic only",
                             "J/tok ratio dynamic only", "static share", "s"],
                     markdown=True))
    within = sum(GOAL[0] <= r["measured_w"] / r["power_w"] <= GOAL[1] for r in rows)
    out(f"\npower within {GOAL[0]}-{GOAL[1]}: {within} of {len(rows)} rows; "
        f"ratios are measured / predicted; {load()}")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests_per_slot", type=int, default=8,
                    help="requests per max_num_seqs slot (at least 256 in all)")
    a = ap.parse_args()
    if a.requests_per_slot < 2:
        ap.error(f"--requests_per_slot {a.requests_per_slot}: expected >= 2 (the harness sends "
                 "at least 2 x max_num_seqs requests)")
    main(requests_per_slot=a.requests_per_slot)
