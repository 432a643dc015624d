"""One command-line vocabulary (perfcounter/cli/flags.py): generate.py and every command that
runs a model show the same shared flags with the same defaults in --help; a mistyped flag
or choice gets the nearest valid one; old spellings work with one note; every flag that
writes refuses a missing folder the same way, while parsing, and makes no folder."""
import contextlib
import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfcounter.cli import flags
from perfcounter.cli.main import build_parser, main

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)
COMMANDS = ["count", "profile", "op-bench", "graph", "simulate", "sweep", "serve"]
SHARED = ["--model", "--prompt_length", "--max_new_tokens", "--batch_size", "--precision",
          "--execution", "--compile", "--device_spec", "--quantize", "--weight_dtype",
          "--group_size", "--kv_dtype", "--save_path"]


def run_generate(*argv):
    return subprocess.run([sys.executable, "generate.py", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def helps():
    """--help of every command, and of generate.py (run as a script)."""
    texts = {}
    for command in COMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv=[command, "--help"]) == 0
        texts[command] = out.getvalue()
    run = run_generate("--help")
    assert run.returncode == 0, run.stderr
    texts["generate.py"] = run.stdout
    return texts


def entries(text: str) -> dict[str, str]:
    """{flag: its help entry, whitespace normalised} of an argparse --help text."""
    found, flag = {}, None
    for line in text.splitlines():
        m = re.match(r"  (--\w+)", line)
        if m:
            flag = m.group(1)
            found[flag] = line.strip()
        elif flag and line.startswith("    ") and line.strip():
            found[flag] += " " + line.strip()
        else:
            flag = None
    return {k: re.sub(r"\s+", " ", v) for k, v in found.items()}


def default(entry: str) -> str | None:
    m = re.search(r"\(default: (.*)\)$", entry)
    return m.group(1) if m else None


OWN_DEFAULTS = {  # a command whose default differs, as its --help says
    ("serve", "--execution"): "the engine's: cudagraphs on a GPU spec, eager elsewhere"}


def test_every_command_shows_the_same_shared_flags_and_defaults(helps):
    reference = entries(helps["count"])
    assert set(SHARED) <= set(reference)
    for command, text in helps.items():
        mine = entries(text)
        assert set(SHARED) <= set(mine), command
        for flag in SHARED:
            expected = OWN_DEFAULTS.get((command, flag), default(reference[flag]))
            assert default(mine[flag]) == expected, (command, flag)
    shown = {flag: default(reference[flag]) for flag in SHARED}
    assert shown["--prompt_length"] == shown["--max_new_tokens"] == "128"
    assert shown["--batch_size"] == "1" and shown["--precision"] == "auto"
    assert shown["--execution"] == "eager" and shown["--model"].startswith("none")
    for command, text in helps.items():  # old spellings work but are not advertised
        assert "--new_tokens" not in text and "--checkpoint_path" not in text, command


@pytest.mark.parametrize("command", COMMANDS)
def test_a_mistyped_flag_or_choice_gets_the_nearest(command, capsys):
    assert main(argv=[command, "--max_new_tokns", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfcounter {command}: error: unrecognized arguments: "
                          "--max_new_tokns 3; did you mean --max_new_tokens") and err.count("\n") == 1
    assert main(argv=[command, "--execution", "eagr"]) == 2
    assert "did you mean eager?" in capsys.readouterr().err
    assert main(argv=[command, "--precision", "bf61"]) == 2
    assert "did you mean bf16?" in capsys.readouterr().err


def parse_generate(*argv):
    """generate.py's parser, in this process: its exit status (0: parsed)."""
    try:
        gen.build_parser().parse_args([str(a) for a in argv])
    except SystemExit as exc:
        return exc.code
    return 0


def test_generate_py_suggests_too(capsys):
    assert parse_generate("--max_new_tokns", "3") == 2
    assert capsys.readouterr().err == ("generate.py: error: unrecognized arguments: "
                                       "--max_new_tokns 3; did you mean --max_new_tokens?\n")


def test_a_mistyped_command():
    assert main(argv=["cout"]) == 2


def test_spellings(capsys):
    parse = build_parser().parse_args
    args = parse(["count", "--config", "smollm2-135m", "--new_tokens", "3", "--act_dtype", "fp16"])
    assert (args.model, args.max_new_tokens, args.precision) == ("smollm2-135m", 3, "float16")
    assert capsys.readouterr().err.splitlines() == [
        "perfcounter: note: --config is deprecated; use --model",
        "perfcounter: note: --new_tokens is deprecated; use --max_new_tokens",
        "perfcounter: note: --act_dtype is deprecated; use --precision"]
    args = parse(["sweep", "--max-new-tokens", "2,3", "--prompt-length=5", "--precision", "BF16"])
    assert (args.max_new_tokens, args.prompt_length, args.precision) == ("2,3", "5", "bfloat16")
    args = parse(["calibrate", "--array-mb", "1", "--matmul_n", "8", "--no-write"])
    assert (args.array_mb, args.matmul_n, args.no_write) == (1.0, 8, True)
    args = parse(["simulate", "--checkpoint_path", "ckpt"])
    assert (args.checkpoint_path, parse(["serve", "--compile"]).execution) == ("ckpt", "compiled")
    assert capsys.readouterr().err == ("perfcounter: note: --checkpoint_path is deprecated; "
                                       "use --model\n")


def _writers(tmp: Path):
    """(argv, flag) for every flag that writes, in every command that has it."""
    model = ["--model", "smollm2-135m"]
    cases = [(["count", *model], f) for f in ("--save_path", "--plot", "--trace")]
    cases += [(["profile", *model], "--save_path"), (["op-bench", *model], "--save_path")]
    cases += [(["graph", *model], f) for f in ("--save_path", "--out")]
    cases += [(["simulate", *model], f) for f in ("--save_path", "--plot", "--trace",
                                                  "--save_mapping", "--save_counts")]
    cases += [(["sweep", *model], f) for f in ("--save_path", "--csv", "--markdown", "--plot")]
    cases += [(["serve", *model, "--qps", "1"], f) for f in ("--save_path", "--csv", "--trace",
                                                            "--plot")]
    cases += [(["calibrate"], "--out")]
    return cases


def test_every_writing_flag_refuses_a_missing_folder_the_same_way(tmp_path, capsys):
    missing = tmp_path / "missing"
    target = missing / "out.x"
    for argv, flag in _writers(tmp_path):
        assert main(argv=[*argv, flag, str(target)]) == 2, (argv, flag)
        err = capsys.readouterr().err
        assert err == (f"perfcounter {argv[0]}: error: {flag} {target}: folder {missing} does "
                       "not exist\n"), (argv, flag)
    assert not missing.exists()  # no folder made for a refused run


@pytest.mark.parametrize("flag", ["--save_path", "--plot", "--trace"])
def test_generate_py_refuses_a_missing_folder_the_same_way(flag, tmp_path, capsys):
    target = tmp_path / "missing" / "out.x"
    assert parse_generate("--model", "smollm2-135m", flag, target) == 2
    assert capsys.readouterr().err == (f"generate.py: error: {flag} {target}: folder "
                                       f"{target.parent} does not exist\n")
    assert not target.parent.exists()


def test_generate_keywords(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    parse = gen.build_parser().parse_args
    kw = flags.generate_keywords(parse(["--model", str(tmp_path), "--compile"]))
    assert (kw["config"], kw["model"], kw["checkpoint_path"]) == (tmp_path, None, None)
    assert kw["compile"] and kw["execution"] == "compiled" and kw["prompt_length"] == 128
    (tmp_path / "model.pth").write_bytes(b"PK\x03\x04")  # how torch.save's zip begins
    kw = flags.generate_keywords(parse(["--model", str(tmp_path / "model.pth"), "--prompt", "Hi"]))
    assert (kw["checkpoint_path"], kw["prompt"], kw["prompt_length"]) == (
        tmp_path / "model.pth", "Hi", None)  # a text prompt replaces the synthetic one
    kw = flags.generate_keywords(parse(["--model", "llama-2-7b"]))
    assert (kw["model"], kw["config"], kw["checkpoint_path"], kw["compile"]) == (
        "llama-2-7b", None, None, False)


def test_model_source(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert flags.model_source("llama-2-7b") == "preset"
    assert flags.model_source(tmp_path / "config.json") == "config"
    assert flags.model_source(tmp_path) == "config"
    (tmp_path / "model.safetensors").write_bytes(b"\x02" + bytes(7) + b"{}")  # 2 B of JSON
    assert flags.model_source(tmp_path) == "checkpoint"
    assert flags.config_of(tmp_path / "model.safetensors") == tmp_path  # its config.json
    with pytest.raises(ValueError, match="--model nope/config.json: no such file or folder"):
        flags.model_source("nope/config.json")


@pytest.mark.parametrize("command", ["op-bench", "graph"])
def test_an_execution_a_command_does_not_price_is_refused(command, capsys):
    assert main(argv=[command, "--model", "smollm2-135m", "--compile"]) == 2
    assert capsys.readouterr().err == (
        f"perfcounter {command}: error: --compile (compiled): perfcounter {command} prices eager "
        "runs only (it times or records ops one by one); the other commands price eager, "
        "compiled, cudagraphs\n")
    for other in ("count", "profile", "simulate", "sweep"):  # each prediction in the regime
        args = build_parser().parse_args([other, "--execution", "cudagraphs"])
        assert args.execution == "cudagraphs"
    args = build_parser().parse_args(["serve", "--execution", "cudagraphs"])
    assert args.execution == "cudagraphs"
    assert gen.build_parser().parse_args(["--compile"]).execution == "compiled"
