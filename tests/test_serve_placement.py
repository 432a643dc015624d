"""serve under a placement mapping: device shares, boundary transfers, memory per device."""
import dataclasses
import re
import warnings

import numpy as np
import pytest

from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.serve import ServeError, deployment, serve, synthetic
from perfcounter.serve.placement import model_modules, whole_trace
from perfcounter.serve.steps import features

TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
LIMITS = {"max_num_seqs": 64, "max_num_batched_tokens": 512}
# a PIM part with a memory size and a device link, no per-element costs (so that its
# roofline is the single-device table's): pim-ai-4chip's figures otherwise
PIM = dataclasses.replace(get_device_spec("pim-ai-4chip"), name="pim-a", vram=8e9,
                          softmax_ns_per_element=None, silu_ns_per_element=None,
                          rmsnorm_ns_per_element=None, device_link_bw=1e9,
                          device_link_pj_per_bit=2.0)
DEVICES = {"pim-a": PIM, "pim-b": dataclasses.replace(PIM, name="pim-b")}
STEPS = ([(8, 0)], [(1, 100), (1, 50), (16, 3)], [(40, 7)])


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():  # float32 logits priced at the part's bfloat16 figures
        warnings.simplefilter("ignore")
        yield


def placed(mapping):
    return deployment(TINY, mapping=mapping, devices=DEVICES, host="generic-cpu", **LIMITS)


def test_the_whole_model_on_one_device_is_the_single_device_table():
    # the root on pim-a: every op there, the step's input in and its logits back over the
    # host link, as the single-device roofline charges them
    one = deployment(TINY, PIM, execution="bound", **LIMITS)
    dep = placed({"Transformer": "pim-a"})
    assert dep.execution == "bound" and dep.name == "placement {Transformer: pim-a}"
    for pieces in STEPS:
        f = features(pieces)
        assert dep.table.seconds(f) == pytest.approx(one.table.seconds(f), rel=1e-9)
        assert dep.table.energy_j(f, 0.0) == pytest.approx(one.table.energy_j(f, 0.0), rel=1e-9)


def test_a_boundary_costs_its_activations_over_the_device_link():
    # layer 1 on pim-b: its input [T, 32] bf16 goes pim-a -> pim-b and its output comes
    # back for the final norm (on pim-a with its parent): 2 x T x 32 x 2 B over the device
    # link (min of both ends: 1 GB/s, 2 pJ/bit); the identical parts compute the same
    a, b = placed({"Transformer": "pim-a"}), placed({"Transformer": "pim-a", "layers.1": "pim-b"})
    for pieces in STEPS:
        f = features(pieces)
        tokens = sum(n for n, _ in pieces)
        moved = 2 * tokens * 32 * 2  # 8 tokens: 1,024 B -> 1.024 us, 16.384 nJ
        assert b.table.seconds(f) - a.table.seconds(f) == pytest.approx(moved / 1e9, rel=1e-9)
        assert b.table.energy_j(f, 0) - a.table.energy_j(f, 0) == \
            pytest.approx(moved * 8 * 2e-12, rel=1e-9)
        shares = b.table.device_seconds(f)
        assert set(shares) == {"pim-a", "pim-b"}
        # the step = Σ device shares + transfers
        assert b.table.seconds(f) == pytest.approx(sum(shares.values()) + b.table.transfer_s @ f)


