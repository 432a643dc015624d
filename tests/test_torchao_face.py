"""What a torchao user reads: the report's module depth, utilization, module rows, a ratio
across devices, compare()'s columns, int32 positions and parameter counts."""
import torch

from perfcounter import TransformerPerformanceCounter
from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.models.model import Transformer, count_params
from perfcounter.quant.quantize import quantize_model
from perfcounter.report.phase import _utilization, format_stats
from perfcounter.stats import PerformanceStats
from perfcounter.trace import OpRecord, Trace

ARGS = dict(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_local_heads=2, dim=64,
            intermediate_size=128)


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**{**ARGS, **overrides})).eval()
    model.setup_caches(max_batch_size=1, max_seq_length=16)
    return model


def test_int32_positions_run_as_int64_ones():
    model, x = tiny(), torch.randint(0, 256, (1, 4))
    with torch.no_grad():
        want = model(x, torch.arange(4))
        model.setup_caches(max_batch_size=1, max_seq_length=16)
        got = model(x, torch.arange(4, dtype=torch.int32))  # gpt-fast's caches take int32
    assert torch.equal(got, want)


def test_a_depth_3_counter_reports_modules_to_depth_3_without_twin_rows():
    counter, model = TransformerPerformanceCounter(depth=3, device_spec="generic-cpu"), tiny()
    with torch.no_grad(), counter.count("prefill", 4):
        model(torch.randint(0, 256, (1, 4)), torch.arange(4))
    text = format_stats(counter.counts["prefill"])
    assert "  Modules (depth 3, layer indices merged as *)" in text
    assert "Transformer.layers.*" in text  # its list, Transformer.layers, has the same figures
    assert "    Transformer.layers " not in text


def test_a_tiny_utilization_keeps_two_significant_digits():
    assert _utilization(3.2e-07) == "3.2e-05 % (3.2e-07 of peak)"
    assert _utilization(0.0113) == "1.13 % (0.0113 of peak)" and _utilization(None) == "n/a"


def stats_on(spec_name: str, timing: str) -> PerformanceStats:
    recs = [OpRecord("aten.mm.default", "M.proj", "bfloat16", (), 1, 1000, 1000,
                     read=[2000, 0, 0, 0, 0])]
    return PerformanceStats("decode", 8, 0.5, Trace(records=recs),
                            get_device_spec(spec_name, dtype=torch.bfloat16), timing=timing)


def test_a_host_clock_timing_priced_on_a_gpu_says_the_ratio_spans_two_devices():
    note = "    NB: timed by the host's clock, priced on h100-sxm (cuda)"
    assert note in format_stats(stats_on("h100-sxm", "time.perf_counter"))
    assert "NB: timed" not in format_stats(stats_on("h100-sxm", "cuda events, synchronized"))
    assert "NB: timed" not in format_stats(stats_on("generic-cpu", "time.perf_counter"))


def test_compare_sets_each_tokens_per_second_beside_its_latency():
    counter, model = TransformerPerformanceCounter(device_spec="generic-cpu"), tiny()
    with torch.no_grad(), counter.count("prefill", 4):
        model(torch.randint(0, 256, (1, 4)), torch.arange(4))
    table = counter.compare(["h100-sxm"])
    head = str(table).splitlines()[0].split()
    assert head[2:9] == ["Roofline", "Bound", "Roofline", "tok/s", "Predicted", "Predicted",
                         "tok/s"]
    row = table.to_dict()[0]
    # 4 tokens over the predicted seconds; the roofline's figure is the roofline's
    assert row["predicted_tokens_per_s"] == 4 / row["predicted_latency"]
    assert row["tokens_per_s"] == 4 / row["roofline_latency"]


def test_int8_quantization_leaves_the_parameter_count_as_it_was():
    """Tied head, dim 64, vocab 256, 2 layers: embedding 256 * 64 = 16,384; a layer's wqkv
    64 * (64 + 2 * 2 * 16) = 8,192, wo 4,096, w1 + w3 2 * 64 * 128 = 16,384, w2 8,192, two
    norms 128: 36,992; 16,384 + 2 * 36,992 + 64 (the final norm) = 90,432, the head shared."""
    model = tiny(tie_embeddings=True)
    assert count_params(model) == (90_432, 90_432)
    quantize_model(model, "int8")  # the head stored apart, as int8: the same parameters
    assert model.output.weight is not model.tok_embeddings.weight
    assert count_params(model) == (90_432, 90_432)
