"""`perfcounter count`, `profile` and `op-bench`: a model known by its config counted with no
weights (FakeTensorMode), then reported, queried as llm-profiler does, or timed op by op.

    perfcounter count --model smollm2-135m --prompt_length 128 --max_new_tokens 128
    perfcounter profile --model llama-2-7b --scope attn --attr FLOPS --attr MULT
    perfcounter op-bench --model smollm2-135m --prompt_length 16 --max_new_tokens 2

The three share the model and run flags (flags.py) and the flags of count_config below;
`main.py` registers `add_parsers`. Errors are ValueErrors (one line, exit code 2).
"""
from __future__ import annotations

import functools
import json
import sys
from types import SimpleNamespace

from perfcounter.cli.flags import (PRECISIONS, add_model_flags, add_output, add_parallel_flags,
                                   config_of, parallel_of, precision_of, refuse)
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.devices import default_device_spec, get_device_spec
from perfcounter.devices.calibrate import measurable_device
from perfcounter.devices.op_keys import EXECUTIONS
from perfcounter.format import si
from perfcounter.generation.config_only import count_config, resolve_config
from perfcounter.models.args import ModelArgs, UnknownModelError
from perfcounter.parallel import check_links, fit_line, shard
from perfcounter.pricing.op_bench import op_bench
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_types import FILE_TYPES, check_file_type, stored_bytes
from perfcounter.report.html import HELP as HTML_HELP, check_html, count_page, write_page
from perfcounter.report.plots import check_outputs, source_name, write_outputs
from perfcounter.report.profile import ATTRS, format_profile, scope_filter
from perfcounter.serve.memory import kv_bytes_per_token, weight_bytes
from perfcounter.serve.placement import model_modules


