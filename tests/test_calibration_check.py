"""Calibration on a shared machine: repeated points merged (the fastest kept), their spread,
the plausibility rules by hand, and a noisy clock that yields a flagged calibration — which
is written with its flags and its load, and never becomes the default spec."""
import time

import pytest
import torch

from perfcounter.cli.main import main
from perfcounter.devices import calibrated_spec_path, default_device_spec, load_device_specs
from perfcounter.devices import calibration_check as C
from perfcounter.devices import op_rates, overheads
from perfcounter.devices import calibrate as calibrate_module
from perfcounter.devices.calibrate import calibrate
from perfcounter.devices.registry import default_spec_and_why

MB = 1 << 20


@pytest.fixture(autouse=True)
def isolated_home(monkeypatch, tmp_path):
    """A calibration written by a test lands in a folder of its own, never this machine's."""
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))


def test_best_of_keeps_the_faster_figure_and_spread_says_by_how_much():
    a = {"curves": {"gemv": {"float32": [(1.0, 10e9, 5e9, 2e9)]}}, "rows": {"float32": {2: 4e9}},
         "flops": {"float32": 90e9}}
    b = {"curves": {"gemv": {"float32": [(1.0, 8e9, 6e9, 2e9)]}}, "rows": {"float32": {2: 5e9}},
         "flops": {"float32": 60e9}}
    best = C.best_of(a, b)
    assert best["curves"]["gemv"]["float32"] == [(1.0, 10e9, 6e9, 2e9)]
    assert best["rows"] == {"float32": {2: 5e9}} and best["flops"] == {"float32": 90e9}
    # spread: warm 10/8 - 1 = 0.25, cold 6/5 - 1 = 0.2 -> 0.25; rows 5/4 - 1 = 0.25;
    # flops 90/60 - 1 = 0.5 (a table of numbers: its worst point, named by the table)
    assert C.spread(a, b) == {"curves gemv float32": 0.25, "rows float32": 0.25, "flops": 0.5}


def test_best_of_keeps_the_smaller_of_two_overheads():
    # overheads are seconds: a slow spell of the host makes them larger, never smaller, so
    # eager 7.2 us against 11.9 us keeps 7.2; compiled 24.8 against 16.8 keeps 16.8 (the H200
    # calibration that kept the larger of each: 11.9 and 24.8, 0.65-0.83 of its models' steps)
    a = {"eager": 11.9e-6, "compiled": 24.8e-6, "kernel": 1.15e-6}
    b = {"eager": 7.2e-6, "compiled": 16.8e-6, "kernel": 0.97e-6}
    assert C.best_of(a, b, seconds=True) == {"eager": 7.2e-6, "compiled": 16.8e-6,
                                             "kernel": 0.97e-6}
    assert C.best_of(a, b) == a  # rates: the larger


class Host:
    """HostCosts with timers that play a host two speeds apart: each timing reads its
    next value from `times` (a list per timing), one value per sample."""

    def __init__(self, calls, times, launches=(), dtype_calls=None):
        self.host = op_rates.HostCosts.__new__(op_rates.HostCosts)
        self.host.calls, self.host.launches = calls, list(launches)
        self.host.dtype_calls = dtype_calls or {}
        self.host.timers = {name: iter(values).__next__ for name, values in times.items()}
        self.host.fastest, self.host.samples = {}, []


def test_the_hosts_costs_keep_the_fastest_sample_and_record_the_spread():
    # a CPU host, 100 op calls a step; sample 1 in a slow spell (warm 1.1 ms, cold 2.0 ms,
    # streams 0.5 ms), sample 2 fast (0.6, 1.2, 0.4 ms); the compiled tiny step (27 launches
    # at 2 layers, 99 at 8) 0.2 / 0.56 ms in both: (0.56 - 0.2) ms / 72 = 5 us a launch,
    # 0.2 ms - 27 x 5 us = 65 us a step
    h = Host(100, {"warm": [1.1e-3, 0.6e-3], "cold": [2.0e-3, 1.2e-3],
                   "streams": [0.5e-3, 0.4e-3], "compiled 2": [0.2e-3] * 2,
                   "compiled 8": [0.56e-3] * 2}, launches=(27, 99)).host
    first = h.sample()
    # eager 1.1 ms / 100 = 11 us; cold (2.0 - 0.5) ms / 100 = 15 us
    assert first == pytest.approx({"eager": 11e-6, "eager_cold": 15e-6, "compiled": 5e-6,
                                   "compiled_step": 65e-6})
    h.sample()
    # the fastest of each timing: eager 0.6 ms / 100 = 6 us, cold (1.2 - 0.4) / 100 = 8 us
    assert h.figures() == pytest.approx({"eager": 6e-6, "eager_cold": 8e-6, "compiled": 5e-6,
                                         "compiled_step": 65e-6})
    # spread: 11 / 6 - 1 = 0.833; cold 15 / 8 - 1 = 0.875 (sample 2: (1.2 - 0.4) / 100 = 8
    # us); the compiled step's figures the same in both samples: 0
    assert h.spread() == {"eager": 0.833, "eager_cold": 0.875, "compiled": 0.0,
                          "compiled_step": 0.0}


