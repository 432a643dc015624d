"""Counting a model from its config alone, under FakeTensorMode.

    counter = perfcounter.count_config("path/to/config.json", batch_size=1, prompt_length=128,
                                       new_tokens=4, dtype=torch.bfloat16)
    print(counter.compare(["h100-sxm", "a100-sxm4-80gb"]))
    print(counter.counts["decode"].profile("attn", "FLOPS"))

`count_config` takes any transformers causal-LM config (a `PretrainedConfig`, a
local config.json or a folder holding one: transformers' own model class runs,
whatever the architecture), or a perfcounter preset name or `ModelArgs` (our
gpt-fast model runs; `hf=True` runs transformers' Llama/Mistral/Qwen2/Mixtral
instead), and returns a TransformerPerformanceCounter with phases "prefill" and
"decode". transformers' models generate greedily with their default cache
(`cache="dynamic"`, what `model.generate` uses) or a StaticCache (`"static"`).
Under fake tensors two things have no values and are assumed, as stated:
attention masks have the structure of the attention module (causal, its
sliding window; op_data.py), and MoE routing spreads rows over experts as
`expert_load` says (balanced by default). A MoE config asking for
`experts_implementation="eager"` is counted on the default grouped_mm path (the
eager loop routes by values; the FLOPs are the same).

`count_config_only` builds our Transformer with fake parameters (loading's
`fake_model`: shapes and dtypes, no data, no memory, so a 70B model counts on
a laptop) and feeds it a synthetic prompt of zeros through one generation — a
prefill block, then one decode block per further token, each inside
`counter.count` — so the counter sees every aten op that real weights would
run. The generation is a function `generate(model, prompt, max_new_tokens,
phase=counter.count, **sampling_kwargs)`: `greedy_generate` here by default;
generate.py passes its own, and its sampling ops count too.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.counting.op_data import ExpertLoad
from perfcounter.generation.derive import count_generation
from perfcounter.models import hf_presets
from perfcounter.models.args import ModelArgs
from perfcounter.models.checkpoint_config import gguf_config  # noqa: F401 (serve, sweep)
from perfcounter.models.loading import (CheckpointError, fake_model, model_args_from_dict,
                                        model_args_from_hf)
from perfcounter.models.tokenizer import cache_keyword, offline_transformers
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_stored import annotate, check_price_as
from perfcounter.quant.gguf_types import check_gguf_type, stored_as

CACHES = ("dynamic", "static")


def _argmax_token(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].argmax(dim=-1, keepdim=True)  # [B, S, vocab] -> [B, 1]


@torch.no_grad()
def greedy_generate(model, prompt: torch.Tensor, max_new_tokens: int, *, phase):
    """prompt [B, S] -> [B, S + max_new_tokens], each new token the argmax of the logits;
    `phase(label, num_tokens)` wraps the prefill and each decode step."""
    batch, length = prompt.shape
    model.setup_caches(max_batch_size=batch, max_seq_length=length + max_new_tokens)
    input_pos = torch.arange(0, length, device=prompt.device)
    with phase("prefill", num_tokens=batch * length):
        token = _argmax_token(model(prompt, input_pos))
    tokens = [prompt, token]
    input_pos = torch.tensor([length], device=prompt.device)
    for _ in range(max_new_tokens - 1):
        with phase("decode", num_tokens=batch):
            token = _argmax_token(model(token, input_pos))
        input_pos += 1
        tokens.append(token)
    return torch.cat(tokens, dim=-1)


def context_error(config, prompt_tokens: int, new_tokens: int) -> str | None:
    """Why `prompt_tokens` + `new_tokens` do not fit the model's context (our block_size,
    transformers' max_position_embeddings), one line; None where they fit or it is unknown."""
    block = getattr(config, "block_size", None) or getattr(config, "max_position_embeddings",
                                                             None)
    if not isinstance(block, int) or prompt_tokens + new_tokens <= block:
        return None
    return (f"max_seq_length={prompt_tokens + new_tokens} exceeds the model's block_size={block} "
            f"(a prompt of {prompt_tokens} tokens + {new_tokens} new tokens); shorten the prompt "
            "or lower --max_new_tokens")


