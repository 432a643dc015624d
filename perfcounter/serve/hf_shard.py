"""How a transformers causal LM (hf_model.HfArgs) splits over ranks as vLLM splits it:
`shard_hf` checks deployment()'s parallel options before any work and returns one rank's
HfArgs (tensor parallelism: hf_model's module doc; expert parallelism over TP x DP ranks:
`check_expert_parallel`; pipeline stages: `pipeline_stages`, vLLM's layer split, and
`heaviest_stage`, the stage a rank is priced on).
"""
from __future__ import annotations

from perfcounter.parallel.sharding import ParallelConfig
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import HfArgs, check_tensor_parallel, kind_params


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
