"""The device registry: lookups by name, alias, YAML path or CUDA device name.

Three layers, a later one replacing an entry of an earlier one with the same
name or alias: the shipped files (device_specs/*.yaml), the spec `perfcounter
calibrate` wrote (calibrated_spec_path()), and the files a user passed by path
(register_device_specs, or get_device_spec("file.yaml[:ENTRY]")). Names match
exactly, case-insensitively; an unknown name fails with the closest names.
`CUDADeviceSpec` is the registry entry of the local GPU, found by its CUDA name.
"""
from __future__ import annotations

import fnmatch
import os
import re
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from perfcounter._util import PerfcounterWarning, did_you_mean
from perfcounter.devices.dtypes import TF32, DeviceSpecError, UnknownDeviceError, as_dtype, rate_key
from perfcounter.devices.schema import load_device_specs
from perfcounter.devices.spec import DeviceSpec


def _shipped_dir() -> Path:
    """device_specs/ inside an installed package, else at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent  # perfcounter/
    for candidate in (package / "device_specs", package.parent / "device_specs"):
        if any(candidate.glob("*.yaml")):
            return candidate
    return package.parent / "device_specs"


_SHIPPED_DIR = _shipped_dir()

_shipped_cache: list[DeviceSpec] | None = None
_calibrated_cache: dict = {}
_user_specs: list[tuple[str, DeviceSpec]] = []  # (resolved file path, spec)


def perfcounter_home() -> Path:
    """$PERFCOUNTER_HOME, else $XDG_CACHE_HOME/perfcounter, else ~/.cache/perfcounter; a
    DeviceSpecError when it names something that is not a folder (checked before any work)."""
    if os.environ.get("PERFCOUNTER_HOME"):
        home = Path(os.environ["PERFCOUNTER_HOME"]).expanduser()
        if home.exists() and not home.is_dir():
            raise DeviceSpecError(f"PERFCOUNTER_HOME={os.environ['PERFCOUNTER_HOME']!r} is not a "
                                  "folder; set it to a folder (calibrate makes it) or unset it")
        return home
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "perfcounter"


def calibrated_spec_path() -> Path:
    """Where `perfcounter calibrate` writes this machine's spec."""
    return perfcounter_home() / "calibrated.yaml"


def shipped_spec_files() -> list[Path]:
    """The registry's YAML files, one per device family."""
    return sorted(_SHIPPED_DIR.glob("*.yaml"))


def _shipped() -> list[DeviceSpec]:
    global _shipped_cache
    if _shipped_cache is None:
        _shipped_cache = [s for p in shipped_spec_files() for s in load_device_specs(p)]
    return _shipped_cache


def _calibrated() -> list[DeviceSpec]:
    """The calibrated file's entries; a file that no longer loads is warned about, not fatal."""
    path = calibrated_spec_path()
    try:
        stat = path.stat()
    except OSError:
        return []
    stamp = (str(path), stat.st_mtime_ns, stat.st_size)
    if _calibrated_cache.get("stamp") != stamp:
        try:
            specs = load_device_specs(path)
        except DeviceSpecError as exc:
            warnings.warn(f"ignoring the calibrated spec file: {exc}; rerun `perfcounter "
                          "calibrate` to rewrite it", PerfcounterWarning, stacklevel=3)
            specs = []
        _calibrated_cache.update(stamp=stamp, specs=specs)
    return _calibrated_cache["specs"]


def _layers() -> list[list[DeviceSpec]]:
    return [_shipped(), _calibrated(), [spec for _, spec in _user_specs]]


def _keys(spec: DeviceSpec) -> list[str]:
    return list(dict.fromkeys(k.lower() for k in (spec.name, *spec.aliases)))


def _index() -> tuple[dict[str, DeviceSpec], dict[str, str]]:
    """canonical name -> spec, and lower-case name/alias -> canonical name.

    A later layer's entry takes the names and aliases it claims; an earlier
    entry keeps the others (and is dropped once no name reaches it).
    """
    specs: dict[str, DeviceSpec] = {}
    index: dict[str, str] = {}
    for layer in _layers():
        for spec in layer:
            specs[spec.name] = spec
            for key in _keys(spec):
                index[key] = spec.name
    reachable = set(index.values())
    return {n: s for n, s in specs.items() if n in reachable}, index


def list_device_specs(device_type: str | None = None) -> list[str]:
    """Canonical names of every known device (optionally of one device_type), sorted."""
    specs, _ = _index()
    return sorted(n for n, s in specs.items() if device_type in (None, s.device_type))


