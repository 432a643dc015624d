"""A device spec's errors and its dtype names.

`as_dtype("bf16")` is torch.bfloat16 (names, aliases and "torch." prefixes; "tf32" for float32
matmuls on tensor cores, which torch has no dtype for), `dtype_name` the inverse, and
`rate_key` the dtype whose peak another runs at (every float8 shares one rate). The errors
(`DeviceSpecError` and its kinds) say which field and what was expected.
"""
from __future__ import annotations

import torch

from perfcounter._util import did_you_mean


class DeviceSpecError(ValueError):
    """A device spec (a file, an entry or a constructor argument) is invalid.

    `field` names the DeviceSpec field at fault (with `dtype` for a per-dtype
    table) and `expected` what it should be, when one figure is to blame.
    """

    def __init__(self, message: str, *, field: str | None = None, dtype=None,
                 expected: str | None = None):
        super().__init__(message)
        self.field, self.dtype, self.expected = field, dtype, expected


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
    raise UnknownDtypeError(f"unknown dtype {value!r}{did_you_mean(name, known)} "
                            f"(valid: {', '.join(known)})")


def dtype_name(dtype) -> str:
    """"bfloat16" for torch.bfloat16, "tf32" for "tf32"."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def rate_key(dtype):
    """The dtype whose peak `dtype` runs at (every float8 shares one rate, as do int4/uint4)."""
    dtype = as_dtype(dtype)
    return _RATE_CLASS.get(dtype, dtype)
