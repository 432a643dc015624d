"""`perfcounter serve`: a model served to a workload on one or more deployments.

    perfcounter serve --model llama-3-8b --device_spec h100-sxm --qps 10 --num_requests 1000 \\
        --prompt_length uniform:128-1024 --max_new_tokens 128 --slo ttft=200ms,tpot=50ms
    perfcounter serve --model llama-3-8b --device_spec h100-sxm --plan
    perfcounter serve --model llama-3-8b --device_spec h100-sxm,a100-sxm4-80gb --qps 1:40:8
    perfcounter serve --model llama-3-8b --find_max_qps --slo ttft=200ms,tpot=50ms --engine trtllm

The model and run flags are the shared ones (flags.py): --prompt_length and
--max_new_tokens are each request's lengths, a number or a distribution; --device_spec
takes a comma-separated list of deployments to compare. `--engine` (vllm, trtllm, sglang;
serve/engines.py) sets what the engine sets: the regime its steps run in (CUDA graphs on a
GPU, eager elsewhere), admission, max_num_seqs, the token budget, host costs and the KV
cache's scale granularity; `--execution` (bound: the roofline; eager, compiled,
cudagraphs: perfcounter's prediction) and the scheduler flags override it. Every input is
checked before any table is counted; bad input: one line on stderr, exit code 2.
`main.py` registers `add_parser`.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from perfcounter import console
from perfcounter.cli.flags import (add_deprecated, add_model_flags, add_output, add_parallel_flags,
                                   config_of, given, refuse)
from perfcounter.devices import default_device_spec
from perfcounter.parallel import PARALLEL_SIZES
from perfcounter.serve.disaggregated import Pool
from perfcounter.pricing.price import REGIMES
from perfcounter.quant.gguf_types import FILE_TYPES
from perfcounter.quant.quantize import resolve_scheme
from perfcounter.report.html import HELP as HTML_HELP, check_html
from perfcounter.report.html_serving import serve_page
from perfcounter.serve.api import (deployment, disaggregated, qps_values, resolve_model,
                                   resolve_precision, resolve_quantization, resolve_spec, serve)
from perfcounter.serve.engines import ENGINES, engine_profile
from perfcounter.serve.errors import ServeError
from perfcounter.serve.launch import for_deployment
from perfcounter.serve.metrics import check_attainment, check_prices, parse_slo
from perfcounter.serve.outputs import check_plotting, csv_text, trace_text, write_all, write_plots
from perfcounter.serve.placement import PlacementPricer
from perfcounter.serve.render import (SWEEP_COLUMNS, launch_text, plan_text, result_text,
                                      smallest_fit_text, table)
from perfcounter.serve.replicas import check_sizes
from perfcounter.serve.search import PROBE_REQUESTS, find_max_qps, scaled_trace
from perfcounter.serve.workload import (check_burstiness, check_count, check_fits_model,
                                        check_rate, check_seed, parse_lengths, read_trace,
                                        synthetic)


def add_parser(sub) -> None:
    """Register `perfcounter serve` on the command's subparsers."""
    p = sub.add_parser("serve", help="a model served to a workload: TTFT / TPOT percentiles, "
                       "memory fit, J and $ per token",
                       description=__doc__.split("\n\n")[0])
    add_model_flags(p, lengths="distributions", device_list=True, executions=REGIMES,
                    execution_default="the engine's: cudagraphs on a GPU spec, eager elsewhere")
    add_parallel_flags(p)  # one rank's step table and memory, the price of every GPU
    add_arguments(p)
    g = p.add_argument_group("output")
    add_output(g, "--csv", help="per-request times (the first result)")
    add_output(g, "--trace", help="Perfetto trace of the steps (the first result)")
    add_output(g, "--plot", folder=True,
               help="latency CDF and throughput-latency plots (PNG and SVG; needs matplotlib)")
    add_output(g, "--html", needs=check_html, help=HTML_HELP)
    g.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """serve's own flags (the model and run flags and the output files are added above)."""
    g = p.add_argument_group("deployment")
    g.add_argument("--engine", default="vllm", choices=ENGINES,
                   help="the serving engine whose defaults run (serve/engines.py, each figure "
                        "with its source); --execution and the flags below override them")
    g.add_argument("--mapping", action="append", default=None,
                   help="a placement (as `perfcounter simulate --mapping`): its devices price "
                        "the steps (each its share, in --execution) and hold weights and KV "
                        "cache; repeat to compare, beside any --device_spec")
    g.add_argument("--host", help="the host of a mapping (default: calibrated CPU, else generic-cpu)")
    g.add_argument("--allow_unmatched", action="store_true", help="mapping keys that match nothing warn")
    g.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    g.add_argument("--max_num_batched_tokens", type=int, default=None,
                   help="token budget a step (default: the engine's on the device)")
    g.add_argument("--max_num_seqs", type=int, default=None,
                   help="sequences a step (default: the engine's on the device)")
    g.add_argument("--block_size", type=int, default=16, help="KV cache block (tokens)")
    g.add_argument("--step_overhead_ms", type=float, default=None,
                   help="host time added to every step (default: the engine's)")
    g.add_argument("--request_overhead_ms", type=float, default=None,
                   help="host time before a request is first scheduled (default: the engine's)")
    g.add_argument("--expert_load", default=None,
                   help="a mixture of experts' routing: 'balanced' (default) or weights per "
                        "expert, '4,2,1,1'")
    g.add_argument("--gguf_type", default=None,
                   help="a preset's weights as stored in a llama.cpp GGUF of this file type: "
                        f"{', '.join(FILE_TYPES)} (not with --mapping)")
    add_deprecated(g, "--bound", "--execution bound", dest="execution", nargs=0, const="bound")
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
    g.add_argument("--find_max_qps", action="store_true",
                   help="the highest rate meeting --slo in steady state (serve/search.py)")
    g.add_argument("--usd_per_hour", type=float, help="device price (else the spec's sourced one)")
    g.add_argument("--usd_per_kwh", type=float, help="energy price")
    g.add_argument("--plan", action="store_true", help="the memory fit only, no simulation")
    for pool in ("prefill", "decode"):
        g.add_argument(f"--{pool}_pool", help=f"disaggregated serving: the {pool} pool, "
                       "DEVICE[,instances=N][,tp=T] (give both; docs/parallel.md)")
    g.add_argument("--plan_context", type=int, help="--plan: the largest batch at this context")
    g.add_argument("--plan_batch", type=int, help="--plan: the longest context at this batch")


