"""Achievable rates and fixed costs on a device, for predictions (predict.py): per op class,
dtype and working set, from the spec's measured curves, its sourced efficiencies, or the
stated defaults below; the fixed cost of an op call by execution regime; matmul FLOP/s by
rows; a GEMV's cost per weight row.

Where each figure comes from, in this order: measured (`perfcounter calibrate`: op_curves,
matmul_rows, op_overhead_s), sourced (a device's `op_efficiency` / `op_overhead_us` in
device_specs/*.yaml, each with its `source:`), else DEFAULT_EFFICIENCY / DEFAULT_OVERHEAD_S
(stated here, with what they rest on): never a silent 100 %.
"""
from __future__ import annotations

import bisect
import warnings
from dataclasses import dataclass, replace

from perfcounter._util import PerfcounterWarning
from perfcounter.devices.op_rates import interpolate, row_seconds
from perfcounter.devices.spec import EFFICIENCY_CLASSES, EXECUTIONS, row_table
from perfcounter.pricing.regimes import check_regime
from perfcounter.pricing.roofline import is_integer_dtype, peak_flops

# Stated defaults for a spec that gives neither curves nor efficiencies: achievable / peak.
# Source: assumption of this project, not a measurement; typical of tuned libraries
# (vendor GEMM ~70 % of dense peak, streaming kernels ~80 % of bandwidth, attention and
# gathers below). A spec's own `op_efficiency` (with its source) replaces them.
# GEMV by weight dtype: a weight-only int8 / int4 kernel dequantizes in registers and streams
# its weight below a bf16 GEMV's rate. Source: inclusionAI/humming pull request 2
# (github.com/inclusionAI/humming/pull/2, H100, n = k = 8192, M = 1): torch w16a16
# 2.30 TFLOP/s, marlin w8a16 3.46, w4a16 4.98, i.e. kernels of 58.4, 38.8 and 27.0 us; less
# a kernel's fixed device time (DEFAULT_KERNEL_S, 2.7 us: these efficiencies price the
# stream, kernel_s the rest) their 134, 67 and 34 MB weights stream at 2.41, 1.86 and
# 1.38 TB/s: int8 at 0.77 and int4 at 0.58 of the bf16 stream; x the GEMV default 0.8.
# An fp8 GEMV (W8A8, fp8 x fp8: nothing dequantized, both operands fed to fp8 tensor cores)
# is not the weight-only int8 kernel: NVIDIA/cutlass issue 1139 (github.com/NVIDIA/cutlass/
# issues/1139, H100, e4m3 x e4m3, M = 16-64, N = 14336, K = 4096): the best CUTLASS kernels
# stream ~2.2 TB/s (~68 % of HBM bandwidth by Nsight Compute): 58.7 MB of weight in 26.7 us,
# less the fixed 2.7 us 2.45 TB/s, 1.02 of the bf16 stream above; x the GEMV default 0.8.
# Elementwise on strided views ("strided": x[..., ::2] * cos, rotary's halves): memory moves
# whole cache lines (64 B on a CPU, 32 B sectors on a GPU), of which a stride-2 view uses half.
# A binary op on two such views and a dense output is counted 3 n elements (2 n read, n
# written) and moves 5 n (2 x 2 n read, n written): STRIDED_SHARE = 3 / 5 of the contiguous
# rate (rotary's multiplies ran 1.57x their contiguous-rate prediction on a Xeon, 1 / 1.57 =
# 0.64; docs/predictions.md), x the elementwise default 0.8 = 0.48. A calibration measures it.
STRIDED_SHARE = 3 / 5
DEFAULT_EFFICIENCY = {"gemv": 0.8, "gemm": 0.7, "attention": 0.5, "elementwise": 0.8,
                      "reduction": 0.6, "indexing": 0.3, "gemv_int8": 0.62, "gemv_int4": 0.46,
                      "gemv_fp8": 0.81, "strided": 0.8 * STRIDED_SHARE}
