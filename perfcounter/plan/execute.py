"""Where a search's candidates run: in this process, a pool of its machine's cores, or on Ray.

Candidates are grouped by the step table they are priced with (model x precision x storage x
shard on one kind of device: `table_group`): a group is one task, which builds its table
once (serve/pricing.py's step_table cache) and evaluates every candidate of the group with
it. A task returns (candidate index, figures) pairs; the search puts them back in candidate
order, so that every backend gives the same list, bit for bit (each figure is computed by
the same code from the same inputs: nothing depends on which process ran it).

    backend "serial"    this process (workers=1)
    backend "processes" concurrent.futures' process pool, `workers` processes (default: the
                        cores this process may run on)
    backend "ray"       each group a Ray task (`ray.remote`), on the cluster at `address`
                        (None: the one this process is connected to, else a local one);
                        Ray is the optional extra `.[ray]`

A candidate that serve refuses (one line) keeps its message as its `error` figure: nothing
is dropped.

The pruned search (prune.py) goes in rounds, one per number of GPUs, fewest first: a
candidate is dominated by one with at least its throughput per GPU, on about as many GPUs or
fewer, so those are decided before it. A round's task is the round's candidates of one group
sharing a step table's counts (`counts_group`: the model, storage and shard, whatever the
kind of device: a task prices its counts on each kind it needs); every task of a group runs
in the same worker process (a process pool of one process per worker, or one Ray actor per
worker), which counts the table once and keeps it. Each task decides its candidates against
the incumbents of the rounds before (and its own as it goes); the rounds' results join the
incumbents in task order. So every backend, with any number of workers, gives the same
answer, bit for bit.

`on_done(index, figures)` hears of each candidate as its task ends (a progress bar, the best
so far; the pruned search's in this process, as each is decided); an interrupt (Ctrl-C)
cancels the tasks not started, ends the pool's processes (they ignore the signal themselves:
no traceback from each) and goes up to the caller, which has heard of every candidate done.
"""
from __future__ import annotations

import copy
import os
import signal
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed

from perfcounter.plan.candidates import Candidate
from perfcounter.plan.evaluate import Job, evaluate
from perfcounter.plan.pool import PlanError
from perfcounter.plan.prune import Incumbents, forget_alone_runs, run_group as run_pruned_group
from perfcounter.serve.errors import ServeError

BACKENDS = ("serial", "processes", "ray")


def table_group(c: Candidate) -> tuple:
    """What a candidate's step tables depend on: the kinds, storage and shard (the experts
    a rank holds: split over TP x DP with expert parallelism)."""
    ep = c.tensor_parallel_size * c.data_parallel_size if c.enable_expert_parallel else 1
    decode = None if c.decode_device == c.device else c.decode_device  # one kind: one table
    return (c.device, decode, c.dtype, c.quantization, c.kv_cache_dtype,
            c.tensor_parallel_size, c.pipeline_parallel_size, ep)


def run_group(job: Job, indexed: list[tuple[int, Candidate]]) -> list[tuple[int, dict]]:
    """Evaluate one group's candidates (their table built once, by the first); a refusal
    becomes that candidate's `error`."""
    out = []
    for i, c in indexed:
        try:
            out.append((i, evaluate(c, job)))
        except (ServeError, ValueError) as e:
            out.append((i, {"error": str(e)}))
    return out


