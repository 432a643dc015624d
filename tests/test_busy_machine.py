"""Other work on the machine, measured rather than guessed: the share of a timing this
process's threads spent waiting for a core, and the share of the CPUs' time a hypervisor gave
away (timing.CoreWait); a generate.py run timed meanwhile warns, and a calibration on the wall
clock records it as a flag, so it never becomes the default spec."""
import multiprocessing
import os
import time
import warnings

import pytest

from perfcounter._util import PerfcounterWarning
from perfcounter.devices import timing
from perfcounter.devices.calibration_check import check_record, describe_check
from perfcounter.generation.run import time_samples


def fake_clocks(monkeypatch, waits, ticks):
    """timing.CoreWait reading `waits` ((on, waited) s) and `ticks` ((all, stolen)) in turn."""
    waits, ticks = iter(waits), iter(ticks)
    monkeypatch.setattr(timing, "cores_waited", lambda: next(waits))
    monkeypatch.setattr(timing, "cpu_ticks", lambda: next(ticks))


def test_the_shares_are_waited_over_ready_and_stolen_over_all_ticks(monkeypatch):
    fake_clocks(monkeypatch, [(1.0, 0.0), (2.23, 0.74)], [(1000, 10), (2000, 210)])
    wait = timing.CoreWait()
    # on a core 2.23 - 1.0 = 1.23 s, waited 0.74 s: 0.74 / (1.23 + 0.74) = 0.3756
    assert wait.share() == pytest.approx(0.74 / 1.97)
    # 1,000 ticks went by, 200 of them stolen: 0.2
    assert wait.stolen() == pytest.approx(0.2)


def test_a_note_names_each_share_above_a_tenth_and_nothing_below(monkeypatch):
    fake_clocks(monkeypatch, [(0.0, 0.0), (1.0, 0.5)], [(0, 0), (1000, 50)])
    # waited 0.5 / 1.5 = 33 %; stolen 50 / 1000 = 5 %: below BUSY_SHARE (0.1), not named
    assert timing.CoreWait().note() == "its threads waited 33% of their time for a core"
    fake_clocks(monkeypatch, [(0.0, 0.0), (1.0, 0.05)], [(0, 0), (1000, 5)])
    assert timing.CoreWait().note() is None  # 4.8 % and 0.5 %
    monkeypatch.setattr(timing, "cores_waited", lambda: None)  # no /proc: nothing claimed
    monkeypatch.setattr(timing, "cpu_ticks", lambda: None)
    wait = timing.CoreWait()
    assert (wait.share(), wait.stolen(), wait.note()) == (None, None, None)


def _busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(timing.cores_waited() is None, reason="no /proc/self/task/*/schedstat")
@pytest.mark.slow  # ~2 s: twice as many busy processes as cores, beside a loop of ours
def test_busy_processes_beside_a_loop_make_it_wait_for_a_core():
    quiet = timing.CoreWait()
    _busy(0.2)
    assert 0.0 <= quiet.share() <= 1.0
    procs = [multiprocessing.Process(target=_busy, args=(2.0,))
             for _ in range(2 * (os.cpu_count() or 1))]
    for p in procs:
        p.start()
    try:
        time.sleep(0.3)
        wait = timing.CoreWait()
        _busy(1.0)
        # 2n busy processes and our loop share n cores: the loop is ready all the time and
        # runs about n / (2n + 1) of it, so it waits about half; a tenth is a wide margin
        assert wait.share() > timing.BUSY_SHARE
    finally:
        for p in procs:
            p.join()


def test_a_run_timed_while_other_work_held_the_cores_warns_once(monkeypatch):
    monkeypatch.setattr(timing.CoreWait, "note",
                        lambda self: "its threads waited 40% of their time for a core")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        time_samples(lambda phase: None, 2, "cpu")
    lines = [str(w.message) for w in caught if issubclass(w.category, PerfcounterWarning)]
    assert len(lines) == 1
    assert "waited 40% of their time for a core" in lines[0]
    assert "include the waits" in lines[0]  # the wall clock, the default
    monkeypatch.setattr(timing.CoreWait, "note", lambda self: None)
    monkeypatch.setattr(timing.CoreWait, "share", lambda self: 0.02)
    monkeypatch.setattr(timing.CoreWait, "stolen", lambda self: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, _, other_work = time_samples(lambda phase: None, 1, "cpu")
    assert not [w for w in caught if issubclass(w.category, PerfcounterWarning)]
    assert other_work == {"waited": 0.02, "stolen": None}  # what --save_path's JSON records


def test_a_wall_clock_calibration_on_a_busy_machine_is_flagged_a_thread_clock_one_recorded():
    wall = check_record(clock="wall", threads=2, load=[1.0, 3.2], flags=[], spreads={},
                        rounds=2, waited=0.36, stolen=0.0)
    assert not wall["passed"] and wall["waited"] == 0.36 and wall["stolen"] == 0.0
    assert wall["flags"] == ["busy: other work took 36% of the calibration's time (waited)"]
    # the thread clock leaves the waits out of every timing: recorded, not a flag
    thread = check_record(clock="thread", threads=1, load=[1.0, 3.2], flags=[], spreads={},
                          rounds=2, waited=0.36, stolen=0.0)
    assert thread["passed"]
    assert "waited 36%" in describe_check(thread)
    quiet = check_record(clock="wall", threads=2, load=[0.5], flags=[], spreads={}, rounds=2,
                         waited=0.001, stolen=None)
    assert quiet["passed"] and "waited" not in describe_check(quiet) and "stolen" not in quiet
