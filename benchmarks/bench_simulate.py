"""How fast does a recorded trace re-price under a new mapping? And the figures the README's
simulation section quotes: agreement with UPMEM where it is right, and where it is not.

Counts Llama-2-7B once (transformers' LlamaForCausalLM from its config, no weights,
bf16, a --prompt_length prefill and --max_new_tokens - 1 decode steps), then:
1. re-prices it under mappings it has not seen (UPMEM's mixed mapping, everything on
   PIM-AI-4chip, everything on a phone SoC, the projections on PIM and the rest on the
   phone), --repeats times each, and prints the median seconds of a re-pricing: cold (the
   first time a device prices the trace) and warm (every later mapping), with the
   per-module log (detail) and without (what a search uses);
2. prints decode on one device against the weight-streaming bound (time >= weight bytes /
   bandwidth; energy >= weight bits x pJ/bit + 2 FLOPs per weight x pJ/FLOP);
3. prints the Linear FLOPs of one decode token as perfcounter counts them and as UPMEM's
   formula (2 * numel(input) * in_features) gives them.

    python benchmarks/bench_simulate.py [--repeats 5] [--prompt_length 64] [--max_new_tokens 16]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from perfcounter import TransformerPerformanceCounter, simulate
from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.format import format_table
from perfcounter.generation.config_only import count_hf_config, hf_config
from perfcounter.simulation.timeline import PREPARED
from perfcounter.trace import ROLES

UPMEM_MIXED = {"LlamaRMSNorm": "PIM-AI-1chip,t", "q_proj": "PIM-AI-4chip,t",
               "k_proj": "PIM-AI-4chip", "v_proj": "PIM-AI-4chip", "o_proj": "PIM-AI-4chip,t",
               "gate_proj": "PIM-AI-4chip,t", "up_proj": "PIM-AI-4chip,t",
               "down_proj": "PIM-AI-4chip,t", "norm": "PIM-AI-1chip,t",
               "lm_head": "PIM-AI-4chip,t"}
MAPPINGS = {
    "UPMEM mixed": UPMEM_MIXED,
    "all on PIM-AI-4chip": {"LlamaForCausalLM": "PIM-AI-4chip"},
    "all on Snapdragon8gen3": {"LlamaForCausalLM": "Snapdragon8gen3"},
    "projections on PIM": {"LlamaForCausalLM": "Snapdragon8gen3", "Linear": "PIM-AI-4chip"},
}
ONE_DEVICE = {"PIM-AI-4chip": "pim-ai-4chip", "Snapdragon8gen3": "upmem-snapdragon8gen3",
              "H100": "upmem-h100"}


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def repricing(counter, repeats: int) -> None:
    print("\n1. re-pricing the recorded trace (seconds per mapping, median of "
          f"{repeats}; cold = the first mapping that puts the trace on its devices)")
    rows = []
    for name, mapping in MAPPINGS.items():
        PREPARED.cache_clear()
        t0 = time.perf_counter()
        simulate(counter, mapping)
        cold = time.perf_counter() - t0
        warm = median_seconds(lambda: simulate(counter, mapping), repeats)
        lean = median_seconds(lambda: simulate(counter, mapping, detail=False), repeats)
        rows.append([name, f"{cold:.3f}", f"{warm:.3f}", f"{lean:.3f}"])
    print(format_table(rows, ["mapping", "cold s", "warm s", "warm, detail=False s"],
                       indent=2, rule=True))


def agreement(counter) -> None:
    print("\n2. decode on one device against weight streaming (perfcounter / bound)")
    decode = counter.counts["decode"]
    weight = decode.trace.per_op_read[ROLES.index("weight")]  # bytes, all steps
    rows = []
    for name, entry in ONE_DEVICE.items():
        spec = get_device_spec(entry)
        p = simulate(counter, {"LlamaForCausalLM": name}, labels=["decode"]).phases["decode"]
        time_bound = weight / spec.bandwidth
        energy_bound = (weight * 8 * spec.mem_pj_per_bit
                        + weight / 2 * 2 * spec.pj_per_flop("bfloat16")) * 1e-12  # bf16: 2 B
        rows.append([name, f"{time_bound / decode.num_tokens * 1e3:.2f}",
                     f"{p.time_s / decode.num_tokens * 1e3:.2f}", f"{p.time_s / time_bound:.4f}",
                     f"{energy_bound / decode.num_tokens:.4f}",
                     f"{p.energy_j / decode.num_tokens:.4f}", f"{p.energy_j / energy_bound:.4f}"])
    print(format_table(rows, ["device", "bound ms/token", "ms/token", "ratio", "bound J/token",
                              "J/token", "ratio"], indent=2, rule=True))


def upmem_linear_flops(counter, args: ModelArgs) -> None:
    print("\n3. Linear FLOPs of one decode token, layer 0 (UPMEM: 2 * numel(input) * in_features)")
    decode = counter.counts["decode"]
    steps = decode.num_tokens
    rows = []
    for leaf, fan_in in [("q_proj", args.dim), ("gate_proj", args.dim), ("up_proj", args.dim),
                         ("down_proj", args.intermediate_size), ("lm_head", args.dim)]:
        flops = sum(r.flops for r in decode.trace.records
                    if r.module.endswith(("layers.0.self_attn." + leaf, "layers.0.mlp." + leaf))
                    or (leaf == "lm_head" and r.module.endswith(".lm_head"))) / steps
        upmem = 2 * fan_in * fan_in  # numel(input) = in_features for one token
        rows.append([leaf, f"{flops / 1e6:,.1f}", f"{upmem / 1e6:,.1f}", f"{upmem / flops:.3f}"])
    print(format_table(rows, ["layer", "perfcounter MFLOP", "UPMEM MFLOP", "UPMEM / exact"],
                       indent=2, rule=True))


def main(*, repeats: int = 5, prompt_length: int = 64, max_new_tokens: int = 16) -> None:
    warnings.simplefilter("ignore")  # dtype fallbacks of the UPMEM profiles warn once each
    torch.set_num_threads(2)
    args = ModelArgs.from_name("llama-2-7b")
    counter = TransformerPerformanceCounter()
    t0 = time.perf_counter()
    count_hf_config(hf_config(args), counter, batch_size=1, cache="static", prompt_length=prompt_length,
                         max_new_tokens=max_new_tokens, dtype=torch.bfloat16)
    counter.counts  # build the traces: part of counting, not of re-pricing
    records = sum(len(s.trace.records) for s in counter.counts.values())
    print(f"Llama-2-7B (transformers, bf16, no weights), prompt {prompt_length}, "
          f"{max_new_tokens} new tokens: counted in {time.perf_counter() - t0:.1f} s, "
          f"{records} op records in {len(counter.counts)} phases")
    repricing(counter, repeats)
    agreement(counter)
    upmem_linear_flops(counter, args)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt_length", type=int, default=64)
    p.add_argument("--max_new_tokens", type=int, default=16)
    main(**vars(p.parse_args()))
