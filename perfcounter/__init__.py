"""perfcounter: what one LLM inference costs, and where it goes.

Counts every aten op inside `with counter.count("prefill")` blocks — FLOPs by
kind, bytes by role (weights, KV cache, activations) — and prices the trace on
any device of the registry: roofline latency, utilization, energy.
"""
from perfcounter._util import VERSION
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.devices import (CUDADeviceSpec, DeviceSpec, default_device_spec, get_device_spec,
                                 list_device_specs)
from perfcounter.generation.config_only import count_config
from perfcounter.simulation.run import Simulation, simulate
from perfcounter.stats import PerformanceStats
from perfcounter.timer import CUDAPerformanceTimer, PerformanceTimer, total_model_params
from perfcounter.trace import OpRecord, Trace

__version__ = VERSION

__all__ = ["CUDADeviceSpec", "CUDAPerformanceTimer", "DeviceSpec", "OpRecord",
           "PerformanceCounterMode", "PerformanceStats", "PerformanceTimer", "Simulation", "Trace",
           "TransformerPerformanceCounter", "count_config", "default_device_spec",
           "get_device_spec", "list_device_specs", "simulate", "total_model_params"]
