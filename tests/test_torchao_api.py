"""torchao's prototype profiler API, as its documentation and docstrings describe it, on
perfcounter: code written for `torchao.prototype.profiler` must run with only the import
changed. torchao itself is not installed; every expectation below is derived by hand.

Reference blocks:
- a matmul a[M, K] @ b[K, N] in float32, M = 8, K = 16, N = 12:
  FLOPs = 2 * M * K * N = 2 * 8 * 16 * 12 = 3072
  bytes = (M*K + K*N + M*N) * 4 = (128 + 192 + 96) * 4 = 1664
- a 1-layer Llama (transformers, SDPA), hidden 64, 4 heads, batch 1, 16 tokens, float32:
  q_proj FLOPs = 2 * B * S * H * H = 2 * 16 * 64 * 64 = 131,072
  q_proj bytes = (B*S*H in + H*H weight + B*S*H out) * 4 = (1024 + 4096 + 1024) * 4 = 24,576
  attention matmuls = 2 * 2 * B * S * S * H = 4 * 16 * 16 * 64 = 65,536 (torch's formula)
"""
import json
import math

import pytest
import torch
from torch.utils.flop_counter import sdpa_flop_count

from perfcounter import (CUDADeviceSpec, CUDAPerformanceTimer, DeviceSpec, PerformanceCounterMode,
                         PerformanceStats, PerformanceTimer, TransformerPerformanceCounter,
                         total_model_params)
from perfcounter.costs.attention import SDPA_SOFTMAX, attention_cost, attention_matmul_flops
from perfcounter.stats_dict import TORCHAO_FIELDS, TORCHAO_PROPERTIES

M, K, N = 8, 16, 12
MM_FLOPS = 2 * M * K * N  # 3072
MM_BYTES = (M * K + K * N + M * N) * 4  # 1664


def torchao_fields(device: bool) -> dict:
    """torchao's PerformanceStats fields, as its users pass them (keywords, flat dicts)."""
    return dict(label="with_device" if device else "no_device", num_tokens=128, latency=0.1,
                total_flops=123e9, total_io=123e6, flops_summary={"a": 234e12, "b": 345e9},
                io_summary={"a": 1, "b": 2}, flop_counts={"a": 234e12, "b": 345e9},
                io_counts={"a": 1, "b": 2}, device_bandwidth=1e9 if device else None,
                device_flops_per_s=23e9 if device else None)


def toy_spec():
    return DeviceSpec(device_type="cpu", name="toy", bandwidth=1e9, flops_per_s=23e9,
                      dtype=torch.float32)


# -- PerformanceStats from torchao's fields --------------------------------------------------

@pytest.mark.parametrize("device", [True, False], ids=["with_device", "no_device"])
def test_performance_stats_from_torchao_fields(device):
    stats = PerformanceStats(**torchao_fields(device))
    assert stats.total_flops == 123e9 and stats.total_io == 123e6
    assert stats.flop_counts == {"a": 234e12, "b": 345e9} and stats.io_summary == {"a": 1, "b": 2}
    assert stats.token_throughput == 128 / 0.1
    assert stats.achieved_bandwidth == 123e6 / 0.1  # 1.23 GB/s
    assert stats.achieved_flops_per_s == 123e9 / 0.1  # 1.23 TFLOP/s
    if device:
        assert stats.theoretical_io_latency == 123e6 / 1e9  # 0.123 s
        assert stats.theoretical_compute_latency == 123e9 / 23e9  # 5.348 s
        assert stats.bandwidth_utilization == stats.achieved_bandwidth / 1e9  # 1.23
        assert stats.flops_utilization == stats.achieved_flops_per_s / 23e9  # 53.48
    else:  # torchao: None without a device
        for name in ("theoretical_io_latency", "theoretical_compute_latency",
                     "bandwidth_utilization", "flops_utilization", "device_bandwidth"):
            assert getattr(stats, name) is None, name
    text = str(stats)
    # IO and FLOPs at the nearest power of 10**3, two decimals (torchao's format)
    for expected in ("Total: 0.12 GB", "Total: 0.12 TFLOPs", "Throughput: 1.23 GB/s",
                     "Throughput: 1.23 TFLOPs/s"):
        assert expected in text, expected
    if device:  # the utilization fraction torchao printed (4 decimals) is there, by the percent
        assert "1.2300" in text and "123.00 %" in text  # 1.23e9 / 1e9
        assert "53.4783" in text  # 1.23e12 / 23e9
        assert "0.12 s" in text and "5.35 s" in text  # the two theoretical latencies
    # figures that need per-op records are absent, not zero
    assert stats.trace is None and stats.executed_flops is None and stats.roofline is None
    assert stats.flops_by_kind is None and stats.modules() == {} and stats.scopes() == {}


