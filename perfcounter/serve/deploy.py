"""A deployment: what serves, resolved and checked in named steps (deployment()'s
docstring lists its settings; options.py groups them), with its step table and memory plan.

    dep = deployment("llama-3-8b", "h100-sxm", precision="bfloat16")
    dep.table, dep.plan, dep.engine, dep.usd_per_hour
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from perfcounter.counting.op_data import ExpertLoad
from perfcounter.generation.run import PRECISIONS  # noqa: F401  (the shared names, re-exported)
from perfcounter.models.args import ModelArgs
from perfcounter.parallel.sharding import ParallelConfig, check_links, shard
from perfcounter.pricing.links import gpus_per_node
from perfcounter.pricing.price import REGIMES, check_regime
from perfcounter.quant.gguf_types import GgufFile
from perfcounter.quant.quantize import WeightScheme
from perfcounter.serve.engines import EngineProfile, check_given, engine_profile, engine_settings
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import HfArgs
from perfcounter.serve.hf_shard import shard_hf, smallest_fit
from perfcounter.serve.kv_blocks import BlockCost
from perfcounter.serve.memory import MemoryPlan, memory_plan
from perfcounter.serve.metrics import check_prices
from perfcounter.serve.options import CacheOptions, DeploymentOptions
from perfcounter.serve.placement import PlacementPricer, placement_memory
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.pricing import RooflinePricer, step_table
from perfcounter.serve.resolve import (gguf_file, is_gguf, precision_label,  # noqa: F401
                                       resolve_expert_load, resolve_model, resolve_precision,
                                       resolve_quantization, resolve_spec)
from perfcounter.serve.replicas import check_sizes
from perfcounter.serve.sampler import SamplerCost, kernels, parse_sampling
from perfcounter.serve.scheduler import EngineConfig
from perfcounter.simulation.placement import Mapping

MAX_BLOCK = 65_536  # the most tokens a KV block holds


def check_execution(execution) -> str:
    """pricing's check_regime, its refusal a ServeError naming the flag."""
    try:
        return check_regime(execution)
    except ValueError:
        raise ServeError(f"--execution {execution!r}; valid: {', '.join(REGIMES)} "
                         "(bound: the least any regime takes)") from None


def pricer_for(spec, execution: str = "eager"):
    """The pricer of steps on `spec` in `execution` (REGIMES)."""
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
    execution: str = "eager"  # the regime its steps are priced in (REGIMES)
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


def deployment(model, device_spec="h100-sxm", *, options: DeploymentOptions | None = None,
               **keywords) -> Deployment:
    """A deployment (see the module doc) of `model` on `device_spec` (Python's default is
    h100-sxm, the device serving is asked about; the command line's is this machine's, as
    every command's), every limit checked before any work. Its settings come as `options`
    (a DeploymentOptions) or as flat keywords, each landing in its group (options.py):
    - model: precision; quantize (a quantize.WeightScheme or a name parse_scheme takes);
      kv_dtype ("int8", "fp8"); expert_load (a mixture of experts' routing, an ExpertLoad or
      what ExpertLoad.parse takes: "balanced", "4,2,1,1"; None: balanced); gguf_type (a
      preset's weights as stored in a llama.cpp file of that type, "Q4_K_M"; not with a
      mapping);
    - cache: gpu_memory_utilization, block_size, kv_scales ("tensor", "token_head"),
      check_fit (refuse a model that leaves no KV cache; False: --plan shows it);
    - engine: engine ("vllm", "trtllm", "sglang": engines.py) and what is None among
      execution, max_num_batched_tokens, max_num_seqs, step_overhead_s, request_overhead_s,
      seq_overhead_s, async_scheduling, sampler ("torch", "fused"), admission ("recompute",
      "no_evict") is the engine's default on the device (under a mapping: on its host, eager
      unless every device is a GPU); sampling: the requests' sampling parameters, whose
      sampler kernels a "torch" sampler prices (serve/sampler.py; None: not priced);
    - parallel: tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
      enable_expert_parallel, vLLM's (perfcounter/parallel): one rank's step table and
      memory, the price all GPUs';
    - placement: mapping, host and PlacementPricer's options (devices, allow_unmatched,
      default_device, peak_fraction: the bound only, device_link, interconnect);
    - usd_per_hour: one device's price (None: the devices' listed prices).
    The steps, each its own function: check, resolve the model and its storage, shard it,
    settle the engine's settings and the memory plan, count and price its step table."""
    if options is None:
        options = DeploymentOptions.of(**keywords)
    elif keywords:
        raise TypeError(f"deployment() takes options or keywords, not both (got "
                        f"{', '.join(sorted(keywords))})")
    profile = _check(options)
    rank = _resolve(model, options)
    if options.placement.mapping is not None:
        placed = _placed(rank, options, profile)
    else:
        placed = _on_device(rank, resolve_spec(device_spec, rank.dtype), options, profile)
    if options.cache.check_fit and not placed.plan.fits:
        line = no_fit_line(str(model), placed.name, placed.plan)
        if isinstance(rank.args, HfArgs) and options.placement.mapping is None:
            plan = placed.plan
            line += "; " + smallest_fit(rank.args, rank.dtype,
                                        plan.usable_bytes - plan.workspace_bytes,
                                        gpus_per_node(placed.spec))
        raise ServeError(line)
    table = placed.table or step_table(rank.args, rank.dtype,
                                       pricer_for(placed.spec, placed.settings["execution"]),
                                       load=rank.load, weights=rank.weights, kv=rank.kv)
    return _deployment(model, rank, placed, table, options, profile)


