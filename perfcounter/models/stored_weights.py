"""A model's weights as stored: the one rule that serve's memory plan, a rank's memory
(parallel/memory.py) and `count`'s and generate.py's fit lines ask.

Float weights are perfcounter's model's parameters (`weight_params`: the embedding; per
layer wqkv (+ its bias), wo, the feed-forward or the experts with their router, two norms;
the final norm; the output layer unless tied) at the precision's element size. A rank of
expert parallelism (parallel.RankArgs, expert_parallel_size > 1) holds E / EP experts and the
whole router (d x E: it routes over all of them, as models/model.py builds it).

Quantized weights (`weights` a quantize.WeightScheme or its name) are the bytes stored
(data, scales and zero points: quant.stored_nbytes) of a fake model quantized as
`perfcounter count --quantize` does it (every nn.Linear, the output layer included and
untied): one layer built, its parameters (models/layer_paths.py says which) repeated
n_layer times, the others once (a tied weight once). The fake model is built once a process
per (model, dtype, scheme) (`cache_info`, `cache_clear`). A llama.cpp file (a
gguf_types.GgufFile) is its tensors as the file stores them, the rest (norms) at `dtype`.

    weight_bytes(ModelArgs.from_name("llama-3-8b"), torch.bfloat16)   # 8,030,261,248 x 2
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from perfcounter.models.args import ModelArgs
from perfcounter.models.layer_paths import layer_of
from perfcounter.models.loading import fake_model
from perfcounter.quant.gguf_types import GgufFile, file_params
from perfcounter.quant.stored import stored_nbytes


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def weight_params(args: ModelArgs) -> int:
    """Parameters of perfcounter's model for `args` (shared embedding counted once; a rank's
    router over all the experts: the module doc)."""
    d, q, kv = args.dim, args.n_head * args.head_dim, args.n_local_heads * args.head_dim
    inter = args.intermediate_size
    attn = d * (q + 2 * kv) + (q + 2 * kv if args.attention_bias else 0) + q * d
    ffn = 3 * d * inter
    if args.num_experts:
        routed = args.num_experts * getattr(args, "expert_parallel_size", 1)
        ffn = args.num_experts * ffn + d * routed
    layer = attn + ffn + 2 * d
    head = 0 if args.tie_embeddings else args.vocab_size * d
    return args.vocab_size * d + args.n_layer * layer + d + head


def weight_bytes(args: ModelArgs, dtype: torch.dtype, weights=None) -> int:
    """Bytes of the model's weights as stored (the module doc): float, parameters x element
    bytes; quantized (a quantize.WeightScheme or its name), a fake model of one layer's
    parameters as stored, the layer's repeated n_layer times; a GgufFile, the file's."""
    if weights is None:
        return weight_params(args) * element_bytes(dtype)
    if isinstance(weights, GgufFile):  # the file's weights as stored, norms at `dtype`
        return sum(weights.stored.values()) + \
            (weight_params(args) - file_params(args, weights.stored)) * element_bytes(dtype)
    key = StoredKey(f"{type(args).__qualname__}{sorted(vars(args).items())!r}", str(dtype),
                    f"{type(weights).__qualname__}:{weights!r}")
    if key in _STORED:
        _STATS["hits"] += 1
        return _STORED[key]
    _STATS["misses"] += 1
    model, _ = fake_model(dataclasses.replace(args, n_layer=1), dtype=dtype, weights=weights)
    layer = other = 0
    for name, p in model.named_parameters():  # a tied weight once
        if layer_of(name) >= 0:
            layer += stored_nbytes(p)
        else:
            other += stored_nbytes(p)
    _STORED[key] = other + args.n_layer * layer
    return _STORED[key]


# -- the cache: one fake model per (model, dtype, scheme) a process ---------------------------
class StoredKey(NamedTuple):
    """What a quantized model's stored bytes depend on (typed: 1 and 1.0 differ)."""

    model: str  # the args' class and every field's repr
    dtype: str
    scheme: str  # the scheme's type and repr (a WeightScheme or its name)


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    currsize: int


_STORED: dict[StoredKey, int] = {}
_STATS = {"hits": 0, "misses": 0}


def cache_info() -> CacheInfo:
    """Hits, misses and size of the stored-bytes cache of quantized models."""
    return CacheInfo(_STATS["hits"], _STATS["misses"], len(_STORED))


def cache_clear() -> None:
    """Forget every quantized model's stored bytes (and the hit and miss counts)."""
    _STORED.clear()
    _STATS.update(hits=0, misses=0)
