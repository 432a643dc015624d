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