@dataclass(slots=True)
class _Rank:
    """deployment()'s model resolved: one rank's args, its dtype and storage, its routing."""

    args: ModelArgs
    dtype: torch.dtype
    weights: object
    kv: str | None
    load: ExpertLoad | None
    parallel: ParallelConfig
    vocab: int  # the whole vocabulary (every rank samples the gathered logits)


@dataclass(slots=True)
class _Placed:
    """Where it runs: the memory device's spec, the engine's settings there, the memory
    plan, a placement's step table (None: count it once the plan fits), its name and the
    devices its price lists."""

    spec: object
    settings: dict
    sources: dict
    plan: MemoryPlan
    table: object
    name: str
    prices: list
    devices: list


def _check(options: DeploymentOptions) -> EngineProfile:
    """The settings checked before any work; the engine's profile."""
    cache, engine = options.cache, options.engine
    block = cache.block_size
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= MAX_BLOCK:
        raise ServeError(f"--block_size {block}: expected an integer in [1, {MAX_BLOCK:,}] "
                         "tokens a KV block")
    check_given(engine.given(cache.kv_scales))
    parse_sampling(engine.sampling)
    if engine.execution is not None:
        check_execution(engine.execution)
    profile = engine_profile(engine.engine)
    check_prices(options.usd_per_hour)
    p = options.parallel
    check_sizes(p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size)
    return profile


def _resolve(model, options: DeploymentOptions) -> _Rank:
    """The model, its precision and storage, its routing, and one rank's args (shard: bad
    parallel sizes refused here, before any counting)."""
    m, mapping = options.model, options.placement.mapping
    args = resolve_model(model)
    dtype = resolve_precision(m.precision)
    weights, kv = resolve_quantization(m.quantize, m.kv_dtype, args, dtype)
    if m.gguf_type is not None or is_gguf(model):
        weights = gguf_file(model, args, m.gguf_type, weights, mapping)
    load = resolve_expert_load(m.expert_load, args)
    p = options.parallel
    if isinstance(args, HfArgs):
        vocab = args.vocab_size
        parallel, args = shard_hf(args, str(model), p, mapping is not None)
        return _Rank(args, dtype, weights, kv, load, parallel, vocab)
    parallel, sharded = shard(
        args, str(model), tensor_parallel_size=p.tensor_parallel_size,
        pipeline_parallel_size=p.pipeline_parallel_size, data_parallel_size=p.data_parallel_size,
        enable_expert_parallel=p.enable_expert_parallel, mapping=mapping is not None,
        gguf=isinstance(weights, GgufFile), expert_load=load is not None)
    return _Rank(sharded, dtype, weights, kv, load, parallel, args.vocab_size)


def _placed(rank: _Rank, options: DeploymentOptions, profile: EngineProfile) -> _Placed:
    """Under a mapping: the engine's settings on its host (eager unless every device is a
    GPU), its step table counted (placement_memory reads it), each device's memory."""
    place = options.placement
    pricer = PlacementPricer(place.mapping, rank.args,
                             execution=options.engine.execution or "eager",
                             **place.pricer_options())
    every = [pricer.host, *(d.spec for d in pricer.devices.values())]
    at = pricer.host if all(profile.regime(s).value == "cudagraphs" for s in every) \
        else next(s for s in every if profile.regime(s).value != "cudagraphs")
    settings, sources = engine_settings(profile, at, options.engine.given(options.cache.kv_scales))
    pricer = pricer.regime(settings["execution"])
    table = step_table(rank.args, rank.dtype, pricer, load=rank.load, weights=rank.weights,
                       kv=rank.kv)
    plan, devices = placement_memory(table, rank.dtype, **_fit_options(settings, options.cache))
    prices = [(pricer.devices[d.device], d.device) for d in devices]
    return _Placed(pricer.host, settings, sources, plan, table,
                   f"placement {mapping_name(place.mapping)}", prices, devices)


