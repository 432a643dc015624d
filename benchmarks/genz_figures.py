"""GenZ's figure beside each published GPU measurement that it can model.

    pip install genz-llm                       # optional: never a dependency of perfcounter
    python benchmarks/genz_figures.py          # prints the table; writes nothing
    python benchmarks/genz_figures.py --save_path genz.json

GenZ (https://github.com/abhibambhaniya/GenZ-LLM-Analyzer, package `genz-llm`) is an
analytical estimator: per operator, max(FLOPs / (peak x efficiency), bytes / (bandwidth x
efficiency)), no launch or dispatch overhead, so it has no notion of eager, compiled or CUDA
graphs: one figure per row whatever its regime. For each row of
benchmarks/data/published_gpu.yaml (loaded by benchmarks/published.py) it runs the same
configuration:

- device: GenZ's own system where it has one (A100_40GB_GPU, A100_80GB_GPU, H100_GPU);
  otherwise a system defined from our registry's figures (`perfcounter devices`: bf16 peak,
  bandwidth, memory size), said so in the `system` column. A device not in our registry is
  skipped.
- model: GenZ's own configs of the row's preset (Llama-2-7B/70B, Llama-3.1-8B).
- precision: GenZ's `bits` (bf16 for bf16/fp16; fp8; int8; int4 for int4 and the GGUF
  Q4_0/Q4_K_M, whose scales GenZ does not count: 4 bits per weight where Q4_0 stores 4.5).
- ttft_ms / prefill_s: prefill_moddeling at the row's batch and prompt.
- decode_step_s: decode_moddeling at the row's batch with the prompt in the KV cache.
- decode_tokens_per_s: 1 / decode_moddeling at batch 1 with the KV cache half way through the
  generation (prompt + output / 2); beam size 1.
- prompt_tokens_per_s: prompt / prefill latency.
- output_tokens_per_s at a stated batch (static batching): batch x output / (prefill of the
  batch + output x the decode step half way through). A "saturated" batch is skipped.
- A length the source does not state is assumed (prompt 0, output 128) and marked so.

GenZ's efficiencies are left at its default (1: peak) unless --efficiency is given.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published import DATA_FILE, PublishedDataError, PublishedRow, load_rows  # noqa: E402

GENZ_MODELS = {"llama-2-7b": "meta-llama/Llama-2-7B", "llama-2-70b": "meta-llama/Llama-2-70B",
               "llama-3.1-8b": "meta-llama/Llama-3.1-8B"}
GENZ_SYSTEMS = {"a100-sxm4-40gb": "A100_40GB_GPU", "a100-sxm4-80gb": "A100_80GB_GPU",
                "h100-sxm": "H100_GPU"}
GENZ_BITS = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "int8", "int4": "int4",
             "q4_0": "int4", "q4_k_m": "int4"}
ASSUMED_PROMPT, ASSUMED_OUTPUT = 0, 128


def genz_system(device_spec: str):
    """(GenZ system argument, label): GenZ's own system, or one defined from our registry."""
    if device_spec in GENZ_SYSTEMS:
        return GENZ_SYSTEMS[device_spec], f"GenZ {GENZ_SYSTEMS[device_spec]}"
    import torch
    from perfcounter import get_device_spec
    spec = get_device_spec(device_spec, dtype=torch.bfloat16)
    system = {"Flops": spec.flops_per_s / 1e12, "Memory_size": spec.vram / 1e9,
              "Memory_BW": spec.bandwidth / 1e9, "ICN": 150, "real_values": True}
    return system, (f"registry {device_spec} ({system['Flops']:g} TFLOP/s bf16, "
                    f"{system['Memory_BW']:g} GB/s)")


