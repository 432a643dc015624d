"""Pictures of a counted generation: a roofline plot per device and stacked bars of time
or energy by module kind. matplotlib is an optional extra (`pip install
'perfcounter[plot]'`); it is imported only here, inside the functions, and drawn with
its Agg canvas (no display, no global backend switch).

    write_plots("plots/", counter, ["h100-sxm", "pim-ai-4chip"])   # rooflines + bars
    write_plots("plots/", simulation)                              # bars per device used
    sweep_plots("plots/", rows)                                    # perfcounter sweep's rows

Roofline (`roofline_plot`): log-log, arithmetic intensity (executed FLOPs per byte of
per-op IO) against FLOP/s, under the device's ridge min(peak FLOP/s, intensity x
bandwidth). Each phase is a point at its achieved FLOP/s when it was timed (a real
run; its label says "measured"), else at its predicted FLOP/s (executed FLOPs / the
sum of its ops' predicted seconds, predict.op_predictions run eagerly: below the
roofline by the per-call overhead and the achievable rates); beside it each module
kind and the `top` aten ops (by predicted time) of that phase, at predicted FLOP/s.

Bars (`kind_bars`): one panel per phase, one bar per device, stacked by module kind
(counting/module_kinds.py): embedding, attention, mlp, norm, lm_head, other (rotary
tables, code outside modules), transfers (the host link; a simulation's host, device links
and all-reduces) and, for energy, static power. Time is each op's predicted seconds
on the device (predict.op_predictions, eager) plus the host link (the roofline's, as
predict.predict adds it); energy its FLOPs x pJ/FLOP + bytes x pJ/bit (energy.py's
figures). A simulation's bars are its log: each module's ops on the device that ran
them (the simulator's times, roofline-based).

Every figure is written twice, NAME.png and NAME.svg, each atomically.
"""
from __future__ import annotations

import os
from pathlib import Path

from perfcounter._util import atomic_write, check_writable_target
from perfcounter.counting.module_kinds import MODULE_KINDS, module_kind
from perfcounter.devices import default_device_spec, get_device_spec
from perfcounter.pricing.energy import record_energies
from perfcounter.report.trace_events import op_times, write_trace
from perfcounter.simulation.source import SIMULATION, read_source
from perfcounter.trace import op_packet

KINDS = (*MODULE_KINDS, "transfers", "static")
COLORS = dict(zip(KINDS, ("#8c564b", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#7f7f7f",
                          "#d62728", "#bcbd22")))
MISSING = "plots need matplotlib, an optional extra: pip install 'perfcounter[plot]'"


class PlotError(ValueError):
    """matplotlib is missing, or a plot folder cannot be used."""


