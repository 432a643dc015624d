"""Measure this machine: bandwidth, matmul FLOP/s, and (op_rates.py) the rates predictions use.

Bandwidth is a STREAM-like triad, a = b + 3·c, over three float32 arrays that
together exceed the last-level cache (a GPU's L2), counted as STREAM does: 2 reads + 1
write = 12 bytes per element (the write-allocate read is not counted); the
best of `repeats` runs is kept. FLOP/s is the best of a few timed batches of
n×n @ n×n matmuls, 2·n³ FLOPs each (on a GPU each call's kernel timed on the device, n = 4096
by default: a 1024³ matmul is a few microseconds there, below a launch from Python). These
are achievable figures, not peaks.

Rates for predictions (op_curves, matmul_rows, op_overhead_s) are measured in
op_rates.py.

The result is a DeviceSpec, written (atomically) to calibrated_spec_path().
"""
from __future__ import annotations

import datetime
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from perfcounter import console
from perfcounter.devices.calibration_check import (check_record, describe_check,
                                                   drop_flagged, load_average)
from perfcounter.devices.calibration_parts import (Parts, matmul_flops,  # noqa: F401
                                                   unit_name, units)
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.devices.op_rates import (CLOCKS, ROW_KS, MiB, HostCosts, check_clock,
                                          fill_operands, last_level_cache_bytes, sync)
from perfcounter.devices.registry import calibrated_spec_path
from perfcounter.devices.spec import ROW_DTYPES
from perfcounter.devices.spec import DeviceSpec
from perfcounter.devices.spec_file import write_device_specs
from perfcounter.devices.timing import Budget, CoreWait, MeasureStopped, check_budget

TRIAD_BYTES_PER_ELEMENT = 3 * 4  # read b, read c, write a; float32


GPU_MATMUL_N = 4096  # the square matmul's n on a GPU (CPU: 1024)
BUDGET_S = 55.0  # a calibration's wall budget: `perfcounter calibrate` within a minute; on a
# quiet 2-core CPU all of it fits (float32 and bfloat16, every part twice)


def default_array_bytes(device="cpu") -> int:
    """Each triad array: on a CPU half the last-level cache (the three together 1.5x it);
    on a GPU 6x its L2 (the op curves' largest working set, a quarter of the three, then
    streams from memory: 128 MiB on an H100 or H200); at least 64 MiB, at most 1 GiB."""
    device = torch.device(device)
    cache = 6 * (_cache_bytes(device) or 0) if device.type == "cuda" \
        else (last_level_cache_bytes() or 0) // 2
    return min(1024 * MiB, max(64 * MiB, cache))


