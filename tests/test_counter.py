"""TransformerPerformanceCounter over real forward passes (CPU, tiny models).

The reference block is Linear(6, 5, bias=False) on x[4, 6] in float32:
  FLOPs = 2 * M * N * K = 2 * 4 * 5 * 6 = 240
  per-op bytes = (M*K + K*N + M*N) * 4 = (24 + 30 + 20) * 4 = 296
"""
import json
import os

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from perfcounter.counter import CountArgumentError, NestedCountError, TransformerPerformanceCounter
from perfcounter.counts_doc import SCHEMA, SCHEMA_VERSION
from perfcounter.devices import DeviceSpec


class Proj(torch.nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5, bias=False, device=device)

    def forward(self, x):
        return self.lin(x)


@pytest.fixture
def toy():
    return DeviceSpec(device_type="cuda", name="toy", bandwidth=100.0, flops_per_s=1000.0,
                      dtype=torch.float32, mem_pj_per_bit=1.0,
                      pj_per_flop_by_dtype={"float32": 0.5})


def test_counts_a_matmul_without_a_device():
    counter, model, x = TransformerPerformanceCounter(), Proj(), torch.randn(4, 6)
    with counter.count("prefill", num_tokens=4):
        model(x)
    s = counter.counts["prefill"]
    assert s.total_flops == 240  # 2 * 4 * 5 * 6
    assert s.total_io == 296  # (24 + 30 + 20) * 4
    assert s.flop_counts["Global"] == {"aten.mm": 240}
    assert s.flop_counts["Proj.lin"] == {"aten.mm": 240}
    assert s.latency is not None and s.latency > 0 and s.timing == "time.perf_counter"
    assert s.raw_latency >= s.latency
    assert s.raw_latency - s.latency == pytest.approx(min(s.overhead_s, s.raw_latency))
    assert s.device_bandwidth is None and s.roofline_latency is None
    assert counter.get_counts() == counter.counts


def test_counts_a_matmul_on_a_device(toy):
    counter, model, x = TransformerPerformanceCounter(device_spec=toy), Proj(), torch.randn(4, 6)
    with counter.count("prefill", num_tokens=4):
        model(x)
    s = counter.counts["prefill"]
    assert s.theoretical_io_latency == pytest.approx(2.96)  # 296 B / 100 B/s
    assert s.theoretical_compute_latency == pytest.approx(0.24)  # 240 / 1000
    assert s.roofline_latency == pytest.approx(2.96) and s.bound == "memory"
    assert s.bandwidth_utilization == pytest.approx(296 / s.latency / 100)
    assert s.energy_j == pytest.approx((240 * 0.5 + 296 * 8 * 1.0) * 1e-12)  # 2488 pJ


def test_repeated_label_accumulates():
    counter, model = TransformerPerformanceCounter(), Proj()
    x = torch.randn(1, 6)
    for _ in range(3):
        with counter.count("decode", num_tokens=1):
            model(x)
    s = counter.counts["decode"]
    assert s.steps == 3 and s.num_tokens == 3
    assert s.total_flops == 180  # 3 * 2 * 1 * 5 * 6
    assert s.total_io == 3 * (6 + 30 + 5) * 4  # 492
    mm = next(r for r in s.trace.records if r.op == "aten.mm.default")
    assert mm.calls == 3
    assert list(counter.counts) == ["decode"]
    x4 = torch.randn(4, 6)
    with counter.count("prefill", num_tokens=4):
        model(x4)
    assert counter.total_flops == 420 and counter.total_tokens == 7  # 180 + 240, 3 + 4
    assert counter.total_io == 492 + 296
    assert counter.total_time == pytest.approx(s.latency + counter.counts["prefill"].latency)
    summary = counter.stats_summary
    assert summary.label == "Performance Summary" and summary.steps == 4
    assert summary.total_flops == 420


