"""`plan(...)`: the deployment search, from its inputs checked to its result as plain data.

    from perfcounter.plan import plan
    result = plan("llama-3.1-70b", "h100-sxm:8", slo="ttft=1s,tpot=50ms", qps=4)
    result.recommended, result.front, result.to_dict()

Every input is checked before any table is counted (PlanError, one line). Then the
candidates are enumerated (candidates.py), those that do not fit a rank's memory are left
out (kept in the result, `fits` false), each other one is bounded (bounds.py) and decided by
the pruned search (prune.py: left out where its bounds or a short run show it cannot matter,
its figures from a run already simulated where that run is its own, else simulated), or
with `exhaustive` every one is simulated, on the chosen backend (execute.py); the front and
the recommendation are read off their figures (front.py). A candidate left out keeps why
(`pruned`, `pruned_by`: bound or halving) and its bounds in the result.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

from perfcounter._util import atomic_write
from perfcounter.models.args import ModelArgs
from perfcounter.plan import evaluate as ev
from perfcounter.plan.bounds import bounds, step_seconds
from perfcounter.plan.candidates import (Candidate, Space, default_quantizations,
                                         KV_CACHE_DTYPES, tensor_parallel_sizes,
                                         enumerate_candidates, memory_fit)
from perfcounter.plan.execute import check_backend, pruned_rounds, run_candidates, run_pruned
from perfcounter.plan.front import pareto_front, recommend
from perfcounter.plan.options import PlanEngine, PlanOptions, PlanSpace, PlanTarget
from perfcounter.plan.pool import DeviceKind, PlanError, kind_named, parse_devices
from perfcounter.serve.api import (check_execution, resolve_model, resolve_precision,
                                   resolve_quantization)
from perfcounter.serve import counts_cache
from perfcounter.serve.engines import ENGINES
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import HfArgs
from perfcounter.serve.metrics import check_attainment, parse_slo
from perfcounter.serve.workload import check_fits_model, check_rate, parse_lengths


@dataclass
class PlanResult:
    """A search: its job, pool, every candidate with its fit and figures, front, choice."""

    job: ev.Job
    kinds: list[DeviceKind]
    candidates: list[Candidate]
    fits: list[bool]
    # None: left out (no KV cache fits); {"error": why}: refused; {"pruned": why,
    # "pruned_by": rule, bounds}: not simulated (prune.py); "same_run_as": j: j's run
    figures: list[dict | None]
    front: list[int]  # candidate indices, by ascending TPOT
    recommended: int | None
    slo_attainment: float
    backend: str
    seconds: float = 0.0  # wall time of the search (not part of its figures)
    commands: dict = field(default_factory=dict)  # index -> `perfcounter serve` command
    exhaustive: bool = True  # every candidate that fits simulated (else pruned, prune.py)

    @property
    def simulated(self) -> int:
        """Candidates served whole (serve's refusals included)."""
        return sum(1 for f, ok in zip(self.figures, self.fits)
                   if ok and not {"pruned", "same_run_as"} & set(f or ()))

    @property
    def pruned(self) -> dict:
        """{rule: candidates it left out} (prune.py's bound, halving)."""
        return dict(Counter(f["pruned_by"] for f in self.figures if f and "pruned" in f))

    @property
    def same_run(self) -> int:
        """Candidates whose figures come from another's run (dedupe.py)."""
        return sum(1 for f in self.figures if f and "same_run_as" in f)

    def to_dict(self) -> dict:
        """The JSON of --save_path: the search's inputs and every candidate."""
        on_front = set(self.front)
        rows = []
        for i, c in enumerate(self.candidates):
            rows.append({"index": i, **c.to_dict(), "fits": self.fits[i],
                         "pareto": i in on_front, "recommended": i == self.recommended,
                         **(self.figures[i] or {}),
                         "serve_command": self.commands.get(i)})
        job = self.job
        return {"model": job.model_name,
                "devices": {k.name: {"count": k.count, "usd_per_hour": k.usd_per_hour,
                                     "usd_per_hour_source": k.usd_source} for k in self.kinds},
                "workload": {"qps": job.qps, "num_requests": job.num_requests,
                             "prompt_length": job.prompt_length,
                             "max_new_tokens": job.max_new_tokens,
                             "burstiness": job.burstiness, "seed": job.seed},
                "slo": job.slo, "slo_attainment": self.slo_attainment,
                "engine": job.engine, "execution": job.execution, "enumerated": len(self.candidates),
                "simulated": self.simulated, "exhaustive": self.exhaustive,
                "pruned": self.pruned, "same_run": self.same_run, "pareto_front": self.front,
                "recommended": self.recommended, "candidates": rows}

    def save(self, path) -> None:
        atomic_write(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")


def _names(values, what: str, check) -> tuple:
    out = tuple(None if v is None or str(v).strip().lower() in ("none", "auto")
                else str(v).strip().lower() for v in values)
    if not out:
        raise PlanError(f"{what}: expected at least one value")
    if len(set(out)) < len(out):
        raise PlanError(f"{what} {','.join(str(v) for v in out)}: a value named twice")
    for v in out:
        check(v)
    return out


def _check_sizes(args, kinds: list[DeviceKind], model: str, tp, pp, dp) -> dict:
    """The parallel sizes asked (None: enumerated), checked: integers >= 1, TP sizes that
    shard the model, PP at most its layers, the smallest asked on the pool's largest kind."""
    out = {}
    for flag, values in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp),
                         ("data_parallel_size", dp)):
        if values is None:
            out[flag + "s"] = None
            continue
        values = tuple(values)
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                             for v in values) or len(set(values)) < len(values):
            raise PlanError(f"--{flag} {','.join(map(str, values))}: expected distinct "
                            "integers >= 1")
        out[flag + "s"] = values
    for t in out["tensor_parallel_sizes"] or ():
        if t not in tensor_parallel_sizes(args):
            raise PlanError(f"--tensor_parallel_size {t} does not shard {model}; valid: "
                            f"{', '.join(map(str, tensor_parallel_sizes(args)))}")
    for p in out["pipeline_parallel_sizes"] or ():
        if p > args.n_layer:
            raise PlanError(f"--pipeline_parallel_size {p}: {model} has {args.n_layer} layers, "
                            f"at most one stage each; valid: 1..{args.n_layer}")
    least = [min(v) if v else 1 for v in out.values()]
    gpus, most = least[0] * least[1] * least[2], max(k.count for k in kinds)
    if gpus > most:
        raise PlanError(f"TP {least[0]} x PP {least[1]} x DP {least[2]} asks {gpus} GPUs; the "
                        f"pool's largest kind holds {most} (--devices)")
    return out


