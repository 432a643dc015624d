"""What --model names (cli/model_flag.py), and the one line a path that is not what it says
gets: what was wrong, and what --model takes; the scripts take --model too, their old
spelling kept for one release with one note (cli/flags.py's add_deprecated, checkpoint_of)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perfcounter.cli.flags import Parser, add_deprecated, checkpoint_of
from perfcounter.cli.main import main
from perfcounter.cli.model_flag import config_of, model_source

REPO = Path(__file__).resolve().parent.parent
TAKES = ("--model takes a preset name, a config.json, a model folder, or a .gguf, .pth or "
         ".safetensors file")


def _count(model, capsys) -> str:
    assert main(argv=["count", "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line
    return err


def test_a_missing_checkpoint_says_what_model_takes(tmp_path, capsys):
    assert _count(tmp_path / "x.pth", capsys) == (
        f"perfcounter count: error: --model {tmp_path / 'x.pth'}: no such file or folder; "
        f"{TAKES}\n")


@pytest.mark.parametrize("name, kind", [
    ("x.pth", "a torch checkpoint (torch.save: a zip or a pickle)"),
    ("x.safetensors", "a safetensors file (a JSON header)"),
    ("x.gguf", "a GGUF file (magic 'GGUF')")])
def test_a_file_that_is_no_checkpoint_is_named_so(name, kind, tmp_path, capsys):
    (tmp_path / name).write_text("not weights\n")
    assert _count(tmp_path / name, capsys) == (
        f"perfcounter count: error: --model {tmp_path / name}: not a checkpoint: its first "
        f"bytes are not those of {kind}; {TAKES}\n")


def test_real_checkpoints_are_checkpoints(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pth")
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file  # deferred: an optional package
    save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert [model_source(tmp_path / n) for n in ("model.pth", "model.safetensors", "m.gguf")] \
        == ["checkpoint"] * 3


def test_weights_without_a_config_say_what_counting_needs(tmp_path, capsys):
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pth")
    err = _count(tmp_path / "model.pth", capsys)
    assert err == (f"perfcounter count: error: --model {tmp_path / 'model.pth'}: counting needs "
                   f"the model's config, and these weights have none: no config.json in "
                   f"{tmp_path}, and the folder's name {tmp_path.name!r} is no preset; give "
                   "--model PRESET|config.json, or put the config.json beside the weights\n")
    gpt_fast = tmp_path / "smollm2-135m"  # gpt-fast names a checkpoint's folder by its model
    gpt_fast.mkdir()
    torch.save({"w": torch.zeros(2)}, gpt_fast / "model.pth")
    assert config_of(gpt_fast / "model.pth") == "smollm2-135m"


def _parser():
    p = Parser(prog="script")
    p.add_argument("--model", default=None)
    p.add_argument("--model_name", default=None)
    add_deprecated(p, "--checkpoint_path", "--model", default=None)
    return p


@pytest.mark.parametrize("argv, checkpoint, model_name", [
    (["--model", "ckpt"], "ckpt", None),
    (["--checkpoint_path", "ckpt"], "ckpt", None),
    (["--checkpoint_path", "ckpt", "--model", "llama-2-7b"], "ckpt", "llama-2-7b"),  # old
])
def test_checkpoint_of(argv, checkpoint, model_name, capsys):
    p = _parser()
    values = vars(p.parse_args(argv))
    assert checkpoint_of(p, values, "checkpoint_path") == checkpoint
    assert values == {"model_name": model_name}
    note = "perfcounter: note: --checkpoint_path is deprecated; use --model\n"
    assert capsys.readouterr().err == (note if "--checkpoint_path" in argv else "")


@pytest.mark.slow  # over ~2 s here (three interpreters each): -m 'not slow' skips it
@pytest.mark.parametrize("script", ["quantize.py", "convert_hf_checkpoint.py"])
def test_the_scripts_take_model(script, tmp_path):
    old = "--checkpoint_path" if script == "quantize.py" else "--checkpoint_dir"
    extra = ["--out_dir", str(tmp_path)] if script != "quantize.py" else []
    for flag in ("--model", old):
        run = subprocess.run([sys.executable, str(REPO / "scripts" / script), flag,
                              str(tmp_path / "missing"), *extra], capture_output=True, text=True)
        note = f"perfcounter: note: {old} is deprecated; use --model\n" if flag == old else ""
        assert run.returncode == 2
        missing = f"{script}: error: {tmp_path / 'missing'}: no such file or folder\n"
        assert run.stderr == note + missing
    run = subprocess.run([sys.executable, str(REPO / "scripts" / script), *extra],
                         capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (2, f"{script}: error: --model is required: the "
                                               "checkpoint to read\n")
