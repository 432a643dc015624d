"""Fused IO (counting/storage.py): the bytes a compiled program moves outside its matmul and
attention kernels, counted by hand on toy programs; the compiled prediction prices it."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.devices import DeviceSpec
from perfcounter.pricing import predict as P
from perfcounter.trace import Trace

W, KV, ACT, INP, BUF = range(5)


def count(fn, grad=torch.no_grad):
    mode = PerformanceCounterMode()
    with grad(), mode:
        fn()
    return mode.trace()


def swiglu_block():
    """x [4, 8] -> w2(silu(x @ w1) * (x @ w3)) + x, float32, weights as parameters."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    w1, w3 = torch.nn.Parameter(torch.randn(8, 16)), torch.nn.Parameter(torch.randn(8, 16))
    w2 = torch.nn.Parameter(torch.randn(16, 8))

    def run():
        h1 = x @ w1  # mm: extern, stage 1
        s = F.silu(h1)  # fused, stage 1: reads h1 (an extern output: 4*16*4 = 256 B)
        h3 = x @ w3  # mm: extern, stage 1 (it does not depend on s)
        m = s * h3  # fused, stage 1: s made in this kernel (free), h3 read (256 B)
        y = m @ w2  # mm: extern, stage 2: m leaves its kernel (256 B written)
        return y + x  # fused, stage 2: y (4*8*4 = 128 B) and x (128 B, input) read;
        # its output is never read again in the block: not charged

    return run


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_swiglu_block_moves_what_crosses_a_kernel_boundary(grad):
    t = count(swiglu_block(), grad)
    # read: h1 256 + h3 256 + y 128 = 640 B of activations, x 128 B of input; weights are the
    # matmuls' (extern) reads
    assert t.fused_read == [0, 0, 640, 128, 0]
    # written: m 256 B (w2's matmul reads it); silu's output stays in registers
    assert t.fused_written == [0, 0, 256, 0, 0]
    assert t.fused_bytes == 1024
    # the compulsory model charges every intermediate once (h1, s, h3, m, y written and read
    # 256 + 256 + 256 + 256 + 128 B each way, the output 128 B) and every weight once
    assert t.compulsory_bytes - 3 * 512 - 128 == 2 * (4 * 256 + 128) + 128


def test_elementwise_chain_charges_its_input_and_its_output_only():
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))

    def run():
        c = torch.exp(x * 2 + 1)  # three fused ops in one kernel (stage 0)
        return c @ w  # extern: c leaves the kernel

    t = count(run)
    # x read once (4*8*4 = 128 B, input); c written once (128 B); x * 2 and + 1 stay in
    # registers
    assert t.fused_read == [0, 0, 0, 128, 0]
    assert t.fused_written == [0, 0, 128, 0, 0]


def test_a_value_read_in_a_later_kernel_is_written_and_read_again():
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))

    def run():
        h = x + 1  # stage 0: reads x (128 B); h is the residual stream
        y = h @ w  # extern, stage 1: h leaves its kernel (128 B written)
        return y + h  # stage 1: y read (128 B), h read again (128 B: an earlier kernel's)

    t = count(run)
    assert t.fused_read == [0, 0, 256, 128, 0]
    assert t.fused_written == [0, 0, 128, 0, 0]


def test_kv_cache_write_is_charged():
    cache = torch.zeros(1, 2, 16, 8)
    new = torch.randn(1, 2, 1, 8)
    pos = torch.tensor([3])
    q = torch.randn(1, 2, 1, 8)

    def run():
        cache.index_copy_(2, pos, new)  # fused: reads new (64 B) and pos (8 B), writes one
        # position of the cache, which outlives the block: 1*2*1*8*4 = 64 B of KV cache
        F.scaled_dot_product_attention(q, cache, cache)  # extern: its reads are its own

    t = count(run)
    assert t.fused_read == [0, 0, 0, 64 + 8, 0]
    assert t.fused_written == [0, 64, 0, 0, 0]


def test_fused_io_survives_json_and_merge_and_old_files_load():
    t = count(swiglu_block())
    back = Trace.from_dict(t.to_dict())
    assert back.fused_read == t.fused_read and back.fused_written == t.fused_written
    two = t.merge(t)
    assert two.fused_read == [2 * b for b in t.fused_read]
    assert two.fused_written == [2 * b for b in t.fused_written]
    old = t.to_dict()
    del old["fused_read"], old["fused_written"]
    assert Trace.from_dict(old).fused_bytes == 0


def _spec() -> DeviceSpec:
    # 1 GB/s and 1 GFLOP/s peaks, elementwise at half of them; no cache: every byte cold
    return DeviceSpec(device_type="cpu", name="toy", bandwidth=1e9, dtype=torch.float32,
                      flops_by_dtype={torch.float32: 1e9},
                      op_overhead_s={"eager": 1e-6, "compiled": 0.5e-6, "cudagraphs": 10e-6},
                      op_efficiency={"gemv": 0.5, "gemm": 0.5, "elementwise": 0.5})


def test_compiled_prediction_prices_the_fused_io():
    t = count(swiglu_block())
    for execution in ("compiled", "cudagraphs"):
        p = P.predict(t, _spec(), execution)
        # fused work: 1,024 B at 0.5 GB/s = 2.048 us (its FLOPs, silu's and a multiply and an
        # add per element, take less: 4*16*(silu) + 4*16 + 4*8 at 0.5 GFLOP/s < 1 us)
        fused_s = p.by_class["fused"] - (3 + 1) * 0.5e-6 * (execution == "compiled")
        assert fused_s == pytest.approx(1024 / 0.5e9)
    # the same trace without fused IO (an old file): compulsory less the weights the matmuls
    # stream (3 x 512 B) is priced instead
    old = dataclasses.replace(t, fused_read=[0] * 5, fused_written=[0] * 5)
    p = P.predict(old, _spec(), "cudagraphs")
    assert p.by_class["fused"] == pytest.approx((t.compulsory_bytes - 3 * 512) / 0.5e9)
