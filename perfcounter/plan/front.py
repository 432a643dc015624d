"""The Pareto front of a search and its recommendation, from the candidates' figures.

Front (as NVIDIA AIConfigurator draws it): output tokens a second per GPU against the
median TPOT. A candidate is on it when no other candidate has at least its throughput per
GPU at no more TPOT, and more of one or less of the other. Candidates serve refused,
overloaded ones (no latency figures) and those without a TPOT are not on it.

Recommendation: of the candidates whose share of requests meeting every SLO target is at
least `attainment` (serve's --slo_attainment, 0.9) and that are not overloaded, the one of
the highest goodput per GPU; ties go to the lower $ per 1M output tokens, then the lower J
per output token, then fewer GPUs, then the earlier candidate. None when none meets the SLO.
"""
from __future__ import annotations


def usable(f: dict) -> bool:
    return "error" not in f and not f.get("overloaded") and f.get("median_tpot_ms") is not None


def pareto_front(figures: list[dict]) -> list[int]:
    """Indices of the front's candidates (module doc), by ascending TPOT."""
    points = sorted((f["median_tpot_ms"], -f["output_throughput_per_gpu"], i)
                    for i, f in enumerate(figures) if usable(f))
    front, best = [], None
    for tpot, neg_tput, i in points:  # by TPOT, then the higher throughput first
        if best is None or -neg_tput > best:
            front.append(i)
            best = -neg_tput
    return front


def meets_slo(f: dict, attainment: float) -> bool:
    return usable(f) and (f.get("slo_met_fraction") or 0.0) >= attainment


def recommend(figures: list[dict], gpus: list[int], attainment: float = 0.9) -> int | None:
    """The index of the recommended candidate (module doc), or None."""
    best = None
    for i, f in enumerate(figures):
        if not meets_slo(f, attainment):
            continue
        key = (-(f["goodput_per_gpu"] or 0.0), _or_inf(f.get("usd_per_1m_output_tokens")),
               _or_inf(f.get("j_per_output_token")), gpus[i], i)
        if best is None or key < best[0]:
            best = (key, i)
    return None if best is None else best[1]


def _or_inf(value) -> float:
    return float("inf") if value is None else value
