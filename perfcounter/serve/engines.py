"""Engine profiles: what a serving engine sets by itself, each figure with its source.

`--engine vllm|trtllm|sglang` (default vllm) picks one. A profile gives, for a device:

- the regime its steps run in by default (CUDA graphs on a GPU; eager where the engine
  has none, a CPU or a PIM part: no CUDA, no graph to replay);
- admission: "recompute" (vLLM, SGLang: admit while blocks are free now, preempt the
  newest running request by recompute when they run out) or "no_evict" (TensorRT-LLM's
  GUARANTEED_NO_EVICT: admit a request only when blocks for its whole prompt + output
  are left after every running request's whole prompt + output; nothing is ever evicted);
- its default `max_num_seqs` and token budget (`max_num_batched_tokens`), which depend on
  the device's memory where the engine's code says so;
- host time per step (scheduling, input preparation) and per scheduled sequence, and a fixed
  host cost per request (tokenisation, admission) where the engine publishes one; 0 where it
  publishes none: give `--step_overhead_ms` / `--request_overhead_ms` / `seq_overhead_s`
  measured; whether the host's work for a step overlaps the GPU's previous step
  (`async_scheduling`: vLLM's --async-scheduling, the overlap schedulers of SGLang and
  TensorRT-LLM; scheduler.py's module doc says what a step then costs);
- its sampler: "torch" (vLLM's PyTorch ops, whose bytes serve/sampler.py counts for the
  requests' `sampling=` parameters) or "fused" (an engine's fused sampling kernels, whose
  bytes no source gives: not priced);
- the KV cache's scale granularity when it is stored in int8 / fp8: "tensor" (one scale
  per layer's K and V, what all three engines ship) or "token_head" (a scale per token
  and KV head: perfcounter's quantize.QuantizedKVCache).

`--execution` and the scheduler flags override what a profile sets. Every figure is a
`Figure(value, source)`; `EngineProfile.settings(spec)` gives the values for a device and
`EngineProfile.sources(spec)` says where each came from.
"""
from __future__ import annotations

from dataclasses import dataclass

import math

from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import KV_SCALES
from perfcounter.serve.scheduler import ADMISSIONS

GiB = 1024 ** 3
LIMIT = 1_000_000  # the most sequences or tokens a step may take (a bound named in refusals)
GPU_TYPES = ("cuda", "rocm", "hip")  # device types whose engines replay CUDA (HIP) graphs


@dataclass(frozen=True)
class Figure:
    """One value an engine sets, and where it is stated."""

    value: object
    source: str


def _gpu(spec) -> bool:
    return str(getattr(spec, "device_type", "")).lower() in GPU_TYPES


def _memory(spec) -> float:
    return float(getattr(spec, "vram", None) or 0.0)


@dataclass(frozen=True)
class EngineProfile:
    """An engine's defaults; the callables take the DeviceSpec that serves."""

    name: str
    version: str
    admission: Figure  # "recompute" | "no_evict"
    max_num_seqs: object  # spec -> Figure
    max_num_batched_tokens: object  # spec -> Figure
    step_overhead_s: Figure
    request_overhead_s: Figure
    kv_scales: Figure  # "tensor" | "token_head"
    graphs: Figure  # "cudagraphs" on a GPU where the engine captures graphs by default
    seq_overhead_s: Figure  # host time a scheduled sequence a step
    async_scheduling: Figure  # bool: the host's work overlaps the previous step's GPU work
    sampler: Figure  # "torch" | "fused" (SAMPLERS)
    windowed_kv: Figure  # "freed": a windowed layer's blocks before its window freed; "held"

    def regime(self, spec) -> Figure:
        """The regime the engine's steps run in on `spec` by default."""
        if _gpu(spec):
            return self.graphs
        return Figure("eager", f"{spec.device_type} device: no CUDA graphs to replay "
                               f"({self.name} captures graphs on GPUs only); eager")

    def figures(self, spec) -> dict[str, Figure]:
        return {"execution": self.regime(spec), "admission": self.admission,
                "max_num_seqs": self.max_num_seqs(spec),
                "max_num_batched_tokens": self.max_num_batched_tokens(spec),
                "step_overhead_s": self.step_overhead_s,
                "request_overhead_s": self.request_overhead_s, "kv_scales": self.kv_scales,
                "seq_overhead_s": self.seq_overhead_s, "async_scheduling": self.async_scheduling,
                "sampler": self.sampler, "windowed_kv": self.windowed_kv}

    def settings(self, spec) -> dict:
        return {k: f.value for k, f in self.figures(spec).items()}

    def sources(self, spec) -> dict[str, str]:
        return {k: f.source for k, f in self.figures(spec).items()}


