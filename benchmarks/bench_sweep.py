"""How fast is a config-only sweep? Time to count a model with no weights, per configuration.

Each configuration builds a preset under FakeTensorMode (no weights, no memory),
counts a prefill of --prompt_length tokens and --max_new_tokens decode steps
through TransformerPerformanceCounter, builds the stats and prices them on three
devices. Prints seconds per configuration (median of --repeats) and the figures
it found, so the speed claim and the numbers come from one run.

    python benchmarks/bench_sweep.py [--repeats 3] [--prompt_length 128] [--max_new_tokens 4]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from perfcounter import TransformerPerformanceCounter
from perfcounter.generation.config_only import count_config_only
from perfcounter.models.args import ModelArgs
from perfcounter.format import format_table, scaled

PRESETS = ["smollm2-135m", "llama-3.2-1b", "llama-2-7b", "llama-3-8b", "mixtral-8x7b", "llama-3-70b"]
DEVICES = ["h100-sxm", "a100-sxm4-80gb", "pim-ai-4chip"]


def count_once(name: str, prompt_length: int, max_new_tokens: int):
    counter = TransformerPerformanceCounter(device_spec="h100-sxm")
    count_config_only(ModelArgs.from_name(name), counter, batch_size=1, prompt_length=prompt_length,
                      max_new_tokens=max_new_tokens, dtype=torch.bfloat16, device="cpu")
    table = counter.compare(DEVICES)
    return counter.counts, table


def main(*, repeats: int = 3, prompt_length: int = 128, max_new_tokens: int = 4):
    import warnings

    warnings.simplefilter("ignore")  # device fallbacks warn once per device; not the point here
    torch.set_num_threads(2)
    print(f"config-only counts, bf16, prompt {prompt_length}, {max_new_tokens} new tokens, "
          f"priced on {', '.join(DEVICES)}; median of {repeats}")
    count_once(PRESETS[0], 8, 1)  # warm up: imports and the op cost cache
    header, widths = ["model", "seconds", "prefill GFLOPs", "decode GB/token"], [14, 8, 15, 16]
    print(format_table([], header, widths=widths, sep=" "))
    for name in PRESETS:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            counts, _ = count_once(name, prompt_length, max_new_tokens)
            times.append(time.perf_counter() - t0)
        decode = counts["decode"]
        row = [name, scaled(statistics.median(times)),
               scaled(counts["prefill"].total_flops, "G", 1),
               scaled(decode.total_io / decode.num_tokens, "G", 2)]
        print(format_table([row], widths=widths, sep=" "))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt_length", type=int, default=128)
    p.add_argument("--max_new_tokens", type=int, default=4)
    a = p.parse_args()
    main(repeats=a.repeats, prompt_length=a.prompt_length, max_new_tokens=a.max_new_tokens)
