"""aten.linear counted whole under inference_mode: its decomposition run natively, its records
written directly, once a first call has shown what they are.

Under inference_mode a composite reaches the counting mode whole, and the mode runs its
C++ decomposition under itself (mode.py), so that the counts are those of no_grad: for a
linear layer, `t` and `view` (views) around one `mm` or `addmm`. Each of those calls goes
through Python dispatch, and a decoder runs a few hundred linear layers a step.

`LinearWhole` keeps, per call signature (shapes, strides, dtypes, requires_grad, inference
tensors or not, bias or not: everything the decomposition's choices read), what the first call recorded: the
views' names and the one matmul's plan. It keeps them only when they are views of VIEWS
and one mm / addmm, and the decomposition run without the mode gives the same output bit
for bit. A later call with that signature runs the decomposition natively (the Python dispatch
key is off inside the mode's dispatch), then appends the same view names and
accounts the same plan on the same storages: a view shares its base's storage and offset,
so `x`, `w` and the output stand for the views the decomposition made. Any other first
call (a copy for a non-contiguous input, a tensor subclass, fake tensors) keeps the
counted path for its signature.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch
from torch._C import DispatchKey
from torch.nn import Parameter

Tensor = torch.Tensor
LINEAR = torch.ops.aten.linear.default
VIEWS = frozenset({"aten.t.default", "aten.view.default", "aten._unsafe_view.default",
                   "aten._reshape_alias.default"})
_MATMULS = ("aten.mm.default", "aten.addmm.default")
_COMPOSITE = DispatchKey.CompositeImplicitAutograd
_PLAIN = (Tensor, Parameter)
_UNSEEN = object()
MAX_SIGNATURES = 4096
_clock = time.perf_counter


class LinearCacheInfo(NamedTuple):
    whole: int  # signatures counted whole after their first call
    decomposed: int  # signatures that stay decomposed under the mode
    calls_whole: int  # calls counted whole


class LinearWhole:
    """Per-signature records of aten.linear under inference_mode (see the module doc)."""

    def __init__(self):
        # signature -> (view names, the matmul's plan, whether the bias is its first operand),
        # or None: decompose under the mode
        self.known: dict[tuple, tuple | None] = {}
        self.calls_whole = 0

    def cache_info(self) -> LinearCacheInfo:
        whole = sum(v is not None for v in self.known.values())
        return LinearCacheInfo(whole, len(self.known) - whole, self.calls_whole)

    def cache_clear(self) -> None:
        self.known.clear()
        self.calls_whole = 0

    @staticmethod
    def signature(args, kwargs) -> tuple | None:
        """The call's signature, or None when it is not linear(x, w[, bias]) of plain tensors."""
        if kwargs and set(kwargs) != {"bias"} or len(args) < 2:
            return None
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else (kwargs or {}).get("bias")
        if type(x) not in _PLAIN or type(w) not in _PLAIN or (b is not None and type(b) not in _PLAIN):
            return None
        return (x.shape, x.stride(), x.dtype, x.requires_grad, x.is_inference(), w.shape,
                w.stride(), w.dtype, w.requires_grad, w.is_inference(),
                None if b is None else (b.shape, b.stride(), b.dtype))

    def call(self, mode, args, kwargs):
        """linear(*args, **kwargs) counted on `mode` (its CountingMode): whole when
        its signature is known, else decomposed under the mode (and learned, the first time)."""
        key = self.signature(args, kwargs)
        known = self.known.get(key, _UNSEEN) if key is not None else None
        if known is None or known is _UNSEEN:
            n_views, n_log = len(mode.views), len(mode.log)
            out = mode.decompose(LINEAR, args, kwargs)
            if known is _UNSEEN:
                t0 = _clock()
                self.learn(key, args, kwargs, out, [name for _, name in mode.views[n_views:]],
                           mode.log[n_log:])
                mode.overhead += _clock() - t0
            return out
        out = self.native(args, kwargs)
        t0 = _clock()
        self.calls_whole += 1
        view_names, plan, _ = known
        scope = mode.tracker.scope
        for name in view_names:
            mode.views.append((scope, name))
        roles = mode.storages.account(plan, self.tensors(known, args, kwargs), out)
        mode.log.append((scope, plan, roles))
        mode.overhead += _clock() - t0
        return out

    @staticmethod
    def native(args, kwargs):
        """The call's output, its decomposition run without the mode (inside the mode's
        dispatch, the Python key is off: every op of it runs natively)."""
        return LINEAR._op_dk(_COMPOSITE, *args, **(kwargs or {}))

    def learn(self, key: tuple, args, kwargs, out, view_names: list, entries: list) -> None:
        """After the first counted call of `key`, which added `view_names` and log `entries`."""
        plan = entries[0][1] if len(entries) == 1 else None
        usable = plan is not None and plan.name in _MATMULS and type(out) is Tensor \
            and all(name in VIEWS for name in view_names)
        if usable:
            native = self.native(args, kwargs)
            usable = native.shape == out.shape and native.stride() == out.stride() \
                and torch.equal(native, out)
        if len(self.known) >= MAX_SIGNATURES:  # a sweep of many shapes: start again
            self.known.clear()
        self.known[key] = (tuple(view_names), plan, plan.name == _MATMULS[1]) if usable else None

    def tensors(self, known: tuple, args, kwargs) -> list:
        """The matmul's operands as its plan reads them: (x, w) or (bias, x, w)."""
        if not known[2]:
            return [args[0], args[1]]
        return [args[2] if len(args) > 2 else kwargs["bias"], args[0], args[1]]