def test_host_and_pim_transfers_and_memory_by_hand():
    # TransformerBlock on pim-a: the embedding runs on the host (execution starts there);
    # norm and output run where the last layer ran (pim-a)
    dep = placed({"TransformerBlock": "pim-a"})
    # host -> pim-a: [T, 32] x 2 B at 12.8 GB/s = 5e-9 s a token; pim-a -> host: the logits
    # [S, 64] x 2 B at 51.2 GB/s = 2.5e-9 s a sequence
    np.testing.assert_allclose(dep.table.transfer_s, [0, 5e-9, 2.5e-9, 0, 0, 0], atol=1e-18)
    # joules: 64 B x 8 x 80 pJ = 40.96 nJ a token; 128 B x 8 x 20 pJ = 20.48 nJ a sequence
    np.testing.assert_allclose(dep.table.transfer_j, [0, 40.96e-9, 20.48e-9, 0, 0, 0],
                               atol=1e-18)
    host, pim = dep.devices
    # host: the embedding 64 x 32 x 2 B = 4,096 B, no KV cache
    assert (host.device, host.weight_bytes, host.kv_bytes_per_token) == ("host", 4096, 0)
    # pim-a: 2 layers x (wqkv 32 x 64 + wo 32 x 32 + 3 x 32 x 64 + 2 x 32 = 9,280) + norm 32
    # + output 64 x 32 = 20,640 params x 2 B = 41,280 B; KV 2 layers x 2 x 2 heads x 8 x 2 B
    # = 128 B a token; workspace 512 x (4 x 32 + 32 + 2 x 16 + 2 x 64) x 2 B + 64 x 64 x 4 B
    # = 344,064 B; (8e9 x 0.9 - 41,280 - 344,064) / (16 x 128) = 3,515,436.8 blocks
    assert (pim.weight_bytes, pim.kv_bytes_per_token) == (41_280, 128)
    assert pim.kv_blocks == 3_515_436 == dep.plan.kv_blocks == dep.engine.kv_blocks
    result = serve(dep, synthetic(40, 32, 8, qps=5, seed=0)).metrics
    assert result["completed"] == 40 and result["j_per_output_token"] > 0


def test_a_placement_costs_the_sum_of_its_devices_prices():
    # pim-a at $1 an hour, the host at $0.5: $1.5 an hour; one device without a price: none
    priced = {"pim-a": dataclasses.replace(PIM, usd_per_hour=1.0,
                                           source={**PIM.source, "usd_per_hour": "test"})}
    host = dataclasses.replace(get_device_spec("generic-cpu"), usd_per_hour=0.5)
    dep = deployment(TINY, mapping={"TransformerBlock": "pim-a"}, devices=priced, host=host,
                     **LIMITS)
    assert dep.usd_per_hour == 1.5 and dep.usd_source.startswith("host: ")
    assert placed({"TransformerBlock": "pim-a"}).usd_per_hour is None


def test_whole_trace_repeats_the_layer():
    dep = placed({"Transformer": "pim-a"})
    one = dep.table.counts.fit_traces[1]
    whole, segments = whole_trace(one, 3)
    layer = [r for r in one.records if re.search(r"\.layers\.0(\.|$)", r.module)]
    assert len(whole.records) == len(one.records) + 2 * len(layer)
    root = next(m for m in whole.modules if m.path == "Transformer")
    # tok_embeddings, 3 layers, norm, output: the root's segment after child 2 (the layer)
    # is now after child 4 (its last copy)
    assert root.children[1:4] == [f"Transformer.layers.{i}" for i in range(3)]
    assert segments["Transformer"] == {1: 1, 2: 4, 3: 5, 4: 6}
    assert [m.path for m in model_modules(TINY)].count("Transformer.layers.1.attention") == 1


@pytest.mark.parametrize("mapping, options, expected", [
    ({"attention": "pim-z"}, {}, "unknown device 'pim-z'"),
    ({"q_proj": "pim-a"}, {}, "mapping key 'q_proj' (pim-a) matches no module"),  # HF names
    ({"attention": "pim-a,x"}, {}, "unknown option 'x'"),
    ({"attention": "pim-a"}, {"execution": "compiled"}, "give --bound"),
    ({"attention": "pim-ai-4chip"}, {}, "'pim-ai-4chip' has no memory size"),
])
def test_bad_mappings_in_one_line(mapping, options, expected):
    with pytest.raises(ServeError) as e:
        deployment(TINY, mapping=mapping, devices=DEVICES, host="generic-cpu", **options)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_placement_is_not_repriced_in_another_regime():
    dep = placed({"Transformer": "pim-a"})
    with pytest.raises(ServeError, match="roofline bound only"):
        serve(dep, synthetic(4, 8, 2, qps=1), execution="eager")
