"""A newcomer's first runs: checked from the checkpoint's config before anything is measured or
loaded (generation/run.check_checkpoint), and a prompt of real text (generation/prompt.py)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_args
from perfcounter.devices import this_machine
from perfcounter.generation import prompt as prompts
from perfcounter.generation import run
from perfcounter.models import fit
from perfcounter.models.checkpoint_files import CheckpointError
from perfcounter.models.fit import MemoryFitError
from perfcounter.models.loading import save_checkpoint
from perfcounter.models.tokenizer import SentencePieceTokenizer

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """Measuring allowed, but measuring or loading anything fails the test."""
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PERFCOUNTER_MEASURE")

    def never(*a, **kw):
        raise AssertionError("measured or loaded before the flags were checked")
    monkeypatch.setattr(this_machine, "calibrate", never)
    monkeypatch.setattr(run, "load_model", never)


def test_a_pth_without_a_config_is_refused_before_measuring_or_loading(tmp_path, tiny_model,
                                                                       nothing_runs):
    folder = tmp_path / "my-weights"  # no config.json, and no preset has this name
    folder.mkdir()
    torch.save(tiny_model.state_dict(), folder / "model.pth")
    with pytest.raises(CheckpointError) as refused:
        gen.main(checkpoint_path=folder / "model.pth", prompt_length=4, max_new_tokens=2)
    assert str(refused.value) == (
        f"{folder / 'model.pth'}: no config.json beside it and its folder's name 'my-weights' "
        "is no preset; pass --model NAME (a preset) or --config FILE, or put the model's "
        "config.json beside it")


def test_a_batch_that_cannot_fit_is_refused_before_measuring_or_loading(tmp_path, tiny_model,
                                                                        nothing_runs,
                                                                        monkeypatch):
    save_checkpoint(tmp_path / "ckpt", tiny_args(), tiny_model.state_dict())
    monkeypatch.setattr(fit, "available_bytes", lambda device: (1_000_000, "left in this test"))
    # KV: 2 * 2 layers * 100,000 * 2 kv heads * (4 + 2) tokens * 8 * 4 B = 153.6 MB;
    # activations: 100,000 * 4 * (64 + 3 * 48 + 4 * 32) * 4 + 100,000 * 4 heads * 4 * 6 * 4
    # = 537.6 MB + 38.4 MB = 576 MB, against the 1 MB left
    with pytest.raises(MemoryFitError, match=r"^batch 100,000 x 6 tokens needs 153\.60 MB of "
                                             r"KV cache and about 576\.00 MB of activations; "
                                             r"1\.00 MB is left in this test"):
        gen.main(checkpoint_path=tmp_path / "ckpt", prompt_length=4, max_new_tokens=2,
                 batch_size=100_000)


def test_a_prompt_past_the_context_is_refused_before_loading(tmp_path, tiny_model,
                                                             nothing_runs):
    save_checkpoint(tmp_path / "ckpt", tiny_args(), tiny_model.state_dict())
    with pytest.raises(run.GenerateArgumentError, match=r"^max_seq_length=70 exceeds the "
                                                        r"model's block_size=64"):
        gen.main(checkpoint_path=tmp_path / "ckpt", prompt_length=60, max_new_tokens=10)


@pytest.mark.slow  # reads the built-in GGUF's config (transformers' import: seconds)
def test_the_default_model_at_batch_100000_is_refused_at_once_in_one_line():
    try:
        from perfcounter.models.loading import default_checkpoint
        default_checkpoint()
    except CheckpointError as e:
        pytest.skip(str(e))
    env = {k: v for k, v in os.environ.items() if k != "PERFCOUNTER_MEASURE"}
    done = subprocess.run([sys.executable, "generate.py", "--batch_size", "100000"], cwd=REPO,
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "Device spec" not in done.stdout  # nothing measured
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("generate.py: error: batch 100,000 x 256 "
                                                   "tokens needs ")


# -- the prompt: real text -------------------------------------------------------------------
def test_the_default_prompt_is_the_passage_cut_to_its_length(sp_model_file):
    tok = SentencePieceTokenizer(sp_model_file)
    whole = tok.encode(prompts.PASSAGE)
    ids, what = prompts.prompt_ids(tok, None, 8, vocab_size=64)
    assert ids == whole[:8] and what.startswith("8 tokens of the built-in text")
    longer, _ = prompts.prompt_ids(tok, None, len(whole) + 5, vocab_size=64)
    # the passage twice, a blank line between: its first len(whole) tokens are the passage's
    assert len(longer) == len(whole) + 5 and longer[:len(whole) - 1] == whole[:-1]


def test_no_tokenizer_or_one_that_does_not_fit_gives_random_ids_and_says_so(sp_model_file):
    ids, what = prompts.prompt_ids(None, None, 5, vocab_size=64)
    assert ids is None and what == "5 random token ids (no tokenizer beside the checkpoint)"
    tok = SentencePieceTokenizer(sp_model_file)  # 60 tokens: ids past a 3-token model's
    ids, what = prompts.prompt_ids(tok, None, 5, vocab_size=3)
    assert ids is None and what.startswith("5 random token ids (the built-in text: ")
    x, _ = prompts.prompt_tensor(None, None, 5, 3, batch=2, device="cpu")
    assert x.shape == (2, 5) and int(x.max()) < 3
    given, what = prompts.prompt_ids(tok, "the", None, vocab_size=64)
    assert given == tok.encode("the") and what == "the given text"


def test_generate_says_what_its_prompt_is(tmp_path, tiny_model, sp_model_file, capsys):
    save_checkpoint(tmp_path / "ckpt", tiny_args(), tiny_model.state_dict())
    (tmp_path / "ckpt" / "tokenizer.model").write_bytes(sp_model_file.read_bytes())
    out = gen.main(checkpoint_path=tmp_path / "ckpt", prompt_length=6, max_new_tokens=2,
                   device_spec="generic-cpu", temperature=0)
    assert "Prompt: 6 tokens of the built-in text" in capsys.readouterr().out
    tok = SentencePieceTokenizer(sp_model_file)
    head = tok.decode(prompts.passage_ids(tok, 6, 64))
    assert out["texts"][0].startswith(head)  # the text the run printed begins with its prompt


@pytest.mark.slow  # SmolLM2-135M converted once a session (~15 s)
def test_smollm2_continues_the_default_prompt_in_words(smollm2_dir):
    out = gen.main(checkpoint_path=smollm2_dir, prompt_length=32, max_new_tokens=12,
                   precision="float32", quiet=True, device_spec="generic-cpu", temperature=0)
    text = out["texts"][0]
    assert text.startswith("Alice was beginning to get very tired of sitting by her sister")
    words = text[len(text) // 2:].split()
    assert len(words) >= 4 and all(w.isascii() for w in words)  # readable, not random ids


# -- a GGUF's figures from its header --------------------------------------------------------
def test_a_gguf_headers_figures_are_read_without_transformers(tmp_path):
    gguf = pytest.importorskip("gguf")
    from perfcounter.models.gguf_header import gguf_shape
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(512)
    w.add_token_list([f"t{i}" for i in range(300)])  # an array of strings, skipped by length
    w.add_tensor("x", torch.zeros(4, dtype=torch.float32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = gguf_shape(path)
    assert (shape.num_hidden_layers, shape.hidden_size, shape.intermediate_size,
            shape.num_attention_heads, shape.num_key_value_heads, shape.max_position_embeddings,
            shape.vocab_size) == (2, 64, 128, 4, 2, 512, 300)
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")  # the header ends early: transformers asked
    assert gguf_shape(tmp_path / "bad.gguf") is None


@pytest.mark.slow  # transformers' reader of the built-in GGUF: seconds
def test_the_header_agrees_with_transformers_on_the_built_in_model():
    from perfcounter.models.checkpoint_config import gguf_config
    from perfcounter.models.gguf_header import gguf_shape
    from perfcounter.models.loading import default_checkpoint
    try:
        path = default_checkpoint()
    except CheckpointError as e:
        pytest.skip(str(e))
    shape, config = gguf_shape(path), gguf_config(path)
    for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "vocab_size"):
        assert getattr(shape, name) == getattr(config, name), name
