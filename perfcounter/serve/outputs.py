"""serve's files: per-request CSV, a Perfetto trace of the steps, plots; all written atomically.

- CSV (`--csv FILE`): one row per request: index, arrival_s, first_token_s, finish_s,
  prompt_tokens, output_tokens, ttft_ms, tpot_ms, e2el_ms, preemptions.
- Perfetto / Chrome trace-event JSON (`--trace FILE`): one slice per engine step on an
  "engine" track, its args the batch composition (sequences, decodes, prefill tokens,
  tokens, KV blocks held, joules); counter tracks of the batch size and KV blocks; one
  slice per request from arrival to finish on a "requests" track (its first token as an
  instant). Times in microseconds.
- `--save_path`, `--csv` and `--trace` are replaced together (`write_all`): all new or
  all old.
- Plots (`--plot DIR`, the plot extra): `serve_MODEL_DEVICES_latency_cdf` (TTFT, TPOT and
  E2EL CDFs of each result) and, for a sweep, `..._throughput_latency` (output tokens/s
  against mean and P99 TPOT and TTFT), PNG and SVG.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import tempfile

import numpy as np

from perfcounter._util import TMP_TAG, atomic_write, check_writable_target, remove_stale_temporaries
from perfcounter.serve.metrics import per_request
from perfcounter.serve.errors import ServeError
from pathlib import Path

CSV_COLUMNS = ("index", "arrival_s", "first_token_s", "finish_s", "prompt_tokens",
               "output_tokens", "ttft_ms", "tpot_ms", "e2el_ms", "preemptions")


def _process_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_all(files: dict) -> None:
    """{path: text} replaced together: every file written to a temporary beside its target
    first, then all renamed over their targets (a failure before the renames leaves every
    old file as it was)."""
    staged = []
    try:
        for path, text in files.items():
            target = check_writable_target(path)
            remove_stale_temporaries(target)
            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp",
                                       prefix=f".{target.name}.{TMP_TAG}-{os.getpid()}-")
            staged.append((tmp, target))
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode) if target.exists()
                     else 0o666 & ~_process_umask())
        for tmp, target in staged:
            os.replace(tmp, target)
        staged = []
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_csv(path, result) -> None:
    atomic_write(path, csv_text(result))


def csv_text(result) -> str:
    """The per-request CSV (module doc); a one-token request's TPOT is empty."""
    rq = per_request(result.run)
    out = io.StringIO()
    out.write(",".join(CSV_COLUMNS) + "\n")
    for i in range(len(rq["arrival"])):
        tpot = rq["tpot"][i]
        out.write(f"{i},{rq['arrival'][i]:.9f},{rq['first_token'][i]:.9f},{rq['finish'][i]:.9f},"
                  f"{rq['prompt'][i]},{rq['output'][i]},{rq['ttft'][i] * 1e3:.6f},"
                  f"{'' if np.isnan(tpot) else f'{tpot * 1e3:.6f}'},{rq['e2el'][i] * 1e3:.6f},"
                  f"{rq['preemptions'][i]}\n")
    return out.getvalue()


def trace_events(result, max_requests: int = 2000) -> dict:
    """The trace-event document (see the module doc); requests beyond max_requests left out."""
    steps = result.run.steps
    cols = {k: np.frombuffer(getattr(steps, k)) for k in (
        "start", "seconds", "tokens", "seqs", "prefill_tokens", "decode_seqs", "kv_blocks",
        "energy_j")}
    us = 1e6
    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": result.deployment.name}},
              {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "engine"}},
              {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "requests"}}]
    for i in range(len(cols["start"])):
        ts = cols["start"][i] * us
        events.append({"ph": "X", "pid": 1, "tid": 1, "name": "step", "ts": ts,
                       "dur": cols["seconds"][i] * us,
                       "args": {"seqs": int(cols["seqs"][i]), "decodes": int(cols["decode_seqs"][i]),
                                "prefill_tokens": int(cols["prefill_tokens"][i]),
                                "tokens": int(cols["tokens"][i]),
                                "kv_blocks": int(cols["kv_blocks"][i]),
                                "energy_j": float(cols["energy_j"][i])}})
        events.append({"ph": "C", "pid": 1, "name": "batch", "ts": ts,
                       "args": {"seqs": int(cols["seqs"][i]), "kv_blocks": int(cols["kv_blocks"][i])}})
    for r in result.run.requests[:max_requests]:
        events.append({"ph": "X", "pid": 1, "tid": 2, "name": f"request {r.index}",
                       "ts": r.arrival * us, "dur": (r.finish - r.arrival) * us,
                       "args": {"prompt": r.prompt, "output": r.output,
                                "preemptions": r.preemptions}})
        events.append({"ph": "i", "pid": 1, "tid": 2, "s": "t", "name": "first token",
                       "ts": r.first_token * us, "args": {"request": r.index}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_costs": result.deployment.table.label}}


def write_trace(path, result) -> None:
    atomic_write(path, trace_text(result))


def trace_text(result) -> str:
    return json.dumps(trace_events(result), allow_nan=False)


def check_plotting() -> None:
    """matplotlib importable, else ServeError (called before any work)."""
    try:
        import matplotlib  # noqa: F401  # deferred: optional (the plot extra), only when asked
    except ImportError:
        raise ServeError("--plot needs matplotlib: pip install 'perfcounter[plot]'") from None


def _save(fig, folder, name: str) -> list:
    written = []
    Path(folder).mkdir(exist_ok=True)  # a --plot folder whose parent the command checked
    for ext in ("png", "svg"):
        path = Path(folder) / f"{name}.{ext}"
        atomic_write(path, writer=lambda tmp, e=ext: fig.savefig(tmp, format=e, dpi=120))
        written.append(path)
    return written


def write_plots(folder, results: list, labels: list[str], sweep: list | None = None,
                stem: str = "serve") -> list:
    """STEM_latency_cdf of each result, and STEM_throughput_latency of a sweep's rows (stem:
    what they show, e.g. serve_llama-3-8b_h100-sxm)."""
    import matplotlib  # deferred: optional (the plot extra), only for --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: optional (the plot extra)
    written = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for result, label in zip(results, labels):
        rq = per_request(result.run)
        for ax, key in zip(axes, ("ttft", "tpot", "e2el")):
            v = np.sort(rq[key][~np.isnan(rq[key])]) * 1e3
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
    for ax, key in zip(axes, ("TTFT", "TPOT", "E2EL")):
        ax.set_xlabel(f"{key} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    written += _save(fig, folder, f"{stem}_latency_cdf")
    plt.close(fig)
    if sweep:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for ax, name in zip(axes, ("tpot", "ttft")):
            for label in dict.fromkeys(r["deployment"] for r in sweep):
                rows = [r for r in sweep if r["deployment"] == label and not r["overloaded"]]
                x = [r["output_throughput"] for r in rows]
                ax.plot(x, [r[f"mean_{name}_ms"] for r in rows], "o-", label=f"{label} mean")
                ax.plot(x, [r[f"p99_{name}_ms"] for r in rows], "s--", label=f"{label} P99")
            ax.set_xlabel("output tokens/s")
            ax.set_ylabel(f"{name.upper()} (ms)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        written += _save(fig, folder, f"{stem}_throughput_latency")
        plt.close(fig)
    return written
