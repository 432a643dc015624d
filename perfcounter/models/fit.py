"""Does a real run fit in memory? Checked before its KV cache is allocated, not after.

A loaded model's weights are already in memory; what a generation adds is its KV cache
(every layer's K and V for batch x (prompt + new tokens) positions, allocated at once, as
gpt-fast's static cache is) and its largest activations, reached in the prefill:

    KV          = 2 · n_layer · B · n_kv_heads · T · head_dim · itemsize      (T = S + new)
    activations ≈ B · S · (vocab + 3 · intermediate + 4 · dim) · itemsize      (logits, the
                  feed-forward's three [B, S, I], the residual stream and its norms)
                + B · n_head · S · T · itemsize                                 (attention scores)

The activation figure is an estimate (an upper one: a fused attention kernel never holds
the scores), stated as such. Both are compared with the memory the run can still have:
the CUDA device's free memory (torch.cuda.mem_get_info) or this host's MemAvailable
(/proc/meminfo; os.sysconf where that file is absent). A run that does not fit is
refused with one line naming the figures and the largest batch (and context) that would
fit; `--no_memory_check` lets an expert go ahead.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from perfcounter.format import si
from perfcounter.quant.quantize import kv_cache_bytes


class MemoryFitError(ValueError):
    """A run that would not fit in the memory it can have."""


@dataclass(frozen=True)
class Shape:
    """What the memory of a run depends on, from our ModelArgs or a transformers config."""

    n_layer: int
    n_head: int
    n_kv_heads: int
    head_dim: int
    dim: int
    intermediate: int
    vocab: int


def shape_of(config) -> Shape | None:
    """Our ModelArgs or a transformers config as a Shape; None for a config without them."""
    get = lambda *names: next((getattr(config, n) for n in names  # noqa: E731
                               if isinstance(getattr(config, n, None), int)), None)
    n_layer, n_head, dim = get("n_layer", "num_hidden_layers"), get("n_head", "num_attention_heads"), \
        get("dim", "hidden_size")
    vocab = get("vocab_size")
    if None in (n_layer, n_head, dim, vocab) or n_head < 1:
        return None
    return Shape(n_layer, n_head, get("n_local_heads", "num_key_value_heads") or n_head,
                 get("head_dim") or dim // n_head, dim,
                 get("intermediate_size", "ffn_dim") or 4 * dim, vocab)


def run_bytes(shape: Shape, batch: int, prompt: int, new_tokens: int, itemsize: int,
              kv: str | None = None) -> tuple[int, int]:
    """(KV cache bytes, activation bytes) of a generation (see the module doc)."""
    total = prompt + new_tokens
    cache = kv_cache_bytes(shape.n_layer, batch, shape.n_kv_heads, total, shape.head_dim, kv=kv,
                           itemsize=itemsize)
    activations = batch * prompt * (shape.vocab + 3 * shape.intermediate + 4 * shape.dim) * itemsize \
        + batch * shape.n_head * prompt * total * itemsize
    return cache, activations


def available_bytes(device) -> tuple[int, str] | None:
    """(bytes the run can still take, what that figure is) on `device`; None when unknown."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free on {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available on this host (MemAvailable)"
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free on this host"
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(config, *, batch: int, prompt: int, new_tokens: int, itemsize: int, device,
               kv: str | None = None, available=None) -> None:
    """Refuse (MemoryFitError, one line) a generation whose KV cache and activations exceed
    what `device` has left; `available` ((bytes, what)) overrides the measurement."""
    shape = shape_of(config)
    have = available if available is not None else available_bytes(device)
    if shape is None or have is None:
        return
    free, what = have
    cache, acts = run_bytes(shape, batch, prompt, new_tokens, itemsize, kv)
    if cache + acts <= free:
        return
    per_seq = sum(run_bytes(shape, 1, prompt, new_tokens, itemsize, kv))
    most = free // per_seq
    fits = (f"at these lengths at most --batch_size {most:,} fits" if most >= 1 else
            "not even one sequence of these lengths fits")
    raise MemoryFitError(
        f"batch {batch:,} x {prompt + new_tokens:,} tokens needs {si(cache, 'B')} of KV cache "
        f"and about {si(acts, 'B')} of activations; {si(free, 'B')} is {what}; "
        f"{fits} (--no_memory_check runs it anyway)")
