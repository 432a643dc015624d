"""perfcounter.parallel: a model served on many devices, sharded as vLLM and Megatron shard it.

Owns what one rank holds: its shapes and the checks of a parallel configuration
(sharding.py: ParallelConfig with vLLM's names, RankArgs, rank_args, shard) and the memory
one rank needs with the smallest tensor-parallel size that fits (memory.py). The serving
topologies built of ranks (data-parallel replicas, pipeline streams, disaggregated pools)
are serve's (serve/replicas.py, serve/disaggregated.py). The collectives are ops of the
cost registry (costs/collectives.py), priced on the devices' link by
pricing/collectives.py and pricing/links.py; the model calls them (models/model.py). May
import: models, costs, counting, quant, devices, pricing (the layers below it); generation,
serve, plan and the commands import it. Nothing here runs the serving engine.

Python API:

    from perfcounter.serve import deployment, serve, synthetic
    dep = deployment("llama-3.1-70b", "h100-sxm", tensor_parallel_size=4,
                     pipeline_parallel_size=1, data_parallel_size=2,
                     enable_expert_parallel=False)       # 8 GPUs: 2 replicas of TP4
    dep.parallel        # ParallelConfig(tensor_parallel_size=4, ..., gpus=8)
    dep.args            # one rank's RankArgs (n_head 64 / 4, ...); dep.plan: its memory
    dep.usd_per_hour    # all 8 GPUs
    serve(dep, synthetic(200, 512, 128, qps=4, seed=0)).metrics   # replicas split the stream

    from perfcounter.parallel import ParallelConfig, rank_args, shard, smallest_fit
    rank = rank_args(ModelArgs.from_name("llama-3.1-70b"),
                     ParallelConfig(tensor_parallel_size=4))
    count_config(rank, ...)   # one rank counted: its FLOPs and bytes, its collectives' records

A bad configuration (TP not dividing the heads, EP on a dense model, a device without a
link) raises ParallelError or LinkError (ValueErrors, one line) before anything is counted.
"""
from perfcounter.parallel.memory import Fit, fit_line, fits_text, smallest_fit
from perfcounter.parallel.sharding import (ParallelConfig, ParallelError, RankArgs, check_links,
                                           check_parallel, rank_args, shard,
                                           valid_tensor_parallel_sizes)
from perfcounter.pricing.links import LinkError

PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                  "enable_expert_parallel")  # deployment()'s keywords, vLLM's flag names

__all__ = ["PARALLEL_SIZES", "Fit", "fit_line", "fits_text", "smallest_fit", "ParallelConfig", "ParallelError", "RankArgs", "check_links", "check_parallel",
           "rank_args", "shard", "valid_tensor_parallel_sizes", "LinkError"]