# Where a class streams its bytes at another share than it computes, by device_type: the bytes'
# side (DEFAULT_EFFICIENCY keeps the FLOPs'), as streams: a kernel's fixed device time
# (DEFAULT_KERNEL_S) is priced apart. A GPU's attention reads its KV cache as a stream: an
# H200's SDPA of one query over L keys (bfloat16, 8 heads of 64, a 128 MiB working set) ran
# 3,519 GB/s of its datasheet 4,800, a 38.1 us kernel; less the fixed 2.7 us, 3,787 GB/s: 0.79
# (`perfcounter calibrate` in benchmarks/gpu_check.py at aaf2a2b, docs/measured.md#on-a-gpu).
# A GPU's elementwise kernels stream at 0.9 of bandwidth: the same H200's add of 128 MiB ran
# 3,983 GB/s (33.7 us; less the fixed 2.7 us 4,330 GB/s: 0.90); copy kernels of
# github.com/xytpai/nvbench (README, global_memory_bandwidth, float4) read 1,379 of 1,555 GB/s
# on an A100-40GB (0.89) and 922 of 1,008 on an RTX 4090 (0.91); a100's own figure is 0.88.
# Measurements of three GPUs applied to every GPU; the GEMV keeps its default 0.8 (an H100's
# torch GEMV streamed 0.72 of bandwidth, the H200's 0.87: two sources apart), attention's
# FLOPs the 0.5 assumed of a fused kernel.
DEFAULT_STREAM_EFFICIENCY = {"cuda": {"attention": 0.79, "elementwise": 0.9}}
WEIGHT_CLASSES = ("gemv_int8", "gemv_int4", "gemv_fp8")  # a GEMV priced by its weight's dtype
# Stated default fixed costs, seconds, by device_type and execution. CPU: assumption of this
# project; eager: 1.8-2.6 us of dispatch per tiny aten op measured on a 2-core Xeon (issue 16),
# plus module Python; compiled: per kernel, one generated-code call. GPU eager: assumption, a
# kernel launch (~5 us) plus dispatch (an H200's calibrations measured 5.8 and 7.9 us per op
# call of a tiny model's decode step). GPU compiled: per kernel, torch.compile's launch of one
# generated kernel from its Python wrapper, 15 us, and per step its entry (guards, the
# wrapper: DEFAULT_STEP_S) 69 us: calibrate's tiny compiled decode step at 2 and 8 layers
# (benchmarks/gpu_check.py, docs/measured.md#on-a-gpu), the host's fast state in three calls on
# two cards, a launch 12.3 and 16.8 us on an H200 (at aaf2a2b, 9649e8d) and 15.1 on an H100 (at
# 3ed63a7), the middle kept; a step's entry 57, 194 and 60 us, the 69 of the first call kept; an
# engine that launches from C++ (a TensorRT engine, llama.cpp) pays less, which its spec's
# own figures state. cudagraphs: per STEP, one graph launch and its host sync (assumption;
# the H200 measured 9.7 and 18.2 us), no launch per kernel.
DEFAULT_OVERHEAD_S = {"cpu": {"eager": 3e-6, "compiled": 1e-6, "cudagraphs": 2e-5},
                      "cuda": {"eager": 8e-6, "compiled": 1.5e-5, "cudagraphs": 2e-5}}
DEFAULT_STEP_S = {"cuda": 6.9e-5}  # a compiled step's entry (compiled_step); none on a CPU
# What a program compiled for any input length (dynamic=True: generate.py's and gpt-fast's
# prefill) costs a GPU's host beyond the static step's figures, a launch and a step: the tiny
# model's fit on an H100, 15.0 us a launch and 170 us a step at 8 tokens against 13.2 and 136
# static (benchmarks/bench_compiled_prefill.py at d36fdf7, docs/measured.md#on-a-gpu). Where a
# calibration measured the dynamic program (compiled_dynamic), its own figures. None on a CPU,
# whose compiled prefill its kernels bind.
DEFAULT_DYNAMIC_S = {"cuda": {"compiled": 1.8e-6, "compiled_step": 3.4e-5}}
# A GPU kernel's fixed device time, seconds: each kernel, however small, occupies the device for
# its launch on the device, its blocks' scheduling, its first loads' latency and its tail,
# beside its bytes and FLOPs (which the efficiencies above price as streams). Source: an H200's
# CUDA-graph decode steps, where the host launches nothing per kernel and the weights stream in
# a small share of the step: the SmolLM2-135M shape ran 1.06 ms a step and a 1.04B Llama 1.11
# ms, against 0.091 and 0.563 ms for their bytes, FLOPs and graph launch at the defaults above,
# over 363 and 195 kernels: 2.67 and 2.81 us a kernel, 2.7 (gpu_check.py at aaf2a2b,
# docs/measured.md#on-a-gpu; `python benchmarks/bench_kernel_time.py`); that run's calibration
# timed a lone add of 64 KiB at 3.3 us of device time. A spec's own `kernel` overhead (measured
# by calibrate on a GPU: a CUDA graph of tiny kernels replayed) replaces it; a measured curve
# already holds it (its small working sets take that long), so only rates from efficiencies or
# defaults pay it (kernel_s).
DEFAULT_KERNEL_S = {"cuda": 2.7e-6}
CALIBRATED = "perfcounter calibrate"  # what the source of a measured spec says
# devices whose host queues kernels ahead of them (a GPU, an accelerator): a step's time is the
# longer of the host's dispatch and the device's work (predict.py); elsewhere (cpu, pim, mobile)
# the ops run one after another on the thread that dispatches them
ASYNCHRONOUS = ("cuda", "mps", "tpu")


