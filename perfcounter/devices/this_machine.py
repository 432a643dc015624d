"""The spec a run timed on this machine's CPU is priced on when no --device_spec names one.

    spec, why = spec_for_run(torch.float32, measure=True)   # generate.py's real CPU runs

The registry's default (registry.default_spec_and_why) is this machine's saved calibration
when it passed its checks. Without one it is "generic-cpu", an assumed 8-core desktop: beside
a run timed here its predictions read whatever this machine is not (the built-in default job
on a 2-core VM: decode measured ÷ predicted 2.7-3.5). A run that is timed here is therefore
priced on this machine measured first, in-process: `perfcounter calibrate`'s measurements
(devices.calibrate: triad, matmuls, the host's cost per op call, each class's curve, matmuls
by rows; each figure twice, the faster kept, calibration_check's rules applied) at the run's
dtypes only and a shorter time per point (QUICK: ~11 s on a quiet 2-core VM against ~23 s for
a full calibration). It is used only when it passed those checks, else generic-cpu, with the
measurement's failure in the reason.

The measurement has a wall budget, BUDGET_S (timing.Budget): it stops when the budget is
spent, and stops early, saying so, once other work has taken more than BUSY_SHARE of its
threads' time (a measurement on a busy machine fails its checks anyway; it took 81-157 s on a
2-core VM at load 5-10 before it did).

Its result, passed or failed, with the date and the load before and after, is saved in
$PERFCOUNTER_HOME/this-machine.json (saved_path(); atomically) and reused by later runs
instead of measuring again: a passed one for REUSE["passed"] (7 days) while it covers the
run's dtypes and torch's thread count is the same, a failed one for REUSE["failed"] (1 day),
whatever the run. Past that, or for a run it does not cover, the next run measures again
and replaces it. `perfcounter calibrate` stays the proper way: its saved calibration, once it
passed, is the registry's default and no run measures at all; deleting the file measures
again at the next run.

$PERFCOUNTER_MEASURE=0 keeps the registry's default (generic-cpu) without measuring or reading
the file, as the test suite does; `--device_spec generic-cpu` names it for one run.
"""
from __future__ import annotations

import datetime
import json
import os
import warnings
from pathlib import Path

import torch

from perfcounter._util import PerfcounterWarning, atomic_write
from perfcounter.devices.calibrate import calibrate
from perfcounter.devices.calibration_check import describe_check, load_average
from perfcounter.devices.dtypes import DeviceSpecError, as_dtype, dtype_name
from perfcounter.devices.registry import (calibrated_spec_path, default_spec_and_why,
                                          get_device_spec, perfcounter_home)
from perfcounter.devices.schema import parse_device_specs
from perfcounter.devices.spec import DeviceSpec
from perfcounter.devices.spec_file import spec_to_entry
from perfcounter.devices.timing import Budget, MeasureStopped

NAME = "this-machine"  # the measured spec's name, as tables print it
ENV = "PERFCOUNTER_MEASURE"
# calibrate's keywords for a run's measurement: every part, each figure twice (the faster
# kept, the spread recorded), 50 ms of timing a point instead of 200
QUICK = {"rounds": 2, "min_time": 0.05}
BUDGET_S = 15.0  # the measurement's wall budget (the module doc)
REUSE = {"passed": datetime.timedelta(days=7), "failed": datetime.timedelta(days=1)}


def measuring_allowed() -> bool:
    """False where $PERFCOUNTER_MEASURE is "0"; a DeviceSpecError naming the valid values
    where it is set to anything but "0" or "1"."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise DeviceSpecError(f"{ENV}={os.environ[ENV]!r} is not valid; valid: 0 (never "
                              f"measure this machine for a run) or 1 (the default)")
    return value == "1"


def run_dtypes(dtype) -> tuple[str, ...]:
    """The dtypes a run's measurement times: float32 (the host's base figures) and the run's."""
    name = dtype_name(as_dtype(dtype))
    return ("float32",) if name == "float32" else ("float32", name)


def saved_path() -> Path:
    """Where a run's measurement of this machine is kept ($PERFCOUNTER_HOME/this-machine.json)."""
    return perfcounter_home() / "this-machine.json"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _when(record: dict) -> str:
    """The record's date and load, as a reason quotes them."""
    at = datetime.datetime.fromisoformat(record["measured_at"]).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join("?" if v is None else f"{v:g}" for v in record.get("load", []))
    return f"{at}, load {load or '?'}"


