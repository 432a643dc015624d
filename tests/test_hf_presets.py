"""Presets for transformers architectures (perfcounter/models/hf_presets.yaml): each loads as its
transformers config class with the published fields, has the published parameter count (the model
transformers builds on the meta device, tied weights once, within 0.5 %), counts config-only as
`perfcounter count --model NAME` does, and has the KV cache bytes per token derived by hand below,
as transformers' eager cache stores it (measured on fake tensors) and as vLLM stores it."""
import os
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

from perfcounter import count_config  # noqa: E402
from perfcounter.cli.main import main as cli  # noqa: E402
from perfcounter.generation.config_only import fake_hf_model, resolve_config  # noqa: E402
from perfcounter.models import hf_presets  # noqa: E402
from perfcounter.models.args import PRESETS as OURS, ModelArgs, UnknownModelError  # noqa: E402
from perfcounter.models.hf_presets import (PRESETS, HfPreset, UnsupportedArchitecture,  # noqa: E402
                                           counted_config, find, preset_config)
from perfcounter.models.kv_layout import kv_bytes_per_token, kv_cache_bytes, kv_layers  # noqa: E402
from perfcounter.models.tokenizer import cache_keyword  # noqa: E402

BF16 = torch.bfloat16
NAMES = list(PRESETS)
MULTIMODAL = ("llama-4-scout", "llama-4-maverick", "gemma-3-12b", "gemma-3-27b")

# The published totals, each with what it counts (sources also in hf_presets.yaml, `parameters`).
PUBLISHED = {
    "qwen3-8b": 8.2e9,  # huggingface.co/Qwen/Qwen3-8B: "Number of Parameters: 8.2B"
    "qwen3-32b": 32.8e9,  # huggingface.co/Qwen/Qwen3-32B: "Number of Parameters: 32.8B"
    # huggingface.co/Qwen/Qwen3-30B-A3B: "Number of Parameters: 30.5B in total and 3.3B activated"
    "qwen3-30b-a3b": 30.5e9,
    # huggingface.co/Qwen/Qwen3-235B-A22B (and -FP8, "the FP8 version of Qwen3-235B-A22B"):
    # "Number of Parameters: 235B in total and 22B activated"
    "qwen3-235b-a22b": 235e9,
    "qwen3-235b-a22b-fp8": 235e9,
    # github.com/deepseek-ai/DeepSeek-V3 README_WEIGHTS.md, the Main Model: "Total parameters:
    # 671B", its 61 layers with the embedding and the head; the checkpoint's 685B add the 14B of
    # the multi-token-prediction module (layer 61), which transformers does not build
    "deepseek-v3": 671e9,
    "deepseek-r1": 671e9,  # huggingface.co/deepseek-ai/DeepSeek-R1: "DeepSeek-R1 | 671B | 37B"
    # arxiv.org/abs/2508.10925 (the gpt-oss model card): 20.9B and 116.8B total parameters
    "gpt-oss-20b": 20.9e9,
    "gpt-oss-120b": 116.8e9,
    # github.com/meta-llama/llama-models models/llama4/MODEL_CARD.md: "17B (Activated) 109B
    # (Total)" and "17B (Activated) 400B (Total)": the checkpoint, its vision tower included
    "llama-4-scout": 109e9,
    "llama-4-maverick": 400e9,
    # arxiv.org/abs/2503.19786 (Gemma 3 Technical Report), Table 1: vision encoder + embedding
    # + non-embedding parameters: 417M + 1,012M + 10,759M and 417M + 1,416M + 25,600M
    "gemma-3-12b": (417 + 1012 + 10759) * 1e6,
    "gemma-3-27b": (417 + 1416 + 25600) * 1e6,
}


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight once


def checkpoint_model(name):
    """The published checkpoint's model on the meta device: transformers' class for its
    config's `architectures`. AutoModelForCausalLM.from_config builds that class for every
    preset but Llama 4, where it builds the language model alone (Llama4ForCausalLM)."""
    config = preset_config(name)
    with torch.device("meta"):
        return getattr(transformers, config.architectures[0])._from_config(config)


