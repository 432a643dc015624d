"""Numbers and tables as perfcounter prints them: one number formatter, one table printer.

`si` scales to an SI prefix (13.25 GB, 0.37 ms; nearest=True: torchao's nearest prefix
above one too, 0.12 TFLOPs) or, for a table column, to a fixed one (3,350 GB/s); `scaled`
is the bare number at a fixed prefix (989.5 under a "TFLOP/s" header); `rate` is a
throughput in words (4.77 tokens/s); `percent` prints a fraction, as utilizations are
stored, as a percent (1.13 %); `ratio` is measured ÷ predicted (1.05x); `torchao_si` is
torchao's compact form for its getters. A figure that cannot be known is printed "n/a".
`format_table` lays rows out as fixed-width text or markdown.

A leaf: it imports nothing of perfcounter, so every layer can format with it.
"""
from __future__ import annotations

import math

_PREFIXES = {-12: "p", -9: "n", -6: "µ", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P"}
_POWERS = {prefix: power for power, prefix in _PREFIXES.items()}
NA = "n/a"


def scaled(value, prefix: str = "", digits: int = 2, *, na: str = NA) -> str:
    """The number in units of a fixed SI prefix, without a unit, thousands separated:
    scaled(13.345e9, "G", 3) == "13.345" (for a column whose header names the unit)."""
    if value is None:
        return na
    return f"{value / 10 ** _POWERS[prefix]:,.{digits}f}"


def si(value, unit: str, digits: int = 2, *, prefix: str | None = None, nearest: bool = False,
       na: str = NA) -> str:
    """'13.25 GB', '0.37 ms': the value scaled to an SI prefix (torchao's choice below
    one: the prefix nearest the magnitude, so 0.16 s stays s; above one the largest
    prefix not above it, 148 B, 123.00 GFLOPs). nearest=True takes the nearest prefix
    above one too, as torchao's report did: 0.12 TFLOPs, 0.15 KB. prefix="G" fixes the
    prefix instead, as a table column wants: si(3.35e12, "B/s", 0, prefix="G") == "3,350 GB/s"."""
    if value is None:
        return na
    if prefix is not None:
        return f"{scaled(value, prefix, digits)} {prefix}{unit}"
    if value == 0:
        return f"0 {unit}"
    if not math.isfinite(value):  # an overflowed product of figures: said as it is, never a crash
        return f"{value} {unit}"
    power = math.floor(math.log10(abs(value)))
    if power >= 0 and not nearest:  # 148 B, 13.25 GB
        chosen = min(3 * (power // 3), max(_PREFIXES))
    else:  # the nearest prefix: 0.16 s, 0.37 ms, 14.15 ms (and with nearest=True 0.12 TFLOPs)
        chosen = min(_PREFIXES, key=lambda p: (abs(p - power), p))
    if chosen == 0 and float(value).is_integer():
        return f"{int(value):,} {unit}"
    return f"{scaled(value, _PREFIXES[chosen], digits)} {_PREFIXES[chosen]}{unit}"


def torchao_si(value, unit: str, precision: int = 2) -> str:
    """torchao's compact form, kept for its getters: '128.00FLOPs', '1.23kB' (no space,
    lower-case k, the fraction digits always shown)."""
    value, prefix = float(value), ""
    for p in ("k", "M", "G", "T", "P"):
        if abs(value) < 1000:
            break
        value, prefix = value / 1000, p
    return f"{value:.{precision}f}{prefix}{unit}"


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


def format_table(rows, header=None, *, align: str | None = None, widths=None, indent: int = 0,
                 sep: str = "  ", rule: bool = False, markdown: bool = False) -> str:
    """Rows of cells as a fixed-width text table, or as a markdown table (markdown=True).

    align: a letter per column, "l" or "r" (default: the first column left, the others
    right, as numbers are); widths: the least width of each column; rule: a dashed line
    under the header. Lines carry no trailing blanks."""
    head = None if header is None else [str(c) for c in header]
    body = [[str(c) for c in row] for row in rows]
    if markdown:
        lines = [] if head is None else ["| " + " | ".join(head) + " |",
                                         "|" + "|".join("---" for _ in head) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    table = ([] if head is None else [head]) + body
    if not table:
        return ""
    ncols = max(len(row) for row in table)
    align = align or "l" + "r" * (ncols - 1)
    width = [max([len(row[i]) for row in table if i < len(row)] + [widths[i] if widths else 0])
             for i in range(ncols)]
    pad = " " * indent

    def line(cells: list[str]) -> str:
        return (pad + sep.join(c.rjust(width[i]) if align[i] == "r" else c.ljust(width[i])
                               for i, c in enumerate(cells))).rstrip()

    lines = [line(row) for row in table]
    if rule and head is not None:
        lines.insert(1, pad + sep.join("-" * w for w in width))
    return "\n".join(lines)


def ratio(measured, predicted) -> str:
    """'1.05x': measured ÷ predicted (or ÷ a bound), 'n/a' when either is missing."""
    return NA if measured is None or not predicted else f"{measured / predicted:.2f}x"
