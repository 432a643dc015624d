"""Collectives priced on the devices' link: the seconds and joules of one rank's all-reduce,
all-gather, send/recv and all-to-all (costs/collectives.py records them as ops).

The pricing engine prices every record of op class "collective" (op_class: the registry's
family "collectives") with `record_seconds(record, spec)` here, and its link energy with
`record_joules`. Figures that keep no records (a step table's groups) keep each collective
group's `record_call(record)` = (kind, bytes a call, ranks) instead, and price one call with
`call_seconds(kind, nbytes, ranks, spec)` (the same rule).

A collective of B bytes over n ranks, on a link of per-step latency a and achievable bus
bandwidth busbw (nccl-tests' "busbw": the bandwidth each rank's link really carries), takes

    all-reduce, ring      2(n-1)/n · B / busbw + 2(n-1) · a       (reduce-scatter + all-gather)
    all-reduce, tree      2(n-1)/n · B / busbw + 2 ceil(log2 n) · a   (NCCL's double binary tree)
    all-gather, ring      (n-1)/n · B_out / busbw + (n-1) · a     (B_out: the gathered tensor)
    all-to-all            (n-1)/n · B / busbw + (n-1) · a         (pairwise exchange)
    send/recv             B / busbw + a                            (one hop to the next stage)

Which algorithm (NCCL's choice): within one node NCCL runs rings over NVLink or PCIe; when
the group crosses nodes it runs the double binary tree for all-reduce, whose bandwidth term
equals the ring's and whose latency grows with log2 n (NCCL picks by its cost model; the
cheaper of the two is taken). A group crosses nodes when it spans more than
`GPUS_PER_NODE` ranks (an HGX/DGX board holds 8).

The link (`link_for`):
- within a node, the spec's `interconnect_bw` (NVLink through NVSwitch on SXM boards, one
  way), else its host link (`host_to_device_bw`: PCIe cards talk through the PCIe switch);
- across nodes, InfiniBand: `NODE_LINK_BW`, one 400 Gb/s NDR port per GPU (NVIDIA DGX H100
  datasheet: 8x ConnectX-7 400 Gb/s), unless the spec gives `node_link_bw`.
- achievable bus bandwidth = the link's bandwidth x BUS_EFFICIENCY of its kind, from
  nccl-tests' published all_reduce_perf busbw at large sizes (docs.alayanew.com, "NCCL-tests
  in practice", reference numbers): 8x A100 SXM4 NVLink 230-250 GB/s on a 300 GB/s link
  (240/300 = 0.8; 8x H100 SXM 460-480 GB/s runs NVLink SHARP, in-switch reduction, which
  the ring formula does not model: 0.8 of 450 GB/s = 360 GB/s is the ring's figure); 8x H100
  PCIe 35-45 GB/s on PCIe Gen5's 64 GB/s (40/64 = 0.625); InfiniBand: NVLink's 0.8 assumed.
- per-step latency a: NCCL's own cost model (src/graph/tuning.cc, hwLat, Ring, LL protocol:
  what small messages, a decode step's, use): NVLink 0.6 us, PCIe 1.0 us; the network 5 us
  (its tree LL figure in the same table of NCCL 2.x).
- energy: the bytes each rank sends x 8 x the link's pJ/bit (`interconnect_pj_per_bit`,
  `host_to_device_pj_per_bit` for PCIe, `node_link_pj_per_bit`); unknown: 0 J, said by
  `Link.pj_per_bit` being None.

Overlap (the regime's rule, `overlaps_compute`): a tensor-parallel collective sits on the
critical path of the layer that needs its result (the next layer's input), so in every
regime it adds to the step; only the pipeline's send/recv of one micro-batch overlaps the
next micro-batch's compute (the engines post it asynchronously), and is not added to a
stage's step time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GPUS_PER_NODE = 8
NODE_LINK_BW = 50e9  # B/s one way: 400 Gb/s InfiniBand NDR per GPU (see the module doc)
BUS_EFFICIENCY = {"nvlink": 0.8, "pcie": 0.625, "network": 0.8}  # busbw / link bandwidth
STEP_LATENCY_S = {"nvlink": 0.6e-6, "pcie": 1.0e-6, "network": 5.0e-6}
OPS = {"perfcounter.all_reduce.default": "all_reduce",
       "perfcounter.all_gather.default": "all_gather",
       "perfcounter.send_recv.default": "send_recv",
       "perfcounter.all_to_all.default": "all_to_all"}


class LinkError(ValueError):
    """A device with no link to price a collective on (one line: which figure to give)."""


@dataclass(frozen=True, slots=True)
class Link:
    """One rank's link: kind ("nvlink", "pcie", "network"), bandwidth in B/s one way,
    achievable bus bandwidth, per-step latency, energy (None: unknown)."""

    kind: str
    bandwidth: float
    busbw: float
    latency_s: float
    pj_per_bit: float | None


def crosses_nodes(ranks: int) -> bool:
    return ranks > GPUS_PER_NODE


def link_for(spec, ranks: int) -> Link:
    """The link a group of `ranks` ranks of `spec` talks over (the module doc)."""
    if crosses_nodes(ranks):
        bw = getattr(spec, "node_link_bw", None) or NODE_LINK_BW
        kind, pj = "network", getattr(spec, "node_link_pj_per_bit", None)
    elif getattr(spec, "interconnect_bw", None):
        kind, bw, pj = "nvlink", spec.interconnect_bw, spec.interconnect_pj_per_bit
    elif getattr(spec, "host_to_device_bw", None) and spec.device_type not in ("cpu",):
        kind, bw, pj = "pcie", spec.host_to_device_bw, spec.host_to_device_pj_per_bit
    else:
        raise LinkError(f"device {spec.name!r} has no link to another device to run "
                        f"collectives over: give interconnect_GBs (NVLink) or "
                        f"host_to_device_bw_GBs (PCIe) in its YAML entry")
    return Link(kind, bw, bw * BUS_EFFICIENCY[kind], STEP_LATENCY_S[kind], pj)


def check_link(spec, ranks: int) -> Link | None:
    """The link of a group of `ranks` (None for one rank); LinkError before any counting."""
    return None if ranks <= 1 else link_for(spec, ranks)


# -- the formulas -----------------------------------------------------------------------
def ring_all_reduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """2(n-1)/n · B / busbw + 2(n-1) · latency."""
    n = ranks
    return 2 * (n - 1) / n * nbytes / link.busbw + 2 * (n - 1) * link.latency_s


def tree_all_reduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """2(n-1)/n · B / busbw + 2 ceil(log2 n) · latency (a double binary tree)."""
    n = ranks
    return 2 * (n - 1) / n * nbytes / link.busbw + 2 * math.ceil(math.log2(n)) * link.latency_s


def all_reduce_s(nbytes: float, ranks: int, link: Link) -> tuple[float, str]:
    """(seconds, "ring" or "tree"): NCCL's choice (the module doc)."""
    ring = ring_all_reduce_s(nbytes, ranks, link)
    if crosses_nodes(ranks):
        tree = tree_all_reduce_s(nbytes, ranks, link)
        if tree < ring:
            return tree, "tree"
    return ring, "ring"


