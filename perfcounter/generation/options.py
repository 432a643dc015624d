"""generate.py's flags checked before the run: `Options` (its main's keywords, and what
checking them resolved) and `check_options`, every flag checked first, in order
(GenerateArgumentError, one line), before any model is loaded or counted. vLLM's parallel
flags count one rank of our model config only (its shapes and memory: parallel/), and a
model (or rank) that does not fit the device priced is said in one warning.

    o = check_options(Options(**flags))
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from perfcounter._util import PerfcounterWarning, check_writable_target
from perfcounter.counting.module_path import check_depth
from perfcounter.devices import DeviceSpecError, get_device_spec
from perfcounter.devices.op_rates import check_clock
from perfcounter.devices.op_keys import EXECUTIONS
from perfcounter.generation import speculative
from perfcounter.generation.config_only import context_error, resolve_config
from perfcounter.generation.errors import PRECISIONS, GenerateArgumentError
from perfcounter.models.args import ModelArgs
from perfcounter.models.checkpoint_config import checkpoint_config, checkpoint_kind
from perfcounter.models.fit import check_fits
from perfcounter.models.loading import check_device, default_checkpoint, fake_model, read_config
from perfcounter.parallel.memory import fit_line, rank_bytes
from perfcounter.parallel.sharding import ParallelConfig, ParallelError, check_links, rank_args
from perfcounter.pricing.regimes import check_regime
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_types import check_gguf_type
from perfcounter.quant.gguf_stored import check_price_as
from perfcounter.report.plots import check_outputs
from perfcounter.simulation.placement import Mapping


def check_sampling(temperature: float = 1.0, top_k: int | None = None) -> None:
    """temperature: a finite number >= 0 (0: greedy); top_k: None (no top-k) or an int >= 1."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise GenerateArgumentError(f"--temperature must be a finite number >= 0 (0 for greedy), "
                                    f"got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise GenerateArgumentError(f"--top_k must be an int >= 1, got {top_k!r}")


# -- the flags, checked before the run --------------------------------------------------------
@dataclasses.dataclass(slots=True, kw_only=True)
class Options:
    """generate.py's flags (its `main`'s keywords, defaults there), and what checking them
    resolved: the run mode, the model's config, the quantization, dtype and device."""
    prompt: str
    prompt_length: int | None
    num_samples: int
    max_new_tokens: int
    batch_size: int
    top_k: int | None
    temperature: float
    checkpoint_path: Path | None
    model: str | None
    config: Path | None
    hf: bool
    device: str | None
    precision: str | None
    compile: bool
    device_spec: str | None
    io_model: str
    depth: int
    save_path: Path | None
    quiet: bool
    mapping: Path | None
    trust_remote_code: bool
    count_every_step: bool
    draft_checkpoint_path: Path | None
    draft_model: str | None
    speculate_k: int
    acceptance_rate: float | None
    quantize: str | None
    weight_dtype: str | None
    group_size: int | None
    kv_dtype: str | None
    act_dtype: str | None
    price_as: str
    gguf_type: str | None = None  # config only: weights as stored in a llama.cpp file type
    execution: str | None = None  # eager | compiled | cudagraphs; None: as --compile says
    clock: str = "wall"  # how phases are timed (PhaseTimer)
    no_memory_check: bool = False  # a real run: go ahead though it may not fit (models.fit)
    parallel: object = None  # vLLM's parallel sizes (cli/flags.py), then their ParallelConfig
    plot: Path | None
    trace: Path | None
    # resolved by check_options
    config_only: bool = False
    speculative: bool = False
    args: ModelArgs | None = None  # config only, perfcounter's model
    hf_config: object = None  # config only, transformers' model
    scheme: object = None  # weight quantization (quantization.resolve_scheme), or None
    kv: str | None = None
    dtype: torch.dtype | None = None
    placement: Mapping | None = None
    pictures: object = None  # report.plots.check_outputs
    spec_why: str = ""  # why the run is priced on its spec (run_report.run_spec), one line

    @property
    def config_prompt_length(self) -> int:  # 6 = BOS + "Hello, my name is" in Llama-2's tokenizer
        return self.prompt_length or 6

    @property
    def compiled(self) -> bool:  # whether the timed runs were compiled (config only times none)
        return self.execution != "eager" and not self.config_only

    @property
    def sampling(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k)

    @property
    def quantized(self) -> bool:
        return self.scheme is not None or self.kv is not None


