"""Device registry: shipped YAML, spot values, lookups, bad input, CUDA autodetection."""
import dataclasses
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from perfcounter import devices
from perfcounter.cli.main import main
from perfcounter.devices import (CUDADeviceSpec, DeviceSpec, DeviceSpecError,
                                 UnknownDeviceError, UnknownDtypeError, default_device_spec,
                                 find_cuda_device_spec, get_device_spec, list_device_specs,
                                 register_device_specs, shipped_spec_files)
from perfcounter.devices import registry
from perfcounter.devices import spec as spec_module
from perfcounter.devices.schema import FIGURES, load_device_specs, parse_device_specs
from perfcounter.devices.spec_file import write_device_specs

REFERENCE = Path("/work/shared/reference")


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch, tmp_path):
    """No user files from other tests, no calibrated file from this machine."""
    monkeypatch.setattr(registry, "_user_specs", [])
    monkeypatch.setattr(spec_module, "_warned", set())
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path / "home"))


# ---------------------------------------------------------------- shipped data

def test_every_shipped_file_validates_and_every_figure_has_a_source():
    files = shipped_spec_files()
    assert {f.name for f in files} >= {"nvidia.yaml", "upmem.yaml", "cpu.yaml"}
    specs = [s for f in files for s in load_device_specs(f)]
    assert len(specs) >= 30
    for spec in specs:
        figures = {f for f in (figure.field for figure in FIGURES.values())
                   if getattr(spec, f) not in (None, {})}
        assert figures >= {"bandwidth", "flops_by_dtype"}, spec.name
        missing = figures - {k for k, v in spec.source.items() if v.strip()}
        assert not missing, f"{spec.name}: no source for {missing}"


def test_shipped_names_and_aliases_are_unique_across_files():
    seen = {}
    for f in shipped_spec_files():
        for spec in load_device_specs(f):
            for key in (spec.name, *spec.aliases):
                assert key.lower() not in seen, f"{key} in {f.name} and {seen[key.lower()]}"
                seen[key.lower()] = f.name


def test_issue_device_list_is_covered():
    wanted = ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm", "h100-pcie", "h100-nvl", "h200",
              "b200", "l4", "l40s", "rtx-3090", "rtx-4090", "v100-sxm2-16gb", "t4", "a10g",
              "mi300x", "mi325x", "tpu-v5e", "m2-ultra", "m3-max", "m4-max",
              "snapdragon-8-gen3", "dimensity-9300", "a17-pro", "epyc-9654", "xeon-8480",
              "generic-cpu", "pim-ai-1chip", "pim-ai-4chip", "pim-ai-1dimm", "pim-ai-24dimm",
              "sam-lpddr5pim", "cxl-pim-bc", "cxl-pim-nbc", "upmem-dgx100", "upmem-a17pro"]
    assert set(wanted) <= set(list_device_specs())


def test_spot_values_h100_sxm():
    spec = get_device_spec("h100-sxm")
    assert spec.bandwidth == 3.35e12  # 3,350 GB/s
    assert spec.dtype == torch.bfloat16
    assert spec.flops_per_s == pytest.approx(989e12, rel=1e-3)  # 1,979 sparse / 2 = 989.5
    assert spec.vram == 85.52e9  # nvidia-smi's 81559 MiB x 1,048,576 = 85.52e9 B, not 80e9
    # 989.5e12 / 3.35e12 = 295.37 FLOP/byte
    assert spec.roofline_balancepoint == pytest.approx(295.37, abs=0.01)
    assert spec.peak_flops(torch.float8_e4m3fn) == 1979e12  # 3,958 sparse / 2
    assert spec.peak_flops(torch.float8_e5m2) == 1979e12  # every float8 shares one rate


@pytest.mark.parametrize("name, bandwidth, bf16", [
    ("a100-sxm4-80gb", 2039e9, 312e12), ("a100-sxm4-40gb", 1555e9, 312e12),
    ("h100-pcie", 2000e9, 756.5e12), ("h200", 4800e9, 989.5e12), ("b200", 7700e9, 2250e12),
    ("l4", 300e9, 121e12), ("rtx-3090", 936e9, 71e12), ("rtx-4090", 1008e9, 165.2e12),
    ("mi300x", 5300e9, 1307.4e12), ("tpu-v5e", 819e9, 197e12),
])
def test_spot_values(name, bandwidth, bf16):
    spec = get_device_spec(name)
    assert spec.bandwidth == pytest.approx(bandwidth)
    assert spec.peak_flops("bf16") == pytest.approx(bf16)


