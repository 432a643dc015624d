"""vLLM's parallel flags on the command line (count, sweep, simulate, generate.py config only):
--tensor_parallel_size 1 changes nothing, a rank is counted from its sharded shapes, a model
that does not fit is said in one line, bad sizes are refused in one line (exit code 2)
before any counting."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfcounter.cli.main import main

REPO = Path(__file__).resolve().parent.parent

SMALL = ["count", "--model", "smollm2-135m", "--prompt_length", "8", "--max_new_tokens", "2",
         "--device_spec", "h100-sxm"]


def _without_wall_time(d):
    """The counter's own wall time of counting (overhead_s) differs from run to run."""
    if isinstance(d, dict):
        return {k: _without_wall_time(v) for k, v in d.items() if k != "overhead_s"}
    if isinstance(d, list):
        return [_without_wall_time(v) for v in d]
    return d


def _json(capsys, argv):
    assert main(argv=argv) == 0
    return json.loads(capsys.readouterr().out)


def test_tensor_parallel_size_1_is_byte_identical(capsys):
    base = _json(capsys, [*SMALL, "--json"])
    for extra in (["--tensor_parallel_size", "1"], ["--tp", "1", "--pp", "1", "--dp", "1"]):
        one = _json(capsys, [*SMALL, "--json", *extra])
        assert json.dumps(_without_wall_time(one), sort_keys=True) == \
            json.dumps(_without_wall_time(base), sort_keys=True)


def test_a_rank_is_counted_with_its_collectives(capsys):
    base = _json(capsys, [*SMALL, "--json"])
    three = _json(capsys, [*SMALL, "--json", "--tp", "3"])  # 9 heads, 3 KV heads, 1536 / 3
    text = json.dumps(three)
    assert "perfcounter.all_reduce.default" in text and "perfcounter.all_gather.default" in text
    assert "perfcounter.all_reduce" not in json.dumps(base)


def test_a_model_that_does_not_fit_is_said_in_one_line(capsys):
    argv = ["count", "--model", "llama-3.1-70b", "--prompt_length", "8", "--max_new_tokens", "2",
            "--device_spec", "h100-sxm"]
    assert main(argv=argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "does not fit" in ln]
    # 70,553,706,496 params x 2 B = 141.11 GB of weights on a part that reports 81559 MiB
    # = 85.52 GB
    assert lines == ["llama-3.1-70b does not fit on h100-sxm: weights 141.11 GB + KV cache "
                     "0.00 GB > 85.52 GB of memory; --tensor_parallel_size shards it"]
    assert main(argv=[*argv, "--tp", "2"]) == 0  # 70.56 GB a rank: fits
    out = capsys.readouterr().out
    assert "does not fit" not in out and "TP2: one rank counted" in out


