"""benchmarks/bench_published.py: gpt-fast's A100 rows predicted in the regime that produced
them (cudagraphs) within 0.8-1.25, no efficiency fitted to them (a100's GEMV efficiencies by
weight dtype come from a kernel benchmark, device_specs/nvidia.yaml)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_published  # noqa: E402


@pytest.mark.slow  # counts Llama-2-7B's config three times: ~10 s
def test_gpt_fast_a100_rows_hold(capsys):
    results = bench_published.main(only="gptfast-a100-llama2-7b", genz=False)
    assert [r["id"].rsplit("-", 1)[1] for r in results] == ["bf16", "int8", "int4"]
    assert all(0.8 <= r["ratio"] <= 1.25 for r in results), results
    out = capsys.readouterr().out
    assert "| gptfast-a100-llama2-7b-int4 | cudagraphs | 196.8 tokens/s |" in out


def test_rows_it_cannot_price_say_why():
    from published import load_rows
    reasons = {r.id: bench_published.skip_reason(r) for r in load_rows()}
    # fp8 rows: W8A8 (--quantize fp8) with TensorRT-LLM's --fp8_kv_cache, activations bf16
    assert reasons["trtllm-h100-llama7b-fp8-ttft-128"] == ""
    assert bench_published.PRECISION["fp8"] == ("bfloat16", "fp8", "fp8")
    assert reasons["llamacpp-3090ti-llama7b-q4_0-tg128"].endswith("not in the registry")
    assert "serving scheduler" in reasons["trtllm-h100-llama31-8b-fp8-sat-128-128"]
    assert reasons["gptfast-a100-llama2-7b-bf16"] == ""
    # a rate's measured / predicted is predicted / measured: 100 predicted, 80 measured
    assert bench_published.ratio_of("decode_tokens_per_s", 80, 100) == 1.25
    assert bench_published.ratio_of("ttft_ms", 80, 100) == 0.8
