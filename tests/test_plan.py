"""The deployment search (perfcounter/plan/): the pool, the enumeration counted by hand, the
memory fit, the front and the recommendation on figures made by hand, bad input in one line."""
import json

import pytest
import torch

from perfcounter.cli.main import main
from perfcounter.models.args import ModelArgs
from perfcounter.plan import PlanError, Space, enumerate_candidates, parse_devices, plan
from perfcounter.plan.candidates import Candidate, default_quantizations, memory_fit
from perfcounter.plan.front import pareto_front, recommend
from perfcounter.serve import cache_clear, cache_info

# 4 layers, 8 heads of 8, 8 KV heads: TP 1, 2, 4, 8 divide the heads
TOY = ModelArgs(block_size=1024, vocab_size=64, n_layer=4, n_head=8, n_local_heads=8, dim=64,
                intermediate_size=128)
TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_a_pool_of_two_kinds_and_their_prices():
    kinds = parse_devices("h100:8, a100-sxm4-80gb:4")
    assert [(k.name, k.count) for k in kinds] == [("h100-sxm", 8), ("a100-sxm4-80gb", 4)]
    # device_specs/nvidia.yaml: p5.48xlarge $55.04 / 8 = $6.88; p4de.24xlarge $27.44705 / 8
    assert [k.usd_per_hour for k in kinds] == [6.88, 3.4309]
    assert "p5.48xlarge" in kinds[0].usd_source
    given = parse_devices("h100-sxm:2", usd_per_hour=2.5)
    assert (given[0].usd_per_hour, given[0].usd_source) == (2.5, "--usd_per_hour")


@pytest.mark.parametrize("text, expected", [
    ("h100-sxm", "expected KIND:COUNT"),
    ("h100-sxm:0", "a count >= 1"),
    ("h100-sxm:two", "a count >= 1"),
    ("", "expected KIND:COUNT"),
    ("h100-sxm:8,", "expected KIND:COUNT"),
    ("h10:8", "h100"),  # the registry's "did you mean"
    ("h100-sxm:2,h100:2", "h100-sxm is named twice"),
])
def test_bad_pools(text, expected):
    with pytest.raises(PlanError) as e:
        parse_devices(text)
    assert expected in str(e.value) and "\n" not in str(e.value)


def _triples(cands):
    return sorted((c.tensor_parallel_size, c.pipeline_parallel_size, c.data_parallel_size)
                  for c in cands)


def test_enumeration_counted_by_hand():
    pool = parse_devices("h100-sxm:4")
    one = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                disaggregated=False)
    # on one node (4 GPUs of 8 a node) no PP: TP 1 (DP 1, 2, 4), TP 2 (DP 1, 2), TP 4 -> 6
    assert _triples(enumerate_candidates(TOY, pool, "bfloat16", one)) == [
        (1, 1, 1), (1, 1, 2), (1, 1, 4), (2, 1, 1), (2, 1, 2), (4, 1, 1)]
    staged = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                   disaggregated=False, pipeline_parallel_sizes=(1, 2, 4))
    cands = enumerate_candidates(TOY, pool, "bfloat16", staged)
    # PP asked, TP x PP x DP <= 4 GPUs: TP 1: PP 1 (DP 1, 2, 4), PP 2 (DP 1, 2), PP 4 (DP 1);
    # TP 2: PP 1 (DP 1, 2), PP 2 (DP 1); TP 4: PP 1, DP 1 -> 3 + 2 + 1 + 2 + 1 + 1 = 10
    assert _triples(cands) == [(1, 1, 1), (1, 1, 2), (1, 1, 4), (1, 2, 1), (1, 2, 2), (1, 4, 1),
                               (2, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert {c.num_gpus for c in cands} <= {1, 2, 4}
    # x 2 weights x 2 KV x 3 batch limits = 10 x 12 = 120
    wide = Space(quantizations=(None, "int8"), kv_cache_dtypes=(None, "fp8"),
                 max_num_seqs=(8, 16, 32), disaggregated=False, pipeline_parallel_sizes=(1, 2, 4))
    assert len(enumerate_candidates(TOY, pool, "bfloat16", wide)) == 120
    # 16 GPUs, two nodes: TP up to 8, PP 1 or 2 across the nodes
    two_nodes = {(c.tensor_parallel_size, c.pipeline_parallel_size)
                 for c in enumerate_candidates(TOY, parse_devices("h100-sxm:16"), "bfloat16", one)}
    assert two_nodes == {(t, p) for t in (1, 2, 4, 8) for p in (1, 2)}
    assert len(enumerate_candidates(TOY, pool, "bfloat16",
                                    Space((None,), (None,), (16,), parallel=False,
                                          disaggregated=False))) == 1


def test_sizes_asked_instead_of_the_powers_of_two():
    space = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                  disaggregated=False, tensor_parallel_sizes=(2,), data_parallel_sizes=(1, 3))
    cands = enumerate_candidates(TOY, parse_devices("h100-sxm:8"), "bfloat16", space)
    # TP 2 of 8 GPUs on one node: PP 1; DP 1 or 3 (2 x 3 = 6 <= 8)
    assert _triples(cands) == [(2, 1, 1), (2, 1, 3)]


def test_disaggregated_ratios_counted_by_hand():
    pool = parse_devices("h100-sxm:4")
    space = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,))
    disagg = [c for c in enumerate_candidates(TOY, pool, "bfloat16", space) if c.disaggregated]
    # instances of TP GPUs (serve's pools: no PP): of 1 GPU, 2 instances 1P:1D, 4 instances
    # 1:3, 2:2, 3:1; of 2 GPUs: 2 instances, 1:1; of 4 GPUs: one instance, no P:D -> 4 + 1
    got = sorted((c.tensor_parallel_size, c.pipeline_parallel_size, c.num_prefill_instances,
                  c.num_decode_instances) for c in disagg)
    assert got == [(1, 1, 1, 1), (1, 1, 1, 3), (1, 1, 2, 2), (1, 1, 3, 1), (2, 1, 1, 1)]
    assert [c.num_gpus for c in disagg if c.num_prefill_instances == 3] == [4]
    two = parse_devices("h100-sxm:2,a100-sxm4-80gb:2")
    cross = [c for c in enumerate_candidates(TOY, two, "bfloat16", space)
             if c.disaggregated and c.device != c.decode_device]
    # H100 -> A100 and A100 -> H100; per instance of 1 GPU P, D in {1, 2}: 4 ratios, of 2
    # GPUs (TP 2): 1:1 -> (4 + 1) x 2 directions = 10
    assert len(cross) == 10


