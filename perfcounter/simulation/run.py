"""Simulate: price a counted inference with its layers placed on several devices.

    sim = perfcounter.simulate(counter, {"q_proj": "PIM-AI-4chip,t", "lm_head": "H100"})
    print(sim.report(log_summary=True)); sim.to_json("sim.json")

UPMEM's LLM framework asks "what if this layer ran on that accelerator?" by
swapping nn classes; here the answer is built on the counted trace, op by op.
Each phase's one forward is replayed in time order (a module's own ops placed
between its children by segment, `ModuleInfo.children`; traces without them
fall back to the order ops first ran), each module runs where placement.py
says, and:
- an op costs its roofline on its device (executed FLOPs / peak at the op's
  dtype against bytes / bandwidth, roofline.op_costs), divided by the device's
  peak_fraction and its tensor-parallel degree; with elementwise_model="upmem"
  softmax / SiLU / RMSNorm cost the spec's ns per element (UPMEM's defaults,
  0.4 / 0.6 / 1.1 ns, for UPMEM profiles without them);
- execution starts on the host, which holds the phase's input (role "input":
  token ids, positions); a module entered on another device receives its input
  (ModuleInfo.input_bytes per call; the model's root: the phase's input), a
  parent resumed after a child on another device receives the child's output:
  over a device<->device link when one is known (both specs' figures, or
  device_link=), else device->host->device at each host link's bandwidth and
  pJ/bit (pricing/links.py: the link and `transfer`); a transfer point (`t`)
  always goes through the host, a MoE point (`m`) once per sibling group; the phase's last output goes back to the host.
  Nothing else moves: weights, KV caches, causal masks and RoPE tables live on
  the device that made or holds them;
- with tp=N, one all-reduce of the block's output (2(N-1)/N of its bytes sent
  per device) ends each attention and each MLP block, priced as every all-reduce is
  (pricing/collectives.py on pricing/links.py's link: the interconnect given, else the
  spec's, as --tensor_parallel_size N prices it), else through the host;
- time is the sum of ops and transfers (with overlap=True a transfer and the
  compute after it take the longer of the two); energy is compute + memory +
  host link + device link + static W x phase time per device used (pricing/power.py's
  static power: a GPU's idle_W, else the entry's static_W; no cap per step here).
"""
from __future__ import annotations

import warnings

from perfcounter._util import PerfcounterWarning
from perfcounter.pricing.collectives import all_reduce_s, sent_bytes
from perfcounter.pricing.links import LinkError, host_link, joules, transfer
from perfcounter.pricing.per_record import per_step_overhead_s
from perfcounter.pricing.power import power_of
from perfcounter.pricing.predict import phase_program, phase_regime
from perfcounter.pricing.regimes import check_regime
from perfcounter.simulation.hf_names import split_qkv
from perfcounter.simulation.links import Link, Links
from perfcounter.simulation.placement import (HOST, Device, Mapping, MappingError, Plan,
                                              default_host, resolve_device)
from perfcounter.simulation.result import (DeviceResult, FunctionResult, LogRow, ModuleResult,
                                           PhaseResult, Simulation)
from perfcounter.simulation.source import read_source
from perfcounter.simulation.timeline import PREPARED, Ev
from perfcounter.trace import op_packet

ELEMENTWISE_MODELS = ("roofline", "upmem")