def test_upmem_pim_profile_in_registry():
    spec = get_device_spec("PIM-AI-4chip")  # UPMEM's layer-mapping spelling
    assert spec is get_device_spec("PIM_AI_4chip") is get_device_spec("pim-ai-4chip")
    assert spec.device_type == "pim"
    assert spec.bandwidth == pytest.approx(409.6e9)  # 102.4 * 4 GB/s
    assert spec.peak_flops(torch.bfloat16) == 20e12
    assert spec.peak_flops("int4") == 128e12
    assert spec.pj_per_flop(torch.bfloat16) == 0.4  # pj_per_tflop 0.4e+12 / 1e12
    assert spec.pj_per_flop("int4") == 0.4
    assert (spec.mem_pj_per_bit, spec.host_to_device_pj_per_bit) == (0.95, 80)
    assert spec.host_to_device_bw == 12.8e9 and spec.device_to_host_bw == 51.2e9
    assert (spec.softmax_ns_per_element, spec.silu_ns_per_element,
            spec.rmsnorm_ns_per_element) == (0.1, 0.15, 0.275)
    assert "UPMEM" in spec.source["mem_pj_per_bit"]


@pytest.mark.skipif(not (REFERENCE / "upmem_sim_architectures.yaml").exists(),
                    reason="UPMEM reference files are not in this checkout")
def test_every_upmem_reference_entry_is_shipped_with_the_same_figures():
    for file in ("upmem_sim_architectures.yaml", "upmem_extra_arch.yaml"):
        for ref in load_device_specs(REFERENCE / file):
            name = ref.name if ref.name.startswith(("pim-", "sam-", "cxl-")) else f"upmem-{ref.name}"
            ours = get_device_spec(name)
            for f in ("bandwidth", "flops_by_dtype", "pj_per_flop_by_dtype", "mem_pj_per_bit",
                      "host_to_device_bw", "host_to_device_pj_per_bit", "device_to_host_bw",
                      "device_to_host_pj_per_bit", "softmax_ns_per_element",
                      "silu_ns_per_element", "rmsnorm_ns_per_element"):
                assert getattr(ours, f) == getattr(ref, f), (name, f)


def test_generic_cpu_says_its_figures_are_assumed():
    spec = get_device_spec("generic-cpu")
    assert "assumption" in spec.source["bandwidth"]
    assert spec.bandwidth == 51.2e9  # 2 channels x 8 B x 3200 MT/s
    assert spec.peak_flops(torch.float32) == pytest.approx(0.768e12)  # 8 x 3.0e9 x 32


# ---------------------------------------------------------------- DeviceSpec

def test_torchao_constructor_and_derived_fields():
    spec = DeviceSpec(device_type="cpu", name="x", bandwidth=100e9, flops_per_s=1e12,
                      dtype=torch.float32)
    assert spec.flops_by_dtype == {torch.float32: 1e12}
    assert spec.roofline_balancepoint == 10.0  # 1e12 / 100e9
    assert spec.peak_flops("fp32") == 1e12
    assert spec.pj_per_flop() is None
    with pytest.warns(UserWarning, match="no peak FLOP/s figure for bfloat16"):
        assert spec.peak_flops(torch.bfloat16) == 1e12  # documented fallback
    with pytest.raises(UnknownDtypeError, match="bfloat16.*it has: float32"):
        spec.peak_flops(torch.bfloat16, strict=True)
    assert json.loads(json.dumps(spec.to_dict()))["flops_by_dtype"] == {"float32": 1e12}
    hash(spec)


def test_to_dict_round_trips_through_the_constructor():
    for name in ("h100-sxm", "pim-ai-4chip", "generic-cpu"):
        spec = get_device_spec(name)
        assert DeviceSpec(**spec.to_dict()) == spec


def test_torchao_str_format():
    spec = DeviceSpec(device_type="cuda", name="NVIDIA GeForce RTX 3090", bandwidth=936.1e9,
                      flops_per_s=35.6e12, vram=25.4e9, dtype=torch.bfloat16)
    assert str(spec) == ("DeviceSpec(device_type=cuda, name=NVIDIA GeForce RTX 3090, "
                         "dtype=torch.bfloat16, bandwidth=936.1GB/s, flops=35.6TFLOPs, "
                         "vram=25.4GB)")


def test_with_dtype_moves_flops_and_balance_point():
    spec = get_device_spec("h100", dtype=torch.float32)
    assert spec.name == "h100-sxm"
    assert spec.flops_per_s == 67e12
    assert spec.roofline_balancepoint == pytest.approx(20.0)  # 67e12 / 3.35e12
    assert get_device_spec("H100-SXM", dtype="fp8").flops_per_s == 1979e12


def test_missing_dtype_falls_back_to_the_compute_dtype_with_a_warning():
    v100 = get_device_spec("v100-sxm2-16gb")  # Volta has no bfloat16
    with pytest.warns(UserWarning, match="using its float16 figure"):
        assert v100.peak_flops(torch.bfloat16) == 125e12


