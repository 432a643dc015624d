"""Workloads: when requests arrive and how many tokens each brings and asks for.

- open loop: `--qps R` arrivals at rate R a second, Poisson (exponential gaps) or, with
  `--burstiness b`, gamma gaps of shape b and mean 1/R (b < 1 burstier, b = 1 Poisson),
  as vLLM's benchmark draws them; the first request arrives at 0;
- closed loop: `--concurrency N`: N requests always in flight (a finished request's
  successor arrives when it finishes), `--num_requests` in all;
- lengths: a number (fixed), `uniform:LO-HI` (integers, both included) or
  `normal:MEAN,STD` (rounded, at least 1);
- a trace file: JSONL (one object a line) or CSV (a header line), with
  `arrival_time` (s), `prompt_tokens`, `output_tokens` and optionally
  `cached_tokens` (prompt tokens a prefix cache already holds: shared prefixes).

Everything is drawn from numpy's Generator(seed): the same seed, the same workload.
Bounds (each named in its refusal): lengths are integers in [1, the model's context]
(`most`: a normal draw is clipped to it, a fixed length, a uniform's HI, a normal's MEAN
and STD beyond it are refused); at most MAX_REQUESTS requests; a rate in [MIN_RATE,
MAX_RATE] requests a second; arrivals within MAX_HORIZON_S seconds. Bad input raises
ServeError naming the value and what is valid. A CSV trace may start with a UTF-8
byte-order mark (as spreadsheets save it).
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfcounter.serve.errors import ServeError

COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens")
MAX_REQUESTS = 1_000_000  # requests a run may simulate
MIN_RATE, MAX_RATE = 1e-4, 1e9  # requests a second (1e9: a flood, every request at once)
MAX_HORIZON_S = 1e7  # seconds over which requests may arrive (about 116 days)
MAX_LENGTH = 10_000_000  # tokens a request may have before any model's context is known
OPTIONAL = ("cached_tokens",)


@dataclass
class Workload:
    """Requests by index: arrival (s; closed loop: the first `concurrency` at 0, the rest
    when one finishes), prompt and output tokens, prompt tokens already cached."""

    arrival: np.ndarray  # float64 [n]
    prompt: np.ndarray  # int64 [n]
    output: np.ndarray  # int64 [n]
    cached: np.ndarray  # int64 [n]
    concurrency: int | None = None  # closed loop
    source: str = ""

    def __len__(self) -> int:
        return len(self.prompt)


def parse_lengths(text, what: str, most: int | None = None):
    """A length spec (see the module doc) -> a function (rng, n) -> int64 [n], each in
    [1, most] (most: the model's context, else MAX_LENGTH)."""
    s = str(text).strip()
    most = MAX_LENGTH if most is None else most
    beyond = f"beyond the context of {most:,} tokens" if most < MAX_LENGTH else \
        f"beyond {most:,} tokens"
    try:
        if s.isdigit() or (s.lstrip("-").isdigit()):
            value = int(s)
            if value < 1:
                raise ServeError(f"{what} {s}: expected a length >= 1")
            if value > most:
                raise ServeError(f"{what} {s}: {beyond}; expected a length in [1, {most:,}]")
            return lambda rng, n: np.full(n, value, dtype=np.int64)
        kind, _, rest = s.partition(":")
        if kind == "uniform":
            lo, hi = (int(v) for v in rest.split("-"))
            if not 1 <= lo <= hi:
                raise ServeError(f"{what} {s}: expected uniform:LO-HI with 1 <= LO <= HI")
            if hi > most:
                raise ServeError(f"{what} {s}: HI {hi:,} {beyond}")
            return lambda rng, n: rng.integers(lo, hi + 1, size=n, dtype=np.int64)
        if kind == "normal":
            mean, std = (float(v) for v in rest.split(","))
            if not (mean >= 1 and std >= 0 and math.isfinite(mean + std)):
                raise ServeError(f"{what} {s}: expected normal:MEAN,STD with MEAN >= 1, STD >= 0")
            if mean > most or std > most:
                raise ServeError(f"{what} {s}: {'MEAN' if mean > most else 'STD'} {beyond} "
                                 f"(draws are clipped to [1, {most:,}])")
            return lambda rng, n: np.clip(np.rint(rng.normal(mean, std, size=n)), 1,
                                          most).astype(np.int64)
    except ServeError:
        raise
    except ValueError:
        pass
    raise ServeError(f"{what} {s!r}: expected a number, uniform:LO-HI or normal:MEAN,STD")


def synthetic(num_requests: int, prompt, output, *, qps: float | None = None,
              concurrency: int | None = None, burstiness: float = 1.0, seed: int = 0,
              prefix_hit_rate: float = 0.0, block_size: int = 16) -> Workload:
    """Open loop at `qps` or closed loop at `concurrency` (exactly one of them)."""
    if (qps is None) == (concurrency is None):
        raise ServeError("give one of --qps and --concurrency")
    check_count(num_requests)
    check_seed(seed)
    if qps is not None:
        check_rate(qps, num_requests)
        check_burstiness(burstiness)
    rng = np.random.default_rng(seed)
    prompts = parse_lengths(prompt, "--prompt_length")(rng, num_requests)
    outputs = parse_lengths(output, "--max_new_tokens")(rng, num_requests)
    if qps is not None:
        gaps = rng.gamma(burstiness, 1.0 / (qps * burstiness), size=num_requests)
        arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    else:
        if concurrency < 1:
            raise ServeError(f"--concurrency {concurrency}: expected >= 1")
        arrival = np.zeros(num_requests)
    cached = prefix_hits(prompts, prefix_hit_rate, block_size)
    return Workload(arrival, prompts, outputs, cached, concurrency,
                    f"qps {qps:g}" if qps is not None else f"concurrency {concurrency}")


def check_rate(qps: float, num_requests: int | None = None) -> float:
    """qps in [MIN_RATE, MAX_RATE], and num_requests arriving within MAX_HORIZON_S."""
    if not (isinstance(qps, (int, float)) and math.isfinite(qps) and qps > 0):
        raise ServeError(f"--qps {qps}: expected a rate > 0 requests a second")
    if not MIN_RATE <= qps <= MAX_RATE:
        raise ServeError(f"--qps {qps:g}: expected a rate in [{MIN_RATE:g}, {MAX_RATE:g}] "
                         "requests a second")
    if num_requests is not None and num_requests / qps > MAX_HORIZON_S:
        raise ServeError(f"--qps {qps:g} with --num_requests {num_requests:,}: arrivals over "
                         f"{num_requests / qps:.3g} s, beyond the {MAX_HORIZON_S:g} s a run may span")
    return float(qps)


def check_count(num_requests) -> int:
    if isinstance(num_requests, bool) or not isinstance(num_requests, (int, np.integer)) \
            or not 1 <= num_requests <= MAX_REQUESTS:
        raise ServeError(f"--num_requests {num_requests}: expected an integer in "
                         f"[1, {MAX_REQUESTS:,}]")
    return int(num_requests)


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed < 2 ** 63:
        raise ServeError(f"--seed {seed}: expected an integer in [0, 2**63)")
    return int(seed)


def check_burstiness(burstiness: float) -> float:
    if not (isinstance(burstiness, (int, float)) and 0 < burstiness <= 1000):
        raise ServeError(f"--burstiness {burstiness}: expected a number in (0, 1000] "
                         "(1: Poisson, below 1 burstier)")
    return float(burstiness)


def prefix_hits(prompts: np.ndarray, rate: float, block_size: int) -> np.ndarray:
    """Cached prompt tokens at a prefix hit rate: whole blocks, at least one token left."""
    if not 0 <= rate < 1:
        raise ServeError(f"--prefix_hit_rate {rate}: expected a fraction in [0, 1)")
    hit = np.floor(prompts * rate / block_size).astype(np.int64) * block_size
    return np.minimum(hit, (prompts - 1) // block_size * block_size)


def _rows(path: Path) -> list[dict]:
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a spreadsheet's byte-order mark
    except UnicodeDecodeError as e:
        raise ServeError(f"--trace_file {path}: not UTF-8 text (byte {e.start}: "
                         f"{e.reason}); a trace is JSONL or CSV") from None
    except OSError as e:
        raise ServeError(f"--trace_file {path}: cannot read it ({e.strerror})") from None
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise ServeError(f"{path}:{i}: not a JSON object ({e})") from None
        return rows
    if path.suffix.lower() == ".csv":
        return list(csv.DictReader(text.splitlines()))
    raise ServeError(f"{path}: a trace file is .jsonl or .csv")


def read_trace(path, *, block_size: int = 16) -> Workload:
    """A workload from a JSONL or CSV trace file (see the module doc)."""
    path = Path(path)
    if not path.is_file():
        raise ServeError(f"--trace_file {path}: no such file")
    rows = _rows(path)
    if not rows:
        raise ServeError(f"{path}: no requests")
    if len(rows) > MAX_REQUESTS:
        raise ServeError(f"{path}: {len(rows):,} requests; at most {MAX_REQUESTS:,}")
    cols = {c: [] for c in COLUMNS + OPTIONAL}
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ServeError(f"{path}: request {i} is not an object with {', '.join(COLUMNS)}")
        for c in COLUMNS + OPTIONAL:
            value = row.get(c, 0 if c in OPTIONAL else None)
            if value is None or value == "":
                raise ServeError(f"{path}: request {i} has no {c} (columns: "
                                 f"{', '.join(COLUMNS)}[, {', '.join(OPTIONAL)}])")
            if isinstance(value, bool):
                raise ServeError(f"{path}: request {i}: {c} {value!r} is not a number")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ServeError(f"{path}: request {i}: {c} {value!r} is not a number") from None
            if not math.isfinite(number):
                raise ServeError(f"{path}: request {i}: {c} {value!r} is not finite")
            if c != "arrival_time" and number != int(number):
                raise ServeError(f"{path}: request {i}: {c} {value!r} is not a whole number")
            if c == "arrival_time" and number > MAX_HORIZON_S:
                raise ServeError(f"{path}: request {i}: arrival_time {value!r} beyond the "
                                 f"{MAX_HORIZON_S:g} s a run may span")
            if c != "arrival_time" and number > MAX_LENGTH:
                raise ServeError(f"{path}: request {i}: {c} {value!r} beyond {MAX_LENGTH:,} "
                                 "tokens (any model's context)")
            cols[c].append(number)
    arrival = np.array(cols["arrival_time"], dtype=float)
    prompt = np.array(cols["prompt_tokens"], dtype=np.int64)
    output = np.array(cols["output_tokens"], dtype=np.int64)
    cached = np.array(cols["cached_tokens"], dtype=np.int64)
    _first_bad(path, arrival < 0, arrival, "arrival_time", "a time >= 0")
    _first_bad(path, np.r_[False, np.diff(arrival) < 0], arrival, "arrival_time",
               "arrivals sorted in time (this one is earlier than the one before)")
    _first_bad(path, prompt < 1, prompt, "prompt_tokens", "a length >= 1")
    _first_bad(path, output < 1, output, "output_tokens", "a length >= 1")
    _first_bad(path, (cached < 0) | (cached >= prompt), cached, "cached_tokens",
               "0 <= cached_tokens < prompt_tokens")
    cached = cached // block_size * block_size
    return Workload(arrival, prompt, output, cached, None, str(path))


def _first_bad(path, bad: np.ndarray, values, column: str, expected: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise ServeError(f"{path}: request {i + 1}: {column} {values[i]:g}; expected {expected}")


def check_fits_model(w: Workload, max_model_len: int) -> None:
    """Every request's prompt + output within the model's context (block_size)."""
    total = w.prompt + w.output
    if (total > max_model_len).any():
        i = int(np.argmax(total > max_model_len))
        raise ServeError(f"request {i + 1}: {w.prompt[i]} prompt + {w.output[i]} output tokens "
                         f"= {total[i]} exceed the model's context of {max_model_len} tokens")
