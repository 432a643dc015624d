"""A compact gpt-fast style decoder-only Transformer with a static KV cache.

One model covers the Llama family and its relatives: RMSNorm, rotary position
embeddings (with Llama-3 frequency scaling), grouped-query attention through
`F.scaled_dot_product_attention`, a SwiGLU feed-forward or a top-k mixture of
experts (Mixtral), optional q/k/v bias (Qwen2), tied input/output embeddings
(SmolLM2, small Qwen2) and an optional sliding attention window (Mistral).

Weights use gpt-fast's layout and names (fused `wqkv`, rotary dimensions
interleaved in pairs), so gpt-fast `model.pth` checkpoints load unchanged;
loading.py converts Hugging Face weights into it. The KV cache is a module
with buffers `k_cache` / `v_cache` of shape [B, H_kv, max_seq, D], written in
place with `index_copy_` at `input_pos`; attention always reads the whole
static cache under a mask, as gpt-fast does.

Built from a rank's shapes (perfcounter/parallel/sharding.py's RankArgs), the model is one
rank of a model sharded as Megatron and vLLM shard it, and calls the collectives where they do
(costs/collectives.py): an all-reduce after the row-parallel wo and w2 (and a MoE layer) and
after the vocab-parallel embedding, an all-gather of the LM head's vocab shards, a send/recv
of a pipeline stage's hidden states. With one rank it runs exactly the ops it always ran.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from perfcounter.costs.collectives import (ep_all_to_all, send_recv_stages, tp_all_gather,
                                           tp_all_reduce)
from perfcounter.models.args import ModelArgs
from perfcounter.quant.experts import QuantizedExperts


class KVCache(nn.Module):
    def __init__(self, max_batch_size: int, max_seq_length: int, n_heads: int, head_dim: int,
                 dtype: torch.dtype):
        super().__init__()
        shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)

    def update(self, input_pos: Tensor, k_val: Tensor, v_val: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [S], k_val / v_val: [B, H_kv, S, D]
        self.k_cache.index_copy_(2, input_pos, k_val)
        self.v_cache.index_copy_(2, input_pos, v_val)
        return self.k_cache, self.v_cache


class Transformer(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.max_batch_size = -1
        self.max_seq_length = -1
        self.make_kv_cache = KVCache  # quantize.quantize_kv_cache swaps in a quantized cache
        # one rank of a sharded model (parallel.sharding.RankArgs: the ranks its collectives span)
        self.tp = getattr(config, "tensor_parallel_size", 1)
        self.pp = getattr(config, "pipeline_parallel_size", 1)

    @classmethod
    def from_name(cls, name: str) -> "Transformer":
        return cls(ModelArgs.from_name(name))

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        """Allocate KV caches, rotary table and mask for up to `max_seq_length` positions."""
        if max_seq_length > self.config.block_size:
            raise ValueError(f"max_seq_length={max_seq_length} exceeds the model's "
                             f"block_size={self.config.block_size}")
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        weight = self.tok_embeddings.weight  # the activations' dtype (output may be quantized)
        cfg = self.config
        for layer in self.layers:
            layer.attention.kv_cache = self.make_kv_cache(
                max_batch_size, max_seq_length, cfg.n_local_heads, cfg.head_dim,
                weight.dtype).to(weight.device)
        freqs = precompute_freqs_cis(max_seq_length, cfg.head_dim, cfg.rope_base, cfg.rope_scaling)
        self.register_buffer("freqs_cis", freqs.to(weight.device), persistent=False)
        mask = torch.ones(max_seq_length, max_seq_length, dtype=torch.bool).tril()
        if cfg.sliding_window is not None:  # key k is visible from query q when q - k < window
            mask = mask.triu(-(cfg.sliding_window - 1))
        self.register_buffer("causal_mask", mask.to(weight.device), persistent=False)

    def forward(self, idx: Tensor, input_pos: Tensor) -> Tensor:
        # idx: [B, S] token ids, input_pos: [S] positions -> logits [B, S, vocab]
        if self.max_seq_length < 0:
            raise RuntimeError("call setup_caches(max_batch_size, max_seq_length) before forward")
        if input_pos.dtype != torch.long:  # int32 positions, as gpt-fast's caches take them
            input_pos = input_pos.long()  # index_copy_ into the cache takes int64 only
        mask = self.causal_mask[None, None, input_pos]  # [1, 1, S, max_seq]
        x = self.embed(idx)  # [B, S, dim]
        freqs_cis = self.freqs_cis[input_pos].to(x.dtype)  # [S, D/2, 2], rotations in x's dtype
        for layer in self.layers:
            x = layer(x, input_pos, freqs_cis, mask)
        return self.logits(self.norm(self.to_next_stage(x)))

    def embed(self, idx: Tensor) -> Tensor:
        """idx [B, S] -> [B, S, dim]; a tensor-parallel rank looks up its vocab shard's rows and
        an all-reduce sums the shards (vocab-parallel embedding)."""
        return tp_all_reduce(self.tok_embeddings(idx), self.tp)

    def to_next_stage(self, x: Tensor) -> Tensor:
        """A pipeline stage's hidden states sent to the next stage (none without stages)."""
        return send_recv_stages(x, self.pp)

    def logits(self, x: Tensor) -> Tensor:
        """[..., dim] -> [..., vocab]; a tensor-parallel rank computes its vocab shard and an
        all-gather joins the shards (vocab-parallel LM head)."""
        return tp_all_gather(self.output(x), self.tp)


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = MOEFeedForward(config) if config.num_experts else FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: Tensor, input_pos: Tensor, freqs_cis: Tensor, mask: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Attention(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.n_head, self.n_local_heads = config.n_head, config.n_local_heads
        self.head_dim = config.head_dim
        q_size, kv_size = config.n_head * config.head_dim, config.n_local_heads * config.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.wqkv = nn.Linear(config.dim, q_size + 2 * kv_size, bias=config.attention_bias)
        self.wo = nn.Linear(q_size, config.dim, bias=False)
        self.kv_cache: Optional[KVCache] = None
        # the mask's structure, for a counter that has no mask values (fake tensors): causal,
        # within the window, as transformers' attention modules say it
        self.is_causal, self.sliding_window = True, config.sliding_window
        self.tp = getattr(config, "tensor_parallel_size", 1)  # a rank's heads: n_head / tp

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor, input_pos: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        q, k, v = self.wqkv(x).split(self.sizes, dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim)  # [B, S, H, D]
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)  # [B, H_kv, max_seq, D]
        attend = getattr(self.kv_cache, "attention", F.scaled_dot_product_attention)  # quantized KV
        y = attend(q, k, v, attn_mask=mask, dropout_p=0.0,
                   enable_gqa=self.n_head != self.n_local_heads)
        y = y.transpose(1, 2).contiguous().view(bsz, seqlen, self.n_head * self.head_dim)
        return tp_all_reduce(self.wo(y), self.tp)  # row-parallel wo: the ranks' sums added


