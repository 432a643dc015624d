"""Graphs of one recorded forward, EdgeShard style (seed 003): modules and the tensors
that flow between them, and the aten ops with every edge between them.

    rec = record_forward(model, x)                  # ONE forward, counted and its data flow kept
    g = module_graph(rec, spec)                     # or op_graph(rec, spec)
    print(g.to_text()); g.to_json("g.json"); atomic_write("g.dot", g.to_dot())

Recording. `record_forward` runs the model once under a `PerformanceCounterMode`
whose dispatch mode also keeps a data-flow log (`_FlowMode`, a subclass of the
counting mode that mode.py's `PerformanceCounterMode._mode_cls` selects: the
counter's own hot path is untouched, and nothing is kept when it is not used).
Per counted aten op call (views, composites and `torch.tensor` constants are not
calls of their own) it notes the op's module scope, its cost as a one-call
`OpRecord`, the measured seconds of the call when tensors are real, and where each
input tensor came from: the last op that wrote its storage in this forward (a view
shares its base's storage, so data flows through views), the forward's input (a
storage no op wrote and whose role is "input": token ids, positions, a mask made
outside), or state (weights, buffers, a KV cache filled earlier: no edge). A
storage address a freed tensor gave back is resolved at the time of the call, so
reuse cannot join two tensors.

Module graph. A node per leaf module (a listed module with no listed children:
q_proj, input_layernorm, rotary_emb), per stretch of a parent's own code between
two child calls (`model.layers.0[2]`: the residual add after self_attn, the
Python-level ops a module runs itself; see trace.py's `segment`), and `input`.
A module whose ops all are views (eval dropout) has no node: data passes through.
An edge joins two nodes when an op of one reads a tensor an op of the other
wrote: `tensors` counts the distinct tensors, `bytes` their sizes.
Op graph: a node per op call, an edge per producer -> consumer pair.

Time: `predicted_s` is each op's predicted seconds on `spec`, run eagerly
(predict.op_predictions: per-call overhead + achievable rates; prim.* metadata ops
0 s), `roofline_s` its roofline bound (roofline.op_costs), both summed per node;
`measured_s` the wall time of its call (real tensors only; includes no
bookkeeping of the counter; a model's first call pays one-time warm-up, so run it
once before recording for steady figures), None under FakeTensorMode.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace

import torch
from torch.utils._pytree import tree_leaves

from perfcounter._util import atomic_write
from perfcounter.counting.mode import CountingMode, PerformanceCounterMode
from perfcounter.counting.op_plan import HANDLING, OpKind, classify
from perfcounter.counting.storage import INPUT, storage_id
from perfcounter.format import format_table, si
from perfcounter.report.trace_events import OpTime, op_times
from perfcounter.trace import ModuleInfo, OpRecord, Trace

INPUT_NODE = "input"
_Fake = torch._subclasses.FakeTensor
_NOT_CALLS = (OpKind.VIEW, OpKind.DECOMPOSE, OpKind.FRESH)


@dataclass(slots=True)
class FlowEvent:
    """One counted op call and where its inputs came from."""

    index: int
    record: OpRecord  # this call alone (calls == 1)
    sources: list  # (producer event index or -1 for the forward's input, storage id, bytes)
    measured_s: float | None


class _FlowMode(CountingMode):
    """The counting mode, plus a data-flow log (see the module doc)."""

    def __init__(self, depth: int):
        super().__init__(depth)
        self.events: list[FlowEvent] = []
        self.linears = None  # every linear decomposed: its matmul is a call of the flow
        self._writer: dict[int, int] = {}  # storage id -> index of the last op writing it
        self.real = True

    def reset(self) -> None:
        super().reset()
        self.events, self._writer, self.real = [], {}, True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = (HANDLING.get(id(func)) or classify(func)).kind
        if kind in _NOT_CALLS:
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if kind is OpKind.FRESH:  # a new storage: no writer, whatever wrote a freed
                for t in tree_leaves(out):  # storage at the same address
                    if isinstance(t, torch.Tensor):
                        self._writer.pop(storage_id(t), None)
            return out
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sync = any(t.is_cuda and not isinstance(t, _Fake) for t in inputs)
        if sync:
            torch.cuda.synchronize()
        n_log, overhead, t0 = len(self.log), self.overhead, time.perf_counter()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if sync:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0 - (self.overhead - overhead)
        fake = any(isinstance(t, _Fake) for t in inputs + tree_leaves(out))
        self.real = self.real and not fake
        if len(self.log) > n_log:
            self._note(self.log[n_log], inputs, out, None if fake else max(seconds, 0.0))
        return out

    def stored_call(self, entry: tuple, tensors: list, out, seconds: float) -> None:
        """A layer with a stored-smaller weight, counted whole (subclass_linear): one op
        call of the flow, timed from its module's call to its return."""
        fake = any(isinstance(t, _Fake) for t in [*tensors, out])
        self.real = self.real and not fake
        self._note(entry, tensors, out, None if fake else max(seconds, 0.0))

    def _note(self, entry, inputs, out, seconds) -> None:
        (module, segment), plan, roles = entry
        read, written = plan.contribution(roles)
        rec = OpRecord(plan.name, module, plan.dtype, plan.args, 1, plan.flops,
                       plan.executed_flops, list(plan.cost.kinds), list(read), list(written),
                       plan.has_formula, segment)
        index, sources, seen = len(self.events), [], set()
        for t in inputs:
            sid = storage_id(t)
            if sid in seen:
                continue
            seen.add(sid)
            src = self._writer.get(sid)
            if src is None:
                st = self.storages.by_id.get(sid)
                if st is None or st.role != INPUT:
                    continue  # state: weights, buffers, a KV cache filled before
                src = -1
            sources.append((src, sid, t.numel() * t.element_size()))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._writer[storage_id(t)] = index
        self.events.append(FlowEvent(index, rec, sources, seconds))


