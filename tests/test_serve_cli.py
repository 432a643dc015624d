"""`perfcounter serve` (cli/serve.py): bad input in one line with exit code 2, outputs, views."""
import csv
import json

import pytest

from perfcounter.cli.main import build_parser
from perfcounter.cli import serve as command
from perfcounter.serve import cache_clear, cache_info

TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def run(*argv):
    """`perfcounter serve` on an H100 unless the test names the device."""
    device = [] if "--device_spec" in argv else ["--device_spec", "h100-sxm"]
    try:  # a bad flag or output path is refused while parsing: one line, exit code 2
        args = build_parser().parse_args(["serve", *device, *(str(a) for a in argv)])
    except SystemExit as exc:
        return exc.code
    return command.run(args)


def one_line_error(capsys, code):
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("perfcounter serve: error: ") and "\n" not in err
    return err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("rows, expected", [
    ("arrival_time,prompt_tokens,output_tokens\n-1,10,5\n", "arrival_time -1; expected a time >= 0"),
    ("arrival_time,prompt_tokens,output_tokens\n2,10,5\n1,10,5\n", "sorted"),
    ("arrival_time,prompt_tokens,output_tokens\n0,0,5\n", "prompt_tokens 0; expected a length >= 1"),
    ("arrival_time,prompt_tokens,output_tokens\n0,10,-3\n", "output_tokens -3"),
    ("arrival_time,prompt_tokens,output_tokens\n0,1000,100\n", "exceed the model's context of 1024"),
    ("arrival_time,prompt_tokens\n0,10\n", "has no output_tokens"),
])
def test_bad_trace_files(tmp_path, capsys, config, rows, expected):
    trace = write(tmp_path, "t.csv", rows)
    err = one_line_error(capsys, run("--model", config, "--trace_file", trace))
    assert expected in err


def test_bad_jsonl_trace(tmp_path, capsys, config):
    trace = write(tmp_path, "t.jsonl", '{"arrival_time": 0, "prompt_tokens": 4, '
                                       '"output_tokens": 2}\nnot json\n')
    assert "t.jsonl:2: not a JSON object" in one_line_error(
        capsys, run("--model", config, "--trace_file", trace))


@pytest.mark.parametrize("argv, expected", [
    (("--qps", "5", "--slo", "ttft=200"), "a unit is required"),
    (("--qps", "5", "--slo", "ttft=200ms,speed=3ms"), "unknown target 'speed'"),
    (("--qps", "0"), "every rate must be > 0"),
    (("--qps", "1,-2"), "every rate must be > 0"),
    (("--qps", "fast"), "expected a rate"),
    (("--qps", "5", "--prompt_length", "0"), "--prompt_length 0"),
    (("--qps", "5", "--max_new_tokens", "uniform:9-3"), "uniform:LO-HI"),
    (("--qps", "5", "--concurrency", "2"), "not both"),
    (("--find_max_qps",), "needs --slo"),
    (("--qps", "5", "--device_spec", "h10"), "h10"),
    (("--qps", "5", "--precision", "int3"), "--precision 'int3'"),
    (("--qps", "5", "--gpu_memory_utilization", "1.5"), "fraction in (0, 1]"),
    (("--qps", "5", "--max_num_seqs", "0"), "--max_num_seqs 0"),
    (("--qps", "5", "--prefix_hit_rate", "1"), "--prefix_hit_rate 1"),
    (("--qps", "5", "--mapping", "m.yaml"), "cannot read mapping file 'm.yaml'"),
    (("--qps", "5", "--mapping", "{qproj: pim-ai-4chip}"), "matches no module"),
    (("--qps", "5", "--mapping", "{wqkv: pim-z}"), "unknown device 'pim-z'"),
    ((), "give a workload"),
])
def test_bad_options(capsys, config, argv, expected):
    assert expected in one_line_error(capsys, run("--model", config, *argv))


@pytest.mark.parametrize("argv", [("--mapping", "{wqkv: pim-z}"), ("--mapping", "{wqkv: host}",
                                  "--mapping", "{qproj: host}"), ("--device_spec", "h100-sxm,h10")])
def test_every_deployment_is_checked_before_any_step_table(capsys, config, argv):
    # the bad one comes last: refused before the good ones' tables are counted
    cache_clear()
    one_line_error(capsys, run("--model", config, "--qps", "5", *argv))
    assert cache_info().misses == 0