def test_a_gpus_compiled_costs_come_from_each_depths_fastest_step():
    # launches 27 at 2 layers, 99 at 8 (test_gpu_calibration); the 8-layer step fast in
    # sample 1 (1.685 ms), the 2-layer step fast in sample 2 (0.605 ms):
    # (1.685 - 0.605) ms / 72 = 15 us a launch; 0.605 ms - 27 x 15 us = 0.2 ms a step
    h = Host(100, {"warm": [1e-3] * 2, "cold": [1e-3] * 2, "streams": [0.0] * 2,
                   "compiled 2": [0.9e-3, 0.605e-3], "compiled 8": [1.685e-3, 2.5e-3],
                   "graph": [20e-6, 12e-6]}, launches=(27, 99)).host
    h.sample(), h.sample()
    got = h.figures()
    assert got["compiled"] == pytest.approx(15e-6)
    assert got["compiled_step"] == pytest.approx(0.2e-3)
    assert got["cudagraphs"] == pytest.approx(12e-6)


def test_a_rate_far_below_its_neighbours_is_flagged():
    curve = [(64e3, 20e9, 10e9, 1e9), (1 * MB, 5e9, 12e9, 1e9), (16 * MB, 22e9, 15e9, 1e9)]
    # warm at 1 MiB: 5 GB/s < 1/3 x min(20, 22) = 6.67 -> flagged; cold and FLOP/s are smooth
    (flag,) = C.curve_flags({"gemv": {"float32": curve}})
    assert flag.startswith("gemv float32 warm GB/s at 1 MiB: 5, far below its neighbours (20, 22)")
    # an end point only below 1/10 of its one neighbour: 2.1 > 22 / 10 passes, 2 < 2.2 does not
    ok = [(64e3, 2.3e9, 10e9, 1e9), (1 * MB, 22e9, 12e9, 1e9)]
    assert C.curve_flags({"gemv": {"float32": ok}}) == []
    low = [(64e3, 2e9, 10e9, 1e9), (1 * MB, 22e9, 12e9, 1e9)]
    assert len(C.curve_flags({"gemv": {"float32": low}})) == 1
    # indexing's FLOP/s (1 FLOP per call, for a rate) are placeholders: never flagged
    gather = [(64e3, 20e9, 10e9, 2e-6), (1 * MB, 21e9, 12e9, 6e-5), (16 * MB, 22e9, 15e9, 3e-6)]
    assert C.curve_flags({"indexing": {"float32": gather}}) == []


def test_a_gpus_launch_bound_smallest_set_is_not_a_wait():
    # An H200's elementwise float32 curve as a calibration read it (64 KiB, 1 MiB, 16 MiB):
    # seconds per call 65532 / 5.66e9 = 11.6 us, 1048572 / 93.7e9 = 11.2 us, 16777212 /
    # 1399e9 = 12.0 us: one launch's fixed cost each, rates 16x apart by physics.
    h200 = [(65532, 5.66e9, 6.46e9, 0.471e9), (1048572, 93.7e9, 88.3e9, 7.81e9),
            (16777212, 1399e9, 1467e9, 117e9)]
    # a CPU's rule: 5.66 < 93.7 / 10 (and 6.46 < 8.83, 0.471 < 0.781): three flags
    assert len(C.curve_flags({"elementwise": {"float32": h200}})) == 3
    assert C.curve_flags({"elementwise": {"float32": h200}}, launched=True) == []
    # launched or not, a dip in the middle is a wait: 1.5 GB/s < 1/3 x min(5.66, 1399) = 1.89
    dip = [h200[0], (1048572, 1.5e9, 88.3e9, 7.81e9), h200[2]]
    (flag,) = C.curve_flags({"elementwise": {"float32": dip}}, launched=True)
    assert flag.startswith("elementwise float32 warm GB/s at 1 MiB: 1.5, far below")
    # and so is the largest set's fall below 1/10 of the one before: 16 MiB at 9 < 93.7 / 10
    fall = h200[:2] + [(16777212, 9e9, 1467e9, 117e9)]
    assert len(C.curve_flags({"elementwise": {"float32": fall}}, launched=True)) == 1


