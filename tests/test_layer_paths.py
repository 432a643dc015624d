"""Which module paths lie in a decoder layer (models/layer_paths.py): the one answer derive,
the step table, the placed steps and the stored weights ask."""
import pytest

from perfcounter.models.layer_paths import (Layer, at_layer, every_layer, in_layer, is_layer,
                                            layer_of)


@pytest.mark.parametrize("path, index", [
    ("Transformer.layers.3.attention.wqkv", 3),
    ("Transformer.layers.12", 12),
    ("layers.0.attention.wqkv.weight", 0),  # a parameter's name: no root
    ("GPT2LMHeadModel.transformer.h.5.attn", 5),
    ("M.blocks.1.mlp", 1),
    ("Transformer.layers.*.attention", -1),  # every layer, not one
    ("Transformer.tok_embeddings", -1),
    ("Transformer.output", -1),
    ("tok_embeddings.weight", -1),
    ("Transformer", -1),
    ("", -1),
    ("M.sublayers.3.mlp", -1),  # a whole segment's name only
    ("M.layers.3x.mlp", -1),
    ("M.layers.norm", -1),
])
def test_layer_of(path, index):
    assert layer_of(path) == index
    assert in_layer(path) == (index >= 0 or ".*" in path)


def test_a_layer_of_one_list():
    # a vision tower's blocks are not the language model's layers
    assert layer_of("M.vision.blocks.0.mlp", "M.model.layers") == -1
    assert layer_of("M.model.layers.7.mlp", "M.model.layers") == 7
    assert layer_of("M.model.layers", "M.model.layers") == -1  # the list itself
    assert at_layer("M.model.layers.0.mlp", 4, "M.model.layers") == "M.model.layers.4.mlp"
    assert at_layer("M.model.layers.0", 4, "M.model.layers") == "M.model.layers.4"
    assert at_layer("M.vision.blocks.0.mlp", 4, "M.model.layers") == "M.vision.blocks.0.mlp"


def test_is_layer_names_the_layer_itself_and_its_list():
    assert is_layer("LlamaForCausalLM.model.layers.3") == Layer("LlamaForCausalLM.model.layers", 3)
    assert is_layer("GPT2LMHeadModel.transformer.h.11") == Layer("GPT2LMHeadModel.transformer.h",
                                                                 11)
    assert is_layer("A.layers.0.blocks.2") == Layer("A.layers.0.blocks", 2)  # the innermost
    for path in ("LlamaForCausalLM.model.layers.3.mlp", "LlamaForCausalLM.model.layers",
                 "T.layers.*", "T.norm"):
        assert is_layer(path) is None


def test_every_layer_and_back():
    path = "Transformer.layers.3.feed_forward.w1"
    assert every_layer(path) == "Transformer.layers.*.feed_forward.w1"
    assert at_layer(every_layer(path), 5) == "Transformer.layers.5.feed_forward.w1"
    assert at_layer("Transformer.layers.0.attention", 9) == "Transformer.layers.9.attention"
    assert every_layer("Transformer.output") == at_layer("Transformer.output", 2) \
        == "Transformer.output"
