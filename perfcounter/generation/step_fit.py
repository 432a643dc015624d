"""The affine model of decode steps: fit on two counted steps, checked on the others.

A decode step at context length x (the tokens already in the cache) has the same
records at every x — op, module, segment, dtype and arguments with their integers
taken out (trace_args.pattern) — and every figure is affine in x with integer
coefficients (a + b·x): each record's calls, FLOPs, executed FLOPs, primitive counts and
bytes by role, each integer of its arguments (shapes, strides, integer scalars: the
arguments are rebuilt from them, trace_args.with_numbers), and the step's compulsory bytes by role and valid KV-cache bytes
read. `fit_steps` fits it on two counted steps and checks it on the others;
`StepFit.total` sums any steps in integers. Also here: what derive_layers.py shares
(`difference`, `keyed_records`, `uncounted_counts`); the figures are figures.py's.
"""
from __future__ import annotations

import dataclasses
import itertools

from perfcounter.generation.figures import DeriveError, Figures, PhaseFigures
from perfcounter.trace import OpRecord, Trace
from perfcounter.trace_args import numbers, pattern, with_numbers


def _slopes(a: list[int], b: list[int], dx: int) -> list[int]:
    """The integer slopes of the integers of two args (DeriveError when one has none)."""
    out = []
    for u, v in zip(a, b):
        if (v - u) % dx:
            raise DeriveError(f"an argument goes from {u} to {v} over {dx} steps: no integer slope")
        out.append((v - u) // dx)
    return out


def uncounted_counts(records) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        if not r.has_formula:
            out[r.op] = out.get(r.op, 0) + r.calls
    return out


def keyed_records(records) -> dict[tuple, OpRecord]:
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
    ra, rb = keyed_records(a.records), keyed_records(b.records)
    for key in {**ra, **rb}:
        x, y = ra.get(key), rb.get(key)
        if x is None or y is None or Figures.of(x) != Figures.of(y) or x.has_formula != y.has_formula:
            shown = [None if r is None else (Figures.of(r).values(), r.has_formula) for r in (x, y)]
            return (f"{key[0]} under {key[1] or 'top level'} [{key[4]}], segment {key[2]}: "
                    f"{shown[0]} vs {shown[1]} (calls, flops, executed, kinds, read, written)")
    if PhaseFigures.of(a) != PhaseFigures.of(b):
        return f"phase figures {PhaseFigures.of(a)} vs {PhaseFigures.of(b)}"
    ma, mb = [m.to_dict() for m in a.modules], [m.to_dict() for m in b.modules]
    if modules and ma != mb:
        first = next((i for i, (x, y) in enumerate(zip(ma, mb)) if x != y), min(len(ma), len(mb)))
        return f"module {first}: {ma[first:first + 1]} vs {mb[first:first + 1]}"
    return None


# -- decode steps --------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class _Line:
    """One record of a decode step as a function of d = x - x0."""

    key: tuple  # what `_groups` keys its record by: op, module, segment, dtype, ..., pattern
    args0: tuple  # its arguments at x0
    nums: list[int]  # their integers (trace_args.numbers)
    num_slopes: list[int]
    at: Figures  # at x0
    slope: Figures
    fixed: bool  # nothing moves with x

    def args(self, d: int) -> tuple:
        if not any(self.num_slopes):
            return self.args0
        return with_numbers(self.args0, [n + s * d for n, s in zip(self.nums, self.num_slopes)])

    def figures(self, d: int) -> Figures:
        return self.at if self.fixed else self.at.along(self.slope, d)

    def record(self, d: int, figures: Figures) -> OpRecord:
        op, module, segment, dtype, has_formula, _ = self.key
        return figures.record(op, module, dtype, self.args(d), has_formula, segment)

    def lowest(self, d: int) -> int:
        if self.fixed:
            return 0  # counted figures, never negative
        moving = [n + s * d for n, s in zip(self.nums, self.num_slopes) if s]  # sizes, strides
        return min([self.figures(d).lowest(), *moving])


def _groups(trace: Trace) -> dict[tuple, list[tuple[OpRecord, list[int]]]]:
    """Records by everything but the integers of their arguments, in order."""
    out: dict[tuple, list] = {}
    for r in trace.records:
        key = (r.op, r.module, r.segment, r.dtype, r.has_formula, pattern(r.args))
        out.setdefault(key, []).append((r, numbers(r.args)))
    return out


@dataclasses.dataclass
class StepFit:
    """Decode steps as affine functions of the context length x (see the module doc)."""

    x0: int
    lines: list[_Line]
    phase_at: PhaseFigures
    phase_slope: PhaseFigures
    modules: list  # ModuleInfo of one step

    def check_range(self, lo: int, hi: int) -> None:
        """DeriveError when a figure of a step in [lo, hi] would be negative."""
        for d in (lo - self.x0, hi - self.x0):
            if self.phase_at.along(self.phase_slope, d).lowest() < 0 or any(
                    line.lowest(d) < 0 for line in self.lines):
                raise DeriveError(f"the fit gives a negative figure at context {d + self.x0}")

    def matches(self, x: int, trace: Trace, groups: dict) -> bool:
        """The quick check: the step at x pairs up with the fit line for line and every
        figure is the fit's (False says nothing: signatures may coincide at x)."""
        d, lines = x - self.x0, iter(self.lines)
        for key, recs in groups.items():
            for r, _ in recs:
                line = next(lines, None)
                if (line is None or line.key != key or line.args(d) != r.args
                        or line.figures(d) != Figures.of(r)):
                    return False
        if next(lines, None) is not None:
            return False
        return self.phase_at.along(self.phase_slope, d) == PhaseFigures.of(trace)

    def total(self, xs) -> Trace:
        """The steps at context lengths xs, summed (exact integers)."""
        xs = list(xs)
        n, sd = len(xs), sum(x - self.x0 for x in xs)
        self.check_range(min(xs, default=self.x0), max(xs, default=self.x0))
        records: list[OpRecord] = []
        for line in self.lines:
            if line.fixed:
                records.append(line.record(0, line.at.scaled(n)))
            elif not any(line.num_slopes):  # one signature: summed in closed form
                records.append(line.record(0, line.at.scaled(n).along(line.slope, sd)))
            else:
                records += [line.record(x - self.x0, line.figures(x - self.x0)) for x in xs]
        phase = self.phase_at.scaled(n).along(self.phase_slope, sd)
        keyed: dict[tuple, OpRecord] = {}
        for r in records:  # signatures that coincide at some x: one record, as counting makes
            if r.key in keyed:
                keyed[r.key].add(r)
            else:
                keyed[r.key] = r
        return Trace(records=list(keyed.values()), **phase.trace_fields(),
                     uncounted_ops=uncounted_counts(keyed.values()), steps=n,
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
    dx, lines, zeros = x1 - x0, [], Figures()
    for key, recs in g0.items():
        for (r0, n0), (r1, n1) in zip(recs, g1[key]):
            f0, f1 = Figures.of(r0), Figures.of(r1)
            slope = zeros if f0 == f1 else f0.slope_to(f1, dx)
            num_slopes = [0] * len(n0) if n0 == n1 else _slopes(n0, n1, dx)
            lines.append(_Line(key, r0.args, n0, num_slopes, f0, slope,
                               slope is zeros and n0 == n1))
    at = PhaseFigures.of(t0)
    return StepFit(x0, lines, at, at.slope_to(PhaseFigures.of(t1), dx), t0.modules)


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
