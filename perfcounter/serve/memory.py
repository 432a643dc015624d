"""Memory fit: weights, activation workspace and the paged KV cache a device holds.

    KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element
    capacity = device memory x gpu_memory_utilization - weights - activation workspace
    KV blocks = floor(capacity / (block_size x KV bytes per token))

Llama-3-70B in bfloat16: 2 x 80 x 8 x 128 x 2 B = 327,680 B a token. A quantized cache
(`kv="int8"` or `"fp8"`) stores 1 B an element plus its scales: with `kv_scales="tensor"`
(what vLLM, TensorRT-LLM and SGLang ship: one scale per layer's K and V, engines.py) none
a token, Llama-3-8B in int8 2 x 32 x 8 x 128 = 65,536 B a token against 131,072; with
"token_head" (quantize.QuantizedKVCache, as `perfcounter count` stores it) a scale per token
and KV head at the precision's element size (quantize.kv_cache_bytes): 2 x 32 x 8 x
(128 + 2) = 66,560 B.
Weights are the model's weights as stored (models/stored_weights.py, the one rule: float,
the parameters at the precision's element size; quantized, a `quantize.WeightScheme`'s
bytes stored, one layer of a fake model built and repeated; a llama.cpp file's own).
The activation workspace is the peak live set of the dummy step
at the token budget T that vLLM profiles before sizing its cache (v0.10.0
vllm/v1/worker/gpu_model_runner.py profile_run: one forward of T tokens, then the sampler
on max_num_seqs rows; the peak of torch's allocator is reserved): within a layer the
residual stream [T, dim] stays live beside, at attention, the fused qkv output and the
attention output (2 q + 2 kv a token), at the feed-forward the fused gate-up output and
its activation (3 x intermediate), whichever is larger; plus the logits of max_num_seqs
rows in float32. Llama-3-8B at T = 8,192: 8,192 x (4,096 + max(12,288, 43,008)) x 2 B +
256 x 128,256 x 4 B = 0.77 GB + 0.13 GB. `plan(...)` answers before simulating: does it
fit, how many tokens of KV cache remain, the largest batch at a context and the
longest context at a batch.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from perfcounter.models.args import ModelArgs
from perfcounter.models.stored_weights import element_bytes, weight_bytes
from perfcounter.quant.quantize import kv_cache_bytes
from perfcounter.serve.errors import ServeError

__all__ = ["KV_SCALES", "MemoryPlan", "element_bytes", "kv_bytes_per_token", "memory_plan",
           "weight_bytes", "workspace_bytes"]  # weight_bytes: models/stored_weights.py's


KV_SCALES = ("tensor", "token_head")  # a quantized KV cache's scale granularity


def kv_bytes_per_token(args: ModelArgs, dtype: torch.dtype, kv: str | None = None,
                       scales: str = "token_head") -> int:
    """2 x layers x KV heads x head_dim x element bytes; kv "int8" / "fp8": 2 x layers x KV
    heads x (head_dim x 1 B + a scale of `dtype`'s element bytes), or with scales="tensor"
    (a scale per layer, nothing a token) 2 x layers x KV heads x head_dim x 1 B."""
    if kv is not None and scales == "tensor":
        return 2 * args.n_layer * args.n_local_heads * args.head_dim
    return kv_cache_bytes(args.n_layer, 1, args.n_local_heads, 1, args.head_dim, kv=kv,
                          itemsize=element_bytes(dtype))


def workspace_bytes(args: ModelArgs, dtype: torch.dtype, max_num_batched_tokens: int,
                    max_num_seqs: int) -> int:
    """The activation workspace estimate of the module doc."""
    q, kv = args.n_head * args.head_dim, args.n_local_heads * args.head_dim
    per_token = args.dim + max(2 * q + 2 * kv, 3 * args.intermediate_size)
    return (max_num_batched_tokens * per_token * element_bytes(dtype)
            + max_num_seqs * args.vocab_size * 4)


@dataclass(frozen=True)
class MemoryPlan:
    """Where a device's memory goes; bytes unless said."""

    device_bytes: float
    gpu_memory_utilization: float
    weight_bytes: int
    workspace_bytes: int
    kv_bytes_per_token: int
    block_size: int
    kv_blocks: int  # 0 when the model does not fit
    max_model_len: int

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * self.gpu_memory_utilization

    @property
    def kv_capacity_bytes(self) -> float:
        return self.usable_bytes - self.weight_bytes - self.workspace_bytes

    @property
    def fits(self) -> bool:
        return self.kv_blocks > 0

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def max_batch(self, context: int) -> int:
        """The most sequences of `context` tokens whose KV fits at once."""
        return self.kv_blocks // self.blocks_for(context) if context > 0 else 0

    def max_context(self, batch: int) -> int:
        """The longest context each of `batch` sequences can hold (capped by the model)."""
        return min(self.kv_blocks // batch * self.block_size, self.max_model_len) if batch else 0

    def to_dict(self) -> dict:
        return {**asdict(self), "usable_bytes": self.usable_bytes,
                "kv_capacity_bytes": self.kv_capacity_bytes, "fits": self.fits,
                "kv_tokens": self.kv_tokens}


def memory_plan(args: ModelArgs, dtype: torch.dtype, spec, *, gpu_memory_utilization: float = 0.9,
                block_size: int = 16, max_num_batched_tokens: int = 8192,
                max_num_seqs: int = 256, device_bytes: float | None = None, weights=None,
                kv: str | None = None, kv_scales: str = "token_head") -> MemoryPlan:
    """The memory plan of `args` at `dtype` on `spec` (its vram, or device_bytes); weights
    (a quantize.WeightScheme) and kv ("int8", "fp8"): stored quantized (the module doc)."""
    total = device_bytes if device_bytes is not None else spec.vram
    if not total:
        raise ServeError(f"device {spec.name!r} has no memory size (vram_GB); give one in its "
                         "YAML entry")
    if not 0 < gpu_memory_utilization <= 1:
        raise ServeError(f"--gpu_memory_utilization {gpu_memory_utilization}: expected a "
                         "fraction in (0, 1]")
    if isinstance(args, ModelArgs):
        stored = weight_bytes(args, dtype, weights)
        per_token = kv_bytes_per_token(args, dtype, kv, kv_scales)
    else:  # a transformers model (serve/hf_model.py): as its checkpoint stores it
        stored = args.weight_bytes(dtype)
        per_token = args.kv_elements_per_token() * element_bytes(dtype)
    work = workspace_bytes(args, dtype, max_num_batched_tokens, max_num_seqs)
    capacity = float(total) * gpu_memory_utilization - stored - work
    blocks = max(0, math.floor(capacity / (block_size * per_token)))
    return MemoryPlan(float(total), gpu_memory_utilization, stored, work, per_token, block_size,
                      blocks, args.block_size)
