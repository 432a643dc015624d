"""Reading and writing device spec YAML files: our schema and UPMEM's, validated.

Our schema (device_specs/*.yaml, and what `perfcounter calibrate` writes):

    source: default citation for every figure of the file   # optional
    devices:
      h100-sxm:
        device_type: cuda            # cuda, cpu, mps, tpu, mobile, pim, ...
        aliases: [h100]              # exact, case-insensitive alternative names
        cuda_names: ['NVIDIA H100 80GB HBM3', 'NVIDIA H100*']   # names or globs
        dtype: bfloat16              # compute dtype (default bfloat16)
        vram_GB: 80
        bandwidth_GBs: 3350
        tflops: {bfloat16: 989.5, float32: 67}  # dense; a number means `dtype`
        mem_pj_per_bit: 7
        pj_per_flop: {bfloat16: 0.5}            # a number applies to every dtype
        device_link_GBs: 450         # to another non-host device (NVLink ...), one way
        interconnect_GBs: 450        # within a tensor-parallel group, one way
        source: {bandwidth_GBs: "datasheet ...", default: "..."}

Optional figures for placement and many devices (pricing/links.py), each with a source
like every other number: device_link_GBs / device_link_pj_per_bit, interconnect_GBs /
interconnect_pj_per_bit, node_link_GBs / node_link_pj_per_bit (to another node, one way),
gpus_per_node, and peak_fraction (achievable / peak, 0 < f <= 1).
For serving costs (`perfcounter serve`): usd_per_hour, the price of one device an hour
(a cloud list price per GPU, with its date in the source).
For predictions (predict.py): op_overhead_us {eager, compiled}, op_efficiency
{op class: achievable / peak}, op_curves {op class: {dtype: [[working set MB,
warm GB/s, cold GB/s, GFLOP/s], ...]}}, cache_MB (last-level cache) and matmul_rows
{dtype: {rows: FLOP/s}} (what a matmul of that many rows achieves).
`profile: upmem` marks an entry as one of the UPMEM LLM framework's simulator
profiles (its conventions apply, e.g. default per-element costs); every entry
of a file in UPMEM's own format gets it.

Figure names follow the UPMEM framework's accelerator format (mem_bw_GBs,
tflops, tflops_int4, pj_per_tflop, host_to_device_bw_GBs, ...), so an UPMEM
file — entries at the top level, no `devices:` — loads as is: its names
become lower case with hyphens ("PIM_AI_4chip" -> "pim-ai-4chip", the original
kept as an alias), `tflops` is bfloat16 and pj_per_tflop 0.4e+12 is 0.4 pJ/FLOP.

`cuda_names` are compared with torch.cuda.get_device_name() as a whole and
case-insensitively: literally, or as a glob (* any text, ? one character,
[abc] one of) — never as a regular expression. A key given twice in one
mapping is an error (plain PyYAML keeps the last one silently), and 1e12 is
read as the number it means (YAML 1.2), not as a string.

Figures are checked by DeviceSpec itself; every error names the file, the
entry, the field, the value and what was expected.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import yaml

from perfcounter._util import did_you_mean
from perfcounter.devices.dtypes import DeviceSpecError, as_dtype, dtype_name, rate_key
from perfcounter.devices.spec import DeviceSpec
from perfcounter.devices.figure_ranges import RANGES, out_of_range
from perfcounter.strict_yaml import DuplicateKey, YamlTooLarge, load_yaml, one_line


class Figure(NamedTuple):
    """Where a YAML figure lands: the DeviceSpec field, and the factor to SI units."""

    field: str
    scale: float


FIGURES = {
    "bandwidth_GBs": Figure("bandwidth", 1e9),
    "mem_bw_GBs": Figure("bandwidth", 1e9),
    "vram_GB": Figure("vram", 1e9),
    "tflops": Figure("flops_by_dtype", 1e12),
    "tflops_int4": Figure("flops_by_dtype", 1e12),
    "pj_per_flop": Figure("pj_per_flop_by_dtype", 1.0),
    "pj_per_tflop": Figure("pj_per_flop_by_dtype", 1e-12),
    "mem_pj_per_bit": Figure("mem_pj_per_bit", 1.0),
    "host_to_device_bw_GBs": Figure("host_to_device_bw", 1e9),
    "host_to_device_pj_per_bit": Figure("host_to_device_pj_per_bit", 1.0),
    "device_to_host_bw_GBs": Figure("device_to_host_bw", 1e9),
    "device_to_host_pj_per_bit": Figure("device_to_host_pj_per_bit", 1.0),
    "softmax_ns_per_element": Figure("softmax_ns_per_element", 1.0),
    "SiLU_ns_per_element": Figure("silu_ns_per_element", 1.0),
    "silu_ns_per_element": Figure("silu_ns_per_element", 1.0),
    "RMSNorm_ns_per_element": Figure("rmsnorm_ns_per_element", 1.0),
    "rmsnorm_ns_per_element": Figure("rmsnorm_ns_per_element", 1.0),
    "tdp_W": Figure("tdp_w", 1.0), "static_W": Figure("static_w", 1.0),
    "idle_W": Figure("idle_w", 1.0), "usd_per_hour": Figure("usd_per_hour", 1.0),
    "device_link_GBs": Figure("device_link_bw", 1e9),
    "device_link_pj_per_bit": Figure("device_link_pj_per_bit", 1.0),
    "interconnect_GBs": Figure("interconnect_bw", 1e9),
    "interconnect_pj_per_bit": Figure("interconnect_pj_per_bit", 1.0),
    "node_link_GBs": Figure("node_link_bw", 1e9), "gpus_per_node": Figure("gpus_per_node", 1.0),
    "node_link_pj_per_bit": Figure("node_link_pj_per_bit", 1.0),
    "peak_fraction": Figure("peak_fraction", 1.0),
    "cache_MB": Figure("cache_bytes", 1e6), "op_overhead_us": Figure("op_overhead_s", 1e-6),
    "op_efficiency": Figure("op_efficiency", 1.0),
    "op_curves": Figure("op_curves", 1.0),
    "matmul_rows": Figure("matmul_rows", 1.0),
}
# nested figures (predict.py): {execution: us}, {class: fraction}, {class: {dtype: points}} with
# a point [working set MB, warm GB/s, cold GB/s, GFLOP/s]; these are the factors to SI units
NESTED = {"op_overhead_us": (1e-6,), "op_efficiency": (1.0,), "op_curves": (1e6, 1e9, 1e9, 1e9),
           "matmul_rows": (1.0,)}  # {dtype: {rows: FLOP/s}}: numbers as they are


def nested_values(key: str, value, to_si: bool):
    """A nested figure in SI units (to_si) or back in YAML units; what is not a number is
    passed on for DeviceSpec to refuse."""
    scales = NESTED[key]

    def one(v, scale):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return _scaled(v, scale) if to_si else v * round(1 / scale) if scale < 1 else v / scale
    if not isinstance(value, dict):
        return value
    if key != "op_curves":
        return {k: one(v, scales[0]) for k, v in value.items()}
    return {cls: {d: [[one(x, f) for x, f in zip(p, scales)] if isinstance(p, (list, tuple))
                      else p for p in pts] if isinstance(pts, (list, tuple)) else pts
                  for d, pts in table.items()} if isinstance(table, dict) else table
            for cls, table in value.items()}
OTHER_FIELDS = ("device_type", "dtype", "profile", "aliases", "cuda_names", "source", "notes",
                "calibration_check")  # {passed, clock, threads, load, flags, spread, waited, stolen}
UPMEM_PROFILE = "upmem"  # what `profile` says for the entries of a file in UPMEM's format
UPMEM_REQUIRED = ("host_to_device_bw_GBs", "host_to_device_pj_per_bit",
                  "device_to_host_bw_GBs", "device_to_host_pj_per_bit", "mem_bw_GBs",
                  "mem_pj_per_bit", "tflops", "pj_per_tflop")
UPMEM_FIELDS = UPMEM_REQUIRED + ("tflops_int4", "softmax_ns_per_element",
                                 "SiLU_ns_per_element", "RMSNorm_ns_per_element")
# a cuda_names pattern with one of these is a regular expression, not a name or a glob
_REGEX_SIGNS = ("\\", "|", ".*", ".+", ")?", ")*", ")+", "(?", "^", "$")


def _duplicate_error(origin: str, dup: DuplicateKey) -> DeviceSpecError:
    path, (first, second) = dup.path, dup.lines
    where = (f"(line {first})" if first == second else f"(lines {first} and {second})") \
        + "; give it once"
    if dup.upmem:
        entry, rest = path[0], path[1:]
    elif path[0] == "devices" and len(path) > 1:
        entry, rest = path[1], path[2:]
    else:
        return DeviceSpecError(f"{origin}: top-level field "
                               f"{'.'.join(map(str, path))!r} is given twice {where}")
    if not rest:
        return DeviceSpecError(f"{origin}: entry {entry!r} is given twice {where}")
    return DeviceSpecError(f"{origin}: entry {entry!r}: field "
                           f"{'.'.join(map(str, rest))!r} is given twice {where}")


# ---------------------------------------------------------------- reading

def _scaled(value, scale: float):
    """value in SI units; what is not a number is passed on for DeviceSpec to refuse.

    NB: divides by the inverse of a small scale, so that 0.4e12 / 1e12 is exactly 0.4."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value * scale if scale >= 1 else value / round(1 / scale)


