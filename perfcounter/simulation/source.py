"""What a pricing entry point was given: the one reader of a source for `simulate`, the
plots and the Perfetto traces.

    src = read_source(counter, "simulate()", ("counter", "stats", "dict", "trace"))
    src.kind        # "phases", "simulation" or "recording"
    src.phases      # {label: Phase(trace, num_tokens, stats)} for a counted source
    src.stats()     # {label: PerformanceStats}

Each caller names what it accepts; a source of another kind is refused in one line that
names the caller, what it was given and what it accepts. The counter and the stats sit
above this layer, so they are recognised by the attributes they are read for (NB: a
TransformerPerformanceCounter has `counts` and `count`, PerformanceStats `trace`,
`label` and `num_tokens`, a Trace `records` and `modules`, a Simulation `phases` and
`mapping`, a graph.Recording `events` and `real`).
"""
from __future__ import annotations

from typing import NamedTuple

PHASES, SIMULATION, RECORDING = "phases", "simulation", "recording"
ACCEPTED = {"counter": "a TransformerPerformanceCounter", "stats": "PerformanceStats",
            "trace": "a Trace", "dict": "a dict of them", "simulation": "a Simulation",
            "recording": "a graph.Recording"}


class Phase(NamedTuple):
    """One counted phase as a source gives it."""

    trace: object | None  # its Trace (None: totals read from a torchao file)
    num_tokens: int
    stats: object | None  # the PerformanceStats it came from; None for a bare Trace


class Source(NamedTuple):
    kind: str  # PHASES, SIMULATION or RECORDING
    phases: dict[str, Phase]  # {} unless kind is PHASES
    value: object  # the source as given

    def stats(self) -> dict:
        """{label: PerformanceStats} of a counted source."""
        return {k: p.stats for k, p in self.phases.items()}


def _is_counter(x) -> bool:
    return hasattr(x, "counts") and hasattr(x, "count")


def _is_stats(x) -> bool:
    return hasattr(x, "trace") and hasattr(x, "label") and hasattr(x, "num_tokens")


def _is_trace(x) -> bool:
    return hasattr(x, "records") and hasattr(x, "modules")


def _refuse(who: str, given, accepts) -> TypeError:
    return TypeError(f"{who} takes {', '.join(ACCEPTED[a] for a in accepts)}; "
                     f"got {type(given).__name__}")


def read_source(source, who: str, accepts=("counter", "stats", "dict")) -> Source:
    """`source` as a Source (see the module doc), or a one-line TypeError."""
    unknown = [a for a in accepts if a not in ACCEPTED]
    assert not unknown, unknown

    def phase(x, label) -> Phase:
        if _is_stats(x) and "stats" in accepts:
            return Phase(x.trace, x.num_tokens, x)
        if _is_trace(x) and "trace" in accepts:
            return Phase(x, 0, None)
        kinds = " or ".join(ACCEPTED[a] for a in ("stats", "trace") if a in accepts)
        raise TypeError(f"{who}: phase {label!r} is a {type(x).__name__}; expected {kinds}")

    if hasattr(source, "phases") and hasattr(source, "mapping") and "simulation" in accepts:
        return Source(SIMULATION, {}, source)
    if hasattr(source, "events") and hasattr(source, "real") and "recording" in accepts:
        return Source(RECORDING, {}, source)
    if _is_counter(source) and "counter" in accepts:
        phases = {k: phase(v, k) for k, v in source.counts.items()}
    elif isinstance(source, dict) and "dict" in accepts:
        phases = {k: phase(v, k) for k, v in source.items()}
    elif _is_stats(source) and "stats" in accepts:
        phases = {source.label: phase(source, source.label)}
    elif _is_trace(source) and "trace" in accepts:
        phases = {"phase": phase(source, "phase")}
    else:
        raise _refuse(who, source, accepts)
    return Source(PHASES, phases, source)
