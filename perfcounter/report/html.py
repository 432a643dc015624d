"""One self-contained HTML page of a command's results: `--html PATH` on count, sweep, serve
and plan. No script, no stylesheet or font fetched: each chart is matplotlib's own SVG
(`fig.savefig(buf, format="svg")`, text drawn as paths) inlined in the page, each <svg> with
an id (the chart's), each plotted point group with a gid (`set_gid`: an SVG <g id=...>
holding one <use> per point), tables as HTML; the page opens offline in any browser.

    check_html()                          # matplotlib importable, else HtmlError (one line)
    write_page(path, count_page(counter))  # atomically (_util.atomic_write)

This file: the page, a chart's SVG, a table, and count's and sweep's pages; serve's and
plan's are in html_serving.py. matplotlib is the plot extra, imported inside the functions.

count's page (`count_page`), per phase: the roofline (the phase at its executed FLOPs per
byte of per-op IO and the FLOP/s of its predicted time, under min(peak, intensity x
bandwidth) of the device priced), and each decoder layer's FLOPs and bytes (per-op IO;
models/layer_paths.is_layer) beside what lies outside the layers (embedding, final norm,
head). sweep's (`sweep_page`): each row's predicted latency and J/token by device and phase,
and the table the command prints.
"""
from __future__ import annotations

import contextlib
import html
import io
import re

from perfcounter._util import atomic_write
from perfcounter.models.layer_paths import is_layer

MISSING = "--html needs matplotlib, an optional extra: pip install 'perfcounter[plot]'"
HELP = ("write one self-contained HTML page of the results: charts as inline SVG, no script, "
        "opens offline (needs matplotlib)")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
STYLE = ("body{font-family:sans-serif;margin:2em;color:#222}h1{font-size:1.4em}"
         "h2{font-size:1.15em;margin-top:1.6em}table{border-collapse:collapse;font-size:.85em}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         "th{background:#f3f3f3}tr.pick{background:#fff3c4}pre{background:#f6f6f6;padding:.6em;"
         "overflow-x:auto}svg{max-width:100%;height:auto}")


class HtmlError(ValueError):
    """matplotlib is missing (the page's charts need it)."""


def check_html() -> None:
    """matplotlib importable, else HtmlError (MISSING): called before any work."""
    try:
        import matplotlib  # noqa: F401  # deferred: optional (the plot extra), only for --html
    except ImportError:
        raise HtmlError(MISSING) from None


def figure(width: float = 7.0, height: float = 4.0, panels: int = 1):
    """(a matplotlib Figure on its own Agg canvas, its axes): no pyplot, no global state."""
    check_html()
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: the plot extra
    from matplotlib.figure import Figure  # deferred: optional (the plot extra)
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def svg(fig, chart_id: str) -> str:
    """`fig` as an inline <svg id=chart_id>; matplotlib's own ids (glyphs, markers, clips,
    groups) and the references to them prefixed with chart_id, so that no two charts of a
    page share an id; the gids given (CHART-...) kept as they are."""
    import matplotlib  # deferred: optional (the plot extra)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": chart_id, "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = re.sub(r'(\bid="|xlink:href="#|url\(#)([^")]+)', lambda m: m.group(1) + (
        m.group(2) if m.group(2).startswith(f"{chart_id}-") else f"{chart_id}_{m.group(2)}"),
        text[text.index("<svg"):])
    return f'<svg id="{html.escape(chart_id)}" ' + text[len("<svg "):]


def points(ax, x, y, gid: str, **style):
    """A plotted point group: markers (and a line unless ls="none"), with its gid."""
    style.setdefault("marker", "o")
    style.setdefault("ms", 3)
    (line,) = ax.plot(list(x), list(y), **style)
    line.set_gid(gid)
    return line


def table(headers, rows, table_id: str, pick: int | None = None) -> str:
    """An HTML table (every cell escaped); row `pick` (an index into rows) marked."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        f'<tr{" class=pick" if i == pick else ""}>'
        + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
        for i, row in enumerate(rows))
    return f'<table id="{html.escape(table_id)}"><tr>{head}</tr>{body}</table>'


def text_block(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def page(title: str, sections: list[tuple[str, str]]) -> str:
    """The document: a title, then (heading, HTML) sections."""
    parts = [f"<h2>{html.escape(h)}</h2>{body}" if h else body for h, body in sections]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
            f"<body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n")


def write_page(path, document: str):
    """The page written atomically (the old file stays whole if anything fails)."""
    return atomic_write(path, document)


def _close(fig) -> None:
    with contextlib.suppress(Exception):
        fig.clear()


def _roofline(phases: dict, spec, chart_id: str) -> str:
    """Each phase at (FLOPs / per-op byte, FLOPs / predicted s) under the device's roofline."""
    fig, (ax,) = figure(7.0, 4.5)
    xs = []
    for n, (label, s) in enumerate(phases.items()):
        seconds = s.predicted_latency or s.roofline_latency
        if not (s.total_flops and s.total_io and seconds):
            continue
        x, y = s.total_flops / s.total_io, s.total_flops / seconds
        how = "predicted" if s.predicted_latency else "roofline"
        points(ax, [x], [y], f"{chart_id}-{label}", ls="none", ms=9, marker="*",
               color=COLORS[n % len(COLORS)], label=f"{label} ({how})")
        xs.append(x)
    peak, bw = float(spec.flops_per_s), float(spec.bandwidth)
    ridge = peak / bw
    lo, hi = min(xs + [ridge]) / 10, max(xs + [ridge]) * 10
    grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax.plot(grid, [min(peak, g * bw) for g in grid], color="black", lw=1.2,
            label=f"roofline ({peak / 1e12:.3g} TFLOP/s, {bw / 1e9:.4g} GB/s)")
    ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte (per-op IO)", ylabel="FLOP/s",
           title=f"roofline on {spec.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    out = svg(fig, chart_id)
    _close(fig)
    return out


