"""A byte's price over a link, owned here: the one `Link`, the rule for which link joins two
devices (a tensor-parallel group, two devices of a placement, two serving pools, a device and
its host), and `transfer(nbytes, link) -> (seconds, joules)`.

A `Link` is data: its raw bandwidth one way (B/s), the fraction of it a transfer achieves
(`efficiency`: nccl-tests' bus bandwidth / the link's), a fixed latency per message, and
its energy (pJ/bit; None: unknown, 0 J charged). A transfer of B bytes over it, split over
`lanes` links that carry it side by side, takes

    B / (lanes x bandwidth x efficiency) + latency      seconds
    B x 8 x pJ/bit                                      joules

The collectives (collectives.py) keep their own formulas (a ring all-reduce sends
2(n-1)/n of its bytes in 2(n-1) steps) on the same link's `busbw` and `latency_s`.

Each kind of link says what a transfer achieves on it (`KINDS`):
- "nvlink", "pcie", "network": what NCCL achieves, between GPUs (collectives.py's module doc
  has the sources): bus efficiency 0.8 / 0.625 / 0.8 (nccl-tests' all_reduce_perf busbw at
  large sizes over the link's bandwidth), latency 0.6 / 1.0 / 5 us a step (NCCL's own cost
  model, src/graph/tuning.cc, hwLat, LL protocol);
- "direct": the link's full bandwidth, no latency: UPMEM's LLM framework simulator's rule
  (seed 002: bytes / the link's bandwidth, every byte at its pJ/bit), for a placement's host
  links (the placement replay is that framework's), every link of a device that is not a GPU
  (PIM parts, NPUs, UPMEM's profiles), and a link a user gives by its two figures
  (simulate's device_link= and interconnect=, --device_link_GBs): so the PIM paper's and
  UPMEM's figures stay as that simulator computes them, and nothing is assumed beside what a
  user gave.

Which link (the rules, each in one function):
- `within(spec, ranks)`: a group of `ranks` GPUs of one kind, as a collective runs over it:
  within a node (at most `gpus_per_node(spec)` ranks) the spec's interconnect (NVLink through
  NVSwitch on SXM boards), else its host link as "pcie" (PCIe cards talk through the PCIe
  switch); across nodes the spec's node link (`node_link`). The NCCL kinds are for GPUs
  (`nccl`); any other device's links are "direct".
- `stage_links(spec, tp, pp)`: the hops of a pipeline's stages (TP within a node, PP
  across): a hop between nodes over the node link, else over the link within a node.
- `node_link(spec)`: the spec's `node_link_bw` / `node_link_pj_per_bit` (device files'
  `node_link_GBs`, sourced there: one InfiniBand port a GPU, 400 Gb/s NDR on DGX H100, H200
  and B200, 200 Gb/s HDR on DGX A100), else `NODE_LINK_BW`.
- `between(a, b)`: two devices of a placement, each with a device link (`device_link_bw`):
  the slower end's bandwidth, the mean pJ/bit (unknown when either end's is), the kind of
  GPUs' fabric ("nvlink") between two GPUs, else "direct".
- `pool_link(a, b)`: two serving pools: each end's node link (a GPU with a GPU fabric), else
  its host link as "pcie"; the slower end's bandwidth and efficiency, the larger latency, the
  mean pJ/bit.
- `host_link(spec, direction)`: a device's link to its host ("host_to_device" or
  "device_to_host"), "direct"; None when the spec has no such bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

GPUS_PER_NODE = 8  # an HGX/DGX board holds 8 GPUs: the default where a spec does not say
NODE_LINK_BW = 50e9  # B/s one way: 400 Gb/s InfiniBand NDR per GPU (NVIDIA DGX H100 datasheet)
PJ = 1e-12  # J per pJ


class LinkKind(NamedTuple):
    """What a transfer achieves on a kind of link: the fraction of its bandwidth, and a
    fixed latency per message (or per step of a collective)."""

    efficiency: float
    latency_s: float


KINDS = {"nvlink": LinkKind(0.8, 0.6e-6), "pcie": LinkKind(0.625, 1.0e-6),
         "network": LinkKind(0.8, 5.0e-6), "direct": LinkKind(1.0, 0.0)}


class LinkError(ValueError):
    """A link that cannot be priced: a figure out of range, or a device with no link where
    one is needed (one line: which figure to give)."""


@dataclass(frozen=True, slots=True)
class Link:
    """A link: raw bandwidth in B/s one way, energy in pJ/bit (None: unknown, 0 J charged),
    and what a transfer achieves on it (`KINDS`): `Link(50e9, 5.0)` is a link given by its
    two figures; `of_kind` makes one of a named kind."""

    bandwidth: float
    pj_per_bit: float | None = None
    kind: str = field(default="direct", kw_only=True)
    efficiency: float = field(default=1.0, kw_only=True)
    latency_s: float = field(default=0.0, kw_only=True)

    def __post_init__(self):
        if not _finite(self.bandwidth) or self.bandwidth <= 0:
            raise LinkError(f"a link's bandwidth must be a finite number of B/s > 0, "
                            f"got {self.bandwidth!r:.40}")
        if self.pj_per_bit is not None and (not _finite(self.pj_per_bit) or self.pj_per_bit < 0):
            raise LinkError(f"a link's energy must be a finite number of pJ/bit >= 0 (or "
                            f"unknown), got {self.pj_per_bit!r:.40}")
        if self.kind not in KINDS:
            raise LinkError(f"unknown kind of link {self.kind!r}; valid: {', '.join(KINDS)}")
        if not _finite(self.efficiency) or not 0 < self.efficiency <= 1:
            raise LinkError(f"a link's efficiency must be in (0, 1], got {self.efficiency!r:.40}")
        if not _finite(self.latency_s) or self.latency_s < 0:
            raise LinkError(f"a link's latency must be a finite number of s >= 0, "
                            f"got {self.latency_s!r:.40}")

    @classmethod
    def of_kind(cls, kind: str, bandwidth: float, pj_per_bit: float | None = None) -> "Link":
        """A link of `kind` (KINDS' efficiency and latency) of this bandwidth and energy."""
        k = KINDS[kind]
        return cls(bandwidth, pj_per_bit, kind=kind, efficiency=k.efficiency,
                   latency_s=k.latency_s)

    @property
    def busbw(self) -> float:
        """The bandwidth a transfer achieves: bandwidth x efficiency."""
        return self.bandwidth * self.efficiency


def _finite(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


# -- the price -----------------------------------------------------------------------------
def joules(nbytes, link: Link):
    """nbytes x 8 x the link's pJ/bit (0 where it is unknown); works on numpy arrays."""
    return nbytes * 8 * (link.pj_per_bit or 0.0) * PJ


def transfer(nbytes, link: Link, lanes: int = 1):
    """(seconds, joules) of moving nbytes over `lanes` such links side by side:
    nbytes / (lanes x busbw) + latency, nbytes x 8 x pJ/bit. Works on numpy arrays."""
    return nbytes / (lanes * link.busbw) + link.latency_s, joules(nbytes, link)


# -- which link ----------------------------------------------------------------------------
def nccl(spec) -> bool:
    """Whether `spec`'s device links are priced as NCCL achieves them: a GPU's (device type
    cuda, ROCm's included), not an UPMEM profile's. Any other device's are "direct": its
    file's figures, nothing assumed beside them."""
    return spec.device_type == "cuda" and getattr(spec, "profile", None) != "upmem"


def gpus_per_node(spec) -> int:
    """How many devices of `spec` one node holds (the spec's figure, else GPUS_PER_NODE)."""
    return int(spec.gpus_per_node or GPUS_PER_NODE)


def crosses_nodes(spec, ranks: int) -> bool:
    return ranks > gpus_per_node(spec)


def node_link(spec) -> Link:
    """The link between nodes of `spec`'s GPUs: its node link figures, else NODE_LINK_BW."""
    return Link.of_kind("network", spec.node_link_bw or NODE_LINK_BW, spec.node_link_pj_per_bit)


def within(spec, ranks: int) -> Link:
    """The link a group of `ranks` devices of `spec` talks over (the module doc)."""
    if crosses_nodes(spec, ranks):
        return node_link(spec)
    kind = None if nccl(spec) else "direct"
    if getattr(spec, "interconnect_bw", None):
        return Link.of_kind(kind or "nvlink", spec.interconnect_bw, spec.interconnect_pj_per_bit)
    if getattr(spec, "host_to_device_bw", None) and spec.device_type not in ("cpu",):
        return Link.of_kind(kind or "pcie", spec.host_to_device_bw,
                            spec.host_to_device_pj_per_bit)
    raise LinkError(f"device {spec.name!r} has no link to another device to run "
                    f"collectives over: give interconnect_GBs (NVLink) or "
                    f"host_to_device_bw_GBs (PCIe) in its YAML entry")


def stage_links(spec, tp: int, pp: int) -> list[Link]:
    """The links a pipeline's PP - 1 hops take, one a hop: ranks numbered stage by stage
    (stage k's TP ranks are k TP .. (k + 1) TP - 1, as vLLM lays TP within a node and PP
    across), rank j of stage k sends to rank j of stage k + 1; a hop whose sends any cross
    a node boundary of `gpus_per_node(spec)` goes over the node link, else over the link
    of two ranks within a node (`within(spec, 2)`)."""
    per = gpus_per_node(spec)
    inside = None
    out = []
    for k in range(pp - 1):
        crosses = any((k * tp + j) // per != ((k + 1) * tp + j) // per for j in range(tp))
        if crosses:
            out.append(node_link(spec))
        else:
            inside = inside or within(spec, 2)
            out.append(inside)
    return out


def between(a, b) -> Link | None:
    """Two devices' direct link (the module doc); None when either has no device link."""
    ends = [s.device_link_bw for s in (a, b)]
    if None in ends:
        return None
    pjs = [s.device_link_pj_per_bit for s in (a, b)]
    kind = "nvlink" if nccl(a) and nccl(b) else "direct"
    return Link.of_kind(kind, min(ends), None if None in pjs else sum(pjs) / 2)


def pool_end(spec) -> Link:
    """One serving pool's end of the link between pools: a GPU's node link (it has a GPU
    fabric: interconnect_bw), else its host link as PCIe; LinkError for neither."""
    if getattr(spec, "interconnect_bw", None) and spec.device_type != "cpu":
        return node_link(spec)
    if getattr(spec, "host_to_device_bw", None) and spec.device_type != "cpu":
        return Link.of_kind("pcie", spec.host_to_device_bw, spec.host_to_device_pj_per_bit)
    raise LinkError(f"device {spec.name!r} has no link to move KV caches between pools: give "
                    "interconnect_GBs or host_to_device_bw_GBs in its YAML entry")


def pool_link(a, b) -> Link:
    """The link between two pools: the slower end's bandwidth (and its kind's efficiency),
    the larger latency, the mean pJ/bit (unknown when either end's is)."""
    ends = pool_end(a), pool_end(b)
    pj = None if None in (e.pj_per_bit for e in ends) else sum(e.pj_per_bit for e in ends) / 2
    slow = min(ends, key=lambda e: e.busbw)
    return Link(slow.bandwidth, pj, kind=slow.kind, efficiency=slow.efficiency,
                latency_s=max(e.latency_s for e in ends))


def host_link(spec, direction: str) -> Link | None:
    """`spec`'s link to its host, "host_to_device" or "device_to_host" ("direct": UPMEM's
    simulator's rule); None when the spec has no bandwidth that way."""
    bw = getattr(spec, f"{direction}_bw", None)
    if not bw:
        return None
    return Link.of_kind("direct", bw, getattr(spec, f"{direction}_pj_per_bit", None))


def host_link_s(spec, to_device, to_host):
    """Seconds of moving `to_device` bytes in and `to_host` bytes out over `spec`'s host
    link (`host_link`'s "direct" rule; a direction with no bandwidth costs 0), with no Link
    built: a serving step prices it every step. Works on numpy arrays."""
    direct = KINDS["direct"]
    seconds = 0.0
    for nbytes, bw in ((to_device, spec.host_to_device_bw), (to_host, spec.device_to_host_bw)):
        if bw:
            seconds = seconds + nbytes / (bw * direct.efficiency) + direct.latency_s
    return seconds
