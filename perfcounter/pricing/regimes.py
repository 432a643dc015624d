"""The regimes a step is priced in, named once: "bound" (the least any regime can take) and
the programs a prediction prices (devices/op_keys.py's EXECUTIONS: eager, compiled,
cudagraphs), with the one check of a regime's name. price.py's module doc says what each
charges."""
from __future__ import annotations

from perfcounter.devices.op_keys import EXECUTIONS

REGIMES = ("bound", *EXECUTIONS)  # the bound, then the programs a prediction prices


def check_regime(execution, *, bound: bool = True) -> str:
    """execution itself when it is one of REGIMES (bound=False: of EXECUTIONS, the programs a
    prediction prices); else a ValueError naming the value and the valid ones. The one check
    of a regime's name: the others (serve's ServeError, generate's flags) wrap it."""
    valid = REGIMES if bound else EXECUTIONS
    if execution not in valid:
        raise ValueError(f"unknown execution {execution!r}; valid: {', '.join(valid)}")
    return execution