@pytest.mark.parametrize("kwargs, match", [
    ({"bandwidth": -1.0}, "bandwidth must be a positive"),
    ({"bandwidth": True}, "bandwidth must be a number"),
    ({"mem_pj_per_bit": -0.5}, "mem_pj_per_bit must be a positive finite number, got -0.5"),
    ({"mem_pj_per_bit": 0}, "mem_pj_per_bit must be a positive finite number, got 0"),
    ({"host_to_device_pj_per_bit": -1}, "host_to_device_pj_per_bit must be a non-negative"),
    ({"dtype": "float33"}, "unknown dtype 'float33'; did you mean float32"),
])
def test_constructor_rejects_bad_values(kwargs, match):
    with pytest.raises(DeviceSpecError, match=match):
        DeviceSpec(name="x", **kwargs)


# ---------------------------------------------------------------- lookups and files

def test_unknown_name_suggests_close_names():
    with pytest.raises(UnknownDeviceError) as info:
        get_device_spec("h10")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "unknown device 'h10'; did you mean h100-sxm" in str(info.value)


def _write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
devices:
  my-gpu:
    device_type: cuda
    bandwidth_GBs: 1000
    tflops: {bfloat16: 100, float32: 10}
    source: my lab's measurement
"""


@pytest.mark.parametrize("entry, expect", [
    ("    bandwith_GBs: 1000\n", ["unknown field 'bandwith_GBs'", "did you mean 'bandwidth_GBs'"]),
    ("    tdp_W: fast\n", ["field 'tdp_W'", "got 'fast'", "expected a positive number"]),
    ("    mem_pj_per_bit: -3\n", ["field 'mem_pj_per_bit'", "got -3",
                                 "expected pJ per bit in [0.001, 100000] (a plausible range)"]),
    ("    mem_pj_per_bit: 0\n", ["field 'mem_pj_per_bit'", "got 0", "pJ per bit in [0.001, "]),
    ("    tflops: {bfloat16: 0}\n", ["field 'tflops.bfloat16'", "got 0",
                                    "TFLOP/s in [1e-06, 1e+06]"]),
    ("    pj_per_flop: 1.0e300\n", ["field 'pj_per_flop'", "got 1e+300",
                                   "expected pJ per FLOP in [0.001, 100000]"]),
    ("    vram_GB: .nan\n", ["field 'vram_GB'", "got nan", "GB in [0.001, 1e+06]"]),
    ("    aliases: 7\n", ["field 'aliases'", "got 7", "list of non-empty strings"]),
    ("    dtype: int8\n", ["field 'dtype'", "got 'int8'", "one of the tflops dtypes"]),
    ("    peak_fraction: 1.5\n", ["field 'peak_fraction'", "got 1.5", "a number in (0, 1]"]),
    ("    peak_fraction: 0\n", ["field 'peak_fraction'", "got 0", "a number in (0, 1]"]),
    ("    device_link_GBs: 0\n", ["field 'device_link_GBs'", "got 0", "GB/s in [0.01, 1e+06]"]),
    ("    interconnect_GBs: fast\n", ["field 'interconnect_GBs'", "got 'fast'", "positive"]),
    ("    device_link_pj_per_bit: -1\n", ["field 'device_link_pj_per_bit'", "got -1",
                                        "pJ per bit in [0, 100000]"]),
    ("    profile: upmen\n", ["field 'profile'", "got 'upmen'", "one of upmem"]),
])
def test_bad_entry_errors_name_file_entry_field_value_and_expectation(tmp_path, entry, expect):
    lines = GOOD.splitlines()
    lines.insert(4, entry.rstrip("\n"))
    if entry.startswith("    tflops"):
        lines = [ln for ln in lines if not ln.startswith("    tflops: {bfloat16: 100")]
    path = _write(tmp_path, "\n".join(lines))
    with pytest.raises(DeviceSpecError) as info:
        get_device_spec(path)
    message = str(info.value)
    for part in [str(path), "entry 'my-gpu'", *expect]:
        assert part in message


def test_a_figure_out_of_its_range_is_refused_before_it_can_break_a_report(tmp_path):
    """GOOD with bandwidth 1e-300 GB/s: refused, the range named (it would print 300-digit
    times); every shipped figure lies within its range."""
    path = _write(tmp_path, GOOD.replace("bandwidth_GBs: 1000", "bandwidth_GBs: 1.0e-300"))
    with pytest.raises(DeviceSpecError) as info:
        get_device_spec(path)
    assert str(info.value) == (f"{path}: entry 'my-gpu': field 'bandwidth_GBs': got 1e-300; "
                               "expected GB/s in [0.01, 1e+06] (a plausible range)")
    for name in list_device_specs():  # the registry loads: none of its figures is refused
        assert get_device_spec(name).bandwidth >= 1e7


def test_a_figure_past_a_floats_range_prints_as_it_is():
    from perfcounter.format import si
    assert si(float("inf"), "J") == "inf J" and si(-float("inf"), "s") == "-inf s"


def test_missing_field_and_missing_source_are_errors(tmp_path):
    path = _write(tmp_path, GOOD.replace("    bandwidth_GBs: 1000\n", ""))
    with pytest.raises(DeviceSpecError, match="entry 'my-gpu': missing required field "
                                              "'bandwidth_GBs' or 'mem_bw_GBs'"):
        load_device_specs(path)
    path = _write(tmp_path, GOOD.replace("    source: my lab's measurement\n", ""))
    with pytest.raises(DeviceSpecError, match="figure 'bandwidth_GBs' has no source"):
        load_device_specs(path)


def test_bad_path_names_the_file(tmp_path):
    with pytest.raises(DeviceSpecError, match=r"nope\.yaml: no such device spec file"):
        get_device_spec(str(tmp_path / "nope.yaml"))
    path = _write(tmp_path, "devices: [1, 2\n", "broken.yaml")
    with pytest.raises(DeviceSpecError, match=r"broken\.yaml: not a valid YAML file"):
        get_device_spec(path)


def test_user_file_by_path_extends_the_registry(tmp_path):
    path = _write(tmp_path, GOOD)
    spec = get_device_spec(str(path), dtype="float32")
    assert (spec.name, spec.flops_per_s, spec.bandwidth) == ("my-gpu", 10e12, 1000e9)
    assert spec.source["bandwidth"] == "my lab's measurement"
    assert "my-gpu" in list_device_specs()
    assert get_device_spec("MY-GPU").flops_per_s == 100e12


UPMEM_TEXT = """\
# yaml-language-server: $schema=./architectures_schema.json
My_accelerator:
    host_to_device_bw_GBs: 22
    host_to_device_pj_per_bit: 200
    device_to_host_bw_GBs: 88
    device_to_host_pj_per_bit: 50
    mem_bw_GBs: 6553.6
    mem_pj_per_bit: 0.95
    tflops: 320
    pj_per_tflop: 0.4e+12
    softmax_ns_per_element: 6.25e-03
    SiLU_ns_per_element: 9.375e-03
    RMSNorm_ns_per_element: 1.625e-02