def test_more_rows_below_fewer_rows_and_a_square_matmul_below_its_rows_are_flagged():
    rows = {"float32": {2: 4e9, 4: 1.9e9, 8: 40e9, 16: 10e9, 1024: 80e9}}
    # 4 rows: 1.9 < 0.5 x 4 -> flagged; 16 rows: 10 < 0.5 x 40 -> flagged; 1024: 80 >= 20
    flags = C.rows_flags(rows)
    assert [f.split(":")[0] for f in flags] == ["matmul float32 4 rows", "matmul float32 16 rows"]
    # the square 1024 x 1024 matmul at 60 GFLOP/s < 0.8 x 80 = 64 of its own 1024-row curve
    (flag,) = C.square_flags({"float32": 60e9}, rows, 1024)
    assert "matmul float32 1024x1024: 60 GFLOP/s, below 0.8 x its rows curve's 80" in flag
    assert C.square_flags({"float32": 70e9}, rows, 1024) == []


def test_an_eager_overhead_far_above_one_direct_call_is_flagged():
    # 87 us per op against a direct call's 1.2 us: 72x > 10x
    assert C.overhead_flags({"eager": 87e-6, "compiled": 1.2e-6}) != []
    assert C.overhead_flags({"eager": 2.7e-6, "compiled": 1.2e-6}) == []


def waiting_clock():
    """A clock of a machine where every timed call first waits 30 ms for a core: each
    reading lies 30 ms past the one before beyond the real time (deterministic)."""
    waited = [0.0]

    def now():
        waited[0] += 0.03
        return time.perf_counter() + waited[0]
    return now


@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_a_noisy_clock_gives_a_flagged_calibration_never_a_silent_one(monkeypatch):
    monkeypatch.setitem(op_rates.CLOCKS, "wall", waiting_clock())
    # no wall budget: on a machine shared with other work the 55 s one can end the second
    # round early, which is the budget's test (test_first_run.py), not this one's
    monkeypatch.setattr(calibrate_module, "BUDGET_S", float("inf"))
    # every point the noise throws off its curve fails the check here (in use, up to
    # MAX_DROPPED of them are left out and the rest passes: how many is the machine's)
    monkeypatch.setattr(C, "MAX_DROPPED", 0)
    cal = calibrate(array_bytes=1 * MB, repeats=1, matmul_n=32, dtypes=("float32",),
                    min_time=0.01, clock="wall", rounds=2, retries=1)
    check = cal.check
    assert check["passed"] is False and check["flags"]
    assert check["clock"] == "wall" and check["rounds"] == 2 and len(check["load"]) == 2
    assert set(check["spread"]) >= {"flops float32", "rows float32"}
    spec = cal.to_spec()
    assert spec.calibration_check == check


@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_a_flagged_calibration_is_written_with_its_checks_but_is_not_the_default(
        monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(op_rates.CLOCKS, "wall", waiting_clock())
    monkeypatch.setattr(calibrate_module, "BUDGET_S", float("inf"))  # as above
    monkeypatch.setattr(C, "MAX_DROPPED", 0)
    assert main(argv=["calibrate", "--array-mb", "1", "--repeats", "1", "--matmul-n", "32",
                      "--min-time", "0.01", "--dtypes", "float32", "--clock", "wall"]) == 0
    out = capsys.readouterr().out
    assert "calibration FAILED its checks (wall clock" in out
    assert "it failed its checks, so it is not the default spec" in out
    (spec,) = load_device_specs(calibrated_spec_path())
    assert spec.calibration_check["passed"] is False and spec.calibration_check["flags"]
    with pytest.warns(UserWarning, match="failed its checks; using 'generic-cpu'"):
        assert default_device_spec().name == "generic-cpu"
    assert "failed its checks" in default_spec_and_why()[1]


def test_the_thread_clock_needs_one_thread():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="the thread clock times the calling thread only"):
            op_rates.check_clock("thread")
        assert op_rates.check_clock("auto") == "wall"
        torch.set_num_threads(1)
        assert op_rates.check_clock("auto") == "thread"
    finally:
        torch.set_num_threads(threads)


def test_a_gpus_dynamic_prefill_costs_come_from_the_same_fit():
    # the tiny prefill compiled for any prompt length, 29 launches at 2 layers and 101 at 8:
    # fastest 0.75 ms and 2.19 ms: (2.19 - 0.75) ms / 72 = 20 us a launch, 0.75 ms - 29 x
    # 20 us = 0.17 ms a step; the static step's figures apart (15 us, 0.2 ms as above)
    h = Host(100, {"warm": [1e-3] * 2, "cold": [1e-3] * 2, "streams": [0.0] * 2,
                   "compiled 2": [0.605e-3] * 2, "compiled 8": [1.685e-3] * 2,
                   "dynamic 2": [0.9e-3, 0.75e-3], "dynamic 8": [2.19e-3, 2.4e-3]},
             launches=(27, 99)).host
    h.dynamic_launches = [29, 101]
    h.sample(), h.sample()
    got = h.figures()
    assert got["compiled"] == pytest.approx(15e-6)
    assert got["compiled_dynamic"] == pytest.approx(20e-6)
    assert got["compiled_dynamic_step"] == pytest.approx(0.17e-3)


