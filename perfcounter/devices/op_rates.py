"""The micro-benchmarks behind predictions: per-op-class rates, matmuls by rows, per-op overheads.

Rates for predictions (predict.py), per op class and dtype over working-set
size (`op_curves`): each point times a representative op — gemv: x[1,K] @
W[N,K]ᵀ and the same bytes with K 4x as long, times summed (a feed-forward's up and
down projections; FLOP/s: x[16,K], the skinniest that is still a GEMV); gemm: n×n @ n×n;
attention: SDPA, one query over L keys (bandwidth) and, for FLOP/s, L over L
as a decoder's prefill calls it (32 query heads over 8 key/value heads, an
explicit causal mask); elementwise: c = a + b (strided: a[::2] * b[::2], n elements
counted from each, as the counter counts a view); reduction: softmax over rows
of 1024; indexing: an embedding gathering rows of 1024 — twice: warm (the
same operands again: small sets run from cache) and cold (operands carved in
turn from one pool, the triad's arrays, larger than the cache, so that each
call reads memory). The Python cost of one direct op call (timed on 1-element
tensors) is taken off each call before a rate is computed. gemm takes its
bandwidths from the gemv points.
Matmuls by rows (`matmul_rows`): x[M,K] @ W[N,K]ᵀ with a cold 16 MiB weight (a GPU: 64 MiB),
K = 2048 and 8192 (a feed-forward's up and down projections), for M of 2 to
1024 rows (a GPU: to 4096), FLOP/s each: a linear layer's layout and sizes (CPU kernels compute
a few rows about as long as many: 8 rows take as long as 16; a few hundred
rows run below the square n×n @ n×n rate, further below in bfloat16).
Per-op overheads (`op_overhead_s`): eager = the time of a tiny transformer's
decode step (perfcounter.models.model: 4 layers of dim 64, GQA, rotary, KV cache,
SwiGLU; under no_grad as generate.py runs; its work is next to nothing)
divided by the op calls the counter records in it, views included: the
dispatch and the model's Python between ops; eager_cold = the same with a
stream of 4x the L2 cache before each linear layer (its own time taken off),
as a model whose weights stream through the caches runs: each op then finds
the interpreter's and dispatcher's state evicted (several times the warm
figure: `perfcounter calibrate` prints both); compiled and compiled_step = the same tiny step
compiled at 2 and 8 layers (overheads.compiled_fit): per kernel launch and per step's entry.

Operands come from one pool (`calibrate` hands it the triad's arrays, larger than
the cache), filled with normal numbers (`fill_operands`); `time_calls` times an op
cold or warm with `clock` (CLOCKS).

On a GPU the rates are the kernels' own (`time_calls(kernel=True)`): a GPU queues kernels
while the host goes on, so a call timed from the host (launch, then synchronize) measures the
host's ~10-15 us per call, not the kernel: on an H200 every class read 5 GB/s at 64 KiB and
at most 1.2 TB/s at 16 MiB that way (a 1B model's CUDA-graph decode then ran 0.39x its
prediction). Each call is timed by CUDA events on the device, queued behind a short spin
kernel so that the host has enqueued the op before the device reaches it; a kernel's fixed
device-side cost stays in its figure, as it does in a CUDA graph. The working sets reach
past the GPU's L2 cache (calibrate sizes the pool at 6x L2): a 16 MiB set runs from an
H100's or H200's 50-60 MB L2. Per-op overheads stay host figures: they are what the host pays.
"""
from __future__ import annotations

import bisect
import math

import torch
import torch.nn.functional as F

from perfcounter.devices.dtypes import dtype_name
from perfcounter.devices.overheads import (  # noqa: F401 (calibrate's names, re-exported)
    HostCosts, call_overhead, compiled_fit, eager_overheads, graph_timer, host_call_s,
    kernel_time_s, tiny_decode_step)
