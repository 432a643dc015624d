"""What a tensor is stored in: the bytes a weight costs as kept, whatever it runs as.

Two kinds of weight are stored smaller than the float tensor a layer multiplies by:
a tensor subclass (torchao's `quantize_`: data plus scales and zero points), whose
stored bytes are those of its inner tensors (`packed_parts`, flattened recursively),
and a float weight with a stored size set by `set_stored_nbytes` (a GGUF file priced as
stored). `stored_nbytes(t)` answers for any tensor. A leaf: torch only.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils.weak import WeakIdKeyDictionary

Tensor = torch.Tensor
_PLAIN = (torch.Tensor, torch.nn.Parameter)

STORED = WeakIdKeyDictionary()  # weight tensor -> bytes as stored (set_stored_nbytes)


def set_stored_nbytes(weight: Tensor, nbytes: int) -> None:
    """Price `weight` (a float Parameter of an nn.Linear or nn.Embedding) at `nbytes`
    stored bytes instead of numel · itemsize; nbytes=None removes the override."""
    if nbytes is None:
        STORED.pop(weight, None)
        return
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
        raise ValueError(f"stored bytes must be an int >= 1, got {nbytes!r}")
    STORED[weight] = nbytes


def is_packed(t) -> bool:
    """A tensor subclass that stores other tensors (`__tensor_flatten__`): not a plain
    Tensor, Parameter or FakeTensor."""
    tp = type(t)
    return (isinstance(t, Tensor) and tp not in _PLAIN and not isinstance(t, FakeTensor)
            and callable(getattr(tp, "__tensor_flatten__", None)))


def packed_parts(t) -> list[Tensor]:
    """The plain tensors a subclass stores (data, scales, zero points), flattened
    recursively; [t] for a plain tensor."""
    if not is_packed(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [p for name in names for p in packed_parts(getattr(t, name))]


def stored_nbytes(t) -> int:
    """Bytes `t` is stored in: an override (set_stored_nbytes), a subclass's inner tensors,
    else numel · itemsize."""
    found = STORED.get(t)
    if found is not None:
        return found
    return sum(p.numel() * p.element_size() for p in packed_parts(t))
