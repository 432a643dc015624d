"""The command that runs it: what perfcounter simulated, as the serving engine's own launch
command (`perfcounter serve` prints it beside its figures, `perfcounter plan` beside its
recommendation, both in their JSON as `launch_command`).

    launch = for_deployment(dep)        # vllm serve Qwen/Qwen3-8B --dtype bfloat16 ...
    launch.text, launch.notes           # the command ("" where none), what it cannot say
    for_candidate(c, job, execution)    # a plan candidate's (plan/evaluate.py's Job)

The flags come from engine_flags.yaml: those of `vllm serve` (vLLM v0.10.0) and of
`python -m sglang.launch_server` (SGLang v0.4.9), each read in the release's own argument
parser, at the release whose defaults serve/engines.py simulates. A flag not listed there,
or a value outside its choices or type, is never printed: `check` raises LaunchError.

What is simulated -> the flag (vLLM; SGLang):
    --precision             --dtype; --dtype
    TP / PP / DP            --tensor-/--pipeline-/--data-parallel-size; --tp-/--pp-/--dp-size
    EP                      --enable-expert-parallel; --enable-ep-moe (SGLang's EP spans the
                            TP ranks: a note where DP > 1, perfcounter's spans TP x DP)
    max_num_seqs            --max-num-seqs; --max-running-requests
    token budget a step     --max-num-batched-tokens and --enable-chunked-prefill (the
                            scheduler chunks prefills); --chunked-prefill-size
    KV block                --block-size; --page-size
    gpu_memory_utilization  --gpu-memory-utilization; (SGLang's --mem-fraction-static means
                            another share: left out)
    KV cache fp8            --kv-cache-dtype fp8; fp8_e4m3 (int8: neither has one, a note)
    weights fp8 (W8A8)      --quantization fp8; --quantization fp8
    weights int8, int4-G    (a note: vLLM v0.10.0 quantizes neither at load as counted);
                            --torchao-config int8wo, int4wo-G (torchao's, as counted)
    eager on a GPU          --enforce-eager; --disable-cuda-graph (compiled, bound: a note)
The model: a transformers preset's repository (models/hf_presets.yaml), one of our presets'
(engine_flags.yaml hf_repos), a repository id given, else the path given (a config.json's
folder). TensorRT-LLM has no pinned flags here: its command is none, with a note saying so.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from perfcounter.devices import get_device_spec
from perfcounter.models import hf_presets
from perfcounter.models.args import ModelArgs, UnknownModelError
from perfcounter.serve.engines import engine_profile
from perfcounter.strict_yaml import load_yaml

FLAGS_FILE = Path(__file__).with_name("engine_flags.yaml")
_DATA = load_yaml(FLAGS_FILE.read_text(encoding="utf-8"))
HF_REPOS: dict[str, str] = _DATA.pop("hf_repos")
PINNED: dict[str, dict] = _DATA  # engine -> version, command, model, source, flags


class LaunchError(ValueError):
    """A flag the pinned release does not list, or a value it does not take."""


@dataclass(frozen=True, slots=True)
class Simulated:
    """What perfcounter simulated, in vLLM's names (the deployment or candidate's)."""

    engine: str
    model: str
    dtype: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    quantization: str | None = None  # quantize.WeightScheme's name: int8, int4-G, fp8
    kv_cache_dtype: str | None = None  # int8, fp8 (None: --dtype)
    execution: str | None = None  # the regime priced; None: the engine's default there
    default_execution: str = "cudagraphs"  # the engine's default regime on the device
    notes: tuple = ()  # what no flag says (a GGUF's weights)


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """The engine's command line (argv; empty where there is none) and what it cannot say."""

    engine: str
    version: str | None
    argv: tuple = ()
    notes: tuple = field(default_factory=tuple)

    @property
    def text(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict:
        return {"launch_command": self.text or None, "launch_engine": self.version,
                "launch_notes": list(self.notes)}


def model_id(model) -> str:
    """The model as the engine takes it (module doc)."""
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        return str(path.parent if path.suffix == ".json" else path)
    if "/" in text:  # a repository id given (org/name)
        return text
    found = hf_presets.find(text)
    if found:
        return hf_presets.PRESETS[found].repo
    try:
        args = ModelArgs.from_name(text)
    except UnknownModelError:
        return text
    return next((repo for name, repo in HF_REPOS.items() if ModelArgs.from_name(name) == args),
                text)


def check(engine: str, argv) -> None:
    """Every flag of `argv` (after the launcher and, for vLLM, the model) one the pinned
    release lists, and each value in its choices or of its type; LaunchError otherwise."""
    pinned = PINNED[engine]
    flags, rest = pinned["flags"], list(argv)[len(pinned["command"]):]
    if pinned["model"] == "positional":
        rest = rest[1:]
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag not in flags:
            raise LaunchError(f"{flag}: not a flag of {pinned['version']}'s "
                              f"{' '.join(pinned['command'])} (serve/engine_flags.yaml)")
        spec = flags[flag]
        if spec.get("boolean"):
            i += 1
            continue
        value = rest[i + 1] if i + 1 < len(rest) else None
        choices = spec.get("choices")
        kind = {"int": int, "float": float, "str": str}.get(spec.get("type"), str)
        try:
            ok = value is not None and (str(value) in map(str, choices) if choices
                                        else kind(value) is not None)
        except ValueError:
            ok = False
        if not ok:
            raise LaunchError(f"{flag} {value}: {pinned['version']} takes "
                              + (', '.join(map(str, choices)) if choices else spec['type']))
        i += 2


def _regime(s: Simulated, version: str, eager_flag: str) -> tuple[list, list]:
    """(flags, notes) of the regime priced, where it is not the engine's default there."""
    if s.execution in (None, s.default_execution):
        return [], []
    if s.execution == "eager":
        return [eager_flag], []
    what = {"bound": "the roofline, a bound and no program",
            "compiled": "compiled kernels without CUDA graphs"}.get(s.execution, s.execution)
    return [], [f"steps priced {s.execution} ({what}); {version} runs its default, "
                f"{s.default_execution}, with these flags"]


def _vllm(s: Simulated, version: str) -> tuple[list, list]:
    argv = [model_id(s.model), "--dtype", s.dtype,
            "--tensor-parallel-size", str(s.tensor_parallel_size),
            "--pipeline-parallel-size", str(s.pipeline_parallel_size),
            "--data-parallel-size", str(s.data_parallel_size)]
    argv += ["--enable-expert-parallel"] * s.enable_expert_parallel
    argv += ["--max-num-seqs", str(s.max_num_seqs),
             "--max-num-batched-tokens", str(s.max_num_batched_tokens),
             "--enable-chunked-prefill", "--block-size", str(s.block_size),
             "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    notes = []
    if s.kv_cache_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    elif s.kv_cache_dtype is not None:
        notes.append(f"KV cache {s.kv_cache_dtype}: {version}'s --kv-cache-dtype stores none")
    if s.quantization == "fp8":
        argv += ["--quantization", "fp8"]  # W8A8: fp8 weights, dynamic fp8 activations
    elif s.quantization is not None:
        notes.append(f"weights {s.quantization}: {version} quantizes none so at load; serve "
                     "a checkpoint stored so (its quantization_config)")
    flags, more = _regime(s, version, "--enforce-eager")
    return argv + flags, notes + more


def _sglang(s: Simulated, version: str) -> tuple[list, list]:
    argv = ["--model-path", model_id(s.model), "--dtype", s.dtype,
            "--tp-size", str(s.tensor_parallel_size), "--pp-size", str(s.pipeline_parallel_size),
            "--dp-size", str(s.data_parallel_size)]
    notes = []
    if s.enable_expert_parallel:
        argv.append("--enable-ep-moe")
        if s.data_parallel_size > 1:
            notes.append(f"{version}'s expert parallelism spans the {s.tensor_parallel_size} "
                         "TP ranks; perfcounter's spans TP x DP")
    argv += ["--max-running-requests", str(s.max_num_seqs),
             "--chunked-prefill-size", str(s.max_num_batched_tokens),
             "--page-size", str(s.block_size)]
    if s.kv_cache_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    elif s.kv_cache_dtype is not None:
        notes.append(f"KV cache {s.kv_cache_dtype}: {version}'s --kv-cache-dtype stores none")
    if s.quantization == "fp8":
        argv += ["--quantization", "fp8"]
    elif s.quantization is not None:  # torchao's int8 a channel, int4 a group (as counted)
        kind, _, group = s.quantization.partition("-")
        argv += ["--torchao-config", f"{kind}wo" + (f"-{group}" if group else "")]
    flags, more = _regime(s, version, "--disable-cuda-graph")
    return argv + flags, notes + more


BUILDERS = {"vllm": _vllm, "sglang": _sglang}


def launch_command(s: Simulated) -> LaunchCommand:
    """The pinned engine's command for `s`, every flag checked (check)."""
    if s.engine not in PINNED:
        return LaunchCommand(s.engine, None, (), (
            f"no {engine_profile(s.engine).version} command: perfcounter pins the flags of "
            f"{', '.join(p['version'] for p in PINNED.values())} (serve/engine_flags.yaml)",))
    pinned = PINNED[s.engine]
    args, notes = BUILDERS[s.engine](s, pinned["version"])
    argv = (*pinned["command"], *args)
    check(s.engine, argv)
    return LaunchCommand(s.engine, pinned["version"], argv, (*s.notes, *notes))


def _weights(weights) -> tuple[str | None, tuple]:
    """(the scheme's name, notes) of a deployment's stored weights (a GGUF's: a note)."""
    if weights is None:
        return None, ()
    if hasattr(weights, "kinds"):  # a llama.cpp file's tensors, each at its type
        return None, ("weights as a llama.cpp GGUF stores them: serve that .gguf file",)
    return weights.name, ()


def for_deployment(dep) -> LaunchCommand:
    """A serve Deployment's command (a placement over devices, run by no engine: none)."""
    if dep.profile is None or dep.devices:
        return LaunchCommand(getattr(dep.profile, "name", "none"), None, (), (
            "a placement over several devices: no serving engine runs it",))
    quantization, notes = _weights(dep.weights)
    return launch_command(Simulated(
        dep.profile.name, dep.model_name, str(dep.dtype).replace("torch.", ""),
        *(getattr(dep.parallel, k) for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                             "data_parallel_size", "enable_expert_parallel")),
        dep.engine.max_num_seqs, dep.engine.max_num_batched_tokens, dep.engine.block_size,
        dep.plan.gpu_memory_utilization, quantization, dep.kv_dtype,
        dep.execution, dep.profile.regime(dep.spec).value, notes))


def for_candidate(c, job, execution: str | None) -> LaunchCommand:
    """A plan candidate's command (plan/candidates.Candidate; its Job; the regime it was
    priced in, None: the engine's own); a disaggregated one's is none, with the reason."""
    if c.disaggregated:
        return LaunchCommand(job.engine, None, (), (
            "disaggregated: a prefill and a decode pool of engines joined by a KV connector, "
            "which perfcounter does not choose; no single command",))
    spec = get_device_spec(c.device)
    return launch_command(Simulated(
        job.engine, job.model_name, c.dtype, c.tensor_parallel_size, c.pipeline_parallel_size,
        c.data_parallel_size, c.enable_expert_parallel, c.max_num_seqs,
        job.max_num_batched_tokens, job.block_size, job.gpu_memory_utilization,
        c.quantization, c.kv_cache_dtype, execution,
        engine_profile(job.engine).regime(spec).value))
