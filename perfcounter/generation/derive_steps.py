"""Decode steps derived from a few counted ones (see derive.py for the whole story).

The model: a decode step at context length x (the tokens already in the cache)
has the same records at every x — op, module, segment, dtype and shape signature
with its numbers taken out — and every figure is affine in x with integer
coefficients (a + b·x): each record's calls, FLOPs, executed FLOPs, primitive
counts and bytes by role, each number in its shape signature, and the step's
compulsory bytes by role and valid KV-cache bytes read. `fit_steps` (step_fit.py) fits
it on two counted steps and checks it on the others; `StepFit.total` sums any steps in
integers; `DecodeSteps` is the `phase` a generation function takes, which counts
the first steps, fits, and runs the rest without the dispatch mode.
"""
from __future__ import annotations

import gc
import time
import warnings
from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from perfcounter._util import PerfcounterWarning
from perfcounter.generation.step_fit import DeriveError, StepFit, fit_steps
from perfcounter.models.args import ModelArgs
from perfcounter.trace import Trace, build_trace

NOT_MEASURED = "not measured: fake or meta tensors"
class StopGeneration(Exception):
    """Raised by a `DecodeSteps(stop_early=True)` phase when no further step needs to run."""


@contextmanager
def _cycle_gc_paused():
    """Bookkeeping makes many short-lived objects that reference counting frees; with
    Python's cycle collector paused meanwhile none is promoted to an old generation, and
    the full collection that would follow (0.15 s in a process holding a loaded model)
    does not come due."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _fake_mode_active() -> bool:
    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


class DecodeSteps:
    """A `phase(label, num_tokens)` for a generation function (generate.py's `generate`,
    config_only's `greedy_generate`): the prefill and other labels go to
    `counter.count`; of the `steps` decode steps the first three are counted (fit and
    check; when they do not fit, one more, and the fit starts from the second: the first
    step may see what the prefill left differently), the others run without the dispatch
    mode, each timed, and are derived.
    `finish()` adds the "decode" phase to the counter: derived + counted counts; as
    latency the uncounted steps' time scaled to all steps (or, when every step was
    counted, the counted time less the counter's bookkeeping).

    every_step: count every step. stop_early: raise StopGeneration at the first step
    that need not run (config-only counts, where nothing is measured). breakpoints:
    context lengths where the counts may change form (see `decode_breakpoints`); when
    one lies inside the generation, every step is counted (a step counted after
    uncounted ones would miss what they did to the cache's state)."""

    FIT_STEPS = 3  # counted in a row: two for the fit, one to check it
    LATE_START = 1  # the fit may start this many steps late (the first step may differ)

    def __init__(self, counter, steps: int, *, prompt_length: int | None = None,
                 breakpoints=(), every_step: bool = False, stop_early: bool = False):
        self.counter, self.steps, self.x0 = counter, steps, prompt_length
        self.breakpoints = tuple(breakpoints)
        self.every_step, self.stop_early = every_step, stop_early
        self.k = 0  # decode steps entered
        self.tokens = 0
        self.counted: list = []  # (context length, Block; None once the fit holds it)
        self.counted_s = 0.0
        self.timed_s, self.timed = 0.0, 0  # uncounted steps: seconds, number
        self.fit: StepFit | None = None
        self._fit_overhead = 0.0  # the counter's bookkeeping seconds in the fitted steps
        self.start = 0  # the counted step the fit starts from
        self.reason: str | None = None  # why steps were counted one by one, when they were
        self.real = True
        self.stopped = False
        self._prefill_tokens = None

    def __call__(self, label: str, num_tokens: int):
        if label != "decode":
            if label == "prefill":
                self._prefill_tokens = num_tokens
            return self.counter.count(label, num_tokens)
        return self._step(num_tokens)

    def _fit(self) -> None:
        """Fit on the three counted steps from `start`; when they do not fit and the first
        step may differ from the rest (what the prefill left in the cache), count one more
        step and fit from the next."""
        first, end = self.start, self.start + self.FIT_STEPS
        window = self.counted[first:end]
        try:
            with _cycle_gc_paused():
                self.fit = fit_steps([(x, build_trace([b])) for x, b in window])
                self.fit.check_range(self.x0 + self.start, self.x0 + self.steps - 1)
            self._fit_overhead = sum(b.overhead_s for _, b in window)
            self.counted[first:end] = [(x, None) for x, _ in window]  # the fit holds them now
        except DeriveError as e:
            self.fit = None
            if self.start < self.LATE_START:
                self.start += 1
                return
            self.reason = str(e)
            warnings.warn(f"perfcounter: decode steps do not follow the affine model ({e}); "
                          "counting every step", PerfcounterWarning, stacklevel=5)

    def _wants(self, x: int) -> bool:
        """Whether the step at context x is counted."""
        if self.every_step or self.reason is not None:
            return True
        if self.fit is None:
            if self.k < self.start + self.FIT_STEPS:
                return True
            self._fit()
            if self.fit is None:
                return True
        return self.k >= self.steps

    @contextmanager
    def _step(self, num_tokens: int):
        if self.x0 is None:  # the prompt length from the prefill's tokens (batch * length)
            self.x0 = self._prefill_tokens // num_tokens if self._prefill_tokens else 0
        if self.k == 0:
            self.real = not _fake_mode_active()
            edge = next((b for b in self.breakpoints if self.x0 <= b < self.x0 + self.steps), None)
            if edge is not None and not self.every_step:
                self.reason = f"the counts may change form at context {edge}, inside the generation"
        x = self.x0 + self.k
        count = self._wants(x)
        if not count and self.stop_early:
            self.stopped = True
            raise StopGeneration
        self.k += 1
        self.tokens += num_tokens
        if count:
            with self.counter.mode:
                _sync()
                t0 = time.perf_counter()
                yield
                _sync()
                self.counted_s += time.perf_counter() - t0
            self.counted.append((x, self.counter.mode.last_block()))
        else:
            _sync()
            t0 = time.perf_counter()
            yield
            _sync()
            self.timed_s += time.perf_counter() - t0
            self.timed += 1

    def trace(self) -> Trace | None:
        """The decode phase (None before any step): when the fit held, the fit summed over
        the steps from its first (it equals the counted ones exactly: two made it, one
        checked it) plus any step counted before; else the counted steps."""
        n = self.steps if self.stopped else self.k
        if n == 0:
            return None
        if self.fit is None or self.reason is not None:
            return build_trace([b for _, b in self.counted])
        trace = self.fit.total(self.x0 + k for k in range(self.start, min(n, self.steps)))
        trace.overhead_s = self._fit_overhead
        head = [b for _, b in self.counted[:self.start]]  # before the fit
        tail = [b for x, b in self.counted if x >= self.x0 + self.steps]  # past the plan
        if head:
            trace = build_trace(head).merge(trace)
        return trace.merge(build_trace(tail)) if tail else trace

    def finish(self) -> Trace | None:
        """Add the decode phase to the counter (see the class doc); returns its trace."""
        with _cycle_gc_paused():
            trace = self.trace()
        if trace is None:
            return None
        n = trace.steps
        tokens = self.tokens if not self.stopped else self.tokens * n // max(self.k, 1)
        if not self.real:
            self.counter.add("decode", trace, num_tokens=tokens, timing=NOT_MEASURED)
        elif self.timed:
            seconds = self.timed_s * n / self.timed
            self.counter.add("decode", trace, num_tokens=tokens, latency=seconds,
                             raw_latency=seconds,
                             timing=f"time.perf_counter over the {self.timed} uncounted of "
                                    f"{n} steps, scaled to {n}")
        else:
            overhead = sum(b.overhead_s for _, b in self.counted)
            self.counter.add("decode", trace, num_tokens=tokens,
                             latency=max(self.counted_s - overhead, 0.0),
                             raw_latency=self.counted_s,
                             timing="time.perf_counter, counted steps less the counter's bookkeeping")
        return trace


def decode_breakpoints(config) -> list[int]:
    """Context lengths from which a model's decode steps may stop following the affine
    model: a Hugging Face sliding window (its cache stops growing; one step early, to be
    safe). Our Transformer has none: its window is a mask over a static cache."""
    window = None if isinstance(config, ModelArgs) else getattr(config, "sliding_window", None)
    return [max(window - 2, 0)] if isinstance(window, int) else []
