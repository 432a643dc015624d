"""serve's Python face: a deployment, a served workload, a QPS sweep, the highest QPS under an SLO.

    from perfcounter.serve import deployment, serve, synthetic
    dep = deployment("llama-3-8b", "h100-sxm", precision="bfloat16")
    result = serve(dep, synthetic(1000, 512, 128, qps=10, seed=0), slo="ttft=200ms,tpot=50ms")
    result.metrics["p99_ttft_ms"], result.to_dict()

A deployment is a model (a preset, ModelArgs or a config.json), a precision (the
activations' dtype; `quantize`: the linears' weights stored as any scheme
quantize.parse_scheme accepts, int8, int4-G, ...; `kv_dtype`: the KV cache int8 or fp8
with its scales), a device
spec (its memory holds weights, workspace and the KV cache), the execution regime its
steps are priced in (`execution`: "eager", "compiled" or "cudagraphs", perfcounter's
prediction (predicted.py); "bound": the roofline bound; a placement alike, each device's
share on that device, placement.py; None: the engine profile's regime on the device),
optionally a placement mapping that prices the steps (`perfcounter.simulate`), and the
engine (`engine`: a profile of engines.py, whose defaults the limits given override). Its
step table
is built once per (model, precision, device or mapping, regime) and cached
(pricing.step_table), so sweeps and searches re-use it; `serve(..., execution=...)`
re-prices a deployment in another regime from the same counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from perfcounter.counting.op_data import ExpertLoad
from perfcounter.generation.run import PRECISIONS  # noqa: F401  (the shared names, re-exported)
from perfcounter.models.args import ModelArgs
from perfcounter.parallel.disaggregated import Pool
from perfcounter.parallel.disaggregated import simulate as simulate_pools
from perfcounter.parallel.replicas import simulate as simulate_parallel
from perfcounter.parallel.sharding import ParallelConfig, check_links, shard
from perfcounter.pricing.links import pool_end
from perfcounter.pricing.price import REGIMES, check_regime
from perfcounter.quant.gguf_types import GgufFile
from perfcounter.quant.quantize import WeightScheme
from perfcounter.serve.engines import EngineProfile, check_given, engine_profile, engine_settings
from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import MemoryPlan, kv_bytes_per_token, memory_plan
from perfcounter.serve.metrics import metrics, parse_slo
from perfcounter.serve.placement import PlacementPricer, placement_memory
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.pricing import RooflinePricer, step_table
from perfcounter.serve.resolve import (gguf_file, is_gguf, precision_label,  # noqa: F401
                                       resolve_expert_load, resolve_model, resolve_precision,
                                       resolve_quantization, resolve_spec)
from perfcounter.serve.scheduler import EngineConfig, Run, simulate_engine
from perfcounter.serve.search import PROBE_REQUESTS, Search
from perfcounter.serve.search import find_max_qps as _search
from perfcounter.serve.workload import Workload, check_fits_model
from perfcounter.simulation.placement import Mapping

MAX_BLOCK = 65_536  # the most tokens a KV block holds
MAX_RATES = 100  # rates one --qps list or range may hold


def check_execution(execution) -> str:
    """pricing's check_regime, its refusal a ServeError naming the flag."""
    try:
        return check_regime(execution)
    except ValueError:
        raise ServeError(f"--execution {execution!r}; valid: {', '.join(REGIMES)} "
                         "(bound: the least any regime takes)") from None


def pricer_for(spec, execution: str = "eager"):
    """The pricer of steps on `spec` in `execution` (EXECUTIONS)."""
    if check_execution(execution) == "bound":
        return RooflinePricer(spec)
    return PredictionPricer(spec, execution)


@dataclass
class Deployment:
    """What serves: model, precision, memory device, step table, memory plan, engine limits."""

    name: str
    args: ModelArgs
    model_name: str
    dtype: torch.dtype
    spec: object
    table: object  # pricing.PricedTable (the bound) or predicted.PredictedTable
    plan: MemoryPlan
    engine: EngineConfig
    usd_per_hour: float | None = None
    usd_source: str | None = None
    notes: list = field(default_factory=list)
    execution: str = "eager"  # the regime its steps are priced in (EXECUTIONS)
    devices: list = field(default_factory=list)  # a placement's placement.DeviceMemory rows
    weights: WeightScheme | None = None  # the linears' stored scheme (None: float)
    kv_dtype: str | None = None  # the KV cache's stored dtype, "int8" / "fp8" (None: float)
    expert_load: ExpertLoad | None = None  # a mixture of experts' routing (None: balanced)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # TP, PP, DP: args a rank's
    profile: EngineProfile | None = None  # the engine whose defaults it runs (engines.py)
    settings: dict = field(default_factory=dict)  # what the profile set: {name: value}
    sources: dict = field(default_factory=dict)  # {name: the profile's source, or the flag}

    @property
    def precision(self) -> str:
        return precision_label(self.dtype, self.weights, self.kv_dtype)

    @property
    def engine_line(self) -> str:
        """The first line of serve's output: the profile and regime that priced the run."""
        if self.profile is None:
            return f"engine: none; steps priced {self.table.label}"
        how = "given" if self.sources.get("execution", "").startswith("--") else \
            "the engine's default here"
        return (f"engine: {self.profile.name} ({self.profile.version} defaults), "
                f"{self.execution} ({how}); steps priced {self.table.label}")