def check_options(o: Options) -> Options:
    """Every flag checked before the run, in order (GenerateArgumentError, or the error of the
    module that owns the flag); fills in o's resolved fields and returns o."""
    _check_numbers(o)
    _check_files(o)
    o.scheme, o.kv, o.precision = check_quantization(o.quantize, o.weight_dtype, o.group_size,
                                                     o.kv_dtype, o.act_dtype, o.precision)
    _resolve_model(o)
    _check_stored(o)
    _resolve_device(o)
    o.parallel, o.args = _one_rank_run(o)  # config only: one rank counted
    o.execution, o.compile = check_execution(o.execution, o.compile, o.device, o.config_only)
    try:
        o.clock = check_clock(o.clock)
    except ValueError as e:
        raise GenerateArgumentError(str(e)) from None
    if not o.config_only:  # a real run: its checkpoint's config, before any measuring or loading
        check_checkpoint(o)
    return o


def _check_numbers(o: Options) -> None:
    """The run's sizes, sampling, speculation, --depth and --price_as, before anything else."""
    if o.max_new_tokens < 1 or o.batch_size < 1 or o.num_samples < 1:
        raise GenerateArgumentError(f"--max_new_tokens, --batch_size and --num_samples must be >= "
                                    f"1, got {o.max_new_tokens}, {o.batch_size}, {o.num_samples}")
    if o.prompt_length is not None and o.prompt_length < 1:
        raise GenerateArgumentError(f"--prompt_length must be >= 1, got {o.prompt_length}")
    check_sampling(o.temperature, o.top_k)
    speculative.check_speculate_k(o.speculate_k)
    if o.acceptance_rate is not None:
        speculative.check_acceptance_rate(o.acceptance_rate)
    try:
        check_depth(o.depth)
        check_price_as(o.price_as)
    except ValueError as e:
        raise GenerateArgumentError(f"--{e}") from None


def _check_files(o: Options) -> None:
    """--save_path (its folder made), --mapping (the file read: a bad one fails first), --plot
    and --trace (and matplotlib): before the run, not after."""
    if o.save_path is not None:
        o.save_path = check_save_path(o.save_path)
    o.placement = None if o.mapping is None else Mapping.load(o.mapping)
    try:
        o.pictures = check_outputs(o.plot, o.trace)
    except ValueError as e:
        raise GenerateArgumentError(str(e)) from None


def _resolve_model(o: Options) -> None:
    """Whether the run counts a config only (a model or config, no checkpoint) and whether it
    decodes speculatively (a draft given: gpt-fast's); a config-only run's model read:
    transformers' own with --hf (any causal LM), else perfcounter's ModelArgs."""
    o.config_only = o.checkpoint_path is None and (o.model is not None or o.config is not None)
    o.speculative = speculative.check_run(
        config_only=o.config_only, draft_checkpoint_path=o.draft_checkpoint_path,
        draft_model=o.draft_model, acceptance_rate=o.acceptance_rate, batch_size=o.batch_size,
        hf=o.hf, compile=o.compile)
    if o.config_only and o.hf:
        o.hf_config = resolve_config(o.config if o.config is not None else o.model)
    elif o.config_only:
        o.args = read_config(o.config) if o.config is not None else ModelArgs.from_name(o.model)


def _check_stored(o: Options) -> None:
    """How the weights are stored: --gguf_type (a preset counted config only, no draft) and
    the quantization flags (perfcounter's model alone; config only: the group size applied
    to the model before the run)."""
    if o.gguf_type is not None:
        if not o.config_only or o.speculative:
            raise GenerateArgumentError("--gguf_type prices a preset counted config only (no "
                                        "draft); a .gguf checkpoint is priced as its file says "
                                        "(--price_as)")
        try:
            o.gguf_type = check_gguf_type(o.args if o.args is not None else o.hf_config,
                                          o.gguf_type, hf=o.hf, quantize=o.scheme)
        except ValueError as e:
            raise GenerateArgumentError(f"--{e}") from None
    if o.quantized:
        if o.hf:
            raise GenerateArgumentError("--quantize, --weight_dtype and --kv_dtype quantize "
                                        "perfcounter's model; --hf runs transformers' own (use "
                                        "torchao's quantize_ on it)")
        if o.args is not None:
            apply_quantization(o.args, o.scheme, o.kv)


