"""The pruned search: which candidates are simulated, and why each other one is not.

The front (output tokens/s per GPU against the median TPOT) and the recommendation (the most
goodput per GPU meeting the SLO) are front.py's, read off the candidates simulated. A
candidate can be left out without changing either when it can be neither: off the front
(another simulated candidate has at least its throughput per GPU at no more TPOT, one of the
two strictly) and not recommendable (it cannot meet the SLO, or a simulated one meeting it
has more goodput per GPU than it can reach). Each candidate of a group (one step table's
counts, execute.py) is decided in turn, the most promising first (fewest GPUs, then the
largest batch limit), against `Incumbents`: the front and the best goodput of the candidates
simulated so far, plain data handed from task to task:

1. bound: its Bounds (bounds.py: provable, before any work) already show it is dominated on
   the front and cannot be recommended: left out, `"pruned_by": "bound"`;
2. same run: its run is one simulated already (dedupe.py: exact): its figures from that
   run, `"same_run_as"` naming the candidate simulated;
3. halving (successive halving, one rung): with at least MIN_HALVING requests, and a
   candidate simulated with at least its throughput bound (else nothing could dominate it),
   it first serves the first 1/SHORT of them. Its optimistic figures on all of them: the
   short run's median TPOT x (1 - MARGIN) (never below its bound); the throughput per GPU its
   bound (a short run's is no guide: its last requests' drain is a larger share of its
   duration, 1.1-1.4 x below the whole run's on benchmarks/bench_plan.py's question); goodput
   per GPU its bound with the short run's share meeting the SLO + MARGIN; the SLO within
   reach if the short run met it for --slo_attainment - MARGIN of its requests (an
   overloaded short run: its requests' TPOT and share). Where even those are dominated on
   the front by a candidate simulated in full and cannot be recommended, it is left out,
   `"pruned_by": "halving"` (a heuristic: the margins are its safety; tests/test_plan_prune.py
   holds the answer equal to the exhaustive search's on random questions);
4. else it serves the whole workload (evaluate.py) and joins the incumbents.
So the front and the recommendation are always read off whole runs. `--exhaustive` simulates
every candidate that fits (execute.run_candidates).
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np

from perfcounter._util import PerfcounterWarning
from perfcounter.plan import dedupe
from perfcounter.plan import evaluate as ev
from perfcounter.plan.front import meets_slo, usable
from perfcounter.serve.errors import ServeError
from perfcounter.serve.metrics import per_request

MIN_HALVING = 32  # requests from which a short run is made first
SHORT = 4  # a short run serves the first 1/SHORT of the requests (at least 8)
MARGIN = 0.3  # how far a whole run's figures may be better than the short run's


@dataclass
class Incumbents:
    """The candidates simulated so far, as the rules need them: the front's points (median
    TPOT ms, output tokens/s per GPU, index) and the best (goodput per GPU, index) meeting
    the SLO for `attainment` of its requests."""

    attainment: float
    front: list = field(default_factory=list)
    best: tuple | None = None

    def add(self, i: int, f: dict) -> None:
        if usable(f):
            tpot, tput = f["median_tpot_ms"], f["output_throughput_per_gpu"]
            if self.dominating(tpot, tput) is None:
                kept = [p for p in self.front if not (tput >= p[1] and tpot <= p[0])]
                self.front = sorted(kept + [(tpot, tput, i)])
        if meets_slo(f, self.attainment):
            goodput = f["goodput_per_gpu"] or 0.0
            if self.best is None or goodput > self.best[0]:
                self.best = (goodput, i)

    def dominating(self, tpot_ms: float, tput: float) -> int | None:
        """A front point with at least `tput` at no more `tpot_ms`, one of the two strictly."""
        for p_tpot, p_tput, i in self.front:
            if p_tput >= tput and p_tpot <= tpot_ms and (p_tput > tput or p_tpot < tpot_ms):
                return i
        return None


def why_left_out(inc: Incumbents, tpot_ms: float | None, tput: float, goodput: float,
                 reachable: bool) -> str | None:
    """Why a candidate whose figures are at best these cannot matter (module doc), or None."""
    if tpot_ms is None:
        front = "no request has a TPOT (one output token each): never on the front"
    else:
        d = inc.dominating(tpot_ms, tput)
        if d is None:
            return None
        front = f"TPOT >= {tpot_ms:.4g} ms at <= {tput:.4g} tok/s/GPU: dominated by #{d}"
    if not reachable:
        return f"{front}; the SLO out of reach"
    if inc.best is not None and inc.best[0] > goodput:
        return f"{front}; goodput <= {goodput:.4g}/s/GPU, below #{inc.best[1]}'s {inc.best[0]:.4g}"
    return None


def short_figures(f: dict, result) -> tuple | None:
    """(median TPOT ms, share meeting the SLO) of a short run's figures `f`, or None (refused,
    or no TPOT). An overloaded run keeps its share (metrics.py) but not its latencies: its
    TPOT is read off its requests where its run is here (`result`, an aggregated
    candidate's ServeResult)."""
    if "error" in f:
        return None
    tpot = f.get("median_tpot_ms")
    if tpot is None and f.get("overloaded") and result is not None:
        values = per_request(result.run)["tpot"]
        values = values[~np.isnan(values)]
        tpot = float(np.median(values * 1e3)) if len(values) else None
    return None if tpot is None else (tpot, f.get("slo_met_fraction") or 0.0)


def estimate_reason(inc: Incumbents, b, short: tuple, n: int) -> str | None:
    """Rule 3 (module doc): why a candidate with Bounds `b` and a short run's figures `short`
    (short_figures) cannot matter, or None."""
    tpot, met = max(b.tpot_ms or 0.0, short[0] * (1 - MARGIN)), short[1]
    goodput = min(b.goodput_per_gpu, min(1.0, met + MARGIN) * b.request_rate_per_gpu)
    reachable = b.meets_slo and met >= inc.attainment - MARGIN
    reason = why_left_out(inc, tpot, b.output_throughput_per_gpu, goodput, reachable)
    return None if reason is None else f"the first {n} requests' run x margins: {reason}"


def order(item) -> tuple:
    """The most promising first: fewest GPUs, then by deployment, the largest batch limit."""
    i, c, _ = item
    return (c.num_gpus, c.disaggregated, c.decode_device or "", c.data_parallel_size,
            c.num_prefill_instances, c.enable_expert_parallel, -c.max_num_seqs, i)


def prefix(workload, n: int):
    """The first `n` requests of `workload` (arrivals as they are)."""
    return dataclasses.replace(workload, **{k: getattr(workload, k)[:n]
                                            for k in ("arrival", "prompt", "output", "cached")})


_ALONE: dict = {}  # (job, group) -> {index: (Candidate, ServeResult)} of runs alone (dedupe)


def forget_alone_runs() -> None:
    """A new search starts: no run of an earlier one is reused, even of the same job (its
    candidates' indices would name runs of that search as this one's)."""
    _ALONE.clear()


def _alone_runs(job: ev.Job, group: int) -> dict:
    """This process's runs of `group` whose requests each ran alone (dedupe.py's second
    rule: a later round's candidate with more replicas reuses one): kept for one job."""
    if any(key[0] != job for key in _ALONE):
        _ALONE.clear()
    return _ALONE.setdefault((job, group), {})


def run_group(job: ev.Job, items: list, inc: Incumbents, evaluate, on_done=None, *,
              group: int = 0) -> list:
    """Decide each (index, Candidate, Bounds) of one task in turn (module doc), `evaluate`
    serving a candidate whole (execute.py's, so that a test can stand in for it); updates
    `inc`. Returns [(index, figures)]: serve's, derived, or {"pruned": why, "pruned_by": rule}
    with its bounds, or {"error": why} where serve refused it. group: the task's group, whose
    runs this process keeps for its later tasks."""
    workload = ev.workload(job)
    most = dedupe.request_blocks(workload, job.block_size)
    n = max(8, job.num_requests // SHORT)
    short = prefix(workload, n) if job.num_requests >= MIN_HALVING else None
    task = _Task(job, inc, evaluate, most, short, {}, {}, _alone_runs(job, group))
    out = []
    for i, c, b in sorted(items, key=order):
        f = task.decide(i, c, b)
        if "pruned" not in f:
            inc.add(i, f)
        out.append((i, f))
        if on_done is not None:
            on_done(i, f)
    return out


@dataclass
class _Task:
    """What one task keeps while it decides its candidates."""

    job: ev.Job
    inc: Incumbents
    evaluate: object
    most: int  # the most KV blocks one request holds
    short: object  # the short runs' workload (None: no halving)
    runs: dict  # index -> (Candidate, ServeResult) served whole in this task
    shorts: dict  # index -> (Candidate, ServeResult) of the short runs made in this task
    alone: dict  # the group's runs alone (_alone_runs)

    def decide(self, i: int, c, b) -> dict:
        reason = why_left_out(self.inc, b.tpot_ms, b.output_throughput_per_gpu,
                              b.goodput_per_gpu, b.meets_slo)
        if reason is not None:
            return {"pruned": f"bounds: {reason}", "pruned_by": "bound", **b.to_dict()}
        job = self.job
        try:
            reuse = dedupe.reusable(c, job, {**self.alone, **self.runs}, self.most)
            if reuse is not None:
                return dedupe.derive(c, job, *reuse)
            if self.short is not None and b.tpot_ms is not None and any(
                    tput >= b.output_throughput_per_gpu for _, tput, _ in self.inc.front):
                reason = self._halving(i, c, b)  # (a short run can leave it out)
                if reason is not None:
                    return {"pruned": reason, "pruned_by": "halving", **b.to_dict()}
            f = self.evaluate(c, job)
        except (ServeError, ValueError) as e:
            return {"error": str(e)}
        result = ev.last_run(c, job)
        if result is not None:
            self.runs[i] = (c, result)
            if dedupe.alone(result):
                self.alone[i] = (c, result)
        return f

    def _halving(self, i: int, c, b) -> str | None:
        """Rule 3 on the short run (or on one of the same run, dedupe.py's first rule)."""
        job, n = self.job, len(self.short)
        reuse = dedupe.reusable(c, dataclasses.replace(job, num_requests=n), self.shorts,
                                dedupe.request_blocks(self.short, job.block_size))
        if reuse is not None:
            figures, result = dedupe.derive(c, job, *reuse), reuse[1]
        else:
            with warnings.catch_warnings():  # replicas past its few requests: said of the whole
                warnings.simplefilter("ignore", PerfcounterWarning)
                figures, result = ev.served(c, job, self.short)
            if result is not None:
                self.shorts[i] = (c, result)
        short = short_figures(figures, result)
        return None if short is None else estimate_reason(self.inc, b, short, n)
