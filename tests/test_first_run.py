"""A first run that calibrates (issue 47, item 3): the measurement of this machine is budgeted
and ordered by value (devices/calibration_parts.py), a measurement cut short still yields a spec
from what finished, a point that fails a check is left out and the rest kept, and a
measurement used in part or not at all is never reused silently. No wall-clock assertion: the
budget is spent by a fake clock, the figures are given."""
import functools
import json

import pytest
import torch

from perfcounter.devices import calibrate as cal_mod
from perfcounter.devices import calibration_check as C
from perfcounter.devices import calibration_parts, op_rates, this_machine, timing
from perfcounter.devices.timing import Budget, MeasureStopped, check_budget
from perfcounter.pricing.achievable import prediction_inputs, rate
from test_this_machine import fake_calibration

MB = 1 << 20


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """No calibration saved, measuring allowed."""
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PERFCOUNTER_MEASURE")


class FakeClock:
    """A clock that reads `t`, which a test moves: the budget spent when the test says."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def calibrate_until(monkeypatch, last_unit, **kw):
    """calibrate() on tiny sizes whose fake budget clock jumps past its 100 s as `last_unit`
    ends: the units after it never finish."""
    clock = FakeClock()
    monkeypatch.setattr(cal_mod, "Budget", functools.partial(Budget, clock=clock))
    once = calibration_parts.Parts.once

    def timed(self, unit):
        figures = once(self, unit)
        if unit == last_unit:
            clock.t = 1e9  # the budget spent: the next timing stops the measurement
        return figures
    monkeypatch.setattr(calibration_parts.Parts, "once", timed)
    return cal_mod.calibrate(array_bytes=1 * MB, repeats=1, matmul_n=32, dtypes=("float32",),
                             min_time=0.01, rounds=2, retries=0, compiled=False,
                             budget_s=100.0, **kw)


# -- the order and the budget ----------------------------------------------------------------
def test_the_units_come_in_the_order_of_their_value_to_a_run():
    plan = calibration_parts.units([torch.float32], curves=True, compiled=False)
    names = [calibration_parts.unit_name(u) for u in plan]
    # the host's cost per op call first (every op of an eager run pays it), then the square
    # matmul, decode's weight streams and the ops between them, a prompt's matmuls, the rest
    assert names == ["overheads", "flops float32", "curves gemv", "curves elementwise",
                     "rows few", "curves attention", "curves reduction", "curves strided",
                     "curves indexing", "curves gemm", "rows many"]
    with_compiled = calibration_parts.units([torch.float32], curves=True, compiled=True)
    assert with_compiled == plan + [("compiled", "")]  # torch.compile's seconds come last
    assert calibration_parts.units([torch.float32, torch.bfloat16], curves=False,
                                   compiled=True) == [("flops", "float32"), ("flops", "bfloat16")]


def test_a_measurement_cut_short_by_its_budget_keeps_what_finished(monkeypatch):
    cal = calibrate_until(monkeypatch, ("curves", "elementwise"))
    check = cal.check
    assert check["stopped"] == "its 100 s budget was spent" and not check["passed"]
    assert check["missing"] == ["rows few", "curves attention", "curves reduction",
                                "curves strided", "curves indexing", "curves gemm", "rows many"]
    assert any(f.startswith("not measured (its 100 s budget was spent): rows few")
               for f in check["flags"])
    # what finished is kept: the host's cost per op call, the matmul, two curves
    assert cal.overhead_s["eager"] > 0 and cal.flops[torch.float32] > 0
    assert set(cal.curves) == {"gemv", "elementwise"} and cal.rows == {}
    spec = cal.to_spec("this-machine")
    # the classes not measured are priced at the measured triad and matmul figures, said so
    assert spec.op_efficiency == {c: 1.0 for c in ("attention", "reduction", "strided",
                                                   "indexing", "gemm")}
    assert "attention, reduction, strided, indexing, gemm not measured (its 100 s budget was " \
           "spent)" in spec.source["op_efficiency"]
    r = rate(spec, "attention", "float32", 1 * MB)  # no warning: the spec says where it is from
    assert (r.basis, r.cold_bytes_per_s) == ("efficiency", spec.bandwidth)
    assert ("attention", "1 of peak", "sourced (op_efficiency)") in prediction_inputs(spec)
    assert "not measured" in C.describe_check(check)


def test_a_budget_spent_before_the_triad_ends_says_so(monkeypatch):
    clock = FakeClock()

    class Spent(Budget):
        def __init__(self, seconds, **kw):
            super().__init__(seconds, clock=clock, **kw)

        def __enter__(self):
            out = super().__enter__()
            clock.t += 1e9  # spent at once
            return out
    monkeypatch.setattr(cal_mod, "Budget", Spent)
    with pytest.raises(MeasureStopped, match=r"^its 5 s budget was spent$"):
        cal_mod.calibrate(array_bytes=1 * MB, repeats=1, dtypes=("float32",), budget_s=5.0)


def test_a_budget_inside_another_stops_at_the_earlier_and_busy_none_never_stops():
    outer_clock, inner_clock = FakeClock(), FakeClock()
    with Budget(10.0, clock=outer_clock, busy=None) as outer:
        with Budget(100.0, clock=inner_clock, busy=None, settle=0.0, every=0.0) as inner:
            inner.wait = type("Busy", (), {"share": lambda s: 0.9, "stolen": lambda s: 0.9})()
            check_budget()  # 90 % waits: busy=None measures on
            outer_clock.t = 11.0
            with pytest.raises(MeasureStopped, match="its 10 s budget was spent"):
                check_budget()
            assert inner.left() == 100.0 and outer.left() == 0.0
        assert timing.budget_left() == 0.0  # the outer one in force again
    assert timing.budget_left() is None


# -- fewer repetitions where a point is stable ---------------------------------------------
class StepClock:
    """A clock that moves `step` seconds each reading: every call takes `step` s."""

    def __init__(self, step):
        self.t, self.step, self.reads = 0.0, step, 0

    def __call__(self):
        self.t += self.step
        self.reads += 1
        return self.t


def test_a_slow_stable_point_is_timed_twice_not_four_times(monkeypatch):
    # every call 0.6 s (> SLOW_CALL_S 0.5): the warm-up counts, a second call within 5 % of
    # it settles the point: 2 timed readings of 2 calls (the warm-up and one more), 4 reads
    clock = StepClock(0.6)
    monkeypatch.setitem(timing.CLOCKS, "wall", clock)
    calls = []
    assert timing.time_calls(lambda: lambda: calls.append(1), "cpu", 0.05) == 0.6
    assert len(calls) == 2 and clock.reads == 4
    # a fast call (4 ms) is timed until min_time (50 ms) is spent: 13 calls (52 ms) past its
    # warm-up (float sums may need a 14th)
    monkeypatch.setitem(timing.CLOCKS, "wall", StepClock(0.004))
    calls.clear()
    timing.time_calls(lambda: lambda: calls.append(1), "cpu", 0.05)
    assert 1 + 13 <= len(calls) <= 1 + 14


def test_settled_by_hand():
    assert not timing.settled([0.6], 0.05)  # one call is no figure
    assert timing.settled([0.6, 0.62], 0.05)  # 0.62 <= 0.6 x 1.05 = 0.63
    assert not timing.settled([0.6, 0.64], 0.05)  # 0.64 > 0.63: a third call
    assert timing.settled([0.6, 0.64, 0.7, 0.61], 0.05)  # 4 calls, 2.55 s >= 0.05 s
    assert not timing.settled([0.01, 0.01], 0.05)  # 0.02 s < min_time 0.05


def test_a_rows_table_ends_after_a_point_over_its_cap(monkeypatch):
    # every call 0.6 s: the 2-row point's two inner dims take 1.2 s > ROWS_CAP_S (1 s); more
    # rows are priced at its FLOP/s (predict.rows_flops)
    monkeypatch.setitem(timing.CLOCKS, "wall", StepClock(0.6))
    monkeypatch.setattr(op_rates, "host_call_s", lambda device, clock: 0.0)
    pool = torch.full((3 * (1 << 20),), 0.5)
    rows = op_rates.matmul_rows(pool, [torch.float32], "cpu", 0.01, rows=[2, 4, 8])
    assert list(rows["float32"]) == [2]


# -- a point that fails a check is left out, the rest kept ---------------------------------
def test_a_flagged_point_is_left_out_and_the_rest_of_its_curve_kept():
    curve = [(64e3, 20e9, 10e9, 1e9), (1 * MB, 5e9, 12e9, 1e9), (16 * MB, 22e9, 15e9, 1e9)]
    got = {"flops": {"float32": 60e9}, "overheads": {"eager": 3e-6},
           "curves": {"gemv": {"float32": list(curve)}},
           "rows": {"float32": {2: 4e9, 4: 1.9e9, 8: 40e9, 1024: 80e9}}}
    flags = C.all_flags(got["flops"], got["overheads"], got["curves"], got["rows"], 1024)
    # warm 5 GB/s at 1 MiB < 1/3 x min(20, 22); 4 rows: 1.9 < 0.5 x 4; the square matmul's 60
    # GFLOP/s < 0.8 x the 1024-row curve's 80 = 64
    assert [(f.part, f.key) for f in flags] == [("flops", ("float32",)),
                                                ("rows", ("float32", 4)),
                                                ("curves", ("gemv", "float32", 1))]
    dropped = C.drop_flagged(got, flags, 1024)
    assert got["curves"]["gemv"]["float32"] == [curve[0], curve[2]]  # interpolated over
    assert got["rows"]["float32"] == {2: 4e9, 8: 40e9, 1024: 80e9}
    assert got["flops"]["float32"] == 80e9  # the rows curve's figure at 1024 rows
    assert dropped[0].startswith("matmul float32 1024x1024: 60 GFLOP/s, below 0.8 x its rows "
                                 "curve's 80; its rows curve's figure used")
    check = C.check_record(clock="wall", threads=2, load=[0.3, 0.4], flags=[], spreads={},
                           rounds=2, dropped=dropped)
    assert check["passed"] and check["dropped"] == dropped  # 3 left out: at most MAX_DROPPED
    line = C.describe_check(check)
    assert line.startswith("passed its checks (wall clock, 2 thread(s), load 0.3, 0.4, no "
                           "spread); 3 point(s) left out, their curves used without them: "
                           "matmul float32 1024x1024")
    more = C.check_record(clock="wall", threads=2, load=[0.3], flags=[], spreads={},
                          rounds=2, dropped=dropped + ["one more"])
    assert not more["passed"]  # 4 > MAX_DROPPED: the machine was too noisy to trust
    assert more["flags"][0].startswith("4 points fell off their curves (at most 3 are left out)")


def test_an_eager_overhead_far_above_a_compiled_launch_leaves_out_the_compiled_figures():
    got = {"overheads": {"eager": 87e-6, "compiled": 1.2e-6, "compiled_step": 5e-5}}
    flags = C.overhead_flags(got["overheads"])  # 87 / 1.2 = 72 > 10
    assert C.drop_flagged(got, flags, 1024)[0].endswith("; the compiled figures left out")
    assert got["overheads"] == {"eager": 87e-6}  # eager, what an eager run pays, is kept


def test_the_neighbours_spread_and_waits_are_reported_with_the_load_not_fatal():
    # on the thread clock the waits are recorded, not a flag; a spread of 343 % is reported
    check = C.check_record(clock="thread", threads=1, load=[2.5, 3.1], flags=[],
                           spreads={"overheads compiled": 3.43}, rounds=2, waited=0.4)
    assert check["passed"]
    assert C.describe_check(check) == ("passed its checks (thread clock, 1 thread(s), load "
                                       "2.5, 3.1, waited 40%, largest spread 343% (overheads "
                                       "compiled))")


# -- the run's measurement: used in part, never reused silently -----------------------------
def partial_calibration() -> cal_mod.Calibration:
    cal = fake_calibration(True)
    cal.curves = {"gemv": {"float32": [(1e6, 20e9, 15e9, 10e9), (16e6, 18e9, 14e9, 10e9)]}}
    cal.check = C.check_record(clock="wall", threads=2, load=[0.2, 0.3], flags=[], spreads={},
                               rounds=2, missing=["curves attention", "rows few"],
                               stopped="its 15 s budget was spent")
    return cal


def test_a_run_uses_a_partial_measurement_and_says_what_it_did_not_measure(fresh_machine,
                                                                        monkeypatch):
    calls = []
    monkeypatch.setattr(this_machine, "calibrate",
                        lambda **kw: calls.append(kw) or partial_calibration())
    with pytest.warns(UserWarning) as warned:
        spec, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert spec.name == "this-machine" and spec.op_curves["gemv"]  # what finished, used
    assert spec.op_efficiency == {"attention": 1.0}
    assert "not measured (its 15 s budget was spent): curves attention, rows few" in why
    assert "used for what it measured" in why and "`perfcounter calibrate`" in why
    assert str(warned[0].message) == why  # a warning too: --quiet prints no spec line
    record = json.loads(this_machine.saved_path().read_text())
    assert (record["passed"], record["used"]) == (False, True)
    with pytest.warns(UserWarning) as again:  # reused for a day, and said so each time
        reused, why = this_machine.spec_for_run(torch.float32, measure=True)
    assert len(calls) == 1 and reused.op_curves == spec.op_curves
    assert why.startswith("this machine's measurement ") and "reused until " in why
    assert "to measure again now: `perfcounter calibrate`" in why and str(again[0].message) == why
    assert this_machine.REUSE["partial"] < this_machine.REUSE["passed"]


def test_a_compiled_run_measures_the_compiled_programs_an_eager_one_does_not(fresh_machine,
                                                                          monkeypatch):
    calls = []
    monkeypatch.setattr(this_machine, "calibrate",
                        lambda **kw: calls.append(kw) or fake_calibration(True))
    this_machine.spec_for_run(torch.float32, measure=True, execution="eager")
    this_machine.spec_for_run(torch.float32, measure=True, execution="eager")  # reused
    this_machine.spec_for_run(torch.float32, measure=True, execution="compiled")  # not covered
    assert [c["compiled"] for c in calls] == [False, True]
