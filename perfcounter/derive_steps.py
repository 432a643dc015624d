"""Decode steps derived from a few counted ones (see derive.py for the whole story).

The model: a decode step at context length x (the tokens already in the cache)
has the same records at every x — op, module, segment, dtype and shape signature
with its numbers taken out — and every figure is affine in x with integer
coefficients (a + b·x): each record's calls, FLOPs, executed FLOPs, primitive
counts and bytes by role, each number in its shape signature, and the step's
compulsory bytes by role and valid KV-cache bytes read. `fit_steps` fits it on
two counted steps and checks it on the others; `StepFit.total` sums any steps in
integers; `DecodeSteps` is the `phase` a generation function takes, which counts
the first steps, fits, and runs the rest without the dispatch mode.
Also here: the record arithmetic derive_layers.py shares (`difference`, ...).
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import re
import time
import warnings
from contextlib import contextmanager

import torch

from perfcounter.model import ModelArgs
from perfcounter.trace import KINDS, ROLES, OpRecord, Trace, build_trace
from perfcounter._util import PerfcounterWarning

NOT_MEASURED = "not measured: fake or meta tensors"
_NUM = re.compile(r"\d+")
_K, _R = 3 + len(KINDS), len(ROLES)  # record figures: calls, flops, executed, kinds, read, written


class DeriveError(ValueError):
    """A count that cannot be derived (the counts do not follow the model): count it."""


class StopGeneration(Exception):
    """Raised by a `DecodeSteps(stop_early=True)` phase when no further step needs to run."""


def _figures(r: OpRecord) -> list[int]:
    return [r.calls, r.flops, r.executed_flops, *r.kinds, *r.read, *r.written]


def _phase_figures(t: Trace) -> list[int]:
    return [*t.compulsory_read, *t.compulsory_written, t.kv_cache_valid_read]


def _slopes(a: list[int], b: list[int], dx: int) -> list[int]:
    out = []
    for u, v in zip(a, b):
        if (v - u) % dx:
            raise DeriveError(f"a figure goes from {u} to {v} over {dx} steps: no integer slope")
        out.append((v - u) // dx)
    return out


def _line(at: list[int], slope: list[int], d: int) -> list[int]:
    return [a + s * d for a, s in zip(at, slope)]


def _uncounted(records) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        if not r.has_formula:
            out[r.op] = out.get(r.op, 0) + r.calls
    return out


def _keyed(records) -> dict[tuple, OpRecord]:
    """Records by key, those with the same key summed."""
    out: dict[tuple, OpRecord] = {}
    for r in records:
        if r.key in out:
            out[r.key].add(r)
        else:
            out[r.key] = r.copy()
    return out


def difference(a: Trace, b: Trace, *, modules: bool = True) -> str | None:
    """None when two traces have the same records (by key), phase figures and (unless
    modules=False) modules; else the first difference, in words."""
    ra, rb = _keyed(a.records), _keyed(b.records)
    for key in {**ra, **rb}:
        x, y = ra.get(key), rb.get(key)
        if x is None or y is None or _figures(x) != _figures(y) or x.has_formula != y.has_formula:
            shown = [None if r is None else (_figures(r), r.has_formula) for r in (x, y)]
            return (f"{key[0]} under {key[1] or 'top level'} [{key[4]}], segment {key[2]}: "
                    f"{shown[0]} vs {shown[1]} (calls, flops, executed, kinds, read, written)")
    if _phase_figures(a) != _phase_figures(b):
        return f"phase figures {_phase_figures(a)} vs {_phase_figures(b)}"
    ma, mb = [m.to_dict() for m in a.modules], [m.to_dict() for m in b.modules]
    if modules and ma != mb:
        first = next((i for i, (x, y) in enumerate(zip(ma, mb)) if x != y), min(len(ma), len(mb)))
        return f"module {first}: {ma[first:first + 1]} vs {mb[first:first + 1]}"
    return None


# -- decode steps --------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class _Line:
    """One record of a decode step as a function of d = x - x0."""

    key: tuple  # what `_groups` keys its record by: op, module, segment, dtype, ..., pieces
    text: str  # its shape signature at x0
    nums: list[str]  # the numbers in it, as written
    num_slopes: list[int]
    at: list[int]  # figures at x0
    slope: list[int]
    fixed: bool  # nothing moves with x

    def shapes(self, d: int) -> str:
        if not any(self.num_slopes):
            return self.text
        nums = [n if not s else str(int(n) + s * d) for n, s in zip(self.nums, self.num_slopes)]
        return "".join(p + n for p, n in zip(self.key[-1], nums + [""]))

    def figures(self, d: int) -> list[int]:
        return self.at if self.fixed else _line(self.at, self.slope, d)

    def record(self, d: int, figures: list[int]) -> OpRecord:
        f, (op, module, segment, dtype, has_formula, _) = figures, self.key
        return OpRecord(op, module, dtype, self.shapes(d), f[0], f[1], f[2], f[3:_K],
                        f[_K:_K + _R], f[_K + _R:], has_formula, segment)

    def lowest(self, d: int) -> int:
        if self.fixed:
            return 0  # counted figures, never negative
        nums = [int(n) + s * d for n, s in zip(self.nums, self.num_slopes)]
        return min(_line(self.at, self.slope, d) + nums)


def _groups(trace: Trace) -> dict[tuple, list[tuple[OpRecord, list[str]]]]:
    """Records by everything but the numbers in their signature, in order."""
    out: dict[tuple, list] = {}
    for r in trace.records:
        key = (r.op, r.module, r.segment, r.dtype, r.has_formula, tuple(_NUM.split(r.shapes)))
        out.setdefault(key, []).append((r, _NUM.findall(r.shapes)))
    return out


@dataclasses.dataclass
class StepFit:
    """Decode steps as affine functions of the context length x (see the module doc)."""

    x0: int
    lines: list[_Line]
    phase_at: list[int]
    phase_slope: list[int]
    modules: list  # ModuleInfo of one step

    def check_range(self, lo: int, hi: int) -> None:
        """DeriveError when a figure of a step in [lo, hi] would be negative."""
        for d in (lo - self.x0, hi - self.x0):
            if min(_line(self.phase_at, self.phase_slope, d), default=0) < 0 or any(
                    line.lowest(d) < 0 for line in self.lines):
                raise DeriveError(f"the fit gives a negative figure at context {d + self.x0}")

    def matches(self, x: int, trace: Trace, groups: dict) -> bool:
        """The quick check: the step at x pairs up with the fit line for line and every
        figure is the fit's (False says nothing: signatures may coincide at x)."""
        d, lines = x - self.x0, iter(self.lines)
        for key, recs in groups.items():
            for r, _ in recs:
                line = next(lines, None)
                if (line is None or line.key != key or line.shapes(d) != r.shapes
                        or line.figures(d) != _figures(r)):
                    return False
        if next(lines, None) is not None:
            return False
        return _line(self.phase_at, self.phase_slope, d) == _phase_figures(trace)

    def total(self, xs) -> Trace:
        """The steps at context lengths xs, summed (exact integers)."""
        xs = list(xs)
        n, sd = len(xs), sum(x - self.x0 for x in xs)
        self.check_range(min(xs, default=self.x0), max(xs, default=self.x0))
        records: list[OpRecord] = []
        for line in self.lines:
            if line.fixed:
                records.append(line.record(0, [n * a for a in line.at]))
            elif not any(line.num_slopes):  # one signature: summed in closed form
                sums = [n * a + sd * s for a, s in zip(line.at, line.slope)]
                records.append(line.record(0, sums))
            else:
                records += [line.record(x - self.x0, line.figures(x - self.x0)) for x in xs]
        phase = [n * a + sd * s for a, s in zip(self.phase_at, self.phase_slope)]
        keyed: dict[tuple, OpRecord] = {}
        for r in records:  # signatures that coincide at some x: one record, as counting makes
            if r.key in keyed:
                keyed[r.key].add(r)
            else:
                keyed[r.key] = r
        return Trace(records=list(keyed.values()), compulsory_read=phase[:_R],
                     compulsory_written=phase[_R:2 * _R], kv_cache_valid_read=phase[-1],
                     uncounted_ops=_uncounted(keyed.values()), steps=n,
                     modules=[dataclasses.replace(m, calls=m.calls * n, children=list(m.children))
                              for m in self.modules])


