"""What a generate.py run found, reported: the run modes' Outcome, the counter's reports,
gpt-fast's sample metrics, predicted vs measured per phase, speculation's costs, the
simulated placement, the plots and trace, and the results document that --save_path writes.

    out = Outcome(net, args, length, texts, seconds, measured)   # what a run mode returns
    s = summarize(o, out, counter)          # params, model size, measured seconds, speculation
    print_report(o, out, counter, s, spec, log)
    doc = results_doc(o, out, counter, s)   # the counter's JSON, the run in each phase's block
"""
from __future__ import annotations

import dataclasses
import resource

import torch

from perfcounter.format import format_table, ratio, scaled, si
from perfcounter.generation import speculative_cost
from perfcounter.generation.run import Options
from perfcounter.models.args import ModelArgs
from perfcounter.models.loading import HFCausalLM
from perfcounter.models.model import count_params
from perfcounter.quant import quantize as quantization
from perfcounter.report.plots import write_outputs
from perfcounter.simulation.run import simulate

RULE = "\n" + "=" * 30 + "\n"
PHASES = ("draft_prefill", "prefill", "decode", "draft", "verify")  # the report's order


@dataclasses.dataclass(slots=True)
class Outcome:
    """A run mode's result: the model counted, its config, the prompt's tokens; a real run's
    texts, seconds per sample and mean seconds per phase; speculation's accept counts and the
    target's plain decode step."""
    net: torch.nn.Module
    args: ModelArgs | None
    length: int
    texts: list[str] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)
    measured: dict = dataclasses.field(default_factory=dict)
    acceptance: object = None
    baseline: object = None


@dataclasses.dataclass(slots=True)
class Summary:
    """What the report and the document share: parameters (active, total), the model's bytes,
    the phases counted (in the report's order) with the measured seconds of each (None: not
    timed), speculation's costs."""
    active: int
    total: int
    size: int
    labels: list[str]
    measured: dict
    spec_costs: list


def summarize(o: Options, out: Outcome, counter) -> Summary:
    """What a run mode's outcome and the counter's phases add up to (nothing is printed)."""
    active, total = count_params(out.net)
    size = quantization.model_size_bytes(out.net, o.batch_size, out.length + o.max_new_tokens)
    labels = [label for label in PHASES if label in counter.counts]
    spec_costs = speculative_cost.speculative_costs(
        counter, speculate_k=o.speculate_k, acceptance=out.acceptance,
        acceptance_rate=o.acceptance_rate, baseline=out.baseline) if o.speculative else []
    measured = {label: out.measured.get(label) for label in labels}
    return Summary(active, total, size, labels, measured, spec_costs)


def print_report(o: Options, out: Outcome, counter, s: Summary, spec, log) -> None:
    """The counter's reports, gpt-fast's sample metrics (a real run), predicted vs measured,
    speculation's costs, the simulated placement; the plots and trace written."""
    log(RULE + f"\nUsing {spec}")
    hf_class = type(out.net.model if isinstance(out.net, HFCausalLM) else out.net).__name__
    log(f"Model Config: {out.args if out.args is not None else hf_class}")
    log(f"Active params, Total Params: {s.active}, {s.total}")
    stored = o.scheme or quantization.quantized_scheme(out.net)  # a checkpoint saved quantized
    log(f"Model size: {s.size / 1e9:.2f} GB ({stored.name if stored else 'float'} weights, "
        f"{o.kv or 'float'} KV cache; gpt-fast's _get_model_size)")
    if not o.quiet:
        for label in s.labels:
            print(RULE + "\nTransformerPerfCounter Metrics")
            counter.print_summary(labels=[label], show=True)
    if not o.config_only:
        for i, text in enumerate(out.texts):
            log(RULE + f"\nGenerated text for sample {i}: {text}")
        tokens = o.max_new_tokens * o.batch_size
        log("\nGPTFast Sample Metrics")
        for i, t in enumerate(out.seconds):
            log(f"  Time for inference {i + 1}: {out.length} prompt tokens {o.max_new_tokens} "
                f"tokens generated, {t:.02f} sec total, {tokens / t:.02f} tokens/sec")
            log(f"  Bandwidth achieved: {si(s.size * tokens / t, 'B/s', prefix='G')}")
        log(RULE + "\nGPTFast Aggregate Stats")
        log(f"  Average tokens/sec: {sum(tokens / t for t in out.seconds) / len(out.seconds):.2f}")
        log(f"  Memory used: {si(memory_used(o.device), 'B', prefix='G')}")
    print_predicted_vs_measured(counter, s.labels, s.measured, compiled=o.compiled)
    if o.speculative:  # cost per accepted token, expected tokens/s from the roofline
        print(RULE + "\n" + speculative_cost.format_speculative(s.spec_costs, out.acceptance,
                                                               spec.name))
    if o.placement is not None:  # the counted run re-priced with its layers placed on devices
        print(RULE + f"\nSimulated placement: {o.mapping}")
        print(simulate(counter, o.placement).report())
    if not o.quiet:
        print(RULE + "\nTransformerPerfCounter")
        counter.print_summary(show=True)
    write_outputs(o.pictures, counter, [spec], log=log,  # roofline, bars by module kind, trace
                  measured={k: v for k, v in s.measured.items() if v})


