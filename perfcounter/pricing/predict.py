"""Predicted latency of a counted phase on a device: what the roofline bound becomes
once each op pays what it really costs there.

The roofline (roofline.py) is a bound: every op at peak FLOP/s and peak bandwidth,
nothing else. A prediction prices each op record as

    calls x overhead(execution) + max(flops / F, bytes_cold / Bc + bytes_warm / Bw)

- overhead: the fixed cost of one op call, from the spec's `op_overhead_s` by
  execution: "eager" (Python, dispatcher, module calls: measured per recorded
  op by `perfcounter calibrate`; "eager_cold" when the step streams its weights
  through the caches, which evicts the state the next op's Python needs) or
  "compiled" (one generated-code kernel call).
- flops: the record's executed FLOPs (causal kernels skip masked blocks), but an
  attention call with an explicit mask at its dense FLOPs (`has_explicit_mask`).
- F, Bw, Bc: the achievable FLOP/s and bandwidth (warm: from cache; cold: from
  memory) of the op's class (OP_CLASSES: gemv for matmuls of <= SKINNY_ROWS
  rows, gemm, attention, elementwise and copies, reduction and norms, indexing
  and embedding), its dtype and its working set (bytes per call), read from
  the spec's `op_curves` (measured, interpolated in log size), else from
  `op_efficiency` x peak (a sourced fraction per class), else from
  DEFAULT_EFFICIENCY x peak (stated below; the prediction's `basis` says which).
  A matmul of 2 rows or more runs at the FLOP/s the spec's `matmul_rows`
  measured for its rows (`rows_flops`; more rows than measured: the most
  rows' figure) instead, where the spec has that table.
- bytes_cold: every byte when one step's distinct bytes exceed the spec's
  `cache_bytes`: weights and KV cache cannot stay cached between steps, and
  streaming them evicts the activations between one op and the next (a
  512-token prefill's activations of a few MiB come back from memory;
  benchmarks/bench_predict_ops.py times each op of a run against its prediction).
  bytes_warm: every byte when the step fits.

Compiled (fusion): matmuls and attention stay one kernel each ("extern", priced
as above with the compiled overhead). Every other op is assumed fused into the
kernels between them: chains of elementwise ops, reductions and indexing do not
round-trip memory and pay no per-op overhead. They move the compulsory bytes
(each storage once per phase) that the extern kernels do not already stream
(their weight and KV reads), at the elementwise rate (cold or warm as bytes_cold
below says), and cost one compiled
overhead per fused kernel, one between each pair of extern calls.
Metadata ops (prim.*: x.device under fake tensors) are no op calls and cost nothing.
Host-link transfers are taken from the roofline and added as they are.
"""
from __future__ import annotations

import bisect
import math
import re
import warnings
from dataclasses import dataclass

from perfcounter._util import PerfcounterWarning
from perfcounter.costs import op_info_by_name
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.devices.op_rates import interpolate
from perfcounter.devices.spec import EXECUTIONS
from perfcounter.pricing.roofline import is_integer_dtype, peak_flops, roofline
from perfcounter.trace import ROLES, OpRecord, Trace

SKINNY_ROWS = 16  # a matmul of at most this many rows is a GEMV: it streams its weight
# A skinny matmul of a few rows computes about as long as more rows: CPU GEMM kernels work in
# row blocks (measured, 1 thread, [M,576]x[576,49152] float32: M=1 8.2 ms, 2 8.6, 4 17.1,
# 8 27.2, 16 26.7), and a matmul of a few hundred rows runs below the square matmul's rate.
# A calibrated spec measures FLOP/s by rows (`matmul_rows`, see rows_flops), which replaces
# the class's FLOP/s for matmuls of 2 rows up to the most rows measured; otherwise the stated
# default: 2..ROW_BLOCK rows are charged ROW_BLOCK rows of FLOPs. One row runs a GEMV kernel,
# priced by its own FLOPs (and its weight's bytes).
ROW_BLOCK = 8
EXTERN = ("gemv", "gemm", "attention")  # one kernel each, also when compiled
_STREAMED = (ROLES.index("weight"), ROLES.index("kv_cache"))
_SHAPE = re.compile(r"\[([\d,\s]*)\]")
_FAMILY = {"matmul": "gemm", "attention": "attention", "norms": "reduction",
           "reductions": "reduction", "indexing": "indexing", "elementwise": "elementwise",
           "movement": "elementwise"}

# Stated defaults for a spec that gives neither curves nor efficiencies: achievable / peak.
# Source: assumption of this project, not a measurement; typical of tuned libraries
# (vendor GEMM ~70 % of dense peak, streaming kernels ~80 % of bandwidth, attention and
# gathers below). A spec's own `op_efficiency` (with its source) replaces them.
DEFAULT_EFFICIENCY = {"gemv": 0.8, "gemm": 0.7, "attention": 0.5, "elementwise": 0.8,
                      "reduction": 0.6, "indexing": 0.3}
