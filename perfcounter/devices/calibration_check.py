"""Whether a calibration can be trusted: repeated points merged, their spread, and the
plausibility rules a measurement on a shared machine breaks.

Other jobs on the machine only ever slow an op down (a core taken, a cache flushed); they
never speed it up. So each point is measured more than once and the fastest figure kept
(`best_of`), the relative spread between the measurements is recorded (`spread`), and a
figure that contradicts the others is flagged (`flags`):

- a curve's rate far below both its neighbours (below DIP x the smaller; an end point
  below END_DIP x its one neighbour): bandwidth and FLOP/s change smoothly with the
  working set, a dip is a wait (rates under 1 MB/s or MFLOP/s on the whole curve are
  placeholders, not measured rates: indexing has no FLOPs). On a device that launches
  kernels (a GPU: `launched`) the smallest working set is exempt from the end-point rule:
  its kernel is over in the fixed few microseconds any launch takes, so its rate is a
  fraction of the next one's by physics, not by a wait (an H200: every class within
  10-15 us per call from 64 KiB to 16 MiB, rates 14x apart);
- a matmul of more rows below ROWS_DIP x the FLOP/s of fewer rows (a CPU GEMM reuses each
  weight over more rows: FLOP/s grow with rows);
- the square n x n matmul below SQUARE_DIP x the rows table's FLOP/s at n rows (the
  square matmul is the easiest shape of all);
- an eager overhead over EAGER_RATIO x the compiled one (one direct op call).

`calibrate` re-measures what is flagged; a point still flagged is left out (`drop_flagged`:
the curve or rows table without it is used, a square matmul's figure is its rows curve's at n
rows) and named in the record's `dropped`. More than MAX_DROPPED such points, an essential
figure not measured (`missing`: a budget spent first) or, on the wall clock, other work over
BUSY_SHARE of the time are `flags`: the calibration does not pass, and `default_device_spec`
never picks it. The spread, the load and the waits are recorded with it, and reported
(`describe_check`), never fatal by themselves.
"""
from __future__ import annotations

import os

from perfcounter.devices.timing import BUSY_SHARE

DIP = 1 / 3
END_DIP = 1 / 10  # the smallest sets pay a call's fixed cost: they may run well below
ROWS_DIP = 0.5
SQUARE_DIP = 0.8
EAGER_RATIO = 10.0
MAX_DROPPED = 3  # flagged points a calibration may leave out and still pass
FIELDS = ("warm GB/s", "cold GB/s", "GFLOP/s")  # a curve point's rates, after its working set
MiB = 1 << 20


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the system has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def best_of(a: dict, b: dict, *, seconds: bool = False) -> dict:
    """Two measurements of the same figures merged, the faster of each kept: curves
    ({cls: {dtype: [(ws, warm, cold, flops)]}}), rows ({dtype: {rows: FLOP/s}}), rates
    ({key: rate}) take the larger rate; `seconds` (overheads, {execution: s}) the smaller."""
    faster = min if seconds else max
    out = {}
    for key in [*a, *(k for k in b if k not in a)]:  # a's order kept
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            out[key] = x if y is None else y
        elif isinstance(x, dict):
            out[key] = best_of(x, y, seconds=seconds)
        elif isinstance(x, list):  # curve points, measured at the same working sets
            out[key] = [(p[0], *(faster(u, v) for u, v in zip(p[1:], q[1:])))
                        for p, q in zip(x, y)]
        else:
            out[key] = faster(x, y)
    return out


def spread(a: dict, b: dict, prefix: str = "") -> dict[str, float]:
    """{figure: largest relative difference between two measurements of it (0.1: 10 %)},
    per curve (class dtype), rows table (dtype) or number."""
    out = {}
    for key in sorted(a.keys() & b.keys(), key=str):
        x, y, name = a[key], b[key], f"{prefix}{key}"
        if isinstance(x, dict):
            nested = spread(x, y, name + " ")
            if nested and all(isinstance(v, (int, float)) for v in x.values()):
                out[name] = max(nested.values())  # a table: its worst point
            else:
                out.update(nested)
        elif isinstance(x, list):
            out[name] = max((_rel(u, v) for p, q in zip(x, y) for u, v in zip(p[1:], q[1:])
                             if max(u, v) >= 1e6), default=0.0)  # placeholders left out
        else:
            out[name] = _rel(x, y)
    return {k: round(v, 3) for k, v in out.items()}


