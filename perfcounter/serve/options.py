"""deployment()'s settings in named groups, as vLLM groups its engine's (ModelConfig,
CacheConfig, SchedulerConfig, ParallelConfig inside one VllmConfig).

    options = DeploymentOptions.of(precision="bfloat16", max_num_seqs=64,
                                   tensor_parallel_size=2)
    options.model.precision, options.engine.max_num_seqs, options.parallel.tensor_parallel_size

`DeploymentOptions.of(**keywords)` takes deployment()'s flat keywords (vLLM's and serve's
flag names) and puts each in its group; a name no group has is refused in one line naming
it, with the closest valid names. Each group is plain data: the checks and the work are
deployment()'s steps (api.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from perfcounter._util import did_you_mean
from perfcounter.parallel.sharding import ParallelConfig


@dataclass(frozen=True)
class ModelOptions:
    """How the model's weights and KV cache are stored."""

    precision: str = "bfloat16"
    quantize: object = None  # a quantize.WeightScheme or a name parse_scheme takes
    kv_dtype: str | None = None  # "int8", "fp8" (None: the precision's floats)
    expert_load: object = None  # an ExpertLoad or what ExpertLoad.parse takes (None: balanced)
    gguf_type: str | None = None  # a llama.cpp file type ("Q4_K_M"): a preset stored so


@dataclass(frozen=True)
class CacheOptions:
    """The memory plan's limits (vLLM's CacheConfig)."""

    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    kv_scales: str | None = None  # "tensor", "token_head" (None: the engine's)
    check_fit: bool = True  # refuse a model that leaves no KV cache (False: --plan shows it)


@dataclass(frozen=True)
class EngineOptions:
    """The engine whose defaults it runs (engines.py) and what the caller sets of them
    (None: the engine's default on the device)."""

    engine: str = "vllm"
    execution: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    step_overhead_s: float | None = None
    request_overhead_s: float | None = None
    admission: str | None = None  # "recompute", "no_evict"
    seq_overhead_s: float | None = None  # host time a scheduled sequence a step
    async_scheduling: bool | None = None  # the host's work overlaps the GPU's previous step
    sampler: str | None = None  # "torch", "fused" (engines.SAMPLERS)
    sampling: object = None  # the requests' sampling parameters (sampler.parse_sampling);
    # None: the sampler is not priced

    def given(self, kv_scales: str | None) -> dict:
        """{setting: value or None}: what engine_settings fills from the profile."""
        return {"max_num_batched_tokens": self.max_num_batched_tokens,
                "max_num_seqs": self.max_num_seqs, "step_overhead_s": self.step_overhead_s,
                "request_overhead_s": self.request_overhead_s, "admission": self.admission,
                "kv_scales": kv_scales, "execution": self.execution,
                "seq_overhead_s": self.seq_overhead_s, "async_scheduling": self.async_scheduling,
                "sampler": self.sampler}


@dataclass(frozen=True)
class PlacementOptions:
    """A placement mapping and PlacementPricer's options (None mapping: one device)."""

    mapping: object = None
    host: object = None
    devices: dict | None = None
    allow_unmatched: bool = False
    default_device: str | None = None
    peak_fraction: object = None  # the bound only
    device_link: object = None
    interconnect: object = None

    def pricer_options(self) -> dict:
        """PlacementPricer's keywords besides the mapping, its args and its regime."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "mapping"}


@dataclass(frozen=True)
class DeploymentOptions:
    """Every setting of a deployment, by group."""

    model: ModelOptions = field(default_factory=ModelOptions)
    cache: CacheOptions = field(default_factory=CacheOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    usd_per_hour: float | None = None  # None: the devices' listed prices

    @classmethod
    def of(cls, **keywords) -> "DeploymentOptions":
        """The groups of deployment()'s flat keywords (the module doc); TypeError naming an
        unknown keyword."""
        kinds = {"model": ModelOptions, "cache": CacheOptions, "engine": EngineOptions,
                 "parallel": ParallelConfig, "placement": PlacementOptions}
        usd = {"usd_per_hour": keywords.pop("usd_per_hour", None)}
        groups = group_keywords(kinds, keywords, "deployment()", also=usd)
        return cls(**{group: kinds[group](**given) for group, given in groups.items()}, **usd)


def group_keywords(kinds: dict, keywords: dict, who: str, also: dict = ()) -> dict:
    """{group: {keyword: value}} of flat `keywords`, each in the group (kinds: {group: a
    dataclass}) that has a field of its name; TypeError naming a keyword no group has (nor
    `also`), with the closest valid names."""
    owner = {f.name: group for group, kind in kinds.items() for f in fields(kind)}
    out: dict = {group: {} for group in kinds}
    for name, value in keywords.items():
        if name not in owner:
            raise TypeError(f"{who} got an unexpected keyword {name!r}"
                            f"{did_you_mean(name, [*owner, *also], quote=True)}")
        out[owner[name]][name] = value
    return out


def keyword_names() -> tuple[str, ...]:
    """Every flat keyword DeploymentOptions.of takes."""
    kinds = (ModelOptions, CacheOptions, EngineOptions, ParallelConfig, PlacementOptions)
    return tuple(f.name for kind in kinds for f in fields(kind)) + ("usd_per_hour",)