def count_config_only(args: ModelArgs, counter, *, batch_size: int = 1, prompt_length: int,
                      max_new_tokens: int, dtype=torch.bfloat16, device: str = "cpu",
                      generate=greedy_generate, make_model=None, **sampling_kwargs):
    """Count one generation of a weightless model (FakeTensorMode) with `counter`: labels
    "prefill" and "decode". Returns the fake model. make_model(args) -> (model, fake mode)
    builds another one (loading.fake_model with weights= and kv=: quantized)."""
    if "cuda" in device and not torch.cuda.is_available():
        device = "cpu"  # fake CUDA modules cannot be initialised without CUDA; counts agree
    model, fake_mode = (make_model or (lambda a: fake_model(a, dtype=dtype, device=device)))(args)
    with fake_mode:
        x = torch.zeros(batch_size, prompt_length, dtype=torch.int64, device=device)
        generate(model, x, max_new_tokens, phase=counter.count, **sampling_kwargs)
    return model


# -- any transformers config -------------------------------------------------------------
def resolve_config(config):
    """A transformers PretrainedConfig or our ModelArgs, from what count_config accepts:
    either of those, a dict, a config.json or a folder holding one, or a preset name: ours
    (ModelArgs), or a transformers preset (hf_presets.yaml: its language model's config)."""
    if isinstance(config, ModelArgs):
        return config
    transformers = offline_transformers()
    if isinstance(config, transformers.PretrainedConfig):
        return config
    source = "config"
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise CheckpointError(f"{config}: a folder without config.json")
        if not path.is_file():
            if path.suffix == ".json" or len(path.parts) > 2:
                raise CheckpointError(f"{config}: no such config file")
            preset = hf_presets.find(config)  # a transformers preset, else ours (UnknownModelError)
            return hf_presets.counted_config(preset) if preset else ModelArgs.from_name(str(config))
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{path}: not readable JSON ({e})") from None
        source = str(path)
    if not isinstance(config, dict):
        if source != "config":
            raise CheckpointError(f"{source}: expected a JSON object of config fields, got "
                                  f"{type(config).__name__}")
        raise TypeError(f"count_config takes a transformers config, a config.json path or "
                        f"folder, a preset name or ModelArgs; got {type(config).__name__}")
    if "model_type" not in config:
        return model_args_from_dict(config, source)
    data = dict(config)
    model_type = data.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise CheckpointError(f"{source}: model_type {model_type!r} is not a transformers "
                              f"{transformers.__version__} architecture")
    check_sizes(data, source)
    try:
        return transformers.AutoConfig.for_model(model_type, **data)
    except Exception as e:  # transformers' own validation: one line of it, with the file
        first = str(e).strip().splitlines()
        raise CheckpointError(f"{source}: transformers refuses this {model_type} config "
                              f"({first[-1].strip() if first else type(e).__name__})") from None


SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "intermediate_size", "head_dim")  # each a positive int, if given


def check_sizes(data: dict, source: str) -> None:
    """The sizes a causal LM is built from: positive ints (a bool, a string, NaN or 0 named
    in one line), heads that divide the hidden size (unless head_dim is given) and KV heads
    that divide the heads."""
    for key in SIZES:
        value = data.get(key)
        if value is None:  # not given: the architecture's default applies
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: {key} must be an int >= 1, got {value!r:.40}")
    heads, kv, hidden = (data.get(k) for k in ("num_attention_heads", "num_key_value_heads",
                                                "hidden_size"))
    if heads and hidden and data.get("head_dim") is None and hidden % heads:
        raise CheckpointError(f"{source}: hidden_size {hidden} is not a multiple of "
                              f"num_attention_heads {heads} (give head_dim, or heads that divide it)")
    if heads and kv and heads % kv:
        raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv} (valid: a divisor of {heads})")


