"""serve/kv_blocks.py: a sequence's blocks where windowed layers free theirs, by hand."""
from __future__ import annotations

import pytest

from perfcounter.serve.kv_blocks import BlockCost


def tiny(model_type: str, **fields):
    import transformers
    return transformers.AutoConfig.for_model(model_type, **{
        "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "head_dim": 8, **fields})


def test_half_sliding_layers_hold_their_window_only():
    # 2 sliding (window 32: 31 tokens before the newest) and 2 full layers, the same
    # elements each: shares 0.5 and 0.5; blocks of 16
    config = tiny("gpt_oss", num_hidden_layers=4, intermediate_size=16, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=32,
                  layer_types=["sliding_attention", "full_attention"] * 2)
    cost = BlockCost.of(config, 16)
    assert sorted(cost.shares, key=str) == sorted(((0.5, 31), (0.5, None)), key=str)
    # 100 tokens: full layers ceil(100 / 16) = 7 blocks, sliding ones min(7, ceil(31 / 16)
    # + 1 = 3): 0.5 x 7 + 0.5 x 3 = 5
    assert cost(100) == pytest.approx(5.0)
    # 20 tokens: 2 blocks, inside the window: 0.5 x 2 + 0.5 x 2 = 2, as without windows
    assert cost(20) == pytest.approx(2.0)
    assert cost(0) == 0


def test_chunked_layers_and_a_model_without_windows():
    # Llama 4: 3 of 4 layers chunked over 32 tokens (attention_chunk_size), the 4th full
    config = tiny("llama4_text", num_hidden_layers=4, intermediate_size=48,
                  intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=1,
                  no_rope_layers=[1, 1, 1, 0], attention_chunk_size=32)
    cost = BlockCost.of(config, 16)
    # 1,000 tokens: 63 blocks a full layer; a chunked one min(63, ceil(32 / 16) + 1 = 3):
    # 0.25 x 63 + 0.75 x 3 = 18
    assert cost(1000) == pytest.approx(18.0)
    assert BlockCost.of(tiny("qwen3", num_hidden_layers=2, intermediate_size=48), 16) is None


def test_vllm_admits_more_sequences_where_windows_free_blocks():
    import dataclasses

    import numpy as np

    from perfcounter.serve import deployment
    from perfcounter.serve.hf_model import HfArgs
    from perfcounter.serve.scheduler import simulate_engine
    from perfcounter.serve.workload import Workload
    config = tiny("gpt_oss", num_hidden_layers=4, intermediate_size=16, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=32,
                  layer_types=["sliding_attention", "full_attention"] * 2)
    args = HfArgs.of(config, "gpt_oss")
    vllm = deployment(args, "h100-sxm", execution="bound", engine="vllm")
    sglang = deployment(args, "h100-sxm", execution="bound", engine="sglang")
    assert vllm.engine.block_cost is not None and sglang.engine.block_cost is None
    # a pool of 80 blocks, 30 prompts of 100 tokens: each holds ceil(100 / 16) = 7 blocks
    # where every layer keeps every token (80 // 7 = 11 admitted in the first step), 0.5 x 7
    # + 0.5 x 3 = 5 where the sliding layers free theirs (80 // 5 = 16)
    n = 30
    w = Workload(np.zeros(n), np.full(n, 100), np.full(n, 4), np.zeros(n, dtype=np.int64),
                 None, "fixed")
    first = {}
    for name, dep in (("held", sglang), ("freed", vllm)):
        cfg = dataclasses.replace(dep.engine, kv_blocks=80, max_num_seqs=64,
                                  max_num_batched_tokens=8192)
        first[name] = simulate_engine(w, dep.table, cfg).steps.seqs[0]
    assert first == {"held": 11, "freed": 16}


def test_disaggregated_pools_hold_every_token(monkeypatch):
    # vLLM turns its hybrid KV cache manager off under a KV transfer: the pools' engines hold
    # every layer's blocks (no block_cost), where one deployment frees the sliding layers'
    import perfcounter.serve.api as api
    from perfcounter.serve import deployment, synthetic
    from perfcounter.serve.hf_model import HfArgs
    config = tiny("gpt_oss", num_hidden_layers=4, intermediate_size=16, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=32,
                  layer_types=["sliding_attention", "full_attention"] * 2)
    args = HfArgs.of(config, "gpt_oss")
    assert deployment(args, "h100-sxm", execution="bound").engine.block_cost is not None
    seen = []
    monkeypatch.setattr(api, "simulate_pools", lambda w, *rest, **kw: seen.extend(rest[:2]))
    api.disaggregated(args, synthetic(2, 16, 2, qps=1, seed=0), "h100-sxm", "h100-sxm",
                      execution="bound")
    assert len(seen) == 2 and all(d.engine.block_cost is None for d in seen)


def test_the_docs_gpt_oss_figure():
    # docs/serve.md and the module doc: gpt-oss-120b (18 of 36 layers sliding over 128 tokens,
    # 127 held before the newest) at 2,000 tokens: 0.5 x ceil(2000 / 16) + 0.5 x (ceil(127 /
    # 16) + 1) = 0.5 x 125 + 0.5 x 9 = 67 blocks, not 125
    from perfcounter.models.hf_presets import counted_config
    assert BlockCost.of(counted_config("gpt-oss-120b"), 16)(2000) == pytest.approx(67.0)
