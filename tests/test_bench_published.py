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


@pytest.mark.slow  # counts Llama-2-7B's 32 layers as a Q4_0 file twice: ~10 s
def test_llama_cpp_rows_price_the_file_and_the_eval_rate():
    from published import load_rows
    row = next(r for r in load_rows() if r.id == "llamacpp-3090-llama2-7b-q4_0-tg-nographs")
    # ./main's `eval time` line: generated tokens over their steps' time, the prompt apart
    assert row.metric == "eval_tokens_per_s" and bench_published.PRECISION["q4_0"][3] == "Q4_0"
    counter = bench_published._count(row, 192, 1)  # the step half way through 128 tokens
    trace = counter.counts["decode"].trace
    # a step reads the Q4_0 file's linears and output (3,824,001,024 B less the embedding's
    # 73,728,000, of which it reads one row), float16 norms and the KV cache: > 3.75 GB
    assert 3.75e9 < trace.compulsory_bytes / trace.steps < 3.9e9
    predicted = bench_published.predict_row(row)["predicted"]
    step = bench_published._predict(row, counter.counts["decode"]).latency_s / trace.steps
    assert predicted == pytest.approx(1 / step, rel=1e-9)
    assert 0.8 <= bench_published.ratio_of(row.metric, row.figure, predicted) <= 1.25
