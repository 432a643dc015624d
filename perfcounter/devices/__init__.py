"""Devices: what a device can do (spec), its YAML files (schema to read, spec_file to
write), the registry of known devices (registry) and this machine measured (calibrate,
op_rates).

    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    spec = get_device_spec("my_accels.yaml:PIM_AI_4chip")
    spec = CUDADeviceSpec(dtype=torch.bfloat16)   # from torch.cuda.get_device_name()

Imports run one way: spec <- schema <- spec_file <- registry <- calibrate. Calibration runs
models under the counting mode, so devices sits above counting and models.
"""
from perfcounter.devices.dtypes import (TF32, DeviceSpecError, UnknownDeviceError,
                                        UnknownDtypeError, as_dtype, dtype_name)
from perfcounter.devices.registry import (CUDADeviceSpec, calibrated_spec_path, default_device_spec,
                                          find_cuda_device_spec, get_device_spec, list_device_specs,
                                          perfcounter_home, register_device_specs,
                                          shipped_spec_files)
from perfcounter.devices.schema import load_device_specs
from perfcounter.devices.spec import DeviceSpec
from perfcounter.devices.spec_file import write_device_specs

__all__ = ["CUDADeviceSpec", "DeviceSpec", "DeviceSpecError", "TF32", "UnknownDeviceError",
           "UnknownDtypeError", "as_dtype", "calibrated_spec_path", "default_device_spec",
           "dtype_name", "find_cuda_device_spec", "get_device_spec", "list_device_specs",
           "load_device_specs", "perfcounter_home", "register_device_specs",
           "shipped_spec_files", "write_device_specs"]
