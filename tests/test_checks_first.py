"""Whatever the flags and the model's config can tell is checked before anything is counted:
a mapping's keys and devices (simulate), profile's scopes, a context that a transformers
config states (count, graph, simulate --hf)."""
import json

import pytest

from perfcounter.cli import count as count_cli
from perfcounter.cli import graph as graph_cli
from perfcounter.cli import simulate as simulate_cli
from perfcounter.cli.main import main as cli
from perfcounter.generation import config_only


@pytest.fixture
def nothing_counted(monkeypatch):
    def never(*a, **kw):
        raise AssertionError("counted before the flags were checked")
    monkeypatch.setattr(simulate_cli, "count", never)
    monkeypatch.setattr(count_cli, "count_from_flags", never)
    monkeypatch.setattr(config_only, "fake_hf_model", never)


def refusal(argv, capsys) -> str:
    assert cli(argv=argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("mapping, says", [
    ("{nosuch: host}", "mapping key 'nosuch' (host) matches no module of the model"),
    ("{wqkv: nosuchdev}", "mapping entry 'wqkv': unknown device 'nosuchdev'"),
    ("{layers.99.attention: host}", "mapping key 'layers.99.attention' (host) matches no module")])
def test_a_mapping_is_checked_on_the_models_modules_before_counting(nothing_counted, capsys,
                                                                     mapping, says):
    line = refusal(["simulate", "--model", "llama-2-7b", "--mapping", mapping], capsys)
    assert says in line


def test_q_k_and_v_on_different_devices_pass_the_check_simulate_splits_them(monkeypatch):
    seen = []
    monkeypatch.setattr(simulate_cli, "count", lambda args: seen.append(args) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # reached counting: the mapping passed
        simulate_cli.run(simulate_cli_args(["--model", "llama-2-7b", "--mapping",
                                            "{q_proj: PIM_AI_4chip, k_proj: host}"]))
    assert seen


def simulate_cli_args(argv):
    from perfcounter.cli.main import build_parser
    return build_parser().parse_args(["simulate", *argv])


def test_a_profile_scope_is_checked_on_the_models_modules_before_counting(nothing_counted,
                                                                          capsys):
    line = refusal(["profile", "--model", "llama-2-7b", "--scope", "nosuch"], capsys)
    assert line.startswith("perfcounter profile: error: scope 'nosuch' matches no module")


@pytest.fixture
def no_model_built(monkeypatch):
    def never(*a, **kw):
        raise AssertionError("a model was built before its context was checked")
    monkeypatch.setattr(config_only, "fake_hf_model", never)
    monkeypatch.setattr(graph_cli, "fake_hf_model", never)


@pytest.mark.parametrize("command", [["count"], ["graph"], ["simulate", "--mapping",
                                                             "{q_proj: host}"]])
def test_a_transformers_context_is_checked_before_its_model_is_built(no_model_built, capsys,
                                                                     command, tmp_path):
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 256, "max_position_embeddings": 512}
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = refusal([command[0], "--model", str(tmp_path), "--hf", "--prompt_length", "600",
                    *command[1:]], capsys)
    assert "exceeds the model's block_size=512" in line
