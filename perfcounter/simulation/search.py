"""Search: the placement of a model's module kinds over a few devices that costs least.

    best = search_mapping(counter, ["Snapdragon8gen3", "PIM-AI-4chip"], "energy",
                          max_latency_ms=50)
    print(best.mapping_text()); print(best.simulation.report())

The kinds are those a hardware architect places (counting/module_kinds.own_kind): the
attention projections (the Linear children of an attention module: q/k/v/o, wqkv/wo,
keyed by leaf name), the attention module's own ops (RoPE, cache update, SDPA: keyed by
class), the MLP (by class, its projections and activation with it), the norms (by class)
and the output head (lm_head / output: by leaf name). Everything else (embedding, residual adds)
runs where the previous module ran, as in UPMEM. Every assignment of kinds to
devices is priced when there are at most MAX_EXHAUSTIVE of them, else a
coordinate descent (one kind at a time, until nothing improves) looks for one.
Each candidate is a re-pricing of the counted trace (simulate(detail=False)).
The objective is the energy or the time of all phases; `max_latency_ms` bounds
the decode time per generated token (per token of all phases when there is no
decode phase).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from perfcounter.counting.module_kinds import ATTENTION, MLP, OTHER, own_kind
from perfcounter.simulation.placement import MappingError, resolve_device
from perfcounter.simulation.run import modules_of, phases_of, simulate

KINDS = {"attention_proj": "attention projections", "attention": "attention", "mlp": "MLP",
         "norm": "norms", "lm_head": "lm_head"}
OBJECTIVES = ("energy", "latency")
MAX_EXHAUSTIVE = 1024


def kind_keys(modules) -> dict[str, list[str]]:
    """kind -> the mapping keys that place it (leaf names or class names), first-run order."""
    infos = {m.path: m for m in modules}
    out: dict[str, list[str]] = {k: [] for k in KINDS}
    for path, m in infos.items():
        kind = own_kind(path, m.cls)
        parent = infos.get(path.rsplit(".", 1)[0]) if "." in path else None
        if (kind == OTHER and m.cls == "Linear" and parent is not None
                and own_kind(parent.path, parent.cls) == ATTENTION):
            kind = "attention_proj"  # a projection of an attention module
        if kind not in KINDS:
            continue  # embedding, other: runs where the previous module ran
        if kind == MLP and any(own_kind(a, infos[a].cls) == MLP
                               for a in _ancestors(path) if a in infos):
            continue  # an MLP inside an MLP (experts) goes with the outer one
        key = path.rsplit(".", 1)[-1] if kind in ("attention_proj", "lm_head") else m.cls
        if key not in out[kind]:
            out[kind].append(key)
    return {k: v for k, v in out.items() if v}


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def per_token_s(sim) -> float:
    """Decode seconds per generated token, or all phases' seconds per token."""
    decode = sim.phases.get("decode")
    if decode is not None and decode.num_tokens:
        return decode.time_s / decode.num_tokens
    tokens = sum(p.num_tokens for p in sim.phases.values())
    return sim.time_s / tokens if tokens else sim.time_s


@dataclass
class SearchResult:
    objective: str
    mapping: dict  # key -> device
    simulation: object  # the Simulation of the best mapping, with detail
    groups: dict  # kind -> keys
    choice: dict  # kind -> device
    tried: int
    feasible: bool  # the best mapping meets max_latency_ms (True when there is no bound)
    max_latency_ms: float | None

    def mapping_text(self) -> str:
        """The best mapping as a YAML mapping file, its figures in comments."""
        sim = self.simulation
        lines = [f"# perfcounter simulate --search {self.objective}: best of {self.tried} "
                 "mappings" + ("" if self.feasible else
                               f" (none meets --max_latency_ms {self.max_latency_ms:g})"),
                 f"# {per_token_s(sim) * 1e3:.3f} ms per token, {sim.time_s:.6g} s and "
                 f"{sim.energy_j:.6g} J for all phases"]
        for kind, keys in self.groups.items():
            lines += [f"{key}: {self.choice[kind]}  # {KINDS[kind]}" for key in keys]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        return {"objective": self.objective, "mapping": dict(self.mapping),
                "choice": dict(self.choice), "tried": self.tried, "feasible": self.feasible,
                "max_latency_ms": self.max_latency_ms,
                "per_token_s": per_token_s(self.simulation)}


def search_mapping(source, candidates: list[str], objective: str = "energy", *,
                   max_latency_ms: float | None = None, **simulate_kwargs) -> SearchResult:
    """The mapping of module kinds to the `candidates` devices that minimizes `objective`
    under the bound; simulate_kwargs go to every simulate() (host, devices, links, ...)."""

    if objective not in OBJECTIVES:
        raise MappingError(f"unknown search objective {objective!r}; "
                           f"valid: {', '.join(OBJECTIVES)}")
    devices = [d.strip() for d in candidates if d.strip()]
    if not devices:
        raise MappingError("--search needs --devices: a comma-separated list of device names")
    for name in devices:  # an unknown name fails here, once, naming --devices
        resolve_device(name, None, where="--devices", extra=simulate_kwargs.get("devices"))
    if max_latency_ms is not None and not max_latency_ms > 0:
        raise MappingError(f"max_latency_ms must be > 0, got {max_latency_ms!r}")
    groups = kind_keys(modules_of(phases_of(source, simulate_kwargs.get("labels"))))
    if not groups:
        raise MappingError("the model has no module of a kind the search places "
                           f"({', '.join(KINDS.values())})")
    kinds = list(groups)
    seen: dict[tuple, tuple] = {}

    def score(combo: tuple) -> tuple:
        if combo not in seen:
            mapping = {k: dev for kind, dev in zip(kinds, combo) for k in groups[kind]}
            sim = simulate(source, mapping, detail=False,  # ranked by the bound
                           **{**simulate_kwargs, "execution": None})
            late = max_latency_ms is not None and per_token_s(sim) * 1e3 > max_latency_ms
            value = sim.energy_j if objective == "energy" else sim.time_s
            other = sim.time_s if objective == "energy" else sim.energy_j
            # infeasible candidates rank after feasible ones, the least late first
            seen[combo] = (late, per_token_s(sim) if late else value, other)
        return seen[combo]

    if len(devices) ** len(kinds) <= MAX_EXHAUSTIVE:
        best = min(itertools.product(devices, repeat=len(kinds)), key=score)
    else:
        best = (devices[0],) * len(kinds)
        improved = True
        while improved:
            improved = False
            for i in range(len(kinds)):
                trial = min((best[:i] + (d,) + best[i + 1:] for d in devices), key=score)
                if score(trial) < score(best):
                    best, improved = trial, True
    mapping = {k: dev for kind, dev in zip(kinds, best) for k in groups[kind]}
    sim = simulate(source, mapping, **simulate_kwargs)
    return SearchResult(objective, mapping, sim, groups, dict(zip(kinds, best)), len(seen),
                        not score(best)[0], max_latency_ms)
