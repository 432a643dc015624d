"""Steps under a placement mapping (`--mapping`): the seam is here, the pricing not yet.

A placement prices a step's whole trace with `perfcounter.simulate` (each module on its
device, transfers where the device changes). What the step table lacks for it is each
module's per-call input and output bytes (ModuleInfo) as a function of the step's
features, which simulate needs for its transfers; until then a mapping is refused in
one line rather than priced wrongly.
"""
from __future__ import annotations

from perfcounter.serve.errors import ServeError


class PlacementPricer:
    """A step priced under a mapping by perfcounter.simulate (not available yet)."""

    def __init__(self, mapping, host=None, **options):
        raise ServeError(f"--mapping {mapping}: serving steps under a placement is not priced "
                         "yet (the step table has no per-module transfer sizes); price the "
                         "placement of one generation with `perfcounter simulate`")
