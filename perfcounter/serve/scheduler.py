"""The iteration-level scheduler: continuous batching as vLLM v1 and Sarathi-Serve run it.

Time advances one engine step at a time. Each step (docs/serve.md states it in full):

1. Requests whose arrival time has come join the waiting queue (FCFS).
2. Running requests are scheduled first, decodes before unfinished prefills (each in
   admission order), each taking min(tokens it still needs, the budget left) of the
   step's token budget (`max_num_batched_tokens`): a prompt longer than the budget is
   prefilled in chunks (chunked prefill). A request needs prompt + generated tokens in
   its KV cache before it can emit its next token.
3. The KV cache is paged: a request holds ceil(tokens in cache / block_size) blocks.
   When a running request's new tokens need blocks that are not free, the running
   request admitted last (and not yet scheduled this step) is preempted by recompute:
   its blocks are freed, it goes back to the front of the waiting queue and will
   prefill its prompt and the tokens it generated again; if it is the request itself,
   it waits.
4. If nothing was preempted, waiting requests are admitted in order while budget,
   `max_num_seqs` and free blocks allow (a request's cached prefix tokens, on first
   admission, need blocks but no compute).
5. The step costs the step table's price of its pieces (pricing.py), plus
   `step_overhead_s`. At its end a request whose cache reached prompt + generated emits
   a token (the first: time to first token); one that emitted its last token finishes
   and frees its blocks (closed loop: its successor arrives then).
6. With nothing running or waiting, time jumps to the next arrival.
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from perfcounter.costs.attention import window_pairs
from perfcounter.serve.errors import ServeError
from perfcounter.serve.steps import EXPERTS, FEATURES
from perfcounter.serve.workload import Workload


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
    done: bool = False


@dataclass(frozen=True)
class EngineConfig:
    kv_blocks: int
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    step_overhead_s: float = 0.0


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


def simulate_engine(w: Workload, table, cfg: EngineConfig) -> Run:
    """Run the workload through the scheduler (see the module doc)."""
    bs, budget_max, seqs_max = cfg.block_size, cfg.max_num_batched_tokens, cfg.max_num_seqs
    n = len(w)
    worst = int(((w.prompt + w.output + bs - 1) // bs).max())
    if worst > cfg.kv_blocks:
        raise ServeError(f"a request of {int((w.prompt + w.output).max())} tokens needs {worst} "
                         f"KV blocks of {bs}; the device holds {cfg.kv_blocks}: it can never fit")
    arrival = w.arrival.astype(float).copy()
    released = n if w.concurrency is None else min(w.concurrency, n)
    reqs = [Request(i, float(arrival[i]), int(w.prompt[i]), int(w.output[i]),
                    computed=int(w.cached[i])) for i in range(n)]
    window = table.counts.window
    seconds, energy = table.seconds, table.energy_j
    f = np.zeros(len(FEATURES))
    f[0] = 1.0
    touched = table.counts.experts_touched if table.counts.experts else None
    itl = array("d")
    log = Steps()
    waiting: deque = deque()
    running: list = []
    free = cfg.kv_blocks
    t, nxt, finished, preemptions = 0.0, 0, 0, 0
    while finished < n:
        while nxt < released and arrival[nxt] <= t:
            waiting.append(reqs[nxt])
            nxt += 1
        if not running and not waiting:
            t = max(t, float(arrival[nxt]))
            continue
        budget = budget_max
        sched: list = []
        taken: set = set()
        preempted = False
        order = [r for r in running if r.prompt + r.generated - r.computed == 1]
        order += [r for r in running if r.prompt + r.generated - r.computed != 1]
        for r in order:
            if budget == 0:
                break
            if r.done:  # preempted earlier in this step
                continue
            todo = min(r.prompt + r.generated - r.computed, budget)
            need = (r.computed + todo + bs - 1) // bs - r.blocks
            while need > free:
                victim = next((v for v in reversed(running) if not v.done and v.index not in taken),
                              None)
                free += victim.blocks
                victim.blocks, victim.computed, victim.done = 0, 0, True
                victim.preemptions += 1
                preemptions += 1
                preempted = True
                waiting.appendleft(victim)
                if victim is r:
                    break
            if r.done:
                continue
            free -= need
            r.blocks += need
            sched.append((r, todo))
            taken.add(r.index)
            budget -= todo
        if preempted:
            running = [r for r in running if not r.done]
            for r in waiting:
                r.done = False
        else:
            while waiting and budget and len(running) < seqs_max:
                r = waiting[0]
                todo = min(r.prompt + r.generated - r.computed, budget)
                need = (r.computed + todo + bs - 1) // bs - r.blocks
                if need > free:
                    break
                waiting.popleft()
                free -= need
                r.blocks += need
                running.append(r)
                sched.append((r, todo))
                budget -= todo
        if not sched:
            raise ServeError("the scheduler could not run any request: a request needs more "
                             "KV blocks than the device holds")
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
        f[1], f[2], f[3], f[4], f[5] = tokens, len(sched), kv, dense, causal
        if touched is not None:
            f[EXPERTS] = touched(tokens)
        dt = seconds(f) + cfg.step_overhead_s
        end = t + dt
        log.start.append(t)
        log.seconds.append(dt)
        log.tokens.append(tokens)
        log.seqs.append(len(sched))
        log.prefill_tokens.append(prefill)
        log.decode_seqs.append(decodes)
        log.kv_blocks.append(cfg.kv_blocks - free)
        log.in_system.append(nxt - finished)
        log.energy_j.append(energy(f, dt))
        done_any = False
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
                r.finish, r.done = end, True
                free += r.blocks
                r.blocks = 0
                finished += 1
                done_any = True
                if released < n:  # closed loop: its successor arrives now
                    arrival[released] = end
                    reqs[released].arrival = end
                    released += 1
        if done_any:
            running = [r for r in running if not r.done]
        t = end
    return Run(reqs, itl, log, preemptions, t, cfg)
