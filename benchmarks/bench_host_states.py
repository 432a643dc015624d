"""How far a host's cost per op call moves between samples a few seconds apart: the evidence
behind calibrate sampling the host between its parts and keeping the fastest (HostCosts).

    python benchmarks/bench_host_states.py                      # a CUDA GPU: 4 rounds
    python benchmarks/bench_host_states.py --device cpu --rounds 2 --depths ''   # a smoke test

Each round times, one after another, the host's cost per op call of a tiny transformer's
decode step (perfcounter.devices.overheads.tiny_decode_step: 4 layers of dim 64) four ways:
calibrate's own eager figure (eager_overheads: the step / its op calls, warm, and cold with the
caches streamed), and the same model as generate.decode_one_token runs it, 8 steps between
synchronizations (float32; float32 synchronized after every step; bfloat16). A host that
kept one speed would print the same figure in every round; one that moves between states
prints rounds apart by the same factor in every column that was timed in the slow spell.
Then the tiny step compiled at each of --depths layers: its launches (costs.compiled_launches)
and its time a step, and the time per launch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import generate  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.costs import compiled_launches  # noqa: E402
from perfcounter.counting.mode import PerformanceCounterMode  # noqa: E402
from perfcounter.devices.overheads import eager_overheads, tiny_decode_step  # noqa: E402
from perfcounter.devices.timing import sync  # noqa: E402
from perfcounter.format import format_table  # noqa: E402

STEPS = 8  # decode steps between synchronizations


def tiny(device: str, dtype, n_layer: int = 4):
    model, _ = tiny_decode_step(device, n_layer)
    return model.to(dtype=dtype).eval()


def per_step(model, step, device: str, repeats: int = 15, sync_each: bool = False) -> float:
    """Seconds a decode step, 25th percentile of `repeats` runs of STEPS steps each."""
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.tensor([8], device=device)
    dev = torch.device(device)
    with torch.no_grad():
        for _ in range(3):
            step(model, tok, pos, temperature=0.0)
        runs = []
        for _ in range(repeats):
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(STEPS):
                step(model, tok, pos, temperature=0.0)
                if sync_each:
                    sync(dev)
            sync(dev)
            runs.append((time.perf_counter() - t0) / STEPS)
    return sorted(runs)[len(runs) // 4]


def decode_trace(model, device: str):
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)
    with torch.no_grad(), PerformanceCounterMode() as mode:
        generate.decode_one_token(model, tok, torch.tensor([8], device=device), temperature=0.0)
    return mode.trace()


def main(device: str = "cuda", rounds: int = 4, depths=(2, 8, 16)) -> dict:
    """{"rounds": [us per op call by column], "compiled": [(layers, launches, us a step)]}."""
    us = lambda seconds, calls: f"{seconds / calls * 1e6:.2f}"  # noqa: E731
    f32, b16 = tiny(device, torch.float32), tiny(device, torch.bfloat16)
    calls = {m: sum(r.calls for r in decode_trace(m, device).records
                    if not r.op.startswith("prim.")) for m in (f32, b16)}
    print(f"{device}: {os.cpu_count()} host cores, load {os.getloadavg()[0]:.2f}; op calls a "
          f"step: float32 {calls[f32]}, bfloat16 {calls[b16]}", flush=True)
    step = generate.decode_one_token
    rows, got = [], {"rounds": [], "compiled": []}
    for i in range(rounds):
        e = eager_overheads(device)
        cells = [e["eager"] * 1e6, e["eager_cold"] * 1e6,
                 per_step(f32, step, device) / calls[f32] * 1e6,
                 per_step(f32, step, device, sync_each=True) / calls[f32] * 1e6,
                 per_step(b16, step, device) / calls[b16] * 1e6]
        got["rounds"].append(cells)
        rows.append([str(i + 1), *(f"{c:.2f}" for c in cells)])
        print("  round " + " | ".join(rows[-1]), flush=True)
    print(format_table(rows, ["round", "calibrate eager (us)", "calibrate eager_cold",
                              "float32, 8 steps a sync", "float32, a sync a step",
                              "bfloat16, 8 steps a sync"], markdown=True), flush=True)
    rows = []
    for n_layer in depths:
        model = tiny(device, torch.bfloat16, n_layer)
        launches = compiled_launches(decode_trace(model, device))
        torch._dynamo.reset()
        seconds = per_step(model, torch.compile(step), device)
        got["compiled"].append((n_layer, launches, seconds * 1e6))
        rows.append([str(n_layer), str(launches), f"{seconds * 1e6:,.0f}", us(seconds, launches)])
        print("  compiled " + " | ".join(rows[-1]), flush=True)
    if rows:
        print(format_table(rows, ["layers", "launches", "us a step", "us a launch"],
                           markdown=True))
    return got


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--rounds", type=int, default=4, help="rounds of the eager timings")
    p.add_argument("--depths", default="2,8,16",
                   help="layers of the compiled tiny steps, comma-separated ('' for none)")
    a = p.parse_args()
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: expected a positive number of rounds")
    try:
        depths = tuple(int(d) for d in a.depths.split(",") if d.strip())
    except ValueError:
        p.error(f"--depths {a.depths!r}: expected layer counts like 2,8,16")
    if any(d < 1 for d in depths):
        p.error(f"--depths {a.depths!r}: expected positive layer counts")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: no CUDA device here; --device cpu runs it on the CPU")
    quiet_third_party()
    main(a.device, a.rounds, depths)
