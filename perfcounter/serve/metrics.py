"""Serving metrics from a simulated run, under vLLM's benchmark field names.

As vLLM's benchmark_serving computes them: duration from the first arrival to the
last finish; request_throughput = completed / duration; output_throughput = output
tokens / duration; total_token_throughput = (prompt + output tokens) / duration; TTFT
= first token - arrival; TPOT = (E2EL - TTFT) / (output tokens - 1), for requests of
more than one output token; ITL = every gap between two tokens of a request. A request
of one output token has neither: it is left out of TPOT's and ITL's mean and percentiles
(and when every request has one token, those figures are None: null in JSON, n/a in
text), never counted as 0; E2EL =
finish - arrival; mean, median (`median_*`), std, p90 and p99 (numpy.percentile) in
ms. Goodput (vLLM's `request_goodput`): requests meeting every SLO given
(`--slo ttft=200ms,tpot=50ms[,e2el=2s]`: units required) per second.

Ours beside them: mean and peak batch size (sequences a step), KV-cache utilisation
(blocks held / blocks, mean over steps and peak), preemptions, energy (J per output
token, per request: J = ∫ P dt, pricing/power.py: every step's joules, static + activity
capped per step under the power model, + the static W of each stream's GPUs over the time it
runs nothing, `idle_energy_j`: `streams` x duration - the steps' seconds; None where the
device's figures give no energy, `energy_known=False`, shown as n/a, never as 0), the run's
average power (`mean_power_w` = energy / duration, every GPU's, as a power meter over the
run reads it) and cost ($ per 1M
output tokens: the device's hourly price over the duration, and energy at `usd_per_kwh`;
each price within its range, `check_prices`). Overload: with open-loop arrivals, when the
requests in the system at the last arrival are more than the batch holds, and more than
twice their mean over the first half of the arrivals or arriving 1.25 times faster than the
run completes them, the queue is growing without bound: `overloaded` is true, `overload`
says it in one line, and the latency figures (which would only measure how long the run
was) are None.
"""
from __future__ import annotations

import math
import re

import numpy as np

from perfcounter.devices.figure_ranges import RANGES
from perfcounter.pricing.power import idle_joules, mean_power_w
from perfcounter.serve.errors import ServeError

USD_PER_HOUR = RANGES["usd_per_hour"][:2]  # a device's price an hour: the device files' range
USD_PER_KWH = (0.0, 1e3)  # $ a kWh: from free to ~1,000 x what grids charge (0.05-0.5)
MIN_ATTAINMENT = 0.01  # --slo_attainment: at least 1% of requests ("0%" would meet any SLO)
SLO_KEYS = ("ttft", "tpot", "itl", "e2el")
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6}
_SLO = re.compile(r"^\s*([a-z0-9]+)\s*[=:]\s*([0-9.eE+-]+)\s*([a-z]*)\s*$")
LATENCIES = ("ttft", "tpot", "itl", "e2el")


def parse_slo(text) -> dict[str, float]:
    """'ttft=200ms,tpot=50ms' -> {'ttft': 0.2, 'tpot': 0.05} (seconds); units required."""
    if isinstance(text, dict):
        return dict(text)
    out = {}
    for part in str(text).split(","):
        m = _SLO.match(part.lower())
        if not m:
            raise ServeError(f"--slo {text!r}: expected NAME=VALUEUNIT pairs such as "
                             "ttft=200ms,tpot=50ms")
        name, value, unit = m.groups()
        if name not in SLO_KEYS:
            raise ServeError(f"--slo {part.strip()!r}: unknown target {name!r}; valid: "
                             f"{', '.join(SLO_KEYS)}")
        if unit not in _UNITS:
            raise ServeError(f"--slo {part.strip()!r}: a unit is required (ms, s or us), "
                             f"as in {name}={value}ms")
        try:
            seconds = float(value) * _UNITS[unit]
        except ValueError:
            raise ServeError(f"--slo {part.strip()!r}: {value!r} is not a number") from None
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ServeError(f"--slo {part.strip()!r}: expected a time > 0")
        if name in out:
            raise ServeError(f"--slo {text!r}: {name} given twice; give each target once")
        out[name] = seconds
    return out


