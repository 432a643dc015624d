"""Timing ops on a device: the clocks, `time_calls` (host-timed, or on a GPU the kernels'
own, `kernel=True`: see op_rates.py), the CPU's cache sizes, how long this process's
threads waited for a core (`CoreWait`: what other work on the machine adds to a timing), and
a measurement's wall budget (`Budget`: every timing loop calls `check_budget()`, which stops
the measurement once its time is spent or other work holds the cores)."""
from __future__ import annotations

import time
from pathlib import Path

import torch

MiB = 1 << 20
# how op times are read: wall time, the process's CPU time, or the calling thread's CPU time
# (on a machine other jobs share, with one torch thread: the time an op takes alone, without
# the waits for a core; what neighbours cannot inflate, bar the caches they share)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}


def cores_waited() -> tuple[float, float] | None:
    """(seconds on a core, seconds ready to run but waiting for one) of this process's live
    threads so far, from Linux's /proc/self/task/*/schedstat; None where the system keeps
    no such record. A thread waits while other work holds every core."""
    tasks = Path("/proc/self/task")
    try:
        names = [t.name for t in tasks.iterdir()]
    except OSError:
        return None
    on = waited = 0
    for name in names:
        try:
            fields = (tasks / name / "schedstat").read_text().split()
            on, waited = on + int(fields[0]), waited + int(fields[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return on / 1e9, waited / 1e9


def cpu_ticks() -> tuple[int, int] | None:
    """(all ticks, stolen ticks) of the machine's CPUs so far, from Linux's /proc/stat:
    steal is time a virtual machine's CPUs were ready to run while its hypervisor ran
    others' (None where not recorded)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    return (sum(ticks), ticks[7]) if fields[0] == "cpu" and len(ticks) == 8 else None


class CoreWait:
    """What other work took from this process between its creation and now: `share()`, the
    part of its threads' time spent waiting for a core (0 on a machine the process has to
    itself; two busy processes beside a one-thread loop on 2 cores: 0.74 s waited beside 1.23
    s on a core, 0.38); `stolen()`, the part of the machine's CPU time its hypervisor gave
    to other machines (0 on bare metal)."""

    def __init__(self):
        self.start, self.ticks = cores_waited(), cpu_ticks()

    def share(self) -> float | None:
        """Waited / (on a core + waited) since creation; None where not recorded."""
        end = cores_waited()
        if self.start is None or end is None:
            return None
        on, waited = max(end[0] - self.start[0], 0.0), max(end[1] - self.start[1], 0.0)
        return waited / (on + waited) if on + waited > 0 else 0.0

    def stolen(self) -> float | None:
        """Stolen ticks / all ticks of the machine's CPUs since creation; None where not
        recorded."""
        end = cpu_ticks()
        if self.ticks is None or end is None:
            return None
        total, steal = end[0] - self.ticks[0], end[1] - self.ticks[1]
        return max(steal, 0) / total if total > 0 else 0.0

    def note(self) -> str | None:
        """One clause where other work took more than BUSY_SHARE of either, else None."""
        share, stolen = self.share(), self.stolen()
        parts = ([f"its threads waited {share:.0%} of their time for a core"]
                 if share is not None and share > BUSY_SHARE else []) + \
            ([f"the hypervisor gave {stolen:.0%} of the CPUs' time to other machines"]
             if stolen is not None and stolen > BUSY_SHARE else [])
        return " and ".join(parts) or None


BUSY_SHARE = 0.1  # other work's share of a timing that a report names: above noise (a quiet
# 2-core VM's generate.py run waited 0.1 % of its threads' time; with two busy processes beside
# it, 36 %)


class MeasureStopped(Exception):
    """A measurement stopped before its end: its budget spent, or the machine too busy."""


class Budget:
    """A measurement's wall budget, as a context manager: inside it `check_budget()` (which
    every timing loop here calls) raises MeasureStopped once `seconds` have passed (read from
    `clock`), or, from `settle` seconds in, once other work has taken more than `busy` of this
    process's time (CoreWait: its threads' waits for a core, or a hypervisor's steal; never
    with busy=None: a run's measurement keeps what it can and reports the waits) — a
    measurement that would fail its checks anyway stops early and says why. A Budget inside
    another stops at the earlier of the two. Outside a Budget, check_budget() does nothing."""

    def __init__(self, seconds: float, *, busy: float | None = BUSY_SHARE, settle: float = 0.5,
                 every: float = 0.25, clock=time.perf_counter):
        self.seconds, self.busy, self.settle, self.every = seconds, busy, settle, every
        self.clock = clock  # a test's fake clock spends the budget without waiting
        self.start = self.checked = 0.0
        self.wait: CoreWait | None = None
        self.outer: Budget | None = None

    def __enter__(self) -> "Budget":
        global _budget
        self.start = self.checked = self.clock()
        self.wait, self.outer, _budget = CoreWait(), _budget, self
        return self

    def __exit__(self, *exc) -> None:
        global _budget
        _budget = self.outer  # a budget inside another: the outer one in force again

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds of the budget not yet spent (never below 0)."""
        return max(self.seconds - self.elapsed(), 0.0)

    def check(self) -> None:
        if self.outer is not None:
            self.outer.check()
        now = self.clock()
        if now - self.start > self.seconds:
            raise MeasureStopped(f"its {self.seconds:g} s budget was spent")
        if self.busy is None or now - self.start < self.settle or now - self.checked < self.every:
            return
        self.checked = now
        share, stolen = self.wait.share(), self.wait.stolen()
        if share is not None and share > self.busy:
            raise MeasureStopped(f"this machine is too busy to measure: its threads waited "
                                 f"{share:.0%} of their time for a core")
        if stolen is not None and stolen > self.busy:
            raise MeasureStopped(f"this machine is too busy to measure: the hypervisor gave "
                                 f"{stolen:.0%} of the CPUs' time to other machines")