def test_add_takes_a_phase_counted_elsewhere():
    counter, model, x = TransformerPerformanceCounter(), Proj(), torch.randn(4, 6)
    with counter.count("prefill", num_tokens=4):
        model(x)
    trace = counter.counts["prefill"].trace
    stats = counter.add("derived", trace, num_tokens=4, latency=0.5, timing="given")
    assert stats.total_flops == 240 and stats.latency == 0.5  # 2 * 4 * 5 * 6, as counted
    counter.add("derived", trace, num_tokens=4, latency=0.25)  # the same label adds up
    s = counter.counts["derived"]
    assert (s.total_flops, s.num_tokens, s.latency) == (480, 8, 0.75)  # 240 + 240; 4 + 4; 0.5 + 0.25
    assert list(counter.counts) == ["prefill", "derived"]
    with pytest.raises(CountArgumentError, match="num_tokens must be an int >= 0, got -1"):
        counter.add("x", trace, num_tokens=-1)
    with pytest.raises(CountArgumentError, match="trace must be a perfcounter Trace, got dict"):
        counter.add("x", {}, num_tokens=1)


def test_argument_errors():
    counter = TransformerPerformanceCounter()
    with pytest.raises(ValueError, match="num_tokens must be an int >= 0, got -1"):
        with counter.count("prefill", -1):
            pass
    for bad in (1.5, "4", True, None):
        with pytest.raises(CountArgumentError, match="num_tokens"):
            with counter.count("prefill", bad):
                pass
    with pytest.raises(TypeError, match="label must be a non-empty str, got 3"):
        with counter.count(3, 1):
            pass
    with pytest.raises(ValueError, match="label"):
        with counter.count("", 1):
            pass
    with counter.count("numpy-like", torch.tensor(2).item()):  # any int works
        pass
    assert counter.counts["numpy-like"].num_tokens == 2
    with pytest.raises(ValueError, match="did you mean 'per_op'"):
        TransformerPerformanceCounter(io_model="perop")
    with pytest.raises(ValueError, match="depth"):
        TransformerPerformanceCounter(depth=0)
    with pytest.raises(TypeError, match="device_spec must be a DeviceSpec, a registry name"):
        TransformerPerformanceCounter(10)  # torchao's first positional argument was depth


def test_nested_count_is_refused_and_the_outer_block_survives():
    counter, model = TransformerPerformanceCounter(), Proj()
    with counter.count("outer", 4):
        nested = r"count\('inner'\) entered inside count\('outer'\)"
        with pytest.raises(NestedCountError, match=nested):
            with counter.count("inner", 1):
                pass
        model(torch.randn(4, 6))
    assert list(counter.counts) == ["outer"] and counter.counts["outer"].total_flops == 240


def test_exception_inside_a_block_leaves_nothing_behind():
    counter, model = TransformerPerformanceCounter(), Proj()
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    post = dict(torch.nn.modules.module._global_forward_hooks)
    with pytest.raises(RuntimeError, match="boom"):
        with counter.count("prefill", 4):
            model(torch.randn(4, 6))
            raise RuntimeError("boom")
    assert counter.counts == {}
    assert _get_current_dispatch_mode_stack() == []
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks
    assert dict(torch.nn.modules.module._global_forward_hooks) == post
    with counter.count("prefill", 4):  # the counter is usable again
        model(torch.randn(4, 6))
    assert counter.counts["prefill"].total_flops == 240 and counter.counts["prefill"].steps == 1


def test_fake_and_meta_tensors_have_no_latency():
    from torch._subclasses.fake_tensor import FakeTensorMode
    counter = TransformerPerformanceCounter()
    with FakeTensorMode():
        model, x = Proj(), torch.randn(4, 6)
        with counter.count("fake-inside", 4):
            model(x)
    with counter.count("fake-outside", 4):  # fake weights, no fake mode on the stack
        model(x)
    with counter.count("meta", 4):
        Proj(device="meta")(torch.empty(4, 6, device="meta"))
    for label in ("fake-inside", "fake-outside", "meta"):
        s = counter.counts[label]
        assert s.total_flops == 240, label
        assert s.latency is None and s.raw_latency is None and s.token_throughput is None, label
        assert s.timing.startswith("not measured"), label
    assert counter.total_time is None
    assert "Latency = n/a" in counter.print_summary(["meta"])