def check_prices(usd_per_hour: float | None = None, usd_per_kwh: float | None = None) -> None:
    """--usd_per_hour and --usd_per_kwh, each None or within its range (ServeError naming
    the flag, the value and the range)."""
    for flag, value, (lo, hi), unit in (("--usd_per_hour", usd_per_hour, USD_PER_HOUR,
                                         "USD a device-hour (the device files' range)"),
                                        ("--usd_per_kwh", usd_per_kwh, USD_PER_KWH,
                                         "USD a kWh")):
        if value is not None and not (isinstance(value, (int, float)) and lo <= value <= hi):
            raise ServeError(f"{flag} {value}: expected a price in [{lo:g}, {hi:,g}] {unit}")


def check_attainment(attainment, flag: str = "--slo_attainment") -> float:
    """A share of requests that must meet the SLO: a fraction in [MIN_ATTAINMENT, 1]."""
    if isinstance(attainment, bool) or not isinstance(attainment, (int, float)) \
            or not MIN_ATTAINMENT <= attainment <= 1:
        raise ServeError(f"{flag} {attainment}: expected a fraction in [{MIN_ATTAINMENT:g}, 1] "
                         f"(from {MIN_ATTAINMENT:.0%} to all of the requests)")
    return float(attainment)


def _stats(name: str, values_s: np.ndarray, out: dict) -> None:
    """mean, median, std, p90, p99 in ms; None when no request has the figure (a run of
    one-token requests has no TPOT and no ITL)."""
    if not len(values_s):
        for key in ("mean", "median", "std", "p90", "p99"):
            out[f"{key}_{name}_ms"] = None
        return
    ms = values_s * 1e3
    out[f"mean_{name}_ms"] = float(ms.mean())
    out[f"median_{name}_ms"] = float(np.median(ms))
    out[f"std_{name}_ms"] = float(ms.std())
    for p in (90, 99):
        out[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))


def per_request(run) -> dict[str, np.ndarray]:
    """Arrays by request: arrival, first token, finish, prompt, output, ttft, tpot, e2el."""
    reqs = run.requests
    arrival = np.array([r.arrival for r in reqs])
    first = np.array([r.first_token for r in reqs])
    finish = np.array([r.finish for r in reqs])
    output = np.array([r.output for r in reqs], dtype=np.int64)
    ttft, e2el = first - arrival, finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output > 1, (e2el - ttft) / np.maximum(output - 1, 1), np.nan)
    return {"arrival": arrival, "first_token": first, "finish": finish,
            "prompt": np.array([r.prompt for r in reqs], dtype=np.int64), "output": output,
            "ttft": ttft, "tpot": tpot, "e2el": e2el,
            "preemptions": np.array([r.preemptions for r in reqs], dtype=np.int64)}


def overload(run, rq: dict, open_loop: bool) -> str | None:
    """The one-line overload flag of the module doc, or None."""
    if not open_loop or len(rq["arrival"]) < 8:
        return None
    steps = run.steps
    start, in_system = np.frombuffer(steps.start), np.frombuffer(steps.in_system)
    last = rq["arrival"].max()
    if not last > 0 or not len(start):
        return None
    at_last = in_system[np.searchsorted(start, last, side="right") - 1]
    first_half = in_system[start <= last / 2]
    mean_half = first_half.mean() if len(first_half) else 0.0
    rate = (len(rq["arrival"]) - 1) / last
    served = len(rq["arrival"]) / run.end
    if at_last > run.config.max_num_seqs and (at_last > 2 * mean_half or rate > 1.25 * served):
        return (f"overload: requests arrive at {rate:.3g}/s and the deployment completes "
                f"{served:.3g}/s; {int(at_last)} requests were in the system at the last "
                "arrival and the queue grows without bound (latency percentiles left out)")
    return None


