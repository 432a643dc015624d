"""Weights kept in another form than they run in: one matmul per linear call, at stored bytes.

Two kinds of weight are stored smaller than the float tensor a layer multiplies by:
- a tensor subclass (torchao's `quantize_`: int8 / int4 / float8 data plus scales and zero
  points), recognised generically: a torch.Tensor subclass with `__tensor_flatten__` that
  is not a plain Tensor, Parameter or FakeTensor. Its stored bytes are those of its inner
  tensors (flattened recursively). Nothing here imports torchao.
- a float weight with a stored size set by `set_stored_nbytes` (a GGUF file priced as
  stored: gguf_stored.py), run dequantized.

Counted op by op, such a layer is its decomposition: torchao handles F.linear in Python
(`__torch_function__`), so the dispatch mode would see t, _to_copy (a full dequantized
copy), mm and mul, and the int8 data as an input, not a weight. `StoredLinears` instead
counts each call of an nn.Linear or nn.Embedding whose weight is of either kind as ONE op
(`aten.linear.default` / `aten.embedding.default`):
- FLOPs: the registry's linear formula (2·M·N·K + M·N for a bias), equal to the float
  layer's; the record's dtype is the dtype the matmul executes in: the activation's for
  weight-only quantization (int4 weight-only runs at the activation dtype's peak), int8
  when activations are quantized too (W8A8, W4A8), float8 for float8 x float8;
- bytes: the input, the weight at its stored size (every inner tensor, each its own
  storage with role `weight`; an embedding reads its rows' share), the bias, the output.
The layer runs with the counting mode taken off the dispatch stack (outputs are the
uncounted run's), between two process-wide forward hooks that the counter installs while
it counts (after the module tracker's, so the op lands on the layer's own module path).
A layer whose counting mode is not on top of the dispatch stack is counted op by op.

Activations count as quantized when the weight carries one of torchao's markers for it
(`act_quant_kwargs`, `activation_quantization`, `input_quant_func`) and it is not None.
A module's weight is classified the first time the counter sees the module, as the mode
registers its parameters' roles.
"""
from __future__ import annotations

import time
import weakref

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from perfcounter import costs
from perfcounter.counting.op_plan import OpPlan, Output, Place, Read
from perfcounter.counting.storage import ACTIVATION, WEIGHT, storage_id
from perfcounter.quant.stored import STORED, is_packed, packed_parts
from perfcounter.trace_args import TensorArg, signature, tensor_arg

aten = torch.ops.aten
Tensor = torch.Tensor
_ACT_QUANT_MARKERS = ("act_quant_kwargs", "activation_quantization", "input_quant_func")
_current_mode = torch.utils._python_dispatch._get_current_dispatch_mode
_push, _pop = torch._C._push_on_torch_dispatch_stack, torch._C._pop_torch_dispatch_stack
_clock = time.perf_counter

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def executed_dtype(weight, activation_dtype: torch.dtype) -> str:
    """The dtype a linear with this weight multiplies in: the activation's for weight-only
    storage; int8 (or the data's float8) when torchao quantizes the activations too."""
    if not is_packed(weight) or all(getattr(weight, m, None) is None for m in _ACT_QUANT_MARKERS):
        return _dtype_name(activation_dtype)
    data = max(packed_parts(weight), key=lambda p: p.numel())
    return _dtype_name(data.dtype) if data.dtype.is_floating_point else "int8"


class _Layer:
    """What is kept of a layer whose weight is stored smaller: its kind, weight and parts."""

    __slots__ = ("linear", "weight", "parts", "part_bytes", "tag", "plans")

    def __init__(self, linear: bool, weight: Tensor):
        self.linear, self.weight = linear, weight
        self.parts = packed_parts(weight)
        override = STORED.get(weight)
        self.part_bytes = ([override] if override is not None else
                           [p.numel() * p.element_size() for p in self.parts])
        self.tag = type(weight).__name__ if override is None else "stored"
        self.plans: dict[tuple, OpPlan] = {}


