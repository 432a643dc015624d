"""A simulation's results as plain data, and their text rendering.

`Simulation` holds one `PhaseResult` per phase: its time and energy, per device
a `DeviceResult` (compute, memory and transfer time, bytes over each link,
energy by component), and with detail the per-module results, per-op
("function") results and the time-ordered log. `to_dict` / `to_json` give the
plain data (`to_json` writes atomically); `report(...)` renders the views
UPMEM's profiler prints (--report_layers, --report_functions, --print_log,
--print_log_summary) with format.py's number and table helpers.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from perfcounter._util import atomic_write
from perfcounter.simulation.render import render

COMPONENTS = ("compute", "memory", "host_link", "device_link", "static")
SCHEMA = "perfcounter.simulation.run"
SCHEMA_VERSION = 1


def _components() -> dict[str, float]:
    return dict.fromkeys(COMPONENTS, 0.0)


@dataclass(slots=True)
class DeviceResult:
    """One device's share of a phase. Times in s (busy: its ops; transfer: links it took
    part in), bytes moved over each link, energy in J by component."""

    device: str  # "host", "pim-ai-4chip", "pim-ai-1dimm,tp=4"
    spec: str  # the registry entry
    device_type: str
    tp: int = 1
    peak_fraction: float = 1.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    busy_s: float = 0.0  # Σ over its ops of max(compute, memory)
    transfer_s: float = 0.0
    flops: float = 0.0  # executed FLOPs
    bytes: float = 0.0  # memory traffic of its ops
    host_to_device_bytes: float = 0.0
    device_to_host_bytes: float = 0.0
    device_link_bytes: float = 0.0  # received over a device<->device link
    allreduce_bytes: float = 0.0  # sent per device by its tensor-parallel all-reduces
    energy_by_component_j: dict = field(default_factory=_components)
    predicted_busy_s: float | None = None  # its ops predicted (simulate's execution)

    @property
    def time_s(self) -> float:
        return self.busy_s + self.transfer_s

    @property
    def energy_j(self) -> float:
        return sum(self.energy_by_component_j.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "time_s": self.time_s, "energy_j": self.energy_j}


@dataclass(slots=True)
class ModuleResult:
    """A module's own ops (not its children's) and the transfers into it, in one phase."""

    path: str
    cls: str
    devices: list  # device keys its ops and transfers used, in order
    calls: int = 0
    params: int = 0
    input_shapes: str = ""
    time_s: float = 0.0  # Σ over its ops of max(compute, memory)
    compute_s: float = 0.0
    memory_s: float = 0.0
    transfer_s: float = 0.0
    transfer_bytes: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    energy_j: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class FunctionResult:
    """One aten op (all overloads) on one device in one phase."""

    device: str
    op: str  # "aten.mm"
    calls: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    time_s: float = 0.0
    energy_j: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class LogRow:
    """One event of the time-ordered log: a module's ops (one segment) or a transfer."""

    module: str
    device: str
    start_s: float
    duration_s: float
    bytes: float
    flops: float
    energy_j: float
    transfer: str = ""  # "" for ops; the route ("pim-ai-4chip->host->upmem-h100") or "all-reduce"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PhaseResult:
    label: str
    num_tokens: int
    steps: int
    time_s: float
    devices: dict  # key -> DeviceResult
    modules: list = field(default_factory=list)  # ModuleResult, in first-run order (detail)
    functions: list = field(default_factory=list)  # FunctionResult (detail)
    log: list = field(default_factory=list)  # LogRow in time order (detail)
    predicted_s: float | None = None  # the phase predicted (simulate's execution), time_s a bound
    # the placement: per trace record, the device key it ran on (a view: where the step paying
    # its calls ran; None: a metadata record or one no step ran)
    record_devices: tuple = ()

    @property
    def predicted_tokens_per_s(self) -> float | None:
        return self.num_tokens / self.predicted_s if self.num_tokens and self.predicted_s else None

    @property
    def energy_by_component_j(self) -> dict[str, float]:
        out = _components()
        for d in self.devices.values():
            for k, v in d.energy_by_component_j.items():
                out[k] += v
        return out

    @property
    def energy_j(self) -> float:
        return sum(self.energy_by_component_j.values())

    @property
    def tokens_per_s(self) -> float | None:
        return self.num_tokens / self.time_s if self.num_tokens and self.time_s else None

    @property
    def j_per_token(self) -> float | None:
        return self.energy_j / self.num_tokens if self.num_tokens else None

    def to_dict(self) -> dict:
        return {"label": self.label, "num_tokens": self.num_tokens, "steps": self.steps,
                "time_s": self.time_s, "predicted_s": self.predicted_s,
                "energy_j": self.energy_j, "energy_by_component_j": self.energy_by_component_j,
                "tokens_per_s": self.tokens_per_s,
                "predicted_tokens_per_s": self.predicted_tokens_per_s,
                "j_per_token": self.j_per_token,
                "devices": {k: d.to_dict() for k, d in self.devices.items()},
                "modules": [m.to_dict() for m in self.modules],
                "functions": [f.to_dict() for f in self.functions],
                "log": [r.to_dict() for r in self.log]}


@dataclass
class Simulation:
    """Every phase of a counted inference, priced under one placement."""

    phases: dict  # label -> PhaseResult
    mapping: dict  # key -> "device[,options]", as given
    host: str  # the host's registry entry
    options: dict  # elementwise_model, overlap, default_device, links, peak fractions
    devices: dict  # key -> the spec figures used (name, type, bandwidth, FLOP/s, links)
    notes: list = field(default_factory=list)  # what was assumed or left out

    @property
    def time_s(self) -> float:
        return sum(p.time_s for p in self.phases.values())

    @property
    def energy_j(self) -> float:
        return sum(p.energy_j for p in self.phases.values())

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, "mapping": dict(self.mapping),
                "host": self.host, "options": dict(self.options), "devices": dict(self.devices),
                "notes": list(self.notes), "time_s": self.time_s, "energy_j": self.energy_j,
                "phases": {k: p.to_dict() for k, p in self.phases.items()}}

    def to_json(self, path=None) -> dict:
        """The plain data; written to `path` atomically when given."""
        doc = self.to_dict()
        if path is not None:
            atomic_write(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return doc

    def report(self, *, layers: bool = False, functions: bool = False, log: bool = False,
               log_summary: bool = False) -> str:
        """The summary per phase, plus the views asked for (UPMEM's flags)."""
        return render(self, layers=layers, functions=functions, log=log, log_summary=log_summary)

    def __str__(self) -> str:
        return self.report()
