"""Bounds on a candidate's figures before it is simulated: the least any step of it takes, and
from that the least TTFT, TPOT and E2EL of each request, the most output tokens a second per
GPU and the most goodput per GPU it can reach. Each is a bound on the figures serve gives the
candidate, whatever its run; the search (prune.py) discards a candidate only where a bound
already shows it can be neither on the front nor the recommendation.

Why each is a bound:

- A step, in any regime. serve prices a step at its table's seconds (price.py) plus host time
  and the sampler's kernels, never less (scheduler.step_seconds: GPU + max(0, host - ...)).
  price.py's "bound" is at most every regime's price (pricing/bound.py; held on random steps
  by tests/test_bound_bounds.py) and at least the fewest bytes any regime moves over the
  highest bytes/s any group is priced at (bound_parts: max(compute, least / peak_b) + the
  collectives' and host link's seconds, each >= 0). Those fewest bytes (per op, matmuls and
  attention plus fused IO, or each storage once) each hold every weight the step's matmuls
  multiply by, once: a step of at least one token runs every layer and the head (of the last
  row of each sequence), so all the rank's stored weights but its embedding table, whose rows
  are gathered, not read whole (taken out at vocabulary x dim x 4 B, as much as any dtype it
  could be stored in; a head tied to it is taken out too: a bound only looser). The highest
  bytes/s: the spec's bandwidth x its largest stated efficiency (at least 1), the rate
  achievable.rate gives every class on a spec without measured curves or rows tables; a spec
  with them prices groups at measured rates (a warm cache's above the bandwidth) and gets no
  bound here (its candidates are simulated). The compulsory bytes are fitted within 1 %
  (serve/steps.py), hence SLACK. A pipeline's step is its stages' (replicas.StagedTable: PP x
  the rank's step + hops), so PP x the rank's.

      step_s = SLACK x PP x (rank's weight bytes - vocab x dim x 4) / (bandwidth x efficiency)

- A request of P prompt tokens (none cached in a search's workload) and O output tokens: a
  step holds at most max_num_batched_tokens (B) tokens, so its prompt takes ceil(P / B) steps
  and each later token one more step of its own (a token is emitted at the end of a step):

      TTFT >= ceil(P / B) x step_s     TPOT >= step_s (O > 1)
      E2EL >= (ceil(P / B) + O - 1) x step_s

  (the host's request and step overheads, >= 0, left out). Disaggregated: the prompt's steps
  on the prefill pool's rank, the O - 1 tokens on the decode pool's (after the KV move, >= 0).
  The median TPOT is then >= step_s (each request's is).
- The run ends no earlier than every request's arrival + its least E2EL, and a run's duration
  is from the first arrival to the last finish (metrics.py): duration >= D = max(arrival +
  E2EL bound) - min(arrival). So output tokens a second per GPU <= output tokens / D / GPUs,
  and goodput per GPU <= (requests whose bounds meet every SLO target) / D / GPUs (<= requests
  / D / GPUs); the share meeting the SLO is at most those requests / all: below
  --slo_attainment, never recommended.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perfcounter.models.args import ModelArgs
from perfcounter.pricing.achievable import DEFAULT_EFFICIENCY

SLACK = 0.98  # the compulsory bytes' fit is within 1 % (serve/steps.py): 2 % below it


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a candidate can reach at best (module doc): its least step, TPOT (ms; None: no
    request has a TPOT), the most output tokens/s and goodput per GPU, whether its bounds
    let the SLO be met by --slo_attainment of the requests."""

    step_s: float
    tpot_ms: float | None
    output_throughput_per_gpu: float
    goodput_per_gpu: float
    meets_slo: bool
    request_rate_per_gpu: float = math.inf  # requests / the least duration / GPUs

    def to_dict(self) -> dict:
        return {"tpot_lower_bound_ms": self.tpot_ms,
                "output_throughput_per_gpu_upper_bound": _finite(self.output_throughput_per_gpu),
                "goodput_per_gpu_upper_bound": _finite(self.goodput_per_gpu)}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def max_bandwidth(spec) -> float | None:
    """The highest bytes/s any step on `spec` is priced at (module doc), or None where the
    spec has measured curves or rows tables (rates by working set: no bound here)."""
    if getattr(spec, "op_curves", None) or getattr(spec, "matmul_rows", None):
        return None
    stated = [*getattr(spec, "op_efficiency", {}).values(), *DEFAULT_EFFICIENCY.values()]
    return float(spec.bandwidth) * max(1.0, *stated)


def step_seconds(args, weight_bytes: float | None, spec, stages: int = 1) -> float:
    """The least seconds of any step of a rank of `weight_bytes` stored weights on `spec`
    (the module doc's step_s); 0 where no bound is known: a mixture of experts (a step reads
    the experts its tokens route to), a transformers model, a spec without max_bandwidth."""
    peak = max_bandwidth(spec)
    if peak is None or not weight_bytes or not isinstance(args, ModelArgs) \
            or args.num_experts:
        return 0.0
    read = weight_bytes - args.vocab_size * args.dim * 4  # the embedding: rows gathered
    return SLACK * stages * max(read, 0.0) / peak


def bounds(workload, slo: dict, attainment: float, budget: int, gpus: int,
           prefill_s: float, decode_s: float) -> Bounds:
    """A candidate's Bounds (module doc) on `workload` (serve's Workload) with steps of at
    least `prefill_s` while a prompt is prefilled and `decode_s` after (aggregated: both its
    step_s), `budget` tokens a step at most, `gpus` GPUs; slo: parse_slo's."""
    arrival = np.asarray(workload.arrival, dtype=float)
    prompt = np.asarray(workload.prompt) - np.asarray(workload.cached)
    output = np.asarray(workload.output)
    chunks = np.maximum(1, -(-prompt // budget))
    ttft = chunks * prefill_s
    e2el = ttft + (output - 1) * decode_s
    good = np.ones(len(arrival), dtype=bool)
    for name, limit in slo.items():
        value = {"ttft": ttft, "e2el": e2el,
                 "tpot": np.where(output > 1, decode_s, 0.0)}.get(name)
        if value is not None:
            good &= value <= limit
    duration = float((arrival + e2el).max() - arrival.min())
    per_s = (lambda n: n / duration / gpus) if duration > 0 else \
        (lambda n: math.inf if n else 0.0)
    return Bounds(decode_s, decode_s * 1e3 if (output > 1).any() else None,
                  per_s(float(output.sum())), per_s(float(good.sum())),
                  bool(good.mean() >= attainment), per_s(float(len(output))))
