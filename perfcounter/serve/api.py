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
share on that device, placement.py), optionally a placement mapping that prices the steps
(`perfcounter.simulate`), and the engine's limits. Its step table
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
from perfcounter.devices import get_device_spec
from perfcounter.generation.config_only import gguf_config, resolve_config
from perfcounter.models.args import ModelArgs
from perfcounter.models.hf_checkpoint import model_args_from_hf
from perfcounter.models.loading import CheckpointError
from perfcounter.parallel.replicas import simulate as simulate_parallel
from perfcounter.parallel.sharding import ParallelConfig, check_links, shard
from perfcounter.quant.gguf_types import GgufFile, check_gguf_type
from perfcounter.quant.quantize import WeightScheme, parse_kv_dtype, parse_scheme
from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import MemoryPlan, memory_plan, weight_bytes
from perfcounter.serve.metrics import metrics, parse_slo
from perfcounter.serve.placement import PlacementPricer, placement_memory
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.pricing import RooflinePricer, step_table
from perfcounter.serve.scheduler import EngineConfig, Run, simulate_engine
from perfcounter.serve.workload import Workload, check_fits_model
from perfcounter.simulation.placement import Mapping

PRECISIONS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EXECUTIONS = ("eager", "compiled", "cudagraphs", "bound")  # bound: the roofline


def check_execution(execution) -> str:
    """execution itself when it is one of EXECUTIONS; else a ServeError naming them."""
    if execution not in EXECUTIONS:
        raise ServeError(f"execution {execution!r}; valid: {', '.join(EXECUTIONS)} "
                         "(bound: the roofline)")
    return execution


def pricer_for(spec, execution: str = "eager"):
    """The pricer of steps on `spec` in `execution` (EXECUTIONS)."""
    if check_execution(execution) == "bound":
        return RooflinePricer(spec)
    return PredictionPricer(spec, execution)


def resolve_model(model) -> ModelArgs:
    """ModelArgs from a preset name, ModelArgs, a config.json (ours or a Llama-like HF one) or
    a .gguf file's metadata."""
    try:
        resolved = gguf_config(model) if is_gguf(model) else resolve_config(model)
    except (KeyError, ValueError, OSError, CheckpointError) as e:
        raise ServeError(str(e).strip("'\"")) from None
    if isinstance(resolved, ModelArgs):
        return resolved
    try:
        return model_args_from_hf(resolved.to_dict(), str(model))
    except (KeyError, ValueError) as e:
        raise ServeError(f"{model}: serve prices perfcounter's model, which cannot hold this "
                         f"config ({e})") from None


def resolve_precision(precision) -> torch.dtype:
    if isinstance(precision, torch.dtype):
        return precision
    if precision not in PRECISIONS:
        raise ServeError(f"--precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def resolve_quantization(quantize=None, kv_dtype=None, args: ModelArgs | None = None,
                         dtype: torch.dtype = torch.bfloat16) -> tuple:
    """(WeightScheme or None, "int8" / "fp8" or None) from a scheme (or its name, as
    --quantize takes it) and a KV dtype name; with `args`, the scheme is also held to the
    model (int4's group size must divide every linear's in_features). ServeError else."""
    try:
        scheme = quantize if isinstance(quantize, WeightScheme) else parse_scheme(quantize)
        kv = parse_kv_dtype(kv_dtype)
        if scheme is not None and args is not None:
            weight_bytes(args, dtype, scheme)  # quantizes a one-layer fake model: refuses misfits
    except ValueError as e:  # QuantizeError
        raise ServeError(str(e)) from None
    return scheme, kv


def precision_label(dtype: torch.dtype, weights=None, kv: str | None = None) -> str:
    """'bfloat16', or 'bfloat16, weights int4-32, KV int8' when stored quantized."""
    parts = [str(dtype).replace("torch.", "")]
    if weights is not None:
        parts.append(f"weights {weights.name}")
    if kv is not None:
        parts.append(f"KV {kv}")
    return ", ".join(parts)


