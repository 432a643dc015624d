"""Published GPU measurements beside perfcounter's predictions, each in the regime that ran.

    python benchmarks/bench_published.py                 # every row it can price, GenZ beside
    python benchmarks/bench_published.py --no-genz       # without the peer estimator
    python benchmarks/bench_published.py --only gptfast  # rows whose id contains a word

Reads `benchmarks/data/published_gpu.yaml` (sourced rows, `benchmarks/published.py`). Each row
is counted from its preset's config alone (generate.py config only, FakeTensorMode, no
weights), quantized as the row's precision says, and priced on the row's registry device in
the row's regime (`eager`, `compiled`, `cudagraphs`: predict.py): measured ÷ predicted per
row. No efficiency is fitted to a row it is compared with: the device's sourced
`op_efficiency` (device_specs/*.yaml, with its source) or the stated defaults of
perfcounter/pricing/achievable.py. GenZ's figure (benchmarks/genz_figures.py; `genz-llm`,
never a dependency) stands beside where it models the row.

How a metric is predicted (per request; decode steps priced at the context the run reaches
half way through its output):
- ttft_ms, prefill_s: the prefill of prompt_len tokens x batch;
- decode_step_s: one decode step;
- decode_tokens_per_s (batch 1): output_len / (prefill + (output_len - 1) steps), the whole
  generate() call as gpt-fast times it;
- eval_tokens_per_s (batch 1): 1 / step, the generation steps alone (llama.cpp's `eval time`
  line, llama-bench's tg: the prompt's time is reported apart);
- prompt_tokens_per_s: prompt_len / prefill;
- output_tokens_per_s (batch B): B x output_len / (prefill + output_len steps).
Measured ÷ predicted of a rate is predicted ÷ measured.
fp8 rows (TensorRT-LLM's FP8: --enable_fp8 --fp8_kv_cache) are W8A8: `--quantize fp8`
(float8_e4m3fn weights with a per-tensor scale, activations quantized per call, matmuls at the
device's fp8 peak) with an fp8 KV cache, activations in bfloat16 between the linears.
Rows not priced, and why: a device not in the registry, a batch the serving scheduler chose
("saturated": `perfcounter serve` prices those, benchmarks/bench_serving_published.py with the
serving rows of benchmarks/data/published_serving.yaml), a precision with no scheme here.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
import torch  # noqa: E402
from perfcounter.devices import get_device_spec  # noqa: E402
from perfcounter.generation.config_only import count_config  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.pricing.predict import phase_program, predict  # noqa: E402
from published import DATA_FILE, load_rows  # noqa: E402

# the row's precision as generate.py's flags: (precision, quantize[, kv_dtype])
PRECISION = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "int8": ("bfloat16", "int8"),
             "fp8": ("bfloat16", "fp8", "fp8"),  # W8A8 fp8 and an fp8 KV cache
             "int4": ("bfloat16", "int4-32"),  # gpt-fast's int4: group size 32 (its README)
             # llama.cpp's files: each tensor at the type its quantize picks (gguf_types.py)
             "q4_0": ("float16", None, None, "Q4_0"), "q4_k_m": ("float16", None, None, "Q4_K_M")}
ASSUMED_PROMPT, ASSUMED_OUTPUT = 128, 128  # where the source states no length (genz_figures')
# Engines that launch their kernels from C++ (a TensorRT engine, llama.cpp's ggml graph), not
# from torch.compile's Python wrapper, whose launch and step entry the GPU defaults hold
# (achievable.DEFAULT_OVERHEAD_S, DEFAULT_STEP_S: an H200's 12.5 us a kernel, 69 us a step):
# their rows run "compiled" at one cudaLaunchKernel a kernel, NATIVE_LAUNCH_S (assumption of
# this project: ~2 us of host time, the GPU compiled default before the H200 measured
# torch.compile's), no step entry.
NATIVE_ENGINES = ("TensorRT-LLM", "llama.cpp")
NATIVE_LAUNCH_S = 2e-6


def _count(row, prompt: int, batch: int):
    """The row's model counted config-only: prefill of `prompt` tokens, two decode steps."""
    precision, quantize, *kv = PRECISION[row.precision]
    if len(kv) == 2:  # a llama.cpp file type: every layer counted, its tensors as stored
        dtype = getattr(torch, precision)
        return count_config(row.preset, batch_size=batch, prompt_length=max(prompt, 1),
                            new_tokens=3, dtype=dtype, gguf_type=kv[1],
                            device_spec=get_device_spec(row.device_spec, dtype=dtype))
    with contextlib.redirect_stdout(io.StringIO()):  # generate.py's own table: not wanted here
        result = generate.main(model=row.preset, prompt_length=max(prompt, 1), max_new_tokens=3,
                               batch_size=batch, precision=precision, quantize=quantize,
                               kv_dtype=kv[0] if kv else None, device_spec=row.device_spec,
                               quiet=True)
    return result["counter"]


def skip_reason(row) -> str:
    if row.device_spec is None:
        return f"{row.device}: not in the registry"
    if row.batch == "saturated":
        return ("batch chosen by the serving scheduler (perfcounter serve prices it: "
                "bench_serving_published.py)")
    if row.precision not in PRECISION:
        return f"{row.precision}: no scheme of perfcounter's stands for it"
    if row.tensor_parallel != 1:
        return "tensor parallel: priced by perfcounter simulate, not here"
    return ""


