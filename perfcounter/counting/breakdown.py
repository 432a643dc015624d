"""Per-module breakdowns of a trace's records: torchao's flop_counts / io_counts shape
({module path or "Global": {op: n}}, every parent path included); llm-profiler's scopes
are module_kinds.record_scopes.

Every module that ran is a key of both the FLOPs and the bytes breakdowns, with {}
when it adds nothing (torchao's tests hold the two summaries to the same keys). A
fused attention kernel's FLOPs split in two (`flop_parts`): its matmuls under its own
op, torch's SDPA formula, and its softmax under "sdpa_softmax" (costs/attention.py).
"""
from __future__ import annotations

from perfcounter.costs.attention import FUSED_ATTENTION, SDPA_SOFTMAX, attention_matmul_flops
from perfcounter.trace import op_packet

GLOBAL = "Global"


def by_module_and_op(records, value, op_key=op_packet) -> dict[str, dict]:
    """{module path or 'Global': {op packet: Σ value(record)}}: torchao's flop_counts shape,
    each record counted under 'Global' and under every prefix of its module path.

    value(record) is a number, or a list of (op name, number) pairs for a record counted
    under several keys (see flop_parts). op_key(name) names the op ('aten.mm'; the mode's
    getters use torch's packets). Every record's module path is a key, {} when it adds
    nothing, so that the FLOPs and the bytes breakdowns have the same keys."""
    out: dict[str, dict] = {GLOBAL: {}}
    keys: dict[str, object] = {}
    for r in records:
        v = value(r)
        paths = [GLOBAL]
        if r.module:
            parts = r.module.split(".")
            paths += [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for p in paths:
            out.setdefault(p, {})
        for name, n in (v if isinstance(v, list) else [(r.op, v)]):
            if not n:
                continue
            op = keys.get(name)
            if op is None:
                op = keys[name] = op_key(name)
            for p in paths:
                ops = out[p]
                ops[op] = ops.get(op, 0) + n
    return out


def flop_parts(r):
    """A record's FLOPs for the per-op breakdowns: r.flops, or for a fused attention kernel
    [(its op, the matmuls: torch's SDPA formula), (SDPA_SOFTMAX, its softmax)]."""
    if r.flops and op_packet(r.op) in FUSED_ATTENTION:
        matmuls = attention_matmul_flops(r.kinds)
        return [(r.op, matmuls), (SDPA_SOFTMAX, r.flops - matmuls)]
    return r.flops


def flop_counts(records, op_key=op_packet) -> dict[str, dict]:
    """FLOPs by module path (every parent included) and op; 'Global' = all."""
    return by_module_and_op(records, flop_parts, op_key)


def io_counts(records, op_key=op_packet) -> dict[str, dict]:
    """Per-op bytes (read + written) by module path (every parent included) and op."""
    return by_module_and_op(records, lambda r: r.bytes, op_key)


def empty_row(with_roofline: bool) -> dict:
    """A zero row of a per-module (or per-scope) table: calls, FLOPs, bytes [, roofline s]."""
    row = {"calls": 0, "flops": 0, "executed_flops": 0, "bytes_read": 0, "bytes_written": 0}
    if with_roofline:
        row["roofline_s"] = 0.0
    return row

def add_row(out: dict, key: str, r, cost) -> None:
    """Add record `r` (and its roofline cost, when priced) to row `key` of `out`."""
    row = out.setdefault(key, empty_row(cost is not None))
    row["calls"] += r.calls
    row["flops"] += r.flops
    row["executed_flops"] += r.executed_flops
    row["bytes_read"] += sum(r.read)
    row["bytes_written"] += sum(r.written)
    if cost is not None:
        row["roofline_s"] += cost.latency_s
