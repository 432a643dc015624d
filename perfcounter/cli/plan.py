"""`perfcounter plan`: which deployment of a model on a pool of devices serves a workload within
an SLO, with the most goodput per GPU (the deployment search, perfcounter/plan/).

    perfcounter plan --model llama-3.1-70b --devices h100-sxm:8 --qps 4 \\
        --prompt_length 512 --max_new_tokens 128 --slo ttft=1s,tpot=50ms --save_path plan.json
    perfcounter plan --model llama-3.1-70b --devices h100-sxm:8,a100-sxm4-80gb:8 ... --ray
    perfcounter plan ... --ray 10.0.0.1:6379     (each candidate group a task on that cluster)

The workload flags are serve's (one rate); the candidates' storage, max_num_seqs and parallel
degrees are enumerated (--quantize, --kv_dtype and --max_num_seqs take the lists to try).
Prints the inputs, the Pareto front, the recommended deployment, the `perfcounter serve`
command that reproduces it and the engine's own command that runs it (serve/launch.py);
--save_path writes every candidate as JSON, --html a page of the front and the candidates
(report/html_serving.py). Bad input: one line on stderr, exit code 2, before any work.
The search leaves out the candidates that can be neither on the front nor the recommendation
(their bounds, a short run; --exhaustive simulates every one that fits) and says how many.
While it searches, a bar on stderr counts the candidates decided, with the best goodput per
GPU that meets the SLO so far (off with --quiet or where stderr is no terminal); Ctrl-C stops
the search and prints the best found so far (exit code 130).
"""
from __future__ import annotations

import json
import sys

from perfcounter import console
from perfcounter._util import atomic_write
from perfcounter.cli.flags import add_output
from perfcounter.cli.model_flag import ACCEPTED, config_of
from perfcounter.format import format_table
from perfcounter.plan.candidates import KV_CACHE_DTYPES, MAX_NUM_SEQS, QUANTIZATIONS
from perfcounter.plan.front import meets_slo
from perfcounter.plan.pool import PlanError
from perfcounter.plan.render import HEADER, plan_dict, plan_text, row
from perfcounter.plan.search import Progress, plan
from perfcounter.pricing.price import REGIMES
from perfcounter.report.html import HELP as HTML_HELP, check_html, write_page
from perfcounter.report.html_serving import plan_page
from perfcounter.serve.api import PRECISIONS
from perfcounter.serve.engines import ENGINES
from perfcounter.serve.errors import ServeError
from perfcounter.serve.metrics import check_attainment, parse_slo


def _names(values) -> str:
    return ",".join("none" if v is None else str(v) for v in values)


def add_parser(sub) -> None:
    """Register `perfcounter plan` on the command's subparsers."""
    p = sub.add_parser("plan", help="search deployments (precision, TP/PP/DP/EP, disaggregated, "
                       "max_num_seqs) of a model on a device pool for a workload and an SLO",
                       description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("model and pool")
    g.add_argument("--model", help=ACCEPTED)
    g.add_argument("--devices", help="the pool: KIND:COUNT[,KIND:COUNT], e.g. h100-sxm:8 or "
                                     "h100-sxm:8,a100-sxm4-80gb:8")
    g.add_argument("--usd_per_hour", type=float,
                   help="price a GPU-hour of every kind (default: the registry's sourced one)")
    g.add_argument("--precision", default="bfloat16", choices=tuple(PRECISIONS),
                   help="the activations' dtype")
    g.add_argument("--execution", default="cudagraphs", choices=REGIMES,
                   help="the regime steps are priced in (bound: the roofline) (default: "
                        "cudagraphs; on a kind that replays no CUDA graphs, a CPU or a PIM "
                        "part, the engine's eager)")
    g.add_argument("--engine", default="vllm", choices=ENGINES,
                   help="the serving engine whose defaults run (serve's --engine; --execution "
                        "and the limits here override them)")
    g = p.add_argument_group("what to try")
    g.add_argument("--quantize", help="weights as stored, a list (default: "
                   f"{_names(QUANTIZATIONS)}, int4 at the largest group dividing the model's "
                   "linears; none: --precision; fp8 only on devices with an fp8 peak)")
    g.add_argument("--kv_dtype", default=_names(KV_CACHE_DTYPES),
                   help="KV cache storage, a list (none: --precision)")
    g.add_argument("--max_num_seqs", default=",".join(map(str, MAX_NUM_SEQS)),
                   help="engine batch limits, a list")
    for flag, short, what in (("--tensor_parallel_size", "--tp", "TP"),
                              ("--pipeline_parallel_size", "--pp", "PP"),
                              ("--data_parallel_size", "--dp", "DP")):
        g.add_argument(flag, short, help=f"{what} sizes to try, a list (default: every power "
                       "of two the pool holds; TP at most 8)")
    g.add_argument("--aggregated_only", action="store_true",
                   help="no disaggregated candidates (prefill and decode pools of P:D instances)")
    g.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    g.add_argument("--max_num_batched_tokens", type=int, default=8192, help="token budget a step")
    g.add_argument("--block_size", type=int, default=16, help="KV cache block (tokens)")
    g = p.add_argument_group("workload and SLO (serve's)")
    g.add_argument("--qps", type=float, help="requests a second (one rate)")
    g.add_argument("--num_requests", type=int, default=200)
    g.add_argument("--prompt_length", default="512",
                   help="prompt tokens: a number, uniform:LO-HI or normal:MEAN,STD")
    g.add_argument("--max_new_tokens", default="128",
                   help="output tokens: a number, uniform:LO-HI or normal:MEAN,STD")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps (1: Poisson)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--slo", help="targets with units: ttft=1s,tpot=50ms[,e2el=10s]")
    g.add_argument("--slo_attainment", type=float, default=0.9,
                   help="share of requests meeting --slo for a candidate to be recommended")
    g = p.add_argument_group("where it runs")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="each candidate group a Ray task: on the cluster at ADDRESS, else a "
                        "local one (needs the extra: pip install 'perfcounter[ray]')")
    g.add_argument("--workers", type=int, help="processes (default: this machine's cores; "
                                               "1: this process)")
    g.add_argument("--exhaustive", action="store_true",
                   help="simulate every candidate that fits (default: leave out those whose "
                        "bounds or a short run show they can be neither on the front nor the "
                        "recommendation; the same front and recommendation, docs/plan.md)")
    add_output(g, "--save_path", help="every candidate and its figures as JSON")
    add_output(g, "--html", needs=check_html, help=HTML_HELP)
    g.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


