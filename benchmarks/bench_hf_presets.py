"""The transformers presets (perfcounter/models/hf_presets.yaml) as docs/counting.md's table quotes
them: each checkpoint's parameters (transformers' class for its config on the meta device, a tied
weight once), its language model's, its KV cache bytes a token in bfloat16 (models/kv_layout.py,
vLLM's layout), and how long a config-only count of it takes (prompt 8 tokens, 2 new), whether
one layer of each kind was counted and the rest derived, with the machine's load.
`--tables` times instead how long serve's step table of each takes to build on one rank
(serve/steps_hf.count_hf_table: every fit step counted on transformers' model of one layer of
each kind, as stored; built once and reused by every plan candidate of that model and
parallel layout; the goal: within 10 s on a quiet 2-core machine), with the load before and
after each.

    python benchmarks/bench_hf_presets.py [--only deepseek-v3,gpt-oss-20b] [--no_count]
    python benchmarks/bench_hf_presets.py --tables [--only qwen3-8b]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402

from perfcounter.generation.config_only import count_config  # noqa: E402
from perfcounter.models.hf_presets import PRESETS, counted_config, preset_config  # noqa: E402
from perfcounter.models.kv_layout import kv_bytes_per_token  # noqa: E402


def _params(make) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in make().parameters())  # a tied weight once


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="comma-separated preset names (default: all)")
    p.add_argument("--no_count", action="store_true", help="parameters and KV bytes only")
    p.add_argument("--tables", action="store_true", help="time serve's step table of each")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(PRESETS)
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        p.error(f"unknown preset {unknown[0]!r}; valid: {', '.join(PRESETS)}")
    if a.tables:
        return tables(names)
    print(f"{'preset':22} {'checkpoint':>17} {'language model':>17} {'KV B/token':>11}  count")
    for name in names:
        whole = preset_config(name)
        text = counted_config(name)
        checkpoint = _params(lambda: getattr(transformers, whole.architectures[0])._from_config(
            whole))
        language = _params(lambda: transformers.AutoModelForCausalLM.from_config(text))
        kv = kv_bytes_per_token(text, torch.bfloat16)
        count = ""
        if not a.no_count:
            t = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                count_config(name, prompt_length=8, new_tokens=2)
            every = any("counting every layer" in str(w.message) for w in caught)
            count = (f"{time.perf_counter() - t:.1f} s, "
                     f"{'every layer counted' if every else 'derived'}  [{_load()}]")
        print(f"{name:22} {checkpoint:>17,} {language:>17,} {kv:>11,}  {count}")
    return 0


def tables(names) -> int:
    """Each preset's serve step table built twice, timed: on TP 1 first (its modeling
    code imported then), then on TP 2 (a plan's next candidate: a new table, imports done)."""
    from perfcounter.serve.resolve import resolve_model
    from perfcounter.serve.steps_hf import count_hf_table
    print(f"serve's step table of one rank, bfloat16 activations, weights as stored; "
          f"{os.cpu_count()} cores; TP 1 (imports included), then TP 2")
    worst = 0.0
    for name in names:
        args = resolve_model(name)
        took = []
        before = _load()
        for tp in (1, 2):
            t = time.perf_counter()
            count_hf_table(args.sharded(tp), torch.bfloat16)
            took.append(time.perf_counter() - t)
        worst = max(worst, took[1])
        print(f"{name:22} TP 1 {took[0]:6.1f} s, TP 2 {took[1]:6.1f} s  [{before}; after: "
              f"{_load()}]", flush=True)
    print(f"slowest TP 2 build: {worst:.1f} s (goal: within 10 s on a quiet machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
