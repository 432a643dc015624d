"""Data movement: copies, casts, joins, rearrangements, fills, factories, allocation
(part of the costs registry).

None of these ops computes anything (0 FLOPs), but all of them move bytes,
which the dispatch mode counts from the tensors; registering them says that
they are understood, so they never land in `uncounted_ops`. What differs from
op to op is what the mode needs to know about those bytes, and that is what
the groups below carry:
- `write_only`: an in-place fill (fill_, zero_, the random fills, copy_) or a
  storage swap (set_, resize_) overwrites its target without reading it;
- `cache_write`: copy_ and slice_scatter into a buffer make it KV cache (a
  static cache updated in place);
- `join`: cat / stack onto a KV cache grow the cache: their output is KV cache;
- `factory`: zeros / ones / full / empty and their _like / new_ forms make a
  fresh buffer that may become KV cache when a cache write lands in it.
Views and metadata ops (view, t, expand, slice, …) are not registered: the
mode recognizes them from their schema and counts neither FLOPs nor bytes.
"""
from __future__ import annotations

from perfcounter.costs._core import ZERO, Cost, aten, register


def data_movement_cost(*args, out_shape=None, **kw) -> Cost:
    """Copies, casts, concatenation, padding, factory fills: no arithmetic; the
    mode counts the bytes they read and write."""
    return ZERO


# copies and casts; the composites to/reshape/contiguous/flatten/type_as are priced
# whole when they copy (and are a view when they do not: the mode decides per call)
register(aten._to_copy, aten.clone, aten.copy, aten._copy_from, aten.lift_fresh_copy,
         aten.expand_copy, aten._local_scalar_dense,
         aten.to, aten.reshape, aten.contiguous, aten.flatten, aten.type_as)(data_movement_cost)

# copy_ into a buffer: the static KV-cache update (the buffer becomes KV cache)
register(aten.copy_, write_only=True, cache_write=True)(data_movement_cost)

# out-of-place scatters into a copy; slice_scatter is how a functionalized static
# cache is updated, so it marks its base KV cache
register(aten.slice_scatter, cache_write=True)(data_movement_cost)
register(aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter, aten.index_copy,
         aten.scatter)(data_movement_cost)

# joins: a cache grown by concatenation stays KV cache
register(aten.cat, aten.stack, join=True)(data_movement_cost)

# rearrangements, selections and index builders: read one tensor, write another
register(aten.repeat, aten.repeat_interleave, aten.roll, aten.flip, aten.constant_pad_nd,
         aten.tensor_split, aten.unfold, aten.masked_select, aten.nonzero,
         aten.unique_consecutive, aten._unique2, aten.one_hot, aten.equal,
         aten.tril_indices, aten.triu_indices, aten._assert_tensor_metadata)(data_movement_cost)

# in-place fills: the target is written, never read
register(aten.fill_, aten.zero_, aten.uniform_, aten.normal_, aten.random_, aten.bernoulli_,
         write_only=True)(data_movement_cost)

# storage swaps: the target's old contents are not read
register(aten.set_, aten.resize_, write_only=True)(data_movement_cost)

# out-of-place fills and random tensors: written, not read
register(aten.fill, aten.scalar_tensor, aten.rand, aten.randn, aten.randint, aten.rand_like,
         aten.randn_like, aten.bernoulli)(data_movement_cost)

# factories: a fresh buffer that a later cache write may make KV cache
register(aten.zeros, aten.ones, aten.full, aten.zeros_like, aten.ones_like, aten.full_like,
         aten.new_zeros, aten.new_ones, aten.new_full, factory=True)(data_movement_cost)


def allocation_cost(*args, out_shape=None, **kw) -> Cost:
    """Allocates without writing: no arithmetic and no bytes.

    NB: the first op that writes the buffer counts its bytes."""
    return Cost(write_elems=0)


register(aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
         factory=True)(allocation_cost)
# NB: not factories in the mode's sets as they stood; kept so that no figure moves
register(aten.new_empty_strided, aten.empty_permuted)(allocation_cost)