# Stated default overheads per op call, seconds, by device_type and execution. Source:
# assumption of this project; CPU eager: 1.8-2.6 us of dispatch per tiny aten op measured
# on a 2-core Xeon (issue 16), plus module Python; GPU eager: a kernel launch (~5 us) plus
# dispatch; compiled: one generated-code call (CPU) or one node of a CUDA graph (GPU).
DEFAULT_OVERHEAD_S = {"cpu": {"eager": 3e-6, "compiled": 1e-6},
                      "cuda": {"eager": 8e-6, "compiled": 2e-6}}
CALIBRATED = "perfcounter calibrate"  # what the source of a measured spec says


def check_execution(execution) -> str:
    """execution itself when it is one of EXECUTIONS; else a ValueError naming them."""
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution {execution!r}; valid: {', '.join(EXECUTIONS)}")
    return execution


def _dims(shapes: str) -> list[list[int]]:
    return [[int(d) for d in m.group(1).replace(" ", "").split(",") if d]
            for m in _SHAPE.finditer(shapes)]


def matmul_rows(op: str, shapes: str) -> int:
    """Rows of a matmul's left operand (M): the first operand of >= 2 dims; batched
    matmuls (bmm, baddbmm) count one matrix's rows, the others flatten leading dims."""
    for dims in _dims(shapes):
        if len(dims) >= 2:
            if "bmm" in op:
                return dims[-2]
            return math.prod(dims[:-1])
    return 1


def op_class(op: str, shapes: str = "") -> str:
    """An op record's class (OP_CLASSES), from the op registry: the family file of
    its cost formula, its attention flag and its per-element tag. NB: an op the
    registry does not know is priced as elementwise."""
    info = op_info_by_name(op)
    if info is None:
        return "elementwise"
    if info.attention:
        return "attention"
    if info.per_element in ("softmax", "rmsnorm"):
        return "reduction"
    family = info.formula.__module__.rsplit(".", 1)[-1] if info.formula else "elementwise"
    cls = _FAMILY.get(family, "elementwise")
    if cls == "gemm" and matmul_rows(op, shapes) <= SKINNY_ROWS:
        return "gemv"
    return cls


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
    """Achievable rates of op class `cls` in `dtype` at `working_set` bytes on `spec`."""
    curves = spec.op_curves.get(cls)
    peak = peak_flops(spec, "" if not dtype or is_integer_dtype(dtype) else dtype)
    if curves:
        key = measured_dtype(curves, dtype)  # another dtype's: FLOP/s scaled by the peaks
        warm, cold, flops = interpolate(curves[key], max(working_set, 1.0))
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
    return Rate(peak * e, spec.bandwidth * e, spec.bandwidth * e, basis)


def overhead(spec, execution: str, cold: bool = False) -> float:
    """Seconds of fixed cost per op call on `spec` when run `execution`; `cold`: the
    step streams its weights through the caches (the spec's eager_cold, where measured)."""
    if cold and execution == "eager" and "eager_cold" in spec.op_overhead_s:
        return spec.op_overhead_s["eager_cold"]
    if execution in spec.op_overhead_s:
        return spec.op_overhead_s[execution]
    defaults = DEFAULT_OVERHEAD_S.get(spec.device_type, DEFAULT_OVERHEAD_S["cuda"])
    if is_calibrated(spec):
        _warn_missing(spec, "op_overhead_s", f"the stated default {defaults[execution] * 1e6:g} "
                      f"us per op ({execution})")
    return defaults[execution]


def has_explicit_mask(shapes: str) -> bool:
    """Whether an attention record's operands include a mask tensor (a tensor after q, k,
    v whose last two dims are [Sq, Sk]). Fused kernels (CPU flash, memory-efficient)
    compute every block under an explicit mask: they skip blocks only for is_causal, so
    such a call is priced at its dense FLOPs, not at the pairs the mask keeps."""
    dims = _dims(shapes)
    if len(dims) < 4 or len(dims[0]) < 2 or len(dims[1]) < 2:
        return False
    scores = [dims[0][-2], dims[1][-2]]
    return any(len(d) >= 2 and d[-2:] == scores for d in dims[3:])


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


@dataclass(frozen=True, slots=True)
class OpPrediction:
    """One record's predicted seconds: overhead, compute and memory sides."""

    record: OpRecord
    op_class: str
    overhead_s: float
    compute_s: float
    memory_s: float
    basis: str

    @property
    def latency_s(self) -> float:
        return self.overhead_s + max(self.compute_s, self.memory_s)


def streams_cold(trace: Trace, spec) -> bool:
    """True when one step's distinct bytes exceed the spec's cache (unknown cache: True)."""
    if not spec.cache_bytes:
        return True
    return trace.compulsory_bytes / max(trace.steps, 1) > spec.cache_bytes


def _memory_s(bytes_cold: float, bytes_warm: float, r: Rate) -> float:
    return bytes_cold / r.cold_bytes_per_s + bytes_warm / r.warm_bytes_per_s