def layer_totals(stats) -> tuple[list[str], list[int], list[int]]:
    """(labels, FLOPs, per-op bytes) of each decoder layer in order, then "outside layers"
    (the whole phase less its layers)."""
    flops, io_counts = stats.flop_counts, stats.io_counts
    layers = sorted(((is_layer(p).index, p) for p in flops if is_layer(p)), key=lambda t: t[0])
    labels = [f"layer {i}" for i, _ in layers]
    f = [sum(flops[p].values()) for _, p in layers]
    b = [sum(io_counts.get(p, {}).values()) for _, p in layers]
    total_f, total_b = sum(flops["Global"].values()), sum(io_counts["Global"].values())
    return labels + ["outside layers"], f + [total_f - sum(f)], b + [total_b - sum(b)]


def _layers(phases: dict, chart_id: str) -> str:
    """Per-layer FLOPs and bytes, one line of points per phase (gid CHART-flops-PHASE, ...)."""
    fig, axes = figure(9.0, 3.8, panels=2)
    for n, (label, s) in enumerate(phases.items()):
        names, f, b = layer_totals(s)
        for ax, what, values, scale in ((axes[0], "flops", f, 1e9), (axes[1], "bytes", b, 1e6)):
            points(ax, range(len(names)), [v / scale for v in values],
                   f"{chart_id}-{what}-{label}", color=COLORS[n % len(COLORS)], label=label)
    for ax, unit in zip(axes, ("GFLOPs", "MB (per-op IO)")):
        ax.set(xlabel="decoder layer (last point: outside the layers)", ylabel=unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    out = svg(fig, chart_id)
    _close(fig)
    return out


def count_page(counter, title: str, summary: str) -> str:
    """`perfcounter count`'s page: the printed summary, the roofline, per-layer figures."""
    phases = {k: v for k, v in counter.counts.items() if k in ("prefill", "decode")} \
        or dict(counter.counts)
    return page(title, [
        ("summary", text_block(summary)),
        ("roofline", _roofline(phases, counter.device_spec, "count-roofline")),
        ("FLOPs and bytes by decoder layer", _layers(phases, "count-layers"))])


def sweep_page(rows: list[dict], title: str, headers, cells) -> str:
    """`perfcounter sweep`'s page: predicted latency and J/token of each combination by
    device and phase (gid sweep-chart-latency-DEVICE-PHASE, ...-energy-...), and the table."""
    def combo(r):
        return r["model"], r["batch"], r["prompt"], r["new"], r.get("weights"), r.get("kv_dtype")

    combos = list(dict.fromkeys(combo(r) for r in rows))
    fig, axes = figure(9.0, 3.8, panels=2)
    series = list(dict.fromkeys((r["device"], r["phase"]) for r in rows))
    for n, (device, phase) in enumerate(series):
        mine = {combo(r): r for r in rows if (r["device"], r["phase"]) == (device, phase)}
        for ax, what, key in ((axes[0], "latency", "predicted_latency_s"),
                              (axes[1], "energy", "j_per_token")):
            xy = [(i, mine[c][key]) for i, c in enumerate(combos)
                  if c in mine and mine[c][key] is not None]
            points(ax, [x for x, _ in xy], [y for _, y in xy], f"sweep-chart-{what}-{device}-{phase}",
                   color=COLORS[n % len(COLORS)], ls="none" if len(combos) == 1 else "-",
                   label=f"{device} {phase}")
    for ax, unit in zip(axes, ("predicted latency (s)", "J / token")):
        ax.set(xlabel="combination (the table's order)", ylabel=unit, yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    chart = svg(fig, "sweep-chart")
    _close(fig)
    return page(title, [("predicted latency and energy", chart),
                        ("rows", table(headers, [cells(r) for r in rows], "sweep-table"))])
