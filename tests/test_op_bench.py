"""op_bench.py: op signatures rebuilt and timed on this machine, cached by signature
(shape, dtype, strides, typed scalars); bad devices; FakeTensorMode."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from perfcounter.pricing import op_bench as B
from perfcounter.cli.main import main
from perfcounter.trace import OpRecord, Trace, args_from_text
from perfcounter.trace_args import contiguous


@pytest.fixture(autouse=True)
def fresh_cache():
    B.cache_clear()
    yield
    B.cache_clear()


def timed(op, shapes, dtype="float32", nbytes=384):
    return B.time_op(op, args_from_text(shapes, dtype), dtype, nbytes, min_time=0.001,
                     cold_bytes=1 << 16)


def test_times_are_cached_by_signature():
    seconds, proxy = timed("aten.add.Tensor", "[4, 8], [4, 8]")
    assert seconds > 0 and not proxy
    assert B.cache_info() == B.CacheInfo(hits=0, misses=1, currsize=1)
    assert timed("aten.add.Tensor", "[4, 8], [4, 8]") == (seconds, proxy)
    assert B.cache_info() == B.CacheInfo(hits=1, misses=1, currsize=1)
    timed("aten.add.Tensor", "[8, 4], [8, 4]")  # another shape (and strides)
    timed("aten.add.Tensor", "[4, 8], [4, 8]", dtype="bfloat16")  # another dtype
    timed("aten.add.Scalar", "[4, 8], 1")
    timed("aten.add.Scalar", "[4, 8], 1.0")  # 1 and 1.0 hash alike: the key types them
    assert B.cache_info() == B.CacheInfo(hits=1, misses=5, currsize=5)
    B.cache_clear()
    assert B.cache_info() == B.CacheInfo(hits=0, misses=0, currsize=0)


def test_a_signature_carries_strides_dtypes_and_typed_scalars():
    sig, build = B._spec("aten.add.Scalar", (contiguous((4, 8)), 1), "float32", "cpu")
    assert sig.args == (("t", (4, 8), (8, 1), "float32"), ("int", 1)) and build is not None
    assert B._spec("aten.add.Scalar", (contiguous((4, 8)), 1.0), "float32", "cpu")[0] != sig
    out = build()()  # the op itself, on inputs of the recorded shape and dtype
    assert out.shape == (4, 8) and out.dtype == torch.float32 and bool((out >= 1).all())


def test_an_op_that_cannot_be_rebuilt_is_timed_as_a_copy():
    seconds, proxy = timed("aten.scalar_tensor.default",
                           "0.0, dtype=torch.float32, device=device(type='cpu')")
    assert proxy and seconds > 0
    assert timed("aten.no_such_op.default", "[4]")[1]


def toy_trace():
    # 3 matmul calls of one signature, 2 adds, 4 views; a metadata op that costs nothing
    records = [OpRecord("aten.mm.default", "m", "float32", args_from_text("[1, 64], [64, 32]", "float32"),
                        3, 3 * 4096,
                        3 * 4096, read=[3 * 8192, 0, 3 * 256, 0, 0], written=[0, 0, 3 * 128, 0, 0]),
               OpRecord("aten.add.Tensor", "m", "float32", args_from_text("[1, 32], [1, 32]", "float32"),
                        2, 64, 64,
                        read=[0, 0, 512, 0, 0], written=[0, 0, 256, 0, 0]),
               OpRecord("aten.view.default", "m", "", (), 4),
               OpRecord("prim.device.default", "m", "", (), 50)]
    return Trace(records=records)


def test_a_trace_is_the_sum_of_calls_times_seconds_per_signature():
    result = B.op_bench(toy_trace(), min_time=0.001, cold_bytes=1 << 16)
    mm, _ = timed("aten.mm.default", "[1, 64], [64, 32]", nbytes=8192 + 256 + 128)
    add, _ = timed("aten.add.Tensor", "[1, 32], [1, 32]")
    view, _ = B.time_op("aten.view.default", B.VIEW_ARGS, "float32", 0, min_time=0.001,
                        cold_bytes=1)
    # every lookup above was a hit: the op bench timed each signature once
    assert B.cache_info().misses == 3 and B.cache_info().currsize == 3
    assert result.latency_s == pytest.approx(3 * mm + 2 * add + 4 * view)
    assert result.signatures == 2 and result.proxies == 0
    assert set(result.by_class) == {"gemv", "elementwise"}


def test_op_bench_under_fake_tensors_makes_real_inputs():
    with FakeTensorMode():
        result = B.op_bench(toy_trace(), min_time=0.001, cold_bytes=1 << 16)
    assert result.latency_s > 0 and result.device == "cpu"


@pytest.mark.parametrize("device, expect", [
    ("cuda:3", "cannot benchmark ops on device 'cuda:3': no CUDA GPU is available here "
               "(valid: cpu)"),
    ("tpu", "cannot benchmark ops on device 'tpu'; valid: cpu"),
    ("gpu0", "cannot benchmark ops on device 'gpu0'; valid: cpu"),
])
def test_a_device_that_does_not_exist_is_one_line(monkeypatch, device, expect):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with FakeTensorMode(), pytest.raises(ValueError) as err:
        B.op_bench(toy_trace(), device=device)
    assert str(err.value) == expect
    assert B.cache_info().currsize == 0  # refused before anything was timed


def test_the_command_refuses_a_missing_gpu_before_counting(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv=["op-bench", "--model", "smollm2-135m", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == ("perfcounter op-bench: error: cannot benchmark ops on "
                                       "device 'cuda': no CUDA GPU is available here "
                                       "(valid: cpu)\n")


def test_bad_clock_is_refused():
    with pytest.raises(ValueError, match="unknown clock 'wallclock'; valid: auto, wall, cpu, thread"):
        B.op_bench(toy_trace(), clock="wallclock")