_refuse = functools.partial(refuse, error=ServeError)  # a flag given that this run would ignore


def _check(args) -> object:
    """Everything that can be checked before any counting or simulation; the trace read."""
    if args.model is None:
        raise ServeError("give the model: --model PRESET or config.json")
    _quantization(args)
    engine_profile(args.engine)
    if str(getattr(args, "batch_size", "1")) != "1":
        raise ServeError("--batch_size: serve's scheduler forms the batches (--max_num_seqs)")
    if args.plan:
        _refuse(args, {f"--{k}": "--plan prints the memory fit and simulates nothing, so writes "
                       "no such file" for k in ("csv", "trace", "plot", "html", "save_path")})
        _refuse(args, {f"--{k}": "--plan simulates no workload" for k in (
            "qps", "concurrency", "trace_file", "find_max_qps", "slo")})
    else:
        _refuse(args, {f"--{k}": "only --plan reads it" for k in ("plan_context", "plan_batch")})
    for flag in ("plan_context", "plan_batch"):
        value = getattr(args, flag)
        if value is not None and not 1 <= value <= 10_000_000:
            raise ServeError(f"--{flag} {value}: expected an integer in [1, 10,000,000]")
    if args.trace_file is not None:
        _refuse(args, {f"--{k}": "--trace_file gives every request's arrival and lengths"
                       for k in ("qps", "concurrency", "num_requests", "prompt_length",
                                 "max_new_tokens", "burstiness", "seed")})
    if args.qps is not None and args.concurrency is not None:
        raise ServeError("give --qps or --concurrency, not both")
    if args.find_max_qps:
        if not args.slo:
            raise ServeError("--find_max_qps needs --slo (e.g. ttft=200ms,tpot=50ms)")
        _refuse(args, {"--qps": "--find_max_qps searches the rate itself",
                       "--concurrency": "--find_max_qps searches an arrival rate; a closed "
                                        "loop has none"})
    else:
        _refuse(args, {"--slo_attainment": "only --find_max_qps reads it"})
    check_attainment(args.slo_attainment)
    check_prices(args.usd_per_hour, args.usd_per_kwh)
    if any(not str(m).strip() for m in args.mapping or ()):  # not '.', the current folder
        raise ServeError("--mapping '': expected a YAML/JSON file or inline mapping text")
    check_sizes(*(getattr(args, k) for k in PARALLEL_SIZES[:3]))
    if args.slo:
        parse_slo(args.slo)
    check_burstiness(args.burstiness)
    check_seed(args.seed)
    check_count(args.num_requests)
    if args.concurrency is not None and not 1 <= args.concurrency <= args.num_requests:
        raise ServeError(f"--concurrency {args.concurrency}: expected an integer in "
                         f"[1, --num_requests {args.num_requests:,}]")
    if args.qps is not None:
        for q in qps_values(args.qps):
            check_rate(q, args.num_requests)
    # --plan reads the lengths only for the context it reports at (--plan_context's default)
    context = None if args.plan else resolve_model(args.model).block_size
    parse_lengths(args.prompt_length, "--prompt_length", context and context - 1)
    parse_lengths(args.max_new_tokens, "--max_new_tokens", context and context - 1)
    if context and str(args.prompt_length).isdigit() and str(args.max_new_tokens).isdigit() and \
            int(args.prompt_length) + int(args.max_new_tokens) > context:
        raise ServeError(f"--prompt_length {args.prompt_length} + --max_new_tokens "
                         f"{args.max_new_tokens} exceed the model's context of {context:,}")
    trace = None
    if args.trace_file is not None:
        trace = read_trace(args.trace_file, block_size=args.block_size)
        check_fits_model(trace, context)
    if args.plot is not None:  # the paths were checked as the flags were read
        check_plotting()
    return trace


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


