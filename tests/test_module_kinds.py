"""counting/module_kinds.py: the one module-kind classifier (names and classes of llama,
gpt-fast, gpt2, mixtral-like and NeoX-like models), llm-profiler's scopes on top of it,
and every part that groups by kind using it (plots, the roofline's norms, the simulator's
blocks and search groups)."""
import pytest

from perfcounter.counting.module_kinds import (MODULE_KINDS, kinds_along, module_kind, own_kind,
                                               record_scopes)
from perfcounter.report.plots import KINDS
from perfcounter.simulation.search import kind_keys
from perfcounter.simulation.timeline import blocks
from perfcounter.trace import ModuleInfo


@pytest.mark.parametrize("path, kind", [
    # HF llama
    ("LlamaForCausalLM.model.layers.0.self_attn.q_proj", "attention"),
    ("LlamaForCausalLM.model.layers.0.mlp.down_proj", "mlp"),
    ("LlamaForCausalLM.model.layers.0.input_layernorm", "norm"),
    ("LlamaForCausalLM.model.norm", "norm"),
    ("LlamaForCausalLM.model.embed_tokens", "embedding"),
    ("LlamaForCausalLM.lm_head", "lm_head"),
    ("LlamaForCausalLM.model.rotary_emb", "other"),
    ("LlamaForCausalLM.model.layers.0", "other"),
    # gpt-fast
    ("Transformer.layers.1.attention.wqkv", "attention"),
    ("Transformer.layers.1.feed_forward.w2", "mlp"),
    ("Transformer.layers.1.attention_norm", "norm"),
    ("Transformer.tok_embeddings", "embedding"),
    ("Transformer.output", "lm_head"),
    # gpt2 (ln_1 is a norm only by its class: see the class test)
    ("GPT2LMHeadModel.transformer.h.0.attn.c_attn", "attention"),
    ("GPT2LMHeadModel.transformer.h.0.mlp.c_fc", "mlp"),
    ("GPT2LMHeadModel.transformer.wte", "embedding"),
    ("GPT2LMHeadModel.lm_head", "lm_head"),
    # mixtral: the router and the experts are the MLP's
    ("MixtralForCausalLM.model.layers.0.block_sparse_moe.gate", "mlp"),
    ("MixtralForCausalLM.model.layers.0.block_sparse_moe.experts.3.w1", "mlp"),
    # an "output" deeper than the root's child is no head (Bert's attention.output)
    ("Bert.layers.0.attention.output", "attention"),
    ("", "other"),
])
def test_module_kind_by_name(path, kind):
    assert module_kind(path) == kind


def test_module_kind_by_class():
    classes = {"M.blocks.0.mix": "GPTNeoXAttention", "M.blocks.0.ff": "SwiGLUFeedForward",
               "M.blocks.0.ln": "FancyLayerNorm", "M.blocks.0.moe": "MixtralSparseMoeBlock",
               "GPT2LMHeadModel.transformer.h.0.ln_1": "LayerNorm"}
    assert [module_kind(p, classes) for p in classes] == ["attention", "mlp", "norm", "mlp", "norm"]
    assert module_kind("M.blocks.0.mix.dense", classes) == "attention"  # inside the attention
    assert module_kind("M.blocks.0.mix.dense") == "other"  # the same path, classes unknown


def test_own_kind_is_the_module_itself_and_module_kind_its_code():
    # q_proj is a bare Linear (own kind other) whose code counts under the attention
    assert own_kind("M.layers.0.self_attn.q_proj", "Linear") == "other"
    assert kinds_along("M.layers.0.self_attn.q_proj") == ["other", "other", "other", "attention",
                                                          "other"]
    # a norm inside the attention (qwen3's q_norm) is a norm
    assert module_kind("M.layers.0.self_attn.q_norm") == "norm"
    assert own_kind("M.lm_head") == "lm_head" and own_kind("M.x.lm_head") == "other"


def test_one_vocabulary():
    assert MODULE_KINDS == ("embedding", "attention", "mlp", "norm", "lm_head", "other")
    assert KINDS[:len(MODULE_KINDS)] == MODULE_KINDS  # the plots' bars add transfers, static


def test_scopes_are_llm_profilers_names_for_the_kinds():
    assert record_scopes("M.model.layers.0.self_attn.q_norm") == ["transformer", "attn"]
    assert record_scopes("M.layers.0.block_sparse_moe.experts.0.w1") == ["transformer", "mlp"]
    assert record_scopes("LlamaForCausalLM.lm_head") == ["lm_head"]
    assert record_scopes("LlamaForCausalLM.model.norm") == ["transformer"]
    assert record_scopes("") == []


def _infos(rows):
    return {p: ModuleInfo(path=p, cls=c) for p, c in rows}


def test_blocks_and_search_groups_use_the_one_classifier():
    infos = _infos([("T", "Transformer"), ("T.tok_embeddings", "Embedding"),
                    ("T.layers.0", "TransformerBlock"), ("T.layers.0.attention", "Attention"),
                    ("T.layers.0.attention.wqkv", "Linear"), ("T.layers.0.attention.wo", "Linear"),
                    ("T.layers.0.attention_norm", "RMSNorm"),
                    ("T.layers.0.feed_forward", "MoEFeedForward"),
                    ("T.layers.0.feed_forward.experts", "ConditionalFeedForward"),
                    ("T.norm", "RMSNorm"), ("T.output", "Linear")])
    # the outermost attention and MLP: the experts go with their MoE
    assert blocks(infos) == {"T.layers.0.attention", "T.layers.0.feed_forward"}
    assert kind_keys(list(infos.values())) == {
        "attention_proj": ["wqkv", "wo"], "attention": ["Attention"], "mlp": ["MoEFeedForward"],
        "norm": ["RMSNorm"], "lm_head": ["output"]}
