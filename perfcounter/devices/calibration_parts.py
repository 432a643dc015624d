"""calibrate's measurement, part by part, in the order of each part's value to a prediction.

A calibration is made of units, measured in this order in its first round:

    overheads          the host's cost per op call (eager, with the caches streamed, each
                       dtype's own) and a GEMV's cost per weight row: every op of an eager
                       run pays them (a decode step of SmolLM2-135M makes ~2,600 op calls)
    flops <dtype>      the square n x n matmul, each dtype (the peak the spec states)
    curves gemv        a decode step's weight streams
    curves elementwise the ops between the matmuls
    rows few           matmuls of 2 to FEW_ROWS rows: a prompt's linear layers
    curves attention, reduction, strided, indexing, gemm
    rows many          more rows (a long prompt's; a point over op_rates.ROWS_CAP_S ends a table)
    compiled           the compiled programs' host costs (torch.compile: seconds), where asked

then again, every unit but those over LONG_UNIT_S, in each later round (the fastest figure of
each point kept, the spread between rounds recorded: a slow spell of a shared machine slows one
round, not all),
then the units that calibration_check flags, up to `retries` times more. The host's costs are
sampled again between units (HostCosts: a host moves between speeds over seconds) at most
every HOST_EVERY_S. Every timing checks the Budget in force (timing.check_budget): where it
is spent, what finished is kept and the first round's units that did not are `missing`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from perfcounter.devices.calibration_check import all_flags, best_of, spread
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.devices.op_keys import row_key, row_table
from perfcounter.devices.op_rates import (CURVE_CLASSES, GPU_ROWS, ROWS, HostCosts,
                                          gemv_row_seconds, kernel_time_s, matmul_rows,
                                          op_curves, share_gemm)
from perfcounter.devices.timing import (CLOCKS, SLOW_CALL_S, MeasureStopped, check_budget,
                                        check_clock, settled, sync, time_calls)

FEW_ROWS = 256  # "rows few": up to this many rows (a 128-token prompt's linear layers)
# the curves in the order of their value: decode's weights, the ops between, then the rest
CURVES_FIRST, CURVES_LATER = ("gemv", "elementwise"), ("attention", "reduction", "strided",
                                                       "indexing", "gemm")
assert set(CURVES_FIRST + CURVES_LATER) == set(CURVE_CLASSES)
LONG_UNIT_S = 4.0  # a unit whose first measurement took longer is not measured again: its
# points' own repeated calls span seconds (a bfloat16 1024^3 matmul on a CPU without bfloat16
# units: two calls of 5 s), which is what a later round is for
HOST_EVERY_S = 5.0  # the host's costs sampled between units at most this often


def matmul_flops(n: int, dtype=torch.float32, device="cpu", min_time: float = 0.2,
                 clock: str = "wall") -> float:
    """Best achievable FLOP/s of an n×n @ n×n matmul in `dtype` (2·n³ FLOPs each); on a GPU
    each call's kernel timed on the device (op_rates.time_calls(kernel=True))."""
    device, dtype, now = torch.device(device), as_dtype(dtype), CLOCKS[check_clock(clock)]
    x = torch.randn(n, n, device=device).to(dtype)
    y = torch.randn(n, n, device=device).to(dtype)
    if device.type == "cuda":
        return 2 * n**3 / time_calls(lambda: lambda: torch.mm(x, y), device, min_time,
                                     kernel=True)
    sync(device)
    start = now()
    torch.mm(x, y)  # warm-up, and a first estimate of one call's time
    sync(device)
    once = max(now() - start, 1e-6)
    batch = max(1, int(min_time / 5 / once))
    times = [once] if once > SLOW_CALL_S else []  # a slow call: its warm-up counts (timing.py)
    while len(times) < 5 and not (len(times) >= 2 and settled(times, min_time)):
        check_budget()
        sync(device)
        start = now()
        for _ in range(batch):
            torch.mm(x, y)
        sync(device)
        times.append(max(now() - start, 1e-9) / batch)
    return 2 * n**3 / min(times)


def units(dtypes: list, *, curves: bool, compiled: bool) -> list[tuple[str, str]]:
    """(part, key) of every unit of a first round, in order (the module doc)."""
    first = [("overheads", "")] if curves else []
    first += [("flops", dtype_name(d)) for d in dtypes]
    if curves:
        first += [("curves", c) for c in CURVES_FIRST] + [("rows", "few")]
        first += [("curves", c) for c in CURVES_LATER] + [("rows", "many")]
        first += [("compiled", "")] if compiled else []
    return first


def unit_name(unit: tuple[str, str]) -> str:
    """How a record names a unit ("curves gemv", "flops float32", "overheads")."""
    return " ".join(p for p in unit if p)


