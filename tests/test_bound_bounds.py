"""The bound bounds (pricing/price.py): for every step in every regime, bound <= prediction, on
random mixed steps (prefill chunks and decodes), weights and activations of five precisions
(bfloat16, float16, fp8, int8 and int4 weights) and devices of three kinds (a GPU, a CPU and a
PIM part of device_specs/upmem.yaml)."""
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcounter import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.figures import figures_of
from perfcounter.pricing.predict import predict
from perfcounter.pricing.price import REGIMES, price
from perfcounter.quant.quantize import parse_scheme
from perfcounter.serve import step_table
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.ragged import Piece, count_step

TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
PRECISIONS = {"bfloat16": (torch.bfloat16, None), "float16": (torch.float16, None),
              "fp8": (torch.bfloat16, "fp8"), "int8": (torch.bfloat16, "int8"),
              "int4": (torch.bfloat16, "int4-32")}
DEVICES = ("h100-sxm", "xeon-8480", "pim-ai-1chip")
PREDICTED = REGIMES[1:]  # eager, compiled, cudagraphs
# a CPU's or a PIM part's missing float16 / float8 figures are warned of once and stood in for
pytestmark = pytest.mark.filterwarnings("ignore:device '.*' has no")

decode = st.tuples(st.just(1), st.integers(0, 3000))
chunk = st.tuples(st.integers(2, 512), st.integers(0, 2000))
steps = st.lists(st.one_of(decode, chunk), min_size=1, max_size=6)


def test_the_regimes_are_named_once():
    assert REGIMES == ("bound", "eager", "compiled", "cudagraphs")
    with pytest.raises(ValueError, match="unknown execution None; valid: bound, eager"):
        price(figures_of(count_step(TINY, [Piece(1, 3)]))[0],
              get_device_spec("h100-sxm"), None)


@functools.cache
def tables(precision: str, device: str) -> dict:
    dtype, scheme = PRECISIONS[precision]
    spec = get_device_spec(device, dtype=dtype)
    out = {"bound": step_table(TINY, dtype, RooflinePricer(spec), weights=parse_scheme(scheme))}
    for regime in PREDICTED:
        out[regime] = step_table(TINY, dtype, PredictionPricer(spec, regime),
                                 weights=parse_scheme(scheme))
    return out


def test_the_devices_are_a_gpu_a_cpu_and_a_pim_part():
    kinds = [get_device_spec(d).device_type for d in DEVICES]
    assert kinds == ["cuda", "cpu", "pim"]


@settings(max_examples=40)
@given(pieces=steps)
def test_a_step_tables_bound_is_below_every_regime(pieces):
    for precision in PRECISIONS:
        for device in DEVICES:
            t = tables(precision, device)
            f = t["bound"].counts.features(pieces)
            bound = t["bound"].seconds(f)
            assert bound > 0
            for regime in PREDICTED:
                table = t[regime]
                assert bound <= table.seconds(f), (precision, device, regime, pieces)
                # and on the regime's own figures (a compiled step's varlen attention)
                fig = table.figures(f)
                assert price(fig, table.spec, "bound").latency_s <= \
                    price(fig, table.spec, regime).latency_s, (precision, device, regime)


@settings(max_examples=12)
@given(pieces=st.lists(st.one_of(decode, st.tuples(st.integers(2, 96), st.integers(0, 300))),
                       min_size=1, max_size=3),
       precision=st.sampled_from(sorted(PRECISIONS)), device=st.sampled_from(DEVICES))
def test_a_counted_steps_bound_is_below_every_regime(pieces, precision, device):
    # predict() of the counted trace, each piece's records their own groups
    dtype, scheme = PRECISIONS[precision]
    spec = get_device_spec(device, dtype=dtype)
    trace = count_step(TINY, [Piece(*p) for p in pieces], dtype, weights=parse_scheme(scheme))
    bound = predict(trace, spec, "bound").latency_s
    for regime in PREDICTED:
        assert bound <= predict(trace, spec, regime).latency_s, (regime, pieces)


def test_the_bound_of_a_step_by_hand():
    # one decode at context 3 on an H100 in bfloat16: the FLOPs are far below the bytes, so
    # the bound is the fewest bytes any regime moves at 3.35 TB/s + the host link: the
    # matmuls' and attention's bytes + the fused IO (compiled, CUDA graphs) are fewer than
    # the compulsory bytes (each storage once) and than eager's per-op bytes
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    trace = count_step(TINY, [Piece(1, 3)])
    fig, _ = figures_of(trace)
    extern = [k in ("matmul", "attention") for k in fig.kind]
    least = fig.bytes[extern].sum() + trace.fused_bytes
    assert least < trace.compulsory_bytes < fig.bytes.sum()
    b = predict(trace, spec, "bound")
    assert b.by_class["memory"] == pytest.approx(least / 3.35e12, rel=1e-12)
    assert b.by_class["compute"] < b.by_class["memory"]
    # the host link: [1, 32] x 2 B of ids and positions in, [1, 64] x 2 B of logits out
    assert b.latency_s == pytest.approx(least / 3.35e12 + b.host_link_s, rel=1e-12)
    assert b.overhead_s == 0.0


@pytest.mark.slow
def test_an_fp8_prefill_bound_is_below_its_cuda_graph():
    # Llama-2-7B, fp8 weights and KV cache, one 2,048-token prefill on an H100: the bound
    # charged every eager op's bytes (quantize, cast, KV writes: 28.65 ms), above the CUDA
    # graph's 28.13 ms; the fewest bytes any regime moves are far fewer. Its FLOPs:
    # 2 x ~6.5e9 weights x 2,048 tokens ~ 2.8e13 at fp8's 1,979 TFLOP/s ~ 14 ms
    from perfcounter.models.args import ModelArgs as Args
    args = Args.from_name("llama-2-7b")
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    fp8 = parse_scheme("fp8")
    bound = step_table(args, torch.bfloat16, RooflinePricer(spec), weights=fp8, kv="fp8")
    graphs = step_table(args, torch.bfloat16, PredictionPricer(spec, "cudagraphs"),
                        weights=fp8, kv="fp8")
    assert graphs.price([(2048, 0)]) == pytest.approx(28.13e-3, rel=1e-3)
    assert 13e-3 < bound.price([(2048, 0)]) < 16e-3 < graphs.price([(2048, 0)])
