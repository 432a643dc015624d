"""DeviceSpec: what a device can do, and the registry of known devices.

A `DeviceSpec` is plain data: memory bandwidth (B/s), peak FLOP/s per dtype
(dense, not sparse), memory size, and the energy figures the energy model
needs (pJ per bit of memory traffic, pJ per FLOP, host-link bandwidth and
pJ/bit each way, optional per-element costs of softmax / SiLU / RMSNorm).
Field names and units of torchao's removed `DeviceSpec` are kept.

The registry is `device_specs/*.yaml` (one file per device family, every
figure with a `source:`), plus the spec `perfcounter calibrate` wrote for this
machine, plus any file a user passes by path. Lookups live in
`perfcounter.device_registry` (re-exported here: get_device_spec,
list_device_specs, register_device_specs, default_device_spec, ...); the YAML
schema and the UPMEM accelerator format are read by `perfcounter.device_schema`.

    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    spec = get_device_spec("my_accels.yaml:PIM_AI_4chip")
    spec = CUDADeviceSpec(dtype=torch.bfloat16)   # from torch.cuda.get_device_name()
"""
from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import dataclass, field, fields, replace

import torch

class DeviceSpecError(ValueError):
    """A device spec (a file, an entry or a constructor argument) is invalid."""


class UnknownDeviceError(DeviceSpecError, KeyError):
    """No registry entry has that name or alias."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownDtypeError(DeviceSpecError, KeyError):
    """A dtype name is not understood, or a spec has no figure for it."""

    def __str__(self) -> str:
        return str(self.args[0])


# ---------------------------------------------------------------- dtypes

TF32 = "tf32"  # torch has no dtype for TF32: float32 matmuls on tensor cores
_DTYPE_ALIASES = {
    "fp64": "float64", "double": "float64", "fp32": "float32", "float": "float32",
    "tfloat32": TF32, "bf16": "bfloat16", "fp16": "float16", "half": "float16",
    "fp8": "float8_e4m3fn", "float8": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp4": "float4_e2m1fn_x2", "float4": "float4_e2m1fn_x2",
    "nvfp4": "float4_e2m1fn_x2",
}
# dtypes that share one hardware rate: looked up under a single key
_RATE_CLASS = {
    torch.float8_e5m2: torch.float8_e4m3fn, torch.float8_e4m3fnuz: torch.float8_e4m3fn,
    torch.float8_e5m2fnuz: torch.float8_e4m3fn, torch.uint4: torch.int4,
}


def as_dtype(value) -> torch.dtype | str:
    """A torch.dtype (or "tf32") from a dtype or a name: "bf16", "torch.float16", "int4"."""
    if isinstance(value, torch.dtype) or value == TF32:
        return value
    if not isinstance(value, str):
        raise UnknownDtypeError(f"expected a torch.dtype or a dtype name, got {value!r}")
    name = value.strip().lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name == TF32:
        return TF32
    dtype = getattr(torch, name, None)
    if isinstance(dtype, torch.dtype):
        return dtype
    known = sorted(set(_DTYPE_ALIASES) | {"float64", "float32", "bfloat16", "float16",
                                          "int8", "int4", TF32})
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UnknownDtypeError(f"unknown dtype {value!r}{hint} (valid: {', '.join(known)})")


def dtype_name(dtype) -> str:
    """"bfloat16" for torch.bfloat16, "tf32" for "tf32"."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def _rate_key(dtype):
    dtype = as_dtype(dtype)
    return _RATE_CLASS.get(dtype, dtype)


def _check_number(owner: str, name: str, value, *, positive: bool):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DeviceSpecError(f"DeviceSpec {owner!r}: {name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a positive" if positive else "a non-negative"
        raise DeviceSpecError(f"DeviceSpec {owner!r}: {name} must be {need} finite number, "
                              f"got {value!r}")
    return value


def _dtype_table(owner: str, name: str, table) -> dict:
    out = {}
    for key, value in dict(table or {}).items():
        k = _rate_key(key)
        if k in out:
            raise DeviceSpecError(f"DeviceSpec {owner!r}: {name} lists {dtype_name(k)} twice")
        out[k] = _check_number(owner, f"{name}[{dtype_name(k)}]", value, positive=False)
    return out


_warned: set[tuple[str, str, str]] = set()


def _warn_once(kind: str, spec: "DeviceSpec", dtype, used) -> None:
    key = (kind, str(spec.name), dtype_name(dtype))
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"device {spec.name!r} has no {kind} figure for {dtype_name(dtype)}; "
                      f"using its {dtype_name(used)} figure", stacklevel=3)


# ---------------------------------------------------------------- DeviceSpec

