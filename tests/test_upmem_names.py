"""A UPMEM user's files as they are: a mapping in transformers' Llama names on perfcounter's
model (simulation/hf_names.py), UPMEM's device names, and PIM parts' memory."""
import pytest
import torch

from perfcounter import TransformerPerformanceCounter, simulate
from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.models.model import Transformer
from perfcounter.simulation.hf_names import split_trace, translate
from perfcounter.simulation.placement import Mapping, MappingError, default_host, resolve_device

ARGS = ModelArgs(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_local_heads=2, dim=64,
                 intermediate_size=128)
LLAMA = {"q_proj": "PIM_AI_4chip", "k_proj": "PIM_AI_4chip", "v_proj": "PIM_AI_4chip",
         "o_proj": "PIM_AI_4chip", "gate_proj": "PIM_AI_1dimm", "up_proj": "PIM_AI_1dimm",
         "down_proj": "PIM_AI_1dimm", "lm_head": "H100", "LlamaRMSNorm": "host"}


class Ref:
    def __init__(self, path, cls):
        self.path, self.cls = path, cls


def our_modules():
    model = Transformer(ARGS)
    return [Ref(f"Transformer.{n}" if n else "Transformer", type(m).__name__)
            for n, m in model.named_modules()]


@pytest.mark.parametrize("key, ours", [
    ("q_proj", "wqkv"), ("lm_head", "output"), ("LlamaRMSNorm", "RMSNorm"),
    ("Qwen2MLP", "FeedForward"), ("model.layers.*.self_attn.o_proj", "layers.*.attention.wo"),
    ("model.layers.1?.mlp", "layers.1?.feed_forward"), ("model.embed_tokens", "tok_embeddings"),
    ("layers.0.post_attention_layernorm", "layers.0.ffn_norm"), ("wo", "wo")])
def test_transformers_names_read_as_ours(key, ours):
    assert translate(key) == ours
    assert translate("model.layers.0.self_attn.q_proj", split=True) == \
        "layers.0.attention.wqkv.q_proj"


def test_a_llama_mapping_places_every_module_of_our_model():
    modules = our_modules()
    placed, used = Mapping.load(LLAMA).place(modules)
    where = {p.rsplit("Transformer.", 1)[-1]: pl.assignment.device
             for p, pl in placed.items() if pl.assignment is not None}
    assert where["layers.0.attention.wqkv"] == "PIM_AI_4chip"
    assert where["layers.1.feed_forward.w2"] == "PIM_AI_1dimm"
    assert where["output"] == "H100" and where["layers.0.ffn_norm"] == "host"
    assert where["norm"] == "host" and used == set(LLAMA)  # every key matched a module


def test_q_k_v_on_different_devices_are_refused_where_the_projection_stays_whole():
    with pytest.raises(MappingError, match=r"keys 'q_proj', 'k_proj' put parts of perfcounter's "
                                           r"fused q/k/v projection on different devices"):
        Mapping.load({"q_proj": "PIM_AI_4chip", "k_proj": "host"}).place(our_modules())


def counted():
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    model.setup_caches(max_batch_size=1, max_seq_length=16)
    counter = TransformerPerformanceCounter(device_spec="generic-cpu")
    with torch.no_grad(), counter.count("prefill", 4):
        model(torch.randint(0, 256, (1, 4)), torch.arange(4))
    return counter


def test_the_fused_projection_splits_by_heads():
    """4 query heads, 2 key / value heads of 16: q 64 of the 128 outputs, k and v 32 each.
    The fused mm over 4 tokens: 2 * 4 * 64 * 128 = 65,536 FLOPs -> 32,768 + 16,384 + 16,384;
    its weight 128 * 64 * 4 B = 32,768 B -> 16,384 + 8,192 + 8,192."""
    trace = counted().counts["prefill"].trace
    split = split_trace(trace)
    flops = {r.module.rsplit(".", 1)[-1]: r.flops for r in split.records
             if "wqkv." in r.module and r.flops}
    assert flops == {"q_proj": 32_768, "k_proj": 16_384, "v_proj": 16_384}
    weight = {r.module.rsplit(".", 1)[-1]: r.read[0] for r in split.records
              if "wqkv." in r.module and r.read[0]}
    assert weight == {"q_proj": 16_384, "k_proj": 8_192, "v_proj": 8_192}
    assert sum(r.flops for r in split.records) == sum(r.flops for r in trace.records)
    fused = next(m for m in split.modules if m.path.endswith("layers.0.attention.wqkv"))
    assert [c.rsplit(".", 1)[-1] for c in fused.children] == ["q_proj", "k_proj", "v_proj"]


def test_simulate_puts_q_k_and_v_where_the_mapping_says():
    sim = simulate(counted(), {"q_proj": "PIM_AI_4chip", "k_proj": "PIM_AI_1dimm",
                               "v_proj": "PIM_AI_1dimm"}, default_device="host")
    devices = sim.phases["prefill"].devices
    # q: 32,768 FLOPs a layer, 2 layers; k and v: 2 * 16,384 a layer
    assert devices["pim-ai-4chip"].flops == 2 * 32_768
    assert devices["pim-ai-1dimm"].flops == 2 * 2 * 16_384
    assert devices["pim-ai-1dimm"].host_to_device_bytes > 0  # k and v receive the input


@pytest.mark.parametrize("name, entry", [("Snapdragon8gen3", "snapdragon-8-gen3"),
                                         ("A17Pro", "a17-pro"),
                                         ("Dimensity9300", "dimensity-9300")])
def test_upmems_device_names_as_its_yaml_writes_them_resolve(name, entry):
    assert get_device_spec(name).name == entry  # the datasheet entry, as H100 is
    # in a mapping, UPMEM's own profile of it
    assert resolve_device(name, default_host()).name == f"upmem-{entry.replace('-', '')}"


def test_phone_profiles_carry_their_datasheets_memory_and_pim_parts_are_told_how(tmp_path):
    assert get_device_spec("upmem-a17pro").vram == 8e9  # iPhone 15 Pro: 8 GB
    assert get_device_spec("upmem-snapdragon8gen3").vram == 24e9  # up to 24 GB
    assert get_device_spec("pim-ai-4chip").vram is None  # none published
    from perfcounter.serve.placement import _no_memory
    line = _no_memory(get_device_spec("pim-ai-4chip"))
    assert "\n" not in line and "has no memory size (vram_GB; none is published for it)" in line
    example = line.split("`")[1].replace("<GB>", "32").replace("<where the size comes from>",
                                                               "an assumption")
    (tmp_path / "my.yaml").write_text(example)  # what the refusal shows loads as it says
    mine = get_device_spec(f"{tmp_path / 'my.yaml'}:pim-ai-4chip-mine")
    assert mine.vram == 32e9 and mine.bandwidth == 409.6e9
