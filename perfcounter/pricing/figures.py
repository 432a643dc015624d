"""A step's (or a phase's) figures by record group: everything price.py needs, plain data.

A group is one kernel's worth of records: one record of a counted trace (`figures_of`), or
in a serving step table one op of every layer and piece (serve/steps.py: a layer's pieces'
attention is one varlen kernel). Per group, in arrays of one entry a group:

    kind      "matmul" (a GEMV or a GEMM by its rows) or its op class (op_classes.op_class)
    dtype     the dtype it computes in
    weight    a matmul's (weight class, weight rows a call) (op_classes.gemv_weight), else None
    dense     an attention call with an explicit mask: priced at its dense FLOPs
    calls     op calls (kernels), flops (dense, as counted), executed_flops (causal kernels
              skip masked blocks), bytes (read + written), streamed (its weight and KV-cache
              reads: what a compiled phase's matmuls and attention stream), rows (a matmul's
              rows M a call), collective (a collective's (kind, ranks), else None: priced on
              the link by pricing/collectives.py from the bytes a call writes: link_bytes)

and per step: the compulsory bytes (each storage once: whether the step fits the device's
cache, the bound's least bytes), the fused IO (counting/fused_io.py; 0: not counted), the
steps it spans, the calls of records that move and compute nothing (views: eager dispatches
them), the dtype of most op calls (the host's cost per call) and the bytes that cross the
host link each way. Devices and regimes are price.py's; nothing here knows them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcounter.pricing.achievable import program_dtype
from perfcounter.pricing.collectives import record_call
from perfcounter.pricing.op_classes import (COLLECTIVE, gemv_weight, has_explicit_mask, matmul_rows,
                                            op_class)
from perfcounter.pricing.roofline import host_link_bytes
from perfcounter.trace import ROLES, Trace

_STREAMED = (ROLES.index("weight"), ROLES.index("kv_cache"))


@dataclass(slots=True)
class Figures:
    """A step's figures by record group (module doc); arrays of one entry a group."""

    kind: tuple  # "matmul" or the op class
    dtype: tuple
    weight: tuple  # (weight class, weight rows a call) of a matmul, None otherwise
    dense: np.ndarray  # bool: an attention call with an explicit mask
    calls: np.ndarray
    flops: np.ndarray
    executed_flops: np.ndarray
    bytes: np.ndarray
    streamed: np.ndarray  # weight and KV-cache reads
    rows: np.ndarray  # a matmul's rows M a call (0: not a matmul)
    collective: tuple  # (kind, ranks) of a collective (collectives.record_call), else None
    link_bytes: np.ndarray  # a collective's bytes written (its calls' messages), else 0
    compulsory_bytes: float
    fused_bytes: float = 0.0  # 0: not counted (price.py falls back on compulsory bytes)
    steps: int = 1
    view_calls: float = 0.0  # calls of records that move and compute nothing
    program_dtype: str | None = None
    to_device_bytes: float = 0.0
    to_host_bytes: float = 0.0

    def __len__(self) -> int:
        return len(self.kind)


def record_kind(op: str, args: tuple) -> str:
    """A record's kind: "matmul" for a GEMV or GEMM (its rows decide which), else its op class."""
    cls = op_class(op, args)
    return "matmul" if cls in ("gemv", "gemm") else cls


def figures_of(trace: Trace) -> tuple[Figures, list]:
    """(the figures of a counted trace, one group per record, and those records in group
    order). Metadata records (prim.*) are no op calls and have no group."""
    records = [r for r in trace.records if not r.op.startswith("prim.")]
    kinds = tuple(record_kind(r.op, r.args) for r in records)
    arr = lambda xs: np.array(xs, dtype=float)  # noqa: E731
    to_device, to_host = host_link_bytes(trace)
    fig = Figures(
        kind=kinds, dtype=tuple(r.dtype for r in records),
        weight=tuple(gemv_weight(r) if k == "matmul" else None for r, k in zip(records, kinds)),
        dense=np.array([k == "attention" and has_explicit_mask(r.args)
                        for r, k in zip(records, kinds)], dtype=bool),
        calls=arr([r.calls for r in records]), flops=arr([r.flops for r in records]),
        executed_flops=arr([r.executed_flops for r in records]),
        bytes=arr([r.bytes for r in records]),
        streamed=arr([sum(r.read[i] for i in _STREAMED) for r in records]),
        rows=arr([matmul_rows(r.op, r.args) if k == "matmul" else 0
                  for r, k in zip(records, kinds)]),
        collective=tuple(record_call(r)[::2] if k == COLLECTIVE else None
                         for r, k in zip(records, kinds)),
        link_bytes=arr([sum(r.written) if k == COLLECTIVE else 0 for r, k in zip(records, kinds)]),
        compulsory_bytes=float(trace.compulsory_bytes), fused_bytes=float(trace.fused_bytes),
        steps=max(trace.steps, 1), program_dtype=program_dtype(records),
        to_device_bytes=float(to_device), to_host_bytes=float(to_host))
    return fig, records


__all__ = ["Figures", "figures_of", "record_kind"]
