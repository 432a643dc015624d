"""The `perfcounter` console command.

    perfcounter devices [NAME ...] [--type cuda] [--spec FILE.yaml] [--json]
    perfcounter calibrate [--array_mb 256] [--repeats 10] [--matmul_n N] [--out PATH]
        [--threads N] [--clock auto|wall|cpu|thread] [--no_curves]
    perfcounter count --model config.json|FOLDER|FILE.gguf|PRESET [--batch_size 1]
        [--prompt_length 128] [--max_new_tokens 128] [--precision bf16] [--save_path c.json]
        [--quantize int8|int4|int4-G] [--weight_dtype int4 --group_size 32] [--kv_dtype int8|fp8]
    perfcounter profile --model ...|--counts c.json [--scope attn] [--attr FLOPS --attr MULT]
    perfcounter op-bench --model ... [--device cpu]   (the flags of count)
    perfcounter simulate --model ... --mapping m.yaml        (cli/simulate.py)
    perfcounter sweep --model llama-3-8b,mixtral-8x7b --batch_size 1,8 --prompt_length 128,2048
        [--device_spec h100-sxm,pim-ai-4dimm] [--mapping m.yaml] [--csv F]   (cli/sweep.py)
    perfcounter graph --model ... [--phase prefill|decode] [--out BASE]    (cli/graph.py)
    perfcounter serve --model ... --qps 10                   (cli/serve.py)
    perfcounter plan --model ... --devices h100-sxm:8 --qps 4 --slo ttft=1s,tpot=50ms (cli/plan.py)

Every command that runs a model takes the same model and run flags with the same defaults
(cli/flags.py). Each subcommand is a `NAME(args) -> int` function registered in
`build_parser()` with `set_defaults(run=...)`; add one the same way.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

import torch

from perfcounter._util import settle_objects
from perfcounter.cli.count import add_parsers as add_count
from perfcounter.cli.flags import Parser, add_output, refuse
from perfcounter.cli.graph import add_parser as add_graph
from perfcounter.cli.plan import add_parser as add_plan
from perfcounter.cli.serve import add_parser as add_serve
from perfcounter.cli.simulate import add_parser as add_simulate
from perfcounter.cli.sweep import add_parser as add_sweep
from perfcounter.console import collected_warnings, quiet_third_party
from perfcounter.devices import (DeviceSpec, DeviceSpecError, calibrated_spec_path, dtype_name,
                                 get_device_spec, list_device_specs, register_device_specs)
from perfcounter.devices.calibrate import calibrate, describe, save_calibrated
from perfcounter.devices.spec_file import spec_to_entry
from perfcounter.devices.this_machine import measuring_allowed
from perfcounter.format import format_table, scaled, si
from perfcounter.pricing.achievable import prediction_inputs

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
    lines.append("  predictions take (pricing/achievable.py):")
    lines += [f"    {name}: {value}; {where}" for name, value, where in prediction_inputs(spec)]
    by_text: dict[str, list[str]] = {}
    for key, text in (sources.items() if isinstance(sources, dict) else []):
        by_text.setdefault(text, []).append(key)
    lines.append("  source:")
    lines += [f"    {', '.join(keys)}: {text}" for text, keys in by_text.items()]
    return "\n".join(lines)


def _devices(args) -> int:
    if args.names:
        refuse(args, {"--type": "NAMEs are shown whatever their type; --type filters the list "
                      "of every device"})
    if args.names or args.json:
        refuse(args, {"--wide": "--wide widens the table's source column; NAMEs and --json "
                      "print no table"})
    for path in args.spec or []:
        register_device_specs(path)
    if args.names:
        specs = [get_device_spec(n) for n in args.names]
    else:
        kinds = sorted({get_device_spec(n).device_type for n in list_device_specs()})
        if args.type is not None and args.type not in kinds:
            raise ValueError(f"--type {args.type!r}: no device is of that type; valid: "
                             f"{', '.join(kinds)}")
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
    if args.no_write:
        refuse(args, {"--out": "--no_write writes no file", "--name": "--name names the entry "
                      "written; --no_write writes none"})
    elif args.out is None:
        calibrated_spec_path()  # a PERFCOUNTER_HOME that is no folder: refused before measuring
    for flag, value, what in (("--array_mb", args.array_mb, "MiB per triad array"),
                              ("--repeats", args.repeats, "triad runs"),
                              ("--matmul_n", args.matmul_n, "the matmul size n"),
                              ("--min_time", args.min_time, "seconds of matmuls per dtype")):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} {value:g}: expected {what}, a number > 0")
    array_bytes = None if args.array_mb is None else int(args.array_mb * (1 << 20))
    if array_bytes == 0:
        raise ValueError(f"--array_mb {args.array_mb:g}: expected at least one byte (1e-6 MiB)")
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
    print(f"wrote {path} (entry {spec.name!r}); use it as get_device_spec({hint})"
          + ("" if cal.check.get("passed") else "; it failed its checks, so it is not the "
             "default spec: rerun on a quieter machine, or name it with --device_spec"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    p.add_argument("--array_mb", type=float, default=None,
                   help="MiB per triad array (default: 4 x last-level cache, at least 64)")
    p.add_argument("--repeats", type=int, default=10, help="triad runs, best kept (default 10)")
    p.add_argument("--matmul_n", type=int, default=None,
                   help="matmul size n (default: 1024 on a CPU, 4096 on a GPU)")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated matmul dtypes (default: float32,bfloat16)")
    p.add_argument("--min_time", type=float, default=0.2,
                   help="seconds of matmuls per dtype (default 0.2)")
    add_output(p, "--out", help="YAML file to write (default: the file above)")
    p.add_argument("--no_write", action="store_true", help="measure and print only")
    p.add_argument("--no_curves", action="store_true",
                   help="skip the per-op-class rates and overheads predictions use")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads while measuring (default: torch's current setting)")
    p.add_argument("--clock", default="auto", choices=["auto", "wall", "cpu", "thread"],
                   help="time ops by wall clock, the process's or the thread's CPU time (a "
                        "machine other jobs share, with --threads 1); auto (default): thread "
                        "with one torch thread, else wall")
    p.set_defaults(run=_calibrate)

    add_count(sub)
    add_simulate(sub)
    add_sweep(sub)
    add_graph(sub)
    add_serve(sub)
    add_plan(sub)
    return parser


def main(*, argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default sys.argv[1:]); returns the exit status."""
    with warnings.catch_warnings():  # the filters quiet_third_party sets end with the call
        quiet_third_party()
        try:
            parser = build_parser()
        except DeviceSpecError as exc:  # the environment: a PERFCOUNTER_HOME that is no folder
            print(f"perfcounter: error: {exc}", file=sys.stderr)
            return 2
        try:  # a bad flag or output path: one line, exit code 2; --help: 0
            args = parser.parse_args(argv)
        except SystemExit as exc:
            return exc.code
        with collected_warnings():
            try:
                measuring_allowed()  # $PERFCOUNTER_MEASURE, checked in every command
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
