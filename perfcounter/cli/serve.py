"""`perfcounter serve`: a model served to a workload (perfcounter/serve/command.py runs it).

    perfcounter serve --model llama-3-8b --device_spec h100-sxm --qps 10 --num_requests 1000 \\
        --prompt_length uniform:128-1024 --max_new_tokens 128 --slo ttft=200ms,tpot=50ms

The model and run flags are the shared ones (flags.py): --prompt_length and
--max_new_tokens are each request's lengths, a number or a distribution; --device_spec
takes a comma-separated list of deployments to compare. `main.py` registers `add_parser`.
"""
from __future__ import annotations

from perfcounter.cli.flags import add_model_flags, add_output, config_of, refuse
from perfcounter.serve import command


def add_parser(sub) -> None:
    """Register `perfcounter serve` on the command's subparsers."""
    p = sub.add_parser("serve", help="a model served to a workload: TTFT / TPOT percentiles, "
                       "memory fit, J and $ per token",
                       description=command.__doc__.split("\n\n")[0])
    add_model_flags(p, lengths="distributions", device_list=True)
    command.add_arguments(p)
    g = p.add_argument_group("output")
    add_output(g, "--csv", help="per-request times (the first result)")
    add_output(g, "--trace", help="Perfetto trace of the steps (the first result)")
    add_output(g, "--plot", folder=True,
               help="latency CDF and throughput-latency plots (PNG and SVG; needs matplotlib)")
    p.set_defaults(run=run)


def run(args) -> int:
    """command.run, after refusing a regime given beside --bound (one line, exit code 2), with
    --model as the config a config-only command counts (model_flag.config_of: a .pth or
    .safetensors checkpoint's config.json or preset; a .gguf file itself)."""
    if args.bound:
        refuse(args, {"--execution": "--bound prices every deployment at the roofline bound, "
                      "in no execution regime; give one of the two"})
    if args.model is not None:
        args.model = str(config_of(args.model))
    return command.run(args)
