"""Text rendering of a Simulation: the per-phase summary and UPMEM's optional views.

    summary       per phase: tokens, time, tokens/s, energy, J/token, energy by component
    log_summary   per phase and device: busy / compute / memory / transfer time, bytes
                  over each link, energy (UPMEM's --print_log_summary)
    layers        each module: class, device, parameters, input shapes (--report_layers)
    functions     per phase, device and aten op: calls, FLOPs, bytes, time, energy
                  (--report_functions)
    log           per phase, time ordered: each module's ops and each transfer with its
                  start, duration, device, bytes and energy (--print_log)

Numbers go through format.py's helpers (si, rate, format_table); nothing here prints.
"""
from __future__ import annotations

from perfcounter.format import format_table, rate, si

_COMPONENT_NAMES = {"compute": "compute", "memory": "memory", "host_link": "host link",
                    "device_link": "device link", "static": "static"}


def _j(value) -> str:
    return si(value, "J")


def render(sim, *, layers=False, functions=False, log=False, log_summary=False) -> str:
    parts = [_header(sim), _summary(sim)]
    if log_summary:
        parts += [_log_summary(label, p) for label, p in sim.phases.items()]
    if layers:
        parts.append(_layers(sim))
    if functions:
        parts += [_functions(label, p) for label, p in sim.phases.items()]
    if log:
        parts += [_log(label, p) for label, p in sim.phases.items()]
    if sim.notes:
        parts.append("Notes:\n" + "\n".join(f"  - {n}" for n in sim.notes))
    return "\n\n".join(p for p in parts if p)


def _header(sim) -> str:
    opts = sim.options
    default = opts.get("default_device") or "none (unmapped modules stay where the previous ran)"
    lines = [f"Simulation: {len(sim.mapping)} mapping keys, host {sim.host}, default device "
             f"{default}"
             f", elementwise model {opts.get('elementwise_model')}, "
             f"overlap {'on' if opts.get('overlap') else 'off'}"]
    if opts.get("execution"):
        lines.append(f"time: the bound (every op at peak x peak fraction); predicted: run "
                     f"{opts['execution']}, each op at its device's achievable rate for its "
                     f"kernel class plus its overheads (pricing/predict.py)")
    rows = []
    for key, d in sim.devices.items():
        rows.append([key, d.get("device_type") or "-", si(d.get("bandwidth"), "B/s", 1),
                     si(d.get("flops_per_s"), "FLOP/s", 1),
                     si(d.get("host_to_device_bw"), "B/s", 1),
                     si(d.get("device_to_host_bw"), "B/s", 1), f"{d.get('peak_fraction', 1):g}"])
    lines.append(format_table(rows, ["device", "type", "bandwidth", "peak", "host->dev",
                                     "dev->host", "peak fraction"], align="llrrrrr",
                              indent=2, rule=True))
    return "\n".join(lines)


def _summary(sim) -> str:
    rows = []
    for label, p in sim.phases.items():
        comp = p.energy_by_component_j
        rows.append([label, str(p.num_tokens), si(p.time_s, "s"), rate(p.tokens_per_s, "tokens/s"),
                     si(p.predicted_s, "s"), rate(p.predicted_tokens_per_s, "tokens/s"),
                     _j(p.energy_j), _j(p.j_per_token)] + [_j(comp[k]) for k in _COMPONENT_NAMES])
    predicted = [p.predicted_s for p in sim.phases.values()]
    rows.append(["total", str(sum(p.num_tokens for p in sim.phases.values())), si(sim.time_s, "s"),
                 "", si(None if None in predicted else sum(predicted), "s"), "",
                 _j(sim.energy_j), ""] + [""] * len(_COMPONENT_NAMES))
    return format_table(rows, ["phase", "tokens", "bound", "throughput", "predicted",
                               "throughput", "energy", "J/token"]
                        + list(_COMPONENT_NAMES.values()), rule=True)


def _log_summary(label, p) -> str:
    rows = []
    for key, d in p.devices.items():
        rows.append([key, si(d.busy_s, "s"), si(d.predicted_busy_s, "s"),
                     si(d.compute_s, "s"), si(d.memory_s, "s"),
                     si(d.transfer_s, "s"), si(d.flops, "FLOP"), si(d.bytes, "B"),
                     si(d.host_to_device_bytes, "B"), si(d.device_to_host_bytes, "B"),
                     si(d.device_link_bytes + d.allreduce_bytes, "B"), _j(d.energy_j)])
    head = ["device", "busy", "predicted", "compute", "memory", "transfer", "FLOPs", "bytes",
            "host->dev",
            "dev->host", "dev<->dev", "energy"]
    return f"{label}: per device\n" + format_table(rows, head, indent=2, rule=True)


def _layers(sim) -> str:
    first = next((p for p in sim.phases.values() if p.modules), None)
    if first is None:
        return "layers: none recorded (detail=False)"
    rows = [[m.path, m.cls, "+".join(m.devices), f"{m.params:,}", m.input_shapes or "-"]
            for m in first.modules]
    return f"layers ({first.label}):\n" + format_table(
        rows, ["module", "class", "device", "params", "input shapes"], align="lllrl",
        indent=2, rule=True)


def _functions(label, p) -> str:
    rows = [[f.device, f.op, f"{f.calls:,.0f}", si(f.flops, "FLOP"), si(f.bytes, "B"),
             si(f.time_s, "s"), _j(f.energy_j)]
            for f in sorted(p.functions, key=lambda f: -f.time_s)]
    return f"{label}: functions\n" + format_table(
        rows, ["device", "op", "calls", "FLOPs", "bytes", "time", "energy"], align="llrrrrr",
        indent=2, rule=True)


def _log(label, p) -> str:
    rows = [[si(r.start_s, "s"), si(r.duration_s, "s"), r.device, r.module or "(outside modules)",
             si(r.bytes, "B"), _j(r.energy_j), r.transfer] for r in p.log]
    return f"{label}: log ({p.steps} step{'s' if p.steps != 1 else ''} counted; one forward " \
           "shown, each row summed over the steps)\n" + format_table(
        rows, ["start", "duration", "device", "module", "bytes", "energy", "transfer"],
        align="rrllrrl", indent=2, rule=True)
