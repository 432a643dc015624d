"""What other work on the machine does to a measurement, and what a run says of it: the
default job timed on a quiet machine and beside busy processes, on the wall clock and on the
thread's CPU clock, side by side in one run.

    python benchmarks/bench_busy_machine.py                 # 2 busy processes a core
    python benchmarks/bench_busy_machine.py --spec cal.yaml --tokens 16

Each configuration runs generate.main as `python generate.py` does (the built-in SmolLM2-135M
GGUF, one torch thread, --tokens new tokens), priced on --spec (default: this machine's default
spec), and prints per phase measured ÷ predicted, the share of the run's thread time spent
waiting for a core (perfcounter.devices.timing.CoreWait: the figure generate.py's warning
quotes), and whether the run warned. "busy": --per_core processes per core spinning on the
CPU for the whole run. The wall clock counts the waits; the thread clock leaves them out,
not the caches and memory bandwidth the busy processes share.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
from perfcounter._util import PerfcounterWarning  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices.calibration_check import load_average  # noqa: E402
from perfcounter.devices.timing import CoreWait  # noqa: E402
from perfcounter.format import format_table  # noqa: E402


def spin(stop) -> None:
    while not stop.is_set():
        pass


@contextlib.contextmanager
def busy(processes: int):
    """`processes` processes spinning on the CPU until the block ends."""
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=spin, args=(stop,), daemon=True)
             for _ in range(processes)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # running before the timing starts
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join()


def one_run(spec: str | None, clock: str, tokens: int) -> dict:
    wait = CoreWait()
    with warnings.catch_warnings(record=True) as caught, \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        result = generate.main(device_spec=spec, max_new_tokens=tokens, clock=clock, quiet=True)
    counts = result["counter"].counts
    return {"ratios": {label: s.latency / s.prediction().latency_s for label, s in counts.items()},
            "waited": wait.share(), "spec": result["counter"].device_spec.name,
            "warned": any("other work shared this machine" in str(w.message) for w in caught
                          if issubclass(w.category, PerfcounterWarning))}


def main(*, spec: str | None = None, tokens: int = 16, per_core: int = 2,
         clocks: tuple[str, ...] = ("wall", "thread"), warm_up: bool = True) -> list[dict]:
    quiet_third_party()
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if warm_up:  # the model's file read, the caches filled
        one_run(spec, "wall", 2)
    out, rows = [], []
    for condition in ("quiet", "busy"):
        with busy(per_core * cores) if condition == "busy" else contextlib.nullcontext():
            for clock in clocks:
                r = one_run(spec, clock, tokens)
                r.update(condition=condition, clock=clock, load=load_average())
                out.append(r)
                rows.append([condition, clock, f"{r['waited']:.1%}" if r["waited"] is not None
                             else "?", *(f"{r['ratios'][k]:.2f}" for k in ("prefill", "decode")),
                             "yes" if r["warned"] else "no", f"{r['load']}"])
    print(format_table(rows, ["machine", "clock", "thread time waiting for a core",
                              "prefill meas/pred", "decode meas/pred", "warned", "load after"],
                       markdown=True))
    print(f"priced on {out[0]['spec']}; {cores} CPU(s), one torch thread, {tokens} new tokens; "
          f"busy: {per_core * cores} spinning processes")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=None, help="a spec name or file (default: this machine's)")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens a run")
    ap.add_argument("--per_core", type=int, default=2, help="busy processes a core")
    a = ap.parse_args()
    for flag, v in (("--tokens", a.tokens), ("--per_core", a.per_core)):
        if v < 1:
            ap.error(f"{flag} {v}: a positive integer")
    if a.spec is not None:
        from perfcounter.devices import get_device_spec
        from perfcounter.devices.dtypes import DeviceSpecError
        try:  # a registry name or a spec file, checked before any run
            get_device_spec(a.spec)
        except (DeviceSpecError, OSError, ValueError) as e:
            ap.error(f"--spec {a.spec!r}: {e}")
    main(spec=a.spec, tokens=a.tokens, per_core=a.per_core)
