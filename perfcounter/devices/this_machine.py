"""The spec a run timed on this machine's CPU is priced on when no --device_spec names one.

    spec, why = spec_for_run(torch.float32, measure=True)   # generate.py's real CPU runs

The registry's default (registry.default_spec_and_why) is this machine's saved calibration
when it passed its checks. Without one it is "generic-cpu", an assumed 8-core desktop: beside
a run timed here its predictions read whatever this machine is not (the built-in default job
on a 2-core VM: decode measured ÷ predicted 2.7-3.5). A run that is timed here is therefore
priced on this machine measured first, in-process: `perfcounter calibrate`'s measurements
(devices.calibrate: triad, matmuls, the host's cost per op call, each class's curve, matmuls
by rows; each figure twice, the faster kept, calibration_check's rules applied) at the run's
dtypes only and a shorter time per point (QUICK: ~11 s on a 2-core VM against ~23 s for a
full calibration). It is used only when it passed those checks, else generic-cpu as before,
with the measurement's failure in the reason; it is never saved (files are written only where
asked): `perfcounter calibrate` saves a calibration, which later runs use without measuring.

$PERFCOUNTER_MEASURE=0 keeps the registry's default (generic-cpu) without measuring, as the
test suite does; `--device_spec generic-cpu` names it for one run.
"""
from __future__ import annotations

import os
import time
import warnings

import torch

from perfcounter._util import PerfcounterWarning
from perfcounter.devices.calibrate import calibrate
from perfcounter.devices.calibration_check import describe_check
from perfcounter.devices.dtypes import DeviceSpecError, as_dtype, dtype_name
from perfcounter.devices.registry import (calibrated_spec_path, default_spec_and_why,
                                          get_device_spec)
from perfcounter.devices.spec import DeviceSpec

NAME = "this-machine"  # the measured spec's name, as tables print it
ENV = "PERFCOUNTER_MEASURE"
# calibrate's keywords for a run's measurement: every part, each figure twice (the faster
# kept, the spread recorded), 50 ms of timing a point instead of 200
QUICK = {"rounds": 2, "min_time": 0.05}


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


def spec_for_run(dtype=None, *, measure: bool) -> tuple[DeviceSpec, str]:
    """(the spec a run is priced on, why, one line): the registry's default; where that is
    generic-cpu and `measure` (a run timed on this CPU) and measuring is allowed, this
    machine measured now when the measurement passed its checks (the module doc)."""
    allowed = measuring_allowed()  # a bad $PERFCOUNTER_MEASURE is refused in any run
    spec, why = default_spec_and_why(dtype)
    if spec.name != "generic-cpu" or not measure or not allowed:
        return spec, why  # the caller prints why (generate.py's `Device spec:` line)
    start = time.perf_counter()
    cal = calibrate(dtypes=run_dtypes(dtype if dtype is not None else torch.float32), **QUICK)
    took = time.perf_counter() - start
    saved = f"no passed calibration is saved ({calibrated_spec_path()})"
    if not cal.check.get("passed"):
        why = (f"{saved}, and this machine measured now ({took:.0f} s) "
               f"{describe_check(cal.check)}; using 'generic-cpu' (assumed figures)")
        warnings.warn(f"{why}. Run `perfcounter calibrate` on a quieter machine.",
                      PerfcounterWarning, stacklevel=2)
        return spec, why
    return (get_device_spec(cal.to_spec(NAME), dtype),
            f"measured now in {took:.0f} s: {saved}; it {describe_check(cal.check)}; not "
            f"saved: `perfcounter calibrate` saves one, and later runs skip this step")
