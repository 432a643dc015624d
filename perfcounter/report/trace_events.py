"""A generation as a Chrome / Perfetto trace (trace-event JSON): open it in ui.perfetto.dev
or chrome://tracing.

    write_trace("gen.json", counter, spec)            # one device: predicted, and measured
    write_trace("sim.json", simulation)               # a placement: one process per device
    write_trace("fwd.json", record_forward(model, x), spec)   # one forward, op by op, measured

One device (a counter, {label: PerformanceStats} or one stats): a process named
after the device; on its "predicted" thread the phases are top-level slices, one
after the other; inside each phase the modules nest as they ran (sim_trace.timeline:
ENTER / RUN / EXIT, the time order of one forward) and inside each module its ops,
each as long as its predicted seconds on the device, run as the phase's execution
(eager unless a run said otherwise; per_record.py: each op's share of the phase's
prediction, per-call overhead + achievable rates); each op's args hold
`predicted_s` and `roofline_s` (its roofline bound, roofline.op_costs) and a phase
lasts the sum of its ops' predictions (the host link is not drawn). Metadata ops
(prim.*) are no op calls: predicted 0 s, they have no slice; ops that move no bytes
(views, t(), split) still pay a call's overhead and are drawn where they ran, in
their module's code (the timeline leaves them out). A phase of several
decode steps is drawn as one pass whose slices hold the time of all its steps
(`args.steps` says how many). When a phase was timed (a real run: the stats'
latency, or `measured={label: s}`) a "measured" thread holds it beside the
prediction. Counter tracks "FLOPs" and "bytes" climb as the phase executes them.

One recorded forward (graph.record_forward): every op call in order inside its
modules, on a "predicted" thread (each call's prediction, as above) and, when
tensors were real, a "measured" thread (each call's wall time, the counter's
bookkeeping left out).

A simulation (simulate.Simulation, with detail): a "generation" process holds the
phases; each device is a process with an "ops" thread (each module's ops on it, the
simulator's log rows) and a "transfers" thread (host links, device links,
all-reduces), and its own FLOPs / bytes counters. Its times are the simulator's log:
the roofline bound of each module's ops on its device (the simulation's predicted
figures are per phase and device, beside the bound, in its report and JSON).

Format: every event has name, ph, ts, pid, tid; a complete event ("X") has dur;
ts and dur are in microseconds, written from integer nanoseconds (three decimals),
so that slices nest exactly; events are sorted by time, an enclosing slice first.
Ops shorter than half a nanosecond have no slice (their time stays in their module).
Written atomically (_util.atomic_write).
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import NamedTuple

from perfcounter._util import atomic_write
from perfcounter.devices import get_device_spec
from perfcounter.pricing.per_record import record_predictions
from perfcounter.pricing.predict import phase_program
from perfcounter.pricing.roofline import op_costs
from perfcounter.simulation.source import RECORDING, SIMULATION, read_source
from perfcounter.simulation.timeline import Ev, timeline

NS = 1e9


_RANK = {"phase": 0, "module": 1, "transfer": 1, "op": 2}


class OpTime(NamedTuple):
    """One record's seconds on a device: predicted, and its roofline bound."""

    predicted_s: float  # its share of the phase's prediction (per_record.py), overhead + work
    roofline_s: float  # roofline.op_costs: max(compute, memory) at peak, no overhead
    bound: str  # the roofline's: "memory" or "compute"


def op_times(trace, spec, execution: str = "eager") -> list[OpTime]:
    """Predicted (run `execution`: each record's share, per_record.py) and roofline seconds
    of every record of `trace` on `spec`, aligned with trace.records. NB: prim.* records
    (metadata, no op call) are predicted 0 s."""
    return [OpTime(t.latency_s, c.latency_s, c.bound) for t, c in
            zip(record_predictions(trace, spec, execution), op_costs(trace, spec))]


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _label(path: str) -> str:
    """A module's slice name: its last path part ("q_proj"), with its parent's for a
    numbered one ("layers.0")."""
    if not path:
        return "(no module)"
    parts = path.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]


class _Events:
    """Events under construction, in integer nanoseconds."""

    def __init__(self):
        self.events: list[dict] = []
        self.names: dict[tuple, str] = {}

    def name(self, pid: int, tid: int | None, text: str) -> None:
        self.names[(pid, tid)] = text

    def slice(self, name: str, pid: int, tid: int, start: int, end: int, cat: str,
              args: dict | None = None) -> None:
        if end <= start:
            return
        self.events.append({"name": name, "cat": cat, "ph": "X", "ts": start, "dur": end - start,
                            "pid": pid, "tid": tid, "args": args or {},
                            "_rank": (_RANK[cat], (args or {}).get("path", "").count("."))})

    def counter(self, name: str, pid: int, at: int, value: float) -> None:
        self.events.append({"name": name, "ph": "C", "ts": at, "pid": pid, "tid": 0,
                            "args": {name: value}})

    def doc(self, other: dict) -> dict:
        meta = []
        for (pid, tid), text in self.names.items():
            kind = "process_name" if tid is None else "thread_name"
            meta.append({"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid or 0,
                         "args": {"name": text}})
        # by time; at one time the longer slice first, and between slices of one extent
        # the phase, then the outer module, then the op: each encloses the next
        body = sorted(self.events, key=lambda e: (e["ts"], -e.get("dur", 0),
                                                  e.get("_rank", (9, 0)), e["pid"], e["tid"]))
        for e in body:
            e.pop("_rank", None)
            e["ts"] = _us(e["ts"])
            if "dur" in e:
                e["dur"] = _us(e["dur"])
        return {"traceEvents": meta + body, "displayTimeUnit": "ns", "otherData": other}


