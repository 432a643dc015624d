"""Where a compiled decode step's time goes on this machine, beside its prediction: the evidence
behind pricing a compiled step's entry (Dynamo's guards, the wrapper) on a CPU as on a GPU.

    python benchmarks/bench_compiled_host.py            # the default model (SmolLM2-135M GGUF)
    python benchmarks/bench_compiled_host.py --spec cal.yaml --steps 5

One torch thread. Calibrates (or reads --spec), loads the built-in default model as generate.py
runs it (float32 weights, dequantized at load), counts one decode step at a 5-token prompt,
predicts it eager and compiled, then times the step both ways (the thread's CPU clock, median of
15) and runs --steps compiled steps under torch.profiler: the seconds a step of the matmuls
(aten::mm), of attention, of the compiled graph's own code (its fused kernels and wrapper) and of
Dynamo's cache lookup (the guards checked before each step).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import generate  # noqa: E402
from perfcounter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec, load_device_specs  # noqa: E402
from perfcounter.devices.calibrate import calibrate, save_calibrated  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.models.loading import default_checkpoint, load_model  # noqa: E402
from perfcounter.pricing.predict import predict  # noqa: E402

PROMPT = 5
PARTS = {"matmuls (aten::mm)": ("aten::mm",),
         "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                       "aten::_scaled_dot_product_flash_attention"),
         "compiled graph's own code": ("## Call CompiledFxGraph",),
         "Dynamo's cache lookup (guards)": ("TorchDynamo Cache Lookup",)}


def thread_ms(step, runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        t0 = time.thread_time()
        step()
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def main(spec_path: str | None = None, steps: int = 5) -> dict:
    torch.set_num_threads(1)
    if spec_path is None:
        spec_path = str(save_calibrated(calibrate().to_spec("calibrated"),
                                        Path(tempfile.mkdtemp()) / "calibrated.yaml"))
    spec = get_device_spec(load_device_specs(spec_path)[0], dtype=torch.float32)
    model = load_model(default_checkpoint(), price_as="executed").model.eval()
    model.setup_caches(1, PROMPT + 16)
    x = torch.arange(1, PROMPT + 1).unsqueeze(0)
    greedy = dict(temperature=0.0)
    out = {}
    with torch.no_grad():
        tok = generate.prefill(model, x, torch.arange(PROMPT), **greedy)
        pos = torch.tensor([PROMPT])
        counter = TransformerPerformanceCounter(device_spec=spec)
        with counter.count("decode", num_tokens=1):
            generate.decode_one_token(model, tok, pos, **greedy)
        trace = counter.counts["decode"].trace
        compiled = torch.compile(generate.decode_one_token)
        rows = []
        for execution, step in (("eager", generate.decode_one_token), ("compiled", compiled)):
            for _ in range(3):
                step(model, tok, pos, **greedy)
            p = predict(trace, spec, execution)
            measured = thread_ms(lambda step=step: step(model, tok, pos, **greedy))
            out[execution] = {"measured_ms": measured, "predicted_ms": p.latency_s * 1e3,
                              "overhead_ms": p.overhead_s * 1e3, "kernels": p.op_calls}
            rows.append([execution, f"{measured:.2f} ms", f"{p.latency_s * 1e3:.2f} ms",
                         f"{measured / (p.latency_s * 1e3):.2f}",
                         f"{p.overhead_s * 1e3:.2f} ms for {p.op_calls:,} calls"])
        print(format_table(rows, ["decode step", "measured", "predicted", "meas/pred",
                                  "of it, fixed costs"], markdown=True))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                compiled(model, tok, pos, **greedy)
    self_us = {}
    for e in prof.key_averages():
        for part, names in PARTS.items():
            if e.key.startswith(names):
                self_us[part] = self_us.get(part, 0.0) + e.self_cpu_time_total
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    rows = [[part, f"{self_us.get(part, 0.0) / steps / 1e3:.2f} ms"] for part in PARTS]
    rows.append(["everything else", f"{(total - sum(self_us.values())) / steps / 1e3:.2f} ms"])
    print(format_table(rows, ["compiled decode step, under torch.profiler", "self time a step"],
                       markdown=True))
    out["profile_ms"] = {part: self_us.get(part, 0.0) / steps / 1e3 for part in PARTS}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    ap.add_argument("--steps", type=int, default=5, help="compiled steps profiled")
    a = ap.parse_args()
    if a.steps < 1:
        ap.error(f"--steps {a.steps}: expected a positive number of steps")
    if a.spec is not None and not Path(a.spec).is_file():
        ap.error(f"--spec {a.spec}: no such file; expected a file `perfcounter calibrate` wrote")
    quiet_third_party()
    main(a.spec, a.steps)
