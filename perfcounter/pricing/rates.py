"""The rates price.py takes for each group of a step's figures: the achievable rates of its
class, dtype, rows and working set (achievable.py; predict.py's module doc says where each
comes from), the fused kernels' rates, and for the bound the highest rate any regime could
use. A serving table's figures keep one group structure from step to step: a cache (a dict
its caller keeps) holds the structure, the other groups' rates once per cold or warm and the
matmuls' once per their rows, unless the spec has measured curves (rates by working set).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from perfcounter.pricing.achievable import (gemv_row_s, kernel_s, measured_dtype, rate,
                                            rows_flops, vector_flops)
from perfcounter.pricing.figures import Figures
from perfcounter.pricing.op_classes import COLLECTIVE, ROW_BLOCK, SKINNY_ROWS
from perfcounter.pricing.roofline import is_integer_dtype, peak_flops


@dataclass(frozen=True)
class Rates:
    """The rates of every group of some figures at their rows and cold or warm (one lookup)."""

    cls: tuple  # the class each group is priced in (a GEMV by its weight's dtype)
    per_flop: np.ndarray  # seconds per FLOP (a few rows charged a row block: ROW_BLOCK)
    per_byte: np.ndarray  # seconds per byte, cold or warm
    row_s: np.ndarray  # a matmul's weight rows x the time per row, a call
    kernel: np.ndarray  # a kernel's fixed device time, a call
    basis: tuple
    strided: np.ndarray  # bool: elementwise on strided views at the stated share


class Structure(NamedTuple):
    """Which groups are matmuls, extern kernels (matmuls and attention), collectives and
    fusable (the rest); as 0/1 floats too (sums over them are dot products: a serving loop)."""

    matmul: np.ndarray
    extern: np.ndarray
    linked: np.ndarray
    any_linked: bool
    extern_f: np.ndarray
    fusable_f: np.ndarray
    ones: np.ndarray


def structure(fig: Figures, cache: dict | None) -> Structure:
    """The figures' group structure (kept in `cache`, which holds one structure's rates)."""
    out = None if cache is None else cache.get("structure")
    if out is None:
        linked = np.array([c is not None for c in fig.collective], dtype=bool)
        extern = np.array([k in ("matmul", "attention") for k in fig.kind], dtype=bool)
        out = Structure(np.array([k == "matmul" for k in fig.kind], dtype=bool), extern,
                        linked, bool(linked.any()), extern.astype(float),
                        (~(extern | linked)).astype(float), np.ones(len(fig)))
        if cache is not None:
            cache["structure"] = out
    return out

def group_rates(fig: Figures, spec, cold: bool, cache: dict | None = None) -> Rates:
    """The rates of every group (module doc of predict.py). `cache`: a dict the caller keeps
    for figures of one group structure (a serving table's): the other groups' rates once per
    cold or warm, the matmuls' once per their rows; unused where the spec has measured curves
    (rates by working set)."""
    n = len(fig)
    if cache is None or spec.op_curves:
        return _rates(fig, spec, cold, range(n))
    matmul = structure(fig, cache).matmul
    key = (fig.rows[matmul].tobytes(), cold)
    out = cache.get(key)
    if out is None:
        base = cache.get(("every group", cold))
        if base is None:
            out = cache[("every group", cold)] = _rates(fig, spec, cold, range(n))
        else:  # only the matmuls' rates follow their rows
            out = _rates(fig, spec, cold, np.flatnonzero(matmul), base)
        cache[key] = out
    return out


def _rates(fig: Figures, spec, cold: bool, groups, base: Rates | None = None) -> Rates:
    """Rates of `groups` (the others as in `base`)."""
    n = len(fig)
    if base is None:
        per_flop, per_byte, row_s, kernel = (np.zeros(n) for _ in range(4))
        classes, bases, strided = [""] * n, [""] * n, np.zeros(n, dtype=bool)
    else:
        per_flop, per_byte, row_s, kernel, strided = (
            x.copy() for x in (base.per_flop, base.per_byte, base.row_s, base.kernel,
                               base.strided))
        classes, bases = list(base.cls), list(base.basis)
    for g in groups:
        cls, dtype, rows = fig.kind[g], fig.dtype[g], int(fig.rows[g])
        rate_cls, scale = cls, 1.0
        if cls == COLLECTIVE:  # priced on its link (collective_s), no rate of its own
            classes[g] = cls
            continue
        if cls == "matmul":
            cls = "gemv" if rows <= SKINNY_ROWS else "gemm"
            weight_cls, weight_rows = fig.weight[g]
            row_s[g] = weight_rows * gemv_row_s(spec, dtype, rows) \
                if weight_cls == "gemv" and not is_integer_dtype(dtype) else 0.0
            rate_cls = weight_cls if cls == "gemv" else cls
        calls = max(float(fig.calls[g]), 1.0)
        rt = rate(spec, rate_cls, dtype, float(fig.bytes[g]) / calls)
        achieved = rt.flops_per_s
        if cls in ("gemv", "gemm") and rows > 1:
            by_rows = None if is_integer_dtype(dtype) else rows_flops(spec, dtype, rows)
            if by_rows is not None:
                achieved = by_rows
            elif cls == "gemv" and rows < ROW_BLOCK:
                scale = ROW_BLOCK / rows
        per_flop[g] = scale / achieved
        per_byte[g] = 1.0 / (rt.cold_bytes_per_s if cold else rt.warm_bytes_per_s)
        kernel[g] = kernel_s(spec, rt.basis)
        classes[g] = rate_cls
        bases[g] = rt.basis
        strided[g] = cls == "strided" and "strided" not in spec.op_curves
    return Rates(tuple(classes), per_flop, per_byte, row_s, kernel, tuple(bases), strided)


def fused_rate(spec, dtype: str, cold: bool, working_set: float, cache: dict | None):
    """(FLOP/s, bytes/s, fixed seconds a kernel, basis, peak bytes/s) of the fused kernels."""
    key = ("fused", dtype, cold)
    out = None if cache is None or spec.op_curves else cache.get(key)
    if out is None:
        rt = rate(spec, "elementwise", dtype, working_set)
        out = (vector_flops(spec, rt), rt.cold_bytes_per_s if cold else rt.warm_bytes_per_s,
               kernel_s(spec, rt.basis), rt.basis,
               max(float(spec.bandwidth), rt.cold_bytes_per_s, rt.warm_bytes_per_s))
        if cache is not None and not spec.op_curves:
            cache[key] = out
    return out

def peak_rates(fig: Figures, spec, cache: dict | None = None) -> tuple[np.ndarray, float]:
    """(per group the highest FLOP/s any regime could price it at: its dtype's peak, its
    classes' achievable rates (a matmul's as a GEMV and as a GEMM), a measured rows table's
    best; the highest bytes/s: the bandwidth, any group's warm or cold rate)."""
    out = None if cache is None or spec.op_curves else cache.get("peaks")
    if out is None:
        flops, peak_b = np.zeros(len(fig)), float(spec.bandwidth)
        for g, (kind, dtype) in enumerate(zip(fig.kind, fig.dtype)):
            if kind == COLLECTIVE:  # priced on its link
                continue
            flops[g] = peak_flops(spec, dtype)
            working_set = float(fig.bytes[g]) / max(float(fig.calls[g]), 1.0)
            for cls in ((fig.weight[g][0], "gemv", "gemm") if kind == "matmul" else (kind,)):
                rt = rate(spec, cls, dtype, working_set)
                flops[g] = max(flops[g], rt.flops_per_s)
                peak_b = max(peak_b, rt.warm_bytes_per_s, rt.cold_bytes_per_s)
            key = measured_dtype(spec.matmul_rows, dtype)
            if kind == "matmul" and key is not None and not is_integer_dtype(dtype):
                flops[g] = max(flops[g], *(rows_flops(spec, dtype, r)
                                           for r in spec.matmul_rows[key]))
        out = (flops, peak_b)
        if cache is not None and not spec.op_curves:
            cache["peaks"] = out
    return out


__all__ = ["Rates", "Structure", "fused_rate", "group_rates", "peak_rates", "structure"]
