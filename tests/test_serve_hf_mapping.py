"""serve under a mapping in transformers' names: q_proj, k_proj and v_proj on different devices
split perfcounter's fused wqkv, priced as simulate prices the split."""
import warnings

import numpy as np
import pytest

from perfcounter.serve import deployment
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import FEATURES, features
from perfcounter.simulation.run import simulate

from test_serve_placement import LIMITS, TINY, TOY_HOST, TOY_PIM, _toy

# TINY: dim 32, 4 heads of 8, 2 KV heads: wqkv is 32 x (32 + 2 x 16 = 64); q 32 x 32, k and v
# 32 x 16 each: shares 1/2, 1/4, 1/4 of its output columns
TOY_B = _toy("toy-b", "pim", eager=1e-6, compiled=2e-6, cudagraphs=7e-6)
DEVICES = {"toy-pim": TOY_PIM, "toy-b": TOY_B}
SPLIT = {"TransformerBlock": "toy-pim", "k_proj": "toy-b"}  # q and v with their block
TOGETHER = {"TransformerBlock": "toy-pim", "q_proj": "toy-pim", "k_proj": "toy-pim",
            "v_proj": "toy-pim"}


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def placed(mapping, execution="bound"):
    return deployment(TINY, mapping=mapping, host=TOY_HOST, devices=DEVICES,
                      execution=execution, **LIMITS)


def wqkv_figures(table, f):
    """{device: (calls, FLOPs, weight bytes) of the fused projection's records there}."""
    out = {}
    for key, _, t in table.parts:
        fig = t.figures(f)
        mine = np.array([".wqkv" in k.module for k in t.counts.keys])
        out[key] = tuple(float(x[mine].sum()) for x in (fig.calls, fig.flops, fig.streamed))
    return out


def test_k_proj_on_another_device_takes_its_share_by_hand():
    # a prefill of 8 tokens; per layer the fused projection computes 2 x 8 x 32 x 64 = 32,768
    # FLOPs and reads 32 x 64 x 2 B = 4,096 B of weights. k (1/4) on toy-b: 8,192 FLOPs and
    # 1,024 B a layer, 2 layers: 16,384 FLOPs, 2,048 B; q and v (3/4) on toy-pim: 49,152 FLOPs,
    # 6,144 B; each part is a kernel of its own: toy-b 1 call a layer, toy-pim 2
    f = features([(8, 0)])
    table = placed(SPLIT).table
    fig = wqkv_figures(table, f)
    assert fig["toy-b"] == (2, 16_384, 2_048)
    assert fig["toy-pim"] == (4, 49_152, 6_144)
    # the fused projection alone where q, k and v stay together: 2 calls, 65,536, 8,192 B
    assert wqkv_figures(placed(TOGETHER).table, f)["toy-pim"] == (2, 65_536, 8_192)
    # memory: toy-b holds k's weights, 32 x 16 x 2 B = 1,024 B a layer, 2 layers; no KV cache
    rows = {d.device: d for d in placed(SPLIT).devices}
    assert (rows["toy-b"].weight_bytes, rows["toy-b"].kv_bytes_per_token) == (2_048, 0)
    assert rows["toy-pim"].weight_bytes + 2_048 == \
        {d.device: d for d in placed(TOGETHER).devices}["toy-pim"].weight_bytes


@pytest.mark.parametrize("pieces", ([(1, 7)], [(8, 0)], [(40, 7)]))
def test_the_split_is_simulates_prediction_of_the_counted_step(pieces):
    # as test_serve_placement holds an unsplit placement: one piece a step, the table's eager
    # shares are what simulate predicts for the counted step's trace under the same mapping,
    # device by device, k's input moved to toy-b and its output back included
    trace = count_step(TINY, [Piece(*p) for p in pieces])
    sim = simulate(trace, SPLIT, host=TOY_HOST, devices=DEVICES, execution="eager")
    phase = next(iter(sim.phases.values()))
    table, f = placed(SPLIT, "eager").table, features(pieces)
    assert table.seconds(f) == pytest.approx(phase.predicted_s, rel=1e-9)
    shares = table.device_seconds(f)
    assert set(shares) == {"host", "toy-pim", "toy-b"}
    for key, share in shares.items():
        assert share == pytest.approx(phase.devices[key].predicted_busy_s, rel=1e-9)


def test_the_split_moves_the_projections_input_and_output():
    # as simulate moves them: a module entered on another device receives its input, so
    # toy-b receives k_proj's input [T, 32] x 2 B = 64 B a token and toy-pim, entering v_proj
    # next, v_proj's 64 B; each through the host (no device link: two legs at 1 GB/s):
    # 2 x 64 B x 2 legs = 256 ns a token a layer, 2 layers: 512 ns a token
    split, together = placed(SPLIT).table, placed(TOGETHER).table
    expected = np.zeros(len(FEATURES))  # over steps.FEATURES: per token (index 1) alone
    expected[1] = 512e-9
    np.testing.assert_allclose(split.transfer_s - together.transfer_s, expected, atol=1e-15)


@pytest.mark.parametrize("execution", ("bound", "eager", "compiled", "cudagraphs"))
def test_q_k_v_together_cost_what_the_fused_projection_does(execution):
    # named in transformers' names but on one device: the projection is the one kernel
    # counted there, every figure identical to the mapping that does not name them
    plain = placed({"TransformerBlock": "toy-pim"}, execution)
    named = placed(TOGETHER, execution)
    for pieces in ([(1, 7)], [(8, 0)], [(1, 100), (1, 50), (16, 3)]):
        f = features(pieces)
        assert named.table.seconds(f) == plain.table.seconds(f)
        assert named.table.energy_j(f, 1.0) == plain.table.energy_j(f, 1.0)
        assert named.table.device_seconds(f) == plain.table.device_seconds(f)
    assert named.devices == plain.devices and named.plan == plain.plan
