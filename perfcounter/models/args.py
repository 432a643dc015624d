"""ModelArgs: a decoder-only Transformer's shape as plain data, its checks and its presets.

gpt-fast's `ModelArgs` with `from_name()`: a preset matched exactly or through its listed
aliases (never by a fuzzy substring); derived fields (head_dim, intermediate_size) filled
as gpt-fast fills them; every field checked on construction with a one-line error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

from perfcounter._util import did_you_mean
from perfcounter.models import hf_presets


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


class UnknownModelError(KeyError, ValueError):
    """A model name that is neither a preset nor one of its aliases (a bad value: the
    commands answer it in one line, as any ValueError)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class ModelArgs:
    block_size: int = 2048
    vocab_size: int = 32000
    n_layer: int = 32
    n_head: int = 32
    dim: int = 4096
    intermediate_size: Optional[int] = None
    n_local_heads: int = -1
    head_dim: Optional[int] = None
    rope_base: float = 10000
    norm_eps: float = 1e-5
    # beyond gpt-fast's Llama-2 fields; shown by repr only when set
    rope_scaling: Optional[dict] = None  # Llama-3: factor, low/high_freq_factor, original_max_position_embeddings
    attention_bias: bool = False  # bias on q, k, v (Qwen2)
    tie_embeddings: bool = False  # output projection shares tok_embeddings.weight
    sliding_window: Optional[int] = None  # attend to at most this many positions
    num_experts: int = 0  # 0: dense SwiGLU feed-forward
    num_activated_experts: int = 0

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "dim"):
            _check_int(self, name, 1)
        if self.n_local_heads == -1:
            self.n_local_heads = self.n_head
        if self.intermediate_size is None:
            self.intermediate_size = find_multiple(int(2 * 4 * self.dim / 3), 256)
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_head
        for name in ("n_local_heads", "intermediate_size", "head_dim"):
            _check_int(self, name, 1)
        for name in ("num_experts", "num_activated_experts"):
            _check_int(self, name, 0)
        if self.sliding_window is not None:
            _check_int(self, "sliding_window", 1)
        for name in ("rope_base", "norm_eps"):
            _check_real(name, getattr(self, name))
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)
        if self.n_head % self.n_local_heads:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_local_heads={self.n_local_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.num_experts and not 0 < self.num_activated_experts <= self.num_experts:
            raise ValueError(f"num_activated_experts={self.num_activated_experts} must be in "
                             f"1..num_experts={self.num_experts}")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _EXTRA_FIELDS and value == f.default:
                continue
            shown.append(f"{f.name}={value!r}")
        return f"ModelArgs({', '.join(shown)})"

    @classmethod
    def from_name(cls, name: str) -> "ModelArgs":
        """The preset called `name` or one of its aliases (case-insensitive, exact)."""
        key = str(name).strip().rstrip("/").lower()
        if key not in _LOOKUP:
            key = key.rsplit("/", 1)[-1]  # "meta-llama/Llama-2-7b-hf" or a checkpoint folder
        if key not in _LOOKUP:  # a close name may be an alias: each one is a valid input
            raise UnknownModelError(_unknown(name, key))
        return cls(**PRESETS[_LOOKUP[key]])


def _unknown(name, key: str) -> str:
    """Why `name` is none of our presets, with both kinds of preset listed: ours (this
    model) and transformers' (hf_presets.yaml, counted through transformers' own model)."""
    ours, theirs = ", ".join(PRESETS), ", ".join(hf_presets.PRESETS)
    hf = hf_presets.find(name)
    if hf:
        return (f"model {name!r} is the transformers preset {hf!r}: count_config and `perfcounter "
                f"count` run transformers' model for it, not perfcounter's (whose presets: {ours})")
    close = did_you_mean(key, {**_LOOKUP, **hf_presets.LOOKUP}) or ";"
    return f"unknown model {name!r}{close} presets: {ours}; transformers presets: {theirs}"


def _check_int(args: "ModelArgs", name: str, least: int) -> None:
    value = getattr(args, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = "a positive int" if least == 1 else f"an int >= {least}"
        raise ValueError(f"ModelArgs.{name} must be {what}, got {value!r}")


def _check_real(name: str, value) -> None:
    """A finite number > 0 (rope_base, norm_eps, the rope scaling factors)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"ModelArgs.{name} must be a finite number > 0, got {value!r}")


ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")


def _check_rope_scaling(scaling) -> None:
    """Llama-3 rope scaling: a dict of the four figures apply_rope_scaling reads."""
    if not isinstance(scaling, dict):
        raise ValueError(f"ModelArgs.rope_scaling must be a dict with {', '.join(ROPE_SCALING_KEYS)} "
                         f"(Llama-3), got {type(scaling).__name__} {scaling!r:.40}")
    missing = [k for k in ROPE_SCALING_KEYS if k not in scaling]
    if missing:
        raise ValueError(f"ModelArgs.rope_scaling lacks {', '.join(missing)}; a Llama-3 block "
                         f"has {', '.join(ROPE_SCALING_KEYS)}")
    for k in ROPE_SCALING_KEYS:
        _check_real(f"rope_scaling[{k!r}]", scaling[k])
    if scaling["low_freq_factor"] == scaling["high_freq_factor"]:
        raise ValueError("ModelArgs.rope_scaling: low_freq_factor and high_freq_factor must "
                         f"differ, both are {scaling['low_freq_factor']!r}")


_EXTRA_FIELDS = ("rope_scaling", "attention_bias", "tie_embeddings", "sliding_window",
                 "num_experts", "num_activated_experts")

_LLAMA31_ROPE = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)

# Numbers from each model's published config.json on the Hugging Face Hub.
PRESETS: dict[str, dict] = {
    # block_size: each model's own context length (its config's max_position_embeddings)
    "llama-2-7b": dict(block_size=4096, n_layer=32, n_head=32, dim=4096),
    "llama-2-13b": dict(block_size=4096, n_layer=40, n_head=40, dim=5120),
    "llama-2-70b": dict(block_size=4096, n_layer=80, n_head=64, dim=8192, n_local_heads=8,
                        intermediate_size=28672),
    "llama-3-8b": dict(block_size=8192, n_layer=32, n_head=32, n_local_heads=8, dim=4096,
                       intermediate_size=14336, vocab_size=128256, rope_base=500000),
    "llama-3-70b": dict(block_size=8192, n_layer=80, n_head=64, n_local_heads=8, dim=8192,
                        intermediate_size=28672, vocab_size=128256, rope_base=500000),
    "llama-3.1-8b": dict(block_size=131072, n_layer=32, n_head=32, n_local_heads=8, dim=4096,
                         intermediate_size=14336, vocab_size=128256, rope_base=500000,
                         rope_scaling=_LLAMA31_ROPE),
    "llama-3.1-70b": dict(block_size=131072, n_layer=80, n_head=64, n_local_heads=8, dim=8192,
                          intermediate_size=28672, vocab_size=128256, rope_base=500000,
                          rope_scaling=_LLAMA31_ROPE),
    "llama-3.1-405b": dict(block_size=131072, n_layer=126, n_head=128, n_local_heads=8, dim=16384,
                           intermediate_size=53248, vocab_size=128256, rope_base=500000,
                           rope_scaling=_LLAMA31_ROPE),
    "llama-3.2-1b": dict(block_size=131072, n_layer=16, n_head=32, n_local_heads=8, dim=2048,
                         intermediate_size=8192, vocab_size=128256, rope_base=500000,
                         tie_embeddings=True, rope_scaling=dict(_LLAMA31_ROPE, factor=32.0)),
    "mistral-7b": dict(block_size=32768, n_layer=32, n_head=32, n_local_heads=8, dim=4096,
                       intermediate_size=14336, sliding_window=4096),
    "mixtral-8x7b": dict(block_size=32768, n_layer=32, n_head=32, n_local_heads=8, dim=4096,
                         intermediate_size=14336, rope_base=1000000, num_experts=8,
                         num_activated_experts=2),
    "qwen2.5-0.5b": dict(block_size=32768, vocab_size=151936, n_layer=24, n_head=14, n_local_heads=2,
                         dim=896, intermediate_size=4864, rope_base=1000000, norm_eps=1e-6,
                         attention_bias=True, tie_embeddings=True),
    "qwen2.5-7b": dict(block_size=32768, vocab_size=152064, n_layer=28, n_head=28, n_local_heads=4,
                       dim=3584, intermediate_size=18944, rope_base=1000000, norm_eps=1e-6,
                       attention_bias=True),
    "smollm2-135m": dict(block_size=8192, vocab_size=49152, n_layer=30, n_head=9, n_local_heads=3,
                         dim=576, intermediate_size=1536, rope_base=100000, tie_embeddings=True),
    "smollm2-360m": dict(block_size=8192, vocab_size=49152, n_layer=32, n_head=15, n_local_heads=5,
                         dim=960, intermediate_size=2560, rope_base=100000, tie_embeddings=True),
    "smollm2-1.7b": dict(block_size=8192, vocab_size=49152, n_layer=24, n_head=32, n_local_heads=32,
                         dim=2048, intermediate_size=8192, rope_base=130000, tie_embeddings=True),
}

ALIASES: dict[str, tuple[str, ...]] = {
    "llama-2-7b": ("7b", "llama2-7b", "llama-2-7b-hf", "llama-2-7b-chat-hf"),
    "llama-2-13b": ("13b", "llama2-13b", "llama-2-13b-hf", "llama-2-13b-chat-hf"),
    "llama-2-70b": ("70b", "llama2-70b", "llama-2-70b-hf", "llama-2-70b-chat-hf"),
    "llama-3-8b": ("llama3-8b", "meta-llama-3-8b", "meta-llama-3-8b-instruct"),
    "llama-3-70b": ("llama3-70b", "meta-llama-3-70b", "meta-llama-3-70b-instruct"),
    "llama-3.1-8b": ("llama3.1-8b", "meta-llama-3.1-8b", "llama-3.1-8b-instruct",
                     "meta-llama-3.1-8b-instruct"),
    "llama-3.1-70b": ("llama3.1-70b", "meta-llama-3.1-70b", "llama-3.1-70b-instruct",
                      "meta-llama-3.1-70b-instruct"),
    "llama-3.1-405b": ("llama3.1-405b", "meta-llama-3.1-405b", "llama-3.1-405b-instruct",
                       "meta-llama-3.1-405b-instruct"),
    "llama-3.2-1b": ("llama3.2-1b", "llama-3.2-1b-instruct"),
    "mistral-7b": ("mistral-7b-v0.1", "mistral-7b-instruct-v0.1"),
    "mixtral-8x7b": ("mixtral-8x7b-v0.1", "mixtral-8x7b-instruct-v0.1"),
    "qwen2.5-0.5b": ("qwen2.5-0.5b-instruct",),
    "qwen2.5-7b": ("qwen2.5-7b-instruct",),
    "smollm2-135m": ("smollm2-135m-instruct",),
    "smollm2-360m": ("smollm2-360m-instruct",),
    "smollm2-1.7b": ("smollm2-1.7b-instruct",),
}
_LOOKUP = {name: name for name in PRESETS}
_LOOKUP.update({alias: name for name, aliases in ALIASES.items() for alias in aliases})
assert set(ALIASES) <= set(PRESETS), "every alias list must name a preset"
assert not set(_LOOKUP) & set(hf_presets.LOOKUP), \
    f"a name of both kinds of preset: {sorted(set(_LOOKUP) & set(hf_presets.LOOKUP))}"
