"""The many-devices surface hardened (issue 46): bounded pools and replicas, no serve flag
dropped by disaggregation, a GGUF header that checks its lengths, figures with ranges,
messages that name the flag that was given. Each refusal: one line naming the flag or
field, the value and what is valid; numbers derived by hand in the comments."""
import json
import struct

import pytest

# -- 2. a GGUF header checks every declared length against the bytes left ------------------


def _gguf(*parts: bytes) -> bytes:
    """'GGUF', version 3, 0 tensors, then `parts` (the key count first)."""
    return b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0) + b"".join(parts)


def _string(text: bytes, declared: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if declared is None else declared) + text


@pytest.mark.parametrize("body, expected", [
    # the issue's file: one key whose name declares 2^60 bytes; 4 + 4 + 8 + 8 + 8 + 12 = 44
    # bytes, the name's 12 left after byte 32
    ((struct.pack("<Q", 1), _string(b"general.arch", 2 ** 60)),
     "a string at byte 32 needs 1,152,921,504,606,846,976 bytes; the file has 12 left"),
    # a string value of 2^40 bytes: key "k" (8 + 1), type 8 (4), its length (8) -> byte 45
    ((struct.pack("<Q", 1), _string(b"k"), struct.pack("<I", 8), _string(b"ab", 2 ** 40)),
     "a string at byte 45 needs 1,099,511,627,776 bytes; the file has 2 left"),
    # an array of 2^61 uint32: 4 bytes each = 2^63 bytes; type 9, inner 4, count -> byte 49
    ((struct.pack("<Q", 1), _string(b"k"), struct.pack("<I", 9), struct.pack("<I", 4),
      struct.pack("<Q", 2 ** 61)),
     "an array of 2,305,843,009,213,693,952 elements at byte 49 needs "
     "9,223,372,036,854,775,808 bytes; the file has 0 left"),
    # an array of 10^12 strings: each at least its 8-byte length = 8e12 bytes
    ((struct.pack("<Q", 1), _string(b"k"), struct.pack("<I", 9), struct.pack("<I", 8),
      struct.pack("<Q", 10 ** 12)),
     "an array of 1,000,000,000,000 elements at byte 49 needs 8,000,000,000,000 bytes"),
    # 50,000 keys (under MAX_KEYS) in a file with none: each key at least 8 + 4 + 1 = 13
    # bytes, 650,000 in all, from byte 24
    ((struct.pack("<Q", 50_000),),
     "50,000 metadata keys at byte 24 needs 650,000 bytes; the file has 0 left"),
])
def test_every_declared_length_is_checked_against_the_bytes_left(tmp_path, body, expected):
    from perfcounter.models.gguf_header import gguf_metadata, gguf_shape
    path = tmp_path / "huge.gguf"
    path.write_bytes(_gguf(*body))
    with pytest.raises(ValueError) as e:
        gguf_metadata(path)
    assert expected in str(e.value)
    assert gguf_shape(path) is None  # the header unread: transformers is asked instead


def test_the_issues_44_byte_file_is_one_line_not_a_memory_error(tmp_path):
    from perfcounter.models.checkpoint_config import checkpoint_config
    from perfcounter.models.checkpoint_files import CheckpointError
    path = tmp_path / "huge_str.gguf"
    path.write_bytes(_gguf(struct.pack("<Q", 1), _string(b"general.arch", 2 ** 60)))
    assert path.stat().st_size == 44
    with pytest.raises(CheckpointError) as e:  # transformers' reader refuses it too
        checkpoint_config(path)
    assert "huge_str.gguf" in str(e.value) and "\n" not in str(e.value)


def test_a_header_within_its_bytes_still_reads(tmp_path):
    from perfcounter.models.gguf_header import gguf_metadata
    path = tmp_path / "ok.gguf"
    # two keys: a string "llama" and an array of 3 strings (skipped, read as its length 3)
    path.write_bytes(_gguf(struct.pack("<Q", 2),
                           _string(b"general.architecture"), struct.pack("<I", 8),
                           _string(b"llama"),
                           _string(b"tokenizer.ggml.tokens"), struct.pack("<I", 9),
                           struct.pack("<I", 8), struct.pack("<Q", 3),
                           _string(b"a"), _string(b"bb"), _string(b"")))
    assert gguf_metadata(path) == {"general.architecture": "llama",
                                   "tokenizer.ggml.tokens": 3}


