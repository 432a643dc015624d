"""The step table of a transformers causal LM (hf_model.HfArgs): steps.py's table, counted on
transformers' own modeling code (ragged_hf.py) with one layer of each kind.

The model of one layer of each kind (derive_layers.layer_kinds: full and sliding attention,
dense and expert feed-forwards, RoPE or none) is built once, one rank's (hf_model's
rank_config), and every step of fit_shapes (FIT, or FIT_HF where a window or MLA needs
more) is counted on it; its groups are fitted over steps.FEATURES as steps.count_table fits
perfcounter's model, each layer group repeated as often as its kind.
The whole model's compulsory and fused bytes add, per kind that repeats, what one more layer
of that kind added (a count with it) times its layers beyond the first.

Two things of a transformers model are features of their own (steps.FEATURES):
- windowed layers (sliding or chunked attention): the keys they hold and read and the pairs
  they compute follow the window (steps.local_keys), not the context. They are counted with
  the window shrunk to LOCAL_COUNTED tokens, so that the FIT steps, whose contexts run past
  it, tell the windowed layers' figures apart from the full layers'; a record's figures per
  key and per pair do not depend on the window's size, and the table prices the config's;
- MLA's two paths (ragged_hf.py): decode pieces and their keys, and whether a step runs
  each path (each reads its absorbed or up-projection weights once).

`fake_hf_model` builds the rank's model; building and counting a real config's one-layer-
per-kind model takes seconds (benchmarks/bench_hf_presets.py prints them).
"""
from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import numpy as np
import torch

from perfcounter.generation.config_only import fake_hf_model
from perfcounter.models import kv_layout
from perfcounter.models.layer_paths import in_layer, layer_of
from perfcounter.serve.hf_model import HfArgs, rank_model_kinds
from perfcounter.serve.ragged import Piece
from perfcounter.serve.ragged_hf import attention_modules, count_hf_step, is_mla
from perfcounter.trace import Trace
from perfcounter.serve.steps import (FIT, StepCounts, StepModelError, group_figures,
                                     counted_features, fit, group_key, saturating)

LOCAL_COUNTED = 16  # the window a windowed layer is counted with (the module doc)
# FIT and steps that tell a window's and MLA's features apart (decodes alone, mixed, long)
FIT_HF = FIT + ([(1, 300)], [(1, 3), (1, 64), (1, 150)], [(4, 90), (1, 33)],
                [(2, 0), (1, 70)], [(6, 40)], [(3, 100), (2, 7), (1, 0)])


def local_attention(config) -> tuple | None:
    """("sliding", w) or ("chunked", C) of a config's windowed layers; None without any."""
    types = set(kv_layout.layer_types(config))
    if "sliding_attention" in types:
        return ("sliding", config.sliding_window)
    if "chunked_attention" in types:
        return ("chunked", config.attention_chunk_size)
    return None


def fit_shapes(experts, local, mla) -> tuple:
    """FIT where its steps tell every feature the model has apart as well as FIT_HF's do
    (a dense model without windows: 9 counts, not 15), else FIT_HF; with steps that touch
    every expert added where too few do (saturating)."""
    def rank(shapes):
        xs = np.stack([counted_features(s, None, experts, local=local, mla=mla)
                       for s in shapes])
        return np.linalg.matrix_rank(xs / np.maximum(np.linalg.norm(xs, axis=0), 1e-300))
    shapes = FIT if rank(FIT) == rank(FIT_HF) else FIT_HF
    return shapes + saturating(shapes, experts)



def _counted(config):
    """`config` with its window shrunk to LOCAL_COUNTED (the module doc)."""
    config = copy.deepcopy(config)
    local = local_attention(config)
    if local is not None:
        field = "sliding_window" if local[0] == "sliding" else "attention_chunk_size"
        setattr(config, field, min(getattr(config, field), LOCAL_COUNTED))
    return config


def as_stored(trace: Trace, ratios: dict, runs_in: str | None) -> Trace:
    """`trace` with each record of a module holding converted weights reading them as stored
    (its weight bytes x the module's ratio, hf_stored.py) and, for fp8, computing in FP8; the
    compulsory weight bytes less what the records no longer read."""
    if not ratios:
        return trace
    records, saved = [], 0
    for r in trace.records:
        ratio = ratios.get(r.module)
        if ratio is not None and r.read[0]:
            r = r.copy()
            stored = round(r.read[0] * ratio)
            saved += r.read[0] - stored
            r.read[0] = stored
            if runs_in is not None and (r.flops or r.executed_flops):
                r.dtype = runs_in
        records.append(r)
    compulsory = list(trace.compulsory_read)
    compulsory[0] = max(0, compulsory[0] - saved)
    return dataclasses.replace(trace, records=records, compulsory_read=compulsory)