def _on_device(rank: _Rank, spec, options: DeploymentOptions,
               profile: EngineProfile) -> _Placed:
    """On one device (each rank's): its links checked, the engine's settings there, one
    rank's memory plan; its step table is counted once the plan fits."""
    check_links(spec, rank.parallel)
    given = options.engine.given(options.cache.kv_scales)
    settings, sources = engine_settings(profile, spec, given)
    plan = memory_plan(rank.args, rank.dtype, spec, **_fit_options(settings, options.cache),
                       weights=rank.weights, kv=rank.kv, kv_scales=settings["kv_scales"])
    return _Placed(spec, settings, sources, plan, None, spec.name, [(spec, spec.name)], [])


def _deployment(model, rank: _Rank, placed: _Placed, table, options: DeploymentOptions,
                profile: EngineProfile) -> Deployment:
    """The Deployment: its price (one device's x every GPU), name and engine limits."""
    usd_per_hour, source = options.usd_per_hour, "--usd_per_hour"
    if usd_per_hour is None:
        usd_per_hour, source = listed_price(placed.prices)
    name, parallel, settings = placed.name, rank.parallel, placed.settings
    if parallel.gpus > 1:  # one device's price x every GPU
        usd_per_hour = None if usd_per_hour is None else usd_per_hour * parallel.gpus
        name = f"{parallel.gpus} x {name} ({parallel.label()})"
    engine_cfg = EngineConfig(placed.plan.kv_blocks, settings["max_num_batched_tokens"],
                              settings["max_num_seqs"], options.cache.block_size,
                              settings["step_overhead_s"], settings["admission"],
                              settings["request_overhead_s"], settings["seq_overhead_s"],
                              settings["async_scheduling"], _sampler(rank, placed, options),
                              _block_cost(rank, settings, options.cache.block_size))
    model_name = model if isinstance(model, str) else type(model).__name__
    return Deployment(name, rank.args, str(model_name), rank.dtype, placed.spec, table,
                      placed.plan, engine_cfg, usd_per_hour, source,
                      execution=settings["execution"], devices=placed.devices,
                      weights=rank.weights, kv_dtype=rank.kv, expert_load=rank.load,
                      parallel=parallel, profile=profile, settings=settings,
                      sources=placed.sources)


def _sampler(rank: _Rank, placed: _Placed, options: DeploymentOptions):
    """The sampler's cost a step (scheduler.EngineConfig.sampler): the requests' `sampling`
    kernels on the memory device, where the engine samples with PyTorch ops; else None (and
    under a mapping, whose devices' steps placement.py prices: not priced)."""
    sampling = parse_sampling(options.engine.sampling)
    if sampling is None or placed.settings["sampler"] != "torch" \
            or options.placement.mapping is not None:
        return None
    return SamplerCost(placed.spec, rank.vocab, kernels(sampling))


def _block_cost(rank: _Rank, settings: dict, block_size: int):
    """How many KV blocks a sequence holds (scheduler.EngineConfig.block_cost): a
    transformers model's windowed layers' blocks before their window freed where the engine
    frees them (its windowed_kv), else None (every layer holds every token)."""
    if not isinstance(rank.args, HfArgs) or settings["windowed_kv"] != "freed":
        return None
    return BlockCost.of(rank.args.rank_config(), block_size)


def _fit_options(settings: dict, cache: CacheOptions) -> dict:
    return {"gpu_memory_utilization": cache.gpu_memory_utilization,
            "block_size": cache.block_size,
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


def no_fit_line(model: str, where: str, plan: MemoryPlan) -> str:
    return (f"{model} does not fit on {where}: weights {plan.weight_bytes / 1e9:.2f} GB + "
            f"workspace {plan.workspace_bytes / 1e9:.2f} GB leave no KV cache in "
            f"{plan.usable_bytes / 1e9:.2f} GB usable")
