"""What a --model names (a preset, a config, a checkpoint) and the config a config-only
command counts for it; a path that is not what it says is refused in one line that says
what --model takes (ValueError: the commands print it, exit code 2).

    model_source("llama-3-8b")             # "preset" (ours, or transformers': "qwen3-8b")
    model_source("ckpt/model.safetensors")  # "checkpoint" (its first bytes checked)
    config_of("ckpt/model.safetensors")     # ckpt/, the folder holding its config.json
"""
from __future__ import annotations

from pathlib import Path

from perfcounter.models import hf_presets
from perfcounter.models.args import ModelArgs, UnknownModelError

CHECKPOINT_SUFFIXES = (".gguf", ".pth", ".pt", ".safetensors", ".bin")
ACCEPTED = "a preset name, a config.json, a model folder, or a .gguf, .pth or .safetensors file"
ACCEPTS = "--model takes " + ACCEPTED




def _not_checkpoint(path: Path) -> str | None:
    """What a checkpoint file with `path`'s suffix begins with, when `path` does not."""
    with open(path, "rb") as f:
        head = f.read(9)
    if path.suffix == ".gguf":
        return None if head[:4] == b"GGUF" else "a GGUF file (magic 'GGUF')"
    if path.suffix == ".safetensors":  # 8 bytes of header length, then its JSON
        return None if head[8:9] == b"{" else "a safetensors file (a JSON header)"
    ok = head[:2] == b"PK" or head[:1] == b"\x80"  # torch.save's zip, or a pickle
    return None if ok else "a torch checkpoint (torch.save: a zip or a pickle)"


def model_source(text) -> str:
    """What a --model names: "preset", "config" (a config.json, or a folder holding one and
    no weights) or "checkpoint" (weights: a .gguf, .pth, .safetensors file or a folder
    holding them). A path that does not exist, or a checkpoint file whose first bytes are
    not its kind's, is refused (ValueError, saying what --model takes)."""
    path = Path(str(text)).expanduser()
    if path.is_file():
        if path.suffix not in CHECKPOINT_SUFFIXES:
            return "config"
        expected = _not_checkpoint(path)
        if expected:
            raise ValueError(f"--model {text}: not a checkpoint: its first bytes are not those "
                             f"of {expected}; {ACCEPTS}")
        return "checkpoint"
    if path.is_dir():
        weights = [p for s in (*CHECKPOINT_SUFFIXES, ".index.json") for p in path.glob(f"*{s}")]
        if weights:  # an index of shards names weights, wherever they are: a checkpoint
            return "checkpoint"
        if (path / "config.json").is_file():
            return "config"
        raise ValueError(f"--model {text}: a folder with neither config.json nor weights; "
                         f"{ACCEPTS}")
    if path.suffix in (".json", *CHECKPOINT_SUFFIXES) or len(path.parts) > 1:
        raise ValueError(f"--model {text}: no such file or folder; {ACCEPTS}")
    return "preset"


def config_of(model):
    """What a config-only command counts for --model: the preset, config.json or .gguf
    itself; for a .pth or .safetensors checkpoint, the config.json beside it (or, as
    gpt-fast names its folders, the preset its folder is named after: ours or transformers')."""
    if model is None:
        raise ValueError("give the model: --model PRESET|config.json|FOLDER|FILE.gguf")
    if model_source(model) != "checkpoint":
        return model
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return path
    folder = path if path.is_dir() else path.parent
    ggufs = sorted(folder.glob("*.gguf"))
    if (folder / "config.json").is_file():
        return folder
    if len(ggufs) == 1:
        return ggufs[0]
    if hf_presets.find(folder.name):  # named after a transformers preset (Qwen3-8B/)
        return folder.name
    try:
        ModelArgs.from_name(folder.name)
    except UnknownModelError:
        raise ValueError(f"--model {model}: counting needs the model's config, and these "
                         f"weights have none: no config.json in {folder}, and the folder's "
                         f"name {folder.name!r} is no preset; give --model PRESET|config.json, "
                         "or put the config.json beside the weights") from None
    return folder.name
