"""benchmarks/bench_host_states.py runs on a CPU as a smoke test: every round's columns are
per-op-call figures of the same tiny step; how far they agree is the benchmark's to print."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_the_host_states_benchmark_runs_on_a_cpu(capsys):
    import bench_host_states
    got = bench_host_states.main("cpu", rounds=1, depths=())
    (cells,) = got["rounds"]
    assert len(cells) == 5 and all(c > 0 for c in cells) and got["compiled"] == []
    # calibrate's warm figure and the same float32 step run by generate.decode_one_token are
    # one program timed two ways; how close they come is the benchmark's figure (printed with
    # the machine's load), not a test's: a neighbour's work moves either one
    assert "calibrate eager (us)" in capsys.readouterr().out
