"""One engine step counted exactly: a ragged batch of sequence pieces in one forward.

A serving engine (vLLM v1, Sarathi-Serve) runs a step as one forward over the T
tokens of every scheduled sequence, flattened: each linear layer is one matmul
of T rows (its weight read once), and attention runs per sequence over that
sequence's own KV cache (a varlen kernel over paged blocks). A `Piece` is one
sequence's share of a step: `new_tokens` tokens (a prefill chunk, or 1 for a
decode) after `context` tokens already in its cache.

`count_step(args, pieces)` counts such a step of perfcounter's gpt-fast model
(model.py) under FakeTensorMode, no weights: the model's own modules run on the
concatenated tokens [1, T, dim]; each layer's attention gets a `_RaggedKV` that
writes each piece's new keys and values into that piece's cache (exactly
context + new_tokens positions long: what a paged cache holds) and attends per
piece with SDPA under the causal structure, its queries the last positions of
the keys (op_data.py). Logits are computed for the last token of every piece,
as vLLM v1 does (it discards those of unfinished prefill chunks). One rank of a sharded
model (parallel/sharding.py) runs its collectives here as its own forward calls them.

Two things stand in here for what a varlen kernel takes as plain offsets, and
are not charged (`strip_offsets`): the per-piece mask that carries the causal
structure (its bytes, role "input", leave the attention record) and the copy
joining the pieces' attention outputs (aten.cat in the attention module), laid
out [1, T, H, D] as a varlen kernel writes it, so that the model's transpose
back copies nothing (its fused IO, the attention outputs read and the join written, goes
too). Records that move no byte and compute nothing (views,
metadata) are left out of the step table (steps.py).

A mixture of experts runs its experts as an engine's fused MoE does (`_moe_forward`):
the router as the model runs it, the T x k routed rows (each token's k experts) gathered,
one grouped GEMM per weight (w1, w3, w2: aten._grouped_mm over [E, ...] stacked weights)
with the SwiGLU between them, and the k outputs of each token scaled by their routing
weights and summed (the model's einsum would be a batched matmul whose layout changes at
T = 1).
Without data the counter spreads the rows evenly (counting's balanced ExpertLoad): each
grouped GEMM computes T x k rows exactly and reads the weights of min(T x k, E) experts;
the step table (steps.py) takes that count of experts as a feature of its own. Quantized
experts (quant/experts.py: no grouped GEMM takes int8 / int4 / fp8 stacked weights) run
their own kernels per expert on the same split: the same rows, experts and FLOPs, each
touched expert's weights read once as stored.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from perfcounter.costs.collectives import tp_all_reduce
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.models.args import ModelArgs
from perfcounter.models.loading import fake_model
from perfcounter.models.model import ConditionalFeedForward, precompute_freqs_cis
from perfcounter.quant.ops import KV_DTYPES, quantize_per_token
from perfcounter.trace import ROLES, Trace

_INPUT = ROLES.index("input")
_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
_QUANTIZED = "perfcounter.quantized_kv_sdpa.default"  # attention over an int8 / fp8 cache


@dataclass(frozen=True, slots=True)
class Piece:
    """One sequence's share of a step: new_tokens after context tokens already cached."""

    new_tokens: int
    context: int

    @property
    def kv_positions(self) -> int:
        return self.context + self.new_tokens


