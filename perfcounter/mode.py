"""PerformanceCounterMode: a TorchDispatchMode that counts every aten op.

For each op it records FLOPs by kind (costs.py), bytes read and written by the
role of each tensor (weight, KV cache, activation, input) and the module it ran
under; each call is logged as (module, entry, roles) and the logs of one or
more blocks become a `Trace` (trace.py) when someone asks. The hot path runs
for every op (~2,000 per decode step), so everything that depends only on
(op, shapes, dtypes, arguments) is computed once and cached in an `_Entry`;
per call the mode looks up one code per tensor storage (role, size, whether
the block already read or wrote it whole) and, for most ops, takes a short
path that a test holds equal to the general one.

Roles are kept per storage: a parameter's storage is `weight`; a storage that
an op produced in this phase is `activation`; one that existed before the
phase is `input`, until a cache write (copy_, index_copy_, index_put_ into it)
or attention reading it as keys/values marks it `kv_cache`; concatenating onto
a KV cache (a growing cache) yields KV cache. Views share their base's storage
and so its role, and move no bytes.
"""
from __future__ import annotations

import time
import warnings
import weakref
from collections import Counter

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.module_tracker import ModuleTracker

from perfcounter import costs
from perfcounter.trace import KINDS, ROLES, ModuleInfo, OpRecord, Trace, merge_modules

aten = torch.ops.aten
Tensor = torch.Tensor

# Storage roles. The first four index ROLES; the rest are activations that may
# still become KV cache (made by a factory, or by concatenation).
WEIGHT, KV, ACT, INPUT, FRESH, JOINED, SKIP = range(7)
_ROLE_INDEX = (0, 1, 2, 3, 2, 2)
# A storage code is (bytes << _SIZE) | (allocation << _SHIFT) | flags | role: the size
# tells a read of the whole storage without asking the tensor; the allocation number
# tells apart storages that reuse a freed one's address; the role can change (an input
# buffer becomes KV cache) while the number stays. Flags: the block has already read /
# written the whole storage (the compulsory model counts that once, and nothing after
# it), or has read / written part of it (noted as regions, merged at build).
_READ, _WRITTEN, _PART_READ, _PART_WRITTEN = 8, 16, 32, 64
_FLAGS, _SHIFT, _SIZE = 120, 7, 56
_STEP = 1 << _SHIFT
_ALLOC = (1 << (_SIZE - _SHIFT)) - 1  # (code >> _SHIFT) & _ALLOC: the allocation number
_storage_id = getattr(torch._C, "_storage_id", None) or (lambda t: t.untyped_storage()._cdata)
_clock = time.perf_counter
_expired = torch.UntypedStorage._expired  # of a StorageWeakRef's cdata

# How an op is handled, decided once per OpOverload.
_COUNT, _VIEW, _VIEW_OR_COPY, _DYNAMIC, _HOP, _FUSED, _DECOMPOSE = range(7)
# _DYNAMIC: output shape depends on data. _VIEW_OR_COPY: composites that return their
# input (or a view of it) when they can and a copy otherwise; decided per call.
_VIEW_OR_COPY_OPS = {aten.to, aten.reshape, aten.contiguous, aten.flatten, aten.type_as}
# _FUSED: composites that run one fused kernel when the dispatcher picks one (then priced
# whole, as one op: cheaper than re-entering the mode for the decomposition) and a chain
# of ops otherwise (then decomposed). Maps the op to its choice op (0 = no fused kernel).
_FUSED_CHOICE = {aten.scaled_dot_product_attention: aten._fused_sdp_choice.default}
_OP_KIND: dict = {}  # id(op) -> (how it is handled, what to call to run it)
_OP_NAMES: dict = {}  # id(op) -> "aten.mm.default"
_ENTRIES: dict = {}  # key -> _Entry, shared by all modes (costs depend on shapes only)
_WARNED: set[str] = set()
_FAST = True  # False: every op through the general path of _record (tests compare both)

# Write-only destinations: the op overwrites them without reading them first.
_WRITE_ONLY = {aten.copy_, aten.fill_, aten.zero_, aten.index_copy_, aten.index_put_,
               aten.scatter_, aten.exponential_, aten.uniform_, aten.normal_, aten.random_,
               aten.bernoulli_, aten.set_, aten.resize_}
_CACHE_WRITES = {aten.copy_, aten.index_copy_, aten.index_put_, aten.slice_scatter,
                 aten.scatter_}
_JOINS = {aten.cat, aten.stack}
_FACTORIES = {aten.zeros, aten.empty, aten.full, aten.ones, aten.empty_strided,
              aten.new_zeros, aten.new_empty, aten.new_full, aten.new_ones,
              aten.zeros_like, aten.empty_like, aten.full_like, aten.ones_like}
_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu,
              aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
              aten._scaled_dot_product_cudnn_attention, aten._flash_attention_forward,
              aten.scaled_dot_product_attention,
              aten._efficient_attention_forward}
# Views whose schema does not say so.
_EXTRA_VIEWS = {aten._unsafe_view, aten._reshape_alias, aten.detach_, aten.t_, aten.transpose_,
                aten.squeeze_, aten.unsqueeze_, aten.as_strided_, aten.swapdims_, aten.swapaxes_}


