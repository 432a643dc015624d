"""One engine step of any transformers causal LM, counted on transformers' own modeling code.

ragged.py counts a step of perfcounter's model; this counts the same step (a ragged batch of
`Piece`s: n_i new tokens after c_i cached, flattened to [1, T]) of transformers' model for a
config, under FakeTensorMode, no weights. The model's own forward runs on the T tokens with
their positions (`position_ids`), so every op transformers runs is counted (QK-norms, gated
attention, embedding scales, routers, shared experts); two things are the engine's, as
serve prices what vLLM runs:

- the KV cache: `_Step` stands where transformers' Cache goes (its `update(key, value,
  layer_idx)`): each piece's new keys and values are written into that piece's own cache of
  the layer (index_copy_, as an engine's reshape_and_cache kernel writes a slot mapping), a
  cache exactly as long as the layer holds and reads for the piece (`piece_keys`): every
  position for full attention; for a sliding window w the last w - 1 tokens before the piece
  plus its n (kv_layout.py: vLLM's SlidingWindowSpec); for chunked attention of size C the
  tokens since the piece's chunk began (ChunkedLocalAttentionSpec). The attention function
  transformers calls (registered as ATTENTION in its AttentionInterface, with no mask
  function: transformers then builds no mask, as for vLLM's backends) attends per piece
  over that cache with SDPA under the causal structure (op_data.py), the queries the last
  positions of the keys. gpt-oss's attention sinks (`s_aux`, one logit a head) join the
  softmax's denominator as vLLM's kernels take them (vllm/attention/ops/
  triton_unified_attention.py, `sinks`): out x sigmoid(lse - sink), lse the scores'
  log-sum-exp, exact.
- multi-head latent attention (a config with kv_lora_rank: DeepSeek-V2/V3/R1, Kimi K2) runs
  as vLLM's MLA backend (vllm/v1/attention/backends/mla/common.py, MLACommonImpl): the cache
  holds the compressed latent and the rope key, kv_lora_rank + qk_rope_head_dim a token, one
  for all heads; decode tokens (a piece of one new token) take the absorbed path (q_nope x
  W_UK per head, attention over the latent as multi-query attention with head size
  kv_lora_rank + qk_rope_head_dim, the latent output x W_UV: W_UK and W_UV are views of
  kv_b_proj's weight, one batched matmul each over the step's decode tokens); prefill pieces
  up-project their cached and new latents through kv_b_proj (one matmul over every prefill
  piece's positions, `_compute_prefill_context`) and attend as multi-head attention, V
  padded to the query-key head size where they differ (`_flash_attn_varlen_diff_headdims`).
  NB the decode kernel (FlashMLA) reads the latent once as K and V: counted as attention
  with V the whole cache row (kv_lora_rank + qk_rope_head_dim), its p.v FLOPs
  qk_rope_head_dim / kv_lora_rank (1/8 for DeepSeek-V3) above the kernel's.

A mixture of experts runs transformers' experts (grouped_mm: its rows gathered by expert, one
grouped GEMM a weight), its rows sorted by expert as the engines' kernels sort them, by a
histogram and a prefix sum (`_counting_sort`: linear in the rows, a comparison sort is not).
Logits are computed for the last token of every piece (`logits_to_keep`), as vLLM v1 does.
What stands in for a varlen kernel's offsets (the per-piece masks' bytes, the join of the
pieces' outputs) is not charged, as in ragged.py (`ragged.strip_offsets`: the join is
the one concatenation along the tokens, dim 1, in an attention module).
"""
from __future__ import annotations

import contextvars
import itertools
import types

import torch
import torch.nn.functional as F

from perfcounter.costs.collectives import ep_all_to_all, tp_all_gather, tp_all_reduce
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.models import kv_layout
from perfcounter.models.tokenizer import cache_keyword
from perfcounter.serve.ragged import Piece, prime_caches, strip_offsets

