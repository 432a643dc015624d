"""The affine model of decode steps: fit on two counted steps, checked on the others.

A decode step at context length x (the tokens already in the cache) has the same
records at every x — op, module, segment, dtype and arguments with their integers
taken out (trace_args.pattern) — and every figure is affine in x with integer
coefficients (a + b·x): each record's calls, FLOPs, executed FLOPs, primitive counts and
bytes by role, each integer of its arguments (shapes, strides, integer scalars: the
arguments are rebuilt from them, trace_args.with_numbers), and the step's compulsory bytes by role and valid KV-cache bytes
read. `fit_steps` fits it on two counted steps and checks it on the others;
`StepFit.total` sums any steps in integers. Also here: the record arithmetic that
derive_layers.py shares (`difference`, `keyed_records`, `record_figures`, ...).
"""
from __future__ import annotations

import dataclasses
import itertools

from perfcounter.trace import KINDS, ROLES, OpRecord, Trace
from perfcounter.trace_args import numbers, pattern, with_numbers

KINDS_END, N_ROLES = 3 + len(KINDS), len(ROLES)  # record figures: calls, flops, executed, kinds, read, written


class DeriveError(ValueError):
    """A count that cannot be derived (the counts do not follow the model): count it."""


def record_figures(r: OpRecord) -> list[int]:
    return [r.calls, r.flops, r.executed_flops, *r.kinds, *r.read, *r.written]


def phase_figures(t: Trace) -> list[int]:
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
        if x is None or y is None or record_figures(x) != record_figures(y) or x.has_formula != y.has_formula:
            shown = [None if r is None else (record_figures(r), r.has_formula) for r in (x, y)]
            return (f"{key[0]} under {key[1] or 'top level'} [{key[4]}], segment {key[2]}: "
                    f"{shown[0]} vs {shown[1]} (calls, flops, executed, kinds, read, written)")
    if phase_figures(a) != phase_figures(b):
        return f"phase figures {phase_figures(a)} vs {phase_figures(b)}"
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
    at: list[int]  # figures at x0
    slope: list[int]
    fixed: bool  # nothing moves with x

    def args(self, d: int) -> tuple:
        if not any(self.num_slopes):
            return self.args0
        return with_numbers(self.args0, [n + s * d for n, s in zip(self.nums, self.num_slopes)])

    def figures(self, d: int) -> list[int]:
        return self.at if self.fixed else _line(self.at, self.slope, d)

    def record(self, d: int, figures: list[int]) -> OpRecord:
        f, (op, module, segment, dtype, has_formula, _) = figures, self.key
        return OpRecord(op, module, dtype, self.args(d), f[0], f[1], f[2], f[3:KINDS_END],
                        f[KINDS_END:KINDS_END + N_ROLES], f[KINDS_END + N_ROLES:], has_formula, segment)

    def lowest(self, d: int) -> int:
        if self.fixed:
            return 0  # counted figures, never negative
        moving = [n + s * d for n, s in zip(self.nums, self.num_slopes) if s]  # sizes, strides
        return min(_line(self.at, self.slope, d) + moving)


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
                if (line is None or line.key != key or line.args(d) != r.args
                        or line.figures(d) != record_figures(r)):
                    return False
        if next(lines, None) is not None:
            return False
        return _line(self.phase_at, self.phase_slope, d) == phase_figures(trace)

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
        return Trace(records=list(keyed.values()), compulsory_read=phase[:N_ROLES],
                     compulsory_written=phase[N_ROLES:2 * N_ROLES], kv_cache_valid_read=phase[-1],
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
    dx, lines, zeros = x1 - x0, [], [0] * (KINDS_END + 2 * N_ROLES)
    for key, recs in g0.items():
        for (r0, n0), (r1, n1) in zip(recs, g1[key]):
            f0, f1 = record_figures(r0), record_figures(r1)
            slope = zeros if f0 == f1 else _slopes(f0, f1, dx)
            num_slopes = [0] * len(n0) if n0 == n1 else _slopes(n0, n1, dx)
            lines.append(_Line(key, r0.args, n0, num_slopes, f0, slope,
                               slope is zeros and n0 == n1))
    at = phase_figures(t0)
    return StepFit(x0, lines, at, _slopes(at, phase_figures(t1), dx), t0.modules)


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
