"""A real run on this CPU without a passed calibration saved is priced on this machine measured
first (devices/this_machine.py), within a budget, its result saved and reused for a while;
conftest turns that off for every other test."""
import datetime
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
from perfcounter.devices.calibrate import Calibration, calibrate, save_calibrated
from perfcounter.devices.timing import Budget, MeasureStopped, check_budget
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
    assert fresh_machine == [{"dtypes": ("float32",), "compiled": False,  # an eager run's
                              "budget_s": this_machine.BUDGET_S, **this_machine.QUICK}]
    assert why.startswith("measured now in 0 s (") and "no passed calibration is saved" in why
    assert "passed its checks" in why and "`perfcounter calibrate` measures it properly" in why
    assert f"saved for later runs ({this_machine.saved_path()})" in why


def test_the_measurement_times_the_runs_dtype_beside_float32(fresh_machine):
    this_machine.spec_for_run(torch.bfloat16, measure=True)
    assert fresh_machine[0]["dtypes"] == ("float32", "bfloat16")


def test_a_measurement_that_fails_its_checks_is_used_for_what_it_measured_and_says_so(
        fresh_machine, monkeypatch):
    monkeypatch.setattr(this_machine, "calibrate", lambda **kw: fake_calibration(False))
    with pytest.warns(UserWarning, match=r"to measure again now: `perfcounter calibrate`"):
        spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "this-machine" and spec.op_overhead_s["eager"] == 3e-6
    assert "this machine measured now (" in why and "took 0 s and FAILED its checks" in why
    assert "far below its neighbours" in why and "used for what it measured" in why
    assert f"or delete {this_machine.saved_path()}" in why
    record = json.loads(this_machine.saved_path().read_text())
    assert record["passed"] is False and record["used"] is True and record["spec"]


def test_a_measurement_without_a_runs_essentials_is_not_used(fresh_machine, monkeypatch):
    # no eager overhead measured (its budget spent first): the run cannot be priced on it
    cal = fake_calibration(True)
    cal.overhead_s = {}
    monkeypatch.setattr(this_machine, "calibrate", lambda **kw: cal)
    with pytest.warns(UserWarning, match=r"to measure again now: `perfcounter calibrate`"):
        spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "generic-cpu" and "so it is not used" in why
    assert "using 'generic-cpu' (assumed figures)" in why


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
    assert first.startswith("Device spec: this-machine (measured now in 0 s (")
    doc = json.loads((tmp_path / "r.json").read_text())
    for phase in ("prefill", "decode"):  # each phase's "perfcounter" block holds the run
        assert doc[phase]["perfcounter"]["run"]["device_spec_why"].startswith("measured now")


@pytest.mark.slow  # measures this machine (~11 s on a quiet 2-core VM; at most 15 s)
def test_the_real_measurement_passes_on_a_quiet_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PERFCOUNTER_MEASURE")
    spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "this-machine"  # a busy machine's measurement too: used in part
    if not json.loads(this_machine.saved_path().read_text())["passed"]:  # said so, and how
        assert "FAILED its checks" in why and "`perfcounter calibrate`" in why
        return
    assert spec.op_curves and spec.matmul_rows
    assert set(spec.matmul_rows) == {"float32"} and spec.op_overhead_s["eager"] > 0
    again, why = this_machine.spec_for_run(torch.float32, measure=True)  # the saved one
    assert why.startswith("this machine as measured ") and again.bandwidth == spec.bandwidth


# -- the budget, and the saved result reused ------------------------------------------------
class Waits:
    """CoreWait's interface with a share of other work given: what a busy machine reads."""

    def __init__(self, share=None, stolen=None):
        self.share, self.stolen = (lambda: share), (lambda: stolen)


def test_a_spent_budget_stops_the_measurement_at_its_next_timing():
    check_budget()  # outside a budget: nothing to stop
    with Budget(-1.0), pytest.raises(MeasureStopped, match=r"^its -1 s budget was spent$"):
        calibrate(dtypes=("float32",), array_bytes=1 << 20, repeats=1, rounds=1)
    check_budget()  # the budget ends with its block


