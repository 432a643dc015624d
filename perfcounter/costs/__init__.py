"""Op cost registry: what each aten op computes, by kind, and which bytes it touches.

One registry keyed by aten `OpOverloadPacket` (or a higher-order op), filled by
`@register(...)`, which refuses duplicates and overloads (aten.mm.default: pass
aten.mm). `OPS[op]` is an `OpInfo`: the op's formula and all that the dispatch
mode and the roofline need to know of it (write_only, cache_write, join,
factory, attention, per_element; see _core.py). `COSTS[op]` is the formula of
every op that has one. Look ops up with `op_info(aten.mm)`, or by a record's
name with `op_info_by_name("aten.mm.default")`.

A formula takes shapes and dtypes, not tensors — the op's arguments with every
tensor replaced by its `Shape` (a tuple that also carries the dtype; a test
passes plain tuples), lists of tensors by lists of shapes, plus `out_shape` (a
shape, or a tuple of them); `shape_tree(args)` makes them. It returns a
`Cost`: primitive counts by kind (trace.KINDS: add, mul, div, sqrt, exp,
special, cmp) and, where an op touches less than whole tensors (an embedding
reads rows, an index_copy_ writes positions), the elements it really reads or
writes. Every formula has a one-line docstring and an NB: line for conventions.

Conventions:
- FLOPs = the sum of the primitive counts; a multiply-accumulate is 1 mul +
  1 add = 2 FLOPs, as in torch.utils.flop_counter (matmul = 2·M·N·K).
- Attention is dense (both matmuls over every score, as torch and torchao
  count it); `executed` is what a kernel that skips causally masked blocks
  computes. Softmax inside attention is counted too.
- Copies, casts, factories and views compute nothing (0 FLOPs); views and
  metadata ops also move nothing (the mode tells them from their schema).
  Random number generation itself is not counted, only the arithmetic that
  shapes it.

One file per family; importing this package imports them all, which fills
the registry:
  matmul.py      mm, bmm, addmm, baddbmm, linear, _grouped_mm, convolutions
  attention.py   SDPA on every backend, flex attention
  norms.py       softmax, log-softmax, RMSNorm, LayerNorm
  reductions.py  sum/mean/max…, norms of vectors, var, scans, topk, sort, histc, isin, sampling
  indexing.py    embedding, gathers, scatters, index_put_/index_copy_/index_add_
  elementwise.py the per-element table, add, mul (complex too), polar, pow, clamp, gelu, arange
  movement.py    copies, casts, joins, fills, factories, allocation
  collectives.py all-reduce, all-gather, send/recv, all-to-all of a sharded model's ranks
"""
from __future__ import annotations

from perfcounter.costs._core import (COSTS, OPS, PER_ELEMENT, ZERO, Cost, OpInfo, Shape, dtype_of,
                                      first_shape, is_complex, kinds, numel, op_info,
                                      op_info_by_name, op_name, register, shape_tree)
from perfcounter.costs.attention import (attention_cost, causal_pairs, efficient_forward_cost,
                                         flash_forward_cost, flex_attention_cost,
                                         sdpa_composite_cost, sdpa_cpu_flash_cost,
                                         sdpa_efficient_cost, sdpa_flash_cost, window_pairs)
from perfcounter.costs.collectives import collective_cost
from perfcounter.costs.elementwise import (add_cost, arange_cost, clamp_cost, gelu_cost, mul_cost,
                                           polar_cost, pow_cost)
from perfcounter.costs.indexing import (embedding_cost, gather_cost, index_add_cost,
                                        index_add_inplace_cost, index_copy_cost, index_cost,
                                        index_put_cost, index_select_cost, scatter_add_cost,
                                        scatter_cost)
from perfcounter.costs.matmul import (addmm_cost, baddbmm_cost, bmm_cost, conv_cost,
                                      conv_transpose_cost, convnd_cost, grouped_mm_cost,
                                      linear_cost, mm_cost)
from perfcounter.costs.movement import allocation_cost, data_movement_cost
from perfcounter.costs.norms import (layer_norm_cost, log_softmax_cost, rms_norm_cost,
                                     safe_softmax_cost, softmax_cost)
from perfcounter.costs.reductions import (cumulative_cost, exponential_cost, histc_cost, isin_cost,
                                          multinomial_cost, sort_cost, topk_cost, var_cost,
                                          vector_norm_cost)



def runs_alone(name: str) -> bool:
    """Whether the op of a record named `name` stays one kernel of its own when compiled
    (OpInfo.extern: a matmul or attention); every other op fuses into its neighbours."""
    info = op_info_by_name(name)
    return info is not None and info.extern


def compiled_launches(trace) -> int:
    """Kernel launches the compiled regime charges a trace (pricing/predict.py): each call of
    an op that runs alone, and one fused kernel beside each of them and at each step's end
    (calibrate divides a compiled step's time by this)."""
    alone = sum(r.calls for r in trace.records
                if not r.op.startswith("prim.") and runs_alone(r.op))
    return 2 * alone + max(trace.steps, 1)


__all__ = [
    "runs_alone", "compiled_launches",
    "COSTS", "OPS", "PER_ELEMENT", "ZERO", "Cost", "OpInfo", "Shape", "dtype_of", "first_shape",
    "is_complex", "kinds", "numel", "op_info", "op_info_by_name", "op_name", "register",
    "shape_tree",
    "attention_cost", "causal_pairs", "efficient_forward_cost", "flash_forward_cost",
    "flex_attention_cost", "sdpa_composite_cost", "sdpa_cpu_flash_cost", "sdpa_efficient_cost",
    "sdpa_flash_cost", "window_pairs",
    "add_cost", "arange_cost", "clamp_cost", "gelu_cost", "mul_cost", "polar_cost", "pow_cost",
    "embedding_cost", "gather_cost", "index_add_cost", "index_add_inplace_cost", "index_copy_cost",
    "index_cost", "index_put_cost", "index_select_cost", "scatter_add_cost", "scatter_cost",
    "addmm_cost", "baddbmm_cost", "bmm_cost", "conv_cost", "conv_transpose_cost", "convnd_cost",
    "grouped_mm_cost", "linear_cost", "mm_cost",
    "allocation_cost", "data_movement_cost", "collective_cost",
    "layer_norm_cost", "log_softmax_cost", "rms_norm_cost", "safe_softmax_cost", "softmax_cost",
    "cumulative_cost", "exponential_cost", "histc_cost", "isin_cost", "multinomial_cost",
    "sort_cost", "topk_cost", "var_cost", "vector_norm_cost",
]
