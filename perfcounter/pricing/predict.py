"""Predicted latency of a counted phase on a device: what the roofline bound becomes
once each op pays what it really costs there.

The rule below is applied by pricing/price.py's `price(figures, spec, execution)` (one rule for
every consumer: a serving step table prices its steps' figures with it too); `predict(trace)`
prices the trace's figures (figures.py: one group a record), `op_predictions` each record's
share. Op classes are op_classes.py's.

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

from dataclasses import dataclass

from perfcounter.costs import compiled_launches, op_info_by_name  # noqa: F401 (re-exported)
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.format import si
from perfcounter.pricing.achievable import (  # noqa: F401 (re-exported: predict's names)
    ASYNCHRONOUS, CALIBRATED, DEFAULT_EFFICIENCY, DEFAULT_KERNEL_S, DEFAULT_OVERHEAD_S,
    DEFAULT_STREAM_EFFICIENCY,
    STRIDED_SHARE, WEIGHT_CLASSES, Rate,
    compiled_step_s, dynamic_program, gemv_row_s, is_calibrated, kernel_s, measured_dtype,
    overhead, program_dtype, rate, rows_flops, vector_flops)
from perfcounter.pricing.figures import figures_of
from perfcounter.pricing.op_classes import (  # noqa: F401 (re-exported: predict's names)
    EXTERN, ROW_BLOCK, SKINNY_ROWS, gemv_weight, has_explicit_mask, matmul_mk, matmul_rows,
    op_class, strided_view)
from perfcounter.pricing.price import (  # noqa: F401 (re-exported)
    REGIMES, Prediction, check_regime, price, streams_cold)
from perfcounter.trace import OpRecord, Trace


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


def op_predictions(trace: Trace, spec, execution: str = "eager") -> list[OpPrediction]:
    """Every record priced alone (prim.* metadata queries left out), as price() prices each
    group of the trace's figures (one a record): calls x the overhead of one call
    `execution` (cudagraphs: none, the step pays; eager on a GPU: each op's share of the
    dispatch its kernels do not hide) + max(compute, memory) + a GEMV's weight rows x the
    time per row + on a GPU each kernel's fixed time (kernel_s). Compiled and CUDA graphs:
    the fused records' own figures, as eager would price them without overhead."""
    check_regime(execution, bound=False)
    fig, records = figures_of(trace)
    g = price(fig, spec, "eager" if execution != "eager" else execution).groups
    if execution != "eager":  # the regime's overhead a call; each record's own work
        per_call = 0.0 if execution == "cudagraphs" else \
            overhead(spec, execution, streams_cold(fig, spec), fig.program_dtype)
        over = fig.calls * per_call
    else:
        over = g.overhead_s
    return [OpPrediction(r, g.cls[i], float(over[i]), float(g.compute_s[i]),
                         float(g.memory_s[i]), g.basis[i], float(g.rows_s[i]),
                         bool(g.strided[i]), float(g.fixed_s[i]))
            for i, r in enumerate(records)]


def predict(trace: Trace, spec, execution: str = "eager") -> Prediction:
    """The predicted latency of a trace on a device run `execution`: eager, compiled or
    cudagraphs (see the module doc), or its "bound": price() of the trace's figures."""
    return price(figures_of(trace)[0], spec, execution)


def phase_regime(execution: str, label: str) -> str:
    """The regime a phase labelled `label` runs under `execution`: a prefill (a label naming
    one) under "cudagraphs" runs "compiled" (see the module doc); anything else as asked."""
    check_regime(execution, bound=False)
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
    if prediction.by_class.get("collective"):
        text += f"; {si(prediction.by_class['collective'], 's')} of it collectives on the link"
    return text


def dtype_key(dtype) -> str:
    """A dtype as the curves name it ("float32")."""
    return dtype_name(as_dtype(dtype))