def _whole_model(traces, plus, kinds, reps):
    """[shapes, 2] the whole model's compulsory and fused bytes: the counted model's, plus per
    kind that repeats (plus[kind]: its traces with one more layer of it) the difference times
    the layers of that kind beyond the first."""
    count = Counter(kinds)
    out = []
    for s, trace in enumerate(traces):
        row = [trace.compulsory_bytes, trace.fused_bytes]
        for kind, more in plus.items():
            extra = count[kind] - 1
            row[0] += extra * (more[s].compulsory_bytes - trace.compulsory_bytes)
            row[1] += extra * (more[s].fused_bytes - trace.fused_bytes)
        out.append(row)
    return np.array(out, float)


def count_hf_table(args: HfArgs, dtype=torch.bfloat16, *, weights=None, kv=None) -> StepCounts:
    """steps.count_table for a transformers model (the module doc); weights and kv: refused
    here (a transformers model's stored formats are its preset's: stored.py)."""
    if weights is not None or kv is not None:
        raise StepModelError(f"{args.name}: --quantize and --kv_dtype price perfcounter's model; "
                             "a transformers model is priced as its checkpoint stores it")
    kinds, reps = args.kinds, rank_model_kinds(args)
    config = _counted(args.rank_config(reps))
    local = local_attention(config)
    model, fake_mode = fake_hf_model(config, dtype=dtype)
    mla = any(is_mla(m) for m in attention_modules(model).values())
    tp, ep, stored = args.tensor_parallel_size, args.expert_parallel_size, args.stored
    precision = str(dtype).replace("torch.", "")
    runs_in = stored.runs_in(precision) if stored is not None else None

    def count(built, shape):
        trace = count_hf_step(built[0], built[1], [Piece(*p) for p in shape], dtype, tp=tp,
                              ep=ep)
        ratios = stored.module_ratios(built[0]) if stored is not None else {}
        return as_stored(trace, ratios, runs_in if runs_in != precision else None)
    experts = (args.num_experts, args.num_activated_experts) if args.num_experts else None
    shapes = fit_shapes(experts, local, mla)
    traces = [count((model, fake_mode), shape) for shape in shapes]
    plus = {}
    for kind in reps:
        if kinds.count(kind) > 1:
            more = fake_hf_model(_counted(args.rank_config(reps + [kind])), dtype=dtype)
            plus[kind] = [count(more, shape) for shape in shapes]
    keys: dict = {}
    rows, sample = [], {}
    for trace in traces:
        rows.append(group_figures(trace, keys))
        for r in trace.records:
            sample.setdefault(group_key(r), r)
    g = len(keys)
    ys = np.stack([np.pad(r, ((0, g - r.shape[0]), (0, 0))) for r in rows])
    xs = np.stack([counted_features(s, None, experts, local=local, mla=mla) for s in shapes])
    # NB 1e-5: fourteen features of magnitudes 1 to 1e5 condition the fit worse than
    # perfcounter's seven (1e-6); a figure's integer is still its own after rounding
    coef = fit(xs, ys.reshape(len(shapes), -1), "figures", 1e-5).reshape(
        g, ys.shape[2], xs.shape[1])
    ordered = sorted(keys, key=keys.get)
    # the counted model's layer j (arranged) stands for every layer of kind reps[j]
    counted_kinds = tuple(tuple(i for i, k in enumerate(kinds) if k == rep) for rep in reps)
    layers = np.array([len(counted_kinds[k.kind]) if in_layer(k.module) else 1
                       for k in ordered], float)
    whole, fused = fit(xs, _whole_model(traces, plus, kinds, reps),
                       "compulsory and fused bytes", 0.01)
    return StepCounts(args, str(dtype).replace("torch.", ""), ordered, coef, layers, sample,
                      None, traces, whole, xs, fused=fused, kinds=counted_kinds,
                      local=local_attention(args.config), mla=mla)


__all__ = ["FIT_HF", "LOCAL_COUNTED", "count_hf_table", "local_attention", "layer_of"]