def resolve_spec(device_spec, dtype: torch.dtype):
    """A DeviceSpec as given, or the registry's entry of that name at `dtype`."""
    if not isinstance(device_spec, str):
        return device_spec
    try:
        return get_device_spec(device_spec, dtype=dtype)
    except (KeyError, ValueError) as e:
        raise ServeError(str(e).strip("'\"")) from None


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

    @property
    def precision(self) -> str:
        return precision_label(self.dtype, self.weights, self.kv_dtype)


def resolve_expert_load(value, args: ModelArgs) -> ExpertLoad | None:
    """`value` (ExpertLoad.parse's: None, "balanced", "4,2,1,1") checked against the model's
    experts before any work: one weight per expert, none above 1/k of the rows; None when
    balanced. A skewed load on a model without experts is refused (ServeError)."""
    try:
        load = ExpertLoad.parse(value)
        if load.shares is None:
            return None
        if not args.num_experts:
            raise ValueError(f"--expert_load {value}: this model has no experts (a dense "
                             "feed-forward); leave it out")
        load.expected_hit(1, args.num_experts, args.num_activated_experts)  # checks the shares
    except ValueError as e:
        raise ServeError(str(e).replace("expert_load", "--expert_load", 1)
                         if not str(e).startswith("--") else str(e)) from None
    return load


def deployment(model, device_spec="h100-sxm", *, mapping=None, precision="bfloat16",
               gpu_memory_utilization: float = 0.9, block_size: int = 16,
               max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
               step_overhead_s: float = 0.0, usd_per_hour: float | None = None,
               execution: str | None = None, host=None, check_fit: bool = True,
               quantize=None, kv_dtype=None, expert_load=None, gguf_type=None,
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
    execution: None is "eager", on a device and under a mapping alike. mapping_options:
    PlacementPricer's (devices, allow_unmatched, default_device, peak_fraction: the bound
    only, device_link, interconnect).
    tensor_parallel_size, pipeline_parallel_size, data_parallel_size, enable_expert_parallel:
    vLLM's (perfcounter/parallel): one rank's step table and memory, the price all GPUs'."""
    for name, value, least in (("--block_size", block_size, 1),
                               ("--max_num_batched_tokens", max_num_batched_tokens, 1),
                               ("--max_num_seqs", max_num_seqs, 1)):
        if not isinstance(value, int) or value < least:
            raise ServeError(f"{name} {value}: expected an integer >= {least}")
    if not (step_overhead_s >= 0 and math.isfinite(step_overhead_s)):
        raise ServeError(f"--step_overhead_ms {step_overhead_s * 1e3}: expected a time >= 0")
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
    fit_options = {"gpu_memory_utilization": gpu_memory_utilization, "block_size": block_size,
                   "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs}
    devices: list = []
    execution = check_execution("eager" if execution is None else execution)
    if mapping is not None:
        pricer = PlacementPricer(mapping, args, execution=execution, host=host,
                                 **mapping_options)
        table = step_table(args, dtype, pricer, load=load, **stored)
        plan, devices = placement_memory(table, dtype, **fit_options)
        spec, name = pricer.host, f"placement {mapping_name(mapping)}"
        prices = [(pricer.devices[d.device], d.device) for d in devices]
    else:
        spec = resolve_spec(device_spec, dtype)
        check_links(spec, parallel)
        plan = memory_plan(args, dtype, spec, **fit_options, **stored)
        table, name, prices = None, spec.name, [(spec, spec.name)]
    if check_fit and not plan.fits:
        raise ServeError(_no_fit(str(model), name, plan))
    if table is None:
        table = step_table(args, dtype, pricer_for(spec, execution), load=load, **stored)
    source = "--usd_per_hour" if usd_per_hour is not None else None
    if usd_per_hour is None:
        usd_per_hour, source = listed_price(prices)
    if parallel.gpus > 1:  # one device's price x every GPU
        usd_per_hour = None if usd_per_hour is None else usd_per_hour * parallel.gpus
        name = f"{parallel.gpus} x {name} ({parallel.label()})"
    engine = EngineConfig(plan.kv_blocks, max_num_batched_tokens, max_num_seqs, block_size,
                          step_overhead_s)
    model_name = model if isinstance(model, str) else type(model).__name__
    return Deployment(name, args, str(model_name), dtype, spec, table, plan, engine,
                      usd_per_hour, source, execution=execution, devices=devices,
                      weights=weights, kv_dtype=kv, expert_load=load, parallel=parallel)


def is_gguf(model) -> bool:
    return isinstance(model, (str, Path)) and str(model).endswith(".gguf")


def gguf_file(model, args: ModelArgs, gguf_type, scheme, mapping) -> GgufFile:
    """The weights of a .gguf `model` as its file stores them, or of `args` as stored in a
    llama.cpp file of `gguf_type`; ServeError (one line) for both at once, either beside a
    quantize scheme or a mapping (a placement's table repeats one layer on its devices, and
    a file's layers differ), a mixture of experts."""
    if is_gguf(model) and gguf_type is not None:
        raise ServeError("--gguf_type prices a preset as a file type; a .gguf model is a file "
                         "of its own types: drop --gguf_type")
    given = "--gguf_type" if gguf_type is not None else "a .gguf model"
    if mapping is not None:
        raise ServeError(f"{given} and --mapping: a placement's step table repeats one layer "
                         "on its devices, and a file's layers differ; give one of them")
    if scheme is not None and is_gguf(model):
        raise ServeError(f"--quantize {scheme.name} and a .gguf model: its weights are stored "
                         "as the file stores them; drop --quantize")
    if is_gguf(model) and args.num_experts:
        raise ServeError(f"{model}: a mixture of experts stored as a GGUF is not priced by "
                         "serve (its experts are no linears of ours); give its preset")
    try:
        if is_gguf(model):
            return GgufFile.of_file(model, args)
        return GgufFile.of_type(check_gguf_type(args, gguf_type, quantize=scheme), args)
    except ValueError as e:
        raise ServeError(str(e).replace("gguf_type", "--gguf_type", 1)
                         .replace("quantize", "--quantize", 1)) from None


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
                      execution=execution)
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


