"""Identical decoder layers counted once per kind, the others derived (see derive.py).

A model with one layer of each kind (`layer_kinds`) is counted, and with one more
layer of each kind that repeats (`with_layers` makes the configs). `expand_layers`
renames the representative's records to every layer of its kind (layers.0 ->
layers.i, segments kept) and derives what lies outside the layers — records
there, such as a cache made per layer, and the phase figures that cannot be split
by op (compulsory bytes, valid KV bytes) — as the first count plus, per kind, the
difference one more layer made times the layers of that kind beyond the first.
`count_layers` checks that the extra layer's records are its representative's
(else DeriveError) and expands every phase.
"""
from __future__ import annotations

import copy
import dataclasses
from collections import Counter

from perfcounter.generation.figures import DeriveError, Figures, PhaseFigures
from perfcounter.generation.step_fit import difference, keyed_records, uncounted_counts
from perfcounter.models.args import ModelArgs
from perfcounter.models.layer_paths import at_layer, is_layer, layer_of
from perfcounter.trace import OpRecord, Trace


# The per-layer settings of transformers' configs, each read as transformers' modeling code
# reads it: a layer's attention type (layer_types[i]); whether it applies RoPE
# (no_rope_layers[i], Llama 4, SmolLM3); whether it holds experts (i in moe_layers, Llama 4;
# i >= first_k_dense_replace, DeepSeek-V2/V3, GLM-4-MoE, dots1, Mistral 4; i not in
# mlp_only_layers and (i + 1) % decoder_sparse_step == 0, Qwen2/3-MoE). moe_layer_freq is in
# configs but no modeling file reads it. A layer's kind joins what it reads of each.
_PER_LAYER = ("no_rope_layers", "moe_layers", "first_k_dense_replace", "mlp_only_layers",
              "decoder_sparse_step")


def layer_kinds(config) -> list[str]:
    """The kind of each decoder layer of a ModelArgs or Hugging Face config: layers of one
    kind are identical. Its attention type ("decoder" without layer_types), then each
    per-layer setting the config has ("full_attention", "sliding_attention",
    "decoder;rope=0;experts=1")."""
    if isinstance(config, ModelArgs):
        return ["decoder"] * config.n_layer  # a sliding window or experts apply to every layer
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(n, int):
        raise DeriveError(f"{type(config).__name__} has no num_hidden_layers")
    types = list(getattr(config, "layer_types", None) or ["decoder"] * n)
    if len(types) != n:
        raise DeriveError(f"{len(types)} layer_types for {n} layers")
    return [";".join([types[i], *_settings(config, i, n)]) for i in range(n)]


def _settings(config, i: int, n: int) -> list[str]:
    """What layer i reads of the config's per-layer settings (_PER_LAYER), as "name=value"."""
    out = []
    rope = getattr(config, "no_rope_layers", None)
    if rope:
        if len(rope) != n:
            raise DeriveError(f"{len(rope)} no_rope_layers for {n} layers")
        out.append(f"rope={int(rope[i])}")
    experts = None
    if getattr(config, "moe_layers", None) is not None:
        experts = i in config.moe_layers
    elif getattr(config, "first_k_dense_replace", None) is not None:
        experts = i >= config.first_k_dense_replace
    elif getattr(config, "mlp_only_layers", None) is not None \
            or getattr(config, "decoder_sparse_step", None) is not None:
        step = getattr(config, "decoder_sparse_step", None) or 1
        experts = i not in (getattr(config, "mlp_only_layers", None) or ()) and (i + 1) % step == 0
    if experts is not None:
        out.append(f"experts={int(experts)}")
    return out


