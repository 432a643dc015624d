"""The deployments a search tries: one record each, in vLLM's field names, and their enumeration.

A candidate is a model served on GPUs of one kind of the pool (`device`), or, disaggregated,
prefilled on instances of one kind and decoded on instances of another (or the same):

    dtype x quantization x kv_cache_dtype             (weights and KV cache as stored)
      x tensor_parallel_size x pipeline_parallel_size x data_parallel_size
      x enable_expert_parallel (a mixture of experts with TP x DP > 1)
      x aggregated | disaggregated (prefill:decode instances)
      x max_num_seqs

Degrees are powers of two (or the sizes asked); TP one that shards the model
(parallel/sharding.py: it divides the heads and the intermediate size, and divides or is a
multiple of the KV heads) and no larger than a node (8 GPUs: one NVLink domain); PP across
nodes, as vLLM's documentation advises (tensor parallelism within a node, pipeline
parallelism across nodes): up to the kind's count / 8 and the layers (1 on one node; asked
with --pipeline_parallel_size, any that fits); EP only where TP x DP divides the experts;
TP x PP x DP GPUs of a kind at most as many as the pool holds (a disaggregated candidate:
TP x (P + D), its pools' instances TP GPUs each). A device without a link between its GPUs
(pricing/collectives.py) runs one-GPU instances only; fp8 weights need a device with an fp8
peak. What can matter is enumerated, and the rest bounded before any work: a deployment never
needs more replicas than the workload has requests (one replica serves a request, the others
idle), so DP and the P and D instances go up to `Space.max_replicas` (the requests; sizes
asked are kept as asked); a pool of thousands of GPUs then enumerates what a pool of about
twice the requests would, and a search of more than MAX_CANDIDATES candidates is refused
(PlanError naming the pool, the bound and the flags that narrow it) as its enumeration
reaches the bound, never built whole. Before anything is simulated, a candidate whose rank's
weights and workspace leave no KV cache (serve/memory.py's plan of the rank's args,
parallel/sharding.py) is left out, and counted as such; so is one whose rank the weight
scheme cannot store (an int4 group larger than a sharded linear's inputs), its reason kept.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields

import torch

from perfcounter.models.args import ModelArgs
from perfcounter.parallel.sharding import ParallelConfig, rank_args, valid_tensor_parallel_sizes
from perfcounter.serve import hf_model
from perfcounter.serve.hf_model import HfArgs
from perfcounter.serve.hf_shard import shard_hf
from perfcounter.plan.pool import DeviceKind, PlanError
from perfcounter.pricing.collectives import LinkError, check_link
from perfcounter.pricing.links import GPUS_PER_NODE
from perfcounter.serve.api import resolve_quantization
from perfcounter.serve.memory import memory_plan

QUANTIZATIONS = (None, "fp8", "int8", "int4-128")  # quantize.parse_scheme's names
INT4_GROUPS = (128, 64, 32)  # the default int4: the largest group dividing every linear
KV_CACHE_DTYPES = (None, "fp8")  # None: the precision ("auto" in vLLM)
MAX_NUM_SEQS = (16, 32, 64, 128, 256)
MAX_CANDIDATES = 4096  # a search's candidates, each served to the workload (~0.2 CPU-s each)


@dataclass(frozen=True)
class Candidate:
    """One deployment to simulate; the fields as vLLM names its engine arguments."""

    device: str  # the pool's kind it runs on (disaggregated: the prefill instances')
    dtype: str
    quantization: str | None
    kv_cache_dtype: str | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool
    max_num_seqs: int
    disaggregated: bool = False
    decode_device: str | None = None  # disaggregated: the decode instances' kind
    num_prefill_instances: int = 0  # disaggregated: P of P:D
    num_decode_instances: int = 0  # disaggregated: D of P:D

    @property
    def gpus_per_instance(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_gpus(self) -> int:
        if self.disaggregated:
            return self.gpus_per_instance * (self.num_prefill_instances +
                                             self.num_decode_instances)
        return self.gpus_per_instance * self.data_parallel_size

    def to_dict(self) -> dict:
        return {**asdict(self), "num_gpus": self.num_gpus}

    @classmethod
    def from_dict(cls, d: dict) -> "Candidate":
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Space:
    """What a search enumerates (module doc). parallel: degrees above 1 (TP, PP, DP, EP);
    disaggregated: prefill and decode pools beside the aggregated deployments; the sizes:
    those to try instead of the powers of two (None: every power of two that fits);
    max_replicas: the most replicas (DP, P, D) enumerated, the workload's requests (None: as
    many as the pool holds)."""

    quantizations: tuple = QUANTIZATIONS
    kv_cache_dtypes: tuple = KV_CACHE_DTYPES
    max_num_seqs: tuple = MAX_NUM_SEQS
    parallel: bool = True
    disaggregated: bool = True
    tensor_parallel_sizes: tuple | None = None
    pipeline_parallel_sizes: tuple | None = None
    data_parallel_sizes: tuple | None = None
    max_replicas: int | None = None


def default_quantizations(args: ModelArgs, dtype: torch.dtype) -> tuple:
    """QUANTIZATIONS, int4 at the largest of INT4_GROUPS whose group divides every linear's
    in_features (none of them: no int4)."""
    if isinstance(args, HfArgs):  # priced as its checkpoint stores it (serve/hf_stored.py)
        return (None,)
    for group in INT4_GROUPS:
        try:
            resolve_quantization(f"int4-{group}", None, args, dtype)
        except ValueError:
            continue
        return (*QUANTIZATIONS[:-1], f"int4-{group}")
    return QUANTIZATIONS[:-1]


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit` (included when it is one)."""
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def has_fp8(spec) -> bool:
    return torch.float8_e4m3fn in getattr(spec, "flops_by_dtype", {})