ATTENTION = "perfcounter_ragged"
_STEP: contextvars.ContextVar = contextvars.ContextVar("perfcounter_ragged_step")
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def piece_keys(piece: Piece, local: tuple | None) -> int:
    """Positions a layer holds and reads for `piece`: all c + n (local None); a sliding
    window ("sliding", w): min(c + n, w - 1 + n); chunked ("chunked", C): c + n - C floor(c / C)
    (the piece's queries from the first one's chunk on; NB a piece that crosses a chunk's end
    reads its first chunk too, as the kernel does)."""
    c, n = piece.context, piece.new_tokens
    if local is None:
        return c + n
    kind, size = local
    if kind == "sliding":
        return min(c + n, size - 1 + n)
    return c + n - size * (c // size)


def layer_local(config, layer: int) -> tuple | None:
    """("sliding", w), ("chunked", C) or None (full attention) for a layer of `config`
    (kv_layout.layer_types: the config's, else as transformers infers them)."""
    kind = kv_layout.layer_types(config)[layer]
    if kind == "sliding_attention":
        return ("sliding", config.sliding_window)
    if kind == "chunked_attention":
        return ("chunked", config.attention_chunk_size)
    return None


def attention_modules(model) -> dict:
    """{layer index: attention module} of a transformers causal LM."""
    return {m.layer_idx: m for m in model.modules()
            if isinstance(getattr(m, "layer_idx", None), int) and hasattr(m, "is_causal")
            and type(m).__name__.endswith("Attention")}


def is_mla(module) -> bool:
    return bool(getattr(module, "kv_lora_rank", None))


class _Step:
    """The KV cache of one step's pieces for every attention layer (transformers' Cache
    interface where the models call it), and the per-piece attention (the module doc)."""

    is_compileable = False

    def __init__(self, model, pieces, dtype):
        config = model.config
        self.pieces, self.sizes = pieces, [p.new_tokens for p in pieces]
        self.caches, self.local = {}, {}
        one = torch.zeros(1, 1, 1, 1, dtype=dtype)
        for i, m in attention_modules(model).items():
            local = self.local[i] = layer_local(config, i)
            keys = [piece_keys(p, local) for p in pieces]
            if is_mla(m):  # the latent and the rope key, one "head" for all
                width = m.kv_lora_rank + m.qk_rope_head_dim
                self.caches[i] = [torch.zeros(1, 1, k, width, dtype=dtype) for k in keys]
            else:
                heads = config.num_key_value_heads
                head_dim = getattr(m, "head_dim", None) or config.hidden_size // \
                    config.num_attention_heads
                self.caches[i] = [(torch.zeros(1, heads, k, head_dim, dtype=dtype),
                                   torch.zeros(1, heads, k, head_dim, dtype=dtype)) for k in keys]
        self.keys = {i: [piece_keys(p, loc) for p in pieces] for i, loc in self.local.items()}
        self.masks = {i: [one.expand(1, 1, p.new_tokens, k) for p, k in zip(pieces, ks)]
                      for i, ks in self.keys.items()}
        self.slots = {i: [torch.arange(k - p.new_tokens, k) for p, k in zip(pieces, ks)]
                      for i, ks in self.keys.items()}

    # transformers' Cache interface, as far as the models call it
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def update(self, key, value, layer_idx, *args, **kwargs):
        """key, value [1, H_kv, T, D] (MLA: the latent and the rope key) written into each
        piece's cache at its last n positions; returned as given (the attention reads the
        caches)."""
        caches, slots = self.caches[layer_idx], self.slots[layer_idx]
        if isinstance(caches[0], tuple):
            for j, (k, v) in enumerate(zip(key.split(self.sizes, dim=2),
                                           value.split(self.sizes, dim=2))):
                caches[j][0].index_copy_(2, slots[j], k)
                caches[j][1].index_copy_(2, slots[j], v)
        else:
            latent = key.shape[-1]
            for j, (k, r) in enumerate(zip(key.split(self.sizes, dim=2),
                                           value.split(self.sizes, dim=2))):
                caches[j][..., :latent].index_copy_(2, slots[j], k)
                caches[j][..., latent:].index_copy_(2, slots[j], r)
        return key, value

    def attend(self, module, query, scaling, sinks=None) -> torch.Tensor:
        """query [1, H, T, D] -> [1, T, H, D], each piece over its own cache."""
        i = module.layer_idx
        out = []
        for j, q in enumerate(query.split(self.sizes, dim=2)):
            k, v = self.caches[i][j]
            if sinks is None:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.masks[i][j],
                                                   scale=scaling, enable_gqa=True)
            else:  # a sink logit a head in the softmax's denominator: x sigmoid(lse - sink)
                o, lse = _FLASH(q, k, v, attn_mask=self.masks[i][j], scale=scaling)
                o = o * torch.sigmoid(lse - sinks[None, :, None].to(lse.dtype))[..., None] \
                    .to(o.dtype)
            out.append(o.transpose(1, 2))
        return torch.cat(out, dim=1)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
               s_aux=None, **kwargs):
    """The attention function transformers calls under ATTENTION (its interface's
    signature): (output [1, T, H, D], no weights)."""
    return _STEP.get().attend(module, query, scaling, s_aux), None