from perfcounter.devices.timing import (  # noqa: F401 (re-exported)
    CLOCKS, MAX_CALLS, MiB, cache_levels, check_clock, kernel_seconds, last_level_cache_bytes,
    sync, time_calls)

ROW = 1024  # row length of the reduction and indexing ops
SKINNY = 16  # rows of the matmul that gives the gemv class its FLOP/s (predict.SKINNY_ROWS)


def fill_operands(pool: torch.Tensor, block_bytes: int = 4 * MiB) -> None:
    """Fill a float32 pool with values that are normal numbers read as float32 and as
    bfloat16 alike (pairs of bfloat16 in [0.5, 1.5)): no zeros, denormals or NaNs, whose
    arithmetic runs at other speeds than a model's weights (a bfloat16 matmul of
    weights half zeros ran faster than of random weights)."""
    flat = pool.view(-1)
    n = max(1, min(flat.numel(), block_bytes // 4))
    block = (torch.rand(2 * n, device=pool.device) + 0.5).to(torch.bfloat16).view(torch.float32)
    full = flat.numel() // n * n
    flat[:full].view(-1, n).copy_(block)
    flat[full:].copy_(block[:flat.numel() - full])


class _Pool:
    """Operands carved in turn from one big buffer, so that a call finds them cold."""

    def __init__(self, pool: torch.Tensor):
        self.bytes = pool.view(torch.uint8)
        self.offset = 0

    def take(self, shape, dtype) -> torch.Tensor:
        """The next `shape` of `dtype` (from the start again when the pool is used up)."""
        n = math.prod(shape) * dtype.itemsize
        size = -(-n // 64) * 64  # 64-byte aligned
        if self.offset + size > self.bytes.numel():
            self.offset = 0
        view = self.bytes[self.offset:self.offset + n].view(dtype).view(shape)
        self.offset += size
        return view


def _operands(cls: str, ws: float, dt: torch.dtype, device, wide: bool = False):
    """(shapes, op on those operands, bytes, FLOPs) of class `cls` at about `ws` bytes;
    `wide`: gemv with an inner dim 4x as long (a feed-forward's down projection)."""
    e = dt.itemsize
    if cls == "gemv":  # the activation is a tensor of its own: only weights come from the pool
        k = min(2048, max(64, 2 ** round(math.log2(math.sqrt(ws / e))))) * (4 if wide else 1)
        n = max(1, int(ws / e / k))
        x = torch.rand(1, k, device=device).to(dt)
        return [(n, k)], lambda w: torch.mm(x, w.t()), (k + n * k + n) * e, 2 * n * k
    if cls == "gemm":
        n = max(16, min(1024, int(math.sqrt(ws / e / 3))))
        return [(n, n), (n, n)], torch.mm, 3 * n * n * e, 2 * n ** 3
    if cls == "attention":  # one query over L keys: bandwidth
        length = max(16, int(ws / e / (2 * 8 * 64)))
        q = torch.rand(1, 8, 1, 64, device=device).to(dt)
        return ([(1, 8, length, 64), (1, 8, length, 64)],
                lambda k, v: F.scaled_dot_product_attention(q, k, v),
                (2 * length + 2) * 8 * 64 * e, 4 * 8 * length * 64)
    if cls == "elementwise":
        n = max(16, int(ws / e / 3))
        return [(n,), (n,)], torch.add, 3 * n * e, n
    if cls == "strided":  # a multiply of two stride-2 views (rotary's halves): n counted each
        n = max(16, int(ws / e / 3))
        return [(2 * n,), (2 * n,)], lambda a, b: torch.mul(a[::2], b[::2]), 3 * n * e, n
    rows = max(1, int(ws / e / ROW / 2))
    if cls == "reduction":
        return [(rows, ROW)], lambda x: torch.softmax(x, -1), 2 * rows * ROW * e, 5 * rows * ROW
    table = 4 * rows  # rows gathered from a table four times their size
    idx = torch.randint(0, table, (rows,), device=device)
    return [(table, ROW)], lambda w: F.embedding(idx, w), 2 * rows * ROW * e, 0


def attention_flops(length: int, dt, device, min_time: float, clock: str = "wall") -> float:
    """FLOP/s of SDPA as a decoder's prefill runs it: L queries in 32 heads of 64 over L keys
    in 8 (grouped-query), under an explicit causal mask; dense: 4·32·L²·64 FLOPs (a fused
    kernel computes every block under a mask, see predict.has_explicit_mask)."""
    q = torch.rand(1, 32, length, 64, device=device).to(dt)
    kv = torch.rand(1, 8, length, 64, device=device).to(dt)
    mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    seconds = time_calls(lambda: lambda: F.scaled_dot_product_attention(
        q, kv, kv, attn_mask=mask, enable_gqa=True), device, min_time, clock, kernel=True)
    return 4 * 32 * length * length * 64 / seconds


def attention_length(device) -> int:
    """The longest sequence attention_flops times: 512 on a CPU (a call of 4·32·512²·64 =
    2.1 GFLOPs), 2,048 on a GPU, whose attention kernels fill the device only at a long
    prompt's length (an H200's SDPA, head dim 64 under a causal mask: 96 TFLOP/s at 512,
    226 at 2,048, the rate a 2,048-token prompt's attention runs at: docs/measured.md)."""
    return 2048 if torch.device(device).type == "cuda" else 512


ROW_K = (256, 4096)  # the inner dims gemv_row_seconds compares, at the same weight bytes


ROW_MS = (1, SKINNY)  # activation rows at which gemv_row_seconds measures (predict interpolates)


def gemv_row_seconds(pool: torch.Tensor, dtypes, device, min_time: float,
                     clock: str = "wall") -> dict[str, dict[int, float]]:
    """{dtype name: {M: seconds per weight row}} for M of ROW_MS: x[M,K] @ W[N,K]ᵀ over the
    same cold 8 MiB of weights at K = 256 and 4096 (N = bytes / K, the same FLOPs): t = work
    + N · t_row, so t_row = (t_256 - t_4096) / (N_256 - N_4096). Each weight row starts its
    dot products afresh (prefetch ramp, horizontal sums, stores): measured 1 thread, float32,
    ~80 ns at M = 1 and ~120 ns at 16, which makes a K = 576 GEMV stream at half the rate of
    a K = 4096 one."""
    carve, direct = _Pool(pool), host_call_s(device, clock)
    wbytes = min(8 * MiB, pool.numel() * pool.element_size() // 4)
    out: dict[str, dict[int, float]] = {}
    for dt in dtypes:
        for m in ROW_MS:
            t, n = [], []
            for k in ROW_K:
                rows = max(1, wbytes // (k * dt.itemsize))
                x = torch.rand(m, k, device=device).to(dt)
                s = time_calls(lambda: (lambda w: lambda: torch.mm(x, w.t()))(
                    carve.take((rows, k), dt)), device, min_time / 8, clock, kernel=True)
                t.append(max(s - direct, 0.25 * s))
                n.append(rows)
            out.setdefault(dtype_name(dt), {})[m] = max(0.0, (t[0] - t[1]) / (n[0] - n[1]))
    return out


def row_seconds(row_s: dict | None, dtype: str, m: int) -> float:
    """Seconds per weight row at M activation rows from {dtype: {M: s}} (gemv_row_seconds):
    linear in log M between the measured M, the end points beyond them; 0 without figures."""
    table = (row_s or {}).get(dtype) or {}
    if not table:
        return 0.0
    ms = sorted(table)
    if m <= ms[0] or len(ms) == 1:
        return table[ms[0]] if m <= ms[0] else table[ms[-1]]
    if m >= ms[-1]:
        return table[ms[-1]]
    i = bisect.bisect_left(ms, m)
    lo, hi = ms[i - 1], ms[i]
    w = math.log(m / lo) / math.log(hi / lo)
    return table[lo] * (1 - w) + table[hi] * w


CURVE_CLASSES = ("gemv", "gemm", "attention", "elementwise", "reduction", "indexing", "strided")


def op_curves(pool: torch.Tensor, dtypes, device, min_time: float, clock: str = "wall",
              row_s: dict | None = None, classes=CURVE_CLASSES) -> dict:
    """{class: {dtype name: [(working set B, warm B/s, cold B/s, FLOP/s), ...]}} for each of
    `classes`; row_s ({dtype name: {M: s}}, gemv_row_seconds): each gemv point's own rows'
    share taken off its times (the curve then streams; predict.py adds each GEMV's rows
    apart). gemm's bandwidths are the gemv curve's where both are measured (share_gemm)."""
    carve, direct = _Pool(pool), host_call_s(device, clock)
    largest = pool.numel() * pool.element_size() / 4  # each cold operand set: a quarter of the pool
    sizes = [s for s in (64 << 10, 1 << 20, 16 << 20, 128 << 20) if s <= largest] or [largest]
    per_point = min_time / 5
    curves: dict = {}

    def timed(shapes, op, dt, time_each) -> list[float]:
        """[warm s, cold s] per call of op on operands of `shapes` carved from the pool."""
        def make(cold):
            if not cold:  # the same operands every call
                carve.offset = 0
            args = [carve.take(s, dt) for s in shapes]
            return lambda: op(*args)
        return [max(t - direct, 0.25 * t) for t in (
            time_calls(lambda: make(False), device, time_each, clock, kernel=True),
            time_calls(lambda: make(True), device, time_each, clock, kernel=True))]
    for dt in dtypes:
        for cls in classes:
            points = []
            for ws in sizes:
                shapes, op, nbytes, flops = _operands(cls, ws, dt, device)
                if cls == "gemv":  # a GEMV's speed depends on its inner dim (bfloat16: K = 8192
                    # streams slower than 2048): both of a feed-forward's, times summed
                    wide_shapes, wide_op, wide_bytes, _ = _operands(cls, ws, dt, device, True)
                    warm_s, cold_s = (a + b for a, b in zip(
                        timed(shapes, op, dt, per_point / 2),
                        timed(wide_shapes, wide_op, dt, per_point / 2)))
                    moved = nbytes + wide_bytes
                    rows_s = (shapes[0][0] + wide_shapes[0][0]) * row_seconds(
                        row_s, dtype_name(dt), 1)
                    warm_s, cold_s = (max(s - rows_s, 0.5 * s) for s in (warm_s, cold_s))
                else:
                    (warm_s, cold_s), moved = timed(shapes, op, dt, per_point), nbytes
                if cls == "gemv":  # FLOP/s of the skinniest matmul that still is one: 16 rows
                    x16 = torch.rand(SKINNY, shapes[0][1], device=device).to(dt)
                    t16 = time_calls(lambda: (lambda w: lambda: torch.mm(x16, w.t()))(
                        carve.take(shapes[0], dt)), device, per_point, clock, kernel=True)
                    flops_s = 2 * SKINNY * shapes[0][0] * shapes[0][1] / max(t16 - direct,
                                                                            0.25 * t16)
                elif cls == "attention":
                    flops_s = attention_flops(min(attention_length(device), shapes[0][2]), dt,
                                              device, per_point, clock)
                else:
                    flops_s = max(flops, 1) / warm_s
                if points and nbytes <= points[-1][0]:
                    continue
                points.append((float(nbytes), moved / warm_s, moved / cold_s, flops_s))
            curves.setdefault(cls, {})[dtype_name(dt)] = points
    share_gemm(curves)
    return curves


ROWS = (2, 4, 8, SKINNY, 32, 64, 128, 256, 512, 1024)  # the row counts matmul_rows times


ROW_KS = (2048, 8192)  # the inner dims matmul_rows times: a feed-forward's up (d) and down (4d)
GPU_ROWS = (2048, 4096)  # more rows timed on a GPU: a long prompt's prefill, at the GPU's rate


ROWS_CAP_S = 1.0  # a rows point whose calls took longer: the table ends there (more rows
# are priced at its FLOP/s, predict.rows_flops); a float32 1024-row point takes ~0.5 s on a
# quiet 2-core CPU, a bfloat16 256-row one ~1.4 s on a CPU without bfloat16 units


def matmul_rows(pool: torch.Tensor, dtypes, device, min_time: float,
                clock: str = "wall", row_s: dict | None = None, rows=None) -> dict:
    """{dtype name: {rows M: FLOP/s}}: x[M,K] @ W[N,K]ᵀ, W cold and about 16 MiB, for each K
    of ROW_KS (N = 16 MiB / K), at each M of ROWS; on a GPU W of 64 MiB (16 MiB at K = 8,192
    is N = 1,024: 64 output tiles of 128² at 1,024 rows, fewer than an H200's 132 SMs; its
    1,024 rows ran 614 TFLOP/s, a 4096² matmul 773) and also M of GPU_ROWS; the FLOP/s of
    the two calls together
    (their times summed: a bfloat16 matmul of K = 8192 runs slower than one of 2048
    at a few hundred rows); the weight rows' share (row_s, gemv_row_seconds) taken off, as
    predict.py adds it apart. See predict.rows_flops. `rows`: only those of them (None: all);
    a dtype's table ends after a point whose calls took over ROWS_CAP_S."""
    carve, direct = _Pool(pool), host_call_s(device, clock)
    gpu = torch.device(device).type == "cuda"
    budget = min(64 * MiB if gpu else 16 * MiB, pool.numel() * pool.element_size() // 4)
    out = {}
    for dt in dtypes:
        table, took = {}, 0.0
        for m in ROWS + (GPU_ROWS if gpu else ()):
            if (rows is not None and m not in rows) or took > ROWS_CAP_S:
                continue
            flops = seconds = took = 0.0
            for k in ROW_KS:
                n = max(64, budget // (k * dt.itemsize))
                x = torch.rand(m, k, device=device).to(dt)
                t = time_calls(lambda: (lambda w: lambda: torch.mm(x, w.t()))(
                    carve.take((n, k), dt)), device, min_time / len(ROWS) / len(ROW_KS), clock,
                    kernel=True)
                flops, took = flops + 2 * m * n * k, took + t
                own = n * row_seconds(row_s, dtype_name(dt), m)
                seconds += max(t - direct - own, 0.25 * t)
            table[m] = flops / seconds
        out[dtype_name(dt)] = table
    return out


def share_gemm(curves: dict) -> None:
    """gemm's bandwidths from the gemv points (interpolated at each point's working set), for
    each dtype both curves have."""
    for dt, gemm in curves.get("gemm", {}).items():
        gemv = curves.get("gemv", {}).get(dt)
        if gemv:
            curves["gemm"][dt] = [(w, *interpolate(gemv, w)[:2], f) for w, _, _, f in gemm]


def interpolate(points, working_set: float) -> tuple[float, float, float]:
    """(warm B/s, cold B/s, FLOP/s) at `working_set`, log-log between measured points,
    the end points beyond them."""
    sizes = [p[0] for p in points]
    i = bisect.bisect_left(sizes, working_set)
    if i == 0:
        return points[0][1:]
    if i == len(points):
        return points[-1][1:]
    (x0, *a), (x1, *b) = points[i - 1], points[i]
    w = math.log(working_set / x0) / math.log(x1 / x0)
    return tuple(math.exp(math.log(u) * (1 - w) + math.log(v) * w) for u, v in zip(a, b))
