"""All of perfcounter's text formatting: numbers, tables, phase reports, device comparisons.

Numbers: `si` scales to an SI prefix (13.25 GB, 0.37 ms; nearest=True: torchao's
nearest prefix above one too, 0.12 TFLOPs) or, for a table column, to a fixed one
(3,350 GB/s); `scaled` is the bare number at a fixed prefix
(989.5 under a "TFLOP/s" header); `rate` is a throughput in words (4.77 tokens/s);
`percent` prints a fraction, as utilizations are stored, as a percent (1.13 %).
A figure that cannot be known is printed "n/a". Tables: `format_table`, fixed-width
text or markdown. Phases: `format_stats` keeps the layout of torchao's
TransformerPerfCounter output (Latency / Tokens / IO / FLOPs / Utilization blocks)
and adds the roofline, energy, coverage, scopes and a per-module table.

Nothing here prints, and nothing here imports what it renders: a phase is any
object with PerformanceStats' attributes (stats.py imports this module for
`PerformanceStats.__str__`), so every part of the package can format with it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from perfcounter.format import NA, format_table, percent, rate, ratio, si
from perfcounter.pricing.predict import describe_basis, phase_program


def _device_line(stats) -> str:
    spec = stats.device_spec
    dtype = spec.dtype
    dtype = str(dtype).replace("torch.", "") if dtype is not None else "default dtype"
    return f"{spec.name} ({spec.device_type}, {dtype})"


def _utilization(fraction) -> str:
    """'1.13 % (0.0113 of peak)': the percent, and the fraction torchao printed (to four
    places, or two significant digits where those would read 0.0000: 3.2e-07 of peak)."""
    if fraction is None:
        return NA
    share = f"{fraction:.4f}" if fraction == 0 or abs(fraction) >= 1e-4 else f"{fraction:.2g}"
    return f"{percent(fraction)} ({share} of peak)"


def format_stats(stats, module_depth: int | None = 4) -> str:
    """One phase (a PerformanceStats) as text, in seed 004's layout plus roofline, energy, scopes
    and a per-module table down to `module_depth` (None: no module table). IO and FLOPs
    take torchao's nearest SI prefix (0.12 TFLOPs); a phase built from torchao's totals
    (no trace) has the torchao block only."""
    s = stats
    latency = si(s.latency, "s")
    if s.latency is not None and s.raw_latency is not None:
        latency += (f" (raw {si(s.raw_latency, 's')}, "
                    f"counting overhead {si(s.overhead_s, 's')} excluded)")
    elif s.timing:  # not measured, or measured apart from the counting (set_measured)
        latency += f" ({s.timing})"
    lines = [
        f"{s.label}:",
        f"  Latency = {latency}",
        "  Tokens",
        f"    Total: {s.num_tokens} tokens" + (f" in {s.steps} steps" if s.steps > 1 else ""),
        f"    Throughput: {rate(s.token_throughput, 'tokens/s')}",
        "  IO" + ("" if s.io_model == "per_op" else f" ({s.io_model})"),
        f"    Total: {si(s.total_io, 'B', nearest=True)}",
        f"    Throughput: {si(s.achieved_bandwidth, 'B/s', nearest=True)}",
        f"    Theoretical Latency: {si(s.theoretical_io_latency, 's')}",
        "  FLOPs ",
        f"    Total: {si(s.total_flops, 'FLOPs', nearest=True)}",
        f"    Throughput: {si(s.achieved_flops_per_s, 'FLOPs/s', nearest=True)}",
        f"    Theoretical Latency: {si(s.theoretical_compute_latency, 's')}",
        "  Utilization",
        f"    Bandwidth: {_utilization(s.bandwidth_utilization)}",
        f"    FLOPs: {_utilization(s.flops_utilization)}",
    ]
    if s.trace is None:
        return "\n".join(lines)
    kinds = ", ".join(f"{k} {si(v, '')}".rstrip() for k, v in s.flops_by_kind.items() if v)
    lines.append(f"  Ops by kind: {kinds or 'none'}")
    io = s.io_by_role
    lines.append("  Bytes by role: " + ", ".join(
        f"{role} {si(io['read'][role], 'B')} read / {si(io['written'][role], 'B')} written"
        for role in io["read"] if io["read"][role] or io["written"][role]))
    if s.roofline is not None:
        line, en = s.roofline, s.energy
        lines += [
            f"  Roofline on {_device_line(s)}",
            f"    Latency: {si(line.latency_s, 's')} ({line.bound}-bound; "
            f"compute {si(line.compute_s, 's')}, memory {si(line.memory_s, 's')}"
            + (f", host link {si(line.host_link_s, 's')}" if line.host_link_s else "")
            + (f", collectives {si(line.collective_s, 's')} on the link"
               if line.collective_s else "") + ")",
            f"    Throughput: {rate(s.roofline_token_throughput, 'tokens/s')}",
            f"    Arithmetic intensity: {s.arithmetic_intensity or 0:.2f} FLOPs/B",
            *_prediction_lines(s),
            "  Energy",
            f"    Total: {si(en.total_j, 'J')} ({si(s.energy_per_token_j, 'J')}/token)",
            f"    Compute: {si(en.compute_j, 'J')}, memory: {si(en.memory_j, 'J')}, "
            f"host link: {si(en.host_link_j, 'J')}, static: {si(en.static_j, 'J')}",
            _power_line(en),
        ]
    cov = s.coverage
    lines.append(f"  Coverage: {percent(cov['bytes'])} of bytes, {percent(cov['calls'])} of op "
                 f"calls had a formula")
    if s.uncounted_ops:
        lines.append("  Uncounted ops: " + ", ".join(
            f"{op} x{n}" for op, n in sorted(s.uncounted_ops.items())))
    scopes = {k: v for k, v in s.scopes().items() if v["calls"]}
    if set(scopes) - {"transformer"}:  # a model with recognised parts
        lines += ["  Scopes", _table(scopes, s, indent=4)]
    if module_depth is not None:
        rows = merged_modules(s, module_depth)
        if rows:  # the depth the rows reach: the counter's, where it tracked less than asked
            deepest = max(len(path.split(".")) for path in rows)
            lines += [f"  Modules (depth {deepest}, layer indices merged as *)",
                      _table(rows, s, indent=4)]
    return "\n".join(lines)


def _power_line(en) -> str:
    """The phase's average power and the model that priced it (pricing/power.py)."""
    if en.model == "power":
        how = "power model: idle + activity" + (
            f", at most {si(en.cap_w, 'W')}" if en.cap_w is not None else "")
        over = "predicted"
    else:
        how, over = "dynamic model: pJ figures + static W", "roofline"
    return f"    Mean power: {si(en.mean_power_w, 'W')} over the {over} {si(en.seconds, 's')} ({how})"