def linked(spec) -> bool:
    """Whether `spec`'s GPUs have a link to run collectives over."""
    try:
        check_link(spec, 2)
    except LinkError:
        return False
    return True


def _sizes(given, limit: int) -> list[int]:
    """The sizes given (those up to `limit`), else the powers of two up to it."""
    return powers_of_two(limit) if given is None else [n for n in given if n <= limit]


def shards(args: ModelArgs, gpus: int, parallel: bool,
           space: Space = Space()) -> list[tuple[int, int]]:
    """(TP, PP) pairs of one instance on at most `gpus` GPUs (module doc)."""
    if not parallel:
        return [(1, 1)] if 1 in (space.tensor_parallel_sizes or (1,)) \
            and 1 in (space.pipeline_parallel_sizes or (1,)) else []
    valid = set(tensor_parallel_sizes(args))
    tps, pps = space.tensor_parallel_sizes, space.pipeline_parallel_sizes
    nodes = max(1, gpus // GPUS_PER_NODE)
    return [(tp, pp) for tp in _sizes(tps, gpus if tps else min(gpus, GPUS_PER_NODE))
            if tp in valid
            for pp in _sizes(pps, min(gpus // tp if pps else nodes, args.n_layer))
            if tp * pp <= gpus]


def tensor_parallel_sizes(args) -> list[int]:
    """The TP sizes that shard `args` (perfcounter's model or a transformers one)."""
    if isinstance(args, HfArgs):
        return hf_model.valid_tensor_parallel_sizes(args)
    return valid_tensor_parallel_sizes(args)


def enumerate_candidates(args: ModelArgs, kinds: list[DeviceKind], dtype: str,
                         space: Space = Space()) -> list[Candidate]:
    """Every candidate of the module doc on the pool `kinds`, in a fixed order; PlanError
    before the list holds more than MAX_CANDIDATES."""
    out = list(itertools.islice(_candidates(args, kinds, dtype, space), MAX_CANDIDATES + 1))
    if len(out) > MAX_CANDIDATES:
        pool = ",".join(f"{k.name}:{k.count}" for k in kinds)
        raise PlanError(f"--devices {pool}: more than {MAX_CANDIDATES:,} candidates to simulate "
                        f"(at most {MAX_CANDIDATES:,} a search); narrow the space with the sizes "
                        "to try (--tensor_parallel_size, --pipeline_parallel_size, "
                        "--data_parallel_size), --quantize, --kv_dtype, --max_num_seqs"
                        + (", --aggregated_only" if space.disaggregated else "")
                        + (" or fewer --num_requests (replicas up to the requests)"
                           if space.max_replicas is not None else ""))
    return out


def _replicas(limit: int, space: Space) -> int:
    """`limit` replicas, or the workload's requests where fewer (module doc)."""
    return limit if space.max_replicas is None else min(limit, space.max_replicas)


def _candidates(args: ModelArgs, kinds: list[DeviceKind], dtype: str, space: Space):
    moe = bool(args.num_experts)
    for kind in kinds:
        quants = [q for q in space.quantizations if q != "fp8" or has_fp8(kind.spec)]
        parallel = space.parallel and linked(kind.spec)
        for q, kv, (tp, pp) in itertools.product(quants, space.kv_cache_dtypes,
                                                 shards(args, kind.count, parallel, space)):
            most = kind.count // (tp * pp) if parallel else 1
            dps = _sizes(space.data_parallel_sizes, most if space.data_parallel_sizes
                         else _replicas(most, space))
            for dp, seqs in itertools.product(dps, space.max_num_seqs):
                split = moe and tp * dp > 1 and args.num_experts % (tp * dp) == 0 and (
                    not isinstance(args, HfArgs)  # a rank's top-k of its own experts
                    or args.num_experts // (tp * dp) >= args.num_activated_experts)
                for ep in ((False, True) if split else (False,)):
                    yield Candidate(kind.name, dtype, q, kv, tp, pp, dp, ep, seqs)
    if space.disaggregated:
        yield from disaggregated_candidates(args, kinds, dtype, space)


def disaggregated_candidates(args: ModelArgs, kinds: list[DeviceKind], dtype: str,
                             space: Space):
    """Prefill on P instances of one kind, decode on D of another or the same: every P:D
    with P, D >= 1 the pool holds at the instance's TP (serve's pools are TP instances: no
    PP, no EP; the instances are the replicas), each at most Space.max_replicas; a
    generator, in a fixed order."""
    for pk, dk in itertools.product(kinds, kinds):
        quants = [q for q in space.quantizations
                  if q != "fp8" or (has_fp8(pk.spec) and has_fp8(dk.spec))]
        gpus = min(pk.count, dk.count) if pk.name != dk.name else pk.count
        parallel = space.parallel and linked(pk.spec) and linked(dk.spec)
        for q, kv, (tp, pp) in itertools.product(quants, space.kv_cache_dtypes,
                                                 shards(args, gpus, parallel, space)):
            if pp > 1:
                continue
            per = tp
            for p, d in _ratios(pk, dk, per, space.max_replicas):
                for seqs in space.max_num_seqs:
                    yield Candidate(pk.name, dtype, q, kv, tp, pp, 1, False, seqs, True,
                                    dk.name, p, d)


def _ratios(pk: DeviceKind, dk: DeviceKind, per: int, most: int | None = None):
    """(P, D) instances of `per` GPUs each: on one kind P + D fit its count, on two each
    fits its own; P and D at most `most` (None: no bound). A generator: a pool of 2^20
    GPUs yields its first splits at once."""
    if pk.name == dk.name:
        for n in powers_of_two(pk.count // per):
            low, high = 1, n - 1
            if most is not None:
                low, high = max(low, n - most), min(high, most)
            yield from ((p, n - p) for p in range(low, high + 1))
        return
    cap = (lambda n: n) if most is None else (lambda n: min(n, most))
    yield from itertools.product(powers_of_two(cap(pk.count // per)),
                                 powers_of_two(cap(dk.count // per)))


@dataclass(frozen=True)
class Fit:
    """A candidate's memory on one rank (serve/memory.py), or why it cannot run."""

    fits: bool
    weight_bytes: int | None
    kv_tokens: int
    error: str | None = None  # a rank the scheme cannot store (an int4 group too large)


def memory_fit(args: ModelArgs, dtype: torch.dtype, c: Candidate, spec, *, cache: dict,
               **options) -> Fit:
    """The memory plan of `c`'s rank (its sharded args) on `spec` (options: memory_plan's),
    cached in `cache` by what the plan depends on."""
    ep = c.enable_expert_parallel and c.tensor_parallel_size * c.data_parallel_size > 1
    key = (spec.name, c.quantization, c.kv_cache_dtype, c.tensor_parallel_size,
           c.pipeline_parallel_size, c.data_parallel_size if ep else 1, ep, c.max_num_seqs)
    fit = cache.get(key)
    if fit is None:
        weights, kv = resolve_quantization(c.quantization, c.kv_cache_dtype)
        parallel = ParallelConfig(c.tensor_parallel_size, c.pipeline_parallel_size,
                                  c.data_parallel_size, c.enable_expert_parallel)
        try:  # a transformers model's rank as serve shards it (experts, stages)
            rank = shard_hf(args, args.name, parallel)[1] if isinstance(args, HfArgs) \
                else rank_args(args, parallel)
            plan = memory_plan(rank, dtype, spec, max_num_seqs=c.max_num_seqs, weights=weights,
                               kv=kv, **options)
        except ValueError as e:  # QuantizeError: the rank's linears refuse the scheme
            fit = cache[key] = Fit(False, None, 0, f"a rank of TP {c.tensor_parallel_size}: {e}")
        else:
            fit = cache[key] = Fit(plan.fits, plan.weight_bytes, plan.kv_tokens)
    return fit
