"""`perfcounter simulate`: count a generation, then price it under a layer mapping.

    perfcounter simulate --model llama-2-7b --hf --mapping mapping.yaml --prompt_length 64 \\
        --max_new_tokens 16 --batch_size 1 --precision bfloat16 --save_path sim.json
    perfcounter simulate --model llama-2-7b --hf --default_device PIM-AI-4chip
    perfcounter simulate --model llama-2-7b --hf --search energy \\
        --devices Snapdragon8gen3,PIM-AI-4chip --max_latency_ms 100

The model (--model, the shared flags of cli/flags.py): a preset or a config.json
counted with no weights under FakeTensorMode (one layer per kind and three decode
steps counted, the rest derived), a checkpoint (a real run on this machine, as
generate.py loads it), or a counter saved by `TransformerPerformanceCounter.to_json`
(--counts). --device_spec runs the modules the mapping does not place (as
--default_device). --hf builds transformers'
own model class, so that module names are Hugging Face's (q_proj, lm_head,
LlamaRMSNorm: the names UPMEM's mappings use); without it perfcounter's gpt-fast
model runs (wqkv, wo, w1, w2, w3, output, RMSNorm). `cli/main.py` registers
`add_parser`; errors are ValueErrors, which the command prints on one line
(exit 2).

Device figures: each device's spec gives its own peak_fraction, device link
and tensor-parallel interconnect (YAML `peak_fraction`, `device_link_GBs`,
`interconnect_GBs`, ... see devices/schema.py); --peak_fraction,
--device_link_GBs and --interconnect_GBs (with their _pj_per_bit) override
them when given: --peak_fraction 0.8 for every device, DEVICE=F for that
device; --device_link_GBs for every device<->device transfer, instead of the
specs' links; --interconnect_GBs for every tensor-parallel group, instead of
each spec's interconnect (placement.py's doc has the full order).
"""
from __future__ import annotations

import math
import warnings
from functools import partial
from pathlib import Path

import torch

from perfcounter._util import atomic_write
from perfcounter.cli.flags import (PRECISIONS, add_model_flags, add_output, add_parallel_flags,
                                   parallel_of,
                                   model_source, precision_of, refuse)
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.devices import get_device_spec
from perfcounter.generation.config_only import count_hf_config, greedy_generate, resolve_config
from perfcounter.generation.derive import count_generation
from perfcounter.models.args import ModelArgs
from perfcounter.models.loading import fake_model, load_hf_model, load_model, read_config
from perfcounter.models.tokenizer import cache_keyword
from perfcounter.parallel import check_links, shard
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_types import check_gguf_type, stored_as
from perfcounter.report.plots import check_outputs, source_name, write_outputs
from perfcounter.pricing.links import Link, LinkError
from perfcounter.serve.placement import model_modules
from perfcounter.simulation.hf_names import names_qkv, split_modules
from perfcounter.simulation.placement import (Mapping, MappingError, Plan, default_host,
                                              resolve_device)
from perfcounter.simulation.run import simulate
from perfcounter.simulation.search import search_mapping


class _HFAdapter:
    """A transformers causal LM behind the (idx, input_pos) -> logits interface that
    config_only.greedy_generate drives. Not an nn.Module, so module paths start at the
    transformers class ("LlamaForCausalLM.model.layers.0.self_attn.q_proj")."""

    def __init__(self, model):
        self.model, self.config, self.cache = model, model.config, None

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        import transformers  # deferred: heavy (seconds to import), off the import path
        self.cache = transformers.StaticCache(config=self.config, max_cache_len=max_seq_length)

    def __call__(self, idx, input_pos):
        positions = input_pos.unsqueeze(0).expand(idx.shape[0], -1)
        return self.model(input_ids=idx, position_ids=positions, cache_position=input_pos,
                          use_cache=True, **{cache_keyword(self.model): self.cache}).logits


