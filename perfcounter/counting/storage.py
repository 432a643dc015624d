"""Storage roles and compulsory IO: which memory each tensor lives in, and what a phase
must move at least.

Roles are kept per storage (views share their base's storage, so its role):
a parameter's storage is `weight`; a module's buffer (a RoPE table, a mask) is
`buffer`; a storage an op produced in this phase is `activation`; one that
existed before the phase and belongs to no module is `input` (token ids,
positions, a mask made outside the model) — until a cache write (copy_,
index_copy_, index_put_ into it) or attention reading it as keys/values makes
it `kv_cache`. Concatenating onto a KV cache (a growing cache) yields KV cache.
Weights, buffers and KV caches keep their role from one block to the next
while their storage lives (a freed storage's address may come back as another).

Compulsory IO (each storage region read at most once and written at most once
per phase): an access to a whole storage is summed at once and flagged on its
`Storage`; partial accesses are noted as regions and merged when the block's
trace is built (`Compulsory.totals`).

Fused IO (what a compiled program moves outside its matmul and attention kernels) is kept
beside it, each storage's stage on its `Storage`, the model in fused_io.py.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from perfcounter.counting.fused_io import fused_reads
from perfcounter.trace import ROLES


class Role(enum.IntEnum):
    """A storage's role. The first five are ROLES; FRESH and JOINED are activations
    that may still become KV cache (made by a factory, or by concatenation)."""
    WEIGHT = 0
    KV_CACHE = 1
    ACTIVATION = 2
    INPUT = 3
    BUFFER = 4
    FRESH = 5
    JOINED = 6


# Plain ints on the hot path (an IntEnum member hashes through Python code).
WEIGHT, KV, ACTIVATION, INPUT, BUFFER, FRESH, JOINED = (int(r) for r in Role)
SKIP = 7  # in a call's roles: a tensor passed twice, read once
_REPORTED = (0, 1, 2, 3, 4, 2, 2)
_KEPT = (WEIGHT, KV, BUFFER)  # roles that outlive a block
_BEFORE = (True, True, False, True, True, False, False)  # by role: existed before the block
assert ROLES == tuple(r.name.lower() for r in Role)[:5]

storage_id = getattr(torch._C, "_storage_id", None) or (lambda t: t.untyped_storage()._cdata)
_expired = torch.UntypedStorage._expired  # of a StorageWeakRef's cdata


def reported_role(role: int) -> int:
    """The index in ROLES a storage role is reported under."""
    return _REPORTED[role]


class Storage:
    """One storage as the counter knows it in the current block."""

    __slots__ = ("role", "size", "alloc", "read", "written", "part_read", "part_written", "ref",
                 "stage", "fused", "pending", "read_stage", "read_bytes")

    def __init__(self, role: int, size: int, alloc: int, ref=None):
        self.role = role
        self.size = size  # bytes
        self.alloc = alloc  # allocation number: tells apart storages that reuse an address
        self.read = self.written = False  # whole storage read / written in this block
        self.part_read = self.part_written = False  # part of it, noted as regions
        self.ref = ref  # StorageWeakRef for roles that outlive a block
        # fused IO (fused_io.py), written out: a new output's storage is made on the hot path
        self.stage = 0  # extern kernels on the longest chain that made its content
        self.fused = False  # its content was last written by a fused op (of `stage`)
        self.pending = 0  # bytes a fused op wrote that are charged once read elsewhere
        self.read_stage, self.read_bytes = -1, 0  # fused reads charged in that stage

    def forget_fused(self) -> None:
        """The fused-IO state of a storage made before the block (as __init__ sets it)."""
        self.stage, self.fused, self.pending, self.read_stage, self.read_bytes = 0, False, 0, -1, 0


class Region:
    """The first region of a storage touched partly in a block (for reads or for writes)."""

    __slots__ = ("offset", "nbytes", "role", "size")

    def __init__(self, offset: int, nbytes: int, role: int, size: int):
        self.offset, self.nbytes, self.role, self.size = offset, nbytes, role, size


@dataclass
class Compulsory:
    """One block's compulsory-IO state."""

    read: list[int] = field(default_factory=lambda: [0] * len(Role))  # whole accesses by Role
    written: list[int] = field(default_factory=lambda: [0] * len(Role))
    whole_read: set[int] = field(default_factory=set)  # allocations also read whole
    whole_written: set[int] = field(default_factory=set)
    regions: dict[tuple[int, bool], Region] = field(default_factory=dict)  # (alloc, is write)
    more: list[tuple[tuple[int, bool], int, int]] = field(default_factory=list)  # further regions
    kv_allocs: set[int] = field(default_factory=set)  # allocations that are KV cache
    fused_read: list[int] = field(default_factory=lambda: [0] * len(ROLES))  # by ROLES
    fused_written: list[int] = field(default_factory=lambda: [0] * len(ROLES))

    def totals(self) -> tuple[list[int], list[int]]:
        """(bytes read, bytes written) by ROLES: partial regions merged per storage
        ([offset, offset + bytes), scattered rows added, never more than the storage,
        nothing a whole access already covered); a storage that became KV cache
        counts as KV cache."""
        read, written = [0] * len(ROLES), [0] * len(ROLES)
        for role in Role:
            read[_REPORTED[role]] += self.read[role]
            written[_REPORTED[role]] += self.written[role]
        more: dict[tuple, list] = {}
        for key, off, nbytes in self.more:
            more.setdefault(key, []).append((off, nbytes))
        for key, first in self.regions.items():
            alloc, is_write = key
            if alloc in (self.whole_written if is_write else self.whole_read):
                continue
            nbytes = first.nbytes
            if key in more:
                regions = set(more[key]) | {(first.offset, first.nbytes)}
                nbytes, end = 0, -1
                for off, n in sorted(r for r in regions if r[0] >= 0):
                    lo = max(off, end)
                    if off + n > lo:
                        nbytes += off + n - lo
                    end = max(end, off + n)
                nbytes += sum(n for off, n in regions if off < 0)
            role = KV if alloc in self.kv_allocs else _REPORTED[first.role]
            (written if is_write else read)[role] += min(nbytes, first.size)
        return read, written


