"""A checkpoint's config, read from its files' headers before any weight is read.

    kind, weights, config = checkpoint_config("ckpt/model.pth")   # ("pth", .../model.pth, ModelArgs)

What a run needs to check before it measures or loads anything (its context, whether a batch
fits in memory) is the model's config, and every kind of checkpoint holds it apart from its
weights: a gpt-fast `model.pth` in a config.json beside it or in its folder's name (a
preset); our `model.safetensors` in its header's metadata; a Hugging Face folder in its
config.json; a GGUF file in its metadata (transformers' config). `read_checkpoint` takes the
config from here too, so that what is checked first is what is loaded.
"""
from __future__ import annotations

import json
from pathlib import Path

from perfcounter.models.args import ModelArgs, UnknownModelError
from perfcounter.models.checkpoint_files import (CheckpointError, CheckpointNotFoundError,
                                                 model_args_from_dict, read_json)
from perfcounter.models.gguf_header import gguf_shape
from perfcounter.models.hf_checkpoint import hf_weight_files, model_args_from_hf
from perfcounter.models.tokenizer import offline_transformers

META_KEY = "perfcounter_model_args"  # the ModelArgs JSON in our safetensors' metadata


def read_config(path) -> ModelArgs:
    """ModelArgs from our config.json or from a Hugging Face config.json (a folder: the
    config.json in it)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: a folder without config.json")
        path = path / "config.json"
    data = read_json(path)
    if "model_type" in data:
        return model_args_from_hf(data, path)
    return model_args_from_dict(data, path)


def safetensors_metadata(path: Path) -> dict:
    """The metadata of a safetensors file, from its header alone (8 bytes of length, JSON)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= 100_000_000:
                raise ValueError(f"a header of {size:,} bytes")
            header = json.loads(f.read(size))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def metadata_args(text, weights: Path) -> ModelArgs:
    """The ModelArgs a safetensors file of ours carries in its metadata."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{weights}: metadata {META_KEY!r} is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{weights}: metadata {META_KEY!r} must be a JSON object of "
                              f"ModelArgs fields, got {type(data).__name__}")
    return model_args_from_dict(data, weights)


def weights_args(weights: Path, meta: dict, *, model_name=None, config_path=None) -> ModelArgs:
    """The ModelArgs of a .pth or our .safetensors file, in this order: --config, --model
    NAME, the file's metadata, a config.json beside it, its folder's name as a preset
    (gpt-fast's convention); none of them: a CheckpointError saying what to give."""
    if config_path:
        return read_config(config_path)
    if model_name:
        return ModelArgs.from_name(model_name)
    if META_KEY in meta:
        return metadata_args(meta[META_KEY], weights)
    if (weights.parent / "config.json").is_file():
        return read_config(weights.parent / "config.json")
    try:  # gpt-fast's convention: the folder is named after the model
        return ModelArgs.from_name(weights.parent.name)
    except UnknownModelError:
        raise CheckpointError(f"{weights}: no config.json beside it and its folder's name "
                              f"{weights.parent.name!r} is no preset; pass --model NAME "
                              "(a preset) or --config FILE, or put the model's config.json "
                              "beside it") from None


def checkpoint_kind(path) -> str:
    """"pth", "safetensors", "hf" or "gguf" for a checkpoint file or folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or folder")
    folder = path if path.is_dir() else path.parent
    config = folder / "config.json"
    hf_config = config.is_file() and "model_type" in read_json(config)
    if path.is_file():
        kinds = {".pth": "pth", ".pt": "pth", ".gguf": "gguf", ".bin": "hf"}
        if path.suffix == ".safetensors":
            return "hf" if hf_config else "safetensors"
        if path.suffix in kinds:
            return kinds[path.suffix]
        raise CheckpointError(f"{path}: unknown checkpoint file type {path.suffix!r}; "
                              "expected .pth, .safetensors, .gguf or a model folder")
    if hf_config:
        return "hf"
    if (path / "model.safetensors").is_file():
        return "safetensors"
    if (path / "model.pth").is_file():
        return "pth"
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf"
    raise CheckpointError(f"{path}: no checkpoint recognised; expected model.pth, model.safetensors "
                          "(+ config.json), a Hugging Face config.json + weights, or one .gguf file")


def weights_file(path: Path, kind: str) -> Path:
    """The file holding the weights of a checkpoint given as a file or a folder."""
    if path.is_file() or kind == "hf":
        return path
    if kind == "gguf":
        return sorted(path.glob("*.gguf"))[0]
    return path / ("model.pth" if kind == "pth" else "model.safetensors")


def gguf_config(path):
    """transformers' config of the GGUF file at `path`, read from its metadata (no weights);
    CheckpointError (one line) for a missing file or one transformers cannot read."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        return offline_transformers().AutoConfig.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"{path}: transformers could not read this GGUF's config ({e})") from e


def checkpoint_config(path, *, model_name=None, config_path=None):
    """(kind, weights file or folder, config) of a checkpoint, reading no weights: the
    config is our ModelArgs, or for a GGUF its figures in transformers' names."""
    path = Path(path)
    kind = checkpoint_kind(path)
    weights = weights_file(path, kind)
    if kind == "gguf":  # its header's figures (a tenth of a second), else transformers' reader
        return kind, weights, gguf_shape(weights) or gguf_config(weights)
    if kind == "hf":
        folder = path if path.is_dir() else path.parent
        hf_weight_files(folder)  # an index's shards named inside the folder, and present
        return kind, folder, read_config(config_path or folder / "config.json")
    meta = safetensors_metadata(weights) if kind == "safetensors" else {}
    return kind, weights, weights_args(weights, meta, model_name=model_name,
                                       config_path=config_path)