def _resolve_device(o: Options) -> None:
    """The device (config-only counts run on fake tensors, on a device that is here when one
    is named), the prompt (a real run's not empty), a config-only run's length within its
    model's context, and the precision (None: float32 for a real run on a CPU, whose
    bfloat16 matmuls are slow; else bfloat16) with its dtype."""
    device = o.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        o.device = check_device(device, present=not o.config_only or o.device is not None)
    except ValueError as e:
        priced = ("; a config-only count prices any device by --device_spec (drop --device)"
                  if o.config_only else "")
        raise GenerateArgumentError(f"--{e}{priced}") from None
    if not o.config_only and o.prompt_length is None and not o.prompt:
        raise GenerateArgumentError("--prompt is empty; give some text, or --prompt_length N for a "
                                    "synthetic prompt")
    if o.config_only:
        hf = o.hf_config
        check_length(o.config_prompt_length, o.max_new_tokens,
                     o.args.block_size if o.args is not None else getattr(hf, "block_size", None)
                     or getattr(hf, "max_position_embeddings", None))
    if o.precision is None:
        o.precision = "float32" if o.device == "cpu" and not o.config_only else "bfloat16"
    if o.precision not in PRECISIONS:
        raise GenerateArgumentError(f"unknown --precision {o.precision!r}; valid: "
                                    f"{', '.join(PRECISIONS)}")
    o.dtype = PRECISIONS[o.precision]


def _one_rank_run(o: Options):
    """(ParallelConfig or None, the args to count) of the parallel flags (`o.parallel`: their
    sizes, in ParallelConfig's order): one rank of our model counted config only, refused in
    one line beside a real run, --hf, a draft and --gguf_type, or on a device without a link;
    a model (one rank) that does not fit the device priced is said in one warning."""
    parallel, rank = None, o.args
    try:
        if o.parallel is not None:
            parallel = ParallelConfig(*o.parallel)
        if parallel is not None and (parallel.sharded or parallel.enable_expert_parallel):
            what = parallel.label() or "--enable_expert_parallel"
            if not o.config_only or o.hf or o.speculative or o.gguf_type is not None:
                raise ParallelError(f"{what}: one rank of perfcounter's model is counted config "
                                    "only (a preset or our config.json); leave out checkpoints, "
                                    "--hf, a draft and --gguf_type")
            if o.device_spec is None:
                raise ParallelError(f"{what}: give --device_spec, the device whose link prices "
                                    "the rank's collectives")
            rank = rank_args(o.args, parallel, str(o.model or o.config))
            check_links(get_device_spec(o.device_spec, dtype=o.dtype), parallel)
        spec = None if o.device_spec is None or rank is None or o.gguf_type is not None \
            else get_device_spec(o.device_spec, dtype=o.dtype)
    except DeviceSpecError:  # an unknown or bad spec: the registry's own error
        raise
    except ValueError as e:
        raise GenerateArgumentError(str(e)) from None
    if spec is not None and o.config_only:  # does the model (one rank) fit the device priced?
        weights, kv = rank_bytes(rank, o.dtype, weights=o.scheme, kv=o.kv, batch=o.batch_size,
                                 tokens=o.config_prompt_length + o.max_new_tokens)
        line = fit_line(str(o.model or o.config), spec.name, weights, kv, spec.vram, parallel)
        if line:
            warnings.warn(line, PerfcounterWarning, stacklevel=2)
    return parallel, rank


