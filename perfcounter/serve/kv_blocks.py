"""A sequence's KV cache blocks as a serving engine's hybrid cache manager holds them: windowed
layers (sliding or chunked attention) hold only their window's blocks.

    cost = BlockCost.of(config, block_size=16)     # None: every layer holds every token
    cost(1000)                                     # blocks (of every layer's bytes) for 1,000 tokens

The memory plan counts KV blocks of `block_size` tokens of every layer (memory.py); a sequence
of n tokens in cache holds ceil(n / block_size) of them where every layer holds every token.
vLLM's v1 KV cache manager (the hybrid allocator, on by default since v0.10.0) gives each kind
of layer its own block table over one shared pool of pages: a full-attention layer keeps every
block, a sliding-window layer frees the blocks before its window
(vllm/v1/core/single_type_kv_cache_manager.py, SlidingWindowManager.remove_skipped_blocks), a
chunked-attention layer those before its current chunk (ChunkedLocalAttentionManager). So a
sequence of n tokens holds, in blocks of every layer's bytes,

    Σ_kinds share x min(ceil(n / B), ceil(window / B) + 1)      (window None: ceil(n / B))

where `share` is the kind's part of a token's KV bytes (models/kv_layout.py: its layers'
elements over every layer's) and `window` the tokens it holds before the newest (kv_layout's
engine layout: sliding_window - 1, or attention_chunk_size); the + 1 is the block a window
straddles at its start. For gpt-oss (half its layers sliding over 128 tokens) a sequence of
2,000 tokens holds 0.5 x 125 + 0.5 x 9 = 67 blocks, not 125: about twice the sequences fit.
NB: vLLM pads its groups to one page size (layers of each kind in groups of equal size);
the padding is not modelled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from perfcounter.models import kv_layout


@dataclass(frozen=True, slots=True)
class BlockCost:
    """Blocks a sequence holds by the tokens in its cache (the module doc)."""

    block_size: int
    shares: tuple  # ((share of a token's KV bytes, window in tokens or None), ...)

    @classmethod
    def of(cls, config, block_size: int) -> "BlockCost | None":
        """The cost for a transformers (text) config's layers, one rank's; None where no
        layer is windowed (ceil(n / block_size), the scheduler's own rule)."""
        layers = kv_layout.kv_layers(config, "engine")
        if all(layer.window is None for layer in layers):
            return None
        total = sum(layer.elements for layer in layers)
        by_window: dict = {}
        for layer in layers:
            by_window[layer.window] = by_window.get(layer.window, 0) + layer.elements
        return cls(block_size, tuple((elements / total, window)
                                     for window, elements in by_window.items()))

    def __call__(self, tokens: int) -> float:
        whole = -(-tokens // self.block_size)
        return sum(share * (whole if window is None else
                            min(whole, math.ceil(window / self.block_size) + 1))
                   for share, window in self.shares)