def op_predictions(trace: Trace, spec, execution: str = "eager") -> list[OpPrediction]:
    """The eager-style prediction of every record (calls x overhead + max of the two sides)."""
    check_execution(execution)
    cold = streams_cold(trace, spec)
    per_call = overhead(spec, execution, cold)
    out = []
    for r in trace.records:
        if r.op.startswith("prim."):  # metadata queries, not op calls
            continue
        cls = op_class(r.op, r.shapes)
        calls = max(r.calls, 1)
        rt = rate(spec, cls, r.dtype, r.bytes / calls)
        streamed = r.bytes if cold else 0
        flops = r.flops if cls == "attention" and has_explicit_mask(r.shapes) \
            else r.executed_flops
        achieved = rt.flops_per_s
        if cls in ("gemv", "gemm") and (rows := matmul_rows(r.op, r.shapes)) > 1:
            by_rows = rows_flops(spec, r.dtype, rows) if not is_integer_dtype(r.dtype) else None
            if by_rows is not None:
                achieved = by_rows
            elif cls == "gemv" and rows < ROW_BLOCK:
                flops = flops * ROW_BLOCK / rows
        compute = flops / achieved if flops else 0.0
        out.append(OpPrediction(r, cls, r.calls * per_call, compute,
                                _memory_s(streamed, r.bytes - streamed, rt), rt.basis))
    return out


@dataclass(frozen=True)
class Prediction:
    """A phase's predicted latency on one device; seconds unless named otherwise."""

    execution: str
    overhead_s: float  # Σ fixed costs
    work_s: float  # Σ max(compute, memory) over ops or fused groups
    host_link_s: float
    by_class: dict  # op class -> seconds (overhead included); "fused" for compiled groups
    basis: str  # where the rates came from: "curve", "efficiency", "default", "peak" (joined)
    op_calls: int  # op calls priced (compiled: kernels)

    @property
    def latency_s(self) -> float:
        return self.overhead_s + self.work_s + self.host_link_s

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "execution": self.execution,
                "overhead_s": self.overhead_s, "work_s": self.work_s,
                "host_link_s": self.host_link_s, "by_class": dict(self.by_class),
                "basis": self.basis, "op_calls": self.op_calls}


def predict(trace: Trace, spec, execution: str = "eager") -> Prediction:
    """The predicted latency of a trace on a device, run eagerly or compiled (see the module doc)."""
    ops = op_predictions(trace, spec, execution)
    by_class: dict[str, float] = {}
    bases = {p.basis for p in ops}
    host = roofline(trace, spec).host_link_s
    if execution == "eager":
        for p in ops:
            by_class[p.op_class] = by_class.get(p.op_class, 0.0) + p.latency_s
        return Prediction(execution, sum(p.overhead_s for p in ops),
                          sum(max(p.compute_s, p.memory_s) for p in ops), host, by_class,
                          "+".join(sorted(bases)), sum(p.record.calls for p in ops))
    extern = [p for p in ops if p.op_class in EXTERN]
    fused = [p for p in ops if p.op_class not in EXTERN and p.record.bytes]
    for p in extern:
        by_class[p.op_class] = by_class.get(p.op_class, 0.0) + p.latency_s
    kernels = sum(p.record.calls for p in extern) + max(trace.steps, 1)
    streamed = sum(p.record.read[i] for p in extern for i in _STREAMED)
    fused_bytes = max(0, trace.compulsory_bytes - streamed) if fused else 0
    fused_flops = sum(p.record.executed_flops for p in fused)
    dtype = max((p.record for p in fused), key=lambda r: r.bytes).dtype if fused else ""
    rt = rate(spec, "elementwise", dtype, fused_bytes / kernels)
    bandwidth = rt.cold_bytes_per_s if streams_cold(trace, spec) else rt.warm_bytes_per_s
    fused_s = max(fused_flops / rt.flops_per_s, fused_bytes / bandwidth)
    per_call = overhead(spec, "compiled")
    fused_overhead = (max(trace.steps, 1) + sum(p.record.calls for p in extern)) * per_call \
        if fused else 0.0
    by_class["fused"] = fused_s + fused_overhead
    bases.add(rt.basis)
    return Prediction(execution, sum(p.overhead_s for p in extern) + fused_overhead,
                      sum(max(p.compute_s, p.memory_s) for p in extern) + fused_s, host,
                      by_class, "+".join(sorted(bases)), kernels)


def describe_basis(spec, prediction: Prediction) -> str:
    """Where a prediction's rates came from, in words (for reports)."""
    words = {"curve": "measured curves", "efficiency": "sourced efficiencies",
             "default": "stated default efficiencies (predict.DEFAULT_EFFICIENCY)",
             "peak": "measured peaks (no curves)"}
    return ", ".join(words[b] for b in prediction.basis.split("+") if b in words)


def dtype_key(dtype) -> str:
    """A dtype as the curves name it ("float32")."""
    return dtype_name(as_dtype(dtype))