def _classify(func) -> int:
    """Decide once per op how the mode treats it."""
    if isinstance(func, torch._ops.HigherOrderOperator):
        kind = _HOP
    elif func._overloadpacket in _VIEW_OR_COPY_OPS:
        kind = _VIEW_OR_COPY
    elif func._overloadpacket in _FUSED_CHOICE:
        kind = _FUSED
    elif func._overloadpacket in costs.COSTS:
        kind = _COUNT
    elif _is_composite(func):
        kind = _DECOMPOSE  # reaches us under inference_mode; count its parts instead
    elif func._overloadpacket in _EXTRA_VIEWS or _is_view(func) or _is_metadata(func):
        kind = _VIEW
    else:
        kind = _COUNT
    if kind == _COUNT and torch.Tag.dynamic_output_shape in func.tags:
        kind = _DYNAMIC
    # an OpOverload's C++ callable directly: one Python frame less per op
    call = func._op if type(func) is torch._ops.OpOverload else func
    _OP_KIND[id(func)] = kind, call  # ops live as long as the process; id() hashes fast
    _OP_NAMES[id(func)] = str(func)
    return kind, call


def _is_composite(func) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    except RuntimeError:  # prim:: ops are not in the dispatcher's table
        return False


def _is_metadata(func) -> bool:
    """Ops that return no tensor (size, stride, device, ...): they move no data."""
    return all("Tensor" not in str(r.type) for r in func._schema.returns)


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


class _Entry:
    """What is constant across calls of one op with one argument signature."""

    __slots__ = ("func", "name", "dtype", "shapes", "cost", "flops", "executed", "reads",
                 "writes_in", "writes_out", "has_formula", "special", "out_role", "dups", "rare",
                 "fast", "fast_reads", "out_code", "out_bytes")

    def __init__(self, func, args, kwargs, out, tensors):
        self.func = func
        self.name = str(func)
        packet = getattr(func, "_overloadpacket", func)
        formula = costs.COSTS.get(packet)
        flat_args = _schema_args(func, args, kwargs, len(tensors))
        out_tensors = _flat_tensors(out)
        shaped = _shape_tree(args), {k: _shape_tree(v) for k, v in kwargs.items()}
        out_shape = _shape_tree(out) if not isinstance(out, Tensor) else tuple(out.shape)
        self.shapes = _signature(args, kwargs)
        self.dtype = next((str(t.dtype).replace("torch.", "") for t in [*tensors, *out_tensors]
                           if t.is_floating_point()), str(tensors[0].dtype).replace("torch.", "")
                          if tensors else "")
        cost = costs.ZERO
        self.has_formula = formula is not None
        if formula is not None:
            try:
                cost = formula(*shaped[0], out_shape=out_shape, **shaped[1])
            except Exception as e:  # a formula that cannot price these arguments
                self.has_formula = False
                warnings.warn(f"perfcounter: cost formula for {self.name} failed on "
                              f"{self.shapes}: {e!r}; counting its bytes only", stacklevel=3)
        self.cost = cost
        self.flops = cost.flops
        self.executed = cost.executed if cost.executed is not None else cost.flops
        # bytes: which tensors are read, which written in place, which outputs are new
        reads, writes_in = [], []
        for i, t in enumerate(tensors):
            written, name = flat_args[i]
            size = t.element_size()
            whole = t.numel()
            if written:
                partial = cost.write_elems is not None
                writes_in.append((i, (cost.write_elems if partial else whole) * size, partial))
                if packet in _WRITE_ONLY or name == "out":
                    continue
            elems = cost.read_elems[i] if cost.read_elems and i < len(cost.read_elems) else None
            # how the compulsory model places the read: 1 scattered rows, 2 a broadcast
            # view (more elements than storage), 0 a plain region
            place = 1 if elems is not None else 2 if any(
                st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)) else 0
            reads.append((i, (whole if elems is None else elems) * size, size, place))
        self.reads = tuple(reads)
        self.writes_in = tuple(writes_in)
        rets = getattr(func, "_schema", None)
        aliased = ([r.alias_info is not None for r in rets.returns]
                   if rets is not None and packet not in _VIEW_OR_COPY_OPS else [])
        writes_out = []
        for j, o in enumerate(out_tensors):
            if aliased and (aliased[0] if len(aliased) == 1 else j < len(aliased) and aliased[j]):
                continue  # a view of an input, or the in-place target itself
            n = o.numel() if cost.write_elems is None or writes_in else cost.write_elems
            writes_out.append((j, n * o.element_size()))
        self.writes_out = tuple(writes_out)
        self.out_role = (FRESH if packet in _FACTORIES else JOINED if packet in _JOINS else ACT)
        # see _promote: 1 a cache write, 2 attention (reads keys and values), 0 neither
        self.special = 1 if packet in _CACHE_WRITES else 2 if packet in _ATTENTION else 0
        self.dups = tuple((a[0], b[0]) for k, a in enumerate(reads) for b in reads[k + 1:]
                          if tensors[a[0]].shape == tensors[b[0]].shape
                          and tensors[a[0]].dtype == tensors[b[0]].dtype)
        self.rare = self.special or bool(self.dups)  # one test on the hot path for both
        # The common case, counted by a shorter path in _record: plain reads (no rows, no
        # broadcast; a call that passes one tensor twice takes the general path), nothing
        # written in place, at most one new output, written (its code but for the
        # allocation number is fixed: out_code; a join onto a KV cache is KV cache).
        self.fast = (_FAST and not self.special and not writes_in and all(r[3] == 0 for r in reads)
                     and (not writes_out or (isinstance(out, Tensor) and len(writes_out) == 1
                                             and writes_out[0][1] > 0)))
        self.fast_reads = tuple((i, nbytes) for i, nbytes, _, _ in reads)
        self.out_bytes = writes_out[0][1] if self.fast and writes_out else 0
        self.out_code = ((self.out_bytes << _SIZE) | _WRITTEN | self.out_role
                         if self.out_bytes else None)

    @property
    def packet(self):
        return getattr(self.func, "_overloadpacket", self.func)


