"""Counts that repeat, derived instead of counted: decode steps and identical layers.

Decode steps (`DecodeSteps`, `fit_steps`). The model: a decode step at context
length x (the tokens already in the cache) has the same records at every x — op,
module, segment, dtype and shape signature with its numbers taken out — and every
figure is affine in x with integer coefficients (a + b·x): each record's calls,
FLOPs, executed FLOPs, primitive counts and bytes by role, each number in its
shape signature, and the step's compulsory bytes by role and valid KV-cache bytes
read. A static cache is constant in buffer terms (read whole, written one row a
step: only the valid KV bytes grow); a cache grown by concatenation grows one
dimension by one a step. The model fails across a sliding window's edge (the
cache stops growing; `decode_breakpoints` says where) and under data-dependent
routing (a real mixture of experts). `DecodeSteps` counts the first three steps in
a row, fits on the first two, checks the third (when they do not fit, it counts a
fourth and fits from the second: the first step may read what the prefill left
differently) and derives every other step in integers, so a derived total equals
stepwise counting exactly when the model holds. When the check fails, or an edge
lies inside the generation, every step is counted.

Identical layers (`count_layers`, `expand_layers`). Decoder layers with the same
config, shapes and code produce the same records. A model with one layer of each
kind (`layer_kinds`: alternating sliding and full attention are two kinds) is
counted, and with one more layer of each kind that repeats; the extra layer's
records must equal its representative's, renamed (layers.0 -> layers.i, segments
kept), else DeriveError. What lies outside the layers and may grow with them (a
cache made per layer; compulsory and valid KV bytes, which cannot be split by op)
is the first count plus, per kind, the difference one more layer made times the
layers of that kind beyond the first. A mixture of experts repeats under balanced
routing, which is what a config-only count runs (model.ConditionalFeedForward).

`count_generation` puts both together for a config-only count. The decode steps live
in derive_steps.py, the layers in derive_layers.py; this module is the way in.
"""
from __future__ import annotations

import warnings

import torch

from perfcounter._util import PerfcounterWarning
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.generation.derive_layers import (count_layers, expand_layers, layer_kinds,
                                                  with_layers)
from perfcounter.generation.derive_steps import (NOT_MEASURED, DecodeSteps, StopGeneration,
                                                 decode_breakpoints)
from perfcounter.generation.step_fit import DeriveError, StepFit, difference, fit_steps
from perfcounter.models.loading import fake_model
from perfcounter.trace import Trace

__all__ = ["NOT_MEASURED", "DecodeSteps", "DeriveError", "StepFit", "StopGeneration",
           "count_generation", "count_layers", "decode_breakpoints", "difference",
           "expand_layers", "fit_steps", "layer_kinds", "with_layers"]


def count_generation(config, counter, *, batch_size: int = 1, prompt_length: int,
                     max_new_tokens: int, dtype=torch.bfloat16, device: str = "cpu",
                     generate, make_model=None, make_counter=None, every_layer: bool = False,
                     every_step: bool = False, **generate_kwargs):
    """Count one generation of a weightless model (FakeTensorMode) into `counter` (labels
    "prefill" and "decode") as config_only.count_config_only does, deriving what repeats:
    one layer per kind (unless every_layer) and the decode steps after the first three
    (unless every_step). Falls back to counting, with a warning, where a derivation's check
    fails. Returns the whole fake model (for its parameter counts).

    config: ModelArgs (our Transformer, unless make_model is given) or a transformers
    config with make_model given (config_only passes its greedy generation loops);
    make_model(config) -> (model, fake mode);
    make_counter() -> a fresh counter for each smaller model (default: counter's depth, io
    model and MoE expert load);
    generate(model, prompt, max_new_tokens, phase=..., **generate_kwargs)."""

    if "cuda" in device and not torch.cuda.is_available():
        device = "cpu"  # fake CUDA modules cannot be initialised without CUDA; counts agree
    make_model = make_model or (lambda c: fake_model(c, dtype=dtype, device=device))

    def like_counter():
        sub = TransformerPerformanceCounter(depth=counter.mode.depth, io_model=counter.io_model)
        sub.mode.expert_load = counter.mode.expert_load  # MoE routing under fake tensors
        return sub

    make_counter = make_counter or like_counter
    tokens: dict[str, int] = {}

    def count(c) -> dict[str, Trace]:
        sub = make_counter()
        model, fake_mode = make_model(c)
        steps = DecodeSteps(sub, max_new_tokens - 1, prompt_length=prompt_length,
                            breakpoints=decode_breakpoints(c), every_step=every_step,
                            stop_early=True)
        with fake_mode:
            x = torch.zeros(batch_size, prompt_length, dtype=torch.int64, device=device)
            try:
                generate(model, x, max_new_tokens, phase=steps, **generate_kwargs)
            except StopGeneration:
                pass
        steps.finish()
        tokens.update({label: s.num_tokens for label, s in sub.counts.items()})
        return {label: s.trace for label, s in sub.counts.items()}

    traces = None
    if not every_layer:
        try:
            traces = count_layers(config, count)
        except DeriveError as e:
            warnings.warn(f"perfcounter: counting every layer ({e})", PerfcounterWarning, stacklevel=2)
    if traces is None:
        traces = count(config)
    for label, trace in traces.items():
        counter.add(label, trace, num_tokens=tokens[label], timing=NOT_MEASURED)
    return make_model(config)[0]
