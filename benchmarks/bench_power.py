"""Predicted serving power and J/token beside measured ones: `perfcounter serve` for
Llama-3.1-8B (bf16) on one H100 SXM at max_num_seqs 8, 32, 128 and 512, against the ML.ENERGY
Leaderboard v3.0's rows (vLLM 0.11.1, NVML power of the GPU over the run's steady state); with
--model, Llama-3.1-70B or Llama-3.3-70B (bf16, the llama-3.1-70b preset: the same shapes) on
4 x H100 SXM (tensor_parallel 4, as ML.ENERGY ran them) at every max_num_seqs of its ladder
(8 to 1,024; power and energy summed over the 4 GPUs, as the rows are).

    python benchmarks/bench_power.py [--requests_per_slot 8] [--without_engine_costs]
    python benchmarks/bench_power.py --model llama-3.1-70b [--requests_per_slot 2]
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
SOURCE_70B = ("ML.ENERGY Leaderboard v3.0, github.com/ml-energy/leaderboard @0cd52da "
              "public/data/models/meta-llama__Llama-{}-70B-Instruct__lm-arena-chat.json, "
              "H100, 4 GPUs, tensor_parallel 4")
# max_num_seqs: MEASURED's figures, then p99_itl_ms
LLAMA_31_70B = {
    8: (349.986, 1765.428, 3.758714, 469.689, 16.5727, 16.9089, 7.987, 21.116),
    16: (354.425, 1803.806, 2.091010, 862.648, 17.6974, 18.1066, 15.954, 32.136),
    32: (350.571, 1794.225, 1.206875, 1486.670, 20.0469, 20.6637, 31.876, 56.293),
    64: (351.958, 2001.502, 0.797249, 2510.511, 22.4323, 24.3642, 63.791, 90.536),
    96: (357.467, 2101.547, 0.647758, 3244.341, 25.3565, 28.3864, 95.725, 114.146),
    128: (358.930, 2183.755, 0.563366, 3876.267, 27.8678, 34.0043, 127.610, 121.335),
    192: (357.202, 2293.081, 0.514001, 4461.235, 33.7016, 56.6449, 191.621, 161.524),
    256: (349.049, 2354.298, 0.478993, 4915.104, 39.8373, 68.4514, 255.315, 240.360),
    384: (363.863, 2343.525, 0.440615, 5318.759, 55.1241, 92.4354, 383.023, 436.495),
    512: (350.137, 2492.927, 0.421010, 5921.301, 73.8856, 103.6547, 510.506, 299.110),
    768: (351.405, 2535.328, 0.389603, 6507.465, 103.6395, 135.2295, 766.324, 561.739),
    1024: (350.783, 2547.518, 0.373142, 6827.208, 105.6101, 151.6729, 898.453, 592.873)}
LLAMA_33_70B = {
    8: (408.845, 1787.386, 3.846927, 464.627, 16.8666, 17.0144, 7.976, 20.574),
    16: (409.775, 1838.808, 2.101644, 874.938, 17.5624, 17.8938, 15.970, 28.451),
    32: (412.931, 1895.648, 1.249071, 1517.646, 19.8642, 20.3630, 31.911, 51.304),
    64: (408.842, 2108.317, 0.822327, 2563.844, 22.3350, 23.9092, 63.857, 84.978),
    96: (420.329, 2223.797, 0.670763, 3315.324, 25.3797, 27.7174, 95.863, 100.151),
    128: (411.401, 2351.335, 0.603621, 3895.385, 27.7592, 32.0526, 127.713, 123.065),
    192: (406.407, 2461.338, 0.540016, 4557.896, 33.6064, 48.5825, 191.534, 171.243),
    256: (413.312, 2519.353, 0.491087, 5130.155, 39.0579, 59.9095, 255.452, 181.406),
    384: (408.289, 2510.607, 0.443746, 5657.753, 53.8473, 81.1642, 382.917, 268.887),
    512: (413.613, 2490.545, 0.425117, 5858.489, 73.5875, 104.2159, 510.800, 277.252),
    768: (413.419, 2546.050, 0.423094, 6017.691, 97.5441, 149.4576, 724.244, 570.324)}
# --model: (the preset that prices it, tensor_parallel, source, {max_num_seqs: figures}, p99)
LADDERS = {
    "llama-3.1-8b": ("llama-3.1-8b", 1, SOURCE, MEASURED, P99_ITL_MS),
    "llama-3.1-70b": ("llama-3.1-70b", 4, SOURCE_70B.format("3.1"),
                      {k: v[:7] for k, v in LLAMA_31_70B.items()},
                      {k: v[7] for k, v in LLAMA_31_70B.items()}),
    "llama-3.3-70b": ("llama-3.1-70b", 4, SOURCE_70B.format("3.3"),
                      {k: v[:7] for k, v in LLAMA_33_70B.items()},
                      {k: v[7] for k, v in LLAMA_33_70B.items()})}
PROMPT = "uniform:1-422"  # mean 211.5 tokens (the module doc's assumption)
GOAL = (0.85, 1.2)
# the harness's requests and scheduler (the module doc)
ENGINE = {"sampling": "temperature=0.8,top_p=0.95,repetition_penalty=1.1",
          "async_scheduling": True}


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def served(spec, seqs: int, output_len: float, per_slot: int, engine: dict = ENGINE,
           preset: str = "llama-3.1-8b", tp: int = 1) -> dict:
    dep = deployment(preset, spec, max_num_seqs=seqs, max_num_batched_tokens=8192,
                     tensor_parallel_size=tp, **engine)
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


def main(*, requests_per_slot: int = 8, engine_costs: bool = True, out=print,
         model: str = "llama-3.1-8b") -> list[dict]:
    warnings.simplefilter("ignore")
    preset, tp, source, measured, p99s = LADDERS[model]
    h100 = get_device_spec("h100-sxm")
    dynamic = dataclasses.replace(h100, idle_w=None)  # the pJ energies alone
    engine = ENGINE if engine_costs else {}
    out(f"{model} bf16 on {tp} x {h100.name} (preset {preset}, TP {tp}): idle_W "
        f"{h100.idle_w:g}, tdp_W {h100.tdp_w:g} a GPU; prompt {PROMPT}; engine "
        f"{engine or 'without its sampler or host costs'}; {load()}")
    out(f"measured: {source}")
    rows, table = [], []
    for seqs, (length, watts, jpt, tps, itl, p90, _) in measured.items():
        t0 = time.perf_counter()
        m = served(h100, seqs, length, requests_per_slot, engine, preset, tp)
        d = served(dynamic, seqs, length, requests_per_slot, engine, preset, tp)
        took = time.perf_counter() - t0
        r = {"max_num_seqs": seqs, "tok_s": m["output_throughput"], "measured_tok_s": tps,
             "power_w": m["mean_power_w"], "measured_w": watts,
             "j_per_token": m["j_per_output_token"], "measured_j": jpt,
             "dynamic_w": d["mean_power_w"], "dynamic_j": d["j_per_output_token"],
             "idle_share": (m["energy_j"] - d["energy_j"]) / m["energy_j"], "seconds": took,
             "itl_ratio": itl / m["median_itl_ms"], "p90_ratio": p90 / m["p90_itl_ms"],
             "p99_ratio": p99s[seqs] / m["p99_itl_ms"]}
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
    within = {name: sum(lo <= f(r) <= hi for r in rows) for name, f, (lo, hi) in (
        ("power", lambda r: r["measured_w"] / r["power_w"], GOAL),
        ("throughput", lambda r: r["measured_tok_s"] / r["tok_s"], (0.8, 1.25) if tp > 1
         else (0.9, 1.1)),
        ("median ITL", lambda r: r["itl_ratio"], (0.8, 1.25) if tp > 1 else GOAL),
        ("p90 ITL", lambda r: r["p90_ratio"], (0.75, 1.33)))}
    out(f"\nwithin issue 44's goals ({'several GPUs' if tp > 1 else 'one GPU'}): "
        + ", ".join(f"{k} {v} of {len(rows)}" for k, v in within.items())
        + f"; ratios are measured / predicted; {load()}")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests_per_slot", type=int, default=8,
                    help="requests per max_num_seqs slot (at least 256 in all)")
    ap.add_argument("--without_engine_costs", action="store_true",
                    help="no sampler kernels nor async scheduling (as priced before)")
    ap.add_argument("--model", default="llama-3.1-8b", choices=tuple(LADDERS),
                    help="the ladder served (default: llama-3.1-8b on one H100)")
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
        main(requests_per_slot=a.requests_per_slot, engine_costs=not a.without_engine_costs,
             model=a.model)