def register_device_specs(path) -> list[DeviceSpec]:
    """Load a YAML file (our schema or UPMEM's) and add its entries to the registry.

    An entry takes over the names and aliases it shares with a known entry
    (with a warning); the known entry keeps its other names.
    """
    new = load_device_specs(path)
    origin = str(Path(path).expanduser().resolve())
    _user_specs[:] = [(o, s) for o, s in _user_specs if o != origin]  # a reload replaces
    _, index = _index()
    for spec in new:
        taken = [k for k in _keys(spec) if k in index]
        if taken:
            owners = ", ".join(sorted({index[k] for k in taken}))
            warnings.warn(f"{path}: entry {spec.name!r} takes the name(s) "
                          f"{', '.join(taken)} from registry entry {owners}", PerfcounterWarning, stacklevel=2)
    _user_specs.extend((origin, spec) for spec in new)
    return new


def _split_path(text: str):
    """("file.yaml", "ENTRY") for "file.yaml:ENTRY", (text, None) for a file, else (None, None)."""
    if ":" in text:
        path, entry = text.rsplit(":", 1)
        if path.lower().endswith((".yaml", ".yml")):
            return path, entry
    if text.lower().endswith((".yaml", ".yml")) or (os.sep in text and Path(text).is_file()):
        return text, None
    return None, None


def _suggest(name: str, index: dict[str, str]) -> str:
    """The entries one of whose names starts with `name` ("h10": h100-sxm, h100-pcie, ...),
    else the names and aliases closest to it."""
    query = name.lower()
    started = {index[k] for k in index if k.startswith(query)}
    if started:
        return did_you_mean(query, started, n=5, cutoff=0)
    return did_you_mean(query, index, n=5, cutoff=0.5)


def get_device_spec(name_or_path, dtype=None) -> DeviceSpec:
    """A registry entry by name or alias (case-insensitive, exact), or from a YAML file.

    "file.yaml" (one entry) or "file.yaml:ENTRY" loads that file, adds all its
    entries to the registry and returns the entry. dtype=None keeps the
    entry's compute dtype; otherwise the spec is `with_dtype(dtype)`.
    """
    if isinstance(name_or_path, DeviceSpec):
        spec = name_or_path
    else:
        text = os.fspath(name_or_path) if isinstance(name_or_path, os.PathLike) else name_or_path
        if not isinstance(text, str) or not text.strip():
            raise UnknownDeviceError(f"expected a device name or a .yaml path, got {text!r}")
        path, entry = _split_path(text.strip())
        if path is not None:
            spec = _from_file(path, entry)
        else:
            specs, index = _index()
            key = text.strip().lower()
            if key not in index:
                raise UnknownDeviceError(
                    f"unknown device {text!r}{_suggest(key, index)} "
                    f"(`perfcounter devices` lists all {len(specs)})")
            spec = specs[index[key]]
    return spec if dtype is None else spec.with_dtype(dtype)


def _from_file(path: str, entry: str | None) -> DeviceSpec:
    specs = register_device_specs(path)
    if entry is None:
        if len(specs) == 1:
            return specs[0]
        names = ", ".join(s.name for s in specs)
        raise UnknownDeviceError(f"{path}: holds {len(specs)} devices ({names}); "
                                 f"name one as '{path}:NAME'")
    for spec in specs:
        if entry.lower() in _keys(spec):
            return spec
    index = {k: s.name for s in specs for k in _keys(s)}
    raise UnknownDeviceError(f"{path}: no entry {entry!r}{_suggest(entry, index)}")


# ---------------------------------------------------------------- the local GPU

def cuda_name_matches(pattern: str, cuda_name: str) -> bool:
    """Whether a `cuda_names` pattern names a CUDA device: the whole name, ignoring
    case, literally or as a glob (* any text, ? one character, [abc] one of).

    NB: never a regular expression (a user's regex could take exponential time);
    fnmatch's globs match in polynomial time.
    """
    pattern, cuda_name = pattern.strip().casefold(), cuda_name.strip().casefold()
    if not any(sign in pattern for sign in "*?["):
        return pattern == cuda_name
    return fnmatch.fnmatchcase(cuda_name, pattern)


def find_cuda_device_spec(cuda_name: str) -> DeviceSpec:
    """The registry entry one of whose `cuda_names` matches a CUDA device name.

    A user file's entry beats the calibrated one, which beats the shipped ones;
    two matches in one layer are an error.
    """
    specs, _ = _index()
    live = set(id(s) for s in specs.values())
    for layer in reversed(_layers()):
        hits = [s for s in layer if id(s) in live and any(
            cuda_name_matches(p, cuda_name) for p in s.cuda_names)]
        if len(hits) > 1:
            raise DeviceSpecError(f"CUDA device {cuda_name!r} matches several entries: "
                                  f"{', '.join(s.name for s in hits)}")
        if hits:
            return hits[0]
    known = sorted(s.name for s in specs.values() if s.cuda_names)
    literal = re.sub(r"([*?[])", r"[\1]", cuda_name.strip())
    raise UnknownDeviceError(
        f"no device spec matches CUDA device {cuda_name!r} (entries with CUDA names: "
        f"{', '.join(known)}); add `cuda_names: [{literal!r}]` to an entry of a YAML file "
        "and pass it to register_device_specs, or use get_device_spec(NAME)")


