"""How a transformers causal LM (hf_model.HfArgs) splits over ranks as vLLM splits it:
`shard_hf` checks deployment()'s parallel options before any work and returns one rank's
HfArgs (tensor parallelism: hf_model's module doc; expert parallelism over TP x DP ranks:
`check_expert_parallel`; pipeline stages: `pipeline_stages`, vLLM's layer split, and
`heaviest_stage`, the stage a rank is priced on).
"""
from __future__ import annotations

import math

from perfcounter.parallel.sharding import ParallelConfig
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import (HfArgs, check_tensor_parallel, kind_params,
                                        valid_tensor_parallel_sizes)


def pipeline_stages(n_layer: int, pp: int) -> list[tuple[int, int]]:
    """vLLM's layers of each of `pp` stages, [start, end): n // pp each, the remainder one
    more each on the stages before the last, from the second-to-last back
    (vllm/distributed/utils.py get_pp_indices, VLLM_PP_LAYER_PARTITION unset; e.g. 61
    layers on 2 stages: [0, 31), [31, 61))."""
    sizes = [n_layer // pp] * pp
    for i in range(2, n_layer % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:k]) for k in range(pp)]
    return [(a, a + n) for a, n in zip(starts, sizes)]


def heaviest_stage(args: HfArgs, pp: int) -> tuple[int, int]:
    """The layers of the stage of `pp` (pipeline_stages) whose layers hold the most
    parameters (the first of equals): the stage a rank's memory plan and step are priced
    on, as the most layers are for perfcounter's model (both with the embedding and head)."""
    _, per_kind = kind_params(args)
    kinds = args.kinds
    stages = pipeline_stages(len(kinds), pp)
    return max(stages, key=lambda s: (sum(per_kind[k] for k in kinds[slice(*s)]), -s[0]))


def shard_hf(args: HfArgs, model: str, parallel, mapping: bool = False):
    """(ParallelConfig, one rank's HfArgs) for deployment()'s parallel options (its
    options.ParallelOptions), checked before any work; ServeError (one line) for what a
    transformers model is not priced under: a mapping. Pipeline stages: the rank holds its
    heaviest stage's layers (heaviest_stage)."""
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if mapping:
        raise ServeError(f"--mapping: {model} ({args.model_type}) is priced on transformers' "
                         "modeling code, which a placement mapping does not place")
    if pp > args.n_layer:
        raise ServeError(f"--pipeline_parallel_size {pp}: {model} has {args.n_layer} layers, "
                         f"at most one stage each (valid: 1 to {args.n_layer})")
    ep, dp = 1, parallel.data_parallel_size
    if parallel.enable_expert_parallel:
        check_expert_parallel(args, tp * dp, model)
        # over data-parallel ranks (attention DP, TP within each replica as well): E / DP
        # experts a rank, each 1 / TP wide, all-to-all; over one replica's TP ranks alone: the
        # experts split by TP, the same rows x widths and expert bytes a rank in expectation
        # (hf_model's module doc)
        ep = max(1, dp)
    try:
        check_tensor_parallel(args, tp)
    except ValueError as e:
        raise ServeError(str(e)) from None
    config = ParallelConfig(tp, pp, parallel.data_parallel_size, parallel.enable_expert_parallel)
    rank = args.sharded(tp, ep)
    return config, rank.sharded(tp, ep, heaviest_stage(rank, pp) if pp > 1 else None)


def check_expert_parallel(args: HfArgs, ep: int, model: str = "the model") -> None:
    """vLLM's expert parallelism over TP x DP = `ep` ranks: a model with experts, E that EP
    divides, each rank's E / EP at least the top-k (ServeError, one line)."""
    experts, k = args.num_experts, args.num_activated_experts
    flag = "--enable_expert_parallel"
    if not experts:
        raise ServeError(f"{flag}: {model} ({args.model_type}) has no experts (a dense "
                         "feed-forward); leave it out")
    if ep < 2:
        raise ServeError(f"{flag}: experts spread over TP x DP ranks, here 1; give "
                         "--tensor_parallel_size or --data_parallel_size above 1")
    if experts % ep or experts // ep < k:
        raise ServeError(f"{flag}: TP x DP = {ep} ranks do not share {experts} experts "
                         f"(top-{k}) evenly; valid: a divisor of {experts} up to {experts // k}")


def smallest_fit(args: HfArgs, dtype, room_bytes: float, per_node: int,
                 max_gpus: int = 64) -> str:
    """'smallest fit: --tensor_parallel_size 8 --pipeline_parallel_size 2 (44.24 GB of
    weights a rank); ...': the layouts of the fewest GPUs (1, 2, 4, ... up to `max_gpus`)
    whose rank's weights (as stored) leave room for a KV cache in `room_bytes` (a rank's
    usable memory less its workspace): TP up to a node (`per_node`) with PP over the rest,
    and for a mixture of experts, EP over DP ranks (TP 1) and over TP x DP (TP a node)."""
    whole = args.sharded(1)
    tps = [t for t in valid_tensor_parallel_sizes(whole) if t <= per_node]
    g = 1
    while g <= max_gpus:
        fits = []
        for tp, pp, dp in _layouts(g, tps, whole.n_layer, bool(whole.num_experts)):
            rank = _rank(whole, tp, pp, dp)
            weights = rank.weight_bytes(dtype) if rank is not None else math.inf
            if weights < room_bytes:
                fits.append(_flags(tp, pp, dp) + f" ({weights / 1e9:.2f} GB of weights a rank)")
        if fits:
            return "smallest fit: " + "; ".join(fits)
        g *= 2
    return f"smallest fit: none up to {max_gpus} GPUs"


def _layouts(g: int, tps: list[int], n_layer: int, moe: bool):
    """(TP, PP, DP with EP or 1) layouts of g GPUs (smallest_fit)."""
    tp = max([t for t in tps if g % t == 0], default=1)
    if g // tp <= n_layer:
        yield tp, g // tp, 1
    if moe and g > 1:
        yield 1, 1, g
        if tp > 1 and g > tp:
            yield tp, 1, g // tp


def _rank(whole: HfArgs, tp: int, pp: int, dp: int) -> HfArgs | None:
    """One rank of the layout, None where its experts do not split so."""
    ep = dp if dp > 1 else 1
    if ep > 1:
        try:
            check_expert_parallel(whole, tp * dp)
        except ServeError:
            return None
    rank = whole.sharded(tp, ep)
    return rank.sharded(tp, ep, heaviest_stage(rank, pp)) if pp > 1 else rank


def _flags(tp: int, pp: int, dp: int) -> str:
    parts = [f"--tensor_parallel_size {tp}"] if tp > 1 else []
    parts += [f"--pipeline_parallel_size {pp}"] if pp > 1 else []
    parts += [f"--data_parallel_size {dp} --enable_expert_parallel"] if dp > 1 else []
    return " ".join(parts) or "--tensor_parallel_size 1"