def test_expert_parallel_only_for_experts_over_several_ranks():
    moe = ModelArgs(block_size=1024, vocab_size=64, n_layer=4, n_head=8, n_local_heads=8,
                    dim=64, intermediate_size=128, num_experts=4, num_activated_experts=2)
    space = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                  disaggregated=False)
    pool = parse_devices("h100-sxm:4")
    cands = enumerate_candidates(moe, pool, "bfloat16", space)
    # of the 6 (TP, PP, DP) on one node above, TP x DP > 1 (and dividing the 4 experts) in 5:
    # (1,1,2) (1,1,4) (2,1,1) (2,1,2) (4,1,1) -> 6 + 5 = 11
    assert len(cands) == 11
    assert all(c.tensor_parallel_size * c.data_parallel_size > 1
               for c in cands if c.enable_expert_parallel)
    assert not any(c.enable_expert_parallel for c in enumerate_candidates(TOY, pool, "bfloat16",
                                                                            space))


def test_fp8_weights_only_where_the_device_has_an_fp8_peak():
    space = Space(quantizations=(None, "fp8"), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                  parallel=False, disaggregated=False)
    cands = enumerate_candidates(TOY, parse_devices("h100-sxm:1,a100-sxm4-80gb:1"),
                                 "bfloat16", space)
    # the A100 lists no float8 peak (device_specs/nvidia.yaml)
    assert [(c.device, c.quantization) for c in cands] == [
        ("h100-sxm", None), ("h100-sxm", "fp8"), ("a100-sxm4-80gb", None)]


def test_default_int4_is_the_largest_group_dividing_every_linear():
    assert default_quantizations(TOY, torch.bfloat16)[-1] == "int4-64"  # dim 64: not 128
    llama = ModelArgs.from_name("llama-3.1-70b")
    assert default_quantizations(llama, torch.bfloat16) == (None, "fp8", "int8", "int4-128")


def test_memory_fit_of_llama_70b_on_one_h100():
    llama = ModelArgs.from_name("llama-3.1-70b")
    spec = parse_devices("h100-sxm:1")[0].spec
    c = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 1, False, 64)
    fit = memory_fit(llama, torch.bfloat16, c, spec, cache={})
    # 70.55e9 parameters x 2 B = 141.1 GB > 0.9 x 85.52 GB (81559 MiB reported) usable
    assert not fit.fits and fit.weight_bytes == pytest.approx(141.1e9, rel=1e-3)
    assert fit.weight_bytes > 0.9 * spec.vram
    q4 = Candidate("h100-sxm", "bfloat16", "int4-128", None, 1, 1, 1, False, 64)
    # int4 with a bf16 scale and zero point per 128 weights: 4.25 bits a weight of the
    # linears, ~39 GB with the bf16 embedding: room for a KV cache
    assert memory_fit(llama, torch.bfloat16, q4, spec, cache={}).fits


