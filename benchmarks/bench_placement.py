"""The README's "Should this layer run on PIM?" table: Llama-2-7B priced four ways.

Runs the walkthrough's `perfcounter simulate` commands (transformers' model class from
the preset's config, no weights, bf16, a 64-token prompt, 16 new tokens; host generic-cpu)
and prints, per placement, the prefill's time and energy and decode's per-token figures:
all on a phone SoC, all on PIM-AI-4chip, UPMEM's mixed mapping (its example, with the
keys that match no layer allowed), and the best mix `--search energy --max_latency_ms 50`
finds over the three devices. One count, re-priced; every run's output is hidden.

    python benchmarks/bench_placement.py
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from perfcounter.cli.main import main as cli

UPMEM_MIXED = """\
LlamaRMSNorm: PIM-AI-1chip,t
q_proj: PIM-AI-4chip,t
k_proj: PIM-AI-4chip
rotatory_emb: PIM-AI-4chip
v_proj: PIM-AI-4chip
o_proj: PIM-AI-4chip,t
output_layernorm: PIM-AI-1chip,t
gate_proj: PIM-AI-4chip,t
up_proj: PIM-AI-4chip,t
down_proj: PIM-AI-4chip,t
norm: PIM-AI-1chip,t
lm_head: PIM-AI-4chip,t
"""


def simulate(*argv: str) -> dict:
    """One `perfcounter simulate` run; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli(argv=["simulate", *argv, "--save_path", str(out)])
        if code:
            raise SystemExit(f"perfcounter simulate {' '.join(argv)} exited {code}")
        return json.loads(out.read_text())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        counts, mixed, best = (str(Path(tmp) / n) for n in ("llama2.json", "mixed.yaml", "best.yaml"))
        Path(mixed).write_text(UPMEM_MIXED)
        runs = {"all on Snapdragon8gen3": simulate(
            "--model", "llama-2-7b", "--hf", "--prompt_length", "64", "--max_new_tokens", "16",
            "--default_device", "Snapdragon8gen3", "--save_counts", counts)}
        runs["all on PIM-AI-4chip"] = simulate("--counts", counts, "--default_device", "PIM-AI-4chip")
        runs["UPMEM's mixed mapping"] = simulate("--counts", counts, "--mapping", mixed,
                                                 "--allow_unmatched")
        simulate("--counts", counts, "--search", "energy", "--devices",
                 "Snapdragon8gen3,PIM-AI-4chip,PIM-AI-1chip", "--max_latency_ms", "50",
                 "--save_mapping", best)
        runs["best found by --search energy"] = simulate("--counts", counts, "--mapping", best)
    print("Llama-2-7B, bf16, 64 + 16 tokens, host generic-cpu")
    print(f"{'placement':<32}{'prefill ms':>11}{'prefill J':>10}{'decode ms/token':>16}"
          f"{'decode J/token':>15}{'total s':>9}{'total J':>9}")
    for name, doc in runs.items():
        pre, dec = doc["phases"]["prefill"], doc["phases"]["decode"]
        print(f"{name:<32}{pre['time_s'] * 1e3:>11.2f}{pre['energy_j']:>10.2f}"
              f"{dec['time_s'] / dec['num_tokens'] * 1e3:>16.2f}{dec['j_per_token']:>15.3f}"
              f"{doc['time_s']:>9.3f}{doc['energy_j']:>9.2f}")


if __name__ == "__main__":
    main()