@pytest.mark.parametrize("extra, message", [
    (["--tp", "2"], "--tensor_parallel_size 2 does not divide the 9 attention heads"),
    (["--enable_expert_parallel"], "--enable_expert_parallel: smollm2-135m is dense"),
    (["--tp", "0"], "--tensor_parallel_size 0: expected an integer >= 1"),
    (["--tp", "3", "--device_spec", "generic-cpu"], "has no link to another device"),
    (["--tp", "3", "--hf"], "--hf: perfcounter shards its own model"),
])
def test_bad_parallel_flags_are_one_line_exit_2(capsys, extra, message):
    assert main(argv=[*SMALL, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_sweep_prices_one_rank(capsys, tmp_path):
    argv = ["sweep", "--model", "smollm2-135m", "--batch_size", "1", "--prompt_length", "8",
            "--max_new_tokens", "2", "--device_spec", "h100-sxm"]
    rows = {}
    for name, extra in (("base", []), ("tp1", ["--tp", "1"]), ("tp3", ["--tp", "3"])):
        out = tmp_path / f"{name}.json"
        assert main(argv=[*argv, *extra, "--save_path", str(out)]) == 0
        rows[name] = json.loads(out.read_text())
    capsys.readouterr()
    assert rows["tp1"] == rows["base"]  # the same rows, no parallel column
    three = {r["phase"]: r for r in rows["tp3"]}
    base = {r["phase"]: r for r in rows["base"]}
    assert three["prefill"]["parallel"] == "TP3"
    # a rank's weights: about a third (9 heads, 3 KV heads, 1536 and 49152 / 3; norms whole)
    assert 0.3 < three["prefill"]["weights_bytes"] / base["prefill"]["weights_bytes"] < 0.36


def test_simulate_places_one_rank(capsys, tmp_path):
    argv = ["simulate", "--model", "smollm2-135m", "--prompt_length", "8", "--max_new_tokens",
            "2", "--default_device", "h100-sxm"]
    flops = {}
    for name, extra in (("base", []), ("tp3", ["--tp", "3"])):
        out = tmp_path / f"{name}.json"
        assert main(argv=[*argv, *extra, "--save_counts", str(out)]) == 0
        doc = json.loads(out.read_text())
        flops[name] = sum(r["flops"] for r in doc["prefill"]["trace"]["records"]
                          if r["op"] == "aten.mm.default")
    capsys.readouterr()
    # every matmul of a rank is a third of the model's: heads, KV heads, 1536 and vocab / 3
    assert flops["tp3"] * 3 == flops["base"]
    assert main(argv=[*argv, "--tp", "3", "--hf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "leave out --hf" in err[0]


def _generate(*argv):
    return subprocess.run([sys.executable, "generate.py", "--prompt_length", "8",
                           "--max_new_tokens", "2", "--device_spec", "h100-sxm", "--quiet", *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_generate_config_only_counts_one_rank(tmp_path):
    docs = {}
    for name, extra in (("base", []), ("tp1", ["--tp", "1"]), ("tp3", ["--tp", "3"])):
        out = tmp_path / f"{name}.json"
        run = _generate("--model", "smollm2-135m", "--save_path", str(out), *extra)
        assert run.returncode == 0, run.stderr
        docs[name] = json.loads(out.read_text())
    assert _without_wall_time(docs["tp1"]) == _without_wall_time(docs["base"])
    assert "perfcounter.all_reduce.default" in json.dumps(docs["tp3"])
    assert "perfcounter.all_reduce" not in json.dumps(docs["base"])


def test_generate_says_when_the_model_does_not_fit_and_refuses_bad_sizes():
    run = _generate("--model", "llama-3.1-70b")
    assert run.returncode == 0
    assert "llama-3.1-70b does not fit on h100-sxm: weights 141.11 GB" in run.stderr
    run = _generate("--model", "smollm2-135m", "--tp", "2")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "generate.py: error: --tensor_parallel_size 2 does not divide the 9 attention heads of "
        "smollm2-135m; valid: 1, 3"]


def test_serve_plan_names_the_smallest_tensor_parallel_size(capsys):
    argv = ["serve", "--model", "llama-3.1-70b", "--device_spec", "h100-sxm", "--plan"]
    assert main(argv=argv) == 0
    out = capsys.readouterr().out
    assert "does not fit" in out  # 141.11 GB of weights on 0.9 x 85.52 = 76.97 GB usable
    # TP 2: 2 x 35,277,512,704 params = 70.56 GB a rank (tests/test_parallel_serve.py)
    assert "smallest fit: --tensor_parallel_size 2 (bfloat16, 70.56 GB of weights a rank)" in out
    assert main(argv=[*argv, "--tp", "4"]) == 0
    assert "4 x h100-sxm (TP4)" in capsys.readouterr().out


def test_serve_runs_a_tensor_parallel_deployment(capsys):
    argv = ["serve", "--model", "smollm2-135m", "--device_spec", "h100-sxm", "--num_requests",
            "8", "--qps", "4", "--prompt_length", "32", "--max_new_tokens", "8"]
    assert main(argv=[*argv, "--tp", "3", "--dp", "2"]) == 0
    assert "6 x h100-sxm (TP3 DP2)" in capsys.readouterr().out
    assert main(argv=[*argv, "--tp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not divide the 9 attention heads" in err[0]


def test_collectives_reach_perfetto_and_the_priced_classes(capsys, tmp_path):
    trace = tmp_path / "rank.json"
    doc = _json(capsys, [*SMALL, "--json", "--tp", "3", "--trace", str(trace)])
    assert "perfcounter.all_reduce.default" in trace.read_text()  # a slice like any op's
    # the prediction prices them on NVLink in their own class (pricing/collectives.py)
    assert '"collective":' in json.dumps(doc) and '"collective":' not in json.dumps(
        _json(capsys, [*SMALL, "--json"]))


def test_simulate_needs_a_device_with_a_link_for_a_rank(capsys):
    argv = ["simulate", "--model", "smollm2-135m", "--prompt_length", "8", "--max_new_tokens",
            "2", "--tp", "3"]
    assert main(argv=argv) == 2  # unplaced modules run on the host, a CPU: no link
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give --default_device" in err[0]