_VLLM = "vLLM v0.10.0"
_VLLM_BATCH = (f"{_VLLM} vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, the OpenAI "
               "server: {} on a device of >= 70 GiB that is not an A100, else {}")


def _vllm_seqs(spec) -> Figure:
    big = _memory(spec) >= 70 * GiB and "a100" not in spec.name.lower()
    return Figure(1024 if big else 256, _VLLM_BATCH.format("max_num_seqs 1024", "256"))


def _vllm_tokens(spec) -> Figure:
    big = _memory(spec) >= 70 * GiB and "a100" not in spec.name.lower()
    return Figure(8192 if big else 2048,
                  _VLLM_BATCH.format("max_num_batched_tokens 8192", "2048"))


_TRT = "TensorRT-LLM 1.0"


def _trt_seqs(spec) -> Figure:
    return Figure(2048, f"{_TRT} trtllm-serve --max_batch_size, default BuildConfig."
                        "max_batch_size = 2048")


def _trt_tokens(spec) -> Figure:
    return Figure(8192, f"{_TRT} trtllm-serve --max_num_tokens, default BuildConfig."
                        "max_num_tokens = 8192")


_SGL = "SGLang v0.4.9"


def _sgl_seqs(spec) -> Figure:
    return Figure(4096, f"{_SGL} python/sglang/srt/model_executor/model_runner.py: "
                        "max_num_reqs = min(max(KV pool tokens / context length x 512, 2048), "
                        "4096): 4096 once the pool holds 8 context lengths")


def _sgl_tokens(spec) -> Figure:
    gb = _memory(spec) / 1024 ** 2  # server_args compares MiB
    size = 2048 if gb < 35 * 1024 else 8192 if gb < 160 * 1024 else 16384
    return Figure(size, f"{_SGL} python/sglang/srt/server_args.py: chunked_prefill_size "
                        "2048 below 35 GB of GPU memory, 8192 below 160 GB, 16384 above")


_NONE_PUBLISHED = ("{} publishes no figure for it; 0 (give --{} from a measurement of the "
                   "engine on the device)")
_TENSOR_SCALES = ("{}: an fp8 / int8 KV cache carries one scale per layer's K and one per V "
                  "(per-tensor: {})")