@pytest.mark.slow  # compiles the tiny prefill twice (~20 s here)
def test_the_dynamic_timers_compile_the_tiny_prefill_for_any_length_and_time_it():
    launches, timers = overheads.dynamic_timers("cpu", min_time=0.01)
    assert len(launches) == len(timers) == len(overheads.COMPILED_DEPTHS)
    assert 0 < launches[0] < launches[1]  # the deeper model launches more kernels
    with torch.no_grad():
        assert all(t() > 0 for t in timers)


def test_a_bfloat16_programs_eager_cost_comes_from_its_own_steps_fastest_sample():
    # the float32 step: 100 calls, 0.6 ms -> 6 us a call; the bfloat16 step (its own count:
    # 120 calls, the float32 norms' casts added) 1.2 ms, then 0.96 ms: 0.96 ms / 120 = 8 us
    h = Host(100, {"warm": [0.6e-3] * 2, "cold": [0.6e-3] * 2, "streams": [0.0] * 2,
                   "compiled 2": [0.2e-3] * 2, "compiled 8": [0.56e-3] * 2,
                   "eager_bfloat16": [1.2e-3, 0.96e-3]}, launches=(27, 99),
             dtype_calls={"eager_bfloat16": 120}).host
    h.sample(), h.sample()
    got = h.figures()
    assert got["eager"] == pytest.approx(6e-6)
    assert got["eager_bfloat16"] == pytest.approx(8e-6)
    assert h.spread()["eager_bfloat16"] == 0.25  # 10 us / 8 us - 1


def test_the_dtype_timers_time_the_tiny_step_in_each_dtype_but_float32():
    calls, timers = overheads.dtype_timers("cpu", ["float32", "bfloat16"], min_time=0.01)
    assert set(calls) == set(timers) == {"eager_bfloat16"}
    # the bfloat16 step counts more calls than float32's 4 layers: each RMSNorm's upcast
    # and downcast (RMSNorm computes in float32) are op calls of their own
    float32_calls, _ = overheads.eager_timers("cpu", min_time=0.01)
    assert calls["eager_bfloat16"] > float32_calls
    with torch.no_grad():
        assert timers["eager_bfloat16"]() > 0


def test_calibrate_samples_the_host_between_its_parts_and_keeps_its_fast_state(monkeypatch):
    # a host whose eager cost reads 9 us in each round's overheads unit and 5 us in the
    # samples between the other units (HOST_EVERY_S = 0: after every unit): float32 with the
    # compiled programs is 12 units (calibration_parts.units: overheads, flops, 7 curves, 2
    # rows, compiled), sampled 1 + 10 + 1 = 12 times in round 1 and 1 + 10 = 11 in round 2
    # (compiled is not measured again): 23 samples; the calibration keeps 5 us
    seen = []

    class Alternating:
        samples = seen

        def __init__(self, *args, **kw):
            pass

        def add_compiled(self):
            pass

        def sample(self):
            seen.append(9e-6 if len(seen) in (0, 12) else 5e-6)
            return {"eager": seen[-1], "eager_cold": seen[-1], "compiled": 1e-6}

        def figures(self):
            return {"eager": min(seen), "eager_cold": min(seen), "compiled": 1e-6}

        def spread(self):
            return {"eager": round(max(seen) / min(seen) - 1, 3)}
    import perfcounter.devices.calibrate as Cal
    from perfcounter.devices import calibration_parts
    monkeypatch.setattr(Cal, "HostCosts", Alternating)
    monkeypatch.setattr(calibration_parts, "HOST_EVERY_S", 0.0)
    cal = calibrate(array_bytes=1 * MB, repeats=1, matmul_n=32, dtypes=("float32",),
                    min_time=0.01, rounds=2, retries=0)
    assert len(seen) == 23 and seen[0] == seen[12] == 9e-6  # the overheads unit's readings
    assert cal.overhead_s["eager"] == 5e-6
    assert cal.check["spread"]["overheads eager"] == 0.8  # 9 / 5 - 1


def test_the_check_line_names_the_figure_that_spread_most():
    check = {"passed": True, "clock": "thread", "threads": 1, "load": [0.58, 0.7],
             "spread": {"flops float32": 0.082, "overheads eager_cold": 1.33}}
    assert C.describe_check(check) == ("passed its checks (thread clock, 1 thread(s), load "
                                       "0.58, 0.7, largest spread 133% (overheads eager_cold))")
    one_round = {**check, "spread": {}}  # nothing measured twice: no spread to report
    assert C.describe_check(one_round).endswith("load 0.58, 0.7, no spread)")
