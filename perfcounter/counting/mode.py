"""PerformanceCounterMode: counts every aten op run inside `with mode:`.

The public class owns a private TorchDispatchMode (torch's pattern: the mode is
entered afresh to count a composite's decomposition, with no re-entry flag).
For each call the private mode runs the op, then records it in one place
(`CountingMode._record`): the op's plan (op_plan.py: FLOPs by kind and byte
counts, cached per signature; op_data.py: the few numbers some plans read from
the data), the role of each tensor's storage and what the compulsory model must
add (storage.py), and the module the op ran under (module_path.py). A block's
log becomes a `Trace` (trace.py) when someone asks.

Composites reach the mode only under inference_mode; the mode runs their C++
decomposition under itself, as autograd does under no_grad, so the counted run
is bitwise the uncounted one and counts do not depend on the grad mode.
"""
from __future__ import annotations

import time
import weakref

import torch
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils._python_dispatch import TorchDispatchMode

from perfcounter.counting import op_data
from perfcounter.counting.breakdown import flop_counts, io_counts
from perfcounter.counting.composite_linear import LINEAR, LinearWhole
from perfcounter.counting.module_path import ModulePath, check_depth
from perfcounter.counting.op_data import ExpertLoad
from perfcounter.counting.op_plan import HANDLING, SHORTCUTS, OpKind, classify, plan_for
from perfcounter.counting.run_eagerly import force_eager, set_flex_eager
from perfcounter.counting.storage import BUFFER, KV, WEIGHT, StorageTable, storage_id
from perfcounter.counting.subclass_linear import StoredLinears
from perfcounter.format import torchao_si
from perfcounter.trace import Block, Trace, build_trace, check_io_model

Tensor = torch.Tensor
_clock = time.perf_counter
_VIEW, _DATA, _DECOMPOSE, _FRESH = OpKind.VIEW, OpKind.DATA, OpKind.DECOMPOSE, OpKind.FRESH
_COMPOSITE = DispatchKey.CompositeImplicitAutograd
_NO_DATA = (DynamicOutputShapeException, DataDependentOutputException)
_caller_tls = torch._C._RestorePythonTLSSnapshot
_push, _pop = torch._C._push_on_torch_dispatch_stack, torch._C._pop_torch_dispatch_stack


