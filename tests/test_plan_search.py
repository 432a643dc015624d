"""A whole search on a tiny model: every candidate in the JSON with vLLM's field names, the
same figures in this process, on a process pool and on Ray, and the recommendation re-served
with its printed `perfcounter serve` command giving its figures."""
import json
import shlex

import pytest

from perfcounter.cli.main import main
from perfcounter.plan import plan
from perfcounter.plan.execute import groups, table_group

pytestmark = pytest.mark.slow  # a search counts 4 step tables; Ray starts a local cluster

TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}
SEARCH = dict(slo="ttft=50ms,tpot=2ms", qps=50.0, num_requests=24, prompt_length="uniform:16-48",
              max_new_tokens="8", quantizations=("none", "int8"), kv_cache_dtypes=("none",),
              max_num_seqs=(2, 8), pipeline_parallel_size=(1, 2), disaggregated=False,
              exhaustive=True)  # every candidate simulated (the pruned search: test_plan_prune)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.fixture(scope="module")
def serial(tiny):
    return plan(tiny, "h100-sxm:2,a100-sxm4-80gb:1", backend="serial", **SEARCH)


def test_every_candidate_and_its_figures(serial):
    # 2 H100: (TP, PP, DP) (1, 1, 1) (1, 1, 2) (1, 2, 1) (2, 1, 1); 1 A100: (1, 1, 1)
    # -> 5 x 2 weights x 2 batch limits = 20, every one fits a tiny model
    assert serial.simulated == len(serial.candidates) == 20
    d = serial.to_dict()
    row = d["candidates"][0]
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                 "enable_expert_parallel", "max_num_seqs", "quantization", "kv_cache_dtype",
                 "goodput_per_gpu", "output_throughput_per_gpu", "usd_per_1m_output_tokens",
                 "j_per_output_token", "serve_command", "pareto", "recommended", "num_gpus"):
        assert name in row
    assert len(d["candidates"]) == d["enumerated"] == len(serial.candidates)
    for r in d["candidates"]:
        if r.get("goodput_per_gpu") is not None:  # request_goodput / GPUs
            assert r["goodput_per_gpu"] == r["request_goodput"] / r["num_gpus"]
        if r["usd_per_1m_output_tokens"] is not None and r["device"] == "h100-sxm":
            # the candidate's GPUs at $6.88 a GPU-hour each (the registry's H100 price)
            assert r["usd_per_hour"] == pytest.approx(6.88 * r["num_gpus"])
    assert serial.front and all(d["candidates"][i]["pareto"] for i in serial.front)


def test_candidates_share_one_table_per_model_precision_and_shard(serial):
    tasks = groups(serial.candidates)
    # a table per kind x weights x (TP, PP): H100 3 shards x 2 weights + A100 1 x 2 = 8; each
    # of 2 batch limits, the H100's TP 1 PP 1 tables also of DP 1 and 2
    assert len(tasks) == len({table_group(c) for c in serial.candidates}) == 8
    assert sorted(len(t) for t in tasks) == [2, 2, 2, 2, 2, 2, 4, 4]
    assert all(c.tensor_parallel_size * c.pipeline_parallel_size * c.data_parallel_size
               == c.num_gpus <= 2 for c in serial.candidates)


def test_the_same_figures_on_a_process_pool(tiny, serial):
    pooled = plan(tiny, "h100-sxm:2,a100-sxm4-80gb:1", backend="processes", workers=2, **SEARCH)
    assert pooled.candidates == serial.candidates
    assert pooled.figures == serial.figures  # bit for bit: == on every float
    assert (pooled.front, pooled.recommended) == (serial.front, serial.recommended)


def test_the_same_figures_on_ray(tiny, serial):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = plan(tiny, "h100-sxm:2,a100-sxm4-80gb:1", backend="ray", **SEARCH)
    finally:
        ray.shutdown()
    assert on_ray.candidates == serial.candidates
    assert on_ray.figures == serial.figures
    assert (on_ray.front, on_ray.recommended) == (serial.front, serial.recommended)


def _first(result, **sizes):
    return next(i for i, c in enumerate(result.candidates)
                if all(getattr(c, k) == v for k, v in sizes.items()))