def print_predicted_vs_measured(counter, labels: list[str], measured: dict, compiled: bool) -> None:
    """Per phase: counts, the roofline latency on the counter's device (a bound), the
    predicted latency (perfcounter/pricing/predict.py; compiled: fused), energy, and the measured
    latency of the uncounted runs with its ratio to the prediction and to the roofline."""
    print(RULE + f"\nPredicted vs measured on {counter.device_spec.name}"
          + (" (compiled run)" if compiled else ""))
    head = ["phase", "tokens", "GFLOPs", "GB", "roofline", "bound", "predicted", "energy",
            "measured", "meas/pred", "meas/roof"]
    rows = []
    for label in labels:
        s = counter.counts[label]
        roof, real, pred = s.roofline_latency, measured.get(label), predicted_latency(s, compiled)
        rows.append([label, s.num_tokens, scaled(s.total_flops, "G", 2), scaled(s.total_io, "G", 3),
                     si(roof, "s", 3, prefix="m"), s.bound or "n/a", si(pred, "s", 3, prefix="m"),
                     si(s.energy_j, "J"), si(real, "s", 3, prefix="m"), ratio(real, pred),
                     ratio(real, roof)])
    print(format_table(rows, head, widths=[8, 7, 10, 9, 11, 8, 11, 9, 11, 9, 9], sep=" ",
                       indent=2))
    print("  roofline: a bound (peak rates, no overhead); predicted: per-op overhead + "
          "achievable rates (README, Predictions)")


def predicted_latency(stats, compiled: bool) -> float | None:
    """A phase's predicted seconds, run eagerly or compiled (fused), or None unpriced."""
    p = stats.prediction("compiled" if compiled else "eager")
    return None if p is None else p.latency_s


def memory_used(device) -> float:
    if "cuda" in str(device):
        return torch.cuda.max_memory_reserved()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak resident set, Linux KiB


def results_doc(o: Options, out: Outcome, counter, s: Summary) -> dict:
    """The counter's JSON with the run in each phase's "perfcounter" block, and each phase's
    measured and predicted seconds beside the two models."""
    run = {"config_only": o.config_only, "model": repr(out.args), "prompt_tokens": out.length,
           "batch_size": o.batch_size, "max_new_tokens": o.max_new_tokens,
           "compiled": o.compiled, "measured_latency_s": s.measured,
           "sample_seconds": out.seconds, "active_params": s.active, "total_params": s.total,
           "model_size_bytes": s.size, "quantize": o.scheme and o.scheme.name, "kv_dtype": o.kv,
           "bandwidth_achieved_Bps": [s.size * o.max_new_tokens * o.batch_size / t
                                      for t in out.seconds]}
    if o.speculative:
        run["speculative"] = {"speculate_k": o.speculate_k,
                              "draft": str(o.draft_checkpoint_path or o.draft_model),
                              "accept_counts": out.acceptance and list(out.acceptance.counts),
                              "costs": [c.to_dict() for c in s.spec_costs]}
    doc = counter.to_json(run=run)
    for label, phase in doc.items():  # the uncounted runs' time beside the two models
        if label in counter.counts:
            phase["measured_latency_s"] = s.measured.get(label)
            phase["predicted_latency_s"] = predicted_latency(counter.counts[label], o.compiled)
    return doc
