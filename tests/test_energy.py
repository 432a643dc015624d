"""Energy by hand on UPMEM's PIM-AI 4chip profile.

PIM-AI 4chip: memory 409.6 GB/s at 0.95 pJ/bit, 20 TFLOP/s at 0.4 pJ/FLOP,
host->device 12.8 GB/s at 80 pJ/bit, device->host 51.2 GB/s at 20 pJ/bit.

The phase is one decode-step projection: x[1, 64] (input) @ w[64, 128]
(weight) -> [1, 128] (activation), bf16:
  FLOPs = 2 * 1 * 128 * 64 = 16,384
  bytes = (64 + 8192 + 128) * 2 = 16,768
  host->device: x, 64 * 2 = 128 B; device->host: the output, 128 * 2 = 256 B
"""
import pytest
import torch

from perfcounter.devices import DeviceSpec, get_device_spec
from perfcounter.pricing.energy import Energy
from perfcounter.stats import PerformanceStats
from perfcounter.trace import OpRecord, Trace, args_from_text

PIM_FIGURES = dict(device_type="pim", bandwidth=409.6e9, flops_per_s=20e12,
                   dtype=torch.bfloat16, mem_pj_per_bit=0.95,
                   pj_per_flop_by_dtype={"bfloat16": 0.4},
                   host_to_device_bw=12.8e9, host_to_device_pj_per_bit=80.0,
                   device_to_host_bw=51.2e9, device_to_host_pj_per_bit=20.0)


def decode_trace(steps=1):
    rec = OpRecord("aten.mm.default", "M.proj", "bfloat16", args_from_text("[1, 64], [64, 128]", "bfloat16"),
                   steps,
                   16_384 * steps, 16_384 * steps, [8192 * steps, 8192 * steps, 0, 0, 0, 0, 0],
                   [16_384 * steps, 0, 0, 128 * steps], [0, 0, 256 * steps, 0])
    return Trace(records=[rec], compulsory_read=[16_384 * steps, 0, 0, 128 * steps],
                 compulsory_written=[0, 0, 256 * steps, 0], steps=steps)


@pytest.fixture
def pim():
    return DeviceSpec(name="pim-by-hand", **PIM_FIGURES)


def test_pim_energy_by_hand(pim):
    s = PerformanceStats("decode", 1, None, decode_trace(), pim)
    e = s.energy
    assert e.compute_j == pytest.approx(6_553.6e-12)  # 16,384 FLOPs * 0.4 pJ
    assert e.memory_j == pytest.approx(127_436.8e-12)  # 16,768 B * 8 * 0.95 pJ/bit
    # 128 B * 8 * 80 pJ/bit + 256 B * 8 * 20 pJ/bit = 81,920 + 40,960 = 122,880 pJ
    assert e.host_link_j == pytest.approx(122_880e-12)
    assert e.static_j is None  # the profile gives no static power
    assert s.energy_j == pytest.approx(256_870.4e-12)  # 6,553.6 + 127,436.8 + 122,880
    assert s.energy_per_token_j == pytest.approx(256_870.4e-12)  # one token


def test_pim_roofline_by_hand(pim):
    line = PerformanceStats("decode", 1, None, decode_trace(), pim).roofline
    assert line.compute_s == pytest.approx(8.192e-10)  # 16,384 / 20e12
    assert line.memory_s == pytest.approx(4.09375e-8)  # 16,768 / 409.6e9
    assert line.host_link_s == pytest.approx(1.5e-8)  # 128 / 12.8e9 + 256 / 51.2e9
    assert line.latency_s == pytest.approx(5.59375e-8)
    assert line.bound == "memory"


def test_registry_entry_gives_the_same_energy(pim):
    spec = get_device_spec("pim-ai-4chip")
    by_hand = PerformanceStats("decode", 1, None, decode_trace(), pim)
    registry = PerformanceStats("decode", 1, None, decode_trace(), spec)
    assert registry.energy_j == pytest.approx(by_hand.energy_j)
    assert registry.roofline_latency == pytest.approx(by_hand.roofline_latency)


