"""llm-profiler's question on any counted phase: how much of X in scope Y.

    counter = perfcounter.count_config("config.json", batch_size=16, prompt_length=200)
    counter.counts["prefill"].profile("attn", "MULT")       # an int
    print(format_profile(counter.counts["prefill"], "attn", ["FLOPS", "MULT"]))

A scope (llm-profiler's, seeds 000/001, and more):
- "transformer" (the default): every op under the model but the output head;
- "attn", "mlp", "embedding", "lm_head": the modules named so in any transformers
  or perfcounter model (self_attn / attention / attn, mlp / feed_forward /
  block_sparse_moe, ...; module_kinds.SCOPES);
- a module class, "LlamaDecoderLayer", "Linear": every module of that class;
- a module path or a glob over paths, with or without the root class:
  "model.layers.12.self_attn.k_proj", "model.layers.*.mlp".
A module's ops include its children's. A path deeper than the counter's depth is
folded into its listed ancestor, as records are.

An attr: what perfcounter counts / what llm-profiler counted under that name.

| attr    | perfcounter                                     | llm-profiler                     |
| ------- | ----------------------------------------------- | -------------------------------- |
| FLOPS   | every primitive op, ADD + MULT + ... + CMP      | ADD + MULT                       |
| ADD     | adds, subtractions (a MAC's add, sums, biases)  | element-wise additions           |
| MULT    | multiplications (a MAC's mul, scales, gates)    | element-wise multiplications     |
| DIV     | divisions and reciprocals                       | divisions                        |
| SQRT    | square roots and rsqrt                          | square roots                     |
| EXP     | exp and log (softmax)                           | -                                |
| SPECIAL | sin, cos, tanh, erf, sigmoid, ...               | - (sigmoid left out)             |
| CMP     | max, where, comparisons, sorting                | -                                |
| PARAMS  | parameters the modules in scope own             | the same                         |
| ACT     | bytes of activations its ops write              | values of intermediate outputs   |
| CACHE   | bytes of KV cache its ops read and write        | temporary buffers, released      |

A multiply-accumulate is 1 MULT + 1 ADD = 2 FLOPS in both.

So llm-profiler's FLOPs are ADD + MULT here; perfcounter's FLOPS add the
divisions, roots, exponentials, special functions and comparisons it also counts.
ACT and CACHE are bytes (divide by the dtype's size for values); llm-profiler's
CACHE (temporary buffers) is part of perfcounter's ACT, and perfcounter's CACHE is
the KV-cache traffic, which llm-profiler does not count: in decode, attention
reading the cache and the update writing it; in a prefill with transformers'
dynamic cache the prompt's keys and values become the cache without an op
writing them (they are ACT), while a static cache's prefill writes them.
"""
from __future__ import annotations

import fnmatch

from perfcounter._util import did_you_mean
from perfcounter.counting.module_kinds import SCOPES, record_scopes
from perfcounter.format import scaled
from perfcounter.trace import KINDS, ROLES

KIND_ATTRS = {"ADD": "add", "MULT": "mul", "DIV": "div", "SQRT": "sqrt", "EXP": "exp",
              "SPECIAL": "special", "CMP": "cmp"}
ATTRS = ("FLOPS", *KIND_ATTRS, "PARAMS", "ACT", "CACHE")
_ALIASES = {"FLOPS": "FLOPS", "FLOPs": "FLOPS", "MUL": "MULT", "PARAM": "PARAMS",
            "KV": "CACHE", "KV_CACHE": "CACHE", "ACTIVATIONS": "ACT"}
_ACT, _KV = ROLES.index("activation"), ROLES.index("kv_cache")


def check_attr(attr) -> str:
    """The canonical name of an attr ("flops", "FLOPs", "mult" are fine), or a ValueError."""
    name = _ALIASES.get(str(attr), str(attr).upper())
    name = _ALIASES.get(name, name)
    if name not in ATTRS:
        raise ValueError(f"unknown attr {attr!r}; valid: {', '.join(ATTRS)}"
                         f"{did_you_mean(str(attr).upper(), ATTRS, n=1, quote=True)}")
    return name


def _strip_root(path: str) -> str:
    return path.split(".", 1)[1] if "." in path else ""


def scope_filter(trace, scope: str | None):
    """A predicate on module paths: is this module (or record's module) in `scope`?"""
    scope = "transformer" if scope is None else str(scope)
    if scope in SCOPES:
        return lambda path: scope in record_scopes(path)
    paths = [m.path for m in trace.modules]
    roots = ({m.path for m in trace.modules if m.cls == scope}
             or {p for p in paths if fnmatch.fnmatchcase(p, scope)
                 or fnmatch.fnmatchcase(_strip_root(p), scope)})
    if not roots:
        names = set(SCOPES) | {m.cls for m in trace.modules} | {p.rsplit(".", 1)[-1] for p in paths}
        hint = did_you_mean(scope, sorted(names), quote=True)
        raise ValueError(f"scope {scope!r} matches no module of this phase{hint or ';'} "
                         f"scopes: {', '.join(SCOPES)}, a module class, a module path or a "
                         f"glob over paths")

    def inside(path: str) -> bool:
        while path:
            if path in roots:
                return True
            path = path.rpartition(".")[0]
        return False

    return inside


def profile(stats, scope: str | None = "transformer", attr: str = "FLOPS") -> int:
    """One number, llm-profiler's get_profile(kwargs, attr, scope), of a counted phase
    (a PerformanceStats or a Trace): see the module doc for scopes and attrs."""
    trace = getattr(stats, "trace", stats)
    attr = check_attr(attr)
    inside = scope_filter(trace, scope)
    if attr == "PARAMS":
        return sum(m.params for m in trace.modules if inside(m.path))
    records = [r for r in trace.records if r.module and inside(r.module)]
    if attr == "FLOPS":
        return sum(r.flops for r in records)
    if attr == "ACT":
        return sum(r.written[_ACT] for r in records)
    if attr == "CACHE":
        return sum(r.read[_KV] + r.written[_KV] for r in records)
    kind = KINDS.index(KIND_ATTRS[attr])
    return sum(r.kinds[kind] for r in records)


def _shape(stats) -> str:
    """'input batchsize 16 and sequence length 200' from the phase's first module's input."""
    modules = getattr(getattr(stats, "trace", stats), "modules", [])
    shape = modules[0].input_shapes if modules else ""
    dims = shape.split("x")[0].strip("[]").split(", ") if shape else []
    if len(dims) >= 2 and all(d.isdigit() for d in dims[:2]):
        return f" with input batchsize {dims[0]} and sequence length {dims[1]}"
    return ""


def format_profile(stats, scope: str | None = "transformer", attrs=("FLOPS",)) -> str:
    """llm-profiler's printout: the scope and input shape, then one line per attr, in
    10^9 / 10^6 units as it prints them (bytes for ACT and CACHE)."""
    attrs = [check_attr(a) for a in ([attrs] if isinstance(attrs, str) else attrs)]
    label = getattr(stats, "label", "")
    lines = [f"{scope or 'transformer'}{_shape(stats)}{f' ({label})' if label else ''}:"]
    for attr in attrs:
        value = profile(stats, scope, attr)
        unit = " B" if attr in ("ACT", "CACHE") else ""
        if value >= 1e9:
            shown = f"{scaled(value, 'G', 2)}  (10^9){unit}"
        elif value >= 1e6:
            shown = f"{scaled(value, 'M', 2)}  (10^6){unit}"
        else:
            shown = f"{value}{unit}"
        lines.append(f"    {attr + ':':<9} {shown}")
    return "\n".join(lines)
