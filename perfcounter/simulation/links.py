"""Links between devices: the device<->device fabric and a tensor-parallel group's interconnect.

A `Link` is a bandwidth (B/s) and an energy (pJ/bit; None: unknown, 0 J charged, said once
per link and simulation). `Links` holds the options a simulation was given, which override
the devices' own figures, and answers which link two devices, or one group, use.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from perfcounter._util import PerfcounterWarning
from perfcounter.simulation.placement import Device, MappingError


@dataclass(frozen=True, slots=True)
class Link:
    """A link: bandwidth in B/s and energy in pJ per bit (None: unknown, 0 J charged)."""

    bw: float
    pj_per_bit: float | None = None

    def __post_init__(self):
        if isinstance(self.bw, bool) or not isinstance(self.bw, (int, float)) \
                or not math.isfinite(self.bw) or self.bw <= 0:
            raise MappingError(f"a link's bandwidth must be a finite number of B/s > 0, "
                               f"got {self.bw!r:.40}")
        if self.pj_per_bit is not None and (
                isinstance(self.pj_per_bit, bool) or not isinstance(self.pj_per_bit, (int, float))
                or not math.isfinite(self.pj_per_bit) or self.pj_per_bit < 0):
            raise MappingError(f"a link's energy must be a finite number of pJ/bit >= 0 (or "
                               f"unknown), got {self.pj_per_bit!r:.40}")


@dataclass(frozen=True, slots=True)
class Links:
    """The links a simulation may use besides each device's host link: the options given
    (they override the specs' figures), else each DeviceSpec's own (see the module doc)."""

    device_link: Link | None = None  # one fabric between all non-host devices
    interconnect: Link | None = None  # within a tensor-parallel group
    warned: set = field(default_factory=set, compare=False, repr=False)  # links without pJ/bit

    def _priced(self, link: Link | None, what: str) -> Link | None:
        """The link, with a warning (once per link and simulation) when it has no pJ/bit."""
        if link is not None and link.pj_per_bit is None and what not in self.warned:
            self.warned.add(what)
            warnings.warn(f"{what} has no pJ/bit: its transfers cost time but 0 J",
                          PerfcounterWarning, stacklevel=4)
        return link

    def between(self, src: Device, dst: Device) -> Link | None:
        """The device<->device link: the fabric given, else both specs' figures when both
        have one (the slower end's bandwidth, the mean pJ/bit), else None (via the host)."""
        if self.device_link is not None:
            return self._priced(self.device_link, "the device_link option")
        ends = [d.spec.device_link_bw for d in (src, dst)]
        if None in ends:
            return None
        pjs = [d.spec.device_link_pj_per_bit for d in (src, dst)]
        return self._priced(Link(min(ends), None if None in pjs else sum(pjs) / 2),
                            f"the device link {src.spec.name}<->{dst.spec.name}")

    def within(self, dev: Device) -> Link | None:
        """The interconnect of a tensor-parallel group: the one given, else the spec's."""
        if self.interconnect is not None:
            return self._priced(self.interconnect, "the interconnect option")
        if dev.spec.interconnect_bw is None:
            return None
        return self._priced(Link(dev.spec.interconnect_bw, dev.spec.interconnect_pj_per_bit),
                            f"the interconnect of {dev.spec.name}")
