"""benchmarks/bench_serving_published.py: each published serving row served as it ran, its ratio
and goal as the script defines them, and the rows it cannot price named with the reason."""
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_serving_published as bench  # noqa: E402
from published_serving import load_rows  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return {r.id: r for r in load_rows()}


def test_ratios_and_goals(rows):
    flood = rows["trtllm017-h100-llama31-8b-fp8-tp1-128-128"]
    # a throughput's measured / predicted: 28,836.77 measured over 28,836.77 / 1.25 predicted
    assert bench.ratio_of(flood, 28836.77 / 1.25) == pytest.approx(1.25)
    assert bench.goal_of(flood) == (0.9, 1.1)
    ttft = rows["trtllm05-a100-llama7b-fp16-ttft-2048"]
    assert bench.ratio_of(ttft, 100.0) == pytest.approx(1.33)  # 133 ms over 100 ms
    assert bench.goal_of(ttft) == (0.85, 1.2)
    # a decode rate is a latency: 1/75 s a token measured over 1/80 predicted = 80 / 75
    rate = rows["vllm023-a100-40gb-llama31-8b-bf16-c1"]
    assert bench.ratio_of(rate, 80.0) == pytest.approx(80 / 75)
    assert bench.goal_of(rate) == (0.85, 1.2)
    # several GPUs: 0.8-1.25 whatever the metric
    assert bench.goal_of(rows["trtllm017-h100-llama31-70b-fp8-tp8-128-128"]) == (0.8, 1.25)
    assert bench.goal_of(rows["trtllm05-h100-llama70b-fp8-tp4-ttft-128"]) == (0.8, 1.25)


def test_summaries_split_by_goal():
    one_t = {"gpus": 1, "goal": (0.9, 1.1), "throughput": True}
    one_l = {"gpus": 1, "goal": (0.85, 1.2), "throughput": False}
    many = {"gpus": 4, "goal": (0.8, 1.25), "throughput": True}
    parts = dict(bench.summaries([one_t, one_l, many, one_t]))
    assert parts == {"one GPU, throughput rows": [one_t, one_t],
                     "one GPU, latency rows": [one_l], "several GPUs, every row": [many]}


def test_predicted_figure_reads_serves_metrics(rows):
    m = {"output_throughput": 8000.0, "mean_ttft_ms": 12.0, "median_tpot_ms": 5.0,
         "mean_itl_ms": 4.0, "mean_tpot_ms": 12.5}
    per_gpu = replace(rows["trtllm061-h100-llama70b-fp8-tp4-bs480-128-2048"])
    assert bench.predicted_figure(per_gpu, m) == 8000.0 / 4  # tok/s/GPU over TP 4
    assert bench.predicted_figure(rows["trtllm05-h100-llama7b-fp8-ttft-128"], m) == 12.0
    assert bench.predicted_figure(rows["trtllm014-h100-llama31-8b-bf16-467-256-qps2-itl"],
                                  m) == 4.0
    tpot = rows["sglang030-a100-llama31-8b-bf16-sharegpt-rps4-tpot"]  # statistic: median
    assert bench.predicted_figure(tpot, m) == 5.0
    assert bench.predicted_figure(rows["vllm023-a100-40gb-llama31-8b-bf16-c1"], m) == 80.0


def test_workloads_as_the_rows_ran(rows):
    static = bench.workload_of(rows["trtllm05-l40s-llama7b-fp8-bs16-2048-2048"], None)
    assert len(static) == 16 and static.concurrency is None
    assert float(static.arrival[-1]) < 1e-6  # every request of the batch at once
    flood = bench.workload_of(rows["trtllm017-h100-llama31-8b-fp8-tp1-128-128"], 3000)
    assert len(flood) == 3000  # the source's 30,000, capped
    assert len(bench.workload_of(rows["trtllm017-h100-llama31-8b-fp8-tp1-128-128"],
                                 None)) == 30000
    poisson = bench.workload_of(rows["trtllm014-h100-llama31-8b-bf16-467-256-qps2-ttft"], None)
    assert len(poisson) == 500 and 200 < float(poisson.arrival[-1]) < 300  # ~499 / 2 s
    closed = bench.workload_of(rows["vllm023-a100-40gb-llama31-8b-bf16-c1"], None)
    assert closed.concurrency == 1 and len(closed) == bench.CONCURRENCY_REQUESTS
    # NIM's concurrency 25 with no count stated: 4 requests a slot, 100
    wide = bench.workload_of(rows["nim180-h100-llama33-70b-fp8-tp2-5000-500-c25-output"], None)
    assert wide.concurrency == 25 and len(wide) == 100


def test_rows_it_cannot_price_say_why(rows, monkeypatch):
    monkeypatch.setattr(bench, "api_takes", lambda name: name != "tensor_parallel_size")
    reason = bench.skip_reason
    assert reason(rows["trtllm017-h100-llama31-70b-fp8-tp8-128-128"]) == \
        "needs tensor_parallel_size"
    assert reason(rows["sglang030-a100-llama31-8b-bf16-sharegpt-offline"]) == \
        "lengths not stated by the source"
    assert reason(rows["sglang-h100-deepseek-v3-ep-pd-2000-out-per-node"]) == \
        "no perfcounter preset stands for the model"
    assert reason(rows["trtllm017-h100-llama31-8b-fp8-tp1-128-128"]) == ""


@pytest.mark.slow  # builds Llama-3.1-8B's step table: ~5-10 s
def test_a_single_request_row_is_served_and_printed(rows, capsys):
    got = bench.main(only="vllm023-a100-40gb-llama31-8b-bf16-c1")
    assert [r["id"] for r in got] == ["vllm023-a100-40gb-llama31-8b-bf16-c1"]
    assert got[0]["requests"] == bench.CONCURRENCY_REQUESTS and got[0]["preemptions"] == 0
    assert got[0]["ratio"] == pytest.approx(got[0]["predicted"] / 75)
    out = capsys.readouterr().out
    assert "| vllm023-a100-40gb-llama31-8b-bf16-c1 |" in out
    assert "one GPU, latency rows: " in out and "of 1 within 0.85-1.2" in out