def check_checkpoint(o: Options) -> None:
    """A real run checked from its checkpoint's config, read from the files' headers
    (models.checkpoint_config), before anything is measured or loaded: a config there (a
    .pth without one is refused), the prompt and new tokens within the model's context, the
    batch's KV cache and activations in the memory left (models.fit; checked again once the
    weights are loaded), and the draft's config."""
    path = o.checkpoint_path if o.checkpoint_path is not None else default_checkpoint()
    if o.hf:  # transformers' own model: its config as transformers reads it
        kind = checkpoint_kind(path)
        folder = path if path.is_dir() else path.parent
        config = (checkpoint_config(path)[2] if kind == "gguf" else
                  resolve_config(folder) if kind == "hf" else None)  # others: load_hf_model says
    else:
        config = checkpoint_config(path, model_name=o.model, config_path=o.config)[2]
    if o.draft_checkpoint_path is not None:
        checkpoint_config(o.draft_checkpoint_path, model_name=o.draft_model)
    if config is None:
        return
    check_length(o.prompt_length or 1, o.max_new_tokens, getattr(config, "block_size", None)
                 or getattr(config, "max_position_embeddings", None))  # a text: 1 token at least
    if not o.no_memory_check:
        check_fits(config, batch=o.batch_size, prompt=o.prompt_length or 1,
                   new_tokens=o.max_new_tokens, itemsize=o.dtype.itemsize, device=o.device,
                   kv=o.kv)


def check_execution(execution, compile: bool, device: str, config_only: bool):
    """(the program predicted and, a real run, timed: eager, compiled or cudagraphs; whether
    the timed runs are torch.compile'd). execution None: as --compile says: without it
    eager; with it compiled, or a real run on a CUDA device cudagraphs (the timed decode runs
    torch.compile's reduce-overhead mode: CUDA graphs). The name is checked by the one check
    (pricing.price.check_regime, the bound refused), refused as --execution; beside it, a
    real run's cudagraphs needs a CUDA device."""
    if execution is None:
        real_cuda = "cuda" in str(device) and not config_only
        execution = ("cudagraphs" if real_cuda else "compiled") if compile else "eager"
    try:
        check_regime(execution, bound=False)
    except ValueError:
        raise GenerateArgumentError(f"--execution {execution!r} is not valid; valid: "
                                    f"{', '.join(EXECUTIONS)}") from None
    if execution == "cudagraphs" and not config_only and "cuda" not in str(device):
        raise GenerateArgumentError("--execution cudagraphs times CUDA graphs: it needs a CUDA "
                                    "device (config only prices it for any device)")
    return execution, compile or execution != "eager"


def check_length(prompt_tokens: int, max_new_tokens: int, block_size: int | None) -> None:
    too_long = context_error(SimpleNamespace(block_size=block_size), prompt_tokens,
                             max_new_tokens)
    if too_long:
        raise GenerateArgumentError(too_long)


def check_save_path(save_path) -> Path:
    """--save_path checked before the run (its folder made), so that no run is lost to it."""
    try:
        Path(save_path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        check_writable_target(save_path)
    except OSError as e:
        raise GenerateArgumentError(f"--save_path {save_path}: {e.strerror or e}") from None
    return Path(save_path)


def check_quantization(quantize, weight_dtype, group_size, kv_dtype, act_dtype, precision):
    """(weight scheme or None, KV dtype or None, precision): the quantization flags checked
    before the run (perfcounter.quant.quantize); --act_dtype is --precision by another name."""
    try:
        scheme = quantization.resolve_scheme(quantize, weight_dtype, group_size)
        kv = quantization.parse_kv_dtype(kv_dtype)
    except quantization.QuantizeError as e:
        raise GenerateArgumentError(str(e)) from None
    if act_dtype is not None:
        names = {dtype: name for name, dtype in PRECISIONS.items()}
        act = quantization.FLOAT_NAMES.get(str(act_dtype).strip().lower())
        if act not in names:
            raise GenerateArgumentError(f"unknown --act_dtype {act_dtype!r}; valid: "
                                        f"{', '.join(quantization.FLOAT_NAMES)}")
        if precision is not None and PRECISIONS.get(precision) != act:
            raise GenerateArgumentError(f"--act_dtype {act_dtype} and --precision {precision} "
                                        "disagree; give one of them")
        precision = names[act]
    return scheme, kv, precision


def apply_quantization(net, scheme, kv) -> None:
    """Quantize a loaded model in place, or (ModelArgs) check that a config-only one can be."""
    try:
        if isinstance(net, ModelArgs):
            fake_model(net, weights=scheme, kv=kv, dtype=torch.bfloat16)
        else:
            quantization.quantize_kv_cache(quantization.quantize_model(net, scheme), kv)
    except quantization.QuantizeError as e:
        raise GenerateArgumentError(str(e)) from None
