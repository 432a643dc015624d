"""Measured ÷ predicted latency of prefill and decode, on this machine.

    python benchmarks/bench_predict.py                  # every configuration (slow: ~30 min)
    python benchmarks/bench_predict.py --quick          # SmolLM2-135M only
    python benchmarks/bench_predict.py --spec cal.yaml  # predict from an existing calibration
    python benchmarks/bench_predict.py --published      # = benchmarks/bench_published.py

First `perfcounter calibrate` runs (micro-benchmarks only: it never sees the runs
below) with the same threads and clock, unless --spec names a calibrated file.
Then, per configuration: the model counts one prefill and --steps decode steps
eagerly under the counter (perfcounter/pricing/predict.py prices that trace: eager, or
compiled with fusion), and runs the same uncounted, eagerly or torch.compile'd
as generate.py compiles it, timed --repeats times (the best kept). Configurations:
the built-in SmolLM2-135M (float32, generate.py's default) and a Llama-shaped
~1B config (16 layers, dim 2048, GQA 32/8 heads, SwiGLU 8192, vocab 32,000,
tied embeddings: 1.04 B parameters) with random weights in float32 and bfloat16;
eager and compiled; prompts of 16 and 512 tokens; batch 1 and 8. Trimmed (too
slow on 2 shared cores): batch 8 runs with the 16-token prompt only.

Timing: --clock cpu (default) reads the process's CPU time and --threads 1
(default) runs one thread: on a machine other jobs share, a 2-thread op waits
for the core another process holds (a 0.15 ms GEMV took a median 31 ms under a
load of 5 on 2 cores), and wall time measures the queue, not the run. Pass
--threads 2 --clock wall on a quiet machine.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generate import decode_one_token, prefill  # noqa: E402
from perfcounter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec, load_device_specs  # noqa: E402
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated  # noqa: E402
from perfcounter.devices.op_rates import CLOCKS  # noqa: E402
from perfcounter.models.model import Transformer  # noqa: E402
from perfcounter.models.args import ModelArgs
from perfcounter.format import format_table, ratio, si  # noqa: E402

LLAMA_1B = dict(block_size=2048, vocab_size=32000, n_layer=16, n_head=32, n_local_heads=8,
                dim=2048, intermediate_size=8192, tie_embeddings=True)
SHAPES = [(16, 1), (512, 1), (16, 8)]  # (prompt tokens, batch)


def smollm2(dtype):
    from perfcounter.models.loading import default_checkpoint, load_model
    # priced as it runs: transformers dequantizes the GGUF's Q4_1 blocks to `dtype` on load
    return load_model(default_checkpoint(), dtype=dtype, price_as="executed").model


def llama_1b(dtype):
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(ModelArgs(**LLAMA_1B))
    model = model.to_empty(device="cpu")
    for p in model.parameters():  # random weights, scaled as an initialisation would
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
    return model.to(dtype).eval()


def _best(fn, repeats: int, clock) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def run(model, spec, prompt: int, batch: int, steps: int, compiled: bool, repeats: int,
        clock) -> dict:
    """Count eagerly, then time uncounted: seconds measured and predicted per phase
    (decode: per step)."""
    model.setup_caches(batch, prompt + steps + 1)
    x = torch.randint(0, model.config.vocab_size, (batch, prompt))
    pos = torch.arange(prompt)
    sampling = dict(temperature=0.0)
    counter = TransformerPerformanceCounter(device_spec=spec)
    with torch.no_grad():
        with counter.count("prefill", num_tokens=prompt * batch):
            tok = prefill(model, x, pos, **sampling)
        for i in range(steps):
            with counter.count("decode", num_tokens=batch):
                tok = decode_one_token(model, tok, torch.tensor([prompt + i]), **sampling)
        pre, dec = prefill, decode_one_token
        if compiled:
            pre, dec = torch.compile(prefill, dynamic=True), torch.compile(decode_one_token)

        def run_prefill():
            return pre(model, x, pos, **sampling)

        def run_decode():
            t = tok
            for i in range(steps):
                t = dec(model, t, torch.tensor([prompt + i]), **sampling)
        run_prefill(), run_decode()  # warm-up (and compilation)
        measured = {"prefill": _best(run_prefill, repeats, clock),
                    "decode": _best(run_decode, repeats, clock) / steps}
    execution = "compiled" if compiled else "eager"
    out = {}
    for label in ("prefill", "decode"):
        stats = counter.counts[label]
        per = stats.steps if label == "decode" else 1
        out[label] = (measured[label], stats.prediction(execution).latency_s / per,
                      stats.roofline_latency / per)
    return out


def published() -> list[dict]:
    """The published GPU rows beside their predictions: benchmarks/bench_published.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_published  # noqa: E402  (deferred: only --published needs it)
    return bench_published.main()


def main(*, quick: bool = False, steps: int = 4, repeats: int = 2, threads: int = 1,
         clock: str = "cpu", spec_path: str | None = None) -> list[list[str]]:
    torch.set_num_threads(threads)
    if spec_path is None:
        t0 = time.perf_counter()
        cal = calibrate(clock=clock)
        path = save_calibrated(cal.to_spec("bench-calibrated"),
                               Path(tempfile.mkdtemp()) / "calibrated.yaml")
        print(f"calibrated in {time.perf_counter() - t0:.1f} s ({threads} thread(s), {clock} "
              f"clock): {path}", flush=True)
        print("\n".join(describe(cal)), flush=True)
        spec_path = str(path)
    spec = load_device_specs(spec_path)[0]
    models = [("SmolLM2-135M", smollm2, torch.float32)]
    if not quick:
        models += [("Llama ~1B", llama_1b, torch.float32), ("Llama ~1B", llama_1b, torch.bfloat16)]
    rows, head = [], ["model", "dtype", "run", "prompt", "batch", "phase", "measured",
                      "predicted", "meas/pred", "roofline", "meas/roof"]
    print("  ".join(head), flush=True)
    for name, make, dtype in models:
        model = make(dtype)
        priced = get_device_spec(spec, dtype=dtype)
        for compiled in (False, True):
            for prompt, batch in SHAPES:
                torch._dynamo.reset()
                result = run(model, priced, prompt, batch, steps, compiled, repeats,
                             CLOCKS[clock])
                for label, (real, pred, roof) in result.items():
                    row = [name, str(dtype).removeprefix("torch."),
                           "compiled" if compiled else "eager", str(prompt), str(batch), label,
                           si(real, "s", 3, prefix="m"), si(pred, "s", 3, prefix="m"),
                           ratio(real, pred), si(roof, "s", 3, prefix="m"), ratio(real, roof)]
                    rows.append(row)
                    print(format_table([row], widths=[len(h) + 8 for h in head]), flush=True)
        del model
    print()
    print(format_table(rows, head, markdown=True))
    return rows


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="SmolLM2-135M only")
    parser.add_argument("--steps", type=int, default=4, help="decode steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs, best kept")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--clock", default="cpu", choices=list(CLOCKS),
                        help="cpu: the process's CPU time (default); wall: wall time")
    parser.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    parser.add_argument("--published", action="store_true",
                        help="only the predictions beside gpt-fast's and torchao's measurements")
    args = parser.parse_args()
    if args.published:
        sys.exit(published() and 0)
    main(quick=args.quick, steps=args.steps, repeats=args.repeats, threads=args.threads,
         clock=args.clock, spec_path=args.spec)