def collective_s(kind: str, nbytes: float, ranks: int, link: Link) -> float:
    """Seconds of one call of a collective `kind` (OPS' values) of `nbytes` over `ranks`;
    nbytes: the tensor's bytes (all-gather: the gathered output's)."""
    if ranks <= 1:
        return 0.0
    n = ranks
    if kind == "all_reduce":
        return all_reduce_s(nbytes, n, link)[0]
    if kind in ("all_gather", "all_to_all"):
        return (n - 1) / n * nbytes / link.busbw + (n - 1) * link.latency_s
    if kind == "send_recv":
        return nbytes / link.busbw + link.latency_s
    raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(OPS.values())}")


def sent_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """Bytes one rank puts on its link in one call (its energy): a ring all-reduce sends
    2(n-1)/n · B, an all-gather and an all-to-all (n-1)/n · B, a send B."""
    if ranks <= 1:
        return 0.0
    n = ranks
    share = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
             "all_to_all": (n - 1) / n, "send_recv": 1.0}[kind]
    return share * nbytes


# -- records ----------------------------------------------------------------------------
def record_call(record) -> tuple[str, float, int]:
    """(kind, bytes of one call, ranks) of a collective record: the bytes its call writes
    (the tensor an all-reduce sums, the gathered output, the message sent), the ranks its
    integer argument (read from the record's own figures, which a step table refits)."""
    kind = OPS.get(record.op) or OPS[record.op.rsplit(".", 1)[0] + ".default"]
    calls = max(record.calls, 1)
    nbytes = sum(record.written) / calls
    ranks = next(a for a in record.args if isinstance(a, int) and not isinstance(a, bool))
    return kind, nbytes, ranks


def is_collective(op: str) -> bool:
    return op in OPS or op.rsplit(".", 1)[0] + ".default" in OPS


def link_seconds(record, spec) -> float:
    """Seconds every call of a collective record takes on `spec`'s link (the module doc)."""
    kind, nbytes, ranks = record_call(record)
    if ranks <= 1:
        return 0.0
    return record.calls * collective_s(kind, nbytes, ranks, link_for(spec, ranks))


def call_seconds(kind: str, nbytes: float, ranks: int, spec) -> float:
    """One call's seconds in a step (record_seconds' rule) from `record_call`'s figures."""
    if ranks <= 1 or overlaps_compute(kind):
        return 0.0
    return collective_s(kind, nbytes, ranks, link_for(spec, ranks))


def record_seconds(record, spec) -> float:
    """THE price of a collective record (op class "collective") in a step, every regime:
    its link seconds when it is on the critical path, 0 when it overlaps compute (a
    pipeline's send/recv: `overlaps_compute`, the module doc). Works on any record with
    .op, .calls, .written (bytes by role) and .args (its integer: the ranks)."""
    if overlaps_compute(record_call(record)[0]):
        return 0.0
    return link_seconds(record, spec)


def record_joules(record, spec) -> float:
    """Joules of every call's link traffic (0 when the link's pJ/bit is unknown)."""
    kind, nbytes, ranks = record_call(record)
    if ranks <= 1:
        return 0.0
    pj = link_for(spec, ranks).pj_per_bit
    return 0.0 if pj is None else record.calls * sent_bytes(kind, nbytes, ranks) * 8 * pj * 1e-12


def overlaps_compute(kind: str) -> bool:
    """Whether a collective overlaps compute (the module doc's rule): send/recv only."""
    return kind == "send_recv"


def trace_collectives_s(trace, spec) -> float:
    """Seconds of a trace's collectives on the critical path (overlapping ones left out)."""
    return sum(record_seconds(r, spec) for r in trace.records if is_collective(r.op))