def _keywords(args) -> dict:
    """deployment()'s keywords from the flags: one deployment's, each pool's alike."""
    if args.precision == "auto":  # no weights run: bfloat16 (cli/flags.py)
        args.precision = "bfloat16"
    weights, kv = _quantization(args)
    return {"precision": args.precision, "quantize": weights, "kv_dtype": kv,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "block_size": args.block_size, "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_num_seqs": args.max_num_seqs,  # the overheads: ms -> s, None stays None
            "step_overhead_s": args.step_overhead_ms and args.step_overhead_ms * 1e-3,
            "request_overhead_s": args.request_overhead_ms and args.request_overhead_ms * 1e-3,
            "usd_per_hour": args.usd_per_hour, "expert_load": getattr(args, "expert_load", None),
            "gguf_type": getattr(args, "gguf_type", None), "engine": args.engine,
            "execution": args.execution if "execution" in given(args) else None}


def _deployments(args) -> list:
    common = {**_keywords(args), "check_fit": not args.plan,
              **{k: getattr(args, k) for k in PARALLEL_SIZES}}
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
        PlacementPricer(m, model_args, execution=common["execution"] or "eager", host=args.host,
                        allow_unmatched=args.allow_unmatched)
    deps = [deployment(model, s, **common) for s in specs]
    return deps + [deployment(model, mapping=m, host=args.host,
                              allow_unmatched=args.allow_unmatched, **common)
                   for m in args.mapping]


