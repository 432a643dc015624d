"""The fixed costs of running ops, measured for `perfcounter calibrate` (op_rates.py's module
doc says what each is): one direct op call, a tiny transformer's eager decode step per op
call (warm, with the caches streamed, and in each other dtype calibrated), per launch of its
compiled step and per compiled step (two depths compared; on a GPU also of its prefill
compiled for any prompt length), one CUDA graph's launch per step, a tiny kernel's device
time."""
from __future__ import annotations

import torch

from perfcounter.costs import compiled_launches
from perfcounter.devices.dtypes import as_dtype, dtype_name
from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.devices.timing import MiB, cache_levels, check_budget, time_calls
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


def graph_timer(device):
    """A function timing one CUDA graph's launch and host synchronization, a step's
    `cudagraphs` overhead (a graph of one tiny kernel, captured here, replayed; wall clock);
    None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    graph = tiny_graph(device, 1)
    return lambda: time_calls(lambda: graph.replay, device, 0.05)


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


def eager_timers(device, min_time: float = 0.1, clock: str = "wall"):
    """(op calls a step, {"warm", "streams", "cold": a function that times it once}) of a
    tiny transformer's decode step: warm; the streams of 4x the L2 cache (8 MiB when unknown)
    alone, one per linear layer; the step with a stream before each linear layer (cold)."""
    device = torch.device(device)
    model, step = tiny_decode_step(device)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    stream = torch.ones(max(cache_levels().get(2, 2 * MiB) * 4, 8 * MiB) // 4, device=device)

    def flush(*_):
        stream.add_(1.0)

    def cold() -> float:
        hooks = [m.register_forward_pre_hook(flush) for m in linears]
        try:
            return time_calls(lambda: step, device, 2 * min_time, clock)
        finally:
            for h in hooks:
                h.remove()
    with torch.no_grad():
        step()
        with PerformanceCounterMode() as mode:
            step()
    calls = max(1, sum(r.calls for r in mode.trace().records if not r.op.startswith("prim.")))
    return calls, {"warm": lambda: time_calls(lambda: step, device, min_time, clock),
                   "streams": lambda: time_calls(lambda: lambda: [flush() for _ in linears],
                                                 device, min_time, clock),
                   "cold": cold}


def eager_figures(calls: int, times: dict[str, float]) -> dict[str, float]:
    """{"eager": s, "eager_cold": s} per op call from eager_timers' times: warm / calls; the
    cold step less its streams (never below warm) / calls."""
    return {"eager": times["warm"] / calls,
            "eager_cold": max(times["cold"] - times["streams"], times["warm"]) / calls}


def dtype_timers(device, dtypes, min_time: float = 0.1, clock: str = "wall"):
    """({"eager_<dtype>": op calls a step}, {"eager_<dtype>": a function that times it once})
    of the tiny transformer's decode step in each of `dtypes` other than float32 (float32's
    is eager_timers'): a program computing in bfloat16 costs the host more a call than one
    in float32 (the tiny step as generate.py runs it, an H200's host: 7.3-7.5 us against
    6.3-6.6 in its fast rounds; this 2-core CPU: 4.2-4.3 against 2.7;
    `python benchmarks/bench_host_states.py`, docs/measured.md#on-a-gpu), and a model is
    priced at its own dtype's figure (achievable.overhead)."""
    calls, timers = {}, {}
    for dtype in dtypes:
        if as_dtype(dtype) == torch.float32:
            continue
        _, step = tiny_decode_step(device, dtype=as_dtype(dtype))
        key = f"eager_{dtype_name(as_dtype(dtype))}"
        with torch.no_grad():
            step()
            with PerformanceCounterMode() as mode:
                step()
        calls[key] = max(1, sum(r.calls for r in mode.trace().records
                                if not r.op.startswith("prim.")))
        timers[key] = lambda step=step: time_calls(lambda: step, device, min_time, clock)
    return calls, timers


def eager_overheads(device, min_time: float = 0.1, clock: str = "wall") -> dict[str, float]:
    """{"eager": s, "eager_cold": s} per recorded op call of a tiny transformer's decode
    step (see the module doc), timed once; eager_cold with a stream of 4x the L2 cache
    before each linear layer, the streams' own time taken off."""
    calls, timers = eager_timers(device, min_time, clock)
    with torch.no_grad():
        return eager_figures(calls, {name: timer() for name, timer in timers.items()})


def tiny_decode_step(device, n_layer: int = 4, dtype=torch.float32):
    """(model, step): a tiny transformer (`n_layer` layers of dim 64, GQA, rotary, KV cache,
    SwiGLU) in `dtype` and one decode step of it, whose work is next to nothing: what is
    timed is the cost of running its ops (eager_timers, compiled_timers)."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(block_size=64, vocab_size=256, n_layer=n_layer, n_head=4,
                                  n_local_heads=2, dim=64, intermediate_size=128))
    model = model.to(device=device, dtype=dtype)
    model.setup_caches(max_batch_size=1, max_seq_length=64)
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.tensor([8], device=device)

    def step():
        return model(idx, pos).argmax(-1)
    return model, step


COMPILED_DEPTHS = (2, 8)  # layers of the two tiny models compiled_fit compares


def compiled_timers(device, min_time: float = 0.1, clock: str = "wall"):
    """([launches], [a function that times the step once]) of the tiny transformer's decode
    step compiled at each of COMPILED_DEPTHS (compiled once, here), its launches counted as
    the compiled regime charges them (costs.compiled_launches: each matmul and attention
    call, and a fused kernel beside each)."""
    launches, timers = [], []
    for i, n_layer in enumerate(COMPILED_DEPTHS):
        check_budget()  # a compilation takes seconds: none started past the budget
        _, step = tiny_decode_step(device, n_layer)
        if i == 0 and hasattr(torch._dynamo, "reset_code"):  # an earlier calibration's entries
            torch._dynamo.reset_code(step.__code__)  # for this step count toward Dynamo's
            # recompile limit (8 a code object), past which it would run the step eager
        with torch.no_grad():
            with PerformanceCounterMode() as mode:
                step()
            launches.append(compiled_launches(mode.trace()))
            compiled = torch.compile(step)
            compiled(), compiled()  # compilation, then a warm call
        timers.append(lambda compiled=compiled: time_calls(lambda: compiled, device, min_time,
                                                           clock))
    return launches, timers


DYNAMIC_TOKENS = 8  # the prompt the tiny model's dynamic prefill is timed at


def tiny_prefill(model, x, pos):
    """The tiny model's prefill as generate.prefill runs it greedily: the last position's
    most likely token (a module-level function: its compiled entries are its own)."""
    return model(x, pos)[:, -1].argmax(-1)


def dynamic_timers(device, min_time: float = 0.1, clock: str = "wall"):
    """([launches], [a function that times the call once]) of the tiny transformer's prefill
    compiled for any prompt length (torch.compile(dynamic=True), as generate.py and gpt-fast
    compile theirs) at each of COMPILED_DEPTHS, called at DYNAMIC_TOKENS tokens. Its host
    pays more a launch and a step than the static step's (the wrapper computes each launch's
    sizes from symbols; the guards check them): on an H100 the tiny model's fit read 15.0 us a
    launch and 170 us a step at 8 tokens, against 13.2 and 136 static
    (benchmarks/bench_compiled_prefill.py, docs/measured.md#on-a-gpu)."""
    launches, timers = [], []
    if hasattr(torch._dynamo, "reset_code"):  # an earlier calibration's entries count toward
        torch._dynamo.reset_code(tiny_prefill.__code__)  # the recompile limit
    compiled = torch.compile(tiny_prefill, dynamic=True)
    for n_layer in COMPILED_DEPTHS:
        model, _ = tiny_decode_step(device, n_layer)
        x = torch.zeros(1, DYNAMIC_TOKENS, dtype=torch.long, device=device)
        pos = torch.arange(DYNAMIC_TOKENS, device=device)
        with torch.no_grad():
            with PerformanceCounterMode() as mode:
                tiny_prefill(model, x, pos)
            launches.append(compiled_launches(mode.trace()))
            compiled(model, x, pos), compiled(model, x, pos)  # compilation, then a warm call
        timers.append(lambda model=model, x=x, pos=pos: time_calls(
            lambda: lambda: compiled(model, x, pos), device, min_time, clock))
    return launches, timers


def compiled_fit(launches: list[int], seconds: list[float]) -> dict[str, float]:
    """{"compiled": s per kernel launch, "compiled_step": s per step} from the compiled tiny
    step's time at two depths: t = step + launches x per launch. The deeper model's extra
    time over its extra launches is the cost per launch (what each layer adds: its launches
    and its guards); what is left of the shallow model's time is the step's own (the
    compiled program's entry, its guards and wrapper, the host's synchronization). On a GPU
    a compiled decode step is bound by them (a 1B model's compiled step on an H200: 3.6-4.3
    ms, against 1.1 ms as one CUDA graph); a single model's time over its launches would
    charge every launch the entry's share. A deeper step no slower (noise): the shallow
    step's time over its launches, no step figure."""
    per_launch = max(seconds[1] - seconds[0], 0.0) / max(launches[1] - launches[0], 1)
    if per_launch <= 0.0:
        per_launch = seconds[0] / max(launches[0], 1)
    return {"compiled": per_launch,
            "compiled_step": max(seconds[0] - launches[0] * per_launch, 0.0)}


class HostCosts:
    """The host's fixed costs of running ops (eager, eager_cold, compiled, compiled_step and,
    on a GPU, cudagraphs), from timings that `sample()` takes again each time it is
    called, the fastest of each timing kept (`figures()`).

    A host moves between speeds over seconds, not over one timing's tenth of a second: on an
    H200's 16-core host the same tiny decode step ran 6.2 us an op call, then 10.5 and 11.1
    a few seconds later, then 6.4 again (`python benchmarks/bench_host_states.py`,
    docs/measured.md#on-a-gpu). Neighbours and power states only ever slow the host down,
    so calibrate samples it between its other parts and keeps the fast state: the cost a
    step can count on. `spread()` records how far the samples fell apart.

    "compiled" and "compiled_step" come from the tiny step compiled at COMPILED_DEPTHS
    (compiled_fit) on every device: a compiled step's launches and its entry (Dynamo's guards,
    the wrapper's Python) are what the host pays, a CPU's as a GPU's (SmolLM2-135M's compiled
    decode step on a 2-core CPU spent 0.84 ms a step in Dynamo's cache lookup alone,
    against 0.41 ms for all its 363 launches at one direct op call each:
    benchmarks/bench_compiled_host.py, docs/measured.md); on CUDA
    also one CUDA graph's launch (graph_timer) and the same fit of the tiny prefill compiled
    for any prompt length (dynamic_timers: "compiled_dynamic", "compiled_dynamic_step"; a
    CPU's compiled prefill is bound by its kernels, its static figures serve).
    "eager_<dtype>", for each of `dtypes` other than float32: the eager step in that dtype
    (dtype_timers)."""

    def __init__(self, device, clock: str = "wall", min_time: float = 0.1, dtypes=(),
                 compiled: bool = True):
        self.device, self.clock, self.min_time = torch.device(device), clock, min_time
        self.calls, self.timers = eager_timers(self.device, min_time, clock)
        self.dtype_calls, timers = dtype_timers(self.device, dtypes, min_time, clock)
        self.timers.update(timers)
        self.launches: list[int] = []
        self.dynamic_launches: list[int] = []
        self.fastest: dict[str, float] = {}
        self.samples: list[dict[str, float]] = []  # each sample's figures
        if compiled:
            self.add_compiled()

    def add_compiled(self) -> None:
        """The compiled programs' timers (compiled_timers; on CUDA also graph_timer and
        dynamic_timers): seconds of torch.compile, so that a measurement for an eager run
        leaves them out and calibrate adds them after what an eager run needs."""
        device, min_time, clock = self.device, self.min_time, self.clock
        self.launches, compiled = compiled_timers(device, min_time, clock)
        self.timers.update({f"compiled {n}": t for n, t in zip(COMPILED_DEPTHS, compiled)})
        if device.type == "cuda":
            self.timers["graph"] = graph_timer(device)
            self.dynamic_launches, dynamic = dynamic_timers(device, min_time, clock)
            self.timers.update({f"dynamic {n}": t for n, t in zip(COMPILED_DEPTHS, dynamic)})

    def sample(self) -> dict[str, float]:
        """Every timing once; the fastest of each kept. Returns this sample's figures."""
        with torch.no_grad():
            times = {name: timer() for name, timer in self.timers.items()}
        for name, seconds in times.items():
            self.fastest[name] = min(seconds, self.fastest.get(name, seconds))
        figures = self.figures(times)
        self.samples.append(figures)
        return figures

    def figures(self, times: dict[str, float] | None = None) -> dict[str, float]:
        """The overheads from `times` (default: the fastest of every sample)."""
        t = self.fastest if times is None else times
        out = eager_figures(self.calls, t)
        out.update({key: t[key] / calls for key, calls in self.dtype_calls.items()
                    if key in t})
        if all(f"compiled {n}" in t for n in COMPILED_DEPTHS):
            out.update(compiled_fit(self.launches,
                                    [t[f"compiled {n}"] for n in COMPILED_DEPTHS]))
        if "graph" in t:
            out["cudagraphs"] = t["graph"]
        if f"dynamic {COMPILED_DEPTHS[0]}" in t:
            fit = compiled_fit(self.dynamic_launches,
                               [t[f"dynamic {n}"] for n in COMPILED_DEPTHS])
            out.update(compiled_dynamic=fit["compiled"], compiled_dynamic_step=fit["compiled_step"])
        return out

    def spread(self) -> dict[str, float]:
        """{figure: slowest sample / fastest - 1} over every sample (0.5: 50 %)."""
        out = {}
        for name in self.samples[-1] if self.samples else ():  # the last: every figure
            values = [s[name] for s in self.samples if name in s]
            lo, hi = min(values), max(values)
            out[name] = round(hi / lo - 1 if lo > 0 else 0.0, 3)
        return out