# -- one phase, replayed -------------------------------------------------------------------
class _Replay:
    """A phase's forward replayed under a plan: the clock, each device's account, the log."""

    def __init__(self, prep, plan: Plan, links: Links, elementwise: str, overlap: bool,
                 notes: set, detail: bool, execution: str | None = None,
                 specs: dict | None = None):
        """execution None: each op at its roofline on its device (x peak fraction); else
        its predicted seconds run that way (per_record.py: achievable rates, overheads), on
        `specs` where given (a device key's spec as the phase's program prices it)."""
        self.prep, self.plan, self.links, self.notes = prep, plan, links, notes
        self.elementwise, self.overlap, self.detail = elementwise, overlap, detail
        self.execution, self.specs = execution, specs or {}
        self.acc: dict[str, DeviceResult] = {}
        self.clock = self.wt = self.wc = 0.0  # finished windows; this window's transfer, compute
        self.log: list[LogRow] = []
        self.mods: dict[str, ModuleResult] = {}
        self.funcs: dict[tuple[str, str], FunctionResult] = {}
        self.moe_sent: set[tuple] = set()

    def account(self, dev: Device) -> DeviceResult:
        a = self.acc.get(dev.key)
        if a is None:
            a = self.acc[dev.key] = DeviceResult(dev.key, dev.spec.name, dev.spec.device_type,
                                                 dev.tp, dev.fraction)
        return a

    def module(self, path: str, dev: Device) -> ModuleResult | None:
        """The module's result row (detail only; None outside any listed module)."""
        info = self.prep.infos.get(path)
        if not self.detail or info is None:
            return None
        m = self.mods.get(path)
        if m is None:
            m = self.mods[path] = ModuleResult(path, info.cls, [], info.calls, info.params,
                                               info.input_shapes)
        if dev.key not in m.devices:
            m.devices.append(dev.key)
        return m

    # -- time ----------------------------------------------------------------------------
    def _window(self, transfer_s: float) -> float:
        """Close the window (a transfer and the compute after it) and open one; its start."""
        self.clock += max(self.wt, self.wc) if self.overlap else self.wt + self.wc
        self.wt, self.wc = transfer_s, 0.0
        return self.clock

    def _leg(self, dev: Device, direction: str, nbytes: float) -> tuple[float, float]:
        link = host_link(dev.spec, direction)
        if link is None or link.pj_per_bit is None:
            self.notes.add(f"{dev.key} has no {direction.replace('_', '-')} "
                           f"{'bandwidth' if link is None else 'pJ/bit'}: those transfers cost 0")
        t, e = (0.0, 0.0) if link is None else transfer(nbytes, link)
        a = self.account(dev)
        a.transfer_s += t
        a.energy_by_component_j["host_link"] += e
        if direction == "host_to_device":
            a.host_to_device_bytes += nbytes
        else:
            a.device_to_host_bytes += nbytes
        return t, e

    def transfer(self, src: Device, dst: Device, nbytes: float, path: str, via_host: bool) -> None:
        """Move `nbytes` from src to dst: over their link, or device->host->device."""
        if nbytes <= 0 or (src is dst and not via_host) or (src.is_host and dst.is_host):
            return
        link = None if via_host or src.is_host or dst.is_host else self.links.between(src, dst)
        if link is not None:
            t, e = transfer(nbytes, link)
            for d in {src.key: src, dst.key: dst}.values():
                self.account(d).transfer_s += t
            a = self.account(dst)
            a.device_link_bytes += nbytes
            a.energy_by_component_j["device_link"] += e
            route = f"{src.key}->{dst.key}"
        else:
            t = e = 0.0
            if not src.is_host:
                t, e = self._leg(src, "device_to_host", nbytes)
            if not dst.is_host:
                t2, e2 = self._leg(dst, "host_to_device", nbytes)
                t, e = t + t2, e + e2
            hops = [src.key] + ([] if src.is_host or dst.is_host else [HOST]) + [dst.key]
            route = "->".join(hops)
        start = self._window(t)
        m = self.module(path, dst)
        if m is not None:
            m.transfer_s += t
            m.transfer_bytes += nbytes
            m.energy_j += e
        if self.detail:
            self.log.append(LogRow(path, dst.key, start, t, nbytes, 0.0, e, route))

    def allreduce(self, dev: Device, nbytes: float, path: str) -> None:
        """A ring all-reduce of nbytes over dev's tensor-parallel group."""
        n = dev.tp
        ring = sent_bytes("all_reduce", nbytes, n)  # what each device sends: 2(n-1)/n of it
        link = self.links.within(dev)
        a = self.account(dev)
        if link is not None:  # the one all-reduce rule (collectives.py) on the group's link
            t, e = all_reduce_s(nbytes, n, link)[0], n * joules(ring, link)
            a.energy_by_component_j["device_link"] += e
        else:  # through the host: each device's share out and back
            self.notes.add(f"{dev.key}: no interconnect given; its all-reduces go through "
                           "the host link")
            t = e = 0.0
            for direction in ("device_to_host", "host_to_device"):
                leg = host_link(dev.spec, direction)
                if leg is not None:
                    t_leg, e_leg = transfer(ring, leg)
                    t, e = t + t_leg, e + n * e_leg
            a.energy_by_component_j["host_link"] += e
        a.allreduce_bytes += ring
        a.transfer_s += t
        start = self._window(t)
        m = self.module(path, dev)
        if m is not None:
            m.transfer_s += t
            m.energy_j += e
            self.log.append(LogRow(path, dev.key, start, t, ring, 0.0, e, f"all-reduce x{n}"))

    def run(self, step, j: int, dev: Device, costs) -> None:
        c = costs[dev.key][j]
        scale = 1.0 / ((dev.fraction if self.execution is None else 1.0) * dev.tp)
        t = c.latency_s * scale
        a = self.account(dev)
        a.compute_s += c.compute_s * scale
        a.memory_s += c.memory_s * scale
        a.busy_s += t
        a.flops += c.flops
        a.bytes += c.bytes
        a.energy_by_component_j["compute"] += c.compute_j
        a.energy_by_component_j["memory"] += c.memory_j
        start = self.clock + (0.0 if self.overlap else self.wt) + self.wc
        self.wc += t
        if not self.detail:
            return
        m = self.module(step.module, dev)
        if m is not None:
            m.time_s += t
            m.compute_s += c.compute_s * scale
            m.memory_s += c.memory_s * scale
            m.flops += c.flops
            m.bytes += c.bytes
            m.energy_j += c.compute_j + c.memory_j
        self.log.append(LogRow(step.module, dev.key, start, t, c.bytes, c.flops,
                               c.compute_j + c.memory_j, ""))
        per = self.prep.record_costs(self.specs.get(dev.key, dev.spec), self.elementwise,
                                     self.execution)
        for i in step.records:
            r, rc = self.prep.trace.records[i], per[i]
            op = op_packet(r.op)
            f = self.funcs.get((dev.key, op))
            if f is None:
                f = self.funcs[(dev.key, op)] = FunctionResult(dev.key, op)
            f.calls += r.calls * step.share
            f.flops += rc.flops * step.share
            f.bytes += rc.bytes * step.share
            f.time_s += rc.latency_s * step.share * scale
            f.energy_j += (rc.compute_j + rc.memory_j) * step.share

    # -- the replay ---------------------------------------------------------------------------
    def replay(self, label: str, num_tokens: int) -> PhaseResult:
        plan, prep = self.plan, self.prep
        costs = {}
        ran: list = [None] * len(prep.trace.records)  # the device key each record ran on
        cur = plan.host  # execution starts on the host
        for j, step in enumerate(prep.steps):
            path = step.module
            dev = plan.where.get(path) or plan.default or cur
            if step.kind == Ev.ENTER:
                info, key = prep.infos.get(path), plan.own.get(path)
                value = plan.value.get(path) if key else None
                via_host = bool(value and value.transfer)
                if value is not None and value.moe:  # once per sibling group and device
                    group = (key, dev.key, path.rsplit(".", 1)[0])
                    via_host = via_host or group not in self.moe_sent
                    self.moe_sent.add(group)
                if info is not None and (via_host or dev is not cur):
                    nbytes = prep.input_bytes if path == prep.root else \
                        info.input_bytes * step.count
                    self.transfer(cur, dev, nbytes, path, via_host)
                cur = dev
                self.module(path, dev)
            elif step.kind == Ev.RUN:
                if dev is not cur:  # a parent resumed after a child elsewhere gets its output
                    source = prep.infos.get(step.after or path)
                    if source is None:  # ops outside any module: the phase's input
                        nbytes = prep.input_bytes
                    else:
                        nbytes = step.count * (source.output_bytes if step.after
                                               else source.input_bytes)
                    self.transfer(cur, dev, nbytes, path, False)
                    cur = dev
                if dev.key not in costs:
                    costs[dev.key] = prep.step_costs(self.specs.get(dev.key, dev.spec),
                                                     self.elementwise, self.execution)
                self.run(step, j, cur, costs)
                for i in step.records:
                    ran[i] = cur.key
                for i in prep.riders.get(j, ()):  # views: where the step paying their calls ran
                    ran[i] = ran[i] or cur.key
            elif cur.tp > 1 and path in prep.blocks:
                self.allreduce(cur, prep.infos[path].output_bytes * step.count, path)
        self.transfer(cur, plan.host, prep.output_bytes, "(output)", False)
        self._window(0.0)
        for key, a in self.acc.items():
            static_w = power_of(plan.devices[key].spec).static_w  # a GPU's idle W (power.py)
            a.energy_by_component_j["static"] += static_w * a.tp * self.clock
        return PhaseResult(label, num_tokens, prep.trace.steps, self.clock, self.acc,
                           list(self.mods.values()), list(self.funcs.values()), self.log,
                           record_devices=tuple(ran))


