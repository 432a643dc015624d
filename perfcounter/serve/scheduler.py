"""The iteration-level scheduler: continuous batching as vLLM v1, Sarathi-Serve and
TensorRT-LLM run it.

Time advances one engine step at a time. Each step (docs/serve.md states it in full) has
four named parts:

1. Arrival: requests whose arrival time (+ the engine's fixed host cost a request,
   `request_overhead_s`) has come join the waiting queue (FCFS).
2. Running (`_Engine.schedule_running`, KV blocks): running requests are scheduled first,
   decodes before unfinished prefills (each in admission order), each taking min(tokens
   it still needs, the budget left) of the step's token budget
   (`max_num_batched_tokens`): a prompt longer than the budget is prefilled in chunks. A
   request needs prompt + generated tokens in its KV cache before it emits its next
   token. The cache is paged: a request holds ceil(tokens in cache / block_size) blocks
   (`EngineConfig.blocks`; a model with windowed layers as kv_blocks.BlockCost says: their
   blocks before the window freed, as vLLM's hybrid cache manager frees them).
   Under admission "recompute" (vLLM, SGLang), when a running request's new tokens need
   blocks that are not free, the running request admitted last (and not yet scheduled
   this step) is preempted: its blocks are freed, it goes back to the front of the
   waiting queue and will prefill its prompt and the tokens it generated again; if it is
   the request itself, it waits. Under "no_evict" (TensorRT-LLM's GUARANTEED_NO_EVICT)
   nothing is ever preempted (admission below guarantees the blocks).
3. Admission (`_Engine.admit`): if nothing was preempted, waiting requests are admitted in
   order while budget, `max_num_seqs` and blocks allow: "recompute" admits a request
   whose next chunk's blocks are free now; "no_evict" admits one only when the blocks of
   its whole prompt + output fit beside every running request's whole prompt + output
   (a request's cached prefix tokens, on first admission, need blocks but no compute).
4. Step composition (`_compose`) and emission (`_emit`): the step's features (tokens,
   sequences, KV positions, pairs; experts touched) priced by the step table, the GPU's
   part, with the sampler's kernels for its sequences (`sampler`, serve/sampler.py); the
   host's part is `step_overhead_s` + `seq_overhead_s` x its sequences (`step_seconds`).
   Without `async_scheduling` the host prepares a step while the GPU waits: the step takes
   host + GPU. With it (vLLM's --async-scheduling, the overlap schedulers of SGLang and
   TensorRT-LLM) the host prepares step n+1 while the GPU runs step n: only the host time
   beyond the GPU's previous step shows, max(0, host - previous GPU) + GPU; a step after an
   idle engine has none to hide behind (host + GPU). At its end a request whose cache
   reached prompt + generated emits a token (the first: time to first token); one that
   emitted its last token finishes and frees its blocks (closed loop: its successor arrives
   then). Every gap between two tokens of a request is an ITL: a decode that shares a step
   with a prefill chunk waits the longer step (the p90 / p99 ITL chunked prefill makes).

With nothing running or waiting, time jumps to the next arrival. A request's state is a
`State`: waiting, running, preempted (within the step that preempted it) or finished.

Most steps of a run decode the same batch; decode_runs.py takes such a stretch at once, the
very same run bit for bit (`DECODE_RUNS`; False steps one request at a time).
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from perfcounter.costs.attention import window_pairs
from perfcounter.serve.decode_runs import decode_run
from perfcounter.serve.errors import ServeError
from perfcounter.serve.steps import BASE, EXPERTS, FEATURES, extra_features
from perfcounter.serve.workload import Workload

ADMISSIONS = ("recompute", "no_evict")


class State(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # freed in this step; waiting again from the next
    FINISHED = "finished"


WAITING, RUNNING, PREEMPTED, FINISHED = State.WAITING, State.RUNNING, State.PREEMPTED, \
    State.FINISHED


DECODE_RUNS = True  # decode stretches taken at once (decode_runs.py); False: step by step


@dataclass(slots=True)
class Request:
    index: int
    arrival: float
    prompt: int
    output: int
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0  # output tokens emitted
    blocks: int = 0
    first_token: float = -1.0
    last_token: float = -1.0
    finish: float = -1.0
    preemptions: int = 0
    state: State = WAITING


@dataclass(frozen=True)
class EngineConfig:
    kv_blocks: int
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    step_overhead_s: float = 0.0
    admission: str = "recompute"  # ADMISSIONS
    request_overhead_s: float = 0.0  # host time before a request can be scheduled
    seq_overhead_s: float = 0.0  # host time a scheduled sequence a step
    async_scheduling: bool = False  # the host's work overlaps the GPU's previous step
    sampler: object = None  # sequences -> the sampler's GPU seconds (sampler.SamplerCost)
    block_cost: object = None  # tokens -> blocks a sequence holds (kv_blocks.BlockCost);
    # None: ceil(tokens / block_size), every layer holding every token

    def blocks(self, tokens: int) -> float:
        """KV blocks a sequence of `tokens` tokens in cache holds."""
        if self.block_cost is not None:
            return self.block_cost(tokens)
        return (tokens + self.block_size - 1) // self.block_size


def step_seconds(cfg: EngineConfig, gpu_s: float, seqs: int,
                 previous_gpu_s: float | None) -> tuple[float, float]:
    """(a step's seconds, its GPU's) (module doc, part 4): the GPU's `gpu_s` (the step
    table's) + the sampler's kernels for `seqs` sequences; the host's step_overhead_s +
    seq_overhead_s x seqs added, or under async_scheduling what of it outlasts the GPU's
    previous step (`previous_gpu_s`; None: the engine was idle, nothing hides it)."""
    if cfg.sampler is not None:
        gpu_s += cfg.sampler(seqs)
    host = cfg.step_overhead_s + cfg.seq_overhead_s * seqs
    if cfg.async_scheduling and previous_gpu_s is not None:
        host = max(0.0, host - previous_gpu_s)
    return gpu_s + host, gpu_s


@dataclass
class Steps:
    """One row per engine step (array('d') columns, numpy on read)."""

    start: array = field(default_factory=lambda: array("d"))
    seconds: array = field(default_factory=lambda: array("d"))
    tokens: array = field(default_factory=lambda: array("d"))
    seqs: array = field(default_factory=lambda: array("d"))
    prefill_tokens: array = field(default_factory=lambda: array("d"))
    decode_seqs: array = field(default_factory=lambda: array("d"))
    kv_blocks: array = field(default_factory=lambda: array("d"))  # held after the step's allocation
    in_system: array = field(default_factory=lambda: array("d"))  # arrived, not finished
    energy_j: array = field(default_factory=lambda: array("d"))


@dataclass
class Run:
    """What one simulation produced: requests, inter-token gaps and steps."""

    requests: list  # Request, by index
    itl: array  # every gap between two tokens of a request, s
    steps: Steps
    preemptions: int
    end: float  # time the last request finished
    config: EngineConfig


class _Engine:
    """The scheduler's state between steps: queues, free and reserved blocks."""

    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.waiting: deque = deque()
        self.running: list = []
        self.free = cfg.kv_blocks
        self.reserved = 0  # no_evict: blocks of running requests' whole prompt + output
        self.preemptions = 0

    # -- KV blocks and running requests -----------------------------------------------------
    def schedule_running(self, budget: int) -> tuple[list, int, bool]:
        """(scheduled (request, tokens), budget left, preempted?) of step part 2."""
        blocks = self.cfg.blocks
        sched: list = []
        taken: set = set()
        preempted = False
        running = self.running
        order = [r for r in running if r.prompt + r.generated - r.computed == 1]
        order += [r for r in running if r.prompt + r.generated - r.computed != 1]
        for r in order:
            if budget == 0:
                break
            if r.state is PREEMPTED:
                continue
            todo = min(r.prompt + r.generated - r.computed, budget)
            need = blocks(r.computed + todo) - r.blocks
            while need > self.free:
                victim = next(v for v in reversed(running)
                              if v.state is RUNNING and v.index not in taken)
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.state is PREEMPTED:
                continue
            self.free -= need
            r.blocks += need
            sched.append((r, todo))
            taken.add(r.index)
            budget -= todo
        if preempted:
            self.running = [r for r in running if r.state is RUNNING]
            for r in self.waiting:
                r.state = WAITING
        return sched, budget, preempted

    def _preempt(self, victim: Request) -> None:
        if self.cfg.admission == "no_evict":  # admission reserved every block: never here
            raise AssertionError("no_evict admission ran out of reserved KV blocks")
        self.free += victim.blocks
        victim.blocks, victim.computed, victim.state = 0, 0, PREEMPTED
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    # -- admission -------------------------------------------------------------------------
    def admit(self, sched: list, budget: int) -> None:
        """Step part 3: waiting requests admitted in order while they fit."""
        cfg, waiting, running = self.cfg, self.waiting, self.running
        no_evict = cfg.admission == "no_evict"
        while waiting and budget and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            todo = min(r.prompt + r.generated - r.computed, budget)
            need = cfg.blocks(r.computed + todo) - r.blocks
            if no_evict:
                whole = cfg.blocks(r.prompt + r.output)
                if self.reserved + whole > cfg.kv_blocks:
                    break
                self.reserved += whole
            elif need > self.free:
                break
            waiting.popleft()
            self.free -= need
            r.blocks += need
            r.state = RUNNING
            running.append(r)
            sched.append((r, todo))
            budget -= todo

    def finish(self, r: Request) -> None:
        self.free += r.blocks
        r.blocks = 0
        r.state = FINISHED
        if self.cfg.admission == "no_evict":
            self.reserved -= self.cfg.blocks(r.prompt + r.output)