def test_json_round_trip(tmp_path, toy):
    counter, model = TransformerPerformanceCounter(device_spec=toy), Proj()
    with counter.count("prefill", 4):
        model(torch.randn(4, 6))
    for _ in range(2):
        with counter.count("decode", 1):
            model(torch.randn(1, 6))
    path = tmp_path / "stats.json"
    doc = counter.to_json(path)
    assert os.listdir(tmp_path) == ["stats.json"]  # no temporary file left
    on_disk = json.loads(path.read_text())
    assert on_disk == doc
    # torchao's layout: labels at the top level, our version and device inside each phase
    assert list(on_disk) == ["prefill", "decode"]
    meta = on_disk["decode"]["perfcounter"]
    assert meta["schema"] == SCHEMA and meta["version"] == SCHEMA_VERSION == 2
    assert meta["io_model"] == "per_op" and meta["depth"] == 10
    assert on_disk["decode"]["steps"] == 2 and on_disk["decode"]["device"]["name"] == "toy"
    assert on_disk["prefill"]["flop_counts"]["Global"] == {"aten.mm": 240}
    back = TransformerPerformanceCounter.from_json(path)
    assert back.to_dict() == counter.to_dict()
    assert back.device_spec == toy
    assert back.stats_summary.total_flops == 240 + 2 * 60
    assert back.print_summary(["prefill", "decode"]) == counter.print_summary(["prefill", "decode"])


def test_from_json_reads_the_version_1_envelope(tmp_path, toy):
    counter = TransformerPerformanceCounter(device_spec=toy)
    with counter.count("prefill", 4):
        Proj()(torch.randn(4, 6))
    stats = counter.counts["prefill"].to_dict()
    old = {"schema": SCHEMA, "version": 1, "perfcounter": "0.1.0", "io_model": "per_op",
           "depth": 10, "device": toy.to_dict(), "counts": {"prefill": stats},
           "summary": None}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    back = TransformerPerformanceCounter.from_json(path)
    assert back.device_spec == toy and back.counts["prefill"].total_flops == 240