def fig(tput, tpot, met=1.0, goodput=1.0, usd=1.0, j=1.0, **kw):
    return {"output_throughput_per_gpu": tput, "median_tpot_ms": tpot, "slo_met_fraction": met,
            "goodput_per_gpu": goodput, "usd_per_1m_output_tokens": usd,
            "j_per_output_token": j, "overloaded": False, **kw}


def test_pareto_front_by_hand():
    figures = [fig(100, 20), fig(300, 40), fig(200, 50),  # 2 is dominated by 1
               fig(300, 45), fig(500, 80), {"error": "refused"},
               fig(900, 10, overloaded=True), fig(50, 5)]
    # by TPOT: 7 (5 ms, 50) front; 0 (20 ms, 100) front; 1 (40, 300) front; 3 (45, 300) not
    # higher; 2 (50, 200) no; 4 (80, 500) front; the overloaded and refused ones are off it
    assert pareto_front(figures) == [7, 0, 1, 4]


def test_recommendation_and_its_ties():
    figures = [fig(1, 1, met=0.85, goodput=9.0),  # misses 90 % of requests
               fig(1, 1, goodput=2.0, usd=3.0), fig(1, 1, goodput=2.0, usd=2.0, j=5.0),
               fig(1, 1, goodput=2.0, usd=2.0, j=4.0), fig(1, 1, goodput=2.0, usd=2.0, j=4.0)]
    # highest goodput per GPU meeting the SLO: 1-4 tie at 2.0; lower $: 2-4; lower J: 3, 4;
    # fewer GPUs: 4 (2 GPUs against 3's 4)
    assert recommend(figures, [1, 1, 1, 4, 2]) == 4
    assert recommend(figures, [1, 1, 1, 4, 2], attainment=0.8) == 0
    assert recommend([fig(1, 1, met=0.5)], [1]) is None


def plan_cli(*argv):
    return main(argv=["plan", *map(str, argv)])


