"""A model's weights as stored, one rule (models/stored_weights.py) for serve's memory plan, a
rank's memory (parallel.memory.rank_bytes) and the fit lines: a tiny mixture of experts and
one expert-parallel rank of it, float and int8, derived by hand."""
import torch

from perfcounter.models import stored_weights as S
from perfcounter.models.args import ModelArgs
from perfcounter.parallel import ParallelConfig, rank_args
from perfcounter.parallel.memory import rank_bytes
from perfcounter.quant.quantize import WeightScheme
from perfcounter.serve.memory import memory_plan, weight_bytes

BF16 = torch.bfloat16
# 3 layers, 2 heads of 4 (1 KV head), 4 experts of width 4 (2 a token), a vocabulary of 16
MOE = ModelArgs(block_size=64, vocab_size=16, n_layer=3, n_head=2, n_local_heads=1, dim=8,
                intermediate_size=4, num_experts=4, num_activated_experts=2)
# TP 2 with expert parallelism: EP = 2, so 1 head, 1 KV head, 2 whole experts, the router over
# all 4; the vocabulary padded to 64 and split: 32 rows
RANK = rank_args(MOE, ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True))


def test_float_weights_by_hand():
    # a layer: wqkv 8 x (8 + 2 x 4) = 128, wo 8 x 8 = 64, 4 experts x 3 x 8 x 4 = 384, router
    # 8 x 4 = 32, 2 norms x 8 = 16 -> 624; x 3 = 1,872 + embedding 16 x 8 = 128, output 128,
    # norm 8 = 2,136 parameters x 2 B
    assert S.weight_params(MOE) == 2_136
    assert weight_bytes(MOE, BF16) == 4_272
    # the rank: wqkv 8 x (4 + 2 x 4) = 96, wo 4 x 8 = 32, 2 experts x 96 = 192, the router
    # over all 4 experts 8 x 4 = 32, norms 16 -> 368; x 3 = 1,104 + embedding 32 x 8 = 256,
    # output 256, norm 8 = 1,624 x 2 B
    assert S.weight_params(RANK) == 1_624
    assert weight_bytes(RANK, BF16) == 3_248


def test_int8_weights_by_hand_are_one_layer_repeated():
    # int8: a byte an element and a bfloat16 scale a row (an expert's rows each); the
    # embedding and norms stay bfloat16, the output is quantized (untied). The rank's layer:
    # wqkv 12 x 8 + 12 x 2 = 120, wo 8 x 4 + 8 x 2 = 48, router 4 x 8 + 4 x 2 = 40, w1 and
    # w3 2 x 4 x 8 + 2 x 4 x 2 = 80 each, w2 2 x 8 x 4 + 2 x 8 x 2 = 96, norms 2 x 16 = 32
    # -> 496; x 3 = 1,488 + embedding 32 x 8 x 2 = 512, norm 16, output 32 x 8 + 32 x 2 = 320
    S.cache_clear()
    int8 = WeightScheme("int8")
    assert weight_bytes(RANK, BF16, int8) == 1_488 + 512 + 16 + 320 == 2_336
    assert weight_bytes(RANK, BF16, int8) == 2_336
    assert S.cache_info() == S.CacheInfo(hits=1, misses=1, currsize=1)  # one fake model


def test_a_rank_and_serve_weigh_by_the_one_rule():
    # 2 sequences of 10 tokens: K and V x 3 layers x 1 KV head x 4 x 2 B x 20 = 960 B
    assert rank_bytes(RANK, BF16, batch=2, tokens=10) == (3_248, 960)
    assert memory_plan(RANK, BF16, None, device_bytes=1e9).weight_bytes == 3_248


def test_the_cache_key_is_typed():
    # rope_base 10000 and 10000.0 compare (and hash) alike; the key keeps them apart
    S.cache_clear()
    int8 = WeightScheme("int8")
    a, b = ModelArgs(**{**vars(MOE), "rope_base": 10000}), ModelArgs(**{**vars(MOE),
                                                                       "rope_base": 10000.0})
    assert a == b
    assert weight_bytes(a, BF16, int8) == weight_bytes(b, BF16, int8)
    assert S.cache_info() == S.CacheInfo(hits=0, misses=2, currsize=2)