def _rel(u: float, v: float) -> float:
    lo, hi = min(u, v), max(u, v)
    return 0.0 if hi <= 0 else (hi - lo) / hi if lo <= 0 else hi / lo - 1


class Flag(str):
    """A rule's flag: its text (a str, as the record keeps it), and `part` and `key`, the
    figure it names: curves (class, dtype, point index), rows (dtype, rows), flops (dtype,),
    overheads (name,)."""

    part: str
    key: tuple

    def __new__(cls, text: str, part: str, key: tuple) -> "Flag":
        flag = super().__new__(cls, text)
        flag.part, flag.key = part, key
        return flag


def curve_flags(curves: dict, launched: bool = False) -> list[str]:
    """A rate far below its neighbours on its curve (see the module doc; `launched`: the
    smallest working set is not held to its neighbour)."""
    flags = []
    for cls, by_dtype in curves.items():
        for dt, points in by_dtype.items():
            for f, name in enumerate(FIELDS, start=1):
                values = [p[f] for p in points]
                if max(values) < 1e6:
                    continue  # a class without FLOPs (indexing: 1 FLOP per call, for a rate)
                for i, v in enumerate(values):
                    if launched and i == 0:
                        continue
                    near = values[max(i - 1, 0):i] + values[i + 1:i + 2]
                    limit = (DIP if len(near) == 2 else END_DIP) * min(near) if near else 0
                    if v < limit:
                        flags.append(Flag(f"{cls} {dt} {name} at {points[i][0] / MiB:.3g} "
                                          f"MiB: {v / 1e9:.3g}, far below its neighbours "
                                          f"({', '.join(f'{n / 1e9:.3g}' for n in near)})",
                                          "curves", (cls, dt, i)))
    return flags


def rows_flags(rows: dict) -> list[str]:
    """A matmul of more rows far below the FLOP/s of fewer rows."""
    flags = []
    for dt, table in rows.items():
        best = 0.0
        for m in sorted(table):
            if table[m] < ROWS_DIP * best:
                flags.append(Flag(f"matmul {dt} {m} rows: {table[m] / 1e9:.3g} GFLOP/s, below "
                                  f"{ROWS_DIP:g} x fewer rows' {best / 1e9:.3g}", "rows",
                                  (dt, m)))
            best = max(best, table[m])
    return flags


def square_flags(flops: dict, rows: dict, n: int) -> list[str]:
    """The square n x n matmul (flops {dtype name: FLOP/s}) below its own rows curve at n rows."""
    flags = []
    for dt, value in flops.items():
        at_n = rows_at(rows.get(dt) or {}, n)
        if at_n and value < SQUARE_DIP * at_n:
            flags.append(Flag(f"matmul {dt} {n}x{n}: {value / 1e9:.3g} GFLOP/s, below "
                              f"{SQUARE_DIP:g} x its rows curve's {at_n / 1e9:.3g}", "flops",
                              (dt,)))
    return flags


def rows_at(table: dict, n: int) -> float | None:
    """A rows table's FLOP/s at n rows, or at its most rows where it ends below n."""
    return table.get(n) or (table[max(table)] if table and max(table) <= n else None)


def overhead_flags(overheads: dict) -> list[str]:
    """An eager overhead over EAGER_RATIO x the compiled one (one direct op call)."""
    eager, compiled = overheads.get("eager"), overheads.get("compiled")
    if eager and compiled and eager > EAGER_RATIO * compiled:
        return [Flag(f"eager overhead {eager * 1e6:.3g} us per op, over {EAGER_RATIO:g} x one "
                     f"compiled launch's {compiled * 1e6:.3g} us", "overheads", ("compiled",))]
    return []


def all_flags(flops: dict, overheads: dict, curves: dict, rows: dict, n: int, *,
              launched: bool = False) -> list[str]:
    """Every rule's flags on one calibration's figures (flops by dtype name); `launched`:
    a device that launches kernels (a GPU, see curve_flags)."""
    return (square_flags(flops, rows, n) + rows_flags(rows) + curve_flags(curves, launched)
            + overhead_flags(overheads))