def _idle(trace, times) -> dict[tuple[str, int], list[int]]:
    """Records the timeline leaves out (no bytes, no FLOPs: views, t(), split) that are
    still op calls with a predicted overhead, by (module, segment), in the order they ran."""
    out: dict[tuple[str, int], list[int]] = {}
    for i, (r, c) in enumerate(zip(trace.records, times)):
        if not (r.bytes or r.executed_flops) and c.predicted_s > 0:
            out.setdefault((r.module, getattr(r, "segment", 0)), []).append(i)
    return out


def _device_trace(phases: dict, spec, measured: dict) -> dict:
    ev = _Events()
    ev.name(1, None, f"{spec.name} (predicted)")
    ev.name(1, 1, "predicted")
    clock, real_clock = 0.0, 0
    flops = nbytes = 0.0
    for label, stats in phases.items():
        trace = stats.trace
        if trace is None:
            continue
        regime, program = phase_program(spec, stats.execution, label)  # as stats prices it
        times = op_times(trace, program, regime)
        infos = {m.path: m for m in trace.modules}
        idle, placed = _idle(trace, times), set()
        start, stack = clock, []

        def draw(indices, share: float) -> None:
            nonlocal clock, flops, nbytes
            for i in indices:
                r, c = trace.records[i], times[i]
                t = c.predicted_s * share
                ev.slice(r.op.removeprefix("aten."), 1, 1, round(clock * NS),
                         round((clock + t) * NS), "op",
                         {"module": r.module, "shapes": r.shapes, "dtype": r.dtype,
                          "calls": r.calls * share, "bound": c.bound,
                          "flops": r.executed_flops * share, "bytes": r.bytes * share,
                          "predicted_s": t, "roofline_s": c.roofline_s * share})
                clock += t
                flops += r.executed_flops * share
                nbytes += r.bytes * share
            ev.counter("FLOPs", 1, round(clock * NS), flops)
            ev.counter("bytes", 1, round(clock * NS), nbytes)

        for step in timeline(trace):
            if step.kind == Ev.ENTER:
                stack.append((step.module, clock))
            elif step.kind == Ev.EXIT:
                path, begun = stack.pop()
                info = infos.get(path)
                ev.slice(_label(path), 1, 1, round(begun * NS), round(clock * NS),
                         "module", {"path": path, "cls": info.cls if info else "",
                                    "params": info.params if info else 0})
            else:  # the step's ops, and the idle ones of its segment, in the order they ran
                first = trace.records[step.records[0]] if step.records else None
                key = (step.module, getattr(first, "segment", 0))
                extra = tuple(idle.get(key, ())) if first is not None else ()
                if extra:
                    placed.add(key)
                draw(sorted(step.records + extra) if extra else step.records, step.share)
        rest = [i for key, idx in idle.items() if key not in placed for i in idx]
        if rest:  # a segment with idle ops only: at the phase's end, outside modules
            draw(sorted(rest), 1.0)
        ev.slice(label, 1, 1, round(start * NS), round(clock * NS), "phase",
                 {"tokens": stats.num_tokens, "steps": trace.steps,
                  "flops": trace.executed_flops, "bytes": trace.per_op_bytes,
                  "predicted_s": clock - start,
                  "roofline_s": sum(c.roofline_s for c in times)})
        real = measured.get(label, stats.latency)
        if real:
            ev.name(1, 2, "measured")
            end = real_clock + round(real * NS)
            ev.slice(label, 1, 2, real_clock, end, "phase",
                     {"measured_s": real, "predicted_s": clock - start})
            real_clock = end
    return ev.doc({"device": spec.name, "source": "perfcounter",
                   "time": "predicted per op (eager)"})