def _workload_maker(args, block_size: int, trace):
    """make(qps, at_least=0): the workload at a rate, at least `at_least` requests long (the
    QPS search's probes; a trace scaled and repeated, search.scaled_trace)."""
    if trace is not None:
        return lambda qps, at_least=0: scaled_trace(trace, qps, at_least) if args.find_max_qps else trace
    if args.concurrency is not None:
        return lambda qps, at_least=0: synthetic(
            args.num_requests, args.prompt_length, args.max_new_tokens, block_size=block_size,
            concurrency=args.concurrency, seed=args.seed, prefix_hit_rate=args.prefix_hit_rate)
    return lambda qps, at_least=0: synthetic(
        max(args.num_requests, at_least), args.prompt_length, args.max_new_tokens, qps=qps,
        burstiness=args.burstiness, seed=args.seed, prefix_hit_rate=args.prefix_hit_rate,
        block_size=block_size)


def _main(args) -> int:
    trace = _check(args)
    make = _workload_maker(args, args.block_size, trace)
    if args.qps is None and args.concurrency is None and args.trace_file is None \
            and not args.plan and not args.find_max_qps:
        raise ServeError("give a workload: --qps, --concurrency or --trace_file (or --plan)")
    if args.prefill_pool is not None or args.decode_pool is not None:
        return _pools(args, make)
    deps = _deployments(args)
    if args.plan:
        for dep in deps:
            context = args.plan_context
            if context is None and str(args.prompt_length).isdigit() \
                    and str(args.max_new_tokens).isdigit():
                context = int(args.prompt_length) + int(args.max_new_tokens)
            print(plan_text(dep, context, args.plan_batch or dep.engine.max_num_seqs))
            if not dep.devices and not hasattr(dep.weights, "kinds"):  # one device, no GGUF
                print(smallest_fit_text(args.model, dep))
        return 0
    results, rows, notes, rates = [], [], [], qps_values(args.qps) if args.qps else [None]
    run_one = console.counting(serve, console.progress(  # each run (--find_max_qps: each probe)
        total=None if args.find_max_qps else len(deps) * len(rates), desc="serve", unit="run",
        quiet=args.quiet), lambda r: f"{r.metrics['completed']:,} requests, {r.metrics['duration']:.4g} s simulated")
    for dep in deps:
        if args.find_max_qps:  # serve/search.py's search, each probe counted
            found = find_max_qps(dep, make, args.slo, attainment=args.slo_attainment, serve=run_one)
            best = found.rate
            why = " (the steady throughput: the queue grows without bound above it)" \
                if found.limited_by_throughput else ""
            notes.append(f"{dep.name}: highest QPS meeting {args.slo} for "
                         f"{args.slo_attainment:.0%} of requests (at least {PROBE_REQUESTS:,} a "
                         "probe, the first 10% left out): "
                         + ("none (not even the lowest rate tried)" if best is None else
                            f"{best:.3g}{why}"))
            chosen = [r for (q, ok), r in zip(found.probes, found.results) if q == best] \
                or found.results[-1:]
            results.append(chosen[0])
            rows.append({**chosen[0].to_dict(), "qps": best, **for_deployment(dep).to_dict()})
            continue
        for qps in rates:
            result = run_one(dep, make(qps), slo=args.slo, usd_per_kwh=args.usd_per_kwh)
            results.append(result)
            rows.append({**result.to_dict(), "qps": qps, **for_deployment(dep).to_dict()})
    run_one.bar.close()
    text = result_text(results[0]) if len(rows) == 1 and not args.find_max_qps else "\n".join([
        *dict.fromkeys(d.engine_line for d in deps),
        f"step costs: {'; '.join(dict.fromkeys(d.table.label for d in deps))}",
        table(rows, first=("deployment", "deployment", 0)), *notes,
        *dict.fromkeys(launch_text(d) for d in deps)])
    print(text)
    _write(args, results, rows, text)
    return 0