# -- 7. a counts file's schema named, not a field it lacks ---------------------------------
@pytest.mark.parametrize("doc, says", [
    ({"prefill": {"schema": 99}},
     "phase 'prefill': schema 99 is not a perfcounter counts document's (expected a "
     "'perfcounter' block with \"schema\": 'perfcounter.counts')"),
    ({"perfcounter": {"schema": 99, "version": 2}},  # the block alone, as the document
     "phase 'perfcounter': schema 99 is not a perfcounter counts document's"),
    ({"prefill": {"perfcounter": {"schema": 99}}},
     "phase 'prefill': field 'perfcounter' has schema 99 (expected an object with "
     "\"schema\": 'perfcounter.counts')"),
    ({"schema": 99, "version": 2}, "not a perfcounter counts document (schema 99; "),
])
def test_profile_counts_of_a_schema_99_file_names_the_schema(tmp_path, capsys, doc, says):
    from perfcounter.cli.main import main
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(doc))
    assert main(argv=["profile", "--counts", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"perfcounter profile: error: {path}: ")
    assert says in err and "'label' is missing" not in err


# -- 3. disaggregated runs drop no flag ----------------------------------------------------
TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}
POOLS = ("--prefill_pool", "h100-sxm", "--decode_pool", "h100-sxm")
WORKLOAD = {"--qps": "200", "--num_requests": "12", "--prompt_length": "64",
            "--max_new_tokens": "8"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hardened")
    (folder / "tiny.json").write_text(json.dumps(TINY))
    (folder / "trace.csv").write_text("arrival_time,prompt_tokens,output_tokens\n"
                                      "0,40,6\n0.001,20,3\n0.002,30,9\n")
    (folder / "map.yaml").write_text("layers: h100-sxm\n")
    return folder


def serve_cli(argv, capsys):
    """(exit code, stdout, stderr) of `perfcounter serve` in this process."""
    from perfcounter.cli.main import main
    code = main(argv=["serve", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(code, err) -> str:
    err = err.strip()
    assert code == 2, err
    assert err.startswith("perfcounter serve: error: ") and "\n" not in err, err
    return err


def test_a_flag_the_pools_ignored_now_applies_to_them(tiny, capsys):
    argv = ["--model", tiny / "tiny.json", *POOLS, *sum(map(list, WORKLOAD.items()), [])]
    save = tiny / "pools.json"

    def overall(*extra):
        code, out, err = serve_cli([*argv, *extra, "--save_path", save], capsys)
        assert code == 0, err
        return json.loads(save.read_text())["overall"], out

    base, text = overall()
    assert "$/1M out" in text.splitlines()[0]  # the pools' table has a $ column
    slow, _ = overall("--step_overhead_ms", "1000")
    # every decode step takes 1 s more: a TPOT of 1,000 ms at least (was 1.11 ms, unchanged)
    assert base["mean_tpot_ms"] < 1 and slow["mean_tpot_ms"] >= 1000
    late, _ = overall("--request_overhead_ms", "5000")
    assert base["mean_ttft_ms"] < 1 and late["mean_ttft_ms"] >= 5000  # 5 s before the first step
    priced, text = overall("--usd_per_hour", "1000")
    # two pools of one H100 each at $1,000 an hour: $2,000 over the run, per 1M output tokens
    assert priced["usd_per_1m_output_tokens"] == pytest.approx(
        2000 * priced["duration"] / 3600 / priced["total_output_tokens"] * 1e6)
    assert base["usd_per_1m_output_tokens"] != priced["usd_per_1m_output_tokens"]
    q4, _ = overall("--gguf_type", "Q4_0")
    assert q4["j_per_output_token"] != base["j_per_output_token"]  # Q4_0's bytes, not bf16's
    code, _, err = serve_cli([*argv, "--expert_load", "4,2,1,1"], capsys)
    assert "--expert_load" in one_line(code, err)  # a dense model: refused, as aggregated


# each serve flag (by its first spelling): what to give, and what the pools do with it
CHANGES = {  # the figures move on one deployment; they must move on the pools, or be refused
    "--prompt_length": ["32"], "--max_new_tokens": ["4"], "--new_tokens": ["4"],
    "--precision": ["float32"], "--act_dtype": ["float32"], "--execution": ["bound"],
    "--compile": [], "--bound": [], "--quantize": ["int8"], "--weight_dtype": ["int8"],
    "--group_size": ["32", "--weight_dtype", "int4"], "--kv_dtype": ["fp8"],
    "--engine": ["sglang"], "--gpu_memory_utilization": ["0.5"],
    "--max_num_batched_tokens": ["16"], "--max_num_seqs": ["1"], "--block_size": ["32"],
    "--step_overhead_ms": ["5"], "--request_overhead_ms": ["5"], "--expert_load": ["4,2,1,1"],
    "--gguf_type": ["Q4_0"], "--qps": ["50"], "--burstiness": ["0.3"], "--concurrency": ["2"],
    "--num_requests": ["10"], "--trace_file": ["trace.csv"], "--prefix_hit_rate": ["0.5"],
    "--seed": ["3"], "--slo": ["ttft=1ms"], "--usd_per_hour": ["10"], "--usd_per_kwh": ["0.1"],
    "--batch_size": ["2"],
}
POOLS_REFUSE = {  # what a run on pools cannot honour: refused in one line
    "--device_spec": ["a100-sxm4-80gb"], "--mapping": ["map.yaml"], "--host": ["generic-cpu"],
    "--allow_unmatched": [], "--tensor_parallel_size": ["2"], "--pipeline_parallel_size": ["2"],
    "--data_parallel_size": ["2"], "--enable_expert_parallel": [], "--plan": [],
    "--find_max_qps": [], "--csv": ["out.csv"], "--trace": ["out.json"], "--plot": ["plots"],
    "--html": ["out.html"],
    "--plan_context": ["8"], "--plan_batch": ["2"], "--slo_attainment": ["0.5"],
}
NOT_FIGURES = {"-h", "--model", "--config", "--checkpoint_path", "--save_path",
               "--prefill_pool", "--decode_pool", "--quiet"}  # the run itself, its output,
# its path, its progress bars
DROPS = {"--concurrency": {"--qps"},  # a closed loop has no rate; a trace, no synthetic draws
         "--trace_file": {"--qps", "--num_requests", "--prompt_length", "--max_new_tokens"}}


def test_every_serve_flag_is_classified():
    from perfcounter.cli.main import build_parser
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    firsts = {a.option_strings[0] for a in serve._actions}
    assert firsts == set(CHANGES) | set(POOLS_REFUSE) | NOT_FIGURES
    assert not (set(CHANGES) & set(POOLS_REFUSE))


def test_every_flag_moves_the_pools_as_one_deployment_or_is_refused(tiny, capsys):
    """The property of the issue: for each of serve's flags, the disaggregated run either
    changes its figures where the aggregated run does, or refuses the flag in one line."""
    save = tiny / "out.json"

    def run(flag, value, pools: bool):
        """The metrics rows of the --save_path JSON (the pools': prefill, decode, overall),
        or the one-line refusal."""
        drop = DROPS.get(flag, set())
        work = [x for k, v in WORKLOAD.items() if k not in drop and k != flag for x in (k, v)]
        where = list(POOLS) if pools else ["--device_spec", "h100-sxm"]
        value = [str(tiny / v) if v in ("trace.csv", "map.yaml") else v for v in value]
        extra = [] if flag is None else [flag, *value]
        save.unlink(missing_ok=True)
        code, _, err = serve_cli(["--model", tiny / "tiny.json", *where, *work, *extra,
                                  "--save_path", save], capsys)
        if code != 0:
            return one_line(code, err)
        doc = json.loads(save.read_text())
        rows = [doc["prefill"], doc["decode"], doc["overall"]] if pools else [doc]
        return [{k: row.get(k) for k in metric_keys} for row in rows]

    metric_keys = ()
    run(None, [], True)  # the pools' overall row: serve's metrics and the KV moved
    metric_keys = set(json.loads(save.read_text())["overall"]) - {
        "gpus", "kv_transfer_bytes", "kv_transfer_s", "kv_transfer_j"} | {
        "request_goodput", "slo_met_fraction"}  # (--slo's)
    base_pools, base_one = run(None, [], True), run(None, [], False)
    moved = []
    for flag, value in CHANGES.items():
        one, pools = run(flag, value, False), run(flag, value, True)
        if isinstance(one, str):  # refused on one deployment: refused on the pools too
            assert isinstance(pools, str), (flag, pools)
            continue
        moved.append(flag)
        assert one != base_one, flag  # the value chosen moves one deployment's figures ...
        assert not isinstance(pools, str) and pools != base_pools, (flag, pools)  # ... and these
    for flag, value in POOLS_REFUSE.items():
        assert isinstance(run(flag, value, True), str), flag
    # all but --expert_load (a dense model) and --batch_size (serve forms the batches)
    assert set(CHANGES) - set(moved) == {"--expert_load", "--batch_size"}


# -- 4. replicas bounded, and the run says when some get no request -------------------------
@pytest.mark.parametrize("extra, says", [
    # 1 x 1 x 10^9 = 10^9 GPUs > 2^20 = 1,048,576
    (["--dp", "1000000000"], "--data_parallel_size 1000000000: TP 1 x PP 1 x DP 1,000,000,000 "
                             "= 1,000,000,000 GPUs; at most 1,048,576 GPUs a deployment"),
    # 4 x 2 x 131,073 = 1,048,584: 8 past the bound; the largest size is named
    (["--tp", "4", "--pp", "2", "--dp", "131073"],
     "--data_parallel_size 131073: TP 4 x PP 2 x DP 131,073 = 1,048,584 GPUs; at most 1,048,576"),
    (["--prefill_pool", "h100-sxm,instances=1000000000", "--decode_pool", "h100-sxm"],
     "--prefill_pool 'h100-sxm,instances=1000000000': 1,000,000,000 instances x TP 1 = "
     "1,000,000,000 GPUs; at most 1,048,576 GPUs a pool"),
    (["--prefill_pool", "h100-sxm", "--decode_pool", "h100-sxm,instances=2048,tp=1024"],
     "2,048 instances x TP 1,024 = 2,097,152 GPUs; at most 1,048,576"),  # 2^11 x 2^10 = 2^21
])
def test_more_gpus_than_the_bound_are_refused_before_any_work(tiny, capsys, extra, says):
    where = [] if "--prefill_pool" in extra else ["--device_spec", "h100-sxm"]
    code, _, err = serve_cli(["--model", tiny / "tiny.json", *where, "--qps", "1", *extra],
                             capsys)
    assert says in one_line(code, err)


def test_replicas_beyond_the_requests_are_named_in_a_warning(tiny, capsys):
    # TP 2 x PP 2 x DP 1,000 = 4,000 GPUs for 12 requests: 988 replicas get none
    code, out, err = serve_cli(["--model", tiny / "tiny.json", "--device_spec", "h100-sxm",
                                "--tp", "2", "--pp", "2", "--dp", "1000", "--qps", "200",
                                "--num_requests", "12"], capsys)
    assert code == 0 and "on 4000 x h100-sxm (TP2 PP2 DP1000)" in out
    assert ("perfcounter: warning: 988 of 1,000 replicas get no request (12 requests, one "
            "replica each); their GPUs are priced all the same") in err
    # at the bound: 2 x 2 x 262,144 = 1,048,576 GPUs, accepted
    code, out, err = serve_cli(["--model", tiny / "tiny.json", "--device_spec", "h100-sxm",
                                "--tp", "2", "--pp", "2", "--dp", "262144", "--qps", "200",
                                "--num_requests", "12"], capsys)
    assert code == 0 and "262,132 of 262,144 replicas get no request" in err


def test_a_pool_of_more_instances_than_requests_says_so_and_prices_them_all(tiny):
    from perfcounter.serve import synthetic
    from perfcounter.serve.api import disaggregated
    with pytest.warns(UserWarning, match="3 of 4 replicas get no request"):
        r = disaggregated(str(tiny / "tiny.json"), synthetic(1, 16, 4, qps=1, seed=0),
                          "h100-sxm,instances=4", "h100-sxm", usd_per_hour=1.0)
    # 4 + 1 GPUs at $1 an hour over the run, per 1M output tokens (4 of them)
    m = r.overall
    assert m["usd_per_1m_output_tokens"] == pytest.approx(5 * m["duration"] / 3600 / 4 * 1e6)


# -- 5. figures given on the command line have a range -------------------------------------
@pytest.mark.parametrize("extra, says", [
    (["--usd_per_hour", "1e300"], "--usd_per_hour 1e+300: expected a price in [0, 100,000] "
                                  "USD a device-hour (the device files' range)"),
    (["--usd_per_hour", "nan"], "--usd_per_hour nan: expected a price in [0, 100,000]"),
    (["--usd_per_hour", "-1"], "--usd_per_hour -1.0: expected a price in [0, 100,000]"),
    (["--usd_per_kwh", "1e300"], "--usd_per_kwh 1e+300: expected a price in [0, 1,000] USD a kWh"),
    (["--find_max_qps", "--slo", "ttft=1s", "--slo_attainment", "1e-300"],
     "--slo_attainment 1e-300: expected a fraction in [0.01, 1] (from 1% to all of the requests)"),
    (["--prefill_pool", "h100-sxm", "--decode_pool", "h100-sxm", "--usd_per_hour", "1e300"],
     "--usd_per_hour 1e+300: expected a price in [0, 100,000]"),
])
def test_serve_figures_out_of_range_are_refused(tiny, capsys, extra, says):
    where = [] if "--prefill_pool" in extra else ["--device_spec", "h100-sxm"]
    qps = [] if "--find_max_qps" in extra else ["--qps", "1"]
    code, _, err = serve_cli(["--model", tiny / "tiny.json", *where, *qps, *extra], capsys)
    assert says in one_line(code, err)


def test_a_price_at_the_ends_of_its_range_is_taken():
    from perfcounter.serve.metrics import check_attainment, check_prices
    check_prices(0.0, 0.0)
    check_prices(1e5, 1e3)
    assert check_attainment(0.01) == 0.01 and check_attainment(1) == 1.0


# -- 6. messages that name the flag given --------------------------------------------------
@pytest.mark.parametrize("extra, says", [
    # SmolLM2-135M: 9 heads, 3 KV heads, intermediate 1536: TP 1 or 3
    (["--prefill_pool", "h100-sxm,tp=2", "--decode_pool", "h100-sxm"],
     "--prefill_pool 'h100-sxm,tp=2': tp=2 does not shard smollm2-135m; valid: 1, 3"),
    (["--prefill_pool", "h100-sxm", "--decode_pool", "h100-sxm,instances=²"],
     "--decode_pool 'h100-sxm,instances=²': 'instances=²' is not instances=N or tp=T "
     "(integers >= 1)"),
    (["--prefill_pool", "h100-sxm,tp=3,tp=1", "--decode_pool", "h100-sxm"],
     "--prefill_pool 'h100-sxm,tp=3,tp=1': tp given twice; give it once"),
    (["--prefill_pool", "h100-sxm,instances=2", "--decode_pool", "h100-sxm",
      "--gguf_type", "Q4_0"],
     "--prefill_pool 'h100-sxm,instances=2': a llama.cpp file's layers are priced unsharded, "
     "on one GPU: give instances=1,tp=1, or leave out --gguf_type"),
    (["--device_spec", "h100-sxm", "--mapping", ""],
     "--mapping '': expected a YAML/JSON file or inline mapping text"),
    (["--device_spec", "h100-sxm", "--save_path", ""],
     "--save_path '': expected a path, got an empty one"),
])
def test_a_refusal_names_the_flag_that_was_given(capsys, extra, says):
    code, _, err = serve_cli(["--model", "smollm2-135m", "--qps", "1", *extra], capsys)
    line = one_line(code, err)
    assert says in line and "--tensor_parallel_size" not in line \
        and "--data_parallel_size" not in line


# -- 1. a pool's size bounded: what can matter enumerated, the rest refused ----------------
def _toy():
    from perfcounter.models.args import ModelArgs
    # 4 layers, 8 heads of 8, 8 KV heads: TP 1, 2, 4, 8 divide the heads
    return ModelArgs(block_size=1024, vocab_size=64, n_layer=4, n_head=8, n_local_heads=8,
                     dim=64, intermediate_size=128)


def test_replicas_go_up_to_the_requests():
    from perfcounter.plan import Space, enumerate_candidates, parse_devices
    space = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                  tensor_parallel_sizes=(1,), max_replicas=2)
    cands = enumerate_candidates(_toy(), parse_devices("h100-sxm:8"), "bfloat16", space)
    # aggregated: TP 1, PP 1 (one node), DP 1 and 2 (4 and 8 would idle: 2 requests)
    assert [c.data_parallel_size for c in cands if not c.disaggregated] == [1, 2]
    # P + D a power of two of 1-GPU instances, each at most 2: 1:1 (n = 2), 2:2 (n = 4); at
    # n = 8 one side would need 6 (was 1:1, 1:3, 2:2, 3:1, and seven splits of 8 -> 11)
    assert [(c.num_prefill_instances, c.num_decode_instances) for c in cands
            if c.disaggregated] == [(1, 1), (2, 2)]
    two = parse_devices("h100-sxm:8,a100-sxm4-80gb:8")
    cross = [(c.num_prefill_instances, c.num_decode_instances) for c in
             enumerate_candidates(_toy(), two, "bfloat16", space)
             if c.disaggregated and c.device != c.decode_device]
    # each side a power of two up to 2: 1, 2 -> 4 ratios, in both directions
    assert cross == [(1, 1), (1, 2), (2, 1), (2, 2)] * 2
    asked = Space(quantizations=(None,), kv_cache_dtypes=(None,), max_num_seqs=(16,),
                  tensor_parallel_sizes=(1,), data_parallel_sizes=(4,), max_replicas=2,
                  disaggregated=False)  # a size asked is kept as asked
    assert [c.data_parallel_size for c in
            enumerate_candidates(_toy(), parse_devices("h100-sxm:8"), "bfloat16", asked)] == [4]


def test_a_pool_of_thousands_is_refused_at_the_bound_without_building_it():
    from perfcounter.plan import PlanError, Space, enumerate_candidates, parse_devices
    from perfcounter.plan.candidates import MAX_CANDIDATES, _ratios
    pool = parse_devices("h100-sxm:1048576")  # the most a kind may hold: 2^20
    with pytest.raises(PlanError) as e:
        enumerate_candidates(_toy(), pool, "bfloat16", Space(max_replicas=50))
    assert str(e.value).startswith("--devices h100-sxm:1048576: more than 4,096 candidates to "
                                   "simulate (at most 4,096 a search); narrow the space")
    assert MAX_CANDIDATES == 4096
    # the splits of 2^20 one-GPU instances come one at a time: (1, 1), then (1, 3), (2, 2)...
    splits = _ratios(pool[0], pool[0], 1)
    assert [next(splits) for _ in range(3)] == [(1, 1), (1, 3), (2, 2)]


@pytest.mark.parametrize("devices, says", [
    ("h100-sxm:99999999999999999999", "--devices 'h100-sxm:99999999999999999999': "
     "99,999,999,999,999,999,999 GPUs of h100-sxm; at most 1,048,576 GPUs of a kind"),
    ("h100-sxm:1048577", "1,048,577 GPUs of h100-sxm; at most 1,048,576"),  # 2^20 + 1
    ("h100-sxm:²", "--devices 'h100-sxm:²': expected KIND:COUNT[,KIND:COUNT] such as "
                   "h100-sxm:8 (a count >= 1 after each device), got 'h100-sxm:²'"),
])
def test_a_pool_count_out_of_bounds_is_refused(devices, says):
    from perfcounter.plan import PlanError, parse_devices
    with pytest.raises(PlanError) as e:
        parse_devices(devices)
    assert says in str(e.value)


def plan_cli(argv, capsys):
    from perfcounter.cli.main import main
    code = main(argv=["plan", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


ISSUE_PLAN = ["--model", "smollm2-135m", "--qps", "5", "--slo", "ttft=1s,tpot=50ms",
              "--num_requests", "50"]


@pytest.mark.parametrize("extra, says", [
    # the issue's question: refused before any table is counted, the bound named
    (["--devices", "h100-sxm:4096"],
     "--devices h100-sxm:4096: more than 4,096 candidates to simulate (at most 4,096 a "
     "search)"),
    (["--devices", "h100-sxm:99999999999999999999"], "at most 1,048,576 GPUs of a kind"),
    (["--devices", "h100-sxm:8", "--usd_per_hour", "1e300"],
     "--usd_per_hour 1e+300: expected a price in [0, 100,000] USD a device-hour"),
    (["--devices", "h100-sxm:8", "--slo_attainment", "1e-300"],
     "--slo_attainment 1e-300: expected a fraction in [0.01, 1]"),
    (["--devices", "h100-sxm:8", "--save_path", ""],
     "--save_path '': expected a path, got an empty one"),
])
def test_plan_refuses_in_one_line_before_any_work(capsys, extra, says):
    from perfcounter.serve import cache_info
    tables = cache_info().tables
    code, out, err = plan_cli([*ISSUE_PLAN, *extra], capsys)
    assert code == 2 and "\n" not in err and says in err, err
    assert err.startswith("perfcounter plan: error: ") and not out
    assert cache_info().tables == tables  # no step table counted


def test_a_plan_where_nothing_fits_says_what_did_not(capsys):
    from perfcounter.plan import plan
    from perfcounter.plan.render import plan_text
    # Llama-3.1-70B on one A100 40 GB: even int4 (39.03 GB of weights) leaves no KV cache in
    # 0.9 x its memory; every candidate is left out, a pool of 2 workers runs nothing
    result = plan("llama-3.1-70b", "a100-sxm4-40gb:1", slo="ttft=1s,tpot=50ms", qps=1,
                  num_requests=10, workers=2)
    assert result.simulated == 0 and result.recommended is None
    text = plan_text(result)
    assert "(no candidate was simulated)" in text
    assert ("recommended: none; no candidate fits 1 x a100-sxm4-40gb: a rank's weights and "
            "workspace leave no KV cache; give more or larger devices (--devices) or smaller "
            "weights (--quantize)") in text
    assert "max_workers" not in text


def test_a_cpu_pool_shows_no_energy_it_does_not_know_and_runs_eager(tiny, capsys):
    import shlex
    from perfcounter.plan import plan
    from perfcounter.plan.render import plan_text
    cpu = tiny / "mycpu.yaml"  # a CPU with memory and peaks, no energy figures, no price
    cpu.write_text("devices:\n  my-cpu:\n    device_type: cpu\n    vram_GB: 16\n"
                   "    bandwidth_GBs: 51.2\n    tflops: {float32: 0.768, bfloat16: 0.768}\n"
                   "    source:\n      default: a test's assumed part\n")
    result = plan(str(tiny / "tiny.json"), f"{cpu}:1", slo="ttft=10s,tpot=1s", qps=1,
                  num_requests=4, prompt_length="16", max_new_tokens="4",
                  quantizations=("none",), kv_cache_dtypes=("none",), max_num_seqs=(8,),
                  backend="serial")
    (figures,) = result.figures
    assert figures["j_per_output_token"] is None and figures["usd_per_1m_output_tokens"] is None
    text = plan_text(result)
    assert f"steps cudagraphs (eager on {cpu}: no CUDA graphs there)" in text
    row = next(line for line in text.splitlines() if line.startswith("0 "))
    assert row.split()[-2:] == ["-", "-"]  # $/1M tok and J/tok both unknown: "-"
    argv = shlex.split(result.commands[0])
    assert "--execution" not in argv  # serve runs the engine's own regime there: eager
    save = tiny / "cpu.json"
    code, _, err = serve_cli([*argv[2:], "--save_path", save], capsys)
    served = json.loads(save.read_text())
    assert code == 0 and served["execution"] == "eager"
    assert served["median_tpot_ms"] == figures["median_tpot_ms"]


def test_a_disaggregated_command_carries_a_price_given_to_the_search(tiny, capsys):
    import shlex
    from perfcounter.plan import plan
    result = plan(str(tiny / "tiny.json"), "h100-sxm:2", slo="ttft=50ms,tpot=2ms", qps=50,
                  num_requests=12, prompt_length="32", max_new_tokens="8",
                  quantizations=("none",), kv_cache_dtypes=("none",), max_num_seqs=(8,),
                  tensor_parallel_size=(1,), pipeline_parallel_size=(1,),
                  data_parallel_size=(1,), usd_per_hour=2.5, backend="serial")
    i = next(i for i, c in enumerate(result.candidates) if c.disaggregated)  # 1P:1D
    argv = shlex.split(result.commands[i])
    assert argv[argv.index("--usd_per_hour") + 1] == "2.5"
    save = tiny / "priced.json"
    code, _, err = serve_cli([*argv[2:], "--save_path", save], capsys)
    assert code == 0, err
    # 1 + 1 GPUs at $2.5 an hour, both in plan and in serve
    served = json.loads(save.read_text())["overall"]["usd_per_1m_output_tokens"]
    assert served == result.figures[i]["usd_per_1m_output_tokens"]


# -- the same checks from Python: deployment(), serve(), plan(), a mapping ---------------------
def test_the_python_api_checks_what_the_command_line_checks():
    from perfcounter.models.args import ModelArgs
    from perfcounter.plan import PlanError, plan
    from perfcounter.serve import ServeError, deployment, serve, synthetic
    from perfcounter.simulation.placement import Mapping, MappingError
    toy = ModelArgs(**TINY)
    with pytest.raises(ServeError, match=r"--data_parallel_size 1000000000"):
        deployment(toy, "h100-sxm", data_parallel_size=10**9)
    with pytest.raises(ServeError, match=r"^--usd_per_hour 1e\+300: expected a price in \[0, "):
        deployment(toy, "h100-sxm", usd_per_hour=1e300)
    dep = deployment(toy, "h100-sxm", execution="bound")
    with pytest.raises(ServeError, match=r"^--usd_per_kwh 1e\+300: expected a price in \[0, "):
        serve(dep, synthetic(2, 8, 2, qps=1, seed=0), usd_per_kwh=1e300)
    with pytest.raises(PlanError, match=r"^--slo_attainment 1e-300: expected a fraction in"):
        plan(toy, "h100-sxm:1", slo="ttft=1s", qps=1, slo_attainment=1e-300)
    with pytest.raises(MappingError, match=r"not an empty string$"):
        Mapping.load("")
    with pytest.raises(MappingError, match=r"'tp=²' needs a whole number from 1 to 4,096"):
        Mapping.load({"layers": "h100-sxm,tp=²"})


def test_plan_enumerates_no_more_replicas_than_requests():
    from perfcounter.models.args import ModelArgs
    from perfcounter.plan import plan
    toy = ModelArgs(**TINY)
    # 2 requests on 8 GPUs: DP 1 and 2 only (DP 4 and 8 would leave replicas with no request)
    r = plan(toy, "h100-sxm:8", slo="ttft=1s,tpot=50ms", qps=1, num_requests=2,
             prompt_length="8", max_new_tokens="2", max_num_seqs=(16,), quantizations=(None,),
             kv_cache_dtypes=(None,), tensor_parallel_size=(1,), disaggregated=False,
             backend="processes", workers=1)
    assert sorted({c.data_parallel_size for c in r.candidates}) == [1, 2]