def count(args):
    """A TransformerPerformanceCounter holding the phases the flags ask for."""
    if args.counts is not None:
        return TransformerPerformanceCounter.from_json(args.counts)
    if args.model is not None and args.checkpoint_path is None and args.config is None:
        kind = model_source(args.model)  # --model names a preset, a config or a checkpoint
        if kind != "preset":
            setattr(args, "config" if kind == "config" else "checkpoint_path", args.model)
            args.model = None
    # auto: float32 for a checkpoint, which runs here on the CPU; bfloat16 with no weights
    dtype = PRECISIONS[precision_of(args.precision, args.checkpoint_path and "cpu")]
    sizes = dict(batch_size=args.batch_size, prompt_length=args.prompt_length,
                 max_new_tokens=args.max_new_tokens)
    if min(sizes.values()) < 1:
        raise MappingError("--batch_size, --prompt_length and --max_new_tokens must be >= 1, "
                           f"got {args.batch_size}, {args.prompt_length}, {args.max_new_tokens}")
    counter = TransformerPerformanceCounter(depth=args.depth)
    if args.checkpoint_path is None and args.model is None and args.config is None:
        raise MappingError("give the model: --model PRESET|config.json|CHECKPOINT, or a "
                           "saved count: --counts counts.json")
    scheme = quantization.resolve_scheme(args.quantize, args.weight_dtype, args.group_size)
    kv = quantization.parse_kv_dtype(args.kv_dtype)
    if args.gguf_type and (args.hf or args.checkpoint_path is not None):
        raise MappingError("--gguf_type prices a preset or config of ours counted with no "
                           "weights: leave out --hf and checkpoints")
    if (scheme is not None or kv is not None) and (args.hf or args.checkpoint_path is not None):
        raise MappingError("--quantize, --weight_dtype and --kv_dtype price perfcounter's model "
                           "counted from a config: leave out --hf and checkpoints")
    parallel = parallel_of(args)  # one rank of our model (perfcounter/parallel)
    sharded = parallel.sharded or parallel.enable_expert_parallel
    if sharded and (args.hf or args.checkpoint_path is not None or args.gguf_type):
        raise MappingError(f"{parallel.label() or '--enable_expert_parallel'}: one rank of "
                           "perfcounter's model is counted from its config; leave out --hf, "
                           "checkpoints and --gguf_type")
    if sharded:  # the collectives' link: the device the unplaced modules run on
        where = args.default_device or args.device_spec
        if where is None:
            raise MappingError(f"{parallel.label() or '--enable_expert_parallel'}: give "
                               "--default_device, the device whose link prices the collectives")
        check_links(get_device_spec(where, dtype=dtype), parallel)
    if args.checkpoint_path is not None:
        _count_checkpoint(args, counter, dtype, sizes)
    elif args.hf:
        count_hf_config(args.config if args.config is not None else args.model, counter,
                        dtype=dtype, cache="static", derive=True, **sizes)
    else:
        model_args = read_config(args.config) if args.config else ModelArgs.from_name(args.model)
        if sharded:  # its sharded shapes and collectives, placed as the mapping says
            model_args = shard(model_args, str(args.config or args.model),
                               tensor_parallel_size=parallel.tensor_parallel_size,
                               pipeline_parallel_size=parallel.pipeline_parallel_size,
                               data_parallel_size=parallel.data_parallel_size,
                               enable_expert_parallel=parallel.enable_expert_parallel)[1]
        make = None if scheme is None and kv is None else partial(fake_model, weights=scheme,
                                                                     kv=kv, dtype=dtype)
        file = args.gguf_type and check_gguf_type(model_args, args.gguf_type, quantize=scheme)
        count_generation(model_args, counter, dtype=dtype, make_model=make, every_layer=bool(file),
                         generate=stored_as(model_args, file, greedy_generate) if file
                         else greedy_generate,
                         **sizes)  # one layer per kind (a file's differ), three decode steps
    return counter


def check_mapping_first(args, kwargs) -> None:
    """--mapping's keys and devices checked before any counting where the model's structure
    is known from its config alone (a preset or our config.json, counted whole: not --hf, a
    checkpoint, a saved count or one rank): the modules of its fake model, as serve lists
    them, wqkv split where q_proj / k_proj / v_proj are named."""
    if args.mapping is None or args.search is not None or args.counts is not None or args.hf \
            or args.checkpoint_path is not None or parallel_of(args).sharded:
        return
    source = args.config or args.model
    if source is None or (args.config is None and model_source(source) == "checkpoint"):
        return
    try:
        config = resolve_config(source)
    except (KeyError, ValueError, OSError):
        return  # counting says what is wrong with it
    if not isinstance(config, ModelArgs):
        return
    mapping = Mapping.load(args.mapping)
    modules = model_modules(config)
    if names_qkv(mapping.to_dict()):
        modules = split_modules(modules)
    host = default_host() if kwargs["host"] is None else resolve_device(kwargs["host"], None,
                                                                         where="--host")
    plan = Plan(mapping, modules, host, default_device=kwargs["default_device"],
                peak_fraction=kwargs["peak_fraction"])
    unmatched = mapping.unmatched(plan.used, modules)
    if unmatched and not args.allow_unmatched:
        raise MappingError("; ".join(unmatched) + " (--allow_unmatched warns and goes on)")