@dataclass(slots=True)
class Parts:
    """calibrate's units measured on the triad's `pool`: the fastest figures of each part
    ({flops, overheads, curves, rows}) in `got`, their spread over the rounds in `spreads`."""

    device: torch.device
    dtypes: list
    pool: torch.Tensor
    matmul_n: int
    min_time: float
    clock: str
    host: HostCosts | None  # the host's fixed costs (curves only)
    got: dict = field(default_factory=dict)
    spreads: dict = field(default_factory=dict)
    sampled: float = 0.0  # when the host was last sampled (time.perf_counter)
    took: dict = field(default_factory=dict)  # {unit: seconds of its first measurement}
    bar: object = None  # a console.progress bar the units count on (None: none)

    def measure(self, plan: list, rounds: int, retries: int) -> tuple[list, list, str | None]:
        """Every unit of `plan` (units()) in each of `rounds`, then those still flagged up to
        `retries` times more: (what calibration_check still flags, the first round's units
        not measured, why the measurement stopped or None)."""
        done: list = []
        again = [u for u in plan if u[0] != "compiled"]  # sampled with the overheads
        if self.bar is not None:
            self.bar.reset(total=len(plan) + (rounds - 1) * len(again))
        try:
            for unit in plan:
                start = time.perf_counter()
                self.run(unit)
                self.took[unit] = time.perf_counter() - start
                done.append(unit)
            for _ in range(rounds - 1):
                for unit in again:  # a unit of over LONG_UNIT_S outlasts a slow spell itself
                    self.run(unit, again=True, skip=self.took[unit] > LONG_UNIT_S)
        except MeasureStopped as stopped:
            return self.flags(), [unit_name(u) for u in plan if u not in done], str(stopped)
        flags = self.flags()
        try:
            for _ in range(retries):  # the units a flag names, measured again: the fastest kept
                for unit in dict.fromkeys(flag_unit(f) for f in flags if flag_unit(f) in plan):
                    self.keep(unit, self.once(unit))  # not counted: the bar's total is the rounds
                flags = self.flags()
        except MeasureStopped:
            flags = self.flags()  # the retries are extra: what was measured stands
        return flags, [], None

    def flags(self) -> list:
        """calibration_check's flags on the figures so far (the host's fastest state in)."""
        if self.host is not None and self.host.samples:
            self.got.setdefault("overheads", {}).update(self.host.figures())
            self.spreads.update({f"overheads {k}": v for k, v in self.host.spread().items()})
        got = self.got
        return all_flags(got.get("flops", {}), got.get("overheads", {}), got.get("curves", {}),
                         got.get("rows", {}), self.matmul_n,
                         launched=self.device.type == "cuda")

    def once(self, unit: tuple[str, str]) -> dict:
        """One measurement of `unit`: {part's figures}."""
        part, key = unit
        device, dtypes, pool, min_time, clock = (self.device, self.dtypes, self.pool,
                                                 self.min_time, self.clock)
        if part == "flops":
            return {key: matmul_flops(self.matmul_n, next(d for d in dtypes
                                                          if dtype_name(d) == key),
                                      device, min_time, clock)}
        if part == "overheads":
            rows = gemv_row_seconds(pool, dtypes, device, min_time, clock)
            figures = self.sample()
            return {**figures, **({"kernel": kernel_time_s(device)} if device.type == "cuda"
                                  else {}),
                    **{row_key(d, m): s for d, by_m in rows.items() for m, s in by_m.items()}}
        if part == "compiled":
            self.host.add_compiled()
            return self.sample()
        row_s = row_table(self.got.get("overheads", {}))
        if part == "curves":
            return op_curves(pool, dtypes, device, min_time, clock, row_s, classes=(key,))
        few = [m for m in ROWS if m <= FEW_ROWS]
        if key == "few":
            return matmul_rows(pool, dtypes, device, min_time, clock, row_s, rows=few)
        table = self.got.get("rows", {})  # a table cut short (ROWS_CAP_S) gets no more rows
        reached = [d for d in dtypes if max(table.get(dtype_name(d), {0: 0})) >= FEW_ROWS]
        return matmul_rows(pool, reached, device, min_time, clock, row_s,
                           rows=[m for m in ROWS + GPU_ROWS if m > FEW_ROWS]) if reached else {}

    def run(self, unit: tuple[str, str], again: bool = False, skip: bool = False) -> None:
        """`unit` measured and kept (unless `skip`), named on the bar while it runs and
        counted once done."""
        if self.bar is not None:
            self.bar.set_postfix_str(unit_name(unit))
        if not skip:
            self.keep(unit, self.once(unit), again=again)
        if self.bar is not None:
            self.bar.update(1)

    def sample(self) -> dict:
        """The host's costs sampled now (HostCosts.sample)."""
        self.sampled = time.perf_counter()
        return self.host.sample()

    def keep(self, unit: tuple[str, str], figures: dict, again: bool = False) -> None:
        """A unit's figures merged into `got` (the fastest of each point kept; `again`: its
        spread against what was there recorded); the host sampled where HOST_EVERY_S has
        passed since it last was."""
        part = "overheads" if unit[0] == "compiled" else unit[0]
        have = self.got.setdefault(part, {})
        if part == "curves":  # gemm's bandwidths: the gemv curve's (share_gemm), as kept
            figures = {**figures, **({"gemv": have["gemv"]} if "gemv" not in figures
                                     and "gemv" in have else {})}
            share_gemm(figures)
            figures = {k: v for k, v in figures.items() if k == unit[1]}
        if again:
            old = {k: have[k] for k in figures if k in have}
            for name, value in spread(old, figures, f"{part} ").items():
                self.spreads[name] = max(value, self.spreads.get(name, 0.0))
        self.got[part] = best_of(have, figures, seconds=part == "overheads")
        if unit == ("curves", "gemv"):  # a gemm curve kept before it: its bandwidths anew
            share_gemm(self.got[part])
        if self.host is not None and part != "overheads" and \
                time.perf_counter() - self.sampled >= HOST_EVERY_S:
            self.sample()


def flag_unit(flag) -> tuple[str, str] | None:
    """The unit a flag (calibration_check.Flag) is about; None for a flag without a figure."""
    part, key = getattr(flag, "part", None), getattr(flag, "key", ())
    if part == "curves":
        return ("curves", key[0])
    if part == "rows":
        return ("rows", "few" if key[1] <= FEW_ROWS else "many")
    if part == "flops":
        return ("flops", key[0])
    return ("overheads", "") if part == "overheads" else None
