"""The `perfcounter` console command.

    perfcounter devices [NAME ...] [--type cuda] [--spec FILE.yaml] [--json]
    perfcounter calibrate [--array-mb 256] [--repeats 10] [--matmul-n 1024] [--out PATH]
        [--threads N] [--clock wall|cpu] [--no-curves]
    perfcounter op-bench --config ...|PRESET [--device cpu]   (the flags of count)
    perfcounter count --config config.json|FOLDER|PRESET [--batch_size 1] [--prompt_length 128]
        [--new_tokens 4] [--precision bfloat16] [--expert_load balanced] [--save_path c.json]
        [--quantize int8|int4|int4-G] [--weight_dtype int4 --group_size 32] [--kv_dtype int8|fp8]
    perfcounter profile --config ...|--counts c.json [--scope attn] [--attr FLOPS --attr MULT]
    perfcounter sweep --model llama-3-8b,mixtral-8x7b --batch_size 1,8 --prompt_length 128,2048
        [--max_new_tokens 256] [--device_spec h100-sxm,pim-ai-4dimm] [--mapping m.yaml] [--csv F]
    perfcounter graph --config ...|PRESET [--phase prefill|decode] [--level module|op|both]
        [--format txt,json,dot] [--out BASE]

Each subcommand is a `_NAME(args) -> int` function registered in
`build_parser()` with `set_defaults(run=...)`; add one the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch

from perfcounter._util import settle_objects
from perfcounter.cli.graph import add_parser as add_graph
from perfcounter.cli.simulate import add_parser as add_simulate
from perfcounter.cli.sweep import add_parser as add_sweep
from perfcounter.console import collected_warnings, quiet_third_party
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.devices import (DeviceSpec, DeviceSpecError, calibrated_spec_path, dtype_name,
                                 get_device_spec, list_device_specs, register_device_specs)
from perfcounter.devices.calibrate import calibrate, describe, measurable_device, save_calibrated
from perfcounter.devices.spec_file import spec_to_entry
from perfcounter.format import format_table, scaled, si
from perfcounter.generation.config_only import count_config
from perfcounter.models.args import UnknownModelError
from perfcounter.pricing.op_bench import op_bench
from perfcounter.quant import quantize as quantization
from perfcounter.report.plots import check_outputs, write_outputs
from perfcounter.report.profile import ATTRS, format_profile
from perfcounter.serve import command as serve_command

_TABLE = ("name", "type", "memory", "bandwidth", "dtype", "bf16 TFLOP/s", "balance",
          "source")
_ALIGN = "llrrlrrl"  # numbers right-aligned


def device_row(spec: DeviceSpec, source_width: int = 48) -> tuple[str, ...]:
    """One row of the `devices` table; '-' marks an unknown figure."""
    bf16 = spec.flops_by_dtype.get(torch.bfloat16)
    source = spec.source.get("bandwidth") or spec.source.get("flops_by_dtype") or "-"
    if source_width and len(source) > source_width:
        source = source[: source_width - 3] + "..."
    bw_digits = 1 if spec.bandwidth and spec.bandwidth < 1e11 else 0
    return (spec.name, spec.device_type, si(spec.vram, "B", 0, prefix="G", na="-"),
            si(spec.bandwidth, "B/s", bw_digits, prefix="G", na="-"),
            dtype_name(spec.dtype) if spec.dtype is not None else "-",
            scaled(bf16, "T", 1, na="-"),
            si(spec.roofline_balancepoint, "FLOP/B", 1, prefix="", na="-"), source)


def _figure(value) -> str:
    """A figure of a spec entry as a reader wants it: 3,350 not 3350.0; tables inline."""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_figure(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_figure(v) for v in value)
    if isinstance(value, float):
        return f"{value:,.6g}" if abs(value) < 1e15 else f"{value:.4g}"
    return str(value)


def _describe(spec: DeviceSpec) -> str:
    """Every figure of a spec in the units its file names (bandwidth_GBs: 3,350), and sources."""
    entry = spec_to_entry(spec)
    lines = [f"{spec.name} ({entry.pop('device_type')})"]
    sources = entry.pop("source", {})
    for key, value in entry.items():
        if value not in (None, [], {}):
            lines.append(f"  {key}: {_figure(value)}")
    if spec.roofline_balancepoint:
        lines.append(f"  balance: {spec.roofline_balancepoint:,.1f} FLOP/B (peak FLOP/s at "
                     f"{dtype_name(spec.dtype)} / bandwidth)")
    by_text: dict[str, list[str]] = {}
    for key, text in (sources.items() if isinstance(sources, dict) else []):
        by_text.setdefault(text, []).append(key)
    lines.append("  source:")
    lines += [f"    {', '.join(keys)}: {text}" for text, keys in by_text.items()]
    return "\n".join(lines)


def _devices(args) -> int:
    for path in args.spec or []:
        register_device_specs(path)
    if args.names:
        specs = [get_device_spec(n) for n in args.names]
    else:
        specs = [get_device_spec(n) for n in list_device_specs(args.type)]
    if args.json:
        print(json.dumps([s.to_dict() for s in specs], indent=2))
    elif args.names:
        print("\n\n".join(_describe(s) for s in specs))
    else:
        width = 0 if args.wide else 48
        print(format_table([device_row(s, width) for s in specs], _TABLE, align=_ALIGN,
                           rule=True))
        print(f"\n{len(specs)} devices. memory: 1e9 B; bandwidth: 1e9 B/s; balance: peak "
              "FLOP/s at dtype / bandwidth. `perfcounter devices NAME` shows every figure "
              "and its source.")
    return 0


def _calibrate(args) -> int:
    array_bytes = None if args.array_mb is None else int(args.array_mb * (1 << 20))
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    cal = calibrate(device=args.device, array_bytes=array_bytes, repeats=args.repeats,
                    matmul_n=args.matmul_n, dtypes=dtypes, min_time=args.min_time,
                    curves=not args.no_curves, clock=args.clock)
    for line in describe(cal):
        print(line)
    spec = cal.to_spec(args.name)
    if args.no_write:
        return 0
    path = save_calibrated(spec, args.out)
    hint = repr(spec.name) if args.out is None else f"'{path}:{spec.name}'"
    print(f"wrote {path} (entry {spec.name!r}); use it as get_device_spec({hint})")
    return 0


_PRECISIONS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _op_bench(args) -> int:
    measurable_device(args.device, "benchmark ops on")  # a bad device fails before counting
    counter = _count_config(args)
    for label in ("prefill", "decode"):
        if label in counter.counts:
            s = counter.counts[label]
            result = op_bench(s.trace, args.device)
            per_step = result.latency_s / s.steps
            print(f"{label}: {si(per_step, 's')} per step on {result.device}, op by op "
                  f"({result.signatures} signatures, {result.proxies} timed as a copy); "
                  f"predicted {si(s.predicted_latency and s.predicted_latency / s.steps, 's')}, "
                  f"roofline {si(s.roofline_latency and s.roofline_latency / s.steps, 's')}")
    return 0


def _count_config(args):
    """The counter `count` and `profile` share: count_config with the flags."""
    quant = _quantization(args)  # first: --act_dtype sets --precision
    spec = get_device_spec(args.device_spec, dtype=_PRECISIONS[args.precision]) \
        if args.device_spec else None
    try:
        counter = count_config(args.config, batch_size=args.batch_size,
                               prompt_length=args.prompt_length, new_tokens=args.new_tokens,
                               dtype=_PRECISIONS[args.precision], hf=args.hf, cache=args.cache,
                               expert_load=args.expert_load, device_spec=spec,
                               io_model=args.io_model, depth=args.depth, **quant,
                               price_as=getattr(args, "price_as", None))
    except UnknownModelError as e:  # not a file either
        raise ValueError(f"--config {args.config!r} is no config file or folder, nor a preset: "
                         f"{e}") from None
    routing = counter.mode.expert_load
    print(f"{args.config}: counted with no weights (FakeTensorMode), batch {args.batch_size}, "
          f"prompt {args.prompt_length} tokens, {args.new_tokens} new tokens, {args.precision}; "
          f"attention masks as the attention modules say (causal, sliding window); "
          f"MoE routing {routing}")
    if quant["quantize"] is not None or quant["kv_dtype"] is not None:
        print(f"weights {quant['quantize'].name if quant['quantize'] else args.precision}, KV cache "
              f"{quant['kv_dtype'] or args.precision}: bytes as stored, FLOPs at {args.precision}")
    return counter


def _quantization(args) -> dict:
    """count_config's quantize / kv_dtype from --quantize, --weight_dtype, --group_size,
    --kv_dtype and --act_dtype (--precision by another name); errors name the flag."""
    if args.act_dtype is not None:
        act = quantization.FLOAT_NAMES.get(args.act_dtype.strip().lower())
        if act is None:
            raise ValueError(f"unknown --act_dtype {args.act_dtype!r}; valid: "
                             f"{', '.join(quantization.FLOAT_NAMES)}")
        args.precision = next(name for name, dtype in _PRECISIONS.items() if dtype == act)
    return {"quantize": quantization.resolve_scheme(args.quantize, args.weight_dtype,
                                                     args.group_size),
            "kv_dtype": quantization.parse_kv_dtype(args.kv_dtype)}


def _count(args) -> int:
    outputs = check_outputs(args.plot, args.trace)  # --plot DIR, --trace FILE: before counting
    counter = _count_config(args)
    labels = [label for label in ("prefill", "decode") if label in counter.counts]
    if args.json:
        print(json.dumps(counter.to_dict(), indent=2))
    else:
        print(counter.print_summary(labels=labels))
    if args.save_path:
        counter.to_json(args.save_path)
        print(f"wrote {args.save_path}")
    write_outputs(outputs, counter, log=(lambda *a: None) if args.json else print)
    return 0


def _profile(args) -> int:
    attrs = args.attr or ["FLOPS"]
    if attrs == ["ALL"]:
        attrs = list(ATTRS)
    if (args.config is None) == (args.counts is None):
        raise ValueError("give the model to count, --config, or a saved count, --counts (one)")
    if args.counts is not None:
        counter = TransformerPerformanceCounter.from_json(args.counts)
    else:
        counter = _count_config(args)
    phases = [args.phase] if args.phase else [
        label for label in ("prefill", "decode") if label in counter.counts]
    for phase in phases:
        if phase not in counter.counts:
            raise ValueError(f"no phase {phase!r}: counted {', '.join(counter.counts)}")
        for scope in args.scope or ["transformer"]:
            print(format_profile(counter.counts[phase], scope, attrs))
    return 0


def _add_config_flags(p, required: bool = True) -> None:
    p.add_argument("--config", required=required,
                   help="a transformers config.json or a folder holding one (any causal LM), "
                        "our ModelArgs config.json, or a preset name")
    p.add_argument("--hf", action="store_true",
                   help="transformers' model for a preset too (Llama, Mistral, Qwen2, Mixtral)")
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--prompt_length", type=int, default=128)
    p.add_argument("--new_tokens", type=int, default=4,
                   help="tokens generated: the first by prefill, the rest by decode steps")
    p.add_argument("--precision", default="bfloat16", choices=list(_PRECISIONS))
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static"],
                   help="transformers' KV cache (default: dynamic, as model.generate)")
    p.add_argument("--expert_load", default=None,
                   help="MoE routing with no weights: 'balanced' (default) or weights per "
                        "expert, '4,2,1,1'")
    p.add_argument("--device_spec", default=None, help="registry name or YAML path to price on")
    p.add_argument("--io_model", default="per_op", choices=["per_op", "compulsory"])
    p.add_argument("--depth", type=int, default=10, help="module depth the counter tracks")
    p.add_argument("--quantize", default=None, help="our model's linears as int8, int4 or int4-G "
                   "(G = 32, 64, 128, 256): bytes as stored, FLOPs at --precision")
    p.add_argument("--weight_dtype", default=None, help="what-if weights: int8, int4 or a float")
    p.add_argument("--group_size", type=int, default=None, help="int4 group size")
    p.add_argument("--kv_dtype", default=None, help="KV cache int8 or fp8, a scale per token")
    p.add_argument("--act_dtype", default=None, help="as --precision: bf16, fp16, fp32")
    p.add_argument("--price_as", default=None, help="a .gguf --config's weights: stored (its "
                   "quant types' bytes, the default) or executed (dequantized, at --precision)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfcounter",
        description="What one LLM inference costs: FLOPs, bytes, roofline latency, energy.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("devices", help="list the device registry, or show entries in full")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="show these entries (names, aliases or FILE.yaml[:ENTRY]) in full")
    p.add_argument("--type", help="only devices of this device_type (cuda, cpu, mps, pim, ...)")
    p.add_argument("--spec", action="append", metavar="FILE.yaml",
                   help="add the entries of a YAML file (ours or UPMEM's) first; repeatable")
    p.add_argument("--json", action="store_true", help="print DeviceSpec.to_dict() as JSON")
    p.add_argument("--wide", action="store_true", help="do not shorten the source column")
    p.set_defaults(run=_devices)

    p = sub.add_parser("calibrate", help="measure this machine's bandwidth and matmul FLOP/s",
                       description="STREAM-like triad and matmul timing; writes a device spec "
                       f"(default file: {calibrated_spec_path()}, set $PERFCOUNTER_HOME to move it)")
    p.add_argument("--device", default="cpu", help="torch device to measure (default: cpu)")
    p.add_argument("--name", default="calibrated", help="entry name (default: calibrated)")
    p.add_argument("--array-mb", type=float, default=None,
                   help="MiB per triad array (default: 4 x last-level cache, at least 64)")
    p.add_argument("--repeats", type=int, default=10, help="triad runs, best kept (default 10)")
    p.add_argument("--matmul-n", type=int, default=1024, help="matmul size n (default 1024)")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated matmul dtypes (default: float32,bfloat16)")
    p.add_argument("--min-time", type=float, default=0.2,
                   help="seconds of matmuls per dtype (default 0.2)")
    p.add_argument("--out", default=None, help="YAML file to write (default: the file above)")
    p.add_argument("--no-write", action="store_true", help="measure and print only")
    p.add_argument("--no-curves", action="store_true",
                   help="skip the per-op-class rates and overheads predictions use")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads while measuring (default: torch's current setting)")
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="time ops by wall clock (default) or by the process's CPU time (a "
                        "machine other jobs share, with --threads 1)")
    p.set_defaults(run=_calibrate)

    p = sub.add_parser("op-bench", help="time each op signature of a config's count here",
                       description="Count a config (as `count` does), then time every distinct "
                       "op signature on a local device, cold, and sum: the eager latency "
                       "predicted op by op (perfcounter/pricing/op_bench.py).")
    _add_config_flags(p)
    p.add_argument("--device", default="cpu", help="local torch device to time on (default cpu)")
    p.set_defaults(run=_op_bench)

    p = sub.add_parser("count", help="count a model from its config alone (no weights)",
                       description="Count one greedy generation (prefill, decode steps) of a "
                       "model known by its config, under FakeTensorMode: no weights, no memory.")
    _add_config_flags(p)
    p.add_argument("--json", action="store_true", help="print the counter's to_dict() as JSON")
    p.add_argument("--save_path", default=None, help="write the counts as JSON")
    p.add_argument("--plot", default=None, metavar="DIR", help="write a roofline plot and "
                   "time / energy by module kind (PNG and SVG; needs matplotlib)")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome / Perfetto trace of the generation (JSON)")
    p.set_defaults(run=_count)

    p = sub.add_parser("profile", help="llm-profiler's query: FLOPS, ADD, MULT, ... of a scope",
                       description="Count a config (as `count` does), then print llm-profiler's "
                       "figures of a scope: transformer, attn, mlp, a module class, path or glob.")
    _add_config_flags(p, required=False)
    p.add_argument("--counts", default=None, help="profile a count saved with --save_path "
                   "(or to_json) instead of counting --config")
    p.add_argument("--scope", action="append", default=None,
                   help="transformer (default), attn, mlp, embedding, lm_head, a module class "
                        "(LlamaDecoderLayer), path or glob (model.layers.12.self_attn.k_proj); "
                        "repeatable")
    p.add_argument("--attr", action="append", default=None, type=str.upper,
                   help="FLOPS (default), ADD, MULT, DIV, SQRT, EXP, SPECIAL, CMP, PARAMS, ACT, "
                        "CACHE or ALL; repeatable")
    p.add_argument("--phase", default=None, help="prefill or decode (default: both)")
    p.set_defaults(run=_profile)

    add_simulate(sub)
    add_sweep(sub)
    add_graph(sub)
    p = sub.add_parser("serve", help="a model served to a workload: TTFT / TPOT percentiles, "
                       "memory fit, J and $ per token", description=serve_command.__doc__.split("\n\n")[0])
    serve_command.add_arguments(p)
    p.set_defaults(run=serve_command.run)
    return parser


def main(*, argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default sys.argv[1:]); returns the exit status."""
    with warnings.catch_warnings():  # the filters quiet_third_party sets end with the call
        quiet_third_party()
        parser = build_parser()
        args = parser.parse_args(argv)
        with collected_warnings():
            try:
                return args.run(args)
            except (DeviceSpecError, ValueError) as exc:
                print(f"perfcounter {args.command}: error: {exc}", file=sys.stderr)
                return 2
            except BrokenPipeError:  # `perfcounter devices | head`: stop quietly
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 1


def console() -> None:
    """The `perfcounter` command: `main()` in a process of its own, whose long-lived
    objects the garbage collector is told to leave alone (`settle_objects`)."""
    settle_objects()
    status = main()
    settle_objects()
    sys.exit(status)


if __name__ == "__main__":
    console()