PROFILES = {
    "vllm": EngineProfile(
        "vllm", _VLLM,
        admission=Figure("recompute", f"{_VLLM} vllm/v1/core/sched/scheduler.py: when a "
                         "running request's new blocks are not free, the request scheduled "
                         "last is preempted and recomputed (v1 has no swapping)"),
        max_num_seqs=_vllm_seqs, max_num_batched_tokens=_vllm_tokens,
        step_overhead_s=Figure(0.0, _NONE_PUBLISHED.format(_VLLM, "step_overhead_ms")),
        request_overhead_s=Figure(0.0, _NONE_PUBLISHED.format(_VLLM, "request_overhead_ms")),
        kv_scales=Figure("tensor", _TENSOR_SCALES.format(
            _VLLM, "docs/features/quantization/quantized_kvcache.md, k_scale and v_scale "
                   "of each attention layer")),
        graphs=Figure("cudagraphs", f"{_VLLM}: CUDA graphs captured by default "
                      "(CompilationConfig, enforce_eager=False)"),
        seq_overhead_s=Figure(0.0, f"{_VLLM} (and v0.11.1) publishes no host time a sequence "
                              "a step; 0 (the nearest published: Scheduler.update_from_output "
                              "alone, 0.287 ms at 256 decodes on a 2026 main, vLLM pull request "
                              "46112; give seq_overhead_s measured)"),
        async_scheduling=Figure(False, f"{_VLLM} and v0.11.1 vllm/config/scheduler.py: "
                                "SchedulerConfig.async_scheduling = False (--async-scheduling "
                                "opts in: the scheduler runs one step ahead of the GPU, vLLM pull "
                                "request 19970)"),
        sampler=Figure("torch", f"{_VLLM} vllm/v1/sample/ops/topk_topp_sampler.py: FlashInfer's "
                       "sampler where FlashInfer is installed (requirements/cuda.txt does not "
                       "require it), else PyTorch ops; v0.11.1 runs the PyTorch ops unless "
                       "VLLM_USE_FLASHINFER_SAMPLER=1 (pull request 26859): their bytes "
                       "(serve/sampler.py)"),
        windowed_kv=Figure("freed", f"{_VLLM} vllm/config.py: SchedulerConfig."
                           "disable_hybrid_kv_cache_manager = False, so on a GPU the hybrid KV "
                           "cache manager gives each kind of attention layer its own blocks "
                           "and frees a sliding or chunked layer's blocks before its window "
                           "(vllm/v1/core/single_type_kv_cache_manager.py; off with a KV "
                           "transfer, i.e. disaggregated prefill: VllmConfig.__post_init__)")),
    "trtllm": EngineProfile(
        "trtllm", _TRT,
        admission=Figure("no_evict", f"{_TRT} docs performance-tuning-guide/useful-runtime-"
                         "flags.md: capacity scheduler policy GUARANTEED_NO_EVICT (default) "
                         "guarantees that a started request is never paused"),
        max_num_seqs=_trt_seqs, max_num_batched_tokens=_trt_tokens,
        step_overhead_s=Figure(0.0, f"{_TRT} docs torch/features/overlap_scheduler.md: the "
                               "overlap scheduler (enabled by default) runs step n's CPU work "
                               "(stop criteria, responses, the next batch's schedule) while the "
                               "GPU runs step n+1: no host time between steps"),
        request_overhead_s=Figure(0.0, _NONE_PUBLISHED.format(_TRT, "request_overhead_ms")),
        kv_scales=Figure("tensor", _TENSOR_SCALES.format(
            _TRT, "docs/source/reference/precision.md, kv_cache_scaling_factor a layer")),
        graphs=Figure("cudagraphs", f"{_TRT} tensorrt_llm/llmapi/llm_args.py: "
                      "cuda_graph_config = CudaGraphConfig() by default (PyTorch backend)"),
        seq_overhead_s=Figure(0.0, _NONE_PUBLISHED.format(_TRT, "seq_overhead_s")),
        async_scheduling=Figure(True, f"{_TRT} docs torch/features/overlap_scheduler.md: the "
                                "overlap scheduler, enabled by default, runs step n's CPU work "
                                "while the GPU runs step n+1"),
        sampler=Figure("fused", f"{_TRT}: its own top-k/top-p sampling kernels; no count of "
                       "their bytes published: not priced"),
        windowed_kv=Figure("held", f"{_TRT} tensorrt_llm/llmapi/llm_args.py: KvCacheConfig."
                           "max_attention_window = None by default: every layer's cache the "
                           "sequence's whole length")),
    "sglang": EngineProfile(
        "sglang", _SGL,
        admission=Figure("recompute", f"{_SGL} python/sglang/srt/managers/scheduler.py: "
                         "out of KV memory, decode requests are retracted (their cache "
                         "freed, recomputed later)"),
        max_num_seqs=_sgl_seqs, max_num_batched_tokens=_sgl_tokens,
        step_overhead_s=Figure(0.0, f"{_SGL}: the overlap scheduler runs the CPU's "
                               "scheduling of step n+1 while the GPU runs step n (SGLang "
                               "v0.4 release blog, 2024-12-04, 'zero-overhead batch "
                               "scheduler'): no host time between steps"),
        request_overhead_s=Figure(0.0, _NONE_PUBLISHED.format(_SGL, "request_overhead_ms")),
        kv_scales=Figure("tensor", _TENSOR_SCALES.format(
            _SGL, "python/sglang/srt/layers/radix_attention.py, k_scale and v_scale")),
        graphs=Figure("cudagraphs", f"{_SGL} server_args.py: disable_cuda_graph=False "
                      "(CUDA graphs for decode batches up to cuda_graph_max_bs)"),
        seq_overhead_s=Figure(0.0, _NONE_PUBLISHED.format(_SGL, "seq_overhead_s")),
        async_scheduling=Figure(True, f"{_SGL}: the overlap scheduler (SGLang v0.4 release "
                                "blog, 2024-12-04, 'zero-overhead batch scheduler') schedules "
                                "step n+1 while the GPU runs step n"),
        sampler=Figure("fused", f"{_SGL} python/sglang/srt/layers/sampler.py: FlashInfer's "
                       "fused top-k/top-p sampling kernels; no count of their bytes "
                       "published: not priced"),
        windowed_kv=Figure("held", f"{_SGL} server_args.py: hybrid_kvcache_ratio = None, one "
                           "KV pool, every layer holding every token (configs/model_config.py "
                           "is_hybrid_model: a separate sliding-window pool only with the ratio "
                           "given, and for Llama 4 only)")),
}
ENGINES = tuple(PROFILES)


