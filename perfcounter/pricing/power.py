"""What a device draws while it runs, and the energy of a run as the integral of that power.

    P(a step)          = min(cap, static + activity)      activity = dynamic J / the step's seconds
    P(an idle stretch) = static
    J(a run)           = Σ_steps P(step) · seconds  +  static · idle seconds        (= ∫ P dt)

`dynamic J` is what the kernels move and compute, priced by pricing/energy.py (executed FLOPs
x pJ/FLOP, bytes x 8 x memory pJ/bit, host-link and collective bits x their pJ/bit). The cap
applies step by step: a step whose static + activity would exceed it draws the cap for its
seconds (J = cap x seconds). A step of no time has no time to cap over: its J is its dynamic J.

Two models, one per device (model_of):

- POWER, a GPU whose entry gives `idle_W`: static = idle_W, the board's draw with a model
  loaded and its clocks up but no kernel running (nvidia-smi at P0 with a CUDA context, 0 %
  utilisation: what a serving engine's GPU draws between steps; device_specs/nvidia.yaml
  gives each figure its source), cap = tdp_W, the board's power limit (None where the entry
  has none). An idle-heavy run (a small batch, a step shorter than its idle stretches) pays
  the static watts over its whole duration, so it costs more per token than a busy one.
- DYNAMIC, every other device: static = static_W (0 where the entry gives none), no cap;
  perfcounter's model before the power model, and the one the PIM parts keep (device_type
  pim, and the UPMEM LLM framework's profiles, `profile: upmem`, whose figures reproduce
  that framework's and the PIM paper's J/token, whatever an entry says of idle_W).

NB: activity here is the dynamic energy the counts price and nothing else: no power-vs-
utilisation relation is added (none was found in a cited measurement that applies here), so
on a GPU what the kernels do on chip beyond those pJ figures is not in it (the docs, docs/serve.md
"Energy and power", and benchmarks/bench_power.py say how far that leaves a prediction from
measured serving power).
"""
from __future__ import annotations

from typing import NamedTuple

POWER, DYNAMIC = "power", "dynamic"
ENERGY_MODELS = (POWER, DYNAMIC)


class Power(NamedTuple):
    """A device's power figures as the model that applies to it reads them (W)."""

    model: str  # POWER or DYNAMIC
    static_w: float  # drawn at every instant, busy or idle
    cap_w: float | None  # the most it draws while busy (POWER: tdp_W); None: no cap


def model_of(spec) -> str:
    """POWER for a device with an idle figure that is no PIM part nor UPMEM profile, else
    DYNAMIC (the module doc)."""
    pim = spec.device_type == "pim" or getattr(spec, "profile", None) == "upmem"
    return POWER if getattr(spec, "idle_w", None) is not None and not pim else DYNAMIC


def power_of(spec) -> Power:
    """`spec`'s static watts and cap under its model."""
    if model_of(spec) == POWER:
        return Power(POWER, float(spec.idle_w), spec.tdp_w)
    return Power(DYNAMIC, float(spec.static_w or 0.0), None)


def step_joules(dynamic_j: float, seconds: float, power: Power) -> float:
    """J of one busy stretch of `seconds` doing `dynamic_j` of work on one device: static x
    seconds + dynamic, at most cap x seconds."""
    joules = power.static_w * seconds + dynamic_j
    if power.cap_w is not None and seconds > 0:
        joules = min(joules, power.cap_w * seconds)
    return joules


def idle_joules(seconds: float, static_w: float) -> float:
    """J of `seconds` with nothing running, drawing `static_w` (no stretch is negative)."""
    return static_w * max(0.0, seconds)


def mean_power_w(joules: float | None, seconds: float | None) -> float | None:
    """Average power: joules / seconds; None where either is unknown or no time passed."""
    if joules is None or not seconds or seconds <= 0:
        return None
    return joules / seconds


__all__ = ["DYNAMIC", "ENERGY_MODELS", "POWER", "Power", "idle_joules", "mean_power_w",
           "model_of", "power_of", "step_joules"]
