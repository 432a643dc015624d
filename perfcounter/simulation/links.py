"""Which link a placement's transfer or tensor-parallel all-reduce uses: the options a
simulation was given (they override the devices' own figures), else pricing/links.py's rule
on the devices' specs. The link and its price are pricing/links.py's (`Link`, `transfer`);
this file adds the options and a warning, once per link and simulation, for a link with no
pJ/bit (its transfers cost time but 0 J).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from perfcounter._util import PerfcounterWarning
from perfcounter.pricing import links
from perfcounter.pricing.links import Link
from perfcounter.simulation.placement import Device

__all__ = ["Link", "Links"]


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
        """The device<->device link: the fabric given, else links.between on both specs
        (None: via the host)."""
        if self.device_link is not None:
            return self._priced(self.device_link, "the device_link option")
        return self._priced(links.between(src.spec, dst.spec),
                            f"the device link {src.spec.name}<->{dst.spec.name}")

    def within(self, dev: Device) -> Link | None:
        """The interconnect of a tensor-parallel group: the one given, else links.within on
        the spec's interconnect (None: the spec has none; its all-reduces go via the host)."""
        if self.interconnect is not None:
            return self._priced(self.interconnect, "the interconnect option")
        if dev.spec.interconnect_bw is None:
            return None
        return self._priced(links.within(dev.spec, dev.tp), f"the interconnect of {dev.spec.name}")