_POSITIVE = ("bandwidth", "flops_per_s", "vram", "roofline_balancepoint",
             "host_to_device_bw", "device_to_host_bw", "softmax_ns_per_element",
             "silu_ns_per_element", "rmsnorm_ns_per_element", "tdp_w")
_NON_NEGATIVE = ("mem_pj_per_bit", "host_to_device_pj_per_bit", "device_to_host_pj_per_bit",
                 "static_w")


@dataclass(frozen=True)
class DeviceSpec:
    """One device: bandwidth in B/s, FLOP/s per dtype (dense), vram in B, energy figures.

    `flops_per_s` is the peak at `dtype` (the compute dtype); `flops_by_dtype`
    the peaks of every dtype the source gives. `roofline_balancepoint` is
    flops_per_s / bandwidth (FLOP/byte) unless given. Energy and link fields
    are None when unknown. `source` maps a field name to its citation.
    """

    device_type: str = "cuda"
    name: str | None = None
    bandwidth: float | None = None  # B/s
    flops_per_s: float | None = None  # FLOP/s at `dtype`
    vram: float | None = None  # bytes
    dtype: torch.dtype | None = None
    flops_by_dtype: dict = field(default_factory=dict)  # dtype -> FLOP/s, dense
    roofline_balancepoint: float | None = None  # FLOP/byte
    mem_pj_per_bit: float | None = None
    pj_per_flop_by_dtype: dict = field(default_factory=dict)  # dtype -> pJ/FLOP
    host_to_device_bw: float | None = None  # B/s
    host_to_device_pj_per_bit: float | None = None
    device_to_host_bw: float | None = None  # B/s
    device_to_host_pj_per_bit: float | None = None
    softmax_ns_per_element: float | None = None
    silu_ns_per_element: float | None = None
    rmsnorm_ns_per_element: float | None = None
    tdp_w: float | None = None
    static_w: float | None = None
    source: dict = field(default_factory=dict)  # field name -> citation
    aliases: tuple = ()
    cuda_names: tuple = ()  # regexes matched against torch.cuda.get_device_name()

    def __post_init__(self):
        owner = self.name or "<unnamed>"
        put = object.__setattr__
        for name in _POSITIVE + _NON_NEGATIVE:
            put(self, name, _check_number(owner, name, getattr(self, name),
                                          positive=name in _POSITIVE))
        dtype = None if self.dtype is None else as_dtype(self.dtype)
        if dtype == TF32:
            raise DeviceSpecError(f"DeviceSpec {owner!r}: dtype tf32 is float32 run on tensor "
                                  "cores; pass dtype=torch.float32 (CUDADeviceSpec "
                                  "use_tensorcores=True picks the tf32 rate)")
        flops = _dtype_table(owner, "flops_by_dtype", self.flops_by_dtype)
        if self.flops_per_s is not None and dtype is not None:
            flops.setdefault(_rate_key(dtype), self.flops_per_s)
        if self.flops_per_s is None and dtype is not None and _rate_key(dtype) in flops:
            put(self, "flops_per_s", flops[_rate_key(dtype)])
        put(self, "dtype", dtype)
        put(self, "flops_by_dtype", flops)
        put(self, "pj_per_flop_by_dtype",
            _dtype_table(owner, "pj_per_flop_by_dtype", self.pj_per_flop_by_dtype))
        if self.roofline_balancepoint is None and self.flops_per_s and self.bandwidth:
            put(self, "roofline_balancepoint", self.flops_per_s / self.bandwidth)
        put(self, "source", dict(self.source or {}))
        put(self, "aliases", tuple(self.aliases or ()))
        put(self, "cuda_names", tuple(self.cuda_names or ()))

    def __hash__(self):
        return hash((type(self).__name__, self.device_type, self.name, self.dtype,
                     self.bandwidth, self.flops_per_s, self.vram))

    def __str__(self):
        def fmt(value, scale, unit):
            return "None" if value is None else f"{value / scale:,.1f}{unit}"
        return (f"DeviceSpec(device_type={self.device_type}, name={self.name}, "
                f"dtype={self.dtype}, bandwidth={fmt(self.bandwidth, 1e9, 'GB/s')}, "
                f"flops={fmt(self.flops_per_s, 1e12, 'TFLOPs')}, "
                f"vram={fmt(self.vram, 1e9, 'GB')})")

    def peak_flops(self, dtype=None, *, strict: bool = False) -> float:
        """Peak dense FLOP/s at `dtype` (a torch.dtype or a name such as "bf16").

        NB: all float8 variants share one rate, as do int4/uint4. At the spec's
        own dtype this is `flops_per_s` (an explicit constructor figure wins
        over the table). When the spec has no figure for `dtype`, the peak at
        the spec's compute dtype (`flops_per_s`) is returned and a warning is
        issued once per device and dtype; strict=True raises UnknownDtypeError.
        """
        if dtype is None and self.dtype is None:
            raise UnknownDtypeError(f"device {self.name!r} has no compute dtype; "
                                    "pass one to peak_flops(dtype)")
        key = _rate_key(self.dtype if dtype is None else dtype)
        if self.dtype is not None and key == _rate_key(self.dtype) \
                and self.flops_per_s is not None:
            return self.flops_per_s
        if key in self.flops_by_dtype:
            return self.flops_by_dtype[key]
        known = ", ".join(dtype_name(d) for d in self.flops_by_dtype) or "none"
        if strict or self.flops_per_s is None:
            raise UnknownDtypeError(f"device {self.name!r} has no peak FLOP/s for "
                                    f"{dtype_name(key)} (it has: {known})")
        _warn_once("peak FLOP/s", self, key, self.dtype)
        return self.flops_per_s

    def pj_per_flop(self, dtype=None) -> float | None:
        """Energy per FLOP in pJ at `dtype`; None when the spec gives none.

        NB: a dtype without its own figure uses the compute dtype's figure
        (with a warning once per device and dtype), as the UPMEM profiles price
        every FLOP alike.
        """
        if dtype is None and self.dtype is None:
            return None
        key = _rate_key(self.dtype if dtype is None else dtype)
        if key in self.pj_per_flop_by_dtype:
            return self.pj_per_flop_by_dtype[key]
        own = None if self.dtype is None else _rate_key(self.dtype)
        if own in self.pj_per_flop_by_dtype:
            _warn_once("pJ/FLOP", self, key, self.dtype)
            return self.pj_per_flop_by_dtype[own]
        return None

    def with_dtype(self, dtype) -> "DeviceSpec":
        """This device computing in `dtype`: flops_per_s and the balance point follow."""
        dtype = as_dtype(dtype)
        return replace(self, dtype=dtype, flops_per_s=self.peak_flops(dtype),
                       roofline_balancepoint=None)

    def to_dict(self) -> dict:
        """JSON-able: dtypes as names ("bfloat16"), tuples as lists."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "dtype":
                value = None if value is None else dtype_name(value)
            elif f.name in ("flops_by_dtype", "pj_per_flop_by_dtype"):
                value = {dtype_name(k): v for k, v in value.items()}
            elif isinstance(value, (tuple, dict)):
                value = list(value) if isinstance(value, tuple) else dict(value)
            out[f.name] = value
        return out


@dataclass(frozen=True)
class CUDADeviceSpec(DeviceSpec):
    """The spec of the local CUDA (or ROCm) GPU, found by `torch.cuda.get_device_name()`.

    The name is matched against the `cuda_names` patterns of the registry;
    bandwidth, vram and peaks come from that entry (fields passed explicitly
    are kept). dtype defaults to torch.get_default_dtype(), as in torchao; with
    use_tensorcores, float32 is priced at the TF32 tensor-core rate.
    """

    device_type: str = "cuda"
    use_tensorcores: bool = True

    def __post_init__(self):
        put = object.__setattr__
        name = self.name or _local_cuda_name()
        from perfcounter.device_registry import find_cuda_device_spec
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
            key, table = _rate_key(self.dtype), self.flops_by_dtype
            if key == torch.float32 and self.use_tensorcores and TF32 in table:
                put(self, "flops_per_s", table[TF32])
            elif key not in table:
                put(self, "flops_per_s", entry.peak_flops(key))  # warns: entry's fallback
        super().__post_init__()

    def peak_flops(self, dtype=None, *, strict: bool = False) -> float:
        key = _rate_key(self.dtype if dtype is None else dtype)
        if (key != _rate_key(self.dtype) and key == torch.float32 and self.use_tensorcores
                and TF32 in self.flops_by_dtype):
            return self.flops_by_dtype[TF32]
        return super().peak_flops(key, strict=strict)


def _local_cuda_name() -> str:
    try:
        return torch.cuda.get_device_name()
    except (AssertionError, RuntimeError) as exc:
        raise DeviceSpecError("CUDADeviceSpec: no CUDA device to detect "
                              f"({exc}); pass name='NVIDIA H100 80GB HBM3' or use "
                              "get_device_spec(NAME)") from None


_REGISTRY_NAMES = ("get_device_spec", "list_device_specs", "register_device_specs",
                   "find_cuda_device_spec", "default_device_spec", "perfcounter_home",
                   "calibrated_spec_path", "shipped_spec_files")


def __getattr__(name):  # the registry's public names, imported on first use
    if name in _REGISTRY_NAMES:
        from perfcounter import device_registry
        return getattr(device_registry, name)
    raise AttributeError(f"module 'perfcounter.devices' has no attribute {name!r}")