def triad_bandwidth(array_bytes: int, repeats: int = 10, device="cpu", pool=None,
                    clock: str = "wall") -> float:
    """Best achievable B/s of a = b + 3·c over three float32 arrays of `array_bytes` each
    (the thirds of `pool`, a float32 tensor, when given), timed by `clock` (CLOCKS)."""
    device, now = torch.device(device), CLOCKS[check_clock(clock)]
    n = max(1, array_bytes // 4)
    if pool is None:
        pool = torch.rand(3 * n, dtype=torch.float32, device=device)
    a, b, c = pool[:n], pool[n:2 * n], pool[2 * n:3 * n]
    torch.add(b, c, alpha=3.0, out=a)  # warm-up: page faults, thread pool
    best = float("inf")
    for _ in range(max(1, repeats)):
        check_budget()
        sync(device)
        start = now()
        torch.add(b, c, alpha=3.0, out=a)
        sync(device)
        best = min(best, now() - start)
    return n * TRIAD_BYTES_PER_ELEMENT / max(best, 1e-9)


@dataclass
class Calibration:
    """What one `perfcounter calibrate` run measured, and how."""

    device: str
    processor: str
    threads: int
    array_bytes: int
    repeats: int
    clock: str
    matmul_n: int
    bandwidth: float  # B/s
    flops: dict  # dtype -> FLOP/s
    memory_bytes: int | None
    cache_bytes: int | None = None
    overhead_s: dict = field(default_factory=dict)  # execution -> s per op call
    curves: dict = field(default_factory=dict)  # see op_curves()
    rows: dict = field(default_factory=dict)  # see matmul_rows()
    check: dict = field(default_factory=dict)  # calibration_check.check_record()

    def to_spec(self, name: str = "calibrated") -> DeviceSpec:
        when = datetime.date.today().isoformat()
        how = (f"measured by `perfcounter calibrate` on {platform.node() or 'this machine'} "
               f"({self.processor}, {self.threads} threads, torch {torch.__version__}), {when}")
        triad = (f"{how}: STREAM-like triad a = b + 3*c over 3 x {self.array_bytes / MiB:g} MiB "
                 f"float32 arrays, best of {self.repeats}, 12 B per element")
        mm = (f"{how}: {self.matmul_n}^3 matmuls, 2*n^3 FLOPs each, "
              + ("each kernel timed on the device, 25th percentile" if self.device.startswith("cuda")
                 else "best of up to 5 batches (2 that agree within 5 %)"))
        source = {"bandwidth": triad, "flops_by_dtype": mm}
        if self.memory_bytes:
            source["vram"] = f"{how}: total memory reported by the system"
        if self.cache_bytes:
            source["cache_bytes"] = f"{how}: largest cache level in /sys/devices/system/cpu"
        if self.overhead_s:
            compiled = ("a tiny transformer's compiled decode step at 2 and 8 layers: the "
                        "extra time over the extra kernel launches the compiled regime "
                        "charges (costs.compiled_launches), compiled_step = the rest of the "
                        "shallow step" + ("; compiled_dynamic(_step) = the same of the tiny "
                                          "prefill compiled for any prompt length, at 8 tokens"
                                          "; cudagraphs = one CUDA graph's replay and sync; "
                                          "kernel = a CUDA graph of 64 tiny kernels replayed, "
                                          "device time / 64"
                                          if self.device.startswith("cuda") else ""))
            source["op_overhead_s"] = (f"{how}: eager = a tiny transformer's decode step / "
                                       f"the op calls counted in it (eager_cold: with a "
                                       f"stream of 4x L2 before each linear; eager_<dtype>: the "
                                       f"step in that dtype); compiled = {compiled}; "
                                       f"gemv_row_<dtype> = a GEMV's time per weight row "
                                       f"(K = 256 vs 4096, same bytes); the host's figures "
                                       f"from the fastest of samples taken between all parts; "
                                       f"{self.clock} clock")
        if self.curves:
            timing = ("each kernel timed on the device (CUDA events)"
                      if self.device.startswith("cuda") else f"{self.clock} clock")
            source["op_curves"] = (f"{how}: a representative op per class timed warm and cold "
                                   f"(operands rotated through the triad's arrays), {timing}; "
                                   "see perfcounter/devices/op_rates.py")
        if self.rows:
            gpu = self.device.startswith("cuda")
            rows = "; ".join(f"{dt} {', '.join(map(str, sorted(t)))}"
                             for dt, t in self.rows.items())
            source["matmul_rows"] = (f"{how}: x[M,K] @ W^T, W cold ({64 if gpu else 16} MiB), "
                                     f"K = {' and '.join(map(str, ROW_KS))} (times summed), "
                                     f"M = {rows}; "
                                     + ("each kernel timed on the device (CUDA events)" if gpu
                                        else f"{self.clock} clock"))
        unmeasured = [u.split()[1] for u in self.check.get("missing", [])
                      if u.startswith("curves ")]
        if unmeasured:  # priced at the measured figures themselves: said so, no warning
            source["op_efficiency"] = (f"{how}: {', '.join(unmeasured)} not measured "
                                       f"({self.check.get('stopped', 'stopped')}): the measured "
                                       "triad bandwidth and matmul FLOP/s")
        dtype = torch.bfloat16 if torch.bfloat16 in self.flops else next(iter(self.flops))
        return DeviceSpec(device_type=torch.device(self.device).type, name=name,
                          op_efficiency={c: 1.0 for c in unmeasured},
                          bandwidth=self.bandwidth, vram=self.memory_bytes, dtype=dtype,
                          flops_by_dtype=dict(self.flops), source=source,
                          cache_bytes=self.cache_bytes, op_overhead_s=dict(self.overhead_s),
                          op_curves=self.curves, matmul_rows=self.rows,
                          calibration_check=dict(self.check))


def _processor(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cache_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None) or None
    return last_level_cache_bytes()


def measurable_device(device, purpose: str = "calibrate") -> torch.device:
    """`device` as a torch.device that calibrate (or `purpose`) can time here: the CPU, or
    a CUDA (ROCm) GPU that is present; anything else is a ValueError naming what is valid."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    valid = ", ".join(["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(gpus)] if gpus else []))
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        parsed = None
    if parsed is not None and parsed.type == "cuda" and not gpus:
        raise ValueError(f"cannot {purpose} device {str(device)!r}: no CUDA GPU is available "
                         f"here (valid: {valid})")
    if parsed is None or parsed.type not in ("cpu", "cuda") or (
            parsed.type == "cuda" and (parsed.index or 0) >= gpus):
        raise ValueError(f"cannot {purpose} device {str(device)!r}; valid: {valid}")
    return parsed


def calibrate(*, device="cpu", array_bytes: int | None = None, repeats: int = 10,
              matmul_n: int | None = None, dtypes=("float32", "bfloat16"),
              min_time: float = 0.2, curves: bool = True, clock: str = "auto",
              rounds: int = 2, retries: int = 2, compiled: bool = True,
              budget_s: float | None = None, progress: bool | None = None) -> Calibration:
    """Measure bandwidth (triad), matmul FLOP/s for each of `dtypes` and, with `curves`,
    the per-op overheads and per-class rates on `device`, within `budget_s` seconds (a
    timing.Budget; None: BUDGET_S on a CPU, none on a GPU; inf: none); op times read from `clock` (CLOCKS; "auto": the thread's CPU
    time with one torch thread, else wall). matmul_n: the square matmul's n (None: 1024 on a
    CPU, GPU_MATMUL_N on a GPU). `compiled`: also the compiled programs' host costs (seconds
    of torch.compile; an eager run's measurement leaves them out). The parts are measured in
    the order of their value (calibration_parts.py), every figure `rounds` times, the fastest
    kept and the spread recorded; figures that break calibration_check's rules are measured
    again (up to `retries` more rounds), and what is still flagged is left out
    (drop_flagged). Where the budget is spent first, what finished is kept and the rest
    named `missing` in the result's `check` (passed: no flag); MeasureStopped only where not
    even the triad finished. `progress`: a bar of the parts on stderr (console.progress;
    None: where stderr is a terminal)."""
    device = measurable_device(device)
    clock = check_clock("wall" if clock == "auto" and device.type == "cuda" else clock)
    if array_bytes is None:
        array_bytes = default_array_bytes(device)
    if matmul_n is None:
        matmul_n = GPU_MATMUL_N if device.type == "cuda" else 1024
    if array_bytes <= 0 or repeats <= 0 or matmul_n <= 0 or min_time <= 0 or rounds < 1 \
            or retries < 0 or (budget_s is not None and not budget_s > 0):  # NaN too
        raise ValueError(f"array_bytes, repeats, matmul_n, min_time, rounds and budget_s must "
                         f"be positive and retries >= 0, got {array_bytes}, {repeats}, "
                         f"{matmul_n}, {min_time}, {rounds}, {budget_s}, {retries}")
    load, wait, dtypes = [load_average()], CoreWait(), [as_dtype(d) for d in dtypes]
    if budget_s is None:
        budget_s = float("inf") if device.type == "cuda" else BUDGET_S
    with Budget(budget_s, busy=None), console.progress(
            desc="measuring this machine", unit="part", quiet=progress is False) as bar:
        n = max(1, array_bytes // 4)
        pool = torch.full((3 * n,), 0.5, dtype=torch.float32, device=device)
        bandwidth = max(triad_bandwidth(array_bytes, repeats, device, pool, clock)
                        for _ in range(rounds))
        fill_operands(pool)
        try:
            host = HostCosts(device, clock, min(min_time, 0.1),
                             [d for d in dtypes if dtype_name(d) in ROW_DTYPES],
                             compiled=False) if curves else None
        except MeasureStopped:
            host = None
        parts = Parts(device, dtypes, pool, matmul_n, min_time, clock, host, bar=bar)
        plan = units(dtypes, curves=curves, compiled=compiled)
        cut = [] if host or not curves else [unit_name(u) for u in plan if u[0] != "flops"]
        flags, missing, stopped = parts.measure([u for u in plan if unit_name(u) not in cut],
                                                rounds, retries)
    if cut:  # the host's timers not even built: none of the parts that need them measured
        missing, stopped = cut + missing, f"its {budget_s:g} s budget was spent"
    got = parts.got
    dropped = drop_flagged(got, flags, matmul_n)
    load.append(load_average())
    check = check_record(clock=clock, threads=torch.get_num_threads(), load=load, flags=[],
                         spreads=parts.spreads, rounds=rounds, waited=wait.share(),
                         stolen=wait.stolen(), dropped=dropped, missing=missing,
                         stopped=stopped)
    return Calibration(device=str(device), processor=_processor(device),
                       threads=torch.get_num_threads(), array_bytes=array_bytes,
                       repeats=repeats, clock=clock, matmul_n=matmul_n, bandwidth=bandwidth,
                       flops={as_dtype(k): v for k, v in got.get("flops", {}).items()},
                       memory_bytes=_memory_bytes(device),
                       cache_bytes=_cache_bytes(device), overhead_s=got.get("overheads", {}),
                       curves=got.get("curves", {}), rows=got.get("rows", {}), check=check)


def save_calibrated(spec: DeviceSpec, path=None) -> Path:
    """Write `spec` into the calibrated file (other entries there are kept; a file
    that no longer loads is replaced, and kept beside as NAME.corrupt, with a warning)."""
    path = Path(path) if path is not None else calibrated_spec_path()
    header = ("This machine's figures, measured by `perfcounter calibrate`; rerun it to\n"
              "update. Entries are found by name: get_device_spec(NAME).")
    return write_device_specs(path, [spec], header=header)


def describe(cal: Calibration) -> list[str]:
    """Lines for the console."""
    lines = [f"device: {cal.device} ({cal.processor}, {cal.threads} threads)",
             f"memory bandwidth, triad over 3 x {cal.array_bytes / MiB:g} MiB: "
             f"{cal.bandwidth / 1e9:.2f} GB/s"]
    for dtype, value in cal.flops.items():
        lines.append(f"matmul {dtype_name(dtype)} {cal.matmul_n}x{cal.matmul_n}: "
                     f"{value / 1e9:.1f} GFLOP/s")
    for execution, seconds in cal.overhead_s.items():
        if execution.startswith("gemv_row"):
            lines.append(f"GEMV, per weight row, {execution}: {seconds * 1e9:.0f} ns")
        else:
            unit = {"compiled": "per kernel launch", "compiled_step": "per compiled step",
                    "compiled_dynamic": "per kernel launch, a program for any input length",
                    "compiled_dynamic_step": "per step, a program for any input length",
                    "cudagraphs": "per CUDA graph launch",
                    "kernel": "per kernel, device time"}.get(execution, "per op call")
            lines.append(f"overhead {unit}, {execution}: {seconds * 1e6:.2f} us")
    for cls, by_dtype in cal.curves.items():
        for dt, points in by_dtype.items():
            cells = ", ".join(f"{w / MiB:g} MiB {a / 1e9:.1f}/{b / 1e9:.1f} GB/s "
                              f"{f / 1e9:.0f} GFLOP/s" for w, a, b, f in points)
            lines.append(f"{cls} {dt} (warm/cold): {cells}")
    for dt, table in cal.rows.items():
        cells = ", ".join(f"{m}: {f / 1e9:.0f}" for m, f in table.items())
        lines.append(f"matmul {dt} by rows, GFLOP/s: {cells}")
    lines.append(f"calibration {describe_check(cal.check)}")
    lines += [f"  flagged: {f}" for f in cal.check.get("flags", [])[1:]]
    return lines