def _local_cuda_name() -> str:
    try:
        return torch.cuda.get_device_name()
    except (AssertionError, RuntimeError) as exc:
        raise DeviceSpecError("CUDADeviceSpec: no CUDA device to detect "
                              f"({exc}); pass name='NVIDIA H100 80GB HBM3' or use "
                              "get_device_spec(NAME)") from None


@dataclass(frozen=True)
class CUDADeviceSpec(DeviceSpec):
    """The spec of the local CUDA (or ROCm) GPU, found by `torch.cuda.get_device_name()`.

    The name is matched against the `cuda_names` of the registry; bandwidth,
    vram and peaks come from that entry (fields passed explicitly are kept).
    dtype defaults to torch.get_default_dtype(), as in torchao; with
    use_tensorcores, float32 is priced at the TF32 tensor-core rate.
    """

    device_type: str = "cuda"
    use_tensorcores: bool = True

    __hash__ = DeviceSpec.__hash__

    def __post_init__(self):
        put = object.__setattr__
        name = self.name or _local_cuda_name()
        entry = find_cuda_device_spec(name)
        put(self, "name", name)
        if self.dtype is None:
            put(self, "dtype", torch.get_default_dtype())
        for f in fields(DeviceSpec):
            if f.name in ("name", "dtype", "flops_per_s", "roofline_balancepoint",
                          "device_type"):
                continue
            if getattr(self, f.name) in (None, {}, ()):
                put(self, f.name, getattr(entry, f.name))
        if entry.name not in self.aliases:
            put(self, "aliases", (entry.name,) + tuple(self.aliases))
        if self.flops_per_s is None:
            key, table = rate_key(self.dtype), self.flops_by_dtype
            if key == torch.float32 and self.use_tensorcores and TF32 in table:
                put(self, "flops_per_s", table[TF32])
            elif key not in table:
                put(self, "flops_per_s", entry.peak_flops(key))  # warns: entry's fallback
        super().__post_init__()

    def peak_flops(self, dtype=None, *, strict: bool = False) -> float:
        key = rate_key(self.dtype if dtype is None else dtype)
        if (key != rate_key(self.dtype) and key == torch.float32 and self.use_tensorcores
                and TF32 in self.flops_by_dtype):
            return self.flops_by_dtype[TF32]
        return super().peak_flops(key, strict=strict)


def default_device_spec(dtype=None) -> DeviceSpec:
    """The device this process runs on, as well as it is known (default_spec_and_why)."""
    spec, why = default_spec_and_why(dtype)
    if spec.name == "generic-cpu":
        warnings.warn(f"{why}. Run `perfcounter calibrate` to measure it.", PerfcounterWarning,
                      stacklevel=2)
    return spec


def default_spec_and_why(dtype=None) -> tuple[DeviceSpec, str]:
    """(the device this process runs on, as well as it is known; why that one, one line).

    CUDA available: the registry entry of the local GPU (CUDADeviceSpec).
    Otherwise the spec `perfcounter calibrate` measured (calibrated_spec_path()) when it
    passed its checks (calibration_check.py), else "generic-cpu" (assumed figures, see
    device_specs/cpu.yaml): a calibration that failed its checks, or one from before
    they were recorded, is never the default.
    """
    if torch.cuda.is_available():
        if dtype is None:
            dtype = find_cuda_device_spec(_local_cuda_name()).dtype
        return CUDADeviceSpec(dtype=as_dtype(dtype)), "the local GPU's registry entry"
    calibrated = [s for s in _calibrated() if s.device_type == "cpu"]
    calibrated.sort(key=lambda s: s.name != "calibrated")  # the default name first
    passed = [s for s in calibrated if s.calibration_check.get("passed")]
    if passed:
        return (get_device_spec(passed[0], dtype),
                f"this machine's calibration ({calibrated_spec_path()}), which passed its checks")
    why = "no calibrated spec for this machine; using 'generic-cpu' (assumed figures)"
    if calibrated:
        check = calibrated[0].calibration_check
        why = (f"the calibration in {calibrated_spec_path()} "
               + ("failed its checks" if check else "predates the checks calibrate records")
               + "; using 'generic-cpu' (assumed figures)")
    return get_device_spec("generic-cpu", dtype), why