class CountingMode(TorchDispatchMode):
    """The dispatch mode: runs each op, then records it (see `_record`)."""

    supports_higher_order_operators = True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile wrapper around `__torch_dispatch__` (0.8 us per op on a 2-core CPU):
        no Dynamo frame runs in a counted block, whose compiler stance is force_eager."""
        return False

    def __init__(self, depth: int):
        super().__init__()
        self.storages = StorageTable()
        register = weakref.WeakMethod(self._register_module)  # no cycle: freed without the gc
        self.tracker = ModulePath(depth, lambda mod: register()(mod))
        self._modules_seen: dict[int, weakref.ref] = {}
        self._attention: dict[int, tuple[bool, int | None]] = {}  # id(module) -> structure
        self._masks: dict[int, tuple] = {}  # id(mask) -> (mask, version, kept entries)
        self.expert_load = ExpertLoad()  # MoE routing under fake tensors (op_data.py)
        self.linears = LinearWhole()  # aten.linear whole under inference_mode, once learned
        self.log: list = []
        self.views: list = []
        self.overhead = 0.0

    def reset(self) -> None:
        self.storages.reset()
        self.tracker.reset()
        self._masks = {}
        self.log, self.views, self.overhead = [], [], 0.0

    def block(self) -> Block:
        return Block(self.log, self.views, self.storages.comp, self.storages.kv_valid_read,
                     self.overhead, list(self.tracker.modules.values()))

    def _register_module(self, mod) -> None:
        """A module's own parameters are weights and its buffers model state, from the first
        time it runs (a view of a parameter, such as the transposed weight a linear layer
        multiplies by, is not a Parameter itself); an attention module's mask structure."""
        seen = self._modules_seen.get(id(mod))
        if seen is not None and seen() is mod:
            return
        self._modules_seen[id(mod)] = weakref.ref(mod)
        for p in mod.parameters(recurse=False):
            self.storages.register(p, WEIGHT)
        for b in mod.buffers(recurse=False):
            self.storages.register(b, BUFFER)
        structure = op_data.attention_structure(mod)
        if structure is not None:
            self._attention[id(mod)] = structure
        else:
            self._attention.pop(id(mod), None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        handling = HANDLING.get(id(func)) or classify(func)
        kind, call, name = handling
        if kwargs is None:
            kwargs = {}
        if kind is _DECOMPOSE:  # a composite (inference_mode): its C++ decomposition, counted,
            if func is LINEAR and self.linears is not None:  # (linear: whole once learned)
                return self.linears.call(self, args, kwargs)
            shortcut = SHORTCUTS.get(func)  # (the two commonest when they dispatch a view at most)
            done = shortcut(*args, **kwargs) if shortcut is not None else None
            if done is not None:
                if done[1] is not None:
                    self.views.append((self.tracker.scope, done[1]))
                return done[0]
            return self.decompose(func, args, kwargs)
        try:
            out = call(*args, **kwargs)
        except _NO_DATA as e:  # fake tensors: an op that needs values
            e.add_note(f"perfcounter: {name} needs tensor values, which fake tensors do not "
                       "have; a MoE model's experts_implementation='eager' routes tokens this way: "
                       "count it with the default experts path (grouped_mm), as count_config does")
            raise
        if kind is _VIEW:  # (not timed: a list append is all it costs)
            self.views.append((self.tracker.scope, name))
            return out
        t0 = _clock()
        if kind is _FRESH:  # its storage is new, whatever an address reused from a freed one said
            self.storages.fresh(out)
            self.views.append((self.tracker.scope, name))
        else:
            self._record(func, args, kwargs, out, kind)
        self.overhead += _clock() - t0
        return out

    def decompose(self, func, args, kwargs):
        """A composite's C++ decomposition run under this mode, with the dispatch keys its
        caller had (a view of a weight keeps requires_grad, which decides how matmul folds)
        and this mode back on the stack (`with self` without its flag bookkeeping: the
        block's __enter__ set the flags already)."""
        with _caller_tls():
            _push(self)
            try:
                return func._op_dk(_COMPOSITE, *args, **kwargs)
            finally:
                _pop(None)

    def _record(self, func, args, kwargs, out, kind) -> None:
        """The one place an op is recorded: its plan, its tensors' roles, its module."""
        data = op_data.DATA_OPS[func._overloadpacket](self, args, kwargs) if kind == _DATA else ()
        plan, tensors = plan_for(func, args, kwargs, out, kind, data)
        roles = self.storages.account(plan, tensors, out)
        self.log.append((self.tracker.scope, plan, roles))

    def stored_call(self, entry: tuple, tensors: list, out, seconds: float) -> None:
        """A layer with a stored-smaller weight, recorded whole as `entry` (its log entry)
        by subclass_linear.StoredLinears: nothing more to do here; graph.py's mode notes
        its data flow."""

    # -- what op_data asks of the mode ---------------------------------------------------
    def attention_structure(self) -> tuple[bool, int | None] | None:
        """(is_causal, sliding window) of the innermost running attention module, or None."""
        for frame in reversed(self.tracker.stack):
            found = self._attention.get(frame.module_id)
            if found is not None:
                return found
        return None

    def kv_positions(self, k) -> int:
        """Key positions that hold valid entries: a static cache's buffer is valid as far as
        it was written (storage.py keeps the bytes written); anything else is all valid."""
        sk = k.shape[-2]
        st = self.storages.by_id.get(storage_id(k))
        if st is None or st.role != KV or not st.size:
            return sk
        valid = self.storages.kv_valid_bytes.get(st.alloc)
        return sk if valid is None else max(1, min(sk, round(sk * valid / st.size)))

    def mask_pairs(self, mask) -> int:
        """Entries a real mask keeps, read once per mask and block (layers share a mask)."""
        try:
            version = mask._version
        except RuntimeError:  # an inference tensor keeps no version: it is not changed in place
            version = -1
        found = self._masks.get(id(mask))
        if found is not None and found[0] is mask and found[1] == version:
            return found[2]
        kept = op_data.mask_pairs(mask)
        self._masks[id(mask)] = (mask, version, kept)
        return kept


class PerformanceCounterMode:
    """Counts FLOPs by kind and bytes by role for every aten op run inside it.

    `with mode: model(x)`; then `mode.trace()` is that block's `Trace`. Entering
    again starts a new count; weight, buffer and KV-cache roles are remembered
    across blocks (a cache filled in prefill is read in decode). The torchao
    getters (get_total_flops, get_flop_counts, ...) read the last block.
    """

    _mode_cls = CountingMode  # graph.py's subclass also logs data flow (opt-in, off here)

    def __init__(self, display: bool = False, depth: int = 10, debug: bool = False,
                 io_model: str = "per_op", expert_load=None):
        """display: print the per-module FLOPs summary when a block ends (torchao's flag);
        debug: also print every record (op, module, shapes, FLOPs, bytes) then;
        expert_load: how MoE routing spreads rows over experts under fake tensors, which
        have no values: None or "balanced" (evenly), or weights per expert ("4,2,1,1")."""
        self.depth = check_depth(depth)
        self.io_model = check_io_model(io_model)
        self.display = display
        self.debug = debug
        self._mode = self._mode_cls(depth)
        self._stored = StoredLinears(self._mode)  # stored-smaller weights: one op a layer call
        self.expert_load = expert_load
        self._active = False
        self._block: Block | None = None
        self._trace: Trace | None = Trace()

    def __enter__(self):
        if self._active:
            raise RuntimeError("this PerformanceCounterMode is already counting; "
                               "a mode cannot be nested inside itself")
        self._mode.reset()
        self._active = True
        self._flex_flag = set_flex_eager(True)
        self._stance = force_eager()
        self._mode.tracker.__enter__()
        try:
            self._mode.__enter__()
        except BaseException:
            self._mode.tracker.__exit__(None, None, None)
            self._stance.__exit__(None, None, None)
            set_flex_eager(self._flex_flag)
            self._active = False
            raise
        self._stored.__enter__()  # its hooks after the tracker's
        return self

    def __exit__(self, *exc):
        try:
            self._stored.__exit__(*exc)  # hooks off; the mode back on the stack if a layer raised
            return self._mode.__exit__(*exc)
        finally:
            self._mode.tracker.__exit__(*exc)
            self._stance.__exit__(None, None, None)
            set_flex_eager(self._flex_flag)
            self._active = False
            self._block = self._mode.block()
            self._trace = None  # built on first request (keeps exit cheap)
            if self.display or self.debug:  # asked for explicitly: torchao printed here
                self._show()

    @property
    def expert_load(self) -> ExpertLoad:
        """MoE routing assumed under fake tensors (real tensors route by their values)."""
        return self._mode.expert_load

    @expert_load.setter
    def expert_load(self, value) -> None:
        self._mode.expert_load = ExpertLoad.parse(value)

    # -- results ---------------------------------------------------------------------
    def trace(self) -> Trace:
        """The Trace of the last completed `with` block."""
        if self._trace is None:
            self._trace = build_trace([self._block])
        return self._trace

    def last_block(self) -> Block | None:
        """The raw counts of the last block, for `build_trace` to merge with others later."""
        return self._block

    @property
    def overhead_s(self) -> float:
        """Seconds the last block spent in this mode's own bookkeeping."""
        return self.trace().overhead_s

    @property
    def uncounted_ops(self) -> dict[str, int]:
        return dict(self.trace().uncounted_ops)

    @property
    def coverage(self) -> tuple[float, float]:
        """(share of bytes, share of op calls) that had a cost formula."""
        return self.trace().coverage

    # -- torchao-compatible getters (last block) -------------------------------------
    def get_flop_counts(self) -> dict[str, dict]:
        """{module path or "Global": {op packet: FLOPs}}, every parent included. A fused
        attention kernel's packet holds its matmuls (torch's formula), its softmax is
        under "sdpa_softmax"; every module that ran is a key, as in get_io_counts."""
        return flop_counts(self.trace().records, _packet)

    def get_io_counts(self) -> dict[str, dict]:
        """{module path or "Global": {op packet: bytes read + written}} (per_op model)."""
        return io_counts(self.trace().records, _packet)

    def get_total_flops(self) -> int:
        return self.trace().flops

    def get_total_io(self) -> int:
        """Bytes moved in the last block under this mode's io_model."""
        t = self.trace()
        return t.compulsory_bytes if self.io_model == "compulsory" else t.per_op_bytes

    def get_summary_flop_counts(self) -> dict[str, int]:
        """{module path or "Global": FLOPs} (torchao's summary: totals per module); the same
        keys as get_summary_io_counts (a module that only moved bytes has 0 FLOPs)."""
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
        names = sorted((m for m in totals if m != "Global" and len(m.split(".")) <= depth),
                       key=lambda m: len(m.split(".")))
        return "\n".join(f"{' ' * (len(m.split('.')) - 1)}{m}: {torchao_si(totals[m], unit, precision)}"
                         for m in names)

    def _show(self) -> None:
        print(self.pretty_summary_counts("flops"))
        if self.debug:
            for r in self.trace().records:
                if r.calls and (r.flops or r.bytes):
                    print(f"{r.module or 'Global'} {r.op} [{r.shapes}] x{r.calls}: "
                          f"{r.flops} FLOPs, {r.bytes} B")


def _packet(name: str):
    """'aten.mm.default' -> torch.ops.aten.mm (the name itself when it is no aten op)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "aten":
        return getattr(torch.ops.aten, parts[1], name)
    return name