class _FlowCounter(PerformanceCounterMode):
    _mode_cls = _FlowMode


@dataclass
class Recording:
    """One forward: its trace (the counter's records), its modules and its op calls."""

    trace: Trace
    events: list[FlowEvent]
    modules: list[ModuleInfo]
    real: bool  # tensors had values: measured times are known


def record_forward(model, *args, depth: int = 10, **kwargs) -> Recording:
    """Run `model(*args, **kwargs)` once, counted, keeping its data flow (see the module doc)."""
    mode = _FlowCounter(depth=depth)
    with torch.no_grad(), mode:
        model(*args, **kwargs)
    trace = mode.trace()
    return Recording(trace, mode._mode.events, trace.modules, mode._mode.real)


# -- graphs ----------------------------------------------------------------------------------
@dataclass(slots=True)
class Node:
    id: str
    kind: str  # "module", "ops" (a parent's own code), "input", "op"
    module: str  # module path ("" outside any module)
    cls: str = ""
    params: int = 0
    calls: int = 0  # op calls
    flops: int = 0  # executed FLOPs
    bytes: int = 0  # per-op bytes read + written
    predicted_s: float | None = None  # predict.op_predictions (eager)
    roofline_s: float | None = None  # the roofline bound of the same ops
    measured_s: float | None = None


@dataclass(slots=True)
class Edge:
    src: str
    dst: str
    tensors: int = 0
    bytes: int = 0