class FeedForward(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.dim, bias=False)
        self.tp = getattr(config, "tensor_parallel_size", 1)  # column-parallel w1, w3; row w2

    def forward(self, x: Tensor) -> Tensor:
        return tp_all_reduce(self.w2(F.silu(self.w1(x)) * self.w3(x)), self.tp)


class ConditionalFeedForward(nn.Module):
    """One SwiGLU per expert, weights stacked: w1, w3 [E, I, dim], w2 [E, dim, I]."""

    def __init__(self, config: ModelArgs):
        super().__init__()
        e, i, d = config.num_experts, config.intermediate_size, config.dim
        self.w1 = nn.Parameter(torch.randn(e, i, d) * 0.02)
        self.w2 = nn.Parameter(torch.randn(e, d, i) * 0.02)
        self.w3 = nn.Parameter(torch.randn(e, i, d) * 0.02)
        # without data: how rows spread over the experts (counting's ExpertLoad:
        # rows_per_expert(rows, experts)); None spreads them evenly
        self.routing = None

    def forward(self, x: Tensor, expert_indices: Tensor) -> Tensor:
        # x: [T, dim], expert_indices: [T, A] -> [T, A, dim]
        if isinstance(x, FakeTensor):
            if getattr(self.routing, "shares", None) is None:
                return self._balanced(x, expert_indices.shape[1])
            return self._routed(x, expert_indices.shape[1])
        out = x.new_empty(*expert_indices.shape, x.shape[-1])
        for e in expert_indices.unique().tolist():  # each expert in use is read once
            t, a = torch.where(expert_indices == e)
            h = x[t]
            out[t, a] = F.linear(F.silu(F.linear(h, self.w1[e])) * F.linear(h, self.w3[e]), self.w2[e])
        return out

    def _balanced(self, x: Tensor, top_k: int) -> Tensor:
        """Without data the routing is unknown: spread the T*A token-slots evenly over
        min(T*A, E) experts, each read once. FLOPs are exact up to the padding of T*A
        to a multiple of the experts used."""
        slots = x.shape[0] * top_k
        used = min(slots, self.w1.shape[0])
        per = -(-slots // used)
        h = F.pad(x.repeat_interleave(top_k, dim=0), (0, 0, 0, used * per - slots))
        h = h.view(used, per, x.shape[-1])  # [used, per, dim]
        h = F.silu(torch.bmm(h, self.w1[:used].mT)) * torch.bmm(h, self.w3[:used].mT)
        out = torch.bmm(h, self.w2[:used].mT)  # [used, per, dim]
        return out.reshape(used * per, -1)[:slots].view(x.shape[0], top_k, -1)

    def _routed(self, x: Tensor, top_k: int) -> Tensor:
        """The T*A token-slots spread as `routing` says: each expert that gets rows runs
        its SwiGLU once on exactly those rows (no padding), the others are not read."""
        rows = self.routing.rows_per_expert(x.shape[0] * top_k, self.w1.shape[0])
        slots = x.repeat_interleave(top_k, dim=0)  # [T*A, dim]
        outs, start = [], 0
        for e, n in enumerate(rows):
            if n:
                h = slots[start:start + n]
                outs.append(F.linear(F.silu(F.linear(h, self.w1[e])) * F.linear(h, self.w3[e]),
                                     self.w2[e]))
                start += n
        return torch.cat(outs).view(x.shape[0], top_k, -1)


class MOEFeedForward(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        # a rank of expert parallelism holds num_experts of every ep x num_experts, routes
        # over all of them (the router is replicated) and each token to its routed_top_k
        self.ep = getattr(config, "expert_parallel_size", 1)
        self.gate = nn.Linear(config.dim, config.num_experts * self.ep, bias=False)
        self.cond_ffn = ConditionalFeedForward(config)
        self.top_k = getattr(config, "routed_top_k", 0) or config.num_activated_experts
        self.tp = getattr(config, "tensor_parallel_size", 1)  # experts' intermediate / tp

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, dim]
        probs = F.softmax(self.gate(x).float(), dim=-1)  # [T, E]
        weights, indices = torch.topk(probs, self.top_k, dim=-1)  # [T, A]
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.einsum("tai,ta->ti", self.experts(x, indices), weights)
        return tp_all_reduce(out, self.tp if self.ep == 1 else 1).view(shape)

    def experts(self, x: Tensor, indices: Tensor) -> Tensor:
        """x [T, dim], indices [T, A] -> each token's A experts' outputs [T, A, dim]; under
        expert parallelism each token's A rows go to their experts' ranks and come back
        (all-to-all dispatch and combine), this rank's experts running the T A rows it
        receives (as many as it sends when the routing is balanced)."""
        if self.ep == 1:
            return self.cond_ffn(x, indices)
        rows = ep_all_to_all(x.repeat_interleave(indices.shape[1], dim=0), self.ep)  # [T A, dim]
        out = self.cond_ffn(rows, indices.reshape(-1, 1))  # [T A, 1, dim]
        return ep_all_to_all(out.reshape(rows.shape), self.ep).view(*indices.shape, -1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # statistics in float32 read straight from x (no float copy of x): ||x||^2 / dim
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        scale = torch.rsqrt(norm.square() / x.shape[-1] + self.eps)  # [..., 1]
        return (x * scale).type_as(x) * self.weight


def apply_rope_scaling(freqs: Tensor, scaling: dict) -> Tensor:
    """Llama-3.1 frequency scaling: slow long wavelengths by `factor`, keep short ones."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freqs
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    scaled = torch.where(wavelen > old_len / low, freqs / factor, blended)
    return torch.where(wavelen < old_len / high, freqs, scaled)


def precompute_freqs_cis(seq_len: int, n_elem: int, base: float = 10000,
                         rope_scaling: Optional[dict] = None) -> Tensor:
    """cos / sin of every position and rotary pair: [seq_len, n_elem / 2, 2], float32."""
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2, dtype=torch.float32)[: n_elem // 2] / n_elem))
    if rope_scaling is not None:
        freqs = apply_rope_scaling(freqs, rope_scaling)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)


def apply_rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    # x: [B, S, H, D], pair (x[2i], x[2i+1]) turned by angle i; freqs_cis: [S, D/2, 2] (cos, sin)
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]  # [B, S, H, D/2] views
    cos, sin = freqs_cis[None, :, None, :, 0], freqs_cis[None, :, None, :, 1]  # [1, S, 1, D/2]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(3)


QUANT_METADATA = ("scales", "scales_and_zeros", "zeros", "weight_scale")  # a quantized layer's own


def _params(module: nn.Module, seen: set) -> int:
    """Parameters of `module` and its children as the model has them, however they are stored:
    a linear's weight is in_features x out_features whether it is kept as float, int8 or two
    int4 a byte (a MoE's quantized stacked experts: num_experts times that); a quantized
    layer's scales and zero points are not parameters of the model;
    a tensor shared by two modules counts once (`seen`)."""
    n = 0
    for sub in module.modules():
        for name, p in sub.named_parameters(recurse=False):
            if id(p) in seen or name in QUANT_METADATA:
                continue
            seen.add(id(p))
            linear = name == "weight" and hasattr(sub, "in_features") and hasattr(sub, "out_features")
            n += sub.in_features * sub.out_features * getattr(sub, "num_experts", 1) if linear \
                else p.numel()
    return n


def count_params(model: nn.Module) -> tuple[int, int]:
    """(active, total) parameters, as the model has them whatever their storage (see
    `_params`; the bytes they are stored in are quantize.model_size_bytes' figure): total
    counts shared tensors once (a tied head stored apart, as quantization stores it, too);
    active leaves out the embedding table (a row lookup) unless the output head shares it,
    and the experts a token does not route to."""
    total = _params(model, set())
    active = total
    config = getattr(model, "config", None)
    embed, output = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    if isinstance(embed, nn.Embedding) and getattr(output, "weight", None) is not embed.weight:
        active -= embed.weight.numel()
        if getattr(config, "tie_embeddings", False):  # a tied head stored apart (quantized):
            total -= embed.weight.numel()  # the same parameters, stored twice, counted once
    for module in model.modules():
        if isinstance(module, (ConditionalFeedForward, QuantizedExperts)):
            experts = _params(module, set())
            active -= experts - experts * config.num_activated_experts // config.num_experts
    return active, total
