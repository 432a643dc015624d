"""A GGUF file's shape from its header's key-value metadata alone, read in a fraction of a second.

    shape = gguf_shape("SmolLM2-135M-Instruct.Q4_1.gguf")
    shape.num_hidden_layers, shape.max_position_embeddings     # 30, 8192

What a run checks before it loads a GGUF (its context, whether a batch's KV cache fits) needs
a handful of numbers; transformers' reader (AutoConfig with gguf_file=) builds the whole
tokenizer first, ~13 s for SmolLM2-135M's on a busy 2-core VM. The header is read here as
the GGUF specification lays it out (version 2 and 3: "GGUF", version, tensor count, key-value
count, then each key, its type and value; arrays skipped element by element, strings by
their length; every declared length and count checked against the bytes left in the file
before anything is read or skipped, a ValueError otherwise), and the model's figures taken
from `{architecture}.*` keys (`block_count`, `embedding_length`, `feed_forward_length`,
`attention.head_count`, `attention.head_count_kv`, `context_length`; the vocabulary:
`tokenizer.ggml.tokens`' length), named as transformers' configs name them. None where the
file is not such a GGUF or lacks a figure: the caller asks transformers instead.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from types import SimpleNamespace

# value type -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LEAST = {_STRING: 8, _ARRAY: 12}  # the fewest bytes a string (its length) or an array takes
_LEAST_KEY = 8 + 4 + 1  # a key: its name's length, its value's type, a value of 1 byte at least
MAX_KEYS = 100_000  # a header with more keys than this is no model's


class _Header:
    """The file read front to back; every declared length and count checked against the
    bytes left before anything is read or skipped (a 44-byte file may declare 2^60 bytes)."""

    def __init__(self, f):
        self.f = f
        self.size = os.fstat(f.fileno()).st_size

    def left(self) -> int:
        return self.size - self.f.tell()

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.left():
            raise ValueError(f"{what} at byte {self.f.tell():,} needs {nbytes:,} bytes; the "
                             f"file has {self.left():,} left")

    def read(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("the header ends early")
        return struct.unpack(fmt, data)[0]

    def string(self, keep: bool = True) -> str | None:
        n = self.read("<Q")
        self.need(n, "a string")
        if not keep:
            self.f.seek(n, 1)
            return None
        return self.f.read(n).decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool = True):
        """One value of `kind`; an array's length instead of its elements."""
        if kind in _SCALARS:
            return self.read(_SCALARS[kind])
        if kind == _STRING:
            return self.string(keep)
        if kind == _ARRAY:
            inner, count = self.read("<I"), self.read("<Q")
            least = struct.calcsize(_SCALARS[inner]) if inner in _SCALARS else _LEAST.get(inner)
            if least is None:
                raise ValueError(f"unknown value type {inner}")
            self.need(least * count, f"an array of {count:,} elements")
            if inner in _SCALARS:
                self.f.seek(least * count, 1)
            else:
                for _ in range(count):
                    self.value(inner, keep=False)
            return count
        raise ValueError(f"unknown value type {kind}")


def gguf_metadata(path) -> dict:
    """{key: value} of a GGUF v2/v3 header (arrays as their lengths); ValueError otherwise,
    a length or count the file's bytes cannot hold included."""
    with open(path, "rb") as f:
        h = _Header(f)
        if f.read(4) != b"GGUF" or h.read("<I") not in (2, 3):
            raise ValueError("not a GGUF file of version 2 or 3")
        h.read("<Q")  # tensors
        count = h.read("<Q")
        if count > MAX_KEYS:
            raise ValueError(f"{count:,} metadata keys; a model's header has at most {MAX_KEYS:,}")
        h.need(count * _LEAST_KEY, f"{count:,} metadata keys")  # each at least 13 bytes
        return {h.string(): h.value(h.read("<I")) for _ in range(count)}


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