def _flat_tensors(x) -> list:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat_tensors(v)]
    return []


def _shape_tree(x):
    if isinstance(x, Tensor):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)):
        return type(x)(_shape_tree(v) for v in x)
    return x


def _signature(args, kwargs) -> str:
    """Readable argument signature: tensor shapes, then scalars that change the cost."""

    def fmt(x):
        if isinstance(x, Tensor):
            return str(list(x.shape))
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(fmt(v) for v in x) + "]"
        return repr(x)

    parts = [fmt(a) for a in args]
    parts += [f"{k}={fmt(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _schema_args(func, args, kwargs, n_tensors) -> list[tuple[bool, str]]:
    """For each tensor in flattened argument order: (is written by the op, argument name)."""
    schema = getattr(func, "_schema", None)
    result = []
    if schema is None:
        return [(False, "")] * n_tensors
    by_name = {a.name: a for a in schema.arguments}
    pairs = list(zip(schema.arguments, args)) + [(by_name.get(k), v) for k, v in kwargs.items()]
    for arg, value in pairs:
        written = bool(arg is not None and arg.alias_info is not None and arg.alias_info.is_write)
        name = arg.name if arg is not None else ""
        result += [(written, name)] * len(_flat_tensors(value))
    return result + [(False, "")] * (n_tensors - len(result))


def _module_info(name: str, mod) -> ModuleInfo:
    params = list(mod.parameters(recurse=False))
    return ModuleInfo(name, type(mod).__name__, 0, sum(p.numel() for p in params),
                      sum(p.numel() * p.element_size() for p in params))


def _fill_io(info: ModuleInfo, args, kwargs, output) -> None:
    """A module's first call: the shapes of its tensor arguments and the bytes of its input
    and output (the first tensor of each)."""
    tensors = _flat_tensors(list(args)) + _flat_tensors(list(kwargs.values()))
    info.input_shapes = "x".join(str(list(t.shape)) for t in tensors)
    info.input_bytes = tensors[0].numel() * tensors[0].element_size() if tensors else 0
    outs = _flat_tensors(output if isinstance(output, (Tensor, list, tuple)) else
                         list(output.values()) if isinstance(output, dict) else [])
    info.output_bytes = outs[0].numel() * outs[0].element_size() if outs else 0


class _ModulePath(ModuleTracker):
    """ModuleTracker that also knows the innermost module, truncated to `depth` parts.

    Names are ModuleTracker's ("LlamaForCausalLM.model.layers.0.mlp"); "" outside any module.
    """

    def __init__(self, depth: int, on_new_module=None):
        super().__init__()
        self.depth = depth
        self.on_new_module = on_new_module
        self.stack: list[tuple] = []  # entries of _names() for the modules running now
        self.current = ""
        self.modules: dict[str, ModuleInfo] = {}  # full name -> info, this block's modules
        # id(module) -> (weakref, full name, name truncated to depth, id, listed in modules): ModuleTracker's
        # weak dictionaries are slow on a path that runs twice per module call
        self._by_id: dict[int, tuple] = {}

    def _name(self, mod) -> tuple:
        """The _by_id entry of a module seen for the first time (or whose id was reused)."""
        name = self._get_mod_name(mod)
        hit = self._by_id[id(mod)] = (weakref.ref(mod), name, ".".join(name.split(".")[: self.depth]),
                                      id(mod), len(name.split(".")) <= self.depth)
        if self.on_new_module is not None:
            self.on_new_module(mod)
        return hit

    # ModuleTracker's hooks, replaced: the mode reads only `current` (ModuleTracker's own
    # parents set, and the backward hooks that maintain it, are not needed for counting)
    def _fw_pre_hook(self, mod, input) -> None:
        hit = self._by_id.get(id(mod))
        if hit is None or hit[0]() is not mod:
            hit = self._name(mod)
        self.stack.append(hit)
        self.current = hit[2]
        if hit[4]:
            info = self.modules.get(hit[1])
            if info is None:
                info = self.modules[hit[1]] = _module_info(hit[1], mod)
            info.calls += 1

    def __enter__(self):
        self._fw_pre_handle = register_module_forward_pre_hook(self._fw_pre_hook)
        self._fw_post_handle = register_module_forward_hook(self._fw_post_hook, with_kwargs=True)
        return self

    def __exit__(self, *args):
        self._fw_pre_handle.remove()
        self._fw_post_handle.remove()

    def _fw_post_hook(self, mod, args, kwargs, output) -> None:
        stack = self.stack
        if stack and stack[-1][4] and stack[-1][3] == id(mod):
            info = self.modules[stack[-1][1]]
            if info.calls == 1 and not info.input_shapes:
                _fill_io(info, args, kwargs, output)
        if stack and stack[-1][3] == id(mod):  # the module is alive: its id is its own
            stack.pop()
        else:  # a module left out of order: drop its entry wherever it is
            self.stack = stack = [h for h in stack if h[3] != id(mod)]
        self.current = stack[-1][2] if stack else ""


_CONTRIB: dict = {}  # (entry, roles signature) -> bytes read and written by role


def _contribution(entry, sig) -> tuple[tuple, tuple]:
    """One call's bytes as ((role, bytes) read, (role, bytes) written), from the entry's
    byte counts and the roles its tensors had: sig holds one role per tensor, 3 bits
    each, first tensor in the highest digit (reads, then in-place writes, then outputs)."""
    read, written = [0] * len(ROLES), [0] * len(ROLES)
    n = len(entry.reads) + len(entry.writes_in) + len(entry.writes_out)
    roles = [(sig >> 3 * (n - 1 - k)) & 7 for k in range(n)]
    pos = 0
    for _, nbytes, _, _ in entry.reads:
        if roles[pos] != SKIP:
            read[_ROLE_INDEX[roles[pos]]] += nbytes
        pos += 1
    for _, nbytes, _ in entry.writes_in:
        written[_ROLE_INDEX[roles[pos]]] += nbytes
        pos += 1
    for _, nbytes in entry.writes_out:
        written[_ROLE_INDEX[roles[pos]]] += nbytes
        pos += 1
    return (tuple((i, b) for i, b in enumerate(read) if b),
            tuple((i, b) for i, b in enumerate(written) if b))


class PerformanceCounterMode(TorchDispatchMode):
    """Counts FLOPs by kind and bytes by role for every aten op run inside it.

    `with mode: model(x)`; then `mode.trace()` is that block's `Trace`. Entering
    again starts a new count; weight and KV-cache roles are remembered across
    blocks (a cache filled in prefill is read in decode). The torchao getters
    (get_total_flops, get_flop_counts, ...) read the last block.
    """

    supports_higher_order_operators = True

    def __init__(self, display: bool = False, depth: int = 10, debug: bool = False,
                 io_model: str = "per_op"):
        """display: print the per-module FLOPs summary when a block ends (torchao's flag);
        debug: also print every record (op, module, shapes, FLOPs, bytes) then."""
        super().__init__()
        import torch._dynamo  # noqa: F401  (a dispatch mode imports it on first use; not inside a timed block)
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive int, got {depth!r}")
        if io_model not in ("per_op", "compulsory"):
            raise ValueError(f"io_model must be 'per_op' or 'compulsory', got {io_model!r}")
        self.depth = depth
        self.io_model = io_model
        self.display = display
        self.debug = debug
        self._roles: dict[int, int] = {}  # storage -> role code
        self._refs: dict[int, StorageWeakRef] = {}  # storage -> weak ref, for weights and KV
        self._gen = 0  # allocation counter, in steps of _STEP (see _READ)
        self._kv_written: dict[int, int] = {}  # KV allocation -> bytes of valid positions
        self._kv_gens: set[int] = set()  # allocations that became KV cache (kept across blocks)
        self._active = False
        self._modules_seen: set[int] = set()
        self._tracker = _ModulePath(depth, self._register_module)  # kept: it caches module names
        self._trace = Trace()
        self._block = None
        self._reset()

    # -- lifecycle -------------------------------------------------------------------
    def _reset(self) -> None:
        self._log: list = []  # (module, entry, roles) per op call, counted by build_trace
        self._view_log: list = []  # (module, id(op)) per view call, counted by build_trace
        # compulsory IO: whole-storage accesses are summed by role at once (and flagged in
        # the code); partial ones go to _touched: (allocation << 1) | is_write -> first
        # (offset or -1, bytes, role), further distinct regions of that storage to _extra
        self._comp = ([0] * len(_ROLE_INDEX), [0] * len(_ROLE_INDEX))  # indexed by storage role
        self._whole = (set(), set())  # allocations read / written whole
        self._touched: dict = {}
        self._extra: list = []
        self._kv_valid = 0
        self._overhead = 0.0
        self._tracker.stack.clear()
        self._tracker.current = ""
        self._tracker.modules = {}
        # only weights (role 0) and KV caches (1) keep their role from one block to the
        # next, and only while their storage lives (else its address may come back as
        # another tensor's)
        refs = self._refs
        self._roles = roles = {s: c ^ (c & _FLAGS) for s, c in self._roles.items()
                               if not c & 6 and s in refs and not _expired(refs[s].cdata)}
        self._refs = {s: refs[s] for s in roles}
        if len(self._kv_written) > 2 * len(roles) + 64:  # forget dead allocations now and then
            live = {(c >> _SHIFT) & _ALLOC for c in roles.values()}
            self._kv_written = {g: n for g, n in self._kv_written.items() if g in live}
            self._kv_gens = {g for g in self._kv_gens if g in live}
        self._kv_gens = set(self._kv_gens)  # a new set: old blocks keep theirs

    def __enter__(self):
        if self._decomposing:  # re-entered to count a decomposition's parts
            return super().__enter__()
        if self._active:
            raise RuntimeError("this PerformanceCounterMode is already counting; "
                               "a mode cannot be nested inside itself")
        self._reset()
        self._active = True
        self._flex_flag = _set_flex_eager(True)
        self._tracker.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._tracker.__exit__(None, None, None)
            _set_flex_eager(self._flex_flag)
            self._active = False
            raise

    def __exit__(self, *exc):
        if self._decomposing:
            return super().__exit__(*exc)
        try:
            return super().__exit__(*exc)
        finally:
            self._tracker.__exit__(*exc)
            _set_flex_eager(self._flex_flag)
            self._active = False
            self._trace = None  # built on first request: trace() (keeps exit cheap)
            self._block = _Block(self._log, self._view_log,
                                 (self._comp, self._whole, self._touched, self._extra, self._kv_gens),
                                 self._kv_valid, self._overhead, list(self._tracker.modules.values()))
            if self.display or self.debug:  # asked for explicitly: torchao printed here
                self._show()

    _decomposing = 0

    def _decompose(self, func, args, kwargs):
        """Run a CompositeImplicit op's decomposition under this mode, so its parts are counted."""
        self._decomposing += 1
        try:
            with self:
                return func.decompose(*args, **kwargs)
        finally:
            self._decomposing -= 1

    # -- the hot path ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        info = _OP_KIND.get(id(func))
        if info is None:
            info = _classify(func)
        kind, call = info
        if kwargs is None:
            kwargs = {}
        if kind >= _FUSED:  # composites that reach the mode (under inference_mode)
            if kind == _FUSED:
                t0 = _clock()
                fused = _FUSED_CHOICE[func._overloadpacket](*args, **kwargs)
                self._overhead += _clock() - t0
                kind = _COUNT if fused else _DECOMPOSE
            if kind == _DECOMPOSE:
                out = self._decompose(func, args, kwargs)
                if out is not NotImplemented:
                    return out
                if info[0] == _DECOMPOSE:  # no decomposition after all: count it whole
                    _OP_KIND[id(func)] = _COUNT, call
                kind = _COUNT
        out = call(*args, **kwargs)
        t0 = _clock()
        if kind == _VIEW_OR_COPY:
            a = args[0]
            if (out is a or not isinstance(out, Tensor) or not isinstance(a, Tensor)
                    or _storage_id(out) == _storage_id(a)):
                kind = _VIEW
        if kind == _VIEW:
            self._view_log.append((self._tracker.current, id(func)))
        else:
            self._record(func, args, kwargs, out, kind)
        self._overhead += _clock() - t0
        return out

    def _record(self, func, args, kwargs, out, kind=_COUNT) -> None:
        """The one place an op is recorded: find the op's _Entry by its key (op, shapes,
        dtypes, other arguments), then look up the role of each tensor's storage and note
        what the compulsory model needs; the (module, entry, roles) triple is logged and
        counted when the block ends."""
        tensors = []
        key = [id(func)]
        for a in args:
            if isinstance(a, Tensor):
                tensors.append(a)
                key.append(a.shape)
                key.append(a.dtype)
            elif type(a) is list or type(a) is tuple:
                key.append(len(a))
                for b in a:
                    if isinstance(b, Tensor):
                        tensors.append(b)
                        key.append(b.shape)
                        key.append(b.dtype)
                    else:
                        key.append(b)
            else:
                key.append(a)
        if kwargs:
            for name, a in kwargs.items():
                key.append(name)
                if isinstance(a, Tensor):
                    tensors.append(a)
                    key.append(a.shape)
                    key.append(a.dtype)
                else:
                    key.append(a if type(a) is not list else tuple(a))
        if kind == _DYNAMIC:
            key.extend(t.shape for t in _flat_tensors(out))
        try:
            key = tuple(key)
            entry = _ENTRIES.get(key)
        except TypeError:  # an unhashable argument: describe this call afresh
            key, entry = None, None
        if entry is None:
            entry = _Entry(func, args, kwargs, out, tensors)
            if key is not None:
                if len(_ENTRIES) > 200_000:
                    _ENTRIES.clear()
                    _CONTRIB.clear()
                _ENTRIES[key] = entry
        roles = self._roles
        if entry.fast:  # see _Entry.fast; the general path below does the same, and more
            for i, j in entry.dups:
                if tensors[i] is tensors[j]:  # x * x: the general path reads x once
                    break
            else:  # the short path: the same counts as the general path below
                sig = 0
                for i, nbytes in entry.fast_reads:
                    t = tensors[i]
                    sid = _storage_id(t)
                    code = roles.get(sid)
                    if code is None:
                        code = self._first_sight(t, sid)
                    sig = sig * 8 + (code & 7)
                    if not code & _READ:
                        if nbytes == code >> _SIZE:  # the whole storage, first time in this block
                            roles[sid] = code | _READ
                            self._comp[0][code & 7] += nbytes
                            if code & _PART_READ:
                                self._whole[0].add((code >> _SHIFT) & _ALLOC)
                        else:
                            self._touch_part(sid, code, t.storage_offset() * t.element_size(), nbytes)
                if entry.out_code is not None:
                    self._gen = gen = self._gen + _STEP
                    r = entry.out_role
                    if r == JOINED:  # onto a KV cache (a role digit 1 in sig): KV cache
                        x = sig
                        for _ in entry.fast_reads:
                            if x & 7 == KV:
                                r = KV
                                break
                            x >>= 3
                    if r == KV:
                        self._kv_output(out, gen, entry.out_bytes)
                    else:
                        roles[_storage_id(out)] = entry.out_code | gen
                        self._comp[1][r] += entry.out_bytes
                    sig = sig * 8 + r
                self._log.append((self._tracker.current, entry, sig))
                return
        skip = ()
        if entry.rare:
            if entry.special:
                self._promote(entry, tensors)
            for i, j in entry.dups:  # the same tensor passed twice (x * x) is read once
                if tensors[i] is tensors[j]:
                    skip += (j,)
        sig = 0  # the role of each tensor in turn, 3 bits each (see _contribution)
        reads_kv = False
        comp_read, comp_written = self._comp
        for i, nbytes, size, place in entry.reads:
            if skip and i in skip:
                sig = sig * 8 + SKIP
                continue
            t = tensors[i]
            sid, code = self._lookup(t)
            r = code & 7
            sig = sig * 8 + r
            if r == KV:
                reads_kv = True
            if code & _READ:
                continue  # read whole already in this block: nothing more to read
            if not place:
                if nbytes == code >> _SIZE:  # the whole storage (so its offset is 0)
                    roles[sid] = code | _READ
                    comp_read[r] += nbytes
                    if code & _PART_READ:
                        self._whole[0].add((code >> _SHIFT) & _ALLOC)
                    continue
                off = t.storage_offset() * size
            elif place == 1:
                off = -1
            else:  # a broadcast view never reads more than its storage
                off, nbytes = t.storage_offset() * size, min(nbytes, t.untyped_storage().nbytes())
            self._touch_part(sid, code, off, nbytes)
        for i, nbytes, scattered in entry.writes_in:
            t = tensors[i]
            sid, code = self._lookup(t)
            r = code & 7
            sig = sig * 8 + r
            if code & _WRITTEN:
                continue
            if scattered:
                off = -1
            else:
                if nbytes == code >> _SIZE:
                    roles[sid] = code | _WRITTEN
                    comp_written[r] += nbytes
                    if code & _PART_WRITTEN:
                        self._whole[1].add((code >> _SHIFT) & _ALLOC)
                    continue
                off = t.storage_offset() * t.element_size()
            self._touch_part(sid, code, off, nbytes, write=1)
        if entry.writes_out:  # new storages: a fresh allocation each, written whole
            outs = (out,) if isinstance(out, Tensor) else _flat_tensors(out)
            r = entry.out_role
            if r == JOINED and reads_kv:
                r = KV  # joined onto a KV cache
            gen = self._gen
            for j, nbytes in entry.writes_out:
                gen += _STEP
                o = outs[j]
                if r == KV:
                    self._kv_output(o, gen, nbytes)
                elif nbytes:
                    roles[_storage_id(o)] = (nbytes << _SIZE) | gen | r | _WRITTEN
                    comp_written[r] += nbytes
                else:  # an empty() is not written
                    roles[_storage_id(o)] = (o.untyped_storage().nbytes() << _SIZE) | gen | r
                sig = sig * 8 + r
            self._gen = gen
        self._log.append((self._tracker.current, entry, sig))

    def _kv_output(self, o, gen: int, nbytes: int) -> None:
        """A new storage that is KV cache from the start (a cache grown by concatenation)."""
        sid = _storage_id(o)
        self._roles[sid] = (nbytes << _SIZE) | gen | KV | _WRITTEN
        self._comp[1][KV] += nbytes
        self._kv_written[gen >> _SHIFT] = nbytes
        self._refs[sid] = StorageWeakRef(o.untyped_storage())

    def _touch_part(self, sid: int, code: int, off: int, nbytes: int, write: int = 0) -> None:
        """A read (write=1: a write) of part of a storage, for the compulsory model: flag the
        storage's code; note its first region in _touched (key allocation << 1 | write, with
        its role and size), further distinct ones in _extra. off -1: scattered rows."""
        flag = _PART_WRITTEN if write else _PART_READ
        if not code & flag:
            self._roles[sid] = code | flag
        k = (((code >> _SHIFT) & _ALLOC) << 1) | write
        prev = self._touched.get(k)
        if prev is None:
            self._touched[k] = (off, nbytes, code & 7, code >> _SIZE)
        elif prev[0] != off or prev[1] != nbytes:
            self._extra.append((k, off, nbytes))

    def _new_code(self, st: int, role: int, storage) -> int:
        """A fresh code (see _READ) for a storage (id `st`) first seen in this block."""
        nbytes = storage.nbytes()
        self._gen += _STEP
        code = self._roles[st] = (nbytes << _SIZE) | self._gen | role
        if role <= KV:  # kept for the next block: while the storage lives (see _reset)
            self._refs[st] = StorageWeakRef(storage)
        return code

    def _register_module(self, mod) -> None:
        """Mark a module's own parameters as weights the first time it runs (views of a
        parameter, such as the transposed weight a linear layer multiplies by, are not
        Parameters themselves)."""
        if id(mod) in self._modules_seen:
            return
        self._modules_seen.add(id(mod))
        for p in mod.parameters(recurse=False):
            storage = p.untyped_storage()
            code = self._roles.get(storage._cdata)
            if code is None or code & 7 != WEIGHT:
                self._new_code(storage._cdata, WEIGHT, storage)

    def _first_sight(self, t, sid: int) -> int:
        """Code of a storage (id `sid`) seen for the first time in this block."""
        base = t._base if t._base is not None else t
        r = WEIGHT if isinstance(t, torch.nn.Parameter) or isinstance(base, torch.nn.Parameter) else INPUT
        return self._new_code(sid, r, t.untyped_storage())

    def _lookup(self, t) -> tuple[int, int]:
        """(storage id, code) of t's storage; a storage seen for the first time gets a code.
        (The short path in _record does the same inline.)"""
        sid = _storage_id(t)
        code = self._roles.get(sid)
        return sid, (self._first_sight(t, sid) if code is None else code)

    def _code(self, t) -> int:
        return self._lookup(t)[1]

    def _make_kv(self, t, code: int) -> int:
        """Mark t's storage as KV cache; move what the block already counted for it
        whole into the KV-cache bucket of the compulsory model."""
        old, gen = code & 7, (code >> _SHIFT) & _ALLOC
        storage = t.untyped_storage()
        new = self._roles[storage._cdata] = (code & ~7) | KV
        self._refs[storage._cdata] = StorageWeakRef(storage)
        self._kv_gens.add(gen)
        size = code >> _SIZE
        for flag, comp in ((_READ, self._comp[0]), (_WRITTEN, self._comp[1])):
            if code & flag and old != KV:
                comp[old] -= size
                comp[KV] += size
        return new

    def _promote(self, entry, tensors) -> None:
        """KV-cache detection for cache writes and attention (rare ops, off the common path)."""
        if entry.special == 1:
            for i, nbytes, _ in entry.writes_in:
                code = self._code(tensors[i])
                gen = (code >> _SHIFT) & _ALLOC
                if code & 7 in (INPUT, FRESH, KV):
                    if code & 7 != KV:
                        self._make_kv(tensors[i], code)
                    self._kv_written[gen] = min(self._kv_written.get(gen, 0) + nbytes,
                                                code >> _SIZE)
        else:
            k = None
            for i, nbytes, _, _ in entry.reads[1:3]:  # key, value
                t = tensors[i]
                if t is k:  # value is key: read once
                    continue
                k = t
                code = self._code(t)
                gen = (code >> _SHIFT) & _ALLOC
                if code & 7 in (INPUT, JOINED):
                    code = self._make_kv(t, code)
                    self._kv_written[gen] = code >> _SIZE
                if code & 7 == KV:
                    size = (code >> _SIZE) or nbytes
                    valid = min(1.0, self._kv_written.get(gen, size) / size)
                    self._kv_valid += int(nbytes * valid)

    # -- results ---------------------------------------------------------------------
    def trace(self) -> Trace:
        """The Trace of the last completed `with` block."""
        if self._trace is None:
            self._trace = build_trace([self._block]) if self._block is not None else Trace()
        return self._trace

    def last_block(self) -> "_Block":
        """The raw counts of the last block, for `build_trace` to merge with others later."""
        return self._block

    @property
    def overhead_s(self) -> float:
        """Seconds the last block spent in this mode's own bookkeeping."""
        return self.trace().overhead_s

    # -- torchao-compatible getters (last block) -------------------------------------
    def _by_module(self, value) -> dict[str, dict]:
        packets = {e.name: e.packet for e in _ENTRIES.values()}
        out: dict[str, dict] = {"Global": {}}
        for rec in self.trace().records:
            v = value(rec)
            if not v:
                continue
            op = packets.get(rec.op, rec.op)
            parts = rec.module.split(".") if rec.module else []
            for scope in ["Global"] + [".".join(parts[: i + 1]) for i in range(len(parts))]:
                d = out.setdefault(scope, {})
                d[op] = d.get(op, 0) + v
        return out

    def get_flop_counts(self) -> dict[str, dict]:
        """{module path or "Global": {op packet: FLOPs}}, every parent included."""
        return self._by_module(lambda r: r.flops)

    def get_io_counts(self) -> dict[str, dict]:
        """{module path or "Global": {op packet: bytes read + written}} (per_op model)."""
        return self._by_module(lambda r: r.bytes)

    def get_total_flops(self) -> int:
        return self.trace().flops

    def get_total_io(self) -> int:
        """Bytes moved in the last block under this mode's io_model."""
        t = self.trace()
        return t.compulsory_bytes if self.io_model == "compulsory" else t.per_op_bytes

    def get_summary_flop_counts(self) -> dict[str, int]:
        """{module path or "Global": FLOPs} (torchao's summary: totals per module)."""
        return {m: sum(ops.values()) for m, ops in self.get_flop_counts().items()}

    def get_summary_io_counts(self) -> dict[str, int]:
        """{module path or "Global": bytes} (per_op model)."""
        return {m: sum(ops.values()) for m, ops in self.get_io_counts().items()}

    def pretty_summary_counts(self, type: str = "flops", precision: int = 2, depth: int | None = None) -> str:
        """torchao's indented per-module summary: one line per module down to `depth`."""
        if type not in ("flops", "io"):
            raise ValueError(f"type must be 'flops' or 'io', got {type!r}")
        depth = self.depth if depth is None else depth
        totals = self.get_summary_flop_counts() if type == "flops" else self.get_summary_io_counts()
        unit = "FLOPs" if type == "flops" else "B"
        lines = []
        for name in sorted((m for m in totals if m != "Global" and len(m.split(".")) <= depth),
                           key=lambda m: len(m.split("."))):
            value, prefix = float(totals[name]), ""
            for p in ("k", "M", "G", "T", "P"):
                if abs(value) < 1000:
                    break
                value, prefix = value / 1000, p
            lines.append(f"{' ' * (len(name.split('.')) - 1)}{name}: {value:.{precision}f}{prefix}{unit}")
        return "\n".join(lines)

    def _show(self) -> None:
        print(self.pretty_summary_counts("flops"))
        if self.debug:
            for r in self.trace().records:
                if r.calls and (r.flops or r.bytes):
                    print(f"{r.module or 'Global'} {r.op} [{r.shapes}] x{r.calls}: "
                          f"{r.flops} FLOPs, {r.bytes} B")

    @property
    def uncounted_ops(self) -> dict[str, int]:
        return dict(self.trace().uncounted_ops)

    @property
    def coverage(self) -> tuple[float, float]:
        """(share of bytes, share of op calls) that had a cost formula."""
        return self.trace().coverage


class _Block:
    """One `with` block's raw log (module, entry, roles per op call) and compulsory-IO
    state, turned into a Trace only when someone asks."""

    __slots__ = ("log", "view_log", "touched", "kv_valid", "overhead", "modules")

    def __init__(self, log, view_log, touched, kv_valid, overhead, modules):
        self.log, self.view_log, self.touched = log, view_log, touched
        self.kv_valid, self.overhead, self.modules = kv_valid, overhead, modules


def build_trace(blocks: list[_Block]) -> Trace:
    """One Trace from one or more blocks (steps = len(blocks)): counts are summed
    before records are built, so a phase of many decode steps is built once."""
    counts, views = Counter(), Counter()
    for b in blocks:
        counts.update(b.log)
        views.update(b.view_log)
    records: dict[tuple, OpRecord] = {}
    uncounted: dict[str, int] = {}
    for (module, entry, sig), n in counts.items():
        key = (entry.name, module, entry.dtype, entry.shapes)
        rec = records.get(key)
        if rec is None:
            rec = records[key] = OpRecord(entry.name, module, entry.dtype, entry.shapes,
                                          has_formula=entry.has_formula)
        rec.calls += n
        rec.flops += n * entry.flops
        rec.executed_flops += n * entry.executed
        kinds = rec.kinds
        for i, c in enumerate(entry.cost.kinds):
            if c:
                kinds[i] += n * c
        contrib = _CONTRIB.get((entry, sig))
        if contrib is None:
            contrib = _CONTRIB[(entry, sig)] = _contribution(entry, sig)
        for i, b in contrib[0]:
            rec.read[i] += n * b
        for i, b in contrib[1]:
            rec.written[i] += n * b
        if not entry.has_formula:
            uncounted[entry.name] = uncounted.get(entry.name, 0) + n
    for (module, op_id), n in views.items():
        name = _OP_NAMES[op_id]
        key = (name, module, "", "")
        rec = records.get(key) or records.setdefault(key, OpRecord(name, module, "", ""))
        rec.calls += n
    for name in uncounted:
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"perfcounter: no cost formula for {name}; its bytes are counted, "
                          f"its FLOPs are not (listed in uncounted_ops)", stacklevel=2)
    modules: list[ModuleInfo] = []
    for b in blocks:
        modules = merge_modules(modules, b.modules)
    read, written = [0] * len(ROLES), [0] * len(ROLES)
    for b in blocks:
        r, w = _compulsory(b.touched)
        read = [x + y for x, y in zip(read, r)]
        written = [x + y for x, y in zip(written, w)]
    return Trace(records=list(records.values()), compulsory_read=read,
                 compulsory_written=written, kv_cache_valid_read=sum(b.kv_valid for b in blocks),
                 uncounted_ops=uncounted, steps=len(blocks),
                 overhead_s=sum(b.overhead for b in blocks), modules=modules)


