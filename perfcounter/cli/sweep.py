"""`perfcounter sweep`: many questions at once — models x batch x lengths x devices.

    perfcounter sweep --model llama-3-8b,mixtral-8x7b --batch_size 1,8,32 \\
        --prompt_length 128,2048 --max_new_tokens 256 \\
        --device_spec h100-sxm,a100-sxm4-80gb,pim-ai-4dimm [--mapping m.yaml] \\
        [--csv sweep.csv] [--markdown sweep.md]

Each (model, batch size, prompt length, new tokens) is counted once, config only
(FakeTensorMode, no weights), through `derive.count_generation` (one layer per
kind, three decode steps counted, the others derived), and re-priced on every
device: one row per combination, device and phase. Figures: FLOPs, per-op and
compulsory IO, roofline latency and bound (with --mapping: the simulated time of
the placement, `simulate.simulate`, the device placing the modules no key
places), the predicted latency beside it in the --execution asked (predict.py:
each op's overhead and achievable rate; with --mapping the simulation's
prediction), tokens/s by each, J/token and the phase's average power on the device (W: its
joules over its predicted time, pricing/power.py), the KV cache's size, and the memory footprint —
weights + KV cache + the largest op's activations (inputs and outputs of one
call, the peak an eager run needs at least) — against the device's memory
(`fits`: no when it exceeds it, n/a when the spec has no size).
Models are presets or config.json files (ours or Hugging Face); a transformers model that
perfcounter's model does not hold (a transformers preset: qwen3-8b, deepseek-v3, ...) is counted
on transformers' own modeling code (count_config), weights as its checkpoint stores them. With vLLM's parallel flags
(--tensor_parallel_size, ...: perfcounter/parallel) one rank of each model is counted, priced
and fitted (a `parallel` column says its sizes). `cli/main.py` registers `add_parser`.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from perfcounter import console
from perfcounter._util import atomic_write
from perfcounter.cli.flags import (PRECISIONS, add_model_flags, add_output, add_parallel_flags,
                                   config_of, parallel_of, precision_of)
from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.devices import default_device_spec, get_device_spec
from perfcounter.format import format_table, rate, scaled, si
from perfcounter.generation.config_only import count_config, gguf_config, greedy_generate
from perfcounter.generation.derive import count_generation
from perfcounter.models import kv_layout
from perfcounter.models.args import ModelArgs
from perfcounter.models.hf_checkpoint import model_args_from_hf
from perfcounter.models.loading import fake_model, read_config
from perfcounter.parallel import check_links, rank_args, shard
from perfcounter.pricing.power import mean_power_w
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_types import FILE_TYPES, GgufFile, check_file_type, check_gguf_type
from perfcounter.quant.quantize import kv_cache_bytes
from perfcounter.quant.stored import STORED
from perfcounter.report.html import HELP as HTML_HELP, check_html, sweep_page, write_page
from perfcounter.report.plots import check_plot_dir, sweep_plots
from perfcounter.serve.errors import ServeError
from perfcounter.serve.hf_model import HfArgs
from perfcounter.serve.resolve import resolve_model
from perfcounter.simulation.placement import Mapping
from perfcounter.simulation.run import simulate
from perfcounter.trace import ROLES

HEAD = ["model", "batch", "prompt", "new", "device", "phase", "tokens", "GFLOPs", "per_op GB",
        "compulsory GB", "roofline", "bound", "predicted", "tok/s roofline", "tok/s predicted",
        "J/token", "W", "KV GB", "footprint GB", "memory GB", "fits"]
_ACT = ROLES.index("activation")


@dataclass
class Footprint:
    """Bytes a generation needs resident: weights, KV cache, the largest op's activations."""

    weights: int
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations


def parse_list(text: str, name: str, convert=str) -> list:
    """'1,8,32' -> [1, 8, 32]; a ValueError naming the flag for a bad item."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        values = [convert(t) for t in items]
    except ValueError:
        raise ValueError(f"--{name}: expected a comma-separated list of {convert.__name__}, "
                         f"got {text!r}") from None
    if not values:
        raise ValueError(f"--{name}: empty list")
    return values


def _model_args(name: str):
    """Our ModelArgs for --model `name`: a preset, a config.json, a folder's config.json, a
    .gguf file's metadata, or a .pth / .safetensors checkpoint's config (config_of)."""
    source = config_of(name)
    if str(source).endswith(".gguf"):
        return model_args_from_hf(gguf_config(source).to_dict(), source)
    if Path(source).is_dir():  # a model folder: its config.json
        return read_config(Path(source) / "config.json")
    return read_config(source) if str(source).endswith(".json") else ModelArgs.from_name(source)


def _transformers(name: str):
    """The transformers model --model `name` is (a transformers preset, a config.json or
    folder of an architecture perfcounter's model does not hold: serve's HfArgs), else
    None (ours: _model_args)."""
    source = config_of(name)
    if str(source).endswith((".gguf", ".pth", ".safetensors")):
        return None
    try:
        args = resolve_model(source)
    except ServeError:
        return None  # _model_args names what is wrong
    return args if isinstance(args, HfArgs) else None


def check_transformers(hf: dict, schemes, kvs, files, sharded: bool, mapping) -> None:
    """A transformers model is counted as its checkpoint stores it, unsharded, on one
    device: the flags that price otherwise refused in one line."""
    name = next((n for n, a in hf.items() if a is not None), None)
    given = [flag for flag, on in (("--quantize", any(schemes)), ("--kv_dtype", any(kvs)),
                                   ("--gguf_type", bool(files)), ("--mapping", mapping),
                                   ("the parallel flags", sharded)) if on]
    if name is not None and given:
        raise ValueError(f"--model {name} is a transformers model, counted as its checkpoint "
                         f"stores it on one device; drop {given[0]} (serve prices its ranks)")


def _count_transformers(hf, batch: int, prompt: int, new: int, dtype, io_model: str,
                        execution: str):
    """(counter, footprint) of a transformers model (count_config: transformers' model on
    fake tensors, one layer per kind derived): weights as stored, the KV cache as
    transformers' eager cache holds it (windows capped), the largest op's activations."""
    counter = count_config(hf.config, batch_size=batch, prompt_length=prompt, new_tokens=new,
                           dtype=dtype, io_model=io_model)
    counter.execution = execution
    kv = batch * kv_layout.kv_cache_bytes(hf.config, dtype, prompt + new, "eager")
    largest = max(((r.read[_ACT] + r.written[_ACT]) // max(r.calls, 1)
                   for s in counter.counts.values() for r in s.trace.records), default=0)
    return counter, Footprint(hf.weight_bytes(dtype), kv, largest)


def _file(name: str, args, file_type) -> GgufFile | None:
    """How a model's weights are stored in a llama.cpp file: a .gguf model's own tensors
    (which no --quantize or --gguf_type restores: refused in check_gguf_models), a preset
    as stored in a file of `file_type`, else None (float or a --quantize scheme)."""
    if str(config_of(name)).endswith(".gguf"):
        return GgufFile.of_file(config_of(name), args)
    return GgufFile.of_type(file_type, args) if file_type else None


def check_gguf_models(models, schemes, files) -> None:
    """A .gguf model's weights are the file's: refused beside --quantize or --gguf_type."""
    for name in models:
        if str(config_of(name)).endswith(".gguf") and (files or any(schemes)):
            given = "--gguf_type" if files else "--quantize"
            raise ValueError(f"--model {name} is a .gguf file, whose weights are priced as the "
                             f"file stores them; drop {given} (or give its preset)")
        if str(config_of(name)).endswith(".gguf") and _model_args(name).num_experts:
            raise ValueError(f"--model {name}: a mixture of experts stored as a GGUF is not "
                             "priced by sweep (its experts are no linears of ours); give its "
                             "preset")


def footprint(args, model, counter, batch: int, max_seq: int, itemsize: int,
              kv_dtype=None) -> Footprint:
    weights = sum(STORED.get(p, p.numel() * p.element_size())  # as stored
                  for p in model.parameters())
    kv = kv_cache_bytes(args.n_layer, batch, args.n_local_heads, max_seq, args.head_dim,
                        kv=kv_dtype, itemsize=itemsize)
    largest = max(((r.read[_ACT] + r.written[_ACT]) // max(r.calls, 1)
                   for s in counter.counts.values() for r in s.trace.records), default=0)
    return Footprint(weights, kv, largest)


def sweep(models, batch_sizes, prompt_lengths, new_tokens, devices, *, mapping=None,
          dtype=torch.bfloat16, io_model: str = "per_op", progress: bool = False,
          quantize=(None,), kv_dtypes=(None,), execution: str = "eager",
          gguf_types=(), parallel=None) -> list[dict]:
    """One dict per (model, batch, prompt, new tokens, weight scheme, KV dtype, device, phase);
    see the module doc. quantize: weight schemes (None: float; "int8", "int4-32", ... or
    quantize.WeightScheme); gguf_types: llama.cpp file types ("Q4_K_M", ...) priced beside
    them, each a preset's weights as stored in such a file (quant/gguf_types.py, every layer
    counted); kv_dtypes: None (float), "int8", "fp8"; execution: the program the predicted
    latency prices (eager, compiled, cudagraphs). parallel: a ParallelConfig (perfcounter/
    parallel): one rank of each model is counted and priced (its sharded shapes, collectives
    and memory), the rows saying its sizes."""

    specs = [get_device_spec(d, dtype=dtype) for d in devices]  # a bad name fails first
    schemes = [q if isinstance(q, quantization.WeightScheme) else quantization.parse_scheme(q)
               for q in quantize]
    files = [check_file_type(t) for t in gguf_types]
    check_gguf_models(models, schemes, files)
    for name in models if files else ():  # a model no file type can store fails first
        check_gguf_type(_model_args(name), files[0])
    schemes = [(s, None) for s in schemes] + [(None, t) for t in files]
    sharded = parallel is not None and (parallel.sharded or parallel.enable_expert_parallel)
    hf = {name: _transformers(name) for name in models}
    check_transformers(hf, [s for s, _ in schemes], kv_dtypes, files, sharded, mapping)
    for name in models if sharded else ():  # every model and device checked before counting
        shard(_model_args(name), name, tensor_parallel_size=parallel.tensor_parallel_size,
              pipeline_parallel_size=parallel.pipeline_parallel_size,
              data_parallel_size=parallel.data_parallel_size,
              enable_expert_parallel=parallel.enable_expert_parallel,
              gguf=bool(files) or str(config_of(name)).endswith(".gguf"))
        for spec in specs:
            check_links(spec, parallel)
    kvs = [quantization.parse_kv_dtype(k) for k in kv_dtypes]  # bad names fail before counting
    combos = console.progress(list(itertools.product(models, batch_sizes, prompt_lengths,
                                                     new_tokens, schemes, kvs)),
                              desc="sweep", unit="config", quiet=not progress)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for name, batch, prompt, new, (scheme, file_type), kv in combos:
        if hf[name] is not None:
            counter, need = _count_transformers(hf[name], batch, prompt, new, dtype, io_model,
                                                execution)
            method = getattr(hf[name].stored, "method", None)
            stored_as = "as stored" + (f" ({method})" if method else "")
        else:
            counter, need, gguf = _count_ours(name, batch, prompt, new, scheme, file_type, kv,
                                              dtype, io_model, execution, sharded and parallel,
                                              itemsize)
            stored_as = f"{file_type} GGUF" if file_type else "as stored (GGUF)" if gguf \
                else scheme.name if scheme else "float"
        for spec in specs:
            sim = None
            if mapping is not None:
                sim = simulate(counter, mapping, default_device=spec.name, detail=False,
                               execution=execution)
            for label, stats in counter.counts.items():
                s = stats.on(spec, io_model)
                if sim is None:
                    latency, bound, predicted = s.roofline_latency, s.bound, s.predicted_latency
                    tps, jpt = s.roofline_token_throughput, s.energy_per_token_j
                    watts = s.energy.mean_power_w if s.energy is not None else None
                else:
                    phase = sim.phases[label]
                    latency, bound, predicted = phase.time_s, None, phase.predicted_s
                    tps, jpt = phase.tokens_per_s, phase.j_per_token
                    watts = mean_power_w(phase.energy_j, phase.time_s)
                rows.append({
                    "model": name, "batch": batch, "prompt": prompt, "new": new,
                    "weights": stored_as, "kv_dtype": kv or "float",
                    "device": spec.name, "phase": label, "tokens": s.num_tokens,
                    "flops": s.total_flops, "per_op_bytes": s.trace.per_op_bytes,
                    "compulsory_bytes": s.trace.compulsory_bytes, "latency_s": latency,
                    "bound": bound, "execution": execution, "predicted_latency_s": predicted,
                    "tokens_per_s": tps,
                    "predicted_tokens_per_s": s.num_tokens / predicted if predicted else None,
                    "j_per_token": jpt, "mean_power_w": watts,
                    "kv_cache_bytes": need.kv_cache, "footprint_bytes": need.total,
                    "weights_bytes": need.weights, "activations_bytes": need.activations,
                    "memory_bytes": spec.vram,
                    "fits": None if not spec.vram else need.total <= spec.vram,
                    **({"parallel": parallel.label()} if sharded else {})})
    return rows


def _count_ours(name, batch, prompt, new, scheme, file_type, kv, dtype, io_model, execution,
                parallel, itemsize):
    """(counter, footprint, GGUF file or None) of perfcounter's model (count_generation),
    one rank of `parallel` where given (checked before)."""
    args = _model_args(name)
    if parallel:
        args = rank_args(args, parallel, name)
    gguf = _file(name, args, file_type)
    counter = TransformerPerformanceCounter(io_model=io_model, execution=execution)
    make = None if scheme is None and kv is None else partial(
        fake_model, weights=scheme, kv=kv, dtype=dtype)
    model = count_generation(args, counter, batch_size=batch, prompt_length=prompt,
                             max_new_tokens=new, dtype=dtype, make_model=make,
                             generate=gguf.stored_as(greedy_generate) if gguf
                             else greedy_generate, every_layer=gguf is not None)
    if gguf:  # the weights' footprint as the file stores them
        gguf.annotate(model, range(args.n_layer))
    return counter, footprint(args, model, counter, batch, prompt + new, itemsize, kv), gguf


def _cells(row: dict) -> list[str]:
    fits = "n/a" if row["fits"] is None else ("yes" if row["fits"] else "NO")
    quant = [f"w {row['weights']}"] * (row.get("weights", "float") != "float") + \
        [f"kv {row['kv_dtype']}"] * (row.get("kv_dtype", "float") != "float")
    model = row["model"] + (f" ({', '.join(quant)})" if quant else "")
    return [model, row["batch"], row["prompt"], row["new"], row["device"], row["phase"],
            row["tokens"], scaled(row["flops"], "G", 1), scaled(row["per_op_bytes"], "G", 2),
            scaled(row["compulsory_bytes"], "G", 2), si(row["latency_s"], "s"),
            row["bound"] or "n/a", si(row["predicted_latency_s"], "s"),
            rate(row["tokens_per_s"], "tok/s"), rate(row["predicted_tokens_per_s"], "tok/s"),
            si(row["j_per_token"], "J"), si(row.get("mean_power_w"), "W"),
            scaled(row["kv_cache_bytes"], "G", 2), scaled(row["footprint_bytes"], "G", 1),
            scaled(row["memory_bytes"], "G", 0), fits]


def to_text(rows: list[dict], *, markdown: bool = False) -> str:
    return format_table([_cells(r) for r in rows], HEAD, align="l" + "r" * 3 + "ll" + "r" * 5
                        + "l" + "r" * 9, markdown=markdown, rule=not markdown)


def to_csv(rows: list[dict]) -> str:
    """Every figure in base units (bytes, seconds, FLOPs); empty where unknown."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    return out.getvalue()


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="count models config-only and price every combination "
                       "of batch, lengths and devices", description=__doc__.split("\n\n")[0])
    add_model_flags(p, lists=True)  # the roofline, a bound; the prediction in --execution
    add_parallel_flags(p)
    p.add_argument("--mapping", default=None, help="layer -> device mapping (YAML/JSON): price "
                   "the placement, each --device_spec running the modules it does not place")
    p.add_argument("--io_model", default="per_op", choices=["per_op", "compulsory"],
                   help="the bytes the roofline prices (both are listed)")
    p.add_argument("--gguf_type", default=None, help="presets' weights as stored in llama.cpp "
                   "GGUF files of these types, beside --quantize's: " + ",".join(FILE_TYPES)
                   + " (comma-separated list)")
    add_output(p, "--csv", help="write the rows as CSV (base units)")
    add_output(p, "--markdown", help="write the table as markdown")
    add_output(p, "--plot", folder=True, help="write latency and J/token per device, phase "
               "and combination (PNG and SVG; needs matplotlib)")
    add_output(p, "--html", needs=check_html, help=HTML_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def run(args) -> int:
    pos = dict(batch_sizes=parse_list(args.batch_size, "batch_size", int),
               prompt_lengths=parse_list(args.prompt_length, "prompt_length", int),
               new_tokens=parse_list(args.max_new_tokens, "max_new_tokens", int))
    for name, values in pos.items():
        if min(values) < 1:
            raise ValueError(f"--{name}: every value must be >= 1, got {values}")
    mapping = None
    if args.mapping is not None:
        mapping = Mapping.load(args.mapping)
    if args.plot is not None:  # checked before the sweep (and matplotlib with it)
        plot_dir = check_plot_dir(args.plot)
    if args.model is None:
        raise ValueError("give the models: --model PRESET|config.json[,...]")
    dtype = PRECISIONS[precision_of(args.precision)]  # no weights run: auto is bfloat16
    schemes = parse_list(args.quantize or "none", "quantize")
    if args.weight_dtype is not None:  # one what-if layout beside --quantize's
        schemes = [quantization.resolve_scheme(None, args.weight_dtype, args.group_size)]
    files = parse_list(args.gguf_type, "gguf_type") if args.gguf_type else []
    if files and args.quantize is None and args.weight_dtype is None:
        schemes = []  # only the files asked; --quantize none,... keeps float rows beside
    rows = sweep([str(config_of(m)) for m in parse_list(args.model, "model")],
                 devices=parse_list(args.device_spec or default_device_spec(dtype).name,
                                    "device_spec"),
                 mapping=mapping, dtype=dtype, io_model=args.io_model, execution=args.execution,
                 progress=not args.quiet,  # where stderr is a terminal (console.progress)
                 quantize=[None if q == "none" else q for q in schemes], gguf_types=files,
                 kv_dtypes=[None if k == "none" else k for k in parse_list(args.kv_dtype or "none",
                                                                             "kv_dtype")],
                 parallel=parallel_of(args), **pos)
    print(to_text(rows))
    if args.csv:
        atomic_write(args.csv, to_csv(rows))
    if args.markdown:
        atomic_write(args.markdown, to_text(rows, markdown=True) + "\n")
    if args.save_path:
        atomic_write(args.save_path, json.dumps(rows, indent=2, default=str) + "\n")
    if args.plot is not None:  # latency and J/token compared across devices
        for path in sweep_plots(plot_dir, rows):
            print(f"wrote {path}")
    if args.html is not None:  # the same, and the table, on one page (report/html.py)
        write_page(args.html, sweep_page(rows, f"perfcounter sweep {args.model}", HEAD, _cells))
        print(f"wrote {args.html}")
    return 0