def with_layers(config, kinds: list[str]):
    """A copy of config with one layer per entry of kinds (layer_kinds' names); DeriveError
    for an order the config cannot say (first_k_dense_replace: its dense layers first)."""
    if isinstance(config, ModelArgs):
        return dataclasses.replace(config, n_layer=len(kinds))
    out = copy.deepcopy(config)
    out.num_hidden_layers = len(kinds)
    parts = [dict(p.split("=", 1) for p in k.split(";")[1:]) for k in kinds]
    if getattr(config, "layer_types", None):
        out.layer_types = [k.split(";", 1)[0] for k in kinds]
    if getattr(config, "no_rope_layers", None):
        out.no_rope_layers = [int(p["rope"]) for p in parts]
    experts = [p.get("experts") == "1" for p in parts]
    if getattr(config, "moe_layers", None) is not None:
        out.moe_layers = [j for j, e in enumerate(experts) if e]
    elif getattr(config, "first_k_dense_replace", None) is not None:
        dense = experts.index(True) if True in experts else len(experts)
        if any(experts[:dense]) or not all(experts[dense:]):
            raise DeriveError(f"layers {kinds} are not dense first: "
                              "first_k_dense_replace cannot say them")
        out.first_k_dense_replace = dense
    elif getattr(config, "mlp_only_layers", None) is not None \
            or getattr(config, "decoder_sparse_step", None) is not None:
        out.decoder_sparse_step = 1
        out.mlp_only_layers = [j for j, e in enumerate(experts) if not e]
    return out


def arranged(config, kinds: list[str]) -> list[str]:
    """kinds in an order the config can say: first_k_dense_replace's dense layers first
    (stable), any order otherwise."""
    if isinstance(config, ModelArgs) or getattr(config, "moe_layers", None) is not None \
            or getattr(config, "first_k_dense_replace", None) is None:
        return list(kinds)
    return sorted(kinds, key=lambda k: "experts=1" in k.split(";"))


def _layout(trace: Trace, n: int) -> tuple[str, str, int]:
    """(parent module, the layer list's path "P.layers", index of layer 0 among the parent's
    children) of a trace of a model with n layers."""
    lists: dict[str, set] = {}
    for m in trace.modules:
        layer = is_layer(m.path)
        if layer is not None:
            lists.setdefault(layer.container, set()).add(layer.index)
    found = [name for name, idx in lists.items() if idx == set(range(n))]
    if len(found) != 1:
        raise DeriveError(f"cannot tell the {n} decoder layers among the modules "
                          f"({', '.join(sorted(lists)) or 'none listed'}): the counter's depth "
                          "must list them")
    container, parent = found[0], found[0].rsplit(".", 1)[0]
    paths = [f"{container}.{i}" for i in range(n)]
    children = next((m.children for m in trace.modules if m.path == parent), [])
    a = children.index(paths[0]) if paths[0] in children else -1
    if children[a:a + n] != paths:
        raise DeriveError(f"the layers of {parent} do not run once each, one after the other")
    return parent, container, a


def _outside(trace: Trace, parent: str, container: str, first: int, n: int, to: int) -> dict:
    """{key: record} of the records outside the layers of a trace with n layers, the
    parent's segments after the layers moved as in a model with `to` layers."""
    out = {}
    for r in trace.records:
        if layer_of(r.module, container) >= 0:
            continue
        r = r.copy()
        if r.module == parent and r.segment > first:
            if r.segment < first + n:
                raise DeriveError(f"{r.op} runs in {parent} between two layers; count every layer")
            r.segment += to - n
        out.setdefault(r.key, []).append(r)
    return {k: v[0] if len(v) == 1 else keyed_records(v)[k] for k, v in out.items()}