class Watch(Progress):
    """The search's bar (console.progress): candidates simulated, the best so far that meets
    the SLO (the recommendation's rule: the highest goodput per GPU)."""

    def __init__(self, attainment: float, quiet: bool):
        self.attainment, self.quiet, self.bar = attainment, quiet, None
        self.total = self.count = 0
        self.best: tuple | None = None  # (goodput per GPU, index, candidate, figures)

    def start(self, total: int) -> None:
        self.total = total
        self.bar = console.progress(total=total, desc="plan", unit="candidate",
                                    quiet=self.quiet)

    def done(self, index, candidate, figures) -> None:
        self.count += 1
        if meets_slo(figures, self.attainment) and (
                self.best is None or (figures["goodput_per_gpu"] or 0.0) > self.best[0]):
            self.best = (figures["goodput_per_gpu"] or 0.0, index, candidate, figures)
            self.bar.set_postfix_str(f"best #{index}: {self.best[0]:.4g} tok/s/GPU goodput "
                                     "meeting the SLO", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def interrupted(self) -> str:
        """What an interrupt prints: how far the search went, the best so far."""
        head = f"plan: interrupted after {self.count} of {self.total} candidates simulated"
        if self.best is None:
            return f"{head}; none of them meets the SLO"
        _, i, c, f = self.best
        return (f"{head}; the best so far that meets the SLO (goodput per GPU): #{i}\n"
                + format_table([row(i, c, f)], HEADER, rule=True))


def _ints(text, flag: str) -> tuple:
    try:
        values = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise PlanError(f"{flag} {text!r}: expected integers, e.g. 16,64,256") from None
    return values


def _search(args, backend: str, watch: Watch):
    """The search the flags ask for (search.plan), told to `watch`."""
    return plan(str(config_of(args.model)), args.devices, slo=args.slo, qps=args.qps,
                num_requests=args.num_requests, prompt_length=args.prompt_length,
                max_new_tokens=args.max_new_tokens, burstiness=args.burstiness,
                seed=args.seed, precision=args.precision, execution=args.execution,
                engine=args.engine,
                gpu_memory_utilization=args.gpu_memory_utilization,
                max_num_batched_tokens=args.max_num_batched_tokens,
                block_size=args.block_size, usd_per_hour=args.usd_per_hour,
                quantizations=None if args.quantize is None else
                [v.strip() for v in args.quantize.split(",") if v.strip()],
                kv_cache_dtypes=[v.strip() for v in args.kv_dtype.split(",") if v.strip()],
                max_num_seqs=_ints(args.max_num_seqs, "--max_num_seqs"),
                **{k: None if getattr(args, k) is None else _ints(getattr(args, k), f"--{k}")
                   for k in ("tensor_parallel_size", "pipeline_parallel_size",
                             "data_parallel_size")},
                disaggregated=not args.aggregated_only,
                slo_attainment=args.slo_attainment, backend=backend, workers=args.workers,
                address=args.ray or None, exhaustive=args.exhaustive, progress=watch)


def _main(args) -> int:
    if args.model is None:
        raise PlanError("give the model: --model PRESET or config.json")
    if args.devices is None:
        raise PlanError("give the pool: --devices KIND:COUNT, e.g. h100-sxm:8")
    if args.qps is None:
        raise PlanError("give the workload's rate: --qps R (requests a second)")
    if args.ray is not None and args.workers is not None:
        raise PlanError("--workers sizes the process pool; with --ray, the cluster's CPUs "
                        "run the tasks: give one of them")
    check_attainment(args.slo_attainment)  # [0.01, 1]: plan() alone takes any fraction > 0
    backend = "ray" if args.ray is not None else "processes"
    watch = Watch(args.slo_attainment, args.quiet)
    try:
        result = _search(args, backend, watch)
    except KeyboardInterrupt:  # Ctrl-C: what was found so far, the shell's code for SIGINT
        watch.close()
        print(watch.interrupted(), flush=True)
        return 130
    finally:
        watch.close()
    text = plan_text(result)
    print(text)
    if args.save_path is not None:
        atomic_write(args.save_path, json.dumps(plan_dict(result), indent=1, allow_nan=False)
                     + "\n")
    if args.html is not None:
        rows = [(i, row(i, c, f)) for i, (c, f, ok) in enumerate(
            zip(result.candidates, result.figures, result.fits))
            if ok and f and "error" not in f and "pruned" not in f]
        write_page(args.html, plan_page(result, f"perfcounter plan {args.model}", text, HEADER,
                                        rows, parse_slo(result.job.slo)))
    return 0


def run(args) -> int:
    """Run `perfcounter plan`; bad input: one line on stderr, exit code 2."""
    try:
        return _main(args)
    except (ServeError, ValueError, KeyError) as e:
        message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"perfcounter plan: error: {message}", file=sys.stderr)
        return 2