def groups(candidates: list[Candidate]) -> list[list[tuple[int, Candidate]]]:
    """Candidates by table_group, largest group first (the pool's longest tasks start first),
    each in candidate order."""
    by: dict = defaultdict(list)
    for i, c in enumerate(candidates):
        by[table_group(c)].append((i, c))
    return sorted(by.values(), key=lambda g: (-len(g), g[0][0]))


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_backend(backend: str, workers: int | None) -> None:
    if backend not in BACKENDS:
        raise PlanError(f"backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise PlanError(f"--workers {workers}: expected an integer >= 1")
    if backend == "ray":
        ray_module()


def ray_module():
    """The ray module, or PlanError saying how to install it."""
    try:
        import ray  # deferred: an optional extra (.[ray]), imported only for --ray
    except ImportError:
        raise PlanError("--ray needs Ray: pip install 'perfcounter[ray]' (or pip install ray)"
                        ) from None
    return ray


def run_candidates(candidates: list[Candidate], job: Job, *, backend: str = "processes",
                   workers: int | None = None, address: str | None = None,
                   on_done=None) -> list[dict]:
    """Each candidate's figures, in candidate order, on `backend` (module doc); `on_done`
    (index, figures) called for each as its task ends."""
    check_backend(backend, workers)
    tasks = groups(candidates)
    if not tasks:  # nothing fits: nothing to run (a pool of 0 workers is no pool)
        return []
    workers = default_workers() if workers is None else workers
    figures: list = [None] * len(candidates)

    def done(pairs) -> None:
        for i, f in pairs:
            figures[i] = f
            if on_done is not None:
                on_done(i, f)
    if backend == "serial" or (backend == "processes" and (workers == 1 or len(tasks) == 1)):
        for task in tasks:
            for pair in task:  # each candidate heard of as it ends
                done(run_group(job, [pair]))
    elif backend == "processes":
        _run_pool(tasks, job, min(workers, len(tasks)), done)
    else:
        _run_ray(tasks, job, address, done)
    assert all(f is not None for f in figures)
    return figures


def _ignore_interrupt() -> None:
    """A pool process's start: Ctrl-C is the parent's to handle (module doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_pool(tasks, job: Job, workers: int, done) -> None:
    pool, futures = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_interrupt), []
    try:
        futures += [pool.submit(run_group, job, task) for task in tasks]
        for future in as_completed(futures):
            done(future.result())
    except BaseException:  # an interrupt, or a task's error: no task left running
        _stop(pool, futures)
        raise
    pool.shutdown()


def _stop(pool, futures) -> None:
    """Cancel `futures`, end the pool's processes (module doc: they ignore Ctrl-C)."""
    for future in futures:
        future.cancel()
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _run_ray(tasks, job: Job, address: str | None, done) -> None:
    ray = ray_module()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    remote = ray.remote(run_group)
    job_ref = ray.put(job)
    pending = [remote.remote(job_ref, task) for task in tasks]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done(ray.get(ready[0]))




def counts_group(c: Candidate) -> tuple:
    """What a candidate's step-table counts depend on: table_group less the kinds."""
    return table_group(c)[2:]


def pruned_rounds(items: list) -> list[list[tuple[int, list]]]:
    """(index, Candidate, Bounds) items in rounds (module doc): by number of GPUs, fewest
    first; in each, (group number, its items) by group, the groups numbered most promising
    first (their fewest GPUs, least step (bounds.py), first candidate)."""
    by: dict = defaultdict(list)
    for item in items:
        by[counts_group(item[1])].append(item)
    ordered = sorted(by.values(), key=lambda g: (min(c.num_gpus for _, c, _ in g),
                                                 min(b.step_s for _, _, b in g), g[0][0]))
    rounds = []
    for gpus in sorted({c.num_gpus for _, c, _ in items}):
        tasks = [(k, [it for it in g if it[1].num_gpus == gpus]) for k, g in enumerate(ordered)]
        rounds.append([(k, its) for k, its in tasks if its])
    return rounds


def _pruned_task(job: Job, items: list, inc: Incumbents, group: int) -> list:
    """One task of the pruned search: its candidates decided (prune.run_group)."""
    return run_pruned_group(job, items, inc, evaluate, group=group)


class _Worker:
    """A worker that keeps its groups' tables: a Ray actor's class."""

    def run(self, job: Job, items: list, inc: Incumbents, group: int) -> list:
        return _pruned_task(job, items, inc, group)


def run_pruned(rounds: list, job: Job, attainment: float, *, backend: str = "processes",
               workers: int | None = None, address: str | None = None,
               on_done=None) -> dict:
    """{index: figures} of the pruned search's `rounds` (pruned_rounds) on `backend` (module
    doc); on_done(index, figures) for each as it is decided."""
    check_backend(backend, workers)
    forget_alone_runs()  # the worker processes and actors below are new each search
    workers = default_workers() if workers is None else workers
    groups = len({k for tasks in rounds for k, _ in tasks})
    inc, results = Incumbents(attainment), {}
    if backend == "serial" or (backend == "processes" and (workers == 1 or groups == 1)):
        def run_round(tasks, snapshot):
            return [run_pruned_group(job, items, copy.deepcopy(snapshot), evaluate, on_done,
                                     group=k) for k, items in tasks]
        _rounds(rounds, inc, results, run_round, None)
    elif backend == "processes":
        pools = [ProcessPoolExecutor(max_workers=1, initializer=_ignore_interrupt)
                 for _ in range(min(workers, groups))]
        try:
            _rounds(rounds, inc, results, _pool_round(job, pools, on_done), None)
        except BaseException:  # an interrupt, or a task's error: no task left running
            for pool in pools:
                _stop(pool, [])
            raise
        for pool in pools:
            pool.shutdown()
    else:
        _rounds(rounds, inc, results, _ray_round(job, address, groups), on_done)
    return results


def _rounds(rounds, inc: Incumbents, results: dict, run_round, on_done) -> None:
    """Each round run with the incumbents of those before; its figures into `results` and,
    in task order, into `inc`."""
    for tasks in rounds:
        for pairs in run_round(tasks, copy.deepcopy(inc)):
            for i, f in pairs:
                results[i] = f
                if on_done is not None:
                    on_done(i, f)
                if "pruned" not in f:
                    inc.add(i, f)


def _pool_round(job: Job, pools: list, on_done):
    def run_round(tasks, snapshot):
        futures = [pools[k % len(pools)].submit(_pruned_task, job, items, snapshot, k)
                   for k, items in tasks]
        for future in as_completed(futures):  # heard of as each task ends
            for i, f in future.result() if on_done is not None else ():
                on_done(i, f)
        return [future.result() for future in futures]
    return run_round


def _ray_round(job: Job, address: str | None, groups: int):
    ray = ray_module()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    cpus = int(ray.available_resources().get("CPU", 1)) or 1
    actors = [ray.remote(_Worker).remote() for _ in range(min(cpus, groups))]
    job_ref = ray.put(job)

    def run_round(tasks, snapshot):
        return ray.get([actors[k % len(actors)].run.remote(job_ref, items, snapshot, k)
                        for k, items in tasks])
    return run_round
