"""The `perfcounter` command: `devices` table and details, `calibrate` measuring and writing."""
import json
import re

import pytest
import torch

from perfcounter import devices
from perfcounter.devices import calibrate as cal_mod
from perfcounter.devices import calibration_check, calibration_parts
from perfcounter.devices import registry
from perfcounter.devices import spec as spec_module
from perfcounter.cli.main import main
from perfcounter.devices import get_device_spec, list_device_specs


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_user_specs", [])
    monkeypatch.setattr(spec_module, "_warned", set())
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))


def test_devices_table(capsys):
    assert main(argv=["devices"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "type", "memory", "bandwidth", "dtype", "bf16",
                              "TFLOP/s", "balance", "source"]
    rows = {line.split()[0]: line for line in out[2:] if line and not line.startswith(" ")}
    assert set(list_device_specs()) <= set(rows)
    # h100-sxm: 81559 MiB as reported = 85.52 GB, shown to the GB: 86 GB; 3,350 GB/s,
    # 989.5 bf16 TFLOP/s, 989.5e12 / 3.35e12 = 295.4 FLOP/B
    assert re.search(r"h100-sxm\s+cuda\s+86 GB\s+3,350 GB/s\s+bfloat16\s+989\.5\s+295\.4 FLOP/B"
                     r"\s+NVIDIA H100", rows["h100-sxm"])
    # t4 has no bfloat16: the column says so; 65e12 / 320e9 = 203.1 FLOP/B at float16; its
    # 15360 MiB reported = 16.11 GB, shown as 16 GB
    assert re.search(r"t4\s+cuda\s+16 GB\s+320 GB/s\s+float16\s+-\s+203\.1 FLOP/B", rows["t4"])


def test_devices_filter_detail_and_json(capsys):
    assert main(argv=["devices", "--type", "pim"]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    names = [ln.split()[0] for ln in lines if ln and ln[0] != " " and "devices." not in ln]
    assert names and all(get_device_spec(n).device_type == "pim" for n in names)
    assert main(argv=["devices", "PIM_AI_4chip"]) == 0
    out = capsys.readouterr().out
    assert "pim-ai-4chip (pim)" in out and "mem_pj_per_bit: 0.95" in out and "UPMEM" in out
    # what its predictions take, and where each figure comes from
    assert "  predictions take (pricing/achievable.py):" in out
    assert "    gemv: 0.8 of peak; stated default (DEFAULT_EFFICIENCY)" in out
    assert main(argv=["devices", "h100", "--json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert data["name"] == "h100-sxm" and data["flops_by_dtype"]["bfloat16"] == 989.5e12


def test_devices_unknown_name_fails_with_suggestion(capsys):
    assert main(argv=["devices", "rtx3090"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'rtx3090'; did you mean rtx-3090" in err


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_calibrate_writes_a_loadable_spec(capsys, tmp_path):
    out_file = tmp_path / "cal.yaml"
    argv = ["calibrate", "--array-mb", "1", "--repeats", "2", "--matmul-n", "32",
            "--min-time", "0.01", "--name", "tiny", "--out", str(out_file)]
    assert main(argv=argv) == 0
    printed = capsys.readouterr().out
    assert "memory bandwidth, triad over 3 x 1 MiB" in printed and "matmul bfloat16" in printed
    spec = get_device_spec(f"{out_file}:tiny")
    assert spec.device_type == "cpu" and spec.dtype == torch.bfloat16
    assert spec.bandwidth > 1e6 and set(spec.flops_by_dtype) == {torch.float32, torch.bfloat16}
    assert "triad" in spec.source["bandwidth"] and "matmul" in spec.source["flops_by_dtype"]
    # a second run with another name keeps the first entry
    assert main(argv=argv[:-3] + ["other", "--out", str(out_file)]) == 0
    assert get_device_spec(f"{out_file}:tiny").name == "tiny"


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_calibrate_default_location_is_found_by_name(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # the plausibility rules are tests/test_calibration_check.py's; here a calibration that
    # passed them (a tiny 16 x 16 matmul is slower than the rows curve by nature)
    monkeypatch.setattr(calibration_parts, "all_flags", lambda *a, **k: [])
    # nor the machine's: other work on a shared machine (a wall clock's busy share) and the
    # 55 s wall budget are the checks' and the budget's tests, not this one's
    monkeypatch.setattr(calibration_check, "BUSY_SHARE", float("inf"))
    monkeypatch.setattr(cal_mod, "BUDGET_S", float("inf"))
    assert main(argv=["calibrate", "--array-mb", "1", "--repeats", "1", "--matmul-n", "16",
                      "--min-time", "0.01", "--dtypes", "float32"]) == 0
    assert devices.calibrated_spec_path().is_file()
    spec = get_device_spec("calibrated")
    assert spec.dtype == torch.float32  # no bfloat16 measured
    assert devices.default_device_spec() == spec


def test_calibrate_rejects_bad_sizes(capsys):
    assert main(argv=["calibrate", "--repeats", "0", "--no-write"]) == 2
    assert capsys.readouterr().err == ("perfcounter calibrate: error: --repeats 0: expected "
                                       "triad runs, a number > 0\n")  # the flag, not calibrate()'s


class FakeClock:
    """perf_counter that advances `step` seconds per call."""

    def __init__(self, step):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


def test_triad_byte_accounting(monkeypatch):
    monkeypatch.setitem(cal_mod.CLOCKS, "wall", FakeClock(0.5))
    # 4 MiB per array = 1,048,576 float32; 12 B each (2 reads + 1 write) in 0.5 s
    # 1,048,576 * 12 / 0.5 = 25,165,824 B/s
    assert cal_mod.triad_bandwidth(4 << 20, repeats=3) == 25_165_824


def test_matmul_flop_accounting(monkeypatch):
    monkeypatch.setitem(cal_mod.CLOCKS, "wall", FakeClock(0.5))
    # n = 8: 2 * 8**3 = 1024 FLOPs per matmul; every batch of 1 call takes 0.5 s
    assert cal_mod.matmul_flops(8, torch.float32, min_time=0.1) == 2048