# -- the API ---------------------------------------------------------------------------------
def phases_of(source, labels=None) -> dict[str, tuple]:
    """{label: (trace, num_tokens)} from a counter, stats, a trace, or a dict of them."""
    src = read_source(source, "simulate()", ("counter", "stats", "trace", "dict"))
    phases = {k: (p.trace, p.num_tokens) for k, p in src.phases.items()}
    if labels is not None:
        missing = [k for k in labels if k not in phases]
        if missing:
            raise MappingError(f"unknown phase {missing[0]!r}; phases: {', '.join(phases)}")
        phases = {k: phases[k] for k in labels}
    if not phases:
        raise MappingError("nothing to simulate: no phase was counted")
    return phases


def modules_of(phases) -> list:
    seen = {}
    for trace, _ in phases.values():
        for m in trace.modules:
            seen.setdefault(m.path, m)
    return list(seen.values())


def _device_figures(dev: Device) -> dict:
    s = dev.spec
    return {"spec": s.name, "device_type": s.device_type, "tp": dev.tp,
            "peak_fraction": dev.fraction, "bandwidth": s.bandwidth, "flops_per_s": s.flops_per_s,
            **{f: getattr(s, f, None) for f in (
                "mem_pj_per_bit", "host_to_device_bw", "device_to_host_bw",
                "host_to_device_pj_per_bit", "device_to_host_pj_per_bit", "static_w",
                "idle_w", "tdp_w")}}


