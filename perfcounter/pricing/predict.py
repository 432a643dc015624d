"""Predicted latency of a counted phase on a device: what the roofline bound becomes
once each op pays what it really costs there.

The roofline (roofline.py) is a bound: every op at peak FLOP/s and peak bandwidth,
nothing else. A prediction prices each op record as

    calls x overhead(execution) + max(flops / F, bytes_cold / Bc + bytes_warm / Bw)
        [+ a GEMV's weight rows x the time per row] [+ calls x a GPU kernel's fixed time]

- overhead: the fixed cost of one op call, from the spec's `op_overhead_s` by
  execution: "eager" (Python, dispatcher, module calls: measured per recorded
  op by `perfcounter calibrate`; "eager_cold" when the step streams its weights
  through the caches, which evicts the state the next op's Python needs) or
  "compiled" (one generated-code kernel call); achievable.py says where each comes from.
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
  rows' figure) instead, where the spec has that table. A GEMV is priced by its weight's
  dtype (read from its bytes per weight: "gemv_int8", "gemv_int4" have their own
  efficiency, as has an fp8 x fp8 one, "gemv_fp8": gemv_weight); a float one also pays its
  weight rows x the spec's time per row (`gemv_row_<dtype>`, measured by calibrate: each row
  starts a dot product afresh, which makes a K = 576 GEMV stream at about half the rate of a
  K = 4096 one on a CPU).
- a GPU kernel's fixed time (achievable.kernel_s): on an asynchronous device each call of a
  record that moves or computes anything is a kernel, which occupies the device 2.7 us
  (DEFAULT_KERNEL_S) however small (launch on the device, scheduling, first loads, tail);
  priced where the rates come from efficiencies or defaults (a measured curve's small working
  sets hold it). A decode step of a small model is made of it: an H200's CUDA-graph step of
  the SmolLM2-135M shape ran 1.06 ms, its bytes and FLOPs take 0.09 ms at the defaults.
- bytes_cold: every byte when one step's distinct bytes exceed the spec's
  `cache_bytes`: weights and KV cache cannot stay cached between steps, and
  streaming them evicts the activations between one op and the next (a
  512-token prefill's activations of a few MiB come back from memory;
  benchmarks/bench_predict_ops.py times each op of a run against its prediction).
  bytes_warm: every byte when the step fits.

Compiled (fusion): matmuls and attention stay one kernel each ("extern", priced
as above with the compiled overhead). Every other op is assumed fused into the
kernels between them: chains of elementwise ops, reductions and indexing do not
round-trip memory and pay no per-op overhead. They move the trace's fused IO
(`fused_bytes`, counted by counting/storage.py: the bytes that cross a fused kernel's
boundary: what fused ops read from weights, buffers, inputs, the KV cache, extern outputs
and earlier kernels' outputs, and what they write that an extern kernel, a later kernel or
memory outliving the phase (a KV-cache write) takes; an RMSNorm's float32 upcast or
silu(x) before its multiply stays in registers), at the elementwise rate (cold or warm as
bytes_cold below says), and cost one compiled overhead per fused kernel, one between each
pair of extern calls. A trace without fused IO (all zero: a file written before it was
counted) is priced as before it was: the compulsory bytes (each storage once per phase)
that the extern kernels do not already stream (their weight and KV reads), which charges
every intermediate of a fused chain. Each step also pays the compiled program's entry (the
spec's `compiled_step`: guards and the wrapper's Python, measured on a GPU; none elsewhere), and
each fused kernel the device's fixed time of a kernel (kernel_s), as an extern one does.
On an asynchronous device the host launches the compiled kernels while the device runs the
ones queued before, as in eager: the launches and entries show only where they exceed the
kernels' work (an H200's 1B compiled decode step was host-bound: ~195 launches, 3.4-3.6 ms,
against 1.1 ms for the same kernels as one CUDA graph). The fused arithmetic runs at
`vector_flops`: on a GPU its float32 peak.

Eager on an asynchronous device (ASYNCHRONOUS: a GPU): the host dispatches op after op
while the device runs the kernels queued before, so the dispatch shows only where it exceeds
the device's work: overhead_s = max(0, Σ calls x overhead - Σ work), each op's overhead
scaled by the same share (op_predictions), so that the ops still add up to the phase.

CUDA graphs ("cudagraphs": gpt-fast's reduce-overhead, serving engines): the compiled
program replayed as one graph per step: fused as above, no overhead per kernel, one
`cudagraphs` overhead per step (the graph's launch). Graphs capture the fixed-shape steps
(decode, a draft's and a verify's rounds); a prefill, of whatever prompt length, runs
compiled, launched kernel by kernel (gpt-fast and generate.py compile it with dynamic shapes
and no graph; llama.cpp and TensorRT-LLM's PyTorch backend capture decode batches only):
`phase_regime` says which a phase gets, `phase_program` also the dynamic program's launch
and entry a compiled prefill pays (achievable.dynamic_program); stats.py applies both. On an
H200, a 1B model's 128-token prefill ran 4.1 ms in generate.py's cudagraphs run, its
decode step 1.2 ms: the prefill's launches, not a graph's one (benchmarks/gpu_check.py).
Metadata ops (prim.*: x.device under fake tensors) are no op calls and cost nothing.

Strides. An elementwise op on a strided view (`strided_view`: x[..., ::2], a slice of a
wider row) streams slower than the dense operands of the elementwise rate (a rotary
multiply on stride-2 views ran 1.6x its prediction at that rate, docs/predictions.md): it
is priced in its own class, "strided" — a calibration's measured curve (a multiply of two
stride-2 views), else the contiguous rate x achievable.STRIDED_SHARE (half of each cache
line used), whose seconds the eager prediction names (`strided_s`; describe_basis says so).
Host-link transfers are taken from the roofline and added as they are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from perfcounter.costs import compiled_launches, op_info_by_name  # noqa: F401 (re-exported)
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.format import si
from perfcounter.pricing.achievable import (  # noqa: F401 (re-exported: predict's names)
    ASYNCHRONOUS, CALIBRATED, DEFAULT_EFFICIENCY, DEFAULT_KERNEL_S, DEFAULT_OVERHEAD_S,
    DEFAULT_STREAM_EFFICIENCY,
    STRIDED_SHARE, WEIGHT_CLASSES, Rate, check_execution,
    compiled_step_s, dynamic_program, gemv_row_s, is_calibrated, kernel_s, measured_dtype,
    overhead, program_dtype, rate, rows_flops, vector_flops)
from perfcounter.pricing.roofline import is_integer_dtype, roofline
from perfcounter.trace import ROLES, OpRecord, Trace
from perfcounter.trace_args import tensor_args

SKINNY_ROWS = 16  # a matmul of at most this many rows is a GEMV: it streams its weight
# A skinny matmul of a few rows computes about as long as more rows: CPU GEMM kernels work in
# row blocks (measured, 1 thread, [M,576]x[576,49152] float32: M=1 8.2 ms, 2 8.6, 4 17.1,
# 8 27.2, 16 26.7), and a matmul of a few hundred rows runs below the square matmul's rate.
# A calibrated spec measures FLOP/s by rows (`matmul_rows`, see rows_flops), which replaces
# the class's FLOP/s for matmuls of 2 rows up to the most rows measured; otherwise the stated
# default: 2..ROW_BLOCK rows are charged ROW_BLOCK rows of FLOPs. One row runs a GEMV kernel,
# priced by its own FLOPs (and its weight's bytes).
ROW_BLOCK = 8
EXTERN = ("gemv", *WEIGHT_CLASSES, "gemm", "attention")  # one kernel each, also when compiled
_WEIGHT = ROLES.index("weight")
_STREAMED = (_WEIGHT, ROLES.index("kv_cache"))
_FAMILY = {"matmul": "gemm", "attention": "attention", "norms": "reduction",
           "reductions": "reduction", "indexing": "indexing", "elementwise": "elementwise",
           "movement": "elementwise"}


def matmul_rows(op: str, args: tuple) -> int:
    """Rows of a matmul's left operand (M): the first tensor of args of >= 2 dims; batched
    matmuls (bmm, baddbmm) count one matrix's rows, the others flatten leading dims."""
    return matmul_mk(op, args)[0]