def metrics(run, *, slo: dict | None = None, open_loop: bool = True, static_w: float = 0.0,
            streams: int = 1, idle_j: float | None = None, usd_per_hour: float | None = None,
            usd_per_kwh: float | None = None, energy_known: bool = True) -> dict:
    """The metrics of the module doc, as a flat dict of numbers (and the overload line);
    static_w and streams: replicas.idle_power's (the W of one stream's GPUs with nothing to
    run, and how many streams ran side by side); idle_j: the idle joules, where the caller
    knows them better (a disaggregated run's pools, each over the whole run);
    energy_known=False: the steps' device gives no energy figures (the step table's
    `has_energy`), so the joules, the power and the energy's price are None."""
    rq = per_request(run)
    steps = run.steps
    seconds = np.frombuffer(steps.seconds)
    seqs = np.frombuffer(steps.seqs)
    kv = np.frombuffer(steps.kv_blocks)
    duration = run.end - float(rq["arrival"].min())
    n = len(rq["output"])
    total_in, total_out = int(rq["prompt"].sum()), int(rq["output"].sum())
    out: dict = {"completed": n, "duration": duration, "total_input_tokens": total_in,
                 "total_output_tokens": total_out,
                 "request_throughput": n / duration, "output_throughput": total_out / duration,
                 "total_token_throughput": (total_in + total_out) / duration}
    flag = overload(run, rq, open_loop)
    tpot = rq["tpot"][~np.isnan(rq["tpot"])]
    itl = np.frombuffer(run.itl) if len(run.itl) else np.zeros(0)
    for name, values in (("ttft", rq["ttft"]), ("tpot", tpot), ("itl", itl), ("e2el", rq["e2el"])):
        _stats(name, values, out)
    if slo:
        good = np.ones(n, dtype=bool)
        for name, limit in slo.items():
            if name == "itl":
                raise ServeError("--slo itl: vLLM's goodput takes ttft, tpot and e2el")
            values = np.nan_to_num(rq[name], nan=0.0)
            good &= values <= limit
        out["request_goodput"] = int(good.sum()) / duration
        out["slo_met_fraction"] = float(good.mean())
    busy = float(seconds.sum())
    if idle_j is None:
        idle_j = idle_joules(streams * duration - busy, static_w)
    energy = float(np.frombuffer(steps.energy_j).sum()) + idle_j
    out.update({
        "mean_batch_size": float(seqs.mean()), "peak_batch_size": int(seqs.max()),
        "mean_kv_cache_utilization": float(kv.mean() / run.config.kv_blocks),
        "peak_kv_cache_utilization": float(kv.max() / run.config.kv_blocks),
        "kv_cache_blocks": run.config.kv_blocks, "preemptions": run.preemptions,
        "steps": len(seconds), "busy_fraction": busy / duration if duration else 0.0,
        "energy_j": energy, "j_per_output_token": energy / total_out, "j_per_request": energy / n,
        "mean_power_w": mean_power_w(energy, duration), "idle_energy_j": idle_j,
        "usd_per_1m_output_tokens": None, "usd_per_1m_output_tokens_energy": None,
    })
    if usd_per_hour is not None:
        out["usd_per_1m_output_tokens"] = usd_per_hour * duration / 3600 / total_out * 1e6
    if not energy_known:
        out.update(energy_j=None, j_per_output_token=None, j_per_request=None,
                   mean_power_w=None, idle_energy_j=None)
    elif usd_per_kwh is not None:
        out["usd_per_1m_output_tokens_energy"] = usd_per_kwh * energy / 3.6e6 / total_out * 1e6
    out["overloaded"] = flag is not None
    out["overload"] = flag
    if flag is not None:
        for key in list(out):
            if any(key.endswith(f"_{name}_ms") for name in LATENCIES):
                out[key] = None
        if "request_goodput" in out:
            out["request_goodput"] = None
    return out