class Progress:
    """What a search tells as it goes (the CLI's bar and best so far): `start(total)` once the
    candidates to simulate are known, `done(index, candidate, figures)` as each ends. This
    one tells no one."""

    def start(self, total: int) -> None:
        pass

    def done(self, index: int, candidate: Candidate, figures: dict) -> None:
        pass


def plan(model, devices, *, options: PlanOptions | None = None, progress: Progress | None = None,
         **keywords) -> PlanResult:
    """Search the deployments of `model` on the pool `devices` ('h100-sxm:8,...') for the
    workload (serve's flags; one rate) and the SLO (module doc). Its settings come as
    `options` (a PlanOptions) or as flat keywords, each landing in its group (options.py):
    the workload (qps, num_requests, prompt_length, max_new_tokens, burstiness, seed), the
    target (slo, slo_attainment), the engine (precision, execution, engine,
    gpu_memory_utilization, max_num_batched_tokens, block_size, usd_per_hour), the space
    (quantizations: the weight schemes to try, None: candidates.default_quantizations;
    kv_cache_dtypes; max_num_seqs; tensor_parallel_size, pipeline_parallel_size,
    data_parallel_size: the sizes to try, None: candidates.py's powers of two;
    disaggregated: prefill and decode pools beside the aggregated ones) and the backend
    (backend, workers, address; exhaustive: simulate every candidate that fits, else the
    pruned search). `progress`: told of each candidate that fits as it is decided
    (Progress)."""
    started = time.perf_counter()
    if options is None:
        options = PlanOptions.of(**keywords)
    elif keywords:
        raise TypeError(f"plan() takes options or keywords, not both (got "
                        f"{', '.join(sorted(keywords))})")
    q = _question(model, devices, options)
    candidates = enumerate_candidates(q.args, q.kinds, str(q.dtype).replace("torch.", ""),
                                      q.space)
    fits, refused, found = _memory_fits(q, candidates, options.engine)
    kept = [c for c, ok in zip(candidates, fits) if ok]
    at = [i for i, ok in enumerate(fits) if ok]  # kept's index in candidates
    progress = progress or Progress()
    progress.start(len(kept))
    b = options.backend
    if b.exhaustive:
        done = iter(run_candidates(kept, q.job, backend=b.backend, workers=b.workers,
                                   address=b.address, on_done=lambda k, f: progress.done(
                                       at[k], kept[k], f)))
        figures = [next(done) if ok else refused.get(i) for i, ok in enumerate(fits)]
    else:
        items = _bounded(q, options.target.slo_attainment, candidates, at, found)
        decided = run_pruned(pruned_rounds(items), q.job, options.target.slo_attainment,
                             backend=b.backend, workers=b.workers, address=b.address,
                             on_done=lambda i, f: progress.done(i, candidates[i], f))
        figures = [decided[i] if ok else refused.get(i) for i, ok in enumerate(fits)]
    usable = [f or {"error": "does not fit"} for f in figures]
    front = pareto_front(usable)
    attainment = options.target.slo_attainment
    best = recommend(usable, [c.num_gpus for c in candidates], attainment)
    commands = {i: ev.serve_command(candidates[i], q.job) for i in range(len(candidates))
                if fits[i]}
    return PlanResult(q.job, q.kinds, candidates, fits, figures, front, best, attainment,
                      b.backend, time.perf_counter() - started, commands, b.exhaustive)


