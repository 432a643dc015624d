"""The engine's own launch command (serve/launch.py): every flag printed is one of the pinned
release's (engine_flags.yaml) and every value the simulated config's; serve and plan print it
and save it; perfcounter's own commands use its flags' real spelling; --help states the
--execution default each command really uses."""
import dataclasses
import itertools
import json
import re
import shlex

import pytest

from perfcounter.cli.main import build_parser, main
from perfcounter.models import hf_presets
from perfcounter.models.args import PRESETS, ModelArgs
from perfcounter.serve import deployment
from perfcounter.serve.engines import PROFILES
from perfcounter.serve.launch import (HF_REPOS, PINNED, LaunchError, Simulated, check,
                                      launch_command, model_id)

TINY = {"block_size": 1024, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 32, "intermediate_size": 64}
TINY_ARGS = ModelArgs(**TINY)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("launch") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def flags_of(engine: str, argv) -> dict:
    """{flag: value, or True for a flag without one} of a launch argv (after the launcher
    and vLLM's positional model), every flag asserted to be one the pinned release lists."""
    pinned = PINNED[engine]
    rest = list(argv)[len(pinned["command"]):]
    out = {"model": rest.pop(0)} if pinned["model"] == "positional" else {}
    while rest:
        flag = rest.pop(0)
        assert flag in pinned["flags"], f"{flag} is not a {pinned['version']} flag"
        out[flag] = True if pinned["flags"][flag].get("boolean") else rest.pop(0)
    return out


def test_the_pinned_releases_are_the_profiles_and_every_flag_has_its_source():
    for engine, pinned in PINNED.items():
        assert pinned["version"] == PROFILES[engine].version  # one engine: figures and command
        assert pinned["source"]["tag"].endswith(pinned["version"].split()[-1])
        for flag, spec in pinned["flags"].items():
            assert flag.startswith("--") and "line" in spec["source"], flag
            assert spec.get("boolean") or spec.get("choices") or spec.get("type"), flag
    assert set(HF_REPOS) == set(PRESETS)  # every preset of ours names its repository


def test_the_model_as_the_engine_takes_it(tiny):
    assert model_id("qwen3-8b") == "Qwen/Qwen3-8B"  # hf_presets.yaml's repo
    assert model_id("Llama-4-Scout-17B-16E-Instruct") == hf_presets.PRESETS["llama-4-scout"].repo
    assert model_id("llama-3-8b") == "meta-llama/Meta-Llama-3-8B"
    assert model_id("7b") == "meta-llama/Llama-2-7b-hf"  # an alias of llama-2-7b
    assert model_id("meta-llama/Llama-2-7b-chat-hf") == "meta-llama/Llama-2-7b-chat-hf"  # given
    assert model_id(tiny) == tiny.rsplit("/", 1)[0]  # a config.json: its folder
    assert model_id("not-a-preset") == "not-a-preset"
    # our presets are told apart by their args: no two alike
    assert len({repr(ModelArgs.from_name(n)) for n in PRESETS}) == len(PRESETS)


# By hand: TP 2, PP 1, DP 4, EP, 128 sequences, 4,096 tokens a step, blocks of 32, 0.85 of the
# memory, fp8 weights and KV cache, eager steps where the engine's default is CUDA graphs.
FULL = Simulated("vllm", "qwen3-8b", "bfloat16", 2, 1, 4, True, 128, 4096, 32, 0.85, "fp8",
                 "fp8", "eager", "cudagraphs")


def test_vllm_command_by_hand():
    launch = launch_command(FULL)
    assert launch.text == (
        "vllm serve Qwen/Qwen3-8B --dtype bfloat16 --tensor-parallel-size 2 "
        "--pipeline-parallel-size 1 --data-parallel-size 4 --enable-expert-parallel "
        "--max-num-seqs 128 --max-num-batched-tokens 4096 --enable-chunked-prefill "
        "--block-size 32 --gpu-memory-utilization 0.85 --kv-cache-dtype fp8 --quantization fp8 "
        "--enforce-eager")
    assert launch.notes == () and launch.version == "vLLM v0.10.0"


