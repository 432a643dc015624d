"""`perfcounter graph`: the module graph and the op graph of one forward of a model known
by its config (no weights, FakeTensorMode), exported as text, JSON and Graphviz DOT.

    perfcounter graph --model llama-2-7b --hf --prompt_length 8 --out llama2
        # llama2_module.txt / .json / .dot and llama2_op.txt / .json / .dot
    perfcounter graph --model path/to/config.json --phase decode --level module

`record_config` builds the model as `perfcounter count` does (config_only.py:
transformers' class for a transformers config or with --hf, else perfcounter's
gpt-fast model) and records ONE forward with graph.record_forward: the prefill
of a synthetic prompt, or (--phase decode) one decode step after an unrecorded
prefill has filled the KV cache. Times are predicted on --device_spec (default:
this machine's, see devices.default_device_spec); measured times need real
tensors: call graph.record_forward on a loaded model. `cli/main.py` registers
`add_parser`; errors are ValueErrors (one line, exit 2).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from perfcounter._util import atomic_write
from perfcounter.cli.flags import (PRECISIONS, add_model_flags, add_output, check_output,
                                   config_of, precision_of, refuse)
from perfcounter.devices import default_device_spec, get_device_spec
from perfcounter.generation.config_only import (context_error, fake_hf_model, hf_config,
                                                resolve_config)
from perfcounter.models.args import ModelArgs
from perfcounter.models.loading import fake_model
from perfcounter.models.tokenizer import cache_keyword
from perfcounter.quant import quantize as quantization
from perfcounter.quant.gguf_types import FILE_TYPES, annotate_file_type, check_gguf_type
from perfcounter.report.graph import Recording, module_graph, op_graph, record_forward

FORMATS = ("txt", "json", "dot")
LEVELS = ("module", "op", "both")


def record_config(config, *, batch_size: int = 1, prompt_length: int = 8,
                  phase: str = "prefill", dtype=torch.bfloat16, hf: bool = False,
                  depth: int = 10, weights=None, kv=None, gguf_type=None) -> Recording:
    """One recorded forward of the model for `config` (what count_config takes), no weights;
    weights, kv: our model's linears and KV cache quantized (quantize.WeightScheme, "int8");
    gguf_type: our model's weights as stored in a llama.cpp file of that type ("Q4_K_M";
    quant/gguf_types.py)."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase {phase!r}; expected prefill or decode")
    if min(batch_size, prompt_length) < 1:
        raise ValueError(f"batch_size and prompt_length must be >= 1, got {batch_size}, "
                         f"{prompt_length}")
    resolved = resolve_config(config)
    ours = isinstance(resolved, ModelArgs) and not hf
    if isinstance(resolved, ModelArgs) and hf:
        resolved = hf_config(resolved)
    if (weights is not None or kv is not None) and not ours:
        raise ValueError("--quantize, --weight_dtype and --kv_dtype price perfcounter's model: "
                         "give a preset or our config.json, without --hf")
    if gguf_type is not None:  # refused before any work: hf, beside --quantize, MoE, misfits
        gguf_type = check_gguf_type(resolved, gguf_type, hf=hf, quantize=weights)
    too_long = context_error(resolved, prompt_length, 1)  # the prompt and the decode token
    if too_long:
        raise ValueError(too_long)
    model, fake_mode = fake_model(resolved, dtype=dtype, weights=weights, kv=kv) if ours else \
        fake_hf_model(resolved, dtype=dtype)
    if gguf_type is not None:
        annotate_file_type(model, resolved, gguf_type)
    with fake_mode, torch.no_grad():
        prompt = torch.zeros(batch_size, prompt_length, dtype=torch.int64)
        token = torch.zeros(batch_size, 1, dtype=torch.int64)
        if ours:
            model.setup_caches(max_batch_size=batch_size, max_seq_length=prompt_length + 1)
            positions = torch.arange(prompt_length)
            if phase == "prefill":
                return record_forward(model, prompt, positions, depth=depth)
            model(prompt, positions)
            return record_forward(model, token, torch.tensor([prompt_length]), depth=depth)
        if phase == "prefill":
            return record_forward(model, input_ids=prompt, use_cache=True, depth=depth)
        key = cache_keyword(model)
        cache = getattr(model(input_ids=prompt, use_cache=True), key)
        return record_forward(model, input_ids=token, use_cache=True, depth=depth, **{key: cache})


