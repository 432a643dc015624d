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
from dataclasses import dataclass, replace

import numpy as np

from perfcounter.generation.run import PRECISIONS  # noqa: F401  (the shared names, re-exported)
from perfcounter.parallel.sharding import ParallelError, valid_tensor_parallel_sizes
from perfcounter.pricing.links import pool_end
from perfcounter.serve import replicas
from perfcounter.serve.disaggregated import Pool
from perfcounter.serve.disaggregated import simulate as simulate_pools
from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import kv_bytes_per_token
from perfcounter.serve.deploy import (MAX_BLOCK, Deployment, no_fit_line, check_execution,  # noqa: F401
                                      deployment, listed_price, mapping_name, pricer_for)
from perfcounter.serve.metrics import check_prices, metrics, parse_slo
from perfcounter.serve.pricing import step_table
from perfcounter.serve.resolve import (gguf_file, is_gguf, precision_label,  # noqa: F401
                                       resolve_expert_load, resolve_model, resolve_precision,
                                       resolve_quantization, resolve_spec)
from perfcounter.serve.scheduler import Run
from perfcounter.serve.search import PROBE_REQUESTS, Search
from perfcounter.serve.search import find_max_qps as _search
from perfcounter.serve.workload import Workload, check_fits_model

MAX_RATES = 100  # rates one --qps list or range may hold


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
                "engine": {k: v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
                           for k, v in (vars(dep.engine) if hasattr(dep.engine, "__dict__") else
                                        {k: getattr(dep.engine, k)
                                         for k in dep.engine.__dataclass_fields__}).items()},
                "usd_per_hour": dep.usd_per_hour, "usd_per_hour_source": dep.usd_source,
                **self.metrics}


def serve(dep: Deployment, workload: Workload, *, slo=None, usd_per_kwh: float | None = None,
          execution: str | None = None) -> ServeResult:
    """Simulate `workload` on `dep` and measure it (metrics.py); `execution` (REGIMES):
    price its steps in that regime instead of the deployment's (the same counts)."""
    if execution is not None and execution != dep.execution:
        pricer = dep.table.pricer.regime(check_execution(execution)) if dep.devices \
            else pricer_for(dep.spec, execution)
        dep = replace(dep, table=step_table(dep.args, dep.dtype, pricer, weights=dep.weights,
                                            kv=dep.kv_dtype, load=dep.expert_load),
                      execution=execution,
                      sources={**dep.sources, "execution": "--execution (given)"})
    if not dep.plan.fits:
        raise ServeError(no_fit_line(dep.model_name, dep.name, dep.plan))
    check_prices(None, usd_per_kwh)
    check_fits_model(workload, dep.plan.max_model_len)
    slo = parse_slo(slo) if slo else None
    run = replicas.simulate(workload, dep)  # DP replicas, PP streams
    m = metrics(run, slo=slo, open_loop=workload.concurrency is None,
                **replicas.idle_power(dep), usd_per_hour=dep.usd_per_hour,
                usd_per_kwh=usd_per_kwh)
    return ServeResult(dep, workload, m, run)


def disaggregated(model, workload: Workload, prefill_pool, decode_pool, *, slo=None,
                  usd_per_kwh: float | None = None, **kwargs):
    """Prefill and decode on pools of their own, "DEVICE[,instances=N][,tp=T]" each, the KV
    moving between them (perfcounter/serve/disaggregated.py); kwargs: deployment()'s, for
    both pools, each applied as to one deployment (usd_per_hour: one device's price, x each
    pool's GPUs); usd_per_kwh: serve's. Pools, their sizes and links checked before any
    step table is counted, a refusal naming the pool's flag and key (tp=T, instances=N)."""
    pools = (Pool.parse(prefill_pool, "--prefill_pool"), Pool.parse(decode_pool, "--decode_pool"))
    dtype = resolve_precision(kwargs.get("precision", "bfloat16"))
    args = resolve_model(model)
    gguf = kwargs.get("gguf_type") is not None or is_gguf(model)
    for pool, flag, text in zip(pools, ("--prefill_pool", "--decode_pool"),
                                (prefill_pool, decode_pool)):
        pool_end(resolve_spec(pool.device, dtype))
        if pool.tp not in valid_tensor_parallel_sizes(args):
            name = model if isinstance(model, str) else type(model).__name__
            raise ParallelError(f"{flag} {text!r}: tp={pool.tp} does not shard {name}; valid: "
                                f"{', '.join(map(str, valid_tensor_parallel_sizes(args)))}")
        if gguf and pool.gpus > 1:  # shard's rule: a llama.cpp file runs on one GPU
            raise ParallelError(f"{flag} {text!r}: a llama.cpp file's layers are priced "
                                "unsharded, on one GPU: give instances=1,tp=1, or leave out "
                                + ("--gguf_type" if kwargs.get("gguf_type") else "the .gguf"))
    check_prices(kwargs.get("usd_per_hour"), usd_per_kwh)
    deps = [deployment(model, p.device, **p.keywords(), **kwargs) for p in pools]
    for d in deps:  # vLLM turns its hybrid KV cache manager off under a KV transfer
        # (VllmConfig.__post_init__, engines.py windowed_kv): every layer holds every token
        d.engine = replace(d.engine, block_cost=None)
    check_fits_model(workload, min(d.plan.max_model_len for d in deps))
    kv = kv_bytes_per_token(args, deps[0].dtype, deps[0].kv_dtype)  # all ranks'
    return simulate_pools(workload, *deps, kv, pools=pools, slo=parse_slo(slo) if slo else None,
                          usd_per_kwh=usd_per_kwh)


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
