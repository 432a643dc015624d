"""--html PATH on count, sweep, serve and plan (report/html.py, html_serving.py): one
self-contained page (no script, nothing fetched), each chart an <svg> with its id, each point
group a gid holding one <use> per point, as many as the data has; bad paths and a missing
matplotlib refused in one line (exit code 2) before any work. tests/test_html_browser.py
opens the same pages in a real browser."""
import json
import re
import sys
from html.parser import HTMLParser

import pytest

from perfcounter.cli.main import main
from perfcounter.serve import cache_clear, cache_info

TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}
CHARTS = {"count": ["count-roofline", "count-layers"],
          "sweep": ["sweep-chart"],
          "serve": ["serve-ttft", "serve-itl", "serve-batch", "serve-kv", "serve-power"],
          "plan": ["plan-tpot", "plan-ttft"]}


def commands(folder, model: str) -> dict:
    """Each command's argv (the smallest that draws every chart), writing FOLDER/NAME.html."""
    serve = ["serve", "--model", model, "--device_spec", "h100-sxm", "--qps", "4",
             "--num_requests", "8", "--prompt_length", "32", "--max_new_tokens", "8",
             "--save_path", str(folder / "serve.json")]
    plan = ["plan", "--model", model, "--devices", "h100-sxm:1", "--qps", "50",
            "--num_requests", "24", "--prompt_length", "32", "--max_new_tokens", "8",
            "--quantize", "none", "--kv_dtype", "none,fp8", "--max_num_seqs", "4",
            "--slo", "ttft=50ms,tpot=2ms", "--workers", "1",
            "--save_path", str(folder / "plan.json")]
    count = ["count", "--model", model, "--prompt_length", "8", "--max_new_tokens", "3",
             "--device_spec", "h100-sxm"]
    sweep = ["sweep", "--model", model, "--batch_size", "1,2", "--prompt_length", "8",
             "--max_new_tokens", "3", "--device_spec", "h100-sxm,a100-sxm4-80gb"]
    return {name: [*argv, "--html", str(folder / f"{name}.html")]
            for name, argv in (("count", count), ("sweep", sweep), ("serve", serve),
                               ("plan", plan))}


def build_pages(folder) -> dict:
    """{command: its page's path}, each written by the command line."""
    model = folder / "tiny.json"
    model.write_text(json.dumps(TINY))
    for name, argv in commands(folder, str(model)).items():
        assert main(argv=argv) == 0, name
    return {name: folder / f"{name}.html" for name in CHARTS}


class _Points(HTMLParser):
    """<svg id> and <g id> elements, and the <use> (one a point) inside each <g id>."""

    def __init__(self):
        super().__init__()
        self.svgs, self.points, self.open = [], {}, []  # open: [(tag, gid or None)]

    def handle_starttag(self, tag, attrs):
        gid = dict(attrs).get("id")
        if tag == "svg" and gid:
            self.svgs.append(gid)
        if tag == "g" and gid:
            self.points.setdefault(gid, 0)
        if tag == "use":
            for _, g in self.open:
                if g is not None:
                    self.points[g] += 1
        if tag not in ("use", "path", "rect", "stop", "image"):  # not always closed in a DOM
            self.open.append((tag, gid if tag == "g" else None))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in ("use", "path", "rect", "stop", "image"):
            self.open.pop()

    def handle_endtag(self, tag):
        if tag in ("use", "path", "rect", "stop", "image"):
            return
        while self.open and self.open.pop()[0] != tag:
            pass


def points_by_gid(html: str) -> tuple[list[str], dict[str, int]]:
    """(the ids of the page's <svg> charts, {gid: points under it}) of an HTML text."""
    parser = _Points()
    parser.feed(html)
    return parser.svgs, parser.points