def fake_hf_model(config, *, dtype=torch.bfloat16):
    """(transformers causal LM for `config`, its FakeTensorMode): fake parameters, no memory;
    MoE experts on the default grouped_mm path (see the module doc)."""

    transformers = offline_transformers()
    fake_mode = FakeTensorMode()
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # fake parameters cannot be cast afterwards: build in dtype
    try:
        with fake_mode:
            model = transformers.AutoModelForCausalLM.from_config(config).eval()
    except ValueError as e:  # not a causal LM
        raise ValueError(f"{type(config).__name__} ({config.model_type}): transformers has no "
                         f"causal LM for it ({e})") from None
    finally:
        torch.set_default_dtype(default)
    if getattr(model.config, "_experts_implementation", None) == "eager":
        try:
            model.set_experts_implementation("grouped_mm")
        except ValueError:  # no experts to set
            pass
    return model, fake_mode


@torch.no_grad()
def hf_greedy_generate(model, prompt: torch.Tensor, max_new_tokens: int, *, phase,
                       cache: str = "dynamic"):
    """prompt [B, S] through a transformers causal LM, as `model.generate` runs it greedily:
    a prefill block, then one decode block per further token, each wrapped in
    `phase(label, num_tokens)`; the cache transformers makes by default, or a StaticCache."""
    batch, length = prompt.shape
    key = cache_keyword(model)
    kwargs = {"use_cache": True}
    if cache == "static":
        import transformers  # deferred: heavy (seconds to import), off the import path
        kwargs[key] = transformers.StaticCache(config=model.config,
                                               max_cache_len=length + max_new_tokens)
    with phase("prefill", num_tokens=batch * length):
        out = model(input_ids=prompt, **kwargs)
        token = _argmax_token(out.logits)
    tokens = [prompt, token]
    kwargs[key] = getattr(out, key)
    for _ in range(max_new_tokens - 1):
        with phase("decode", num_tokens=batch):
            out = model(input_ids=token, **kwargs)
            token = _argmax_token(out.logits)
        kwargs[key] = getattr(out, key)
        tokens.append(token)
    return torch.cat(tokens, dim=-1)


def hf_config(args: ModelArgs):
    """transformers' config of the same model as our ModelArgs: Llama, Mistral (a sliding
    window), Qwen2 (attention biases) or Mixtral (experts)."""
    transformers = offline_transformers()
    kind = "mixtral" if args.num_experts else "qwen2" if args.attention_bias else \
        "mistral" if args.sliding_window else "llama"
    extra = {"num_local_experts": args.num_experts,
             "num_experts_per_tok": args.num_activated_experts} if args.num_experts else {}
    if args.sliding_window:
        extra["sliding_window"] = args.sliding_window
    if args.rope_scaling:
        extra["rope_scaling"] = {"rope_type": "llama3", **args.rope_scaling}
    return transformers.AutoConfig.for_model(
        kind, vocab_size=args.vocab_size, hidden_size=args.dim, num_hidden_layers=args.n_layer,
        intermediate_size=args.intermediate_size, num_attention_heads=args.n_head,
        num_key_value_heads=args.n_local_heads, head_dim=args.head_dim,
        max_position_embeddings=args.block_size, rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_base, tie_word_embeddings=args.tie_embeddings, **extra)


def count_hf_config(config, counter, *, batch_size: int = 1, prompt_length: int,
                    max_new_tokens: int, dtype=torch.bfloat16, cache: str = "dynamic",
                    derive: bool = False):
    """Count one greedy generation of transformers' model for `config` (anything
    count_config takes; ModelArgs and presets as transformers' Llama/Mistral/Qwen2/Mixtral)
    with `counter`, no weights: labels "prefill" and "decode". Returns the fake model.
    derive: count one layer per kind and the first decode steps, derive the rest
    (perfcounter.generation.derive.count_generation: exact, checked, falls back to counting)."""
    if cache not in CACHES:
        raise ValueError(f"cache={cache!r}; expected one of {', '.join(CACHES)}")
    resolved = resolve_config(config)
    if isinstance(resolved, ModelArgs):
        resolved = hf_config(resolved)
    too_long = context_error(resolved, prompt_length, max_new_tokens)  # before any model is built
    if too_long:
        raise ValueError(too_long)
    if derive:
        return count_generation(resolved, counter, batch_size=batch_size,
                                prompt_length=prompt_length, max_new_tokens=max_new_tokens,
                                make_model=lambda c: fake_hf_model(c, dtype=dtype),
                                generate=hf_greedy_generate, cache=cache)
    model, fake_mode = fake_hf_model(resolved, dtype=dtype)
    with fake_mode:
        prompt = torch.zeros(batch_size, prompt_length, dtype=torch.int64)
        hf_greedy_generate(model, prompt, max_new_tokens, phase=counter.count, cache=cache)
    return model


