"""Quiet output: no third-party notice reaches a user who did nothing wrong, our warnings are
one line each after the report, and a machine-readable flag writes only JSON to stdout."""
import json
import subprocess
import sys
import warnings
from io import StringIO
from pathlib import Path

import pytest

from perfcounter._util import PerfcounterWarning
from perfcounter.console import collected_warnings, quiet_third_party, warning_line

REPO = Path(__file__).resolve().parent.parent
TINY_HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
           "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
FOREIGN = ("torch", "torchao", "transformers", "Traceback", "Failed to load", "UserWarning",
           "FutureWarning", "DeprecationWarning", "it/s]")


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("quiet") / "config.json"
    path.write_text(json.dumps(TINY_HF))
    return path


def _stderr_lines(argv, cwd=REPO):
    run = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run, [line for line in run.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("argv", [
    ["-m", "perfcounter.cli", "count", "--model", "{config}", "--hf", "--prompt_length", "4",
     "--max_new_tokens", "3", "--device_spec", "h100-sxm"],
    ["generate.py", "--model", "{config}", "--hf", "--prompt_length", "4", "--max_new_tokens",
     "3", "--device_spec", "h100-sxm"],
])
@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_a_transformers_backed_command_prints_no_foreign_line(tiny_config, argv):
    run, lines = _stderr_lines([a.replace("{config}", str(tiny_config)) for a in argv])
    # whatever stderr holds is ours: one line each, "perfcounter: ..." or the script's own
    foreign = [line for line in lines if not line.startswith(("perfcounter: ", "generate.py: "))
               or any(word in line for word in FOREIGN if word not in ("torch",))]
    assert foreign == []
    assert len(lines) == len(set(lines))  # each warning once


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_count_json_writes_only_json_to_stdout(tiny_config):
    run, _ = _stderr_lines(["-m", "perfcounter.cli", "count", "--model", str(tiny_config), "--hf",
                            "--prompt_length", "4", "--max_new_tokens", "2", "--json"])
    assert set(json.loads(run.stdout)) == {"prefill", "decode"}


def test_our_warnings_are_one_line_each_once_after_the_block():
    out = StringIO()
    with collected_warnings(out):
        for _ in range(3):
            warnings.warn("perfcounter: a figure is missing;\n  using another", PerfcounterWarning)
        print("the report", file=out)
    assert out.getvalue().splitlines() == ["the report",
                                           "perfcounter: warning: a figure is missing; using another"]


def test_a_foreign_warning_is_one_line_with_its_category_and_module():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn_explicit("old API", FutureWarning, "/x/transformers/utils/generic.py", 1)
    assert warning_line(caught[0]) == "warning: FutureWarning (generic): old API"


def test_quiet_silences_transformers_deprecations_only_inside_the_entry_point():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn_explicit("deprecated", FutureWarning, "generic.py", 1,
                               module="transformers.utils.generic")
        warnings.warn_explicit("ours", PerfcounterWarning, "x.py", 1, module="perfcounter.x")
    assert [str(w.message) for w in caught] == ["ours"]
