"""perfcounter.report.trace_events: a generation as Chrome / Perfetto trace-event JSON. The format
is validated as ui.perfetto.dev reads it: required keys, microseconds, timestamps that
never go back, slices that nest properly on each thread."""
import json

import pytest
import torch

from conftest import tiny_args
from perfcounter import TransformerPerformanceCounter, get_device_spec
from perfcounter.generation.config_only import count_config, greedy_generate
from perfcounter.simulation.run import simulate
from perfcounter.report.trace_events import trace_events, write_trace


def check_format(doc: dict) -> list[dict]:
    """Every rule of the trace-event format perfcounter relies on; returns the X events."""
    assert set(doc) >= {"traceEvents"} and isinstance(doc["traceEvents"], list)
    json.dumps(doc, allow_nan=False)  # plain JSON, no NaN
    events = doc["traceEvents"]
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e), e
        assert e["ph"] in ("X", "M", "C") and isinstance(e["name"], str)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] > 0
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    timed = [e for e in events if e["ph"] != "M"]
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)  # monotonic
    slices = [e for e in events if e["ph"] == "X"]
    stacks: dict[tuple, list] = {}
    for e in slices:  # in file order: each slice inside the open one, or after it
        start, end = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)  # µs -> ns
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        while stack and stack[-1][1] <= start:
            stack.pop()
        assert not stack or end <= stack[-1][1], (e, stack[-1])
        stack.append((start, end, e["name"]))
    return slices


@pytest.fixture(scope="module")
def counted():
    return count_config(tiny_args(), batch_size=2, prompt_length=16, new_tokens=3,
                        device_spec="h100-sxm")


def test_one_device_trace(counted):
    doc = trace_events(counted)
    slices = check_format(doc)
    spec = get_device_spec("h100-sxm")
    phases = [e for e in slices if e["cat"] == "phase"]
    assert [p["name"] for p in phases] == ["prefill", "decode"]
    ops = [e for e in slices if e["cat"] == "op"]
    for p in phases:  # units: µs; a phase lasts the sum of its ops' predictions, to 1 ns
        on = counted.counts[p["name"]].on(spec)
        pred = on.prediction("eager")  # predict.predict, less the host link (not drawn)
        assert p["dur"] == pytest.approx((pred.overhead_s + pred.work_s) * 1e6, abs=1e-3)
        # h100-sxm gives no op_overhead_s: DEFAULT_OVERHEAD_S cuda eager, 8 us per op call,
        # of which a GPU shows what its kernels do not hide: max(0, calls x 8 us - work); the
        # tiny model's ops are so small that the overhead is nearly all of it
        assert pred.overhead_s == pytest.approx(max(pred.op_calls * 8e-6 - pred.work_s, 0.0))
        assert p["args"]["predicted_s"] == pytest.approx(p["dur"] * 1e-6, abs=1e-9)
        assert p["args"]["roofline_s"] == pytest.approx(on.roofline.ops_s)  # the bound
        mine = [e for e in ops if p["ts"] <= e["ts"] < p["ts"] + p["dur"]]
        assert sum(e["args"]["predicted_s"] for e in mine) == pytest.approx(
            p["args"]["predicted_s"])  # every priced op call is drawn, views included
        assert sum(e["args"]["roofline_s"] for e in mine) == pytest.approx(on.roofline.ops_s)
    assert not any(e["name"].startswith("prim.") for e in ops)  # 0 s: no slice
    assert all(e["args"]["predicted_s"] > e["args"]["roofline_s"] for e in ops)
    assert phases[1]["ts"] == pytest.approx(phases[0]["ts"] + phases[0]["dur"], abs=1e-3)
    assert phases[1]["args"]["steps"] == 2  # 3 new tokens: the prefill's and 2 decode steps
    modules = {e["name"] for e in slices if e["cat"] == "module"}
    assert {"layers.0", "layers.1", "attention", "feed_forward", "output"} <= modules
    assert any(e["name"].startswith("mm") or e["name"].startswith("addmm") for e in ops)
    # counters climb to the phase's FLOPs: prefill + decode executed FLOPs
    flops = [e["args"]["FLOPs"] for e in doc["traceEvents"] if e["name"] == "FLOPs"]
    assert flops == sorted(flops)
    total = sum(s.trace.executed_flops for s in counted.counts.values())
    assert flops[-1] == pytest.approx(total)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"h100-sxm (predicted)", "predicted"}


