"""A write killed mid-way never corrupts its target, and what it left beside it is removed by
the next write to the same target."""
import os
import signal
import subprocess
import sys

from perfcounter._util import TMP_TAG, atomic_write, remove_stale_temporaries


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_writer_leaves_the_target_whole_and_its_temporary_is_cleaned_next_time(tmp_path):
    target = tmp_path / "counts.json"
    target.write_text("old")
    # a writer that makes its temporary, then hangs before renaming: killed with SIGKILL
    code = ("import sys, time; from perfcounter._util import atomic_write\n"
            "def slow(tmp):\n"
            "    open(tmp, 'w').write('half'); print('writing', flush=True); time.sleep(60)\n"
            f"atomic_write({str(target)!r}, writer=slow)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = list(tmp_path.glob(f".counts.json.{TMP_TAG}-{child.pid}-*.tmp"))
    assert len(left) == 1 and target.read_text() == "old"  # the target is whole
    atomic_write(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["counts.json"]


def test_a_live_writers_temporary_is_kept(tmp_path):
    target = tmp_path / "x.json"
    live = tmp_path / f".x.json.{TMP_TAG}-{os.getppid()}-abc.tmp"  # our parent runs
    dead = tmp_path / f".x.json.{TMP_TAG}-{_dead_pid()}-abc.tmp"
    other = tmp_path / f".y.json.{TMP_TAG}-{_dead_pid()}-abc.tmp"  # another target's
    for p in (live, dead, other):
        p.write_text("")
    assert remove_stale_temporaries(target) == [dead]
    assert live.exists() and other.exists() and not dead.exists()