def matmul_mk(op: str, args: tuple) -> tuple[int, int]:
    """(rows M, inner dim K) of a matmul's left operand (see matmul_rows); (1, 1) unknown."""
    for t in tensor_args(args):
        dims = t.shape
        if len(dims) >= 2:
            return (dims[-2] if "bmm" in op else math.prod(dims[:-1])), max(dims[-1], 1)
    return 1, 1


def gemv_weight(r: OpRecord) -> tuple[str, float]:
    """(the class a GEMV record is priced in by its weight's bits per element, read from its
    bytes: "gemv_int4" up to 5.5 bits (int4 and its scales, GGUF Q4 blocks), "gemv_int8" up
    to 9, else "gemv"; a float8 matmul (W8A8: fp8 x fp8) "gemv_fp8"; its weight rows N per
    call). NB: a matmul without weight bytes (attention's) is a "gemv" of no weight rows."""
    calls = max(r.calls, 1)
    m, k = matmul_mk(r.op, r.args)
    nk = r.flops / calls / (2 * m)  # N x K (x batch) of one call: flops = 2 M N K
    weight = r.read[_WEIGHT] / calls
    if weight <= 0 or nk <= 0:
        return "gemv", 0.0
    if r.dtype.startswith("float8"):  # fp8 activations and weights: no dequantizing kernel
        return "gemv_fp8", nk / k
    bits = 8 * weight / nk
    return ("gemv_int4" if bits <= 5.5 else "gemv_int8" if bits <= 9 else "gemv"), nk / k


