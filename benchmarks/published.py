"""Published GPU inference measurements: load and validate `benchmarks/data/published_gpu.yaml`.

    from published import load_rows          # with benchmarks/ on sys.path
    for row in load_rows():
        print(row.id, row.device_spec, row.regime, row.figure, row.unit)

Each row is a `PublishedRow` (plain data). The file's schema, field by field:

    id            unique name of the row
    model         the model as the source names it
    preset        the perfcounter preset (perfcounter/models/model.py) that prices it
    device        the device as the source names it
    device_spec   the registry entry (`perfcounter devices`) or null: not in the registry
    precision     bf16 fp16 fp8 int8 int4 q4_0 q4_k_m (what the weights are stored as)
    engine        the program and its settings
    regime        eager | compiled | cudagraphs (see the file's header)
    batch         an integer >= 1, or "saturated" (a serving scheduler chose it)
    tensor_parallel   GPUs per model copy (default 1)
    prompt_len, output_len   integers >= 0, or null where the source does not state them
                  (then a sentence of `notes` must say the length is 'not stated')
    metric        ttft_ms | prefill_s | decode_step_s | decode_tokens_per_s |
                  eval_tokens_per_s | prompt_tokens_per_s | output_tokens_per_s
                  (decode_tokens_per_s: the whole generate() call, prompt included, as
                  gpt-fast times it; eval_tokens_per_s: the generation steps alone, as
                  llama.cpp's `eval time` line and llama-bench's tg report it)
    figure        the number the source states (> 0)
    unit          the unit the metric is stated in (ms, s or tokens/s)
    source        {url: http(s)://..., where: the table / figure / sentence, date: ...}
    quote         the sentence or table cell the figure was read from (contains the figure)
    notes         optional

A bad file fails with one line naming the file, the row and the field.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

DATA_FILE = Path(__file__).resolve().parent / "data" / "published_gpu.yaml"

REGIMES = ("eager", "compiled", "cudagraphs")
PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4", "q4_0", "q4_k_m")
METRIC_UNITS = {"ttft_ms": "ms", "prefill_s": "s", "decode_step_s": "s",
                "decode_tokens_per_s": "tokens/s", "eval_tokens_per_s": "tokens/s",
                "prompt_tokens_per_s": "tokens/s",
                "output_tokens_per_s": "tokens/s"}
REQUIRED = ("id", "model", "preset", "device", "device_spec", "precision", "engine", "regime",
            "batch", "prompt_len", "output_len", "metric", "figure", "unit", "source", "quote")
OPTIONAL = ("tensor_parallel", "notes")
_LENGTHS_NOT_STATED = re.compile(r"lengths?\b[^.]*\bnot stated", re.IGNORECASE)


class PublishedDataError(ValueError):
    """A row of the data file that does not follow the schema (one line: file, row, field)."""


@dataclass(frozen=True)
class Source:
    url: str
    where: str
    date: str


@dataclass(frozen=True)
class PublishedRow:
    id: str
    model: str
    preset: str
    device: str
    device_spec: str | None
    precision: str
    engine: str
    regime: str
    batch: int | str
    tensor_parallel: int
    prompt_len: int | None
    output_len: int | None
    metric: str
    figure: float
    unit: str
    source: Source
    quote: str
    notes: str = ""

    @property
    def seconds(self) -> float | None:
        """The figure as seconds per phase or per token where it is a time or a 1-request rate:
        ttft_ms, prefill_s, decode_step_s -> s; decode_tokens_per_s, eval_tokens_per_s -> s
        per token; prompt_tokens_per_s -> s for the whole prompt. None for batch throughputs."""
        if self.metric == "ttft_ms":
            return self.figure / 1e3
        if self.metric in ("prefill_s", "decode_step_s"):
            return self.figure
        if self.metric in ("decode_tokens_per_s", "eval_tokens_per_s"):
            return 1 / self.figure
        if self.metric == "prompt_tokens_per_s" and self.prompt_len:
            return self.prompt_len / self.figure
        return None


def _fail(path, where: str, field: str, expected: str, got) -> None:
    raise PublishedDataError(f"{path}: {where}: field '{field}': expected {expected}, "
                             f"got {got!r}")


def _text(path, where, row, field) -> str:
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        _fail(path, where, field, "a non-empty string", value)
    return value


def _count(path, where, row, field, *, nullable: bool, minimum: int) -> int | None:
    value = row.get(field)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(path, where, field, f"an integer >= {minimum}" + (" or null" if nullable else ""),
              value)
    return value


def _figure_in_quote(figure: float, quote: str) -> bool:
    """The quote states the figure: some number in it (thousands commas allowed) equals it."""
    for token in re.findall(r"\d[\d,]*(?:\.\d+)?", quote):
        try:
            if math.isclose(float(token.replace(",", "")), figure, rel_tol=1e-9):
                return True
        except ValueError:
            continue
    return False


def notes_and_figure(path, where: str, row: dict, prompt, output, quote: str) -> tuple:
    """(notes, figure) of a row: notes a string saying 'not stated' where a length is null,
    the figure a finite number > 0 that its quote states."""
    notes = row.get("notes", "")
    if notes is None or not isinstance(notes, str):
        _fail(path, where, "notes", "a string", notes)
    if (prompt is None or output is None) and not _LENGTHS_NOT_STATED.search(notes):
        _fail(path, where, "notes", "a sentence saying the length is 'not stated' (a length "
              "is null)", notes)
    figure = row["figure"]
    if isinstance(figure, bool) or not isinstance(figure, (int, float)) \
            or not math.isfinite(figure) or figure <= 0:
        _fail(path, where, "figure", "a finite number > 0", figure)
    if not _figure_in_quote(float(figure), quote):
        _fail(path, where, "quote", f"the source's text stating the figure {figure}", quote)
    return notes, figure


def check_fields(row, index: int, path, required: tuple, optional: tuple) -> str:
    """A row's name in errors ("row 3 (its id)"; the index, 0-based, until its id is read),
    once it is a mapping with every required field and no field outside the two lists."""
    where = f"row {index + 1}"
    if not isinstance(row, dict):
        raise PublishedDataError(f"{path}: {where}: expected a mapping of fields, got "
                                 f"{type(row).__name__}")
    if isinstance(row.get("id"), str) and row["id"].strip():
        where = f"row {index + 1} ({row['id']})"
    for field in required:
        if field not in row:
            raise PublishedDataError(f"{path}: {where}: field '{field}' is missing")
    unknown = sorted(set(row) - set(required) - set(optional))
    if unknown:
        raise PublishedDataError(f"{path}: {where}: unknown field '{unknown[0]}' (fields: "
                                 f"{', '.join((*required, *optional))})")
    return where


def parse_row(row, index: int, path=DATA_FILE) -> PublishedRow:
    """One row of the file, validated; `index` (0-based) names it in errors until its id is read."""
    where = check_fields(row, index, path, REQUIRED, OPTIONAL)
    text = {f: _text(path, where, row, f)
            for f in ("id", "model", "preset", "device", "engine", "quote")}
    spec = row["device_spec"]
    if spec is not None and (not isinstance(spec, str) or not spec.strip()):
        _fail(path, where, "device_spec", "a registry name or null", spec)
    precision, regime, metric, unit = (row["precision"], row["regime"], row["metric"],
                                       row["unit"])
    if precision not in PRECISIONS:
        _fail(path, where, "precision", f"one of {', '.join(PRECISIONS)}", precision)
    if regime not in REGIMES:
        _fail(path, where, "regime", f"one of {', '.join(REGIMES)}", regime)
    if metric not in METRIC_UNITS:
        _fail(path, where, "metric", f"one of {', '.join(METRIC_UNITS)}", metric)
    if unit != METRIC_UNITS[metric]:
        _fail(path, where, "unit", f"'{METRIC_UNITS[metric]}' for metric {metric}", unit)
    batch = row["batch"]
    if batch != "saturated":
        batch = _count(path, where, row, "batch", nullable=False, minimum=1)
    tp = row.get("tensor_parallel", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        _fail(path, where, "tensor_parallel", "an integer >= 1", tp)
    prompt = _count(path, where, row, "prompt_len", nullable=True, minimum=0)
    output = _count(path, where, row, "output_len", nullable=True, minimum=0)
    notes, figure = notes_and_figure(path, where, row, prompt, output, text["quote"])
    source = row["source"]
    if not isinstance(source, dict):
        _fail(path, where, "source", "a mapping {url, where, date}", source)
    for key in ("url", "where", "date"):
        value = source.get(key)
        if not isinstance(value, str) or not value.strip():
            _fail(path, where, f"source.{key}", "a non-empty string", value)
    if not re.match(r"https?://\S+$", source["url"]):
        _fail(path, where, "source.url", "an http(s) URL", source["url"])
    extra = sorted(set(source) - {"url", "where", "date"})
    if extra:
        _fail(path, where, f"source.{extra[0]}", "only url, where, date", source[extra[0]])
    return PublishedRow(id=text["id"], model=text["model"], preset=text["preset"],
                        device=text["device"], device_spec=spec, precision=precision,
                        engine=text["engine"], regime=regime, batch=batch, tensor_parallel=tp,
                        prompt_len=prompt, output_len=output, metric=metric,
                        figure=float(figure), unit=unit,
                        source=Source(source["url"], source["where"], source["date"]),
                        quote=text["quote"], notes=notes)


def load_rows(path=DATA_FILE, parse=None) -> list[PublishedRow]:
    """Every row of the data file, validated by `parse(raw, index, path)` (default: this
    file's parse_row; published_serving.py gives its own); PublishedDataError (one line) on the
    first bad one."""
    path, parse = Path(path), parse or parse_row
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise PublishedDataError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise PublishedDataError(f"{path}: not valid YAML{at}: "
                                 f"{getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not data["rows"]:
        raise PublishedDataError(f"{path}: expected a mapping with a non-empty list 'rows'")
    rows, seen = [], set()
    for i, raw in enumerate(data["rows"]):
        row = parse(raw, i, path)
        if row.id in seen:
            raise PublishedDataError(f"{path}: row {i + 1} ({row.id}): field 'id': duplicate "
                                     f"of an earlier row")
        seen.add(row.id)
        rows.append(row)
    return rows


if __name__ == "__main__":
    import sys
    try:
        for r in load_rows(sys.argv[1] if len(sys.argv) > 1 else DATA_FILE):
            print(f"{r.id}: {r.figure:g} {r.unit} ({r.metric}, {r.regime}, batch {r.batch}, "
                  f"{r.device_spec or 'not in registry'})")
    except PublishedDataError as e:
        sys.exit(str(e))
