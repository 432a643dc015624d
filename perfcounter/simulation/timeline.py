"""What a simulation reads from a trace: the time order of one forward, module kinds,
and each record's roofline on a device (cached, so that a new mapping re-prices fast).

`timeline(trace)` replays one forward of a phase as ENTER / RUN / EXIT steps:
expand(M) = ENTER M, M's own ops before its first child (segment 0), then for
the k-th child c: expand(c), M's ops of segment k; EXIT M. It needs
`ModuleInfo.children` and `OpRecord.segment`; a trace without them (written by
an older perfcounter) falls back to the order in which records first ran,
entering and leaving modules as the innermost module path changes. Records are
aggregated over calls, so a step carries `share` (the part of its records'
calls it stands for, 1 / occurrences of the module in one forward) and `count`
(how many times the event happens in the phase: a transfer is per call).
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import NamedTuple

from perfcounter.counting.module_kinds import ATTENTION, MLP, own_kind
from perfcounter.pricing.energy import record_energies
from perfcounter.pricing.per_record import record_predictions
from perfcounter.pricing.roofline import op_costs
from perfcounter.trace import ROLES

UPMEM_NS_PER_ELEMENT = {"softmax_ns_per_element": 0.4, "silu_ns_per_element": 0.6,
                        "rmsnorm_ns_per_element": 1.1}  # UPMEM's BaseArchitecture defaults


class Ev(enum.IntEnum):
    ENTER = 0  # a module's call begins: its input may have to move
    RUN = 1  # a module's own ops (one segment)
    EXIT = 2  # a module's call ends: a tensor-parallel block all-reduces


@dataclass(slots=True)
class Step:
    kind: Ev
    module: str
    records: tuple = ()  # RUN: indices into trace.records
    share: float = 1.0  # RUN: the part of those records' calls this step stands for
    count: float = 0.0  # calls of this event in the phase (transfers are per call)
    after: str = ""  # RUN after a child call: that child


def timeline(trace) -> list[Step]:
    """One forward of a phase in time order, as ENTER / RUN / EXIT steps."""
    infos = {m.path: m for m in trace.modules}
    live = [i for i, r in enumerate(trace.records) if r.bytes or r.executed_flops]
    if any(getattr(m, "children", None) for m in trace.modules):
        return _by_segments(trace, infos, live)
    return _by_first_run(trace, infos, live)


def _calls(infos, path: str) -> float:
    info = infos.get(path)
    return float(info.calls) if info is not None else 1.0


def _by_segments(trace, infos, live) -> list[Step]:
    scopes: dict[tuple[str, int], list[int]] = {}
    for i in live:
        r = trace.records[i]
        scopes.setdefault((r.module, getattr(r, "segment", 0)), []).append(i)
    roots = [p for p in infos if not any(a in infos for a in _ancestors(p))]
    occ: dict[str, int] = {}

    def count(path):
        occ[path] = occ.get(path, 0) + 1
        for c in infos[path].children:
            if c in infos:
                count(c)
    for root in roots:
        count(root)
    steps: list[Step] = []
    placed: set[tuple[str, int]] = set()

    def run(path, seg, after=""):
        idx = scopes.get((path, seg))
        if idx:
            placed.add((path, seg))
            steps.append(Step(Ev.RUN, path, tuple(idx), 1.0 / occ.get(path, 1),
                              _calls(infos, after or path) / occ.get(after or path, 1), after))

    def expand(path):
        n = _calls(infos, path) / occ[path]
        steps.append(Step(Ev.ENTER, path, count=n))
        run(path, 0)
        for k, child in enumerate(infos[path].children, 1):
            if child in infos:
                expand(child)
            run(path, k, child)
        steps.append(Step(Ev.EXIT, path, count=n))

    occ[""] = 1
    run("", 0)
    for k, root in enumerate(roots, 1):
        expand(root)
        run("", k, root)
    orphans = [i for key, idx in scopes.items() if key not in placed for i in idx]
    return _place_orphans(steps, orphans, trace, infos)


def _place_orphans(steps, orphans, trace, infos) -> list[Step]:
    """Records whose segment was not reached (a module first called in a later step):
    priced with their module's first run, or at the end."""
    for i in orphans:
        module = trace.records[i].module
        home = next((s for s in steps if s.kind == Ev.RUN and s.module == module), None)
        if home is None:
            n = _calls(infos, module)
            home = Step(Ev.RUN, module, (), 1.0, n)
            steps += [Step(Ev.ENTER, module, count=n), home, Step(Ev.EXIT, module, count=n)]
        home.records = home.records + (i,)
    return steps


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _by_first_run(trace, infos, live) -> list[Step]:
    """Without children lists: records in the order they first ran, entering and leaving
    modules as the innermost module path changes."""
    steps: list[Step] = []
    prev: list[str] = []
    enters: dict[str, int] = {}
    for i in live:
        module = trace.records[i].module
        chain = [a for a in _ancestors(module) if a in infos] + ([module] if module else [])
        last = steps[-1] if steps else None
        if chain == prev and last is not None and last.kind == Ev.RUN:
            last.records += (i,)
            continue
        common = 0
        while common < min(len(chain), len(prev)) and chain[common] == prev[common]:
            common += 1
        steps += [Step(Ev.EXIT, p) for p in reversed(prev[common:])]
        after = prev[common] if len(prev) > common and len(chain) == common else ""
        for p in chain[common:]:
            enters[p] = enters.get(p, 0) + 1
            steps.append(Step(Ev.ENTER, p))
        steps.append(Step(Ev.RUN, module, (i,), 1.0, 0.0, after))
        prev = chain
    steps += [Step(Ev.EXIT, p) for p in reversed(prev)]
    for s in steps:  # a module entered twice moves its input on each entry: calls / entries
        path = s.after or s.module
        s.count = _calls(infos, path) / max(enters.get(path, 1), 1)
    return steps


