"""plan()'s settings in named groups (as serve/options.py groups deployment()'s):

    options = PlanOptions.of(slo="ttft=1s,tpot=50ms", qps=4, max_num_seqs=(64, 256))
    options.workload.qps, options.target.slo, options.space.max_num_seqs

`PlanOptions.of(**keywords)` takes plan()'s flat keywords (the command line's flag names)
and puts each in its group; a name no group has is refused in one line naming it, with
the closest valid names; `slo` and `qps` are required, as on the command line. The checks
are plan()'s (search.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfcounter.plan.candidates import KV_CACHE_DTYPES, MAX_NUM_SEQS
from perfcounter.serve.options import group_keywords


@dataclass(frozen=True)
class PlanWorkload:
    """The workload every candidate serves (serve's flags; one rate)."""

    qps: float
    num_requests: int = 200
    prompt_length: object = "512"
    max_new_tokens: object = "128"
    burstiness: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class PlanTarget:
    """What a candidate must meet: the SLO, for this fraction of its requests."""

    slo: object
    slo_attainment: float = 0.9


@dataclass(frozen=True)
class PlanEngine:
    """The engine every candidate runs, and its limits."""

    precision: str = "bfloat16"
    execution: str = "cudagraphs"
    engine: str = "vllm"
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    usd_per_hour: float | None = None  # one device's price (None: the listed ones)


@dataclass(frozen=True)
class PlanSpace:
    """What is tried: weight schemes (None: candidates.default_quantizations), KV dtypes,
    max_num_seqs, the parallel sizes (None: candidates.py's powers of two), and prefill and
    decode pools beside the aggregated deployments."""

    quantizations: object = None
    kv_cache_dtypes: tuple = KV_CACHE_DTYPES
    max_num_seqs: tuple = MAX_NUM_SEQS
    tensor_parallel_size: object = None
    pipeline_parallel_size: object = None
    data_parallel_size: object = None
    disaggregated: bool = True


@dataclass(frozen=True)
class PlanBackend:
    """Where the candidates are simulated (execute.py), and whether every one that fits is
    (exhaustive) or only those that can still matter (prune.py)."""

    backend: str = "processes"
    workers: int | None = None
    address: str | None = None
    exhaustive: bool = False


@dataclass(frozen=True)
class PlanOptions:
    """Every setting of a search, by group."""

    workload: PlanWorkload
    target: PlanTarget
    engine: PlanEngine = field(default_factory=PlanEngine)
    space: PlanSpace = field(default_factory=PlanSpace)
    backend: PlanBackend = field(default_factory=PlanBackend)

    @classmethod
    def of(cls, **keywords) -> "PlanOptions":
        """The groups of plan()'s flat keywords (the module doc); TypeError naming an
        unknown or a missing keyword."""
        kinds = {"workload": PlanWorkload, "target": PlanTarget, "engine": PlanEngine,
                 "space": PlanSpace, "backend": PlanBackend}
        for required in ("slo", "qps"):
            if required not in keywords:
                raise TypeError(f"plan() needs the keyword {required!r}")
        groups = group_keywords(kinds, keywords, "plan()")
        return cls(**{group: kinds[group](**given) for group, given in groups.items()})