class _Entry:
    """Error context: which file and which entry is being read."""

    def __init__(self, origin: str, name):
        self.origin, self.name = origin, name

    def error(self, message: str) -> DeviceSpecError:
        return DeviceSpecError(f"{self.origin}: entry {self.name!r}: {message}")

    def bad(self, key: str, value, expected: str) -> DeviceSpecError:
        return self.error(f"field {key!r}: got {value!r}; expected {expected}")


def _strings(ctx: _Entry, key: str, value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ctx.bad(key, value, "a list of non-empty strings")
    return tuple(v.strip() for v in value)


def _per_dtype(ctx: _Entry, key: str, value, dtypes, given: dict) -> dict:
    """{dtype: figure in SI units} from a number (applies to `dtypes`) or a
    {dtype name: number} map; `given` learns which YAML key and value fed each dtype."""
    field, scale = FIGURES[key]
    if not isinstance(value, dict):
        given.update({(field, rate_key(d)): (key, value) for d in dtypes})
        return {d: _scaled(value, scale) for d in dtypes}
    out = {}
    for name, figure in value.items():
        try:
            dtype = as_dtype(str(name))
        except DeviceSpecError as exc:
            raise ctx.bad(f"{key}.{name}", name, f"a dtype name ({exc})") from None
        if dtype in out:
            raise ctx.bad(key, value, f"each dtype once ({dtype_name(dtype)} repeated)")
        out[dtype] = _scaled(figure, scale)
        given[(field, rate_key(dtype))] = (f"{key}.{name}", figure)
    if not out:
        raise ctx.bad(key, value, "a number or a non-empty {dtype: number} map")
    return out


def _check_fields(ctx: _Entry, entry: dict, allowed, required) -> None:
    for key in entry:
        if key not in allowed:
            hint = did_you_mean(key, allowed, n=1, quote=True)
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
        target = FIGURES[key].field
        out[target] = text if out.get(target) in (None, text) else f"{out[target]}; {text}"
    return out


def _dtype(ctx: _Entry, value):
    try:
        return as_dtype(value)
    except DeviceSpecError as exc:
        raise ctx.bad("dtype", value, f"a dtype name ({exc})") from None


def _build(ctx: _Entry, name: str, entry: dict, device_type: str, aliases, source,
           profile=None) -> DeviceSpec:
    given: dict = {}  # (DeviceSpec field, dtype or None) -> (YAML key, YAML value)
    for key in sorted(RANGES.keys() & entry.keys()):  # each figure within its plausible range
        bad = out_of_range(key, entry[key])
        if bad is not None:
            raise ctx.bad(*bad)
    dtype = _dtype(ctx, entry["dtype"]) if "dtype" in entry else None
    flops = _per_dtype(ctx, "tflops", entry["tflops"], [dtype or as_dtype("bfloat16")], given)
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
        flops[int4] = _scaled(entry["tflops_int4"], 1e12)
        given[("flops_by_dtype", int4)] = ("tflops_int4", entry["tflops_int4"])
    pj = {}
    for key in ("pj_per_flop", "pj_per_tflop"):
        if key in entry:
            pj = _per_dtype(ctx, key, entry[key], list(flops), given)
    kwargs = {}
    for key, (target, scale) in FIGURES.items():
        if key in entry and target not in ("flops_by_dtype", "pj_per_flop_by_dtype"):
            kwargs[target] = (nested_values(key, entry[key], True) if key in NESTED
                              else _scaled(entry[key], scale))
            given[(target, None)] = (key, entry[key])
    cuda_names = _patterns(ctx, entry.get("cuda_names", []))
    if "profile" in entry:
        profile = entry["profile"]
        given[("profile", None)] = ("profile", profile)
    try:
        return DeviceSpec(device_type=device_type, name=name, dtype=dtype, flops_by_dtype=flops,
                          pj_per_flop_by_dtype=pj, source=source, aliases=aliases,
                          cuda_names=cuda_names, profile=profile, **kwargs)
    except DeviceSpecError as exc:
        where = given.get((exc.field, exc.dtype))
        if where is not None and exc.expected:
            raise ctx.bad(*where, exc.expected) from None
        raise ctx.error(str(exc)) from None


def _patterns(ctx: _Entry, value) -> tuple[str, ...]:
    patterns = _strings(ctx, "cuda_names", value) if value else ()
    for p in patterns:
        if any(sign in p for sign in _REGEX_SIGNS):
            raise ctx.bad("cuda_names", p, "a CUDA device name or a glob (* any text, "
                          "? one character, [abc] one of), matched to the whole name "
                          "ignoring case; regular expressions are not read")
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
            spec = _build(ctx, canonical, entry, "accelerator", aliases, source, UPMEM_PROFILE)
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
            check = entry.get("calibration_check")
            if check is not None:
                if not isinstance(check, dict) or not isinstance(check.get("passed"), bool):
                    raise ctx.bad("calibration_check", check, "a mapping with passed: true/false")
                spec = replace(spec, calibration_check=dict(check))
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
        data = load_yaml(path.read_text(encoding="utf-8"))
    except DuplicateKey as dup:
        raise _duplicate_error(str(path), dup) from None
    except YamlTooLarge as exc:
        raise DeviceSpecError(f"{path}: {exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DeviceSpecError(f"{path}: not a valid YAML file: {one_line(exc)}") from None
    except OSError as exc:
        raise DeviceSpecError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return parse_device_specs(data, str(path))