def register() -> None:
    """ATTENTION in transformers' AttentionInterface (idempotent)."""
    from transformers import AttentionInterface  # deferred: heavy to import
    AttentionInterface.register(ATTENTION, _attention)


def _mla_forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None,
                 **kwargs):
    """DeepSeek's attention as vLLM's MLA backend runs a step (the module doc); the
    projections, norms and rope are the module's own."""
    step: _Step = _STEP.get()
    batch, tokens = hidden_states.shape[:-1]
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(batch, tokens, -1, self.qk_head_dim).transpose(1, 2)  # [1, H, T, nope + rope]
    q_nope, q_rot = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states),
                                [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
    latent = self.kv_a_layernorm(latent).view(batch, 1, tokens, self.kv_lora_rank)
    k_rot = k_rot.view(batch, 1, tokens, self.qk_rope_head_dim)
    cos, sin = position_embeddings
    rotate = self._perfcounter_rotary
    q_rot, k_rot = rotate(q_rot, k_rot, cos, sin)
    step.update(latent, k_rot, self.layer_idx)
    heads = q.shape[1]
    w = self.kv_b_proj.weight.view(heads, self.qk_nope_head_dim + self.v_head_dim,
                                   self.kv_lora_rank)
    w_uk, w_uv = w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]  # [H, nope|v, r]
    decode = [j for j, p in enumerate(step.pieces) if p.new_tokens == 1]
    prefill = [j for j, p in enumerate(step.pieces) if p.new_tokens > 1]
    starts = [0, *itertools.accumulate(step.sizes)]
    out = [None] * len(step.pieces)
    caches = step.caches[self.layer_idx]
    if decode:  # absorbed: [H, B, nope] x [H, nope, r] -> latent queries, MQA over the cache
        rows = torch.tensor([starts[j] for j in decode])
        qd = torch.bmm(q_nope[0].index_select(1, rows), w_uk)  # [H, B, r]
        qd = torch.cat([qd, q_rot[0].index_select(1, rows)], dim=-1)  # [H, B, r + rope]
        latents = []
        for b, j in enumerate(decode):
            c = caches[j]  # [1, 1, keys, r + rope]
            o, _ = _FLASH(qd[None, :, b:b + 1], c, c, attn_mask=step.masks[self.layer_idx][j],
                          scale=self.scaling)  # the latent is V: one cache read as K and V
            latents.append(o[0, ..., :self.kv_lora_rank])  # [H, 1, r]
        vo = torch.bmm(torch.cat(latents, dim=1), w_uv.transpose(1, 2))  # [H, B, v]
        for b, j in enumerate(decode):
            out[j] = vo[:, b:b + 1].transpose(0, 1)[None]  # [1, 1, H, v]
    if prefill:  # every prefill piece's positions up-projected by kv_b_proj at once
        sizes = [step.keys[self.layer_idx][j] for j in prefill]
        # the pieces' latents and rope keys gathered into workspaces (vLLM's gather_cache),
        # one copy each
        r, dtype = self.kv_lora_rank, caches[prefill[0]].dtype
        latent = torch.empty(1, 1, sum(sizes), r, dtype=dtype)
        rope = torch.empty(1, 1, sum(sizes), self.qk_rope_head_dim, dtype=dtype)
        at = 0
        for j, size in zip(prefill, sizes):
            latent[:, :, at:at + size].copy_(caches[j][..., :r])
            rope[:, :, at:at + size].copy_(caches[j][..., r:])
            at += size
        kv = self.kv_b_proj(latent)  # [1, 1, sum keys, H (nope + v)]
        kv = kv.view(1, -1, heads, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
        for j, kvp, rot in zip(prefill, kv.split(sizes, dim=2), rope.split(sizes, dim=2)):
            k_nope, v = torch.split(kvp, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            k = torch.cat([k_nope, rot.expand(-1, heads, -1, -1)], dim=-1)
            at, end = starts[j], starts[j + 1]  # its queries, nope and rope joined
            qp = torch.cat([q_nope[:, :, at:end], q_rot[:, :, at:end]], dim=-1)
            v = F.pad(v, [0, self.qk_head_dim - self.v_head_dim])  # one head size, as vLLM pads
            o, _ = _FLASH(qp, k, v, attn_mask=step.masks[self.layer_idx][j], scale=self.scaling)
            out[j] = o[..., :self.v_head_dim].transpose(1, 2)  # [1, n, H, v]
    attn = torch.cat(out, dim=1).reshape(batch, tokens, -1)
    return self.o_proj(attn), None


def _counting_sort(x: torch.Tensor, experts: int, stable: bool = False, descending=False):
    """torch.sort of expert ids `x` [S] as an engine's MoE kernels sort rows by expert: a
    histogram and a prefix sum (vLLM's moe_align_block_size, csrc/moe/moe_align_sum_kernels.cu),
    linear in S, where a comparison sort is S log S. (values, indices) as torch.sort's."""
    hit = x[:, None] == torch.arange(experts)[None]  # [S, E]
    rank = hit.cumsum(0)  # each row's place among its expert's rows, from 1
    per = hit.sum(0)
    start = per.cumsum(0) - per
    pos = ((start[None] + rank - 1) * hit).sum(1)  # [S] its place in the sorted order
    perm = torch.empty_like(pos).scatter_(0, pos, torch.arange(x.shape[0]))
    return torch.return_types.sort((x[perm], perm))


def _engine_sort(module) -> None:
    """A mixture of experts' `module` (transformers' experts: num_experts, has_gate) sorts its
    rows by expert with _counting_sort while it runs."""
    forward, experts = module.forward, module.num_experts

    def run(*args, **kwargs):
        sort = torch.sort
        torch.sort = lambda x, *a, **k: _counting_sort(x, experts)
        try:
            return forward(*args, **kwargs)
        finally:
            torch.sort = sort
    module.forward = run
    module._perfcounter_sort = True


def _use_mla(model) -> None:
    for m in attention_modules(model).values():
        if is_mla(m):
            module = __import__(type(m).__module__, fromlist=["apply_rotary_pos_emb"])
            interleave = getattr(m.config, "rope_interleave", False)
            name = "apply_rotary_pos_emb_interleave" if interleave else "apply_rotary_pos_emb"
            m._perfcounter_rotary = getattr(module, name)
            m.forward = types.MethodType(_mla_forward, m)


FEED_FORWARDS = ("mlp", "feed_forward", "block_sparse_moe")  # a decoder layer's, by name


def _tensor_parallel(model, tp: int) -> None:
    """One rank's collectives of tensor parallelism (hf_model.py's module doc), as forward
    hooks: the all-reduce of each attention's and feed-forward's output and of the
    vocabulary-parallel embedding's, the all-gather of the LM head's logits. Once a model."""
    if tp == 1 or getattr(model, "_perfcounter_tp", 1) == tp:
        return
    if getattr(model, "_perfcounter_tp", 1) != 1:
        raise ValueError("a model's tensor-parallel hooks are set once")
    model._perfcounter_tp = tp

    def reduce(module, inputs, out):
        if isinstance(out, tuple):
            return (tp_all_reduce(out[0], tp), *out[1:])
        return tp_all_reduce(out, tp)
    layers = {m.layer_idx for m in attention_modules(model).values()}
    for m in attention_modules(model).values():
        m.register_forward_hook(reduce)
    found = 0
    for name, m in model.named_modules():
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2] in FEED_FORWARDS:
            m.register_forward_hook(reduce)
            found += 1
    if found != len(layers):
        raise ValueError(f"{type(model).__name__}: {found} feed-forward blocks found for "
                         f"{len(layers)} layers; tensor parallelism needs each layer's")
    model.get_input_embeddings().register_forward_hook(reduce)
    model.get_output_embeddings().register_forward_hook(
        lambda module, inputs, out: tp_all_gather(out, tp))


def _expert_parallel(model, ep: int) -> None:
    """Attention data-parallel, experts spread over `ep` ranks (hf_model.py): each experts
    module's rows dispatched to their experts' ranks and combined back, an all-to-all each
    way of each token to as many ranks as it picks experts on, min(k, EP) (DeepEP's
    dispatch and combine: a token goes once to each rank holding one of its experts). Once a
    model."""
    if ep == 1 or getattr(model, "_perfcounter_ep", 1) == ep:
        return
    model._perfcounter_ep = ep
    k = next((getattr(model.config, f) for f in ("num_experts_per_tok", "moe_topk", "top_k")
              if getattr(model.config, f, None)), 1)
    copies = min(k, ep)

    def dispatch(module, args):
        ep_all_to_all(args[0].unsqueeze(0).expand(copies, *args[0].shape), ep)

    def combine(module, args, out):
        ep_all_to_all(out.unsqueeze(0).expand(copies, *out.shape), ep)

    for m in model.modules():
        if hasattr(m, "num_experts") and hasattr(m, "has_gate"):
            m.register_forward_pre_hook(dispatch)
            m.register_forward_hook(combine)


def count_hf_step(model, fake_mode, pieces, dtype=torch.bfloat16, depth: int = 10,
                  tp: int = 1, ep: int = 1):
    """The counted trace of one engine step of `pieces` (Piece or (new_tokens, context)) of
    a fake transformers causal LM (config_only.fake_hf_model's), as the module doc says; tp:
    one rank of that tensor-parallel size (the model built from hf_model's rank config); ep:
    the data-parallel ranks its experts spread over (hf_model's expert_parallel_size),
    dispatched and combined by all-to-all over the TP x EP ranks; 1: the TP all-reduce
    combines them."""
    pieces = [p if isinstance(p, Piece) else Piece(*p) for p in pieces]
    if not pieces or any(p.new_tokens < 1 or p.context < 0 for p in pieces):
        raise ValueError(f"a step needs pieces of >= 1 new token after >= 0 cached; got {pieces}")
    register()
    model.config._attn_implementation = ATTENTION
    for sub in model.modules():  # text configs of a multimodal model read it too
        config = getattr(sub, "config", None)
        if config is not None and config is not model.config:
            config._attn_implementation = ATTENTION
    _use_mla(model)
    _tensor_parallel(model, tp)
    if ep > 1:
        _expert_parallel(model, ep * tp)
    for m in model.modules():
        if hasattr(m, "num_experts") and hasattr(m, "has_gate") \
                and not getattr(m, "_perfcounter_sort", False):
            _engine_sort(m)
    counter = TransformerPerformanceCounter(depth=depth)
    total = sum(p.new_tokens for p in pieces)
    with fake_mode:
        step = _Step(model, pieces, dtype)
        idx = torch.zeros(1, total, dtype=torch.int64)
        positions = torch.cat([torch.arange(p.context, p.kv_positions) for p in pieces])[None]
        ends = torch.tensor(step.sizes).cumsum(0) - 1
        prime_caches(counter, [t for per in step.caches.values() for c in per
                               for t in (c if isinstance(c, tuple) else (c,))])
        token = _STEP.set(step)
        try:
            with counter.count("step", num_tokens=total):
                model(input_ids=idx, position_ids=positions, use_cache=True,
                      **{cache_keyword(model): step}, logits_to_keep=ends)
        finally:
            _STEP.reset(token)
    attention = set(attention_modules(model).values())
    joins = {name for name, m in model.named_modules() if m in attention}
    return strip_offsets(counter.counts["step"].trace, torch.zeros((), dtype=dtype).element_size(),
                         lambda r: r.op == "aten.cat.default" and r.args[-1:] == (1,)
                         and any(r.module.endswith(j) for j in joins))

