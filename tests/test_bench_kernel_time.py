"""benchmarks/bench_kernel_time.py: the source of DEFAULT_KERNEL_S, reproduced config-only."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_the_fixed_time_a_kernel_from_the_h200s_cuda_graph_steps():
    import bench_kernel_time
    from perfcounter.pricing.achievable import DEFAULT_KERNEL_S
    smol, one_b = bench_kernel_time.main()
    # kernels a decode step as CUDA graphs: per layer wqkv, wo, w1, w3, w2 and attention (6
    # extern calls), + the output head; one fused kernel after each and one a step:
    # SmolLM2 (30 layers) 2 x (30 x 6 + 1) + 1 = 363; the 1B (16 layers) 2 x 97 + 1 = 195
    assert (smol["kernels"], one_b["kernels"]) == (363, 195)
    for row, measured_ms in zip((smol, one_b), (1.06, 1.11)):
        assert row["per_kernel_us"] == pytest.approx(
            (measured_ms - row["priced_ms"]) / row["kernels"] * 1e3)
    # the stated default is their mean, rounded: (2.67 + 2.81) / 2 = 2.7 us
    mean = (smol["per_kernel_us"] + one_b["per_kernel_us"]) / 2
    assert DEFAULT_KERNEL_S["cuda"] * 1e6 == pytest.approx(mean, abs=0.05)
