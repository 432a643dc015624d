"""The fixed costs of running ops, measured for `perfcounter calibrate` (op_rates.py's module
doc says what each is): one direct op call, a tiny transformer's eager decode step per op
call (warm, and with the caches streamed), per launch of its compiled step and per compiled
step (two depths compared), one CUDA graph's launch per step, a tiny kernel's device time."""
from __future__ import annotations

import torch

from perfcounter.costs import compiled_launches
from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.devices.timing import MiB, cache_levels, time_calls
from perfcounter.models.args import ModelArgs
from perfcounter.models.model import Transformer


def host_call_s(device, clock: str = "wall") -> float:
    """What each timed call's own figure holds beside the op's work, taken off before a
    rate is computed: on a CPU one direct op call's Python (call_overhead); on a GPU
    nothing (kernel-timed calls hold no host time)."""
    if torch.device(device).type == "cuda":
        return 0.0
    return call_overhead(device, clock=clock)


def tiny_graph(device: torch.device, kernels: int) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of `kernels` in-place adds of one element, captured on `device`."""
    a = torch.ones(1, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            a.add_(1.0)  # warm-up off the default stream, as capture asks
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            for _ in range(kernels):
                a.add_(1.0)
    return graph


def graph_launch_s(device, min_time: float = 0.05) -> float | None:
    """Seconds one CUDA graph's launch and host synchronization cost a step (the
    `cudagraphs` overhead: a graph of one tiny kernel replayed, wall clock); None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    graph = tiny_graph(device, 1)
    return time_calls(lambda: graph.replay, device, min_time)


GRAPH_KERNELS = 64  # tiny kernels in the graph kernel_time_s replays


def kernel_time_s(device, min_time: float = 0.05) -> float | None:
    """Seconds of device time one tiny kernel occupies a CUDA device (the `kernel` overhead:
    a CUDA graph of GRAPH_KERNELS adds of one element replayed, timed on the device, / the
    kernels: no host launch between them, each kernel's launch on the device, scheduling and
    tail); None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    graph = tiny_graph(device, GRAPH_KERNELS)
    return time_calls(lambda: graph.replay, device, min_time, kernel=True) / GRAPH_KERNELS


def call_overhead(device, min_time: float = 0.05, clock: str = "wall") -> float:
    """Seconds of one direct op call on tiny tensors (torch.add of 1-element tensors)."""
    a = torch.ones(1, device=device)
    return time_calls(lambda: lambda: [torch.add(a, a) for _ in range(20)], device,
                      min_time, clock) / 20


def eager_overheads(device, min_time: float = 0.1, clock: str = "wall") -> dict[str, float]:
    """{"eager": s, "eager_cold": s} per recorded op call of a tiny transformer's decode
    step (see the module doc); eager_cold with a stream of 4x the L2 cache (8 MiB when
    unknown) before each linear layer, the streams' own time taken off."""

    model, step = tiny_decode_step(device)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    stream = torch.ones(max(cache_levels().get(2, 2 * MiB) * 4, 8 * MiB) // 4, device=device)

    def flush(*_):
        stream.add_(1.0)
    with torch.no_grad():
        step()
        with PerformanceCounterMode() as mode:
            step()
        calls = max(1, sum(r.calls for r in mode.trace().records if not r.op.startswith("prim.")))
        warm = time_calls(lambda: step, device, min_time, clock)
        streams = time_calls(lambda: lambda: [flush() for _ in linears], device, min_time, clock)
        hooks = [m.register_forward_pre_hook(flush) for m in linears]
        try:
            cold = time_calls(lambda: step, device, 2 * min_time, clock)
        finally:
            for h in hooks:
                h.remove()
    return {"eager": warm / calls, "eager_cold": max(cold - streams, warm) / calls}


def tiny_decode_step(device, n_layer: int = 4):
    """(model, step): a tiny transformer (`n_layer` layers of dim 64, GQA, rotary, KV cache,
    SwiGLU) and one decode step of it, whose work is next to nothing: what is timed is the
    cost of running its ops (eager_overheads, compiled_costs)."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(block_size=64, vocab_size=256, n_layer=n_layer, n_head=4,
                                  n_local_heads=2, dim=64, intermediate_size=128)).to(device)
    model.setup_caches(max_batch_size=1, max_seq_length=64)
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.tensor([8], device=device)

    def step():
        return model(idx, pos).argmax(-1)
    return model, step


COMPILED_DEPTHS = (2, 8)  # layers of the two tiny models compiled_costs compares


def compiled_costs(device, min_time: float = 0.1, clock: str = "wall") -> dict[str, float]:
    """{"compiled": s per kernel launch, "compiled_step": s per step} of a compiled decode
    step, from the tiny transformer at two depths (COMPILED_DEPTHS) under torch.compile: each
    step timed, and its launches counted as the compiled regime charges them
    (costs.compiled_launches: each matmul and attention call, and a fused kernel beside each).
    t = step + launches x per launch: the deeper model's extra time over its extra launches
    is the cost per launch (what each layer adds: its launches, and its guards); what is
    left of the shallow model's time is the step's own (the compiled program's entry, its
    guards and wrapper, the host's synchronization). On a GPU a compiled decode step is
    bound by them (a 1B model's compiled step on an H200: 3.4-5.1 ms, against 1.2 ms as one
    CUDA graph); a single model's time over its launches charges every launch the entry's
    share (24.5 us there, against ~15 us per launch in a 1B model's step)."""
    seconds, launches = [], []
    for n_layer in COMPILED_DEPTHS:
        _, step = tiny_decode_step(device, n_layer)
        with torch.no_grad():
            with PerformanceCounterMode() as mode:
                step()
            launches.append(compiled_launches(mode.trace()))
            compiled = torch.compile(step)
            compiled(), compiled()  # compilation, then a warm call
            seconds.append(time_calls(lambda: compiled, device, min_time, clock))
    per_launch = max(seconds[1] - seconds[0], 0.0) / max(launches[1] - launches[0], 1)
    if per_launch <= 0.0:  # the deeper step ran no slower: noise; the shallow one's average
        per_launch = seconds[0] / max(launches[0], 1)
    return {"compiled": per_launch,
            "compiled_step": max(seconds[0] - launches[0] * per_launch, 0.0)}
