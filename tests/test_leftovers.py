"""Bad inputs an audit found answered with a traceback, nothing, or a misleading line: each is
now one line naming the value and what is valid (exit 2), or the right answer."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from perfcounter.cli.main import main as cli
from perfcounter.devices import DeviceSpecError, this_machine
from perfcounter.devices.schema import load_device_specs
from perfcounter.generation import run
from perfcounter.generation.run import GenerateArgumentError
from perfcounter.models.checkpoint_files import CheckpointError

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

HF_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5}


def one_line_refusal(argv, capsys) -> str:
    assert cli(argv=argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("text, says", [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deep to be a counts document"),
    ("{}", "no phase in it (an empty object)"),
    (json.dumps({"schema": 99, "version": 1}), "not a perfcounter counts document (schema 99; "
                                               "expected 'perfcounter.counts')")])
def test_a_counts_file_that_is_no_counts_document_is_refused_in_one_line(tmp_path, capsys,
                                                                          text, says):
    path = tmp_path / "counts.json"
    path.write_text(text)
    line = one_line_refusal(["profile", "--counts", str(path)], capsys)
    assert line.startswith(f"perfcounter profile: error: {path}: {says}")


def test_devices_of_an_unknown_type_are_refused_with_the_types_there_are(capsys):
    line = one_line_refusal(["devices", "--type", "nosuch"], capsys)
    assert line.startswith("perfcounter devices: error: --type 'nosuch': no device is of that "
                           "type; valid: cpu, cuda, ")
    assert "pim" in line


@pytest.mark.parametrize("argv", [["devices"], ["count", "--model", "llama-2-7b"],
                                  ["graph", "--model", "llama-2-7b"]])
def test_a_bad_measure_setting_is_refused_by_every_command(monkeypatch, capsys, argv):
    monkeypatch.setenv("PERFCOUNTER_MEASURE", "yes")
    line = one_line_refusal(argv, capsys)
    assert line.endswith("error: PERFCOUNTER_MEASURE='yes' is not valid; valid: 0 (never "
                         "measure this machine for a run) or 1 (the default)")


def test_a_yaml_error_is_one_line_with_where(tmp_path):
    path = tmp_path / "tag.yaml"
    path.write_text("devices:\n  x: !!python/object:foo {}\n")
    with pytest.raises(DeviceSpecError) as refused:
        load_device_specs(path)
    assert str(refused.value) == (f"{path}: not a valid YAML file: could not determine a "
                                  "constructor for the tag 'tag:yaml.org,2002:python/object:foo'"
                                  " (line 2, column 6)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only machine's answer")
def test_a_config_only_count_on_a_gpu_that_is_not_here_is_refused():
    with pytest.raises(GenerateArgumentError, match=r"^--device 'cuda': no CUDA GPU is available "
                                                    r"here \(valid: cpu.*\); a config-only count "
                                                    r"prices any device by --device_spec"):
        gen.main(model="llama-2-7b", device="cuda", max_new_tokens=2, quiet=True)


def test_an_hf_count_past_max_position_embeddings_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HF_LLAMA))
    with pytest.raises(GenerateArgumentError, match=r"^max_seq_length=602 exceeds the model's "
                                                    r"block_size=512"):
        gen.main(config=tmp_path, hf=True, prompt_length=600, max_new_tokens=2, quiet=True)


def test_model_folder_with_a_config_and_no_weights_is_counted_from_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HF_LLAMA))
    kw = gen.keywords(gen.build_parser().parse_args(["--model", str(tmp_path),
                                                     "--max_new_tokens", "2",
                                                     "--prompt_length", "4", "--quiet"]))
    out = gen.main(**kw)
    assert out["config_only"] and out["counter"].counts["prefill"].num_tokens == 4


def test_model_folder_whose_index_names_a_file_outside_is_refused_before_anything(
        tmp_path, monkeypatch):
    monkeypatch.delenv("PERFCOUNTER_MEASURE")
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(this_machine, "calibrate", lambda **kw: pytest.fail("measured"))
    monkeypatch.setattr(run, "load_model", lambda *a, **kw: pytest.fail("loaded"))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_LLAMA))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../outside.safetensors"}}))
    kw = gen.keywords(gen.build_parser().parse_args(["--model", str(folder)]))
    assert kw["checkpoint_path"] == folder  # an index names weights: a real run, not a count
    with pytest.raises(CheckpointError, match=r"shard '\.\./outside\.safetensors' is outside "
                                              r"the model folder"):
        gen.main(**kw)
