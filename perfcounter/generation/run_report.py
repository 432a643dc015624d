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

from perfcounter import console
from perfcounter.format import format_table, ratio, scaled, si
from perfcounter.generation import speculative_cost
from perfcounter.devices.calibration_check import describe_check
from perfcounter.devices.registry import get_device_spec
from perfcounter.devices.this_machine import spec_for_run
from perfcounter.generation.config_only import count_gguf
from perfcounter.generation.run import Options
from perfcounter.models.args import ModelArgs
from perfcounter.models.loading import HFCausalLM
from perfcounter.models.model import count_params
from perfcounter.quant import quantize as quantization
from perfcounter.quant import gguf_types
from perfcounter.report.plots import source_name, write_outputs
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
    gguf: object = None  # the GGUF file a real run loaded (dequantized: it runs float weights)
    other_work: dict | None = None  # its timed samples' share lost to other work (time_samples)


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
    as_stored: dict | None = None  # a GGUF run: {phase: predicted s} with its weights as stored


def summarize(o: Options, out: Outcome, counter) -> Summary:
    """What a run mode's outcome and the counter's phases add up to (nothing is printed)."""
    active, total = count_params(out.net)
    if o.gguf_type:  # the weights at the file's bytes, as the counts priced them
        gguf_types.annotate_file_type(out.net, o.args, o.gguf_type)
    size = quantization.model_size_bytes(out.net, o.batch_size, out.length + o.max_new_tokens)
    labels = [label for label in PHASES if label in counter.counts]
    spec_costs = speculative_cost.speculative_costs(
        counter, speculate_k=o.speculate_k, acceptance=out.acceptance,
        acceptance_rate=o.acceptance_rate, baseline=out.baseline) if o.speculative else []
    measured = {label: out.measured.get(label) for label in labels}
    how = (f"mean of {len(out.seconds)} uncounted {o.execution} run(s), {o.clock} clock, "
           f"{torch.get_num_threads()} threads")
    for label, seconds in measured.items():  # the one measured figure of each phase
        if seconds is not None:
            counter.set_measured(label, seconds, timing=how, execution=o.execution)
    stored = as_stored(o, out, counter.device_spec) \
        if out.gguf is not None and o.price_as == "stored" else None
    return Summary(active, total, size, labels, measured, spec_costs, stored)


