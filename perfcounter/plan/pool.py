"""A device pool: the GPUs a deployment search may use, by kind, with their hourly price.

    --devices h100-sxm:8                      eight H100 SXM
    --devices h100-sxm:8,a100-sxm4-80gb:8     two kinds (a candidate runs on one kind, or
                                              prefills on one and decodes on the other)

Each kind is a registry name (or a YAML path) and a count from 1 to serve's MAX_GPUS
(2^20, serve/replicas.py) in ASCII digits. Its price a GPU-hour is the registry's sourced
`usd_per_hour` (serve/api.py listed_price), or `--usd_per_hour` (within the device files'
range, serve/metrics.py check_prices), which then prices every kind alike. Bad input raises
PlanError naming the value and what is valid, before any work.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from perfcounter.serve.api import listed_price, resolve_spec
from perfcounter.serve.errors import ServeError
from perfcounter.serve.metrics import check_prices
from perfcounter.serve.replicas import MAX_GPUS


class PlanError(ServeError):
    """Bad input to the deployment search (one line: the value and what is valid)."""


@dataclass(frozen=True)
class DeviceKind:
    """`count` GPUs of one kind: its registry name, spec and price a GPU-hour."""

    name: str  # as given (a registry name or a YAML path)
    count: int
    spec: object  # devices.DeviceSpec at the search's dtype
    usd_per_hour: float | None  # a GPU-hour (None: no price listed nor given)
    usd_source: str | None


def parse_devices(text, dtype: torch.dtype = torch.bfloat16,
                  usd_per_hour: float | None = None) -> list[DeviceKind]:
    """'h100-sxm:8,a100-sxm4-80gb:8' -> [DeviceKind, ...] (module doc); PlanError else."""
    try:
        check_prices(usd_per_hour)
    except ServeError as e:
        raise PlanError(str(e)) from None
    kinds: list[DeviceKind] = []
    for part in str(text or "").split(","):
        name, sep, count = part.strip().rpartition(":")
        count = count.strip()
        if not sep or not name or not count.isascii() or not count.isdigit() or int(count) < 1:
            raise PlanError(f"--devices {text!r}: expected KIND:COUNT[,KIND:COUNT] such as "
                            f"h100-sxm:8 (a count >= 1 after each device), got {part.strip()!r}")
        if int(count) > MAX_GPUS:
            raise PlanError(f"--devices {text!r}: {int(count):,} GPUs of {name}; at most "
                            f"{MAX_GPUS:,} GPUs of a kind")
        try:
            spec = resolve_spec(name, dtype)
        except ServeError as e:
            raise PlanError(f"--devices: {e}") from None
        if not (name.endswith((".yaml", ".yml")) or "/" in name):
            name = spec.name  # an alias ("h100") as the registry names it
        if any(k.name == name for k in kinds):
            raise PlanError(f"--devices {text!r}: {name} is named twice; give its count once")
        if not spec.vram:
            raise PlanError(f"--devices: {spec.name} has no memory size (vram_GB) to hold a "
                            "model; give a device whose YAML entry lists one")
        price, source = (usd_per_hour, "--usd_per_hour") if usd_per_hour is not None \
            else listed_price([(spec, spec.name)])
        kinds.append(DeviceKind(name, int(count), spec, price, source))
    return kinds


def kind_named(kinds: list[DeviceKind], name: str) -> DeviceKind:
    for kind in kinds:
        if kind.name == name:
            return kind
    raise PlanError(f"device {name!r} is not in the pool; the pool holds "
                    f"{', '.join(k.name for k in kinds)}")
