"""The HTML pages of `perfcounter serve --html` and `perfcounter plan --html` (html.py draws
and writes them: inline SVG charts with ids, point groups with gids, no script, offline).

serve's page (`serve_page`), one series per result (a rate of a sweep, a deployment):
    serve-ttft    TTFT of every request, sorted, against the fraction of requests (a CDF;
                  above MAX_POINTS requests, the CDF at MAX_POINTS evenly spaced fractions)
    serve-itl     every gap between two tokens of a request, likewise
    serve-batch   sequences in each engine step against the step's start (s)
    serve-kv      KV cache blocks held after each step, as a % of the blocks there are
    serve-power   each step's joules / its seconds (W), where the device gives energy figures
Steps beyond MAX_POINTS are shown one in every ceil(steps / MAX_POINTS) (the chart says so).
The gids: CHART-N, N the result's index. The reads are a run's plain fields (serve/
scheduler.py's Run and Steps), so that this file imports nothing of serve/.

plan's page (`plan_page`): output tokens/s per GPU against median TPOT (plan-tpot) and
against P99 TTFT (plan-ttft), every simulated candidate (gid CHART-candidates), the Pareto
front (CHART-front), the recommended one (CHART-pick) and the SLO's target as a vertical
line (CHART-slo); then the candidates' table (plan/render.py's columns), the pick marked.
"""
from __future__ import annotations

import math

import numpy as np

from perfcounter.report.html import (COLORS, figure, page, points, svg, table, text_block)

MAX_POINTS = 2000  # points a series draws at most (a page stays small and quick to open)


def _cdf(values) -> tuple[np.ndarray, np.ndarray]:
    """(sorted values, fraction of values at or below each), at most MAX_POINTS of them."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[~np.isnan(v)]
    if len(v) > MAX_POINTS:
        q = np.linspace(0.0, 1.0, MAX_POINTS)
        return np.quantile(v, q), q
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def _steps(run) -> tuple[dict, int]:
    """The step columns as numpy arrays, one in every `stride` steps, and the stride."""
    cols = {k: np.frombuffer(getattr(run.steps, k)) for k in (
        "start", "seconds", "seqs", "kv_blocks", "energy_j")}
    stride = max(1, math.ceil(len(cols["start"]) / MAX_POINTS))
    return {k: v[::stride] for k, v in cols.items()}, stride


def _chart(chart_id: str, series: list, xlabel: str, ylabel: str, *, line: bool = True,
           note: str = "") -> str:
    """One chart of (label, x, y) series, gid CHART-N each."""
    fig, (ax,) = figure(7.0, 3.6)
    for n, (label, x, y) in enumerate(series):
        points(ax, x, y, f"{chart_id}-{n}", color=COLORS[n % len(COLORS)], label=label,
               ms=2, lw=0.8, ls="-" if line else "none", drawstyle="steps-post" if line else None)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=note or None)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return svg(fig, chart_id)


def serve_page(results: list, labels: list[str], title: str, summary: str) -> str:
    """`perfcounter serve`'s page (module doc) of its results (serve.ServeResult)."""
    ttft, itl, batch, kv, power, strides = [], [], [], [], [], set()
    for result, label in zip(results, labels):
        run = result.run
        first = np.array([r.first_token - r.arrival for r in run.requests]) * 1e3
        ttft.append((label, *_cdf(first)))
        itl.append((label, *_cdf(np.frombuffer(run.itl) * 1e3 if len(run.itl) else [])))
        cols, stride = _steps(run)
        strides.add(stride)
        blocks = max(run.config.kv_blocks, 1)
        batch.append((label, cols["start"], cols["seqs"]))
        kv.append((label, cols["start"], 100.0 * cols["kv_blocks"] / blocks))
        energy_known = getattr(result.deployment.table, "has_energy", True) \
            and result.metrics.get("j_per_output_token") is not None
        if energy_known:
            with np.errstate(divide="ignore", invalid="ignore"):
                watts = np.where(cols["seconds"] > 0, cols["energy_j"] / cols["seconds"], 0.0)
            power.append((label, cols["start"], watts))
    note = "" if strides == {1} else f"one step in every {max(strides):,} shown"
    sections = [("summary", text_block(summary)),
                ("time to first token", _chart("serve-ttft", [(a, x, y) for a, x, y in ttft],
                                               "TTFT (ms)", "fraction of requests")),
                ("inter-token latency", _chart("serve-itl", itl, "ITL (ms)",
                                               "fraction of token gaps")),
                ("batch size over time", _chart("serve-batch", batch, "time (s)",
                                                "sequences a step", note=note)),
                ("KV cache use over time", _chart("serve-kv", kv, "time (s)",
                                                  "KV cache blocks held (%)", note=note))]
    if power:
        sections.append(("power over time", _chart(
            "serve-power", power, "time (s)", "W (a step's joules / its seconds)", note=note)))
    return page(title, sections)


def _front_chart(chart_id: str, figures: list, front: list, pick, key: str, slo_ms,
                 xlabel: str) -> str:
    """Throughput per GPU against figures[i][key], candidates, front, pick and SLO line."""
    def xy(indices):
        keep = [i for i in indices if figures[i] and figures[i].get(key) is not None
                and figures[i].get("output_throughput_per_gpu") is not None]
        return ([figures[i][key] for i in keep],
                [figures[i]["output_throughput_per_gpu"] for i in keep])

    fig, (ax,) = figure(7.0, 4.2)
    ran = [i for i, f in enumerate(figures) if f and "error" not in f]
    points(ax, *xy(ran), f"{chart_id}-candidates", ls="none", color="#999999",
           label="candidates")
    points(ax, *xy(front), f"{chart_id}-front", color=COLORS[0], ms=5, label="Pareto front")
    if pick is not None:
        points(ax, *xy([pick]), f"{chart_id}-pick", ls="none", marker="*", ms=14,
               color=COLORS[3], label=f"recommended #{pick}")
    if slo_ms is not None:
        ax.axvline(slo_ms, color=COLORS[3], ls="--", lw=1, label=f"SLO {slo_ms:g} ms") \
            .set_gid(f"{chart_id}-slo")
    ax.set(xlabel=xlabel, ylabel="output tokens/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return svg(fig, chart_id)


def plan_page(result, title: str, summary: str, headers, rows: list, slo: dict) -> str:
    """`perfcounter plan`'s page (module doc): result a plan.PlanResult; rows the table's
    (index, cells) of its simulated candidates; slo the targets in seconds (parse_slo)."""
    pick = result.recommended
    figures = result.figures
    ms = {k: v * 1e3 for k, v in slo.items()}
    picked = next((n for n, (i, _) in enumerate(rows) if i == pick), None)
    return page(title, [
        ("summary", text_block(summary)),
        ("throughput per GPU against TPOT", _front_chart(
            "plan-tpot", figures, result.front, pick, "median_tpot_ms", ms.get("tpot"),
            "median TPOT (ms)")),
        ("throughput per GPU against TTFT", _front_chart(
            "plan-ttft", figures, result.front, pick, "p99_ttft_ms", ms.get("ttft"),
            "P99 TTFT (ms)")),
        ("candidates simulated", table(headers, [cells for _, cells in rows], "plan-table",
                                       pick=picked))])
