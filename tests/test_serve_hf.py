"""serve on transformers' own modeling code (serve/hf_model.py, ragged_hf.py, steps_hf.py):
tiny configs of each new model_type, the step table held to counting the same step on the
whole model, tensor parallelism by the config's plan, the KV cache as the engines store it,
and bad input refused in one line."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from perfcounter.generation.config_only import fake_hf_model
from perfcounter.models.args import ModelArgs
from perfcounter.serve import deployment
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import HfArgs, rank_model_kinds, tp_rules
from perfcounter.serve.ragged import Piece
from perfcounter.serve.ragged_hf import count_hf_step
from perfcounter.serve.resolve import resolve_model
from perfcounter.serve.steps import counted_features
from perfcounter.serve.steps_hf import count_hf_table as count_table


def tiny(model_type: str, **fields):
    import transformers
    return transformers.AutoConfig.for_model(model_type, **{
        "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, **fields})


TINY = {  # two layers of each kind at least; windows of 32, past LOCAL_COUNTED (16)
    "qwen3": dict(num_hidden_layers=2, intermediate_size=48, head_dim=8),
    "qwen3_moe": dict(num_hidden_layers=3, mlp_only_layers=[0], decoder_sparse_step=1,
                      intermediate_size=48, moe_intermediate_size=16, num_experts=16,
                      num_experts_per_tok=2, head_dim=8),
    "deepseek_v3": dict(num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=48,
                        num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=16,
                        num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=8),
    "gpt_oss": dict(num_hidden_layers=4, intermediate_size=16, num_local_experts=16,
                    num_experts_per_tok=2, head_dim=8, sliding_window=32,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    "gemma3_text": dict(num_hidden_layers=4, intermediate_size=48, head_dim=8, sliding_window=32,
                        layer_types=["sliding_attention", "full_attention"] * 2),
    "llama4_text": dict(num_hidden_layers=4, intermediate_size=48, intermediate_size_mlp=64,
                        num_local_experts=16, num_experts_per_tok=1, head_dim=8,
                        moe_layers=[1, 3], no_rope_layers=[1, 1, 1, 0], attention_chunk_size=32),
}
HELD_OUT = [(5, 37), (1, 120), (1, 11), (3, 0)]  # a step no fit counted: prefill, decodes


def _figures(trace):
    flops = sum(r.flops for r in trace.records)
    executed = sum(r.executed_flops for r in trace.records)
    return flops, executed, sum(r.bytes for r in trace.records)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
@pytest.mark.parametrize("model_type", list(TINY))
def test_step_table_equals_counting_the_whole_model(model_type):
    # the table counts one layer of each kind (windows shrunk to 16) and derives the rest;
    # counting the held-out step on the whole model (windows of 32) gives the same figures
    args = HfArgs.of(tiny(model_type, **TINY[model_type]), model_type)
    counts = count_table(args, torch.bfloat16)
    model, mode = fake_hf_model(args.config, dtype=torch.bfloat16)
    direct = _figures(count_hf_step(model, mode, [Piece(*p) for p in HELD_OUT]))
    # the experts as counting without data spreads them (min(T k, E) touched); the table
    # prices a step at the expectation of uniform routing (steps.py's module doc)
    table = counts.totals(counted_features(HELD_OUT, None, counts.experts, local=counts.local,
                                           mla=counts.mla))
    assert (round(table["flops"]), round(table["executed_flops"]),
            round(table["bytes"])) == direct


def _linears(trace) -> dict:
    """{linear's path without its layer index: (FLOPs, weight bytes read)} of a trace."""
    out: dict = {}
    for r in trace.records:
        if r.op in ("aten.mm.default", "aten.addmm.default") and ".layers." in r.module:
            key = r.module.split(".layers.", 1)[1].split(".", 1)[1]
            f, w = out.get(key, (0, 0))
            out[key] = (f + r.flops, w + r.read[0])
    return out


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_tensor_parallel_halves_each_sharded_linear(model_type):
    # TP 2: q, k, v, gate, up column-parallel (out / 2), o and down row-parallel (in / 2): each
    # linear's FLOPs 2 M N K and weight bytes N K x 2 halve exactly (4 heads -> 2, 2 KV heads
    # -> 1, intermediate 48 -> 24); every layer's attention and feed-forward all-reduce
    args = HfArgs.of(tiny(model_type, **TINY[model_type]), model_type)
    steps = [Piece(4, 6), Piece(1, 9)]
    reps = rank_model_kinds(args)
    full_model, full_mode = fake_hf_model(args.rank_config(reps))
    rank = args.sharded(2)
    rank_model, rank_mode = fake_hf_model(rank.rank_config(reps))
    whole = _linears(count_hf_step(full_model, full_mode, steps))
    trace = count_hf_step(rank_model, rank_mode, steps, tp=2)
    half = _linears(trace)
    assert whole and set(half) == set(whole)
    for key, (flops, weight) in whole.items():
        assert half[key] == (flops // 2, weight // 2), key
    reduces = [r for r in trace.records if r.op == "perfcounter.all_reduce.default"]
    # per layer attention + feed-forward, and the vocabulary-parallel embedding
    assert len(reduces) == 2 * len(reps) + 1
    rules = tp_rules(full_model, rank_model, 2)
    assert rules["model.layers.*.self_attn.q_proj"] == "colwise"
    assert rules["model.layers.*.self_attn.o_proj"] == "rowwise"
    assert rules["model.layers.*.mlp.down_proj"] == "rowwise"


def test_kv_bytes_per_token_as_the_engines_store_it():
    # DeepSeek-V3: the latent and the rope key, (512 + 64) x 61 layers x 2 B = 70,272 B
    deepseek = resolve_model("deepseek-v3")
    assert isinstance(deepseek, HfArgs)
    assert deepseek.kv_elements_per_token() * 2 == (512 + 64) * 61 * 2 == 70_272
    # Qwen3-8B: K and V, 8 KV heads x 128 x 36 layers x 2 B = 147,456 B; at TP 4 each rank
    # holds 2 KV heads: a quarter, 36,864 B
    qwen = resolve_model("qwen3-8b")
    assert qwen.kv_elements_per_token() * 2 == 2 * 8 * 128 * 36 * 2 == 147_456
    assert qwen.sharded(4).kv_elements_per_token() * 2 == 36_864


def test_weights_of_a_preset_are_its_published_parameters():
    # huggingface.co/Qwen/Qwen3-8B: "Number of Parameters: 8.2B" (a rank of TP 2 holds half
    # of every sharded weight, the norms whole)
    qwen = resolve_model("qwen3-8b")
    assert qwen.weight_params() == pytest.approx(8.2e9, rel=0.005)
    assert qwen.sharded(2).weight_params() == pytest.approx(qwen.weight_params() / 2, rel=0.001)


def test_our_architectures_stay_on_our_model():
    assert isinstance(resolve_model("llama-3-8b"), ModelArgs)
    assert isinstance(resolve_model("mixtral-8x7b"), ModelArgs)
    assert isinstance(resolve_model("qwen3-30b-a3b"), HfArgs)


def test_a_preset_serves_and_fits_its_memory_plan():
    dep = deployment("qwen3-8b", "h100-sxm", execution="bound")
    # 8.19e9 parameters x 2 B = 16.4 GB of 80 GB x 0.9: fits, its KV cache 147,456 B a token
    assert dep.plan.fits and dep.plan.kv_bytes_per_token == 147_456
    assert dep.plan.weight_bytes == pytest.approx(16.4e9, rel=0.005)
    assert dep.table.price([(1, 1000)]) > 0


@pytest.mark.parametrize("options, line", [
    (dict(enable_expert_parallel=True), "has no experts"),
    (dict(tensor_parallel_size=3), "does not divide num_attention_heads 32"),
    (dict(pipeline_parallel_size=37), "--pipeline_parallel_size 37: qwen3-8b has 36 layers"),
    (dict(quantize="int8"), "--quantize"),
])
def test_bad_parallel_input_is_one_line(options, line):
    with pytest.raises(ServeError, match=line):
        deployment("qwen3-8b", "h100-sxm", **options)


def test_cli_refuses_before_any_counting(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "no_such_model", "hidden_size": 8}')
    for flags, line in ((["--model", str(path)], "'no_such_model' is not a transformers"),
                        (["--model", "qwen3-8b", "--enable_expert_parallel"], "has no experts")):
        done = subprocess.run([sys.executable, "-m", "perfcounter.cli", "serve", *flags,
                               "--device_spec", "h100-sxm", "--num_requests", "2", "--qps", "1"],
                              capture_output=True, text=True)
        assert done.returncode == 2
        last = [x for x in done.stderr.splitlines() if x.strip()][-1]
        assert line in last and "Traceback" not in done.stderr


def test_decode_attention_counts_every_cached_position():
    # a decode after 127 cached tokens computes 128 query-key pairs a head (the cache primed
    # as written by earlier steps, ragged.prime_caches), not 1
    args = HfArgs.of(tiny("qwen3", **TINY["qwen3"]), "qwen3")
    model, mode = fake_hf_model(args.config)
    trace = count_hf_step(model, mode, [Piece(1, 127)])
    attention = [r for r in trace.records if "flash_attention" in r.op]
    one = attention[0]
    # q·k and p·v: 2 x 8 MACs each = 32 FLOPs a pair, 4 heads, 128 pairs, + softmax's own
    assert one.executed_flops >= 4 * 128 * 32
    assert np.isclose(one.executed_flops, one.flops)  # one query: dense is causal


def test_stored_formats_by_hand():
    from perfcounter.serve.hf_stored import StoredFormat
    fp8 = StoredFormat("fp8", (128, 128))
    # a [7168, 1536] weight (DeepSeek-V3's q_b_proj is [24576, 1536]): 1 B an element and a
    # float32 scale per 128 x 128 block: 7168 x 1536 + 56 x 12 x 4 = 11,010,048 + 2,688
    w = torch.empty(7168, 1536, device="meta")
    assert fp8.nbytes("model.layers.3.self_attn.q_b_proj.weight", w) == 11_010_048 + 2_688
    # stacked experts [256, 4096, 7168]: per expert 4096 x 7168 + 32 x 56 x 4
    e = torch.empty(256, 4096, 7168, device="meta")
    assert fp8.nbytes("model.layers.3.mlp.experts.gate_up_proj", e) == \
        256 * 4096 * 7168 + 256 * 32 * 56 * 4
    # never converted: the router, the embedding, the head, norms
    for name in ("model.layers.3.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                 "model.layers.3.input_layernorm.weight"):
        assert fp8.nbytes(name, w) is None
    # mxfp4 (gpt-oss): experts only, 4 bits + an 8-bit scale per 32: [32, 5760, 2880] ->
    # 530,841,600 elements x 17 / 32 = 282,009,600 B; attention stays float
    mx = StoredFormat("mxfp4", skip=("model.layers.*.self_attn",))
    x = torch.empty(32, 5760, 2880, device="meta")
    assert mx.nbytes("model.layers.0.mlp.experts.gate_up_proj", x) == 282_009_600
    assert mx.nbytes("model.layers.0.self_attn.q_proj.weight", w) is None


def test_presets_priced_as_their_checkpoints_ship():
    # gpt-oss-120b: 116.8e9 parameters, its experts in MXFP4: the checkpoint's ~65 GB (the
    # model card, arxiv.org/abs/2508.10925: "fits on a single 80GB GPU")
    oss = resolve_model("gpt-oss-120b")
    assert oss.stored.method == "mxfp4"
    assert 60e9 < oss.weight_bytes(torch.bfloat16) < 67e9
    # DeepSeek-V3: 671e9 parameters, nearly all FP8: 1 B each + bf16 embedding and head
    ds = resolve_model("deepseek-v3")
    assert ds.weight_bytes(torch.bfloat16) == pytest.approx(671e9, rel=0.01)


def test_plan_searches_a_transformers_model(tmp_path):
    from perfcounter.plan.search import plan
    path = tmp_path / "config.json"
    tiny("qwen3", **TINY["qwen3"]).to_json_file(str(path))
    result = plan(str(path), "h100-sxm:2", slo="ttft=2s,tpot=100ms", qps=2.0, num_requests=8,
                  prompt_length="64", max_new_tokens="8", max_num_seqs=(8,))
    # bfloat16 as stored, its cache at the precision; TP 1 and 2 (4 heads, 2 KV heads), DP
    # up to the pool; one node: no pipeline stages (PP across nodes), a dense model: no EP
    sizes = {(c.tensor_parallel_size, c.pipeline_parallel_size, c.data_parallel_size)
             for c in result.candidates}
    assert sizes == {(1, 1, 1), (1, 1, 2), (2, 1, 1)}
    assert {(c.quantization, c.kv_cache_dtype) for c in result.candidates} == {(None, None)}
    assert result.recommended is not None


def test_plan_searches_stages_and_experts_of_a_transformers_model(tmp_path):
    from perfcounter.plan.search import plan
    path = tmp_path / "config.json"
    tiny("qwen3_moe", **TINY["qwen3_moe"]).to_json_file(str(path))
    result = plan(str(path), "h100-sxm:4", slo="ttft=2s,tpot=100ms", qps=2.0, num_requests=4,
                  prompt_length="64", max_new_tokens="8", max_num_seqs=(8,),
                  pipeline_parallel_size=(1, 2), disaggregated=False, workers=1)
    sizes = {(c.tensor_parallel_size, c.pipeline_parallel_size, c.data_parallel_size,
              c.enable_expert_parallel) for c in result.candidates}
    # pipeline stages asked: TP x PP within the 4 GPUs; EP where TP x DP > 1 shares the 16
    # experts (top-2) evenly, TP and DP both above 1 included
    assert {(1, 2, 1, False), (2, 2, 1, True), (2, 1, 2, True)} <= sizes
    served = [c for c, f in zip(result.candidates, result.figures)
              if f and "error" not in f and c.pipeline_parallel_size == 2]
    assert served, "no pipeline candidate simulated"


def test_a_llama_on_either_path_runs_the_same_matmuls_and_attention():
    # our model (ragged.count_step) and transformers' Llama (ragged_hf) for one tiny config
    # and step: each linear's and attention's FLOPs and weight / KV bytes are the same; what
    # differs is elementwise (transformers computes RoPE's cos and sin a step and its RMSNorm
    # in float32; ours reads a table), which is why our four architectures stay on our model
    from perfcounter.generation.config_only import hf_config
    from perfcounter.serve.ragged import count_step
    args = ModelArgs(block_size=256, vocab_size=64, n_layer=2, n_head=4, dim=32,
                     n_local_heads=2, intermediate_size=48)
    step = [Piece(5, 37), Piece(1, 120)]
    ours = count_step(args, step, torch.bfloat16)
    model, mode = fake_hf_model(hf_config(args), dtype=torch.bfloat16)
    theirs = count_hf_step(model, mode, step)

    def heavy(trace):
        mm = [r for r in trace.records if r.op in ("aten.mm.default", "aten.addmm.default")]
        att = [r for r in trace.records if "flash_attention" in r.op]
        return (sum(r.flops for r in mm), sum(r.read[0] for r in mm),
                sum(r.executed_flops for r in att), sum(r.read[1] for r in att))
    assert heavy(ours) == heavy(theirs)


def test_expert_parallel_over_data_parallel_ranks():
    # Qwen3-MoE tiny: 16 experts, top-2, DP 2 with EP: a rank holds 8 whole experts (16
    # routed widths each) and routes its tokens' rows to them; each token goes to
    # min(k, EP) = 2 ranks and back: two all-to-alls of 2 x T x D elements a MoE layer
    args = HfArgs.of(tiny("qwen3_moe", **TINY["qwen3_moe"]), "qwen3_moe")
    dep = deployment(args, "h100-sxm", data_parallel_size=2, enable_expert_parallel=True,
                     execution="bound")
    rank = dep.args
    assert (rank.expert_parallel_size, rank.num_experts, rank.rank.moe_intermediate_size) == \
        (2, 8, 16)
    model, mode = fake_hf_model(rank.rank_config(rank_model_kinds(rank)))
    trace = count_hf_step(model, mode, [Piece(3, 5), Piece(1, 9)], ep=2)
    a2a = [r for r in trace.records if r.op == "perfcounter.all_to_all.default"]
    # one MoE layer of the counted model (the dense first layer has none): T = 4 tokens,
    # D = 32, 2 copies, bfloat16: 4 x 32 x 2 x 2 B = 512 B read each way
    assert len(a2a) == 2 and all(r.read[2] == 4 * 32 * 2 * 2 for r in a2a)
    # the weights a rank holds: attention whole, half the experts: below the whole model's
    assert dep.plan.weight_bytes < HfArgs.of(args.config, "x").weight_bytes(torch.bfloat16)


def test_expert_parallel_refusals():
    with pytest.raises(ServeError, match="do not share 128 experts"):
        deployment("qwen3-30b-a3b", "h100-sxm", data_parallel_size=32,
                   enable_expert_parallel=True)
    with pytest.raises(ServeError, match="do not share 128 experts"):
        deployment("qwen3-30b-a3b", "h100-sxm", tensor_parallel_size=4, data_parallel_size=32,
                   enable_expert_parallel=True)


def test_expert_parallel_over_tensor_and_data_parallel_ranks():
    # Qwen3-MoE tiny (16 experts of width 16, top-2) on TP 2 x DP 2 with EP (vLLM's: over
    # the 4 ranks): a rank holds 16 / DP = 8 experts, each 16 / TP = 8 wide: 8 x 3 x 32 x 8
    # = 6,144 expert parameters a MoE layer, as 16 / 4 = 4 whole experts (4 x 3 x 32 x 16)
    args = HfArgs.of(tiny("qwen3_moe", **TINY["qwen3_moe"]), "qwen3_moe")
    dep = deployment(args, "h100-sxm", tensor_parallel_size=2, data_parallel_size=2,
                     enable_expert_parallel=True, execution="bound")
    rank = dep.args
    assert (rank.tensor_parallel_size, rank.expert_parallel_size, rank.num_experts,
            rank.rank.moe_intermediate_size) == (2, 2, 8, 8)
    model, mode = fake_hf_model(rank.rank_config(rank_model_kinds(rank)))
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert experts == 8 * 3 * 32 * 8 == 4 * 3 * 32 * 16
    trace = count_hf_step(model, mode, [Piece(3, 5), Piece(1, 9)], tp=2, ep=2)
    a2a = [r for r in trace.records if r.op == "perfcounter.all_to_all.default"]
    # one MoE layer: T = 4 tokens x D = 32 x min(k, TP x DP) = 2 copies x 2 B = 512 B each
    # way, over the TP x DP = 4 ranks
    assert len(a2a) == 2 and all(r.read[2] == 4 * 32 * 2 * 2 and r.args[1] == 4 for r in a2a)


def test_pipeline_stages_split_layers_as_vllm_does():
    from perfcounter.serve.hf_shard import pipeline_stages
    # 61 layers on 2 stages: 30 each, the 1 left over to the second-to-last (the first)
    assert pipeline_stages(61, 2) == [(0, 31), (31, 61)]
    # 10 on 4: 2 each, 2 left over to stages -2 and -3: sizes 2, 3, 3, 2
    assert pipeline_stages(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert pipeline_stages(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_pipeline_stage_is_the_heaviest_and_priced_on_its_layers():
    # DeepSeek-V3 tiny, 5 layers, the first 2 dense (feed-forward 3 x 32 x 48 = 4,608) and 3
    # of 16 experts (16 x 3 x 32 x 16 = 24,576, + a shared one and the router): PP 3 splits
    # them 2, 2, 1 (pipeline_stages): stage 1 holds two MoE layers, the most parameters
    config = tiny("deepseek_v3", **{**TINY["deepseek_v3"], "num_hidden_layers": 5,
                                    "first_k_dense_replace": 2})
    args = HfArgs.of(config, "deepseek_v3")
    dep = deployment(args, "h100-sxm", pipeline_parallel_size=3, execution="bound")
    rank = dep.args
    assert (rank.layers, rank.n_layer) == ((2, 4), 2)
    assert dep.parallel.pipeline_parallel_size == 3 and dep.parallel.gpus == 3
    from perfcounter.serve.hf_model import kind_params
    outside, per_kind = kind_params(args)
    moe = next(k for k in per_kind if "experts=1" in k)
    # the rank holds the embedding and head (outside the layers) and its two MoE layers
    assert rank.weight_params() == outside + 2 * per_kind[moe]
    # its KV cache: MLA's latent 16 + rope key 8 elements a token a layer, 2 layers
    assert rank.kv_elements_per_token() == 2 * (16 + 8)
    # a decode step through the 3 stages takes 3 x the stage's step + 2 hops
    f = dep.table.counts.features([(1, 64)])
    from perfcounter.serve.replicas import staged
    stage = dep.table.seconds(f)
    assert 3 * stage < staged(dep).seconds(f) < 3 * stage + 2 * 10e-6


def test_a_transformers_model_serves_on_pipeline_stages():
    from perfcounter.serve import serve, synthetic
    args = HfArgs.of(tiny("qwen3", **{**TINY["qwen3"], "num_hidden_layers": 4}), "qwen3")
    one = deployment(args, "h100-sxm", execution="bound")
    pp = deployment(args, "h100-sxm", pipeline_parallel_size=2, execution="bound")
    # a stage holds 2 of the 4 layers: half the KV cache a token (2 x 2 heads x 8 x 2 B a
    # layer = 64 B; 128 B for 2 layers) and one stage's step counts 2 layers
    assert (one.plan.kv_bytes_per_token, pp.plan.kv_bytes_per_token) == (256, 128)
    run = serve(pp, synthetic(4, 32, 4, qps=10, seed=0))
    assert run.metrics["completed"] == 4


def test_a_model_that_does_not_fit_names_the_smallest_layouts_that_do():
    from perfcounter.serve.hf_shard import smallest_fit
    args = HfArgs.of(tiny("deepseek_v3", **TINY["deepseek_v3"]), "deepseek_v3")
    whole = args.weight_bytes(torch.bfloat16)  # 157,360 B
    tp2 = args.sharded(2).weight_bytes(torch.bfloat16)  # heads, widths, vocabulary halved
    ep2 = args.sharded(1, 2).weight_bytes(torch.bfloat16)  # 8 of the 16 experts a rank
    assert tp2 < ep2 < 0.7 * whole
    # 0.7 of the weights' room: one GPU does not hold them, both 2-GPU layouts do
    assert smallest_fit(args, torch.bfloat16, 0.7 * whole, 8) == (
        "smallest fit: --tensor_parallel_size 2 (0.00 GB of weights a rank); "
        "--data_parallel_size 2 --enable_expert_parallel (0.00 GB of weights a rank)")
    assert smallest_fit(args, torch.bfloat16, whole + 1, 8).startswith(
        "smallest fit: --tensor_parallel_size 1 (")
    assert smallest_fit(args, torch.bfloat16, 10, 8) == "smallest fit: none up to 64 GPUs"
    with pytest.raises(ServeError, match="smallest fit: --tensor_parallel_size 8"):
        deployment("deepseek-v3", "h100-sxm", execution="bound")


def test_fit_steps_saturate_the_experts():
    from perfcounter.serve.steps_hf import FIT, saturating
    # 64 experts, top-2: FIT's largest step, 32 tokens, routes 64 rows, none past E: two
    # steps added, of ceil(2 x 64 / 2) = 64 tokens (128 rows)
    assert saturating(FIT, (64, 2)) == ([(64, 0)], [(64, 16), (1, 40)])
    # 16 experts, top-2: steps of 9 tokens or more saturate; FIT has several
    assert saturating(FIT, (16, 2)) == ()
    assert saturating(FIT, None) == ()


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_a_large_batch_reads_each_expert_once():
    # 64 experts, top-2: without saturating steps the fit priced part of an expert's weights
    # per token, and 300 decode tokens read them ~300 x 2 / 64 times over; the table now
    # equals counting the step on the whole model (every expert touched once) within 1 %
    config = tiny("qwen3_moe", **{**TINY["qwen3_moe"], "num_experts": 64})
    args = HfArgs.of(config, "qwen3_moe")
    counts = count_table(args, torch.bfloat16)
    model, mode = fake_hf_model(args.config, dtype=torch.bfloat16)
    step = [(1, 20)] * 300
    direct = _figures(count_hf_step(model, mode, [Piece(*p) for p in step]))
    table = counts.totals(counted_features(step, None, counts.experts))
    assert table["bytes"] == pytest.approx(direct[2], rel=0.01)
    assert table["flops"] == pytest.approx(direct[0], rel=0.01)


def test_a_multimodal_config_json_serves_its_language_model(tmp_path):
    # Gemma 3's published config.json (Gemma3Config: text_config and vision_config) resolves
    # to its language model, as the preset does: the same 62 layers and parameters
    from perfcounter.models.hf_presets import preset_config
    path = tmp_path / "config.json"
    path.write_text(preset_config("gemma-3-27b").to_json_string())
    args, preset = resolve_model(str(path)), resolve_model("gemma-3-27b")
    assert (args.model_type, args.n_layer) == ("gemma3_text", 62)
    assert args.config_json == preset.config_json


def test_serve_plan_lines_of_a_transformers_model():
    from perfcounter.serve.render import plan_text, smallest_fit_text
    dep = deployment("qwen3-8b", "h100-sxm", execution="bound")
    # its layouts as stored, no --quantize (which prices perfcounter's own model only)
    assert smallest_fit_text("qwen3-8b", dep) == (
        f"smallest fit: --tensor_parallel_size 1 ({dep.plan.weight_bytes / 1e9:.2f} GB of "
        "weights a rank)")
    # gpt-oss tiny under vLLM: half its layers slide over 32 tokens; at 1,000 tokens of
    # context a sequence holds 0.5 x 63 + 0.5 x 3 = 33 blocks, not 63
    config = tiny("gpt_oss", **TINY["gpt_oss"])
    windowed = deployment(HfArgs.of(config, "gpt_oss"), "h100-sxm", execution="bound")
    text = plan_text(windowed, context=1000)
    blocks = windowed.plan.kv_blocks
    assert f"largest batch at 1,000 tokens of context: {blocks // 33:,} (windowed" in text