class _RaggedKV:
    """A layer's KV caches for the pieces of one step (Attention.kv_cache's interface:
    `update` then `attention`); kv "int8" / "fp8": stored quantized with a scale per token
    and KV head (quantize.QuantizedKVCache's layout), read by quantized_kv_sdpa."""

    def __init__(self, pieces, heads: int, head_dim: int, dtype, masks, slots, kv=None):
        self.sizes, self.kv = [p.new_tokens for p in pieces], kv
        shape = [(1, heads, p.kv_positions, head_dim) for p in pieces]
        stored = dtype if kv is None else KV_DTYPES[kv][0]
        self.k = [torch.zeros(s, dtype=stored) for s in shape]
        self.v = [torch.zeros(s, dtype=stored) for s in shape]
        self.k_scales = [torch.zeros(*s[:3], 1, dtype=dtype) for s in shape] if kv else None
        self.v_scales = [torch.zeros(*s[:3], 1, dtype=dtype) for s in shape] if kv else None
        self.pos, self.masks = slots, masks  # shared by every layer, as an engine's slot mapping

    def update(self, input_pos, k, v):
        # k, v: [1, H_kv, T, D] -> each piece's rows written at its own positions; quantized
        # once for the step's T tokens (as an engine's cache-write kernel does), then written
        for caches, scales, val in ((self.k, self.k_scales, k), (self.v, self.v_scales, v)):
            if self.kv is not None:
                val, scale = quantize_per_token(val, self.kv)  # [1, H_kv, T, D], [.., 1]
                if val.dtype != torch.int8:  # index_copy_ has no float8 kernel: the bytes
                    val = val.view(torch.uint8)
                for i, sp in enumerate(scale.split(self.sizes, dim=2)):
                    scales[i].index_copy_(2, self.pos[i], sp)
            for i, part in enumerate(val.split(self.sizes, dim=2)):
                cache = caches[i] if part.dtype == caches[i].dtype else caches[i].view(part.dtype)
                cache.index_copy_(2, self.pos[i], part)
        return k, v

    def _attend(self, i, qp, enable_gqa):
        if self.kv is None:
            return F.scaled_dot_product_attention(qp, self.k[i], self.v[i],
                                                  attn_mask=self.masks[i], enable_gqa=enable_gqa)
        return torch.ops.perfcounter.quantized_kv_sdpa(qp, self.k[i], self.v[i], self.k_scales[i],
                                                       self.v_scales[i], self.masks[i], enable_gqa)

    def attention(self, q, k, v, attn_mask=None, dropout_p=0.0, enable_gqa=False):
        # q: [1, H, T, D] -> per piece [1, H, n, D] over its [1, H_kv, c + n, D] cache
        out = [self._attend(i, qp, enable_gqa) for i, qp in enumerate(q.split(self.sizes, dim=2))]
        # joined as a varlen kernel writes it, [1, T, H, D]: the model's transpose back and
        # .contiguous() then copy nothing, at any T
        return torch.cat([o.transpose(1, 2) for o in out], dim=1).transpose(1, 2)


def _grouped_experts(self, x, expert_indices):
    # x [T, dim], expert_indices [T, k] -> [T, k, dim]: the routed rows through one grouped
    # GEMM per weight (w1, w3 [E, I, dim], w2 [E, dim, I]; offs: each expert's last row)
    tokens, k = expert_indices.shape
    rows = x.repeat_interleave(k, dim=0)  # [T k, dim], the gather sorting rows by expert
    offs = torch.zeros(self.w1.shape[0], dtype=torch.int32)
    h = F.silu(torch._grouped_mm(rows, self.w1.mT, offs)) * torch._grouped_mm(rows, self.w3.mT,
                                                                               offs)
    return torch._grouped_mm(h, self.w2.mT, offs).view(tokens, k, -1)


def _moe_forward(self, x):
    # x [1, T, dim] -> [1, T, dim]: model.MOEFeedForward's router, fused MoE's experts
    shape = x.shape
    x = x.reshape(-1, shape[-1])  # [T, dim]
    probs = F.softmax(self.gate(x).float(), dim=-1)  # [T, E]
    weights, indices = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = (self.experts(x, indices) * weights[..., None]).sum(dim=1)  # [T, dim]
    return tp_all_reduce(out, self.tp if self.ep == 1 else 1).view(shape)  # a rank's (model.py)


def _ragged_forward(self, idx, input_pos, freqs_cis, last):
    # idx [1, T] token ids, input_pos [T] positions, last [B] rows whose logits are computed
    x = self.embed(idx)  # [1, T, dim]
    freqs = freqs_cis[input_pos].to(x.dtype)
    for layer in self.layers:
        x = layer(x, input_pos, freqs, None)
    return self.logits(self.norm(self.to_next_stage(x))[:, last])  # [1, B, vocab]


def _is_join(r) -> bool:
    return r.op == "aten.cat.default" and r.module.endswith("attention")


def strip_offsets(trace: Trace, mask_storage: int, is_join=_is_join) -> Trace:
    """The step without what stands in for a varlen kernel's offsets (see the module doc).
    mask_storage: bytes of the one element every mask expands (compulsory IO reads it once);
    is_join(record): whether a record is the join of the pieces' attention outputs."""
    records = []
    masks = 0
    fused_read, fused_written = list(trace.fused_read), list(trace.fused_written)
    for r in trace.records:
        if is_join(r):
            # alone in its fused kernel: it reads the attention outputs and writes what wo reads
            fused_read = [max(0, a - b) for a, b in zip(fused_read, r.read)]
            fused_written = [max(0, a - b) for a, b in zip(fused_written, r.written)]
            continue
        if r.op in (_FLASH, _QUANTIZED) and r.read[_INPUT]:
            r = r.copy()
            masks += r.read[_INPUT]
            r.read[_INPUT] = 0
        records.append(r)
    comp = list(trace.compulsory_read)
    if masks:
        comp[_INPUT] -= mask_storage
    return replace(trace, records=records, compulsory_read=comp, fused_read=fused_read,
                   fused_written=fused_written)