def _link(value, name: str) -> Link | None:
    if value is None or isinstance(value, Link):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        try:
            return Link(*value)
        except LinkError as e:
            raise MappingError(f"{name}: {e}") from None
    raise MappingError(f"{name}: expected Link(bw B/s > 0, pJ/bit) or (bw, pJ/bit), "
                       f"got {value!r}")


def simulate(source, mapping=None, *, host=None, default_device: str | None = None,
             devices: dict | None = None, allow_unmatched: bool = False,
             elementwise_model: str = "roofline", overlap: bool = False, peak_fraction=None,
             device_link=None, interconnect=None, labels=None, detail: bool = True,
             execution: str | None = "eager") -> Simulation:
    """Price every counted phase of `source` (a TransformerPerformanceCounter,
    PerformanceStats, Trace, or {label: either}) with its modules placed by `mapping`
    (a dict, a YAML / JSON file or inline text in UPMEM's notation; see placement.py).

    host: the host's DeviceSpec or name (default: the calibrated CPU, else generic-cpu).
    default_device: where modules no key places run (default: where the previous one ran).
    devices: {name: DeviceSpec} that mapping values may name, before the registry.
    allow_unmatched: warn, instead of failing, for keys that match no module.
    elementwise_model: "roofline" (softmax / SiLU / RMSNorm priced by FLOPs and bytes) or
      "upmem" (by the spec's ns per element, UPMEM's defaults for its profiles).
    overlap: a transfer overlaps the compute after it (max instead of sum).
    peak_fraction: achievable / peak for every device (a number) or per device
      ({"pim-ai-4chip": 0.7, "host": 0.5}); applied to FLOP/s and bandwidth.
    device_link, interconnect: Link(bw B/s, pJ/bit) between any two non-host devices, and
      within a tensor-parallel group; without them transfers go through the host.
    labels: the phases to price (default all); detail=False skips modules, ops and log.
    execution: beside the bound (every op at peak x peak_fraction, UPMEM's simulator's
      assumption), the phase predicted run eager, compiled or cudagraphs: each op at its
      device's achievable rate for its kernel class and paying its overheads (predict.py;
      peak_fraction and elementwise_model do not apply), the same transfers, each device
      used paying its own per-step launches (per_record.per_step_overhead_s: a graph a step
      under cudagraphs) (PhaseResult.predicted_s, DeviceResult.predicted_busy_s); None: the
      bound alone.
    """
    mapping = Mapping.load(mapping)
    phases = split_qkv(phases_of(source, labels), mapping.to_dict())  # q/k/v keys on our wqkv
    if execution is not None:
        check_regime(execution, bound=False)
    if elementwise_model not in ELEMENTWISE_MODELS:
        raise MappingError(f"unknown elementwise_model {elementwise_model!r}; valid: "
                           f"{', '.join(ELEMENTWISE_MODELS)}")
    if host is None:
        host = default_host()
    elif isinstance(host, str):
        host = resolve_device(host, None, where="host", extra=devices)
    modules = modules_of(phases)
    plan = Plan(mapping, modules, host, default_device=default_device,
                peak_fraction=peak_fraction, extra=devices)
    notes: set[str] = set()
    unmatched = mapping.unmatched(plan.used, modules)
    if unmatched and not allow_unmatched:
        raise MappingError("; ".join(unmatched) + " (allow_unmatched=True, or --allow_unmatched, "
                           "warns and goes on)")
    for line in unmatched:
        warnings.warn(line, PerfcounterWarning, stacklevel=2)
        notes.add(line)
    links = Links(_link(device_link, "device_link"), _link(interconnect, "interconnect"))
    results = {label: _Replay(PREPARED.get(trace), plan, links, elementwise_model, bool(overlap),
                              notes, detail).replay(label, tokens)
               for label, (trace, tokens) in phases.items()}
    if execution is not None:  # the prediction beside the bound: the same replay, re-priced
        for label, (trace, tokens) in phases.items():
            # each phase as count prices it: a prefill runs compiled, for any prompt length
            regime = phase_regime(execution, label)
            specs = {key: phase_program(d.spec, execution, label)[1]
                     for key, d in plan.devices.items()}
            predicted = _Replay(PREPARED.get(trace), plan, links, elementwise_model,
                                bool(overlap), notes, False, regime, specs).replay(label, tokens)
            launches = 0.0  # each device that ran ops launches its own per step (a graph)
            for key, a in predicted.devices.items():
                if a.busy_s:
                    a.busy_s += per_step_overhead_s(trace, specs[key], regime)
                    launches += per_step_overhead_s(trace, specs[key], regime)
                results[label].devices[key].predicted_busy_s = a.busy_s
            results[label].predicted_s = predicted.time_s + launches
    options = {"elementwise_model": elementwise_model, "overlap": bool(overlap),
               "execution": execution,
               "default_device": None if plan.default is None else plan.default.key,
               **{name: None if link is None else [link.bandwidth, link.pj_per_bit]
                  for name, link in (("device_link", links.device_link),
                                     ("interconnect", links.interconnect))}}
    return Simulation(results, mapping.to_dict(), host.name, options,
                      {k: _device_figures(d) for k, d in plan.devices.items()}, sorted(notes))
