"""serve under a placement mapping: device shares, boundary transfers, memory per device."""
import dataclasses
import re
import warnings

import numpy as np
import pytest
import torch

from perfcounter.devices import get_device_spec
from perfcounter.devices.spec import DeviceSpec
from perfcounter.models.args import ModelArgs
from perfcounter.serve import ServeError, deployment, serve, synthetic
from perfcounter.serve.placement import model_modules, whole_trace
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import FEATURES, features
from perfcounter.simulation.run import simulate

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
REGIMES = ("eager", "compiled", "cudagraphs")


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():  # float32 logits priced at the part's bfloat16 figures
        warnings.simplefilter("ignore")
        yield


def placed(mapping, execution="bound"):
    return deployment(TINY, mapping=mapping, devices=DEVICES, host="generic-cpu",
                      execution=execution, **LIMITS)


@pytest.mark.parametrize("execution", ("bound", *REGIMES))
def test_the_whole_model_on_one_device_is_the_single_device_table(execution):
    # the root on pim-a: every op there, the step's input in and its logits back over the
    # host link, as the single-device pricing charges them, in each regime
    one = deployment(TINY, PIM, execution=execution, **LIMITS)
    dep = placed({"Transformer": "pim-a"}, execution)
    assert dep.execution == execution and dep.name == "placement {Transformer: pim-a}"
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
    # (over steps.FEATURES: the transformers models' features past BASE are 0 here)
    expected_s = np.zeros(len(FEATURES))
    expected_s[1:3] = 5e-9, 2.5e-9
    np.testing.assert_allclose(dep.table.transfer_s, expected_s, atol=1e-18)
    # joules: 64 B x 8 x 80 pJ = 40.96 nJ a token; 128 B x 8 x 20 pJ = 20.48 nJ a sequence
    expected_j = np.zeros(len(FEATURES))
    expected_j[1:3] = 40.96e-9, 20.48e-9
    np.testing.assert_allclose(dep.table.transfer_j, expected_j, atol=1e-18)
    host, pim = dep.devices
    # host: the embedding 64 x 32 x 2 B = 4,096 B, no KV cache
    assert (host.device, host.weight_bytes, host.kv_bytes_per_token) == ("host", 4096, 0)
    # pim-a: 2 layers x (wqkv 32 x 64 + wo 32 x 32 + 3 x 32 x 64 + 2 x 32 = 9,280) + norm 32
    # + output 64 x 32 = 20,640 params x 2 B = 41,280 B; KV 2 layers x 2 x 2 heads x 8 x 2 B
    # = 128 B a token; workspace 512 x (32 + max(2 x 32 + 2 x 16, 3 x 64)) x 2 B + 64 x 64 x
    # 4 B = 245,760 B; (8e9 x 0.9 - 41,280 - 245,760) / (16 x 128) = 3,515,484.8 blocks
    assert (pim.weight_bytes, pim.kv_bytes_per_token) == (41_280, 128)
    assert pim.kv_blocks == 3_515_484 == dep.plan.kv_blocks == dep.engine.kv_blocks
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
    ({"qproj": "pim-a"}, {}, "mapping key 'qproj' (pim-a) matches no module"),
    # transformers' names: q and k on different devices split wqkv (test_serve_hf_mapping.py);
    # a key the split model lacks is still refused
    ({"q_proj": "pim-a", "k_proj": "host", "o_projj": "pim-a"}, {},
     "mapping key 'o_projj' (pim-a) matches no module"),
    ({"attention": "pim-a,x"}, {}, "unknown option 'x'"),
    ({"attention": "pim-a"}, {"execution": "warp"}, "execution 'warp'"),
    ({"attention": "pim-a"}, {"peak_fraction": 0.5}, "peak_fraction scales the roofline bound"),
    ({"attention": "pim-ai-4chip"}, {}, "'pim-ai-4chip' has no memory size"),
])
def test_bad_mappings_in_one_line(mapping, options, expected):
    with pytest.raises(ServeError) as e:
        deployment(TINY, mapping=mapping, devices=DEVICES, host="generic-cpu", **options)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_placement_is_repriced_in_another_regime_from_the_same_counts():
    dep = placed({"TransformerBlock": "pim-a"})  # the bound
    work = synthetic(20, 16, 4, qps=5, seed=0)
    again = serve(dep, work, execution="cudagraphs")
    want = serve(placed({"TransformerBlock": "pim-a"}, "cudagraphs"), work)
    assert again.to_dict()["step_costs"] == "predicted, cudagraphs, under a placement"
    assert again.metrics["mean_ttft_ms"] == want.metrics["mean_ttft_ms"]
    assert again.metrics["mean_ttft_ms"] > serve(dep, work).metrics["mean_ttft_ms"]


