"""An op record's kernel class for predictions: GEMV or GEMM by a matmul's rows, attention,
elementwise (strided views apart), reduction, indexing; a GEMV's weight dtype and rows; an
attention call's explicit mask. Pure functions of an op's name, arguments and figures.
"""
from __future__ import annotations

import math

from perfcounter.costs import op_info_by_name
from perfcounter.pricing.achievable import WEIGHT_CLASSES
from perfcounter.trace import ROLES, OpRecord
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
COLLECTIVE = "collective"  # a collective on a link (all-reduce, ...): pricing/collectives.py
EXTERN = ("gemv", *WEIGHT_CLASSES, "gemm", "attention")  # one kernel each, also when compiled
_WEIGHT = ROLES.index("weight")
_STREAMED = (_WEIGHT, ROLES.index("kv_cache"))
_FAMILY = {"matmul": "gemm", "attention": "attention", "norms": "reduction",
           "reductions": "reduction", "indexing": "indexing", "elementwise": "elementwise",
           "movement": "elementwise", "collectives": "collective"}


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
