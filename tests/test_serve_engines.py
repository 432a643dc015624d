"""Engine profiles (serve/engines.py): each figure with its source, the regime an engine
runs on each kind of device, TensorRT-LLM's admission that never evicts, host costs,
and serving metrics that leave out what a one-token request does not have."""
import json

import numpy as np
import pytest

from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.serve import ServeError, deployment, serve, synthetic
from perfcounter.serve.engines import ENGINES, PROFILES, Figure, engine_profile
from perfcounter.serve.scheduler import EngineConfig, simulate_engine
from perfcounter.serve.workload import Workload

TINY = ModelArgs(block_size=1024, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
DEVICES = ("h100-sxm", "a100-sxm4-80gb", "rtx-4090", "generic-cpu", "pim-ai-4dimm")


@pytest.fixture(scope="module")
def dep():
    return deployment(TINY, "h100-sxm", max_num_seqs=64, max_num_batched_tokens=512)


def fixed(n, prompt, output):
    return Workload(np.zeros(n), np.full(n, prompt), np.full(n, output),
                    np.zeros(n, dtype=np.int64), None, "fixed")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("device", DEVICES)
def test_every_profile_figure_carries_its_source(engine, device):
    profile = PROFILES[engine]
    spec = get_device_spec(device)
    figures = profile.figures(spec)
    assert set(figures) == {"execution", "admission", "max_num_seqs", "max_num_batched_tokens",
                            "step_overhead_s", "request_overhead_s", "kv_scales",
                            "seq_overhead_s", "async_scheduling", "sampler", "windowed_kv"}
    for name, figure in figures.items():
        assert isinstance(figure, Figure) and figure.value is not None, name
        assert len(figure.source) > 20, (name, figure.source)
        # a figure of the engine's own names the engine's version; a regime the engine
        # lacks on this device says why
        assert profile.version in figure.source or "no CUDA graphs" in figure.source, name


@pytest.mark.parametrize("device, regime", [("h100-sxm", "cudagraphs"), ("rtx-4090", "cudagraphs"),
                                            ("generic-cpu", "eager"),
                                            ("pim-ai-4dimm", "eager")])
def test_cuda_graphs_on_a_gpu_eager_elsewhere(device, regime):
    for engine in ENGINES:
        assert PROFILES[engine].regime(get_device_spec(device)).value == regime


def test_vllm_batch_defaults_follow_the_device_memory():
    # vLLM v0.10.0's OpenAI server: >= 70 GiB and not an A100: 8,192 tokens, 1,024 sequences;
    # else 2,048 and 256. h100-sxm (80 GB = 74.5 GiB) is the first, an A100 80GB and a
    # 24 GB RTX 4090 the second
    vllm = PROFILES["vllm"]
    h100, a100, rtx = (get_device_spec(d) for d in ("h100-sxm", "a100-sxm4-80gb", "rtx-4090"))
    assert (vllm.max_num_batched_tokens(h100).value, vllm.max_num_seqs(h100).value) == (8192, 1024)
    assert (vllm.max_num_batched_tokens(a100).value, vllm.max_num_seqs(a100).value) == (2048, 256)
    assert (vllm.max_num_batched_tokens(rtx).value, vllm.max_num_seqs(rtx).value) == (2048, 256)
    # SGLang: chunked prefill 2,048 below 35 GB, 8,192 below 160 GB
    sgl = PROFILES["sglang"]
    assert sgl.max_num_batched_tokens(rtx).value == 2048
    assert sgl.max_num_batched_tokens(h100).value == 8192


def test_a_deployment_takes_the_profile_and_the_flags_override_it():
    dep = deployment(TINY, "h100-sxm", engine="trtllm")
    assert dep.execution == "cudagraphs" and dep.engine.admission == "no_evict"
    assert (dep.engine.max_num_seqs, dep.engine.max_num_batched_tokens) == (2048, 8192)
    assert dep.engine_line.startswith("engine: trtllm (TensorRT-LLM 1.0 defaults), cudagraphs "
                                      "(the engine's default here)")
    given = deployment(TINY, "h100-sxm", engine="trtllm", execution="eager", max_num_seqs=8,
                       step_overhead_s=1e-3, admission="recompute")
    assert (given.execution, given.engine.max_num_seqs, given.engine.step_overhead_s,
            given.engine.admission) == ("eager", 8, 1e-3, "recompute")
    assert given.sources["max_num_seqs"] == "--max_num_seqs (given)"
    assert "(given)" in given.engine_line
    cpu = deployment(TINY, "generic-cpu")
    assert cpu.execution == "eager" and cpu.table.label == "predicted, eager"
    with pytest.raises(ServeError, match="--engine 'tgi'; valid: vllm, trtllm, sglang"):
        engine_profile("tgi")


def test_no_evict_admits_no_request_it_cannot_finish(dep):
    # 8 requests of 32 prompt + 64 output tokens need ceil(96 / 16) = 6 blocks each by their
    # end. With 20 blocks, vLLM's admission (free blocks now) lets all 8 start and preempts;
    # guaranteed no evict admits a request only when 6 more blocks are left beside the 6 of
    # each running one: floor(20 / 6) = 3 at a time, and none is ever preempted
    w = fixed(8, 32, 64)
    recompute = simulate_engine(w, dep.table, EngineConfig(20, 512, 64))
    no_evict = simulate_engine(w, dep.table, EngineConfig(20, 512, 64, admission="no_evict"))
    assert recompute.preemptions > 0
    assert no_evict.preemptions == 0 and all(r.preemptions == 0 for r in no_evict.requests)
    assert int(np.frombuffer(no_evict.steps.seqs).max()) == 3
    assert all(r.generated == 64 for r in no_evict.requests)
    # blocks held never pass the 18 reserved for 3 requests
    assert np.frombuffer(no_evict.steps.kv_blocks).max() <= 18


def test_the_request_cost_delays_the_first_token(dep):
    # one request alone: its first token comes one prefill step after its arrival, later by
    # exactly the fixed host cost a request
    w = fixed(1, 16, 2)
    plain = simulate_engine(w, dep.table, EngineConfig(100, 512, 64))
    later = simulate_engine(w, dep.table, EngineConfig(100, 512, 64, request_overhead_s=0.005))
    assert later.requests[0].first_token - plain.requests[0].first_token == \
        pytest.approx(0.005, abs=1e-12)


def test_one_token_requests_have_no_tpot_or_itl(dep, tmp_path):
    # every request one output token: no TPOT, no ITL at all (None, null in JSON), never 0
    only = serve(dep, synthetic(20, 16, 1, qps=5, seed=0))
    for key in ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms"):
        assert only.metrics[key] is None, key
    assert json.loads(json.dumps(only.to_dict()))["mean_tpot_ms"] is None
    assert only.metrics["mean_ttft_ms"] > 0
    # mixed: one-token requests are left out of the mean. Alone in the engine (arrivals
    # 1 s apart), a request of 3 output tokens has TPOT = one decode step each
    w = Workload(np.array([0.0, 1.0, 2.0, 3.0]), np.full(4, 16), np.array([1, 3, 1, 3]),
                 np.zeros(4, dtype=np.int64), None, "mixed")
    m = serve(dep, w).metrics
    tpots = [(r.finish - r.first_token) / 2 for r in serve(dep, w).run.requests
             if r.output == 3]
    assert m["mean_tpot_ms"] == pytest.approx(np.mean(tpots) * 1e3, rel=1e-12)
    assert m["mean_tpot_ms"] > 0
