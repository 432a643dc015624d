"""The bound: the least time any regime (price.py's REGIMES) can take on a step's figures.

No fixed cost, every rate at the highest any regime could use for that group (the spec's peak
FLOP/s at the dtype and bandwidth, or a measured rate above them: a warm cache, a fused
kernel's vector FLOP/s), its FLOPs the executed ones, and the fewest bytes any regime moves:
the least of the per-op bytes (eager), the matmuls' and attention's bytes plus the fused IO
(compiled, CUDA graphs) and the compulsory bytes (each storage once: perfect fusion). The step
takes max(Σ compute, bytes / bandwidth) + its host link, + the collectives' link seconds (as
every regime charges them). Each regime takes at least its work, whose groups each take at
least their compute and their bytes at those rates; so bound <= every regime's price
(tests/test_bound_bounds.py holds it on random steps).

Figures of one group structure (a serving table's) keep one BoundRule (in price()'s cache,
unless the spec has measured curves: rates by working set): each group's seconds per executed
FLOP and the peak bandwidth, with and without fused groups, and the 0/1 weights that sum a
step's bytes three ways (all, extern, fusable) in one product. A step is then three dot
products of its figures.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcounter.pricing.figures import Figures
from perfcounter.pricing.rates import Structure, fused_rate, peak_rates


@dataclass(frozen=True)
class BoundRule:
    """What the bound needs of one group structure: per (has fused groups) the seconds per
    executed FLOP of each group and the peak bytes/s; the weights [groups, 3] of a step's bytes
    (every group, extern, fusable) and the extern groups' 0/1 weights (their streamed bytes)."""

    per_flop: dict  # has_fused -> np.ndarray [groups]
    peak_b: dict  # has_fused -> float
    byte_weights: np.ndarray  # [groups, 3]
    extern_f: np.ndarray


def bound_rule(fig: Figures, shape: Structure, cache: dict | None) -> BoundRule:
    """The figures' BoundRule (kept in `cache` as its structure is), peaks not yet looked up."""
    rule = None if cache is None else cache.get("bound rule")
    if rule is None:
        weights = np.ascontiguousarray(np.stack([shape.ones, shape.extern_f, shape.fusable_f],
                                                axis=1))
        rule = BoundRule({}, {}, weights, shape.extern_f)
        if cache is not None:
            cache["bound rule"] = rule
    return rule


def peaks(fig: Figures, spec, shape: Structure, has_fused: bool, fused_bytes: float,
          cold: bool, cache: dict | None) -> tuple[np.ndarray, float]:
    """(each group's seconds per executed FLOP at the highest rate any regime could use, the
    highest bytes/s): rates.peak_rates, and where fused groups compute, a fused kernel's
    arithmetic at the vector rate where that is higher and its bytes at the fused kernels'."""
    peak_f, peak_b = peak_rates(fig, spec, cache)
    if has_fused:  # of any dtype a fused group computes in
        fusable = shape.fusable_f > 0
        kernels = float(fig.calls @ shape.extern_f) + max(fig.steps, 1)
        for dtype in {d for d, f in zip(fig.dtype, fusable) if f}:
            flops_per_s, _, _, _, fused_peak = fused_rate(spec, dtype, cold,
                                                           fused_bytes / kernels, cache)
            peak_f = np.where(fusable, np.maximum(peak_f, flops_per_s), peak_f)
            peak_b = max(peak_b, fused_peak)
    return np.divide(1.0, peak_f, out=np.zeros(len(fig)), where=peak_f > 0), peak_b


def bound_parts(fig: Figures, spec, shape: Structure, cold, cache: dict | None):
    """(Σ compute seconds, memory seconds: the fewest bytes / peak bandwidth, op calls) of
    the figures (module doc). cold: a callable giving streams_cold (asked only when the peaks
    are looked up)."""
    rule = bound_rule(fig, shape, cache)
    every, extern, fusable = fig.bytes.dot(rule.byte_weights).tolist()  # (.dot: no ufunc)
    has_fused = fusable > 0  # (bytes are never negative)
    fused_bytes = 0.0
    if has_fused:  # the fused IO, else (not counted) the compulsory bytes extern kernels miss
        fused_bytes = fig.fused_bytes or \
            max(0.0, fig.compulsory_bytes - float(fig.streamed.dot(rule.extern_f)))
    per_flop = rule.per_flop.get(has_fused)
    if per_flop is None:
        per_flop, peak_b = peaks(fig, spec, shape, has_fused, fused_bytes, cold(), cache)
        if cache is not None and not spec.op_curves:
            rule.per_flop[has_fused], rule.peak_b[has_fused] = per_flop, peak_b
    else:
        peak_b = rule.peak_b[has_fused]
    compute = float(fig.executed_flops.dot(per_flop))
    least = min(every, extern + fused_bytes)
    if fig.compulsory_bytes:
        least = min(least, fig.compulsory_bytes)
    return compute, least / peak_b


__all__ = ["BoundRule", "bound_parts", "bound_rule", "peaks"]