def counted_model(name):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(counted_config(name))


def test_the_presets_are_the_issues_list_with_sources():
    assert NAMES == ["qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                     "qwen3-235b-a22b-fp8", "deepseek-v3", "deepseek-r1", "gpt-oss-20b",
                     "gpt-oss-120b", "llama-4-scout", "llama-4-maverick", "gemma-3-12b",
                     "gemma-3-27b"]
    for p in PRESETS.values():
        assert p.source["config"] == f"https://huggingface.co/{p.repo}/blob/main/config.json"
        assert p.source["read_from"].startswith("https://github.com/")
        assert p.source["parameters"].startswith("https://")


@pytest.mark.parametrize("name", NAMES)
def test_every_preset_loads_as_its_transformers_config_class(name):
    preset, config = PRESETS[name], preset_config(name)
    assert type(config) is transformers.CONFIG_MAPPING[preset.config["model_type"]]

    def published(obj, fields):  # transformers 5 folds rope_theta, rope_scaling in rope_parameters
        for key, value in fields.items():
            if key in ("text_config", "vision_config"):
                published(getattr(obj, key), value)
            elif key not in ("rope_theta", "rope_scaling"):
                assert getattr(obj, key) == value, (name, key)
    published(config, preset.config)
    text = {"llama4": "Llama4TextConfig", "gemma3": "Gemma3TextConfig"}  # a text_config's class
    assert type(counted_config(name)).__name__ == text.get(preset.config["model_type"],
                                                          type(config).__name__)


def test_gemma3_fields_not_published_are_transformers_defaults():
    # the 12B's config.json names neither: Gemma3TextConfig gives head_dim 256 and
    # query_pre_attn_scalar 256; both take vocab 262,208 and 5 sliding layers to 1 full
    c12, c27 = counted_config("gemma-3-12b"), counted_config("gemma-3-27b")
    assert (c12.head_dim, c12.query_pre_attn_scalar) == (256, 256)
    assert c12.vocab_size == c27.vocab_size == 262208
    assert c12.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert c27.layer_types.count("full_attention") == 62 // 6  # 10 of 62


@pytest.mark.parametrize("name", NAMES)
def test_parameters_equal_the_published_total(name):
    total = parameters(checkpoint_model(name))
    assert total == pytest.approx(PUBLISHED[name], rel=0.005), f"{total:,} vs {PUBLISHED[name]:,}"


TOWERS = ("vision_model", "vision_tower", "multi_modal_projector")  # the image side's modules


@pytest.mark.parametrize("name", MULTIMODAL)
def test_the_counted_model_is_the_checkpoints_language_model(name):
    full = checkpoint_model(name)
    towers = sum(parameters(m) for n, m in full.named_modules()
                 if n.rsplit(".", 1)[-1] in TOWERS)
    assert parameters(counted_model(name)) == parameters(full) - towers


# KV cache bytes per token, every layer holding the token (inside each window), bfloat16 (2 B):
# layers x 2 (K and V) x KV heads x head_dim x 2 B; MLA: layers x (kv_lora_rank + rope) x 2 B
KV_PER_TOKEN = {
    "qwen3-8b": 36 * 2 * 8 * 128 * 2,  # 147,456
    "qwen3-32b": 64 * 2 * 8 * 128 * 2,  # 262,144
    "qwen3-30b-a3b": 48 * 2 * 4 * 128 * 2,  # 98,304
    "qwen3-235b-a22b": 94 * 2 * 4 * 128 * 2,  # 192,512
    "qwen3-235b-a22b-fp8": 94 * 2 * 4 * 128 * 2,  # FP8 weights; the cache stays bfloat16
    # MLA: the compressed latent (kv_lora_rank 512) and the rope key (qk_rope_head_dim 64), one
    # for all 128 heads: (512 + 64) x 61 x 2 = 70,272, as vLLM's MLAAttention stores it and as
    # transformers caches it (kv_nope [B, 1, S, 512] and k_rot [B, 1, S, 64]); 128 heads' own
    # keys (128 + 64) and values (128) would be 61 x 128 x (192 + 128) x 2 = 4,997,120
    "deepseek-v3": (512 + 64) * 61 * 2,
    "deepseek-r1": (512 + 64) * 61 * 2,
    "gpt-oss-20b": 24 * 2 * 8 * 64 * 2,  # 49,152 (12 of the 24 layers sliding, window 128)
    "gpt-oss-120b": 36 * 2 * 8 * 64 * 2,  # 73,728 (18 of 36 sliding)
    "llama-4-scout": 48 * 2 * 8 * 128 * 2,  # 196,608 (36 of 48 chunked, chunk 8,192)
    "llama-4-maverick": 48 * 2 * 8 * 128 * 2,  # 196,608 (the same attention as Scout's)
    "gemma-3-12b": 48 * 2 * 8 * 256 * 2,  # 393,216 (40 of 48 sliding, window 1,024)
    "gemma-3-27b": 62 * 2 * 16 * 128 * 2,  # 507,904 (52 of 62 sliding)
}


