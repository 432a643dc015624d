"""benchmarks/gpu_check.py runs on the CPU as a smoke test: calibrate (tiny), a tiny
Llama-shaped model counted and timed eagerly and compiled, one row per regime and phase."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.slow  # calibrates and compiles a tiny model: ~30 s on 2 cores
def test_gpu_check_runs_on_the_cpu(capsys):
    import gpu_check
    rows = gpu_check.main(device="cpu", repeats=1, models=("1b", "widths"))
    assert [(r[1], r[2]) for r in rows] == [("eager", "prefill"), ("eager", "decode"),
                                           ("compiled", "prefill"), ("compiled", "decode")]
    assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows)
    out = capsys.readouterr().out
    assert ("| model | regime | phase | measured | predicted | meas/pred | meas/pred, registry "
            "| counted |") in out
    assert "registry entry beside it: generic-cpu" in out
    # the host's cost per call by width: each 2-layer model, eager and compiled
    for dim in (64, 128):
        assert f"| width {dim} | eager |" in out and f"| width {dim} | compiled |" in out