def prime_caches(counter, caches) -> None:
    """Every position of each cache valid before the step (earlier steps wrote them): a
    counted block of its own ("prime", not the step's) writes each whole, so that the step's
    attention counts the pairs of every cached position (the counter takes a cache written
    in part as valid as far as it was written: a static cache, mode.kv_positions)."""
    with counter.count("prime", num_tokens=1):
        for t in caches:
            if t is not None:
                t.copy_(torch.zeros_like(t))


def build(args: ModelArgs, dtype=torch.bfloat16, *, weights=None, kv=None,
          stored=None) -> tuple:
    """(fake model, its FakeTensorMode, its RoPE table) that count_step counts a step of:
    built once, counted at many steps (steps.count_table: 9 shapes of one model). weights,
    kv, stored: count_step's."""
    model, fake_mode = fake_model(args, dtype=dtype, weights=weights, kv=kv)
    if stored is not None:
        stored(model)
    model.forward = types.MethodType(_ragged_forward, model)
    with fake_mode:  # the model's table: rows read by position
        freqs = precompute_freqs_cis(args.block_size, args.head_dim, args.rope_base,
                                     args.rope_scaling)
    return model, fake_mode, freqs


def count_step(args: ModelArgs, pieces, dtype=torch.bfloat16, depth: int = 10, *,
               weights=None, kv=None, stored=None, built: tuple | None = None) -> Trace:
    """The counted trace of one engine step of `pieces` (see the module doc); weights (a
    quantize.WeightScheme or its name) and kv ("int8", "fp8"): stored quantized, as
    `perfcounter count --quantize --kv_dtype` counts them (bytes as stored); stored: a
    callable that marks the fake model's weights with their bytes as stored (a llama.cpp
    file's, gguf_types.GgufFile.annotate); built: `build`'s of the same args, dtype, weights,
    kv and marks, counted again (None: built here; kv is still the step's cache's)."""
    pieces = [p if isinstance(p, Piece) else Piece(*p) for p in pieces]
    if not pieces or any(p.new_tokens < 1 or p.context < 0 for p in pieces):
        raise ValueError(f"a step needs pieces of >= 1 new token after >= 0 cached; got {pieces}")
    model, fake_mode, freqs = built if built is not None else \
        build(args, dtype, weights=weights, kv=kv, stored=stored)
    counter = TransformerPerformanceCounter(depth=depth)
    total = sum(p.new_tokens for p in pieces)
    with fake_mode:
        idx = torch.zeros(1, total, dtype=torch.int64)
        input_pos = torch.cat([torch.arange(p.context, p.kv_positions) for p in pieces])
        ends = torch.tensor([p.new_tokens for p in pieces]).cumsum(0) - 1
        one = torch.zeros(1, 1, 1, 1, dtype=dtype)
        masks = [one.expand(1, 1, p.new_tokens, p.kv_positions) for p in pieces]
        slots = [torch.arange(p.context, p.kv_positions) for p in pieces]
        kvs = []
        for layer in model.layers:
            experts = getattr(layer.feed_forward, "cond_ffn", None)
            if experts is not None:
                if isinstance(experts, ConditionalFeedForward):  # quantized: its own kernels
                    experts.forward = types.MethodType(_grouped_experts, experts)
                layer.feed_forward.forward = types.MethodType(_moe_forward, layer.feed_forward)
            layer.attention.kv_cache = _RaggedKV(pieces, args.n_local_heads, args.head_dim,
                                                 dtype, masks, slots, kv)
            kvs.append(layer.attention.kv_cache)
        prime_caches(counter, [t for c in kvs for t in (*c.k, *c.v, *(c.k_scales or ()),
                                                        *(c.v_scales or ()))])
        with counter.count("step", num_tokens=total):
            model(idx, input_pos, freqs, ends)
    return strip_offsets(counter.counts["step"].trace, one.element_size())