def _count_checkpoint(args, counter, dtype, sizes) -> None:
    """A real generation of a checkpoint (synthetic prompt), as generate.py loads it."""
    if args.hf:
        model = _HFAdapter(load_hf_model(args.checkpoint_path, dtype=dtype).model.model)
        vocab = model.config.vocab_size
    else:
        model = load_model(args.checkpoint_path, model_name=args.model, config_path=args.config,
                           dtype=dtype).model
        vocab = model.config.vocab_size
    x = torch.randint(0, vocab, (sizes["batch_size"], sizes["prompt_length"]))
    greedy_generate(model, x, sizes["max_new_tokens"], phase=counter.count)


def _peak_fraction(text):
    """'0.8' (every device) or 'pim-ai-4chip=0.7,host=0.5'."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return float(text)
        return {k.strip(): float(v) for k, v in (p.split("=", 1) for p in text.split(","))}
    except ValueError:
        raise MappingError(f"--peak_fraction {text!r}: expected a number (0.8) or "
                           "DEVICE=F pairs (pim-ai-4chip=0.7,host=0.5)") from None


def _link(bw_gbs, pj, name: str):
    if bw_gbs is None:
        if pj is not None:
            raise MappingError(f"--{name}_pj_per_bit needs --{name}_GBs")
        return None
    if not math.isfinite(bw_gbs) or not bw_gbs > 0:
        raise MappingError(f"--{name}_GBs must be a finite number > 0, got {bw_gbs}")
    try:
        return Link(bw_gbs * 1e9, pj)
    except LinkError as e:
        raise MappingError(f"--{name}_pj_per_bit: {e}") from None


# the flags that count a model: what a saved count (--counts) cannot honour
COUNTING = ("--model", "--config", "--checkpoint_path", "--prompt_length", "--max_new_tokens",
            "--batch_size", "--precision", "--quantize", "--weight_dtype", "--group_size",
            "--kv_dtype", "--hf", "--depth", "--gguf_type", "--tensor_parallel_size",
            "--pipeline_parallel_size", "--data_parallel_size", "--enable_expert_parallel")


def _unused(args) -> dict:
    """{flag: why} for the flags given that this run could not honour (refused, not ignored)."""
    why = {}
    if args.counts is not None:
        why |= {f: f"--counts prices a saved count; {f} applies when a model is counted"
                for f in COUNTING}
    if args.default_device is not None:
        why["--device_spec"] = ("--default_device already says where unmapped modules run; "
                                "give one of the two")
    if args.search is None:
        why |= {f: f"{f} goes with --search energy|latency"
                for f in ("--max_latency_ms", "--save_mapping")}
    else:
        why["--allow_unmatched"] = "--search builds the mapping: it has no keys to match"
    return why


def run(args) -> int:
    refuse(args, _unused(args))  # one line, before any work
    outputs = check_outputs(args.plot, args.trace)  # paths checked while parsing; matplotlib
    if args.search is None and args.devices:
        raise MappingError("--devices goes with --search energy|latency")
    if args.search is not None and args.mapping is not None:
        raise MappingError("--search finds a mapping: leave out --mapping")
    kwargs = dict(host=args.host, default_device=args.default_device or args.device_spec,
                  elementwise_model=args.elementwise_model, overlap=args.overlap,
                  peak_fraction=_peak_fraction(args.peak_fraction),
                  device_link=_link(args.device_link_GBs, args.device_link_pj_per_bit,
                                    "device_link"),
                  interconnect=_link(args.interconnect_GBs, args.interconnect_pj_per_bit,
                                     "interconnect"), execution=args.execution)
    check_mapping_first(args, kwargs)
    try:
        counter = count(args)
    except (KeyError, OSError) as exc:  # an unknown preset, a missing file: one line
        raise MappingError(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)) from None
    if args.save_counts is not None:  # price it again later with --counts, without counting
        counter.to_json(args.save_counts)
    with warnings.catch_warnings(record=True) as caught:  # shown once, under Notes
        warnings.simplefilter("always")
        if args.search is not None:
            found = search_mapping(counter, (args.devices or "").split(","), args.search,
                                   max_latency_ms=args.max_latency_ms, **kwargs)
            sim = found.simulation
            print(found.mapping_text())
            if args.save_mapping is not None:
                atomic_write(args.save_mapping, found.mapping_text())
        else:
            sim = simulate(counter, args.mapping, allow_unmatched=args.allow_unmatched, **kwargs)
    sim.notes = sorted(set(sim.notes) | {str(w.message) for w in caught})
    print(sim.report(layers=args.report_layers, functions=args.report_functions,
                     log=args.print_log, log_summary=args.print_log_summary))
    if args.save_path is not None:
        sim.to_json(args.save_path)
        print(f"\nwrote {args.save_path}")
    write_outputs(outputs, sim, name=source_name("simulate", args.model or args.config or
                                                 args.checkpoint_path or args.counts))
    return 0


def add_parser(sub) -> None:
    """Register `perfcounter simulate` on the command's subparsers."""
    p = sub.add_parser("simulate", help="place layers on devices (UPMEM's layer mapping) and "
                       "price time and energy per phase", description=__doc__.split("\n\n")[0])
    add_model_flags(p, legacy_paths=True)  # the bound, and the prediction run --execution
    add_parallel_flags(p)
    g = p.add_argument_group("model")
    g.add_argument("--counts", type=Path, help="a counter saved with to_json or --save_counts: "
                   "price it, don't count")
    add_output(g, "--save_counts", help="write the counts (JSON) for later --counts")
    g.add_argument("--hf", action="store_true", help="transformers' model class and names")
    g.add_argument("--gguf_type", help="a preset's weights as stored in a llama.cpp GGUF of "
                   "this file type (Q4_0, Q4_K_M, ...; docs/quantization.md)")
    g.add_argument("--depth", type=int, default=10, help="module depth the counter tracks")
    g = p.add_argument_group("placement")
    g.add_argument("--mapping", help="YAML/JSON file (or inline {key: 'device[,t][,m][,tp=N]'})")
    g.add_argument("--default_device", help="where unmapped modules run (default: where the "
                   "previous module ran)")
    g.add_argument("--host", help="the host's device spec (default: calibrated CPU, else "
                   "generic-cpu)")
    g.add_argument("--allow_unmatched", action="store_true",
                   help="warn instead of failing for mapping keys that match no module")
    g.add_argument("--elementwise_model", default="roofline", choices=["roofline", "upmem"],
                   help="softmax/SiLU/RMSNorm by FLOPs and bytes, or by ns per element (UPMEM)")
    g.add_argument("--overlap", action="store_true",
                   help="a transfer overlaps the next layer's compute (max, not sum)")
    g.add_argument("--peak_fraction", help="achievable/peak: 0.8, or pim-ai-4chip=0.7,host=0.5 "
                   "(overrides the specs' peak_fraction; default: the spec's, else 1)")
    g.add_argument("--device_link_GBs", type=float, help="device<->device link bandwidth, one "
                   "way (overrides the specs' device_link_GBs; default: theirs, else via host)")
    g.add_argument("--device_link_pj_per_bit", type=float)
    g.add_argument("--interconnect_GBs", type=float, help="tensor-parallel interconnect, one way "
                   "(overrides the specs' interconnect_GBs; default: theirs, else via host)")
    g.add_argument("--interconnect_pj_per_bit", type=float)
    g = p.add_argument_group("search")
    g.add_argument("--search", choices=["energy", "latency"],
                   help="find the mapping of module kinds to --devices that minimizes this")
    g.add_argument("--devices", help="comma-separated devices for --search")
    g.add_argument("--max_latency_ms", type=float, help="bound on decode ms per token")
    add_output(g, "--save_mapping", help="write the mapping found (YAML)")
    g = p.add_argument_group("output")
    g.add_argument("--report_layers", action="store_true", help="each layer: device, params, input")
    g.add_argument("--report_functions", action="store_true", help="per aten op and device")
    g.add_argument("--print_log", action="store_true", help="time-ordered per-layer rows")
    g.add_argument("--print_log_summary", action="store_true", help="per phase and device")
    add_output(g, "--plot", folder=True, help="write time and energy by module kind per phase "
               "and device (PNG and SVG; needs matplotlib)")
    add_output(g, "--trace", help="write a Chrome / Perfetto trace, one track per device (JSON)")
    p.set_defaults(run=run)
