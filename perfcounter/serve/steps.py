"""The step table: what any engine step of a model costs on a device, without counting it.

A step is a ragged batch of pieces (ragged.py: n_i new tokens after c_i cached).
Its figures are affine, record group by record group, in seven features:

    step = 1                      (weights are read once per forward)
    tokens = Σ n_i                (linear layers, norms, RoPE, residuals)
    seqs = number of pieces       (per-sequence calls; logits of each last token)
    kv_positions = Σ (c_i + n_i)  (keys and values attention reads)
    dense_pairs = Σ n_i (c_i + n_i)            (dense attention scores)
    causal_pairs = Σ window_pairs(n_i, c_i + n_i)  (what a causal kernel computes)
    experts = distinct experts a layer's tokens touch (0 without experts)

(and, for a transformers model only, steps_hf.py: its windowed layers' keys and pairs, a step
of one token, MLA's decode pieces; 0 for perfcounter's model, left out of its fits)

A mixture of experts routes by data, so its step reads the weights of the experts its
tokens touch, which no affine figure of the tokens gives. Routed uniformly (counting's
balanced `expert_load`), the T tokens each choosing k distinct experts of E independently,
an expert is missed by a token with probability 1 - k/E, so a layer touches in expectation

    experts(T) = E (1 - (1 - k/E)^T)      (k at T = 1, towards E as T grows)

and under a skewed `expert_load` (expert e taking a share s_e of the routed rows, a token
picking it with probability k s_e) Σ_e 1 - (1 - k s_e)^T: fewer, popular experts.

and each touched expert's weights are read once a step (a fused MoE kernel), while the
experts' FLOPs and activations follow the T k routed rows (the tokens feature). Counting
without data spreads the rows evenly instead (min(T k, E) experts; ragged.py runs the
experts as grouped GEMMs), so the fit takes each counted step's experts as counted
(`StepCounts.xs`) and a step is priced at the expectation (`StepCounts.features`).

A record group is the records of one op, module (layer index taken out), segment,
dtype and argument pattern (their integers taken out: trace_args.pattern), so one group
holds the same op of every piece: in an engine the pieces' attention is one varlen
kernel, priced as one record. `count_table` counts a model of one decoder layer of
each kind (perfcounter's model: one kind) at the FIT shapes (ragged.count_step),
fits every group figure by least squares, refuses a fit that does not reproduce
every counted shape (StepModelError), and multiplies the layer groups by the number
of layers. The step's compulsory bytes (each storage once: whether the step fits the
device's cache) and its fused IO (what a compiled program moves outside its matmuls and
attention, trace.py) cannot be split by record; they are fitted
as a whole from counts of one and two layers, the second layer's share repeated (within
1 %: a few bytes of activations per step, 1e-3 of them, are not affine). tests/test_serve_steps.py holds held-out mixed steps to the counted ones
(FLOPs and bytes within 1 %; in practice exact) and a two-layer count to the table.

A llama.cpp file (`weights` a gguf_types.GgufFile: `--gguf_type`, or a .gguf model) stores
its layers in different types (Q4_K_M: attn_v and ffn_down at Q6_K in half of them): the
layers are grouped by their weights' bytes (`kinds`), one layer of each kind is counted (the
counted model's layer j stands for kinds[j]: GroupKey.kind) and its groups repeat as often as
its kind; held to counting the whole model in tests/test_serve_gguf.py.

Pricing a step on a device is pricing.py's.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import numpy as np
import torch

from perfcounter.costs.attention import window_pairs
from perfcounter.counting.op_data import ExpertLoad
from perfcounter.generation.figures import Figures
from perfcounter.models.args import ModelArgs
from perfcounter.models.layer_paths import at_layer, every_layer, in_layer, layer_of
from perfcounter.quant.gguf_types import GgufFile
from perfcounter.serve.errors import ServeError
from perfcounter.serve.ragged import Piece, build, count_step
from perfcounter.trace import OpRecord, Trace
from perfcounter.trace_args import pattern

FEATURES = ("step", "tokens", "seqs", "kv_positions", "dense_pairs", "causal_pairs", "experts",
            # a transformers model's (steps_hf.py): its windowed or chunked layers' keys, dense
            # and causal pairs; a step of one token (whose layout some models' code copies
            # otherwise); MLA's decode pieces (one new token), their keys, whether any decodes
            # and whether any prefills (each path's weights are read once a step it runs)
            "local_kv", "local_dense", "local_pairs", "one_token", "decodes", "decode_kv",
            "any_decode", "any_prefill")
EXPERTS = FEATURES.index("experts")
BASE = EXPERTS + 1  # perfcounter's model's features end here; the others are 0 for it
FIT = ([(1, 0)], [(1, 127)], [(8, 0)], [(8, 56)], [(32, 0)], [(24, 40)],
       [(1, 30), (1, 90)], [(16, 0), (1, 47), (4, 12)], [(1, 5), (1, 9), (1, 200)])
_NFIG = len(Figures().values())  # a record's figures, in Figures' order


class StepModelError(ServeError):
    """A model whose steps do not follow the affine step model (see the module doc)."""


def expected_experts(tokens: float, experts: int, top_k: int,
                     load: ExpertLoad | None = None) -> float:
    """Distinct experts of `experts` that `tokens` tokens touch, each routed to `top_k`
    distinct experts independently: uniformly, E (1 - (1 - k/E)^T) (the module doc); under a
    skewed `load` (shares of the routed rows), Σ_e 1 - (1 - k s_e)^T (ExpertLoad.expected_hit)."""
    if load is not None and load.shares is not None:
        return load.expected_hit(tokens, experts, top_k)
    if not experts or tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def features(pieces, window: int | None = None, experts: tuple | None = None,
             load: ExpertLoad | None = None, local: tuple | None = None,
             mla: bool = False) -> np.ndarray:
    """The features of a step of `pieces` (Piece or (new_tokens, context)); experts: (E, k)
    of a mixture of experts (the expectation of the module doc, under `load` when skewed),
    None: 0; local: a transformers model's windowed layers, ("sliding", w) or ("chunked", C),
    and mla: its decode pieces (steps_hf.py), else 0."""
    f = np.zeros(len(FEATURES))
    f[0] = 1.0
    for p in pieces:
        n, c = (p.new_tokens, p.context) if isinstance(p, Piece) else p
        f[1] += n
        f[2] += 1
        f[3] += c + n
        f[4] += n * (c + n)
        f[5] += window_pairs(n, c + n, window)
        if local is not None or mla:
            extra_features(f, n, c, local, mla)
    if local is not None or mla:
        f[BASE + 3] = float(f[1] == 1)
    if experts:
        f[EXPERTS] = expected_experts(f[1], *experts, load)
    return f


def extra_features(f: np.ndarray, n: int, c: int, local: tuple | None, mla: bool) -> None:
    """A piece's share of a transformers model's features, added to f: its windowed layers'
    keys (local_keys) and pairs; MLA's decode piece (n == 1), its keys, the indicators."""
    if local is not None:
        keys = local_keys(n, c, local)
        f[BASE] += keys
        f[BASE + 1] += n * keys
        f[BASE + 2] += window_pairs(n, keys, local[1] if local[0] == "sliding" else None)
    if mla:
        if n == 1:
            f[BASE + 4] += 1
            f[BASE + 5] += c + 1
            f[BASE + 6] = 1.0
        else:
            f[BASE + 7] = 1.0


