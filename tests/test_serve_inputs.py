"""serve's inputs: lengths, counts, rates and horizons bounded with the bound named, every
flag a run would ignore or misread refused, trace files read as spreadsheets save them;
each refusal one line, exit code 2, before any step table is counted."""
import json

import pytest

from perfcounter.cli import serve as command
from perfcounter.cli.main import build_parser
from perfcounter.serve import cache_clear, cache_info
from perfcounter.serve.outputs import write_all

TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def run(*argv):
    try:
        args = build_parser().parse_args(["serve", "--device_spec", "h100-sxm",
                                          *(str(a) for a in argv)])
    except SystemExit as exc:
        return exc.code
    return command.run(args)


def refused(capsys, code) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("perfcounter serve: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    return err


def trace(tmp_path, text, name="t.jsonl", data=None):
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("argv, expected", [
    (("--qps", "1:2:1000000000"), "COUNT 1000000000; expected 1 to 100 rates"),
    (("--qps", ",".join(["1"] * 101)), "101 rates; at most 100"),
    (("--qps", "5", "--num_requests", "1000000000"), "--num_requests 1000000000: expected an "
                                                     "integer in [1, 1,000,000]"),
    (("--qps", "5", "--prompt_length", "normal:100,1e300"), "STD beyond the context of 1,023"),
    (("--qps", "5", "--prompt_length", "99999999999999999999"), "beyond the context of 1,023"),
    (("--qps", "5", "--max_new_tokens", "uniform:1-5000"), "HI 5,000 beyond the context"),
    (("--qps", "5", "--prompt_length", "900", "--max_new_tokens", "200"),
     "exceed the model's context of 1,024"),
    (("--qps", "1e-300"), "--qps 1e-300: expected a rate in [0.0001, 1e+09]"),
    (("--qps", "0.001", "--num_requests", "100000"), "beyond the 1e+07 s a run may span"),
    (("--qps", "5", "--slo", "ttft=1s,ttft=2s"), "ttft given twice"),
    (("--qps", "5", "--slo_attainment", "2"), "--slo_attainment: only --find_max_qps reads it"),
    (("--find_max_qps", "--slo", "ttft=1s", "--slo_attainment", "0"),
     "--slo_attainment 0.0: expected a fraction in [0.01, 1]"),
    (("--find_max_qps", "--slo", "ttft=1s", "--qps", "5"), "--qps: --find_max_qps searches"),
    (("--find_max_qps", "--slo", "ttft=1s", "--concurrency", "4"), "a closed loop has none"),
    (("--qps", "5", "--burstiness", "0"), "--burstiness 0.0: expected a number in (0, 1000]"),
    (("--qps", "5", "--seed", "-1"), "--seed -1: expected an integer in [0, 2**63)"),
    (("--qps", "5", "--block_size", "1000000000"),
     "--block_size 1000000000: expected an integer in [1, 65,536] tokens a KV block"),
    (("--qps", "5", "--max_num_seqs", "0"), "--max_num_seqs 0: expected an integer"),
    (("--qps", "5", "--engine", "tgi"), "invalid choice: 'tgi'"),
    (("--plan", "--plan_batch", "0"), "--plan_batch 0: expected an integer in [1,"),
    (("--plan", "--plan_context", "-5"), "--plan_context -5: expected an integer in [1,"),
    (("--qps", "5", "--plan_batch", "8"), "--plan_batch: only --plan reads it"),
])
def test_refused_in_one_line_before_counting(capsys, config, argv, expected):
    cache_clear()
    code = run("--model", config, *argv)
    if code == 2 and "invalid choice" in expected:  # argparse's own line
        assert expected in capsys.readouterr().err
        return
    assert expected in refused(capsys, code)
    assert cache_info().misses == 0  # no step table was counted


@pytest.mark.parametrize("flag", ["--csv", "--trace", "--save_path"])
def test_files_beside_plan_are_refused(capsys, config, tmp_path, flag):
    err = refused(capsys, run("--model", config, "--plan", flag, tmp_path / "x"))
    assert f"{flag}: --plan prints the memory fit and simulates nothing" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("text, expected", [
    ('{"arrival_time": 0, "prompt_tokens": 1e30, "output_tokens": 2}\n',
     "prompt_tokens 1e+30 beyond 10,000,000 tokens"),
    ('{"arrival_time": 0, "prompt_tokens": 4, "output_tokens": 2}\n'
     '{"arrival_time": 1e300, "prompt_tokens": 4, "output_tokens": 2}\n',
     "request 2: arrival_time 1e+300 beyond the 1e+07 s a run may span"),
    ('{"arrival_time": 0, "prompt_tokens": true, "output_tokens": 2}\n',
     "prompt_tokens True is not a number"),
    ('{"arrival_time": 0, "prompt_tokens": 1000, "output_tokens": 100}\n',
     "exceed the model's context of 1024"),
])
def test_bad_traces_before_counting(capsys, config, tmp_path, text, expected):
    cache_clear()
    assert expected in refused(capsys, run("--model", config, "--trace_file",
                                           trace(tmp_path, text)))
    assert cache_info().misses == 0


def test_flags_a_trace_would_ignore_are_refused(capsys, config, tmp_path):
    path = trace(tmp_path, '{"arrival_time": 0, "prompt_tokens": 4, "output_tokens": 2}\n')
    for argv in (("--qps", "5"), ("--num_requests", "10"), ("--prompt_length", "8")):
        err = refused(capsys, run("--model", config, "--trace_file", path, *argv))
        assert f"{argv[0]}: --trace_file gives every request's arrival and lengths" in err


def test_an_undecodable_trace_is_named(capsys, config, tmp_path):
    path = trace(tmp_path, None, "t.csv", data=b"\xff\xfe\x00binary\x80")
    err = refused(capsys, run("--model", config, "--trace_file", path))
    assert f"--trace_file {path}: not UTF-8 text" in err


def test_a_spreadsheets_csv_with_a_byte_order_mark_is_read(capsys, config, tmp_path):
    path = trace(tmp_path, None, "t.csv", data="\ufeffarrival_time,prompt_tokens,output_tokens\n"
                 "0,8,2\n0.5,16,3\n".encode("utf-8"))
    out = tmp_path / "r.json"
    assert run("--model", config, "--trace_file", path, "--save_path", out) == 0, \
        capsys.readouterr().err
    doc = json.loads(out.read_text())
    # 8 + 16 prompt tokens, 2 + 3 output tokens
    assert (doc["total_input_tokens"], doc["total_output_tokens"]) == (24, 5)


def test_one_token_requests_have_no_tpot_in_the_json(capsys, config, tmp_path):
    out = tmp_path / "r.json"
    assert run("--model", config, "--qps", "5", "--num_requests", "20", "--max_new_tokens", "1",
               "--save_path", out) == 0
    doc = json.loads(out.read_text())
    assert doc["mean_tpot_ms"] is None and doc["p99_tpot_ms"] is None
    assert doc["mean_itl_ms"] is None and doc["mean_ttft_ms"] > 0


def test_the_three_files_are_replaced_together(tmp_path):
    a, b, c = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "folder"
    a.write_text("old json")
    b.write_text("old csv")
    c.mkdir()  # a target that cannot be written: nothing is replaced
    with pytest.raises(OSError):
        write_all({a: "new json", b: "new csv", c: "new trace"})
    assert (a.read_text(), b.read_text()) == ("old json", "old csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "r.csv", "r.json"]
    write_all({a: "new json", b: "new csv"})
    assert (a.read_text(), b.read_text()) == ("new json", "new csv")