@pytest.mark.parametrize("waits, why", [
    (Waits(share=0.45), "its threads waited 45% of their time for a core"),
    (Waits(share=0.0, stolen=0.2), "the hypervisor gave 20% of the CPUs' time to other machines")])
def test_other_work_over_the_busy_share_stops_it_early_and_says_why(waits, why):
    with Budget(1e9, settle=0.0, every=0.0) as budget:
        budget.wait = waits  # BUSY_SHARE is 0.1: 0.45 and 0.2 are over it
        with pytest.raises(MeasureStopped) as stopped:
            check_budget()
    assert str(stopped.value) == f"this machine is too busy to measure: {why}"
    with Budget(1e9, settle=0.0, every=0.0) as budget:
        budget.wait = Waits(share=0.05, stolen=0.0)  # under the share: measured on
        check_budget()


def stopped_calibrate(calls):
    def run(**kw):
        calls.append(kw)
        raise MeasureStopped("this machine is too busy to measure: its threads waited 45% "
                             "of their time for a core")
    return run


def test_a_stopped_measurement_is_saved_with_its_load_and_date_and_reused(fresh_machine,
                                                                         monkeypatch):
    calls = []
    monkeypatch.setattr(this_machine, "calibrate", stopped_calibrate(calls))
    with pytest.warns(UserWarning, match=r"to measure again now: `perfcounter calibrate`"):
        spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "generic-cpu" and len(calls) == 1
    assert "stopped after " in why and "too busy to measure: its threads waited 45%" in why
    record = json.loads(this_machine.saved_path().read_text())
    assert record["passed"] is False and record["spec"] is None and len(record["load"]) == 2
    assert record["dtypes"] == ["float32"]
    assert datetime.datetime.fromisoformat(record["measured_at"]).tzinfo is not None  # UTC
    with pytest.warns(UserWarning) as reused:  # never reused silently (--quiet prints no
        spec, why = this_machine.spec_for_run(torch.bfloat16, measure=True)  # Device spec line)
    assert spec.name == "generic-cpu" and len(calls) == 1  # not measured again: any dtype
    assert why.startswith("this machine's measurement ") and "reused until " in why
    assert "too busy to measure" in why and "`perfcounter calibrate` (about a minute" in why
    assert str(reused[0].message) == why


def test_a_passed_measurement_is_reused_while_it_covers_the_runs_dtypes(fresh_machine):
    first, _ = this_machine.spec_for_run(torch.float32, measure=True)
    again, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert len(fresh_machine) == 1 and again.name == "this-machine"
    assert again.bandwidth == first.bandwidth == 20e9 and again.op_overhead_s == {"eager": 3e-6}
    assert why.startswith("this machine as measured ") and "which passed its checks" in why
    this_machine.spec_for_run(torch.bfloat16, measure=True)  # bfloat16 not measured yet
    assert [c["dtypes"] for c in fresh_machine] == [("float32",), ("float32", "bfloat16")]


@pytest.mark.parametrize("passed, days", [(True, 8), (False, 2), (True, -1)])
def test_a_record_older_than_its_reuse_or_from_the_future_is_measured_again(
        fresh_machine, passed, days):
    """REUSE: 7 days for a passed one, 1 day for a failed one; a date ahead of the clock is
    no date."""
    this_machine.spec_for_run(torch.float32, measure=True)
    path = this_machine.saved_path()
    record = json.loads(path.read_text())
    at = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=days)
    record.update(measured_at=at.isoformat(), passed=passed)
    path.write_text(json.dumps(record))
    this_machine.spec_for_run(torch.float32, measure=True)
    assert len(fresh_machine) == 2


@pytest.mark.parametrize("text", ["{not json", "[]", '{"measured_at": "yesterday"}',
                                  '{"measured_at": "2026-01-01T00:00:00+00:00", "passed": true}'])
def test_a_saved_record_that_does_not_read_is_measured_again_and_replaced(fresh_machine, text):
    path = this_machine.saved_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    spec, _ = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "this-machine" and len(fresh_machine) == 1
    assert json.loads(path.read_text())["passed"] is True
