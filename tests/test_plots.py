"""perfcounter.report.plots: roofline plots, time / energy by module kind, the --plot and --trace
flags of the command lines; a one-line error without matplotlib or with a bad folder."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from conftest import tiny_args
from perfcounter.cli.main import main
from perfcounter.generation.config_only import count_config
from perfcounter.report.plots import (KINDS, PlotError, check_outputs, kind_rows, sweep_plots,
                                      write_plots)
from perfcounter.simulation.run import simulate

pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def counted():
    return count_config(tiny_args(), batch_size=1, prompt_length=8, new_tokens=3,
                        device_spec="h100-sxm")


def test_kind_rows_add_up_to_the_prediction_and_the_energy(counted):
    rows = kind_rows(counted, ["h100-sxm", "pim-ai-4chip"])
    assert {r["kind"] for r in rows} <= set(KINDS)
    for label, stats in counted.counts.items():
        for device in ("h100-sxm", "pim-ai-4chip"):
            mine = [r for r in rows if r["phase"] == label and r["device"] == device]
            on = stats.on(device)
            # the kinds split the predicted latency (ops, eager, + host link) and the energy
            assert sum(r["time_s"] for r in mine) == pytest.approx(on.predicted_latency)
            # neither spec gives op_overhead_s: DEFAULT_OVERHEAD_S, 8 us per op call (cuda;
            # pim-ai-4chip's device_type has no row and takes cuda's), well above the bound
            pred, dispatch = on.prediction("eager"), on.prediction("eager").op_calls * 8e-6
            # a GPU runs its kernels while the host dispatches: only the excess shows
            shown = max(dispatch - pred.work_s, 0) if device == "h100-sxm" else dispatch
            assert pred.overhead_s == pytest.approx(shown)
            assert sum(r["time_s"] for r in mine) > on.roofline_latency
            assert sum(r["energy_j"] for r in mine) == pytest.approx(on.energy_j)
            kinds = {r["kind"] for r in mine if r["time_s"]}
            assert {"attention", "mlp", "norm", "embedding", "lm_head"} <= kinds


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_write_plots_writes_png_and_svg(counted, tmp_path):
    files = write_plots(tmp_path, counted, ["h100-sxm", "pim-ai-4chip"])
    names = sorted(p.name for p in files)
    # 2 rooflines + time + energy, each twice = 8; the names say the source and the devices
    assert names == sorted(f"{n}.{ext}" for n in (
        "count_h100-sxm_roofline", "count_pim-ai-4chip_roofline",
        "count_h100-sxm+pim-ai-4chip_time_by_kind", "count_h100-sxm+pim-ai-4chip_energy_by_kind")
        for ext in ("png", "svg"))
    for p in files:
        data = p.read_bytes()
        assert data.startswith(PNG) if p.suffix == ".png" else b"<svg" in data[:2000]
    svg = (tmp_path / "count_h100-sxm_roofline.svg").read_text()
    assert "h100-sxm" in svg and "prefill (predicted)" in svg  # fonts as text: labels readable
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left over


def test_roofline_points_at_predicted_or_measured_flops(counted, tmp_path):
    from perfcounter import get_device_spec
    from perfcounter.report.plots import _points
    spec = get_device_spec("h100-sxm")
    stats = counted.counts["prefill"]
    pred = stats.on(spec).prediction("eager")
    flops, nbytes = stats.trace.executed_flops, stats.trace.per_op_bytes
    phase = _points(stats, spec, {}, top=3)[0]
    # not timed: FLOPs / the sum of the ops' predicted seconds (the host link is no op)
    assert phase[:3] == ("prefill (predicted)", "phase", flops / nbytes)
    assert phase[3] == pytest.approx(flops / (pred.overhead_s + pred.work_s))
    assert phase[3] < flops / stats.on(spec).roofline.ops_s  # below the roofline's point
    label, _, _, y = _points(stats, spec, {"prefill": 1e-3}, top=3)[0]
    assert (label, y) == ("prefill (measured)", pytest.approx(flops / 1e-3))  # 1 ms given
    write_plots(tmp_path, counted, ["h100-sxm"], name="tiny")
    assert "predicted time" in (tmp_path / "tiny_h100-sxm_time_by_kind.svg").read_text()  # axis
    assert "predicted time" not in (tmp_path / "tiny_h100-sxm_energy_by_kind.svg").read_text()


def test_simulation_bars(counted, tmp_path):
    sim = simulate(counted, {"attention": "pim-ai-4chip,t"}, host="generic-cpu",
                   default_device="host")
    rows = kind_rows(sim)
    assert {r["device"] for r in rows} == {"host", "pim-ai-4chip"}
    assert {r["kind"] for r in rows if r["device"] == "pim-ai-4chip"} >= {"attention",
                                                                           "transfers"}
    for label, phase in sim.phases.items():  # the log rows are the phase's time, no overlap
        total = sum(r["time_s"] for r in rows if r["phase"] == label)
        assert total == pytest.approx(phase.time_s)
    files = write_plots(tmp_path, sim)  # time and energy bars, PNG and SVG
    assert sorted(p.name for p in files) == sorted(
        f"simulate_host+pim-ai-4chip_{m}_by_kind.{ext}" for m in ("time", "energy")
        for ext in ("png", "svg"))
    # the simulation's log is the roofline bound per module: the axis says so, not "predicted"
    svg = (tmp_path / "simulate_host+pim-ai-4chip_time_by_kind.svg").read_text()
    assert "roofline-bound time" in svg and "predicted time" not in svg


def test_sweep_plots(tmp_path):
    rows = [dict(model="m", batch=b, prompt=8, new=2, device=d, phase=p, latency_s=t,
                 j_per_token=t * 10) for b in (1, 8) for d, t in (("a", 1e-3), ("b", 2e-3))
            for p in ("prefill", "decode")]
    assert sorted(p.name for p in sweep_plots(tmp_path, rows)) == [
        f"sweep_m_a+b_{m}.{ext}" for m in ("energy", "latency") for ext in ("png", "svg")]
    assert "roofline latency" in (tmp_path / "sweep_m_a+b_latency.svg").read_text()
    # rows with a prediction: bars of the predicted latency, the bound beside them as ticks
    rows = [dict(r, predicted_latency_s=r["latency_s"] * 3, execution="compiled") for r in rows]
    sweep_plots(tmp_path, rows)
    svg = (tmp_path / "sweep_m_a+b_latency.svg").read_text()
    assert "predicted latency, compiled" in svg and "roofline bound" in svg


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_cli_count_plot_and_trace(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(
        model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64)))
    out = tmp_path / "plots"
    assert main(argv=["count", "--config", str(config), "--prompt_length", "4", "--new_tokens",
                      "2", "--device_spec", "h100-sxm", "--plot", str(out), "--trace",
                      str(tmp_path / "t.json")]) == 0
    stem = f"count_{tmp_path.name}_h100-sxm"  # the command, the config's folder, the device
    assert (out / f"{stem}_roofline.png").is_file()  # plots/ made when written
    assert (out / f"{stem}_time_by_kind.svg").is_file()
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [e["name"] for e in doc["traceEvents"] if e.get("cat") == "phase"] == ["prefill",
                                                                                 "decode"]
    assert f"wrote {tmp_path / 't.json'}" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--plot", "/nonexistent/dir/plots"], "--plot /nonexistent/dir/plots: folder "),
    (["--plot", "/etc/hostname"], "not a directory"),
    (["--trace", "/nonexistent/t.json"], "--trace /nonexistent/t.json: folder /nonexistent "
                                         "does not exist"),
    (["--trace", "/dev/null"], "not a regular file"),
])
@pytest.mark.parametrize("command", ["count", "simulate"])
def test_bad_paths_fail_in_one_line(command, flags, message, capsys, tmp_path):
    model = ["--model", "llama-2-7b"] if command == "count" else ["--model", "llama-2-7b"]
    assert main(argv=[command, *model, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_sweep_bad_plot_folder(capsys):
    assert main(argv=["sweep", "--model", "llama-2-7b", "--plot", "/nonexistent/x/y"]) == 2
    assert "--plot /nonexistent/x/y" in capsys.readouterr().err


def test_without_matplotlib(monkeypatch, tmp_path, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(PlotError, match=r"pip install 'perfcounter\[plot\]'"):
        check_outputs(tmp_path)
    assert check_outputs(None, tmp_path / "t.json") == (None, tmp_path / "t.json")  # no plot
    assert main(argv=["count", "--model", "llama-2-7b", "--plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_flags(tmp_path):
    spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with pytest.raises(gen.GenerateArgumentError, match="--plot .*: folder .* does not exist"):
        gen.main(model="llama-2-7b", quiet=True, plot=tmp_path / "no" / "such")
    gen.main(config=None, model="llama-2-7b", prompt_length=4, max_new_tokens=2, quiet=True,
             device_spec="h100-sxm", plot=tmp_path / "p", trace=tmp_path / "t.json")
    assert (tmp_path / "p" / "generate_llama-2-7b_h100-sxm_roofline.svg").is_file()
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["device"] == "h100-sxm"