def test_bound_is_spelled_execution_bound(capsys, config, tmp_path):
    # --bound is the old spelling: one note naming the new one, the same run
    out = tmp_path / "r.json"
    code = run("--model", config, "--qps", "5", "--num_requests", "10", "--bound",
               "--save_path", out)
    err = capsys.readouterr().err
    assert code == 0 and "--bound is deprecated; use --execution bound" in err
    assert json.loads(out.read_text())["execution"] == "bound"


def test_a_workload_that_can_never_fit(capsys, config):
    # utilisation 1e-9 of 80 GB = 80 B holds no block at all
    err = one_line_error(capsys, run("--model", config, "--qps", "5",
                                     "--gpu_memory_utilization", "1e-9"))
    assert "does not fit" in err
    # Llama-3-8B: 8,030,261,248 parameters x 2 B = 16.06 GB > 80 GB x 0.2 = 16 GB
    err = one_line_error(capsys, run("--model", "llama-3-8b", "--qps", "5",
                                     "--gpu_memory_utilization", "0.2"))
    assert "does not fit" in err and "16.06 GB" in err


def test_bad_output_paths_before_the_work(capsys, config, tmp_path):
    err = one_line_error(capsys, run("--model", config, "--qps", "5",
                                     "--save_path", tmp_path / "no" / "r.json"))
    assert "--save_path" in err
    err = one_line_error(capsys, run("--model", config, "--qps", "5",
                                     "--plot", tmp_path / "no" / "x"))
    assert f"--plot {tmp_path / 'no' / 'x'}: folder {tmp_path / 'no'} does not exist" in err


def test_one_result_and_its_files(capsys, config, tmp_path):
    out = {k: tmp_path / f"r.{k}" for k in ("json", "csv", "trace")}
    code = run("--model", config, "--qps", "20", "--num_requests", "40", "--prompt_length", "64",
               "--max_new_tokens", "8", "--slo", "ttft=1s,tpot=100ms", "--usd_per_hour", "2",
               "--save_path", out["json"], "--csv", out["csv"], "--trace", out["trace"])
    text = capsys.readouterr().out
    assert code == 0
    # the first line: vLLM's profile (the default engine), CUDA graphs on an H100
    assert text.startswith("engine: vllm (vLLM v0.10.0 defaults), cudagraphs (the engine's "
                           "default here); steps priced predicted, cudagraphs")
    assert "Serving Benchmark Result" in text and "P99 TTFT (ms):" in text
    doc = json.loads(out["json"].read_text())
    for key in ("request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                "p99_e2el_ms", "request_goodput", "mean_batch_size", "peak_batch_size",
                "mean_kv_cache_utilization", "preemptions", "j_per_output_token",
                "j_per_request", "usd_per_1m_output_tokens"):
        assert doc[key] is not None, key
    rows = list(csv.DictReader(out["csv"].read_text().splitlines()))
    assert len(rows) == 40 and float(rows[0]["ttft_ms"]) > 0
    events = json.loads(out["trace"].read_text())["traceEvents"]
    steps = [e for e in events if e.get("name") == "step"]
    assert steps and all({"seqs", "decodes", "prefill_tokens"} <= set(e["args"]) for e in steps)
    assert all(b["ts"] >= a["ts"] for a, b in zip(steps, steps[1:]))


def test_sweep_compare_and_find_max_qps(capsys, config):
    code = run("--model", config, "--qps", "10:40:3", "--num_requests", "30",
               "--device_spec", "h100-sxm,a100-sxm4-80gb", "--prompt_length", "32",
               "--max_new_tokens", "4")
    text = capsys.readouterr().out
    assert code == 0 and text.count("h100-sxm") >= 3 and text.count("a100-sxm4-80gb") >= 3
    code = run("--model", config, "--find_max_qps", "--slo", "ttft=50ms,tpot=5ms",
               "--num_requests", "60", "--prompt_length", "32", "--max_new_tokens", "4")
    text = capsys.readouterr().out
    assert code == 0 and "highest QPS meeting ttft=50ms,tpot=5ms" in text


def test_plan_view(capsys, config):
    assert run("--model", config, "--plan", "--prompt_length", "100", "--max_new_tokens",
               "28") == 0
    text = capsys.readouterr().out
    # 128 tokens of context = 8 blocks; KV 128 B a token (2 x 2 x 2 x 8 x 2 B)
    assert "128 B a token" in text and "largest batch at 128 tokens of context" in text


