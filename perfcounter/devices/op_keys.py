"""The names a device's prediction figures are keyed by (DeviceSpec's op_overhead_s,
op_efficiency, op_curves and matmul_rows; predict.py prices by them), and the programs a
prediction prices (EXECUTIONS), each named here once.
"""
from __future__ import annotations

# the op classes a prediction prices apart (predict.py)
OP_CLASSES = ("gemv", "gemm", "attention", "elementwise", "reduction", "indexing", "strided")
# the programs a prediction prices, named here once: the op_overhead_s keys below start with
# them, and pricing/regimes.py's REGIMES adds the bound to them (its check_regime checks both)
EXECUTIONS = ("eager", "compiled", "cudagraphs")
# op_efficiency keys: a class, or a GEMV by its weight's dtype (weight-only int8 / int4 kernels,
# fp8 x fp8: W8A8)
EFFICIENCY_CLASSES = (*OP_CLASSES, "gemv_int8", "gemv_int4", "gemv_fp8")
# op_overhead_s keys: an execution, or "eager_cold": eager when each layer's weights have just
# streamed through the caches (a model larger than the cache), which evicts the Python and
# dispatcher state the next op needs (a CPU's: a GPU streams its weights through its own memory),
# or "compiled_step": seconds a compiled step costs the host beside its kernel launches (the
# compiled program's entry: guards, the wrapper's Python; measured on a GPU),
# or "kernel": a GPU kernel's fixed device time beside its bytes and FLOPs (one of a CUDA
# graph's tiny kernels; pricing/achievable.kernel_s),
# or "gemv_row_<dtype>" / "gemv_row16_<dtype>": seconds per weight row of a matmul of 1 / 16
# activation rows (op_rates.gemv_row_seconds),
# or "eager_<dtype>": eager per op call of a program computing in a dtype other than float32
# (its figure where "eager" is float32's; overheads.dtype_timers),
# or "compiled_dynamic" / "compiled_dynamic_step": compiled and compiled_step of a program
# compiled for any input length (dynamic=True: a prefill; overheads.dynamic_timers)
ROW_DTYPES = ("float32", "bfloat16", "float16")
OVERHEADS = (*EXECUTIONS, "eager_cold", "compiled_step", "kernel", "compiled_dynamic",
             "compiled_dynamic_step",
             *(f"gemv_row{m}_{d}" for m in ("", "16") for d in ROW_DTYPES),
             *(f"eager_{d}" for d in ROW_DTYPES if d != "float32"))


def row_key(dtype: str, m: int) -> str:
    """The op_overhead_s key of the time per weight row at M = m (1 or 16) activation rows."""
    return f"gemv_row{'' if m == 1 else m}_{dtype}"


def row_table(overheads: dict) -> dict[str, dict[int, float]]:
    """{dtype: {M: s per weight row}} from op_overhead_s (the inverse of row_key)."""
    out: dict[str, dict[int, float]] = {}
    for key, s in overheads.items():
        if key.startswith("gemv_row"):
            m, dtype = key[len("gemv_row"):].split("_", 1)
            out.setdefault(dtype, {})[int(m or 1)] = s
    return out
CURVE_POINT = ("working_set_bytes", "warm_bytes_per_s", "cold_bytes_per_s", "flops_per_s")
