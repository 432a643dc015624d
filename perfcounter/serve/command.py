"""`perfcounter serve`: a model served to a workload on one or more deployments.

    perfcounter serve --model llama-3-8b --device_spec h100-sxm --qps 10 --num_requests 1000 \
        --prompt_length uniform:128-1024 --max_new_tokens 128 --slo ttft=200ms,tpot=50ms
    perfcounter serve --model llama-3-8b --device_spec h100-sxm --plan
    perfcounter serve --model llama-3-8b --device_spec h100-sxm,a100-sxm4-80gb --qps 1:40:8
    perfcounter serve --model llama-3-8b --device_spec h100-sxm --find_max_qps --slo ttft=200ms,tpot=50ms
    perfcounter serve --model llama-3-8b --device_spec h100-sxm --quantize int4-32 --kv_dtype int8 --plan

--quantize (or --weight_dtype / --group_size) and --kv_dtype store the weights and the KV
cache quantized, as `perfcounter count` takes them: the step table is counted from the
quantized model (bytes as stored, FLOPs at --precision), the memory fit holds the stored
weights and the quantized KV bytes a token (scales included).

Steps are priced as perfcounter predicts them in `--execution` (eager, compiled,
cudagraphs; predicted.py), or at the roofline bound with `--bound`. `--mapping FILE`
(repeatable) serves on a placement (placement.py): each device's share priced on that
device in the same regime, plus the transfers `perfcounter simulate` charges:

    perfcounter serve --model llama-3-8b --device_spec h100-sxm --mapping pim.yaml \
        --find_max_qps --slo ttft=500ms,tpot=50ms

`add_arguments(parser)` adds serve's own flags (perfcounter/cli/serve.py adds the shared
model and run flags and the output files), `run(args)` runs (exit code 0; 2 and one line on
stderr for bad input, every input checked before the work).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfcounter._util import atomic_write
from perfcounter.devices import default_device_spec
from perfcounter.quant.gguf_types import FILE_TYPES
from perfcounter.quant.quantize import resolve_scheme
from perfcounter.serve.api import (
    deployment,
    find_max_qps,
    qps_values,
    resolve_model,
    resolve_precision,
    resolve_quantization,
    resolve_spec,
    serve,
)
from perfcounter.serve.errors import ServeError
from perfcounter.serve.metrics import parse_slo
from perfcounter.serve.outputs import (
    check_plotting,
    write_csv,
    write_plots,
    write_trace,
)
from perfcounter.serve.placement import PlacementPricer
from perfcounter.serve.render import plan_text, result_text, table
from perfcounter.serve.workload import check_rate, parse_lengths, read_trace, synthetic

ROW_KEYS = ("deployment", "qps")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """serve's own flags; the model and run flags (--model, --prompt_length, ...) and the
    output files are the command line's (perfcounter/cli/serve.py)."""
    g = p.add_argument_group("deployment")
    g.add_argument("--mapping", action="append", default=None,
                   help="a placement (as `perfcounter simulate --mapping`): its devices price "
                        "the steps (each its share, in --execution or --bound) and hold "
                        "weights and KV cache; repeat to compare, beside any --device_spec")
    g.add_argument("--host", help="the host of a mapping (default: calibrated CPU, else generic-cpu)")
    g.add_argument("--allow_unmatched", action="store_true", help="mapping keys that match nothing warn")
    g.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    g.add_argument("--max_num_batched_tokens", type=int, default=8192, help="token budget a step")
    g.add_argument("--max_num_seqs", type=int, default=256)
    g.add_argument("--block_size", type=int, default=16, help="KV cache block (tokens)")
    g.add_argument("--step_overhead_ms", type=float, default=0.0, help="added to every step")
    g.add_argument("--expert_load", default=None,
                   help="a mixture of experts' routing: 'balanced' (default) or weights per "
                        "expert, '4,2,1,1' (each step priced at the experts it touches in "
                        "expectation)")
    g.add_argument("--gguf_type", default=None,
                   help="a preset's weights as stored in a llama.cpp GGUF of this file type: "
                        f"{', '.join(FILE_TYPES)} (quant/gguf_types.py; not with --mapping)")
    g.add_argument("--bound", action="store_true",
                   help="price steps at the roofline bound (as UPMEM's comparisons do) instead "
                        "of perfcounter's prediction in --execution")
    g = p.add_argument_group("workload")
    g.add_argument("--qps", help="rate(s): 10, a list 1,2,5 or a range START:STOP:COUNT")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    g.add_argument("--concurrency", type=int, help="closed loop: N requests always in flight")
    g.add_argument("--num_requests", type=int, default=1000)
    g.add_argument("--trace_file", type=Path, help="JSONL or CSV: arrival_time, prompt_tokens, "
                                                   "output_tokens[, cached_tokens]")
    g.add_argument("--prefix_hit_rate", type=float, default=0.0, help="prompt share a prefix cache holds")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("measures")
    g.add_argument("--slo", help="targets with units: ttft=200ms,tpot=50ms[,e2el=2s]")
    g.add_argument("--slo_attainment", type=float, default=0.9,
                   help="share of requests meeting --slo for --find_max_qps")
    g.add_argument("--find_max_qps", action="store_true", help="the highest rate meeting --slo")
    g.add_argument("--usd_per_hour", type=float, help="device price (else the spec's sourced one)")
    g.add_argument("--usd_per_kwh", type=float, help="energy price")
    g.add_argument("--plan", action="store_true", help="the memory fit only, no simulation")
    g.add_argument("--plan_context", type=int, help="--plan: the largest batch at this context")
    g.add_argument("--plan_batch", type=int, help="--plan: the longest context at this batch")


