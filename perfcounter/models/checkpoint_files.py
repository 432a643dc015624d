"""Checkpoint files read safely: JSON configs, safetensors and torch state dicts.

Every failure is a CheckpointError naming the file and what was expected
(CheckpointNotFoundError when it is missing); `model_args_from_dict` checks our
own config's field names.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open

from perfcounter._util import did_you_mean
from perfcounter.models.args import ModelArgs


class CheckpointError(ValueError):
    """A checkpoint or config file that is missing, unreadable or does not fit."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    pass


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def model_args_from_dict(data: dict, source) -> ModelArgs:
    """ModelArgs from our config dict (its field names)."""
    valid = [f.name for f in dataclasses.fields(ModelArgs)]
    unknown = [k for k in data if k not in valid]
    if unknown:
        hint = did_you_mean(unknown[0], valid, n=1, quote=True).removeprefix("; ")
        raise CheckpointError(f"{source}: unknown ModelArgs field {unknown[0]!r}"
                              f"{f' ({hint})' if hint else ''}; valid fields: {', '.join(valid)}")
    try:
        return ModelArgs(**data)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: invalid ModelArgs ({e})") from e



def read_safetensors(path: Path) -> tuple[dict, dict]:
    """(tensors, metadata) of one safetensors file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except Exception as e:  # SafetensorError and friends
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e


def read_pth(path: Path) -> dict:
    try:
        state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except Exception as e:  # pickle, zip and mmap errors
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({e})") from e
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state dict of tensors")
    return state
