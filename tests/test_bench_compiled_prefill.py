"""benchmarks/bench_compiled_prefill.py: the tiny model's static and dynamic compiled programs
fitted per launch and per step, and a model's shape's compiled prefill timed beside its decode
step, on this CPU (the smoke test of a GPU benchmark)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.slow  # ~1-2 min: compiles the tiny model at 2 and 8 layers and a 2-layer SmolLM2
def test_static_and_dynamic_programs_are_timed_and_fitted():
    import bench_compiled_prefill
    got = bench_compiled_prefill.main(device="cpu", layers=2, rounds=1, min_time=0.01)
    assert set(got["fits"]) == {"static 1", "dynamic 1", "dynamic 8", "dynamic 32"}
    for fit in got["fits"].values():  # a launch costs the host something; the entry is >= 0
        assert fit["compiled"] > 0 and fit["compiled_step"] >= 0
    assert set(got["model"]) == {"decode, static", "prefill, dynamic", "prefill, static"}
    for figures in got["model"].values():
        assert figures["host_ms"] > 0 and figures["after_decode_ms"] > 0
        assert figures["Dynamo's cache lookup"] > 0  # every compiled call checks its guards
        assert figures["kernels"] is None  # the kernels a call ran: profiled on a GPU only


@pytest.mark.parametrize("argv, says", [
    (["--device", "tpu"], "--device 'tpu': cuda or cpu"),
    (["--device", "cpu", "--prompt", "1"], "--prompt 1: at least 2 tokens"),
    (["--device", "cpu", "--layers", "0"], "--layers 0: a positive integer"),
    (["--device", "cpu", "--model", "nonsense"], "--model 'nonsense'"),
    (["--device", "cpu", "--model", "smollm2-135m,nonsense"], "--model 'nonsense'"),
])
def test_bad_input_is_refused_before_the_work(argv, says):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_compiled_prefill.py"), *argv],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