@dataclass(frozen=True, slots=True)
class Rate:
    """Achievable rates of one op class at one dtype and working set, and where they came from."""

    flops_per_s: float
    warm_bytes_per_s: float
    cold_bytes_per_s: float
    basis: str  # "curve", "efficiency", "default", "peak"


_warned: set[tuple[str, str]] = set()


def _warn_missing(spec, field: str, fallback: str) -> None:
    key = (str(spec.name), field)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"device {spec.name!r} has no {field} (a calibration from an older "
                      f"version?); predicting with {fallback}; rerun `perfcounter calibrate`",
                      PerfcounterWarning, stacklevel=4)


def is_calibrated(spec) -> bool:
    """True when the spec's figures were measured by `perfcounter calibrate`."""
    return CALIBRATED in str(spec.source.get("bandwidth", ""))


def measured_dtype(tables: dict, dtype: str) -> str | None:
    """The dtype whose measurements stand for `dtype`: itself when measured, else float32,
    else the first measured; None when nothing was."""
    if dtype in tables:
        return dtype
    return "float32" if "float32" in tables else next(iter(tables), None)


def rate(spec, cls: str, dtype: str, working_set: float) -> Rate:
    """Achievable rates of op class `cls` (or a GEMV by its weight's dtype: "gemv_int8",
    "gemv_int4", "gemv_fp8") in `dtype` at `working_set` bytes on `spec`. A quantized GEMV:
    the spec's own efficiency for it, else the float GEMV's measured curve (a calibration times
    float kernels only), else its stated default. Elementwise on strided views ("strided") without
    its own curve or efficiency: the contiguous elementwise rate x STRIDED_SHARE. At a stated
    default, a class's bytes stream at DEFAULT_STREAM_EFFICIENCY's share where it names the
    class for the device's type (a GPU's attention)."""
    if cls == "strided" and "strided" not in spec.op_curves \
            and "strided" not in spec.op_efficiency \
            and ("elementwise" in spec.op_curves or "elementwise" in spec.op_efficiency):
        r = rate(spec, "elementwise", dtype, working_set)
        return Rate(r.flops_per_s, r.warm_bytes_per_s * STRIDED_SHARE,
                    r.cold_bytes_per_s * STRIDED_SHARE, r.basis)
    if cls in WEIGHT_CLASSES and (cls in spec.op_efficiency or "gemv" not in spec.op_curves):
        e = spec.op_efficiency.get(cls, DEFAULT_EFFICIENCY[cls])
        peak = peak_flops(spec, "" if not dtype or is_integer_dtype(dtype) else dtype)
        return Rate(peak * e, spec.bandwidth * e, spec.bandwidth * e,
                    "efficiency" if cls in spec.op_efficiency else "default")
    cls = "gemv" if cls in WEIGHT_CLASSES else cls
    curves = spec.op_curves.get(cls)
    peak = peak_flops(spec, "" if not dtype or is_integer_dtype(dtype) else dtype)
    if curves:
        key = measured_dtype(curves, dtype)  # another dtype's: FLOP/s scaled by the peaks
        warm, cold, flops = interpolate(curves[key], max(working_set, 1.0))
        if cls == "gemm" and spec.op_curves.get("gemv"):  # a GEMM's bandwidths are the GEMV
            # curve's (op_rates._share) at every working set, also past the largest square
            # matmul timed (6 MiB in bfloat16): a linear layer's weight of 30 MB streams at the
            # GEMV's rate there, not at the 6 MiB point's (an H200: 3.8 against 0.8 TB/s)
            stream = spec.op_curves["gemv"]
            warm, cold, _ = interpolate(stream[measured_dtype(stream, dtype)],
                                        max(working_set, 1.0))
        if key != dtype and dtype and not is_integer_dtype(dtype):
            flops *= peak / peak_flops(spec, key)
        return Rate(flops, warm, cold, "curve")
    if cls in spec.op_efficiency:
        e, basis = spec.op_efficiency[cls], "efficiency"
    elif is_calibrated(spec):  # measured triad and matmul figures: already achievable
        _warn_missing(spec, "op_curves", "its measured triad bandwidth and matmul FLOP/s")
        e, basis = 1.0, "peak"
    else:
        e, basis = DEFAULT_EFFICIENCY[cls], "default"
    stream = DEFAULT_STREAM_EFFICIENCY.get(spec.device_type, {}).get(cls, e) \
        if basis == "default" else e
    return Rate(peak * e, spec.bandwidth * stream, spec.bandwidth * stream, basis)


