"""serve: a model served to a workload — continuous batching, latency percentiles, memory fit.

Owns workloads (workload.py), the iteration-level scheduler (scheduler.py: vLLM v1 /
Sarathi-Serve semantics), one engine step counted exactly (ragged.py), the step table
(steps.py: affine per record group in tokens, sequences, context and, for a mixture of
experts, the experts a step touches; quantized weights and KV caches counted as stored)
and its pricing
(pricing.py: the pricer seam; placement.py: a mapping's devices, priced through
perfcounter.simulation),
the memory fit (memory.py), the serving topologies (replicas.py: data-parallel replicas and
pipeline streams, a step on many ranks, one way to join runs; disaggregated.py: prefill and
decode pools with the KV moved between them), serving metrics under vLLM's names
(metrics.py), text
(render.py), files (outputs.py), engine profiles (engines.py) and the QPS search
(search.py); `perfcounter serve`'s command line is perfcounter/cli/serve.py.

It may import counting, trace, quant (schemes, stored bytes), models, pricing and simulate
code, only through deps.py.

    from perfcounter.serve import deployment, serve, synthetic
    dep = deployment("llama-3-8b", "h100-sxm")
    result = serve(dep, synthetic(1000, 512, 128, qps=10, seed=0), slo="ttft=200ms,tpot=50ms")
    print(result.metrics["p99_ttft_ms"])
"""
from perfcounter.serve.api import (Deployment, ServeResult, deployment, find_max_qps, qps_values,
                                   serve)
from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import MemoryPlan, kv_bytes_per_token, memory_plan
from perfcounter.serve.pricing import cache_clear, cache_info, step_table
from perfcounter.serve.workload import Workload, read_trace, synthetic

__all__ = ["Deployment", "MemoryPlan", "ServeError", "ServeResult", "Workload", "cache_clear",
           "cache_info", "deployment", "find_max_qps", "kv_bytes_per_token", "memory_plan",
           "qps_values", "read_trace", "serve", "step_table", "synthetic"]