def expand_layers(base: Trace, base_kinds: list[str], kinds: list[str],
                  plus: dict[str, Trace] | None = None) -> Trace:
    """The trace of a model with layers `kinds` from that of the model with `base_kinds`
    (one layer per kind): each layer's records are its kind's representative's, renamed.
    plus[kind]: the trace with one more layer of that kind, needed for each kind that
    repeats: what is outside the layers (records, their segments in the parent moved; the
    phase figures) is the base's plus, per kind, the difference one more layer made times
    the layers of that kind beyond the first."""
    nb, nf = len(base_kinds), len(kinds)
    parent, container, first = _layout(base, nb)
    rep = {kind: base_kinds.index(kind) for kind in base_kinds}
    outside = _outside(base, parent, container, first, nb, nf)
    figs = {k: Figures.of(r) for k, r in outside.items()}
    named = dict(outside)  # a record of each key, for its names
    zeros = Figures()
    phase, extra = PhaseFigures.of(base), Counter(kinds)
    extra.subtract(base_kinds)
    overhead = base.overhead_s
    for kind, n in extra.items():
        if not n:
            continue
        if plus is None or kind not in plus:
            raise ValueError(f"expand_layers needs plus[{kind!r}]: the count with one more "
                             f"{kind!r} layer")
        if _layout(plus[kind], nb + 1) != (parent, container, first):
            raise DeriveError(f"one more {kind!r} layer moved the layers")
        more = _outside(plus[kind], parent, container, first, nb + 1, nf)
        for key in [*outside, *(k for k in more if k not in outside)]:
            a = Figures.of(more[key]) if key in more else zeros
            b = Figures.of(outside[key]) if key in outside else zeros
            figs[key] = figs.get(key, zeros).along(a.minus(b), n)
            named.setdefault(key, more.get(key))
        phase = phase.along(PhaseFigures.of(plus[kind]).minus(PhaseFigures.of(base)), n)
        overhead += plus[kind].overhead_s
    if phase.lowest() < 0:
        raise DeriveError("compulsory or valid KV bytes do not add up per layer")
    records = []
    for key, f in figs.items():
        if f.lowest() < 0:
            raise DeriveError(f"{key[0]} under {key[1] or 'top level'} does not add up per layer")
        if f.nonzero():
            r = named[key]
            records.append(f.record(r.op, r.module, r.dtype, r.args, r.has_formula, r.segment))
    per_layer: list[list[OpRecord]] = [[] for _ in range(nb)]
    for r in base.records:
        i = layer_of(r.module, container)
        if i >= 0:
            per_layer[i].append(r)
    for j, kind in enumerate(kinds):
        for r in per_layer[rep[kind]]:
            r = r.copy()
            r.module = at_layer(r.module, j, container)
            records.append(r)
    at = [k for k, m in enumerate(base.modules) if layer_of(m.path, container) >= 0]
    if at != list(range(at[0], at[-1] + 1)):
        raise DeriveError(f"modules outside the layers first ran between layers of {parent}")
    layer_mods = base.modules[at[0]:at[-1] + 1]
    modules = [dataclasses.replace(m, children=list(m.children)) for m in base.modules[:at[0]]]
    for j, kind in enumerate(kinds):
        modules += [dataclasses.replace(m, path=at_layer(m.path, j, container),
                                        children=[at_layer(c, j, container) for c in m.children])
                    for m in layer_mods if layer_of(m.path, container) == rep[kind]]
    modules += [dataclasses.replace(m, children=list(m.children))
                for m in base.modules[at[-1] + 1:]]
    for m in modules:
        if m.path == parent:
            m.children[first:first + nb] = [f"{container}.{j}" for j in range(len(kinds))]
    return Trace(records=records, **phase.trace_fields(), uncounted_ops=uncounted_counts(records),
                 steps=base.steps, overhead_s=overhead, modules=modules)


def count_layers(config, count, *, kinds: list[str] | None = None) -> dict[str, Trace]:
    """{label: Trace} of the model `config` describes, from `count(config) -> {label: Trace}`
    run on smaller configs: one layer per kind, and one more layer of each kind that
    repeats. DeriveError when an extra layer's records are not its representative's."""
    kinds = list(kinds) if kinds is not None else layer_kinds(config)
    base = arranged(config, list(dict.fromkeys(kinds)))
    if len(base) == len(kinds):
        return count(config)
    got = count(with_layers(config, base))
    more = {k: arranged(config, base + [k]) for k in base if kinds.count(k) > 1}
    plus = {k: count(with_layers(config, order)) for k, order in more.items()}
    out = {}
    for label, trace in got.items():
        extra = {k: p[label] for k, p in plus.items()}
        for k, p in extra.items():
            diff = difference(expand_layers(trace, base, more[k], extra), p)
            if diff:
                raise DeriveError(f"a second {k!r} layer does not repeat the first ({label}): "
                                  f"{diff}")
        out[label] = expand_layers(trace, base, kinds, extra)
    return out