_budget: Budget | None = None  # the Budget in force (one measurement at a time)


def check_budget() -> None:
    """MeasureStopped when the Budget in force is spent or the machine too busy (Budget)."""
    if _budget is not None:
        _budget.check()


def budget_left() -> float | None:
    """Seconds left of the Budget in force (None outside one)."""
    return None if _budget is None else _budget.left()


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
STABLE = 0.05  # calls within 5 % of each other: a point that has settled
SLOW_CALL_S = 0.5  # a call this long is timed from its first (warm-up) call on: what the first
# call pays beside the op (page faults, a thread pool's start, a kernel's packing buffers) is
# small beside it, and a second call within STABLE of it settles the point (a bfloat16 1024^3
# matmul on a 2-core CPU without bfloat16 units: 5 s a call)


def settled(times: list[float], min_time: float) -> bool:
    """Whether a point timed `times` (seconds per call) is done: MAX_CALLS calls; or
    `min_time` spent and at least 4 calls, or at least 2 within STABLE of each other (fewer
    repetitions when a point is stable: a slow call is timed twice, not four times)."""
    if len(times) >= MAX_CALLS:
        return True
    if sum(times) < min_time:
        return False
    return len(times) >= 4 or (len(times) >= 2 and max(times) <= min(times) * (1 + STABLE))


SPIN_CYCLES = 200_000  # the spin kernel ahead of a kernel-timed call: ~100 us at 2 GHz,
# longer than the host takes to enqueue the events and the op (~15-30 us)
SPIN_HZ = 2e9  # the spin's cycles a second, about (a GPU's boost clock): spin_s to cycles


def time_calls(make, device, min_time: float, clock: str = "wall", *,
               kernel: bool = False, spin_s: float | None = None) -> float:
    """Seconds per call of the op `make()` returns (a new one per call: fresh operands):
    the 25th percentile of the calls timed in about `min_time` (at least 4, or 2 that agree:
    `settled`; at most MAX_CALLS: a tiny op's figure is settled long before, and making its
    operands costs more than the call), which leaves out calls that waited for a core another
    process held; a call over SLOW_CALL_S counts its warm-up. kernel=True on a GPU: the device's time of the op's kernels (CUDA events, the
    call queued behind a spin kernel: see the module doc), not the host's; elsewhere the
    same as False. spin_s: the spin's length where the host takes longer than SPIN_CYCLES
    to enqueue the op (a model's step: milliseconds), so that its kernels run back to back."""
    device = torch.device(device)
    now = CLOCKS[check_clock(clock)]
    on_device = kernel and device.type == "cuda"
    check_budget()
    sync(device)
    start = now()
    make()()  # warm-up
    sync(device)
    warm = now() - start
    times: list[float] = [warm] if warm > SLOW_CALL_S and not on_device else []
    while not settled(times, min_time):
        check_budget()
        op = make()
        if on_device:
            times.append(kernel_seconds(op, device, SPIN_CYCLES if spin_s is None
                                        else max(SPIN_CYCLES, round(spin_s * SPIN_HZ))))
            continue
        sync(device)
        start = now()
        op()
        sync(device)
        times.append(now() - start)
    return sorted(times)[len(times) // 4]


def kernel_seconds(op, device: torch.device, spin_cycles: int = SPIN_CYCLES) -> float:
    """The device's seconds for the kernels `op()` queues on a CUDA device: between two
    events, behind a spin kernel that keeps the device busy while the host enqueues them."""
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        torch.cuda._sleep(spin_cycles)
        start.record()
        op()
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / 1e3