class StoredLinears:
    """Counts each call of a layer with a stored-smaller weight as one op (module doc);
    `with` it around a counting block, after the module tracker is entered."""

    def __init__(self, mode):
        self.mode = mode  # the CountingMode: storages, tracker, log, overhead
        self._seen: dict[int, tuple] = {}  # id(module) -> (weakref, _Layer or None)
        self._open: list[tuple] = []  # (module, scope, layer, input, start) of layers running uncounted
        self._handles = ()

    def __enter__(self):
        self._handles = (register_module_forward_pre_hook(self._pre_hook),
                         register_module_forward_hook(self._post_hook, always_call=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = ()
        while self._open:  # a layer that raised past its hook: the mode goes back
            self._open.pop()
            _push(self.mode)

    def _layer(self, mod) -> _Layer | None:
        seen = self._seen.get(id(mod))
        if seen is not None and seen[0]() is mod:
            return seen[1]
        layer = None
        linear = isinstance(mod, torch.nn.Linear)
        if linear or isinstance(mod, torch.nn.Embedding):
            w = getattr(mod, "weight", None)
            if isinstance(w, Tensor) and (is_packed(w) or w in STORED):
                layer = _Layer(linear, w)
                self._register(layer)
        self._seen[id(mod)] = (weakref.ref(mod), layer)
        return layer

    def _register(self, layer: _Layer) -> None:
        """Role `weight` for the stored parts; a stored-size override sizes its storage."""
        table = self.mode.storages
        if layer.tag != "stored":
            for p in layer.parts:
                table.register(p, WEIGHT)
            return
        w, size = layer.weight, layer.part_bytes[0]
        st = table.by_id.get(storage_id(w))
        if st is None or st.role != WEIGHT or st.size != size:
            table.new(storage_id(w), WEIGHT, size, w.untyped_storage())

    def _pre_hook(self, mod, args) -> None:
        layer = self._layer(mod)
        if layer is None or _current_mode() is not self.mode or not args \
                or not isinstance(args[0], Tensor):
            return
        if mod.weight is not layer.weight:  # swapped since: classify it again
            self._seen.pop(id(mod), None)
            layer = self._layer(mod)
            if layer is None:
                return
        _pop(None)
        self._open.append((mod, self.mode.tracker.scope, layer, args[0], _clock()))

    def _post_hook(self, mod, args, output) -> None:
        if not self._open or self._open[-1][0] is not mod:
            return
        t0 = _clock()
        _, scope, layer, x, start = self._open.pop()
        _push(self.mode)
        if not isinstance(output, Tensor):  # the layer raised (always_call)
            return
        mode = self.mode
        plan, tensors = self._plan(layer, mod, x, output)
        roles = mode.storages.account(plan, tensors, output)
        mode.log.append((scope, plan, roles))
        mode.stored_call(mode.log[-1], tensors, output, t0 - start)
        mode.overhead += _clock() - t0

    def _plan(self, layer: _Layer, mod, x: Tensor, out: Tensor) -> tuple[OpPlan, list]:
        """The call's plan (cached per input signature) and its tensors: a linear's input,
        weight parts, bias; an embedding's weight parts, indices."""
        bias = getattr(mod, "bias", None) if layer.linear else None
        tensors = [x, *layer.parts] if layer.linear else [*layer.parts, x]
        if bias is not None:
            tensors.append(bias)
        key = (x.shape, x.stride(), x.dtype, out.dtype, bias is not None)
        plan = layer.plans.get(key)
        if plan is None:
            plan = layer.plans[key] = _make_plan(layer, x, out, bias, tensors)
        return plan, tensors


def _arg(t: Tensor, tag: str = "") -> TensorArg:
    """t as its plan's argument (a subclass without strides: none)."""
    try:
        stride = tuple(t.stride())
    except (RuntimeError, NotImplementedError):
        stride = ()
    return tensor_arg(t.shape, stride, _dtype_name(t.dtype), tag)


def _make_plan(layer: _Layer, x: Tensor, out: Tensor, bias, tensors: list) -> OpPlan:
    w = layer.weight
    w_shape = costs.Shape(w.shape, w.dtype)
    if layer.linear:
        b_shape = None if bias is None else costs.Shape(bias.shape, bias.dtype)
        cost = costs.op_info(aten.linear).formula(costs.Shape(x.shape, x.dtype), w_shape, b_shape)
        first, share, place = 1, 1, Place.REGION
        dtype = executed_dtype(w, x.dtype)
        args = (_arg(x), _arg(w, layer.tag)) + ((_arg(bias),) if bias is not None else ())
    else:
        cost = costs.ZERO  # an embedding reads one row per index and computes nothing
        first, place = 0, Place.ROWS
        share = (x.numel(), w.shape[0])  # rows read, of rows stored
        dtype = _dtype_name(out.dtype)
        args = (_arg(w, layer.tag), _arg(x))
    reads = []
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if first <= i < first + len(layer.parts):
            nbytes = layer.part_bytes[i - first]
            if share != 1:  # an embedding: its rows' share, as the float table's formula
                nbytes = nbytes * share[0] // max(share[1], 1)
            reads.append(Read(i, nbytes, t.element_size(), place))
        else:
            reads.append(Read(i, nbytes, t.element_size(), Place.REGION))
    name = "aten.linear.default" if layer.linear else "aten.embedding.default"
    return OpPlan(name, dtype, args, signature(args), cost, True, tuple(reads), (),
                  (Output(0, out.numel() * out.element_size()),), ACTIVATION, False, False, (),
                  layer.linear)  # a linear is a matmul kernel; an embedding a fused gather
