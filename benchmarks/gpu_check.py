"""Predictions checked on one GPU in a few minutes: calibrate, then measured ÷ predicted per
phase of the default model and a ~1B Llama-shaped config, eager, compiled and CUDA graphs.

    python benchmarks/gpu_check.py                  # one CUDA GPU, under 5 minutes
    python benchmarks/gpu_check.py --device cpu     # the same steps on the CPU, tiny: a smoke test

Steps:
1. `perfcounter calibrate` on the device (its figures written to a temporary spec file).
2. The default model (the built-in SmolLM2-135M GGUF, float weights as it executes) through
   generate.main, eager, compiled and (CUDA only) cudagraphs: measured ÷ predicted per phase,
   the measured figure being generate.py's own (uncounted runs, the device synchronized).
3. A Llama-shaped config with random weights (~1B: bench_predict.LLAMA_1B; on the CPU a tiny
   one), bfloat16 on CUDA: counted eagerly (the counter's CUDA timer: its figure is printed,
   "counted"), then timed uncounted in each regime with CUDA events (the CPU: wall clock),
   best of --repeats; decode per step.
Every prediction prices the regime that was timed (predict.py: eager / compiled /
cudagraphs). Prints one table and the device's name; nothing is fitted to what it measures.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
from bench_predict import LLAMA_1B  # noqa: E402
from perfcounter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec, load_device_specs  # noqa: E402
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated  # noqa: E402
from perfcounter.devices.calibration_check import describe_check  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.models.args import ModelArgs  # noqa: E402
from perfcounter.models.model import Transformer  # noqa: E402

TINY = dict(block_size=256, vocab_size=512, n_layer=2, n_head=4, n_local_heads=2, dim=64,
            intermediate_size=128)


def regimes(device: str) -> list[str]:
    return ["eager", "compiled"] + (["cudagraphs"] if device.startswith("cuda") else [])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int) -> float:
    """Best seconds of `repeats` calls: CUDA events on a GPU, wall clock on the CPU."""
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        best = min(best, seconds)
    return best


def default_model(spec_path: str, device: str, new_tokens: int) -> list[list[str]]:
    rows = []
    for execution in regimes(device):
        with contextlib.redirect_stdout(io.StringIO()):
            result = generate.main(device=device, device_spec=spec_path, execution=execution,
                                   max_new_tokens=new_tokens, quiet=True)
        for label, s in result["counter"].counts.items():
            p = s.prediction().latency_s
            rows.append(["SmolLM2-135M (GGUF, float weights)", execution, label,
                         f"{s.latency * 1e3:,.2f} ms", f"{p * 1e3:,.2f} ms",
                         f"{s.latency / p:.2f}", "-"])
    return rows


def llama(spec, device: str, dtype, config: dict, prompt: int, steps: int,
          repeats: int) -> list[list[str]]:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**config)).to(device=device, dtype=dtype).eval()
    model.setup_caches(1, prompt + steps + 1)
    x = torch.randint(0, config["vocab_size"], (1, prompt), device=device)
    pos = torch.arange(prompt, device=device)
    counter = TransformerPerformanceCounter(device_spec=spec)
    greedy = dict(temperature=0.0)
    with torch.no_grad():
        with counter.count("prefill", num_tokens=prompt):
            tok = generate.prefill(model, x, pos, **greedy)
        for i in range(steps):
            with counter.count("decode", num_tokens=1):
                tok = generate.decode_one_token(model, tok, torch.tensor([prompt + i],
                                                                         device=device), **greedy)
        rows = []
        name = f"Llama {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B"
        for execution in regimes(device):
            pre, dec = generate.prefill, generate.decode_one_token
            if execution != "eager":
                mode = "reduce-overhead" if execution == "cudagraphs" else None
                pre, dec = torch.compile(pre, dynamic=True), torch.compile(dec, mode=mode)
            positions = [torch.tensor([prompt + i], device=device) for i in range(steps)]

            def run_prefill():
                return pre(model, x, pos, **greedy)

            def run_decode():
                t = tok
                for p in positions:
                    t = dec(model, t, p, **greedy)
            run_prefill(), run_decode(), run_decode()  # warm-up, compilation, graph capture
            measured = {"prefill": timed(run_prefill, device, repeats),
                        "decode": timed(run_decode, device, repeats) / steps}
            for label in ("prefill", "decode"):
                s = counter.counts[label]
                per = s.steps if label == "decode" else 1
                p = s.prediction(execution).latency_s / per
                counted = "-" if execution != "eager" or s.latency is None else \
                    f"{s.latency / per * 1e3:,.2f} ms"
                rows.append([name, execution, label, f"{measured[label] * 1e3:,.2f} ms",
                             f"{p * 1e3:,.2f} ms", f"{measured[label] / p:.2f}", counted])
    return rows


def main(*, device: str = "cuda", repeats: int = 3, spec_path: str | None = None) -> list:
    t0 = time.perf_counter()
    cpu = device == "cpu"
    if cpu:
        torch.set_num_threads(1)
    if spec_path is None:
        cal = calibrate(device=device, **(dict(array_bytes=8 << 20, matmul_n=128, min_time=0.02,
                                               repeats=2, rounds=1, retries=0) if cpu else {}))
        print("\n".join(describe(cal)), flush=True)
        spec_path = str(save_calibrated(cal.to_spec("calibrated"),
                                        Path(tempfile.mkdtemp()) / "calibrated.yaml"))
    dtype = torch.float32 if cpu else torch.bfloat16
    spec = get_device_spec(load_device_specs(spec_path)[0], dtype=dtype)
    name = "CPU" if cpu else torch.cuda.get_device_name()
    print(f"device: {name}; calibration {describe_check(spec.calibration_check)}", flush=True)
    rows = [] if cpu else default_model(spec_path, device, new_tokens=16)
    rows += llama(spec, device, dtype, TINY if cpu else LLAMA_1B, prompt=16 if cpu else 128,
                  steps=2 if cpu else 8, repeats=repeats)
    head = ["model", "regime", "phase", "measured", "predicted", "meas/pred",
            "counted (CUDA timer)" if not cpu else "counted"]
    print(format_table(rows, head, markdown=True))
    print(f"\n{name}; {time.perf_counter() - t0:.0f} s in all")
    return rows


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu: a smoke test")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per phase, best kept")
    p.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    a = p.parse_args()
    if a.device != "cpu" and not torch.cuda.is_available():
        p.error("no CUDA GPU here; --device cpu runs the smoke test")
    main(device=a.device, repeats=a.repeats, spec_path=a.spec)