def _figure(width: float = 7.0, height: float = 5.0):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: the plot extra
        from matplotlib.figure import Figure  # deferred: optional (the plot extra)
    except ImportError:
        raise PlotError(MISSING) from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def check_plot_dir(path) -> Path:
    """The folder --plot writes into, checked before a long run, with matplotlib; a PlotError
    (one line) otherwise. Nothing is made: a missing folder whose parent exists is made by
    the writers, once there is something to write."""
    _figure()
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise PlotError(f"--plot {path}: not a directory")
    parent = folder if folder.exists() else folder.parent
    if not parent.is_dir():
        raise PlotError(f"--plot {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PlotError(f"--plot {path}: folder {parent} is not writable")
    return folder


def source_name(*parts) -> str:
    """A file-name stem saying what a picture shows: its source (the command, the model)
    and, where the caller adds it, the device; `None` parts are left out."""
    words = [_stem(Path(str(p))) if "/" in str(p) or Path(str(p)).suffix in _FILES else str(p)
             for p in parts if p is not None]
    return _safe("_".join(words))


def _save(fig, base: Path) -> list[Path]:
    out = []
    Path(base).parent.mkdir(exist_ok=True)  # a --plot folder check_plot_dir allowed
    for fmt in ("png", "svg"):
        path = Path(f"{base}.{fmt}")
        atomic_write(path, writer=lambda tmp, f=fmt: fig.savefig(tmp, format=f, dpi=120))
        out.append(path)
    return out


def _specs(specs, phases) -> list:
    if specs is None or specs == []:
        own = next((s.device_spec for s in phases.values() if s.device_spec is not None), None)
        if own is None:
            raise ValueError("no device to price on: give specs")
        return [own]
    return [get_device_spec(s) if isinstance(s, (str, os.PathLike)) else s
            for s in (specs if isinstance(specs, (list, tuple)) else [specs])]


def kind_rows(source, specs=None) -> list[dict]:
    """{phase, device, kind, time_s, energy_j} per phase, device and module kind; time_s
    predicted (see the module doc)."""
    src = read_source(source, "kind_rows()", ("counter", "stats", "dict", "simulation"))
    if src.kind == SIMULATION:
        return _simulation_rows(source)
    phases = src.stats()
    acc: dict[tuple, list] = {}

    def add(label, device, kind, t, j):
        cell = acc.setdefault((label, device, kind), [0.0, 0.0])
        cell[0] += t
        cell[1] += j
    for spec in _specs(specs, phases):
        for label, stats in phases.items():
            trace = stats.trace
            if trace is None:  # torchao's totals, read from a file: no ops to split
                continue
            classes = {m.path: m.cls for m in trace.modules}
            kinds = {}
            for r, t, e in zip(trace.records, op_times(trace, spec, stats.execution),
                               record_energies(trace.records, spec)):
                kind = kinds.get(r.module) or kinds.setdefault(r.module,
                                                               module_kind(r.module, classes))
                add(label, spec.name, kind, t.predicted_s,
                    (e.compute_j or 0.0) + (e.memory_j or 0.0))  # a figure lacking: 0 J
            on = stats.on(spec)
            add(label, spec.name, "transfers", on.roofline.host_link_s,
                on.energy.host_link_j or 0.0)
            add(label, spec.name, "static", 0.0, on.energy.static_j or 0.0)
    return [{"phase": p, "device": d, "kind": k, "time_s": t, "energy_j": j}
            for (p, d, k), (t, j) in acc.items()]


def _simulation_rows(sim) -> list[dict]:
    rows: dict[tuple, list] = {}
    for label, phase in sim.phases.items():
        classes = {m.path: m.cls for m in phase.modules}
        if not phase.log:
            raise ValueError("this simulation has no per-module log: simulate(..., detail=True)")
        for r in phase.log:  # its times: each module's roofline bound on its device
            kind = "transfers" if r.transfer else module_kind(r.module, classes)
            cell = rows.setdefault((label, r.device, kind), [0.0, 0.0])
            cell[0] += r.duration_s
            cell[1] += r.energy_j
        for key, d in phase.devices.items():
            static = d.energy_by_component_j.get("static", 0.0)
            if static:
                rows.setdefault((label, key, "static"), [0.0, 0.0])[1] += static
    return [{"phase": p, "device": d, "kind": k, "time_s": t, "energy_j": j, "bound": True}
            for (p, d, k), (t, j) in rows.items()]


def kind_bars(rows: list[dict], base, metric: str = "time") -> list[Path]:
    """Stacked bars of `metric` ("time" or "energy") by module kind: a panel per phase, a
    bar per device. Writes base.png and base.svg. The time axis says "predicted" only
    when it is (a simulation's rows, marked "bound", are the roofline's)."""
    key, unit = {"time": ("time_s", "s"), "energy": ("energy_j", "J")}[metric]
    bound = any(r.get("bound") for r in rows)
    name = metric if metric != "time" else "roofline-bound time" if bound else "predicted time"
    phases = list(dict.fromkeys(r["phase"] for r in rows))
    devices = list(dict.fromkeys(r["device"] for r in rows))
    fig = _figure(max(4.0, 2.2 * len(phases) + 0.6 * len(devices) * len(phases)), 4.5)
    axes = fig.subplots(1, max(len(phases), 1), squeeze=False)[0]
    for ax, phase in zip(axes, phases):
        values = {(r["device"], r["kind"]): r[key] for r in rows if r["phase"] == phase}
        top = max((sum(values.get((d, k), 0.0) for k in KINDS) for d in devices), default=0.0)
        scale, prefix = _prefix(top, unit)
        bottom = [0.0] * len(devices)
        for kind in KINDS:
            heights = [values.get((d, kind), 0.0) / scale for d in devices]
            if any(heights):
                ax.bar(range(len(devices)), heights, bottom=bottom, label=kind,
                       color=COLORS[kind])
                bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xticks(range(len(devices)), devices, rotation=30, ha="right", fontsize=8)
        ax.set_title(phase)
        ax.set_ylabel(f"{name} ({prefix})")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle(f"{name} by module kind")
    return _save(fig, Path(base))


def _prefix(value: float, unit: str) -> tuple[float, str]:
    for scale, p in ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"), (1e-12, "p")):
        if value >= scale:
            return scale, p + unit
    return 1.0, unit


def _points(stats, spec, measured, top: int) -> list[tuple[str, str, float, float]]:
    """(label, marker group, FLOPs per byte, FLOP/s) of a phase, its kinds and top ops: the
    phase at measured FLOP/s when timed, else predicted; kinds and ops at predicted."""
    trace = stats.trace
    times = op_times(trace, spec, stats.execution)
    classes = {m.path: m.cls for m in trace.modules}
    groups: dict[tuple, list] = {}
    for r, t in zip(trace.records, times):
        for key in (("kind", module_kind(r.module, classes)), ("op", op_packet(r.op))):
            cell = groups.setdefault(key, [0.0, 0.0, 0.0])
            cell[0] += r.executed_flops
            cell[1] += r.bytes
            cell[2] += t.predicted_s
    flops, nbytes = trace.executed_flops, trace.per_op_bytes
    predicted = sum(t.predicted_s for t in times)
    real = measured.get(stats.label, stats.latency)
    seconds, how = (real, "measured") if real else (predicted, "predicted")
    out = [(f"{stats.label} ({how})", "phase", flops, nbytes, seconds)]
    out += [(k, "kind", *v) for (g, k), v in groups.items() if g == "kind"]
    ops = sorted(((k, v) for (g, k), v in groups.items() if g == "op"), key=lambda kv: -kv[1][2])
    out += [(k.removeprefix("aten."), "op", *v) for k, v in ops[:top]]
    return [(label, group, f / b, f / s) for label, group, f, b, s in out if f and b and s]


def roofline_plot(source, spec, base, *, measured: dict | None = None, top: int = 6) -> list[Path]:
    """The roofline of a counted generation on one device (see the module doc)."""
    phases = read_source(source, "roofline_plot()").stats()
    spec = _specs(spec, phases)[0]
    fig = _figure(8.0, 5.5)
    ax = fig.add_subplot()
    markers = {"phase": ("*", 180), "kind": ("o", 50), "op": ("^", 30)}
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
    xs = []
    for n, (label, stats) in enumerate(phases.items()):
        if stats.trace is None:  # torchao's totals, read from a file
            continue
        for k, (text, group, x, y) in enumerate(_points(stats, spec, measured or {}, top)):
            m, size = markers[group]
            color = colors[n % len(colors)]
            ax.scatter([x], [y], marker=m, s=size, color=color,
                       label=label if group == "phase" else None, zorder=3)
            # labels fan out below and to the right, so that close points stay readable
            ax.annotate(text, (x, y), fontsize=8 if group == "phase" else 6, color=color,
                        xytext=(6, -10 * (k % 6) - 4 * n), textcoords="offset points",
                        weight="bold" if group == "phase" else "normal",
                        arrowprops={"arrowstyle": "-", "lw": 0.3, "color": color})
            xs.append(x)
    peak, bw = float(spec.flops_per_s), float(spec.bandwidth)
    ridge = peak / bw
    lo, hi = min(xs + [ridge]) / 10, max(xs + [ridge]) * 10
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, x * bw) for x in grid], color="black", lw=1.5,
            label=f"roofline (ridge {ridge:.3g} FLOP/B)")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, per-op IO)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{spec.name}: {peak / 1e12:.3g} TFLOP/s peak, {bw / 1e9:.4g} GB/s "
                 "(★ phase, ● module kind, ▲ op)", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, Path(base))


