"""A real run on this CPU without a passed calibration saved is priced on this machine measured
first (devices/this_machine.py); conftest turns that off for every other test."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import generate
from conftest import tiny_args
from perfcounter.devices import DeviceSpecError
from perfcounter.devices import this_machine
from perfcounter.devices.calibrate import Calibration, save_calibrated
from perfcounter.models.loading import save_checkpoint

REPO = Path(__file__).resolve().parents[1]


def fake_calibration(passed: bool) -> Calibration:
    """What calibrate returns, without measuring: 20 GB/s, 100 GFLOP/s, 3 us an op call."""
    check = {"passed": passed, "clock": "wall", "threads": 2, "rounds": 2, "load": [0.1, 0.2],
             "flags": [] if passed else ["gemv float32 GFLOP/s at 1 MiB: 1, far below its "
                                         "neighbours (50)"], "spread": {}}
    return Calibration(device="cpu", processor="test", threads=2, array_bytes=1 << 26,
                       repeats=10, clock="wall", matmul_n=1024, bandwidth=20e9,
                       flops={torch.float32: 100e9}, memory_bytes=1 << 34,
                       overhead_s={"eager": 3e-6}, check=check)


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """No calibration saved, measuring allowed; calibrate's calls recorded (their dtypes)."""
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PERFCOUNTER_MEASURE")
    calls = []
    monkeypatch.setattr(this_machine, "calibrate",
                        lambda **kw: calls.append(kw) or fake_calibration(True))
    return calls


def test_a_run_without_a_saved_calibration_is_priced_on_this_machine_measured(fresh_machine):
    spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "this-machine" and spec.bandwidth == 20e9
    assert spec.op_overhead_s["eager"] == 3e-6  # the measured figure, not generic-cpu's
    assert fresh_machine == [{"dtypes": ("float32",), **this_machine.QUICK}]
    assert why.startswith("measured now in 0 s: no passed calibration is saved (")
    assert "passed its checks" in why and "`perfcounter calibrate` saves one" in why


def test_the_measurement_times_the_runs_dtype_beside_float32(fresh_machine):
    this_machine.spec_for_run(torch.bfloat16, measure=True)
    assert fresh_machine[0]["dtypes"] == ("float32", "bfloat16")


def test_a_measurement_that_fails_its_checks_is_not_used(fresh_machine, monkeypatch):
    monkeypatch.setattr(this_machine, "calibrate", lambda **kw: fake_calibration(False))
    with pytest.warns(UserWarning, match="on a quieter machine"):
        spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "generic-cpu"
    assert "this machine measured now (0 s) FAILED its checks" in why
    assert "far below its neighbours" in why and why.endswith("using 'generic-cpu' "
                                                              "(assumed figures)")


def test_a_saved_calibration_that_passed_is_used_without_measuring(fresh_machine):
    save_calibrated(fake_calibration(True).to_spec("calibrated"))
    spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "calibrated" and fresh_machine == []
    assert "which passed its checks" in why


@pytest.mark.parametrize("measure, env", [(False, None), (True, "0")])
def test_config_only_counts_and_the_opt_out_never_measure(fresh_machine, monkeypatch,
                                                          measure, env):
    if env is not None:
        monkeypatch.setenv("PERFCOUNTER_MEASURE", env)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: generate.py's `Device spec:` line says why
        spec, why = this_machine.spec_for_run(torch.float32, measure=measure)
    assert spec.name == "generic-cpu" and fresh_machine == []
    assert why == "no calibrated spec for this machine; using 'generic-cpu' (assumed figures)"


def test_a_bad_opt_out_value_is_refused_in_one_line(fresh_machine, monkeypatch):
    monkeypatch.setenv("PERFCOUNTER_MEASURE", "yes")
    with pytest.raises(DeviceSpecError, match=r"^PERFCOUNTER_MEASURE='yes' is not valid; "
                                              r"valid: 0 \(never measure"):
        this_machine.spec_for_run(torch.float32, measure=True)
    run = subprocess.run([sys.executable, "generate.py", "--model", "llama-2-7b",
                          "--max_new_tokens", "2", "--quiet"], cwd=REPO, capture_output=True,
                         text=True, env={**os.environ, "PERFCOUNTER_MEASURE": "yes"})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        "generate.py: error: PERFCOUNTER_MEASURE='yes' is not valid; valid: 0 (never measure "
        "this machine for a run) or 1 (the default)"]


def test_generate_says_which_spec_and_why_and_saves_the_reason(fresh_machine, tmp_path,
                                                               tiny_model, sp_model_file,
                                                               capsys):
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, tiny_args(), tiny_model.state_dict())
    (folder / "tokenizer.model").write_bytes(sp_model_file.read_bytes())
    out = generate.main(checkpoint_path=folder, max_new_tokens=3, prompt="the",
                        save_path=tmp_path / "r.json")
    assert fresh_machine and out["counter"].device_spec.name == "this-machine"
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("Device spec: this-machine (measured now in 0 s: no passed "
                            "calibration is saved (")
    doc = json.loads((tmp_path / "r.json").read_text())
    for phase in ("prefill", "decode"):  # each phase's "perfcounter" block holds the run
        assert doc[phase]["perfcounter"]["run"]["device_spec_why"].startswith("measured now")


@pytest.mark.slow  # measures this machine (~11 s on a 2-core VM)
def test_the_real_measurement_passes_on_a_quiet_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PERFCOUNTER_MEASURE")
    spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    if spec.name == "generic-cpu":  # a busy machine: said so, never used silently
        assert "FAILED its checks" in why
        return
    assert spec.name == "this-machine" and spec.op_curves and spec.matmul_rows
    assert set(spec.matmul_rows) == {"float32"} and spec.op_overhead_s["eager"] > 0
    assert not (tmp_path / "home").exists()  # measured for the run, written nowhere