# two toy parts of round figures: 1 GB/s, 1 TFLOP/s, every kernel class at 100 % of them
_CLASSES = ("gemv", "gemm", "attention", "elementwise", "reduction", "indexing", "strided")


def _toy(name, device_type, **overhead_s):
    return DeviceSpec(device_type=device_type, name=name, dtype=torch.bfloat16, bandwidth=1e9,
                      flops_by_dtype={torch.bfloat16: 1e12, torch.float32: 1e12}, vram=8e9,
                      host_to_device_bw=1e9, device_to_host_bw=1e9,
                      op_efficiency={c: 1.0 for c in _CLASSES}, op_overhead_s=overhead_s)


TOY_HOST = _toy("toy-host", "cpu", eager=1e-6, compiled=2e-6, cudagraphs=5e-6)
TOY_PIM = _toy("toy-pim", "pim", eager=1e-6, compiled=2e-6, cudagraphs=7e-6)


def toy_placed(execution):
    return deployment(TINY, mapping={"TransformerBlock": "toy-pim"}, host=TOY_HOST,
                      devices={"toy-pim": TOY_PIM}, execution=execution, **LIMITS)


def test_each_device_share_is_priced_in_the_regime_by_hand():
    # one decode at context 7; the host runs the embedding and the root's ops before the
    # layers (embedding 136 B, index 72 B, to_copy 48 B: 256 B), toy-pim the rest; every op
    # streams (tiny FLOPs at 1 TFLOP/s): its bytes at 1 GB/s, i.e. 1 ns a byte
    pieces = [(1, 7)]
    f = features(pieces)
    records = [r for r in count_step(TINY, [Piece(*p) for p in pieces]).records
               if not r.op.startswith("prim.")]
    assert sum(r.bytes for r in records) == 52_240
    assert sum(r.calls for r in records) == 210  # op calls, views included
    bound, eager = toy_placed("bound"), toy_placed("eager")
    # transfers, the same in every regime: [1, 32] x 2 B in (64 ns), [1, 64] x 2 B of
    # logits back (128 ns)
    assert bound.table.transfer_s @ f == pytest.approx(192e-9, rel=1e-9)
    np.testing.assert_allclose(eager.table.transfer_s, bound.table.transfer_s, rtol=1e-12)
    # the bound: the fewest bytes any regime moves, the compiled regimes' 44,256 B of matmuls
    # and attention + the 2,872 B of fused IO (both derived below; eager's per-op bytes are
    # 52,240), at 1 ns a byte, + 192 ns = 47.32 us (FLOPs: far below)
    assert bound.table.seconds(f) == pytest.approx(47.32e-6, rel=1e-9)
    # eager: at 100 % of peak each op's work is its roofline; 210 op calls x 1 us more:
    # 262.432 us, the host's share 256 ns + 3 calls x 1 us = 3.256 us
    assert eager.table.seconds(f) == pytest.approx(262.432e-6, rel=1e-9)
    assert eager.table.device_seconds(f)["host"] == pytest.approx(3.256e-6, rel=1e-9)
    # compiled: matmuls and attention stay kernels: 2 layers x (wqkv, w1, w3, w2 4,288 B;
    # wo 2,176 B; attention 656 B) + output 4,288 B = 44,256 B in 13 kernels, all on
    # toy-pim. The rest is fused: the step's fused IO (counted and fitted, steps.py:
    # 2,872 B: norm weights, embedding row and RoPE rows 384 + 72 B read, the activations
    # that cross a kernel boundary 1,312 B read and 976 B written, the KV-cache writes
    # 128 B), 2.872 us, shared by the fused records' bytes (the host's 256 B of
    # 52,240 - 44,256 = 7,984 B)
    fused_io = float(eager.table.counts.fused @ f)
    assert fused_io == pytest.approx(2_872, rel=1e-9)
    assert count_step(TINY, [Piece(*p) for p in pieces]).fused_bytes == 2_872
    fused = fused_io * 1e-9
    compiled, graphs = toy_placed("compiled"), toy_placed("cudagraphs")
    # launches at 2 us: toy-pim 13 kernels + (13 + 1) fused, the host 1 fused: 56 us
    assert compiled.table.seconds(f) == pytest.approx(
        44.256e-6 + fused + 56e-6 + 192e-9, rel=1e-9)  # 103.32 us
    assert compiled.table.device_seconds(f)["host"] == pytest.approx(
        2e-6 + fused * 256 / 7_984, rel=1e-9)
    # CUDA graphs: no launch per kernel, one graph a device: 5 us + 7 us
    assert graphs.table.seconds(f) == pytest.approx(
        44.256e-6 + fused + 12e-6 + 192e-9, rel=1e-9)  # 59.32 us
    for dep in (bound, eager, compiled, graphs):  # the step = Σ device shares + transfers
        assert dep.table.seconds(f) == pytest.approx(
            sum(dep.table.device_seconds(f).values()) + dep.table.transfer_s @ f, rel=1e-12)