def _check(args) -> None:
    """Everything that can be checked before any counting or simulation."""
    if args.model is None:
        raise ServeError("give the model: --model PRESET or config.json")
    _quantization(args)
    if str(getattr(args, "batch_size", "1")) != "1":
        raise ServeError("--batch_size: serve's scheduler forms the batches (--max_num_seqs)")
    if args.qps is not None:
        for q in qps_values(args.qps):
            check_rate(q)
    if args.qps is not None and args.concurrency is not None:
        raise ServeError("give --qps or --concurrency, not both")
    if args.find_max_qps and not args.slo:
        raise ServeError("--find_max_qps needs --slo (e.g. ttft=200ms,tpot=50ms)")
    if args.slo:
        parse_slo(args.slo)
    parse_lengths(args.prompt_length, "--prompt_length")
    parse_lengths(args.max_new_tokens, "--max_new_tokens")
    if args.plot is not None:  # the paths were checked as the flags were read
        check_plotting()


def _quantization(args) -> tuple:
    """(WeightScheme or None, KV dtype or None) from --quantize / --weight_dtype /
    --group_size and --kv_dtype, as `perfcounter count` reads them (ServeError else)."""
    try:
        scheme = resolve_scheme(getattr(args, "quantize", None),
                                getattr(args, "weight_dtype", None),
                                getattr(args, "group_size", None))
    except ValueError as e:  # QuantizeError
        raise ServeError(str(e)) from None
    return resolve_quantization(scheme, getattr(args, "kv_dtype", None))


def _deployments(args) -> list:
    if args.precision == "auto":  # no weights run: bfloat16 (cli/flags.py)
        args.precision = "bfloat16"
    weights, kv = _quantization(args)
    common = {"precision": args.precision, "quantize": weights, "kv_dtype": kv,
              "gpu_memory_utilization": args.gpu_memory_utilization,
              "block_size": args.block_size, "max_num_batched_tokens": args.max_num_batched_tokens,
              "max_num_seqs": args.max_num_seqs, "step_overhead_s": args.step_overhead_ms * 1e-3,
              "usd_per_hour": args.usd_per_hour, "check_fit": not args.plan,
              "expert_load": getattr(args, "expert_load", None),
              "gguf_type": getattr(args, "gguf_type", None),
              "execution": "bound" if args.bound else args.execution}
    model = args.model
    specs = [s.strip() for s in (args.device_spec or "").split(",") if s.strip()]
    if args.device_spec is not None and not specs:
        raise ServeError("--device_spec: expected a device name or YAML path")
    # every device and mapping checked before any step table is counted
    dtype = resolve_precision(args.precision)
    for s in specs:
        resolve_spec(s, dtype)
    if not args.mapping:
        specs = specs or [default_device_spec(dtype)]
        return [deployment(model, s, **common) for s in specs]
    model_args = resolve_model(model)
    for m in args.mapping:
        PlacementPricer(m, model_args, execution=common["execution"], host=args.host,
                        allow_unmatched=args.allow_unmatched)
    deps = [deployment(model, s, **common) for s in specs]
    return deps + [deployment(model, mapping=m, host=args.host,
                              allow_unmatched=args.allow_unmatched, **common)
                   for m in args.mapping]


