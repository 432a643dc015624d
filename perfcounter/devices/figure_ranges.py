"""Each device figure's plausible range, in a device file's units (devices/schema.py reads
them): a figure outside it is refused with its range named.

    out_of_range("bandwidth_GBs", 1e-300)   # ("bandwidth_GBs", 1e-300, "GB/s in [0.01, 1e+06] ...")
"""
from __future__ import annotations

# each figure's plausible range, in the file's units, both ends included: from a
# microcontroller to well past any part there is (the shipped files span 0.10-9,000 TFLOP/s,
# 0.6-39,322 GB/s, 8-256 GB, 0.4-85 pJ/FLOP, 0.95-1,920 pJ/bit). A figure outside it is a
# slip of units or a typo, and one that would print nonsense (1e-300 GB/s: 300-digit times;
# 1e300 pJ/FLOP: energies past a float's range)
_GBS, _PJ = (1e-2, 1e6, "GB/s"), (1e-3, 1e5, "pJ")
RANGES = {
    "bandwidth_GBs": _GBS, "mem_bw_GBs": _GBS, "host_to_device_bw_GBs": _GBS,
    "device_to_host_bw_GBs": _GBS, "device_link_GBs": _GBS, "interconnect_GBs": _GBS,
    "node_link_GBs": _GBS, "node_link_pj_per_bit": (0, 1e5, "pJ per bit"),
    "gpus_per_node": (1, 1e5, "devices"),
    "vram_GB": (1e-3, 1e6, "GB"), "cache_MB": (1e-3, 1e6, "MB"),
    "tflops": (1e-6, 1e6, "TFLOP/s"), "tflops_int4": (1e-6, 1e6, "TFLOP/s"),
    "pj_per_flop": (1e-3, 1e5, "pJ per FLOP"), "pj_per_tflop": (1e9, 1e17, "pJ per TFLOP"),
    "mem_pj_per_bit": (*_PJ[:2], "pJ per bit"),
    "host_to_device_pj_per_bit": (0, 1e5, "pJ per bit"),
    "device_to_host_pj_per_bit": (0, 1e5, "pJ per bit"),
    "device_link_pj_per_bit": (0, 1e5, "pJ per bit"),
    "interconnect_pj_per_bit": (0, 1e5, "pJ per bit"),
    "softmax_ns_per_element": (1e-6, 1e6, "ns per element"),
    "SiLU_ns_per_element": (1e-6, 1e6, "ns per element"),
    "silu_ns_per_element": (1e-6, 1e6, "ns per element"),
    "RMSNorm_ns_per_element": (1e-6, 1e6, "ns per element"),
    "rmsnorm_ns_per_element": (1e-6, 1e6, "ns per element"),
    "tdp_W": (1e-3, 1e6, "W"), "static_W": (0, 1e6, "W"), "idle_W": (0, 1e6, "W"),
    "usd_per_hour": (0, 1e5, "USD an hour"),
    "op_overhead_us": (0, 1e7, "µs"),
}


def out_of_range(key: str, value) -> tuple[str, float, str] | None:
    """(the field, its value, what is expected) where a figure of RANGES — a number, or a
    {dtype or key: number} map — lies outside its range; None where it lies within. What
    is not a number is left for DeviceSpec to refuse."""
    lo, hi, unit = RANGES[key]
    items = value.items() if isinstance(value, dict) else [(None, value)]
    for name, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not lo <= v <= hi:  # NaN fails both
            return (key if name is None else f"{key}.{name}", v,
                    f"{unit} in [{lo:g}, {hi:g}] (a plausible range)")
    return None
