"""Fused IO: the bytes a compiled program moves outside its matmul and attention kernels
(the compiled and cudagraphs regimes of pricing/predict.py), counted beside compulsory IO.

A compiler keeps each extern op (`OpPlan.extern`: matmuls, attention) a kernel of its own
and fuses every other op into the kernels between them, where intermediates stay in
registers. Each storage's content has a stage: how many extern kernels lie on the longest
chain of ops that made it (weights, buffers, inputs and KV caches 0; an extern op's output
1 + its inputs' highest; a fused op's output its inputs' highest). Fused ops of one stage
can run as one kernel: a compiler fuses by dependency, not program order, so
silu(w1(x)) * w3(x) is one kernel after both matmuls, whichever matmul ran first.

- A fused op's read is charged unless a fused op of its own stage wrote the storage:
  weights, buffers, KV cache, inputs, extern outputs and fused outputs of an earlier stage
  (the residual stream) cost their bytes, each storage at most its size per stage; a
  gather's rows (embedding, RoPE rows by position) as many as it reads, so that a step's
  figure stays affine in its tokens.
- A fused op's write is charged when its value leaves the kernel: at once into a storage
  that existed before the block (a KV-cache index_copy_, an in-place update of a buffer or
  an input), else deferred until an extern op or a fused op of another stage reads it, once.
  A value never read again in the block (a phase output left for the caller: a few bytes)
  is not charged.
- Extern ops' own reads and writes are not fused IO: their records price them. Views move
  nothing.

storage.py keeps the state on each `Storage` (`stage`, `fused`, `pending`, `read_stage`,
`read_bytes`) and the block's bytes by ROLES in `Compulsory.fused_read` / `fused_written`;
`StorageTable.account` applies the writes and an extern op's reads, `fused_reads` below a
fused op's reads.
"""
from __future__ import annotations

_ROWS = 1  # op_plan.Place.ROWS (op_plan imports storage, which imports this)


def fused_reads(seen: list, stage: int, read: list, written: list, reported: tuple) -> None:
    """A fused op's reads, `seen` as (Storage, bytes, Place), at `stage` (the op's): those of
    a storage no fused op of its stage wrote are charged, and a value an earlier kernel wrote
    and kept back leaves it now. read / written: bytes by ROLES, added to; reported: a
    storage role's index in ROLES."""
    for st, nbytes, place in seen:
        if st.fused and st.stage == stage:
            continue  # made in this kernel: kept in registers
        if st.pending:
            written[reported[st.role]] += st.pending
            st.pending = 0
        if place == _ROWS:
            read[reported[st.role]] += nbytes
            continue
        if st.read_stage != stage:
            st.read_stage, st.read_bytes = stage, 0
        n = st.size - st.read_bytes
        if nbytes < n:
            n = nbytes
        if n > 0:
            st.read_bytes += n
            read[reported[st.role]] += n
