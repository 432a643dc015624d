"""The error serve raises for bad input: a ValueError with a message fit for one line."""
from __future__ import annotations


class ServeError(ValueError):
    """Bad serving input (a workload, an option, a trace file, a deployment that cannot fit);
    `perfcounter serve` prints its message on one line and exits with code 2."""