def test_static_power_over_roofline_time():
    spec = DeviceSpec(name="pim-static", static_w=2.0, **PIM_FIGURES)
    s = PerformanceStats("decode", 1, None, decode_trace(), spec)
    assert s.energy.static_j == pytest.approx(2.0 * 5.59375e-8)  # W * roofline seconds
    assert s.energy_j == pytest.approx(256_870.4e-12 + 1.11875e-7)


def test_energy_per_token_over_accumulated_steps(pim):
    # 4 decode steps of one token: four times the energy, same energy per token
    s = PerformanceStats("decode", 4, None, decode_trace(steps=4), pim)
    assert s.energy_j == pytest.approx(4 * 256_870.4e-12)
    assert s.energy_per_token_j == pytest.approx(256_870.4e-12)


def test_compulsory_io_prices_compulsory_bytes(pim):
    t = decode_trace()
    t.compulsory_read = [8_192, 0, 0, 128, 0]  # pretend half the weight was shared
    s = PerformanceStats("decode", 1, None, t, pim, io_model="compulsory")
    # (8,192 + 128 + 256) B * 8 * 0.95 pJ/bit = 65,177.6 pJ
    assert s.energy.memory_j == pytest.approx(65_177.6e-12)


def test_missing_figures_are_none_not_zero():
    spec = DeviceSpec(device_type="cuda", name="bare", bandwidth=1e9, flops_per_s=1e12,
                      dtype=torch.bfloat16)
    s = PerformanceStats("decode", 1, None, decode_trace(), spec)
    assert s.energy.compute_j is None and s.energy.memory_j is None
    assert s.energy_j is None and s.energy_per_token_j is None
    assert Energy(1.0, 2.0, None, None).total_j == 3.0  # unknown link/static count as 0
    assert Energy(1.0, 2.0, 0.5, 0.25).per_token_j(0) is None


def test_integer_ops_use_the_compute_dtype_silently(pim, recwarn):
    rec = OpRecord("aten.add.Tensor", "M", "int64", args_from_text("[6], 1", "int64"),
                   1, 6, 6, [6, 0, 0, 0, 0, 0, 0],
                   [0, 0, 48, 0, 0], [0, 0, 48, 0, 0])
    s = PerformanceStats("p", 1, None, Trace(records=[rec]), pim)
    assert s.energy.compute_j == pytest.approx(6 * 0.4e-12)
    assert s.roofline.compute_s == pytest.approx(6 / 20e12)
    assert not [w for w in recwarn if "int64" in str(w.message)]


def test_one_fallback_rule_for_a_missing_pj_per_flop(monkeypatch):
    import perfcounter.devices.spec as spec_module
    monkeypatch.setattr(spec_module, "_warned", set())
    # the compute dtype is bfloat16, the table has float32 only: every dtype without its own
    # figure uses the compute dtype's, else the first listed (here float32's 84.6 pJ)
    spec = DeviceSpec(name="cpu-by-hand", bandwidth=50e9, flops_per_s=1e12, dtype=torch.bfloat16,
                      mem_pj_per_bit=20.0, pj_per_flop_by_dtype={"float32": 84.6})
    with pytest.warns(UserWarning, match="no pJ/FLOP figure for bfloat16; using its float32"):
        assert spec.pj_per_flop(torch.bfloat16) == 84.6
    assert spec.pj_per_flop("int8") == 84.6
    stats = PerformanceStats("decode", 1, trace=decode_trace(), device_spec=spec)
    # 16,384 FLOPs * 84.6 pJ = 1.386 µJ, + 16,768 B * 8 * 20 pJ = 2.683 µJ -> 4.069 µJ
    assert stats.energy.compute_j == pytest.approx(16_384 * 84.6e-12)
    assert stats.energy_j == pytest.approx(16_384 * 84.6e-12 + 16_768 * 8 * 20e-12)
