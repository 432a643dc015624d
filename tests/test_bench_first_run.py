"""benchmarks/bench_first_run.py: a first run (no calibration saved) as generate.py runs it,
priced on this machine measured (calibrate stubbed here: devices/this_machine.py) and, from
the same counts, on generic-cpu."""
import os
import sys
from pathlib import Path

from conftest import tiny_args
from perfcounter.devices import this_machine
from perfcounter.models.loading import save_checkpoint
from test_this_machine import fake_calibration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_first_run  # noqa: E402


def test_a_first_run_measures_the_machine_and_prices_both_specs(tmp_path, tiny_model,
                                                                sp_model_file, monkeypatch):
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, tiny_args(), tiny_model.state_dict())
    (folder / "tokenizer.model").write_bytes(sp_model_file.read_bytes())
    monkeypatch.setattr(this_machine, "calibrate", lambda **kw: fake_calibration(True))
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "mine"))
    phases, line, took = bench_first_run.first_run(
        ["--checkpoint_path", str(folder), "--max_new_tokens", "3", "--prompt_length", "4"])
    assert line.startswith("Device spec: this-machine (measured now in 0 s")
    assert set(phases) == {"prefill", "decode"} and took > 0
    for measured, predicted, generic in phases.values():
        assert measured > 0 and predicted > 0 and generic > 0 and predicted != generic
    # the environment as it was: this test's home, measuring off (conftest)
    assert os.environ["PERFCOUNTER_HOME"] == str(tmp_path / "mine")
    assert os.environ["PERFCOUNTER_MEASURE"] == "0"


def test_busy_mode_runs_the_first_runs_quiet_then_beside_busy_processes(monkeypatch, capsys):
    started = []
    walls = iter([10.0, 12.0, 30.0, 25.0])  # quiet: median 11; busy: median 27.5

    class Loop:
        def __init__(self, argv):
            started.append(self)
            self.killed = False

        def kill(self):
            self.killed = True

        def wait(self):
            return 0
    monkeypatch.setattr(bench_first_run.subprocess, "Popen", Loop)
    monkeypatch.setattr(bench_first_run, "first_run", lambda flags: (
        {"decode": (2.0, 1.0, 4.0)}, "Device spec: generic-cpu (stub)", next(walls)))
    bench_first_run.main(runs=2, busy=2)
    out = capsys.readouterr().out
    assert "## quiet" in out and "## 2 busy processes beside it" in out
    # 27.5 / 11 = 2.5
    assert "first run's median wall: 11.0 s quiet, 27.5 s with 2 busy processes: 2.50x" in out
    assert len(started) == 2 and all(loop.killed for loop in started)
