"""perfcounter.simulate: layer placement on several devices, every figure derived by hand.

The toy devices have round figures so that each time, byte and joule below can be
checked with a pencil (1 pJ = 1e-12 J, 1 ns = 1e-9 s).
"""
import itertools
import json
import warnings
from dataclasses import replace

import pytest
import torch
from torch import nn

import perfcounter
from perfcounter import TransformerPerformanceCounter, simulate
from perfcounter.devices import DeviceSpec
from perfcounter.pricing.predict import phase_program, predict
from perfcounter.simulation.placement import Mapping, MappingError, resolve_device
from perfcounter.simulation.links import Link
from perfcounter.simulation.result import COMPONENTS
from perfcounter.simulation.search import kind_keys, search_mapping
from perfcounter.simulation.timeline import PREPARED, Ev, elementwise_spec, timeline

from conftest import tiny_args

F32 = torch.float32

# dev-a: 1 GB/s memory, 1 GFLOP/s, 1 pJ/bit, 2 pJ/FLOP; link in 0.1 GB/s @ 10 pJ/bit,
#        out 0.2 GB/s @ 5 pJ/bit
DEV_A = DeviceSpec(name="dev-a", device_type="pim", bandwidth=1e9, flops_per_s=1e9, dtype=F32,
                   mem_pj_per_bit=1.0, pj_per_flop_by_dtype={F32: 2.0},
                   host_to_device_bw=1e8, host_to_device_pj_per_bit=10.0,
                   device_to_host_bw=2e8, device_to_host_pj_per_bit=5.0)
# dev-b: 2 GB/s, 4 GFLOP/s, 0.5 pJ/bit, 1 pJ/FLOP; in 0.4 GB/s @ 20 pJ/bit, out 0.1 GB/s @ 2
DEV_B = DeviceSpec(name="dev-b", device_type="pim", bandwidth=2e9, flops_per_s=4e9, dtype=F32,
                   mem_pj_per_bit=0.5, pj_per_flop_by_dtype={F32: 1.0},
                   host_to_device_bw=4e8, host_to_device_pj_per_bit=20.0,
                   device_to_host_bw=1e8, device_to_host_pj_per_bit=2.0)
HOST = DeviceSpec(name="toy-host", device_type="cpu", bandwidth=1e9, flops_per_s=1e9, dtype=F32,
                  mem_pj_per_bit=1.0, pj_per_flop_by_dtype={F32: 1.0})
DEVICES = {"dev-a": DEV_A, "dev-b": DEV_B}


def sim(source, mapping=None, **kw):
    kw.setdefault("host", HOST)
    return simulate(source, mapping, devices=DEVICES, **kw)


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8, bias=False)
        self.b = nn.Linear(8, 2, bias=False)

    def forward(self, x):
        return self.b(self.a(x))


