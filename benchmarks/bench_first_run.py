"""The first run a user makes, measured ÷ predicted: `python generate.py` on a machine where no
calibration is saved (the README's first set-up command), as it prices the run now (this
machine measured first, in-process: devices/this_machine.py) and, from the same counts, on
the registry's `generic-cpu` (what such a run was priced on before).

    python benchmarks/bench_first_run.py                            # the default job, 3 runs
    python benchmarks/bench_first_run.py --runs 1 -- --max_new_tokens 16 --compile
    python benchmarks/bench_first_run.py --runs 1 --busy 2          # quiet, then 2 busy processes

Each run is generate.py's own flags parsed (its defaults: the built-in SmolLM2-135M GGUF, a
128-token prompt, 128 new tokens, eager, torch's threads, wall clock) plus any given after
`--`, with $PERFCOUNTER_HOME a fresh empty folder, so that each run measures the machine anew
as a first run does. It prints, per run and phase, the measured figure generate.py reports,
the prediction on this machine measured and on generic-cpu, their ratios, the seconds the
measurement took and whether it passed its checks; then the medians, the machine's 1-minute
load before and after, and the share of the runs' thread time spent waiting for a core.

--busy N runs the same first runs again with N busy processes started beside them (each a
Python loop that never sleeps: the machine loaded on purpose), and prints each set's median
wall time, their ratio, and the load and waits of each: a first run on a busy machine stops
its measurement early (devices/this_machine.py), so it should take at most twice its quiet time.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec  # noqa: E402
from perfcounter.devices.calibration_check import load_average  # noqa: E402
from perfcounter.devices.this_machine import ENV  # noqa: E402
from perfcounter.devices.timing import CoreWait  # noqa: E402
from perfcounter.format import format_table  # noqa: E402

HEAD = ["run", "phase", "measured", "predicted, this machine", "meas/pred",
        "predicted, generic-cpu", "meas/pred, generic-cpu", "spec", "wall"]


def first_run(flags: list[str]) -> tuple[dict, str, float]:
    """({phase: (measured s, predicted s, predicted on generic-cpu s)}, the spec line, the
    run's wall seconds) of one generate.py run on a machine with no calibration saved."""
    saved = {k: os.environ.get(k) for k in ("PERFCOUNTER_HOME", ENV)}
    try:
        with tempfile.TemporaryDirectory() as home:
            os.environ["PERFCOUNTER_HOME"] = home
            os.environ.pop(ENV, None)
            out = io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(out):
                result = generate.main(**generate.keywords(
                    generate.build_parser().parse_args(flags)))
            took = time.perf_counter() - start
    finally:  # the environment as it was
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    line = next(s for s in out.getvalue().splitlines() if s.startswith("Device spec: "))
    for said in out.getvalue().splitlines():  # what the run read and wrote, as a user sees it
        if said.startswith("Prompt: "):
            print(said, flush=True)
        elif said.startswith("Generated text for sample 0: "):  # its end: what the model wrote
            print("Generated text, its last 300 characters: ..." + said[-300:], flush=True)
    phases = {}
    for label, s in result["counter"].counts.items():
        generic = get_device_spec("generic-cpu", dtype=s.device_spec.dtype)
        phases[label] = (s.latency, s.prediction().latency_s,
                         s.on(generic).prediction().latency_s)
    return phases, line, took


def main(runs: int = 3, flags: list[str] | None = None, busy: int = 0) -> list[list[str]]:
    flags = list(flags or [])
    if busy:
        quiet = first_runs(runs, flags, "quiet")
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            loaded = first_runs(runs, flags, f"{busy} busy processes beside it")
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
        print(f"\nfirst run's median wall: {quiet:.1f} s quiet, {loaded:.1f} s with {busy} busy "
              f"processes: {loaded / quiet:.2f}x")
        return []
    return first_runs(runs, flags)


def first_runs(runs: int, flags: list[str], state: str = "") -> list[list[str]] | float:
    """`runs` first runs, their table and medians printed; with `state` (busy mode) the
    median wall seconds are returned instead of the rows."""
    before, wait = load_average(), CoreWait()
    rows, ratios, walls = [], {}, []
    if state:
        print(f"\n## {state}", flush=True)
    for i in range(runs):
        phases, line, took = first_run(flags)
        walls.append(took)
        print(line, flush=True)
        spec = line.split()[2]
        for label, (measured, predicted, generic) in phases.items():
            ratios.setdefault(label, []).append((measured / predicted, measured / generic))
            rows.append([str(i + 1), label, f"{measured * 1e3:,.1f} ms",
                         f"{predicted * 1e3:,.1f} ms", f"{measured / predicted:.2f}",
                         f"{generic * 1e3:,.1f} ms", f"{measured / generic:.2f}", spec,
                         f"{took:.0f} s"])
    after, waited = load_average(), wait.share()
    print()
    print(format_table(rows, HEAD, markdown=True))
    print()
    for label, pairs in ratios.items():
        now, old = (statistics.median(p[k] for p in pairs) for k in (0, 1))
        print(f"{label}: median measured ÷ predicted {now:.2f} on this machine measured, "
              f"{old:.2f} on generic-cpu ({runs} run(s))")
    print(f"flags: {' '.join(flags) or '(defaults)'}; load {before} before, {after} after; "
          f"threads waited {'?' if waited is None else f'{waited:.1%}'} of their time; "
          f"{os.cpu_count()} CPUs")
    return statistics.median(walls) if state else rows


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="first runs, each measuring anew")
    p.add_argument("--busy", type=int, default=0, help="also run them beside N busy processes")
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if a.runs < 1 or a.busy < 0:
        p.error(f"--runs must be >= 1 and --busy >= 0, got {a.runs}, {a.busy}")
    main(a.runs, extra, a.busy)
