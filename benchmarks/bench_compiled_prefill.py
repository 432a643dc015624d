"""What a prefill compiled for any prompt length costs beside a static compiled step: the
question two GPU calls left open (docs/measured.md#on-a-gpu: the SmolLM2 shape's compiled
prefill ran ~3.8 ms above its compiled decode step on an H100 and on an H200, with the same
launches counted).

    python benchmarks/bench_compiled_prefill.py                     # a CUDA GPU
    python benchmarks/bench_compiled_prefill.py --device cpu --layers 2 --rounds 1  # smoke test
    python benchmarks/bench_compiled_prefill.py --skip_tiny --model smollm2-135m,llama-3.2-1b \
        --layers 8    # what the shape adds: two models' shapes cut to the same depth

Two parts, each compiled as generate.py compiles it (the decode step static, the prefill
with dynamic=True):

1. calibrate's tiny transformer (overheads.tiny_decode_step) at 2 and 8 layers: the static
   decode step, and the prefill compiled dynamic at 1, 8 and 32 tokens; fastest of --rounds
   rounds, each call timed back to back (timing.time_calls); per depth the time a step and
   a launch (costs.compiled_launches), and the fit over the two depths (overheads.
   compiled_fit): what a launch and a step's entry cost in the static and the dynamic program.
2. a model's shape (--model, random weights; --layers to cut it short) at a --prompt-token
   prompt: its decode step static, its prefill dynamic and its prefill static, each timed
   back to back on the host's clock and, on a GPU, on the device's (the calls' kernels
   queued behind a spin kernel twice the host's time, so that they run back to back: what
   the device spends; before 2026-11-26 the spin lasted ~100 us, shorter than a model's
   enqueue, and the device column followed the host), then once after 8 decode steps (as
   gpu_check times a prefill), and under torch.profiler: the host's time a call in Dynamo's
   cache lookup and in the compiled graph's own code, and on a GPU the kernels a call ran
   beside the launches the compiled regime counts (costs.compiled_launches). A call bound
   by its host shows a device time far below its host time; one bound by its kernels, the
   two alike; one that runs more kernels than counted pays launches no prediction charged.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import generate  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.costs import compiled_launches  # noqa: E402
from perfcounter.counting.mode import PerformanceCounterMode  # noqa: E402
from perfcounter.devices.overheads import compiled_fit, tiny_decode_step  # noqa: E402
from perfcounter.devices.timing import sync, time_calls  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.models.args import ModelArgs  # noqa: E402
from perfcounter.models.model import Transformer  # noqa: E402

DEPTHS = (2, 8)  # the tiny model's layers, as calibrate's compiled fit
TOKENS = (1, 8, 32)  # the tiny prefill's prompt lengths
PROFILED = {"Dynamo's cache lookup": "TorchDynamo Cache Lookup",
            "compiled graph's own code": "## Call CompiledFxGraph"}


def inputs(device, tokens: int, decode_at: int = 8):
    """(tokens, positions) of a prefill of `tokens` (a decode step's at position decode_at
    when tokens is 1, as calibrate's tiny step)."""
    x = torch.zeros(1, tokens, dtype=torch.long, device=device)
    pos = torch.tensor([decode_at], device=device) if tokens == 1 else \
        torch.arange(tokens, device=device)
    return x, pos


def launches_of(model, x, pos) -> int:
    with torch.no_grad(), PerformanceCounterMode() as mode:
        generate.prefill(model, x, pos)
    return compiled_launches(mode.trace())


def static_prefill(model, x, pos):  # a code object of its own: generate.prefill's cache entries
    return generate.prefill(model, x, pos)  # stay the dynamic program's


def tiny_part(device, rounds: int, min_time: float) -> tuple[list[list[str]], dict]:
    """Rows of the tiny model's static and dynamic programs, and their fits."""
    cases = {}  # (depth, program, tokens): (function, x, pos, launches)
    for depth in DEPTHS:
        model, _ = tiny_decode_step(device, depth)
        static = torch.compile(generate.decode_one_token)
        dynamic = torch.compile(generate.prefill, dynamic=True)
        with torch.no_grad():
            x, pos = inputs(device, 1)
            static(model, x, pos), static(model, x, pos)
            cases[(depth, "static", 1)] = (static, model, x, pos, launches_of(model, x, pos))
            for tokens in TOKENS:
                x, pos = inputs(device, tokens)
                dynamic(model, x, pos), dynamic(model, x, pos)
                cases[(depth, "dynamic", tokens)] = (dynamic, model, x, pos,
                                                     launches_of(model, x, pos))
        torch._dynamo.reset()  # the next depth compiles afresh (Dynamo's recompile limit)
    seconds = {k: [] for k in cases}
    with torch.no_grad():
        for _ in range(rounds):  # rounds apart in time: the host's slow spells show as rounds
            for k, (f, model, x, pos, _) in cases.items():
                seconds[k].append(time_calls(lambda f=f, m=model, x=x, p=pos: lambda: f(m, x, p),
                                             device, min_time))
    rows, fits = [], {}
    for (depth, program, tokens), times in seconds.items():
        n = cases[(depth, program, tokens)][4]
        rows.append([f"{depth} layers", program, str(tokens), str(n),
                     f"{min(times) * 1e6:,.1f} us", f"{min(times) / n * 1e6:,.2f} us",
                     f"{max(times) / min(times) - 1:.0%}"])
    for program, tokens in (("static", 1), *(("dynamic", t) for t in TOKENS)):
        keys = [(d, program, tokens) for d in DEPTHS]
        fit = compiled_fit([cases[k][4] for k in keys], [min(seconds[k]) for k in keys])
        fits[f"{program} {tokens}"] = fit
    return rows, fits


def one_call(f, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    f()
    sync(device)
    return time.perf_counter() - t0


def profiled(f, device, calls: int = 5) -> dict[str, float | None]:
    """Host milliseconds a call of each PROFILED event and, on a GPU, the kernels a call ran
    ("kernels": what the device executed, against the launches the compiled regime counts;
    None on a CPU), from torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    def run(activities):
        with profile(activities=activities) as prof:
            for _ in range(calls):
                f()
            sync(device)
        return prof.key_averages()
    gpu = device.type == "cuda"
    try:
        events = run([ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else []))
    except RuntimeError as e:  # a benchmark: the host's figures stand without the kernels
        print(f"  (the device's activity could not be profiled: {e}; host only)", flush=True)
        events, gpu = run([ProfilerActivity.CPU]), False
    totals, kernels = dict.fromkeys(PROFILED, 0.0), 0  # inclusive: the graph's code with its
    for e in events:  # launches
        for name, prefix in PROFILED.items():
            if e.key.startswith(prefix):
                totals[name] += e.cpu_time_total
        if getattr(e, "device_type", None) == DeviceType.CUDA:  # kernels, copies and fills
            kernels += e.count
    out = {name: us / 1e3 / calls for name, us in totals.items()}
    out["kernels"] = kernels / calls if gpu else None
    return out


def model_part(device, dtype, name: str, layers: int | None, prompt: int,
               min_time: float) -> tuple[list[list[str]], dict]:
    args = ModelArgs.from_name(name)
    if layers:
        args.n_layer = layers
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(args).to(dtype=dtype).eval()
    model.setup_caches(1, prompt + 9)
    x1, p1 = inputs(device, 1, decode_at=prompt)
    xp, pp = inputs(device, prompt)
    programs = {"decode, static": (torch.compile(generate.decode_one_token), x1, p1),
                "prefill, dynamic": (torch.compile(generate.prefill, dynamic=True), xp, pp),
                "prefill, static": (torch.compile(static_prefill), xp, pp)}
    rows, out = [], {}
    with torch.no_grad():
        n = launches_of(model, xp, pp)
        for label, (f, x, pos) in programs.items():
            def call(f=f, x=x, pos=pos):
                return f(model, x, pos)
            call(), call()  # compilation, then a warm call
            host = time_calls(lambda call=call: call, device, min_time)
            kernels = time_calls(lambda call=call: call, device, min_time, kernel=True,
                                 spin_s=2 * host)  # the spin outlasts the host's enqueue
            after = []
            for _ in range(5):  # once after 8 decode steps, as gpu_check times a prefill
                for _ in range(8):
                    programs["decode, static"][0](model, x1, p1)
                after.append(one_call(call, device))
            prof = profiled(call, device)
            out[label] = {"host_ms": host * 1e3, "device_ms": kernels * 1e3,
                          "after_decode_ms": statistics.median(after) * 1e3, **prof}
            ran = "-" if prof["kernels"] is None else f"{prof['kernels']:,.0f}"
            rows.append([label, str(n), ran, f"{host * 1e3:,.3f} ms", f"{host / n * 1e6:,.2f} us",
                         f"{kernels * 1e3:,.3f} ms", f"{statistics.median(after) * 1e3:,.3f} ms",
                         *(f"{prof[k]:,.3f} ms" for k in PROFILED)])
    return rows, out


def main(*, device: str = "cuda", model: str = "smollm2-135m", layers: int | None = None,
         prompt: int = 8, rounds: int = 3, min_time: float = 0.1, tiny: bool = True) -> dict:
    """The two parts (the module doc); `model` a comma-separated list of presets, each timed
    in the second part; tiny=False leaves the first part out."""
    quiet_third_party()
    t0 = time.perf_counter()
    dev = torch.device(device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    where = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU, one thread"
    print(f"{where}; torch {torch.__version__}", flush=True)
    fits = {}
    if tiny:
        rows, fits = tiny_part(dev, rounds, min_time)
        print(format_table(rows, ["tiny model", "program", "tokens", "launches",
                                  "a step (fastest)", "a launch", "rounds' spread"],
                           markdown=True))
        print(format_table([[k, f"{f['compiled'] * 1e6:,.2f} us",
                             f"{f['compiled_step'] * 1e6:,.1f} us"] for k, f in fits.items()],
                           ["program, tokens", "a launch (fit)", "a step's entry (fit)"],
                           markdown=True))
    measured = {}
    for name in model.split(","):
        shape = f"{name}" + (f", {layers} layers" if layers else "")
        rows, measured[name] = model_part(dev, dtype, name, layers, prompt, min_time)
        print(format_table(rows, [f"{shape}, {prompt}-token prompt", "launches counted",
                                  "kernels run (profiled)", "host, back to back", "a launch",
                                  "device", "once, after 8 decode steps", *PROFILED],
                           markdown=True), flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return {"fits": fits, "model": measured[model.split(",")[0]], "models": measured}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--model", default="smollm2-135m",
                    help="presets of ModelArgs.from_name, comma-separated: each model's shape "
                         "timed in turn (the second part)")
    ap.add_argument("--skip_tiny", action="store_true", help="leave out the tiny model's part")
    ap.add_argument("--layers", type=int, default=None, help="cut the model to this many layers")
    ap.add_argument("--prompt", type=int, default=8, help="the model's prefill tokens")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the tiny model's timings")
    a = ap.parse_args()
    if a.device.split(":")[0] not in ("cuda", "cpu"):
        ap.error(f"--device {a.device!r}: cuda or cpu")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu for the smoke test)")
    for flag, v in (("--layers", a.layers), ("--prompt", a.prompt), ("--rounds", a.rounds)):
        if v is not None and v < 1:
            ap.error(f"{flag} {v}: a positive integer")
    if a.prompt < 2:
        ap.error(f"--prompt {a.prompt}: at least 2 tokens (1 is a decode step)")
    for name in a.model.split(","):
        try:
            ModelArgs.from_name(name)
        except (KeyError, ValueError) as e:
            ap.error(f"--model {name!r}: {e}")
    main(device=a.device, model=a.model, layers=a.layers, prompt=a.prompt, rounds=a.rounds,
         tiny=not a.skip_tiny)
