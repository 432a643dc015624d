"""perfcounter: what one LLM inference costs, and where it goes.

Counts every aten op inside `with counter.count("prefill")` blocks — FLOPs by
kind, bytes by role (weights, KV cache, activations) — and prices the trace on
any device of the registry: roofline latency, utilization, energy.
Names are imported lazily so that `import perfcounter` stays cheap.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "PerformanceCounterMode": "mode",
    "TransformerPerformanceCounter": "counter",
    "PerformanceStats": "stats",
    "DeviceSpec": "devices",
    "CUDADeviceSpec": "devices",
    "get_device_spec": "devices",
    "list_device_specs": "devices",
    "default_device_spec": "devices",
    "OpRecord": "trace",
    "Trace": "trace",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"perfcounter.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'perfcounter' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