class Experts(nn.Module):
    """Four experts on one shared input, summed by the parent's own adds."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4, bias=False) for _ in range(4))

    def forward(self, x):
        out = self.experts[0](x)
        for e in self.experts[1:]:
            out = out + e(x)
        return out


class ToyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 8, bias=False)
        self.down = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.down(self.up(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = ToyMLP()

    def forward(self, x):
        return self.mlp(x)


def count(model, x, label="decode"):
    counter = TransformerPerformanceCounter()
    with torch.no_grad(), counter.count(label, num_tokens=1):
        model(x)
    return counter


@pytest.fixture(scope="module")
def two():
    torch.manual_seed(0)
    return count(TwoLinears(), torch.ones(1, 4))


@pytest.fixture(scope="module")
def tiny_counter():
    """The tiny gpt-fast model: a 5-token prefill and 2 decode steps, no weights."""
    from perfcounter.generation.config_only import count_config_only
    counter = TransformerPerformanceCounter()
    count_config_only(tiny_args(), counter, prompt_length=5, max_new_tokens=3, dtype=F32)
    return counter


# -- the two-linear toy, by hand ---------------------------------------------------------
def test_two_linears_on_two_devices_by_hand(two):
    # a: mm [1,4]x[4,8]: 2*1*4*8 = 64 FLOPs; reads 128 B weight + 16 B x, writes 32 B
    # b: mm [1,8]x[8,2]: 2*8*2 = 32 FLOPs; reads 64 B weight + 32 B, writes 8 B
    s = sim(two, {"a": "dev-a", "b": "dev-b,t"})
    p = s.phases["decode"]
    a, b = p.devices["dev-a"], p.devices["dev-b"]
    # host -> dev-a, a's input (16 B): 16 / 1e8 = 160 ns; 16*8*10 = 1280 pJ
    assert a.host_to_device_bytes == 16
    # a on dev-a: compute 64 / 1e9 = 64 ns, memory (128+16+32) / 1e9 = 176 ns -> 176 ns
    assert a.compute_s == pytest.approx(64e-9) and a.busy_s == pytest.approx(176e-9)
    # b is a transfer point: b's input (32 B) dev-a -> host (32 / 2e8 = 160 ns, 32*8*5 =
    # 1280 pJ) -> dev-b (32 / 4e8 = 80 ns, 32*8*20 = 5120 pJ)
    assert a.device_to_host_bytes == 32 and b.host_to_device_bytes == 32
    # b on dev-b: compute 32 / 4e9 = 8 ns, memory (64+32+8) / 2e9 = 52 ns -> 52 ns
    assert b.busy_s == pytest.approx(52e-9) and b.compute_s == pytest.approx(8e-9)
    # the output (8 B) back: dev-b -> host 8 / 1e8 = 80 ns, 8*8*2 = 128 pJ
    assert b.device_to_host_bytes == 8
    # time: 160 + 176 + 160 + 80 + 52 + 80 = 708 ns
    assert p.time_s == pytest.approx(708e-9)
    assert a.transfer_s == pytest.approx(160e-9 + 160e-9)
    assert b.transfer_s == pytest.approx(80e-9 + 80e-9)
    # compute: 64*2 + 32*1 = 160 pJ; memory: 176*8*1 + 104*8*0.5 = 1408 + 416 = 1824 pJ;
    # host link: 1280 + 1280 + 5120 + 128 = 7808 pJ; total 9792 pJ
    e = p.energy_by_component_j
    assert e["compute"] == pytest.approx(160e-12)
    assert e["memory"] == pytest.approx(1824e-12)
    assert e["host_link"] == pytest.approx(7808e-12)
    assert e["device_link"] == 0 and e["static"] == 0
    assert p.energy_j == pytest.approx(9792e-12)
    assert a.energy_j == pytest.approx(128e-12 + 1408e-12 + 1280e-12 + 1280e-12)
    assert p.j_per_token == pytest.approx(9792e-12)  # 1 token
    assert p.tokens_per_s == pytest.approx(1 / 708e-9)
    # the log, in time order: transfer, a, transfer, b, output
    assert [(r.module, r.transfer) for r in p.log] == [
        ("TwoLinears.a", "host->dev-a"), ("TwoLinears.a", ""),
        ("TwoLinears.b", "dev-a->host->dev-b"), ("TwoLinears.b", ""), ("(output)", "dev-b->host")]
    # starts: 0; 160; 160 + 176 = 336; 336 + 160 + 80 = 576; 576 + 52 = 628 ns
    assert [r.start_s for r in p.log] == pytest.approx([0, 160e-9, 336e-9, 576e-9, 628e-9])


def test_the_prediction_stands_beside_the_bound_by_hand(two):
    # the same placement, each op predicted run eager: 1 us per op call, GEMVs at half of
    # each device's peaks (op_efficiency gemv 0.5); the views (aten.t, no byte) pay their call
    eff = {"gemv": 0.5}
    devices = {"dev-a": replace(DEV_A, op_overhead_s={"eager": 1e-6}, op_efficiency=eff),
               "dev-b": replace(DEV_B, op_overhead_s={"eager": 1e-6}, op_efficiency=eff)}
    s = simulate(two, {"a": "dev-a", "b": "dev-b,t"}, devices=devices, host=HOST)
    p = s.phases["decode"]
    assert p.time_s == pytest.approx(708e-9)  # the bound, as above
    # a: t + mm = 2 calls x 1 us + max(64 / 0.5e9 = 128 ns, 176 B / 0.5e9 = 352 ns) = 2,352 ns
    assert p.devices["dev-a"].predicted_busy_s == pytest.approx(2352e-9)
    # b: 2 x 1 us + max(32 / 2e9 = 16 ns, 104 B / 1e9 = 104 ns) = 2,104 ns
    assert p.devices["dev-b"].predicted_busy_s == pytest.approx(2104e-9)
    # the same transfers: 160 + 160 + 80 + 80 = 480 ns; 480 + 2,352 + 2,104 = 4,936 ns
    assert p.predicted_s == pytest.approx(4936e-9)
    assert p.predicted_tokens_per_s == pytest.approx(1 / 4936e-9)
    assert s.options["execution"] == "eager"
    doc = s.to_dict()["phases"]["decode"]
    assert doc["predicted_s"] == pytest.approx(4936e-9)
    assert "predicted" in s.report(log_summary=True)
    # peak_fraction scales the bound alone: the prediction's rates are achievable already
    slow = simulate(two, {"a": "dev-a", "b": "dev-b,t"}, devices=devices, host=HOST,
                    peak_fraction=0.5).phases["decode"]
    assert slow.time_s > p.time_s and slow.predicted_s == pytest.approx(4936e-9)
    assert simulate(two, {"a": "dev-a"}, devices=devices, host=HOST,
                    execution=None).phases["decode"].predicted_s is None
    with pytest.raises(ValueError, match="unknown execution 'fast'"):
        simulate(two, {"a": "dev-a"}, devices=devices, host=HOST, execution="fast")


def test_under_cuda_graphs_each_device_launches_its_own_graph(two):
    # dev-a launches a graph of 5 us a step, dev-b one of 7 us; no per-kernel launch
    eff = {"gemv": 0.5}
    devices = {"dev-a": replace(DEV_A, op_overhead_s={"cudagraphs": 5e-6}, op_efficiency=eff),
               "dev-b": replace(DEV_B, op_overhead_s={"cudagraphs": 7e-6}, op_efficiency=eff)}
    p = simulate(two, {"a": "dev-a", "b": "dev-b,t"}, devices=devices, host=HOST,
                 execution="cudagraphs").phases["decode"]
    # a: 352 ns of work + 5 us; b: 104 ns + 7 us (the views are no kernels in a graph)
    assert p.devices["dev-a"].predicted_busy_s == pytest.approx(5352e-9)
    assert p.devices["dev-b"].predicted_busy_s == pytest.approx(7104e-9)
    # + the same 480 ns of transfers: 480 + 5,352 + 7,104 = 12,936 ns
    assert p.predicted_s == pytest.approx(12936e-9)


@pytest.mark.parametrize("execution", ["eager", "compiled", "cudagraphs"])
def test_on_one_device_the_prediction_is_predicts(tiny_counter, execution):
    spec = perfcounter.get_device_spec("h100-sxm")
    s = simulate(tiny_counter, None, default_device="h100-sxm", execution=execution)
    for label, stats in tiny_counter.counts.items():
        regime, program = phase_program(spec, execution, label)
        whole = predict(stats.trace, program, regime)
        # every record's share, views included, on the one device: the phase's prediction
        # as count prices it (a prefill compiled for any prompt length, phase_program; less
        # the host link, which the simulation prices as its own transfers)
        assert s.phases[label].devices["h100-sxm"].predicted_busy_s == pytest.approx(
            whole.latency_s - whole.host_link_s)


def test_without_t_the_change_of_device_still_moves_the_input(two):
    # no link between dev-a and dev-b: through the host, as with t (UPMEM moves the input
    # whenever the device changes); the same 708 ns
    assert sim(two, {"a": "dev-a", "b": "dev-b"}).phases["decode"].time_s == pytest.approx(708e-9)
    # t on a module that stays on its device sends its input out and back:
    # dev-a -> host 32 / 2e8 = 160 ns, host -> dev-a 32 / 1e8 = 320 ns
    p = sim(two, {"a": "dev-a", "b": "dev-a,t"}).phases["decode"]
    # b on dev-a: max(32 / 1e9, 104 / 1e9) = 104 ns; output 8 / 2e8 = 40 ns
    assert p.time_s == pytest.approx(160e-9 + 176e-9 + 160e-9 + 320e-9 + 104e-9 + 40e-9)


def test_device_link_between_two_devices(two):
    # a 1 GB/s link at 3 pJ/bit: b's 32 B cross in 32 ns, 32*8*3 = 768 pJ, no host leg
    p = sim(two, {"a": "dev-a", "b": "dev-b"}, device_link=Link(1e9, 3.0)).phases["decode"]
    b = p.devices["dev-b"]
    assert b.device_link_bytes == 32 and b.host_to_device_bytes == 0
    assert p.energy_by_component_j["device_link"] == pytest.approx(768e-12)
    assert p.time_s == pytest.approx(160e-9 + 176e-9 + 32e-9 + 52e-9 + 80e-9)
    # a transfer point still goes through the host
    p = sim(two, {"a": "dev-a", "b": "dev-b,t"}, device_link=(1e9, 3.0)).phases["decode"]
    assert p.devices["dev-b"].device_link_bytes == 0 and p.time_s == pytest.approx(708e-9)


def linked(**figures):
    """DEVICES with figures added to both toy devices ({"dev-a": {...}, "dev-b": {...}})."""
    return {name: replace(spec, **figures.get(name, {})) for name, spec in DEVICES.items()}


def test_a_spec_with_a_device_link_prices_the_transfer_over_it_without_an_option(two):
    # dev-a: 1 GB/s @ 2 pJ/bit, dev-b: 2 GB/s @ 4 pJ/bit -> the slower end, 1 GB/s, and
    # the mean, 3 pJ/bit: b's 32 B cross in 32 ns, 32*8*3 = 768 pJ, no host leg
    devices = linked(**{"dev-a": {"device_link_bw": 1e9, "device_link_pj_per_bit": 2.0},
                        "dev-b": {"device_link_bw": 2e9, "device_link_pj_per_bit": 4.0}})
    p = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST,
                 devices=devices).phases["decode"]
    b = p.devices["dev-b"]
    assert b.device_link_bytes == 32 and b.host_to_device_bytes == 0
    assert p.devices["dev-a"].device_to_host_bytes == 0
    assert p.energy_by_component_j["device_link"] == pytest.approx(768e-12)
    assert p.time_s == pytest.approx(160e-9 + 176e-9 + 32e-9 + 52e-9 + 80e-9)
    # the option overrides the specs: 0.5 GB/s @ 1 pJ/bit -> 64 ns, 32*8*1 = 256 pJ
    p = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST, devices=devices,
                 device_link=Link(0.5e9, 1.0)).phases["decode"]
    assert p.time_s == pytest.approx(160e-9 + 176e-9 + 64e-9 + 52e-9 + 80e-9)
    assert p.energy_by_component_j["device_link"] == pytest.approx(256e-12)
    # one end without a link: through the host, as with no link at all (708 ns)
    one = linked(**{"dev-a": {"device_link_bw": 1e9, "device_link_pj_per_bit": 2.0}})
    p = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST, devices=one).phases["decode"]
    assert p.devices["dev-b"].device_link_bytes == 0 and p.time_s == pytest.approx(708e-9)


def test_a_link_without_pj_per_bit_costs_time_and_warns_of_its_0_joules(two):
    devices = linked(**{"dev-a": {"device_link_bw": 1e9}, "dev-b": {"device_link_bw": 1e9}})
    with pytest.warns(UserWarning, match=r"device link dev-a<->dev-b has no pJ/bit"):
        p = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST,
                     devices=devices).phases["decode"]
    assert p.devices["dev-b"].device_link_bytes == 32  # 32 B in 32 ns, 0 J
    assert p.energy_by_component_j["device_link"] == 0
    assert p.time_s == pytest.approx(160e-9 + 176e-9 + 32e-9 + 52e-9 + 80e-9)


def test_shipped_nvlink_figures_price_a_gpu_to_gpu_transfer(two):
    # h100-sxm -> a tp=2 group of h100-sxm: NVLink, 450 GB/s each way, as NCCL achieves it
    # (pricing/links.py, kind "nvlink": 0.8 of it, 0.6 us a message): 32 B in
    # 32 / 360e9 s + 0.6 us = 0.0889 ns + 600 ns
    with pytest.warns(UserWarning, match="has no pJ/bit"):
        p = simulate(two, {"a": "h100-sxm", "b": "h100-sxm,tp=2"}, host=HOST).phases["decode"]
    hop = next(r for r in p.log if r.transfer == "h100-sxm->h100-sxm,tp=2")
    assert hop.bytes == 32 and hop.duration_s == pytest.approx(32 / 360e9 + 0.6e-6, rel=1e-12)
    assert p.devices["h100-sxm,tp=2"].host_to_device_bytes == 0


def test_a_tp2_all_reduce_has_one_price_whether_a_mapping_or_the_parallel_flag_asks():
    from perfcounter.pricing import collectives, links
    from test_parallel import ALL_REDUCE, record

    torch.manual_seed(0)
    counter = count(Block(), torch.ones(1, 4))
    h100 = perfcounter.get_device_spec("h100-sxm", dtype=F32)
    with pytest.warns(UserWarning, match="has no pJ/bit"):
        p = simulate(counter, {"mlp": "h100-sxm,tp=2"}, host=HOST).phases["decode"]
    row = next(r for r in p.log if r.transfer == "all-reduce x2")
    # the MLP's output [1, 4] float32 = 16 B; a ring over 2 sends 2 * 1/2 * 16 = 16 B a rank
    assert row.bytes == 16
    # --tensor_parallel_size 2 prices a rank's all-reduce record of the same 16 B so: NVLink
    # 450e9 x 0.8 = 360e9 B/s, 0.6 us a step: 16 / 360e9 + 2 * 1 * 0.6 us
    flag = collectives.record_seconds(record(ALL_REDUCE, 16, 2), h100)
    assert row.duration_s == flag == pytest.approx(16 / 360e9 + 1.2e-6, rel=1e-12)
    assert links.within(h100, 2).kind == "nvlink"
    # the same bytes over a link given by its figures alone (450 GB/s, "direct": no latency,
    # the full bandwidth): the only difference is what the link says: 16 / 450e9
    given = simulate(counter, {"mlp": "h100-sxm,tp=2"}, host=HOST,
                     interconnect=Link(450e9, 1.0)).phases["decode"]
    row = next(r for r in given.log if r.transfer == "all-reduce x2")
    assert row.duration_s == pytest.approx(16 / 450e9, rel=1e-12)
    assert row.duration_s == collectives.collective_s("all_reduce", 16, 2, Link(450e9, 1.0))


def test_the_interconnect_comes_from_the_spec_unless_given():
    torch.manual_seed(0)
    counter = count(Block(), torch.ones(1, 4))
    devices = linked(**{"dev-a": {"interconnect_bw": 1e9, "interconnect_pj_per_bit": 1.0}})
    # as test_tp2_mlp_all_reduce_bytes with interconnect=Link(1e9, 1.0): 16 B per device in
    # 16 ns, 2 * 16 * 8 * 1 = 256 pJ, no note about a missing interconnect
    s = simulate(counter, {"mlp": "dev-a,tp=2"}, host=HOST, devices=devices)
    p = s.phases["decode"]
    assert p.devices["dev-a,tp=2"].allreduce_bytes == 16
    assert p.energy_by_component_j["device_link"] == pytest.approx(256e-12)
    assert not any("interconnect" in n for n in s.notes)
    given = sim(counter, {"mlp": "dev-a,tp=2"}, interconnect=Link(1e9, 1.0)).phases["decode"]
    assert p.time_s == pytest.approx(given.time_s)
    # the option overrides the spec: 2 GB/s -> 8 ns instead of 16
    fast = simulate(counter, {"mlp": "dev-a,tp=2"}, host=HOST, devices=devices,
                    interconnect=Link(2e9, 1.0)).phases["decode"]
    assert fast.time_s == pytest.approx(p.time_s - 8e-9)


def test_peak_fraction_from_the_spec_and_the_option_overriding_it(two):
    devices = linked(**{"dev-a": {"peak_fraction": 0.5}})
    # dev-a at half its peak: a takes 2 * 176 = 352 ns; the rest as before
    s = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST, devices=devices)
    p = s.phases["decode"]
    assert p.time_s == pytest.approx(708e-9 + 176e-9)
    assert p.devices["dev-a"].peak_fraction == 0.5 and p.devices["dev-b"].peak_fraction == 1
    # an option for that device, or for every device, wins over the spec
    for option in ({"dev-a": 1.0}, 1.0):
        p = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST, devices=devices,
                     peak_fraction=option).phases["decode"]
        assert p.time_s == pytest.approx(708e-9), option
    # an option for another device leaves dev-a's own
    p = simulate(two, {"a": "dev-a", "b": "dev-b"}, host=HOST, devices=devices,
                 peak_fraction={"dev-b": 1.0}).phases["decode"]
    assert p.time_s == pytest.approx(708e-9 + 176e-9)


def test_overlap_takes_the_longer_of_a_transfer_and_the_compute_after_it(two):
    # windows: [160 | 176] [160+80 | 52] [80 | 0] -> max: 176 + 240 + 80 = 496 ns
    p = sim(two, {"a": "dev-a", "b": "dev-b"}, overlap=True).phases["decode"]
    assert p.time_s == pytest.approx(496e-9)


def test_peak_fraction_slows_ops_not_links(two):
    # dev-a at half its peak: a takes 2 * 176 = 352 ns; the rest as before
    p = sim(two, {"a": "dev-a", "b": "dev-b"}, peak_fraction={"dev-a": 0.5}).phases["decode"]
    assert p.time_s == pytest.approx(708e-9 + 176e-9)
    p = sim(two, {"a": "dev-a", "b": "dev-b"}, peak_fraction=0.5).phases["decode"]
    assert p.time_s == pytest.approx(708e-9 + 176e-9 + 52e-9)


def test_unmapped_module_runs_where_the_previous_ran_or_on_the_default(two):
    # b unmapped: stays on dev-a (max(32, 104) / 1e9 = 104 ns), output dev-a -> host 8 / 2e8
    p = sim(two, {"a": "dev-a"}).phases["decode"]
    assert set(p.devices) == {"dev-a"}
    assert p.time_s == pytest.approx(160e-9 + 176e-9 + 104e-9 + 40e-9)
    # --default_device: the root and b go to dev-b; the phase's input (x, 16 B) enters dev-b
    p = sim(two, {"a": "dev-a"}, default_device="dev-b").phases["decode"]
    assert p.devices["dev-b"].host_to_device_bytes == 16 + 32
    assert p.devices["dev-a"].host_to_device_bytes == 16


def test_timeline_without_children_falls_back_to_first_run_order(two):
    trace = two.counts["decode"].trace
    import copy
    old = copy.deepcopy(trace)
    for m in old.modules:
        m.children = []
    kinds = [(s.kind, s.module) for s in timeline(old)]
    assert kinds == [(Ev.ENTER, "TwoLinears"), (Ev.ENTER, "TwoLinears.a"),
                     (Ev.RUN, "TwoLinears.a"), (Ev.EXIT, "TwoLinears.a"),
                     (Ev.ENTER, "TwoLinears.b"), (Ev.RUN, "TwoLinears.b"),
                     (Ev.EXIT, "TwoLinears.b"), (Ev.EXIT, "TwoLinears")]
    p = sim({"decode": old}, {"a": "dev-a", "b": "dev-b"}).phases["decode"]
    assert p.time_s == pytest.approx(708e-9)


# -- MoE and tensor parallelism --------------------------------------------------------------
def test_m_sends_the_shared_input_once_for_four_experts():
    torch.manual_seed(0)
    counter = count(Experts(), torch.ones(1, 4))
    # x is [1, 4] float32 = 16 B. With t, each expert receives it: host -> dev-a once,
    # then dev-a -> host -> dev-a three times: 4 * 16 = 64 B in, 3 * 16 = 48 B out (+ output)
    t = sim(counter, {"experts.*": "dev-a,t"}).phases["decode"].devices["dev-a"]
    assert t.host_to_device_bytes == 64
    assert t.device_to_host_bytes == 48 + 16  # the summed output [1, 4] goes back: 16 B
    # with m the four siblings share one transfer: 16 B in, only the output out
    m = sim(counter, {"experts.*": "dev-a,m"}).phases["decode"].devices["dev-a"]
    assert m.host_to_device_bytes == 16 and m.device_to_host_bytes == 16


def test_tp2_mlp_all_reduce_bytes():
    torch.manual_seed(0)
    counter = count(Block(), torch.ones(1, 4))
    one = sim(counter, {"mlp": "dev-a"}).phases["decode"].devices["dev-a"]
    p = sim(counter, {"mlp": "dev-a,tp=2"}, interconnect=Link(1e9, 1.0)).phases["decode"]
    two = p.devices["dev-a,tp=2"]
    # the MLP's output [1, 4] float32 = 16 B; a ring all-reduce over N = 2 sends
    # 2 * (N - 1) / N * 16 = 16 B per device: 16 / 1e9 = 16 ns, 2 * 16 * 8 * 1 = 256 pJ
    assert two.allreduce_bytes == 16
    assert p.energy_by_component_j["device_link"] == pytest.approx(256e-12)
    # weights and heads split: each op takes half the time
    assert two.busy_s == pytest.approx(one.busy_s / 2)
    assert two.transfer_s == pytest.approx(one.transfer_s + 16e-9)
    # without an interconnect the all-reduce goes through the host link:
    # 16 / 2e8 + 16 / 1e8 = 240 ns; 2 * 16 * 8 * (5 + 10) = 3840 pJ
    p = sim(counter, {"mlp": "dev-a,tp=4"}).phases["decode"]
    four = p.devices["dev-a,tp=4"]
    assert four.allreduce_bytes == 24  # 2 * 3 / 4 * 16
    assert any("interconnect" in n for n in sim(counter, {"mlp": "dev-a,tp=2"}).notes)


# -- agreement with the single-device roofline, residency -------------------------------------
@pytest.mark.parametrize("device", ["h100-sxm", "pim-ai-4chip"])
def test_everything_on_one_device_equals_the_single_device_roofline(tiny_counter, device):
    from perfcounter.devices import get_device_spec
    from perfcounter.pricing.energy import energy
    from perfcounter.pricing.roofline import roofline
    spec = get_device_spec(device)
    s = simulate(tiny_counter, {"Transformer": device}, host=HOST, elementwise_model="upmem")
    for label, stats in tiny_counter.counts.items():
        line = roofline(stats.trace, spec, "per_op")
        joules = energy(stats.trace, spec, stats.trace.per_op_bytes, line)
        p = s.phases[label]
        assert p.time_s == pytest.approx(line.latency_s, rel=1e-9)
        assert p.energy_j == pytest.approx(joules.total_j, rel=1e-9)
        d = p.devices[spec.name]
        assert (d.host_to_device_bytes, d.device_to_host_bytes) == (
            line.host_to_device_bytes, line.device_to_host_bytes)
    # the empty mapping with that device as the host: no link at all, the ops' roofline
    s = simulate(tiny_counter, host=spec, elementwise_model="upmem")
    for label, stats in tiny_counter.counts.items():
        assert s.phases[label].time_s == pytest.approx(roofline(stats.trace, spec).ops_s)


def test_mask_and_rope_table_never_cross_a_link(tiny_counter):
    from perfcounter.devices import get_device_spec
    from perfcounter.pricing.roofline import host_link_bytes, roofline
    prefill = tiny_counter.counts["prefill"].trace
    # what crosses host -> device is the token ids and positions: [1, 5] + [5] int64 =
    # 40 + 40 = 80 B, not the causal mask rows or freqs_cis rows the model made
    assert host_link_bytes(prefill)[0] == 80
    assert roofline(prefill, get_device_spec("pim-ai-4chip")).host_to_device_bytes == 80
    # decode: 2 steps of [1, 1] + [1] int64 = 2 * 16 = 32 B
    assert host_link_bytes(tiny_counter.counts["decode"].trace)[0] == 32
    # every module on the device (embedding included): only those bytes enter it
    s = simulate(tiny_counter, {"Transformer": "dev-a"}, host=HOST, devices=DEVICES)
    assert s.phases["prefill"].devices["dev-a"].host_to_device_bytes == 80
    assert s.phases["decode"].devices["dev-a"].host_to_device_bytes == 32
    # attention on another device receives its input x (not the mask or freqs_cis):
    # per layer [1, 5, 32] float32 = 640 B, 2 layers
    s = simulate(tiny_counter, {"Transformer": "dev-a", "attention": "dev-b"}, host=HOST,
                 devices=DEVICES)
    assert s.phases["prefill"].devices["dev-b"].host_to_device_bytes == 2 * 640


def test_elementwise_model():
    from perfcounter.devices import get_device_spec
    pim = get_device_spec("pim-ai-4chip")
    assert elementwise_spec(pim, "roofline").rmsnorm_ns_per_element is None
    assert elementwise_spec(pim, "upmem") is pim  # its own 0.1 / 0.15 / 0.275 ns
    phone = get_device_spec("upmem-snapdragon8gen3")  # a UPMEM profile without them
    up = elementwise_spec(phone, "upmem")
    assert (up.softmax_ns_per_element, up.silu_ns_per_element,
            up.rmsnorm_ns_per_element) == (0.4, 0.6, 1.1)
    datasheet = get_device_spec("h100-sxm")  # not UPMEM's: no defaults
    assert elementwise_spec(datasheet, "upmem") is datasheet
    # the spec's `profile` decides, not the text of its sources: a17-pro cites UPMEM's
    # A17Pro profile for some figures but is no UPMEM profile; a user spec marked upmem is
    a17 = get_device_spec("a17-pro")
    assert "UPMEM" in a17.source["bandwidth"] and elementwise_spec(a17, "upmem") is a17
    mine = elementwise_spec(replace(DEV_A, profile="upmem"), "upmem")
    assert (mine.softmax_ns_per_element, mine.rmsnorm_ns_per_element) == (0.4, 1.1)


# -- mapping keys and device names -------------------------------------------------------------
def test_keys_match_leaf_class_glob_and_path_the_most_specific_winning(tiny_counter):
    modules = tiny_counter.counts["prefill"].trace.modules
    m = Mapping.load({"RMSNorm": "dev-a", "attention_norm": "dev-b",
                      "layers.1.attention_norm": "host", "Transformer.layers.?.ffn_norm": "dev-b"})
    placed, used = m.place(modules)
    dev = {p.split(".", 1)[1]: v.assignment.device for p, v in placed.items()
           if v.assignment is not None and "norm" in p}
    assert dev == {"layers.0.attention_norm": "dev-b",  # name beats class
                   "layers.1.attention_norm": "host",  # path beats name
                   "layers.0.ffn_norm": "dev-b", "layers.1.ffn_norm": "dev-b",  # glob beats class
                   "norm": "dev-a"}
    # children inherit their parent's placement; globs match with or without the root
    placed, _ = Mapping.load({"layers.1": "dev-b"}).place(modules)
    assert placed["Transformer.layers.1.attention.wqkv"].assignment.device == "dev-b"
    assert placed["Transformer.layers.0.attention"].assignment is None
    glob = Mapping.load({"layers.1?.*": "dev-a"})
    assert glob.match("LlamaForCausalLM.model.layers.12.mlp.up_proj", "Linear") is not None
    assert glob.match("model.layers.12.mlp", "LlamaMLP") is not None  # without the root
    assert glob.match("LlamaForCausalLM.model.layers.1.mlp", "LlamaMLP") is None
    assert glob.match("LlamaForCausalLM.model.layers.12", "LlamaDecoderLayer") is None


def test_device_names_resolve_as_upmem_writes_them():
    from perfcounter.devices import get_device_spec
    host = get_device_spec("generic-cpu")
    for name, want in [("PIM-AI-4chip", "pim-ai-4chip"), ("PIM_AI_4chip", "pim-ai-4chip"),
                       ("pim_ai_4CHIP", "pim-ai-4chip"), ("H100", "upmem-h100"),
                       ("Snapdragon8gen3", "upmem-snapdragon8gen3"), ("A17Pro", "upmem-a17pro"),
                       ("Dimensity9300", "upmem-dimensity9300"), ("DGX100", "upmem-dgx100"),
                       ("H100_x4", "upmem-h100-x4"), ("h100-sxm", "h100-sxm")]:
        assert resolve_device(name, host).name == want, name
    assert resolve_device("HOST", host) is host


# -- errors: one line, the value and what is valid ----------------------------------------------
@pytest.mark.parametrize("mapping, match", [
    ({"a": "dev-c"}, r"mapping entry 'a': unknown device 'dev-c'; did you mean .*dev-a"),
    ({"a": "dev-a,x"}, r"mapping entry 'a': unknown option 'x' in 'dev-a,x'; valid options: t"),
    ({"a": "dev-a,tp=0"}, r"mapping entry 'a': 'tp=0' needs a whole number from 1 to 4,096"),
    ({"a": "dev-a,tp=1000000000"}, r"'tp=1000000000' needs a whole number from 1 to 4,096"),
    ({"a": "dev-a,tp=two"}, r"'tp=two' needs a whole number"),
    ({"a": ""}, r"mapping entry 'a': expected 'device\[,options\]' as a string, got ''"),
    ({"a": 3}, r"mapping entry 'a': expected 'device\[,options\]' as a string, got 3"),
    ({"a": ",t"}, r"mapping entry 'a': ',t' names no device"),
    ({" a": "dev-a"}, r"mapping key ' a': expected a module name"),
    ({"aa": "dev-a"},
     r"mapping key 'aa' \(dev-a\) matches no module of the model; did you mean 'a'"),
    ({"a": "dev-a", "Linear": "dev-b", "*.a": "dev-b", "T*.?": "dev-a"},  # 2 literals each
     r"module 'TwoLinears.a' \(Linear\): keys '\*.a', 'T\*.\?' match it equally"),
])
def test_mapping_errors(two, mapping, match):
    with pytest.raises(MappingError, match=match):
        sim(two, mapping)


def test_unmatched_keys_warn_when_allowed(two):
    with pytest.warns(UserWarning, match="'rotatory_emb'.*matches no module"):
        s = sim(two, {"a": "dev-a", "rotatory_emb": "dev-b"}, allow_unmatched=True)
    assert any("rotatory_emb" in n for n in s.notes)


def test_bad_files_and_options(two, tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("a: [dev-a\n")
    with pytest.raises(MappingError, match=r"m.yaml: not a valid mapping file"):
        sim(two, bad)
    bad.write_text("- dev-a\n")
    with pytest.raises(MappingError, match=r"expected a non-empty mapping .* got list"):
        sim(two, bad)
    with pytest.raises(MappingError, match=r"cannot read mapping file .*nope.yaml"):
        sim(two, tmp_path / "nope.yaml")
    with pytest.raises(MappingError, match=r"unknown elementwise_model 'ns'; valid: roofline"):
        sim(two, {"a": "dev-a"}, elementwise_model="ns")
    with pytest.raises(MappingError, match=r"peak_fraction of 'dev-a': expected a number in"):
        sim(two, {"a": "dev-a"}, peak_fraction={"dev-a": 1.5})
    with pytest.raises(MappingError, match=r"unknown phase 'prefill'; phases: decode"):
        sim(two, {"a": "dev-a"}, labels=["prefill"])
    with pytest.raises(MappingError, match=r"device_link: a link's bandwidth must be a finite "
                                           r"number of B/s > 0, got 0"):
        sim(two, {"a": "dev-a"}, device_link=(0, 1))
    with pytest.raises(MappingError, match=r"interconnect: a link's bandwidth must be a finite "
                                           r"number of B/s > 0, got inf"):
        sim(two, {"a": "dev-a"}, interconnect=(float("inf"), 1))
    with pytest.raises(MappingError, match=r"device_link: a link's energy must be a finite number "
                                           r"of pJ/bit >= 0 \(or unknown\), got -1"):
        sim(two, {"a": "dev-a"}, device_link=(1e9, -1))
    with pytest.raises(MappingError, match=r"device_link: expected Link"):
        sim(two, {"a": "dev-a"}, device_link=(1e9,))
    with pytest.raises(TypeError, match=r"simulate\(\) takes a TransformerPerformanceCounter"):
        simulate(42)
    with pytest.raises(MappingError, match=r"^--default_device: unknown device 'dev-z'"):
        sim(two, {"a": "dev-a"}, default_device="dev-z")
    with pytest.raises(MappingError, match=r"^--devices: unknown device 'dev-z'"):
        search_mapping(two, ["dev-a", "dev-z"], host=HOST, devices=DEVICES)
    with pytest.raises(MappingError, match=r"unknown search objective 'speed'; valid: energy"):
        search_mapping(two, ["dev-a"], "speed", host=HOST, devices=DEVICES)
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"a": "dev-a", "b": "dev-b,t"}))
    assert sim(two, good).phases["decode"].time_s == pytest.approx(708e-9)
    assert sim(two, "{a: dev-a, b: 'dev-b,t'}").phases["decode"].time_s == pytest.approx(708e-9)


# -- results as plain data -----------------------------------------------------------------------
def test_to_json_is_plain_data_written_atomically(two, tmp_path):
    s = sim(two, {"a": "dev-a", "b": "dev-b,t"})
    path = tmp_path / "sim.json"
    doc = s.to_json(path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    phase = doc["phases"]["decode"]
    assert set(phase["energy_by_component_j"]) == set(COMPONENTS)
    assert phase["time_s"] == pytest.approx(708e-9) and phase["energy_j"] == pytest.approx(9792e-12)
    for d in phase["devices"].values():
        assert set(d["energy_by_component_j"]) == set(COMPONENTS)
        assert {"time_s", "energy_j"} <= set(d)
    assert doc["mapping"] == {"a": "dev-a", "b": "dev-b,t"}
    assert [m["path"] for m in phase["modules"]] == ["TwoLinears", "TwoLinears.a", "TwoLinears.b"]
    text = s.report(layers=True, functions=True, log=True, log_summary=True)
    assert "dev-a->host->dev-b" in text and "aten.mm" in text and "TwoLinears.b" in text


def test_perfcounter_simulate_is_the_function(two):
    import perfcounter.simulation.run  # noqa: F401  (importing the module leaves the name alone)
    assert perfcounter.simulate is perfcounter.simulation.run.simulate
    assert perfcounter.simulate(two, host=HOST).phases["decode"].time_s > 0
    assert PREPARED.cache_info()["hits"] > 0


# -- search ----------------------------------------------------------------------------------
def test_search_finds_the_cheapest_placement_of_each_kind(tiny_counter):
    groups = kind_keys(tiny_counter.counts["prefill"].trace.modules)
    assert groups == {"attention": ["Attention"], "attention_proj": ["wqkv", "wo"],
                      "norm": ["RMSNorm"], "mlp": ["FeedForward"], "lm_head": ["output"]}
    found = search_mapping(tiny_counter, ["dev-a", "dev-b"], "energy", host=HOST,
                           devices=DEVICES)
    assert found.tried == 2 ** 5
    kinds = list(groups)
    every = [sim(tiny_counter, {k: d for kind, d in zip(kinds, combo) for k in groups[kind]},
                 detail=False).energy_j
             for combo in itertools.product(["dev-a", "dev-b"], repeat=len(kinds))]
    assert found.simulation.energy_j == pytest.approx(min(every))
    assert min(every) < max(every)  # the choice matters
    again = sim(tiny_counter, found.mapping_text())
    assert again.energy_j == pytest.approx(found.simulation.energy_j)
    slow = search_mapping(tiny_counter, ["dev-a"], "latency", max_latency_ms=1e-9, host=HOST,
                          devices=DEVICES)
    assert not slow.feasible and "none meets" in slow.mapping_text()


# -- the command -----------------------------------------------------------------------------------
def _config(tmp_path):
    from dataclasses import asdict
    path = tmp_path / "config.json"
    path.write_text(json.dumps(asdict(tiny_args())))
    return path


def test_cli_simulate_writes_json_and_exits_2_on_errors(tmp_path, capsys):
    from perfcounter.cli.main import main
    config, out = _config(tmp_path), tmp_path / "sim.json"
    mapping = tmp_path / "map.yaml"
    mapping.write_text("wqkv: PIM-AI-4chip,t\nwo: PIM_AI_4chip\noutput: H100,t\n")
    argv = ["simulate", "--model", str(config), "--mapping", str(mapping), "--prompt_length",
            "5", "--max_new_tokens", "3", "--precision", "float32", "--save_path", str(out),
            "--print_log_summary", "--report_layers", "--print_log", "--report_functions"]
    assert main(argv=argv) == 0
    text = capsys.readouterr().out
    assert "pim-ai-4chip" in text and "upmem-h100" in text and "decode: per device" in text
    doc = json.loads(out.read_text())
    assert set(doc["phases"]) == {"prefill", "decode"}
    mapping.write_text("wqkv: PIM-AI-4chip,q\n")
    assert main(argv=argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("perfcounter simulate: error: mapping entry 'wqkv': unknown option 'q' in "
                   "'PIM-AI-4chip,q'; valid options: t (transfer point), m (MoE transfer point),"
                   " tp=N (tensor parallel degree)")
    assert main(argv=["simulate", "--model", "llama-2-7bx"]) == 2
    assert "unknown model 'llama-2-7bx'" in capsys.readouterr().err


def test_cli_device_figures_from_yaml_and_options_overriding_them(tmp_path, capsys,
                                                                   monkeypatch):
    from perfcounter.cli.main import main
    from perfcounter.devices import registry
    monkeypatch.setattr(registry, "_user_specs", [])  # the file's entries stay in this test
    devs = tmp_path / "devs.yaml"
    entry = ("    device_type: pim\n    dtype: float32\n    bandwidth_GBs: 1\n"
             "    tflops: 0.001\n    host_to_device_bw_GBs: 0.1\n    device_to_host_bw_GBs: 0.1\n"
             "    device_link_GBs: {link}\n    device_link_pj_per_bit: 1\n")
    devs.write_text("source: test figures\ndevices:\n"
                    "  link-a:\n" + entry.format(link=2) + "    peak_fraction: 0.5\n"
                    "  link-b:\n" + entry.format(link=4))
    mapping = tmp_path / "map.yaml"
    mapping.write_text(f"Attention: '{devs}:link-a'\nFeedForward: '{devs}:link-b'\n")
    out = tmp_path / "sim.json"
    argv = ["simulate", "--model", str(_config(tmp_path)), "--mapping", str(mapping),
            "--prompt_length", "5", "--max_new_tokens", "2", "--precision", "float32",
            "--save_path", str(out)]

    def decode(*extra):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(argv=argv + list(extra)) == 0
        capsys.readouterr()
        return json.loads(out.read_text())["phases"]["decode"]

    # --peak_fraction link-a=1 overrides link-a's own 0.5 (named by its entry, before the
    # mapping has loaded the file)
    full = decode("--peak_fraction", "link-a=1")
    p = decode()
    assert full["devices"]["link-a"]["peak_fraction"] == 1.0 and full["time_s"] < p["time_s"]
    a, b = p["devices"]["link-a"], p["devices"]["link-b"]
    assert a["peak_fraction"] == 0.5 and b["peak_fraction"] == 1.0  # link-a's own figure
    moved = a["device_link_bytes"] + b["device_link_bytes"]
    assert moved > 0  # attention <-> MLP over the specs' link: min(2, 4) = 2 GB/s
    assert p["energy_by_component_j"]["device_link"] == pytest.approx(moved * 8 * 1e-12)
    # --device_link_GBs 1 overrides it: the same bytes take twice as long (1 GB/s, not 2)
    slow = decode("--device_link_GBs", "1", "--device_link_pj_per_bit", "1")
    assert slow["time_s"] - p["time_s"] == pytest.approx(moved / 1e9 - moved / 2e9)


def test_cli_search_prints_a_mapping_file(tmp_path, capsys):
    from perfcounter.cli.main import main
    saved = tmp_path / "best.yaml"
    argv = ["simulate", "--model", str(_config(tmp_path)), "--prompt_length", "5",
            "--max_new_tokens", "2", "--precision", "float32", "--search", "latency",
            "--devices", "PIM-AI-4chip,H100", "--save_mapping", str(saved)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv=argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("# perfcounter simulate --search latency: best of 32 mappings")
    assert set(Mapping.load(saved).to_dict()) == {"Attention", "wqkv", "wo", "RMSNorm",
                                                   "FeedForward", "output"}


# -- agreement with UPMEM where UPMEM is right ---------------------------------------------------
@pytest.fixture(scope="module")
def llama2_7b():
    """Llama-2-7B as transformers builds it, no weights: 8-token prefill, 2 decode steps."""
    from perfcounter.models.args import ModelArgs
    from perfcounter.generation.config_only import count_hf_config, hf_config
    counter = TransformerPerformanceCounter()
    count_hf_config(hf_config(ModelArgs.from_name("llama-2-7b")), counter, batch_size=1, cache="static",
                         prompt_length=8, max_new_tokens=3, dtype=torch.bfloat16)
    return counter


@pytest.mark.parametrize("device, entry", [("PIM-AI-4chip", "pim-ai-4chip"),
                                           ("Snapdragon8gen3", "upmem-snapdragon8gen3"),
                                           ("H100", "upmem-h100")])
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_llama2_7b_decode_on_one_device_is_weight_streaming(llama2_7b, device, entry):
    from perfcounter.devices import get_device_spec
    from perfcounter.trace import ROLES
    spec = get_device_spec(entry)
    decode = llama2_7b.counts["decode"]
    weight = decode.trace.per_op_read[ROLES.index("weight")]
    # 6.61 G parameters streamed per token (the embedding reads one row): ~13.2 GB in bf16
    assert weight / decode.num_tokens == pytest.approx(13.21e9, rel=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # UPMEM profiles price float32 ops at bf16 rates
        p = simulate(llama2_7b, {"LlamaForCausalLM": device}).phases["decode"]
    # time >= weight bytes / bandwidth; energy >= weight bits x pJ/bit + 2 FLOPs per
    # weight (a bf16 weight is 2 B) x pJ/FLOP: UPMEM's model, where it is right
    time_bound = weight / spec.bandwidth
    energy_bound = (weight * 8 * spec.mem_pj_per_bit
                    + weight * spec.pj_per_flop("bfloat16")) * 1e-12
    assert 1.0 <= p.time_s / time_bound <= 1.02
    assert 1.0 <= p.energy_j / energy_bound <= 1.02


def test_the_upmem_example_mapping_keys_that_match_nothing(llama2_7b):
    mixed = {"LlamaRMSNorm": "PIM-AI-1chip,t", "q_proj": "PIM-AI-4chip,t",
             "k_proj": "PIM-AI-4chip", "rotatory_emb": "PIM-AI-4chip", "v_proj": "PIM-AI-4chip",
             "o_proj": "PIM-AI-4chip,t", "output_layernorm": "PIM-AI-1chip,t",
             "gate_proj": "PIM-AI-4chip,t", "up_proj": "PIM-AI-4chip,t",
             "down_proj": "PIM-AI-4chip,t", "norm": "PIM-AI-1chip,t", "lm_head": "PIM-AI-4chip,t"}
    with pytest.raises(MappingError, match="'rotatory_emb'.*did you mean 'rotary_emb'"):
        simulate(llama2_7b, mixed)
    with pytest.warns(UserWarning, match="output_layernorm"):
        s = simulate(llama2_7b, mixed, allow_unmatched=True, detail=False)
    assert set(s.phases["decode"].devices) == {"host", "pim-ai-1chip", "pim-ai-4chip"}


def test_a_counter_saved_as_json_re_prices_the_same(two, tmp_path):
    path = tmp_path / "counts.json"
    two.to_json(path)
    back = TransformerPerformanceCounter.from_json(path)
    assert sim(back, {"a": "dev-a", "b": "dev-b,t"}).phases["decode"].time_s == \
        pytest.approx(708e-9)


def test_generate_py_mapping_prices_the_counted_run(tmp_path, capsys):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "generate", Path(__file__).resolve().parents[1] / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    mapping = tmp_path / "map.yaml"
    mapping.write_text("Attention: PIM-AI-4chip,t\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen.main(config=_config(tmp_path), prompt_length=5, max_new_tokens=3, mapping=mapping,
                 precision="float32", quiet=True, device_spec="generic-cpu", temperature=0)
    out = capsys.readouterr().out
    assert f"Simulated placement: {mapping}" in out and "pim-ai-4chip" in out
    mapping.write_text("Attention: PIM-AI-4chip,x\n")  # fails before counting
    with pytest.raises(MappingError, match="unknown option 'x'"):
        gen.main(config=_config(tmp_path), mapping=mapping, quiet=True)


def test_cli_real_hf_checkpoint_keeps_transformers_names(hf_llama_dir, tmp_path, capsys):
    from perfcounter.cli.main import main
    out = tmp_path / "sim.json"
    argv = ["simulate", "--checkpoint_path", str(hf_llama_dir), "--hf", "--prompt_length", "4",
            "--max_new_tokens", "2", "--precision", "float32", "--mapping",
            "{q_proj: 'PIM-AI-4chip,t', model.layers.1.mlp: H100}", "--save_path", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv=argv) == 0
    doc = json.loads(out.read_text())
    devices = {m["path"]: m["devices"] for m in doc["phases"]["decode"]["modules"]}
    assert devices["LlamaForCausalLM.model.layers.0.self_attn.q_proj"] == ["pim-ai-4chip"]
    assert devices["LlamaForCausalLM.model.layers.1.mlp.down_proj"] == ["upmem-h100"]