def saved_measurement(dtypes: tuple[str, ...]) -> tuple[dict | None, DeviceSpec | None]:
    """(the saved record, its spec where it passed) when a run of `dtypes` reuses it (the
    module doc's rule), else (None, None): no file, one that does not read, one too old, from
    the future, or a passed one that misses a dtype or was measured with other threads."""
    try:
        record = json.loads(saved_path().read_text())
        at = datetime.datetime.fromisoformat(record["measured_at"])
        age = _now() - at
        passed = record["passed"] is True
        if age < datetime.timedelta(0) or age > REUSE["passed" if passed else "failed"]:
            return None, None
        if not passed:
            return record, None
        if not set(dtypes) <= set(record["dtypes"]) or record["threads"] != torch.get_num_threads():
            return None, None
        spec = parse_device_specs({"devices": {NAME: record["spec"]}}, str(saved_path()))[0]
        return record, spec
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None, None  # DeviceSpecError is a ValueError: measured again, file replaced


def _save(record: dict) -> str:
    """The record written to saved_path(), atomically; where that fails, a warning and ''."""
    try:
        return str(atomic_write(saved_path(), json.dumps(record, indent=1, allow_nan=False)
                                + "\n", mkdir=True))
    except (OSError, ValueError, DeviceSpecError) as e:
        warnings.warn(f"could not save this machine's measurement to {saved_path()} ({e}); "
                      "the next run measures again", PerfcounterWarning, stacklevel=3)
        return ""


def measure_now(dtypes: tuple[str, ...], budget_s: float = BUDGET_S) -> tuple[dict, DeviceSpec | None]:
    """Measure this machine within `budget_s` (timing.Budget) and save the result, passed or
    failed (saved_path()): (the record, the spec where it passed)."""
    load, cal, stopped = [load_average()], None, None
    with Budget(budget_s) as budget:
        try:
            cal = calibrate(dtypes=dtypes, **QUICK)
        except MeasureStopped as e:
            stopped = str(e)
    took = budget.elapsed()
    load.append(load_average())
    passed = cal is not None and bool(cal.check.get("passed"))
    result = (f"stopped after {took:.1f} s: {stopped}" if stopped else
              f"took {took:.0f} s and {describe_check(cal.check)}")
    spec = cal.to_spec(NAME) if passed else None
    record = {"measured_at": _now().isoformat(timespec="seconds"), "passed": passed,
              "took_s": round(took, 2), "load": load, "dtypes": list(dtypes),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "result": result,
              "spec": spec_to_entry(spec) if spec is not None else None}
    record["saved_to"] = _save(record)
    return record, spec


def spec_for_run(dtype=None, *, measure: bool) -> tuple[DeviceSpec, str]:
    """(the spec a run is priced on, why, one line): the registry's default; where that is
    generic-cpu and `measure` (a run timed on this CPU) and measuring is allowed, this
    machine's saved measurement when the rule reuses it, else this machine measured now
    (and saved), when the measurement passed its checks (the module doc)."""
    allowed = measuring_allowed()  # a bad $PERFCOUNTER_MEASURE is refused in any run
    spec, why = default_spec_and_why(dtype)
    if spec.name != "generic-cpu" or not measure or not allowed:
        return spec, why  # the caller prints why (generate.py's `Device spec:` line)
    dtypes = run_dtypes(dtype if dtype is not None else torch.float32)
    proper = f"`perfcounter calibrate` measures it properly ({calibrated_spec_path()})"
    record, measured = saved_measurement(dtypes)
    if record is not None:
        until = (datetime.datetime.fromisoformat(record["measured_at"])
                 + REUSE["passed" if measured is not None else "failed"])
        again = f"reused until {until:%Y-%m-%d %H:%M} UTC ({saved_path()})"
        if measured is not None:
            return (get_device_spec(measured, dtype),
                    f"this machine as measured {_when(record)}, which passed its checks; "
                    f"{again}; {proper}")
        return spec, (f"this machine's measurement {_when(record)} {record.get('result', '')}"
                      f"; {again}; {proper}; using 'generic-cpu' (assumed figures)")
    record, measured = measure_now(dtypes)
    kept = (f"saved for later runs ({record['saved_to']})" if record["saved_to"]
            else "not saved")
    if measured is None:
        why = (f"no passed calibration is saved, and this machine measured now "
               f"({_when(record)}) {record['result']}; {kept}; using 'generic-cpu' "
               "(assumed figures)")
        warnings.warn(f"{why}. Run `perfcounter calibrate` on a quieter machine.",
                      PerfcounterWarning, stacklevel=2)
        return spec, why
    return (get_device_spec(measured, dtype),
            f"measured now in {record['took_s']:.0f} s ({_when(record)}): no passed "
            f"calibration is saved; it {describe_check(measured.calibration_check)}; {kept}; "
            f"{proper}")