def _files(base: str, levels: list[str], formats: list[str]) -> list[tuple[str, str, Path]]:
    return [(level, fmt, Path(f"{base}_{level}.{fmt}")) for level in levels for fmt in formats]


def run(args) -> int:
    refuse(args, {"--max_new_tokens": "graph records one forward (the prefill, or with --phase "
                  "decode one decode step after it) and generates no tokens"})
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"--format {args.format!r}: expected a comma-separated list of "
                         f"{', '.join(FORMATS)}")
    levels = ["module", "op"] if args.level == "both" else [args.level]
    files = _files(args.out, levels, formats) if args.out else []
    for _, _, path in files:  # fail before counting, not after (--out BASE itself was checked)
        check_output(path, "--out")
    args.precision = precision_of(args.precision)  # no weights run: auto is bfloat16
    dtype = PRECISIONS[args.precision]
    spec = get_device_spec(args.device_spec, dtype=dtype) if args.device_spec else None
    try:
        rec = record_config(config_of(args.model), batch_size=args.batch_size,
                            prompt_length=args.prompt_length, phase=args.phase, dtype=dtype,
                            hf=args.hf, depth=args.depth,
                            weights=quantization.resolve_scheme(args.quantize, args.weight_dtype,
                                                                args.group_size),
                            kv=quantization.parse_kv_dtype(args.kv_dtype),
                            gguf_type=args.gguf_type)
    except (KeyError, OSError) as exc:  # an unknown preset, a missing file: one line
        raise ValueError(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)) from None
    spec = spec or default_device_spec(dtype)  # after the input's checks: an error comes alone
    graphs = {level: (module_graph if level == "module" else op_graph)(rec, spec)
              for level in levels}
    print(f"{args.model}: one {args.phase} forward, batch {args.batch_size}, prompt "
          f"{args.prompt_length} tokens, {args.precision}, no weights (FakeTensorMode)")
    if not files:
        for level in levels:
            print(graphs[level].to_text())
    for level, fmt, path in files:
        g = graphs[level]
        text = {"txt": g.to_text, "dot": g.to_dot}.get(fmt)
        if text is None:
            g.to_json(path)
        else:
            atomic_write(path, text())
        print(f"wrote {path}")
    if args.save_path is not None:  # both graphs in one JSON document
        atomic_write(args.save_path, json.dumps({level: g.to_dict() for level, g in graphs.items()},
                                                indent=2) + "\n")
        print(f"wrote {args.save_path}")
    for level in levels:
        s = graphs[level].stats()
        print(f"{level} graph: {s['nodes']} nodes, {s['edges']} edges")
    return 0


def add_parser(sub) -> None:
    """Register `perfcounter graph` on the command's subparsers."""
    p = sub.add_parser("graph", help="module and op graphs of one forward (EdgeShard style): "
                       "text, JSON, DOT", description=__doc__.split("\n\n")[0])
    add_model_flags(p, executions=("eager",))  # predicted_s: an eager run
    p.add_argument("--hf", action="store_true", help="transformers' model for a preset too")
    p.add_argument("--phase", default="prefill", choices=["prefill", "decode"],
                   help="the forward recorded: the prefill, or one decode step after it "
                        "(one forward is recorded: --max_new_tokens is refused)")
    p.add_argument("--depth", type=int, default=10, help="module depth the counter tracks")
    p.add_argument("--gguf_type", default=None, help="a preset's weights as stored in a llama.cpp "
                   f"GGUF of this file type: {', '.join(FILE_TYPES)} (quant/gguf_types.py)")
    p.add_argument("--level", default="both", choices=list(LEVELS),
                   help="module graph, op graph, or both")
    p.add_argument("--format", default="txt,json,dot",
                   help="comma-separated: txt (EdgeShard's text), json, dot")
    add_output(p, "--out", metavar="BASE",
               help="base path: writes BASE_module.txt, BASE_op.json, ... (default: print "
                    "the text to stdout)")
    p.set_defaults(run=run)