def _bounded(q: "_Question", attainment: float, candidates: list, at: list,
             found: dict) -> list:
    """(index, Candidate, Bounds) of each candidate that fits (bounds.py): its ranks' least
    step from their weights (found: memory_fit's, by kind), on the search's workload."""
    job = q.job
    workload, slo = ev.workload(job), parse_slo(job.slo)
    items = []
    for i in at:
        c = candidates[i]
        kinds = [c.device] + ([c.decode_device] if c.disaggregated else [])
        steps = [step_seconds(q.args, found[i][k].weight_bytes, kind_named(q.kinds, k).spec,
                              c.pipeline_parallel_size) for k in kinds]
        items.append((i, c, bounds(workload, slo, attainment, job.max_num_batched_tokens,
                                   c.num_gpus, steps[0], steps[-1])))
    return items


@dataclass(slots=True)
class _Question:
    """A search's inputs checked: the model's args and dtype, the pool, the job every
    candidate runs, the space of candidates."""

    args: object
    dtype: object
    kinds: list
    job: ev.Job
    space: Space


def _question(model, devices, o: PlanOptions) -> _Question:
    """Every input checked before any table is counted (PlanError, one line)."""
    eng, w = o.engine, o.workload
    try:
        counts_cache.enabled()  # a bad switch refused here, not in every candidate's run
    except ServeError as e:
        raise PlanError(str(e)) from None
    args = resolve_model(model)
    dtype = resolve_precision(eng.precision)
    kinds = parse_devices(devices, dtype, eng.usd_per_hour)
    _check_engine_and_target(eng, o.target)
    check_rate(w.qps)
    prompt_length, max_new_tokens = str(w.prompt_length), str(w.max_new_tokens)
    parse_lengths(prompt_length, "--prompt_length")
    parse_lengths(max_new_tokens, "--max_new_tokens")
    quants, kvs, seqs = _space_values(args, dtype, o.space)
    for name, value, least in (("--max_num_batched_tokens", eng.max_num_batched_tokens, 1),
                               ("--block_size", eng.block_size, 1),
                               ("--num_requests", w.num_requests, 1)):
        if not isinstance(value, int) or value < least:
            raise PlanError(f"{name} {value}: expected an integer >= {least}")
    if not 0 < eng.gpu_memory_utilization <= 1:
        raise PlanError(f"--gpu_memory_utilization {eng.gpu_memory_utilization}: expected a "
                        "fraction in (0, 1]")
    sp = o.space
    sizes = _check_sizes(args, kinds, str(model), sp.tensor_parallel_size,
                         sp.pipeline_parallel_size, sp.data_parallel_size)
    check_backend(o.backend.backend, o.backend.workers)
    given = model if isinstance(model, (ModelArgs, HfArgs)) else str(model)
    job = ev.Job(model=given, execution=eng.execution, engine=eng.engine,
                 gpu_memory_utilization=eng.gpu_memory_utilization,
                 max_num_batched_tokens=eng.max_num_batched_tokens, block_size=eng.block_size,
                 qps=float(w.qps), num_requests=w.num_requests, prompt_length=prompt_length,
                 max_new_tokens=max_new_tokens, burstiness=float(w.burstiness), seed=w.seed,
                 slo=str(o.target.slo), prices=tuple((k.name, k.usd_per_hour) for k in kinds))
    try:
        check_fits_model(ev.workload(job), args.block_size)
    except ServeError as e:
        raise PlanError(f"{e} (the workload)") from None
    space = Space(quants, kvs, seqs, disaggregated=bool(sp.disaggregated) and ev.DISAGGREGATED,
                  max_replicas=w.num_requests, **sizes)
    return _Question(args, dtype, kinds, job, space)


