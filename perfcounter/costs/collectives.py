"""Collectives as ops: all-reduce, all-gather, pipeline send/recv, all-to-all (part of the
costs registry).

A rank of a sharded model (perfcounter/parallel) calls these where Megatron and vLLM call
NCCL: the all-reduce after a row-parallel linear (attention's wo, the MLP's w2, a MoE layer)
and after the vocab-parallel embedding, the all-gather of the LM head's vocab shards, the
send/recv of activations between pipeline stages, and expert parallelism's all-to-all
dispatch and combine. Each is a torch.library custom op, so the dispatch mode records it as
any aten op (counts, per-module tables, traces, Perfetto) without a special case:

    torch.ops.perfcounter.all_reduce(x, ranks)        -> x's shape (the sum over the ranks)
    torch.ops.perfcounter.all_gather(x, ranks, dim)   -> x's shape, dim x ranks
    torch.ops.perfcounter.send_recv(x, stages)        -> x's shape (the next stage's input)
    torch.ops.perfcounter.all_to_all(x, ranks)        -> x's shape (rows to the experts' ranks)

One process stands for one rank: the ops return a new tensor of the result's shape made from
this rank's values (no other rank exists), which is all counting needs. Their message bytes
are their tensor bytes (an all-gather's: its output), which pricing/collectives.py prices on
the devices' link; the group size is the op's integer argument.

NB: 0 FLOPs: the additions of an all-reduce ((n-1)/n of its elements on each rank) run
inside the communication kernel and are priced with its link time, not as arithmetic.
The mode counts the memory bytes each one reads (its input) and writes (its output), as for
any op.
"""
from __future__ import annotations

import torch
from torch import Tensor

from perfcounter.costs._core import ZERO, Cost, register

COLLECTIVES = ("all_reduce", "all_gather", "send_recv", "all_to_all")


@torch.library.custom_op("perfcounter::all_reduce", mutates_args=())
def all_reduce(x: Tensor, ranks: int) -> Tensor:
    """The sum of x over `ranks` ranks (here: this rank's x)."""
    return x.clone()


@all_reduce.register_fake
def _all_reduce_shape(x, ranks):
    return torch.empty_like(x)


@torch.library.custom_op("perfcounter::all_gather", mutates_args=())
def all_gather(x: Tensor, ranks: int, dim: int) -> Tensor:
    """The `ranks` shards x joined along `dim` (here: x repeated)."""
    return torch.cat([x] * ranks, dim=dim)


@all_gather.register_fake
def _all_gather_shape(x, ranks, dim):
    shape = list(x.shape)
    shape[dim] *= ranks
    return x.new_empty(shape)


@torch.library.custom_op("perfcounter::send_recv", mutates_args=())
def send_recv(x: Tensor, stages: int) -> Tensor:
    """x sent to the next of `stages` pipeline stages, received there."""
    return x.clone()


@send_recv.register_fake
def _send_recv_shape(x, stages):
    return torch.empty_like(x)


@torch.library.custom_op("perfcounter::all_to_all", mutates_args=())
def all_to_all(x: Tensor, ranks: int) -> Tensor:
    """x's rows exchanged among `ranks` ranks (rows to the ranks of their experts)."""
    return x.clone()


@all_to_all.register_fake
def _all_to_all_shape(x, ranks):
    return torch.empty_like(x)


def collective_cost(*args, out_shape=None, **kw) -> Cost:
    """A collective: no arithmetic (see the module doc); the mode counts its memory bytes.

    NB: an all-reduce's additions run in the communication kernel, priced on the link."""
    return ZERO


register(torch.ops.perfcounter.all_reduce, torch.ops.perfcounter.all_gather,
         torch.ops.perfcounter.send_recv, torch.ops.perfcounter.all_to_all)(collective_cost)


def tp_all_reduce(x: Tensor, ranks: int) -> Tensor:
    """x summed over a tensor-parallel group of `ranks`; x itself when there is one rank (no
    op: an unsharded model runs exactly as before)."""
    return x if ranks == 1 else torch.ops.perfcounter.all_reduce(x, ranks)


def tp_all_gather(x: Tensor, ranks: int, dim: int = -1) -> Tensor:
    """The shards of x joined along `dim` over `ranks`; x itself for one rank."""
    return x if ranks == 1 else torch.ops.perfcounter.all_gather(x, ranks, dim % x.dim())


def ep_all_to_all(x: Tensor, ranks: int) -> Tensor:
    """x's rows exchanged among `ranks` expert-parallel ranks; x itself for one rank."""
    return x if ranks == 1 else torch.ops.perfcounter.all_to_all(x, ranks)


def send_recv_stages(x: Tensor, stages: int) -> Tensor:
    """x sent to the next pipeline stage; x itself without stages."""
    return x if stages == 1 else torch.ops.perfcounter.send_recv(x, stages)
