"""No flag silently ignored: a flag a command cannot honour in the run asked for is refused
on one line naming the flag and why, exit code 2, before any work (cli/flags.refuse on
the flags the Parser saw given, in any spelling, even at their default value); and
calibrate's figures are checked by flag name, with the range they take."""
import importlib.util
from pathlib import Path

import pytest
import torch

from perfcounter.cli.flags import given
from perfcounter.cli.main import build_parser, main
from perfcounter.generation.run import GenerateArgumentError

REPO = Path(__file__).resolve().parent.parent

GRAPH = ("--max_new_tokens: graph records one forward (the prefill, or with --phase decode one "
         "decode step after it) and generates no tokens")
SAVED = "{0}: --counts reads a saved count; {0} applies when --model is counted"


@pytest.mark.parametrize("argv, message", [
    (["graph", "--model", "smollm2-135m", "--max_new_tokens", "4"], GRAPH),
    (["graph", "--model", "smollm2-135m", "--max_new_tokens", "128"], GRAPH),  # its default
    (["profile", "--counts", "c.json", "--save_path", "{tmp}/p.json"],
     "--save_path: --counts reads a count already saved; nothing is counted to save"),
    (["profile", "--counts", "c.json", "--max_new_tokens", "4"], SAVED.format("--max_new_tokens")),
    (["profile", "--counts", "c.json", "--hf"], SAVED.format("--hf")),
    (["profile", "--model", "smollm2-135m", "--device_spec", "h100-sxm"],
     "--device_spec: profile's figures (FLOPs by kind, params, bytes) depend on no device; "
     "--device_spec prices only what --save_path writes"),
    (["simulate", "--counts", "c.json", "--batch_size", "2"],
     "--batch_size: --counts prices a saved count; --batch_size applies when a model is counted"),
    (["simulate", "--model", "smollm2-135m", "--default_device", "h100-sxm", "--device_spec",
      "a100-sxm4-80gb"], "--device_spec: --default_device already says where unmapped modules "
                         "run; give one of the two"),
    (["simulate", "--model", "smollm2-135m", "--save_mapping", "{tmp}/m.yaml"],
     "--save_mapping: --save_mapping goes with --search energy|latency"),
    (["simulate", "--model", "smollm2-135m", "--search", "energy", "--devices", "h100-sxm",
      "--allow_unmatched"], "--allow_unmatched: --search builds the mapping: it has no keys to "
                            "match"),
    (["calibrate", "--no_write", "--out", "{tmp}/c.yaml"], "--out: --no_write writes no file"),
    (["calibrate", "--array_mb", "-5"],
     "--array_mb -5: expected MiB per triad array, a number > 0"),
    (["calibrate", "--array_mb", "1e-9"],
     "--array_mb 1e-09: expected at least one byte (1e-6 MiB)"),  # 1e-9 * 2**20 B < 1 B
    (["calibrate", "--repeats", "0"], "--repeats 0: expected triad runs, a number > 0"),
    (["calibrate", "--min_time", "nan"],
     "--min_time nan: expected seconds of matmuls per dtype, a number > 0"),
    (["devices", "h100-sxm", "--type", "pim"],
     "--type: NAMEs are shown whatever their type; --type filters the list of every device"),
    (["devices", "--json", "--wide"], "--wide: --wide widens the table's source column; NAMEs "
                                      "and --json print no table"),
])
def test_a_flag_the_run_cannot_honour_is_refused(argv, message, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(argv=argv) == 2
    assert capsys.readouterr().err == f"perfcounter {argv[0]}: error: {message}\n"
    assert list(tmp_path.iterdir()) == []  # refused before any work: nothing written


def test_an_old_spelling_is_the_flag_it_stands_for(capsys):
    assert main(argv=["graph", "--model", "smollm2-135m", "--new_tokens", "4"]) == 2
    assert capsys.readouterr().err == ("perfcounter: note: --new_tokens is deprecated; use "
                                       f"--max_new_tokens\nperfcounter graph: error: {GRAPH}\n")


def test_the_parser_knows_which_flags_were_given():
    args = build_parser().parse_args(["graph", "--model", "m", "--max-new-tokens", "128"])
    assert given(args) == {"command", "model", "max_new_tokens"}
    assert (args.max_new_tokens, args.prompt_length, args.precision) == (128, 128, "auto")
    args = build_parser().parse_args(["sweep", "--model", "m"])
    assert args.prompt_length == "128" and "prompt_length" not in given(args)  # lists: text


def test_generate_py_refuses_the_flags_of_a_real_run_for_a_config_only_count(tmp_path):
    spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    parse = gen.build_parser().parse_args
    for flag, value in (("--num_samples", "3"), ("--no_memory_check", None)):
        argv = ["--model", "smollm2-135m", flag] + ([value] if value else [])
        with pytest.raises(GenerateArgumentError) as e:
            gen.keywords(parse(argv))
        assert str(e.value) == f"{flag}: {gen.CONFIG_ONLY[flag]}"
    torch.save({}, tmp_path / "model.pth")  # a checkpoint: a real run times its samples
    assert gen.keywords(parse(["--model", str(tmp_path / "model.pth"), "--num_samples", "3"]))[
        "num_samples"] == 3