def meets(result: ServeResult, attainment: float) -> bool:
    m = result.metrics
    return not m["overloaded"] and (m.get("slo_met_fraction") or 0.0) >= attainment


def find_max_qps(dep: Deployment, make, slo, *, attainment: float = 0.9,
                 iterations: int = 10) -> tuple[float | None, list[ServeResult]]:
    """The highest rate whose workload `make(qps)` meets `slo` for `attainment` of its
    requests, not overloaded: bisection between 0 and the saturated throughput."""
    if not 0 < attainment <= 1:
        raise ServeError(f"--slo_attainment {attainment}: expected a fraction in (0, 1]")
    slo = parse_slo(slo)
    tried = []
    flood = serve(dep, make(1e9), slo=slo)  # every request at once: the most it serves
    tried.append(flood)
    hi = flood.metrics["request_throughput"] * 1.1
    lo, best = 0.0, None
    for _ in range(iterations):
        mid = (lo + hi) / 2
        result = serve(dep, make(mid), slo=slo)
        tried.append(result)
        if meets(result, attainment):
            lo, best = mid, mid
        else:
            hi = mid
    return best, tried


def qps_values(text) -> list[float]:
    """'1,2,5' or 'START:STOP:COUNT' (COUNT evenly spaced rates, both ends included)."""
    s = str(text).strip()
    try:
        if s.count(":") == 2:
            start, stop, count = s.split(":")
            values = list(np.linspace(float(start), float(stop), int(count)))
        else:
            values = [float(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise ServeError(f"--qps {s!r}: expected a rate, a list (1,2,5) or a range "
                         "START:STOP:COUNT") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ServeError(f"--qps {s!r}: every rate must be > 0 requests a second")
    return [float(v) for v in values]
