"""A record's arguments as data (trace_args.py): shapes, strides and dtypes as tuples, built
when counting, derived for other context lengths, written to JSON and read back."""
import json
import math

import pytest
import torch
import transformers

from conftest import make_hf_model
from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.generation.step_fit import difference, fit_steps
from perfcounter.models.tokenizer import cache_keyword
from perfcounter.trace import OpRecord, Trace, args_from_text
from perfcounter.trace_args import (Const, Keyword, TensorArg, contiguous, numbers, pattern,
                                    signature, tensor_args, with_numbers)


def counted(fn, *args) -> Trace:
    mode = PerformanceCounterMode()
    with mode:
        fn(*args)
    return mode.trace()


def test_a_strided_view_keeps_its_strides():
    x = torch.rand(2, 8)
    trace = counted(lambda t: t[..., ::2] * 2.0, x)
    (mul,) = [r for r in trace.records if r.op == "aten.mul.Tensor"]
    # x[..., ::2] of a [2, 8] tensor: shape (2, 4), every other element of a row of 8
    assert mul.args == (TensorArg((2, 4), (8, 2), "float32"), 2.0)
    assert mul.shapes == "[2, 4], 2.0"  # the display text is unchanged
    assert not mul.args[0].dense and contiguous((2, 4)).dense
    assert TensorArg((4, 2), (1, 4), "float32").dense  # a transpose of a contiguous [2, 4]
    assert not TensorArg((2, 4), (0, 1), "float32").dense  # a broadcast row


def test_equal_text_other_strides_are_separate_records():
    x = torch.rand(2, 8)

    def both(t):
        t[..., ::2] * 2.0  # [2, 4] strides (8, 2)
        t[..., :4] * 2.0  # [2, 4] strides (8, 1)
        t[..., :4] * 2.0

    muls = [r for r in counted(both, x).records if r.op == "aten.mul.Tensor"]
    assert sorted((r.args[0].stride, r.calls) for r in muls) == [((8, 1), 2), ((8, 2), 1)]
    assert {r.shapes for r in muls} == {"[2, 4], 2.0"}


def test_keywords_lists_and_constants_are_kept():
    x = torch.rand(2, 3)
    trace = counted(lambda t: (torch.cat([t, t], dim=-1), t.to(torch.float64)), x)
    (cat,) = [r for r in trace.records if r.op == "aten.cat.default"]
    assert cat.args == ((contiguous((2, 3)), contiguous((2, 3))), -1)
    assert cat.shapes == "[[2, 3], [2, 3]], -1"
    (to,) = [r for r in trace.records if r.op == "aten._to_copy.default"]
    assert to.args == (contiguous((2, 3)), Keyword("dtype", Const("torch.float64")))
    assert to.shapes == "[2, 3], dtype=torch.float64"


def test_numbers_and_pattern_rebuild_args():
    args = ((TensorArg((1, 2, 5, 8), (80, 40, 8, 1), "float32"), contiguous((1, 2, 1, 8))), -2)
    assert numbers(args) == [1, 2, 5, 8, 80, 40, 8, 1, 1, 2, 1, 8, 16, 8, 8, 1, -2]
    assert with_numbers(args, numbers(args)) == args
    moved = with_numbers(args, [n + (n == 5) for n in numbers(args)])
    assert signature(moved) == "[[1, 2, 6, 8], [1, 2, 1, 8]], -2" and pattern(moved) == pattern(args)
    # 1, 1.0 and True are equal in Python; the pattern keeps them apart
    assert len({pattern((contiguous((2,)), v)) for v in (1, 1.0, True)}) == 3
    assert [t.shape for t in tensor_args(args)] == [(1, 2, 5, 8), (1, 2, 1, 8)]


def test_to_dict_from_dict_round_trips_the_args():
    args = (TensorArg((2, 4), (8, 2), "bfloat16"), (contiguous((3,), "int64"), None), 0.5,
            Keyword("dim", -1), Keyword("dtype", Const("torch.float32")), True, "tanh", -math.inf,
            TensorArg((4, 4), (4, 1), "float32", "Int8WeightTensor"))
    r = OpRecord("aten.foo.default", "M.a", "bfloat16", args, 2, 10, 8, segment=1)
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))  # strict JSON: -inf spelled out
    assert d["shapes"] == ("[2, 4], [[3], None], 0.5, dim=-1, dtype=torch.float32, True, "
                           "'tanh', -inf, Int8WeightTensor[4, 4]")
    back = OpRecord.from_dict(d)
    assert back == r and back.key == r.key and back.shapes == r.shapes
    assert type(back.args[5]) is bool and type(back.args[2]) is float


def test_a_record_written_before_args_is_read_from_its_text():
    r = OpRecord("aten.mm.default", "M", "float32", (contiguous((6, 64)), contiguous((64, 64))), 1)
    d = r.to_dict()
    del d["args"]  # as a file of counts written before records kept args
    back = OpRecord.from_dict(d)
    assert back.args == r.args and back.shapes == "[6, 64], [64, 64]"
    old = args_from_text("[2, 4], dtype=torch.float32, device=device(type='cpu')", "float32")
    assert old == (contiguous((2, 4)), Keyword("dtype", Const("torch.float32")),
                   Keyword("device", Const("device(type='cpu')")))


def test_a_bad_args_field_names_what_is_wrong():
    d = OpRecord("aten.neg.default", "M", "float32", (contiguous((2,)),), 1).to_dict()
    d["args"] = [{"sizes": [2]}]
    with pytest.raises(ValueError, match="none of tensor, keyword, const, float"):
        OpRecord.from_dict(d)


@torch.no_grad()
def test_a_derived_step_has_the_args_of_a_counted_one():
    model = make_hf_model("llama")
    cache = transformers.DynamicCache(config=model.config)
    key = cache_keyword(model)
    model(input_ids=torch.tensor([[1, 5, 9, 2]]), use_cache=True, **{key: cache})
    steps = {}
    for x in range(4, 10):  # the context before the step: 4 .. 9
        steps[x] = counted(lambda: model(input_ids=torch.tensor([[3]]), use_cache=True,
                                         **{key: cache}))
    fit = fit_steps([(x, steps[x]) for x in (4, 5, 6)])
    derived = fit.total([9])
    assert difference(derived, steps[9], modules=False) is None  # keys hold the args
    assert {r.key for r in derived.records} == {r.key for r in steps[9].records}
    cache = [r for r in derived.records
             if r.op == "aten.cat.default" and r.args[-1] == -2]  # keys and values grow
    assert cache and all(r.args[0][0] == contiguous((1, 2, 9, 8)) for r in cache)
    strided = {r.args for r in derived.records
               if any(not t.dense for t in tensor_args(r.args))}
    assert strided  # rotary halves: slices of a wider row keep their strides
    assert strided == {r.args for r in steps[9].records
                       if any(not t.dense for t in tensor_args(r.args))}