@dataclass
class Graph:
    """Nodes in the order they first ran, edges in the order they were first used."""

    level: str  # "module" or "op"
    nodes: list[Node]
    edges: list[Edge]
    device: str | None = None
    notes: list[str] = field(default_factory=list)

    def stats(self) -> dict:
        """Node and edge counts and time aggregates (EdgeShard's summary)."""
        out = {"nodes": len(self.nodes), "edges": len(self.edges),
               "edge_bytes": sum(e.bytes for e in self.edges)}
        for key in ("predicted_s", "roofline_s", "measured_s"):
            values = [getattr(n, key) for n in self.nodes if getattr(n, key) is not None]
            top = max((n for n in self.nodes if getattr(n, key) is not None),
                      key=lambda n: getattr(n, key), default=None)
            out[key] = None if not values else {
                "total": sum(values), "mean": sum(values) / len(values), "max": max(values),
                "max_node": top.id}
        return out

    def to_dict(self) -> dict:
        return {"level": self.level, "device": self.device, "notes": list(self.notes),
                "stats": self.stats(), "nodes": [asdict(n) for n in self.nodes],
                "edges": [asdict(e) for e in self.edges]}

    def to_json(self, path=None) -> dict:
        doc = self.to_dict()
        if path is not None:
            atomic_write(path, json.dumps(doc, indent=2) + "\n")
        return doc

    def to_dot(self) -> str:
        """Graphviz DOT text; module nodes clustered by their parent module."""
        lines = [f"digraph {self.level}_graph {{", "  rankdir=TB;",
                 '  node [shape=box, fontname="monospace", fontsize=10];']
        groups: dict[str, list[Node]] = {}
        for n in self.nodes:
            groups.setdefault(_parent(n) if self.level == "module" else "", []).append(n)
        for k, (group, nodes) in enumerate(groups.items()):
            pad = "  "
            if group:
                lines += [f"  subgraph cluster_{k} {{", f"    label={_q(group)};"]
                pad = "    "
            for n in nodes:
                label = f"{_short(n)}\\n{si(n.flops, 'FLOP')}, {si(n.bytes, 'B')}"
                if n.predicted_s is not None:
                    label += f"\\n{si(n.predicted_s, 's')}"
                shape = ", shape=ellipse" if n.kind in ("ops", "input") else ""
                lines.append(f"{pad}{_q(n.id)} [label={_q(label)}{shape}];")
            if group:
                lines.append("  }")
        for e in self.edges:
            lines.append(f"  {_q(e.src)} -> {_q(e.dst)} [label={_q(si(e.bytes, 'B'))}];")
        return "\n".join(lines + ["}"]) + "\n"

    def to_text(self) -> str:
        """EdgeShard's text export: nodes, the full edge list, summary stats."""
        dev = f" (predicted on {self.device})" if self.device else ""
        op = self.level == "op"  # an op node's class is its aten op; its module beside it
        rows = [[i, n.id, n.module if op else n.kind, n.cls, n.params, n.calls,
                 si(n.flops, "FLOP"), si(n.bytes, "B"), si(n.predicted_s, "s"),
                 si(n.measured_s, "s")] for i, n in enumerate(self.nodes)]
        ids = {n.id: i for i, n in enumerate(self.nodes)}
        edges = [[ids[e.src], ids[e.dst], f"{e.src} -> {e.dst}", e.tensors, si(e.bytes, "B")]
                 for e in self.edges]
        s = self.stats()
        out = [f"# {self.level} graph{dev}", "", "## Nodes",
               format_table(rows, ["id", "name", "module" if op else "kind",
                                   "op" if op else "class", "params", "calls", "FLOPs", "bytes",
                                   "predicted", "measured"], align="rllllrrrrr"),
               "", "## Edges",
               format_table(edges, ["src", "dst", "edge", "tensors", "bytes"], align="rrlrr"),
               "", "## Stats", f"nodes: {s['nodes']}", f"edges: {s['edges']}",
               f"bytes over edges: {si(s['edge_bytes'], 'B')}"]
        for key, name in (("predicted_s", "predicted"), ("roofline_s", "roofline"),
                          ("measured_s", "measured")):
            t = s[key]
            out.append(f"{name} time: n/a" if t is None else
                       f"{name} time: total {si(t['total'], 's')}, mean {si(t['mean'], 's')}, "
                       f"max {si(t['max'], 's')} ({t['max_node']})")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def _q(text: str) -> str:
    """A DOT string (labels keep their \\n line breaks)."""
    return '"' + str(text).replace('"', '\\"') + '"'


