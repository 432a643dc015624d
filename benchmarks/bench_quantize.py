"""What quantization buys: Llama-2-7B decode at bf16 / int8 / int4-32 / W4A16 + KV-int8, priced.

    python benchmarks/bench_quantize.py [--io_model compulsory] [--markdown]

Counts gpt-fast's benchmark setting once per scheme — Llama-2-7B, batch 1, a 5-token
prompt, 200 new tokens (the prefill makes the first, 199 decode steps the rest) — with no
weights (FakeTensorMode; perfcounter/quant/quantize.py stores every linear, the output layer
included, as the scheme says), then re-prices each count on four devices. Prints two
tables, the figures the README quotes:

1. Model size as gpt-fast's `_get_model_size` defines it (every top-level child but the
   embedding, KV caches at their allocated length: gpt-fast allocates 208 positions), next
   to the sizes gpt-fast's published table implies (bandwidth achieved ÷ tokens/s), with the
   output layer quantized and kept in bf16.
2. Per scheme and device: decode ms/token and tokens/s at the roofline, tokens/s as gpt-fast
   counts them (200 tokens ÷ the prefill and 199 decode steps), J/token, and beside the
   A100 rows gpt-fast's measured tokens/s with predicted ÷ measured. The roofline is a bound:
   a ratio above 1 is the share of the memory bandwidth a real run does not reach.
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch

from perfcounter import TransformerPerformanceCounter
from perfcounter.quant import quantize as q
from perfcounter.generation.config_only import greedy_generate
from perfcounter.generation.derive import count_generation
from perfcounter.models.loading import fake_model
from perfcounter.models.args import ModelArgs
from perfcounter.format import format_table

MODEL, PROMPT, NEW = "llama-2-7b", 5, 200
DEVICES = ["a100-sxm4-80gb", "h100-sxm", "snapdragon-8-gen3", "pim-ai-4chip"]
# (label, weight scheme, KV dtype)
SCHEMES = [("bf16", None, None), ("int8", "int8", None), ("int4-32", "int4-32", None),
           ("W4A16 + KV int8", "int4-32", "int8")]
# gpt-fast README (github.com/pytorch-labs/gpt-fast), Llama-2-7B on A100-80GB: tokens/s and
# bandwidth achieved (GB/s); model size = bandwidth / tokens/s
GPT_FAST = {"bf16": (104.9, 1397.31), "int8": (155.58, 1069.20), "int4-32": (196.80, 862.69)}


def count_scheme(weights, kv, io_model: str):
    counter = TransformerPerformanceCounter(io_model=io_model)
    make = None if weights is None and kv is None else (
        lambda c: fake_model(c, weights=weights, kv=kv, dtype=torch.bfloat16))
    count_generation(ModelArgs.from_name(MODEL), counter, batch_size=1, prompt_length=PROMPT,
                     max_new_tokens=NEW, dtype=torch.bfloat16, generate=greedy_generate,
                     make_model=make)
    return counter


def size_table() -> tuple[list[str], list[list]]:
    head = ["scheme", "perfcounter GB", "output kept bf16 GB", "published GB",
            "perfcounter / published", "kept bf16 / published"]
    rows = []
    for label, weights, _ in SCHEMES[:3]:
        args = ModelArgs.from_name(MODEL)
        sizes = []
        for keep in ((), ("output",)):
            model, _ = fake_model(args, weights=weights, keep=keep, dtype=torch.bfloat16)
            sizes.append(q.model_size_bytes(model, 1, 208) / 1e9)  # gpt-fast: 205 -> 208
        tps, bandwidth = GPT_FAST[label]
        published = bandwidth / tps
        rows.append([label, f"{sizes[0]:.2f}", f"{sizes[1]:.2f}", f"{published:.2f}",
                     f"{sizes[0] / published:.3f}", f"{sizes[1] / published:.3f}"])
    return head, rows


def buys_table(io_model: str) -> tuple[list[str], list[list]]:
    head = ["scheme", "device", "decode ms/token", "decode tokens/s", "tokens/s (gpt-fast's count)",
            "J/token", "gpt-fast A100 tokens/s", "predicted / measured"]
    rows = []
    for label, weights, kv in SCHEMES:
        counter = count_scheme(weights, kv, io_model)
        for device in DEVICES:
            pre, dec = (counter.counts[p].on(device, io_model) for p in ("prefill", "decode"))
            total_s = pre.roofline_latency + dec.roofline_latency
            step_ms = dec.roofline_latency / dec.num_tokens * 1e3
            energy = (pre.energy_j + dec.energy_j) / NEW
            tps = NEW / total_s
            measured = GPT_FAST.get(label, (None,))[0] if device == "a100-sxm4-80gb" else None
            rows.append([label, device, f"{step_ms:.2f}", f"{1e3 / step_ms:.1f}", f"{tps:.1f}",
                         f"{energy:.3f}", "" if measured is None else f"{measured:.2f}",
                         "" if measured is None else f"{tps / measured:.2f}"])
    return head, rows


def main(*, io_model: str = "compulsory", markdown: bool = False) -> None:
    warnings.simplefilter("ignore")  # device fallbacks (a peak for another dtype) warn once each
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    for title, (head, rows) in (("Model size (gpt-fast's _get_model_size), Llama-2-7B, 208 KV "
                                 "positions", size_table()),
                                (f"What quantization buys: Llama-2-7B, batch 1, {PROMPT}-token "
                                 f"prompt, {NEW} new tokens, roofline ({io_model} IO)",
                                 buys_table(io_model))):
        print(f"\n{title}\n")
        print(format_table(rows, head, markdown=markdown, rule=not markdown))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--io_model", default="compulsory", choices=["per_op", "compulsory"],
                        help="the bytes the roofline prices (default compulsory: gpt-fast's "
                             "figures are of compiled, fused code)")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    main(**vars(parser.parse_args()))
