"""What the compiled regime charges its fused kernels, counted against the older charge.

    python benchmarks/bench_fused_io.py                       # Llama-2-7B, fp16, 128 and 2,048 tokens
    python benchmarks/bench_fused_io.py --model llama-3-8b --prompts 512

Config-only counts (generate.main, FakeTensorMode, no weights) of one prefill. Per prompt:
the phase's compulsory bytes (each storage once), what its matmul and attention kernels
stream of them (weights, KV cache), the older fused charge (compulsory less streamed: every
intermediate of a fused chain) and the fused IO now counted (perfcounter/counting/fused_io.py:
what crosses a fused kernel's boundary), in GB, and the ratio of the two charges.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.pricing.predict import EXTERN, op_class  # noqa: E402
from perfcounter.trace import ROLES  # noqa: E402

STREAMED = (ROLES.index("weight"), ROLES.index("kv_cache"))


def row(model: str, precision: str, prompt: int) -> list:
    with contextlib.redirect_stdout(io.StringIO()):
        out = generate.main(model=model, prompt_length=prompt, max_new_tokens=1,
                            precision=precision, device_spec="h100-sxm", quiet=True)
    t = out["counter"].counts["prefill"].trace
    streamed = sum(r.read[i] for r in t.records if not r.op.startswith("prim.")
                   and op_class(r.op, r.args) in EXTERN for i in STREAMED)
    older = max(0, t.compulsory_bytes - streamed)
    return [model, precision, prompt, f"{t.compulsory_bytes / 1e9:.2f}", f"{streamed / 1e9:.2f}",
            f"{older / 1e9:.2f}", f"{t.fused_bytes / 1e9:.2f}",
            f"{older / t.fused_bytes:.2f}" if t.fused_bytes else "-"]


def main(model: str = "llama-2-7b", precision: str = "float16",
         prompts: tuple = (128, 2048)) -> list:
    rows = [row(model, precision, p) for p in prompts]
    print(format_table(rows, ["model", "precision", "prompt", "compulsory GB", "streamed GB",
                              "older fused charge GB", "fused IO GB", "older / now"],
                       markdown=True))
    return rows


if __name__ == "__main__":
    quiet_third_party()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-2-7b", help="a model preset (perfcounter/models/args.py) or config")
    p.add_argument("--precision", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--prompts", default="128,2048", help="comma-separated prompt lengths")
    a = p.parse_args()
    try:
        prompts = tuple(int(v) for v in a.prompts.split(","))
    except ValueError:
        p.error(f"--prompts {a.prompts!r}: expected comma-separated whole numbers, such as 128,2048")
    if not prompts or min(prompts) < 1:
        p.error(f"--prompts {a.prompts!r}: expected lengths >= 1")
    try:
        main(a.model, a.precision, prompts)
    except (ValueError, KeyError) as e:
        p.error(str(e).splitlines()[0])
