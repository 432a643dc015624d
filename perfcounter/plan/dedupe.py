"""Candidates whose run is one already simulated: their figures from that run, not simulated again.

Two rules, each exact (the derived figures are those serve gives the candidate, bit for bit;
tests/test_plan_prune.py holds them equal):

- A batch limit never reached. The scheduler (serve/scheduler.py) decides a step from its
  running and waiting requests, the token budget, `max_num_seqs` and the free KV blocks. In a
  run where no request was preempted, fewer sequences than max_num_seqs ever ran in a step
  (peak batch P < S) and every allocation left room (the most blocks held in a step + the
  most one request needs <= its blocks), neither limit stopped an admission: the run is the
  one of no limits. The same deployment with another max_num_seqs S' > P and a cache of at
  least as many blocks runs the same steps, step for step. Its figures are serve's metrics of
  that run under its own engine settings (the overload flag reads max_num_seqs).
- Replicas past what the workload can use. Request i goes to stream i mod (DP x PP)
  (serve/replicas.py). Where, in each stream, every request arrived (+ the engine's request
  overhead) no earlier than the one before it finished, each ran alone: its steps are its own,
  from its arrival, whatever else the replica holds. With DP' a multiple of DP, each of the
  DP' streams holds a subset of one of the DP streams, each request alone again: the same
  requests, steps and times; the figures differ only by what the GPUs cost (their idle power
  over the run, their price, per-GPU rates), which metrics computes from the deployment. (Steps
  of two streams starting at the same instant could join in another order: such a run is not
  reused.)
A disaggregated candidate (two pools, serve/disaggregated.py) is always simulated.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from perfcounter.plan import evaluate as ev
from perfcounter.plan.candidates import Candidate
from perfcounter.serve import replicas
from perfcounter.serve.api import deployment
from perfcounter.serve.metrics import metrics, parse_slo


def family(c: Candidate, *, but: str) -> Candidate:
    """`c` with field `but` set to 0: the candidates that differ from it in that field alone."""
    return dataclasses.replace(c, **{but: 0})


def request_blocks(workload, block_size: int) -> int:
    """The most KV blocks one request of `workload` holds (its prompt + output)."""
    return int(((workload.prompt + workload.output + block_size - 1) // block_size).max())


def _need(result, most_blocks: int) -> int:
    """The blocks a cache must hold for no admission of `result`'s run to be refused: the
    most held in a step + the most one request needs (no_evict: every running request's
    whole blocks, at the peak batch)."""
    steps = result.run.steps
    if result.run.config.admission == "no_evict":
        return int(max(steps.seqs)) * most_blocks
    return int(max(steps.kv_blocks)) + most_blocks


def unconstrained(result, most_blocks: int) -> bool:
    """Whether the run of `result` (a ServeResult) never met max_num_seqs nor its KV blocks
    (module doc, first rule)."""
    run = result.run
    if run.preemptions or not len(run.steps.seqs):
        return False
    return max(run.steps.seqs) < run.config.max_num_seqs \
        and _need(result, most_blocks) <= run.config.kv_blocks


def alone(result) -> bool:
    """Whether every request of `result`'s run ran alone in its stream (module doc, second
    rule), and no two steps started at the same instant."""
    run, dep = result.run, result.deployment
    streams = dep.parallel.data_parallel_size * dep.parallel.pipeline_parallel_size
    arrival = np.array([r.arrival for r in run.requests])
    finish = np.array([r.finish for r in run.requests])
    late = run.config.request_overhead_s
    for s in range(min(streams, len(arrival))):
        idx = np.arange(s, len(arrival), streams)
        if (arrival[idx[1:]] + late < finish[idx[:-1]]).any():
            return False
    start = np.frombuffer(run.steps.start)
    return len(np.unique(start)) == len(start)


def derive(c: Candidate, job: ev.Job, base: int, result) -> dict:
    """`c`'s figures from the run of candidate `base` (`result`, its ServeResult): serve's
    metrics of that run under `c`'s deployment (its engine settings, GPUs, price), as
    evaluate gives them, with `same_run_as` naming `base`."""
    dep = _deployment(c, job)
    stages = dep.parallel.pipeline_parallel_size
    run = dataclasses.replace(result.run, config=dataclasses.replace(
        result.run.config, max_num_seqs=dep.engine.max_num_seqs,
        kv_blocks=dep.engine.kv_blocks // stages))
    m = metrics(run, slo=parse_slo(job.slo), open_loop=True, **replicas.idle_power(dep),
                usd_per_hour=dep.usd_per_hour)
    return {**ev.aggregated_figures(c, dep, m), "same_run_as": base}


def reusable(c: Candidate, job: ev.Job, runs: dict, most_blocks: int):
    """(index, ServeResult) of a simulated run `c` can reuse (module doc), or None. runs: the
    group's simulated aggregated candidates, index -> (Candidate, ServeResult)."""
    if c.disaggregated:
        return None
    for i, (base, result) in runs.items():
        if family(base, but="max_num_seqs") == family(c, but="max_num_seqs") \
                and c.max_num_seqs > max(result.run.steps.seqs) \
                and unconstrained(result, most_blocks) \
                and _stream_blocks(c, job) >= _need(result, most_blocks):
            return i, result
        if family(base, but="data_parallel_size") == family(c, but="data_parallel_size") \
                and c.data_parallel_size % base.data_parallel_size == 0 \
                and c.data_parallel_size * c.pipeline_parallel_size <= job.num_requests \
                and alone(result):
            return i, result
    return None


def _deployment(c: Candidate, job: ev.Job):
    return deployment(job.model, c.device, **ev.deployment_kwargs(c, job))


def _stream_blocks(c: Candidate, job: ev.Job) -> int:
    """The KV blocks a stream of `c` holds (its deployment's, over its pipeline's streams)."""
    dep = _deployment(c, job)
    return dep.engine.kv_blocks // dep.parallel.pipeline_parallel_size