@pytest.mark.parametrize("pieces", ([(1, 7)], [(8, 0)], [(40, 7)]))
def test_eager_shares_are_simulates_prediction_of_the_counted_step(pieces):
    # one piece a step (no varlen merge): the table's eager shares are what
    # perfcounter.simulate predicts for the counted step's trace, device by device
    trace = count_step(TINY, [Piece(*p) for p in pieces])
    sim = simulate(trace, {"TransformerBlock": "toy-pim"}, host=TOY_HOST,
                   devices={"toy-pim": TOY_PIM}, execution="eager")
    phase = next(iter(sim.phases.values()))
    table, f = toy_placed("eager").table, features(pieces)
    assert table.seconds(f) == pytest.approx(phase.predicted_s, rel=1e-9)
    for key, share in table.device_seconds(f).items():
        assert share == pytest.approx(phase.devices[key].predicted_busy_s, rel=1e-9)


def test_tensor_parallel_divides_a_predicted_share():
    # toy-pim,tp=2: its share (overheads included) halves, as simulate's prediction does;
    # joules stay those of the same bytes
    f = features([(1, 7)])
    one = toy_placed("eager")
    two = deployment(TINY, mapping={"TransformerBlock": "toy-pim,tp=2"}, host=TOY_HOST,
                     devices={"toy-pim": TOY_PIM}, execution="eager", **LIMITS)
    a, b = one.table.device_seconds(f), two.table.device_seconds(f)
    assert b["host"] == pytest.approx(a["host"], rel=1e-12)
    pim = next(k for k in b if k != "host")
    assert b[pim] == pytest.approx(a["toy-pim"] / 2, rel=1e-12)


def test_the_placement_says_where_each_record_ran():
    # the replay reports each record's device (PhaseResult.record_devices): the layers'
    # records on toy-pim, the embedding and the root's ops before the layers on the host
    # (3 records: embedding, index, to_copy), the output's norm and head after them on
    # toy-pim (an unmapped module runs where the previous one ran); metadata: none
    trace = count_step(TINY, [Piece(1, 7)])
    sim = simulate(trace, {"TransformerBlock": "toy-pim"}, host=TOY_HOST,
                   devices={"toy-pim": TOY_PIM})
    ran = next(iter(sim.phases.values())).record_devices
    assert len(ran) == len(trace.records)
    moving = [(r, d) for r, d in zip(trace.records, ran) if r.bytes]
    assert all(d == "toy-pim" for r, d in moving if ".layers." in r.module)
    assert sum(d == "host" for _, d in moving) == 3
    assert all(d is None for r, d in zip(trace.records, ran) if r.op.startswith("prim."))
    # and the serving table prices each (module, segment) where the replay ran it
    table = toy_placed("bound").table
    assert {d for d in table.where.values()} == {"host", "toy-pim"}
