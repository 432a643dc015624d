"""Text, markdown and comparison rendering.

The seed test rebuilds torchao's llama-2-7b prefill example (seed 004) from
its totals: 6 tokens, 1.2576 s, 13.25 GB, 79.31 GFLOPs on an RTX 3090 spec of
936.1 GB/s and 35.6 TFLOP/s, and checks that the report shows the seed's
figures — except utilization, which torchao printed as a fraction with a "%"
sign (0.0113 %) and we print as the percent it is (1.13 %).
"""
import pytest
import torch

from perfcounter.devices import DeviceSpec
from perfcounter.report.phase import Comparison, format_stats, merged_modules, to_markdown
from perfcounter.format import format_table, percent, rate, scaled, si
from perfcounter.stats import PerformanceStats
from perfcounter.trace import OpRecord, Trace, args_from_text


def one_record_trace(flops, nbytes, module="Llama.model"):
    rec = OpRecord("aten.mm.default", module, "bfloat16", args_from_text("[6, 4096], [4096, 4096]", "bfloat16"),
                   1,
                   flops, flops, [flops // 2, flops // 2, 0, 0, 0, 0, 0], [nbytes, 0, 0, 0, 0],
                   [0, 0, 0, 0, 0])
    return Trace(records=[rec], compulsory_read=[nbytes, 0, 0, 0, 0])


@pytest.fixture
def rtx3090():
    return DeviceSpec(device_type="cuda", name="rtx-3090", bandwidth=936.1e9, flops_per_s=35.6e12,
                      dtype=torch.bfloat16)


def test_si_prefixes():
    assert si(13.25e9, "B") == "13.25 GB"
    assert si(79.31e9, "FLOPs") == "79.31 GFLOPs"
    assert si(148, "B") == "148 B"
    assert si(1000, "B") == "1.00 kB"  # SI: lower-case k
    assert si(1.26, "s") == "1.26 s"
    # below one, the nearest prefix, as torchao: 0.16 s stays s, 0.37 ms, 14.15 ms
    assert si(0.16, "s") == "0.16 s"
    assert si(0.00037, "s") == "0.37 ms"
    assert si(0.01415, "s") == "14.15 ms"
    assert si(5e-9, "J") == "5.00 nJ"
    assert si(0, "J") == "0 J"
    assert si(None, "J") == "n/a"
    # nearest=True: torchao's nearest prefix above one too (its report's IO and FLOPs)
    assert si(123e9, "FLOPs", nearest=True) == "0.12 TFLOPs"
    assert si(123e6, "B", nearest=True) == "0.12 GB"
    assert si(1.23e9, "B/s", nearest=True) == "1.23 GB/s"
    assert si(13.25e9, "B", nearest=True) == "13.25 GB"
    assert si(148, "B", nearest=True) == "0.15 kB"
    assert si(0.00037, "s", nearest=True) == "0.37 ms"


def test_percent_and_rate():
    assert percent(0.0113) == "1.13 %"  # a fraction, shown as a percent
    assert percent(0.48) == "48.00 %"
    assert percent(0.0) == "0.00 %"
    assert percent(1.3e-7) == "1.3e-05 %"  # too small for two decimals
    assert percent(None) == "n/a"
    assert rate(4.77, "tokens/s") == "4.77 tokens/s"
    assert rate(5120, "tokens/s") == "5,120 tokens/s"
    assert rate(1.41e9, "tokens/s") == "1.41 G tokens/s"
    assert rate(None, "tokens/s") == "n/a"


def test_seed_004_prefill_figures(rtx3090):
    s = PerformanceStats("PREFILL_SEQLEN-6", 6, 1.2576, one_record_trace(79_310_000_000,
                                                                          13_250_000_000), rtx3090)
    lines = format_stats(s).splitlines()
    assert lines[:16] == [
        "PREFILL_SEQLEN-6:",
        "  Latency = 1.26 s",
        "  Tokens",
        "    Total: 6 tokens",
        "    Throughput: 4.77 tokens/s",  # 6 / 1.2576
        "  IO",
        "    Total: 13.25 GB",
        "    Throughput: 10.54 GB/s",  # 13.25e9 / 1.2576
        "    Theoretical Latency: 14.15 ms",  # 13.25e9 / 936.1e9
        "  FLOPs ",
        "    Total: 79.31 GFLOPs",
        "    Throughput: 63.06 GFLOPs/s",  # 79.31e9 / 1.2576
        "    Theoretical Latency: 2.23 ms",  # 79.31e9 / 35.6e12
        "  Utilization",
        "    Bandwidth: 1.13 % (0.0113 of peak)",  # 10.536e9 / 936.1e9 = 0.01126
        "    FLOPs: 0.18 % (0.0018 of peak)",  # 63.06e9 / 35.6e12 = 0.00177
    ]
    text = "\n".join(lines)
    # one record: max(2.23 ms compute, 14.15 ms memory)
    assert "  Roofline on rtx-3090 (cuda, bfloat16)\n    Latency: 14.15 ms (memory-bound;" in text
    assert "  Energy\n    Total: n/a" in text  # this spec has no energy figures
    assert "  Coverage: 100.00 % of bytes, 100.00 % of op calls had a formula" in text


def test_unmeasured_and_unpriced_render_na():
    s = PerformanceStats("decode", 1, None, one_record_trace(100, 10), None, "per_op", None,
                         "not measured: fake or meta tensors")
    text = format_stats(s)
    assert "  Latency = n/a (not measured: fake or meta tensors)" in text
    assert "    Throughput: n/a" in text and "    Bandwidth: n/a" in text
    assert "Roofline" not in text and "Energy" not in text


def test_raw_latency_and_overhead_are_both_shown():
    t = one_record_trace(100, 10)
    t.overhead_s = 0.002
    s = PerformanceStats("p", 1, 0.010, t, raw_latency=0.012, timing="time.perf_counter")
    line = "  Latency = 10.00 ms (raw 12.00 ms, counting overhead 2.00 ms excluded)"
    assert line in format_stats(s)


def test_module_table_merges_layer_indices(rtx3090):
    recs = [OpRecord("aten.mm.default", f"Llama.model.layers.{i}.mlp", "bfloat16", (), 1, 100,
                     100, read=[1000, 0, 0, 0, 0]) for i in range(3)]
    s = PerformanceStats("p", 1, 1.0, Trace(records=recs), rtx3090)
    rows = merged_modules(s, 4)
    # Llama.model.layers holds its merged layers' figures: its `.*` row stands for it
    assert list(rows) == ["Llama", "Llama.model", "Llama.model.layers.*"]
    assert rows["Llama.model.layers.*"]["flops"] == 300 and rows["Llama"]["bytes_read"] == 3000
    text = format_stats(s, module_depth=4)
    assert "  Modules (depth 4, layer indices merged as *)" in text
    assert "Llama.model.layers.*" in text and "100.00 %" in text  # share of the roofline
    assert "Modules" not in format_stats(s, module_depth=None)


def test_scopes_block_appears_for_recognised_parts():
    recs = [OpRecord("aten.mm.default", "L.model.layers.0.self_attn.q_proj", "bfloat16", (), 1,
                     240, 240), OpRecord("aten.mm.default", "L.lm_head", "bfloat16", (), 1, 60, 60)]
    text = format_stats(PerformanceStats("p", 1, 1.0, Trace(records=recs)))
    block = text.split("  Scopes\n")[1].splitlines()
    assert block[1].split()[:3] == ["transformer", "1", "240"]
    assert block[2].split()[:3] == ["attn", "1", "240"]
    assert block[3].split()[:3] == ["lm_head", "1", "60"]


def test_markdown_table(rtx3090):
    a = PerformanceStats("prefill", 6, 1.2576, one_record_trace(79_310_000_000, 13_250_000_000),
                         rtx3090)
    b = PerformanceStats("decode", 1, None, one_record_trace(100, 10), rtx3090)
    lines = to_markdown([a, b]).splitlines()
    assert lines[0].startswith("| Phase | Tokens | Steps | Latency |")
    assert lines[1].startswith("|---|")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:6] == ["prefill", "6", "1", "1.26 s", "79.31 GFLOPs", "13.25 GB"]
    assert cells[7:11] == ["1.13 %", "0.18 %", "14.15 ms", "memory"]
    assert "| decode | 1 | 1 | n/a |" in lines[3]