def drop_flagged(got: dict, flags: list, n: int) -> list[str]:
    """Each flagged point left out of `got` ({flops, overheads, curves, rows}, calibrate's
    figures), the rest kept: a curve's point (the curve interpolates over it), a rows table's
    row, the compiled figures an eager overhead is held to; a square matmul's FLOP/s replaced
    by its rows curve's at n rows (rows_at). Returns what was left out, one line each."""
    dropped, points = [], {}
    for f in flags:
        if getattr(f, "part", None) == "curves":  # by curve, highest index first
            points.setdefault(f.key[:2], set()).add(f.key[2])
        elif getattr(f, "part", None) == "rows":
            got["rows"][f.key[0]].pop(f.key[1], None)
        elif getattr(f, "part", None) == "flops":
            got["flops"][f.key[0]] = rows_at(got["rows"][f.key[0]], n)
            f = Flag(f"{f}; its rows curve's figure used", f.part, f.key)
        elif getattr(f, "part", None) == "overheads":
            for name in ("compiled", "compiled_step"):
                got["overheads"].pop(name, None)
            f = Flag(f"{f}; the compiled figures left out", f.part, f.key)
        dropped.append(str(f))
    for (cls, dt), index in points.items():
        curve = got["curves"][cls][dt]
        got["curves"][cls][dt] = [p for i, p in enumerate(curve) if i not in index]
    return dropped


def check_record(*, clock: str, threads: int, load: list, flags: list[str], spreads: dict,
                 rounds: int, waited: float | None = None, stolen: float | None = None,
                 dropped=(), missing=(), stopped: str | None = None) -> dict:
    """What the calibration file records of the checks (DeviceSpec.calibration_check);
    `waited`, `stolen`: other work's share of the calibration's time (timing.CoreWait), where
    recorded. On the wall clock, a share above BUSY_SHARE is a flag: every timing counted it.
    `dropped`: the flagged points left out (drop_flagged); more than MAX_DROPPED is a flag.
    `missing`: the parts not measured, `stopped`: why (a budget spent); either is a flag."""
    flags = [str(f) for f in flags]
    busy = {"waited": waited, "stolen": stolen}
    if clock == "wall":
        flags += [f"busy: other work took {v:.0%} of the calibration's time ({k})"
                  for k, v in busy.items() if v is not None and v > BUSY_SHARE]
    if len(dropped) > MAX_DROPPED:
        flags.append(f"{len(dropped)} points fell off their curves (at most {MAX_DROPPED} "
                     f"are left out): {dropped[0]}, ...")
    if missing:
        flags.append(f"not measured ({stopped or 'stopped'}): {', '.join(missing)}")
    return {"passed": not flags, "clock": clock, "threads": threads, "rounds": rounds,
            "load": load, "flags": flags, "spread": dict(spreads),
            **{k: round(v, 4) for k, v in busy.items() if v is not None},
            **({"dropped": list(dropped)} if dropped else {}),
            **({"missing": list(missing)} if missing else {}),
            **({"stopped": stopped} if stopped else {})}


def describe_check(check: dict) -> str:
    """One line: passed or not, and why."""
    if not check:
        return "not checked (calibrated before checks were recorded)"
    load = ", ".join("?" if v is None else f"{v:g}" for v in check.get("load", []))
    spreads = check.get("spread", {})
    worst = max(spreads, key=spreads.get, default=None)
    busy = "".join(f", {k} {check[k]:.0%}" for k in ("waited", "stolen")
                   if check.get(k, 0) > BUSY_SHARE)  # other work's share, where it mattered
    head = (f"{check.get('clock')} clock, {check.get('threads')} thread(s), load {load}{busy}, "
            + (f"largest spread {spreads[worst]:.0%} ({worst})" if worst else "no spread"))
    dropped = check.get("dropped", [])
    left_out = (f"; {len(dropped)} point(s) left out, their curves used without them: "
                + "; ".join(dropped[:MAX_DROPPED])
                + (f"; and {len(dropped) - MAX_DROPPED} more" if len(dropped) > MAX_DROPPED
                   else "") if dropped else "")
    if check.get("passed"):
        return f"passed its checks ({head}){left_out}"
    flags = [f for f in check.get("flags", []) if not f.startswith("not measured")]
    missing = check.get("missing", [])
    partial = (f"; not measured ({check.get('stopped', 'stopped')}): {', '.join(missing)}"
               if missing else "")
    return (f"FAILED its checks ({head})"
            + (f": {len(flags)} flagged, e.g. {flags[0] if flags else 'unknown'}"
               if flags or not missing else "")
            + partial + left_out)