def test_performance_stats_dict_access_and_to_dict():
    stats = PerformanceStats(**torchao_fields(True))
    assert stats["total_flops"] == 123e9 and "latency" in stats and "nope" not in stats
    assert list(stats) == list(TORCHAO_FIELDS)
    d = stats.to_dict()
    assert set(TORCHAO_FIELDS) | set(TORCHAO_PROPERTIES) <= set(d)  # every torchao key
    assert d["theoretical_compute_latency"] == 123e9 / 23e9
    back = PerformanceStats.from_dict(json.loads(json.dumps(d)))
    assert back == stats and str(back) == str(stats)


def test_performance_stats_refuses_mixed_or_incomplete_figures():
    with pytest.raises(TypeError, match="needs total_io="):
        PerformanceStats("p", 1, 0.1, total_flops=1.0)
    with pytest.raises(TypeError, match="not both"):
        PerformanceStats("p", 1, 0.1, total_flops=1.0, total_io=1.0, device_spec=toy_spec(),
                         device_bandwidth=1e9)
    with pytest.raises(TypeError, match="keywords"):
        PerformanceStats("p", 1, 0.1, 123e9)  # torchao's fields positionally
    with pytest.raises(ValueError, match="total_io must be a finite number >= 0, got nan"):
        PerformanceStats("p", 1, 0.1, total_flops=1.0, total_io=math.nan)


# -- timers ------------------------------------------------------------------------------------

def test_performance_timer_counts_and_times_a_block(capsys):
    a, b = torch.randn(M, K), torch.randn(K, N)
    with PerformanceTimer("mm", precision=2, display=True, depth=10) as timer:
        torch.matmul(a, b)
    assert timer.total_flops == MM_FLOPS and timer.total_io == MM_BYTES
    assert timer.flop_counts["Global"] == {torch.ops.aten.mm: MM_FLOPS}
    assert timer.io_counts["Global"] == {torch.ops.aten.mm: MM_BYTES}
    assert timer.get_summary_flop_counts() == {"Global": MM_FLOPS}
    assert timer.get_summary_io_counts() == {"Global": MM_BYTES}
    assert timer.latency is not None and 0 <= timer.latency <= timer.raw_latency < 5
    assert timer.timing == "time.perf_counter"
    out = capsys.readouterr().out
    assert "MM:  latency = " in out and "FLOPS = 0.0 GFLOPs" in out  # 3072 / 1e9


def test_performance_timer_defaults_and_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    timer = PerformanceTimer("fake")
    assert (timer.precision, timer.display, timer.depth) == (1, False, 10)
    with FakeTensorMode():
        a, b = torch.randn(M, K), torch.randn(K, N)
        with timer:
            a @ b
    assert timer.total_flops == MM_FLOPS
    assert timer.latency is None and timer.timing.startswith("not measured")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_timer_without_cuda_is_refused_up_front():
    with pytest.raises(ValueError, match="CUDAPerformanceTimer needs a CUDA device"):
        CUDAPerformanceTimer("prefill")
    with pytest.raises(ValueError, match="use PerformanceTimer"):
        TransformerPerformanceCounter(timer_cls=CUDAPerformanceTimer)


