"""The default job, measured ÷ predicted: `python generate.py --device_spec calibrated` as a
new user runs it (the built-in SmolLM2-135M GGUF, dequantized at load: float32 weights),
eager and compiled, batch 1 and 4, prompts of 5 to 512 tokens.

    python benchmarks/bench_default_job.py                  # calibrate, then every configuration
    python benchmarks/bench_default_job.py --spec cal.yaml  # an existing calibration file
    python benchmarks/bench_default_job.py --runs 3 --quick # batch 1, 5-token prompt only

First `perfcounter calibrate` runs (one thread, the thread's CPU clock; it never sees the
runs below) unless --spec names a calibration. Then each configuration is run --runs times
through generate.main itself (counted once eagerly, then timed uncounted: the measured
figure generate.py reports, the one every table shows), one torch thread, timed by the
thread's CPU clock (`clock="thread"`: what the other jobs of a shared machine cannot
inflate, bar the memory bandwidth and caches they share). Per configuration and phase it
prints the median of the runs' measured ÷ predicted (the prediction of the program that
ran: eager or compiled, float32 weights), its range, the machine's 1-minute load before
and after, and the share of the runs' thread time spent waiting for a core (timing.CoreWait:
other work on the machine, measured; the thread clock leaves the waits out, not the caches
and memory bandwidth that work shares). Decode is the whole phase (every step, sampling included).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated  # noqa: E402
from perfcounter.devices.calibration_check import describe_check, load_average  # noqa: E402
from perfcounter.devices.timing import CoreWait  # noqa: E402
from perfcounter.format import format_table  # noqa: E402

# (prompt tokens: None = the default text prompt, 5 tokens; batch; execution)
CONFIGS = [(None, 1, "eager"), (None, 1, "compiled"), (None, 4, "eager"), (None, 4, "compiled"),
           (128, 1, "eager"), (512, 1, "eager"), (512, 1, "compiled")]
QUICK = CONFIGS[:2]


def one_run(spec_path: str, prompt: int | None, batch: int, execution: str,
            new_tokens: int) -> dict:
    """{phase: (measured s, predicted s)} of one generate.main run."""
    with contextlib.redirect_stdout(io.StringIO()):
        result = generate.main(device_spec=spec_path, prompt_length=prompt, batch_size=batch,
                               execution=execution, max_new_tokens=new_tokens, clock="thread",
                               quiet=True)
    return {label: (s.latency, s.prediction().latency_s)
            for label, s in result["counter"].counts.items()}


def main(*, spec_path: str | None = None, runs: int = 3, quick: bool = False,
         new_tokens: int = 32) -> list[list[str]]:
    torch.set_num_threads(1)
    if spec_path is None:
        t0 = time.perf_counter()
        cal = calibrate(clock="thread")
        print("\n".join(describe(cal)))
        spec_path = str(save_calibrated(cal.to_spec("calibrated"),
                                        Path(tempfile.mkdtemp()) / "calibrated.yaml"))
        print(f"calibration: {time.perf_counter() - t0:.1f} s", flush=True)
    else:
        from perfcounter.devices import load_device_specs
        print(f"calibration {spec_path}: "
              f"{describe_check(load_device_specs(spec_path)[0].calibration_check)}")
    rows = []
    for prompt, batch, execution in (QUICK if quick else CONFIGS):
        before, wait = load_average(), CoreWait()
        ratios: dict[str, list[float]] = {}
        times: dict[str, list[tuple[float, float]]] = {}
        for _ in range(runs):
            for label, (measured, predicted) in one_run(spec_path, prompt, batch, execution,
                                                        new_tokens).items():
                ratios.setdefault(label, []).append(measured / predicted)
                times.setdefault(label, []).append((measured, predicted))
        after, waited = load_average(), wait.share()
        for label, values in ratios.items():
            m = statistics.median(values)
            measured, predicted = statistics.median(t[0] for t in times[label]), \
                statistics.median(t[1] for t in times[label])
            rows.append([str(prompt or "5 (text)"), str(batch), execution, label,
                         f"{measured * 1e3:,.1f} ms", f"{predicted * 1e3:,.1f} ms", f"{m:.2f}",
                         f"{min(values):.2f}-{max(values):.2f}", f"{before:g} / {after:g}",
                         "?" if waited is None else f"{waited:.1%}"])
        print(format_table(rows[-len(ratios):], HEAD, markdown=True).split("\n", 2)[-1],
              flush=True)
    print()
    print(format_table(rows, HEAD, markdown=True))
    held = sum(0.8 <= float(r[6]) <= 1.25 for r in rows)
    print(f"\nwithin 0.8-1.25: {held} of {len(rows)} (median of {runs} runs each); "
          f"{os.cpu_count()} CPUs, one torch thread, thread CPU clock")
    return rows


HEAD = ["prompt", "batch", "run", "phase", "measured", "predicted", "meas/pred (median)",
        "range", "load before / after", "threads waited"]


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    p.add_argument("--runs", type=int, default=3, help="runs per configuration (median kept)")
    p.add_argument("--new_tokens", type=int, default=32, help="tokens generated per run")
    p.add_argument("--quick", action="store_true", help="batch 1, the 5-token prompt only")
    a = p.parse_args()
    if a.runs < 1 or a.new_tokens < 2:
        p.error(f"--runs must be >= 1 and --new_tokens >= 2, got {a.runs}, {a.new_tokens}")
    main(spec_path=a.spec, runs=a.runs, quick=a.quick, new_tokens=a.new_tokens)
