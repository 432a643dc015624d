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
`links.gpus_per_node(spec)` ranks (an HGX/DGX board holds 8).

The link: links.py's `within(spec, ranks)` (the one rule for a group's link, with its
sources: NVLink or PCIe within a node, the node link across nodes, each kind's bus
efficiency and per-step latency from nccl-tests and NCCL's cost model); energy: the bytes
each rank sends x 8 x the link's pJ/bit (`links.joules`; unknown: 0 J).

Overlap (the regime's rule, `overlaps_compute`): a tensor-parallel collective sits on the
critical path of the layer that needs its result (the next layer's input), so in every
regime it adds to the step; only the pipeline's send/recv of one micro-batch overlaps the
next micro-batch's compute (the engines post it asynchronously), and is not added to a
stage's step time.
"""
from __future__ import annotations

import math

from perfcounter.pricing.links import Link, LinkError, joules, within  # noqa: F401 (LinkError: re-exported)

OPS = {"perfcounter.all_reduce.default": "all_reduce",
       "perfcounter.all_gather.default": "all_gather",
       "perfcounter.send_recv.default": "send_recv",
       "perfcounter.all_to_all.default": "all_to_all"}


def check_link(spec, ranks: int) -> Link | None:
    """The link of a group of `ranks` (None for one rank); LinkError before any counting."""
    return None if ranks <= 1 else within(spec, ranks)


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
    if link.kind == "network":  # the group crosses nodes
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
    return record.calls * collective_s(kind, nbytes, ranks, within(spec, ranks))


def call_seconds(kind: str, nbytes: float, ranks: int, spec) -> float:
    """One call's seconds in a step (record_seconds' rule) from `record_call`'s figures."""
    if ranks <= 1 or overlaps_compute(kind):
        return 0.0
    return collective_s(kind, nbytes, ranks, within(spec, ranks))


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
    return record.calls * joules(sent_bytes(kind, nbytes, ranks), within(spec, ranks))


def overlaps_compute(kind: str) -> bool:
    """Whether a collective overlaps compute (the module doc's rule): send/recv only."""
    return kind == "send_recv"


def trace_collectives_s(trace, spec) -> float:
    """Seconds of a trace's collectives on the critical path (overlapping ones left out)."""
    return sum(record_seconds(r, spec) for r in trace.records if is_collective(r.op))
