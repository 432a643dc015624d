"""Timing ops on a device: the clocks, `time_calls` (host-timed, or on a GPU the kernels'
own, `kernel=True`: see op_rates.py), the CPU's cache sizes."""
from __future__ import annotations

import time
from pathlib import Path

import torch

MiB = 1 << 20
# how op times are read: wall time, the process's CPU time, or the calling thread's CPU time
# (on a machine other jobs share, with one torch thread: the time an op takes alone, without
# the waits for a core; what neighbours cannot inflate, bar the caches they share)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}


def cache_levels() -> dict[int, int]:
    """{level: bytes} of the CPU caches Linux reports for cpu0 (data and unified; empty
    when unknown)."""
    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip() if (index / "type").exists() else ""
            size = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if digits.isdigit():
            sizes[level] = max(sizes.get(level, 0), int(digits) * factor)
    return sizes


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache level Linux reports (None when unknown)."""
    sizes = cache_levels()
    return sizes[max(sizes)] if sizes else None

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

def check_clock(clock: str) -> str:
    """clock itself when it is one of CLOCKS ("auto": "thread" with one torch thread, else
    "wall"); else a ValueError naming them. The thread clock misses the work of other
    threads: it needs torch.get_num_threads() == 1."""
    if clock == "auto":
        clock = "thread" if torch.get_num_threads() == 1 else "wall"
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; valid: auto, {', '.join(CLOCKS)}")
    if clock == "thread" and torch.get_num_threads() != 1:
        raise ValueError(f"the thread clock times the calling thread only; torch runs "
                         f"{torch.get_num_threads()} threads: set one (--threads 1) or use "
                         "the wall clock")
    return clock


MAX_CALLS = 200


SPIN_CYCLES = 200_000  # the spin kernel ahead of a kernel-timed call: ~100 us at 2 GHz,
# longer than the host takes to enqueue the events and the op (~15-30 us)


def time_calls(make, device, min_time: float, clock: str = "wall", *,
               kernel: bool = False) -> float:
    """Seconds per call of the op `make()` returns (a new one per call: fresh operands):
    the 25th percentile of the calls timed in about `min_time` (at least 4, at most
    MAX_CALLS: a tiny op's figure is settled long before, and making its operands costs
    more than the call), which leaves out calls that waited for a core another process
    held. kernel=True on a GPU: the device's time of the op's kernels (CUDA events, the
    call queued behind a spin kernel: see the module doc), not the host's; elsewhere the
    same as False."""
    device = torch.device(device)
    now = CLOCKS[check_clock(clock)]
    on_device = kernel and device.type == "cuda"
    make()()  # warm-up
    times: list[float] = []
    while (sum(times) < min_time and len(times) < MAX_CALLS) or len(times) < 4:
        op = make()
        if on_device:
            times.append(kernel_seconds(op, device))
            continue
        sync(device)
        start = now()
        op()
        sync(device)
        times.append(now() - start)
    return sorted(times)[len(times) // 4]


def kernel_seconds(op, device: torch.device) -> float:
    """The device's seconds for the kernels `op()` queues on a CUDA device: between two
    events, behind a spin kernel that keeps the device busy while the host enqueues them."""
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        op()
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / 1e3
