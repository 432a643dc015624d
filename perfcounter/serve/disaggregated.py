"""Disaggregated prefill and decode: two pools of instances, each request's KV cache moved
from its prefill instance to a decode instance over the link between the pools.

    result = serve.disaggregated("llama-3-8b", workload, prefill_pool="h100-sxm,instances=2",
                                 decode_pool="a100-sxm4-80gb,instances=2,tp=2")
    result.prefill, result.decode, result.overall     # metrics dicts, vLLM's field names

A pool is `DEVICE[,instances=N][,tp=T]` (the mapping's `device[,options]` notation): N
instances (data-parallel replicas) of a deployment of T GPUs each; the pools may differ
(an H100 prefill pool and an A100 decode pool, a GPU prefill pool and a PIM decode pool, as
AttAcc and NeuPIMs place them). As DistServe and Splitwise run it:
1. prefill: every request runs on the prefill pool as a request of one output token (its
   prompt's forward and the first token): its TTFT;
2. transfer: its KV cache, prompt tokens x KV bytes per token of the whole model (every
   layer, every KV head: each prefill rank sends its shard), moves to the decode pool over
   the link between the pools, the T prefill ranks sending in parallel:
   bytes / (T x busbw) + latency, bytes x 8 x the link's pJ/bit (pricing/links.py's
   `pool_link`: the slower end of a GPU's node link, InfiniBand, or a device's host link,
   PCIe, where it has no GPU fabric; `transfer`);
3. decode: it arrives at the decode pool when its KV has, as a request whose prompt and
   first token are cached (prompt + 1 tokens, prompt cached), asking for output - 1 tokens.
Per pool the metrics are its own run's, priced at its deployment's price an hour (one
device's x its instances x TP GPUs); overall, each request's TTFT is its prefill's, its
end its decode's, its TPOT (end - first token) / (output - 1), the steps and joules both
pools' (each pool's GPUs drawing their static power whenever they run nothing, over the
whole run: `_idle_j`), the price both pools', and `kv_transfer_bytes` / `kv_transfer_s` /
`kv_transfer_j` the moves. Every setting of a deployment applies to both pools as it applies to one
deployment (serve/api.py's `disaggregated`).

Each pool runs as any deployment runs (replicas.simulate: its DP replicas and PP streams);
the pools' runs join as replicas' runs do (replicas.join_steps).
"""
from __future__ import annotations

import dataclasses
from array import array
from dataclasses import dataclass

import numpy as np

from perfcounter.pricing.links import Link, pool_link, transfer
from perfcounter.parallel.sharding import ParallelError
from perfcounter.pricing.power import idle_joules
from perfcounter.serve.metrics import metrics
from perfcounter.serve.replicas import check_gpus, idle_power, join_steps, staged
from perfcounter.serve.replicas import simulate as simulate_run


@dataclass(frozen=True)
class Pool:
    """DEVICE[,instances=N][,tp=T]: N instances of T GPUs each."""

    device: str
    instances: int = 1
    tp: int = 1

    @classmethod
    def parse(cls, text, flag: str = "--prefill_pool") -> "Pool":
        """'DEVICE[,instances=N][,tp=T]' -> Pool; ServeError (one line naming `flag`) for a
        key other than instances and tp, one given twice, a value that is not a whole number
        >= 1 in ASCII digits, or more than replicas.MAX_GPUS GPUs in all."""
        parts = [p.strip() for p in str(text).split(",")]
        if not parts[0]:
            raise ParallelError(f"{flag} {text!r}: expected DEVICE[,instances=N][,tp=T]")
        sizes: dict = {}
        for part in parts[1:]:
            key, eq, value = part.partition("=")
            if key not in ("instances", "tp") or not eq or not value.isascii() \
                    or not value.isdigit() or int(value) < 1:
                raise ParallelError(f"{flag} {text!r}: {part!r} is not instances=N or tp=T "
                                    "(integers >= 1)")
            if key in sizes:
                raise ParallelError(f"{flag} {text!r}: {key} given twice; give it once")
            sizes[key] = int(value)
        pool = cls(parts[0], sizes.get("instances", 1), sizes.get("tp", 1))
        check_gpus(f"{flag} {text!r}", pool.gpus,
                   f"{pool.instances:,} instances x TP {pool.tp:,}", "a pool")
        return pool

    @property
    def gpus(self) -> int:
        return self.instances * self.tp

    def keywords(self) -> dict:
        """deployment()'s keywords for this pool."""
        return {"tensor_parallel_size": self.tp, "data_parallel_size": self.instances}