def test_json_errors_and_atomic_write(tmp_path, monkeypatch):
    counter = TransformerPerformanceCounter()
    with counter.count("prefill", 4):
        Proj()(torch.randn(4, 6))
    path = tmp_path / "stats.json"
    path.write_text("precious")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        counter.to_json(path)
    monkeypatch.undo()
    assert path.read_text() == "precious" and os.listdir(tmp_path) == ["stats.json"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": SCHEMA, "version": 99}))
    with pytest.raises(ValueError, match="schema version 99 is not supported"):
        TransformerPerformanceCounter.from_json(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        TransformerPerformanceCounter.from_json(bad)
    bad.write_text(json.dumps({"schema": "perfcounter.simulation.run", "version": 1}))
    with pytest.raises(ValueError, match="not a perfcounter counts document"):
        TransformerPerformanceCounter.from_json(bad)
    bad.write_text(json.dumps({"schema": SCHEMA, "version": 1, "depth": 10}))
    with pytest.raises(ValueError, match="field 'io_model' is missing"):
        TransformerPerformanceCounter.from_json(bad)
    bad.write_text("{}")  # torchao's to_json of a counter that counted nothing
    assert TransformerPerformanceCounter.from_json(bad).counts == {}


@pytest.mark.filterwarnings("ignore:device .* has no .* figure for float32")
def test_compare_prices_every_phase_on_every_device(toy):
    counter, model, x = TransformerPerformanceCounter(), Proj(), torch.randn(4, 6)
    with counter.count("prefill", 4):
        model(x)
    table = counter.compare(["h100-sxm", "a100-sxm4-80gb", "pim-ai-4chip", toy])
    rows = table.to_dict()
    assert [(r["device"], r["phase"]) for r in rows] == [
        ("h100-sxm", "prefill"), ("a100-sxm4-80gb", "prefill"), ("pim-ai-4chip", "prefill"),
        ("toy", "prefill")]
    assert rows[3]["roofline_latency"] == pytest.approx(2.96)  # 296 B / 100 B/s
    assert rows[3]["tokens_per_s"] == pytest.approx(4 / 2.96)
    assert rows[3]["energy_per_token_j"] == pytest.approx(2488e-12 / 4)
    # an H100 moves bytes faster than an A100
    assert rows[0]["roofline_latency"] < rows[1]["roofline_latency"]
    text = str(table)
    assert text.splitlines()[0].split()[:3] == ["Device", "Phase", "Roofline"]
    assert "pim-ai-4chip" in table.to_markdown()


def test_print_summary(capsys, toy):
    counter = TransformerPerformanceCounter(device_spec=toy)
    with counter.count("prefill", 4):
        Proj()(torch.randn(4, 6))
    text = counter.print_summary(labels=["prefill"], show=True)
    assert capsys.readouterr().out == text + "\n"
    assert text.startswith("prefill:\n  Latency = ")
    assert counter.print_summary().startswith("Performance Summary:\n")
    with pytest.raises(KeyError, match="did you mean 'prefill'"):
        counter.print_summary(labels=["prefil"])


def test_changing_the_device_reprices_counts(toy):
    counter, model, x = TransformerPerformanceCounter(), Proj(), torch.randn(4, 6)
    with counter.count("prefill", 4):
        model(x)
    assert counter.counts["prefill"].roofline_latency is None
    counter.device_spec = toy
    assert counter.counts["prefill"].roofline_latency == pytest.approx(2.96)
    counter.io_model = "compulsory"
    assert counter.counts["prefill"].io_model == "compulsory"


def test_device_spec_by_name():
    counter = TransformerPerformanceCounter(device_spec="h100-sxm")
    assert counter.device_spec.name == "h100-sxm"


def test_tiny_transformer_prefill_and_decode(tiny_model):
    counter = TransformerPerformanceCounter(device_spec="pim-ai-4chip")
    tiny_model.setup_caches(1, 16)
    with torch.no_grad():
        with counter.count("prefill", num_tokens=4):
            tiny_model(torch.zeros(1, 4, dtype=torch.long), torch.arange(4))
        for i in range(4, 6):
            with counter.count("decode", num_tokens=1):
                tiny_model(torch.zeros(1, 1, dtype=torch.long), torch.tensor([i]))
    prefill, decode = counter.counts["prefill"], counter.counts["decode"]
    assert decode.steps == 2 and prefill.uncounted_ops == {}
    scopes = prefill.scopes()
    # wq/wk/wv/wo: 2 layers, 4 tokens: 2*4*32*(32+16+16) + 2*4*32*32 per layer
    # (dim 32, 4 heads of 8, 2 kv heads of 8: q 32 wide, k and v 16 wide)
    proj = 2 * (2 * 4 * 32 * 64 + 2 * 4 * 32 * 32)
    assert scopes["attn"]["flops"] >= proj  # plus the attention itself
    # w1, w3: 32 -> 48 and w2: 48 -> 32, 2 layers: 2 * 3 * (2 * 4 * 32 * 48)
    assert scopes["mlp"]["flops"] >= 2 * 3 * 2 * 4 * 32 * 48
    assert scopes["lm_head"]["flops"] == 2 * 4 * 32 * 64  # output: 32 -> vocab 64
    text = counter.print_summary(["prefill"])
    assert "Transformer.layers.*.attention" in text and "Scopes" in text
    assert decode.roofline_latency > 0 and decode.energy_per_token_j > 0


class Other(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())

    def forward(self, x):
        return self.inner(x)


def test_another_thread_running_a_model_leaves_per_module_counts_alone():
    """Module hooks are process-wide, the dispatch mode is per thread: a model another
    thread runs meanwhile must neither add records nor move ours under its modules."""
    import threading
    import time
    counter, model, other = TransformerPerformanceCounter(), Proj(), Other()
    stop, runs = threading.Event(), []

    def busy():
        x = torch.randn(64, 6)
        while not stop.is_set():
            other(x)
            runs.append(1)

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        while len(runs) < 3:
            time.sleep(0.001)
        x = torch.randn(4, 6)
        for _ in range(20):
            with counter.count("prefill", 4):
                model(x)
    finally:
        stop.set()
        thread.join()
    assert len(runs) > 3  # the other thread ran while we counted
    s = counter.counts["prefill"]
    # 20 blocks of Linear(6, 5) on x[4, 6]: 20 * 240 FLOPs, 20 * 296 bytes
    assert s.flop_counts == {"Global": {"aten.mm": 4800}, "Proj": {"aten.mm": 4800},
                             "Proj.lin": {"aten.mm": 4800}}
    assert s.io_summary == {"Global": 5920, "Proj": 5920, "Proj.lin": 5920}
    assert [m.path for m in s.trace.modules] == ["Proj", "Proj.lin"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_block_is_timed_with_events():
    counter = TransformerPerformanceCounter()
    model, x = Proj(device="cuda"), torch.randn(4, 6, device="cuda")
    with counter.count("prefill", 4):
        model(x)
    s = counter.counts["prefill"]
    assert s.timing == "cuda events, synchronized"
    assert s.total_flops == 240 and s.latency is not None and s.latency >= 0
