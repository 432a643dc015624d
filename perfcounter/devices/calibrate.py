"""Measure this machine: achievable memory bandwidth and matmul FLOP/s per dtype.

Bandwidth is a STREAM-like triad, a = b + 3·c, over float32 arrays several
times larger than the last-level cache, counted as STREAM does: 2 reads + 1
write = 12 bytes per element (the write-allocate read is not counted); the
best of `repeats` runs is kept. FLOP/s is the best of a few timed batches of
n×n @ n×n matmuls, 2·n³ FLOPs each. These are achievable figures, not peaks:
a utilization measured against them says how close a run came to what this
machine really does.

The result is a DeviceSpec, written (atomically) to calibrated_spec_path()
so that `get_device_spec("calibrated")` and default_device_spec() find it.
"""
from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from perfcounter.devices.registry import calibrated_spec_path
from perfcounter.devices.schema import write_device_specs
from perfcounter.devices.spec import DeviceSpec, as_dtype, dtype_name

MiB = 1 << 20
TRIAD_BYTES_PER_ELEMENT = 3 * 4  # read b, read c, write a; float32


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache level Linux reports (None when unknown)."""
    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if digits.isdigit():
            sizes[level] = int(digits) * factor
    return sizes[max(sizes)] if sizes else None


def default_array_bytes() -> int:
    """Each triad array: 4 × the last-level cache, at least 64 MiB."""
    return max(64 * MiB, 4 * (last_level_cache_bytes() or 0))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def triad_bandwidth(array_bytes: int, repeats: int = 10, device="cpu") -> float:
    """Best achievable B/s of a = b + 3·c over three float32 arrays of `array_bytes` each."""
    device = torch.device(device)
    n = max(1, array_bytes // 4)
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.rand(n, dtype=torch.float32, device=device)
    c = torch.rand(n, dtype=torch.float32, device=device)
    torch.add(b, c, alpha=3.0, out=a)  # warm-up: page faults, thread pool
    best = float("inf")
    for _ in range(max(1, repeats)):
        _sync(device)
        start = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return n * TRIAD_BYTES_PER_ELEMENT / best


def matmul_flops(n: int, dtype=torch.float32, device="cpu", min_time: float = 0.2) -> float:
    """Best achievable FLOP/s of an n×n @ n×n matmul in `dtype` (2·n³ FLOPs each)."""
    device, dtype = torch.device(device), as_dtype(dtype)
    x = torch.randn(n, n, device=device).to(dtype)
    y = torch.randn(n, n, device=device).to(dtype)
    _sync(device)
    start = time.perf_counter()
    torch.mm(x, y)  # warm-up, and a first estimate of one call's time
    _sync(device)
    once = max(time.perf_counter() - start, 1e-6)
    batch = max(1, int(min_time / 5 / once))
    best = float("inf")
    for _ in range(5):
        _sync(device)
        start = time.perf_counter()
        for _ in range(batch):
            torch.mm(x, y)
        _sync(device)
        best = min(best, (time.perf_counter() - start) / batch)
    return 2 * n**3 / best


@dataclass
class Calibration:
    """What one `perfcounter calibrate` run measured, and how."""

    device: str
    processor: str
    threads: int
    array_bytes: int
    repeats: int
    matmul_n: int
    bandwidth: float  # B/s
    flops: dict  # dtype -> FLOP/s
    memory_bytes: int | None

    def to_spec(self, name: str = "calibrated") -> DeviceSpec:
        when = datetime.date.today().isoformat()
        how = (f"measured by `perfcounter calibrate` on {platform.node() or 'this machine'} "
               f"({self.processor}, {self.threads} threads, torch {torch.__version__}), {when}")
        triad = (f"{how}: STREAM-like triad a = b + 3*c over 3 x {self.array_bytes / MiB:g} MiB "
                 f"float32 arrays, best of {self.repeats}, 12 B per element")
        mm = f"{how}: best of 5 batches of {self.matmul_n}^3 matmuls, 2*n^3 FLOPs each"
        source = {"bandwidth": triad, "flops_by_dtype": mm}
        if self.memory_bytes:
            source["vram"] = f"{how}: total memory reported by the system"
        dtype = torch.bfloat16 if torch.bfloat16 in self.flops else next(iter(self.flops))
        return DeviceSpec(device_type=torch.device(self.device).type, name=name,
                          bandwidth=self.bandwidth, vram=self.memory_bytes, dtype=dtype,
                          flops_by_dtype=dict(self.flops), source=source)


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


def measurable_device(device) -> torch.device:
    """`device` as a torch.device that calibrate can time here: the CPU, or a CUDA
    (ROCm) GPU that is present; anything else is a ValueError naming what is valid."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    valid = ", ".join(["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(gpus)] if gpus else []))
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        parsed = None
    if parsed is not None and parsed.type == "cuda" and not gpus:
        raise ValueError(f"cannot calibrate device {str(device)!r}: no CUDA GPU is available "
                         f"here (valid: {valid})")
    if parsed is None or parsed.type not in ("cpu", "cuda") or (
            parsed.type == "cuda" and (parsed.index or 0) >= gpus):
        raise ValueError(f"cannot calibrate device {str(device)!r}; valid: {valid}")
    return parsed


def calibrate(*, device="cpu", array_bytes: int | None = None, repeats: int = 10,
              matmul_n: int = 1024, dtypes=("float32", "bfloat16"),
              min_time: float = 0.2) -> Calibration:
    """Measure bandwidth (triad) and matmul FLOP/s for each of `dtypes` on `device`."""
    device = measurable_device(device)
    if array_bytes is None:
        array_bytes = default_array_bytes()
    if array_bytes <= 0 or repeats <= 0 or matmul_n <= 0 or min_time <= 0:
        raise ValueError(f"array_bytes, repeats, matmul_n and min_time must be positive, got "
                         f"{array_bytes}, {repeats}, {matmul_n}, {min_time}")
    flops = {as_dtype(d): matmul_flops(matmul_n, d, device, min_time) for d in dtypes}
    return Calibration(device=str(device), processor=_processor(device),
                       threads=torch.get_num_threads(), array_bytes=array_bytes,
                       repeats=repeats, matmul_n=matmul_n,
                       bandwidth=triad_bandwidth(array_bytes, repeats, device),
                       flops=flops, memory_bytes=_memory_bytes(device))


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
    return lines
