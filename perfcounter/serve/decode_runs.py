"""Decode stretches: the scheduler's steps of one batch of decodes taken at once.

Most steps of a run decode the same batch: every running request emits one token, and no
request arrives, finishes, is admitted or preempted. `decode_run` takes such a stretch at
once (a perfcounter model without a window, a paged cache of whole blocks: scheduler.py
decides): each step's features follow from the first's (KV positions grow by the batch a
step: a decode's keys, dense and causal pairs are its c + 1), its seconds and joules are the
table's as before, the blocks a step allocates follow from each request's residue modulo the
block size, and the requests' tokens, blocks and inter-token gaps are written at the end. It
gives the very same run, bit for bit, as stepping one request at a time
(tests/test_decode_runs.py holds it to that on random workloads), with O(1) work a step in
place of O(batch) (benchmarks/bench_decode_runs.py times both).
"""
from __future__ import annotations

from array import array

import numpy as np

from perfcounter.serve.steps import EXPERTS


def _stretch(engine) -> tuple | None:
    """(steps that may be taken, the blocks the waiting request admission would look at
    needs: None where it does not look or refuses it whatever the blocks) where every running
    request decodes and no step of them finishes one; None where the next step is no decode
    of the same batch or a waiting request would be admitted now."""
    cfg, running, waiting = engine.cfg, engine.running, engine.waiting
    batch = len(running)
    budget_left = cfg.max_num_batched_tokens - batch
    if budget_left < 0:
        return None
    last = running[-1]  # admitted last: the one likeliest still prefilling (a cheap refusal)
    if last.computed < last.prompt or last.prompt + last.generated - last.computed != 1:
        return None
    for r in running:
        if r.state.value != "running" or r.computed < r.prompt or \
                r.prompt + r.generated - r.computed != 1:
            return None
    steps = min(r.output - r.generated for r in running) - 1  # none finishes in them
    if steps < 2:
        return None
    if not (waiting and budget_left and batch < cfg.max_num_seqs):
        return steps, None
    head = waiting[0]
    if cfg.admission == "no_evict":
        if engine.reserved + cfg.blocks(head.prompt + head.output) <= cfg.kv_blocks:
            return None  # it would be admitted
        return steps, None  # refused for as long as nothing finishes
    todo = min(head.prompt + head.generated - head.computed, budget_left)
    return steps, cfg.blocks(head.computed + todo) - head.blocks


def decode_run(engine, state: list, f: np.ndarray, seconds, energy, touched, log, itl: array,
               step_seconds) -> None:
    """Steps of a decode stretch of scheduler's `engine` taken at once (the module doc);
    state [t, gpu, nxt, released, arrival, late, in_system] updated in place (t, gpu); f the
    features array, seconds and energy the table's, touched its experts (None: dense), log
    and itl the run's Steps and gaps, step_seconds scheduler.step_seconds. Nothing is done
    where the next step is not one: the caller then steps as usual."""
    cfg, running = engine.cfg, engine.running
    t, gpu, nxt, released, arrival, late, in_system = state
    if nxt < released and arrival[nxt] + late <= t:
        return
    stretch = _stretch(engine)
    if stretch is None:
        return
    steps, head_need = stretch
    batch = len(running)
    bs = cfg.block_size
    computed = [r.computed for r in running]
    # blocks: the first step allocates blocks(c + 1) - held per request, in order (a
    # preemption where a prefix of them outgrows the free blocks); step j >= 1 one block to
    # each request whose c + j is a multiple of the block size (blocks(c + j + 1) > blocks(c + j))
    first, prefix, most = [], 0, 0
    for c, r in zip(computed, running):
        first.append((c + bs) // bs - r.blocks)
        prefix += first[-1]
        most = max(most, prefix)
    crossing = [0] * bs
    for c in computed:
        crossing[-c % bs] += 1
    kv0 = sum(computed) + batch
    if touched is not None:
        f[EXPERTS] = touched(batch)
    f[1] = f[2] = batch
    free, ends = engine.free, []
    for j in range(steps):
        if j:
            if nxt < released and arrival[nxt] + late <= t:
                break
            need = crossing[j % bs]
            if need > free:
                break  # a preemption: stepped as usual
        else:
            if most > free:
                break
            need = prefix
        if head_need is not None and head_need <= free - need:
            break  # the waiting request is admitted
        free -= need
        kv = kv0 + j * batch
        f[3] = f[4] = f[5] = kv  # a decode's keys, dense and causal pairs: its c + 1
        dt, gpu = step_seconds(cfg, seconds(f), batch, gpu)
        end = t + dt
        log.start.append(t)
        log.seconds.append(dt)
        log.tokens.append(batch)
        log.seqs.append(batch)
        log.prefill_tokens.append(0)
        log.decode_seqs.append(batch)
        log.kv_blocks.append(cfg.kv_blocks - free)
        log.in_system.append(in_system)
        log.energy_j.append(energy(f, dt) if cfg.sampler is None else
                            energy(f, dt, cfg.sampler.joules(batch)))
        ends.append(end)
        t = end
    k = len(ends)
    if not k:
        return
    gaps = [ends[0] - r.last_token for r in running]
    for j in range(1, k):
        gaps += [ends[j] - ends[j - 1]] * batch
    itl.extend(gaps)
    engine.free = free
    for r, c in zip(running, computed):
        r.computed += k
        r.generated += k
        r.blocks = (c + k + bs - 1) // bs  # blocks(c + k), as the steps allocated them
        r.last_token = t
    state[0], state[1] = t, gpu


__all__ = ["decode_run"]