def _compose(sched: list, f: np.ndarray, window, touched,
             extra: tuple | None = None) -> tuple[int, int, int]:
    """Step part 4a: the step's features into `f` (steps.FEATURES); (tokens, prefill
    tokens, decodes); extra: a transformers model's (local, mla) features (steps_hf.py)."""
    if extra is not None:
        f[BASE:] = 0.0
    tokens = kv = dense = causal = 0
    prefill = decodes = 0
    for r, m in sched:
        c = r.computed
        tokens += m
        kv += c + m
        dense += m * (c + m)
        if window is None:
            causal += m * c + m * (m + 1) // 2
        else:
            causal += window_pairs(m, c + m, window)
        if m == 1 and c >= r.prompt:
            decodes += 1
        else:
            prefill += m
        if extra is not None:
            extra_features(f, m, c, *extra)
    f[1], f[2], f[3], f[4], f[5] = tokens, len(sched), kv, dense, causal
    if extra is not None:
        f[BASE + 3] = float(tokens == 1)
    if touched is not None:
        f[EXPERTS] = touched(tokens)
    return tokens, prefill, decodes


def _emit(engine: _Engine, sched: list, end: float, itl: array) -> list:
    """Step part 4b: tokens emitted at `end`; the requests that finished."""
    finished = []
    for r, m in sched:
        r.computed += m
        if r.computed < r.prompt + r.generated:
            continue
        r.generated += 1
        if r.first_token < 0:
            r.first_token = end
        else:
            itl.append(end - r.last_token)
        r.last_token = end
        if r.generated == r.output:
            r.finish = end
            engine.finish(r)
            finished.append(r)
    return finished