# -- tensor-parallel blocks (counting/module_kinds.py) -----------------------------------
def blocks(infos) -> set[str]:
    """The outermost attention and MLP modules: where a tensor-parallel block all-reduces."""
    out = set()
    for path, m in infos.items():
        kind = own_kind(path, m.cls)
        if kind in (ATTENTION, MLP) and not any(
                a in infos and own_kind(a, infos[a].cls) == kind for a in _ancestors(path)):
            out.add(path)
    return out


# -- a trace prepared once, and its cost on each device ------------------------------------
class StepCost(NamedTuple):
    """One RUN step on one device, at peak and without tensor parallelism."""

    latency_s: float  # Σ over its records of max(compute, memory)
    compute_s: float
    memory_s: float
    compute_j: float
    memory_j: float
    flops: float  # executed
    bytes: float


class Prepared:
    """What every mapping of one trace shares: the time order, the modules, the
    tensor-parallel blocks, the bytes the phase returns, and per device the cost of each
    record and of each RUN step (filled on first use)."""

    def __init__(self, trace):
        self.trace = trace
        self.steps = timeline(trace)
        self.infos = {m.path: m for m in trace.modules}
        self.blocks = blocks(self.infos)
        runs = [i for s in self.steps if s.kind == Ev.RUN for i in s.records]
        last = next((i for i in reversed(runs) if sum(trace.records[i].written)), None)
        self.output_bytes = sum(trace.records[last].written) if last is not None else 0
        # the phase's input (token ids, positions: role "input", each storage once) is what
        # moves when the model, or the ops before it, start on a device
        self.root = trace.modules[0].path if trace.modules else None
        self.input_bytes = trace.compulsory_read[ROLES.index("input")]
        self.riders = _riders(trace, self.steps)
        self.records: dict[tuple, list] = {}  # (spec, elementwise, execution) -> per record
        self.runs: dict[tuple, list] = {}  # the same key -> per step (None: not a RUN)

    def record_costs(self, spec, elementwise: str, execution: str | None = None
                     ) -> list[StepCost]:
        """Each record's roofline on `spec`; with an execution, its predicted seconds in that
        regime instead (per_record.py, less the launches a step pays once, which a placement
        charges per device; the energy stays the same FLOPs and bytes)."""
        key = (spec, elementwise, execution)
        if key not in self.records:
            if execution is None:
                self.records[key] = _price(self.trace, spec, elementwise)
            else:
                times = record_predictions(self.trace, spec, execution, per_step=False)
                self.records[key] = [c._replace(latency_s=t.latency_s) for c, t in
                                     zip(self.record_costs(spec, elementwise), times)]
        return self.records[key]

    def step_costs(self, spec, elementwise: str, execution: str | None = None
                   ) -> list[StepCost | None]:
        key = (spec, elementwise, execution)
        if key not in self.runs:
            per = self.record_costs(spec, elementwise, execution)
            out = []
            for j, s in enumerate(self.steps):
                if s.kind != Ev.RUN:
                    out.append(None)
                    continue
                riders = self.riders.get(j, ()) if execution is not None else ()
                sums = [sum(col) * s.share for col in zip(*(per[i] for i in s.records + riders))]
                out.append(StepCost(*sums) if sums else StepCost(0, 0, 0, 0, 0, 0, 0))
            self.runs[key] = out
        return self.runs[key]


