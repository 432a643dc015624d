"""The power model (perfcounter/pricing/power.py) by hand: a run at constant step time and batch
costs (static + activity power) x its duration, an idle stretch static power x its time, no
step draws more than the board's limit, and PIM parts and UPMEM's profiles keep the dynamic
model (their J/token as before).

A toy GPU: idle (static) 100 W, limit 700 W. A toy table: every step 10 ms and 2 J of dynamic
work (activity 2 J / 10 ms = 200 W), priced by power.step_joules, the rule every step table
uses (held equal to it on a real table below)."""
import dataclasses

import numpy as np
import pytest
import torch

from perfcounter.devices import DeviceSpec, get_device_spec
from perfcounter.devices.dtypes import DeviceSpecError
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.power import (DYNAMIC, POWER, Power, idle_joules, mean_power_w,
                                       model_of, power_of, step_joules)
from perfcounter.report.phase import _power_line
from perfcounter.serve import deployment, serve, synthetic
from perfcounter.serve.metrics import metrics
from perfcounter.serve.scheduler import EngineConfig, simulate_engine
from perfcounter.serve.workload import Workload
from perfcounter.stats import PerformanceStats
from test_energy import PIM_FIGURES, decode_trace

TINY = ModelArgs(block_size=1024, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
GPU = dict(device_type="cuda", bandwidth=1e12, flops_per_s=100e12, dtype=torch.bfloat16, vram=8e9,
           flops_by_dtype={"float32": 50e12}, mem_pj_per_bit=7.0,
           pj_per_flop_by_dtype={"bfloat16": 0.5, "float32": 0.5})


class ToyTable:
    """Every step `step` s and `dynamic` J of work, on a device of power `power`."""

    def __init__(self, power: Power, step: float = 0.01, dynamic: float = 2.0):
        self.power, self.step, self.dynamic, self.label = power, step, dynamic, "toy"
        self.static_w = power.static_w
        self.counts = type("Counts", (), {"window": None, "experts": 0})()

    def seconds(self, f):
        return self.step

    def energy_j(self, f, seconds):
        return step_joules(self.dynamic, seconds, self.power)


def toy_gpu(**figures) -> DeviceSpec:
    return DeviceSpec(name="gpu-by-hand", **{**GPU, "idle_w": 100.0, "tdp_w": 700.0, **figures})


def run(table, workload, seqs: int = 4):
    return simulate_engine(workload, table, EngineConfig(100_000, 512, seqs))


def test_step_joules_by_hand():
    p = Power(POWER, 100.0, 700.0)
    assert step_joules(2.0, 0.01, p) == pytest.approx(3.0)  # 100 W x 10 ms + 2 J
    assert step_joules(10.0, 0.01, p) == pytest.approx(7.0)  # 1 + 10 = 11 J > 700 W x 10 ms
    assert step_joules(2.0, 0.0, p) == 2.0  # no time: nothing to cap over, no static
    assert step_joules(10.0, 0.01, Power(DYNAMIC, 100.0, None)) == pytest.approx(11.0)  # no cap
    assert idle_joules(0.5, 100.0) == pytest.approx(50.0) and idle_joules(-1.0, 100.0) == 0.0
    assert mean_power_w(30.0, 0.1) == pytest.approx(300.0) and mean_power_w(1.0, 0.0) is None


def test_which_model_a_device_is_on():
    assert power_of(toy_gpu()) == Power(POWER, 100.0, 700.0)
    # no idle figure: the dynamic model, static_W (0 when not given), no cap
    assert power_of(DeviceSpec(name="g", tdp_w=700.0, **GPU)) == Power(DYNAMIC, 0.0, None)
    assert power_of(DeviceSpec(name="g", static_w=3.0, **GPU)) == Power(DYNAMIC, 3.0, None)
    # PIM parts and UPMEM's profiles keep theirs whatever an entry says of idle_W
    assert model_of(DeviceSpec(name="p", idle_w=5.0, **PIM_FIGURES)) == DYNAMIC
    upmem = dataclasses.replace(get_device_spec("upmem-h100"), idle_w=121.7)
    assert upmem.profile == "upmem" and model_of(upmem) == DYNAMIC
    assert model_of(get_device_spec("h100-sxm")) == POWER
    assert model_of(get_device_spec("pim-ai-4chip")) == DYNAMIC


def test_a_run_at_constant_step_time_and_batch_costs_static_plus_activity_over_its_duration():
    # 8 requests of 4 prompt and 5 output tokens, 4 in flight (closed loop): two waves of 5
    # steps (a prefill giving the first token, 4 decodes), each 10 ms with 4 sequences:
    # 10 steps, 0.1 s, no idle time. P = 100 W + 2 J / 10 ms = 300 W; J = 300 W x 0.1 s = 30 J
    table = ToyTable(power_of(toy_gpu()))
    w = synthetic(8, 4, 5, concurrency=4)
    r = run(table, w)
    m = metrics(r, open_loop=False, static_w=table.static_w)
    assert m["steps"] == 10 and m["duration"] == pytest.approx(0.1)
    assert m["idle_energy_j"] == pytest.approx(0.0, abs=1e-12)
    assert m["energy_j"] == pytest.approx(30.0)
    assert m["mean_power_w"] == pytest.approx(300.0)
    assert m["j_per_output_token"] == pytest.approx(30.0 / 40)  # 8 x 5 tokens: 0.75 J


def test_an_idle_stretch_costs_idle_power_times_its_time():
    # two requests of one token, arriving at 0 and 1 s: two steps of 10 ms (3 J each), the
    # run from 0 to 1.01 s; idle 1.01 - 0.02 = 0.99 s x 100 W = 99 J; 6 + 99 = 105 J
    table = ToyTable(power_of(toy_gpu()))
    w = Workload(np.array([0.0, 1.0]), np.array([4, 4]), np.array([1, 1]),
                 np.zeros(2, dtype=np.int64), None, "two")
    r = run(table, w)
    m = metrics(r, static_w=table.static_w)
    assert m["duration"] == pytest.approx(1.01)
    assert m["idle_energy_j"] == pytest.approx(99.0)
    assert m["energy_j"] == pytest.approx(105.0)
    assert m["mean_power_w"] == pytest.approx(105.0 / 1.01)  # 103.96 W: mostly idle
    # the same run on 2 streams' GPUs (DP 2, the other replica idle throughout): its GPUs
    # idle 2 x 1.01 - 0.02 = 2 s x 100 W = 200 J
    assert metrics(r, static_w=100.0, streams=2)["idle_energy_j"] == pytest.approx(200.0)
    # an idle-heavy run costs more per token than a busy one: 105 J / 2 against 3 J a token
    assert m["j_per_output_token"] == pytest.approx(52.5)


def test_no_step_draws_more_than_the_cap():
    # 10 J of work in 10 ms: 100 W + 1,000 W > 700 W, so the step draws 700 W: 7 J; a closed
    # loop of such steps averages 700 W, never more
    table = ToyTable(power_of(toy_gpu()), dynamic=10.0)
    m = metrics(run(table, synthetic(8, 4, 5, concurrency=4)), open_loop=False,
                static_w=table.static_w)
    assert m["energy_j"] == pytest.approx(70.0)  # 10 steps x 7 J
    assert m["mean_power_w"] == pytest.approx(700.0)


@pytest.fixture(scope="module")
def capped():
    # the real step table of a tiny model on a GPU whose limit is its idle power: any work
    # is capped, so a step of s seconds costs 100 W x s
    spec = toy_gpu(tdp_w=100.0)
    return deployment(TINY, spec, max_num_seqs=8, max_num_batched_tokens=256)


def test_the_step_table_prices_a_step_by_the_one_rule(capped):
    table = capped.table
    f = capped.table.counts.features([(1, 10), (1, 20), (16, 0)])
    s = table.seconds(f)
    dyn = table.dynamic_j(f)
    assert dyn > 0 and table.power == Power(POWER, 100.0, 100.0)
    assert table.energy_j(f, s) == pytest.approx(100.0 * s)  # min(100 s + dyn, 100 s)
    # uncapped, the same table prices static + dynamic: the one rule, step_joules
    free = deployment(TINY, toy_gpu(), max_num_seqs=8, max_num_batched_tokens=256).table
    assert free.energy_j(f, s) == pytest.approx(100.0 * s + free.dynamic_j(f))
    assert free.energy_j(f, s) == step_joules(free.dynamic_j(f), s, free.power)


def test_a_served_run_never_averages_above_the_cap(capped):
    m = serve(capped, synthetic(16, 16, 8, concurrency=4)).metrics
    # every step capped at 100 W and no idle time: exactly 100 W over the run
    assert m["mean_power_w"] == pytest.approx(100.0, rel=1e-9)
    assert m["energy_j"] == pytest.approx(100.0 * m["duration"], rel=1e-9)


def test_count_charges_idle_power_over_the_predicted_time():
    # test_energy's projection on a GPU with these pJ figures: 16,384 FLOPs x 0.5 pJ =
    # 8,192 pJ; 16,768 B x 8 x 7 pJ = 939,008 pJ; no host link (a GPU's inputs are on it);
    # static 100 W x the predicted time t; mean power = total / t
    s = PerformanceStats("decode", 1, None, decode_trace(), toy_gpu())
    e, t = s.energy, s.predicted_latency
    assert e.model == POWER and e.seconds == t and t > s.roofline_latency
    assert e.compute_j == pytest.approx(8_192e-12) and e.memory_j == pytest.approx(939_008e-12)
    assert e.static_j == pytest.approx(100.0 * t)
    assert e.total_j == pytest.approx(947_200e-12 + (e.host_link_j or 0.0) + 100.0 * t)
    assert e.mean_power_w == pytest.approx(e.total_j / t)
    d = e.to_dict()
    assert d["energy_model"] == "power" and d["cap_w"] == 700.0 and d["seconds"] == t
    line = _power_line(e)  # count's report: "Mean power: 1.5 kW over the predicted ..."
    assert line.strip().startswith("Mean power: ") and "over the predicted" in line
    # capped at its idle power: 100 W x t, whatever the work
    capped = PerformanceStats("decode", 1, None, decode_trace(), toy_gpu(tdp_w=100.0))
    assert capped.energy_j == pytest.approx(100.0 * capped.predicted_latency)
    assert capped.energy.mean_power_w == pytest.approx(100.0)


def test_pim_keeps_the_dynamic_model():
    # test_energy's PIM-AI 4chip by hand, 256,870.4 pJ: unchanged with an idle figure given,
    # static over the roofline time as before, no cap; mean power over the roofline time
    spec = DeviceSpec(name="pim-idle", idle_w=5.0, **PIM_FIGURES)
    s = PerformanceStats("decode", 1, None, decode_trace(), spec)
    assert s.energy.model == DYNAMIC and s.energy.static_j is None
    assert s.energy_j == pytest.approx(256_870.4e-12)
    assert s.energy.seconds == pytest.approx(5.59375e-8)  # the roofline latency
    assert s.energy.mean_power_w == pytest.approx(256_870.4e-12 / 5.59375e-8)  # 4.59 W
    # the registry's PIM part and UPMEM's H100 profile: no idle figure, the same by hand
    pim = PerformanceStats("decode", 1, None, decode_trace(), get_device_spec("pim-ai-4chip"))
    assert pim.energy_j == pytest.approx(256_870.4e-12)
    upmem = get_device_spec("upmem-h100")
    assert upmem.idle_w is None and power_of(upmem) == Power(DYNAMIC, 0.0, None)


def test_a_pim_serving_step_is_its_dynamic_joules():
    # on the dynamic model with no static figure a step's joules are its dynamic joules,
    # whatever its seconds (the serving tables PIM's J/token came from)
    pim = {**PIM_FIGURES, "pj_per_flop_by_dtype": {"bfloat16": 0.4, "float32": 0.4}}
    dep = deployment(TINY, DeviceSpec(name="pim-serve", vram=8e9, **pim),
                     max_num_seqs=8, max_num_batched_tokens=256)
    f = dep.table.counts.features([(1, 10), (8, 0)])
    assert dep.table.energy_j(f, 1.0) == dep.table.dynamic_j(f) > 0


def test_idle_above_the_limit_is_refused():
    with pytest.raises(DeviceSpecError, match=r"idle_W 800 exceeds tdp_W 700"):
        DeviceSpec(name="g", idle_w=800.0, tdp_w=700.0, **GPU)
    with pytest.raises(DeviceSpecError, match="idle_w must be a non-negative"):
        DeviceSpec(name="g", idle_w=-1.0, **GPU)


def test_every_idle_figure_has_its_own_source():
    for name in ("h100-sxm", "h200", "b200", "a100-sxm4-80gb", "a100-pcie-40gb", "l40s",
                 "v100-sxm2-32gb", "t4"):
        spec = get_device_spec(name)
        assert 0 < spec.idle_w < spec.tdp_w, name
        assert "github.com" in spec.source["idle_w"], name
    assert get_device_spec("h100-sxm").idle_w == 121.7  # arXiv:2605.23918, CUDA context idle
