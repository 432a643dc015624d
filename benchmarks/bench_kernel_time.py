"""A GPU kernel's fixed device time, from the H200's CUDA-graph decode steps (the source of
pricing/achievable.py's DEFAULT_KERNEL_S).

    python benchmarks/bench_kernel_time.py     # any machine: config-only counts, no GPU

As a CUDA graph the host launches nothing per kernel, and a small model's weights stream in a
small share of the step: what is left of the measured step over its kernels is each kernel's
fixed time (its launch on the device, its blocks' scheduling, first loads and tail). For the two
models benchmarks/gpu_check.py timed on an H200 (at aaf2a2b; docs/measured.md#on-a-gpu), this
counts the decode step config-only at the same shapes, prices it as CUDA graphs on the registry's
h200 without the fixed time (`kernel` 0: its bytes and FLOPs at the stated default efficiencies,
one graph launch), counts its kernels as the regime does (each matmul and attention call, and one
fused kernel after each and one a step), and prints (measured - priced) / kernels.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_predict import LLAMA_1B  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.generation.config_only import count_config  # noqa: E402
from perfcounter.models.args import ModelArgs  # noqa: E402
from perfcounter.pricing.predict import predict  # noqa: E402

# (model, args, prompt tokens, decode step as one CUDA graph on the H200, ms): gpu_check's
# rows at aaf2a2b, as docs/measured.md quotes them
MEASURED = [("SmolLM2-135M shape", ModelArgs.from_name("smollm2-135m"), 8, 1.06),
            ("Llama 1.04B", ModelArgs(**LLAMA_1B), 128, 1.11)]


def main() -> list[dict]:
    spec = get_device_spec("h200", dtype=torch.bfloat16)
    bare = dataclasses.replace(spec, name="h200 (no kernel time)",
                               op_overhead_s={**spec.op_overhead_s, "kernel": 0.0})
    rows, out = [], []
    for name, args, prompt, measured_ms in MEASURED:
        counter = count_config(args, prompt_length=prompt, new_tokens=9, device_spec=spec)
        decode = counter.counts["decode"]
        p = predict(decode.trace, bare, "cudagraphs")
        steps = max(decode.trace.steps, 1)
        kernels = p.op_calls / steps  # extern, one fused after each and one a step
        priced_ms = p.latency_s / steps * 1e3
        per_kernel = (measured_ms - priced_ms) / kernels * 1e3
        out.append({"model": name, "kernels": kernels, "priced_ms": priced_ms,
                    "per_kernel_us": per_kernel})
        rows.append([name, f"{measured_ms:.2f} ms", f"{priced_ms:.3f} ms", f"{kernels:,.0f}",
                     f"{per_kernel:.2f} us"])
    print(format_table(rows, ["model", "measured (H200, CUDA graph)",
                              "bytes + FLOPs + graph launch", "kernels a step",
                              "fixed time a kernel"], markdown=True))
    return out


if __name__ == "__main__":
    quiet_third_party()
    main()
