"""A GGUF file's shape from its header's key-value metadata alone, read in a fraction of a second.

    shape = gguf_shape("SmolLM2-135M-Instruct.Q4_1.gguf")
    shape.num_hidden_layers, shape.max_position_embeddings     # 30, 8192

What a run checks before it loads a GGUF (its context, whether a batch's KV cache fits) needs
a handful of numbers; transformers' reader (AutoConfig with gguf_file=) builds the whole
tokenizer first, ~13 s for SmolLM2-135M's on a busy 2-core VM. The header is read here as
the GGUF specification lays it out (version 2 and 3: "GGUF", version, tensor count, key-value
count, then each key, its type and value; arrays skipped element by element, strings by
their length), and the model's figures taken from `{architecture}.*` keys
(`block_count`, `embedding_length`, `feed_forward_length`, `attention.head_count`,
`attention.head_count_kv`, `context_length`; the vocabulary: `tokenizer.ggml.tokens`'
length), named as transformers' configs name them. None where the file is not such a GGUF
or lacks a figure: the caller asks transformers instead.
"""
from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

# value type -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_KEYS = 100_000  # a header with more keys than this is no model's


def _read(f, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the header ends early")
    return struct.unpack(fmt, data)[0]


def _string(f, keep: bool = True) -> str | None:
    n = _read(f, "<Q")
    if not keep:
        f.seek(n, 1)
        return None
    return f.read(n).decode("utf-8", errors="replace")


def _value(f, kind: int, keep: bool = True):
    """One value of `kind`; an array's length instead of its elements."""
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f, keep)
    if kind == _ARRAY:
        inner, count = _read(f, "<I"), _read(f, "<Q")
        if inner in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[inner]) * count, 1)
        else:
            for _ in range(count):
                _value(f, inner, keep=False)
        return count
    raise ValueError(f"unknown value type {kind}")


def gguf_metadata(path) -> dict:
    """{key: value} of a GGUF v2/v3 header (arrays as their lengths); ValueError otherwise."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF" or _read(f, "<I") not in (2, 3):
            raise ValueError("not a GGUF file of version 2 or 3")
        _read(f, "<Q")  # tensors
        count = _read(f, "<Q")
        if count > MAX_KEYS:
            raise ValueError(f"{count:,} metadata keys")
        return {_string(f): _value(f, _read(f, "<I")) for _ in range(count)}


def gguf_shape(path) -> SimpleNamespace | None:
    """The model's figures in transformers' names (the module doc); None where unknown."""
    try:
        meta = gguf_metadata(Path(path))
    except (OSError, ValueError, struct.error):
        return None
    arch = meta.get("general.architecture")
    names = {"num_hidden_layers": "block_count", "hidden_size": "embedding_length",
             "intermediate_size": "feed_forward_length",
             "num_attention_heads": "attention.head_count",
             "num_key_value_heads": "attention.head_count_kv",
             "max_position_embeddings": "context_length"}
    figures = {ours: meta.get(f"{arch}.{key}") for ours, key in names.items()}
    figures["vocab_size"] = meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens")
    if not isinstance(arch, str) or not all(isinstance(v, int) and v > 0
                                            for v in figures.values()):
        return None
    return SimpleNamespace(model_type=arch, **figures)