Other_one:
    host_to_device_bw_GBs: 1
    host_to_device_pj_per_bit: 1
    device_to_host_bw_GBs: 1
    device_to_host_pj_per_bit: 1
    mem_bw_GBs: 1
    mem_pj_per_bit: 1
    tflops: 1
    pj_per_tflop: 1e12
"""


def test_upmem_format_file_loads_as_is(tmp_path):
    path = _write(tmp_path, UPMEM_TEXT, "accels.yaml")
    with pytest.raises(UnknownDeviceError, match="holds 2 devices.*name one as"):
        get_device_spec(path)
    spec = get_device_spec(f"{path}:My_accelerator")
    assert spec.name == "my-accelerator" and spec.aliases == ("My_accelerator",)
    assert spec.bandwidth == pytest.approx(6553.6e9)
    assert spec.flops_by_dtype == {torch.bfloat16: 320e12}
    assert spec.pj_per_flop() == 0.4
    assert spec.rmsnorm_ns_per_element == 1.625e-2
    assert get_device_spec("My-Accelerator") is spec  # registered by name too
    # "1e12" is a string to PyYAML; it is read as the number it means
    assert get_device_spec("other-one").pj_per_flop() == 1.0


def test_upmem_format_errors(tmp_path):
    path = _write(tmp_path, UPMEM_TEXT.replace("    tflops: 320\n", ""), "a.yaml")
    with pytest.raises(DeviceSpecError, match="entry 'My_accelerator': missing required "
                                              "field 'tflops'"):
        load_device_specs(path)
    path = _write(tmp_path, UPMEM_TEXT.replace("tflops: 320", "tflop: 320"), "b.yaml")
    with pytest.raises(DeviceSpecError, match="unknown field 'tflop'; did you mean 'tflops'"):
        load_device_specs(path)


def test_user_entry_takes_over_the_names_it_claims(tmp_path):
    path = _write(tmp_path, GOOD.replace("my-gpu:", "h100-sxm:"))
    with pytest.warns(UserWarning, match="takes the name.* h100-sxm from registry entry h100-sxm"):
        register_device_specs(path)
    assert get_device_spec("h100-sxm").bandwidth == 1000e9
    assert get_device_spec("h100").bandwidth == 1000e9  # the alias follows the name
    # an entry claiming only an alias leaves the shipped entry its own name
    path = _write(tmp_path, GOOD.replace("my-gpu:", "h200-mine:").replace(
        "    device_type: cuda\n", "    device_type: cuda\n    aliases: [h200-sxm]\n"), "b.yaml")
    with pytest.warns(UserWarning, match="takes the name.* h200-sxm from registry entry h200"):
        register_device_specs(path)
    assert get_device_spec("h200-sxm").name == "h200-mine"
    assert get_device_spec("h200").bandwidth == 4800e9


def test_write_and_read_back(tmp_path):
    spec = get_device_spec("pim-ai-4chip")
    path = write_device_specs(tmp_path / "out.yaml", [spec])
    (back,) = load_device_specs(path)
    for f in ("bandwidth", "flops_per_s", "mem_pj_per_bit", "host_to_device_bw",
              "softmax_ns_per_element", "rmsnorm_ns_per_element", "dtype", "aliases"):
        assert getattr(back, f) == pytest.approx(getattr(spec, f)) if isinstance(
            getattr(spec, f), float) else getattr(back, f) == getattr(spec, f)
    assert back.pj_per_flop("int4") == pytest.approx(0.4)
    assert back.source == spec.source
    with pytest.raises(DeviceSpecError, match="has no source"):
        write_device_specs(tmp_path / "bad.yaml", [DeviceSpec(name="x", bandwidth=1.0,
                                                              flops_per_s=1.0, dtype="bf16")])
    assert not (tmp_path / "bad.yaml").exists()


LINKED = GOOD.replace("    source: my lab's measurement\n", """\
    profile: upmem
    device_link_GBs: 450
    device_link_pj_per_bit: 1.5
    interconnect_GBs: 300
    interconnect_pj_per_bit: 2
    peak_fraction: 0.8
    source:
      default: my lab's measurement
      device_link_GBs: link datasheet
      interconnect_GBs: switch datasheet
