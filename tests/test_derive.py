"""derive.py: decode steps and identical layers, derived and held equal to counting them."""
import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import torch

from conftest import make_hf_model, randomize_, tiny_args
from perfcounter import TransformerPerformanceCounter
from perfcounter._util import PerfcounterWarning
from perfcounter.generation.config_only import count_config_only, greedy_generate
from perfcounter.generation.derive import (DecodeSteps, DeriveError, count_generation, count_layers,
                                decode_breakpoints, fit_steps, layer_kinds)
from perfcounter.models.model import Transformer
from perfcounter.models.args import ModelArgs
from perfcounter.models.tokenizer import cache_keyword
from perfcounter.trace import KINDS, ROLES, OpRecord, Trace, args_from_text

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def figures(trace: Trace) -> dict:
    """Per op and module (the record key): every figure, same keys summed."""
    out = {}
    for r in trace.records:
        f = [r.calls, r.flops, r.executed_flops, *r.kinds, *r.read, *r.written]
        old = out.get(r.key, [0] * len(f))
        out[r.key] = [a + b for a, b in zip(old, f)]
    return out


def assert_same(a: Trace, b: Trace, *, valid_kv: bool = True):
    """Record for record, module for module, phase figures too."""
    assert figures(a) == figures(b)
    assert [m.to_dict() for m in a.modules] == [m.to_dict() for m in b.modules]
    assert (a.compulsory_read, a.compulsory_written) == (b.compulsory_read, b.compulsory_written)
    assert (a.fused_read, a.fused_written) == (b.fused_read, b.fused_written)
    assert a.uncounted_ops == b.uncounted_ops and a.steps == b.steps
    if valid_kv:
        assert a.kv_cache_valid_read == b.kv_cache_valid_read


@torch.no_grad()
def hf_generate(model, prompt, max_new_tokens, *, phase, static=False):
    """Greedy generation through transformers with a DynamicCache (or a StaticCache)."""
    import transformers
    if static:
        cache = transformers.StaticCache(config=model.config,
                                         max_cache_len=prompt.shape[1] + max_new_tokens)
    else:
        cache = transformers.DynamicCache(config=model.config)
    with phase("prefill", num_tokens=prompt.numel()):
        logits = model(input_ids=prompt, use_cache=True, **{cache_keyword(model): cache}).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(max_new_tokens - 1):
        with phase("decode", num_tokens=prompt.shape[0]):
            logits = model(input_ids=token, use_cache=True, **{cache_keyword(model): cache}).logits
        token = logits[:, -1].argmax(-1, keepdim=True)


def stepwise_and_derived(generate, model, prompt, new_tokens, **kw):
    """(counter counting every step, counter deriving, the DecodeSteps)."""
    every = TransformerPerformanceCounter()
    generate(model, prompt, new_tokens, phase=every.count, **kw)
    derived = TransformerPerformanceCounter()
    steps = DecodeSteps(derived, new_tokens - 1, breakpoints=decode_breakpoints(model.config))
    generate(model, prompt, new_tokens, phase=steps, **kw)
    steps.finish()
    return every, derived, steps


# -- the fit, by hand -------------------------------------------------------------------
def step(x: int, *, extra: int = 0) -> Trace:
    """A step at context x: a cache growing by concatenation (float32 [1, 2, x, 8] plus one
    row), and an index lookup that does not move."""
    zeros = [0] * len(KINDS)
    read = [0, 2 * x * 8 * 4, 64, 0, 0]  # kv_cache: 2*x*8 floats; activation: the new row
    cat = OpRecord("aten.cat.default", "M.attn", "float32",
                   args_from_text(f"[[1, 2, {x}, 8], [1, 2, 1, 8]], -2", "float32"),
                   calls=2, read=[2 * v for v in read],
                   written=[0, 2 * 2 * (x + 1) * 8 * 4 + extra, 0, 0, 0], kinds=list(zeros))
    mm = OpRecord("aten.mm.default", "M.mlp", "float32", args_from_text("[1, 8], [8, 8]", "float32"),
                  calls=1, flops=128,
                  executed_flops=128, kinds=[64, 64] + zeros[2:], read=[256, 0, 32, 0, 0],
                  written=[0, 0, 32, 0, 0])
    return Trace(records=[cat, mm], compulsory_read=[256, 2 * 2 * x * 8 * 4, 96, 0, 0],
                 compulsory_written=[0, 2 * 2 * (x + 1) * 8 * 4, 32, 0, 0],
                 kv_cache_valid_read=128 * x)