def count_gguf(path, *, price_as: str = "stored", hf: bool = False, batch_size: int = 1,
               prompt_length: int = 128, new_tokens: int = 4, dtype=torch.bfloat16,
               device_spec=None, io_model: str = "per_op", depth: int = 10, expert_load=None):
    """Count a GGUF model from its metadata alone (FakeTensorMode, no weights read): "prefill"
    and "decode" as count_config counts a config, its weights priced as
    `price_as` says. hf: transformers' model (any architecture it reads from GGUF), else
    perfcounter's Transformer (llama, mistral, qwen2, mixtral)."""
    check_price_as(price_as)
    path = Path(path)
    config = gguf_config(path)
    too_long = context_error(config, prompt_length, new_tokens)  # before any model is built
    if too_long:
        raise ValueError(too_long)
    counter = TransformerPerformanceCounter(device_spec=device_spec, depth=depth, io_model=io_model)
    counter.mode.expert_load = expert_load
    sizes = dict(batch_size=batch_size, prompt_length=prompt_length, max_new_tokens=new_tokens)

    def priced(run, layout):
        def generate(model, prompt, max_new_tokens, **kw):
            if price_as == "stored":
                annotate(model, path, layout)
            return run(model, prompt, max_new_tokens, **kw)
        return generate

    if hf:
        model, fake_mode = fake_hf_model(config, dtype=dtype)
        with fake_mode:
            prompt = torch.zeros(batch_size, prompt_length, dtype=torch.int64)
            priced(hf_greedy_generate, "hf")(model, prompt, new_tokens, phase=counter.count)
    else:
        args = model_args_from_hf(config.to_dict(), path)
        count_config_only(args, counter, dtype=dtype, generate=priced(greedy_generate, "ours"),
                          **sizes)
    return counter


def check_expert_load(args: ModelArgs, expert_load) -> ExpertLoad:
    """expert_load parsed and held to our model: weights given only for a MoE model, one per
    expert (checked before anything is counted)."""
    load = ExpertLoad.parse(expert_load)
    if load.shares is not None and not args.num_experts:
        raise ValueError(f"expert_load {expert_load!r}: this model has no experts (it applies to "
                         "mixture-of-experts models such as mixtral-8x7b)")
    if load.shares is not None and len(load.shares) != args.num_experts:
        raise ValueError(f"expert_load has {len(load.shares)} weights, but this model routes over "
                         f"{args.num_experts} experts (give one weight per expert)")
    return load


def routed(built, load: ExpertLoad):
    """(model, fake mode) with every expert layer routing as `load` says under fake tensors."""
    model, fake_mode = built
    for module in model.modules():
        if hasattr(module, "routing"):
            module.routing = load
    return model, fake_mode


