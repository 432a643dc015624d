"""The bound beside every regime, for the serving steps docs/predictions.md quotes.

    python benchmarks/bench_bound.py     # any machine: config-only step tables, no GPU

For Llama-2-7B with fp8 weights and KV cache on an H100 it prints, for a 2,048-token prefill,
a batch of 64 decodes at context 1,000 and a mixed step, the bound (pricing/price.py: executed
FLOPs at peak, the fewest bytes any regime moves at peak bandwidth), the per-group roofline
(each group's max(FLOPs / peak, its own bytes / bandwidth) summed: what the bound charged
before it took the fewest bytes) and the eager, compiled and CUDA-graph predictions, in ms.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from perfcounter.devices import get_device_spec  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.models.args import ModelArgs  # noqa: E402
from perfcounter.pricing.price import REGIMES, host_link_s  # noqa: E402
from perfcounter.pricing.roofline import peak_flops  # noqa: E402
from perfcounter.quant.quantize import parse_scheme  # noqa: E402
from perfcounter.serve import step_table  # noqa: E402
from perfcounter.serve.predicted import PredictionPricer  # noqa: E402
from perfcounter.serve.pricing import RooflinePricer  # noqa: E402

STEPS = {"prefill 2,048": [(2048, 0)], "64 decodes at 1,000": [(1, 1000)] * 64,
         "prefill 512 + decode": [(512, 0), (1, 300)]}


def per_group_roofline(table, pieces) -> float:
    """Σ over groups max(executed FLOPs / peak, bytes / bandwidth) + the host link."""
    fig, spec = table.figures(table.counts.features(pieces)), table.spec
    peaks = np.array([peak_flops(spec, d) for d in fig.dtype])
    return float(np.maximum(fig.executed_flops / peaks, fig.bytes / spec.bandwidth).sum()) \
        + host_link_s(fig, spec)


def main() -> int:
    warnings.simplefilter("ignore")  # a spec's missing float8 pJ/FLOP, said once per run
    args = ModelArgs.from_name("llama-2-7b")
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    fp8 = parse_scheme("fp8")
    tables = {e: step_table(args, torch.bfloat16,
                            RooflinePricer(spec) if e == "bound" else PredictionPricer(spec, e),
                            weights=fp8, kv="fp8") for e in REGIMES}
    rows = []
    for name, pieces in STEPS.items():
        row = {"step": name, "per-group roofline": per_group_roofline(tables["bound"], pieces)}
        row.update({e: t.price(pieces) for e, t in tables.items()})
        rows.append([v if k == "step" else f"{v * 1e3:.2f}" for k, v in row.items()])
    print("Llama-2-7B, fp8 weights and KV cache, h100-sxm; ms a step")
    print(format_table(rows, ["step", "per-group roofline", *REGIMES]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