class StorageTable:
    """Roles of the storages seen so far, and the current block's compulsory IO."""

    def __init__(self):
        self.by_id: dict[int, Storage] = {}
        self._allocs = 0
        self.kv_valid_bytes: dict[int, int] = {}  # KV allocation -> bytes of valid positions
        self.kv_allocs: set[int] = set()
        self.comp = Compulsory()
        self.kv_valid_read = 0  # bytes of valid KV positions attention read in this block

    def reset(self) -> None:
        """A new block: forget activations and inputs; weights, buffers and KV caches keep
        their role while their storage lives, with fresh flags."""
        kept = {}
        for sid, st in self.by_id.items():
            if st.role in _KEPT and st.ref is not None and not _expired(st.ref.cdata):
                st.read = st.written = st.part_read = st.part_written = False
                st.forget_fused()
                kept[sid] = st
        self.by_id = kept
        if len(self.kv_valid_bytes) > 2 * len(kept) + 64:  # forget dead allocations now and then
            live = {st.alloc for st in kept.values()}
            self.kv_valid_bytes = {a: n for a, n in self.kv_valid_bytes.items() if a in live}
            self.kv_allocs = {a for a in self.kv_allocs if a in live}
        self.comp = Compulsory(kv_allocs=set(self.kv_allocs))  # old blocks keep theirs
        self.kv_valid_read = 0

    # -- lookups ---------------------------------------------------------------------
    def new(self, sid: int, role: int, size: int, storage=None) -> Storage:
        """A storage first seen in this block (weights, buffers and KV keep a weak ref to
        their untyped `storage`, so that they outlive the block only while it lives)."""
        self._allocs += 1
        st = Storage(role, size, self._allocs,
                     StorageWeakRef(storage) if role in _KEPT else None)
        self.by_id[sid] = st
        return st

    def fresh(self, t) -> None:
        """A tensor the Python constructor made in this block (torch.tensor(...) arrives as
        lift_fresh, its copy unseen): an activation, whatever a freed storage at the same
        address was."""
        self.new(storage_id(t), ACTIVATION, t.untyped_storage().nbytes())

    def first_sight(self, t, sid: int) -> Storage:
        base = t._base if t._base is not None else t
        param = isinstance(t, torch.nn.Parameter) or isinstance(base, torch.nn.Parameter)
        storage = t.untyped_storage()
        return self.new(sid, WEIGHT if param else INPUT, storage.nbytes(), storage)

    def lookup(self, t) -> Storage:
        sid = storage_id(t)
        st = self.by_id.get(sid)
        return self.first_sight(t, sid) if st is None else st

    def register(self, tensor, role: int) -> None:
        """A module's parameter (WEIGHT) or buffer (BUFFER), when its module first runs;
        a buffer that already became KV cache stays KV cache."""
        storage = tensor.untyped_storage()
        st = self.by_id.get(storage._cdata)
        if st is None or (st.role != role and st.role != KV):
            self.new(storage._cdata, role, storage.nbytes(), storage)

    # -- KV cache --------------------------------------------------------------------
    def make_kv(self, st: Storage, storage) -> None:
        """Mark a storage KV cache; move what the block already counted for it whole into
        the KV-cache bucket."""
        old = st.role
        st.role = KV
        st.ref = StorageWeakRef(storage)
        self.kv_allocs.add(st.alloc)
        self.comp.kv_allocs.add(st.alloc)
        for flag, counted in ((st.read, self.comp.read), (st.written, self.comp.written)):
            if flag and old != KV:
                counted[old] -= st.size
                counted[KV] += st.size

    def new_kv_output(self, o, nbytes: int) -> Storage:
        """A new storage that is KV cache from the start (a cache grown by concatenation)."""
        st = self.new(storage_id(o), KV, nbytes, o.untyped_storage())
        st.written = True
        self.comp.written[KV] += nbytes
        self.kv_valid_bytes[st.alloc] = nbytes
        self.kv_allocs.add(st.alloc)
        self.comp.kv_allocs.add(st.alloc)
        return st

    def promote(self, plan, tensors) -> None:
        """KV-cache detection for cache writes and attention (rare ops)."""
        if plan.cache_write:
            for w in plan.writes:
                t = tensors[w.index]
                st = self.lookup(t)
                if st.role in (INPUT, FRESH, BUFFER, KV):
                    if st.role != KV:
                        self.make_kv(st, t.untyped_storage())
                    self.kv_valid_bytes[st.alloc] = min(
                        self.kv_valid_bytes.get(st.alloc, 0) + w.nbytes, st.size)
            return
        key = None
        for r in plan.reads[1:3]:  # key, value
            t = tensors[r.index]
            if t is key:  # value is key: read once
                continue
            key = t
            st = self.lookup(t)
            if st.role in (INPUT, JOINED, BUFFER):
                self.make_kv(st, t.untyped_storage())
                self.kv_valid_bytes[st.alloc] = st.size
            if st.role == KV:
                size = st.size or r.nbytes  # in integers: a float share rounds (off by a byte)
                valid = min(self.kv_valid_bytes.get(st.alloc, size), size)
                self.kv_valid_read += r.nbytes * valid // size

    # -- compulsory regions ------------------------------------------------------------
    def touch_part(self, st: Storage, offset: int, nbytes: int, write: bool) -> None:
        """Part of a storage read (or written): its first region per block is kept, further
        distinct ones listed (offset -1: scattered rows)."""
        if write:
            st.part_written = True
        else:
            st.part_read = True
        key = (st.alloc, write)
        first = self.comp.regions.get(key)
        if first is None:
            self.comp.regions[key] = Region(offset, nbytes, st.role, st.size)
        elif first.offset != offset or first.nbytes != nbytes:
            self.comp.more.append((key, offset, nbytes))

    def account(self, plan, tensors, out) -> tuple:
        """One call's bookkeeping: each tensor's role (returned, in the order of
        `OpPlan.contribution`), and what the compulsory and fused-IO models must add."""
        if plan.cache_write or plan.attention:
            self.promote(plan, tensors)
        roles = []
        stage, reads_kv = self._reads(plan, tensors, roles)
        self._writes(plan, tensors, roles, stage)
        if plan.outputs:
            self._outputs(plan, out, roles, stage, reads_kv)
        return tuple(roles)

    def _reads(self, plan, tensors, roles: list) -> tuple[int, bool]:
        """The call's reads: each one's role onto `roles`, the compulsory bytes, and the
        fused-IO charges; returns (the stage its writes get, whether it read KV cache)."""
        by_id, comp = self.by_id, self.comp
        extern, fused_written = plan.extern, comp.fused_written
        seen, stage = [], 0  # a fused op's reads (storage, bytes, place); the highest stage read
        skip = ()
        for i, j in plan.dups:  # the same tensor passed twice (x * x) is read once
            if tensors[i] is tensors[j]:
                skip += (j,)
        reads_kv = False
        for index, nbytes, itemsize, place in plan.reads:
            if skip and index in skip:
                roles.append(SKIP)
                continue
            t = tensors[index]
            sid = storage_id(t)
            st = by_id.get(sid)
            if st is None:
                st = self.first_sight(t, sid)
            role = st.role
            roles.append(role)
            if st.stage > stage:
                stage = st.stage
            if not extern:
                seen.append((st, nbytes, place))
            elif st.pending:  # an extern kernel reads what a fused one wrote: it left that kernel
                fused_written[_REPORTED[role]] += st.pending
                st.pending = 0
            if role == KV:
                reads_kv = True
            if st.read:
                continue  # read whole already in this block
            if place == 0:  # Place.REGION
                if nbytes == st.size:  # the whole storage (so its offset is 0)
                    st.read = True
                    comp.read[role] += nbytes
                    if st.part_read:
                        comp.whole_read.add(st.alloc)
                    continue
                offset = t.storage_offset() * itemsize
            elif place == 1:  # Place.ROWS
                offset = -1
            else:  # a broadcast view never reads more than its storage
                offset, nbytes = t.storage_offset() * itemsize, min(nbytes, st.size)
            self.touch_part(st, offset, nbytes, False)
        if extern:
            stage += 1
        elif seen:
            fused_reads(seen, stage, comp.fused_read, fused_written, _REPORTED)
        return stage, reads_kv

    def _writes(self, plan, tensors, roles: list, stage: int) -> None:
        """The call's writes into existing storages: each one's role onto `roles`, its
        fused-IO stage, and the compulsory bytes."""
        comp, extern, fused_written = self.comp, plan.extern, self.comp.fused_written
        for index, nbytes, scattered in plan.writes:
            t = tensors[index]
            st = self.lookup(t)
            roles.append(st.role)
            st.stage = stage
            if extern:
                st.fused, st.pending = False, 0
            elif _BEFORE[st.role]:  # outlives the block: the value leaves the kernel now
                st.fused = False
                fused_written[_REPORTED[st.role]] += min(nbytes, st.size)
            else:
                st.fused = True
                st.pending = min(st.pending + nbytes, st.size)
            if st.written:
                continue
            if scattered:
                offset = -1
            elif nbytes == st.size:
                st.written = True
                comp.written[st.role] += nbytes
                if st.part_written:
                    comp.whole_written.add(st.alloc)
                continue
            else:
                offset = t.storage_offset() * t.element_size()
            self.touch_part(st, offset, nbytes, True)

    def _outputs(self, plan, out, roles: list, stage: int, reads_kv: bool) -> None:
        """The call's new storages, a fresh allocation each, written whole (KV cache when a
        concatenation grows one); their role onto `roles`."""
        comp, extern = self.comp, plan.extern
        role = KV if plan.out_role == JOINED and reads_kv else plan.out_role
        outs = (out,) if isinstance(out, torch.Tensor) else flat_tensors(out)
        for index, nbytes in plan.outputs:
            o = outs[index]
            if role == KV:
                st = self.new_kv_output(o, nbytes)
                if not extern:
                    comp.fused_written[KV] += nbytes
            elif nbytes:
                self._allocs += 1
                st = self.by_id[storage_id(o)] = Storage(role, nbytes, self._allocs)
                st.written = True
                comp.written[role] += nbytes
                if not extern:
                    st.fused, st.pending = True, nbytes
            else:  # an empty() is not written
                st = self.new(storage_id(o), role, o.untyped_storage().nbytes())
            st.stage = stage
            roles.append(role)

def flat_tensors(x) -> list:
    """The tensors of an op's argument or output, lists and tuples flattened."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat_tensors(v)]
    return []
