"""The gpt-fast style Transformer: presets, parameter counts, cache, RoPE, masks."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import randomize_, tiny_args
from perfcounter.models.model import Transformer, count_params, precompute_freqs_cis
from perfcounter.models.args import PRESETS, ModelArgs, UnknownModelError

SEED_004_REPR = ("ModelArgs(block_size=2048, vocab_size=32000, n_layer=32, n_head=32, dim=4096, "
                 "intermediate_size=11008, n_local_heads=32, head_dim=128, rope_base=10000, "
                 "norm_eps=1e-05)")


def test_llama_2_7b_preset_prints_as_in_seed_004_with_its_real_context():
    # seed 004 printed gpt-fast's default block of 2,048; Llama-2's context (its config's
    # max_position_embeddings) is 4,096, which the preset carries so that a 2,048-token
    # prompt plus new tokens fits
    assert repr(ModelArgs.from_name("llama-2-7b")) == SEED_004_REPR.replace("block_size=2048",
                                                                             "block_size=4096")


def test_llama_2_7b_parameter_counts():
    with torch.device("meta"):
        model = Transformer.from_name("llama-2-7b")
    # embedding = output = 32000 * 4096 = 131_072_000
    # per layer: wqkv 3 * 4096^2 = 50_331_648, wo 4096^2 = 16_777_216,
    #            w1 w2 w3 3 * 4096 * 11008 = 135_266_304, two norms 8_192 -> 202_383_360
    # total = 131_072_000 * 2 + 32 * 202_383_360 + 4_096 = 6_738_415_616
    # active = total - embedding table = 6_607_343_616
    assert count_params(model) == (6_607_343_616, 6_738_415_616)


def test_tiny_parameter_counts_dense_tied_and_moe():
    with torch.device("meta"):
        dense = Transformer(tiny_args())
        tied = Transformer(tiny_args(tie_embeddings=True))
        moe = Transformer(tiny_args(num_experts=4, num_activated_experts=2))
    # embed 64*32 = 2048; layer: wqkv (32+16+16)*32 = 2048, wo 1024, ffn 3*32*48 = 4608,
    # norms 64 -> 7744; total = 2048 + 2*7744 + 32 + 2048 = 19616; active = 19616 - 2048
    assert count_params(dense) == (17568, 19616)
    # tied: the table is stored once and read in full by the output head -> active = total
    assert count_params(tied) == (17568, 17568)
    assert tied.output.weight is tied.tok_embeddings.weight
    # moe layer: gate 4*32 = 128, experts 4*3*32*48 = 18432 -> 2048+1024+64+128+18432 = 21696
    # total = 2048 + 2*21696 + 32 + 2048 = 47520
    # active = 47520 - 2048 (embedding) - 2 layers * 18432/2 (two idle experts) = 27040
    assert count_params(moe) == (27040, 47520)


@pytest.mark.parametrize("scheme", ["int8", "int4-32"])
def test_parameter_counts_do_not_change_with_how_weights_are_stored(scheme):
    from perfcounter.quant.quantize import parse_scheme, quantize_model
    model = Transformer(tiny_args(intermediate_size=64)).to(torch.bfloat16)
    before = count_params(model)
    # int8 keeps [N, K] int8 plus N scales, int4 [N, K/2] bytes plus [K/G, N, 2] scales and
    # zeros: the layers still have N·K parameters, and their scales are not the model's.
    # layer: wqkv 2048 + wo 1024 + ffn 3*32*64 = 6144 + norms 64 = 9280;
    # total = 2048 + 2*9280 + 32 + 2048 = 22688; active = 22688 - 2048 = 20640
    quantize_model(model, parse_scheme(scheme), tile=False)
    assert count_params(model) == before == (20640, 22688)


@pytest.mark.parametrize("name, preset", [
    ("Llama-2-7b-chat-hf", "llama-2-7b"), ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("checkpoints/HuggingFaceTB/SmolLM2-135M-Instruct/", "smollm2-135m"), ("7B", "llama-2-7b"),
    ("QWEN2.5-0.5B", "qwen2.5-0.5b")])
def test_from_name_matches_exact_names_and_aliases(name, preset):
    assert ModelArgs.from_name(name) == ModelArgs(**PRESETS[preset])


def test_unknown_name_lists_presets_and_suggests():
    with pytest.raises(UnknownModelError) as err:
        ModelArgs.from_name("llama-2-8b")
    msg = str(err.value)
    assert "'llama-2-8b'" in msg and "did you mean" in msg and "llama-2-7b" in msg
    assert all(name in msg for name in PRESETS)
    with pytest.raises(UnknownModelError, match="unknown model 'gpt2'; presets: llama-2-7b, "):
        ModelArgs.from_name("gpt2")  # nothing close: the presets alone
    with pytest.raises(KeyError):  # no substring matching: "llama" alone is no model
        ModelArgs.from_name("llama")


def test_every_preset_builds_and_lists_its_extras():
    with torch.device("meta"):
        for name in PRESETS:
            Transformer.from_name(name)
    assert "tie_embeddings=True" in repr(ModelArgs.from_name("smollm2-135m"))
    assert "num_experts=8" in repr(ModelArgs.from_name("mixtral-8x7b"))
    assert ModelArgs.from_name("qwen2.5-0.5b").attention_bias


def test_bad_model_args_are_refused():
    with pytest.raises(ValueError, match="n_head=6 is not a multiple of n_local_heads=4"):
        ModelArgs(n_head=6, n_local_heads=4, dim=48)
    with pytest.raises(ValueError, match="num_activated_experts=3"):
        ModelArgs(num_experts=2, num_activated_experts=3)


def test_cached_decoding_equals_full_forward(tiny_model):
    x = torch.randint(0, 64, (2, 7))
    tiny_model.setup_caches(2, 10)
    with torch.no_grad():
        full = tiny_model(x, torch.arange(7))
        tiny_model.setup_caches(2, 10)
        steps = [tiny_model(x[:, :4], torch.arange(4))]
        cache = tiny_model.layers[0].attention.kv_cache
        assert cache.k_cache.shape == (2, 2, 10, 8)  # [B, H_kv, max_seq, D]
        assert cache.k_cache[:, :, :4].abs().sum() > 0 and cache.k_cache[:, :, 4:].abs().sum() == 0
        steps += [tiny_model(x[:, i:i + 1], torch.tensor([i])) for i in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cache_buffers_are_named_and_outside_the_state_dict(tiny_model):
    tiny_model.setup_caches(1, 8)
    names = {n for n, _ in tiny_model.named_buffers()}
    assert "layers.0.attention.kv_cache.k_cache" in names and "layers.1.attention.kv_cache.v_cache" in names
    assert not any("cache" in k or "freqs" in k or "mask" in k for k in tiny_model.state_dict())


def test_attention_goes_through_sdpa(tiny_model, monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    tiny_model.setup_caches(1, 8)
    with torch.no_grad():
        tiny_model(torch.zeros(1, 3, dtype=torch.long), torch.arange(3))
    assert len(calls) == 2  # one per layer


def test_sliding_window_mask():
    with torch.device("meta"):
        model = Transformer(tiny_args(sliding_window=2))
    model.to_empty(device="cpu").setup_caches(1, 5)
    # query 3 sees keys 2 and 3 only (3 - k < 2); query 0 sees key 0
    assert model.causal_mask[3].tolist() == [False, False, True, True, False]
    assert model.causal_mask[0].tolist() == [True, False, False, False, False]


def test_sliding_window_changes_only_far_positions():
    torch.manual_seed(0)
    plain = randomize_(Transformer(tiny_args()))
    windowed = Transformer(tiny_args(sliding_window=2))
    windowed.load_state_dict(plain.state_dict())
    x = torch.randint(0, 64, (1, 4))
    with torch.no_grad():
        plain.setup_caches(1, 4), windowed.setup_caches(1, 4)
        a, b = plain(x, torch.arange(4)), windowed(x, torch.arange(4))
    # positions 0 and 1 see at most 2 keys anyway; positions 2, 3 lose key 0 (and 1)
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert (a[:, 2:] - b[:, 2:]).abs().max() > 1e-3


def test_llama3_rope_scaling_by_hand():
    scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    table = precompute_freqs_cis(2, 8, base=10000, rope_scaling=scaling)  # [2, 4, 2]
    angles = torch.atan2(table[1, :, 1], table[1, :, 0])  # position 1: the frequencies
    # freqs = 10000^(-i/4) = 1, 0.1, 0.01, 0.001; wavelengths 2*pi/f = 6.28, 62.8, 628, 6283
    # 6.28 < 64/4 = 16: kept; 628 and 6283 > 64/1: divided by 8
    # 62.8 in between: s = (64/62.83 - 1) / (4 - 1), f = (1 - s) * 0.1/8 + s * 0.1
    s = (64 / (2 * math.pi / 0.1) - 1) / 3
    expected = [1.0, (1 - s) * 0.1 / 8 + s * 0.1, 0.01 / 8, 0.001 / 8]
    torch.testing.assert_close(angles, torch.tensor(expected), rtol=1e-5, atol=0)


def test_setup_and_forward_misuse_are_explained(tiny_model):
    with pytest.raises(RuntimeError, match="setup_caches"):
        tiny_model(torch.zeros(1, 2, dtype=torch.long), torch.arange(2))
    with pytest.raises(ValueError, match="max_seq_length=65 exceeds the model's block_size=64"):
        tiny_model.setup_caches(1, 65)


def test_moe_routes_each_token_to_its_top_experts():
    torch.manual_seed(0)
    model = randomize_(Transformer(tiny_args(num_experts=4, num_activated_experts=1, n_layer=1)))
    moe = model.layers[0].feed_forward
    x = torch.randn(3, 32)
    with torch.no_grad():
        out = moe(x)
        chosen = moe.gate(x).argmax(-1)
        ffn = moe.cond_ffn
        for t in range(3):  # top-1: weight 1 on the chosen expert's SwiGLU
            e = chosen[t]
            ref = ffn.w2[e] @ (F.silu(ffn.w1[e] @ x[t]) * (ffn.w3[e] @ x[t]))
            torch.testing.assert_close(out[t], ref, atol=1e-5, rtol=1e-5)