def deployment(model, device_spec="h100-sxm", *, mapping=None, precision="bfloat16",
               gpu_memory_utilization: float = 0.9, block_size: int = 16,
               max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
               step_overhead_s: float | None = None, usd_per_hour: float | None = None,
               execution: str | None = None, host=None, check_fit: bool = True,
               quantize=None, kv_dtype=None, expert_load=None, gguf_type=None,
               engine="vllm", request_overhead_s: float | None = None,
               admission: str | None = None, kv_scales: str | None = None,
               tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
               data_parallel_size: int = 1, enable_expert_parallel: bool = False,
               **mapping_options) -> Deployment:
    """A deployment (see the module doc); every limit checked here, before any work;
    quantize: a quantize.WeightScheme or a name parse_scheme takes; kv_dtype: "int8", "fp8";
    check_fit: refuse a model that leaves no KV cache (False: --plan shows it).
    expert_load: a mixture of experts' routing, an ExpertLoad or what ExpertLoad.parse takes
    ("balanced", "4,2,1,1": weights per expert; None: balanced). gguf_type: a preset's weights
    as stored in a llama.cpp file of that type ("Q4_K_M"; quant/gguf_types.py), one layer of
    each kind counted (steps.count_table); not with a mapping.
    engine: "vllm", "trtllm" or "sglang" (engines.py): what is None among execution,
    max_num_batched_tokens, max_num_seqs, step_overhead_s, request_overhead_s, admission
    ("recompute", "no_evict") and kv_scales ("tensor", "token_head") is the engine's
    default on the device (under a mapping: on its host, eager unless every device is a
    GPU). mapping_options: PlacementPricer's (devices, allow_unmatched, default_device,
    peak_fraction: the bound only, device_link, interconnect).
    tensor_parallel_size, pipeline_parallel_size, data_parallel_size, enable_expert_parallel:
    vLLM's (perfcounter/parallel): one rank's step table and memory, the price all GPUs'."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or \
            not 1 <= block_size <= MAX_BLOCK:
        raise ServeError(f"--block_size {block_size}: expected an integer in [1, {MAX_BLOCK:,}] "
                         "tokens a KV block")
    given = {"max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
             "step_overhead_s": step_overhead_s, "request_overhead_s": request_overhead_s,
             "admission": admission, "kv_scales": kv_scales, "execution": execution}
    check_given(given)
    if execution is not None:
        check_execution(execution)
    profile = engine_profile(engine)
    if usd_per_hour is not None and not (usd_per_hour >= 0 and math.isfinite(usd_per_hour)):
        raise ServeError(f"--usd_per_hour {usd_per_hour}: expected a price >= 0")
    args = resolve_model(model)
    dtype = resolve_precision(precision)
    weights, kv = resolve_quantization(quantize, kv_dtype, args, dtype)
    if gguf_type is not None or is_gguf(model):
        weights = gguf_file(model, args, gguf_type, weights, mapping)
    load = resolve_expert_load(expert_load, args)
    parallel, args = shard(  # one rank's args (perfcounter/parallel); bad sizes refused here
        args, str(model), tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size,
        enable_expert_parallel=enable_expert_parallel, mapping=mapping is not None,
        gguf=isinstance(weights, GgufFile), expert_load=load is not None)
    stored = {"weights": weights, "kv": kv}
    devices: list = []
    if mapping is not None:
        pricer = PlacementPricer(mapping, args, execution=execution or "eager", host=host,
                                 **mapping_options)
        every = [pricer.host, *(d.spec for d in pricer.devices.values())]
        at = pricer.host if all(profile.regime(s).value == "cudagraphs" for s in every) \
            else next(s for s in every if profile.regime(s).value != "cudagraphs")
        settings, sources = engine_settings(profile, at, given)
        pricer = pricer.regime(settings["execution"])
        fit_options = _fit_options(settings, gpu_memory_utilization, block_size)
        table = step_table(args, dtype, pricer, load=load, **stored)
        plan, devices = placement_memory(table, dtype, **fit_options)
        spec, name = pricer.host, f"placement {mapping_name(mapping)}"
        prices = [(pricer.devices[d.device], d.device) for d in devices]
    else:
        spec = resolve_spec(device_spec, dtype)
        check_links(spec, parallel)
        settings, sources = engine_settings(profile, spec, given)
        fit_options = _fit_options(settings, gpu_memory_utilization, block_size)
        plan = memory_plan(args, dtype, spec, **fit_options, **stored,
                           kv_scales=settings["kv_scales"])
        table, name, prices = None, spec.name, [(spec, spec.name)]
    if check_fit and not plan.fits:
        raise ServeError(_no_fit(str(model), name, plan))
    if table is None:
        table = step_table(args, dtype, pricer_for(spec, settings["execution"]), load=load,
                           **stored)
    source = "--usd_per_hour" if usd_per_hour is not None else None
    if usd_per_hour is None:
        usd_per_hour, source = listed_price(prices)
    if parallel.gpus > 1:  # one device's price x every GPU
        usd_per_hour = None if usd_per_hour is None else usd_per_hour * parallel.gpus
        name = f"{parallel.gpus} x {name} ({parallel.label()})"
    engine_cfg = EngineConfig(plan.kv_blocks, settings["max_num_batched_tokens"],
                              settings["max_num_seqs"], block_size, settings["step_overhead_s"],
                              settings["admission"], settings["request_overhead_s"])
    model_name = model if isinstance(model, str) else type(model).__name__
    return Deployment(name, args, str(model_name), dtype, spec, table, plan, engine_cfg,
                      usd_per_hour, source, execution=settings["execution"], devices=devices,
                      weights=weights, kv_dtype=kv, expert_load=load, parallel=parallel,
                      profile=profile, settings=settings, sources=sources)


def _fit_options(settings: dict, gpu_memory_utilization: float, block_size: int) -> dict:
    return {"gpu_memory_utilization": gpu_memory_utilization, "block_size": block_size,
            "max_num_batched_tokens": settings["max_num_batched_tokens"],
            "max_num_seqs": settings["max_num_seqs"]}


def mapping_name(mapping) -> str:
    """A mapping as a deployment's name: its file's name, else its entries."""
    if isinstance(mapping, (str, Path)) and "\n" not in str(mapping) \
            and not str(mapping).lstrip().startswith("{"):
        return Path(mapping).name
    entries = Mapping.load(mapping).to_dict()
    return "{" + ", ".join(f"{k}: {v}" for k, v in entries.items()) + "}"


def listed_price(devices) -> tuple[float | None, str | None]:
    """The sum of the devices' `usd_per_hour` (x tp) and their sources; (None, None) when
    one of them lists no price. devices: (spec or placement Device, its name)."""
    total, sources = 0.0, []
    for dev, label in devices:
        spec, tp = getattr(dev, "spec", dev), getattr(dev, "tp", 1)
        price = getattr(spec, "usd_per_hour", None)
        if price is None:
            return None, None
        total += float(price) * tp
        source = (getattr(spec, "source", None) or {}).get("usd_per_hour")
        sources.append(f"{label}: {source}" if len(devices) > 1 else str(source))
    return total, "; ".join(sources)


def _no_fit(model: str, where: str, plan: MemoryPlan) -> str:
    return (f"{model} does not fit on {where}: weights {plan.weight_bytes / 1e9:.2f} GB + "
            f"workspace {plan.workspace_bytes / 1e9:.2f} GB leave no KV cache in "
            f"{plan.usable_bytes / 1e9:.2f} GB usable")


@dataclass
class ServeResult:
    """One workload served by one deployment: the metrics (plain data) and the run."""

    deployment: Deployment
    workload: Workload
    metrics: dict
    run: Run

    def to_dict(self) -> dict:
        dep = self.deployment
        return {"deployment": dep.name, "model": dep.model_name,
                "engine_profile": dep.profile.name if dep.profile else None,
                "engine_sources": dict(dep.sources),
                "precision": str(dep.dtype).replace("torch.", ""),
                "weights": dep.weights.name if dep.weights else None, "kv_dtype": dep.kv_dtype,
                "step_costs": dep.table.label, "execution": dep.execution,
                "expert_load": None if not dep.args.num_experts else
                str(dep.expert_load or "balanced"),
                "workload": self.workload.source,
                "num_requests": len(self.workload), "memory": dep.plan.to_dict(),
                "engine": vars(dep.engine) if hasattr(dep.engine, "__dict__") else
                {k: getattr(dep.engine, k) for k in dep.engine.__dataclass_fields__},
                "usd_per_hour": dep.usd_per_hour, "usd_per_hour_source": dep.usd_source,
                **self.metrics}


def serve(dep: Deployment, workload: Workload, *, slo=None, usd_per_kwh: float | None = None,
          execution: str | None = None) -> ServeResult:
    """Simulate `workload` on `dep` and measure it (metrics.py); `execution` (EXECUTIONS):
    price its steps in that regime instead of the deployment's (the same counts)."""
    if execution is not None and execution != dep.execution:
        pricer = dep.table.pricer.regime(check_execution(execution)) if dep.devices \
            else pricer_for(dep.spec, execution)
        dep = replace(dep, table=step_table(dep.args, dep.dtype, pricer, weights=dep.weights,
                                            kv=dep.kv_dtype, load=dep.expert_load),
                      execution=execution,
                      sources={**dep.sources, "execution": "--execution (given)"})
    if not dep.plan.fits:
        raise ServeError(_no_fit(dep.model_name, dep.name, dep.plan))
    if usd_per_kwh is not None and not (usd_per_kwh >= 0 and math.isfinite(usd_per_kwh)):
        raise ServeError(f"--usd_per_kwh {usd_per_kwh}: expected a price >= 0")
    check_fits_model(workload, dep.plan.max_model_len)
    slo = parse_slo(slo) if slo else None
    run = simulate_parallel(workload, dep, simulate_engine)  # DP replicas, PP streams
    m = metrics(run, slo=slo, open_loop=workload.concurrency is None,
                static_w=dep.table.static_w * dep.parallel.ranks, usd_per_hour=dep.usd_per_hour,
                usd_per_kwh=usd_per_kwh)
    return ServeResult(dep, workload, m, run)


