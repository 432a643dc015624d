"""Models quantized with torchao's quantize_: one matmul per linear call, weights as stored.

The tiny Llama of conftest (2 layers, dim 32, 4 heads of 8, 2 KV heads, FFN 48, vocab 64,
untied output) holds 17,408 linear weights per copy:
  per layer: wqkv (32 + 2·8 + 2·8 = 64 rows) 64·32 = 2048, wo 32·32 = 1024,
             w1, w3 48·32 = 1536 each, w2 32·48 = 1536  -> 7680; x 2 layers = 15,360
  output: 64·32 = 2048                                  -> 17,408 weights in 512 rows
  (rows: per layer 64 + 32 + 48 + 48 + 32 = 224, x 2 = 448, + 64 = 512)
Its float weights outside the linears, read in a prefill of 6 tokens: the norms,
(2·2 + 1)·32 = 160 floats = 640 B, and 6 embedding rows of 32 floats = 768 B.
torchao is a test extra (setup.cfg); without it these tests skip.
"""
import copy

import pytest
import torch

from conftest import make_hf_model, randomize_, tiny_args
from perfcounter import PerformanceCounterMode, get_device_spec
from perfcounter.models.model import Transformer
from perfcounter.pricing.roofline import peak_flops
from perfcounter.counting.subclass_linear import executed_dtype
from perfcounter.quant.stored import is_packed, packed_parts, stored_nbytes

q = pytest.importorskip("torchao.quantization")

PROMPT = 6
FLOAT_OTHER = 640 + 768  # norms + the embedding rows a 6-token prefill reads (module doc)


def _configs():
    """(id, config factory, hand-derived stored bytes of the 17,408 weights / 512 rows,
    executed dtype of the matmul)."""
    return [
        # int8 data 17,408 B + per row a float32 scale and an int8 zero point: 512 · 5 = 2560
        ("int8-weight-only", lambda: q.Int8WeightOnlyConfig(), 17408 + 512 * 5, "float32"),
        # the same layout; activations quantized per token at run time: an int8 x int8 matmul
        ("w8a8", lambda: q.Int8DynamicActivationInt8WeightConfig(), 17408 + 512 * 5, "int8"),
        # float8 e4m3 data 17,408 B + a float32 scale per row: 512 · 4 = 2048
        ("float8-weight-only", lambda: q.Float8WeightOnlyConfig(), 17408 + 512 * 4, "float32"),
        # int4 weight-only on the CPU (torchao 0.18's CPU int4 layout): values unpacked to one
        # int8 each, 17,408 B, + per group of 16 a float32 scale and an int8 zero point:
        # 17,408 / 16 = 1088 groups · 5 = 5440
        ("int4-weight-only", lambda: q.IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                                            granularity=q.PerGroup(16)),
         17408 + 1088 * 5, "float32"),
    ]


def _count(model, idx, pos, mode=torch.no_grad):
    counter = PerformanceCounterMode(io_model="compulsory")
    with mode(), counter:
        out = model(idx, pos)
    return counter.trace(), out


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    model = randomize_(Transformer(tiny_args()))
    model.setup_caches(1, 64)
    return model


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 64, (1, PROMPT), generator=torch.Generator().manual_seed(1)), \
        torch.arange(PROMPT)


@pytest.mark.parametrize("name, make, stored, dtype", _configs(), ids=[c[0] for c in _configs()])
def test_quantized_prefill_weights_as_stored_flops_as_float(base, prompt, name, make, stored, dtype):
    idx, pos = prompt
    float_trace, _ = _count(base, idx, pos)
    assert float_trace.compulsory_read[0] == 17408 * 4 + FLOAT_OTHER  # 71,040 B in float32
    model = copy.deepcopy(base)
    q.quantize_(model, make())
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(is_packed(m.weight) for m in linears)
    assert sum(stored_nbytes(m.weight) for m in linears) == stored
    trace, _ = _count(model, idx, pos)
    assert trace.compulsory_read[0] == stored + FLOAT_OTHER  # to the byte
    assert trace.per_op_read[0] == stored + FLOAT_OTHER  # each linear runs once in a prefill
    assert trace.flops == float_trace.flops
    # one op per linear call, at the matmul's executed dtype; no dequantize decomposition
    by_module = {}
    for r in trace.records:
        by_module.setdefault(r.module, []).append(r)
    for m in ("Transformer.layers.0.attention.wqkv", "Transformer.output"):
        counted = [r for r in by_module[m] if r.calls and r.dtype]
        assert [(r.op, r.calls, r.dtype) for r in counted] == [("aten.linear.default", 1, dtype)]
    assert not [r for r in trace.records if r.op.startswith(("aten.mm", "aten.addmm", "aten._int_mm"))]