def overhead(spec, execution: str, cold: bool = False, dtype: str | None = None) -> float:
    """Seconds of fixed cost per op call on `spec` when run `execution`; `cold`: the
    step streams its weights through the caches (the spec's eager_cold, where measured). On
    an asynchronous device (ASYNCHRONOUS) the weights stream through the device's memory, not
    the host's caches: the host's dispatch pays its warm figure (an H200's eager decode of a
    1B model: 8.0 us per op measured, against eager 7.9 and eager_cold 10.8 calibrated).
    `dtype`: the dtype the program computes in (program_dtype); eager in a dtype whose own
    figure the spec holds ("eager_<dtype>", calibrate's tiny step in that dtype) pays that
    figure, plus what the cold step adds to float32's (eager_cold - eager) where it is cold."""
    if execution not in EXECUTIONS:  # refused by the one check (price.py imports this module)
        check_regime(execution, bound=False)
    own = spec.op_overhead_s.get(f"eager_{dtype}") if execution == "eager" and dtype else None
    if cold and execution == "eager" and "eager_cold" in spec.op_overhead_s \
            and spec.device_type not in ASYNCHRONOUS:
        cold_s = spec.op_overhead_s["eager_cold"]
        if own is not None and "eager" in spec.op_overhead_s:
            return own + max(cold_s - spec.op_overhead_s["eager"], 0.0)
        return cold_s
    if own is not None:
        return own
    if execution in spec.op_overhead_s:
        return spec.op_overhead_s[execution]
    defaults = DEFAULT_OVERHEAD_S.get(spec.device_type, DEFAULT_OVERHEAD_S["cuda"])
    if is_calibrated(spec):
        _warn_missing(spec, "op_overhead_s", f"the stated default {defaults[execution] * 1e6:g} "
                      f"us per op ({execution})")
    return defaults[execution]


def program_dtype(records) -> str | None:
    """The dtype a program computes in, for its host's cost per call (overhead's `dtype`):
    the dtype of most of its op calls (a bfloat16 model's float32 norms are a few of them);
    None for no records. Metadata queries (prim.*) are no calls."""
    calls: dict[str, int] = {}
    for r in records:
        if not r.op.startswith("prim."):
            calls[r.dtype] = calls.get(r.dtype, 0) + max(r.calls, 1)
    return max(calls, key=calls.get) if calls else None