def count_from_flags(args):
    """The counter `count`, `profile` and `op-bench` share: count_config with the flags."""
    quant = {"quantize": quantization.resolve_scheme(args.quantize, args.weight_dtype,
                                                     args.group_size),
             "kv_dtype": quantization.parse_kv_dtype(args.kv_dtype)}
    args.precision = precision_of(args.precision)  # no weights run: auto is bfloat16
    dtype = PRECISIONS[args.precision]
    spec = get_device_spec(args.device_spec, dtype=dtype) if args.device_spec else None
    model = config_of(args.model)
    parallel = parallel_of(args)  # sizes checked before any work
    if parallel.sharded or parallel.enable_expert_parallel:  # one rank of our model
        model = one_rank(args, model, parallel, spec)
    try:
        counter = count_config(model, batch_size=args.batch_size,
                               prompt_length=args.prompt_length, new_tokens=args.max_new_tokens,
                               dtype=dtype, hf=args.hf, cache=args.cache,
                               expert_load=args.expert_load, device_spec=spec,
                               io_model=args.io_model, depth=args.depth, **quant,
                               price_as=getattr(args, "price_as", None),
                               gguf_type=getattr(args, "gguf_type", None))
    except UnknownModelError as e:  # not a file either
        raise ValueError(f"--model {args.model!r} is no config file or folder, nor a preset: "
                         f"{e}") from None
    if spec is None:  # this machine's, once the model has counted (its warning after errors)
        counter.device_spec = default_device_spec(dtype)
    counter.execution = args.execution  # the program its predictions price (no run measured)
    routing = counter.mode.expert_load
    ours = model if isinstance(model, ModelArgs) else None
    if ours is None and not str(model).endswith(".gguf"):
        ours = resolve_config(model)
    priced = ours if isinstance(ours, ModelArgs) else None
    # what was counted: on stderr when stdout carries JSON, so that stdout parses as JSON
    say = functools.partial(print, file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    say(f"{args.model}: counted with no weights (FakeTensorMode), batch {args.batch_size}, "
          f"prompt {args.prompt_length} tokens, {args.max_new_tokens} new tokens, "
          f"{args.precision}; attention masks as the attention modules say (causal, sliding "
          f"window); MoE routing {routing}")
    if parallel.gpus > 1:
        say(f"{parallel.label()}: one rank counted, {parallel.ranks} GPU(s) a replica "
            f"({parallel.gpus} in all): its sharded shapes and its collectives' records")
    if priced is not None:  # one line when a rank's weights and KV exceed the device
        kv = kv_bytes_per_token(priced, dtype, quant["kv_dtype"]) * args.batch_size \
            * (args.prompt_length + args.max_new_tokens)
        line = fit_line(str(args.model), counter.device_spec.name,
                        weight_bytes(priced, dtype, quant["quantize"]), kv,
                        counter.device_spec.vram, parallel)
        if line:
            say(line)
    if getattr(args, "gguf_type", None):
        ours, file_type = resolve_config(model), check_file_type(args.gguf_type)
        size = si(sum(stored_bytes(ours, file_type).values()), "B")
        say(f"weights as stored in a {file_type} GGUF ({size} of linear and embedding weights, "
            f"each tensor at the type llama.cpp's quantize gives it): bytes as stored, FLOPs at "
            f"{args.precision}")
    if quant["quantize"] is not None or quant["kv_dtype"] is not None:
        ours = None if str(model).endswith(".gguf") else resolve_config(model)
        size = f" ({si(weight_bytes(ours, dtype, quant['quantize']), 'B')} as stored)" \
            if isinstance(ours, ModelArgs) else ""  # every linear and MoE expert of our model
        say(f"weights {quant['quantize'].name if quant['quantize'] else args.precision}{size}, KV "
              f"cache {quant['kv_dtype'] or args.precision}: bytes as stored, FLOPs at "
              f"{args.precision}" + ("; the linears' and experts' at float8_e4m3fn (W8A8)"
                                     if quant["quantize"] and quant["quantize"].kind == "fp8"
                                     else ""))
    return counter


def one_rank(args, model, parallel, spec) -> ModelArgs:
    """One rank's args of our model under `parallel` (perfcounter/parallel), refused in one
    line before any counting where it cannot be sharded here (transformers' models, GGUF
    files and types) or its device has no link."""
    refuse(args, {f: "perfcounter shards its own model; drop it, or the parallel sizes"
                  for f in ("--hf", "--gguf_type", "--price_as")})
    ours = resolve_config(model)
    if not isinstance(ours, ModelArgs) or str(model).endswith(".gguf"):
        raise ValueError(f"--model {args.model}: perfcounter shards its own model (a preset, "
                         f"our config.json); this is transformers' or a GGUF's")
    _, rank = shard(ours, str(args.model), tensor_parallel_size=parallel.tensor_parallel_size,
                    pipeline_parallel_size=parallel.pipeline_parallel_size,
                    data_parallel_size=parallel.data_parallel_size,
                    enable_expert_parallel=parallel.enable_expert_parallel,
                    expert_load=args.expert_load not in (None, "balanced"))
    check_links(spec or default_device_spec(PRECISIONS[args.precision]), parallel)
    return rank


def _save(args, counter, log=print) -> None:
    if args.save_path:
        counter.to_json(args.save_path)
        log(f"wrote {args.save_path}")


def _op_bench(args) -> int:
    measurable_device(args.device, "benchmark ops on")  # a bad device fails before counting
    counter = count_from_flags(args)
    for label in ("prefill", "decode"):
        if label in counter.counts:
            s = counter.counts[label]
            result = op_bench(s.trace, args.device)
            per_step = result.latency_s / s.steps
            print(f"{label}: {si(per_step, 's')} per step on {result.device}, op by op "
                  f"({result.signatures} signatures, {result.proxies} timed as a copy); "
                  f"predicted {si(s.predicted_latency and s.predicted_latency / s.steps, 's')}, "
                  f"roofline {si(s.roofline_latency and s.roofline_latency / s.steps, 's')}")
    _save(args, counter)
    return 0


def _count(args) -> int:
    outputs = check_outputs(args.plot, args.trace)  # --plot DIR, --trace FILE: before counting
    counter = count_from_flags(args)
    labels = [label for label in ("prefill", "decode") if label in counter.counts]
    log = (lambda *a: None) if args.json else print
    summary = counter.print_summary(labels=labels)
    print(json.dumps(counter.to_dict(), indent=2) if args.json else summary)
    _save(args, counter, log)
    write_outputs(outputs, counter, log=log, name=source_name("count", args.model))
    if args.html is not None:  # the summary, the roofline, per-layer figures (report/html.py)
        write_page(args.html, count_page(counter, f"perfcounter count {args.model}", summary))
        log(f"wrote {args.html}")
    return 0


# the flags that count a model: what `profile --counts` (a saved count) cannot honour
COUNTING = ("--prompt_length", "--max_new_tokens", "--batch_size", "--precision", "--execution",
            "--device_spec", "--quantize", "--weight_dtype", "--group_size", "--kv_dtype", "--hf",
            "--cache", "--expert_load", "--io_model", "--depth", "--price_as", "--gguf_type",
            "--tensor_parallel_size", "--pipeline_parallel_size", "--data_parallel_size",
            "--enable_expert_parallel")


def _profile(args) -> int:
    attrs = args.attr or ["FLOPS"]
    if attrs == ["ALL"]:
        attrs = list(ATTRS)
    if (args.model is None) == (args.counts is None):
        raise ValueError("give the model to count, --model, or a saved count, --counts (one)")
    if args.counts is not None:
        refuse(args, {"--save_path": "--counts reads a count already saved; nothing is counted "
                      "to save"} | {f: f"--counts reads a saved count; {f} applies when --model "
                                    "is counted" for f in COUNTING})
    elif args.save_path is None:  # the figures profile prints depend on no device
        refuse(args, {f: "profile's figures (FLOPs by kind, params, bytes) depend on no device; "
                      f"{f} prices only what --save_path writes"
                      for f in ("--device_spec", "--execution")})
    if args.counts is not None:
        counter = TransformerPerformanceCounter.from_json(args.counts)
        if not counter.counts:  # torchao's to_json of a counter that counted nothing
            raise ValueError(f"{args.counts}: no phase in it (an empty object); nothing to "
                             "profile (--save_path of `perfcounter count` or generate.py "
                             "writes a count)")
    else:
        check_scopes_first(args)
        counter = count_from_flags(args)
        _save(args, counter)
    phases = [args.phase] if args.phase else [
        label for label in ("prefill", "decode") if label in counter.counts]
    for phase in phases:
        if phase not in counter.counts:
            raise ValueError(f"no phase {phase!r}: counted {', '.join(counter.counts)}")
        for scope in args.scope or ["transformer"]:
            print(format_profile(counter.counts[phase], scope, attrs))
    return 0


def check_scopes_first(args) -> None:
    """--scope checked before counting where the model's structure is known from its config
    (a preset or our config.json, whole, not --hf): the modules of its fake model."""
    if args.hf or not args.scope or parallel_of(args).sharded:
        return
    try:
        config = resolve_config(config_of(args.model))
    except (KeyError, ValueError, OSError):
        return  # counting says what is wrong with it
    if isinstance(config, ModelArgs) and not str(args.model).endswith(".gguf"):
        modules = SimpleNamespace(modules=model_modules(config))
        for scope in args.scope:
            scope_filter(modules, scope)  # a ValueError naming the scopes there are


def add_count_flags(p, executions=EXECUTIONS) -> None:
    """The model and run flags (predictions priced as `executions` allow), count_config's own."""
    add_model_flags(p, executions=executions)
    add_parallel_flags(p)
    g = p.add_argument_group("counting")
    g.add_argument("--hf", action="store_true",
                   help="transformers' model for a preset too (Llama, Mistral, Qwen2, Mixtral)")
    g.add_argument("--cache", default="dynamic", choices=["dynamic", "static"],
                   help="transformers' KV cache (dynamic, as model.generate)")
    g.add_argument("--expert_load", default=None,
                   help="MoE routing with no weights: 'balanced' (default) or weights per "
                        "expert, '4,2,1,1'")
    g.add_argument("--io_model", default="per_op", choices=["per_op", "compulsory"],
                   help="the bytes the roofline prices")
    g.add_argument("--depth", type=int, default=10, help="module depth the counter tracks")
    g.add_argument("--price_as", default=None, help="a .gguf --model's weights: stored (its "
                   "quant types' bytes, the default) or executed (dequantized, at --precision)")
    g.add_argument("--gguf_type", default=None, help="a preset's weights priced as stored in a "
                   "llama.cpp GGUF of this file type: " + ", ".join(FILE_TYPES) + " (each "
                   "tensor's type as llama.cpp's quantize picks it; FLOPs at --precision)")


def add_parsers(sub) -> None:
    """Register `op-bench`, `count` and `profile` on the command's subparsers."""
    p = sub.add_parser("op-bench", help="time each op signature of a config's count here",
                       description="Count a config (as `count` does), then time every distinct "
                       "op signature on a local device, cold, and sum: the eager latency "
                       "predicted op by op (perfcounter/pricing/op_bench.py).")
    add_count_flags(p, executions=("eager",))  # op by op: an eager run
    p.add_argument("--device", default="cpu", help="local torch device to time on")
    p.set_defaults(run=_op_bench)

    p = sub.add_parser("count", help="count a model from its config alone (no weights)",
                       description="Count one greedy generation (prefill, decode steps) of a "
                       "model known by its config, under FakeTensorMode: no weights, no memory.")
    add_count_flags(p)
    p.add_argument("--json", action="store_true", help="print the counter's to_dict() as JSON")
    add_output(p, "--plot", folder=True, help="write a roofline plot and time / energy by "
               "module kind (PNG and SVG; needs matplotlib)")
    add_output(p, "--trace", help="write a Chrome / Perfetto trace of the generation (JSON)")
    add_output(p, "--html", needs=check_html, help=HTML_HELP)
    p.set_defaults(run=_count)

    p = sub.add_parser("profile", help="llm-profiler's query: FLOPS, ADD, MULT, ... of a scope",
                       description="Count a config (as `count` does), then print llm-profiler's "
                       "figures of a scope: transformer, attn, mlp, a module class, path or glob.")
    add_count_flags(p)
    p.add_argument("--counts", default=None, help="profile a count saved with --save_path "
                   "(or to_json) instead of counting --model")
    p.add_argument("--scope", action="append", default=None,
                   help="transformer (default), attn, mlp, embedding, lm_head, a module class "
                        "(LlamaDecoderLayer), path or glob (model.layers.12.self_attn.k_proj); "
                        "repeatable")
    p.add_argument("--attr", action="append", default=None, type=str.upper,
                   help="FLOPS (default), ADD, MULT, DIV, SQRT, EXP, SPECIAL, CMP, PARAMS, ACT, "
                        "CACHE or ALL; repeatable")
    p.add_argument("--phase", default=None, help="prefill or decode (default: both)")
    p.set_defaults(run=_profile)