def test_sglang_command_by_hand():
    launch = launch_command(dataclasses.replace(FULL, engine="sglang", quantization="int4-64"))
    assert launch.text == (
        "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --dtype bfloat16 --tp-size 2 "
        "--pp-size 1 --dp-size 4 --enable-ep-moe --max-running-requests 128 "
        "--chunked-prefill-size 4096 --page-size 32 --kv-cache-dtype fp8_e4m3 "
        "--torchao-config int4wo-64 --disable-cuda-graph")
    # SGLang's EP spans TP (ep_size = tp_size); ours spans TP x DP: said, not hidden
    assert launch.notes == ("SGLang v0.4.9's expert parallelism spans the 2 TP ranks; "
                            "perfcounter's spans TP x DP",)


VLLM_KV = {"fp8": "fp8"}  # perfcounter's fp8 KV cache (e4m3) by each engine's name
SGLANG_KV = {"fp8": "fp8_e4m3"}


@pytest.mark.parametrize("engine, quantization, kv, execution", itertools.product(
    ("vllm", "sglang"), (None, "int8", "int4-128", "fp8"), (None, "int8", "fp8"),
    (None, "cudagraphs", "eager", "compiled", "bound")))
def test_every_flag_is_pinned_and_every_value_simulated(engine, quantization, kv, execution):
    s = Simulated(engine, "llama-3-8b", "float16", 4, 2, 3, False, 64, 2048, 16, 0.9,
                  quantization, kv, execution, "cudagraphs")
    launch = launch_command(s)
    got = flags_of(engine, launch.argv)
    vllm = engine == "vllm"
    model = got.pop("model") if vllm else got.pop("--model-path")
    assert model == "meta-llama/Meta-Llama-3-8B"
    expected = {"--dtype": "float16"}
    names = (("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
              "--max-num-seqs", "--max-num-batched-tokens", "--block-size") if vllm else
             ("--tp-size", "--pp-size", "--dp-size", "--max-running-requests",
              "--chunked-prefill-size", "--page-size"))
    expected.update(zip(names, ("4", "2", "3", "64", "2048", "16")))
    if vllm:
        expected.update({"--enable-chunked-prefill": True, "--gpu-memory-utilization": "0.9"})
    if kv == "fp8":
        expected["--kv-cache-dtype"] = (VLLM_KV if vllm else SGLANG_KV)[kv]
    if quantization == "fp8":
        expected["--quantization"] = "fp8"
    elif quantization is not None and not vllm:  # torchao's int8 a channel, int4 a group
        expected["--torchao-config"] = {"int8": "int8wo", "int4-128": "int4wo-128"}[quantization]
    if execution == "eager":
        expected["--enforce-eager" if vllm else "--disable-cuda-graph"] = True
    assert got == expected
    said = " ".join(launch.notes)  # what no flag of the release says is a note, never dropped
    assert (kv == "int8") == ("KV cache int8" in said)
    assert (vllm and quantization in ("int8", "int4-128")) == ("quantizes none" in said)
    assert (execution in ("compiled", "bound")) == (f"steps priced {execution}" in said)


@pytest.mark.parametrize("argv, says", [
    (["vllm", "serve", "m", "--tp", "2"], "--tp: not a flag of vLLM v0.10.0's vllm serve"),
    (["vllm", "serve", "m", "--kv-cache-dtype", "int8"], "--kv-cache-dtype int8: vLLM v0.10.0 "
                                                        "takes auto, fp8, fp8_e4m3"),
    (["vllm", "serve", "m", "--max-num-seqs", "many"], "--max-num-seqs many: vLLM v0.10.0 takes int"),
    (["vllm", "serve", "m", "--block-size"], "--block-size None"),
])
def test_a_flag_or_value_the_release_lacks_is_refused(argv, says):
    with pytest.raises(LaunchError) as e:
        check("vllm", argv)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_trtllm_has_no_pinned_command():
    launch = launch_command(Simulated("trtllm", "qwen3-8b", "bfloat16"))
    assert launch.argv == () and launch.to_dict()["launch_command"] is None
    assert "no TensorRT-LLM 1.0 command" in launch.notes[0]


