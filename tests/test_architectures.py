"""The causal LMs transformers ships, each from a tiny config (hidden 32, 2 layers, vocab
100): a prefill of 2 x 5 tokens and one decode step with the model's own cache, counted
under no_grad and under inference_mode, and once more with no weights (FakeTensorMode).

Each architecture is built and run once (`measured`, cached for the module); the tests
read what that run recorded:
- nothing is left uncounted, in either grad mode or under fake tensors;
- the counted run's logits are bitwise those of the uncounted run, in each grad mode;
- every nn.Linear (and GPT-2's Conv1D) counts exactly 2·T·in·out FLOPs (+ T·out bias
  adds), T the rows it was called with;
- fake tensors count the FLOPs real tensors count, dense and executed;
- both grad modes count the same ops, op for op.
An architecture the installed transformers does not have is skipped.
"""
import contextlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from perfcounter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.models.tokenizer import cache_keyword  # noqa: E402

TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
COMMON = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **TOKENS)
MOE = dict(num_experts_per_tok=2)
MLA = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
           v_head_dim=8, n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=1,
           n_group=1, topk_group=1, n_shared_experts=1, **MOE)
SSM = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
           conv_kernel=4, **TOKENS)
# name: (config class, model class, config keywords)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", COMMON),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, sliding_window=4)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(COMMON, num_local_experts=4, **MOE)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", COMMON),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(COMMON, num_experts=4, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, **MOE)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(COMMON, head_dim=8)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(COMMON, head_dim=8, num_experts=4, moe_intermediate_size=32, **MOE)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(COMMON, head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(COMMON, head_dim=8, sliding_window=4)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(COMMON, head_dim=8, sliding_window=4)),
    "phi": ("PhiConfig", "PhiForCausalLM", COMMON),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", COMMON),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", dict(COMMON, num_local_experts=4, **MOE)),
    # no pad token, as GPT-2 ships: with one, transformers checks real ids for padding (a few
    # FLOPs that a fake run, which it treats as tracing, skips)
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
                  eos_token_id=2)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", COMMON),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4,
                  **TOKENS)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(vocab_size=100, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                 **TOKENS)),
    "bloom": ("BloomConfig", "BloomForCausalLM",
              dict(vocab_size=100, hidden_size=32, n_layer=2, n_head=4, **TOKENS)),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    **TOKENS)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", COMMON),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(COMMON, num_experts=4, **MOE)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", COMMON),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(COMMON, **MLA)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(COMMON, **MLA)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(COMMON, head_dim=8, num_local_experts=4, sliding_window=4, **MOE)),
    "mamba": ("MambaConfig", "MambaForCausalLM", SSM),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", SSM),
    "jamba": ("JambaConfig", "JambaForCausalLM",
              dict(COMMON, num_experts=4, attn_layer_period=2, attn_layer_offset=1,
                   expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=4,
                   mamba_expand=2, mamba_dt_rank=4, **MOE)),
}
PHASES = ("prefill", "decode")
GRADS = (torch.no_grad, torch.inference_mode)


def build(name: str):
    """The tiny model (float32, seeded), or a skip when transformers lacks the architecture."""
    config_name, model_name, kwargs = ARCHS[name]
    if not hasattr(transformers, config_name) or not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    torch.manual_seed(0)
    return getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs)).eval()


def generate(model, ids, counter=None, on_phase=lambda label: None):
    """Prefill ids [B, S], then decode their last token once with the model's cache:
    (prefill logits, decode logits); each phase inside counter.count when a counter is given."""
    cache_key = cache_keyword(model)

    def phase(label):
        on_phase(label)
        return counter.count(label, num_tokens=ids.numel()) if counter else contextlib.nullcontext()

    with phase("prefill"):
        out = model(ids, use_cache=True)
    with phase("decode"):
        step = model(ids[:, -1:], use_cache=True, **{cache_key: getattr(out, cache_key)})
    return out.logits, step.logits


MATMULS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.")


