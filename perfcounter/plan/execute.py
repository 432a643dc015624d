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
"""
from __future__ import annotations

import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

from perfcounter.plan.candidates import Candidate
from perfcounter.plan.evaluate import Job, evaluate
from perfcounter.plan.pool import PlanError
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
                   workers: int | None = None, address: str | None = None) -> list[dict]:
    """Each candidate's figures, in candidate order, on `backend` (module doc)."""
    check_backend(backend, workers)
    tasks = groups(candidates)
    if not tasks:  # nothing fits: nothing to run (a pool of 0 workers is no pool)
        return []
    workers = default_workers() if workers is None else workers
    if backend == "serial" or (backend == "processes" and (workers == 1 or len(tasks) == 1)):
        done = [pair for task in tasks for pair in run_group(job, task)]
    elif backend == "processes":
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
            futures = [pool.submit(run_group, job, task) for task in tasks]
            done = [pair for f in futures for pair in f.result()]
    else:
        done = _run_ray(tasks, job, address)
    figures: list = [None] * len(candidates)
    for i, f in done:
        figures[i] = f
    assert all(f is not None for f in figures)
    return figures


def _run_ray(tasks, job: Job, address: str | None) -> list:
    ray = ray_module()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    remote = ray.remote(run_group)
    job_ref = ray.put(job)
    refs = [remote.remote(job_ref, task) for task in tasks]
    return [pair for result in ray.get(refs) for pair in result]