@pytest.mark.slow
def test_serve_prints_and_saves_the_deployments_command(tmp_path, capsys):
    out = tmp_path / "serve.json"
    argv = ["serve", "--model", "smollm2-135m", "--device_spec", "h100-sxm", "--tp", "3",
            "--kv_dtype", "fp8", "--execution", "eager", "--num_requests", "8", "--qps", "4",
            "--prompt_length", "32", "--max_new_tokens", "8", "--save_path", str(out)]
    assert main(argv=argv) == 0
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert f"run it (vLLM v0.10.0's flags): {d['launch_command']}" in text
    got = flags_of("vllm", shlex.split(d["launch_command"]))
    assert got["model"] == "HuggingFaceTB/SmolLM2-135M"
    assert got["--tensor-parallel-size"] == "3" and got["--data-parallel-size"] == "1"
    assert got["--dtype"] == d["precision"] == "bfloat16"
    assert int(got["--max-num-seqs"]) == d["engine"]["max_num_seqs"]
    assert int(got["--max-num-batched-tokens"]) == d["engine"]["max_num_batched_tokens"]
    assert int(got["--block-size"]) == d["engine"]["block_size"]
    assert float(got["--gpu-memory-utilization"]) == d["memory"]["gpu_memory_utilization"]
    assert got["--kv-cache-dtype"] == d["kv_dtype"] == "fp8"
    assert got["--enforce-eager"] is True and d["execution"] == "eager"  # asked, on a GPU


@pytest.mark.slow
def test_plan_prints_and_saves_the_recommended_command(tmp_path, capsys, tiny):
    out = tmp_path / "plan.json"
    code = main(argv=["plan", "--model", tiny, "--devices", "h100-sxm:1", "--qps", "50",
                      "--num_requests", "24", "--prompt_length", "32", "--max_new_tokens", "8",
                      "--quantize", "none", "--kv_dtype", "none,fp8", "--max_num_seqs", "4",
                      "--slo", "ttft=50ms,tpot=2ms", "--workers", "1", "--engine", "sglang",
                      "--save_path", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    d = json.loads(out.read_text())
    best = d["candidates"][d["recommended"]]
    assert d["launch_command"] == best["launch_command"] and d["launch_command"] in text
    got = flags_of("sglang", shlex.split(d["launch_command"]))
    assert got["--model-path"] == tiny.rsplit("/", 1)[0]
    assert (got["--tp-size"], got["--pp-size"], got["--dp-size"]) == tuple(
        str(best[k]) for k in ("tensor_parallel_size", "pipeline_parallel_size",
                               "data_parallel_size"))
    assert int(got["--max-running-requests"]) == best["max_num_seqs"] == 4
    assert int(got["--chunked-prefill-size"]) == 8192  # plan's --max_num_batched_tokens default
    assert got.get("--kv-cache-dtype") == {"fp8": "fp8_e4m3", None: None}[best["kv_cache_dtype"]]
    # the perfcounter command beside it uses perfcounter's own spelling: it parses as typed
    serve = build_parser().parse_args(shlex.split(best["serve_command"])[1:])
    assert serve.max_num_seqs == 4 and serve.engine == "sglang"


@pytest.mark.slow
def test_serve_plan_names_the_smallest_fit_as_flags(capsys):
    argv = ["serve", "--model", "llama-3.1-70b", "--device_spec", "h100-sxm", "--plan"]
    assert main(argv=argv) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "smallest fit" in ln)
    for part in line.removeprefix("smallest fit: ").split("; "):
        flags = part.split(" (")[0]
        parsed = build_parser().parse_args([*argv, *shlex.split(flags)])  # real spellings
        assert parsed.tensor_parallel_size >= 1


def _execution_default(command: str, capsys) -> str:
    main(argv=[command, "--help"])  # argparse's help, exit code 0
    text = " ".join(capsys.readouterr().out.split())
    entry = re.search(r"--execution \{[^}]*\} (.*?)(?= --[a-z])", text).group(1)
    return re.search(r"\(default: ([^)]*)\)", entry).group(1)


def test_help_states_the_execution_default_each_command_uses(capsys):
    said = _execution_default("serve", capsys)
    assert said == "the engine's: cudagraphs on a GPU spec, eager elsewhere"
    # what serve does with no --execution: the engine's regime on the device
    assert deployment(TINY_ARGS, "h100-sxm").execution == "cudagraphs"
    assert deployment(TINY_ARGS, "generic-cpu").execution == "eager"
    assert _execution_default("plan", capsys).startswith("cudagraphs; on a kind that replays "
                                                          "no CUDA graphs")
    assert _execution_default("count", capsys) == "eager"
    assert _execution_default("sweep", capsys) == "eager"
