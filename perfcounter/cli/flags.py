"""The command line's one vocabulary: the model and run flags that generate.py and every
`perfcounter` command running a model share, the parser they are read with, and the one
rule for flags that write a file.

    parser = Parser(prog="perfcounter count")
    add_model_flags(parser)                      # --model, --max_new_tokens, ... --save_path
    add_output(parser, "--trace", help="...")    # checked while parsing, before any work
    args = parser.parse_args(argv)
    dtype = PRECISIONS[args.precision]

Shared flags and their defaults, the same in every command (`--help` shows them):

    --model           none: generate.py runs its built-in SmolLM2-135M-Instruct, the others
                      ask for one. A preset name, a config.json, a model folder, a .gguf,
                      .pth or .safetensors file (`model_source` says which).
    --prompt_length   128 tokens: a prompt long enough that prefill is a matrix-matrix
                      product on every device (past the ridge of most), short enough to count
                      in seconds; the length vLLM's and gpt-fast's short benchmarks use.
    --max_new_tokens  128: enough decode steps that the KV cache grows visibly, as many as
                      the prompt, so that prefill and decode weigh alike in a report.
    --batch_size      1: one user, the latency case.
    --precision       auto: bfloat16 (what checkpoints ship and GPUs run), except for weights
                      that run on a CPU, whose bfloat16 matmuls are slow: float32 there
                      (`precision_of`); bf16, fp16, fp32 and the long names are accepted
                      (--act_dtype is its old name).
    --execution       eager (serve: the engine's, cudagraphs on a GPU spec, eager elsewhere):
                      the program a prediction prices; --compile means compiled.
    --device_spec     none: this machine's, the spec `perfcounter calibrate` wrote, else
                      the detected GPU or generic-cpu (devices.default_device_spec); a
                      generate.py run timed on a CPU without one measures this machine first
                      (devices/this_machine.py).
    --quantize, --weight_dtype, --group_size, --kv_dtype
                      none: weights and KV cache at --precision.
    --save_path       none: results are printed, not written.

Spellings: snake_case; a kebab-case spelling (--max-new-tokens) is the same flag. Old
spellings (--config, --checkpoint_path, --new_tokens, --act_dtype) still work for one
release, with one line on stderr naming the new one. An unknown flag or choice is answered
with the nearest valid ones (_util.did_you_mean), on one line, exit code 2.

A flag a run cannot honour (graph's --max_new_tokens, profile --counts with --save_path) is
refused, never ignored: one line naming it and why, exit code 2, before any work (`refuse`,
on the flags the Parser saw `given`, in any spelling, even at their default).

Flags that write (`add_output`: --save_path, --csv, --markdown, --out, --trace, --plot, --html,
calibrate's --out) are checked as they are parsed, with _util.check_writable_target: a
missing folder, a folder that cannot be written or a target that is no regular file is
refused in one line, exit code 2, before any counting (so is --html without matplotlib); no
folder is made for a refused run (a --plot folder is made when the pictures are written).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import torch

from perfcounter._util import check_writable_target, did_you_mean
from perfcounter.cli.model_flag import ACCEPTED, config_of, model_source  # noqa: F401 config_of
from perfcounter.devices.op_keys import EXECUTIONS
from perfcounter.generation.run import GenerateArgumentError
from perfcounter.parallel import ParallelConfig

PRECISIONS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PRECISION_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16",
                     "fp32": "float32", "float": "float32"}
_UNSET = object()  # a dest no flag has set yet (Parser.parse_known_args: `given`)
_ACCUMULATE = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction,
               argparse._ExtendAction)  # actions that add to a dest's value (append, count)
DEFAULTS = dict(model=None, prompt_length=128, max_new_tokens=128, batch_size=1,
                precision="auto", execution="eager", device_spec=None, quantize=None,
                weight_dtype=None, group_size=None, kv_dtype=None, save_path=None)
MODEL_HELP = (ACCEPTED, " (default: none; generate.py runs its built-in SmolLM2-135M-Instruct)")
DEVICE_HELP = ("registry name or YAML path to price on", " (default: this machine's: the spec "
               "`perfcounter calibrate` wrote, else the detected GPU or generic-cpu; a "
               "run timed on a CPU without one: this machine, measured first)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, less defaults that say nothing (None, False) or stated."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def note(old: str, new: str) -> None:
    """The one line an old spelling prints."""
    print(f"perfcounter: note: {old} is deprecated; use {new}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that shows defaults, takes kebab-case spellings of its snake_case
    flags, answers an unknown flag or choice with the nearest valid ones and reports every
    error on one line (exit code 2)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def _flags(self, hidden: bool = True) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings
                if hidden or action.help != argparse.SUPPRESS]

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        known = set(self._flags())
        for i, arg in enumerate(args):
            if arg == "--":
                break
            name, eq, value = arg.partition("=")
            snake = "--" + name[2:].replace("-", "_")
            if name.startswith("--") and name not in known and snake in known:
                args[i] = snake + eq + value
        namespace = argparse.Namespace() if namespace is None else namespace
        defaults = {}  # dest -> the action whose default it takes, for the dests this parse fills
        for a in self._actions:
            if a.dest != argparse.SUPPRESS and not hasattr(namespace, a.dest) \
                    and not isinstance(a, _ACCUMULATE):  # those read their current value
                if a.dest not in defaults or defaults[a.dest].default is argparse.SUPPRESS:
                    defaults[a.dest] = a  # argparse's: the first default that is not SUPPRESS
        for dest in defaults:  # argparse leaves a present attribute alone
            setattr(namespace, dest, _UNSET)
        parsed, extras = super().parse_known_args(args, namespace)
        given = set(getattr(parsed, "_given", ()))
        given |= {a.dest for a in self._actions if isinstance(a, _ACCUMULATE)
                  and getattr(parsed, a.dest, a.default) is not a.default}  # a new list, count
        for dest, a in defaults.items():
            if getattr(parsed, dest) is not _UNSET:
                given.add(dest)
            elif a.default is argparse.SUPPRESS:
                delattr(parsed, dest)
            else:
                typed = isinstance(a.default, str) and callable(a.type)
                setattr(parsed, dest, a.type(a.default) if typed else a.default)
        parsed._given = frozenset(given)
        unknown = [a.split("=")[0] for a in extras if a.startswith("-") and len(a) > 1]
        if unknown and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       f"{did_you_mean(unknown[0], self._flags(hidden=False))}")
        return parsed, extras

    def parse_args(self, args=None, namespace=None) -> Args:
        parsed = super().parse_args(args, namespace)
        given = vars(parsed).pop("_given", frozenset())  # a subcommand's parse sets it too
        out = Args(**vars(parsed))
        out.given_dests = given
        return out

    def error(self, message: str):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        self.exit(2, f"{self.prog}: error: {message}\n")


class Args(argparse.Namespace):
    """Parser.parse_args' result: the flags' values (vars() shows those) and the flags given."""

    __slots__ = ("given_dests",)


def given(args) -> frozenset:
    """The dests of the flags given on the command line (a Parser's parse; any spelling)."""
    return getattr(args, "given_dests", frozenset())


def refuse(args, why: dict, error=ValueError) -> None:
    """A flag the command cannot honour here, {"--flag": why}: refused when it was given,
    an `error` on one line (exit code 2) naming the flag and why, before any work."""
    for flag, reason in why.items():
        if flag.removeprefix("--") in given(args):
            raise error(f"{flag}: {reason}")


class _Deprecated(argparse.Action):
    """An old spelling: one note on stderr, then the value lands where the new flag's does
    (`const`: the value a flag without argument stands for)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        note(option_string, self.new)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_deprecated(group, old: str, new: str, **kwargs):
    """`old`, an old spelling of `new`: it works for one release, with one note on stderr
    (kwargs: add_argument's, dest, type, default, ...; its help is suppressed)."""
    return group.add_argument(old, action=_Deprecated, new=new, **kwargs)


def checkpoint_of(parser, values: dict, old: str):
    """A script's checkpoint: --model, or its old spelling (dest `old`), both popped from
    `values`; given both, --model keeps its old meaning there, the preset giving a model.pth's
    config (values["model_name"]), as generate.py's --checkpoint_path does. Neither: one
    line, exit code 2."""
    model, checkpoint = values.pop("model"), values.pop(old)
    if checkpoint is None:
        checkpoint, model = model, None
    if checkpoint is None:
        parser.error("--model is required: the checkpoint to read")
    if model is not None:
        values["model_name"] = values.get("model_name") or str(model)
    return checkpoint


class _Precision(argparse.Action):
    """--precision: bf16, fp16, fp32 or the long names, stored as the long name."""

    def __call__(self, parser, namespace, values, option_string=None):
        name = PRECISION_ALIASES.get(str(values).strip().lower(), str(values).strip().lower())
        if name not in PRECISIONS and name != "auto":
            parser.error(f"{option_string} {values!r}: expected one of "
                         f"auto, {', '.join(PRECISIONS)} (or {', '.join(PRECISION_ALIASES)})"
                         f"{did_you_mean(values, [*PRECISIONS, *PRECISION_ALIASES])}")
        if option_string != "--precision":
            note(option_string, "--precision")
        setattr(namespace, self.dest, name)


class _Execution(argparse.Action):
    """--execution (or --compile, which stands for `const`): one of EXECUTIONS that the
    command prices (`priced`); another is refused in one line, never ignored."""

    def __init__(self, option_strings, dest, priced=EXECUTIONS, **kwargs):
        self.priced = priced
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if self.nargs == 0 else values
        if value not in self.priced:
            parser.error(f"{option_string} ({value}): {parser.prog} prices "
                         f"{', '.join(self.priced)} runs only (it times or records ops one by "
                         f"one); the other commands price {', '.join(EXECUTIONS)}")
        setattr(namespace, self.dest, value)


def precision_of(name: str, runs_on: str | None = None) -> str:
    """The precision --precision NAME means: auto is bfloat16, float32 for weights that run
    on a CPU (runs_on="cpu": a real run there); the others are themselves."""
    if name != "auto":
        return name
    return "float32" if runs_on is not None and "cpu" in str(runs_on) else "bfloat16"


def check_output(path, flag: str, folder: bool = False) -> Path:
    """`path` (a file, or with folder=True a folder the command fills) checked for writing;
    a ValueError naming the flag, on one line, otherwise (an empty path too: not '.')."""
    if not str(path).strip():
        raise ValueError(f"{flag} {str(path)!r}: expected a path, got an empty one")
    path = Path(path).expanduser()
    try:
        if folder and path.is_dir():
            if not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(f"cannot write {path}: folder {path} is not writable")
        elif folder and path.exists():
            raise NotADirectoryError(f"cannot write {path}: not a directory")
        else:
            check_writable_target(path)
    except OSError as exc:  # the reason, after check_writable_target's "cannot write X: "
        raise ValueError(f"{flag} {path}: {str(exc).split(': ', 1)[-1]}") from None
    return path


class _Output(argparse.Action):
    """A flag that writes: checked as it is parsed (check_output, then `needs()`, if given)."""

    def __init__(self, option_strings, dest, folder: bool = False, needs=None, **kwargs):
        self.folder, self.needs = folder, needs
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, check_output(values, option_string, self.folder))
            if self.needs is not None:
                self.needs()
        except ValueError as exc:
            parser.error(str(exc))


def add_output(group, flag: str, *, folder: bool = False, **kwargs):
    """A flag that writes a file (or, folder=True, fills a folder), checked while parsing
    (needs=: a check of what else it needs, e.g. --html's matplotlib: report/html.py)."""
    kwargs.setdefault("metavar", "DIR" if folder else "FILE")
    return group.add_argument(flag, action=_Output, folder=folder, default=None, **kwargs)


def add_model_flags(parser, *, lists: bool = False, lengths: str = "tokens",
                    device_list: bool = False, legacy_paths: bool = False,
                    executions: tuple = EXECUTIONS, parallel: bool = False,
                    execution_default: str | None = None) -> None:
    """The shared group on `parser` (a Parser or a subcommand's). lists: --model,
    --batch_size, --prompt_length, --max_new_tokens, --device_spec, --quantize and --kv_dtype
    take comma-separated lists (sweep); lengths="distributions": the lengths may also be
    uniform:LO-HI or normal:MEAN,STD (serve); device_list: --device_spec alone takes a list
    (serve's deployments to compare). legacy_paths: --config and --checkpoint_path
    keep dests of their own (generate.py and simulate gave them meanings beside --model).
    executions: the --execution values it prices (others are refused), execution_default the
    default --help states (serve's: the engine's). parallel: add_parallel_flags too."""
    g = parser.add_argument_group("model and run (shared by every command)")
    many = " (comma-separated list)" if lists else ""
    number = str if lists or lengths != "tokens" else int
    shape = "; or uniform:LO-HI, normal:MEAN,STD" if lengths != "tokens" else many
    g.add_argument("--model", default=DEFAULTS["model"], help=many.join(MODEL_HELP))
    g.add_argument("--prompt_length", type=number, default=number(DEFAULTS["prompt_length"]),
                   help="prompt tokens (synthetic ids)" + shape)
    g.add_argument("--max_new_tokens", type=number, default=number(DEFAULTS["max_new_tokens"]),
                   help="tokens generated: the first by prefill, the rest by decode steps" + shape)
    g.add_argument("--batch_size", type=number, default=number(DEFAULTS["batch_size"]),
                   help="sequences generated together" + many)
    g.add_argument("--precision", action=_Precision, default=DEFAULTS["precision"],
                   help=f"the weights' and activations' dtype: {', '.join(PRECISIONS)} (or "
                        f"{', '.join(PRECISION_ALIASES)}); auto: bfloat16, float32 for weights "
                        "that run on a CPU")
    g.add_argument("--execution", default=DEFAULTS["execution"],
                   choices=tuple(dict.fromkeys((*EXECUTIONS, *executions))),
                   action=_Execution, priced=executions, help="the program a prediction "
                   "prices" + (f" (default: {execution_default})" if execution_default else ""))
    g.add_argument("--compile", dest="execution", action=_Execution, priced=executions, nargs=0,
                   const="compiled", help="--execution compiled")
    g.add_argument("--device_spec", default=DEFAULTS["device_spec"],
                   help=(many or " (comma-separated list)" * device_list).join(DEVICE_HELP))
    g.add_argument("--quantize", default=DEFAULTS["quantize"], help="weights of every linear "
                   "as int8, int4 or int4-G (G = 32, 64, 128, 256): bytes as stored, FLOPs at "
                   "--precision; or fp8 (W8A8: fp8 weights and activations, FLOPs at fp8)"
                   + many + " (default: none)")
    g.add_argument("--weight_dtype", default=DEFAULTS["weight_dtype"], help="what-if weights: "
                   "int8, int4 (with --group_size) or a float dtype (default: none)")
    g.add_argument("--group_size", type=int, default=DEFAULTS["group_size"],
                   help="int4 group: 32, 64, 128, 256 (default: 128)")
    g.add_argument("--kv_dtype", default=DEFAULTS["kv_dtype"], help="KV cache int8 or fp8, a "
                   "scale per token and head" + many + " (default: --precision)")
    add_output(g, "--save_path", help="write the results as JSON (default: none, printed only)")
    add_deprecated(g, "--new_tokens", "--max_new_tokens", dest="max_new_tokens", type=number)
    g.add_argument("--act_dtype", dest="precision", action=_Precision, help=argparse.SUPPRESS)
    for old in ("--config", "--checkpoint_path"):
        add_deprecated(g, old, "--model", dest=old[2:] if legacy_paths else "model",
                       default=None if legacy_paths else argparse.SUPPRESS)
    if parallel:
        add_parallel_flags(parser)


PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
            "enable_expert_parallel")


