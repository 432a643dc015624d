"""Progress on every long job (issue 47, item 2): one bar (console.progress) on stderr with the
count, the rate and the time left, and the best answer so far; off where stderr is no terminal
(CI's output stays the same) or with --quiet; Ctrl-C of `plan` prints the best found so far
(exit code 130). A terminal is played by a stream whose isatty() is True."""
import io
import json
import sys

import pytest
import torch

from perfcounter import console
from perfcounter.cli.main import main
from perfcounter.devices.calibrate import calibrate
from perfcounter.plan import execute
from perfcounter.plan.search import Progress, plan

MB = 1 << 20
TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}
PLAN = ["--devices", "h100-sxm:1", "--qps", "50", "--num_requests", "24", "--prompt_length",
        "32", "--max_new_tokens", "8", "--quantize", "none", "--kv_dtype", "none,fp8",
        "--max_num_seqs", "2,4", "--slo", "ttft=50ms,tpot=2ms", "--workers", "1"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def use_terminal(monkeypatch) -> tuple[Terminal, list]:
    """stderr played by a terminal from here on (in the test's body: pytest sets its own
    capture as the test starts): what the bars write lands in it; and the bars made, kept
    (tqdm redraws at most every 0.1 s and a closed bar clears its line: its last count is
    read from the bar)."""
    stream, made, real = Terminal(), [], console.progress
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(console, "progress", lambda *a, **kw: made.append(real(*a, **kw))
                        or made[-1])
    return stream, made


# -- the helper ------------------------------------------------------------------------------
def test_the_bar_counts_to_its_total_on_a_terminal_and_writes_nothing_elsewhere():
    tty = Terminal()
    bar = console.progress(range(7), desc="job", unit="step", file=tty)
    assert list(bar) == list(range(7)) and bar.n == 7 == bar.total  # the count ends at the total
    written = tty.getvalue()
    assert "job:" in written and "/7" in written and "step/s" in written  # count, rate
    pipe = io.StringIO()  # no terminal: CI logs and pipes read as without a bar
    assert list(console.progress(range(7), desc="job", file=pipe)) == list(range(7))
    assert pipe.getvalue() == ""
    quiet = Terminal()  # --quiet: none on a terminal either
    assert list(console.progress(range(7), desc="job", file=quiet, quiet=True)) == list(range(7))
    assert quiet.getvalue() == ""


def test_a_bar_shows_the_time_left_and_the_best_so_far():
    tty = Terminal()
    bar = console.progress(total=4, desc="plan", unit="candidate", file=tty)
    bar.update(1)
    bar.set_postfix_str("best #3: 120 tok/s/GPU")
    bar.refresh()
    assert "<" in tty.getvalue()  # tqdm's "elapsed<left"
    assert "best #3: 120 tok/s/GPU" in tty.getvalue()
    bar.close()


def test_counting_counts_each_call_and_describes_its_result():
    tty = Terminal()
    twice = console.counting(lambda x: 2 * x, console.progress(total=3, file=tty, desc="runs"),
                             lambda r: f"last {r}")
    assert [twice(i) for i in range(3)] == [0, 2, 4]
    twice.bar.refresh()  # tqdm redraws at most every 0.1 s: the last state drawn now
    assert twice.bar.n == 3 == twice.bar.total and "last 4" in tty.getvalue()


def test_waiting_shows_a_step_that_counts_nothing_only_on_a_terminal():
    tty, pipe = Terminal(), io.StringIO()
    with console.waiting("loading model.gguf", file=tty):
        pass
    with console.waiting("loading model.gguf", file=pipe):
        pass
    assert "loading model.gguf" in tty.getvalue() and pipe.getvalue() == ""


# -- plan: the candidates, the best so far, Ctrl-C ------------------------------------------
class Heard(Progress):
    def __init__(self):
        self.total, self.done_at = None, []

    def start(self, total):
        self.total = total

    def done(self, index, candidate, figures):
        self.done_at.append(index)


def test_a_search_tells_its_progress_of_every_candidate(tiny):
    heard = Heard()
    result = plan(tiny, "h100-sxm:1", slo="ttft=50ms,tpot=2ms", qps=50.0, num_requests=24,
                  prompt_length="32", max_new_tokens="8", quantizations=("none",),
                  kv_cache_dtypes=("none", "fp8"), max_num_seqs=(2, 4), backend="serial",
                  progress=heard)
    # every simulated candidate heard of once, its index in the result's candidates
    assert heard.total == result.simulated == len(heard.done_at) == 4
    assert sorted(heard.done_at) == [i for i, ok in enumerate(result.fits) if ok]


def test_plans_bar_counts_the_candidates_and_shows_the_best_meeting_the_slo(tiny, monkeypatch,
                                                                           capsys):
    terminal, bars = use_terminal(monkeypatch)
    assert main(argv=["plan", "--model", tiny, *PLAN]) == 0
    (bar,) = bars
    assert bar.n == bar.total == 4 and "plan:" in terminal.getvalue()  # the count ends at 4
    assert "0/4" in terminal.getvalue() and "candidate/s" in terminal.getvalue()
    best = bar.postfix or ""  # the best so far that meets the SLO, where one does
    assert "tok/s/GPU goodput meeting the SLO" in best or "recommended: none" in \
        capsys.readouterr().out
    terminal.seek(0), terminal.truncate()
    assert main(argv=["plan", "--model", tiny, *PLAN, "--quiet"]) == 0
    assert terminal.getvalue() == ""  # --quiet: no bar


def test_ctrl_c_prints_the_best_plan_found_so_far_and_exits_130(tiny, capsys, monkeypatch):
    evaluate, calls = execute.evaluate, []

    def interrupted(c, job):  # the third candidate's simulation: Ctrl-C
        calls.append(c)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return evaluate(c, job)
    monkeypatch.setattr(execute, "evaluate", interrupted)
    loose = [*PLAN[:-4], "--slo", "ttft=10s,tpot=1s", "--workers", "1"]  # every one meets it
    assert main(argv=["plan", "--model", tiny, *loose]) == 130
    out = capsys.readouterr().out
    assert out.startswith("plan: interrupted after 2 of 4 candidates simulated; the best so far "
                          "that meets the SLO (goodput per GPU): #")
    assert "goodput/GPU" in out  # the candidate's row, as the recommendation prints it
    assert "Pareto front" not in out  # no result: the search did not end


def test_ctrl_c_before_any_candidate_meets_the_slo_says_so(tiny, capsys, monkeypatch):
    def interrupted(c, job):
        raise KeyboardInterrupt
    monkeypatch.setattr(execute, "evaluate", interrupted)
    assert main(argv=["plan", "--model", tiny, *PLAN]) == 130
    assert capsys.readouterr().out.strip() == ("plan: interrupted after 0 of 4 candidates "
                                               "simulated; none of them meets the SLO")


# -- serve, sweep, the machine measurement ---------------------------------------------------
SERVE = ["serve", "--model", "llama-3-8b", "--device_spec", "h100-sxm", "--num_requests", "20",
         "--prompt_length", "64", "--max_new_tokens", "8"]


def test_serves_bar_counts_its_runs_with_requests_and_simulated_time(monkeypatch, capsys):
    terminal, bars = use_terminal(monkeypatch)
    assert main(argv=[*SERVE, "--qps", "1,2"]) == 0
    (bar,) = bars
    assert bar.n == bar.total == 2 and "serve:" in terminal.getvalue()
    assert bar.postfix.startswith("20 requests, ") and bar.postfix.endswith(" s simulated")
    on_terminal = capsys.readouterr().out
    terminal.seek(0), terminal.truncate()
    assert main(argv=[*SERVE, "--qps", "1,2", "--quiet"]) == 0
    assert terminal.getvalue() == "" and capsys.readouterr().out == on_terminal


def test_serve_and_sweep_print_the_same_without_a_terminal(capsys):
    assert main(argv=[*SERVE, "--qps", "1"]) == 0
    first = capsys.readouterr()
    assert first.err == ""  # captured stderr is no terminal: no bar
    sweep = ["sweep", "--model", "llama-3-8b", "--batch_size", "1", "--prompt_length", "16",
             "--max_new_tokens", "4", "--device_spec", "h100-sxm"]
    assert main(argv=sweep) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    assert main(argv=[*sweep, "--quiet"]) == 0
    assert capsys.readouterr().out == plain.out


def test_the_measurement_counts_its_parts_to_the_total(monkeypatch):
    terminal, bars = use_terminal(monkeypatch)
    cal = calibrate(array_bytes=1 * MB, repeats=1, matmul_n=32, dtypes=("float32",),
                    min_time=0.01, rounds=1, retries=0, compiled=False, curves=False,
                    budget_s=1e6)
    assert cal.flops[torch.float32] > 0
    (bar,) = bars
    assert bar.n == bar.total == 1  # the one unit: flops float32
    assert "measuring this machine" in terminal.getvalue() and "flops float32" in bar.postfix
    terminal.seek(0), terminal.truncate()
    calibrate(array_bytes=1 * MB, repeats=1, matmul_n=32, dtypes=("float32",), min_time=0.01,
              rounds=1, retries=0, compiled=False, curves=False, progress=False)
    assert terminal.getvalue() == ""  # generate.py --quiet: none
