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

from perfcounter.devices.calibration_check import (all_flags, best_of, check_record,
                                                   describe_check, load_average, spread)
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.devices.op_rates import (CLOCKS, ROW_KS, MiB, HostCosts, check_clock,
                                          fill_operands, gemv_row_seconds, kernel_time_s,
                                          last_level_cache_bytes, matmul_rows, op_curves, sync,
                                          time_calls)
from perfcounter.devices.registry import calibrated_spec_path
from perfcounter.devices.spec import ROW_DTYPES, row_key, row_table
from perfcounter.devices.spec import DeviceSpec
from perfcounter.devices.spec_file import write_device_specs
from perfcounter.devices.timing import CoreWait, check_budget

TRIAD_BYTES_PER_ELEMENT = 3 * 4  # read b, read c, write a; float32


GPU_MATMUL_N = 4096  # the square matmul's n on a GPU (CPU: 1024)


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
    best = float("inf")
    for _ in range(5):
        check_budget()
        sync(device)
        start = now()
        for _ in range(batch):
            torch.mm(x, y)
        sync(device)
        best = min(best, max(now() - start, 1e-9) / batch)
    return 2 * n**3 / best


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
                 else "best of 5 batches"))
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
            rows = ", ".join(map(str, sorted(next(iter(self.rows.values())))))
            source["matmul_rows"] = (f"{how}: x[M,K] @ W^T, W cold ({64 if gpu else 16} MiB), "
                                     f"K = {' and '.join(map(str, ROW_KS))} (times summed), "
                                     f"M = {rows}; "
                                     + ("each kernel timed on the device (CUDA events)" if gpu
                                        else f"{self.clock} clock"))
        dtype = torch.bfloat16 if torch.bfloat16 in self.flops else next(iter(self.flops))
        return DeviceSpec(device_type=torch.device(self.device).type, name=name,
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
              rounds: int = 2, retries: int = 2) -> Calibration:
    """Measure bandwidth (triad), matmul FLOP/s for each of `dtypes` and, with `curves`,
    the per-op overheads and per-class rates on `device` (15-20 s on a 2-core CPU); op times
    read from `clock` (CLOCKS; "auto": the thread's CPU time with one torch thread, else
    wall). matmul_n: the square matmul's n (None: 1024 on a CPU, GPU_MATMUL_N on a GPU).
    Every figure is measured `rounds` times, the fastest kept and the spread recorded; the
    host's fixed costs (HostCosts) are sampled after every other part as well (a slow spell of
    the host lasts seconds); figures that break calibration_check's rules are measured again
    (up to `retries` more rounds); what is still flagged, the spread and the load before and after
    land in the result's `check` (passed: no flag)."""
    device = measurable_device(device)
    clock = check_clock("wall" if clock == "auto" and device.type == "cuda" else clock)
    if array_bytes is None:
        array_bytes = default_array_bytes(device)
    if matmul_n is None:
        matmul_n = GPU_MATMUL_N if device.type == "cuda" else 1024
    if array_bytes <= 0 or repeats <= 0 or matmul_n <= 0 or min_time <= 0 or rounds < 1 \
            or retries < 0:
        raise ValueError(f"array_bytes, repeats, matmul_n, min_time and rounds must be "
                         f"positive and retries >= 0, got {array_bytes}, {repeats}, "
                         f"{matmul_n}, {min_time}, {rounds}, {retries}")
    load, wait = [load_average()], CoreWait()
    dtypes = [as_dtype(d) for d in dtypes]
    n = max(1, array_bytes // 4)
    pool = torch.full((3 * n,), 0.5, dtype=torch.float32, device=device)
    bandwidth = max(triad_bandwidth(array_bytes, repeats, device, pool, clock)
                    for _ in range(rounds))
    fill_operands(pool)
    host = HostCosts(device, clock, min(min_time, 0.1),
                     [d for d in dtypes if dtype_name(d) in ROW_DTYPES]) if curves else None
    parts = _Parts(device, dtypes, pool, matmul_n, min_time, clock, host)
    flags = parts.measure(["flops"] + (["overheads", "curves", "rows"] if curves else []),
                          rounds, retries)
    load.append(load_average())
    check = check_record(clock=clock, threads=torch.get_num_threads(), load=load,
                         flags=flags, spreads=parts.spreads, rounds=rounds, waited=wait.share(),
                         stolen=wait.stolen())
    got = parts.got
    return Calibration(device=str(device), processor=_processor(device),
                       threads=torch.get_num_threads(), array_bytes=array_bytes,
                       repeats=repeats, clock=clock, matmul_n=matmul_n, bandwidth=bandwidth,
                       flops={as_dtype(k): v for k, v in got["flops"].items()},
                       memory_bytes=_memory_bytes(device),
                       cache_bytes=_cache_bytes(device), overhead_s=got.get("overheads", {}),
                       curves=got.get("curves", {}), rows=got.get("rows", {}), check=check)


@dataclass(slots=True)
class _Parts:
    """calibrate's parts (flops; overheads, curves, rows) measured on the triad's `pool`:
    the fastest figures of each part in `got`, their spread over the rounds in `spreads`."""

    device: torch.device
    dtypes: list
    pool: torch.Tensor
    matmul_n: int
    min_time: float
    clock: str
    host: HostCosts | None  # the host's fixed costs, sampled between all parts (curves only)
    got: dict = field(default_factory=dict)
    spreads: dict = field(default_factory=dict)

    def measure(self, parts: list[str], rounds: int, retries: int) -> list[str]:
        """Each of `parts` measured `rounds` times, then those still flagged up to `retries`
        times more; returns what calibration_check still flags."""
        for part in parts:  # round 1, part by part (curves and rows use the overheads' row figures)
            self.keep(part, self.once(part))
        for _ in range(rounds - 1):  # later rounds over every part again: spread out in time, a
            for part in parts:  # busy spell of the machine slows one round, not all
                again = self.once(part)
                self.spreads.update(spread(self.got[part], again, f"{part} "))
                self.keep(part, again)
        flags = _flags(self.got, self.matmul_n, self.device)
        for _ in range(retries):  # the parts a flag names, measured again: the fastest kept
            if not flags:
                break
            for part in {_part(f) for f in flags}:
                self.keep(part, self.once(part))
            flags = _flags(self.got, self.matmul_n, self.device)
        if self.host is not None:  # the host figures' spread over all samples, not over two rounds
            self.spreads.update({f"overheads {k}": v for k, v in self.host.spread().items()})
        return flags

    def once(self, part: str) -> dict:
        """One measurement of `part`."""
        device, dtypes, pool = self.device, self.dtypes, self.pool
        min_time, clock = self.min_time, self.clock
        if part == "flops":
            return {dtype_name(d): matmul_flops(self.matmul_n, d, device, min_time, clock)
                    for d in dtypes}
        if part == "overheads":
            rows = gemv_row_seconds(pool, dtypes, device, min_time, clock)
            return {**self.host.sample(),
                    **({"kernel": kernel_time_s(device)} if device.type == "cuda" else {}),
                    **{row_key(d, m): s for d, by_m in rows.items() for m, s in by_m.items()}}
        row_s = row_table(self.got.get("overheads", {}))
        if part == "curves":
            return op_curves(pool, dtypes, device, min_time, clock, row_s)
        return matmul_rows(pool, dtypes, device, min_time, clock, row_s)

    def keep(self, part: str, again: dict) -> None:
        """The fastest of `part`'s figures so far (each host figure from the fastest of its
        timings); the host sampled after every other part, so that a slow spell of it is
        outlasted."""
        got, host = self.got, self.host
        got[part] = best_of(got[part], again, seconds=part == "overheads") if part in got \
            else again
        if host is None:
            return
        if part == "overheads":
            got[part].update(host.figures())
        else:
            host.sample()


def _flags(got: dict, matmul_n: int, device: torch.device) -> list[str]:
    return all_flags(got["flops"], got.get("overheads", {}), got.get("curves", {}),
                     got.get("rows", {}), matmul_n, launched=device.type == "cuda")


def _part(flag: str) -> str:
    """Which measurement a flag (calibration_check's wording) is about."""
    if flag.startswith("eager"):
        return "overheads"
    if " rows:" in flag:
        return "rows"
    return "flops" if flag.startswith("matmul") else "curves"


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