def add_parallel_flags(parser) -> None:
    """vLLM's parallel flags (perfcounter/parallel): one rank of the sharded model is counted
    and priced; the sizes are checked before any work (one line, exit code 2)."""
    g = parser.add_argument_group("parallelism (vLLM's flags; perfcounter/parallel)")
    for name, short, what in (
            ("tensor", "--tp", "GPUs each layer is split over (column/row-parallel linears)"),
            ("pipeline", "--pp", "pipeline stages, each holding consecutive layers"),
            ("data", "--dp", "replicas of the model, each serving its share of the requests")):
        g.add_argument(f"--{name}_parallel_size", short, type=int, default=1, help=what)
    g.add_argument("--enable_expert_parallel", action="store_true",
                   help="a mixture of experts' experts split over the TP x DP ranks")


def parallel_of(args) -> ParallelConfig:
    """The ParallelConfig of add_parallel_flags' flags (checked: ParallelError)."""
    return ParallelConfig(*(getattr(args, name) for name in PARALLEL))


def generate_keywords(args) -> dict:
    """generate.py's flags as its `main`'s keywords: --model sorted into a checkpoint (a real
    run), a config or a preset (config only); the old --checkpoint_path keeps --model and
    --config as its config; --prompt TEXT replaces the synthetic --prompt_length prompt;
    --execution other than eager times a compiled run."""
    kw = dict(vars(args))
    model, checkpoint, config = kw.pop("model"), kw.pop("checkpoint_path"), kw.pop("config")
    if model is not None and checkpoint is None and config is None:
        try:
            kind = model_source(model)
        except ValueError as e:
            raise GenerateArgumentError(str(e)) from None
        if kind == "checkpoint":
            checkpoint, model = model, None
        elif kind == "config":
            config, model = model, None
    if kw["precision"] == "auto":
        kw["precision"] = None  # main's own: float32 for a real run on a CPU, else bfloat16
    kw.update(model=model, checkpoint_path=checkpoint and Path(checkpoint),
              config=config and Path(config), compile=kw["execution"] != "eager")
    if "tensor_parallel_size" in kw:  # vLLM's parallel flags (ParallelConfig's, in order)
        kw["parallel"] = tuple(kw.pop(name) for name in PARALLEL)  # checked by check_options
    if kw["prompt"] is None:
        del kw["prompt"]  # main's own text, unused: the prompt is --prompt_length tokens
    else:
        kw["prompt_length"] = None
    return kw
