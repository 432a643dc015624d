"""The `perfcounter` console command.

    perfcounter devices [NAME ...] [--type cuda] [--spec FILE.yaml] [--json]
    perfcounter calibrate [--array-mb 256] [--repeats 10] [--matmul-n 1024] [--out PATH]

Each subcommand is a `_NAME(args) -> int` function registered in
`build_parser()` with `set_defaults(run=...)`; add one the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from perfcounter.devices import (DeviceSpec, DeviceSpecError, calibrated_spec_path,
                                 dtype_name, get_device_spec, list_device_specs,
                                 register_device_specs)
from perfcounter.report import format_table, scaled, si

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


def _describe(spec: DeviceSpec) -> str:
    data = spec.to_dict()
    lines = [f"{spec.name} ({spec.device_type})"]
    for key, value in data.items():
        if key in ("name", "device_type", "source") or value in (None, [], {}):
            continue
        lines.append(f"  {key}: {value}")
    by_text: dict[str, list[str]] = {}
    for key, text in spec.source.items():
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
    from perfcounter.devices.calibrate import calibrate, describe, save_calibrated
    array_bytes = None if args.array_mb is None else int(args.array_mb * (1 << 20))
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    cal = calibrate(device=args.device, array_bytes=array_bytes, repeats=args.repeats,
                    matmul_n=args.matmul_n, dtypes=dtypes, min_time=args.min_time)
    for line in describe(cal):
        print(line)
    spec = cal.to_spec(args.name)
    if args.no_write:
        return 0
    path = save_calibrated(spec, args.out)
    hint = repr(spec.name) if args.out is None else f"'{path}:{spec.name}'"
    print(f"wrote {path} (entry {spec.name!r}); use it as get_device_spec({hint})")
    return 0


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
    p.set_defaults(run=_calibrate)

    from perfcounter.sim_cli import add_parser as add_simulate  # perfcounter simulate
    add_simulate(sub)
    return parser


def main(*, argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (DeviceSpecError, ValueError) as exc:
        print(f"perfcounter {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `perfcounter devices | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
