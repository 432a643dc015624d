"""A transformers config's KV cache as plain arithmetic: what each attention layer stores per
token, and how many tokens a windowed layer holds, as transformers' eager cache stores it
("eager") and as a serving engine stores it ("engine", vLLM's v1 KV cache manager).

    kv_bytes_per_token(config, torch.bfloat16)               # every layer holding the token
    kv_cache_bytes(config, torch.bfloat16, tokens=32768)     # windowed layers capped
    kv_layers(config, "eager")                               # [KVLayer(elements, window), ...]

Per token and layer (`elements`, K and V together):
- multi-head, grouped or multi-query attention: 2 x num_key_value_heads x head_dim;
- DeepSeek's multi-head latent attention (a config with kv_lora_rank): the compressed latent and
  the rope key, kv_lora_rank + qk_rope_head_dim, one of them for all heads. vLLM stores that:
  vllm/model_executor/layers/attention/mla_attention.py (MLAAttention: head_size =
  kv_lora_rank + qk_rope_head_dim, num_kv_heads = 1) and vllm/v1/kv_cache_interface.py
  (MLAAttentionSpec.real_page_size_bytes = block_size x num_kv_heads x head_size x dtype size, no
  separate V). transformers 5.25 stores the same, "while latent KV is still compressed":
  transformers/models/deepseek_v3/modeling_deepseek_v3.py caches kv_nope [B, 1, S, kv_lora_rank]
  and k_rot [B, 1, S, qk_rope_head_dim], so both layouts agree on MLA.
Tokens a layer holds (`window`; None: every token), from its config's layer_types (or, where it
has none, the rule transformers' cache_utils.py infers them by: a sliding_window makes every
layer sliding, an attention_chunk_size chunked):
- sliding_attention: sliding_window - 1 tokens before the current one, in both layouts:
  transformers' DynamicSlidingWindowLayer caches "the last `self.sliding_window - 1` tokens"
  (transformers/cache_utils.py); vLLM frees the blocks before num_computed_tokens -
  sliding_window + 1 (vllm/v1/core/single_type_kv_cache_manager.py, SlidingWindowManager) and
  budgets "the last `self.sliding_window-1` computed tokens" (vllm/v1/kv_cache_interface.py,
  SlidingWindowSpec);
- chunked_attention (Llama 4): transformers caches it as a sliding window of
  attention_chunk_size (cache_utils.py: "sliding and chunked are the same in how they should
  behave"), attention_chunk_size - 1 tokens; vLLM holds "at most `self.attention_chunk_size`
  computed tokens" (kv_cache_interface.py, ChunkedLocalAttentionSpec).
NB: whole tokens; an engine's blocks round each layer's tokens up to its block size, and its
newly scheduled tokens come on top. The dtype is the cache's (bfloat16: 2 bytes an element).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("engine", "eager")


@dataclass(frozen=True, slots=True)
class KVLayer:
    """One attention layer's cache: elements stored per token, and the most tokens it holds
    (None: every token of the sequence)."""
    elements: int
    window: int | None


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; expected one of {', '.join(LAYOUTS)}")


def elements_per_token(config) -> int:
    """K and V elements one attention layer stores per token (MLA: its latent and rope key)."""
    if getattr(config, "kv_lora_rank", None):
        return config.kv_lora_rank + config.qk_rope_head_dim
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * kv_heads * head_dim


def layer_types(config) -> list[str]:
    """Each layer's attention kind: the config's layer_types, else as transformers infers them."""
    given = getattr(config, "layer_types", None)
    if given:
        return list(given)
    kind = ("sliding_attention" if getattr(config, "sliding_window", None) is not None else
            "chunked_attention" if getattr(config, "attention_chunk_size", None) is not None else
            "full_attention")
    return [kind] * config.num_hidden_layers


def _window(config, kind: str, layout: str) -> int | None:
    if kind == "sliding_attention":
        return config.sliding_window - 1
    if kind == "chunked_attention":
        return config.attention_chunk_size - (layout == "eager")
    if kind == "full_attention":
        return None
    raise ValueError(f"{type(config).__name__}: layer type {kind!r} has no KV layout here "
                     "(full_attention, sliding_attention, chunked_attention)")


def kv_layers(config, layout: str = "engine") -> list[KVLayer]:
    """Every layer's KV cache for a transformers (text) config, as `layout` stores it."""
    _check_layout(layout)
    per_token = elements_per_token(config)
    return [KVLayer(per_token, _window(config, kind, layout)) for kind in layer_types(config)]


def kv_bytes_per_token(config, dtype: torch.dtype, layout: str = "engine") -> int:
    """Bytes of KV cache one token adds while every layer holds it (inside each window).
    NB: equal in both layouts for every attention kind handled here; the layouts differ in
    how long a chunked layer holds a token (kv_cache_bytes)."""
    return sum(layer.elements for layer in kv_layers(config, layout)) * dtype.itemsize


def kv_cache_bytes(config, dtype: torch.dtype, tokens: int, layout: str = "engine") -> int:
    """Bytes of KV cache one sequence of `tokens` tokens holds, each windowed layer at most its
    window (an upper bound for a chunked layer in the engine layout: it holds the tokens since
    its current chunk began)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an int >= 0, got {tokens!r}")
    held = sum(layer.elements * (tokens if layer.window is None else min(tokens, layer.window))
               for layer in kv_layers(config, layout))
    return held * dtype.itemsize