def test_plots(capsys, config, tmp_path):
    pytest.importorskip("matplotlib")
    code = run("--model", config, "--qps", "10,20", "--num_requests", "20", "--prompt_length",
               "32", "--max_new_tokens", "4", "--plot", tmp_path)
    capsys.readouterr()
    assert code == 0
    names = {p.name for p in tmp_path.iterdir()}
    stem = "serve_tiny_h100-sxm"  # what they show: the command, the model, the device
    assert {f"{stem}_latency_cdf.png", f"{stem}_latency_cdf.svg",
            f"{stem}_throughput_latency.png", f"{stem}_throughput_latency.svg"} <= names


@pytest.mark.parametrize("flags, label, execution", [
    (("--execution", "cudagraphs"), "predicted, cudagraphs", "cudagraphs"),
    (("--compile",), "predicted, compiled", "compiled"),
    (("--execution", "bound"), "roofline bound", "bound"),
    ((), "predicted, cudagraphs", "cudagraphs")])  # vLLM's default on a GPU
def test_the_regime_is_named_in_text_and_json(capsys, config, tmp_path, flags, label, execution):
    path = tmp_path / "r.json"
    code = run("--model", config, "--qps", "20", "--num_requests", "10", "--prompt_length", "32",
               "--max_new_tokens", "4", "--save_path", path, *flags)
    assert code == 0
    assert f"step costs: {label}" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert doc["step_costs"] == label and doc["execution"] == execution


PIM_FILE = """devices:
  pim-dimms:
    device_type: pim
    vram_GB: 8
    bandwidth_GBs: 409.6
    tflops: {bfloat16: 20}
    mem_pj_per_bit: 0.95
    host_to_device_bw_GBs: 12.8
    device_to_host_bw_GBs: 51.2
    source: "a test part: pim-ai-4chip's figures (upmem.yaml), 8 GB assumed"
"""


@pytest.mark.parametrize("flags, execution, labels", [
    (("--execution", "eager"), "eager",
     "predicted, eager; predicted, eager, under a placement"),
    (("--execution", "cudagraphs"), "cudagraphs",
     "predicted, cudagraphs; predicted, cudagraphs, under a placement"),
    (("--execution", "bound"), "bound", "roofline bound; roofline bound under a placement")])
def test_a_gpu_beside_a_host_and_pim_placement(capsys, config, tmp_path, flags, execution,
                                                labels):
    # one rule for every deployment of the table when --execution is given
    spec = write(tmp_path, "pim.yaml", PIM_FILE)
    mapping = write(tmp_path, "pim_map.yaml", f"TransformerBlock: {spec}:pim-dimms\n"
                                              f"output: {spec}:pim-dimms\n")
    code = run("--model", config, "--device_spec", "h100-sxm", "--mapping", mapping,
               "--host", "generic-cpu", "--find_max_qps", "--slo", "ttft=50ms,tpot=5ms",
               "--num_requests", "40", "--prompt_length", "32", "--max_new_tokens", "4",
               "--usd_per_hour", "2", "--save_path", tmp_path / "both.json", *flags)
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"step costs: {labels}" in text
    rows = json.loads((tmp_path / "both.json").read_text())
    assert [r["deployment"] for r in rows] == ["h100-sxm", "placement pim_map.yaml"]
    assert all(r["execution"] == execution and r["j_per_output_token"] > 0
               and r["usd_per_1m_output_tokens"] > 0 for r in rows)
    assert run("--model", config, "--mapping", mapping, "--host", "generic-cpu", "--plan") == 0
    text = capsys.readouterr().out
    # the host holds the embedding (64 x 32 x 2 B), pim-dimms the rest and the KV cache
    assert "host: memory 16.00 GB, weights 0.00 GB, no KV cache" in text
    assert "pim-dimms: memory 8.00 GB" in text and "KV 128 B a token" in text


@pytest.mark.parametrize("model, load, expected", [
    ("mixtral-8x7b", "9,1,1,1,1,1,1,1", "--expert_load: expert 0's share 0.562 of the routed "
                                        "rows exceeds 1/k = 0.5"),
    ("mixtral-8x7b", "1,1", "--expert_load has 2 weights, but this model routes over 8 experts"),
    ("mixtral-8x7b", "hot", "--expert_load 'hot': expected 'balanced' or comma-separated"),
    ("llama-3-8b", "1,1", "--expert_load 1,1: this model has no experts"),
])
def test_a_bad_expert_load_is_refused_before_counting(capsys, model, load, expected):
    err = one_line_error(capsys, run("--model", model, "--qps", "1", "--expert_load", load))
    assert expected in err