def op_class(op: str, args: tuple = ()) -> str:
    """An op record's class (OP_CLASSES), from the op registry: the family file of
    its cost formula, its attention flag and its per-element tag. NB: an op the
    registry does not know is priced as elementwise. An elementwise op on a strided view is
    "strided" (the module doc's Strides)."""
    info = op_info_by_name(op)
    if info is None:
        return "strided" if strided_view(args) else "elementwise"
    if info.attention:
        return "attention"
    if info.per_element in ("softmax", "rmsnorm"):
        return "reduction"
    family = info.formula.__module__.rsplit(".", 1)[-1] if info.formula else "elementwise"
    cls = _FAMILY.get(family, "elementwise")
    if cls == "gemm" and matmul_rows(op, args) <= SKINNY_ROWS:
        return "gemv"
    return "strided" if cls == "elementwise" and strided_view(args) else cls


def strided_view(args: tuple) -> bool:
    """Whether an op's tensors include a strided view (trace_args.TensorArg.gapped:
    x[..., ::2], a slice of a wider row), which streams slower than dense memory."""
    return any(t.gapped for t in tensor_args(args))


def has_explicit_mask(args: tuple) -> bool:
    """Whether an attention record's operands include a mask tensor (a tensor after q, k,
    v whose last two dims are [Sq, Sk]). Fused kernels (CPU flash, memory-efficient)
    compute every block under an explicit mask: they skip blocks only for is_causal, so
    such a call is priced at its dense FLOPs, not at the pairs the mask keeps."""
    dims = [t.shape for t in tensor_args(args)]
    if len(dims) < 4 or len(dims[0]) < 2 or len(dims[1]) < 2:
        return False
    scores = [dims[0][-2], dims[1][-2]]
    return any(len(d) >= 2 and list(d[-2:]) == scores for d in dims[3:])


@dataclass(frozen=True, slots=True)
class OpPrediction:
    """One record's predicted seconds: overhead, compute and memory sides."""

    record: OpRecord
    op_class: str
    overhead_s: float
    compute_s: float
    memory_s: float
    basis: str
    rows_s: float = 0.0  # a GEMV's weight rows x the spec's time per row (gemv_row_s)
    strided: bool = False  # elementwise on a strided view at a stated share (module doc)
    fixed_s: float = 0.0  # its kernels' fixed device time, calls x kernel_s (module doc)

    @property
    def work_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.rows_s + self.fixed_s

    @property
    def latency_s(self) -> float:
        return self.overhead_s + self.work_s


def streams_cold(trace: Trace, spec) -> bool:
    """True when one step's distinct bytes exceed the spec's cache (unknown cache: True)."""
    if not spec.cache_bytes:
        return True
    return trace.compulsory_bytes / max(trace.steps, 1) > spec.cache_bytes


def _memory_s(bytes_cold: float, bytes_warm: float, r: Rate) -> float:
    return bytes_cold / r.cold_bytes_per_s + bytes_warm / r.warm_bytes_per_s