def test_timer_cls_must_be_a_timer():
    for bad in (object, "PerformanceTimer", PerformanceTimer("x")):
        with pytest.raises(TypeError, match="timer_cls must be PerformanceTimer"):
            TransformerPerformanceCounter(timer_cls=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_timer_on_a_gpu():
    a = torch.randn(M, K, device="cuda")
    b = torch.randn(K, N, device="cuda")
    counter = TransformerPerformanceCounter(timer_cls=CUDAPerformanceTimer)
    with counter.count("a", num_tokens=M):
        torch.matmul(a, b)
    s = counter.counts["a"]
    assert s.total_flops == MM_FLOPS and s.total_io == MM_BYTES
    assert s.timing == "cuda events, synchronized" and s.latency >= 0


# -- TransformerPerformanceCounter(timer_cls=...) ----------------------------------------------

@pytest.mark.parametrize("spec", [None, "toy"])
def test_counter_with_timer_cls_as_torchao_used_it(spec, tmp_path):
    import time
    device_spec = toy_spec() if spec else None
    cm = TransformerPerformanceCounter(timer_cls=PerformanceTimer, device_spec=device_spec)
    a, b = torch.randn(M, K), torch.randn(K, N)
    latencies = {}
    for label in ("a", "b"):
        start = time.perf_counter()
        with cm.count(label, num_tokens=M):
            torch.matmul(a, b)
        latencies[label] = time.perf_counter() - start
    psa, psb = cm.get_counts()["a"], cm.counts["b"]
    for ps, label in ((psa, "a"), (psb, "b")):
        assert abs(ps.latency - latencies[label]) < 0.1
        assert ps.total_flops == MM_FLOPS and ps.total_io == MM_BYTES
        assert ps.token_throughput == ps.num_tokens / ps.latency
        assert ps.achieved_flops_per_s == ps.total_flops / ps.latency
    assert cm.total_flops == psa.total_flops + psb.total_flops == 2 * MM_FLOPS
    assert cm.total_io == 2 * MM_BYTES and cm.total_time == psa.latency + psb.latency
    summary = cm.stats_summary
    assert summary.num_tokens == 2 * M and summary.latency == psa.latency + psb.latency
    assert summary.total_flops == 2 * MM_FLOPS and summary.total_io == 2 * MM_BYTES
    both = psa.latency + psb.latency
    assert summary.achieved_bandwidth == pytest.approx(2 * MM_BYTES / both)
    if device_spec is None:
        assert summary.bandwidth_utilization is None and summary.flops_utilization is None
    else:
        assert summary.bandwidth_utilization == pytest.approx(2 * MM_BYTES / both / 1e9)
        assert summary.flops_utilization == pytest.approx(2 * MM_FLOPS / both / 23e9)
    # to_json: torchao's layout, labels at the top level, every torchao key in each
    path = tmp_path / "test.json"
    cm.to_json(path)
    perf = json.loads(path.read_text())
    assert set(perf) == {"a", "b"}
    for label, ps in (("a", psa), ("b", psb)):
        d = perf[label]
        assert set(TORCHAO_FIELDS) | set(TORCHAO_PROPERTIES) <= set(d)
        assert (d["num_tokens"], d["total_io"], d["total_flops"], d["latency"]) == (
            ps.num_tokens, ps.total_io, ps.total_flops, ps.latency)
        assert d["achieved_bandwidth"] == ps.achieved_bandwidth
        if device_spec is not None:
            assert d["device_bandwidth"] == 1e9 and d["device_flops_per_s"] == 23e9
            assert d["theoretical_io_latency"] == ps.theoretical_io_latency
            assert d["theoretical_compute_latency"] == ps.theoretical_compute_latency
            assert d["bandwidth_utilization"] == ps.bandwidth_utilization
            assert d["flops_utilization"] == ps.flops_utilization


def test_from_json_reads_a_torchao_file(tmp_path):
    """A file in torchao's layout (what its to_json wrote): its figures as given."""
    fields = torchao_fields(True)
    stats = PerformanceStats(**fields)
    doc = {"prefill": {**fields, **{p: getattr(stats, p) for p in TORCHAO_PROPERTIES}},
           "decode": {**fields, "label": "decode", "num_tokens": 1}}
    path = tmp_path / "torchao.json"
    path.write_text(json.dumps(doc))
    counter = TransformerPerformanceCounter.from_json(path)
    assert counter.counts["prefill"] == stats
    assert counter.total_flops == 2 * 123e9 and counter.total_tokens == 129
    summary = counter.stats_summary
    assert summary.total_io == 2 * 123e6 and summary.latency == pytest.approx(0.2)
    assert summary.device_bandwidth == 1e9 and summary.flops_summary == {"a": 468e12, "b": 690e9}
    assert "Performance Summary:" in counter.print_summary()
    with pytest.raises(ValueError, match="phase 'prefill' holds torchao's totals"):
        with counter.count("prefill", 1):
            pass
    with pytest.raises(ValueError, match="no per-op records to price on another device"):
        counter.compare(["h100-sxm"])


# -- the counting conventions torchao's tests pin ---------------------------------------------

@pytest.fixture(scope="module")
def llama_counts():
    import transformers
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=96,
                                   num_attention_heads=4, vocab_size=128,
                                   max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad(), PerformanceCounterMode() as pc:
        model(torch.randint(0, 128, (1, 16)))
    return pc


def test_summary_flop_and_io_counts_have_the_same_keys(llama_counts):
    flops, io = llama_counts.get_summary_flop_counts(), llama_counts.get_summary_io_counts()
    assert flops.keys() == io.keys()
    embed = "LlamaForCausalLM.model.embed_tokens"  # moves bytes, computes nothing
    assert flops[embed] == 0 and io[embed] > 0
    assert llama_counts.get_flop_counts()[embed] == {}


def test_projection_counts_match_torchao_formulas(llama_counts):
    flops, io = llama_counts.get_summary_flop_counts(), llama_counts.get_summary_io_counts()
    (q_proj,) = [k for k in flops if k.endswith("q_proj")]
    assert flops[q_proj] == 131_072  # 2 * 16 * 64 * 64
    assert io[q_proj] == 24_576  # (1024 + 4096 + 1024) * 4


def test_attention_matmuls_equal_torch_and_softmax_has_its_own_key(llama_counts):
    (attn,) = [k for k in llama_counts.get_summary_flop_counts() if k.endswith("self_attn")]
    by_op = llama_counts.get_flop_counts()[attn]
    fused = {op: n for op, n in by_op.items() if "attention" in op.__name__}  # every key has one
    assert list(fused.values()) == [65_536]  # 4 * B * S^2 * H = 4 * 16 * 16 * 64
    # the softmax inside the fused kernel: per score scale, max, subtract, exp, sum
    # (5 * 4 heads * 16 * 16 = 5120) and one divide per output (4 * 16 * 16 = 1024)
    assert by_op[SDPA_SOFTMAX] == 6_144 and SDPA_SOFTMAX.__name__ == "sdpa_softmax"
    assert llama_counts.get_total_flops() == sum(llama_counts.get_flop_counts()["Global"].values())


@pytest.mark.parametrize("q,k,v", [((2, 4, 6, 8), (2, 4, 10, 8), (2, 4, 10, 8)),
                                   ((1, 2, 5, 16), (1, 2, 5, 16), (1, 2, 5, 32))])
def test_attention_matmul_share_is_torchs_formula(q, k, v):
    cost = attention_cost(q, k, v, is_causal=True, has_mask=True)
    assert attention_matmul_flops(cost.kinds) == sdpa_flop_count(q, k, v)
    assert cost.flops > sdpa_flop_count(q, k, v)  # the softmax is counted in the total


# -- total_model_params ----------------------------------------------------------------------

def test_total_model_params(tiny_model):
    # tiny_args: vocab 64, dim 32; the output head is its own Linear (no tying)
    total = sum(p.numel() for p in tiny_model.parameters())
    assert total_model_params(tiny_model, exclude_embeddings=False) == total
    assert total_model_params(tiny_model) == total - 64 * 32  # less tok_embeddings.weight
    with pytest.raises(ValueError, match="no module 'embed'; pass embedding_key= one of: "
                                         "tok_embeddings"):
        total_model_params(tiny_model, embedding_key="embed")


def test_total_model_params_dotted_key_for_transformers():
    from conftest import make_hf_model
    model = make_hf_model("llama")  # vocab 64, hidden 32
    total = sum(p.numel() for p in model.parameters())
    assert total_model_params(model, embedding_key="model.embed_tokens") == total - 64 * 32


def test_cuda_device_spec_is_exported():
    assert issubclass(CUDADeviceSpec, DeviceSpec)
