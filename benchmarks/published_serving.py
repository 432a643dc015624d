"""Published serving measurements: load and validate `benchmarks/data/published_serving.yaml`.

    from published_serving import load_rows      # with benchmarks/ on sys.path
    for row in load_rows():
        print(row.id, row.engine_profile, row.workload, row.metric, row.figure, row.unit)

The schema of published_gpu.yaml (`published.py`: the same source, quote and figure checks,
one-line errors naming the file, the row and the field), extended by what a serving run states:

    id, model, device, engine, quote   non-empty strings
    preset        the perfcounter preset that prices the row, or null (none stands for the model)
    device_spec   the registry entry (`perfcounter devices`) or null
    precision     bf16 fp16 fp8 int8 int4
    engine_profile vllm | trtllm | sglang (the engine, as `perfcounter serve --engine` names it)
    regime        eager | compiled | cudagraphs
    workload      static | flood | poisson | concurrency (the data file's header says each)
    batch         static and concurrency: an integer >= 1; flood: "saturated"; poisson: null
    request_rate  poisson only: requests a second (> 0)
    num_requests  optional integer >= 1 (static: the batch)
    tensor_parallel, pipeline_parallel   optional integers >= 1 (default 1)
    expert_parallel  optional true / false (default false)
    prompt_len, output_len   integers >= 1, or null where the source does not state them (then
                  a sentence of `notes` says the length is 'not stated')
    metric        METRIC_UNITS' keys; `unit` must be the metric's
    statistic     optional mean | median (of a per-request latency)
    figure        the number the source states (> 0), found in `quote`
    source        {url: http(s)://..., where: the table / row / column, date: the release}
    notes         optional
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import published
from published import (PublishedDataError, REGIMES, Source, _count,
                       _fail, _text)

DATA_FILE = Path(__file__).resolve().parent / "data" / "published_serving.yaml"

PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")
ENGINE_PROFILES = ("vllm", "trtllm", "sglang")
WORKLOADS = ("static", "flood", "poisson", "concurrency")
STATISTICS = ("mean", "median")
METRIC_UNITS = {"output_tokens_per_s": "tokens/s", "output_tokens_per_s_per_gpu": "tokens/s",
                "output_ktokens_per_s_per_node": "k tokens/s", "ttft_ms": "ms",
                "tpot_ms": "ms", "itl_ms": "ms", "decode_tokens_per_s": "tokens/s"}
THROUGHPUTS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu",
               "output_ktokens_per_s_per_node")  # the rest are latencies (decode rate: 1 / TPOT)
REQUIRED = ("id", "model", "preset", "device", "device_spec", "precision", "engine",
            "engine_profile", "regime", "workload", "batch", "prompt_len", "output_len", "metric",
            "figure", "unit", "source", "quote")
OPTIONAL = ("request_rate", "num_requests", "tensor_parallel", "pipeline_parallel",
            "expert_parallel", "statistic", "notes")


@dataclass(frozen=True)
class ServingRow:
    id: str
    model: str
    preset: str | None
    device: str
    device_spec: str | None
    precision: str
    engine: str
    engine_profile: str
    regime: str
    workload: str
    batch: int | str | None
    request_rate: float | None
    num_requests: int | None
    tensor_parallel: int
    pipeline_parallel: int
    expert_parallel: bool
    prompt_len: int | None
    output_len: int | None
    metric: str
    statistic: str | None
    figure: float
    unit: str
    source: Source
    quote: str
    notes: str = ""

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def is_throughput(self) -> bool:
        return self.metric in THROUGHPUTS


def _choice(path, where, row, field, choices, *, nullable=False):
    value = row.get(field)
    if value is None and nullable:
        return None
    if value not in choices:
        _fail(path, where, field, f"one of {', '.join(choices)}" + (" or null" if nullable
                                                                     else ""), value)
    return value


def _batch(path, where, row, workload):
    """static, concurrency: an integer >= 1; flood: "saturated"; poisson: null."""
    batch = row["batch"]
    if workload in ("static", "concurrency"):
        return _count(path, where, row, "batch", nullable=False, minimum=1)
    expected = "saturated" if workload == "flood" else None
    if batch != expected:
        _fail(path, where, "batch", f"{expected!r} for workload {workload}" if expected else
              "null for workload poisson (the rate sets the load)", batch)
    return batch


def parse_row(row, index: int, path=DATA_FILE) -> ServingRow:
    """One row of the file, validated; `index` (0-based) names it in errors until its id is read."""
    where = published.check_fields(row, index, path, REQUIRED, OPTIONAL)
    text = {f: _text(path, where, row, f) for f in ("id", "model", "device", "engine", "quote")}
    for field in ("preset", "device_spec"):
        value = row[field]
        if value is not None and (not isinstance(value, str) or not value.strip()):
            _fail(path, where, field, "a name or null", value)
    precision = _choice(path, where, row, "precision", PRECISIONS)
    profile = _choice(path, where, row, "engine_profile", ENGINE_PROFILES)
    regime = _choice(path, where, row, "regime", REGIMES)
    workload = _choice(path, where, row, "workload", WORKLOADS)
    metric = _choice(path, where, row, "metric", tuple(METRIC_UNITS))
    statistic = _choice(path, where, row, "statistic", STATISTICS, nullable=True)
    if row["unit"] != METRIC_UNITS[metric]:
        _fail(path, where, "unit", f"'{METRIC_UNITS[metric]}' for metric {metric}", row["unit"])
    batch = _batch(path, where, row, workload)
    rate = row.get("request_rate")
    if workload == "poisson":
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) \
                or not math.isfinite(rate) or rate <= 0:
            _fail(path, where, "request_rate", "requests a second > 0 for workload poisson", rate)
    elif rate is not None:
        _fail(path, where, "request_rate", f"absent for workload {workload}", rate)
    requests = _count(path, where, row, "num_requests", nullable=True, minimum=1)
    parallel = {f: _count(path, where, {f: row.get(f, 1)}, f, nullable=False, minimum=1)
                for f in ("tensor_parallel", "pipeline_parallel")}
    expert = row.get("expert_parallel", False)
    if not isinstance(expert, bool):
        _fail(path, where, "expert_parallel", "true or false", expert)
    prompt = _count(path, where, row, "prompt_len", nullable=True, minimum=1)
    output = _count(path, where, row, "output_len", nullable=True, minimum=1)
    notes, figure = published.notes_and_figure(path, where, row, prompt, output,
                                               text["quote"])
    source = _source(path, where, row["source"])
    return ServingRow(id=text["id"], model=text["model"], preset=row["preset"],
                      device=text["device"], device_spec=row["device_spec"], precision=precision,
                      engine=text["engine"], engine_profile=profile, regime=regime,
                      workload=workload, batch=batch,
                      request_rate=None if rate is None else float(rate), num_requests=requests,
                      tensor_parallel=parallel["tensor_parallel"],
                      pipeline_parallel=parallel["pipeline_parallel"], expert_parallel=expert,
                      prompt_len=prompt, output_len=output, metric=metric, statistic=statistic,
                      figure=float(figure), unit=row["unit"], source=source,
                      quote=text["quote"], notes=notes)


def _source(path, where, source) -> Source:
    if not isinstance(source, dict):
        _fail(path, where, "source", "a mapping {url, where, date}", source)
    for key in ("url", "where", "date"):
        value = source.get(key)
        if not isinstance(value, str) or not value.strip():
            _fail(path, where, f"source.{key}", "a non-empty string", value)
    if not source["url"].startswith(("https://", "http://")) or any(c.isspace()
                                                                   for c in source["url"]):
        _fail(path, where, "source.url", "an http(s) URL", source["url"])
    extra = sorted(set(source) - {"url", "where", "date"})
    if extra:
        _fail(path, where, f"source.{extra[0]}", "only url, where, date", source[extra[0]])
    return Source(source["url"], source["where"], source["date"])


def load_rows(path=DATA_FILE) -> list[ServingRow]:
    """Every row of the file, validated; PublishedDataError (one line) on the first bad one."""
    return published.load_rows(path, parse=parse_row)


if __name__ == "__main__":
    import sys
    try:
        for r in load_rows(sys.argv[1] if len(sys.argv) > 1 else DATA_FILE):
            print(f"{r.id}: {r.figure:g} {r.unit} ({r.metric}, {r.workload}, "
                  f"{r.engine_profile}, {r.gpus} GPU(s), {r.device_spec or 'not in registry'})")
    except PublishedDataError as e:
        sys.exit(str(e))
