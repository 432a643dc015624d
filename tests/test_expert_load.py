"""--expert_load takes effect on perfcounter's own MoE model (presets such as mixtral-8x7b),
not only on transformers' models, and is refused where it cannot apply."""
import pytest
import torch

from conftest import tiny_args
from perfcounter import count_config
from perfcounter.trace import ROLES

WEIGHT = ROLES.index("weight")


def _weight_read(counter, label):
    return counter.counts[label].trace.per_op_read[WEIGHT]


def test_a_skewed_routing_reads_only_the_experts_it_hits():
    args = tiny_args(num_experts=4, num_activated_experts=2)
    run = dict(batch_size=1, prompt_length=3, new_tokens=2, dtype=torch.float32)
    even = count_config(args, **run)
    one = count_config(args, expert_load="1,0,0,0", **run)
    # prefill: 3 tokens x top-2 = 6 token-slots; evenly they reach min(6, 4) = 4 experts,
    # all to expert 0 they reach 1: 3 experts x (w1, w3, w2: 3 * 48 * 32 * 4 B = 18,432 B)
    # x 2 layers = 110,592 B fewer weight bytes
    assert _weight_read(even, "prefill") - _weight_read(one, "prefill") == 110_592
    # decode: 1 token x top-2 = 2 slots: evenly 2 experts, skewed 1 -> 1 x 18,432 x 2 layers
    assert _weight_read(even, "decode") - _weight_read(one, "decode") == 36_864
    # FLOPs: the even spread pads 6 slots to 2 rows x 4 experts = 8 rows, the skewed one runs
    # exactly 6: 2 rows x 2 layers x 9,360 FLOPs a row (three matmuls 3 * 2 * 48 * 32 = 9,216,
    # SiLU and the product over 48 features 144) = 37,440
    assert even.counts["prefill"].total_flops - one.counts["prefill"].total_flops == 37_440


@pytest.mark.parametrize("args, load, message", [
    (tiny_args(num_experts=4, num_activated_experts=2), "1,2",
     "expert_load has 2 weights, but this model routes over 4 experts"),
    (tiny_args(), "1,1", "this model has no experts"),
])
def test_an_expert_load_that_cannot_apply_is_refused_before_counting(args, load, message):
    with pytest.raises(ValueError, match=message):
        count_config(args, prompt_length=2, new_tokens=2, expert_load=load)