@pytest.mark.parametrize("name", NAMES)
def test_kv_bytes_per_token_derived_by_hand(name):
    config = counted_config(name)
    assert kv_bytes_per_token(config, BF16, "eager") == KV_PER_TOKEN[name]
    assert kv_bytes_per_token(config, BF16, "engine") == KV_PER_TOKEN[name]
    assert kv_bytes_per_token(config, torch.float8_e4m3fn) == KV_PER_TOKEN[name] // 2


def test_windowed_layers_hold_their_window():
    # gpt-oss-20b at 32,768 tokens: 12 full layers x 2,048 B (2 x 8 x 64 x 2) x 32,768 tokens
    # + 12 sliding layers x 2,048 B x 127 (the window's 128 - 1 before the current token)
    gpt = counted_config("gpt-oss-20b")
    expected = 12 * 2048 * 32768 + 12 * 2048 * 127  # 805,306,368 + 3,121,152 = 808,427,520
    assert kv_cache_bytes(gpt, BF16, 32768, "eager") == kv_cache_bytes(gpt, BF16, 32768) == expected
    # Llama 4 Scout: 12 full layers x 4,096 B (2 x 8 x 128 x 2) x 32,768 + 36 chunked layers x
    # 4,096 B x 8,191 (transformers: a sliding window of the chunk, 8,192 - 1) or 8,192 (vLLM)
    scout = counted_config("llama-4-scout")
    full = 12 * 4096 * 32768  # 1,610,612,736
    assert kv_cache_bytes(scout, BF16, 32768, "eager") == full + 36 * 4096 * 8191
    assert kv_cache_bytes(scout, BF16, 32768, "engine") == full + 36 * 4096 * 8192
    assert kv_cache_bytes(scout, BF16, 100) == 48 * 4096 * 100  # inside every window
    assert [layer.window for layer in kv_layers(scout, "eager")][:4] == [8191, 8191, 8191, None]
    with pytest.raises(ValueError, match="layout='paged'; expected one of engine, eager"):
        kv_layers(scout, "paged")


def fewer_layers(name, layers):
    """Preset `name`'s language model with its first `layers` layers, the published widths."""
    fields = dict(PRESETS[name].config)
    fields = dict(fields.get("text_config", fields), num_hidden_layers=layers)
    if "layer_types" in fields:
        fields["layer_types"] = fields["layer_types"][:layers]
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)


def eager_cache_bytes(config, tokens: int) -> int:
    """Bytes transformers' default cache holds after a prefill of `tokens` tokens (fake tensors)."""
    model, fake_mode = fake_hf_model(config, dtype=BF16)
    with fake_mode:
        out = model(input_ids=torch.zeros(1, tokens, dtype=torch.int64), use_cache=True)
    cache = getattr(out, cache_keyword(model))
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return sum(t.numel() * t.element_size() for t in tensors)


# one layer of each attention kind (Gemma 3's sixth layer is its first full one; Llama 4's fourth)
@pytest.mark.parametrize("name, layers, tokens", [
    ("qwen3-8b", 2, 4), ("qwen3-30b-a3b", 2, 4), ("deepseek-v3", 2, 4), ("gpt-oss-20b", 2, 4),
    ("gpt-oss-20b", 2, 200), ("gemma-3-12b", 6, 4), ("llama-4-scout", 4, 4)])