def _prediction_lines(s) -> list[str]:
    """The prediction beside the roofline (the roofline is a bound, this is a prediction)."""
    p = s.prediction()
    program = phase_program(s.device_spec, s.execution, s.label)[1]  # a dynamic prefill's own
    regime = p.execution + (" for any prompt length" if program is not s.device_spec else "")
    line = (f"    Latency: {si(p.latency_s, 's')} ({regime}: overhead {si(p.overhead_s, 's')} for "
            f"{p.op_calls:,} {'op calls' if p.execution == 'eager' else 'kernels'} + work {si(p.work_s, 's')}; {describe_basis(s.device_spec, p)})")
    lines = ["  Prediction (the roofline above is a bound)", line]
    if s.latency is not None:
        lines.append(f"    Measured ÷ predicted: {ratio(s.latency, p.latency_s)} (measured ÷ "
                     f"roofline {ratio(s.latency, s.roofline_latency)})")
        if s.device_spec.device_type != "cpu" and s.timing.startswith("time.perf_counter"):
            lines.append(f"    NB: timed by the host's clock, priced on {s.device_spec.name} "
                         f"({s.device_spec.device_type}): where the run did not run on it, the "
                         "ratio compares two devices, not the prediction with its run")
    return lines


def merged_modules(stats, depth: int) -> dict[str, dict]:
    """stats.modules(depth) with numeric path components (layer indices) merged; a list of
    layers whose row is its merged layers' row (`layers` beside `layers.*`: a container with
    no work of its own) is left out, its `.*` row says it."""
    out: dict[str, dict] = {}
    for path, row in stats.modules(depth).items():
        key = re.sub(r"(?<=\.)\d+(?=\.|$)", "*", path)
        if key in out:
            for k, v in row.items():
                out[key][k] += v
        else:
            out[key] = dict(row)
    return {k: v for k, v in out.items() if not _same(out.get(f"{k}.*"), v)}