def predict_row(row) -> dict:
    """{predicted: the row's metric as predicted, basis, assumed} (see the module doc)."""
    prompt = row.prompt_len if row.prompt_len is not None else ASSUMED_PROMPT
    output = row.output_len if row.output_len is not None else ASSUMED_OUTPUT
    assumed = ", ".join(f"{k} {v}" for k, v, given in (("prompt", prompt, row.prompt_len),
                                                       ("output", output, row.output_len))
                        if given is None)
    first = _count(row, prompt, row.batch)
    prefill = _predict(row, first.counts["prefill"])
    mid = first if output <= 16 else _count(row, prompt + output // 2, row.batch)
    decode = mid.counts["decode"]
    step = _predict(row, decode).latency_s / decode.steps
    p, metric = prefill.latency_s, row.metric
    value = {"ttft_ms": p * 1e3, "prefill_s": p, "decode_step_s": step,
             "decode_tokens_per_s": output / (p + (output - 1) * step),
             "eval_tokens_per_s": 1 / step,
             "prompt_tokens_per_s": prompt / p,
             "output_tokens_per_s": row.batch * output / (p + output * step)}[metric]
    bases = sorted(set(prefill.basis.split("+")) | set(_predict(row, decode).basis.split("+")))
    return {"predicted": value, "basis": "+".join(bases), "assumed": assumed,
            "step_bytes": decode.trace.compulsory_bytes / max(decode.trace.steps, 1),
            "bandwidth": decode.device_spec.bandwidth}


def _predict(row, phase):
    """A counted phase's prediction in the row's regime, on its device as the row's engine
    launches kernels there (NATIVE_ENGINES: from C++)."""
    spec = phase.device_spec
    if row.engine.startswith(NATIVE_ENGINES):
        spec = replace(spec, name=f"{spec.name} ({row.engine.split()[0]})",
                       op_overhead_s={**spec.op_overhead_s, "compiled": NATIVE_LAUNCH_S,
                                      "compiled_step": 0.0})
    regime, spec = phase_program(spec, row.regime, phase.label)
    return predict(phase.trace, spec, regime)


def ratio_of(metric: str, measured: float, predicted: float) -> float:
    """measured ÷ predicted as a latency: a rate's is predicted ÷ measured."""
    return predicted / measured if metric.endswith("per_s") else measured / predicted


def genz_by_id(enabled: bool, rows) -> dict:
    if not enabled:
        return {}
    try:
        import GenZ  # noqa: F401  (deferred: optional, a peer estimator, never a dependency)
        from genz_figures import genz_figure
    except ImportError:
        return {}
    out = {}
    for row in rows:
        try:
            out[row.id] = genz_figure(row)["genz"]
        except Exception:  # GenZ refuses a configuration: no figure beside ours
            out[row.id] = None
    return out


def main(*, only: str | None = None, genz: bool = True, path=DATA_FILE) -> list[dict]:
    rows = [r for r in load_rows(path) if only is None or only in r.id]
    genz_figures = genz_by_id(genz, rows)
    results, table, skipped = [], [], []
    for row in rows:
        reason = skip_reason(row)
        if reason:
            skipped.append(f"{row.id}: {reason}")
            continue
        got = predict_row(row)
        r = ratio_of(row.metric, row.figure, got["predicted"])
        g = genz_figures.get(row.id)
        results.append({"id": row.id, "ratio": r, **got})
        table.append([row.id, row.regime, f"{row.figure:g} {row.unit}",
                      f"{got['predicted']:.4g} {row.unit}", f"{r:.2f}",
                      "n/a" if g is None else f"{g:.4g} {row.unit}",
                      "n/a" if g is None else f"{ratio_of(row.metric, row.figure, g):.2f}",
                      got["basis"] + (f"; assumed {got['assumed']}" if got["assumed"] else "")])
    head = ["row", "regime", "measured", "predicted", "meas/pred", "GenZ", "meas/GenZ",
            "rates (assumed lengths)"]
    print(format_table(table, head, markdown=True))
    within = sum(0.8 <= r["ratio"] <= 1.25 for r in results)
    print(f"\nwithin 0.8-1.25: {within} of {len(results)} priced rows")
    for r in results:  # a rate of the steps alone: the bandwidth share the measured run shows
        row = next(x for x in rows if x.id == r["id"])
        if row.metric == "eval_tokens_per_s" and r["bandwidth"]:
            print(f"measured stream: {row.id}: {row.figure:g} steps/s x {r['step_bytes'] / 1e9:.2f}"
                  f" GB a step = {row.figure * r['step_bytes'] / r['bandwidth']:.2f} of "
                  f"{row.device_spec}'s {r['bandwidth'] / 1e9:g} GB/s")
    for line in skipped:
        print(f"not priced: {line}")
    return results


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None, help="rows whose id contains this text")
    p.add_argument("--no-genz", action="store_true", help="leave GenZ's column empty")
    a = p.parse_args()
    main(only=a.only, genz=not a.no_genz)