def _compulsory(touched) -> tuple[list[int], list[int]]:
    """Bytes by role when each storage region is read at most once and written at most once.

    Whole-storage accesses were summed while counting; partial ones are merged here:
    regions [offset, offset + bytes) per storage, gathers and scatters (offset -1)
    added, never more than the storage, nothing a whole access already covered; a
    storage that became KV cache counts as KV cache."""
    (comp_read, comp_written), whole, first, extra, kv_gens = touched
    read, written = [0] * len(ROLES), [0] * len(ROLES)
    for role, (r, w) in enumerate(zip(comp_read, comp_written)):  # storage role -> ROLES
        read[_ROLE_INDEX[role]] += r
        written[_ROLE_INDEX[role]] += w
    more: dict[int, list] = {}
    for k, off, nbytes in extra:
        more.setdefault(k, []).append((off, nbytes))
    for k, (off, nbytes, role, size) in first.items():
        gen, is_write = k >> 1, k & 1
        if gen in whole[is_write]:
            continue
        if k in more:
            regions = set(more[k]) | {(off, nbytes)}
            nbytes, end = 0, -1
            for o, n in sorted(r for r in regions if r[0] >= 0):
                lo = max(o, end)
                if o + n > lo:
                    nbytes += o + n - lo
                end = max(end, o + n)
            nbytes += sum(n for o, n in regions if o < 0)
        if nbytes > size:
            nbytes = size
        (written if is_write else read)[1 if gen in kv_gens else _ROLE_INDEX[role]] += nbytes
    return read, written


def _set_flex_eager(value: bool) -> bool:
    """flex_attention's eager path wraps itself in torch.compile, which refuses to run
    under a dispatch mode; its documented debug switch runs it eagerly instead."""
    try:
        import torch.nn.attention.flex_attention as fa
    except ImportError:
        return False
    old = getattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = value
    return old