def op_predictions(trace: Trace, spec, execution: str = "eager") -> list[OpPrediction]:
    """Every record priced alone: calls x the overhead of one call `execution` (cudagraphs:
    none, the step pays) + max(compute, memory) + a GEMV's weight rows x the time per row
    + on a GPU each kernel's fixed time (kernel_s)."""
    check_execution(execution)
    cold = streams_cold(trace, spec)
    per_call = 0.0 if execution == "cudagraphs" else \
        overhead(spec, execution, cold, program_dtype(trace.records))
    out = []
    for r in trace.records:
        if r.op.startswith("prim."):  # metadata queries, not op calls
            continue
        cls = op_class(r.op, r.args)
        calls = max(r.calls, 1)
        rows_s, weight_cls = 0.0, cls
        if cls in ("gemv", "gemm"):  # a GEMV priced by its weight's dtype; float weights pay
            weight_cls, weight_rows = gemv_weight(r)  # per weight row
            if weight_cls == "gemv" and not is_integer_dtype(r.dtype):
                rows_s = r.calls * weight_rows * gemv_row_s(spec, r.dtype,
                                                            matmul_rows(r.op, r.args))
            weight_cls = weight_cls if cls == "gemv" else cls
        strided = cls == "strided"
        rt = rate(spec, weight_cls, r.dtype, r.bytes / calls)
        streamed = r.bytes if cold else 0
        flops = r.flops if cls == "attention" and has_explicit_mask(r.args) \
            else r.executed_flops
        achieved = rt.flops_per_s
        if cls in ("gemv", "gemm") and (rows := matmul_rows(r.op, r.args)) > 1:
            by_rows = rows_flops(spec, r.dtype, rows) if not is_integer_dtype(r.dtype) else None
            if by_rows is not None:
                achieved = by_rows
            elif cls == "gemv" and rows < ROW_BLOCK:
                flops = flops * ROW_BLOCK / rows
        compute = flops / achieved if flops else 0.0
        fixed = r.calls * kernel_s(spec, rt.basis) if r.bytes or r.executed_flops else 0.0
        out.append(OpPrediction(r, weight_cls, r.calls * per_call,
                                compute, _memory_s(streamed, r.bytes - streamed, rt), rt.basis,
                                rows_s, strided and "strided" not in spec.op_curves, fixed))
    if execution == "eager" and spec.device_type in ASYNCHRONOUS:  # dispatch overlaps kernels:
        dispatch, work = sum(p.overhead_s for p in out), sum(p.work_s for p in out)
        shown = max(dispatch - work, 0.0) / dispatch if dispatch else 0.0  # each op its share
        out = [replace(p, overhead_s=p.overhead_s * shown) for p in out]
    return out


@dataclass(frozen=True)
class Prediction:
    """A phase's predicted latency on one device; seconds unless named otherwise."""

    execution: str
    overhead_s: float  # Σ fixed costs
    work_s: float  # Σ max(compute, memory) (+ GEMV rows) over ops or fused groups
    host_link_s: float
    by_class: dict  # op class -> seconds (overhead included); "fused" for compiled groups
    basis: str  # where the rates came from: "curve", "efficiency", "default", "peak" (joined)
    op_calls: int  # op calls priced (compiled, CUDA graphs: kernels, extern and fused)
    strided_s: float = 0.0  # eager: work on strided views at the stated share (module doc)
    host_shown: float = 1.0  # compiled: the share of the host's launches the phase shows
    # (below 1 where an asynchronous device's kernels hide them, module doc)
    fixed_s: float = 0.0  # of work_s: the kernels' fixed device time on a GPU (kernel_s)

    @property
    def latency_s(self) -> float:
        return self.overhead_s + self.work_s + self.host_link_s

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "execution": self.execution,
                "overhead_s": self.overhead_s, "work_s": self.work_s,
                "host_link_s": self.host_link_s, "by_class": dict(self.by_class),
                "basis": self.basis, "op_calls": self.op_calls, "strided_s": self.strided_s,
                "fixed_s": self.fixed_s}


def fused_io(trace: Trace, extern: list[OpPrediction]) -> int:
    """Bytes the fused kernels of a compiled phase move (module doc): the trace's fused IO;
    for a trace without it, its compulsory bytes less the extern kernels' weight and KV reads."""
    if trace.fused_bytes:
        return trace.fused_bytes
    streamed = sum(p.record.read[i] for p in extern for i in _STREAMED)
    return max(0, trace.compulsory_bytes - streamed)


