"""How long `perfcounter serve --find_max_qps` takes, side by side in one process: Llama-3.1-8B
on one H100 SXM (prompt 512, output 128), for an SLO the steady throughput meets (one flood)
and one it must bisect for; each search run with its step table counted (the process caches
emptied, the disk cache off), with it read back from the disk cache, and read back without the
scheduler's decode stretches (serve/decode_runs.py), CPU seconds of each (median of
--repeats) and their ratios, whether the answers are the same, and the load.

    python benchmarks/bench_find_max_qps.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfcounter.cli.main import main as cli  # noqa: E402
from perfcounter.serve import cache_clear, counts_cache, scheduler  # noqa: E402

SLOS = ("ttft=200ms,tpot=50ms", "ttft=200ms,tpot=20ms")


def _search(slo: str, *, cache: str, stretches: bool) -> tuple[float, str]:
    """(CPU seconds, the answer's line) of one search, in this process."""
    os.environ[counts_cache.ENV] = cache
    scheduler.DECODE_RUNS = stretches
    cache_clear()
    out = io.StringIO()
    t = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = cli(argv=["serve", "--model", "llama-3.1-8b", "--device_spec", "h100-sxm",
                  "--find_max_qps", "--slo", slo, "--prompt_length", "512",
                  "--max_new_tokens", "128"])
    took = time.process_time() - t
    scheduler.DECODE_RUNS = True
    answer = next((line for line in out.getvalue().splitlines() if "highest QPS" in line),
                  f"no answer (exit code {rc})")
    return took, answer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    os.environ["PERFCOUNTER_HOME"] = tempfile.mkdtemp(prefix="bench_find_max_qps-")
    print(f"llama-3.1-8b on h100-sxm, prompt 512, output 128; cores: {os.cpu_count()}; load "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    _search(SLOS[0], cache="1", stretches=True)  # imports done, the table saved on disk
    for slo in SLOS:
        runs = {"counted": [], "read back": [], "read back, no stretches": []}
        answers = set()
        for _ in range(a.repeats):
            for name, cache, stretches in (("counted", "0", True), ("read back", "1", True),
                                           ("read back, no stretches", "1", False)):
                took, answer = _search(slo, cache=cache, stretches=stretches)
                runs[name].append(took)
                answers.add(answer.split(": ", 1)[-1])
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"  --slo {slo}: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items())
              + f" CPU; counted / read back {med['counted'] / med['read back']:.2f}x, no "
              f"stretches / stretches {med['read back, no stretches'] / med['read back']:.2f}x; "
              f"the same answer each time: {'yes' if len(answers) == 1 else 'NO'} "
              f"({answers.pop() if len(answers) == 1 else answers})")
    print("load after " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
