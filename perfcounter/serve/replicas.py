"""Data and pipeline parallelism as engines run them: streams of requests, each its own
scheduler, on replicas and on a pipeline's micro-batches.

vLLM's `--data_parallel_size N` runs N engines, each a whole copy of the model (each itself
TP x PP ranks); its front end hands each request to one of them. Here request i goes to
replica i mod N (round robin: an even split of any arrival process, which is what a
least-loaded balancer reaches with equal replicas), each replica's requests are simulated by
the deployment's own engine, and the runs are joined into one: requests in their original
order, every replica's inter-token gaps and steps, the last finish. Metrics read the joined
run as they read one engine's (a step's seconds and joules are one replica's; the caller
scales energy by the ranks a step runs on).

Pipeline parallelism (PP stages, each holding a stage's layers on its TP ranks): vLLM keeps
PP batches in flight, one scheduler step per stage, so that every stage works on another
batch while a batch moves on (its V0 engine holds PP "virtual engines", each with its
scheduler and its share of the KV blocks). Here the requests are split over PP streams the
same way, each stream's engine holds kv_blocks // PP blocks, and one step of a stream takes
the batch through every stage: PP x the stage's step time (the rank's step table: the stage
with the most layers, the embedding and the head) + (PP - 1) hops of its hidden states to
the next stage (`hop_s`: a send/recv on each hop's link, links.stage_links: TP within a
node and PP across, so that a hop between nodes takes the node link). A stream waits for its own batch only, so
with PP streams busy the pipeline starts a batch every stage time; with fewer (a light load,
the last requests), stages idle: the pipeline's bubbles. A step's joules are those of every
rank it ran on: TP x PP x the stage's.

`staged(dep)` is the one rule of a step on many ranks (its seconds through the stages and
its joules and static power on every rank: the step table's, pricing/power.py's model, each
rank's step capped at its limit); `idle_power(dep)` what its GPUs draw between steps, as
metrics.py charges it; `join(runs, total)` joins replicas' runs and `join_steps(runs)` any
runs' steps (the disaggregated pools' too), in the order they started.

Bounds: a deployment (TP x PP x DP) or a pool (instances x TP) holds at most MAX_GPUS GPUs
(`check_gpus`, before any work). Replicas beyond the requests get none (each request goes to
one replica): they are priced all the same, and the run says so in one warning.
"""
from __future__ import annotations

import dataclasses
import warnings
from array import array

import numpy as np

from perfcounter._util import PerfcounterWarning
from perfcounter.pricing.collectives import collective_s
from perfcounter.pricing.links import stage_links
from perfcounter.serve.errors import ServeError
from perfcounter.serve.scheduler import simulate_engine

MAX_GPUS = 1 << 20  # 1,048,576 GPUs a deployment or pool: a bound far past the pools modelled


def check_sizes(tensor_parallel_size, pipeline_parallel_size, data_parallel_size) -> None:
    """TP x PP x DP within MAX_GPUS (check_gpus), the largest size's flag named; sizes that
    are not integers >= 1 are left to parallel/sharding.py's refusal."""
    sizes = (tensor_parallel_size, pipeline_parallel_size, data_parallel_size)
    if all(isinstance(v, int) and v >= 1 for v in sizes):
        size, name = max(zip(sizes, ("tensor", "pipeline", "data")))
        check_gpus(f"--{name}_parallel_size {size}", sizes[0] * sizes[1] * sizes[2],
                   "TP {:,} x PP {:,} x DP {:,}".format(*sizes))


def check_gpus(what: str, gpus: int, sizes: str, unit: str = "a deployment") -> int:
    """`gpus` (`sizes`: how they multiply, "TP 3 x PP 10 x DP 1,000") within MAX_GPUS, else
    a ServeError naming `what` (the flag and its value) and the bound, GPUs `unit`."""
    if gpus > MAX_GPUS:
        raise ServeError(f"{what}: {sizes} = {gpus:,} GPUs; at most {MAX_GPUS:,} GPUs {unit}")
    return gpus