def _linear_calls(model):
    """Per phase: (module path, in, out, bias, rows, whole) of every nn.Linear / Conv1D call;
    whole: the module runs Linear's (Conv1D's) own forward, so all its ops are the product
    (a subclass with its own forward, such as PhiMoE's router, also routes: its matmuls)."""
    from transformers.pytorch_utils import Conv1D
    root = type(model).__name__
    calls, current, handles = {p: [] for p in PHASES}, ["prefill"], []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            n_in, n_out = mod.in_features, mod.out_features
            whole = type(mod).forward is torch.nn.Linear.forward
        elif isinstance(mod, Conv1D):
            n_in, n_out = mod.weight.shape
            whole = type(mod).forward is Conv1D.forward
        else:
            continue
        path, bias = f"{root}.{name}", mod.bias is not None

        def hook(mod, args, path=path, n_in=n_in, n_out=n_out, bias=bias, whole=whole):
            calls[current[0]].append((path, n_in, n_out, bias, args[0].numel() // n_in, whole))

        handles.append(mod.register_forward_pre_hook(hook))
    return calls, current, handles


def _measure(name: str) -> dict:
    model = build(name)
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    out = {}
    for grad in GRADS:
        with grad():
            reference = generate(model, ids)
            counter = TransformerPerformanceCounter()
            if grad is torch.no_grad:
                calls, current, handles = _linear_calls(model)
                counted = generate(model, ids, counter,
                                   on_phase=lambda label: current.__setitem__(0, label))
                for h in handles:
                    h.remove()
                out["linear_calls"] = calls
            else:
                counted = generate(model, ids, counter)
        out[grad.__name__] = dict(reference=reference, counted=counted, counter=counter)
    fake_mode = FakeTensorMode()
    with fake_mode:
        fake_model = build(name)
        fake_ids = torch.randint(3, 100, ids.shape)
        out["fake"] = TransformerPerformanceCounter()
        with torch.no_grad():
            generate(fake_model, fake_ids, out["fake"])
    return out


@pytest.fixture(scope="module")
def measured():
    """name -> what one run of that architecture recorded (built on first use)."""
    cache = {}

    def get(name):
        if name not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[name] = _measure(name)
        return cache[name]

    return get


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_counted_exactly_and_outputs_bitwise_the_uncounted_runs(arch, measured):
    m = measured(arch)
    for grad in GRADS:
        run = m[grad.__name__]
        for label in PHASES:
            stats = run["counter"].counts[label]
            assert stats.uncounted_ops == {}, (grad.__name__, label)
            assert stats.total_flops > 0
        for ref, got in zip(run["reference"], run["counted"]):
            assert torch.equal(ref, got), grad.__name__
    assert all(m["fake"].counts[label].uncounted_ops == {} for label in PHASES)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_linear_is_two_t_in_out(arch, measured):
    m = measured(arch)
    counts = m["no_grad"]["counter"].counts
    for label in PHASES:
        calls = m["linear_calls"][label]
        assert calls, "no nn.Linear ran"
        whole = {path for path, *_, w in calls if w}
        flops_by_module = {}
        for r in counts[label].trace.records:
            if r.module in whole or r.op.startswith(MATMULS):
                flops_by_module[r.module] = flops_by_module.get(r.module, 0) + r.flops
        expected = {}
        for path, n_in, n_out, bias, rows, _ in calls:
            # a multiply-accumulate per row, input and output (2 FLOPs), + a bias add per output
            flops = 2 * rows * n_in * n_out + (rows * n_out if bias else 0)
            expected[path] = expected.get(path, 0) + flops
        assert {p: flops_by_module.get(p, 0) for p in expected} == expected, label


@pytest.mark.parametrize("arch", ARCHS)
def test_fake_tensors_count_what_real_tensors_count(arch, measured):
    m = measured(arch)
    real, fake = m["no_grad"]["counter"].counts, m["fake"].counts
    for label in PHASES:
        assert (fake[label].total_flops, fake[label].executed_flops) == \
            (real[label].total_flops, real[label].executed_flops), label


def _counted_records(trace) -> list:
    """Records that count something (views are 0 FLOPs, 0 bytes; torch.tensor(...) adds a
    detach_ view under inference_mode), in a comparable form."""
    return sorted((r.op, r.module, r.segment, r.shapes, r.calls, r.flops, r.executed_flops,
                   tuple(r.kinds), tuple(r.read), tuple(r.written))
                  for r in trace.records if r.flops or r.bytes)


def test_both_grad_modes_count_op_for_op(measured):
    """inference_mode hands composites (linear, matmul, dropout, SDPA, one_hot, ...) to the
    mode whole; it runs their own decomposition, so the ops are those no_grad counts."""
    compared = 0
    for arch in ARCHS:
        try:
            m = measured(arch)
        except pytest.skip.Exception:
            continue
        for label in PHASES:
            a = m["no_grad"]["counter"].counts[label].trace
            b = m["inference_mode"]["counter"].counts[label].trace
            assert _counted_records(a) == _counted_records(b), (arch, label)
            assert (a.compulsory_read, a.compulsory_written, a.kv_cache_valid_read,
                    a.fused_read, a.fused_written) == \
                (b.compulsory_read, b.compulsory_written, b.kv_cache_valid_read,
                 b.fused_read, b.fused_written), (arch, label)
        compared += 1
    assert compared >= 20


@pytest.mark.parametrize("arch", ["llama", "mixtral", "mamba"])
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_transformers_generate_counts_every_op(arch):
    """model.generate: the stop check (isin against the end-of-sequence ids) and the
    bookkeeping between steps count too; the tokens are those of the uncounted run."""
    from perfcounter import PerformanceCounterMode
    model = build(arch)
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=3, do_sample=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            reference = model.generate(ids, **kwargs)
            mode = PerformanceCounterMode()
            with mode:
                tokens = model.generate(ids, **kwargs)
    assert torch.equal(tokens, reference)
    assert mode.uncounted_ops == {}
    assert any(r.op.startswith("aten.isin") for r in mode.trace().records)