def _workload_maker(args, block_size: int):
    if args.trace_file is not None:
        trace = read_trace(args.trace_file, block_size=block_size)
        return lambda qps: trace
    if args.concurrency is not None:
        return lambda qps: synthetic(args.num_requests, args.prompt_length, args.max_new_tokens,
                                     concurrency=args.concurrency, seed=args.seed,
                                     prefix_hit_rate=args.prefix_hit_rate, block_size=block_size)
    return lambda qps: synthetic(args.num_requests, args.prompt_length, args.max_new_tokens,
                                 qps=qps, burstiness=args.burstiness, seed=args.seed,
                                 prefix_hit_rate=args.prefix_hit_rate, block_size=block_size)


def _main(args) -> int:
    _check(args)
    make = _workload_maker(args, args.block_size)
    if args.qps is None and args.concurrency is None and args.trace_file is None \
            and not args.plan and not args.find_max_qps:
        raise ServeError("give a workload: --qps, --concurrency or --trace_file (or --plan)")
    deps = _deployments(args)
    if args.plan:
        for dep in deps:
            context = args.plan_context
            if context is None and str(args.prompt_length).isdigit() \
                    and str(args.max_new_tokens).isdigit():
                context = int(args.prompt_length) + int(args.max_new_tokens)
            print(plan_text(dep, context, args.plan_batch or args.max_num_seqs))
        return 0
    results, rows, notes = [], [], []
    for dep in deps:
        if args.find_max_qps:
            best, tried = find_max_qps(dep, make, args.slo, attainment=args.slo_attainment)
            notes.append(f"{dep.name}: highest QPS meeting {args.slo} for "
                         f"{args.slo_attainment:.0%} of requests: "
                         + ("none (not even the lowest rate tried)" if best is None else
                            f"{best:.3g}"))
            chosen = [r for r in tried[1:] if best is not None
                      and r.workload.source == f"qps {best:g}"] or tried[-1:]
            results.append(chosen[0])
            rows.append({**chosen[0].to_dict(), "qps": best})
            continue
        rates = qps_values(args.qps) if args.qps is not None else [None]
        for qps in rates:
            result = serve(dep, make(qps), slo=args.slo, usd_per_kwh=args.usd_per_kwh)
            results.append(result)
            rows.append({**result.to_dict(), "qps": qps})
    if len(rows) == 1 and not args.find_max_qps:
        print(result_text(results[0]))
    else:
        print(f"step costs: {'; '.join(dict.fromkeys(d.table.label for d in deps))}")
        print(table(rows, first=("deployment", "deployment", 0)))
        for line in notes:
            print(line)
    _write(args, results, rows)
    return 0


def _write(args, results, rows) -> None:
    if args.save_path is not None:
        atomic_write(args.save_path, json.dumps(rows if len(rows) > 1 else rows[0], indent=2,
                                                allow_nan=False, default=str) + "\n")
    if args.csv is not None:
        write_csv(args.csv, results[0])
    if args.trace is not None:
        write_trace(args.trace, results[0])
    if args.plot is not None:
        stem = "_".join(["serve", Path(str(args.model)).stem if str(args.model).endswith(".json")
                         else str(args.model), *dict.fromkeys(r["deployment"] for r in rows)])
        write_plots(args.plot, results, [f"{r['deployment']} qps {r['qps']}" for r in rows],
                    sweep=rows if len(rows) > 1 else None,
                    stem="".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:120])


def run(args) -> int:
    """Run `perfcounter serve`; bad input: one line on stderr, exit code 2."""
    try:
        return _main(args)
    except (ServeError, ValueError, KeyError) as e:  # MappingError and spec errors are ValueErrors
        message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"perfcounter serve: error: {message}", file=sys.stderr)
        return 2