def write_plots(folder, source, specs=None, *, measured: dict | None = None,
                name: str | None = None) -> list[Path]:
    """Every picture of a counted generation (rooflines per device, time and energy by
    module kind) or of a Simulation (its bars) into `folder`; returns the files written.
    File names carry what they show: NAME_DEVICE_roofline, NAME_DEVICES_time_by_kind, ...
    (name: the source, e.g. source_name("count", "llama-2-7b"); default "simulate" for a
    Simulation, else "count")."""
    folder = Path(folder)
    src = read_source(source, "write_plots()", ("counter", "stats", "dict", "simulation"))
    simulation = src.kind == SIMULATION
    name = name or ("simulate" if simulation else "count")
    written: list[Path] = []
    if not simulation:
        phases = src.stats()
        specs = _specs(specs, phases)
        for spec in specs:
            written += roofline_plot(phases, spec, folder / f"{name}_{_safe(spec.name)}_roofline",
                                     measured=measured)
    rows = kind_rows(source, specs)
    devices = _safe("+".join(dict.fromkeys(r["device"] for r in rows)))
    for metric in ("time", "energy"):
        written += kind_bars(rows, folder / f"{name}_{devices}_{metric}_by_kind", metric)
    return written


_FILES = (".json", ".gguf", ".pth", ".pt", ".safetensors", ".bin", ".yaml")


