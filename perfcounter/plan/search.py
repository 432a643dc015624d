"""`plan(...)`: the deployment search, from its inputs checked to its result as plain data.

    from perfcounter.plan import plan
    result = plan("llama-3.1-70b", "h100-sxm:8", slo="ttft=1s,tpot=50ms", qps=4)
    result.recommended, result.front, result.to_dict()

Every input is checked before any table is counted (PlanError, one line). Then the
candidates are enumerated (candidates.py), those that do not fit a rank's memory are left
out (kept in the result, `fits` false), the others are simulated on the chosen backend
(execute.py), and the front and the recommendation are read off their figures (front.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from perfcounter._util import atomic_write
from perfcounter.parallel.sharding import valid_tensor_parallel_sizes
from perfcounter.plan import evaluate as ev
from perfcounter.plan.candidates import (KV_CACHE_DTYPES, MAX_NUM_SEQS, Candidate, Space,
                                         default_quantizations, enumerate_candidates,
                                         memory_fit)
from perfcounter.plan.execute import check_backend, run_candidates
from perfcounter.plan.front import pareto_front, recommend
from perfcounter.plan.pool import DeviceKind, PlanError, kind_named, parse_devices
from perfcounter.serve.api import (check_execution, resolve_model, resolve_precision,
                                   resolve_quantization)
from perfcounter.serve.engines import ENGINES
from perfcounter.serve.errors import ServeError
from perfcounter.serve.metrics import parse_slo
from perfcounter.serve.workload import check_fits_model, check_rate, parse_lengths


@dataclass
class PlanResult:
    """A search: its job, pool, every candidate with its fit and figures, front, choice."""

    job: ev.Job
    kinds: list[DeviceKind]
    candidates: list[Candidate]
    fits: list[bool]
    figures: list[dict | None]  # None: left out (no KV cache fits); {"error": why}: refused
    front: list[int]  # candidate indices, by ascending TPOT
    recommended: int | None
    slo_attainment: float
    backend: str
    seconds: float = 0.0  # wall time of the search (not part of its figures)
    commands: dict = field(default_factory=dict)  # index -> `perfcounter serve` command

    @property
    def simulated(self) -> int:
        return sum(self.fits)

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
        return {"model": job.model,
                "devices": {k.name: {"count": k.count, "usd_per_hour": k.usd_per_hour,
                                     "usd_per_hour_source": k.usd_source} for k in self.kinds},
                "workload": {"qps": job.qps, "num_requests": job.num_requests,
                             "prompt_length": job.prompt_length,
                             "max_new_tokens": job.max_new_tokens,
                             "burstiness": job.burstiness, "seed": job.seed},
                "slo": job.slo, "slo_attainment": self.slo_attainment,
                "engine": job.engine, "execution": job.execution, "enumerated": len(self.candidates),
                "simulated": self.simulated, "pareto_front": self.front,
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
        if t not in valid_tensor_parallel_sizes(args):
            raise PlanError(f"--tensor_parallel_size {t} does not shard {model}; valid: "
                            f"{', '.join(map(str, valid_tensor_parallel_sizes(args)))}")
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


def plan(model, devices, *, slo, qps: float, num_requests: int = 200,
         prompt_length="512", max_new_tokens="128", burstiness: float = 1.0, seed: int = 0,
         precision: str = "bfloat16", execution: str = "cudagraphs", engine: str = "vllm",
         gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 8192,
         block_size: int = 16, usd_per_hour: float | None = None,
         quantizations=None, kv_cache_dtypes=KV_CACHE_DTYPES,
         max_num_seqs=MAX_NUM_SEQS, tensor_parallel_size=None, pipeline_parallel_size=None,
         data_parallel_size=None, disaggregated: bool = True, slo_attainment: float = 0.9,
         backend: str = "processes",
         workers: int | None = None, address: str | None = None) -> PlanResult:
    """Search the deployments of `model` on the pool `devices` ('h100-sxm:8,...') for the
    workload (serve's flags; one rate) and the SLO (module doc). quantizations: the weight
    schemes to try (None: candidates.default_quantizations); tensor_parallel_size,
    pipeline_parallel_size, data_parallel_size: the sizes to try (None: candidates.py's
    powers of two); disaggregated: prefill and decode pools beside the aggregated ones."""
    started = time.perf_counter()
    args = resolve_model(model)
    dtype = resolve_precision(precision)
    kinds = parse_devices(devices, dtype, usd_per_hour)
    check_execution(execution)
    if engine not in ENGINES:
        raise PlanError(f"--engine {engine!r}; valid: {', '.join(ENGINES)}")
    if not slo:
        raise PlanError("--slo: a search needs targets, e.g. ttft=1s,tpot=50ms")
    if "itl" in parse_slo(slo):
        raise PlanError(f"--slo {slo}: goodput takes ttft, tpot and e2el (vLLM's), not itl")
    if not 0 < slo_attainment <= 1:
        raise PlanError(f"--slo_attainment {slo_attainment}: expected a fraction in (0, 1]")
    check_rate(qps)
    prompt_length, max_new_tokens = str(prompt_length), str(max_new_tokens)
    parse_lengths(prompt_length, "--prompt_length")
    parse_lengths(max_new_tokens, "--max_new_tokens")
    if quantizations is None:
        quantizations = default_quantizations(args, dtype)
    quants = _names(quantizations, "--quantize",
                    lambda q: resolve_quantization(q, None, args, dtype))
    kvs = _names(kv_cache_dtypes, "--kv_dtype", lambda k: resolve_quantization(None, k))
    seqs = tuple(max_num_seqs)
    if not seqs or any(not isinstance(s, int) or s < 1 for s in seqs) \
            or len(set(seqs)) < len(seqs):
        raise PlanError(f"--max_num_seqs {','.join(map(str, seqs))}: expected distinct "
                        "integers >= 1")
    for name, value, least in (("--max_num_batched_tokens", max_num_batched_tokens, 1),
                               ("--block_size", block_size, 1),
                               ("--num_requests", num_requests, 1)):
        if not isinstance(value, int) or value < least:
            raise PlanError(f"{name} {value}: expected an integer >= {least}")
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError(f"--gpu_memory_utilization {gpu_memory_utilization}: expected a "
                        "fraction in (0, 1]")
    sizes = _check_sizes(args, kinds, str(model), tensor_parallel_size, pipeline_parallel_size,
                         data_parallel_size)
    check_backend(backend, workers)
    job = ev.Job(model=str(model), execution=execution, engine=engine,
                 gpu_memory_utilization=gpu_memory_utilization,
                 max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                 qps=float(qps), num_requests=num_requests, prompt_length=prompt_length,
                 max_new_tokens=max_new_tokens, burstiness=float(burstiness), seed=seed,
                 slo=str(slo), prices=tuple((k.name, k.usd_per_hour) for k in kinds))
    try:
        check_fits_model(ev.workload(job), args.block_size)
    except ServeError as e:
        raise PlanError(f"{e} (the workload)") from None

    space = Space(quants, kvs, seqs, disaggregated=bool(disaggregated) and ev.DISAGGREGATED,
                  **sizes)
    candidates = enumerate_candidates(args, kinds, str(dtype).replace("torch.", ""), space)
    cache: dict = {}
    options = {"gpu_memory_utilization": gpu_memory_utilization, "block_size": block_size,
               "max_num_batched_tokens": max_num_batched_tokens}
    fits, refused = [], {}
    for i, c in enumerate(candidates):
        kinds_used = [c.device] + ([c.decode_device] if c.disaggregated else [])
        found = [memory_fit(args, dtype, c, kind_named(kinds, k).spec, cache=cache, **options)
                 for k in kinds_used]
        fits.append(all(f.fits for f in found))
        reasons = [f.error for f in found if f.error]
        if reasons:
            refused[i] = {"error": reasons[0]}
    kept = [c for c, ok in zip(candidates, fits) if ok]
    done = iter(run_candidates(kept, job, backend=backend, workers=workers, address=address))
    figures = [next(done) if ok else refused.get(i) for i, ok in enumerate(fits)]
    usable = [f or {"error": "does not fit"} for f in figures]
    front = pareto_front(usable)
    best = recommend(usable, [c.num_gpus for c in candidates], slo_attainment)
    commands = {i: ev.serve_command(candidates[i], job) for i in range(len(candidates))
                if fits[i]}
    return PlanResult(job, kinds, candidates, fits, figures, front, best, slo_attainment,
                      backend, time.perf_counter() - started, commands)