def test_the_recommendation_reserved_by_its_command(tmp_path, capsys, serial):
    assert serial.recommended is not None, "the tiny model meets a loose SLO"
    # the recommendation, and a tensor-, a pipeline- and a data-parallel candidate
    for i in (serial.recommended, _first(serial, tensor_parallel_size=2),
              _first(serial, pipeline_parallel_size=2), _first(serial, data_parallel_size=2)):
        argv = shlex.split(serial.commands[i])
        assert argv[:2] == ["perfcounter", "serve"]
        out = tmp_path / f"served{i}.json"
        assert main(argv=[*argv[1:], "--save_path", str(out)]) == 0
        served = json.loads(out.read_text())
        mine = serial.figures[i]
        for key in ("request_goodput", "output_throughput", "median_tpot_ms", "p99_ttft_ms",
                    "j_per_output_token", "usd_per_1m_output_tokens", "usd_per_hour"):
            assert served[key] == mine[key], (serial.commands[i], key)


def test_another_engine_and_its_command(tmp_path, tiny):
    result = plan(tiny, "h100-sxm:1", backend="serial", engine="sglang",
                  **{**SEARCH, "quantizations": ("none",), "max_num_seqs": (8,)})
    (i,) = range(len(result.candidates))  # one GPU, one weight, one batch limit
    argv = shlex.split(result.commands[i])
    assert argv[argv.index("--engine") + 1] == "sglang"
    out = tmp_path / "sglang.json"
    assert main(argv=[*argv[1:], "--save_path", str(out)]) == 0
    served = json.loads(out.read_text())
    assert served["engine_profile"] == "sglang"
    assert served["median_tpot_ms"] == result.figures[i]["median_tpot_ms"]


def test_the_command_line_prints_and_saves(tmp_path, capsys, tiny):
    out = tmp_path / "plan.json"
    code = main(argv=["plan", "--model", tiny, "--devices", "h100-sxm:1", "--qps", "50",
                      "--num_requests", "24", "--prompt_length", "32", "--max_new_tokens", "8",
                      "--quantize", "none", "--kv_dtype", "none,fp8", "--max_num_seqs", "4",
                      "--slo", "ttft=50ms,tpot=2ms", "--workers", "1", "--save_path", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "candidates: 2 enumerated, 0 left out" in text and "Pareto front" in text
    assert "perfcounter serve --model" in text
    d = json.loads(out.read_text())
    assert [r["kv_cache_dtype"] for r in d["candidates"]] == [None, "fp8"]
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary left


def test_a_disaggregated_candidate_and_its_command(tmp_path, capsys, tiny):
    search = {**SEARCH, "quantizations": ("none",), "max_num_seqs": (8,), "disaggregated": True}
    result = plan(tiny, "h100-sxm:2", backend="serial", **search)
    # aggregated (TP, PP, DP) (1, 1, 1) (1, 1, 2) (1, 2, 1) (2, 1, 1); disaggregated: two
    # instances of 1 GPU, 1P:1D (an instance of TP 2 leaves no second one) -> 4 + 1
    assert len(result.candidates) == 5
    i = next(i for i, c in enumerate(result.candidates) if c.disaggregated)
    c, mine = result.candidates[i], result.figures[i]
    assert (c.num_prefill_instances, c.num_decode_instances, c.num_gpus) == (1, 1, 2)
    assert mine["usd_per_hour"] == 2 * 6.88  # both pools' GPUs at the H100's price
    # the KV moved: every prompt token's K and V, 2 layers x 2 KV heads x 8 x 2 B x 2 = 128 B
    served = tmp_path / "pools.json"
    argv = shlex.split(result.commands[i])
    assert "--prefill_pool" in argv and "--decode_pool" in argv
    assert main(argv=[*argv[1:], "--save_path", str(served)]) == 0
    overall = json.loads(served.read_text())["overall"]
    for key in ("request_goodput", "output_throughput", "median_tpot_ms", "p99_ttft_ms",
                "j_per_output_token", "kv_transfer_bytes", "kv_transfer_j"):
        assert overall[key] == mine[key], key
    assert mine["kv_transfer_bytes"] == overall["total_input_tokens"] * 128
