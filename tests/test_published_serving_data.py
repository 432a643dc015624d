"""benchmarks/data/published_serving.yaml: every row complete, sourced and quoted; bad rows refused
in one line naming the file, the row and the field."""
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402
import published_serving  # noqa: E402
from published import PublishedDataError  # noqa: E402
from published_serving import load_rows  # noqa: E402

from perfcounter import list_device_specs  # noqa: E402
from perfcounter.models.args import PRESETS  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return load_rows()


def test_every_row_has_its_quote_source_and_fields(rows):
    for r in rows:
        assert r.model and r.device and r.engine and r.quote, r.id
        assert published._figure_in_quote(r.figure, r.quote), r.id
        assert r.source.url.startswith(("https://", "http://")), r.id
        assert r.source.where and r.source.date, r.id
        assert r.unit == published_serving.METRIC_UNITS[r.metric], r.id
        assert r.engine_profile in published_serving.ENGINE_PROFILES, r.id
        if r.workload in ("static", "concurrency"):
            assert isinstance(r.batch, int) and r.batch >= 1, r.id
        assert (r.request_rate is not None) == (r.workload == "poisson"), r.id
        if r.prompt_len is None or r.output_len is None:
            assert published._LENGTHS_NOT_STATED.search(r.notes), r.id


def test_enough_rows_on_one_gpu_and_on_many(rows):
    single = [r for r in rows if r.gpus == 1 and not r.expert_parallel]
    multi = [r for r in rows if r.gpus > 1 or r.expert_parallel]
    assert len(single) >= 30 and len(multi) >= 20
    assert {r.engine_profile for r in single} == {"trtllm", "vllm", "sglang"}
    assert {r.tensor_parallel for r in multi} >= {2, 4, 8}
    assert any(r.expert_parallel for r in multi)
    # throughput and latency rows both, and every workload kind
    assert any(r.is_throughput for r in single) and any(not r.is_throughput for r in single)
    assert {r.workload for r in rows} == set(published_serving.WORKLOADS)


def test_rows_name_our_presets_and_devices(rows):
    devices = set(list_device_specs())
    for r in rows:
        assert r.preset is None or r.preset in PRESETS, r.id
        assert r.device_spec is None or r.device_spec in devices, r.id
    assert len({r.id for r in rows}) == len(rows)


def test_figures_read_from_their_tables(rows):
    by_id = {r.id: r for r in rows}
    # TensorRT-LLM v0.17's table: LLaMA v3.1 8B, 128/128, H100 FP8 column
    row = by_id["trtllm017-h100-llama31-8b-fp8-tp1-128-128"]
    assert (row.figure, row.num_requests, row.workload) == (28836.77, 30000, "flood")
    # v0.5's first-token latency: batch 1, one output token, 2,048-token prompt on an A100
    row = by_id["trtllm05-a100-llama7b-fp16-ttft-2048"]
    assert (row.figure, row.batch, row.output_len, row.metric) == (133, 1, 1, "ttft_ms")
    row = by_id["trtllm014-h100-llama31-8b-bf16-467-256-qps2-itl"]
    assert (row.figure, row.request_rate, row.statistic) == (8, 2.0, "mean")
    assert by_id["trtllm017-h100-mixtral-8x7b-fp8-tp8-128-128"].gpus == 8


def _good_row():
    return yaml.safe_load(published_serving.DATA_FILE.read_text())["rows"][0]


def _write(tmp_path, rows):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    return path


@pytest.mark.parametrize("field, value, words", [
    ("workload", "burst", "field 'workload': expected one of static, flood, poisson"),
    ("engine_profile", "tgi", "field 'engine_profile': expected one of vllm, trtllm, sglang"),
    ("batch", "saturated", "field 'batch': expected an integer >= 1"),
    ("request_rate", 4, "field 'request_rate': expected absent for workload static"),
    ("unit", "ms", "field 'unit': expected 'tokens/s'"),
    ("quote", "a row without the number", "field 'quote'"),
    ("output_len", None, "field 'notes'"),
    ("tensor_parallel", 0, "field 'tensor_parallel': expected an integer >= 1"),
    ("expert_parallel", "yes", "field 'expert_parallel': expected true or false"),
    ("statistic", "p99", "field 'statistic'"),
    ("source", {"url": "not a url", "where": "x", "date": "y"}, "field 'source.url'"),
])
def test_bad_rows_fail_in_one_line_naming_row_and_field(tmp_path, field, value, words):
    row = _good_row()
    row[field] = value
    with pytest.raises(PublishedDataError) as e:
        load_rows(_write(tmp_path, [row]))
    message = str(e.value)
    assert "\n" not in message
    assert f"row 1 ({row['id']})" in message and words in message


def test_poisson_needs_a_rate_and_flood_a_saturated_batch(tmp_path):
    row = _good_row()
    row.update(workload="poisson", batch=None)
    with pytest.raises(PublishedDataError, match="field 'request_rate': expected requests a "
                                                 "second > 0 for workload poisson"):
        load_rows(_write(tmp_path, [row]))
    row.update(workload="flood", batch=64)
    with pytest.raises(PublishedDataError, match="field 'batch': expected 'saturated'"):
        load_rows(_write(tmp_path, [row]))


def test_missing_field_duplicate_id_and_bad_files(tmp_path):
    row = _good_row()
    del row["quote"]
    with pytest.raises(PublishedDataError, match=r"row 1 \(.*\): field 'quote' is missing"):
        load_rows(_write(tmp_path, [row]))
    with pytest.raises(PublishedDataError, match=r"row 2 \(.*\): field 'id': duplicate"):
        load_rows(_write(tmp_path, [_good_row(), _good_row()]))
    with pytest.raises(PublishedDataError, match="cannot read"):
        load_rows(tmp_path / "absent.yaml")
    with pytest.raises(PublishedDataError, match="non-empty list 'rows'"):
        load_rows(_write(tmp_path, []))