def test_fit_derives_steps_by_hand():
    fit = fit_steps([(10, step(10)), (11, step(11)), (12, step(12))])
    total = fit.total(range(13, 16))  # contexts 13, 14, 15
    cats = sorted((r.shapes, r.read[ROLES.index("kv_cache")]) for r in total.records
                  if r.op == "aten.cat.default")
    # one record per signature; kv_cache read = 2 calls * 2*x*8*4 = 128 x
    assert cats == [("[[1, 2, 13, 8], [1, 2, 1, 8]], -2", 1664),
                    ("[[1, 2, 14, 8], [1, 2, 1, 8]], -2", 1792),
                    ("[[1, 2, 15, 8], [1, 2, 1, 8]], -2", 1920)]
    (mm,) = [r for r in total.records if r.op == "aten.mm.default"]
    assert (mm.calls, mm.flops, mm.shapes) == (3, 384, "[1, 8], [8, 8]")  # 3 steps * 128
    assert total.kv_cache_valid_read == 128 * (13 + 14 + 15) and total.steps == 3
    assert total.compulsory_read[ROLES.index("weight")] == 3 * 256


def attention_step(x: int) -> Trace:
    """q·kᵀ [4, 1, 8] x [4, 8, x] and p·v [4, 1, x] x [4, x, 8]: one signature at x = 8."""
    def bmm(shapes, flops):
        return OpRecord("aten.bmm.default", "M.attn", "float32", args_from_text(shapes, "float32"),
                        calls=1, flops=flops,
                        executed_flops=flops, kinds=[flops // 2, flops // 2, 0, 0, 0, 0, 0])
    return Trace(records=[bmm(f"[4, 1, 8], [4, 8, {x}]", 64 * x)]).merge(
        Trace(records=[bmm(f"[4, 1, {x}], [4, {x}, 8]", 64 * x)]))  # same key: summed


def test_a_step_whose_signatures_coincide_is_checked_not_fitted_on():
    # at x = 8 both matmuls have signature [4, 1, 8], [4, 8, 8]: one record of 2 calls
    assert len(attention_step(8).records) == 1
    fit = fit_steps([(6, attention_step(6)), (7, attention_step(7)), (8, attention_step(8))])
    assert fit.x0 == 6  # fitted on 6 and 7, checked on 8
    total = fit.total(range(6, 10))
    expected = Trace()
    for x in range(6, 10):
        expected = expected.merge(attention_step(x))
    assert figures(total) == figures(expected)


def test_fit_refuses_what_is_not_affine():
    with pytest.raises(DeriveError, match="12 counted vs fit: aten.cat.default under M.attn"):
        fit_steps([(10, step(10)), (11, step(11)), (12, step(12, extra=4))])
    moved = step(12)
    moved.records[1].module = "M.other"
    with pytest.raises(DeriveError, match="context 12 counted vs fit: aten.mm.default under M.mlp"):
        fit_steps([(10, step(10)), (11, step(11)), (12, moved)])
    shrinking = fit_steps([(10, step(11)), (11, step(10))])  # one row fewer each step
    with pytest.raises(DeriveError, match="negative"):
        shrinking.total(range(10, 40))


# -- decode steps: derived equals stepwise --------------------------------------------------
@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_static_cache_64_steps_derived_equal_stepwise():
    torch.manual_seed(0)
    model = randomize_(Transformer(tiny_args(block_size=128)))
    every, derived, steps = stepwise_and_derived(gen.generate, model, torch.tensor([[1, 5, 9, 2]]),
                                                 65, temperature=0)
    assert (len(steps.counted), steps.timed, steps.reason) == (3, 61, None)
    for label in ("prefill", "decode"):
        assert_same(every.counts[label].trace, derived.counts[label].trace, valid_kv=False)
    decode = derived.counts["decode"]
    assert decode.num_tokens == 64 and decode.trace.steps == 64
    assert decode.latency > 0 and "61 uncounted of 64 steps" in decode.timing


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_static_cache_valid_kv_bytes_derived_equal_stepwise():
    torch.manual_seed(0)
    model = randomize_(Transformer(tiny_args(block_size=128)))
    every, derived, _ = stepwise_and_derived(gen.generate, model, torch.tensor([[1, 5, 9, 2]]), 65,
                                             temperature=0)
    assert (every.counts["decode"].trace.kv_cache_valid_read
            == derived.counts["decode"].trace.kv_cache_valid_read)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
@pytest.mark.parametrize("static", [False, True], ids=["DynamicCache", "StaticCache"])
def test_transformers_cache_64_steps_derived_equal_stepwise(static):
    model = make_hf_model("llama")
    every, derived, steps = stepwise_and_derived(hf_generate, model, torch.tensor([[1, 5, 9, 2]]),
                                                 65, static=static)
    assert (len(steps.counted), steps.reason) == (3, None)
    for label in ("prefill", "decode"):
        assert_same(every.counts[label].trace, derived.counts[label].trace, valid_kv=not static)
    if not static:  # the cache grows: attention's signature moves every step
        cats = {r.shapes for r in derived.counts["decode"].trace.records
                if r.op == "aten.cat.default" and r.shapes.endswith("[1, 2, 1, 8]], -2")}
        assert len(cats) == 64  # keys and values [1, 2, x, 8] + the new row, x = 4 .. 67


def test_sliding_window_edge_inside_the_generation_counts_every_step():
    model = make_hf_model("mistral", sliding_window=20)  # the cache stops growing at 20
    assert decode_breakpoints(model.config) == [18]
    prompt = torch.tensor([[1, 5, 9, 2]])
    every, derived, steps = stepwise_and_derived(hf_generate, model, prompt, 33)
    assert len(steps.counted) == 32 and "context 18" in steps.reason
    assert_same(every.counts["decode"].trace, derived.counts["decode"].trace)


def test_a_first_step_unlike_the_rest_is_counted_and_the_fit_starts_after_it():
    # sliding window 4 under a 6-token prompt: the prefill left the cache cut to the window,
    # the first step reads that, the others what the step before them wrote
    model = make_hf_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0,
                          layer_types=["sliding_attention", "full_attention"])
    every, derived, steps = stepwise_and_derived(hf_generate, model, torch.arange(1, 7)[None], 25)
    assert (steps.start, len(steps.counted), steps.reason) == (1, 4, None)
    assert_same(every.counts["decode"].trace, derived.counts["decode"].trace)


def test_a_step_that_breaks_the_fit_is_counted_with_the_rest():
    class Odd(torch.nn.Module):  # one more op from the third step on: not affine
        config = None

        def forward(self, x, pos):
            return x * 2 + (x.sum() if pos >= 6 else 0)

    def generate(model, prompt, n, *, phase):
        with phase("prefill", num_tokens=4):
            model(prompt.float(), 0)
        for k in range(n - 1):
            with phase("decode", num_tokens=1):
                model(prompt[:, :1].float(), 4 + k)

    with pytest.warns(UserWarning, match="counting every step"):
        every, derived, steps = stepwise_and_derived(generate, Odd(), torch.ones(1, 4), 9)
    assert len(steps.counted) == 8 and "step at context 6 has other records" in steps.reason
    assert_same(every.counts["decode"].trace, derived.counts["decode"].trace)
    assert "counted steps" in derived.counts["decode"].timing


# -- identical layers ------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    tiny_args(n_layer=4, n_local_heads=4),  # Llama (multi-head)
    tiny_args(n_layer=4),  # grouped-query attention
    tiny_args(n_layer=3, sliding_window=4),  # one window for all layers: one kind
    tiny_args(n_layer=3, num_experts=4, num_activated_experts=2),  # MoE, balanced routing
], ids=["llama", "gqa", "window", "moe"])
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_config_only_one_layer_per_kind_equals_every_layer(args):
    every = TransformerPerformanceCounter()
    count_config_only(args, every, batch_size=2, prompt_length=5, max_new_tokens=12,
                      generate=gen.generate, temperature=0.8, top_k=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        derived = TransformerPerformanceCounter()
        model = count_generation(args, derived, batch_size=2, prompt_length=5, max_new_tokens=12,
                                 generate=gen.generate, temperature=0.8, top_k=5)
    assert len(model.layers) == args.n_layer  # the whole model comes back, for its parameters
    for label, tokens in (("prefill", 2 * 5), ("decode", 2 * 11)):
        assert_same(every.counts[label].trace, derived.counts[label].trace)
        assert derived.counts[label].num_tokens == tokens and derived.counts[label].latency is None


def count_hf(config, prompt_length=6, new_tokens=5):
    """{label: Trace} of a transformers model built from config, every step counted."""
    import transformers
    model = getattr(transformers, config.architectures[0])(config).eval()
    counter = TransformerPerformanceCounter()
    hf_generate(model, torch.zeros(1, prompt_length, dtype=torch.long), new_tokens,
                phase=counter.count)
    return {label: s.trace for label, s in counter.counts.items()}


def alternating_qwen2(n_layer: int = 4):
    config = make_hf_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0,
                           layer_types=["sliding_attention", "full_attention"] * (n_layer // 2),
                           num_hidden_layers=n_layer).config
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def test_alternating_sliding_and_full_layers_equal_every_layer():
    config = alternating_qwen2(4)
    assert layer_kinds(config) == ["sliding_attention", "full_attention"] * 2
    derived, every = count_layers(config, count_hf), count_hf(config)
    for label in ("prefill", "decode"):
        assert_same(every[label], derived[label])
    # the two kinds differ: a sliding layer's cache stops at its window, a full one grows
    cats = {r.module.split(".")[3]: r.shapes for r in every["decode"].records
            if r.op == "aten.cat.default" and "[1, 2, 3, 8]" in r.shapes}
    assert set(cats) == {"0", "2"}  # sliding layers 0 and 2 only


def test_layers_that_do_not_repeat_are_refused():
    from perfcounter.models.model import FeedForward

    def count_uneven(args):  # the last of several layers has a narrower feed-forward
        model = Transformer(args)
        if args.n_layer > 1:
            model.layers[-1].feed_forward = FeedForward(tiny_args(intermediate_size=16))
        model.setup_caches(1, 8)
        counter = TransformerPerformanceCounter()
        with counter.count("prefill", num_tokens=4):
            model(torch.zeros(1, 4, dtype=torch.long), torch.arange(4))
        return {"prefill": counter.counts["prefill"].trace}

    with pytest.raises(DeriveError, match="a second 'decoder' layer does not repeat the first"):
        count_layers(tiny_args(n_layer=3), count_uneven)
    qwen_moe = type("Cfg", (), {"num_hidden_layers": 4, "layer_types": ["a"] * 3})()
    with pytest.raises(DeriveError, match="3 layer_types for 4 layers"):
        layer_kinds(qwen_moe)


def test_layers_below_the_counter_depth_fall_back_to_every_layer():
    args = tiny_args(n_layer=3)
    every = TransformerPerformanceCounter(depth=2)  # "Transformer.layers.0" is not listed
    count_config_only(args, every, prompt_length=4, max_new_tokens=6)
    derived = TransformerPerformanceCounter(depth=2)
    with pytest.warns(UserWarning, match="counting every layer"):
        count_generation(args, derived, prompt_length=4, max_new_tokens=6, generate=greedy_generate)
    for label in ("prefill", "decode"):
        assert_same(every.counts[label].trace, derived.counts[label].trace)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_70b_prefill_and_one_decode_equal_every_layer():
    args = ModelArgs.from_name("llama-3-70b")
    every, derived = TransformerPerformanceCounter(), TransformerPerformanceCounter()
    count_config_only(args, every, prompt_length=16, max_new_tokens=2)
    count_generation(args, derived, prompt_length=16, max_new_tokens=2, generate=greedy_generate)
    for label in ("prefill", "decode"):
        assert_same(every.counts[label].trace, derived.counts[label].trace)


# -- generate.py and the config-only counts ----------------------------------------------
@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_config_only_derived_equals_count_every_step(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_args(n_layer=3).__dict__))
    run = dict(config=path, prompt_length=5, max_new_tokens=16, precision="float32", quiet=True,
               device_spec="generic-cpu")
    every = gen.main(count_every_step=True, **run)["counter"].counts
    derived = gen.main(**run)["counter"].counts
    for label in ("prefill", "decode"):
        assert_same(every[label].trace, derived[label].trace)
        assert every[label].num_tokens == derived[label].num_tokens


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_real_run_counts_three_steps_and_times_the_rest():
    torch.manual_seed(0)
    model = randomize_(Transformer(tiny_args(block_size=64)))
    counter = TransformerPerformanceCounter(device_spec="generic-cpu")
    gen.run_checkpoint(model, torch.tensor([[1, 5, 9]]), counter, max_new_tokens=20, num_samples=1,
                       compile=False, device="cpu", progress=False, temperature=0.8, top_k=5)
    decode = counter.counts["decode"]  # 20 new tokens: the prefill's, then 19 steps, 3 counted
    assert decode.num_tokens == 19 and "16 uncounted of 19 steps" in decode.timing
    every = TransformerPerformanceCounter(device_spec="generic-cpu")
    gen.run_checkpoint(model, torch.tensor([[1, 5, 9]]), every, max_new_tokens=20, num_samples=1,
                       compile=False, device="cpu", progress=False, count_every_step=True,
                       temperature=0.8, top_k=5)
    assert_same(every.counts["decode"].trace, decode.trace, valid_kv=False)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_transformers_config_alternating_layers_derived_equals_counted():
    import transformers
    from perfcounter.generation.config_only import count_hf_config
    config = transformers.AutoConfig.for_model(  # Gemma 2: sliding and full layers in turn
        "gemma2", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=64,
        max_position_embeddings=128)
    assert layer_kinds(config) == ["sliding_attention", "full_attention"] * 2
    every, derived = TransformerPerformanceCounter(), TransformerPerformanceCounter()
    run = dict(batch_size=1, prompt_length=6, max_new_tokens=12, dtype=torch.float32)
    count_hf_config(config, every, **run)
    with warnings.catch_warnings(record=True) as caught:  # derived, no fallback: the step at
        warnings.simplefilter("always")  # context 8, where q·kᵀ and p·v have one signature,
        count_hf_config(config, derived, derive=True, **run)  # is checked; transformers' own
    ours = [str(w.message) for w in caught if issubclass(w.category, PerfcounterWarning)]
    assert ours == []  # warnings (deprecations of a release) are theirs, not asserted on
    for label in ("prefill", "decode"):
        assert_same(every.counts[label].trace, derived.counts[label].trace)