def _stem(path: Path) -> str:
    """A model file's name without its suffix; a config.json's folder's name."""
    return path.parent.name or path.stem if path.name == "config.json" else path.stem


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in name)


def sweep_plots(folder, rows: list[dict]) -> list[Path]:
    """perfcounter sweep's rows compared across devices: latency and J/token per phase,
    a group of bars (one per device) per model and size, in sweep_MODELS_DEVICES_latency
    and sweep_MODELS_DEVICES_energy."""
    written = []
    stem = source_name("sweep", "+".join(dict.fromkeys(source_name(r["model"]) for r in rows)),
                       "+".join(dict.fromkeys(r["device"] for r in rows)))[:120]
    combos = list(dict.fromkeys((r["model"], r["batch"], r["prompt"], r["new"]) for r in rows))
    devices = list(dict.fromkeys(r["device"] for r in rows))
    phases = list(dict.fromkeys(r["phase"] for r in rows))
    width = 0.8 / max(len(devices), 1)
    predicted = all(r.get("predicted_latency_s") for r in rows)  # else the bound alone
    execution = rows[0].get("execution", "eager") if rows else "eager"
    for key, name, unit in (("predicted_latency_s" if predicted else "latency_s", "latency", "s"),
                            ("j_per_token", "energy", "J/token")):
        fig = _figure(max(5.0, 1.2 * len(combos) * len(phases)), 4.5)
        axes = fig.subplots(1, max(len(phases), 1), squeeze=False)[0]
        for ax, phase in zip(axes, phases):
            for i, device in enumerate(devices):
                mine = {(r["model"], r["batch"], r["prompt"], r["new"]): r for r in rows
                        if r["device"] == device and r["phase"] == phase}
                x = [c + i * width for c in range(len(combos))]
                ax.bar(x, [(mine[c][key] or 0.0) if c in mine else 0.0 for c in combos], width,
                       label=device)
                if name == "latency" and predicted:  # the bound beside it, a black tick
                    ax.scatter(x, [mine[c]["latency_s"] if c in mine else float("nan")
                                   for c in combos], marker="_", s=200, color="black",
                               label="roofline bound" if i == 0 else None, zorder=3)
            ax.set_xticks([c + 0.4 - width / 2 for c in range(len(combos))],
                          [f"{m}\nb{b} p{p} n{n}" for m, b, p, n in combos], fontsize=7)
            ax.set_yscale("log")
            ax.set_title(phase)
            ax.set_ylabel(f"predicted {name}, {execution} ({unit})"
                          if name == "latency" and predicted else
                          f"{'roofline ' if name == 'latency' else ''}{name} ({unit})")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"sweep: {name} per device")
        written += _save(fig, Path(folder) / f"{stem}_{name}")
    return written


# -- the --plot DIR / --trace FILE flags of generate.py and the CLIs -------------------------
def check_outputs(plot=None, trace=None) -> tuple[Path | None, Path | None]:
    """(plot folder, trace file), both checked before a long run: a ValueError (one line,
    exit 2 on the command line) for a bad path or a missing matplotlib."""
    folder = None if plot is None else check_plot_dir(plot)
    if trace is not None:
        try:
            check_writable_target(trace)
        except OSError as e:
            raise PlotError(f"--trace {trace}: {e}") from None
    return folder, None if trace is None else Path(trace)


def write_outputs(outputs: tuple, source, specs=None, *, measured: dict | None = None,
                  log=print, name: str | None = None) -> list[Path]:
    """The pictures and the trace that check_outputs allowed, of a counter or a Simulation;
    priced on `specs` (default: the counter's device, else this machine's)."""
    folder, trace = outputs
    src = read_source(source, "write_outputs()", ("counter", "stats", "dict", "simulation"))
    simulation = src.kind == SIMULATION
    if not simulation and not specs and all(s.device_spec is None
                                           for s in src.stats().values()):
        specs = [default_device_spec()]
    written = [] if folder is None else write_plots(folder, source, specs, measured=measured,
                                                    name=name)
    if trace is not None:
        one = None if simulation else _specs(specs, src.stats())[0]
        write_trace(trace, source, one, measured=measured)
        written.append(trace)
    for path in written:
        log(f"wrote {path}")
    return written
