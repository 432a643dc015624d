"""Where a prediction misses: each op timed inside the real run beside its prediction.

    python benchmarks/bench_predict_ops.py                      # ~1B Llama, bfloat16, prefill 512
    python benchmarks/bench_predict_ops.py --model smollm2 --dtype float32 --prompt 16 --phase decode
    python benchmarks/bench_predict_ops.py --spec cal.yaml      # predict from an existing calibration

bench_predict.py says how far a phase's prediction is from its measured time;
this script says which ops make the difference. It calibrates (or reads
--spec), counts one prefill and one decode step of the model eagerly, times the
same phase uncounted (best of --repeats), then runs it once more under a
dispatch mode that times each aten op call (the mode's own Python is outside
the timed calls). Per op (aten name), it prints the calls, the seconds measured
inside the run, the seconds predicted (predict.op_predictions: max of the
compute and memory sides and a matmul's weight rows, overhead apart) and measured ÷ predicted, largest
gaps first; views cost no work and are left out. One thread, the process's CPU
clock, as bench_predict.py.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_predict import llama_1b, smollm2  # noqa: E402
from generate import decode_one_token, prefill  # noqa: E402
from perfcounter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.console import quiet_third_party  # noqa: E402
from perfcounter.devices import get_device_spec, load_device_specs  # noqa: E402
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated  # noqa: E402
from perfcounter.devices.op_rates import CLOCKS  # noqa: E402
from perfcounter.pricing.predict import op_predictions, predict  # noqa: E402
from perfcounter.format import format_table, ratio, si  # noqa: E402

MODELS = {"llama-1b": llama_1b, "smollm2": smollm2}


class OpTimer(TorchDispatchMode):
    """Seconds and calls of each aten op (by name) run under it."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = self.clock()
        out = func(*args, **(kwargs or {}))
        self.seconds[str(func)] += self.clock() - start
        self.calls[str(func)] += 1
        return out


def main(*, model: str = "llama-1b", dtype: str = "bfloat16", prompt: int = 512, batch: int = 1,
         phase: str = "prefill", repeats: int = 2, clock: str = "cpu", spec_path: str | None = None,
         top: int = 12) -> list[list[str]]:
    torch.set_num_threads(1)
    now = CLOCKS[clock]
    if spec_path is None:
        cal = calibrate(clock=clock)
        print("\n".join(describe(cal)), flush=True)
        spec_path = str(save_calibrated(cal.to_spec("bench-calibrated"),
                                        Path(tempfile.mkdtemp()) / "calibrated.yaml"))
    dt = getattr(torch, dtype)
    spec = get_device_spec(load_device_specs(spec_path)[0], dtype=dt)
    net = MODELS[model](dt)
    net.setup_caches(batch, prompt + 2)
    x = torch.randint(0, net.config.vocab_size, (batch, prompt))
    pos = torch.arange(prompt)
    counter = TransformerPerformanceCounter(device_spec=spec)
    with torch.no_grad():
        with counter.count("prefill", num_tokens=prompt * batch):
            tok = prefill(net, x, pos, temperature=0.0)
        with counter.count("decode", num_tokens=batch):
            decode_one_token(net, tok, torch.tensor([prompt]), temperature=0.0)

        def run():
            if phase == "prefill":
                return prefill(net, x, pos, temperature=0.0)
            return decode_one_token(net, tok, torch.tensor([prompt]), temperature=0.0)
        run()  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = now()
            run()
            best = min(best, now() - start)
        timer = OpTimer(now)
        with timer:
            run()
    trace = counter.counts[phase].trace
    whole = predict(trace, spec, "eager")
    predicted: dict[str, float] = defaultdict(float)
    for p in op_predictions(trace, spec, "eager"):
        predicted[p.record.op] += p.work_s
    inside = sum(timer.seconds.values())
    print(f"{model} {dtype} prompt {prompt} batch {batch} {phase}: measured {si(best, 's', 3, prefix='m')}, "
          f"predicted {si(whole.latency_s, 's', 3, prefix='m')} ({ratio(best, whole.latency_s)}; of "
          f"which overhead {si(whole.overhead_s, 's', 3, prefix='m')}); ops timed inside the run "
          f"{si(inside, 's', 3, prefix='m')}")
    names = sorted(set(timer.seconds) | {n for n, s in predicted.items() if s},
                   key=lambda n: -abs(timer.seconds.get(n, 0.0) - predicted.get(n, 0.0)))
    rows = [[n, str(timer.calls.get(n, 0)), si(timer.seconds.get(n, 0.0), "s", 3, prefix="m"),
             si(predicted.get(n, 0.0), "s", 3, prefix="m"),
             ratio(timer.seconds.get(n, 0.0), predicted[n]) if predicted.get(n) else "-"]
            for n in names if predicted.get(n) or timer.seconds[n] > 1e-4][:top]
    print(format_table(rows, ["op", "calls", "measured", "predicted", "meas/pred"], markdown=True))
    return rows


if __name__ == "__main__":
    quiet_third_party()  # the libraries' notices and progress bars, as the commands do
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-1b", choices=list(MODELS))
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--phase", default="prefill", choices=["prefill", "decode"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--clock", default="cpu", choices=list(CLOCKS))
    p.add_argument("--spec", default=None, help="a calibrated spec file (default: calibrate now)")
    p.add_argument("--top", type=int, default=12, help="ops printed, largest gaps first")
    a = p.parse_args()
    for flag in ("prompt", "batch", "repeats", "top"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(a, flag)}")
    try:
        main(model=a.model, dtype=a.dtype, prompt=a.prompt, batch=a.batch, phase=a.phase,
             repeats=a.repeats, clock=a.clock, spec_path=a.spec, top=a.top)
    except (ValueError, OSError) as e:  # a spec file that does not load, a prompt too long
        p.error(str(e).splitlines()[0])
