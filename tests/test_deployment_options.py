"""deployment()'s and plan()'s settings in named groups (serve/options.py, plan/options.py):
the flat keywords land in their groups, options and keywords build the same deployment, and
a keyword no group has is refused by name."""
import pytest

from perfcounter.parallel.sharding import ParallelConfig
from perfcounter.plan.options import PlanOptions
from perfcounter.serve.api import deployment
from perfcounter.serve.options import (CacheOptions, DeploymentOptions, EngineOptions,
                                       ModelOptions, group_keywords)
from test_parallel_disagg import TINY


def test_flat_keywords_land_in_their_groups():
    o = DeploymentOptions.of(precision="float16", kv_dtype="int8", block_size=32,
                             max_num_seqs=8, engine="sglang", tensor_parallel_size=2,
                             usd_per_hour=2.5)
    assert o.model == ModelOptions(precision="float16", kv_dtype="int8")
    assert o.cache == CacheOptions(block_size=32)
    assert o.engine == EngineOptions(engine="sglang", max_num_seqs=8)
    assert o.parallel == ParallelConfig(tensor_parallel_size=2)
    assert o.usd_per_hour == 2.5 and o.placement.mapping is None
    # what the engine's profile fills in: the settings given, None for the others
    assert o.engine.given("tensor") == {
        "max_num_batched_tokens": None, "max_num_seqs": 8, "step_overhead_s": None,
        "request_overhead_s": None, "admission": None, "kv_scales": "tensor",
        "execution": None, "seq_overhead_s": None, "async_scheduling": None, "sampler": None}


def test_options_and_keywords_build_the_same_deployment():
    kw = {"execution": "bound", "max_num_seqs": 4, "data_parallel_size": 2}
    a = deployment(TINY, "h100-sxm", **kw)
    b = deployment(TINY, "h100-sxm", options=DeploymentOptions.of(**kw))
    assert (a.name, a.engine, a.plan, a.usd_per_hour, a.parallel, a.settings) == \
        (b.name, b.engine, b.plan, b.usd_per_hour, b.parallel, b.settings)
    # 2 replicas of one h100-sxm at its listed $6.88 an hour: $13.76
    assert a.name.startswith("2 x h100-sxm") and a.usd_per_hour == pytest.approx(2 * 6.88)
    with pytest.raises(TypeError, match="options or keywords, not both"):
        deployment(TINY, "h100-sxm", options=DeploymentOptions(), max_num_seqs=4)


def test_an_unknown_keyword_is_refused_by_name():
    with pytest.raises(TypeError, match=r"^deployment\(\) got an unexpected keyword "
                                        r"'max_num_seq'; did you mean 'max_num_seqs'\?$"):
        deployment(TINY, "h100-sxm", max_num_seq=4)
    with pytest.raises(TypeError, match=r"^plan\(\) got an unexpected keyword 'tensor_parallel'"):
        PlanOptions.of(slo="ttft=1s", qps=1, tensor_parallel=2)
    with pytest.raises(TypeError, match=r"^plan\(\) needs the keyword 'qps'$"):
        PlanOptions.of(slo="ttft=1s")
    groups = group_keywords({"cache": CacheOptions}, {"block_size": 8}, "f()")
    assert groups == {"cache": {"block_size": 8}}


def test_plan_keywords_land_in_their_groups():
    o = PlanOptions.of(slo="ttft=1s,tpot=50ms", qps=4, num_requests=50, max_num_seqs=(64,),
                       tensor_parallel_size=(1, 2), backend="threads")
    assert (o.workload.qps, o.workload.num_requests, o.target.slo) == (4, 50, "ttft=1s,tpot=50ms")
    assert (o.space.max_num_seqs, o.space.tensor_parallel_size) == ((64,), (1, 2))
    assert o.backend.backend == "threads" and o.engine.execution == "cudagraphs"
