"""Every bad Hugging Face config is one line naming the value and what is valid, exit code 2,
before anything is counted: `perfcounter count --model FILE --hf` and generate.py alike."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfcounter.cli.main import main

REPO = Path(__file__).resolve().parent.parent
BASE = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128}
BAD = [
    ({"hidden_size": 0}, "hidden_size must be an int >= 1, got 0"),
    ({"num_attention_heads": 0}, "num_attention_heads must be an int >= 1, got 0"),
    ({"num_attention_heads": 5}, "hidden_size 32 is not a multiple of num_attention_heads 5"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"vocab_size": 0}, "vocab_size must be an int >= 1, got 0"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be an int >= 1, got 0"),
    ({"hidden_size": "32"}, "hidden_size must be an int >= 1, got '32'"),
    ({"intermediate_size": float("nan")}, "intermediate_size must be an int >= 1, got nan"),
    ({"intermediate_size": True}, "intermediate_size must be an int >= 1, got True"),
    ({"model_type": "nosuch"}, "model_type 'nosuch' is not a transformers"),
]


def _write(tmp_path, change) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **change}))
    return path


@pytest.mark.parametrize("change, message", BAD, ids=[m for _, m in BAD])
def test_count_refuses_a_bad_config_in_one_line(tmp_path, capsys, change, message):
    path = _write(tmp_path, change)
    assert main(argv=["count", "--model", str(path), "--hf", "--prompt_length", "2",
                      "--max_new_tokens", "2", "--device_spec", "h100-sxm"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith(f"perfcounter count: error: {path}: {message}")


def test_count_refuses_a_config_that_is_not_an_object(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    assert main(argv=["count", "--model", str(path), "--hf"]) == 2
    assert f"{path}: expected a JSON object of config fields, got list" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [BAD[1], BAD[6]], ids=["zero heads", "a string"])
@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_refuses_a_bad_config_in_one_line(tmp_path, change, message):
    path = _write(tmp_path, change)
    run = subprocess.run([sys.executable, "generate.py", "--model", str(path), "--hf",
                          "--max_new_tokens", "2"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"generate.py: error: {path}: {message}" in run.stderr.splitlines()


def test_unknown_model_and_missing_counts_file(tmp_path, capsys):
    assert main(argv=["sweep", "--model", "nosuch"]) == 2
    assert "unknown model 'nosuch'; presets: llama-2-7b" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert main(argv=["profile", "--counts", str(missing)]) == 2
    assert f"{missing}: no such counts file" in capsys.readouterr().err


def test_a_perfcounter_home_that_is_a_file_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                      capsys):
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setenv("PERFCOUNTER_HOME", str(home))
    for argv in (["calibrate", "--array_mb", "1", "--no-curves"],
                 ["count", "--model", "llama-2-7b", "--prompt_length", "2"]):
        assert main(argv=argv) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"perfcounter: error: PERFCOUNTER_HOME={str(home)!r} is not a folder; set it to a "
            "folder (calibrate makes it) or unset it"]
