"""Whole generations priced in seconds: derived counts next to step-by-step counting.

Three figures, each printed next to what counting every step costs (issue 13's goals):

  70b-1024   Llama-3-70B config, prompt 2048, 1,024 new tokens: the count in-process
             (derive.count_generation, stats built), and the whole `python generate.py
             --model llama-3-70b --prompt_length 2048 --max_new_tokens 1024 --quiet`
             process (wall seconds, peak RSS). Step by step (count_config_only) is timed
             for 2 and 4 new tokens and extrapolated to 1,024 (most of an hour).
  70b-1      the same with 2 new tokens (prefill 2048 + one decode step), both ways.
  smollm2    a real SmolLM2-135M generation of 64 tokens (generate.py's default model and
             sampling, float32, 2 threads): the generation counted through derive.DecodeSteps
             (prefill and the first three decode steps counted, the rest run and timed
             without the dispatch mode, stats built) over the same generation with no
             counter; and over it, every step counted (counter.count). Median of --rounds
             interleaved rounds, after one warm-up round each; every timed run starts from
             a collected heap (gc.collect(), the collector left on during the run), so that
             no run pays for a full collection of what earlier runs left.

Timings are wall clock on a shared machine: run it alone, and rerun a figure that looks
contended.

    python benchmarks/bench_generation.py [--rounds 5] [--skip_70b] [--skip_smollm2]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GOALS = {"70b-1024": 10.0, "70b-1": 3.0, "smollm2": 1.1}


def run_generate(*flags: str) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one `python generate.py ... --quiet` process."""
    cmd = [sys.executable, str(REPO / "generate.py"), "--quiet", *flags]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err}")
    return seconds, usage.ru_maxrss / 1024  # Linux: KiB


def bench_70b() -> None:
    from perfcounter import TransformerPerformanceCounter
    from perfcounter.generation.config_only import count_config_only, greedy_generate
    from perfcounter.generation.derive import count_generation
    from perfcounter.models.args import ModelArgs

    args = ModelArgs.from_name("llama-3-70b")

    def seconds(count, new_tokens: int) -> float:
        counter = TransformerPerformanceCounter(device_spec="h100-sxm")
        t0 = time.perf_counter()
        count(args, counter, prompt_length=2048, max_new_tokens=new_tokens,
              generate=greedy_generate)
        counter.counts  # stats built
        return time.perf_counter() - t0

    seconds(count_generation, 2)  # warm-up: plan cache, torch._dynamo's import
    derived_1024, derived_1 = seconds(count_generation, 1024), seconds(count_generation, 2)
    every_1, every_3 = seconds(count_config_only, 2), seconds(count_config_only, 4)
    per_step = (every_3 - every_1) / 2
    every_1024 = every_1 + 1022 * per_step
    base = ["--model", "llama-3-70b", "--prompt_length", "2048"]
    wall_1024, rss_1024 = run_generate(*base, "--max_new_tokens", "1024")
    wall_1, rss_1 = run_generate(*base, "--max_new_tokens", "2")
    print(f"llama-3-70b config, prompt 2048; counting in-process (imports done), and the whole "
          f"`python generate.py ... --quiet` process (step by step: {per_step:.2f} s per decode "
          f"step)")
    print(f"  70b-1024  derived {derived_1024:5.2f} s; process {wall_1024:5.2f} s, "
          f"{rss_1024:4.0f} MB peak RSS  |  step by step ~{every_1024:5.0f} s (extrapolated)  |  "
          f"goal <= {GOALS['70b-1024']:.0f} s, <= 1024 MB")
    print(f"  70b-1     derived {derived_1:5.2f} s; process {wall_1:5.2f} s, {rss_1:4.0f} MB peak "
          f"RSS  |  step by step {every_1:6.2f} s               |  goal <= {GOALS['70b-1']:.0f} s")


def bench_smollm2(rounds: int) -> None:
    spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    from perfcounter import TransformerPerformanceCounter
    from perfcounter.generation.derive import DecodeSteps
    from perfcounter.models.loading import default_checkpoint, load_model

    loaded = load_model(default_checkpoint(), dtype=torch.float32)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = torch.tensor([tokenizer.encode("Hello, my name is")])
    sampling = dict(temperature=0.8, top_k=200)
    new_tokens = 64

    def plain():
        gen.generate(model, prompt, new_tokens, **sampling)

    def derived():
        counter = TransformerPerformanceCounter(device_spec="generic-cpu")
        steps = DecodeSteps(counter, new_tokens - 1, prompt_length=prompt.shape[1])
        gen.generate(model, prompt, new_tokens, phase=steps, **sampling)
        steps.finish()
        counter.counts  # stats built: part of counting
        assert len(steps.counted) == DecodeSteps.FIT_STEPS, steps.reason

    def every_step():
        counter = TransformerPerformanceCounter(device_spec="generic-cpu")
        gen.generate(model, prompt, new_tokens, phase=counter.count, **sampling)
        counter.counts

    variants = {"plain": plain, "derived": derived, "every step": every_step}
    times = {name: [] for name in variants}
    for name, fn in variants.items():  # warm-up: plan cache, allocator, first-call costs
        fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            gc.collect()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"SmolLM2-135M, real weights (float32), {prompt.shape[1]} prompt tokens, {new_tokens} "
          f"new, median of {rounds}")
    print(f"  smollm2   plain {med['plain']:.2f} s; counted, derived {med['derived']:.2f} s = "
          f"{med['derived'] / med['plain']:.3f}x  |  every step counted "
          f"{med['every step']:.2f} s = "
          f"{med['every step'] / med['plain']:.2f}x  |  goal <= {GOALS['smollm2']}x")
    spread = {name: f"{min(t):.2f}-{max(t):.2f}" for name, t in times.items()}
    print(f"            spread (s): {spread}")


def main(*, rounds: int = 5, skip_70b: bool = False, skip_smollm2: bool = False) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if not skip_70b:
        bench_70b()
    if not skip_smollm2:
        bench_smollm2(rounds)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip_70b", action="store_true")
    p.add_argument("--skip_smollm2", action="store_true")
    a = p.parse_args()
    main(rounds=a.rounds, skip_70b=a.skip_70b, skip_smollm2=a.skip_smollm2)