def count_config(config, *, batch_size: int = 1, prompt_length: int = 128, new_tokens: int = 4,
                 dtype=torch.bfloat16, hf: bool | None = None, cache: str = "dynamic",
                 expert_load=None, device_spec=None, io_model: str = "per_op", depth: int = 10,
                 quantize=None, kv_dtype=None, price_as=None, gguf_type=None):
    """Count one greedy generation of a model known by its config alone (no weights, no
    memory): a TransformerPerformanceCounter with "prefill" (batch_size x prompt_length
    tokens) and "decode" (new_tokens - 1 steps of batch_size tokens).

    config: a transformers PretrainedConfig, a config.json or folder (transformers' model
    when it has a model_type, ours for our ModelArgs JSON), a preset name or ModelArgs.
    hf: run transformers' model for a preset or ModelArgs too. cache: "dynamic" or
    "static" (transformers' models). expert_load: MoE routing under fake tensors, None
    (balanced) or weights per expert. device_spec, io_model, depth: the counter's.
    quantize: our model's linears stored as "int8", "int4", "int4-G" or "fp8" (or a
    quantize.WeightScheme: --weight_dtype/--group_size); kv_dtype: its KV cache "int8" or
    "fp8" — bytes from the stated layout, FLOPs at `dtype` (fp8 linears: at float8_e4m3fn;
    perfcounter/quant/quantize.py).
    A .gguf file is counted from its metadata, its weights priced as `price_as` says:
    "stored" (the default) or "executed" (perfcounter/quant/gguf_stored.py). gguf_type: our
    model's weights priced as stored in a llama.cpp GGUF of that file type ("Q4_0",
    "Q4_K_M", ...; perfcounter/quant/gguf_types.py), every layer counted (their types differ
    by layer), the decode steps derived. Otherwise one layer of each kind and the first decode steps are counted, the
    rest derived exactly (derive.count_generation)."""
    if min(batch_size, prompt_length, new_tokens) < 1:
        raise ValueError(f"batch_size, prompt_length and new_tokens must be >= 1, got "
                         f"{batch_size}, {prompt_length}, {new_tokens}")
    if gguf_type is not None and str(config).endswith(".gguf"):
        raise ValueError("gguf_type prices a preset as a file type; a .gguf is priced as it is "
                         "stored (price_as)")
    if price_as is not None or str(config).endswith(".gguf"):
        price_as = check_price_as(price_as or "stored")
        if isinstance(config, (str, Path)) and str(config).endswith(".gguf"):
            return count_gguf(config, price_as=price_as, hf=bool(hf), batch_size=batch_size,
                              prompt_length=prompt_length, new_tokens=new_tokens, dtype=dtype,
                              device_spec=device_spec, io_model=io_model, depth=depth,
                              expert_load=expert_load)
    resolved = resolve_config(config)
    if gguf_type is not None:
        gguf_type = check_gguf_type(resolved, gguf_type, hf=hf, quantize=quantize)
    counter = TransformerPerformanceCounter(device_spec=device_spec, depth=depth,
                                            io_model=io_model)
    counter.mode.expert_load = expert_load
    sizes = dict(batch_size=batch_size, prompt_length=prompt_length, max_new_tokens=new_tokens,
                 dtype=dtype)
    if quantize is not None or kv_dtype is not None:
        if not isinstance(resolved, ModelArgs) or hf:
            raise ValueError("quantize / kv_dtype price perfcounter's own model: give a preset or "
                             "our ModelArgs without hf (transformers' models: torchao's quantize_)")
        scheme = quantize if isinstance(quantize, quantization.WeightScheme) else \
            quantization.parse_scheme(quantize)
        kv = quantization.parse_kv_dtype(kv_dtype)
        fake_model(resolved, weights=scheme, kv=kv, dtype=dtype)  # a bad group size fails first
        sizes["make_model"] = lambda a: fake_model(a, weights=scheme, kv=kv, dtype=dtype)
    if gguf_type is not None:  # every layer (a file type's tensor types differ by layer)
        count_generation(resolved, counter, generate=stored_as(resolved, gguf_type,
                                                               greedy_generate),
                         every_layer=True, **sizes)
    elif isinstance(resolved, ModelArgs) and not hf:  # one layer per kind, three decode steps
        load = check_expert_load(resolved, expert_load)
        if load.shares is not None:  # our model's experts route as the load says
            base = sizes.get("make_model") or (lambda a: fake_model(a, dtype=dtype))
            sizes["make_model"] = lambda a: routed(base(a), load)
        count_generation(resolved, counter, generate=greedy_generate, **sizes)  # the rest derived
    else:
        count_hf_config(resolved, counter, cache=cache, derive=True, **sizes)
    return counter
