"""Devices: what a device can do (spec), its YAML files (schema), the registry of
known devices (registry) and this machine measured (calibrate).

    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    spec = get_device_spec("my_accels.yaml:PIM_AI_4chip")
    spec = CUDADeviceSpec(dtype=torch.bfloat16)   # from torch.cuda.get_device_name()

Imports run one way: spec <- schema <- registry <- calibrate.
"""
from perfcounter.devices.registry import (CUDADeviceSpec, calibrated_spec_path,
                                          default_device_spec, find_cuda_device_spec,
                                          get_device_spec, list_device_specs,
                                          perfcounter_home, register_device_specs,
                                          shipped_spec_files)
from perfcounter.devices.schema import load_device_specs, write_device_specs
from perfcounter.devices.spec import (TF32, DeviceSpec, DeviceSpecError, UnknownDeviceError,
                                      UnknownDtypeError, as_dtype, dtype_name)

__all__ = ["CUDADeviceSpec", "DeviceSpec", "DeviceSpecError", "TF32", "UnknownDeviceError",
           "UnknownDtypeError", "as_dtype", "calibrated_spec_path", "default_device_spec",
           "dtype_name", "find_cuda_device_spec", "get_device_spec", "list_device_specs",
           "load_device_specs", "perfcounter_home", "register_device_specs",
           "shipped_spec_files", "write_device_specs"]
