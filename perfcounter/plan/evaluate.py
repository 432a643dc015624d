"""One candidate served to the search's workload: serve's own deployment, workload and metrics.

A candidate is evaluated exactly as `perfcounter serve` would serve it (`serve_command`
prints that command line): `serve.deployment(...)` with the candidate's precision, storage,
engine limits and parallel degrees, `serve.synthetic(...)` with the search's workload (one
rate, --qps), `serve.serve(...)` with the SLO; a disaggregated one by
`serve.disaggregated(...)` on its prefill and decode pools (`DEVICE,instances=N,tp=T`), its
overall metrics (TTFT its prefill's, the KV moved between the pools, TPOT its decode's).
Its figures:

    goodput_per_gpu      request_goodput / GPUs: requests a second meeting every SLO target
                         at the workload's rate (vLLM's goodput), per GPU
    output_throughput_per_gpu   output tokens a second / GPUs (AIConfigurator's tokens/s/gpu)
    usd_per_1m_output_tokens    the GPUs' price an hour (each at the pool's price a GPU-hour)
                                x duration / output tokens x 1e6 (serve's, at that price;
                                disaggregated: both pools' GPUs, each at its kind's price)
    j_per_output_token          serve's energy over the run / output tokens (disaggregated:
                                both pools'; the KV moves' joules beside, kv_transfer_j);
                                None where a device's figures give no energy (as $ is None
                                where no price is listed)
    mean_power_w                serve's energy / the run's duration: every GPU's average
                                power (None where the energy is); the table shows it per GPU

The regime is the search's (--execution), except CUDA graphs on a device that replays none
(a CPU, a PIM part: the engine's profile says so, serve/engines.py): there each device runs
its engine's own regime (eager), as `perfcounter serve` runs it when --execution is not
given, and the serve command leaves --execution out.

Goodput is measured at the workload's rate, not searched for the highest rate meeting the
SLO (serve's find_max_qps bisects rates, each a run of thousands of requests): a search ranks
deployments on the traffic given, and one that meets the SLO on fewer GPUs ranks higher per
GPU.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from perfcounter.plan.candidates import Candidate
from perfcounter.serve.api import (deployment, disaggregated, resolve_precision, resolve_spec,
                                   serve)
from perfcounter.serve.engines import engine_profile
from perfcounter.serve.workload import synthetic

FIGURES = ("request_goodput", "slo_met_fraction", "request_throughput", "output_throughput",
           "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "mean_batch_size",
           "preemptions", "overloaded", "j_per_output_token", "usd_per_1m_output_tokens",
           "mean_power_w")


@dataclass(frozen=True)
class Job:
    """What every candidate of one search shares: the model, the engine settings, the
    workload (serve's flags) and the SLO."""

    model: object  # --model's text (a preset, a path), or a ModelArgs or HfArgs given as one
    execution: str = "cudagraphs"
    engine: str = "vllm"  # the engine whose defaults run (serve/engines.py)
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    qps: float = 1.0
    num_requests: int = 200
    prompt_length: str = "512"
    max_new_tokens: str = "128"
    burstiness: float = 1.0
    seed: int = 0
    slo: str = "ttft=1s,tpot=50ms"
    prices: tuple = ()  # (kind, $ a GPU-hour or None): the pool's (pool.DeviceKind)

    def __hash__(self) -> int:  # a ModelArgs given as the model is a mutable dataclass
        m = self.model
        key = m if isinstance(m, str) else repr(m) + getattr(m, "config_json", "")
        return hash((key, *(getattr(self, f) for f in self.__dataclass_fields__ if f != "model")))

    @property
    def model_name(self) -> str:
        """The model as --model names it: its text, a transformers model's name (HfArgs),
        else the object's repr (a ModelArgs: no name a command line could take)."""
        m = self.model
        return m if isinstance(m, str) else getattr(m, "name", None) or repr(m)


DISAGGREGATED = True  # serve serves prefill and decode on pools of their own


def parallel_kwargs(c: Candidate) -> dict:
    """The keywords of serve.deployment that place `c` on its GPUs (vLLM's names)."""
    return {"tensor_parallel_size": c.tensor_parallel_size,
            "pipeline_parallel_size": c.pipeline_parallel_size,
            "data_parallel_size": c.data_parallel_size,
            "enable_expert_parallel": c.enable_expert_parallel}


def parallel_flags(c: Candidate) -> list[str]:
    """The `perfcounter serve` flags of parallel_kwargs(c) (those other than the default)."""
    argv = []
    for name, value in parallel_kwargs(c).items():
        if value is True:
            argv.append(f"--{name}")
        elif value not in (False, 1):
            argv += [f"--{name}", str(value)]
    return argv


def _specs(c: Candidate) -> list:
    """The device specs `c` runs on (disaggregated: the prefill pool's, the decode pool's)."""
    dtype = resolve_precision(c.dtype)
    return [resolve_spec(d, dtype) for d in [c.device] + [c.decode_device] * c.disaggregated]


def execution(c: Candidate, job: Job) -> str | None:
    """The regime `c` is priced in (module doc): the job's, or None (each device its engine's
    own) where CUDA graphs were asked of a device that replays none."""
    if job.execution != "cudagraphs":
        return job.execution
    profile = engine_profile(job.engine)
    graphs = all(profile.regime(spec).value == "cudagraphs" for spec in _specs(c))
    return job.execution if graphs else None


def deployment_kwargs(c: Candidate, job: Job) -> dict:
    """serve.deployment's keywords for `c` (the same a serve command line gives)."""
    return {"engine": job.engine, "precision": c.dtype, "quantize": c.quantization,
            "kv_dtype": c.kv_cache_dtype,
            "gpu_memory_utilization": job.gpu_memory_utilization,
            "block_size": job.block_size, "max_num_batched_tokens": job.max_num_batched_tokens,
            "max_num_seqs": c.max_num_seqs, "execution": execution(c, job),
            "usd_per_hour": dict(job.prices).get(c.device), **parallel_kwargs(c)}


def workload(job: Job, block_size: int | None = None):
    """The search's workload as `perfcounter serve` draws it."""
    return synthetic(job.num_requests, job.prompt_length, job.max_new_tokens, qps=job.qps,
                     burstiness=job.burstiness, seed=job.seed, prefix_hit_rate=0.0,
                     block_size=job.block_size if block_size is None else block_size)


def pools(c: Candidate) -> tuple[str, str]:
    """A disaggregated candidate's --prefill_pool and --decode_pool."""
    return (f"{c.device},instances={c.num_prefill_instances},tp={c.tensor_parallel_size}",
            f"{c.decode_device},instances={c.num_decode_instances},"
            f"tp={c.tensor_parallel_size}")


def pools_price(c: Candidate, job: Job) -> float | None:
    """Both pools' GPUs an hour, each at its kind's price a GPU-hour (None: one unpriced)."""
    price = dict(job.prices)
    p, d = price.get(c.device), price.get(c.decode_device)
    if p is None or d is None:
        return None
    return c.tensor_parallel_size * (p * c.num_prefill_instances + d * c.num_decode_instances)


def evaluate(c: Candidate, job: Job) -> dict:
    """`c` served to the job's workload: FIGURES from serve's metrics and the per-GPU ones
    (module doc), as plain data. The run behind an aggregated candidate's figures is kept
    until the next evaluation in this process (`last_run`: dedupe.py reuses it)."""
    figures, result = served(c, job, workload(job))
    _LAST.clear()
    if result is not None:
        _LAST[(c, job)] = result
    return figures


_LAST: dict = {}  # (candidate, job) -> the ServeResult of the last evaluate() here


def last_run(c: Candidate, job: Job):
    """The ServeResult behind the last evaluate(c, job) in this process, or None (another
    was evaluated since, or `c` is disaggregated)."""
    return _LAST.get((c, job))


def served(c: Candidate, job: Job, w) -> tuple[dict, object]:
    """(figures, ServeResult or None for a disaggregated one) of `c` serving workload `w`
    (the job's, or a prefix of it: prune.py's short runs)."""
    if c.disaggregated:
        kwargs = deployment_kwargs(c, job)
        for name in ("usd_per_hour", *parallel_kwargs(c)):
            del kwargs[name]
        result = disaggregated(job.model, w, *pools(c), slo=job.slo, **kwargs)
        m, price = result.overall, pools_price(c, job)
        extra = {"usd_per_hour": price, "kv_transfer_bytes": m["kv_transfer_bytes"],
                 "kv_transfer_j": m["kv_transfer_j"],
                 "usd_per_1m_output_tokens": None if price is None else
                 price * m["duration"] / 3600 / m["total_output_tokens"] * 1e6}
        return _figures(c, m, extra), None
    dep = deployment(job.model, c.device, **deployment_kwargs(c, job))
    result = serve(dep, w, slo=job.slo)
    return aggregated_figures(c, dep, result.metrics), result


def aggregated_figures(c: Candidate, dep, m: dict) -> dict:
    """The figures of aggregated candidate `c` (deployment `dep`) from serve's metrics `m`."""
    extra = {"usd_per_hour": dep.usd_per_hour,  # every GPU of the deployment
             "kv_cache_tokens": dep.plan.kv_tokens}
    if not getattr(dep.table, "has_energy", True):  # the device gives no energy figures
        extra["j_per_output_token"] = extra["mean_power_w"] = None
    return _figures(c, m, extra)


def _figures(c: Candidate, m: dict, extra: dict) -> dict:
    out = {k: m.get(k) for k in FIGURES}
    gpus = c.num_gpus
    out["goodput_per_gpu"] = None if m.get("request_goodput") is None \
        else m["request_goodput"] / gpus
    out["output_throughput_per_gpu"] = m["output_throughput"] / gpus
    out.update(extra)
    for k, v in out.items():  # JSON holds no NaN: a figure without a value is None
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = None
    return out


def serve_command(c: Candidate, job: Job) -> str:
    """The `perfcounter serve` command line that serves `c` to the job's workload."""
    argv = ["perfcounter", "serve", "--model", job.model_name]
    if c.disaggregated:
        prefill, decode = pools(c)
        argv += ["--prefill_pool", prefill, "--decode_pool", decode]
    else:
        argv += ["--device_spec", c.device, *parallel_flags(c)]
    argv += ["--engine", job.engine, "--precision", c.dtype]
    if c.quantization is not None:
        argv += ["--quantize", c.quantization]
    if c.kv_cache_dtype is not None:
        argv += ["--kv_dtype", c.kv_cache_dtype]
    argv += ["--max_num_seqs", str(c.max_num_seqs),
             "--max_num_batched_tokens", str(job.max_num_batched_tokens),
             "--gpu_memory_utilization", f"{job.gpu_memory_utilization:g}",
             "--block_size", str(job.block_size)]
    regime = execution(c, job)
    if regime is not None:  # any of REGIMES, bound included (None: the engine's own there)
        argv += ["--execution", regime]
    argv += ["--qps", repr(job.qps), "--num_requests", str(job.num_requests),
             "--prompt_length", job.prompt_length, "--max_new_tokens", job.max_new_tokens,
             "--burstiness", repr(job.burstiness), "--seed", str(job.seed), "--slo", job.slo]
    price = dict(job.prices).get(c.device)
    if price is not None and not c.disaggregated:  # a GPU-hour (serve prices every GPU)
        argv += ["--usd_per_hour", repr(price)]
    elif price is not None and price == dict(job.prices).get(c.decode_device) \
            and any(spec.usd_per_hour != price for spec in _specs(c)):
        argv += ["--usd_per_hour", repr(price)]  # both pools at a price given, not listed
    return shlex.join(argv)