def test_eager_layout_is_what_transformers_caches(name, layers, tokens):
    config = fewer_layers(name, layers)
    assert eager_cache_bytes(config, tokens) == kv_cache_bytes(config, BF16, tokens, "eager")


def counted_parameters(counter, config) -> int:
    """Parameters the counted modules own, a tied weight once: the trace gives a tied head's
    weight to both modules holding it (embed_tokens and lm_head)."""
    modules = counter.counts["decode"].trace.modules
    head = next(m.params for m in modules if m.path.endswith(".lm_head"))
    tied = head if config.tie_word_embeddings else 0
    return sum(m.params for m in modules) - tied


SMALL = ("qwen3-8b", "gpt-oss-20b", "gemma-3-12b")  # a config-only count in seconds


@pytest.mark.parametrize("name", [n if n in SMALL else pytest.param(n, marks=pytest.mark.slow)
                                  for n in NAMES])
def test_counted_config_only_with_the_published_parameters(name):
    start, load = time.perf_counter(), os.getloadavg()[0]
    counter = count_config(name, prompt_length=8, new_tokens=2)
    print(f"{name}: counted config-only in {time.perf_counter() - start:.1f} s "
          f"(load average {load:.2f} before, {os.getloadavg()[0]:.2f} after)")
    assert (counter.counts["prefill"].steps, counter.counts["decode"].steps) == (1, 1)
    counted = counted_parameters(counter, counted_config(name))
    assert counted == parameters(counted_model(name))  # the language model, every weight once
    if name not in MULTIMODAL:  # a multimodal total adds the vision tower (test above)
        assert counted == pytest.approx(PUBLISHED[name], rel=0.005)


@pytest.mark.slow
def test_perfcounter_count_takes_a_preset(capsys):
    assert cli(argv=["count", "--model", "gpt-oss-20b", "--prompt_length", "8",
                     "--max_new_tokens", "2", "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("gpt-oss-20b: counted with no weights (FakeTensorMode)")
    assert '"decode"' in out.out


def test_names_and_aliases():
    assert find("Qwen/Qwen3-235B-A22B-FP8") == find("QWEN3-235B-A22B-FP8") == "qwen3-235b-a22b-fp8"
    assert find("meta-llama/Llama-4-Scout-17B-16E-Instruct") == "llama-4-scout"
    assert find("google/gemma-3-27b-it") == "gemma-3-27b"
    assert find("qwen3-8") is None and find("llama-3-8b") is None
    assert type(resolve_config("deepseek-r1")).__name__ == "DeepseekV3Config"
    assert isinstance(resolve_config("llama-3-8b"), ModelArgs)  # ours stay ours
    assert not set(hf_presets.LOOKUP) & set(OURS)


def test_an_unknown_name_lists_both_kinds_of_preset():
    with pytest.raises(UnknownModelError) as e:
        ModelArgs.from_name("qwen3-9b")
    assert str(e.value).startswith("unknown model 'qwen3-9b'; did you mean qwen3-8b")
    assert "presets: llama-2-7b, " in str(e.value)
    assert "; transformers presets: qwen3-8b, " in str(e.value)
    with pytest.raises(UnknownModelError, match="is the transformers preset 'gpt-oss-20b'"):
        ModelArgs.from_name("openai/gpt-oss-20b")  # perfcounter's own model has no such preset


def test_a_model_type_transformers_lacks_is_refused_in_one_line(monkeypatch):
    monkeypatch.setitem(PRESETS, "qwen3-8b", HfPreset(
        name="qwen3-8b", repo="Qwen/Qwen3-8B", source={},
        config=dict(PRESETS["qwen3-8b"].config, model_type="qwen9")))
    with pytest.raises(UnsupportedArchitecture, match=r"^preset 'qwen3-8b': model_type 'qwen9' is "
                                                      r"not a transformers 5\.\S+ architecture"):
        count_config("qwen3-8b")