def vector_flops(spec, elementwise: Rate) -> float:
    """FLOP/s of the fused kernels' arithmetic. On an asynchronous device (a GPU) the vector
    units' float32 peak (a fused kernel computes in float32 on CUDA cores, tens of TFLOP/s):
    its fused kernels are bound by their bytes, and the elementwise curve's FLOP/s is an add's,
    bound by its bytes and by a kernel's fixed device time, which the bytes' side already pays
    (an H200's add of 64 KiB ran 2 GFLOP/s, its float32 peak is 51 TFLOP/s). Elsewhere the
    elementwise rate: a CPU runs generated elementwise code (exponentials, divisions,
    horizontal sums) far below its FMA peak, about as fast per FLOP as the add. The larger of
    the two."""
    if spec.device_type not in ASYNCHRONOUS:
        return elementwise.flops_per_s
    try:
        return max(float(spec.peak_flops("float32", strict=True)), elementwise.flops_per_s)
    except (KeyError, ValueError, TypeError):
        return max(float(spec.flops_per_s), elementwise.flops_per_s)


def compiled_step_s(spec) -> float:
    """Seconds a compiled step's entry costs the host on `spec` (guards, the wrapper's Python):
    the spec's `compiled_step`, else DEFAULT_STEP_S for its device type, else 0 (a CPU: its
    compiled step is priced by its kernels' calls alone)."""
    if "compiled_step" in spec.op_overhead_s:
        return spec.op_overhead_s["compiled_step"]
    return DEFAULT_STEP_S.get(spec.device_type, 0.0)


def dynamic_program(spec):
    """The spec a program compiled for any input length is priced on (a prefill compiled
    with dynamic=True): `compiled` and `compiled_step` replaced by the spec's compiled_dynamic
    figures, where a calibration measured them; else, where the spec states no compiled figure
    of its own (a registry entry: the stated defaults), the defaults plus DEFAULT_DYNAMIC_S's
    for its device type; else the spec itself (its own compiled figures: an engine's, or a
    calibration from before it timed the dynamic program)."""
    own = spec.op_overhead_s
    if "compiled_dynamic" in own:
        update = {"compiled": own["compiled_dynamic"],
                  "compiled_step": own.get("compiled_dynamic_step", compiled_step_s(spec))}
    elif "compiled" not in own and spec.device_type in DEFAULT_DYNAMIC_S:
        extra = DEFAULT_DYNAMIC_S[spec.device_type]
        update = {"compiled": overhead(spec, "compiled") + extra["compiled"],
                  "compiled_step": compiled_step_s(spec) + extra["compiled_step"]}
    else:
        return spec
    return replace(spec, op_overhead_s={**own, **update})


def kernel_s(spec, basis: str) -> float:
    """Seconds of device time one kernel costs on `spec` beside its bytes and FLOPs, for
    rates of `basis` (Rate.basis): none from a measured curve (its small working sets hold
    it) or off an asynchronous device (a CPU's op runs on the thread that calls it: its call
    overhead is the fixed cost); else the spec's `kernel` overhead, else DEFAULT_KERNEL_S for
    its device type (none stated for others: 0)."""
    if basis == "curve" or spec.device_type not in ASYNCHRONOUS:
        return 0.0
    if "kernel" in spec.op_overhead_s:
        return spec.op_overhead_s["kernel"]
    return DEFAULT_KERNEL_S.get(spec.device_type, 0.0)


def rows_flops(spec, dtype: str, rows: int) -> float | None:
    """FLOP/s of a matmul of `rows` rows on `spec`, from its measured `matmul_rows` for
    `dtype` (another dtype's scaled by the peaks when that one was not measured): linear
    in rows between the measured row counts, FLOP/s proportional to rows below the
    fewest (a few rows take as long as the fewest measured), the most rows' FLOP/s beyond
    them (a linear layer's layout, where the square matmul of the curves runs faster than
    any linear layer does); None without the table."""
    tables = spec.matmul_rows
    key = measured_dtype(tables, dtype)
    if key is None:
        return None
    table = tables[key]
    measured = sorted(table)
    i = bisect.bisect_left(measured, rows)
    if i == len(measured):
        flops = table[measured[-1]]
    elif measured[i] == rows:
        flops = table[rows]
    elif i == 0:
        flops = table[measured[0]] * rows / measured[0]
    else:
        lo, hi = measured[i - 1], measured[i]
        t_lo, t_hi = lo / table[lo], hi / table[hi]  # seconds per unit of work, by rows
        flops = rows / (t_lo + (t_hi - t_lo) * (rows - lo) / (hi - lo))
    if key != dtype and dtype and not is_integer_dtype(dtype):
        flops *= peak_flops(spec, dtype) / peak_flops(spec, key)
    return flops


