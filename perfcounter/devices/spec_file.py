"""Writing device spec YAML files: a DeviceSpec back to an entry of our schema, atomically.

`write_device_specs(path, specs)` writes the entries in our schema (what `load_device_specs`
reads back to equal specs), keeping a file that no longer loads beside it under a spare
name rather than losing it; `spec_to_entry` is one spec as a plain dict.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import yaml

from perfcounter._util import PerfcounterWarning, atomic_write
from perfcounter.devices.dtypes import DeviceSpecError, dtype_name
from perfcounter.devices.schema import (FIGURES, NESTED, load_device_specs, nested_values,
                                        parse_device_specs)
from perfcounter.devices.spec import DeviceSpec

# ---------------------------------------------------------------- writing

def spec_to_entry(spec: DeviceSpec) -> dict:
    """A DeviceSpec as one entry of our schema (the inverse of parsing)."""
    entry: dict = {"device_type": spec.device_type}
    if spec.aliases:
        entry["aliases"] = list(spec.aliases)
    if spec.cuda_names:
        entry["cuda_names"] = list(spec.cuda_names)
    if spec.dtype is not None:
        entry["dtype"] = dtype_name(spec.dtype)
    if spec.profile is not None:
        entry["profile"] = spec.profile
    targets = {}
    for key, (target, scale) in FIGURES.items():
        if target in targets.values() or key[0].isupper():
            continue  # one YAML name per field: ours, not UPMEM's spelling
        targets[key] = target
        value = getattr(spec, target)
        if target in ("flops_by_dtype", "pj_per_flop_by_dtype"):
            if value:
                entry[key] = {dtype_name(d): v / scale for d, v in value.items()}
        elif key in NESTED:
            if value:
                entry[key] = nested_values(key, value, False)
        elif value is not None:
            entry[key] = value / scale
    back = {t: k for k, t in targets.items()}
    entry["source"] = {back.get(f, f): text for f, text in spec.source.items() if f in back}
    if spec.calibration_check:
        entry["calibration_check"] = dict(spec.calibration_check)
    return entry


def _spare_name(path: Path, suffix: str) -> Path:
    """path + suffix, or + suffix.1, .2, ... : the first that does not exist."""
    candidate, n = path.with_name(path.name + suffix), 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}{suffix}.{n}")
    return candidate


def write_device_specs(path, specs: list[DeviceSpec], *, header: str = "") -> Path:
    """Write specs to `path` in our schema, atomically; other entries already there are kept.

    NB: an old file that no longer loads cannot be merged: it is copied to
    NAME.corrupt (or NAME.corrupt.N) and replaced, with a warning naming both.
    """
    path = Path(path).expanduser()
    devices: dict = {}
    broken = None
    if path.is_file():
        try:
            devices = {old.name: spec_to_entry(old) for old in load_device_specs(path)}
        except DeviceSpecError as exc:
            broken = exc
    for spec in specs:
        devices[spec.name] = spec_to_entry(spec)
    parse_device_specs({"devices": devices}, str(path))  # never write what cannot be read
    text = yaml.safe_dump({"devices": devices}, sort_keys=False, width=100)
    if broken is not None:
        kept = atomic_write(_spare_name(path, ".corrupt"), path.read_bytes())
        warnings.warn(f"replacing {path}, which does not load ({broken}); "
                      f"the old file is kept as {kept}", PerfcounterWarning, stacklevel=2)
    return atomic_write(path, "".join(f"# {line}\n" for line in header.splitlines()) + text,
                        mkdir=True)