def kv_transfer(prompt: np.ndarray, kv_bytes_per_token: int, link: Link,
                senders: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, seconds, joules) of each request's KV move: prompt x KV bytes per token,
    priced by links.transfer with the `senders` prefill ranks sending side by side."""
    nbytes = prompt.astype(np.int64) * int(kv_bytes_per_token)
    seconds, joules = transfer(nbytes, link, lanes=senders)
    return nbytes, seconds, joules


@dataclass
class DisaggregatedResult:
    """Metrics per pool and overall (vLLM's field names), and the KV moves."""

    prefill: dict
    decode: dict
    overall: dict
    link: Link
    prefill_pool: Pool
    decode_pool: Pool

    def to_dict(self) -> dict:
        return {"prefill_pool": dataclasses.asdict(self.prefill_pool),
                "decode_pool": dataclasses.asdict(self.decode_pool),
                "link": {"kind": self.link.kind, "busbw": self.link.busbw,
                         "latency_s": self.link.latency_s, "pj_per_bit": self.link.pj_per_bit},
                "prefill": self.prefill,
                "decode": self.decode, "overall": self.overall}


def simulate(workload, prefill_dep, decode_dep, kv_bytes_per_token: int, *, pools: tuple,
             slo=None, usd_per_kwh: float | None = None) -> DisaggregatedResult:
    """The module doc's three steps, each pool's run as its deployment runs (DP replicas,
    PP streams), measured by serve's metrics (open loop unless the workload is closed): each
    pool at its deployment's price an hour (its every GPU's), overall at both pools'."""
    open_loop = workload.concurrency is None
    price = {"usd_per_kwh": usd_per_kwh}
    pre = {**price, "usd_per_hour": prefill_dep.usd_per_hour, **idle_power(prefill_dep),
           "energy_known": getattr(staged(prefill_dep), "has_energy", True)}
    dec = {**price, "usd_per_hour": decode_dep.usd_per_hour, **idle_power(decode_dep),
           "energy_known": getattr(staged(decode_dep), "has_energy", True)}
    both = {**price, "energy_known": pre["energy_known"] and dec["energy_known"],
            "usd_per_hour": None if None in (pre["usd_per_hour"], dec["usd_per_hour"])
            else pre["usd_per_hour"] + dec["usd_per_hour"]}
    prefill_pool, decode_pool = pools
    link = pool_link(prefill_dep.spec, decode_dep.spec)
    n = len(workload)
    first = dataclasses.replace(workload, output=np.ones(n, dtype=np.int64))
    prefilled = simulate_run(first, prefill_dep)
    ready = np.array([r.first_token for r in prefilled.requests])
    nbytes, seconds, joules = kv_transfer(workload.prompt, kv_bytes_per_token, link,
                                          prefill_pool.tp)
    later = np.flatnonzero(workload.output > 1)  # requests that still decode
    order = later[np.argsort(ready[later] + seconds[later], kind="stable")]
    finish = np.array([r.finish for r in prefilled.requests])
    decoded = None
    if len(order):
        w = dataclasses.replace(workload, arrival=ready[order] + seconds[order],
                                prompt=workload.prompt[order] + 1,
                                output=workload.output[order] - 1,
                                cached=workload.prompt[order], concurrency=None)
        decoded = simulate_run(w, decode_dep)
        for j, i in enumerate(order):
            finish[i] = decoded.requests[j].finish
    overall = _overall_run(workload, prefilled, decoded, ready, finish, order)
    duration = overall.end - float(workload.arrival.min())
    idle = _idle_j(prefilled, prefill_dep, duration) + _idle_j(decoded, decode_dep, duration)
    out = metrics(overall, slo=slo, open_loop=open_loop, idle_j=idle, **both)
    out.update(kv_transfer_bytes=int(nbytes.sum()), kv_transfer_s=float(seconds.sum()),
               kv_transfer_j=float(joules.sum()), gpus=prefill_pool.gpus + decode_pool.gpus)
    return DisaggregatedResult(metrics(prefilled, open_loop=open_loop, **pre),
                               metrics(decoded, open_loop=open_loop, **dec)
                               if decoded is not None else {},
                               out, link, prefill_pool, decode_pool)


def _idle_j(run, dep, duration: float) -> float:
    """Joules a pool's GPUs draw running nothing over `duration` (metrics' rule: each
    stream's static W over the time its steps leave; a pool that ran nothing idles it all)."""
    idle = idle_power(dep)
    busy = float(np.frombuffer(run.steps.seconds).sum()) if run is not None else 0.0
    return idle_joules(idle["streams"] * duration - busy, idle["static_w"])


def _overall_run(workload, prefilled, decoded, ready, finish, order):
    """One run of both pools: each request's arrival, first token (prefill) and finish
    (decode), both pools' steps in time order and inter-token gaps."""
    requests = [dataclasses.replace(r, arrival=float(workload.arrival[i]),
                                    prompt=int(workload.prompt[i]),
                                    output=int(workload.output[i]),
                                    first_token=float(ready[i]), finish=float(finish[i]))
                for i, r in enumerate(prefilled.requests)]
    runs = [prefilled] + ([decoded] if decoded is not None else [])
    steps = join_steps(runs)
    itl = array("d", decoded.itl if decoded is not None else [])
    if decoded is not None:  # each gap from the first token (prefill) to the second (decode)
        itl.extend(r.first_token - ready[i] for r, i in zip(decoded.requests, order))
    return dataclasses.replace(prefilled, requests=requests, itl=itl, steps=steps,
                               preemptions=sum(r.preemptions for r in runs),
                               end=float(np.max(finish)) if len(finish) else 0.0)