def _check_engine_and_target(eng: PlanEngine, target: PlanTarget) -> None:
    check_execution(eng.execution)
    if eng.engine not in ENGINES:
        raise PlanError(f"--engine {eng.engine!r}; valid: {', '.join(ENGINES)}")
    slo = target.slo
    if not slo:
        raise PlanError("--slo: a search needs targets, e.g. ttft=1s,tpot=50ms")
    if "itl" in parse_slo(slo):
        raise PlanError(f"--slo {slo}: goodput takes ttft, tpot and e2el (vLLM's), not itl")
    try:
        check_attainment(target.slo_attainment)
    except ServeError as e:
        raise PlanError(str(e)) from None


def _space_values(args, dtype, sp: PlanSpace) -> tuple:
    """(weight schemes, KV dtypes, max_num_seqs) to try, each checked."""
    quantizations = sp.quantizations
    if quantizations is None:
        quantizations = default_quantizations(args, dtype)
    quants = _names(quantizations, "--quantize",
                    lambda q: resolve_quantization(q, None, args, dtype))
    kvs = _names(sp.kv_cache_dtypes, "--kv_dtype", lambda k: resolve_quantization(None, k))
    if isinstance(args, HfArgs):  # its cache at the precision; what else is asked, refused
        kvs = _names((None,) if kvs == KV_CACHE_DTYPES else kvs, "--kv_dtype",
                     lambda k: resolve_quantization(None, k, args))
    seqs = tuple(sp.max_num_seqs)
    if not seqs or any(not isinstance(s, int) or s < 1 for s in seqs) \
            or len(set(seqs)) < len(seqs):
        raise PlanError(f"--max_num_seqs {','.join(map(str, seqs))}: expected distinct "
                        "integers >= 1")
    return quants, kvs, seqs


def _memory_fits(q: _Question, candidates: list, eng: PlanEngine) -> tuple[list, dict, dict]:
    """Whether each candidate fits every kind of device it uses (memory_fit), why not where
    a plan refused it ({index: {"error": why}}), and each one's Fit by kind."""
    cache: dict = {}
    options = {"gpu_memory_utilization": eng.gpu_memory_utilization,
               "block_size": eng.block_size, "max_num_batched_tokens": eng.max_num_batched_tokens}
    fits, refused, by_kind = [], {}, {}
    for i, c in enumerate(candidates):
        kinds_used = [c.device] + ([c.decode_device] if c.disaggregated else [])
        found = by_kind[i] = {k: memory_fit(q.args, q.dtype, c, kind_named(q.kinds, k).spec,
                                            cache=cache, **options) for k in kinds_used}
        fits.append(all(f.fits for f in found.values()))
        reasons = [f.error for f in found.values() if f.error]
        if reasons:
            refused[i] = {"error": reasons[0]}
    return fits, refused, by_kind