def _same(a: dict | None, b: dict) -> bool:
    """Two module rows with the same figures (sums in another order: to 1e-9)."""
    return a is not None and a.keys() == b.keys() and all(
        a[k] == b[k] if isinstance(b[k], int) else math.isclose(a[k], b[k], rel_tol=1e-9)
        for k in b)


def _table(rows: dict[str, dict], stats, indent: int) -> str:
    """The scopes / modules table: calls, FLOPs, bytes and, when priced, roofline and share."""
    head = ["", "Calls", "FLOPs", "Read", "Written"]
    total = stats.roofline_latency
    if total is not None:
        head += ["Roofline", "Share"]
    body = []
    for name, r in rows.items():
        cells = [name, f"{r['calls']:,}", si(r["flops"], "FLOPs"), si(r["bytes_read"], "B"),
                 si(r["bytes_written"], "B")]
        if total is not None:
            cells += [si(r["roofline_s"], "s"), percent(r["roofline_s"] / total if total else None)]
        body.append(cells)
    return format_table(body, head, indent=indent)


def to_markdown(phases) -> str:
    """One markdown table, a row per phase (PerformanceStats)."""
    head = ["Phase", "Tokens", "Steps", "Latency", "FLOPs", "IO", "Tokens/s", "BW util",
            "FLOP util", "Roofline", "Bound", "Predicted", "Meas/pred", "Energy/token"]
    body = [[s.label, str(s.num_tokens), str(s.steps), si(s.latency, "s"),
             si(s.total_flops, "FLOPs"), si(s.total_io, "B"), rate(s.token_throughput, "tok/s"),
             percent(s.bandwidth_utilization), percent(s.flops_utilization),
             si(s.roofline_latency, "s"), s.bound or NA, si(s.predicted_latency, "s"),
             ratio(s.latency, s.predicted_latency), si(s.energy_per_token_j, "J")]
            for s in phases]
    return format_table(body, head, markdown=True)


@dataclass
class Comparison:
    """Phases priced on several devices: (device spec, stats on it) pairs."""

    rows: list[tuple]  # (DeviceSpec, PerformanceStats)

    _HEAD = ["Device", "Phase", "Roofline", "Bound", "Roofline tok/s", "Predicted",
             "Predicted tok/s", "Energy", "Energy/token"]

    def _cells(self) -> list[list[str]]:
        return [[spec.name, s.label, si(s.roofline_latency, "s"), s.bound or NA,
                 rate(s.roofline_token_throughput, "tok/s"), si(s.predicted_latency, "s"),
                 rate(_per_s(s.num_tokens, s.predicted_latency), "tok/s"),
                 si(s.energy_j, "J"), si(s.energy_per_token_j, "J")] for spec, s in self.rows]

    def to_dict(self) -> list[dict]:
        return [{"device": spec.name, "phase": s.label, "roofline_latency": s.roofline_latency,
                 "predicted_latency": s.predicted_latency,
                 "predicted_tokens_per_s": _per_s(s.num_tokens, s.predicted_latency),
                 "bound": s.bound, "tokens_per_s": s.roofline_token_throughput,
                 "energy_j": s.energy_j, "energy_per_token_j": s.energy_per_token_j}
                for spec, s in self.rows]

    def to_markdown(self) -> str:
        return format_table(self._cells(), self._HEAD, markdown=True)

    def __str__(self) -> str:
        return format_table(self._cells(), self._HEAD, align="llrrrrrrr")


def _per_s(tokens: int, seconds) -> float | None:
    """Tokens a second at `seconds` a phase (None where the time is unknown or zero)."""
    return tokens / seconds if seconds else None
