"""The memory of one rank, and the smallest tensor-parallel size (and quantization) that fits.

A rank holds its shard of the weights (its sharded linears and vocabulary, the norms whole:
about weights / (TP x PP); experts / EP), the KV cache of its KV heads (n_local_heads / TP,
one when there are fewer KV heads than ranks: each rank then holds a replica) and its
activation workspace; serve's memory plan (serve/memory.py) prices a rank's args as it
prices any model's, and `rank_bytes` weighs them by the same rule (models/stored_weights.py).
`smallest_fit` tries the valid TP sizes in order with a plan maker the
caller gives (serve's memory_plan at the deployment's limits), for each quantization asked,
and names the first that leaves room for a KV cache:

    smallest_fit(args, lambda rank, scheme: memory_plan(rank, dtype, spec, weights=scheme))

`fit_line` is the one line `count` and generate.py say when the model they price does not
fit the device they price it on (generate.py's parallel flags: generation/options.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from perfcounter.models.args import ModelArgs
from perfcounter.models.stored_weights import weight_bytes
from perfcounter.parallel.sharding import ParallelConfig, rank_args, valid_tensor_parallel_sizes
from perfcounter.quant.quantize import kv_cache_bytes


@dataclass(frozen=True)
class Fit:
    """The smallest TP that fits, at one quantization (None: the precision's floats)."""

    tensor_parallel_size: int
    quantization: str | None
    plan: object  # serve's MemoryPlan of one rank


def smallest_fit(args: ModelArgs, plan_of, quantizations=(None,),
                 pipeline_parallel_size: int = 1) -> list:
    """For each quantization, the smallest valid TP whose rank's plan fits (a `Fit`), or None
    when no TP up to the heads fits or the model cannot be stored so; plan_of(rank_args,
    quantization) -> a memory plan."""
    out = []
    for q in quantizations:
        found = None
        for tp in valid_tensor_parallel_sizes(args):
            parallel = ParallelConfig(tensor_parallel_size=tp,
                                      pipeline_parallel_size=pipeline_parallel_size)
            try:
                plan = plan_of(rank_args(args, parallel), q)
            except ValueError:  # a scheme this model cannot take (an int4 group too wide)
                break
            if plan.fits:
                found = Fit(tp, q, plan)
                break
        out.append(found)
    return out


def fits_text(fits: list, precision: str) -> str:
    """'smallest fit: --tensor_parallel_size 2 (bfloat16, 70.56 GB of weights a rank);
    --tensor_parallel_size 1 --quantize int8 (...)': each fit as the flags that run it."""
    parts = []
    for f in fits:
        if f is None:
            continue
        flags = f"--tensor_parallel_size {f.tensor_parallel_size}" + (
            f" --quantize {f.quantization}" if f.quantization else "")
        what = "" if f.quantization else f"{precision}, "
        parts.append(f"{flags} ({what}{f.plan.weight_bytes / 1e9:.2f} GB of weights a rank)")
    if not parts:
        return "smallest fit: none (no tensor-parallel size up to the heads fits)"
    return "smallest fit: " + "; ".join(parts)


def rank_bytes(args: ModelArgs, dtype, *, weights=None, kv=None, batch: int = 1,
               tokens: int = 0) -> tuple[int, int]:
    """(weights as stored, KV cache of `batch` sequences of `tokens`) of the model `args` (one
    rank's, or a whole model's), in bytes: the weights by models/stored_weights.py's rule, the
    KV cache of the rank's KV heads (quantize.kv_cache_bytes)."""
    cache = kv_cache_bytes(args.n_layer, batch, args.n_local_heads, tokens, args.head_dim, kv=kv,
                           itemsize=dtype.itemsize)
    return weight_bytes(args, dtype, weights), cache


def fit_line(model: str, device: str, weight_bytes: float, kv_bytes: float,
             device_bytes: float | None, parallel: ParallelConfig | None = None) -> str | None:
    """One line when a rank's weights and KV cache exceed its device's memory, else None
    (unknown memory: None)."""
    if not device_bytes or weight_bytes + kv_bytes <= device_bytes:
        return None
    rank = f" a rank ({parallel.label()})" if parallel is not None and parallel.sharded else ""
    return (f"{model} does not fit on {device}: weights {weight_bytes / 1e9:.2f} GB + KV cache "
            f"{kv_bytes / 1e9:.2f} GB{rank} > {device_bytes / 1e9:.2f} GB of memory; "
            f"--tensor_parallel_size shards it")