""")


def test_link_fraction_and_profile_fields_load_from_our_schema(tmp_path):
    (spec,) = load_device_specs(_write(tmp_path, LINKED))
    # GB/s -> B/s: 450 * 1e9, 300 * 1e9
    assert (spec.device_link_bw, spec.device_link_pj_per_bit) == (450e9, 1.5)
    assert (spec.interconnect_bw, spec.interconnect_pj_per_bit) == (300e9, 2.0)
    assert spec.peak_fraction == 0.8 and spec.profile == "upmem"
    assert spec.source["device_link_bw"] == "link datasheet"
    assert spec.source["interconnect_bw"] == "switch datasheet"
    assert spec.source["peak_fraction"] == spec.source["device_link_pj_per_bit"] == \
        "my lab's measurement"
    plain = DeviceSpec(name="x", bandwidth=1.0)  # all optional: unknown is None
    assert (plain.device_link_bw, plain.interconnect_bw, plain.peak_fraction,
            plain.profile) == (None, None, None, None)


def test_a_link_figure_without_a_source_is_refused(tmp_path):
    path = _write(tmp_path, GOOD.replace("    source: my lab's measurement\n",
                                         "    device_link_GBs: 450\n    source:\n"
                                         "      bandwidth_GBs: a\n      tflops: b\n"))
    with pytest.raises(DeviceSpecError, match="entry 'my-gpu': figure 'device_link_GBs' has "
                                              "no source"):
        load_device_specs(path)


def test_link_fraction_and_profile_round_trip_through_to_dict_and_the_yaml_writer(tmp_path):
    (spec,) = load_device_specs(_write(tmp_path, LINKED))
    assert DeviceSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    (back,) = load_device_specs(write_device_specs(tmp_path / "out.yaml", [spec]))
    for f in ("device_link_bw", "device_link_pj_per_bit", "interconnect_bw",
              "interconnect_pj_per_bit", "peak_fraction", "bandwidth"):
        assert getattr(back, f) == pytest.approx(getattr(spec, f)), f
    assert back.profile == "upmem" and back.source == spec.source
    text = (tmp_path / "out.yaml").read_text()
    assert "device_link_GBs: 450" in text and "profile: upmem" in text


@pytest.mark.parametrize("kwargs, match", [
    ({"peak_fraction": 1.01}, r"peak_fraction must be a number in \(0, 1\], got 1.01"),
    ({"peak_fraction": 0}, r"peak_fraction must be a number in \(0, 1\], got 0"),
    ({"peak_fraction": "0.5"}, "peak_fraction must be a number, got '0.5'"),
    ({"device_link_bw": -1}, "device_link_bw must be a positive"),
    ({"interconnect_pj_per_bit": float("nan")}, "interconnect_pj_per_bit must be a non-negative"),
    ({"profile": "upmen"}, r"unknown profile 'upmen'; did you mean upmem\? \(valid: upmem"),
    ({"profile": 3}, "unknown profile 3"),
])
def test_constructor_rejects_bad_link_fraction_and_profile(kwargs, match):
    with pytest.raises(DeviceSpecError, match=match) as info:
        DeviceSpec(name="x", **kwargs)
    assert info.value.field == next(iter(kwargs))
    assert DeviceSpec(name="x", profile=" UPMEM ").profile == "upmem"  # one spelling


def test_shipped_links_and_profiles():
    h100 = get_device_spec("h100-sxm")
    # NVLink 900 GB/s both ways together: 450 GB/s each way; no pJ/bit is published
    assert (h100.device_link_bw, h100.interconnect_bw) == (450e9, 450e9)
    assert h100.device_link_pj_per_bit is None and "NVLink 900 GB/s" in \
        h100.source["device_link_bw"]
    assert get_device_spec("a100-sxm4-80gb").device_link_bw == 300e9  # 600 / 2
    assert get_device_spec("b200").interconnect_bw == 900e9  # 1.8 TB/s / 2
    for name in ("h100-pcie", "v100-sxm2-16gb", "pim-ai-4chip", "generic-cpu"):
        assert get_device_spec(name).device_link_bw is None, name  # no sourced figure
    assert all(get_device_spec(n).peak_fraction is None for n in list_device_specs())
    # UPMEM's profiles say so; a datasheet entry whose source merely cites UPMEM does not
    assert get_device_spec("pim-ai-4chip").profile == "upmem"
    assert get_device_spec("upmem-snapdragon8gen3").profile == "upmem"
    assert get_device_spec("a17-pro").profile is None
    assert get_device_spec("h100-sxm").profile is None


def test_an_upmem_format_file_is_an_upmem_profile(tmp_path):
    path = _write(tmp_path, UPMEM_TEXT, "accels.yaml")
    assert {s.profile for s in load_device_specs(path)} == {"upmem"}
    path = _write(tmp_path, UPMEM_TEXT.replace("    tflops: 320\n",
                                               "    tflops: 320\n    profile: upmem\n"), "b.yaml")
    with pytest.raises(DeviceSpecError, match="unknown field 'profile'"):
        load_device_specs(path)  # UPMEM's schema has no such field: it is implied


def test_parse_rejects_what_is_neither_schema():
    with pytest.raises(DeviceSpecError, match="x.yaml: expected a mapping"):
        parse_device_specs([1, 2], "x.yaml")
    with pytest.raises(DeviceSpecError, match="unknown top-level field"):
        parse_device_specs({"devices": {"a": {}}, "sources": "x"}, "x.yaml")


# ---------------------------------------------------------------- CUDA autodetection

@pytest.mark.parametrize("cuda_name, canonical", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA GeForce RTX 3090", "rtx-3090"),
    ("Tesla T4", "t4"), ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA A10G", "a10g"),
    ("NVIDIA A10", "a10"), ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"), ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"),
    ("AMD Instinct MI300X", "mi300x"),
])
def test_cuda_autodetection(monkeypatch, cuda_name, canonical):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: cuda_name)
    entry = get_device_spec(canonical)
    spec = CUDADeviceSpec(dtype=entry.dtype)
    assert spec.name == cuda_name and spec.aliases[0] == canonical
    assert (spec.bandwidth, spec.vram, spec.flops_per_s) == (entry.bandwidth, entry.vram,
                                                             entry.flops_per_s)
    assert isinstance(spec, DeviceSpec) and spec.device_type == "cuda"


def test_cuda_tensorcores_and_explicit_fields(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H100 80GB HBM3")
    assert CUDADeviceSpec(dtype=torch.float32).flops_per_s == 494.5e12  # TF32, 989 sparse / 2
    plain = CUDADeviceSpec(dtype=torch.float32, use_tensorcores=False)
    assert plain.flops_per_s == 67e12
    assert plain.roofline_balancepoint == pytest.approx(20.0)  # 67e12 / 3.35e12
    bf16 = CUDADeviceSpec(dtype=torch.bfloat16, bandwidth=2e12)  # explicit field is kept
    assert (bf16.bandwidth, bf16.flops_per_s) == (2e12, 989.5e12)
    assert bf16.peak_flops(torch.float32) == 494.5e12
    assert bf16.with_dtype("fp8").flops_per_s == 1979e12


def test_cuda_unknown_name_and_no_cuda(monkeypatch):
    with pytest.raises(UnknownDeviceError, match="no device spec matches CUDA device "
                                                 "'NVIDIA Quantum 9000'"):
        find_cuda_device_spec("NVIDIA Quantum 9000")
    monkeypatch.setattr(torch.cuda, "get_device_name",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("no CUDA")))
    with pytest.raises(DeviceSpecError, match="no CUDA device to detect"):
        CUDADeviceSpec()


def test_a_broken_calibrated_file_is_warned_about_not_fatal():
    path = devices.calibrated_spec_path()
    path.parent.mkdir(parents=True)
    path.write_text("devices: {calibrated: {device_type: cpu}}\n")
    with pytest.warns(UserWarning, match="ignoring the calibrated spec file.*missing required"):
        assert get_device_spec("h100").name == "h100-sxm"


def test_default_device_spec(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="perfcounter calibrate"):
        assert default_device_spec().name == "generic-cpu"
    calibrated = DeviceSpec(device_type="cpu", name="calibrated", bandwidth=20e9,
                            flops_per_s=1e11, dtype=torch.float32,
                            source={"bandwidth": "test", "flops_by_dtype": "test"})
    write_device_specs(devices.calibrated_spec_path(), [calibrated])
    with pytest.warns(UserWarning, match="predates the checks"):  # never the default unchecked
        assert default_device_spec().name == "generic-cpu"
    failed = dataclasses.replace(calibrated, calibration_check={"passed": False, "flags": ["x"]})
    write_device_specs(devices.calibrated_spec_path(), [failed])
    with pytest.warns(UserWarning, match="failed its checks"):
        assert default_device_spec().name == "generic-cpu"
    passed = dataclasses.replace(calibrated, calibration_check={"passed": True, "flags": []})
    write_device_specs(devices.calibrated_spec_path(), [passed])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert default_device_spec().bandwidth == 20e9
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA L4")
    spec = default_device_spec()
    assert isinstance(spec, CUDADeviceSpec) and spec.flops_per_s == 121e12  # bf16, 242 / 2
    assert math.isclose(default_device_spec("fp8").flops_per_s, 242.5e12)


# ---------------------------------------------------------------- one validator, from_dict

def test_the_constructor_is_the_one_number_check_and_names_the_field():
    with pytest.raises(DeviceSpecError) as info:
        DeviceSpec(name="x", flops_by_dtype={"bf16": 0})  # a peak of 0 FLOP/s is no peak
    assert (info.value.field, info.value.dtype) == ("flops_by_dtype", torch.bfloat16)
    assert info.value.expected == "a positive number"
    assert "flops_by_dtype[bfloat16] must be a positive finite number, got 0" in str(info.value)
    with pytest.raises(DeviceSpecError, match=r"pj_per_flop_by_dtype\[bfloat16\] must be a "
                                              "positive finite number, got 0"):
        DeviceSpec(name="x", pj_per_flop_by_dtype={"bf16": 0})  # no FLOP is free: "0 J" unsaid
    DeviceSpec(name="x", host_to_device_pj_per_bit=0)  # a link on the same package may be


def test_from_dict_beside_to_dict(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA L4")
    cuda = CUDADeviceSpec(dtype=torch.bfloat16)
    hash(cuda)
    back = DeviceSpec.from_dict(json.loads(json.dumps(cuda.to_dict())))
    assert type(back) is DeviceSpec and back.to_dict() == {
        k: v for k, v in cuda.to_dict().items() if k != "use_tensorcores"}
    with pytest.raises(DeviceSpecError, match="expected a dict from DeviceSpec.to_dict"):
        DeviceSpec.from_dict("h100-sxm")
    with pytest.raises(DeviceSpecError, match="bandwidth must be a positive"):
        DeviceSpec.from_dict(cuda.to_dict() | {"bandwidth": -1})


def test_a_yaml_dtype_that_is_not_one_names_the_file(tmp_path):
    path = _write(tmp_path, GOOD.replace("    device_type: cuda\n",
                                         "    device_type: cuda\n    dtype: float33\n"))
    with pytest.raises(DeviceSpecError) as info:
        load_device_specs(path)
    for part in [str(path), "entry 'my-gpu'", "field 'dtype'", "did you mean float32"]:
        assert part in str(info.value)


# ---------------------------------------------------------------- a key given twice

@pytest.mark.parametrize("text, expect", [
    (GOOD + "    bandwidth_GBs: 2000\n",
     "entry 'my-gpu': field 'bandwidth_GBs' is given twice (lines 5 and 8)"),
    (GOOD.replace("{bfloat16: 100, float32: 10}", "{bfloat16: 100, bfloat16: 10}"),
     "entry 'my-gpu': field 'tflops.bfloat16' is given twice (line 6)"),
    (GOOD + GOOD.replace("devices:\n", ""), "entry 'my-gpu' is given twice (lines 3 and 9)"),
    ("source: a\n" + GOOD + "source: b\n", "top-level field 'source' is given twice"),
    (UPMEM_TEXT + "    mem_bw_GBs: 2\n", "entry 'Other_one': field 'mem_bw_GBs' is given twice"),
], ids=["field", "nested-field", "entry", "top-level", "upmem-field"])
def test_a_key_given_twice_is_refused_with_file_entry_and_field(tmp_path, text, expect):
    path = _write(tmp_path, text)
    with pytest.raises(DeviceSpecError) as info:
        get_device_spec(f"{path}:my-gpu")
    assert str(info.value).startswith(f"{path}: ") and expect in str(info.value)


def test_a_merge_key_may_be_overridden(tmp_path):
    path = _write(tmp_path, "source: lab\ndevices:\n"
                            "  base: &b {device_type: cuda, bandwidth_GBs: 1, tflops: 1}\n"
                            "  fast: {<<: *b, bandwidth_GBs: 5}\n")
    assert [s.bandwidth for s in load_device_specs(path)] == [1e9, 5e9]


# ---------------------------------------------------------------- cuda_names: names and globs

def _cuda_file(tmp_path, patterns):
    return _write(tmp_path, GOOD.replace("    device_type: cuda\n",
                                         f"    device_type: cuda\n    cuda_names: {patterns}\n"))


def test_cuda_names_are_literal_or_whole_name_globs(tmp_path):
    register_device_specs(_cuda_file(tmp_path, "['NVIDIA H100*', 'Lab GPU v1.0', 'Rig-?']"))
    assert find_cuda_device_spec("NVIDIA H100 80GB HBM3").name == "my-gpu"  # user file first
    assert find_cuda_device_spec("nvidia h100 pcie").name == "my-gpu"  # case is ignored
    assert find_cuda_device_spec("Lab GPU v1.0").name == "my-gpu"
    assert find_cuda_device_spec("Rig-7").name == "my-gpu"
    for other in ("Lab GPU v1x0", "Lab GPU v1.0 rev2", "Rig-77", "Big NVIDIA H100"):
        with pytest.raises(UnknownDeviceError, match="no device spec matches"):
            find_cuda_device_spec(other)  # '.' is a dot; the whole name must match


@pytest.mark.parametrize("pattern", ["(a+)+b", "NVIDIA H100.*", "^NVIDIA A100", "A|B",
                                     "(NVIDIA )?GeForce RTX 3090"])
def test_a_regular_expression_in_cuda_names_is_refused(tmp_path, pattern):
    path = _cuda_file(tmp_path, f"[{pattern!r}]")
    with pytest.raises(DeviceSpecError) as info:
        load_device_specs(path)
    for part in [str(path), "entry 'my-gpu'", "field 'cuda_names'", repr(pattern),
                 "glob", "regular expressions are not read"]:
        assert part in str(info.value)


def test_a_glob_matches_in_polynomial_time():
    # as a regex, (a*)*b-like backtracking would take longer than the universe
    assert not registry.cuda_name_matches("*a*a*a*a*a*a*a*a*a*a*a*a*b", "a" * 5000)


# ---------------------------------------------------------------- calibrate: bad input

TINY = ["calibrate", "--array-mb", "1", "--repeats", "1", "--matmul-n", "16",
        "--min-time", "0.01", "--dtypes", "float32"]


@pytest.mark.parametrize("content", ["devices: [1, 2\n", "\x00\xff\xfe binary",
                                     "devices: {calibrated: {device_type: cpu}}\n"])
@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_calibrate_replaces_a_corrupt_calibrated_file_and_keeps_the_old_one(
        capsys, monkeypatch, content):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = devices.calibrated_spec_path()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert main(argv=TINY) == 0  # the command prints its warnings after its report, one line each
    err = capsys.readouterr().err.splitlines()
    replacing = [line for line in err if "replacing" in line]
    assert len(replacing) == 1 and str(path) in replacing[0]
    assert replacing[0].startswith("perfcounter: warning: replacing ")
    assert f"kept as {path}.corrupt" in replacing[0]
    assert path.with_name("calibrated.yaml.corrupt").read_text() == content
    (spec,) = load_device_specs(path)
    assert spec.name == "calibrated" and spec.dtype == torch.float32


@pytest.mark.parametrize("device, expect", [
    ("tpu", "cannot calibrate device 'tpu'; valid: cpu"),
    ("cuda", "cannot calibrate device 'cuda': no CUDA GPU is available here (valid: cpu)"),
    ("cuda:1", "cannot calibrate device 'cuda:1': no CUDA GPU is available here (valid: cpu)"),
    ("mps", "cannot calibrate device 'mps'; valid: cpu"),
])
def test_calibrate_refuses_a_device_it_cannot_measure(capsys, monkeypatch, device, expect):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv=["calibrate", "--device", device, "--no-write"]) == 2
    err = capsys.readouterr().err
    assert err == f"perfcounter calibrate: error: {expect}\n"
