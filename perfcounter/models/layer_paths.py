"""Which module paths lie in a decoder layer, and in which: the one answer every "one layer
counted, the rest derived" asks (generation/derive_layers.py expands a trace's layers,
serve/steps.py groups a step's records over the layers, serve/placement.py repeats a
one-layer trace, models/stored_weights.py repeats one layer's parameters).

A decoder layer is entry i of the model's layer list: a whole path segment with a layer
list's name (`layers`: ours, Llama and most of transformers'; `h`: GPT-2, Falcon, Bloom;
`blocks`), followed by the whole number i. A step table's record group stands for
every layer with `*` for the number.

    layer_of("Transformer.layers.3.attention")       # 3 (-1: outside the layers, or `*`)
    layer_of("layers.0.attention.wqkv.weight")       # 0: a parameter's name has no root
    layer_of("M.vision.blocks.0.mlp", "M.model.layers")  # -1: not a layer of that list
    is_layer("GPT2LMHeadModel.transformer.h.3")      # Layer(container="...transformer.h", index=3)
    is_layer("Transformer.layers.3.attention")       # None: inside a layer, not one
    every_layer("Transformer.layers.3.attention")    # "Transformer.layers.*.attention"
    in_layer("Transformer.layers.*.attention")       # True (False outside the layers)
    at_layer("Transformer.layers.*.attention", 5)    # "Transformer.layers.5.attention"
"""
from __future__ import annotations

import re
from typing import NamedTuple

LAYER_LISTS = ("layers", "h", "blocks")  # what a model calls its list of decoder layers
EVERY = "*"  # the index of a path standing for every layer
# a list's name and the layer's number (or *), whole segments: after the start or a dot,
# before a dot or the end
_LAYER = re.compile(r"(?<![^.])(?P<list>" + "|".join(LAYER_LISTS)
                    + r")\.(?P<index>\d+|\*)(?![^.])")


class Layer(NamedTuple):
    """A decoder layer: its list's path ("Transformer.layers") and its index in it."""

    container: str
    index: int


def layer_of(path: str, container: str | None = None) -> int:
    """The index of the layer `path` lies in ("Transformer.layers.3.attention": 3), of the
    list at `container` when given ("Transformer.layers"); -1 outside the layers (those of
    `container`) or at every layer's `*`."""
    if container is not None:
        if not path.startswith(container + "."):
            return -1
        return int(path[len(container) + 1:].split(".", 1)[0])
    m = _LAYER.search(path)
    return int(m["index"]) if m and m["index"] != EVERY else -1


def in_layer(path: str) -> bool:
    """Whether `path` lies in a layer (one, or every layer's `*`)."""
    return _LAYER.search(path) is not None


def is_layer(path: str) -> Layer | None:
    """The layer `path` names itself ("T.layers.3": Layer("T.layers", 3)), else None (a
    module inside a layer, outside the layers, or `*`)."""
    last = None
    for last in _LAYER.finditer(path):
        pass
    if last is None or last.end() != len(path) or last["index"] == EVERY:
        return None
    return Layer(path[:last.end("list")], int(last["index"]))


def every_layer(path: str) -> str:
    """`path` standing for every layer: its layer index `*` ("T.layers.*.attention");
    unchanged outside the layers."""
    return _indexed(path, EVERY)


def at_layer(path: str, i: int, container: str | None = None) -> str:
    """`path` in layer i ("T.layers.0.attention" or "T.layers.*.attention", 5:
    "T.layers.5.attention"), of the list at `container` alone when given; unchanged outside
    the layers (those of `container`)."""
    if container is None:
        return _indexed(path, str(int(i)))
    if not path.startswith(container + "."):
        return path
    rest = path[len(container) + 1:].split(".", 1)
    return f"{container}.{int(i)}" + ("." + rest[1] if len(rest) > 1 else "")


def _indexed(path: str, index: str) -> str:
    """`path` with each layer index `index`, spliced (a step table asks it of every record;
    re.sub with a group template costs several times as much)."""
    m = _LAYER.search(path)
    if m is None:
        return path
    parts, at = [], 0
    while m is not None:
        parts += (path[at:m.start("index")], index)
        at = m.end()
        m = _LAYER.search(path, at)
    return "".join(parts) + path[at:]
