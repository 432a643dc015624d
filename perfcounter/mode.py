"""PerformanceCounterMode: counts every aten op run inside `with mode:`.

The public class owns a private TorchDispatchMode (torch's pattern: the mode is
entered afresh to count a composite's decomposition, with no re-entry flag).
For each call the private mode runs the op, then records it in one place
(`_CountingMode._record`): the op's plan (op_plan.py: FLOPs by kind and byte
counts, cached per signature), the role of each tensor's storage and what the
compulsory model must add (storage.py), and the module the op ran under
(module_path.py). A block's log becomes a `Trace` (trace.py) when someone asks.
"""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perfcounter import op_plan
from perfcounter.module_path import ModulePath
from perfcounter.op_plan import FUSED_CHOICE, HANDLING, OpKind, classify, plan_for
from perfcounter.report import torchao_si
from perfcounter.stats import by_module_and_op, check_depth
from perfcounter.storage import BUFFER, WEIGHT, StorageTable, storage_id
from perfcounter.trace import Block, Trace, build_trace, check_io_model

Tensor = torch.Tensor
_clock = time.perf_counter
_COUNT, _VIEW, _VIEW_OR_COPY, _FUSED, _DECOMPOSE = (
    OpKind.COUNT, OpKind.VIEW, OpKind.VIEW_OR_COPY, OpKind.FUSED, OpKind.DECOMPOSE)


class _CountingMode(TorchDispatchMode):
    """The dispatch mode: runs each op, then records it (see `_record`)."""

    supports_higher_order_operators = True

    def __init__(self, depth: int):
        super().__init__()
        self.storages = StorageTable()
        self.tracker = ModulePath(depth, self._register_module)
        self._modules_seen: set[int] = set()
        self.log: list = []
        self.views: list = []
        self.overhead = 0.0

    def reset(self) -> None:
        self.storages.reset()
        self.tracker.reset()
        self.log, self.views, self.overhead = [], [], 0.0

    def block(self) -> Block:
        return Block(self.log, self.views, self.storages.comp, self.storages.kv_valid_read,
                     self.overhead, list(self.tracker.modules.values()))

    def _register_module(self, mod) -> None:
        """A module's own parameters are weights and its buffers model state, from the first
        time it runs (a view of a parameter, such as the transposed weight a linear layer
        multiplies by, is not a Parameter itself)."""
        if id(mod) in self._modules_seen:
            return
        self._modules_seen.add(id(mod))
        for p in mod.parameters(recurse=False):
            self.storages.register(p, WEIGHT)
        for b in mod.buffers(recurse=False):
            self.storages.register(b, BUFFER)

    def _decompose(self, func, args, kwargs):
        """Run a CompositeImplicit op's decomposition under this mode, so its parts count."""
        with self:
            return func.decompose(*args, **kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        handling = HANDLING.get(id(func)) or classify(func)
        kind, call, name = handling
        if kwargs is None:
            kwargs = {}
        if kind >= _FUSED:  # composites that reach the mode (under inference_mode)
            if kind == _FUSED:
                t0 = _clock()
                fused = FUSED_CHOICE[func._overloadpacket](*args, **kwargs)
                self.overhead += _clock() - t0
                kind = _COUNT if fused else _DECOMPOSE
            if kind == _DECOMPOSE:
                out = self._decompose(func, args, kwargs)
                if out is not NotImplemented:
                    return out
                if handling.kind == _DECOMPOSE:  # no decomposition after all: count it whole
                    HANDLING[id(func)] = op_plan.Handling(_COUNT, call, name)
                kind = _COUNT
        out = call(*args, **kwargs)
        t0 = _clock()
        if kind == _VIEW_OR_COPY:
            a = args[0]
            if (out is a or not isinstance(out, Tensor) or not isinstance(a, Tensor)
                    or storage_id(out) == storage_id(a)):
                kind = _VIEW
        if kind == _VIEW:
            self.views.append((self.tracker.scope, name))
        else:
            self._record(func, args, kwargs, out, kind)
        self.overhead += _clock() - t0
        return out

    def _record(self, func, args, kwargs, out, kind) -> None:
        """The one place an op is recorded: its plan, its tensors' roles, its module."""
        plan, tensors = plan_for(func, args, kwargs, out, kind)
        roles = self.storages.account(plan, tensors, out)
        self.log.append((self.tracker.scope, plan, roles))


class PerformanceCounterMode:
    """Counts FLOPs by kind and bytes by role for every aten op run inside it.

    `with mode: model(x)`; then `mode.trace()` is that block's `Trace`. Entering
    again starts a new count; weight, buffer and KV-cache roles are remembered
    across blocks (a cache filled in prefill is read in decode). The torchao
    getters (get_total_flops, get_flop_counts, ...) read the last block.
    """

    def __init__(self, display: bool = False, depth: int = 10, debug: bool = False,
                 io_model: str = "per_op"):
        """display: print the per-module FLOPs summary when a block ends (torchao's flag);
        debug: also print every record (op, module, shapes, FLOPs, bytes) then."""
        import torch._dynamo  # noqa: F401  (a dispatch mode imports it on first use; not inside a timed block)
        self.depth = check_depth(depth)
        self.io_model = check_io_model(io_model)
        self.display = display
        self.debug = debug
        self._mode = _CountingMode(depth)
        self._active = False
        self._block: Block | None = None
        self._trace: Trace | None = Trace()

    def __enter__(self):
        if self._active:
            raise RuntimeError("this PerformanceCounterMode is already counting; "
                               "a mode cannot be nested inside itself")
        self._mode.reset()
        self._active = True
        self._flex_flag = _set_flex_eager(True)
        self._mode.tracker.__enter__()
        try:
            self._mode.__enter__()
        except BaseException:
            self._mode.tracker.__exit__(None, None, None)
            _set_flex_eager(self._flex_flag)
            self._active = False
            raise
        return self

    def __exit__(self, *exc):
        try:
            return self._mode.__exit__(*exc)
        finally:
            self._mode.tracker.__exit__(*exc)
            _set_flex_eager(self._flex_flag)
            self._active = False
            self._block = self._mode.block()
            self._trace = None  # built on first request (keeps exit cheap)
            if self.display or self.debug:  # asked for explicitly: torchao printed here
                self._show()

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
        """{module path or "Global": {op packet: FLOPs}}, every parent included."""
        return by_module_and_op(self.trace().records, lambda r: r.flops, _packet)

    def get_io_counts(self) -> dict[str, dict]:
        """{module path or "Global": {op packet: bytes read + written}} (per_op model)."""
        return by_module_and_op(self.trace().records, lambda r: r.bytes, _packet)

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
