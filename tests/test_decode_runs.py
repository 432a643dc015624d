"""serve/decode_runs.py: a stretch of decode steps taken at once gives the very run that
stepping one request at a time gives, bit for bit (every request's times, every gap, every
step's row), across open and closed loops, preemption, both admissions, chunked prefill,
the engine's host costs and a mixture of experts; and it takes most steps of a decode-heavy
run."""
import dataclasses

import numpy as np
import pytest

from perfcounter.devices import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.serve import deployment
from perfcounter.serve import scheduler
from perfcounter.serve.sampler import SamplerCost, kernels, parse_sampling
from perfcounter.serve.scheduler import simulate_engine
from perfcounter.serve.workload import Workload

TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
MOE = dataclasses.replace(TINY, num_experts=8, num_activated_experts=2)


@pytest.fixture(scope="module")
def tables():
    return {name: deployment(args, "h100-sxm", max_num_seqs=64, max_num_batched_tokens=512,
                             execution=execution)
            for name, args, execution in (("dense", TINY, "cudagraphs"), ("moe", MOE, "bound"))}


def _run(w, table, cfg, fast, monkeypatch):
    monkeypatch.setattr(scheduler, "DECODE_RUNS", fast)
    calls = []
    original = scheduler.decode_run

    def counted(engine, state, *a):
        before = len(a[4].start)
        original(engine, state, *a)
        calls.append(len(a[4].start) - before)
    monkeypatch.setattr(scheduler, "decode_run", counted)
    return simulate_engine(w, table, cfg), sum(calls)


def _same(a, b):
    assert [dataclasses.astuple(r) for r in a.requests] == \
        [dataclasses.astuple(r) for r in b.requests]
    assert a.itl == b.itl  # array('d'): every gap, in order, bit for bit
    for column in dataclasses.fields(a.steps):
        assert getattr(a.steps, column.name) == getattr(b.steps, column.name), column.name
    assert (a.preemptions, a.end) == (b.preemptions, b.end)


def _workload(rng, n, closed):
    arrival = np.sort(rng.exponential(0.002, n).cumsum())
    prompt = rng.integers(1, 700, n)
    output = rng.integers(1, 90, n)
    cached = (prompt * rng.uniform(0, 0.5, n)).astype(np.int64) * rng.integers(0, 2, n)
    return Workload(arrival, prompt, output, cached,
                    concurrency=int(rng.integers(1, 40)) if closed else None)


@pytest.mark.parametrize("seed", range(12))
def test_the_same_run_as_step_by_step(seed, tables, monkeypatch):
    rng = np.random.default_rng(seed)
    dep = tables["moe" if seed % 3 == 2 else "dense"]
    cfg = dataclasses.replace(
        dep.engine,
        kv_blocks=int(rng.choice([60, 150, 100_000])),  # 60: preemptions
        max_num_seqs=int(rng.choice([4, 16, 64])),
        max_num_batched_tokens=int(rng.choice([32, 512])),
        admission="no_evict" if seed % 4 == 3 else "recompute",
        async_scheduling=bool(seed % 2), seq_overhead_s=2e-5 * (seed % 2),
        step_overhead_s=1e-4, request_overhead_s=3e-4 * (seed % 3 == 0),
        sampler=SamplerCost(get_device_spec("h100-sxm"), 64,
                            kernels(parse_sampling("temperature=0.8,top_p=0.95")))
        if seed % 2 else None)
    w = _workload(rng, 80, closed=seed % 5 == 4)
    slow, none = _run(w, dep.table, cfg, False, monkeypatch)
    fast, taken = _run(w, dep.table, cfg, True, monkeypatch)
    assert none == 0
    assert taken > len(fast.steps.start) // 20  # the stretches were taken (most seeds: most)
    _same(slow, fast)


def test_a_decode_heavy_run_is_taken_in_stretches(tables, monkeypatch):
    # 32 requests at once, prompt 64, 200 tokens out, a budget of 4,096 tokens: step 1
    # prefills every prompt (2,048 tokens) and emits each first token; then every step
    # decodes the same 32 until the 200th tokens. After step 1 the stretch takes the
    # steps that emit tokens 2..199 (198: none finishes in them), and step 200, where
    # every request finishes, is stepped as usual: 200 steps, 198 of them the stretch's
    dep = tables["dense"]
    cfg = dataclasses.replace(dep.engine, max_num_batched_tokens=4096)
    w = Workload(np.zeros(32), np.full(32, 64), np.full(32, 200), np.zeros(32, np.int64))
    slow, _ = _run(w, dep.table, cfg, False, monkeypatch)
    fast, taken = _run(w, dep.table, cfg, True, monkeypatch)
    _same(slow, fast)
    assert len(fast.steps.start) == 200 and taken == 198
    assert len(fast.itl) == 32 * 199  # every gap between a request's 200 tokens
