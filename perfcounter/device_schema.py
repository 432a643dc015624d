"""Reading and writing device spec YAML files: our schema and UPMEM's, validated.

Our schema (device_specs/*.yaml, and what `perfcounter calibrate` writes):

    source: default citation for every figure of the file   # optional
    devices:
      h100-sxm:
        device_type: cuda            # cuda, cpu, mps, tpu, mobile, pim, ...
        aliases: [h100]              # exact, case-insensitive alternative names
        cuda_names: ['NVIDIA H100 80GB HBM3']   # full-match regexes for autodetection
        dtype: bfloat16              # compute dtype (default bfloat16)
        vram_GB: 80
        bandwidth_GBs: 3350
        tflops: {bfloat16: 989.5, float32: 67}  # dense; a number means `dtype`
        mem_pj_per_bit: 7
        pj_per_flop: {bfloat16: 0.5}            # a number applies to every dtype
        source: {bandwidth_GBs: "datasheet ...", default: "..."}

Figure names follow the UPMEM framework's accelerator format (mem_bw_GBs,
tflops, tflops_int4, pj_per_tflop, host_to_device_bw_GBs, ...), so an UPMEM
file — entries at the top level, no `devices:` — loads as is: its names
become lower case with hyphens ("PIM_AI_4chip" -> "pim-ai-4chip", the original
kept as an alias), `tflops` is bfloat16 and pj_per_tflop 0.4e+12 is 0.4 pJ/FLOP.

Every error names the file, the entry, the field, the value and what was expected.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import tempfile
from pathlib import Path

import yaml

from perfcounter.devices import DeviceSpec, DeviceSpecError, as_dtype, dtype_name

# YAML figure -> (DeviceSpec field, scale to SI units, must be > 0)
FIGURES = {
    "bandwidth_GBs": ("bandwidth", 1e9, True),
    "mem_bw_GBs": ("bandwidth", 1e9, True),
    "vram_GB": ("vram", 1e9, True),
    "tflops": ("flops_by_dtype", 1e12, True),
    "tflops_int4": ("flops_by_dtype", 1e12, True),
    "pj_per_flop": ("pj_per_flop_by_dtype", 1.0, False),
    "pj_per_tflop": ("pj_per_flop_by_dtype", 1e-12, False),
    "mem_pj_per_bit": ("mem_pj_per_bit", 1.0, False),
    "host_to_device_bw_GBs": ("host_to_device_bw", 1e9, True),
    "host_to_device_pj_per_bit": ("host_to_device_pj_per_bit", 1.0, False),
    "device_to_host_bw_GBs": ("device_to_host_bw", 1e9, True),
    "device_to_host_pj_per_bit": ("device_to_host_pj_per_bit", 1.0, False),
    "softmax_ns_per_element": ("softmax_ns_per_element", 1.0, True),
    "SiLU_ns_per_element": ("silu_ns_per_element", 1.0, True),
    "silu_ns_per_element": ("silu_ns_per_element", 1.0, True),
    "RMSNorm_ns_per_element": ("rmsnorm_ns_per_element", 1.0, True),
    "rmsnorm_ns_per_element": ("rmsnorm_ns_per_element", 1.0, True),
    "tdp_W": ("tdp_w", 1.0, True),
    "static_W": ("static_w", 1.0, False),
}
OTHER_FIELDS = ("device_type", "dtype", "aliases", "cuda_names", "source", "notes")
UPMEM_REQUIRED = ("host_to_device_bw_GBs", "host_to_device_pj_per_bit",
                  "device_to_host_bw_GBs", "device_to_host_pj_per_bit", "mem_bw_GBs",
                  "mem_pj_per_bit", "tflops", "pj_per_tflop")
UPMEM_FIELDS = UPMEM_REQUIRED + ("tflops_int4", "softmax_ns_per_element",
                                 "SiLU_ns_per_element", "RMSNorm_ns_per_element")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _scaled(value: float, scale: float) -> float:
    """value in SI units; divides by the inverse of a small scale so 0.4e12 / 1e12 is 0.4."""
    return value * scale if scale >= 1 else value / round(1 / scale)


class _Entry:
    """Error context: which file and which entry is being read."""

    def __init__(self, origin: str, name):
        self.origin, self.name = origin, name

    def error(self, message: str) -> DeviceSpecError:
        return DeviceSpecError(f"{self.origin}: entry {self.name!r}: {message}")

    def bad(self, key: str, value, expected: str) -> DeviceSpecError:
        return self.error(f"field {key!r}: got {value!r}; expected {expected}")


def _number(ctx: _Entry, key: str, value, positive: bool) -> float:
    what = "a positive number" if positive else "a non-negative number"
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        parsed = float(value)  # PyYAML reads 1e12 (no dot, no sign) as a string
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        parsed = float(value)
    else:
        raise ctx.bad(key, value, what)
    if not math.isfinite(parsed) or parsed < 0 or (positive and parsed == 0):
        raise ctx.bad(key, value, what)
    return parsed


def _strings(ctx: _Entry, key: str, value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ctx.bad(key, value, "a list of non-empty strings")
    return tuple(v.strip() for v in value)


def _per_dtype(ctx: _Entry, key: str, value, scale: float, positive: bool, dtypes) -> dict:
    """{dtype: figure} from a number (applies to `dtypes`) or a {dtype name: number} map."""
    if not isinstance(value, dict):
        return {d: _scaled(_number(ctx, key, value, positive), scale) for d in dtypes}
    out = {}
    for name, figure in value.items():
        try:
            dtype = as_dtype(str(name))
        except DeviceSpecError as exc:
            raise ctx.bad(f"{key}.{name}", name, f"a dtype name ({exc})") from None
        if dtype in out:
            raise ctx.bad(key, value, f"each dtype once ({dtype_name(dtype)} repeated)")
        out[dtype] = _scaled(_number(ctx, f"{key}.{name}", figure, positive), scale)
    if not out:
        raise ctx.bad(key, value, "a number or a non-empty {dtype: number} map")
    return out


def _check_fields(ctx: _Entry, entry: dict, allowed, required) -> None:
    for key in entry:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ctx.error(f"unknown field {key!r}{hint} (valid: {', '.join(allowed)})")
    for key in required:
        names = key if isinstance(key, tuple) else (key,)
        if not any(n in entry for n in names):
            raise ctx.error(f"missing required field {' or '.join(map(repr, names))}")
    for a, b in (("bandwidth_GBs", "mem_bw_GBs"), ("pj_per_flop", "pj_per_tflop"),
                 ("silu_ns_per_element", "SiLU_ns_per_element"),
                 ("rmsnorm_ns_per_element", "RMSNorm_ns_per_element")):
        if a in entry and b in entry:
            raise ctx.error(f"fields {a!r} and {b!r} are the same figure; give one")


def _sources(ctx: _Entry, entry: dict, default: str | None) -> dict:
    """DeviceSpec.source: spec field -> citation, for every figure the entry gives."""
    given = entry.get("source", default)
    if given is None:
        given = {}
    elif isinstance(given, str) and given.strip():
        given = {"default": given}
    if not isinstance(given, dict):
        raise ctx.bad("source", given, "a citation string or a {figure: citation} map")
    for key, text in given.items():
        if key != "default" and key not in FIGURES:
            raise ctx.bad("source", key, f"'default' or a figure name ({', '.join(FIGURES)})")
        if not isinstance(text, str) or not text.strip():
            raise ctx.bad(f"source.{key}", text, "a non-empty citation string")
    out: dict[str, str] = {}
    for key in entry:
        if key not in FIGURES:
            continue
        text = given.get(key) or given.get("default") or default
        if not text:
            raise ctx.error(f"figure {key!r} has no source; add source: {{{key}: "
                            "'<datasheet name or URL>'}} (or a file-level source:)")
        target = FIGURES[key][0]
        out[target] = text if out.get(target) in (None, text) else f"{out[target]}; {text}"
    return out


def _build(ctx: _Entry, name: str, entry: dict, device_type: str, aliases, source) -> DeviceSpec:
    dtype = as_dtype(entry["dtype"]) if "dtype" in entry else None
    tflops = entry["tflops"]
    flops = _per_dtype(ctx, "tflops", tflops, 1e12, True, [dtype or as_dtype("bfloat16")])
    if dtype is None:
        dtype = as_dtype("bfloat16")
        if dtype not in flops:
            raise ctx.error(f"field 'dtype' is required: tflops has no bfloat16 "
                            f"(it has {', '.join(dtype_name(d) for d in flops)})")
    elif dtype not in flops:
        raise ctx.bad("dtype", entry["dtype"],
                      f"one of the tflops dtypes ({', '.join(dtype_name(d) for d in flops)})")
    if "tflops_int4" in entry:
        int4 = as_dtype("int4")
        if int4 in flops:
            raise ctx.error("int4 is given both in 'tflops' and in 'tflops_int4'")
        flops[int4] = _number(ctx, "tflops_int4", entry["tflops_int4"], True) * 1e12
    pj = {}
    for key in ("pj_per_flop", "pj_per_tflop"):
        if key in entry:
            pj = _per_dtype(ctx, key, entry[key], FIGURES[key][1], False, list(flops))
    kwargs = {}
    for key, (target, scale, positive) in FIGURES.items():
        if key in entry and target not in ("flops_by_dtype", "pj_per_flop_by_dtype"):
            kwargs[target] = _scaled(_number(ctx, key, entry[key], positive), scale)
    try:
        return DeviceSpec(device_type=device_type, name=name, dtype=dtype, flops_by_dtype=flops,
                          pj_per_flop_by_dtype=pj, source=source, aliases=aliases,
                          cuda_names=_patterns(ctx, entry.get("cuda_names", [])), **kwargs)
    except DeviceSpecError as exc:
        raise ctx.error(str(exc)) from None


def _patterns(ctx: _Entry, value) -> tuple[str, ...]:
    patterns = _strings(ctx, "cuda_names", value) if value else ()
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ctx.bad("cuda_names", p, f"a regular expression ({exc})") from None
    return patterns


def _name(ctx: _Entry, name) -> str:
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise ctx.error("the entry name must be a non-empty string without ':'")
    return name.strip()


def parse_device_specs(data, origin: str) -> list[DeviceSpec]:
    """DeviceSpecs from a loaded YAML document (our schema or UPMEM's)."""
    if not isinstance(data, dict) or not data:
        raise DeviceSpecError(f"{origin}: expected a mapping with 'devices:' (perfcounter "
                              f"schema) or UPMEM accelerator entries, got {type(data).__name__}")
    if "devices" in data:
        extra = set(data) - {"devices", "source"}
        if extra:
            raise DeviceSpecError(f"{origin}: unknown top-level field(s) {sorted(extra)}; "
                                  "expected 'devices' and optionally 'source'")
        default = data.get("source")
        if default is not None and (not isinstance(default, str) or not default.strip()):
            raise DeviceSpecError(f"{origin}: top-level 'source': got {default!r}; "
                                  "expected a citation string")
        entries, upmem = data["devices"], False
        if not isinstance(entries, dict) or not entries:
            raise DeviceSpecError(f"{origin}: 'devices': expected a non-empty mapping of "
                                  f"name -> entry, got {entries!r}")
    else:
        entries, upmem, default = data, True, None
    specs, seen = [], {}
    for raw_name, entry in entries.items():
        ctx = _Entry(origin, raw_name)
        name = _name(ctx, raw_name)
        if not isinstance(entry, dict):
            raise ctx.error(f"expected a mapping of fields, got {entry!r}")
        if upmem:
            _check_fields(ctx, entry, UPMEM_FIELDS, UPMEM_REQUIRED)
            canonical = name.replace("_", "-").lower()
            aliases = (name,) if canonical != name else ()
            source = _sources(ctx, entry, f"UPMEM-format file {origin}, entry {name}")
            spec = _build(ctx, canonical, entry, "accelerator", aliases, source)
        else:
            _check_fields(ctx, entry, tuple(FIGURES) + OTHER_FIELDS,
                          ("device_type", ("bandwidth_GBs", "mem_bw_GBs"), "tflops"))
            device_type = entry["device_type"]
            if not isinstance(device_type, str) or not device_type.strip():
                raise ctx.bad("device_type", device_type, "a string such as cuda, cpu, pim")
            if "notes" in entry and not isinstance(entry["notes"], str):
                raise ctx.bad("notes", entry["notes"], "a string")
            aliases = _strings(ctx, "aliases", entry.get("aliases", []) or [])
            spec = _build(ctx, name, entry, device_type.strip(), aliases,
                          _sources(ctx, entry, default))
        for key in dict.fromkeys(k.lower() for k in (spec.name, *spec.aliases)):
            if key in seen:
                raise ctx.error(f"name or alias {key!r} is already used by entry "
                                f"{seen[key]!r} of this file")
            seen[key] = spec.name
        specs.append(spec)
    return specs


def load_device_specs(path) -> list[DeviceSpec]:
    """DeviceSpecs from one YAML file; errors name the file."""
    path = Path(path).expanduser()
    if not path.is_file():
        nearby = sorted(p.name for p in path.parent.glob("*.y*ml")) if path.parent.is_dir() else []
        hint = f" (.yaml files there: {', '.join(nearby)})" if nearby else ""
        raise DeviceSpecError(f"{path}: no such device spec file{hint}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DeviceSpecError(f"{path}: not a valid YAML file: {exc}") from None
    return parse_device_specs(data, str(path))


# ---------------------------------------------------------------- writing

_BACK = {"bandwidth": "bandwidth_GBs", "vram": "vram_GB", "flops_by_dtype": "tflops",
         "pj_per_flop_by_dtype": "pj_per_flop"}


def spec_to_entry(spec: DeviceSpec) -> dict:
    """A DeviceSpec as one entry of our schema (the inverse of parsing)."""
    entry: dict = {"device_type": spec.device_type}
    if spec.aliases:
        entry["aliases"] = list(spec.aliases)
    if spec.cuda_names:
        entry["cuda_names"] = list(spec.cuda_names)
    if spec.dtype is not None:
        entry["dtype"] = dtype_name(spec.dtype)
    targets = {}
    for key, (target, scale, _) in FIGURES.items():
        if target in targets.values() or key[0].isupper():
            continue
        targets[key] = target
        value = getattr(spec, target)
        if target in ("flops_by_dtype", "pj_per_flop_by_dtype"):
            if value:
                entry[key] = {dtype_name(d): v / scale for d, v in value.items()}
        elif value is not None:
            entry[key] = value / scale
    back = {t: k for k, t in targets.items()}
    entry["source"] = {back.get(f, f): text for f, text in spec.source.items() if f in back}
    return entry


def write_device_specs(path, specs: list[DeviceSpec], *, header: str = "") -> Path:
    """Write specs to `path` in our schema, atomically; other entries already there are kept."""
    path = Path(path).expanduser()
    devices: dict = {}
    if path.is_file():
        for old in load_device_specs(path):
            devices[old.name] = spec_to_entry(old)
    for spec in specs:
        devices[spec.name] = spec_to_entry(spec)
    parse_device_specs({"devices": devices}, str(path))  # never write what cannot be read
    text = yaml.safe_dump({"devices": devices}, sort_keys=False, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(("".join(f"# {line}\n" for line in header.splitlines())) + text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