def _tiny_hf(model_type: str, **fields):
    import transformers
    return transformers.AutoConfig.for_model(model_type, **{
        "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, **fields})


def test_per_layer_settings_are_layer_kinds():
    # DeepSeek-V3: layers below first_k_dense_replace dense, the others experts
    ds = _tiny_hf("deepseek_v3", num_hidden_layers=4, first_k_dense_replace=1)
    assert layer_kinds(ds) == ["decoder;experts=0"] + ["decoder;experts=1"] * 3
    # a dense layer cannot follow an expert layer there: the extra dense layer goes first
    from perfcounter.generation.derive_layers import arranged, with_layers
    order = arranged(ds, ["decoder;experts=0", "decoder;experts=1", "decoder;experts=0"])
    assert order == ["decoder;experts=0"] * 2 + ["decoder;experts=1"]
    assert with_layers(ds, order).first_k_dense_replace == 2
    with pytest.raises(DeriveError, match="not dense first"):
        with_layers(ds, ["decoder;experts=1", "decoder;experts=0"])
    # Qwen3-MoE: mlp_only_layers [0] and every layer else sparse (decoder_sparse_step 1)
    qw = _tiny_hf("qwen3_moe", num_hidden_layers=3, mlp_only_layers=[0], decoder_sparse_step=1)
    assert layer_kinds(qw) == ["decoder;experts=0", "decoder;experts=1", "decoder;experts=1"]
    one = with_layers(qw, ["decoder;experts=1", "decoder;experts=0"])
    assert (one.mlp_only_layers, one.decoder_sparse_step) == ([1], 1)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
@pytest.mark.parametrize("model_type, fields", [
    ("deepseek_v3", dict(num_hidden_layers=4, first_k_dense_replace=1, intermediate_size=48,
                         num_key_value_heads=4,
                         moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                         n_group=1, topk_group=1, n_shared_experts=1, kv_lora_rank=16,
                         q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)),
    ("qwen3_moe", dict(num_hidden_layers=3, mlp_only_layers=[0], decoder_sparse_step=1,
                       intermediate_size=48, moe_intermediate_size=16, num_experts=4,
                       num_experts_per_tok=2, head_dim=8)),
    ("llama4_text", dict(num_hidden_layers=4, intermediate_size=48, intermediate_size_mlp=64,
                         num_local_experts=4, num_experts_per_tok=1, head_dim=8,
                         moe_layers=[1, 3], no_rope_layers=[1, 1, 1, 0],
                         attention_chunk_size=16)),
])
def test_layers_that_differ_by_their_settings_derived_equal_every_layer(model_type, fields):
    from perfcounter.generation.config_only import count_hf_config
    config = _tiny_hf(model_type, **fields)
    assert len(set(layer_kinds(config))) > 1  # two kinds of layer at least
    every, derived = TransformerPerformanceCounter(), TransformerPerformanceCounter()
    run = dict(batch_size=1, prompt_length=6, max_new_tokens=4, dtype=torch.float32)
    count_hf_config(config, every, **run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count_hf_config(config, derived, derive=True, **run)
    ours = [str(w.message) for w in caught if issubclass(w.category, PerfcounterWarning)]
    assert not any("counting every layer" in m for m in ours), ours
    for label in ("prefill", "decode"):
        assert_same(every.counts[label].trace, derived.counts[label].trace)
