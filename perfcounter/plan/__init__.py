"""The deployment search (`perfcounter plan`): which deployment of a model on a pool of
devices serves a workload within an SLO, at what goodput per GPU, $ and J per token.

    pool.py        --devices KIND:COUNT[,...]: the kinds, their specs and prices a GPU-hour
    candidates.py  the candidates (vLLM's field names), their enumeration and memory fit
    evaluate.py    one candidate served as `perfcounter serve` serves it; that command line
    execute.py     candidates grouped by step table, run here, on a process pool or on Ray
    front.py       the Pareto front (throughput per GPU against TPOT) and the recommendation
    search.py      plan(...): inputs checked, candidates enumerated, fitted, run; the result
    render.py      the result as text

It imports serve (deployments, workloads, metrics) and nothing above it; cli/plan.py is its
command line.
"""
from perfcounter.plan.candidates import Candidate, Space, enumerate_candidates
from perfcounter.plan.pool import DeviceKind, PlanError, parse_devices
from perfcounter.plan.search import PlanResult, plan

__all__ = ["Candidate", "DeviceKind", "PlanError", "PlanResult", "Space",
           "enumerate_candidates", "parse_devices", "plan"]