def _parent(n: Node) -> str:
    if n.kind == "ops":
        return n.module
    return n.module.rsplit(".", 1)[0] if "." in n.module else ""


def _short(n: Node) -> str:
    if n.kind == "op":
        return f"{n.id} {n.cls}"
    return n.id.rsplit(".", 1)[-1] if n.kind == "module" else n.id.rsplit(".", 1)[-1] or n.id


def _times(rec: Recording, spec) -> list[OpTime | None]:
    """Each op call's predicted and roofline seconds on `spec` (None without one), priced
    with the forward's own whole-phase figures (its compulsory bytes: cold or warm)."""
    if spec is None:
        return [None] * len(rec.events)
    return op_times(replace(rec.trace, records=[e.record for e in rec.events]), spec)


def _add(node: Node, e: FlowEvent, op_time: OpTime | None) -> None:
    node.calls += 1
    node.flops += e.record.executed_flops
    node.bytes += e.record.bytes
    if op_time is not None:
        node.predicted_s = (node.predicted_s or 0.0) + op_time.predicted_s
        node.roofline_s = (node.roofline_s or 0.0) + op_time.roofline_s
    if e.measured_s is not None:
        node.measured_s = (node.measured_s or 0.0) + e.measured_s


def _notes(rec: Recording) -> list[str]:
    return [] if rec.real else ["fake tensors (no values): measured times are not known"]


def module_graph(rec: Recording, spec=None) -> Graph:
    """Leaf modules, the stretches of parents' own code, the input; tensors between them."""
    infos = {m.path: m for m in rec.modules}
    parents = {m.path for m in rec.modules if any(c in infos for c in m.children)}

    def node_id(r: OpRecord) -> str:
        if r.module and r.module not in parents:
            return r.module
        return f"{r.module or '<top>'}[{r.segment}]"

    nodes: dict[str, Node] = {}
    edges: dict[tuple[str, str], Edge] = {}
    seen: set[tuple] = set()
    ids = []
    for e, op_time in zip(rec.events, _times(rec, spec)):
        nid = node_id(e.record)
        ids.append(nid)
        node = nodes.get(nid)
        if node is None:
            for src, _, _ in e.sources:  # the input node first, when it feeds the first op
                if src < 0 and INPUT_NODE not in nodes:
                    nodes[INPUT_NODE] = Node(INPUT_NODE, "input", "")
            info = infos.get(e.record.module)
            grouped = nid.endswith("]")
            node = nodes[nid] = Node(nid, "ops" if grouped else "module", e.record.module,
                                     info.cls if info and not grouped else "",
                                     info.params if info and not grouped else 0)
        _add(node, e, op_time)
        for src, storage, nbytes in e.sources:
            sid = INPUT_NODE if src < 0 else ids[src]
            if sid == nid or (src, storage, nid) in seen:
                continue  # a tensor counts once per edge, however many ops read it
            seen.add((src, storage, nid))
            edge = edges.get((sid, nid)) or edges.setdefault((sid, nid), Edge(sid, nid))
            edge.tensors += 1
            edge.bytes += nbytes
    return Graph("module", list(nodes.values()), list(edges.values()),
                 getattr(spec, "name", None), _notes(rec))


def op_graph(rec: Recording, spec=None) -> Graph:
    """A node per aten op call ("op12", class: the op's name), an edge per producer ->
    consumer (the forward's input is not a node: aten ops only)."""
    nodes, edges = [], []
    for e, op_time in zip(rec.events, _times(rec, spec)):
        node = Node(f"op{e.index}", "op", e.record.module, e.record.op)
        _add(node, e, op_time)
        nodes.append(node)
        mine: dict[int, Edge] = {}
        for src, _, nbytes in e.sources:
            if src >= 0:
                edge = mine.get(src) or mine.setdefault(src, Edge(f"op{src}", node.id))
                edge.tensors += 1
                edge.bytes += nbytes
        edges += mine.values()
    return Graph("op", nodes, edges, getattr(spec, "name", None), _notes(rec))
