"""The spec a run timed on this machine's CPU is priced on when no --device_spec names one.

    spec, why = spec_for_run(torch.float32, measure=True)   # generate.py's real CPU runs

The registry's default (registry.default_spec_and_why) is this machine's saved calibration
when it passed its checks. Without one it is "generic-cpu", an assumed 8-core desktop: beside
a run timed here its predictions read whatever this machine is not (the built-in default job
on a 2-core VM: measured ÷ predicted 3.2-5.3). A run that is timed here is therefore priced on
this machine measured first, in-process: `perfcounter calibrate`'s measurements
(devices.calibrate) at the run's dtypes only, the compiled programs' host costs only for a
compiled run, a shorter time per point (QUICK), within a wall budget, BUDGET_S. The parts are
measured in the order of their value to the run (calibration_parts.py: the host's cost per
op call, the square matmul, the GEMV and elementwise curves, matmuls of up to 256 rows, then
the rest), so that a measurement cut short by its budget, or by other work on the machine,
still holds what matters most: what finished is used, and the reason names what did not
(priced at the measured triad bandwidth and matmul FLOP/s instead). A flagged point is left
out and named (calibration_check.drop_flagged); the waits other work caused and the load are
reported, not fatal. Only a measurement that holds no cost per op call or no matmul FLOP/s of
a run's dtype is not used: the run then uses generic-cpu, and says so.

Its result, with the date and the load before and after, is saved in
$PERFCOUNTER_HOME/this-machine.json (saved_path(); atomically) and reused by later runs
instead of measuring again: one that passed its checks whole for REUSE["passed"] (7 days)
while it covers the run's dtypes (and compiled programs, for a compiled run) and torch's
thread count is the same; one used in part (cut short, too many points flagged, other work
over timing.BUSY_SHARE of its time) or not used at all for a day, each reuse saying why, when
it is measured again, and how to measure now (REDO: `perfcounter calibrate`, or deleting the
file), in the `Device spec:` line and in a warning. `perfcounter calibrate` stays the proper
way: its saved calibration, once it passed, is the registry's default and no run measures.

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
# calibrate's keywords for a run's measurement: every part twice where the budget allows (the
# faster kept, the spread recorded), 50 ms of timing a point instead of 200
QUICK = {"rounds": 2, "min_time": 0.05}
BUDGET_S = 15.0  # the measurement's wall budget (the module doc)
REUSE = {"passed": datetime.timedelta(days=7), "partial": datetime.timedelta(days=1),
         "failed": datetime.timedelta(days=1)}
REDO = ("to measure again now: `perfcounter calibrate` (about a minute; every later run uses "
        "its result) or delete {path}")


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


def kind(record: dict) -> str:
    """A record's REUSE key: "passed" (its checks passed: measured whole), "partial" (used
    for what it measured) or "failed" (not used)."""
    return "passed" if record["passed"] is True else "partial" if record.get("used") \
        else "failed"


def saved_measurement(dtypes: tuple[str, ...], compiled: bool = False
                      ) -> tuple[dict | None, DeviceSpec | None]:
    """(the saved record, its spec where it was used) when a run of `dtypes` (`compiled`:
    a compiled run) reuses it (the module doc's rule), else (None, None): no file, one that
    does not read, one too old, from the future, or a used one that misses a dtype, the
    compiled programs of a compiled run, or was measured with other threads."""
    try:
        record = json.loads(saved_path().read_text())
        at = datetime.datetime.fromisoformat(record["measured_at"])
        age = _now() - at
        if age < datetime.timedelta(0) or age > REUSE[kind(record)]:
            return None, None
        if kind(record) == "failed":
            return record, None
        if not set(dtypes) <= set(record["dtypes"]) or record["threads"] != torch.get_num_threads() \
                or (compiled and not record.get("compiled")):
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


def usable(cal, dtypes: tuple[str, ...]) -> bool:
    """Whether a calibration holds what a run's prediction cannot do without: the matmul
    FLOP/s of each of `dtypes` and the host's cost per eager op call."""
    return cal is not None and {dtype_name(d) for d in cal.flops} >= set(dtypes) \
        and "eager" in cal.overhead_s


def measure_now(dtypes: tuple[str, ...], budget_s: float = BUDGET_S, compiled: bool = False,
                progress: bool = True) -> tuple[dict, DeviceSpec | None]:
    """Measure this machine within `budget_s` (calibrate's budget; `compiled`: also the
    compiled programs' host costs; `progress`: its bar, where stderr is a terminal) and save
    the result, used or not (saved_path()): (the record, the spec where it is used:
    usable())."""
    load, cal, stopped = [load_average()], None, None
    with Budget(float("inf"), busy=None) as clock:  # the whole measurement's time
        try:
            cal = calibrate(dtypes=dtypes, compiled=compiled, budget_s=budget_s,
                            **({} if progress else {"progress": False}), **QUICK)
        except MeasureStopped as e:  # not even the triad finished
            stopped = str(e)
    took = clock.elapsed()
    load.append(load_average())
    used = usable(cal, dtypes)
    result = (f"stopped after {took:.1f} s: {stopped}" if stopped else
              f"took {took:.0f} s and {describe_check(cal.check)}"
              + ("" if used else "; it holds no cost per op call or no matmul FLOP/s of "
                 f"{' or '.join(dtypes)}, so it is not used"))
    spec = cal.to_spec(NAME) if used else None
    record = {"measured_at": _now().isoformat(timespec="seconds"),
              "passed": used and bool(cal.check.get("passed")), "used": used,
              "took_s": round(took, 2), "load": load, "dtypes": list(dtypes),
              "compiled": compiled, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "result": result,
              "spec": spec_to_entry(spec) if spec is not None else None}
    record["saved_to"] = _save(record)
    return record, spec


def _until(record: dict) -> str:
    at = datetime.datetime.fromisoformat(record["measured_at"]) + REUSE[kind(record)]
    return f"{at:%Y-%m-%d %H:%M} UTC"


def spec_for_run(dtype=None, *, measure: bool, execution: str = "eager",
                 progress: bool = True) -> tuple[DeviceSpec, str]:
    """(the spec a run is priced on, why, one line): the registry's default; where that is
    generic-cpu and `measure` (a run timed on this CPU) and measuring is allowed, this
    machine's saved measurement when the rule reuses it, else this machine measured now
    (and saved), when the measurement holds what the run needs (the module doc). A
    measurement used in part, or not at all, is said so in a warning too, with REDO.
    `progress`: the measurement's bar (off: --quiet)."""
    allowed = measuring_allowed()  # a bad $PERFCOUNTER_MEASURE is refused in any run
    spec, why = default_spec_and_why(dtype)
    if spec.name != "generic-cpu" or not measure or not allowed:
        return spec, why  # the caller prints why (generate.py's `Device spec:` line)
    dtypes = run_dtypes(dtype if dtype is not None else torch.float32)
    proper = f"`perfcounter calibrate` measures it properly ({calibrated_spec_path()})"
    record, measured = saved_measurement(dtypes, compiled=execution != "eager")
    if record is not None:
        head = f"this machine's measurement {_when(record)} {record['result']}"
        if kind(record) == "passed":
            return (get_device_spec(measured, dtype),
                    f"this machine as measured {_when(record)}, which passed its checks; "
                    f"reused until {_until(record)} ({saved_path()}); {proper}")
        head += f"; reused until {_until(record)} ({saved_path()})"
    else:
        record, measured = measure_now(dtypes, compiled=execution != "eager",
                                       progress=progress)
        kept = (f"saved for later runs ({record['saved_to']})" if record["saved_to"]
                else "not saved")
        if kind(record) == "passed":
            return (get_device_spec(measured, dtype),
                    f"measured now in {record['took_s']:.0f} s ({_when(record)}): no passed "
                    f"calibration is saved; it {describe_check(measured.calibration_check)}; "
                    f"{kept}; {proper}")
        head = (f"no passed calibration is saved, and this machine measured now "
                f"({_when(record)}) {record['result']}; {kept}"
                + (f", reused until {_until(record)}" if record["saved_to"] else ""))
    if measured is not None:
        why = (f"{head}; used for what it measured (a part it did not: at its measured triad "
               f"bandwidth and matmul FLOP/s); {REDO.format(path=saved_path())}")
        spec = get_device_spec(measured, dtype)
    else:
        why = (f"{head}; using 'generic-cpu' (assumed figures); "
               f"{REDO.format(path=saved_path())}")
    warnings.warn(why, PerfcounterWarning, stacklevel=2)
    return spec, why