@pytest.mark.parametrize("argv, expected", [
    (["--devices", "h100-sxm:8"], "--qps"),
    (["--devices", "h100-sxm", "--qps", 1], "expected KIND:COUNT"),
    (["--devices", "h999:8", "--qps", 1], "h999"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--slo", "ttft=1"], "a unit is required"),
    (["--devices", "h100-sxm:8", "--qps", 0], "--qps 0"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--engine", "tgi"], "invalid choice"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--slo", "itl=5ms"], "not itl"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--quantize", "int3"], "int3"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--max_num_seqs", "8,x"], "--max_num_seqs"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--prompt_length", "uniform:9-3"], "uniform:LO-HI"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--prompt_length", 2000], "context of 1024"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--ray", "--workers", 2], "give one of them"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--tp", 3], "valid: 1, 2, 4"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--pp", 5], "has 2 layers"),
    (["--devices", "h100-sxm:4", "--qps", 1, "--tp", "2,4", "--dp", "4,8"],
     "TP 2 x PP 1 x DP 4 asks 8 GPUs; the pool's largest kind holds 4"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--dp", "0"], "expected distinct integers >= 1"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--max_num_seqs", "8,8"], "expected distinct"),
    (["--devices", "h100-sxm:8", "--qps", 1, "--quantize", "int8,none,INT8"], "named twice"),
])
def test_bad_input_one_line_before_any_counting(capsys, tiny, argv, expected):
    if "--slo" not in argv:
        argv = [*argv, "--slo", "ttft=1s,tpot=50ms"]
    cache_clear()
    code = plan_cli("--model", tiny, *argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("perfcounter plan: error: ") and "\n" not in err, err
    assert expected in err
    assert cache_info().counts == 0  # refused before any step table was counted


def test_a_search_needs_an_slo(tiny):
    with pytest.raises(PlanError, match="--slo"):
        plan(tiny, "h100-sxm:1", slo=None, qps=1)


def test_a_step_table_prices_a_step_of_the_same_features_once(monkeypatch, tiny):
    """A search serves hundreds of candidates on one table: a step whose features were priced
    is not priced again (the same float back), so that a run costs its distinct steps."""
    from perfcounter.serve import deployment
    from perfcounter.serve import table as step_table
    cache_clear()
    table = deployment(tiny, "h100-sxm", execution="cudagraphs").table
    calls = []
    price = step_table.price
    monkeypatch.setattr(step_table, "price", lambda *a, **k: calls.append(1) or price(*a, **k))
    decode = table.counts.features([(1, 40), (1, 8)])  # two sequences, one token each
    first = table.seconds(decode)
    assert table.seconds(decode.copy()) == first and len(calls) == 1
    table.seconds(table.counts.features([(1, 40), (1, 9)]))  # one more token of context
    assert len(calls) == 2


def test_a_rank_the_int4_group_cannot_store_is_refused_with_its_reason():
    spec = parse_devices("h100-sxm:2")[0].spec
    one = Candidate("h100-sxm", "bfloat16", "int4-64", None, 1, 1, 1, False, 16)
    two = Candidate("h100-sxm", "bfloat16", "int4-64", None, 2, 1, 1, False, 16)
    assert memory_fit(TOY, torch.bfloat16, one, spec, cache={}).fits
    # TP 2: wo's inputs are 8 heads x 8 / 2 = 32, which a group of 64 does not divide
    fit = memory_fit(TOY, torch.bfloat16, two, spec, cache={})
    assert not fit.fits and "TP 2" in fit.error and "64" in fit.error


def test_ray_without_ray_installed_is_one_line(monkeypatch, capsys, tiny):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code = plan_cli("--model", tiny, "--devices", "h100-sxm:1", "--qps", 1, "--slo",
                    "ttft=1s", "--ray")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "pip install 'perfcounter[ray]'" in err and "\n" not in err


def test_a_quantized_rank_weighed_once_a_process():
    # a search asks every candidate's weight bytes: a fake model per model, dtype and scheme.
    # TOY at int8 (a row scale of 2 B): wqkv 192 x 64 + 192 x 2 = 12,672; wo 64 x 64 + 128 =
    # 4,224; w1, w3 128 x 64 + 256 = 8,448 each; w2 64 x 128 + 128 = 8,320; 2 norms 2 x 128
    # -> a layer 42,368, x 4 = 169,472; + embedding 64 x 64 x 2 = 8,192, norm 128, output
    # 64 x 64 + 128 = 4,224 -> 182,016
    from perfcounter.models import stored_weights as S
    from perfcounter.quant.quantize import WeightScheme
    from perfcounter.serve.memory import weight_bytes
    int8 = WeightScheme("int8")
    S.cache_clear()  # none weighed yet in this test
    assert weight_bytes(TOY, torch.bfloat16, int8) == 182_016
    assert S.cache_info() == S.CacheInfo(hits=0, misses=1, currsize=1)
    assert weight_bytes(TOY, torch.bfloat16, int8) == 182_016
    assert S.cache_info() == S.CacheInfo(hits=1, misses=1, currsize=1)  # not built again
    weight_bytes(TOY, torch.bfloat16, WeightScheme("int4", 32))  # another scheme: another model
    assert S.cache_info() == S.CacheInfo(hits=1, misses=2, currsize=2)


def test_the_printed_command_says_execution_bound_and_serve_reads_it(tmp_path, tiny):
    import shlex

    from perfcounter.plan.evaluate import Job, serve_command
    c = Candidate("h100-sxm", "bfloat16", None, None, 1, 1, 1, False, 4)
    job = Job(tiny, execution="bound", qps=20.0, num_requests=4, prompt_length="8",
              max_new_tokens="2")
    argv = shlex.split(serve_command(c, job))
    assert "--bound" not in argv and argv[argv.index("--execution") + 1] == "bound"
    out = tmp_path / "served.json"
    assert main(argv=[*argv[1:], "--save_path", str(out)]) == 0
    assert json.loads(out.read_text())["execution"] == "bound"


def test_a_model_given_as_an_object_plans_as_its_name(tmp_path, tiny):
    # plan() takes the model as serve's deployment() does: a ModelArgs, or a transformers
    # model's HfArgs, answers the same question as its config file, and its commands name
    # the transformers model by its name
    from perfcounter.serve.resolve import resolve_model
    cfg = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "max_position_embeddings": 1024}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    ask = dict(slo="ttft=1s,tpot=50ms", qps=2.0, num_requests=6, prompt_length="16",
               max_new_tokens="4", workers=1)
    for given, name in ((str(path), str(path)), (resolve_model(str(path)), str(path)),
                        (ModelArgs(**TINY), None), (tiny, tiny)):
        result = plan(given, "h100-sxm:1", **ask)
        assert result.recommended is not None
        if name is not None:
            assert f"--model {name} " in result.commands[result.recommended]
    by_name = plan(tiny, "h100-sxm:1", **ask)
    by_args = plan(ModelArgs(**TINY), "h100-sxm:1", **ask)
    assert (by_name.recommended, by_name.front) == (by_args.recommended, by_args.front)
    for i, (a, b) in enumerate(zip(by_name.figures, by_args.figures)):
        assert a == b, (i, {k: (a.get(k), b.get(k)) for k in a if a.get(k) != b.get(k)})