def gemv_row_s(spec, dtype: str, rows: int = 1) -> float:
    """Seconds per weight row of a matmul of `rows` activation rows in `dtype` (op_overhead_s
    "gemv_row_<dtype>" at 1 row, "gemv_row16_<dtype>" at 16, measured by calibrate: each
    weight row starts its dot products afresh; linear in log rows between); 0 where the spec
    has none (its matmul rates then hold for every shape)."""
    return row_seconds(row_table(spec.op_overhead_s), dtype, rows)


def prediction_inputs(spec) -> list[tuple[str, str, str]]:
    """(figure, value, where it comes from) for every figure a prediction on `spec` takes:
    each kernel class's rate, each regime's fixed cost, a GPU kernel's fixed device time
    (`perfcounter devices NAME` prints them; the order rate() and overhead() take them in)."""
    measured = is_calibrated(spec)
    out = []
    for cls in EFFICIENCY_CLASSES:
        if cls in spec.op_curves:
            out.append((cls, "by working set", "measured curve (op_curves)"))
        elif cls in spec.op_efficiency:
            out.append((cls, f"{spec.op_efficiency[cls]:g} of peak", "sourced (op_efficiency)"))
        elif cls in WEIGHT_CLASSES and "gemv" in spec.op_curves:
            out.append((cls, "by working set", "the float GEMV's measured curve"))
        elif cls == "strided" and ("elementwise" in spec.op_curves
                                   or "elementwise" in spec.op_efficiency):
            out.append((cls, f"{STRIDED_SHARE:g} of elementwise", "stated share (STRIDED_SHARE)"))
        else:
            e = DEFAULT_EFFICIENCY[cls]
            stream = DEFAULT_STREAM_EFFICIENCY.get(spec.device_type, {}).get(cls)
            value = f"{e:g} of peak" + (f", bytes at {stream:g}" if stream else "")
            out.append((cls, value, "stated default (DEFAULT_EFFICIENCY)"))
    defaults = DEFAULT_OVERHEAD_S.get(spec.device_type, DEFAULT_OVERHEAD_S["cuda"])
    own = "measured (calibrate)" if measured else "sourced (op_overhead_us)"
    for ex in EXECUTIONS:
        unit = "a graph launch, per step" if ex == "cudagraphs" else \
            "an op call" if ex == "eager" else "a kernel launch"
        if ex in spec.op_overhead_s:
            out.append((ex, f"{spec.op_overhead_s[ex] * 1e6:.3g} us {unit}", own))
        else:
            out.append((ex, f"{defaults[ex] * 1e6:.3g} us {unit}",
                        "stated default (DEFAULT_OVERHEAD_S)"))
    for key, seconds in spec.op_overhead_s.items():
        if key.startswith("eager_") and key != "eager_cold":  # a dtype's own eager figure
            out.append((key, f"{seconds * 1e6:.3g} us an op call of a "
                        f"{key[len('eager_'):]} program", own))
    step = compiled_step_s(spec)
    out.append(("compiled_step", f"{step * 1e6:.3g} us a compiled step",
                own if "compiled_step" in spec.op_overhead_s else "stated default (DEFAULT_STEP_S)"
                if step else "none stated"))
    dynamic = dynamic_program(spec)
    if dynamic is not spec:  # a prefill compiled for any prompt length (dynamic_program)
        where = own if "compiled_dynamic" in spec.op_overhead_s else \
            "stated default + DEFAULT_DYNAMIC_S"
        out.append(("compiled_dynamic", f"{overhead(dynamic, 'compiled') * 1e6:.3g} us a kernel "
                    f"launch, {compiled_step_s(dynamic) * 1e6:.3g} us a step (a prefill "
                    f"compiled for any prompt length)", where))
    if spec.device_type in ASYNCHRONOUS:
        fixed = kernel_s(spec, "default")
        where = own if "kernel" in spec.op_overhead_s else \
            "stated default (DEFAULT_KERNEL_S)" if fixed else "none stated"
        if spec.op_curves:
            where += "; the measured curves hold it"
        out.append(("kernel", f"{fixed * 1e6:.3g} us a kernel, device time", where))
    return out