def _riders(trace, steps) -> dict[int, tuple]:
    """Records the timeline leaves out (views, metadata: no byte, no FLOP) by the RUN steps
    that carry them when a prediction pays their op calls: their own module and segment's
    steps, else their module's first segment's, else the nearest enclosing module's, else
    the first RUN step. Steps that repeat one scope (a module called several times, each
    standing for its share) all carry them; otherwise the first does."""
    scopes: dict[tuple[str, int], list[int]] = {}
    for j, s in enumerate(steps):
        if s.kind == Ev.RUN and s.records:
            scopes.setdefault((s.module, trace.records[s.records[0]].segment), []).append(j)
    placed = {i for s in steps if s.kind == Ev.RUN for i in s.records}
    first = next(iter(scopes.values()), None)
    out: dict[int, tuple] = {}
    for i, r in enumerate(trace.records):
        if i in placed or r.op.startswith("prim.") or first is None:
            continue
        target, module = scopes.get((r.module, r.segment)), r.module
        while target is None:
            own = sorted(seg for m, seg in scopes if m == module)
            if own:
                target = scopes[(module, own[0])]
            elif not module:
                target = first
            else:
                module = module.rsplit(".", 1)[0] if "." in module else ""
        same = [j for j in target if steps[j].records == steps[target[0]].records]
        for j in same:
            out[j] = out.get(j, ()) + (i,)
    return out


class _PrepKey(NamedTuple):
    trace_id: int


class PreparedCache:
    """Prepared traces by identity, least recently used dropped first: a search, or a
    second simulate() of the same counter, re-prices without redoing the work."""

    def __init__(self, maxsize: int = 16):
        self._data: OrderedDict[_PrepKey, Prepared] = OrderedDict()
        self.maxsize, self.hits, self.misses = maxsize, 0, 0

    def get(self, trace) -> Prepared:
        key = _PrepKey(id(trace))
        hit = self._data.get(key)
        if hit is not None and hit.trace is trace:  # the same object, not a reused id
            self.hits += 1
            self._data.move_to_end(key)
            return hit
        self.misses += 1
        hit = self._data[key] = Prepared(trace)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return hit

    def cache_info(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._data),
                "maxsize": self.maxsize}

    def cache_clear(self) -> None:
        self._data.clear()
        self.hits = self.misses = 0


PREPARED = PreparedCache()


def is_upmem_profile(spec) -> bool:
    """A spec marked as one of the UPMEM framework's profiles (DeviceSpec.profile "upmem":
    `profile: upmem` in our YAML, or any entry of a file in UPMEM's own format)."""
    return spec.profile == "upmem"


def elementwise_spec(spec, model: str):
    """The spec as op_costs should see it: no per-element costs under "roofline"; under
    "upmem", UPMEM's defaults filled in for UPMEM profiles that give none."""
    if model == "roofline":
        fields = {f: None for f in UPMEM_NS_PER_ELEMENT if getattr(spec, f, None) is not None}
    else:
        fields = {f: v for f, v in UPMEM_NS_PER_ELEMENT.items()
                  if getattr(spec, f, None) is None and is_upmem_profile(spec)}
    return replace(spec, **fields) if fields else spec


def _price(trace, spec, elementwise: str) -> list[StepCost]:
    """Each record's roofline (roofline.op_costs) and energy (energy.py's pJ/FLOP by dtype,
    memory pJ/bit) on a device; an energy figure the spec lacks counts 0 J."""
    costs = op_costs(trace, elementwise_spec(spec, elementwise))
    return [StepCost(c.latency_s, c.compute_s, c.memory_s, e.compute_j or 0.0,
                     e.memory_j or 0.0, r.executed_flops, r.bytes)
            for r, c, e in zip(trace.records, costs, record_energies(trace.records, spec))]