def check_fits_blocks(w: Workload, cfg: EngineConfig) -> None:
    """Every request's prompt + output within the KV blocks (one line ServeError else)."""
    bs, longest = cfg.block_size, int((w.prompt + w.output).max())
    worst = cfg.blocks(longest)  # blocks grow with the tokens: the longest request's
    if worst > cfg.kv_blocks:
        need = f"{worst:,}" if isinstance(worst, int) else f"{worst:,.1f}"
        raise ServeError(f"a request of {longest} tokens needs {need} KV blocks of {bs}; "
                         f"the device holds {cfg.kv_blocks}: it can never fit")


def simulate_engine(w: Workload, table, cfg: EngineConfig) -> Run:
    """Run the workload through the scheduler (see the module doc)."""
    if cfg.admission not in ADMISSIONS:
        raise ServeError(f"admission {cfg.admission!r}; valid: {', '.join(ADMISSIONS)}")
    check_fits_blocks(w, cfg)
    n = len(w)
    arrival = w.arrival.astype(float).copy()
    released = n if w.concurrency is None else min(w.concurrency, n)
    reqs = [Request(i, float(arrival[i]), int(w.prompt[i]), int(w.output[i]),
                    computed=int(w.cached[i])) for i in range(n)]
    window = table.counts.window
    seconds, energy = table.seconds, table.energy_j
    f = np.zeros(len(FEATURES))
    f[0] = 1.0
    touched = table.counts.experts_touched if table.counts.experts else None
    counts = table.counts
    extra = (counts.local, counts.mla) if getattr(counts, "local", None) is not None \
        or getattr(counts, "mla", False) else None
    itl = array("d")
    log = Steps()
    engine = _Engine(cfg)
    late, budget_max = cfg.request_overhead_s, cfg.max_num_batched_tokens
    t, nxt, finished, gpu = 0.0, 0, 0, None  # gpu: the previous step's GPU seconds (None: idle)
    fast = DECODE_RUNS and window is None and extra is None and cfg.block_cost is None
    while finished < n:
        while nxt < released and arrival[nxt] + late <= t:
            engine.waiting.append(reqs[nxt])
            nxt += 1
        if not engine.running and not engine.waiting:
            t, gpu = max(t, float(arrival[nxt]) + late), None
            continue
        sched, budget, preempted = engine.schedule_running(budget_max)
        if not preempted:
            engine.admit(sched, budget)
        if not sched:
            raise ServeError("the scheduler could not run any request: a request needs more "
                             "KV blocks than the device holds")
        tokens, prefill, decodes = _compose(sched, f, window, touched, extra)
        dt, gpu = step_seconds(cfg, seconds(f), len(sched), gpu)
        end = t + dt
        log.start.append(t)
        log.seconds.append(dt)
        log.tokens.append(tokens)
        log.seqs.append(len(sched))
        log.prefill_tokens.append(prefill)
        log.decode_seqs.append(decodes)
        log.kv_blocks.append(cfg.kv_blocks - engine.free)
        log.in_system.append(nxt - finished)
        log.energy_j.append(energy(f, dt) if cfg.sampler is None else
                            energy(f, dt, cfg.sampler.joules(len(sched))))
        done = _emit(engine, sched, end, itl)
        if done:
            finished += len(done)
            for _ in done:
                if released < n:  # closed loop: its successor arrives now
                    arrival[released] = end
                    reqs[released].arrival = end
                    released += 1
            engine.running = [r for r in engine.running if r.state is RUNNING]
        t = end
        if fast and engine.running:
            state = [t, gpu, nxt, released, arrival, late, nxt - finished]
            decode_run(engine, state, f, seconds, energy, touched, log, itl, step_seconds)
            t, gpu = state[0], state[1]
    return Run(reqs, itl, log, engine.preemptions, t, cfg)