def genz_figure(row: PublishedRow, efficiency: float = 1.0) -> dict:
    """GenZ's figure for one row, in the row's unit, or a reason it was not modelled."""
    out = {"id": row.id, "metric": row.metric, "unit": row.unit, "published": row.figure,
           "genz": None, "system": "", "bits": "", "assumed": "", "skipped": ""}
    if row.preset not in GENZ_MODELS:
        out["skipped"] = f"GenZ has no config of {row.preset}"
        return out
    if row.device_spec is None:
        out["skipped"] = f"{row.device} is not in our registry"
        return out
    if row.batch == "saturated":
        out["skipped"] = "batch not stated (the scheduler's)"
        return out
    from GenZ import decode_moddeling, prefill_moddeling
    system, out["system"] = genz_system(row.device_spec)
    model, bits, batch = GENZ_MODELS[row.preset], GENZ_BITS[row.precision], row.batch
    out["bits"] = bits
    prompt, output, assumed = row.prompt_len, row.output_len, []
    if prompt is None:
        prompt = ASSUMED_PROMPT
        assumed.append(f"prompt {prompt}")
    if output is None:
        output = ASSUMED_OUTPUT
        assumed.append(f"output {output}")
    out["assumed"] = ", ".join(assumed)
    common = dict(model=model, system_name=system, bits=bits, system_eff=efficiency,
                  tensor_parallel=row.tensor_parallel)

    def prefill_ms(b: int) -> float:
        return prefill_moddeling(batch_size=b, input_tokens=max(prompt, 1), **common)["Latency"]

    def decode_ms(b: int, generated: int) -> float:
        return decode_moddeling(batch_size=b, input_tokens=prompt, output_tokens=generated,
                                Bb=1, **common)["Latency"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if row.metric == "ttft_ms":
            out["genz"] = prefill_ms(batch)
        elif row.metric == "prefill_s":
            out["genz"] = prefill_ms(batch) / 1e3
        elif row.metric == "decode_step_s":
            out["genz"] = decode_ms(batch, 0) / 1e3
        elif row.metric in ("decode_tokens_per_s", "eval_tokens_per_s"):
            out["genz"] = 1e3 / decode_ms(1, output // 2)
        elif row.metric == "prompt_tokens_per_s":
            out["genz"] = prompt / (prefill_ms(batch) / 1e3)
        elif row.metric == "output_tokens_per_s":
            total_ms = prefill_ms(batch) + output * decode_ms(batch, output // 2)
            out["genz"] = batch * output / (total_ms / 1e3)
    return out


def figures(path=DATA_FILE, efficiency: float = 1.0) -> list[dict]:
    """GenZ's figure (or the reason it has none) for every row of the data file."""
    results = []
    for row in load_rows(path):
        try:
            results.append(genz_figure(row, efficiency))
        except Exception as e:  # GenZ refuses a configuration (e.g. it does not fit in memory)
            results.append({"id": row.id, "metric": row.metric, "unit": row.unit,
                            "published": row.figure, "genz": None, "system": "", "bits": "",
                            "assumed": "", "skipped": f"GenZ: {str(e).splitlines()[0]}"})
    return results


def ratio(r: dict) -> str:
    """published ÷ GenZ as time (a rate's ratio inverted): > 1 means slower than GenZ says."""
    if r["genz"] is None:
        return ""
    if r["unit"] == "tokens/s":
        return f"{r['genz'] / r['published']:.2f}"
    return f"{r['published'] / r['genz']:.2f}"


def table(results: list[dict]) -> str:
    head = ["row", "metric", "published", "GenZ", "published time ÷ GenZ time", "GenZ system",
            "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        genz = f"{r['genz']:.4g} {r['unit']}" if r["genz"] is not None else "-"
        notes = r["skipped"] or (f"assumed {r['assumed']}" if r["assumed"] else "")
        if r["bits"]:
            notes = "; ".join(x for x in (f"bits {r['bits']}", notes) if x)
        lines.append("| " + " | ".join([r["id"], r["metric"], f"{r['published']:g} {r['unit']}",
                                        genz, ratio(r), r["system"], notes]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DATA_FILE), help="the published-data YAML file")
    parser.add_argument("--efficiency", type=float, default=1.0,
                        help="GenZ's compute and memory efficiency (default 1: its default)")
    parser.add_argument("--save_path", help="write the figures as JSON here (atomically)")
    args = parser.parse_args(argv)
    if not 0 < args.efficiency <= 1:
        print(f"--efficiency: expected a number in (0, 1], got {args.efficiency}",
              file=sys.stderr)
        return 2
    try:
        import GenZ  # noqa: F401
    except ImportError:
        print("GenZ is not installed (pip install genz-llm): no peer figures to print.")
        return 0
    try:
        results = figures(args.data, args.efficiency)
    except PublishedDataError as e:
        print(e, file=sys.stderr)
        return 2
    from importlib.metadata import PackageNotFoundError, version
    try:
        genz_version = version("genz-llm")
    except PackageNotFoundError:
        genz_version = "unknown"
    print(f"GenZ {genz_version}, efficiency {args.efficiency:g}; published: {args.data}")
    print(table(results))
    modelled = sum(r["genz"] is not None for r in results)
    print(f"{modelled} of {len(results)} rows modelled by GenZ.")
    if args.save_path:
        from perfcounter._util import atomic_write
        payload = {"genz_version": genz_version, "efficiency": args.efficiency,
                   "data": str(args.data), "rows": results}
        atomic_write(args.save_path, json.dumps(payload, indent=1) + "\n", mkdir=True)
        print(f"Saved to {args.save_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