def disaggregated(model, workload: Workload, prefill_pool, decode_pool, *, slo=None,
                  **kwargs):
    """Prefill and decode on pools of their own, "DEVICE[,instances=N][,tp=T]" each, the KV
    moving between them (perfcounter/parallel/disaggregated.py); kwargs: deployment()'s, for
    both pools. Pools and links checked before any step table is counted."""
    pools = (Pool.parse(prefill_pool, "--prefill_pool"), Pool.parse(decode_pool, "--decode_pool"))
    dtype = resolve_precision(kwargs.get("precision", "bfloat16"))
    for pool in pools:
        pool_end(resolve_spec(pool.device, dtype))
    deps = [deployment(model, p.device, **p.keywords(), **kwargs) for p in pools]
    check_fits_model(workload, min(d.plan.max_model_len for d in deps))
    kv = kv_bytes_per_token(resolve_model(model), deps[0].dtype, deps[0].kv_dtype)  # all ranks'
    return simulate_pools(
        workload, *deps, kv, pools=pools, slo=parse_slo(slo) if slo else None,
        simulate_run=lambda w, dep: simulate_parallel(w, dep, simulate_engine),
        metrics=lambda run, slo: metrics(run, slo=slo, open_loop=workload.concurrency is None))


def find_max_qps(dep: Deployment, make, slo, *, attainment: float = 0.9,
                 probe_requests: int = PROBE_REQUESTS) -> Search:
    """The highest rate whose workload `make(qps, at_least)` (at least `at_least` requests)
    meets `slo` for `attainment` of its requests in steady state (search.py states how)."""
    return _search(dep, make, slo, attainment=attainment, serve=serve,
                   probe_requests=probe_requests)


def qps_values(text) -> list[float]:
    """'1,2,5' or 'START:STOP:COUNT' (COUNT evenly spaced rates, both ends included)."""
    s = str(text).strip()
    try:
        if s.count(":") == 2:
            start, stop, count = s.split(":")
            count = int(count)
            if not 1 <= count <= MAX_RATES:
                values = None
            else:
                values = list(np.linspace(float(start), float(stop), count))
        else:
            values = [float(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise ServeError(f"--qps {s!r}: expected a rate, a list (1,2,5) or a range "
                         "START:STOP:COUNT") from None
    if values is None:
        raise ServeError(f"--qps {s}: COUNT {count}; expected 1 to {MAX_RATES} rates")
    if len(values) > MAX_RATES:
        raise ServeError(f"--qps {s}: {len(values):,} rates; at most {MAX_RATES}")
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ServeError(f"--qps {s!r}: every rate must be > 0 requests a second")
    return [float(v) for v in values]