def print_report(o: Options, out: Outcome, counter, s: Summary, spec, log) -> None:
    """The counter's reports, gpt-fast's sample metrics (a real run), predicted vs measured,
    speculation's costs, the simulated placement; the plots and trace written."""
    log(RULE + f"\nUsing {spec}")
    hf_class = type(out.net.model if isinstance(out.net, HFCausalLM) else out.net).__name__
    log(f"Model Config: {out.args if out.args is not None else hf_class}")
    log(f"Active params, Total Params: {s.active}, {s.total}")
    stored = o.scheme or quantization.quantized_scheme(out.net)  # a checkpoint saved quantized
    stored = stored.name if stored else f"{o.gguf_type} GGUF" if o.gguf_type else "float"
    log(f"Model size: {s.size / 1e9:.2f} GB ({stored} weights, "
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
    print_predicted_vs_measured(counter, s.labels, execution=o.execution)
    if s.as_stored is not None:
        print(as_stored_line(s.as_stored, o.execution))
    if o.speculative:  # cost per accepted token, expected tokens/s from the roofline
        print(RULE + "\n" + speculative_cost.format_speculative(s.spec_costs, out.acceptance,
                                                               spec.name))
    if o.placement is not None:  # the counted run re-priced with its layers placed on devices
        print(RULE + f"\nSimulated placement: {o.mapping}")
        print(simulate(counter, o.placement, execution=o.execution).report())
    if not o.quiet:
        print(RULE + "\nTransformerPerfCounter")
        counter.print_summary(show=True)
    write_outputs(o.pictures, counter, [spec], log=log,  # roofline, bars by module kind, trace
                  measured={k: v for k, v in s.measured.items() if v},
                  name=source_name("generate", o.checkpoint_path or o.config or o.model))


def print_predicted_vs_measured(counter, labels: list[str], execution: str = "eager") -> None:
    """Per phase: counts, the roofline latency on the counter's device (a bound), the
    predicted latency of the program that ran (perfcounter/pricing/predict.py, `execution`),
    energy, and the phase's measured latency (the uncounted runs, counter.set_measured) with
    its ratio to the prediction and to the roofline."""
    graphs = "; the prefill compiled, no graph" if execution == "cudagraphs" else ""
    print(RULE + f"\nPredicted vs measured on {counter.device_spec.name} ({execution} run{graphs})")
    head = ["phase", "tokens", "GFLOPs", "GB", "roofline", "bound", "predicted", "energy",
            "measured", "meas/pred", "meas/roof"]
    rows = []
    for label in labels:
        s = counter.counts[label]
        roof, real, pred = s.roofline_latency, s.latency, predicted_latency(s, execution)
        rows.append([label, s.num_tokens, scaled(s.total_flops, "G", 2), scaled(s.total_io, "G", 3),
                     si(roof, "s", 3, prefix="m"), s.bound or "n/a", si(pred, "s", 3, prefix="m"),
                     si(s.energy_j, "J"), si(real, "s", 3, prefix="m"), ratio(real, pred),
                     ratio(real, roof)])
    print(format_table(rows, head, widths=[8, 7, 10, 9, 11, 8, 11, 9, 11, 9, 9], sep=" ",
                       indent=2))
    print("  roofline: a bound (peak rates, no overhead); predicted: per-op overhead + "
          "achievable rates (docs/predictions.md)")


def predicted_latency(stats, execution: str = "eager") -> float | None:
    """A phase's predicted seconds run as `execution` (EXECUTIONS), or None unpriced."""
    p = stats.prediction(execution)
    return None if p is None else p.latency_s


def as_stored(o: Options, out: Outcome, spec) -> dict:
    """{phase: predicted seconds} of the same generation with the GGUF's weights as stored
    (its quant blocks' bytes; a what-if: a runtime whose kernels read the blocks, not the
    dequantized float weights this run executed), counted from the file's metadata."""
    with console.waiting("counting the what-if: GGUF weights as stored", quiet=o.quiet):
        counter = count_gguf(out.gguf, price_as="stored", hf=o.hf, batch_size=o.batch_size,
                             prompt_length=out.length, new_tokens=o.max_new_tokens,
                             dtype=o.dtype, device_spec=spec)
    return {label: predicted_latency(stats, o.execution)
            for label, stats in counter.counts.items()}


def as_stored_line(predicted: dict, execution: str) -> str:
    """The as-stored what-if, labelled as such: never compared with the measurement."""
    cells = ", ".join(f"{label} {si(t, 's', 3, prefix='m')}" for label, t in predicted.items())
    return (f"  what-if, GGUF weights priced as stored (not the program that ran, which "
            f"executed them dequantized): predicted {cells} ({execution}; --price_as executed "
            "drops this line)")

def run_spec(named, o) -> tuple:
    """(the spec a run is priced on, why, one line): the one --device_spec names (a
    calibration says whether it passed its checks), else this machine's default
    (this_machine.spec_for_run: a run timed on this CPU without a passed calibration saved is
    priced on this machine measured now)."""
    if not named:
        return spec_for_run(o.dtype, measure=not o.config_only and "cuda" not in str(o.device),
                            execution=o.execution,  # an eager run's: no compiled programs'
                            progress=not o.quiet)
    spec, why = get_device_spec(named, dtype=o.dtype), "named by --device_spec"
    if spec.calibration_check:
        why += f"; its calibration {describe_check(spec.calibration_check)}"
    return spec, why


def memory_used(device) -> float:
    if "cuda" in str(device):
        return torch.cuda.max_memory_reserved()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak resident set, Linux KiB


def results_doc(o: Options, out: Outcome, counter, s: Summary) -> dict:
    """The counter's JSON with the run in each phase's "perfcounter" block, and each phase's
    measured and predicted seconds beside the two models."""
    run = {"config_only": o.config_only, "model": repr(out.args), "prompt_tokens": out.length,
           "batch_size": o.batch_size, "max_new_tokens": o.max_new_tokens,
           "compiled": o.compiled, "execution": o.execution, "measured_latency_s": s.measured,
           "sample_seconds": out.seconds, "active_params": s.active, "total_params": s.total,
           "model_size_bytes": s.size, "quantize": o.scheme and o.scheme.name, "kv_dtype": o.kv,
           "device_spec_why": o.spec_why,
           "bandwidth_achieved_Bps": [s.size * o.max_new_tokens * o.batch_size / t
                                      for t in out.seconds]}
    if o.speculative:
        run["speculative"] = {"speculate_k": o.speculate_k,
                              "draft": str(o.draft_checkpoint_path or o.draft_model),
                              "accept_counts": out.acceptance and list(out.acceptance.counts),
                              "costs": [c.to_dict() for c in s.spec_costs]}
    if s.as_stored is not None:
        run["as_stored_predicted_latency_s"] = s.as_stored
    if out.other_work is not None:  # other work's share of the timed samples (CoreWait)
        run["other_work"] = out.other_work
    return counter.to_json(run=run)  # each phase: its one measured latency, its prediction
