"""Rendering of phases: the text report, markdown tables, device comparisons.

The text report keeps the layout of torchao's TransformerPerfCounter output
(Latency / Tokens / IO / FLOPs / Utilization blocks) and adds the roofline,
energy, coverage, scopes and a per-module table. Numbers are scaled to the
nearest SI prefix (13.25 GB, 0.37 ms); utilizations, stored as fractions, are
printed as percents. A figure that cannot be known is printed "n/a".
Nothing here prints: every function returns a string.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from perfcounter.stats import PerformanceStats

_PREFIXES = {-12: "p", -9: "n", -6: "µ", -3: "m", 0: "", 3: "K", 6: "M", 9: "G", 12: "T", 15: "P"}
NA = "n/a"


def si(value, unit: str, precision: int = 2) -> str:
    """'13.25 GB', '0.37 ms': the value scaled to an SI prefix (torchao's
    choice below one: the prefix nearest the magnitude, so 0.16 s stays s)."""
    if value is None:
        return NA
    if value == 0:
        return f"0 {unit}"
    power = math.floor(math.log10(abs(value)))
    if power >= 0:  # 148 B, 13.25 GB
        nearest = min(3 * (power // 3), max(_PREFIXES))
    else:  # below one, the nearest prefix: 0.16 s, 0.37 ms, 14.15 ms
        nearest = min(_PREFIXES, key=lambda p: (abs(p - power), p))
    if nearest == 0 and float(value).is_integer():
        return f"{int(value):,} {unit}"
    return f"{value / 10 ** nearest:,.{precision}f} {_PREFIXES[nearest]}{unit}"


def percent(fraction) -> str:
    """A fraction printed as a percent: 0.0113 -> '1.13 %'."""
    if fraction is None:
        return NA
    pct = fraction * 100
    return f"{pct:.2f} %" if pct == 0 or abs(pct) >= 0.01 else f"{pct:.2g} %"


def rate(value, unit: str) -> str:
    """Tokens per second and the like: '4.76 tokens/s', '5,120 tokens/s', '1.41 M tokens/s'."""
    if value is None:
        return NA
    if abs(value) >= 1e5:
        return si(value, " " + unit).replace("  ", " ")
    return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:,.2f} {unit}"


def _device_line(stats: PerformanceStats) -> str:
    spec = stats.device_spec
    dtype = getattr(spec, "dtype", None)
    dtype = str(dtype).replace("torch.", "") if dtype is not None else "default dtype"
    return f"{spec.name} ({getattr(spec, 'device_type', '?')}, {dtype})"


def format_stats(stats: PerformanceStats, module_depth: int | None = 4) -> str:
    """One phase as text, in seed 004's layout plus roofline, energy, scopes
    and a per-module table down to `module_depth` (None: no module table)."""
    s = stats
    latency = si(s.latency, "s")
    if s.latency is not None and s.raw_latency is not None:
        latency += (f" (raw {si(s.raw_latency, 's')}, "
                    f"counting overhead {si(s.overhead_s, 's')} excluded)")
    elif s.latency is None:
        latency += f" ({s.timing})" if s.timing else ""
    lines = [
        f"{s.label}:",
        f"  Latency = {latency}",
        "  Tokens",
        f"    Total: {s.num_tokens} tokens" + (f" in {s.steps} steps" if s.steps > 1 else ""),
        f"    Throughput: {rate(s.token_throughput, 'tokens/s')}",
        "  IO" + ("" if s.io_model == "per_op" else f" ({s.io_model})"),
        f"    Total: {si(s.total_io, 'B')}",
        f"    Throughput: {si(s.achieved_bandwidth, 'B/s')}",
        f"    Theoretical Latency: {si(s.theoretical_io_latency, 's')}",
        "  FLOPs ",
        f"    Total: {si(s.total_flops, 'FLOPs')}",
        f"    Throughput: {si(s.achieved_flops_per_s, 'FLOPs/s')}",
        f"    Theoretical Latency: {si(s.theoretical_compute_latency, 's')}",
        "  Utilization",
        f"    Bandwidth: {percent(s.bandwidth_utilization)}",
        f"    FLOPs: {percent(s.flops_utilization)}",
    ]
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
            + (f", host link {si(line.host_link_s, 's')}" if line.host_link_s else "") + ")",
            f"    Throughput: {rate(s.roofline_token_throughput, 'tokens/s')}",
            f"    Arithmetic intensity: {s.arithmetic_intensity or 0:.2f} FLOPs/B",
            "  Energy",
            f"    Total: {si(en.total_j, 'J')} ({si(s.energy_per_token_j, 'J')}/token)",
            f"    Compute: {si(en.compute_j, 'J')}, memory: {si(en.memory_j, 'J')}, "
            f"host link: {si(en.host_link_j, 'J')}, static: {si(en.static_j, 'J')}",
        ]
    cov = s.coverage
    lines.append(f"  Coverage: {percent(cov['bytes'])} of bytes, {percent(cov['calls'])} of op "
                 f"calls had a formula")
    if s.uncounted_ops:
        lines.append("  Uncounted ops: " + ", ".join(
            f"{op} x{n}" for op, n in sorted(s.uncounted_ops.items())))
    scopes = {k: v for k, v in s.scopes().items() if v["calls"]}
    if set(scopes) - {"transformer"}:  # a model with recognised parts
        lines += ["  Scopes"] + _table(scopes, s, indent=4)
    if module_depth is not None:
        rows = merged_modules(s, module_depth)
        if rows:
            lines += [f"  Modules (depth {module_depth}, layer indices merged as *)"]
            lines += _table(rows, s, indent=4)
    return "\n".join(lines)


def merged_modules(stats: PerformanceStats, depth: int) -> dict[str, dict]:
    """stats.modules(depth) with numeric path components (layer indices) merged."""
    out: dict[str, dict] = {}
    for path, row in stats.modules(depth).items():
        key = re.sub(r"(?<=\.)\d+(?=\.|$)", "*", path)
        if key in out:
            for k, v in row.items():
                out[key][k] += v
        else:
            out[key] = dict(row)
    return out


def _table(rows: dict[str, dict], stats: PerformanceStats, indent: int) -> list[str]:
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
    widths = [max(len(str(c[i])) for c in [head] + body) for i in range(len(head))]
    pad = " " * indent
    fmt = lambda c: pad + "  ".join(  # noqa: E731
        str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(c, widths)))
    return [fmt(head).rstrip()] + [fmt(c) for c in body]


def _markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def to_markdown(phases: list[PerformanceStats]) -> str:
    """One markdown table, a row per phase."""
    head = ["Phase", "Tokens", "Steps", "Latency", "FLOPs", "IO", "Tokens/s", "BW util",
            "FLOP util", "Roofline", "Bound", "Energy/token"]
    body = [[s.label, str(s.num_tokens), str(s.steps), si(s.latency, "s"),
             si(s.total_flops, "FLOPs"), si(s.total_io, "B"), rate(s.token_throughput, "tok/s"),
             percent(s.bandwidth_utilization), percent(s.flops_utilization),
             si(s.roofline_latency, "s"), s.bound or NA, si(s.energy_per_token_j, "J")]
            for s in phases]
    return _markdown(head, body)


@dataclass
class Comparison:
    """Phases priced on several devices: (device spec, stats on it) pairs."""

    rows: list[tuple[object, PerformanceStats]]

    _HEAD = ["Device", "Phase", "Roofline", "Bound", "Tokens/s", "Energy", "Energy/token"]

    def _cells(self) -> list[list[str]]:
        return [[spec.name, s.label, si(s.roofline_latency, "s"), s.bound or NA,
                 rate(s.roofline_token_throughput, "tok/s"), si(s.energy_j, "J"),
                 si(s.energy_per_token_j, "J")] for spec, s in self.rows]

    def to_dict(self) -> list[dict]:
        return [{"device": spec.name, "phase": s.label, "roofline_latency": s.roofline_latency,
                 "bound": s.bound, "tokens_per_s": s.roofline_token_throughput,
                 "energy_j": s.energy_j, "energy_per_token_j": s.energy_per_token_j}
                for spec, s in self.rows]

    def to_markdown(self) -> str:
        return _markdown(self._HEAD, self._cells())

    def __str__(self) -> str:
        body = self._cells()
        widths = [max(len(c[i]) for c in [self._HEAD] + body) for i in range(len(self._HEAD))]
        return "\n".join("  ".join(x.ljust(w) if i < 2 else x.rjust(w)
                                   for i, (x, w) in enumerate(zip(c, widths))).rstrip()
                         for c in [self._HEAD] + body)