def split(workload, replicas: int) -> list:
    """The replicas' workloads (module doc), request i in number i mod replicas; a closed
    loop's concurrency C split alike (C // replicas, one more for the first C mod replicas).
    Replicas that would get no request are left out."""
    out = []
    conc = workload.concurrency
    for r in range(min(replicas, len(workload))):
        idx = np.arange(r, len(workload), replicas)
        share = None if conc is None else max(1, conc // replicas + (r < conc % replicas))
        out.append(dataclasses.replace(
            workload, arrival=workload.arrival[idx], prompt=workload.prompt[idx],
            output=workload.output[idx], cached=workload.cached[idx], concurrency=share))
    return out


def join_steps(runs: list):
    """The steps of `runs` as one run's, in the order they started (each run's own order
    among equal starts)."""
    first = runs[0]
    names = [f.name for f in dataclasses.fields(first.steps)]
    columns = {k: np.concatenate([np.frombuffer(getattr(run.steps, k)) for run in runs])
               for k in names}
    order = np.argsort(columns["start"], kind="stable")
    return dataclasses.replace(first.steps, **{k: array("d", columns[k][order].tolist())
                                               for k in names})


def join(runs: list, total: int):
    """One run of the replicas' runs (module doc), steps in the order they started; `total`
    requests in all, replica r's j-th request being request r + j x len(runs)."""
    n = len(runs)
    requests = [None] * total
    for r, run in enumerate(runs):
        for j, req in enumerate(run.requests):
            requests[r + j * n] = dataclasses.replace(req, index=r + j * n)
    itl = array("d")
    for run in runs:
        itl.extend(run.itl)
    return dataclasses.replace(runs[0], requests=requests, itl=itl, steps=join_steps(runs),
                               preemptions=sum(run.preemptions for run in runs),
                               end=max(run.end for run in runs))


class StagedTable:
    """A rank's step table as one stream sees a step (module doc): `stages` x the stage's
    seconds + (stages - 1) hops, joules x every rank (`ranks`: TP x PP)."""

    def __init__(self, table, stages: int, ranks: int, hop_s=None):
        self.table, self.stages, self.ranks, self.hop_s = table, stages, ranks, hop_s
        self.counts, self.label = table.counts, getattr(table, "label", "")
        self.static_w = getattr(table, "static_w", 0.0) * ranks
        self.has_energy = getattr(table, "has_energy", True)

    def seconds(self, f: np.ndarray) -> float:
        hops = self.hop_s(f) if self.hop_s is not None else 0.0
        return self.stages * self.table.seconds(f) + hops

    def energy_j(self, f: np.ndarray, seconds: float, extra_j: float = 0.0) -> float:
        """Every rank's joules: each stage's work once, its static power over its share of
        the step (PP streams overlap in time: a stage's share is seconds / stages); `extra_j`
        a rank's work beside the table's (the sampler's kernels: every TP rank samples the
        gathered logits; under PP only the last stage does, counted on each)."""
        return self.ranks * self.table.energy_j(f, seconds / self.stages, extra_j)


def staged(dep):
    """The step table as one stream of deployment `dep` sees a step (module doc): its own
    table on one rank, else a StagedTable over its PP stages and TP x PP ranks. Its
    `static_w` is every rank's."""
    parallel = dep.parallel
    if parallel.ranks == 1:
        return dep.table
    hop = hop_seconds(dep.spec, dep.args, dep.dtype.itemsize, parallel.tensor_parallel_size,
                      parallel.pipeline_parallel_size) \
        if parallel.pipeline_parallel_size > 1 else None
    return StagedTable(dep.table, parallel.pipeline_parallel_size, parallel.ranks, hop)


def idle_power(dep) -> dict:
    """metrics()'s idle figures for deployment `dep`: `streams`, DP x PP (each replica's PP
    streams), and `static_w`, the W one stream's GPUs draw while it runs nothing: a
    replica's TP x PP ranks' static W over its PP streams (a stream's step charges its
    ranks' static power over seconds / PP, StagedTable.energy_j). A replica that gets no
    request idles for the whole run."""
    pp = dep.parallel.pipeline_parallel_size
    return {"static_w": staged(dep).static_w / pp,
            "streams": dep.parallel.data_parallel_size * pp}


def simulate(workload, dep):
    """One run of `workload` on a deployment `dep` (serve's Deployment: its table, engine,
    parallel sizes, spec, rank args and dtype): DP replicas x PP streams, each the
    scheduler's run with its share of the KV blocks (module doc); one engine's own run when
    nothing is parallel."""
    parallel, config = dep.parallel, dep.engine
    idle = parallel.data_parallel_size - len(workload)
    if idle > 0:
        warnings.warn(f"{idle:,} of {parallel.data_parallel_size:,} replicas get no request "
                      f"({len(workload):,} requests, one replica each); their GPUs are priced "
                      "all the same", PerfcounterWarning, stacklevel=2)
    streams = parallel.data_parallel_size * parallel.pipeline_parallel_size
    if streams == 1 and parallel.ranks == 1:
        return simulate_engine(workload, dep.table, config)
    blocks = dataclasses.replace(config, kv_blocks=config.kv_blocks
                                 // parallel.pipeline_parallel_size)
    table = staged(dep)
    runs = [simulate_engine(w, table, blocks) for w in split(workload, streams)]
    return runs[0] if streams == 1 else join(runs, len(workload))


def hop_seconds(spec, args, itemsize: int, tp: int, pp: int):
    """f -> seconds of a step's PP - 1 hops of its hidden states (tokens x dim x itemsize
    bytes) from stage to stage, each over its link (links.stage_links: between nodes over
    the node link) as pricing/collectives.py's send/recv prices it."""
    links = stage_links(spec, tp, pp)
    return lambda f: sum(collective_s("send_recv", float(f[1]) * args.dim * itemsize, 2, link)
                         for link in links)