def _pools(args, make) -> int:
    """--prefill_pool and --decode_pool: disaggregated serving, per pool and overall, beside
    the aggregated deployment on as many GPUs of the device when both pools name one."""
    if args.prefill_pool is None or args.decode_pool is None:
        raise ServeError("--prefill_pool and --decode_pool go together: give both")
    _refuse(args, {f"--{k}": "a disaggregated run prices its pools (DEVICE,instances=N,tp=T) "
                   "at one rate and writes JSON alone" for k in (
                       "device_spec", "mapping", "host", "allow_unmatched", *PARALLEL_SIZES,
                       "plan", "find_max_qps", "csv", "trace", "plot", "html")})
    rates = qps_values(args.qps) if args.qps is not None else [None]
    if len(rates) > 1:
        raise ServeError("--qps: a disaggregated run serves one rate; give one")
    kw = _keywords(args)  # every deployment setting, applied to both pools
    work = make(rates[0])
    r = disaggregated(args.model, work, args.prefill_pool, args.decode_pool, slo=args.slo,
                      usd_per_kwh=args.usd_per_kwh, **kw)
    rows = [{"deployment": f"prefill {args.prefill_pool}", **r.prefill},
            {"deployment": f"decode {args.decode_pool}", **r.decode},
            {"deployment": f"disaggregated, {r.overall['gpus']} GPUs", **r.overall}]
    pre, dec = Pool.parse(args.prefill_pool), Pool.parse(args.decode_pool)
    gguf = kw["gguf_type"] is not None or str(args.model).endswith(".gguf")  # one GPU only
    if pre.device == dec.device and (pre.gpus + dec.gpus) % pre.tp == 0 and not gguf:
        agg = deployment(args.model, pre.device, tensor_parallel_size=pre.tp,
                         data_parallel_size=(pre.gpus + dec.gpus) // pre.tp, **kw)
        rows.append({"deployment": f"aggregated, {agg.name}",
                     **serve(agg, work, slo=args.slo, usd_per_kwh=args.usd_per_kwh).metrics})
    print(table(rows, SWEEP_COLUMNS[1:], first=("deployment", "deployment", 0)))
    link = r.link
    print(f"KV moved between the pools: {r.overall['kv_transfer_bytes'] / 1e9:.3f} GB over "
          f"{link.kind} ({link.busbw / 1e9:.0f} GB/s a rank), {r.overall['kv_transfer_j']:.3g} J"
          + (" (the link gives no pJ/bit)" if link.pj_per_bit is None else ""))
    if args.save_path is not None:
        write_all({args.save_path: json.dumps({**r.to_dict(), "rows": rows}, indent=2,
                                              allow_nan=False, default=str) + "\n"})
    return 0


def _write(args, results, rows, text: str) -> None:
    """--save_path, --csv, --trace and --html replaced together (all new or all old); then plots."""
    files = {}
    if args.save_path is not None:
        files[args.save_path] = json.dumps(rows if len(rows) > 1 else rows[0], indent=2,
                                           allow_nan=False, default=str) + "\n"
    if args.csv is not None:
        files[args.csv] = csv_text(results[0])
    if args.trace is not None:
        files[args.trace] = trace_text(results[0])
    labels = [f"{r['deployment']} qps {r['qps']}" for r in rows]
    if args.html is not None:  # the text printed, then the charts (report/html_serving.py)
        files[args.html] = serve_page(results, labels, f"perfcounter serve {args.model}", text)
    write_all(files)
    if args.plot is not None:
        stem = "_".join(["serve", Path(str(args.model)).stem if str(args.model).endswith(".json")
                         else str(args.model), *dict.fromkeys(r["deployment"] for r in rows)])
        write_plots(args.plot, results, labels,
                    sweep=rows if len(rows) > 1 else None,
                    stem="".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:120])


def run(args) -> int:
    """Run `perfcounter serve` (--model read as every config-only command reads it:
    model_flag.config_of); bad input: one line on stderr, exit code 2."""
    try:
        if args.model is not None:
            args.model = str(config_of(args.model))
        return _main(args)
    except (ServeError, ValueError, KeyError) as e:  # MappingError and spec errors are ValueErrors
        message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"perfcounter serve: error: {message}", file=sys.stderr)
        return 2