def _fit_pair(x0: int, t0: Trace, g0: dict, x1: int, t1: Trace, g1: dict) -> StepFit:
    """The line through two steps whose records pair up one to one."""
    if g1.keys() != g0.keys() or any(len(v) != len(g0[k]) for k, v in g1.items()):
        extra = next(iter(g1.keys() ^ g0.keys()), None)
        raise DeriveError(f"the step at context {x1} has other records than at {x0}"
                          + (f" ({extra[0]} under {extra[1] or 'top level'})" if extra else ""))
    if [(m.path, m.calls) for m in t1.modules] != [(m.path, m.calls) for m in t0.modules]:
        raise DeriveError(f"the step at context {x1} ran other modules than at {x0}")
    dx, lines, zeros = x1 - x0, [], [0] * (_K + 2 * _R)
    for key, recs in g0.items():
        for (r0, n0), (r1, n1) in zip(recs, g1[key]):
            f0, f1 = _figures(r0), _figures(r1)
            slope = zeros if f0 == f1 else _slopes(f0, f1, dx)
            num_slopes = [0] * len(n0) if n0 == n1 else _slopes([int(n) for n in n0],
                                                                [int(n) for n in n1], dx)
            lines.append(_Line(key, r0.shapes, n0, num_slopes, f0, slope,
                               slope is zeros and n0 == n1))
    at = _phase_figures(t0)
    return StepFit(x0, lines, at, _slopes(at, _phase_figures(t1), dx), t0.modules)


def fit_steps(samples: list[tuple[int, Trace]]) -> StepFit:
    """The affine fit of decode steps from [(context length, one step's trace), ...], made
    on two of them and checked on all the others (records by key, phase figures): the
    first pair that pairs up record for record and passes (a step where two signatures
    happen to coincide, [4, 8, 8] from [4, 8, x] at x = 8, has its records merged: it is
    checked, not fitted on). DeriveError when no pair fits every step."""
    if len({x for x, _ in samples}) < 2:
        raise ValueError("fit_steps needs steps at two different context lengths")
    groups = [_groups(t) for _, t in samples]
    failed = None
    for i, j in itertools.combinations(range(len(samples)), 2):
        if samples[i][0] == samples[j][0]:
            continue
        try:
            fit = _fit_pair(*samples[i], groups[i], *samples[j], groups[j])
            for k, (x, t) in enumerate(samples):
                if k not in (i, j) and not fit.matches(x, t, groups[k]):
                    diff = difference(fit.total([x]), t, modules=False)
                    if diff:
                        raise DeriveError(f"at context {x} counted vs fit: {diff}")
            return fit
        except DeriveError as e:
            failed = failed or e
    raise failed


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
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
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