def test_comparison_table(rtx3090):
    s = PerformanceStats("decode", 1, None, one_record_trace(100, 936_100), None)
    table = Comparison([(rtx3090, s.on(rtx3090))])
    head, row = str(table).splitlines()
    assert head.split() == ["Device", "Phase", "Roofline", "Bound", "Roofline", "tok/s",
                            "Predicted", "Predicted", "tok/s", "Energy", "Energy/token"]
    # 936,100 B / 936.1e9 B/s = 1 µs; 1 token -> 1 M tokens/s
    assert row.split()[:4] == ["rtx-3090", "decode", "1.00", "µs"]
    assert "1.00 M tok/s" in row
    assert table.to_dict()[0]["roofline_latency"] == pytest.approx(1e-6)
    assert table.to_markdown().splitlines()[2].startswith("| rtx-3090 | decode | 1.00 µs |")


def test_fixed_prefix_for_table_columns():
    assert si(3.35e12, "B/s", 0, prefix="G") == "3,350 GB/s"  # one scale down a column
    assert si(0.260636, "s", 3, prefix="m") == "260.636 ms"
    assert si(51.2e9, "B/s", 1, prefix="G") == "51.2 GB/s"
    assert scaled(13.345e9, "G", 3) == "13.345"  # the unit is in the column header
    assert scaled(989.5e12, "T", 1) == "989.5"
    assert scaled(None, "T", na="-") == "-" and si(None, "B", prefix="G", na="-") == "-"


def test_format_table_text_and_markdown():
    rows = [["a", 1, "10 ms"], ["bbb", 22, "3 s"]]
    # widths 4, 2, 5; first column left, numbers right; two blanks between columns
    assert format_table(rows, ["name", "n", "time"]).splitlines() == [
        "name   n   time",
        "a      1  10 ms",
        "bbb   22    3 s"]
    assert format_table(rows, ["name", "n", "time"], align="lrl", rule=True,
                        indent=2).splitlines() == [
        "  name   n  time",
        "  ----  --  -----",
        "  a      1  10 ms",
        "  bbb   22  3 s"]  # no trailing blanks
    assert format_table([["x", 1]], widths=[3, 4], sep=" ") == "x      1"
    assert format_table(rows, ["name", "n", "time"], markdown=True).splitlines() == [
        "| name | n | time |", "|---|---|---|", "| a | 1 | 10 ms |", "| bbb | 22 | 3 s |"]