def test_counted_outputs_are_the_uncounted_ones(base, prompt):
    idx, pos = prompt
    model = copy.deepcopy(base)
    q.quantize_(model, q.Int8DynamicActivationInt8WeightConfig())
    with torch.no_grad():
        expected = model(idx, pos)
    for mode in (torch.no_grad, torch.inference_mode):
        _, out = _count(model, idx, pos, mode)
        assert torch.equal(out, expected)


def test_transformers_llama_quantized():
    hf = make_hf_model("llama")
    float_counter = PerformanceCounterMode(io_model="compulsory")
    idx = torch.randint(0, 64, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), float_counter:
        hf(idx)
    q.quantize_(hf, q.Int8WeightOnlyConfig())
    counter = PerformanceCounterMode(io_model="compulsory")
    with torch.no_grad(), counter:
        hf(idx)
    trace, float_trace = counter.trace(), float_counter.trace()
    linears = [m for m in hf.modules() if isinstance(m, torch.nn.Linear)]
    stored = sum(stored_nbytes(m.weight) for m in linears)
    float_linear = sum(m.weight.numel() * 4 for m in linears)
    assert trace.flops == float_trace.flops
    assert trace.compulsory_read[0] == float_trace.compulsory_read[0] - float_linear + stored
    assert sum(r.calls for r in trace.records if r.op == "aten.linear.default") == len(linears)


def test_w8a8_priced_at_the_int8_peak():
    h100 = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    assert peak_flops(h100, "int8") == h100.peak_flops("int8") > h100.peak_flops("bfloat16")
    cpu = get_device_spec("generic-cpu")  # no int8 figure: the compute dtype's peak
    assert peak_flops(cpu, "int8") == cpu.flops_per_s


def test_a_layer_that_raises_leaves_the_counter_whole(base, prompt):
    model = copy.deepcopy(base)
    q.quantize_(model, q.Int8WeightOnlyConfig())
    counter = PerformanceCounterMode()
    stack = torch._C._len_torch_dispatch_stack()
    with pytest.raises(RuntimeError):
        with torch.no_grad(), counter:
            model.output(torch.zeros(2, 7))  # in_features is 32
    assert torch._C._len_torch_dispatch_stack() == stack
    idx, pos = prompt
    trace, _ = _count(model, idx, pos)  # and it counts again
    assert trace.flops > 0


def test_detection_is_generic():
    from torch._subclasses.fake_tensor import FakeTensorMode
    w = torch.nn.Linear(32, 8).weight
    assert not is_packed(w) and not is_packed(torch.zeros(2))
    with FakeTensorMode():
        assert not is_packed(torch.zeros(2))
    lin = torch.nn.Sequential(torch.nn.Linear(32, 8))
    q.quantize_(lin, q.Int8WeightOnlyConfig())
    parts = packed_parts(lin[0].weight)
    assert [p.dtype for p in parts] == [torch.int8, torch.float32, torch.int8]  # data, scale, zp
    assert stored_nbytes(lin[0].weight) == 8 * 32 + 8 * 4 + 8  # 296
    assert executed_dtype(lin[0].weight, torch.bfloat16) == "bfloat16"


class _Packed(torch.Tensor):
    """A minimal weight subclass (no torchao): data + scale, maybe an activation marker."""

    @staticmethod
    def __new__(cls, qdata, scale, act=None):
        t = torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=torch.bfloat16)
        t.qdata, t.scale, t.act_quant_kwargs = qdata, scale, act
        return t

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{func} on a test weight")


def test_executed_dtype_from_the_data_and_the_activation_marker():
    i8, f8 = torch.zeros(8, 32, dtype=torch.int8), torch.zeros(8, 32, dtype=torch.float8_e4m3fn)
    scale = torch.ones(8, 1)
    assert executed_dtype(_Packed(i8, scale), torch.bfloat16) == "bfloat16"  # weight-only
    assert executed_dtype(_Packed(i8, scale, act=True), torch.bfloat16) == "int8"  # W8A8
    assert executed_dtype(_Packed(f8, scale, act=True), torch.bfloat16) == "float8_e4m3fn"
    assert stored_nbytes(_Packed(f8, scale)) == 8 * 32 + 8 * 4  # 288
    assert executed_dtype(torch.zeros(2), torch.float16) == "float16"
