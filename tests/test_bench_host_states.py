"""benchmarks/bench_host_states.py runs on a CPU as a smoke test: every round's columns are
per-op-call figures of the same tiny step, so they agree within what a host's noise allows."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_the_host_states_benchmark_runs_on_a_cpu(capsys):
    import bench_host_states
    got = bench_host_states.main("cpu", rounds=1, depths=())
    (cells,) = got["rounds"]
    assert len(cells) == 5 and all(c > 0 for c in cells) and got["compiled"] == []
    # calibrate's warm figure and the same float32 step run by generate.decode_one_token are
    # one program timed two ways: within 2x of each other even on a busy machine
    assert 0.5 < cells[0] / cells[2] < 2
    assert "calibrate eager (us)" in capsys.readouterr().out