def engine_profile(name) -> EngineProfile:
    """The profile of `name` (ENGINES), or a one-line ServeError naming them."""
    if isinstance(name, EngineProfile):
        return name
    if name not in PROFILES:
        raise ServeError(f"--engine {name!r}; valid: {', '.join(ENGINES)}")
    return PROFILES[name]


ENGINE_KEYS = ("max_num_batched_tokens", "max_num_seqs", "step_overhead_s",
               "request_overhead_s", "admission", "kv_scales", "execution", "seq_overhead_s",
               "async_scheduling", "sampler")
FLAGS = {"max_num_batched_tokens": "--max_num_batched_tokens", "max_num_seqs": "--max_num_seqs",
         "step_overhead_s": "--step_overhead_ms", "request_overhead_s": "--request_overhead_ms",
         "admission": "admission=", "kv_scales": "kv_scales=", "execution": "--execution",
         "seq_overhead_s": "seq_overhead_s=", "async_scheduling": "async_scheduling=",
         "sampler": "sampler="}
SAMPLERS = ("torch", "fused")  # serve/sampler.py counts the first; the second is not priced


def engine_settings(profile: EngineProfile, spec, given: dict) -> tuple[dict, dict]:
    """({name: value}, {name: source}) of ENGINE_KEYS: `given` (not None) overrides what
    the profile sets for `spec`."""
    settings, sources = profile.settings(spec), profile.sources(spec)
    for key, value in given.items():
        if value is not None:
            settings[key], sources[key] = value, f"{FLAGS[key]} (given)"
    return settings, sources


def check_given(given: dict) -> None:
    """The values given for ENGINE_KEYS (None: the profile's), each in its range (one-line
    ServeError naming the flag and the range else); execution is the caller's to check."""
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        value = given[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= LIMIT):
            raise ServeError(f"{FLAGS[key]} {value}: expected an integer in [1, {LIMIT:,}]")
    for key in ("step_overhead_s", "request_overhead_s", "seq_overhead_s"):
        value = given.get(key)
        if value is not None and not (0 <= value <= 3600 and math.isfinite(value)):
            raise ServeError(f"{FLAGS[key]} {value * 1e3:g}: expected a time in [0, 3,600,000] ms")
    if not isinstance(given.get("async_scheduling"), (type(None), bool)):
        raise ServeError(f"async_scheduling {given['async_scheduling']!r}: expected True or False")
    if given.get("sampler") not in (None, *SAMPLERS):
        raise ServeError(f"sampler {given['sampler']!r}; valid: {', '.join(SAMPLERS)}")
    if given["admission"] not in (None, *ADMISSIONS):
        raise ServeError(f"admission {given['admission']!r}; valid: {', '.join(ADMISSIONS)}")
    if given["kv_scales"] not in (None, *KV_SCALES):
        raise ServeError(f"kv_scales {given['kv_scales']!r}; valid: {', '.join(KV_SCALES)}")
