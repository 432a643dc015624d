"""Checkpoints and tokenizers: HF folders match transformers, files round-trip,
bad input is named."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_hf_model, tiny_args
from perfcounter.models.loading import (CheckpointError, CheckpointNotFoundError, HFCausalLM,
                                 checkpoint_kind, load_hf_model, load_model,
                                 model_args_from_hf, read_config, save_checkpoint)
from perfcounter.models.model import Transformer
from perfcounter.models.tokenizer import (HFTokenizer, SentencePieceTokenizer, TokenizerError,
                                   load_tokenizer)

REPO = Path(__file__).resolve().parents[1]

HF_CASES = {
    "llama-gqa": ("llama", {}),
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama3-rope": ("llama", dict(rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=4))),
    "qwen2-bias-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "mistral-window": ("mistral", dict(sliding_window=3)),
    "mixtral-moe": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
}


def _our_logits(model, x):
    model.setup_caches(x.shape[0], x.shape[1])
    with torch.no_grad():
        return model(x, torch.arange(x.shape[1]))


@pytest.mark.parametrize("case", HF_CASES)
def test_hf_folder_logits_equal_transformers(case, tmp_path):
    kind, overrides = HF_CASES[case]
    hf = make_hf_model(kind, **overrides)
    hf.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.kind == "hf"
    x = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        expected = hf(x).logits
    assert expected.abs().max() > 0.2  # every weight random (std 0.2): logits not near zero
    torch.testing.assert_close(_our_logits(loaded.model, x), expected, atol=1e-5, rtol=1e-5)


def test_qwen2_config_means_qkv_bias():
    args = model_args_from_hf(make_hf_model("qwen2").config.to_dict(), "config.json")
    assert args.attention_bias and args.n_local_heads == 2 and args.head_dim == 8


def test_hf_model_through_transformers_matches_ours(hf_llama_dir):
    ours, theirs = load_model(hf_llama_dir).model, load_hf_model(hf_llama_dir).model
    assert isinstance(theirs, HFCausalLM)
    x = torch.randint(0, 64, (1, 6))
    theirs.setup_caches(1, 8)
    with torch.no_grad():
        prefill = theirs(x[:, :5], torch.arange(5))
        step = theirs(x[:, 5:], torch.tensor([5]))
    torch.testing.assert_close(torch.cat([prefill, step], 1), _our_logits(ours, x), atol=1e-5, rtol=1e-5)


def test_safetensors_round_trip_carries_its_config(tmp_path, tiny_model):
    args = tiny_args(tie_embeddings=True)
    model = Transformer(args)
    path = save_checkpoint(tmp_path, args, model.state_dict())
    assert read_config(tmp_path / "config.json") == args
    (tmp_path / "config.json").unlink()  # the metadata inside the file is enough
    loaded = load_model(path)
    assert loaded.kind == "safetensors" and loaded.args == args
    assert loaded.model.output.weight is loaded.model.tok_embeddings.weight
    torch.testing.assert_close(loaded.model.tok_embeddings.weight, model.tok_embeddings.weight)


def test_gpt_fast_pth_with_split_qkv_loads(tmp_path, tiny_model):
    state = tiny_model.state_dict()
    for i in range(2):  # older gpt-fast checkpoints keep wq / wk / wv apart
        q, k, v = state.pop(f"layers.{i}.attention.wqkv.weight").split([32, 16, 16])
        state.update({f"layers.{i}.attention.w{n}.weight": t for n, t in zip("qkv", (q, k, v))})
    torch.save(state, tmp_path / "model.pth")
    (tmp_path / "config.json").write_text(json.dumps(tiny_args().__dict__))
    x = torch.randint(0, 64, (1, 5))
    loaded = load_model(tmp_path / "model.pth")
    torch.testing.assert_close(_our_logits(loaded.model, x), _our_logits(tiny_model, x))


def test_pth_without_config_needs_a_preset_folder_name(tmp_path, tiny_model):
    torch.save(tiny_model.state_dict(), tmp_path / "model.pth")
    with pytest.raises(CheckpointError, match=r"model\.pth: no config\.json beside it.*--model NAME"):
        load_model(tmp_path / "model.pth")


def test_missing_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="nowhere.pth: no such file or folder"):
        load_model(tmp_path / "nowhere.pth")
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"this is not safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_model(bad, model_name="llama-2-7b")
    (tmp_path / "model.pth").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="model.pth: not a readable torch checkpoint"):
        load_model(tmp_path / "model.pth", model_name="llama-2-7b")
    with pytest.raises(CheckpointError, match=r"unknown checkpoint file type '\.txt'"):
        (tmp_path / "w.txt").write_text("x")
        checkpoint_kind(tmp_path / "w.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="empty: no checkpoint recognised"):
        load_model(empty)


def test_mismatched_weights_name_the_key_and_both_shapes(tmp_path, tiny_model):
    save_checkpoint(tmp_path, tiny_args(dim=16, n_head=2, n_local_heads=2), {})
    path = save_checkpoint(tmp_path / "b", tiny_args(), tiny_model.state_dict())
    with pytest.raises(CheckpointError) as err:
        load_model(path, config_path=tmp_path / "config.json")
    msg = str(err.value)
    assert "model.safetensors: weights do not fit ModelArgs(" in msg
    # file: wqkv rows 4*8 + 2*8 + 2*8 = 64 of dim 32; model: 2*8 + 2*8 + 2*8 = 48 of dim 16
    assert "layers.0.attention.wqkv.weight: file (64, 32) vs model (48, 16)" in msg
    # every tensor depends on dim: 7 per layer * 2 layers + embedding, norm, output = 17
    assert "17 shape mismatch" in msg


def test_bad_configs_are_explained(tmp_path, hf_llama_dir):
    cfg = json.loads((hf_llama_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported; supported: llama"):
        model_args_from_hf({**cfg, "model_type": "gpt2"}, "config.json")
    with pytest.raises(CheckpointError, match="missing 'hidden_size'"):
        model_args_from_hf({k: v for k, v in cfg.items() if k != "hidden_size"}, "config.json")
    with pytest.raises(CheckpointError, match="rope scaling 'yarn'"):
        model_args_from_hf({**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "c")
    ours = tmp_path / "config.json"
    ours.write_text(json.dumps({"n_layers": 2}))
    with pytest.raises(CheckpointError, match="unknown ModelArgs field 'n_layers' \\(did you mean 'n_layer'\\?\\)"):
        read_config(ours)
    ours.write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not readable JSON"):
        read_config(ours)


def test_sentencepiece_round_trip(sp_model_file):
    tok = load_tokenizer(sp_model_file.parent)
    assert isinstance(tok, SentencePieceTokenizer)
    ids = tok.encode("the capital of france is paris")
    assert ids[0] == tok.bos_id == 1  # BOS first, as gpt-fast encodes
    assert tok.decode(ids) == "the capital of france is paris"


def test_hf_tokenizer_json_round_trip(hf_tokenizer_file):
    tok = load_tokenizer(hf_tokenizer_file)
    assert isinstance(tok, HFTokenizer) and (tok.bos_id, tok.eos_id) == (1, 2)
    ids = tok.encode("hello my name is")
    assert ids[0] == 1 and len(ids) == 5  # <s> + four words
    assert tok.decode(ids) == "hello my name is"


def test_missing_or_corrupt_tokenizer_is_named(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer found; expected one of tokenizer.model"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"nonsense")
    with pytest.raises(TokenizerError, match="tokenizer.model: not a readable SentencePiece model"):
        load_tokenizer(tmp_path)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_convert_script_writes_our_layout(tmp_path, hf_llama_dir, hf_tokenizer_file):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf_llama_dir / name).write_bytes((hf_tokenizer_file.parent / name).read_bytes())
    out = tmp_path / "converted"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "convert_hf_checkpoint.py"),
                          "--checkpoint_dir", str(hf_llama_dir), "--out_dir", str(out)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "tokenizer.json", "tokenizer_config.json"]
    x = torch.randint(0, 64, (1, 6))
    converted, direct = load_model(out), load_model(hf_llama_dir)
    # sorted words: I and brown bytes capital count dog flops fox france hello -> 3 + 10 = 13
    assert converted.kind == "safetensors" and converted.tokenizer.encode("hello") == [1, 13]
    torch.testing.assert_close(_our_logits(converted.model, x), _our_logits(direct.model, x))


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_convert_refuses_what_it_cannot_read(tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "convert_hf_checkpoint.py"),
                          "--checkpoint_dir", str(tmp_path / "missing"), "--out_dir", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 2 and "missing: no such file or folder" in run.stderr


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_smollm2_gguf_converted_says_paris(smollm2_dir):
    loaded = load_model(smollm2_dir)
    args = loaded.args  # published: 30 layers, hidden 576, 9 heads, 3 kv heads, theta 1e5
    assert (args.n_layer, args.dim, args.n_head, args.n_local_heads, args.rope_base) == (30, 576, 9, 3, 1e5)
    ids = loaded.tokenizer.encode("The capital of France is")
    logits = _our_logits(loaded.model, torch.tensor([ids]))
    assert loaded.tokenizer.decode([int(logits[0, -1].argmax())]) == " Paris"