def predict(trace: Trace, spec, execution: str = "eager") -> Prediction:
    """The predicted latency of a trace on a device run `execution`: eager, compiled or
    cudagraphs (see the module doc)."""
    ops = op_predictions(trace, spec, execution)
    by_class: dict[str, float] = {}
    bases = {p.basis for p in ops}
    host_link = roofline(trace, spec).host_link_s
    if execution == "eager":
        for p in ops:
            by_class[p.op_class] = by_class.get(p.op_class, 0.0) + p.latency_s
        return Prediction(execution, sum(p.overhead_s for p in ops),
                          sum(p.work_s for p in ops), host_link, by_class,
                          "+".join(sorted(bases)), sum(p.record.calls for p in ops),
                          sum(p.work_s for p in ops if p.strided),
                          fixed_s=sum(p.fixed_s for p in ops))
    extern = [p for p in ops if p.op_class in EXTERN]
    fused = [p for p in ops if p.op_class not in EXTERN and p.record.bytes]
    steps = max(trace.steps, 1)
    kernels = sum(p.record.calls for p in extern) + steps  # the fused ones: one a step and
    # one after each extern kernel
    fused_bytes = fused_io(trace, extern) if fused else 0
    fused_flops = sum(p.record.executed_flops for p in fused)
    dtype = max((p.record for p in fused), key=lambda r: r.bytes).dtype if fused else ""
    rt = rate(spec, "elementwise", dtype, fused_bytes / kernels)
    bandwidth = rt.cold_bytes_per_s if streams_cold(trace, spec) else rt.warm_bytes_per_s
    fused_s = max(fused_flops / vector_flops(spec, rt), fused_bytes / bandwidth)
    fused_fixed = kernels * kernel_s(spec, rt.basis) if fused else 0.0  # extern calls + steps
    fused_s += fused_fixed
    if execution == "cudagraphs":  # one graph launch per step, no launch per kernel
        host = {"graph launch": steps * overhead(spec, "cudagraphs")}
    else:  # a launch per kernel, and the compiled program's entry per step
        host = {}
        for p in extern:
            host[p.op_class] = host.get(p.op_class, 0.0) + p.overhead_s
        host["fused"] = (steps + sum(p.record.calls for p in extern)) \
            * overhead(spec, "compiled") if fused else 0.0
        host["fused"] += steps * compiled_step_s(spec)
    work = sum(p.work_s for p in extern) + fused_s
    shown = 1.0  # the share of the host's time that the step's time shows
    if execution == "compiled" and spec.device_type in ASYNCHRONOUS and sum(host.values()):
        shown = max(sum(host.values()) - work, 0.0) / sum(host.values())  # launches overlap
    for p in extern:  # the device's kernels (module doc), as eager's dispatch does
        by_class[p.op_class] = by_class.get(p.op_class, 0.0) + p.work_s
    for key, s in host.items():
        by_class[key] = by_class.get(key, 0.0) + s * shown
    by_class["fused"] = by_class.get("fused", 0.0) + fused_s
    bases.add(rt.basis)
    return Prediction(execution, sum(host.values()) * shown, work, host_link, by_class,
                      "+".join(sorted(bases)),
                      sum(p.record.calls for p in extern) + (kernels if fused else 0),
                      host_shown=shown,
                      fixed_s=sum(p.fixed_s for p in extern) + fused_fixed)


def phase_regime(execution: str, label: str) -> str:
    """The regime a phase labelled `label` runs under `execution`: a prefill (a label naming
    one) under "cudagraphs" runs "compiled" (see the module doc); anything else as asked."""
    check_execution(execution)
    return "compiled" if execution == "cudagraphs" and "prefill" in label else execution


def phase_program(spec, execution: str, label: str):
    """(regime, spec) a phase labelled `label` is priced in under `execution`: phase_regime's,
    and for a prefill run compiled the spec of a program compiled for any prompt length
    (generate.py's and gpt-fast's dynamic=True prefill: achievable.dynamic_program)."""
    regime = phase_regime(execution, label)
    if regime == "compiled" and "prefill" in label:
        return regime, dynamic_program(spec)
    return regime, spec


def describe_basis(spec, prediction: Prediction) -> str:
    """Where a prediction's rates came from, in words (for reports)."""
    words = {"curve": "measured curves", "efficiency": "sourced efficiencies",
             "default": "stated default efficiencies (predict.DEFAULT_EFFICIENCY)",
             "peak": "measured peaks (no curves)"}
    text = ", ".join(words[b] for b in prediction.basis.split("+") if b in words)
    if prediction.strided_s:
        text += (f"; {si(prediction.strided_s, 's')} of elementwise work on strided views at "
                 f"the stated {STRIDED_SHARE:.0%} of the contiguous rate (no strided curve)")
    if prediction.fixed_s:
        text += (f"; {si(prediction.fixed_s, 's')} of the work is the kernels' fixed device "
                 f"time ({si(kernel_s(spec, 'default'), 's')} a kernel)")
    return text


def dtype_key(dtype) -> str:
    """A dtype as the curves name it ("float32")."""
    return dtype_name(as_dtype(dtype))
