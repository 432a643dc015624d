"""Presets for transformers architectures: published config.json files, kept as data in
hf_presets.yaml (each with its sources) and read with transformers' own config classes.

    find("Qwen/Qwen3-8B")              # "qwen3-8b": a preset's name, from it or its repo's
    preset_config("deepseek-v3")       # DeepseekV3Config, the published checkpoint's config
    counted_config("gemma-3-12b")      # Gemma3TextConfig: the language model count_config runs

`--model qwen3-8b` (perfcounter count) and count_config("qwen3-8b") count these through
transformers' modeling code on fake tensors, as they count a config.json. A multimodal
checkpoint (Llama 4, Gemma 3) publishes its language model's fields as `text_config`:
counted_config is that config (transformers' get_text_config()). perfcounter's own presets
(args.PRESETS) are another set: no name or alias is in both (args.py asserts it). A
model_type the installed transformers does not know is refused in one line naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfcounter.models.tokenizer import offline_transformers
from perfcounter.strict_yaml import load_yaml

PRESETS_FILE = Path(__file__).with_name("hf_presets.yaml")


class UnsupportedArchitecture(ValueError):
    """A preset whose model_type the installed transformers has no config class for."""


@dataclass(frozen=True, slots=True)
class HfPreset:
    """One published checkpoint: its Hugging Face repository, where its config and parameter
    count are published (`source`), and the config's fields as published."""
    name: str
    repo: str
    source: dict
    config: dict


def _read(path: Path = PRESETS_FILE) -> dict[str, HfPreset]:
    data = load_yaml(path.read_text(encoding="utf-8"))
    return {name: HfPreset(name=name, repo=entry["repo"], source=entry["source"],
                           config=entry["config"]) for name, entry in data.items()}


PRESETS: dict[str, HfPreset] = _read()
# a preset by its name or its repository's name, lower-cased ("qwen3-235b-a22b-fp8",
# "llama-4-scout-17b-16e-instruct"): listed aliases, never a fuzzy match
LOOKUP: dict[str, str] = {**{p.repo.rsplit("/", 1)[-1].lower(): n for n, p in PRESETS.items()},
                          **{n: n for n in PRESETS}}


def find(name) -> str | None:
    """The preset `name` is (case-insensitive, exact; "org/Repo" by its repository's name),
    or None."""
    key = str(name).strip().rstrip("/").lower()
    return LOOKUP.get(key) or LOOKUP.get(key.rsplit("/", 1)[-1])


def preset_config(name: str):
    """The transformers config of preset `name` (a KeyError for an unknown one), built by the
    config class of its model_type from the published fields: AutoConfig.for_model."""
    preset = PRESETS[find(name) or name]
    transformers = offline_transformers()
    fields = dict(preset.config)
    model_type = fields.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise UnsupportedArchitecture(
            f"preset {preset.name!r}: model_type {model_type!r} is not a transformers "
            f"{transformers.__version__} architecture (an older release than the preset needs?)")
    for sub in ("text_config", "vision_config"):  # a multimodal checkpoint's parts
        inner = fields.get(sub) or {}
        if inner.get("model_type", model_type) not in transformers.CONFIG_MAPPING:
            raise UnsupportedArchitecture(
                f"preset {preset.name!r}: {sub} model_type {inner['model_type']!r} is not a "
                f"transformers {transformers.__version__} architecture")
    return transformers.AutoConfig.for_model(model_type, **fields)


def counted_config(name: str):
    """The config count_config counts for preset `name`: its language model's (the checkpoint's
    own config, or its text_config for a multimodal checkpoint: get_text_config())."""
    return preset_config(name).get_text_config()