def local_keys(n: int, c: int, local: tuple) -> int:
    """Keys a windowed layer holds and reads for n new tokens after c: a sliding window w,
    min(c + n, w - 1 + n); a chunk of C, the tokens since the first query's chunk began,
    c + n - C floor(c / C) (ragged_hf.piece_keys counts the same)."""
    kind, size = local
    if kind == "sliding":
        return min(c + n, size - 1 + n)
    return c + n - size * (c // size)


def counted_features(pieces, window: int | None = None, experts: tuple | None = None,
                     load: ExpertLoad | None = None, local: tuple | None = None,
                     mla: bool = False) -> np.ndarray:
    """The features of a step as counting without data sees it: the experts touched are
    those the counter's `load` (balanced: min(T k, E)) gives rows to."""
    f = features(pieces, window, local=local, mla=mla)
    if experts:
        f[EXPERTS] = (load or ExpertLoad()).experts_hit(int(f[1]) * experts[1], experts[0])
    return f


class GroupKey(NamedTuple):
    op: str
    module: str  # layer index taken out: "Transformer.layers.*.attention"
    segment: int
    dtype: str
    has_formula: bool
    pattern: tuple  # the arguments but their integers (trace_args.pattern)
    kind: int  # the layer of the counted model the record ran in (its kind); -1: no layer


def group_key(r: OpRecord) -> GroupKey:
    return GroupKey(r.op, every_layer(r.module), r.segment, r.dtype, r.has_formula,
                    pattern(r.args), layer_of(r.module))


@dataclasses.dataclass
class StepCounts:
    """Per group, each figure as coefficients over FEATURES (device-free; whole model)."""

    args: ModelArgs
    dtype: str
    keys: list  # GroupKey per group
    coef: np.ndarray  # [groups, figures, features]
    layers: np.ndarray  # [groups] how many times the group repeats (n_layer or 1)
    sample: dict  # GroupKey -> a counted record (module path and args for trace_at)
    window: int | None
    fit_traces: list  # the counted one-layer traces of the fit's steps, in order (pricers fit on)
    compulsory: np.ndarray  # [features] the whole model's compulsory bytes (read + written)
    xs: np.ndarray  # [FIT shapes, features] the counted steps' features (experts as counted)
    weights: str | None = None  # the linears' quantize scheme (its name), None: float
    kv: str | None = None  # the KV cache's quantized dtype ("int8", "fp8"), None: float
    fused: np.ndarray | None = None  # [features] the whole model's fused IO (Trace.fused_bytes)
    load: ExpertLoad | None = None  # routing a step is priced at (None: balanced)
    # the whole model's layers by kind, the counted model's layer j standing for kinds[j]
    # (a llama.cpp file whose layers store different types); None: one kind, every layer
    kinds: tuple | None = None
    local: tuple | None = None  # a transformers model's windowed layers: ("sliding", w), ...
    mla: bool = False  # a transformers model's MLA decode path (steps_hf.py)

    @property
    def experts(self) -> tuple | None:
        """(E, k) of a mixture of experts, None for a dense model."""
        a = self.args
        return (a.num_experts, a.num_activated_experts) if a.num_experts else None

    def features(self, pieces) -> np.ndarray:
        """A step's features as the table prices it (experts: the expectation)."""
        return features(pieces, self.window, self.experts, self.load, self.local, self.mla)

    def experts_touched(self, tokens: int) -> float:
        """The experts feature of a step of `tokens` tokens (0 for a dense model)."""
        return expected_experts(tokens, *self.experts, self.load) if self.experts else 0.0

    def layers_of(self, kind: int) -> range | tuple:
        """The whole model's layers a counted layer `kind` stands for (-1: none)."""
        if kind < 0:
            return ()
        return self.kinds[kind] if self.kinds is not None else range(self.args.n_layer)

    def repeats(self, r: OpRecord) -> int:
        """How many times a record of a counted trace stands in the whole model."""
        return len(self.layers_of(layer_of(r.module))) if in_layer(r.module) else 1

    def figures(self, f: np.ndarray) -> np.ndarray:
        """[groups, figures] of a step with features f, whole model."""
        return (self.coef @ f) * self.layers[:, None]

    def totals(self, f: np.ndarray) -> dict:
        fig = Figures.from_values(self.figures(f).sum(axis=0))
        read, written = np.array(fig.read), np.array(fig.written)
        return {"flops": fig.flops, "executed_flops": fig.executed_flops,
                "bytes": read.sum() + written.sum(), "read": read, "written": written}

    def trace_at(self, pieces) -> Trace:
        """A whole-model Trace of a step of `pieces`, from the fit (layers expanded)."""
        f = self.features(pieces)
        fig = np.rint(self.coef @ f).astype(np.int64)
        records = []
        for g, key in enumerate(self.keys):
            r = self.sample[key]
            v = Figures.from_values(int(x) for x in fig[g])
            if not v.nonzero():
                continue
            for i in (self.layers_of(key.kind) if in_layer(key.module) else [None]):
                module = key.module if i is None else at_layer(key.module, i)
                records.append(v.record(r.op, module, r.dtype, r.args, r.has_formula, r.segment))
        return Trace(records=records, modules=[])


def group_figures(trace: Trace, keys: dict) -> np.ndarray:
    out = np.zeros((len(keys), _NFIG))
    for r in trace.records:
        if not (r.bytes or r.flops or r.executed_flops):
            continue  # views and metadata: no cost in a step
        k = keys.setdefault(group_key(r), len(keys))
        if k >= out.shape[0]:
            out = np.vstack([out, np.zeros((k + 1 - out.shape[0], _NFIG))])
        out[k] += Figures.of(r).values()
    return out


def fit(xs: np.ndarray, ys: np.ndarray, what: str, tolerance: float = 1e-6) -> np.ndarray:
    """Least-squares coefficients [outputs, features] of ys [shapes, outputs] over
    xs [shapes, features]; StepModelError when a counted shape is not reproduced within
    `tolerance` (relative)."""
    used = np.ones(xs.shape[1], dtype=bool)
    used[BASE:] = np.abs(xs[:, BASE:]).sum(axis=0) > 0  # a transformers model's, where it has them
    coef = np.zeros((xs.shape[1], ys.shape[1]))
    if used[BASE:].any():  # features of many magnitudes: each column scaled to norm 1
        norm = np.linalg.norm(xs[:, used], axis=0)
        norm[norm == 0] = 1.0  # a feature 0 in every counted step (experts of a dense model)
        scaled, *_ = np.linalg.lstsq(xs[:, used] / norm, ys, rcond=None)
        coef[used] = scaled / norm[:, None]
    else:
        coef[used], *_ = np.linalg.lstsq(xs[:, used], ys, rcond=None)
    err = np.abs(xs @ coef - ys)
    scale = np.maximum(np.abs(ys), 1e-9 * np.abs(ys).max(axis=0, keepdims=True) + 1e-300)
    worst = float((err / scale).max()) if ys.size else 0.0
    if worst > tolerance:
        raise StepModelError(f"the step model does not reproduce the counted {what} "
                             f"(worst relative error {worst:.2g}): this model's steps are not "
                             f"affine in {', '.join(FEATURES[1:])}")
    return coef.T


def saturating(shapes, experts) -> tuple:
    """Steps to add so that at least two of `shapes` route more rows than the experts (T k >
    E): below that, every counted step touches min(T k, E) = T k experts, the experts
    feature is k x the tokens feature, and the fit cannot tell a cost per expert touched (an
    expert's weights) from one per token; it would price a large batch's expert weights per
    token (gpt-oss-120b's 128 experts, top-4, and DeepSeek-V3's 256, top-8, both run past
    FIT's 32 tokens x k unsaturated; perfcounter's model the same). The steps added: a
    prefill of n = ceil(2E / k) tokens (twice the rows that saturate), and one of n tokens
    beside a decode."""
    if not experts:
        return ()
    e, k = experts
    hit = sum(sum(n for n, _ in s) * k > e for s in shapes)
    n = -(-2 * e // k)
    return ([(n, 0)], [(n, 16), (1, 40)])[:max(0, 2 - hit)]


def count_table(args: ModelArgs, dtype=torch.bfloat16, *, weights=None, kv=None) -> StepCounts:
    """Count the FIT steps of a one-layer copy of `args` and fit (see the module doc);
    weights (a quantize.WeightScheme) and kv ("int8", "fp8"): stored quantized (bytes as
    stored, FLOPs at `dtype`, as ragged.count_step counts them). weights a
    gguf_types.GgufFile (a llama.cpp file, whose layers may store different types): one layer
    of each kind of layer is counted (the counted model's layer j standing for kinds[j]),
    each group repeated as often as its kind; the whole model's compulsory bytes add each
    kind's weight bytes beyond the first kind's (its layers differ in their weights alone).
    A transformers model (hf_model.HfArgs) is steps_hf.count_hf_table's."""
    gguf = weights if isinstance(weights, GgufFile) else None
    kinds = gguf.kinds() if gguf is not None else None
    reps = [k[0] for k in kinds] if kinds is not None else [0]  # a layer of each kind
    n, counted = args.n_layer, len(reps)
    extra = 0  # the whole model's weight bytes beyond those of its layers all of the first kind
    if gguf is not None:
        per_layer = [gguf.layer_bytes(i) for i in reps]
        extra = sum((len(k) - 1) * (b - per_layer[0]) for k, b in zip(kinds, per_layer))

    built: dict = {}  # the counted models by their layers: each built once (ragged.build)

    def count(layers: list[int], shape) -> Trace:
        marks = None if gguf is None else functools.partial(gguf.annotate, layers=layers)
        counted = dataclasses.replace(args, n_layer=len(layers))
        model = built.get(tuple(layers))
        if model is None:
            model = built[tuple(layers)] = build(counted, dtype, kv=kv, stored=marks,
                                                 weights=None if gguf else weights)
        return count_step(counted, [Piece(*p) for p in shape], dtype, kv=kv, built=model)
    keys: dict = {}
    rows, sample, traces, whole_model = [], {}, [], []
    experts = (args.num_experts, args.num_activated_experts) if args.num_experts else None
    shapes = FIT + saturating(FIT, experts)
    for shape in shapes:
        trace = count(reps, shape)
        traces.append(trace)
        second = count(reps + reps[:1], shape) if n > counted else trace
        # the counted layers + the others x the extra first-kind layer's share (+ kinds' bytes)
        whole_model.append([a + (n - counted) * (b - a) + extra * (i == 0)
                            for i, (a, b) in enumerate((
                                (trace.compulsory_bytes, second.compulsory_bytes),
                                (trace.fused_bytes, second.fused_bytes)))])
        rows.append(group_figures(trace, keys))
        for r in trace.records:
            sample.setdefault(group_key(r), r)
    g = len(keys)
    ys = np.stack([np.pad(r, ((0, g - r.shape[0]), (0, 0))) for r in rows])  # [S, G, F]
    xs = np.stack([counted_features(s, args.sliding_window, experts) for s in shapes])
    coef = fit(xs, ys.reshape(len(shapes), -1), "figures").reshape(g, _NFIG, len(FEATURES))
    ordered = sorted(keys, key=keys.get)
    layers = np.array([(len(kinds[k.kind]) if kinds is not None else n)
                       if in_layer(k.module) else 1 for k in ordered], float)
    # NB: a few bytes of activations per step are not affine (1e-3 of them at most)
    whole, fused = fit(xs, np.array(whole_model, float), "compulsory and fused bytes", 0.01)
    return StepCounts(args, str(dtype).replace("torch.", ""), ordered, coef, layers, sample,
                      args.sliding_window, traces, whole, xs,
                      getattr(weights, "name", weights), kv, fused, kinds=kinds)