def expected_points(folder) -> dict[str, int]:
    """The points each gid should hold, from the commands' own JSON and arguments."""
    serve = json.loads((folder / "serve.json").read_text())
    plan = json.loads((folder / "plan.json").read_text())
    ran = [c for c in plan["candidates"] if c["fits"] and "error" not in c
           and c.get("median_tpot_ms") is not None]
    steps = serve["steps"]  # one point a step (fewer than MAX_POINTS here)
    out = {"serve-ttft-0": 8,  # 8 requests, one TTFT each
           "serve-itl-0": 8 * (8 - 1),  # 8 tokens each: 7 gaps between them
           "serve-batch-0": steps, "serve-kv-0": steps, "serve-power-0": steps,
           "plan-tpot-candidates": len(ran), "plan-ttft-candidates": len(ran),
           "plan-tpot-front": len(plan["pareto_front"]),
           "plan-tpot-pick": int(plan["recommended"] is not None)}
    for phase in ("prefill", "decode"):
        out[f"count-roofline-{phase}"] = 1  # the phase: one point
        for what in ("flops", "bytes"):
            out[f"count-layers-{what}-{phase}"] = 2 + 1  # 2 layers, then outside them
        for device in ("h100-sxm", "a100-sxm4-80gb"):
            out[f"sweep-chart-latency-{device}-{phase}"] = 2  # batch 1 and 2
            out[f"sweep-chart-energy-{device}-{phase}"] = 2
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("html")
    return folder, build_pages(folder)


@pytest.mark.slow  # the pages: four commands run (~20 s)
def test_each_page_holds_its_charts_and_every_point(pages):
    folder, paths = pages
    expected = expected_points(folder)
    for name, path in paths.items():
        svgs, points = points_by_gid(path.read_text(encoding="utf-8"))
        assert svgs == CHARTS[name], name
        for gid, n in expected.items():
            if gid.startswith(name):
                assert points.get(gid) == n, (gid, points.get(gid), n)
    serve = json.loads((folder / "serve.json").read_text())
    assert serve["steps"] > 8 and serve["j_per_output_token"] is not None  # power is drawn


@pytest.mark.slow  # the pages: four commands run (~20 s)
def test_a_page_needs_no_network_and_runs_no_script(pages):
    _, paths = pages
    for path in paths.values():
        html = path.read_text(encoding="utf-8")
        assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
        assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|url\(\s*['\"]?http", html)
        # every reference is inside the page: xlink:href="#id", url(#id)
        assert all(ref.startswith("#") for ref in re.findall(r'href="([^"]*)"', html))
        ids = re.findall(r'\bid="([^"]+)"', html)
        assert len(set(ids)) == len(ids)  # no two charts share an id (glyphs, markers, clips)


@pytest.mark.slow  # the pages: four commands run (~20 s)
def test_plan_marks_the_pick_and_draws_the_slo(pages):
    folder, paths = pages
    plan = json.loads((folder / "plan.json").read_text())
    html = paths["plan"].read_text(encoding="utf-8")
    assert 'id="plan-tpot-slo"' in html and 'id="plan-ttft-slo"' in html
    if plan["recommended"] is not None:
        assert html.count("<tr class=pick>") == 1
    assert plan["launch_command"] in html  # the printed text heads the page


def _one_line(capsys, code, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"perfcounter {command}: error: ") and "\n" not in err
    return err


@pytest.mark.parametrize("command", ["count", "sweep", "serve", "plan"])
def test_bad_html_paths_are_refused_before_any_work(tmp_path, capsys, command):
    argv = commands(tmp_path, "smollm2-135m")[command][:-2]
    cache_clear()
    for path, says in ((tmp_path, "is a directory"),
                       (tmp_path / "no" / "page.html", "does not exist"),
                       ("/dev/null", "is not a regular file")):
        err = _one_line(capsys, main(argv=[*argv, "--html", str(path)]), command)
        assert f"--html {path}" in err and says in err, err
    assert cache_info().counts == 0  # refused while parsing: no step table counted
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("command", ["count", "sweep", "serve", "plan"])
def test_html_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch, command):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    page = tmp_path / "page.html"
    err = _one_line(capsys, main(argv=[*commands(tmp_path, "smollm2-135m")[command][:-2],
                                       "--html", str(page)]), command)
    assert err.endswith("--html needs matplotlib, an optional extra: "
                        "pip install 'perfcounter[plot]'")
    assert not page.exists()
