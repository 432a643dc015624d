"""Cost formulas for gathers and scatters (part of the costs registry).

These ops touch part of a tensor, not all of it: an embedding reads one row
per token, never the whole table; a KV-cache update (index_copy_, index_put_)
writes the new positions only. Their formulas say so through `read_elems`
and `write_elems`, which the dispatch mode turns into bytes. Most compute
nothing; the accumulating forms (scatter_add_, index_add_, index_put_ with
accumulate) add one number per source element.

Cache writes: index_copy_, index_put_ and scatter_ overwrite their target
without reading it (`write_only`) and mark it KV cache (`cache_write`).
"""
from __future__ import annotations

import torch

from perfcounter.costs._core import Cost, aten, first_shape, kinds, numel, register


@register(aten.embedding)
def embedding_cost(weight, indices, *args, out_shape=None, **kw) -> Cost:
    """Reads one row per index, never the whole table; no arithmetic."""
    return Cost(read_elems=(numel(indices) * weight[-1], None))


@register(aten.index_select)
def index_select_cost(x, dim, index, *args, out_shape=None, **kw) -> Cost:
    """Reads the selected slices of x: len(index) · (numel / size[dim])."""
    row = numel(x) // x[dim] if x and x[dim] else 0
    return Cost(read_elems=(numel(index) * row, None))


@register(aten.gather)
def gather_cost(x, dim, index, *args, out_shape=None, **kw) -> Cost:
    """Reads one element of x per index."""
    return Cost(read_elems=(numel(index), None))


@register(aten.index_copy_, write_only=True, cache_write=True)
def index_copy_cost(x, dim, index, source, *args, out_shape=None, **kw) -> Cost:
    """Writes only the indexed positions (a KV-cache update): numel(source) elements."""
    return Cost(write_elems=numel(source))


def _indexed_numel(x, indices) -> int:
    """Elements addressed by x[indices]: the broadcast index shape times every dim
    the indices leave whole (None entries and trailing dims). NB: integer indices."""
    index_shapes = [s for s in indices if s is not None]
    if not index_shapes:
        return numel(x)
    broadcast = torch.broadcast_shapes(*[torch.Size(s) for s in index_shapes])
    kept = [size for i, size in enumerate(x) if i >= len(indices) or indices[i] is None]
    return numel(broadcast) * numel(kept)


def index_put_cost(x, indices, values, accumulate=False, *args, out_shape=None, **kw) -> Cost:
    """x[indices] = values (or += with accumulate): writes the indexed elements only.

    NB: the out-of-place index_put writes its whole output; only index_put_ is partial."""
    n = _indexed_numel(x, indices)
    return Cost(kinds(add=n if accumulate else 0), write_elems=n)


register(aten.index_put_, write_only=True, cache_write=True)(index_put_cost)
register(aten.index_put)(index_put_cost)


@register(aten.index)
def index_cost(x, indices, *args, out_shape=None, **kw) -> Cost:
    """x[indices]: reads the addressed elements only."""
    return Cost(read_elems=(numel(first_shape(out_shape)),) + (None,) * sum(i is not None for i in indices))


@register(aten.scatter_, write_only=True, cache_write=True)
def scatter_cost(x, dim, index, *args, out_shape=None, **kw) -> Cost:
    """In-place scatter writes one element per index."""
    return Cost(write_elems=numel(index))


@register(aten.scatter_add_)
def scatter_add_cost(x, dim, index, src, *args, out_shape=None, **kw) -> Cost:
    """In-place scatter-add reads and writes one element per index, with one add each."""
    n = numel(index)
    return Cost(kinds(add=n), read_elems=(n, None, None), write_elems=n)


@register(aten.index_add_)
def index_add_inplace_cost(x, dim, index, source, *args, alpha=1, out_shape=None, **kw) -> Cost:
    """x.index_add_(dim, index, source) (MoE: expert outputs into their tokens' rows): one add
    per source element (+1 mul with alpha != 1); reads and writes only the indexed rows of x.

    NB: an index listed twice adds into its row twice; its bytes are counted twice too."""
    n = numel(source)
    return Cost(kinds(add=n, mul=n if alpha != 1 else 0), read_elems=(n, None, None), write_elems=n)


@register(aten.index_add)
def index_add_cost(x, dim, index, source, *args, alpha=1, out_shape=None, **kw) -> Cost:
    """Out-of-place index_add: the same adds (and alpha muls); reads x and writes the output whole."""
    n = numel(source)
    return Cost(kinds(add=n, mul=n if alpha != 1 else 0))