def _simulation_trace(sim) -> dict:
    ev = _Events()
    ev.name(0, None, "generation")
    ev.name(0, 1, "phases")
    pids: dict[str, int] = {}
    ends: dict[tuple, int] = {}
    totals: dict[str, list] = {}
    offset = 0.0
    for label, phase in sim.phases.items():
        start, stop = round(offset * NS), round((offset + phase.time_s) * NS)
        ev.slice(label, 0, 1, start, stop, "phase",
                 {"tokens": phase.num_tokens, "steps": phase.steps, "time_s": phase.time_s,
                  "energy_j": phase.energy_j})
        used = set()
        for row in phase.log:
            pid = pids.get(row.device)
            if pid is None:
                pid = pids[row.device] = len(pids) + 1
                ev.name(pid, None, row.device)
                ev.name(pid, 1, "ops")
                ev.name(pid, 2, "transfers")
                totals[row.device] = [0.0, 0.0]
            tid = 2 if row.transfer else 1
            used.add((pid, tid))
            begin = max(round((offset + row.start_s) * NS), ends.get((pid, tid), 0), start)
            end = min(round((offset + row.start_s + row.duration_s) * NS), stop)
            if end <= begin:
                continue
            ends[(pid, tid)] = end
            name = row.transfer if row.transfer else _label(row.module)
            ev.slice(name, pid, tid, begin, end, "transfer" if row.transfer else "module",
                     {"module": row.module, "bytes": row.bytes, "flops": row.flops,
                      "energy_j": row.energy_j})
            acc = totals[row.device]
            acc[0] += row.flops
            acc[1] += row.bytes
            ev.counter("FLOPs", pid, end, acc[0])
            ev.counter("bytes", pid, end, acc[1])
        for pid, tid in used:
            ev.slice(label, pid, tid, start, stop, "phase")
        offset += phase.time_s
    if not pids:
        raise ValueError("this simulation has no per-module log: simulate(..., detail=True)")
    return ev.doc({"source": "perfcounter.simulate", "host": sim.host,
                   "mapping": dict(sim.mapping)})


def _recording_trace(rec, spec) -> dict:
    """One forward recorded by graph.record_forward: every op call in order, with its
    modules around it, on a "predicted" thread and, for real tensors, a "measured" one
    (the wall time of each call, without the counter's bookkeeping)."""
    infos = {m.path for m in rec.modules}
    # the forward's own whole-phase figures (compulsory bytes: cold or warm), its calls
    times = op_times(replace(rec.trace, records=[e.record for e in rec.events]), spec)
    ev = _Events()
    ev.name(1, None, f"{spec.name}: one forward")
    threads = [(1, "predicted", [c.predicted_s for c in times])]
    if rec.real:
        threads.append((2, "measured", [e.measured_s or 0.0 for e in rec.events]))
    for tid, name, seconds in threads:
        ev.name(1, tid, name)
        clock, stack = 0.0, []  # stack: (module path, start)
        for e, t, c in zip(rec.events, seconds, times):
            path = e.record.module
            chain = [a for a in (path.rsplit(".", k)[0] for k in range(path.count("."), -1, -1))
                     if a in infos] if path else []
            while stack and (len(stack) > len(chain) or stack[-1][0] != chain[len(stack) - 1]):
                done, begun = stack.pop()
                ev.slice(_label(done), 1, tid, round(begun * NS), round(clock * NS), "module",
                         {"path": done})
            stack += [(a, clock) for a in chain[len(stack):]]
            args = {"module": path, "shapes": e.record.shapes, "flops": e.record.executed_flops,
                    "bytes": e.record.bytes, "index": e.index}
            if tid == 1:
                args |= {"predicted_s": t, "roofline_s": c.roofline_s}
            else:
                args["measured_s"] = t
            ev.slice(e.record.op.removeprefix("aten."), 1, tid, round(clock * NS),
                     round((clock + t) * NS), "op", args)
            clock += t
        while stack:
            done, begun = stack.pop()
            ev.slice(_label(done), 1, tid, round(begun * NS), round(clock * NS), "module",
                     {"path": done})
    return ev.doc({"device": spec.name, "source": "perfcounter.report.graph.record_forward"})


def trace_events(source, spec=None, *, measured: dict | None = None) -> dict:
    """The trace-event document (a dict) of a counted generation on one device (`spec`:
    a DeviceSpec or a name; default the stats' own device) or of a Simulation."""
    src = read_source(source, "trace_events()",
                      ("counter", "stats", "dict", "simulation", "recording"))
    if src.kind == SIMULATION:
        return _simulation_trace(source)
    if isinstance(spec, str):
        spec = get_device_spec(spec)
    if src.kind == RECORDING:  # graph.Recording
        if spec is None:
            raise ValueError("trace_events needs a device to predict on: pass spec=")
        return _recording_trace(source, spec)
    phases = src.stats()
    if spec is None:
        spec = next((s.device_spec for s in phases.values()
                     if getattr(s, "device_spec", None) is not None), None)
    if spec is None:
        raise ValueError("trace_events needs a device to predict on: pass spec=")
    return _device_trace(phases, spec, measured or {})


def write_trace(path, source, spec=None, *, measured: dict | None = None) -> dict:
    """trace_events(...) written to `path` as JSON, atomically; returns the document."""
    doc = trace_events(source, spec, measured=measured)
    atomic_write(path, json.dumps(doc, allow_nan=False) + "\n")
    return doc
