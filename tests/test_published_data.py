"""benchmarks/data/published_gpu.yaml: every row complete and sourced; bad rows refused in one line."""
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402
from published import PublishedDataError, load_rows  # noqa: E402

from perfcounter import list_device_specs  # noqa: E402
from perfcounter.models.args import PRESETS  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return load_rows()


def test_every_row_is_complete(rows):
    assert len(rows) >= 15  # gpt-fast's A100 table and at least 12 more
    for r in rows:
        assert r.model and r.device and r.engine and r.quote, r.id
        assert r.precision in published.PRECISIONS, r.id
        assert r.regime in published.REGIMES, r.id
        assert r.batch == "saturated" or (isinstance(r.batch, int) and r.batch >= 1), r.id
        assert r.tensor_parallel >= 1, r.id
        assert r.prompt_len is None or r.prompt_len >= 0, r.id
        assert r.output_len is None or r.output_len >= 0, r.id
        if r.prompt_len is None or r.output_len is None:
            assert published._LENGTHS_NOT_STATED.search(r.notes), r.id
        assert r.figure > 0 and r.unit == published.METRIC_UNITS[r.metric], r.id
        assert r.source.url.startswith(("https://", "http://")), r.id
        assert r.source.where and r.source.date, r.id


def test_rows_name_our_presets_and_devices(rows):
    devices = set(list_device_specs())
    for r in rows:
        assert r.preset in PRESETS, r.id
        assert r.device_spec is None or r.device_spec in devices, r.id
    assert len({r.id for r in rows}) == len(rows)


def test_gpt_fast_a100_table_is_in_the_file(rows):
    by_precision = {r.precision: r.figure for r in rows
                    if r.id.startswith("gptfast-a100-llama2-7b")}
    assert by_precision == {"bf16": 104.9, "int8": 155.58, "int4": 196.80}


def test_each_regime_and_metric_kind_is_represented(rows):
    assert {r.regime for r in rows} == set(published.REGIMES)
    metrics = {r.metric for r in rows}
    assert {"ttft_ms", "decode_tokens_per_s", "output_tokens_per_s"} <= metrics
    assert any(r.metric == "decode_tokens_per_s" and r.batch == 1 for r in rows)
    assert any(r.metric == "output_tokens_per_s" and r.batch != 1 for r in rows)


def test_seconds(rows):
    by_id = {r.id: r for r in rows}
    assert by_id["trtllm-a100-llama7b-fp16-ttft-128"].seconds == pytest.approx(0.016)
    assert by_id["gptfast-a100-llama2-7b-bf16"].seconds == pytest.approx(1 / 104.9)
    assert by_id["llamacpp-3090ti-llama7b-q4_0-pp512"].seconds == pytest.approx(512 / 2410.974041)
    assert by_id["trtllm-a100-llama7b-fp16-bs384-128-128"].seconds is None


def _good_row():
    return yaml.safe_load(published.DATA_FILE.read_text())["rows"][0]


def _write(tmp_path, rows):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    return path


@pytest.mark.parametrize("field, value, words", [
    ("regime", "turbo", "field 'regime': expected one of eager, compiled, cudagraphs"),
    ("batch", 0, "field 'batch': expected an integer >= 1"),
    ("unit", "ms", "field 'unit': expected 'tokens/s'"),
    ("figure", -1, "field 'figure': expected a finite number > 0"),
    ("quote", "a sentence without the number", "field 'quote'"),
    ("prompt_len", None, "field 'notes'"),
    ("precision", "fp64", "field 'precision'"),
    ("source", {"url": "not a url", "where": "x", "date": "y"}, "field 'source.url'"),
])
def test_bad_rows_fail_in_one_line_naming_row_and_field(tmp_path, field, value, words):
    row = _good_row()
    row[field] = value
    with pytest.raises(PublishedDataError) as e:
        load_rows(_write(tmp_path, [row]))
    message = str(e.value)
    assert "\n" not in message
    assert "row 1 (gptfast-a100-llama2-7b-bf16)" in message and words in message


def test_missing_field_duplicate_id_and_bad_files(tmp_path):
    row = _good_row()
    del row["source"]
    with pytest.raises(PublishedDataError, match=r"row 1 \(.*\): field 'source' is missing"):
        load_rows(_write(tmp_path, [row]))
    with pytest.raises(PublishedDataError, match=r"row 2 \(.*\): field 'id': duplicate"):
        load_rows(_write(tmp_path, [_good_row(), _good_row()]))
    with pytest.raises(PublishedDataError, match="cannot read"):
        load_rows(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("rows: [\n")
    with pytest.raises(PublishedDataError, match="not valid YAML"):
        load_rows(tmp_path / "broken.yaml")
    with pytest.raises(PublishedDataError, match="non-empty list 'rows'"):
        load_rows(_write(tmp_path, []))


def test_genz_figures_without_genz_says_one_line_and_exits_0(monkeypatch, capsys, tmp_path):
    """GenZ is never a dependency: absent, the peer script prints one line and writes nothing."""
    import genz_figures
    monkeypatch.setitem(sys.modules, "GenZ", None)  # import GenZ raises ImportError
    saved = tmp_path / "genz.json"
    assert genz_figures.main(["--save_path", str(saved)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "GenZ is not installed" in out
    assert not saved.exists()


def test_genz_figures_skips_what_it_cannot_model(rows):
    import genz_figures
    by_id = {r.id: r for r in rows}
    saturated = genz_figures.genz_figure(by_id["trtllm-h100-llama31-8b-fp8-sat-128-128"])
    assert saturated["genz"] is None and "batch not stated" in saturated["skipped"]
    absent = genz_figures.genz_figure(by_id["llamacpp-3090ti-llama7b-q4_0-tg128"])
    assert absent["genz"] is None and "not in our registry" in absent["skipped"]


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_perfcounter_does_not_import_genz():
    import subprocess
    code = "import sys, perfcounter; print('GenZ' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
