"""The "priced as stored" what-if beside llama.cpp itself, on this machine: the built-in GGUF
(SmolLM2-135M-Instruct Q4_1) run by llama.cpp, which reads the stored blocks, and perfcounter's
prediction of the same file priced as stored.

    pip install llama-cpp-python                 # llama.cpp's Python binding: never a dependency
    python benchmarks/bench_llama_cpp.py         # calibrate, then prompts of 16 and 128 tokens
    python benchmarks/bench_llama_cpp.py --spec cal.yaml --prompts 16 --runs 5

generate.py runs a GGUF dequantized to float32 and prices that program beside its measurement;
the file's blocks "as stored" stand on a labelled what-if line, the program a runtime that reads
them would run. This script runs such a runtime. llama.cpp (one thread, `llama_cpp.Llama.eval`)
evaluates a prompt of P tokens in one batch (the prefill) and then --steps single tokens (decode
steps at contexts P to P + steps), timed by the wall clock (one thread: the process's CPU time,
printed beside, agrees on a quiet machine); the median of --runs. perfcounter counts the same file
from its metadata (config_only.count_gguf, price_as="stored", float32 activations) at the same
lengths and predicts each phase on the calibrated spec two ways:
- as generate.py's what-if line prices it: eager, each op call at the calibrated per-call cost of
  PyTorch's dispatch;
- its work alone: no per-call cost (llama.cpp runs a graph of C++ nodes; no figure of its own per
  node is measured here).
Both price each op at the calibrated rates of PyTorch's kernels for its class (a Q4_1 GEMV as
`gemv_int4`, ...): what llama.cpp's own kernels reach is what the ratio shows.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec  # noqa: E402
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated  # noqa: E402
from perfcounter.devices.calibration_check import load_average  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.generation.config_only import count_gguf  # noqa: E402
from perfcounter.models.loading import default_checkpoint  # noqa: E402
from perfcounter.pricing.predict import predict  # noqa: E402

HEAD = ["phase", "prompt", "llama.cpp", "what-if line (eager)", "meas/pred", "work alone",
        "meas/work", "op calls", "load before / after"]


def measure(path: str, prompt: int, steps: int, runs: int) -> dict:
    """{phase: (median wall s of the phase per step, median process CPU s)} of llama.cpp."""
    from llama_cpp import Llama  # deferred: optional (llama-cpp-python, never a dependency)
    llm = Llama(model_path=path, n_ctx=prompt + steps + 8, n_threads=1, n_threads_batch=1,
                n_batch=max(prompt, 8), verbose=False)
    tokens = [1 + (i * 7919) % 40000 for i in range(prompt)]  # any ids; no sampling is timed
    wall: dict[str, list[float]] = {"prefill": [], "decode": []}
    cpu: dict[str, list[float]] = {"prefill": [], "decode": []}
    for _ in range(runs):
        llm.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        llm.eval(tokens)
        t1, c1 = time.perf_counter(), time.process_time()
        for i in range(steps):
            llm.eval([100 + i])
        t2, c2 = time.perf_counter(), time.process_time()
        wall["prefill"].append(t1 - t0), cpu["prefill"].append(c1 - c0)
        wall["decode"].append((t2 - t1) / steps), cpu["decode"].append((c2 - c1) / steps)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in wall}


def priced(spec, prompt: int, steps: int) -> dict:
    """{phase: (what-if s, work s, op calls)} per step of the file priced as stored."""
    counter = count_gguf(default_checkpoint(), price_as="stored", prompt_length=prompt,
                         new_tokens=steps + 1, dtype=torch.float32, device_spec=spec)
    bare = replace(spec, op_overhead_s={**{k: 0.0 for k in spec.op_overhead_s}, "eager": 0.0})
    out = {}
    for label, s in counter.counts.items():
        n = max(s.trace.steps, 1)
        line, work = predict(s.trace, spec, "eager"), predict(s.trace, bare, "eager")
        out[label] = (line.latency_s / n, work.latency_s / n, line.op_calls // n)
    return out


def main(*, spec_path: str | None = None, prompts=(16, 128), steps: int = 32,
         runs: int = 3) -> list[list[str]]:
    try:
        import llama_cpp  # noqa: F401  (deferred: optional)
    except ImportError:
        sys.exit("bench_llama_cpp.py: llama-cpp-python is not installed (pip install "
                 "llama-cpp-python; never a dependency of perfcounter)")
    torch.set_num_threads(1)
    if spec_path is None:
        cal = calibrate(clock="thread")
        print("\n".join(describe(cal)))
        spec_path = str(save_calibrated(cal.to_spec("calibrated"),
                                        Path(tempfile.mkdtemp()) / "calibrated.yaml"))
    spec = get_device_spec(f"{spec_path}:calibrated", dtype=torch.float32)
    path, rows = str(default_checkpoint()), []
    for prompt in prompts:
        before = load_average()
        got = measure(path, prompt, steps, runs)
        after = load_average()
        for label, (line, work, calls) in priced(spec, prompt, steps).items():
            wall, cpu = got[label]
            rows.append([label + (" step" if label == "decode" else ""), str(prompt),
                         f"{wall * 1e3:,.2f} ms (CPU {cpu * 1e3:,.2f})", f"{line * 1e3:,.2f} ms",
                         f"{wall / line:.2f}", f"{work * 1e3:,.2f} ms", f"{wall / work:.2f}",
                         f"{calls:,}", f"{before:g} / {after:g}"])
    print(format_table(rows, HEAD, markdown=True))
    print(f"\nllama.cpp {__import__('llama_cpp').__version__}, one thread; {runs} runs, "
          f"median; decode: {steps} steps after the prompt")
    return rows


if __name__ == "__main__":
    quiet_third_party()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    p.add_argument("--prompts", default="16,128", help="prompt lengths, comma-separated")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed after the prompt")
    p.add_argument("--runs", type=int, default=3, help="runs (median kept)")
    a = p.parse_args()
    try:
        lengths = [int(x) for x in a.prompts.split(",") if x.strip()]
    except ValueError:
        p.error(f"--prompts: expected comma-separated integers, got {a.prompts!r}")
    if not lengths or min(lengths) < 1 or a.steps < 1 or a.runs < 1:
        p.error(f"--prompts, --steps and --runs must be >= 1, got {a.prompts}, {a.steps}, "
                f"{a.runs}")
    main(spec_path=a.spec, prompts=lengths, steps=a.steps, runs=a.runs)