def test_measured_thread_on_a_real_run(tiny_model, tmp_path):
    counter = TransformerPerformanceCounter(device_spec="h100-sxm")
    greedy_generate(tiny_model, torch.zeros(1, 4, dtype=torch.int64), 2, phase=counter.count)
    doc = write_trace(tmp_path / "t.json", counter, measured={"decode": 0.002})
    assert json.loads((tmp_path / "t.json").read_text()) == doc
    slices = check_format(doc)
    measured = [e for e in slices if e["tid"] == 2]
    assert [e["name"] for e in measured] == ["prefill", "decode"]
    assert measured[0]["dur"] == pytest.approx(counter.counts["prefill"].latency * 1e6, abs=1e-3)
    assert measured[1]["dur"] == pytest.approx(2000.0)  # 0.002 s given = 2,000 µs


def test_simulation_has_a_track_per_device(counted):
    sim = simulate(counted, {"attention": "pim-ai-4chip,t"}, host="generic-cpu",
                   default_device="host")
    doc = trace_events(sim)
    slices = check_format(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "process_name"}
    assert sorted(procs.values()) == ["generation", "host", "pim-ai-4chip"]
    pim = next(pid for pid, name in procs.items() if name == "pim-ai-4chip")
    on_pim = {e["name"] for e in slices if e["pid"] == pim and e["cat"] == "module"}
    assert on_pim == {"attention", "wqkv", "wo"}  # the attention and its children only
    assert any(e["cat"] == "transfer" for e in slices if e["pid"] == pim)  # ",t": via the host
    top = [e for e in slices if e["pid"] == 0]
    assert [e["name"] for e in top] == ["prefill", "decode"]
    assert top[0]["dur"] == pytest.approx(sim.phases["prefill"].time_s * 1e6, abs=1e-3)


def test_bad_input(counted, tmp_path):
    with pytest.raises(TypeError, match="TransformerPerformanceCounter"):
        trace_events(42)
    with pytest.raises(OSError, match="does not exist"):
        write_trace(tmp_path / "no" / "t.json", counted)
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError, match="is a directory"):
        write_trace(tmp_path / "d", counted)


def test_one_recorded_forward_predicted_and_measured():
    from perfcounter.report.graph import record_forward
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256)).eval()
    doc = trace_events(record_forward(model, torch.randn(8, 256)), "h100-sxm")
    slices = check_format(doc)
    for tid in (1, 2):  # predicted, measured
        ops = [e["name"] for e in slices if e["tid"] == tid and e["cat"] == "op"]
        assert ops == ["addmm.default", "relu.default", "addmm.default"]
        mods = [e["name"] for e in slices if e["tid"] == tid and e["cat"] == "module"]
        assert mods == ["Sequential", "Sequential.0", "Sequential.1", "Sequential.2"]
    # the first addmm reads x [8, 256], W [256, 256], b [256] and writes [8, 256]:
    # (2048 + 65536 + 256 + 2048) * 4 B = 279,552 B; roofline 279,552 / 3.35e12 B/s = 83.4 ns.
    # predicted (h100-sxm has no op_efficiency / op_overhead_s: predict.py's defaults): 8 rows
    # is a GEMV, DEFAULT_EFFICIENCY 0.8: memory 279,552 / (0.8 * 3.35e12) = 104.31 ns, compute
    # 2*8*256*256 + 8*256 = 1,050,624 / (0.8 * 67e12 fp32) = 19.6 ns, + a GPU kernel's fixed
    # 2,700 ns (DEFAULT_KERNEL_S) -> work 2,804.31 ns. relu: elementwise, a GPU's bytes at 0.9
    # (DEFAULT_STREAM_EFFICIENCY): (8192 + 8192) B / 3.015e12 B/s = 5.43 ns + 2,700 = 2,705.43;
    # the second addmm as the first: work 2 x 2,804.31 + 2,705.43 = 8,314.06 ns.
    # DEFAULT_OVERHEAD_S cuda eager, 8 us a call: dispatch 3 x 8 us = 24 us, of which the GPU
    # shows (24,000 - 8,314.06) / 24,000 = 0.653581, each op its share: 5,228.65 ns per op
    first, relu = [e for e in slices if e["tid"] == 1 and e["cat"] == "op"][:2]
    assert first["dur"] == pytest.approx(8.033, abs=0.001)  # 5,228.65 + 2,804.31 ns
    assert first["args"]["predicted_s"] == pytest.approx(8032.96e-9, abs=0.02e-9)
    assert first["args"]["roofline_s"] == pytest.approx(83.4e-9, abs=0.1e-9)
    assert relu["args"]["predicted_s"] == pytest.approx(7934.08e-9, abs=0.02e-9)  # + 2,705.43
    measured = [e for e in slices if e["tid"] == 2 and e["cat"] == "op"]
    assert all("measured_s" in e["args"] and "predicted_s" not in e["args"] for e in measured)
    with pytest.raises(ValueError, match="pass spec="):
        trace_events(record_forward(model, torch.randn(8, 256)))
