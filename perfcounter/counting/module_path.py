"""Which module each op runs under: a small tracker on torch's public global forward hooks.

Modules are named as torch's ModuleTracker names them: the first module seen
is its class name ("LlamaForCausalLM"), its children "LlamaForCausalLM.model",
and so on. `scope` is what an op is attributed to: (the innermost running
module's path, truncated to `depth` parts; the segment of that module's forward
it is in — k after the module's k-th child call returned). Modules no deeper
than `depth` are listed in `modules` (a `trace.ModuleInfo` each, in the order
they first ran, with their own parameters, their first call's input and output
sizes, and the children they called).

A module that is no child of the running model but is called from inside it (a
function wrapped as a module object at import time, as the `kernels` package that
transformers >= 5.25 requires wraps `apply_rotary_pos_emb`) is not a module of the
model: its ops are attributed to the module that calls it, in that module's current
segment, as if the function were called directly.

Hooks are process-wide; only calls on the thread that entered the tracker are
tracked, so a model running on another thread does not disturb the count.
"""
from __future__ import annotations

import weakref
from threading import get_ident

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from perfcounter.quant.stored import stored_nbytes
from perfcounter.trace import ModuleInfo

Tensor = torch.Tensor


class _Named:
    """What is kept of a module across blocks: its name (`listed` when it has at most
    `depth` parts), its class and its own parameters."""

    __slots__ = ("ref", "name", "listed", "scope", "cls", "params", "param_bytes")

    def __init__(self, mod, name: str, listed: bool):
        self.ref, self.name, self.listed = weakref.ref(mod), name, listed
        self.scope = (name, 0)  # the scope of its ops before its first child runs
        self.cls = type(mod).__name__
        params = list(mod.parameters(recurse=False))
        self.params = sum(p.numel() for p in params)
        self.param_bytes = sum(stored_nbytes(p) for p in params)  # as stored (GGUF, torchao)


class _Frame:
    """A listed module running now."""

    __slots__ = ("module_id", "name", "segment", "info")

    def __init__(self, module_id: int, name: str, info: ModuleInfo):
        self.module_id, self.name, self.segment, self.info = module_id, name, 0, info


class ModulePath:
    """Tracks the innermost running module; `on_new_module(mod)` runs the first time a
    module is seen (the counter registers its parameters and buffers then)."""

    def __init__(self, depth: int, on_new_module=None):
        self.depth = depth
        self.on_new_module = on_new_module
        self._names = weakref.WeakKeyDictionary()  # module -> full name (ModuleTracker's scheme)
        self._named_children = weakref.WeakSet()  # modules whose children have names
        self._by_id: dict[int, _Named] = {}  # id(module) -> _Named: the hooks' fast lookup
        self._handles = ()
        self._thread = None
        self.reset()

    def reset(self) -> None:
        """A new block: no module running, no module listed."""
        self.stack: list[_Frame] = []
        self.top_segment = 0  # segment outside any module
        self.scope = ("", 0)
        self.modules: dict[str, ModuleInfo] = {}

    def __enter__(self):
        self._thread = get_ident()
        self._handles = (register_module_forward_pre_hook(self._pre_hook),
                         register_module_forward_hook(self._post_hook, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = ()

    # -- names -----------------------------------------------------------------------
    def _full_name(self, mod) -> str:
        name = self._names.get(mod)
        if name is None:
            name = self._names[mod] = type(mod).__name__
        if mod not in self._named_children:
            for child_name, child in mod.named_children():
                self._names[child] = f"{name}.{child_name}"
                self._full_name(child)
            self._named_children.add(mod)
        return name

    def _named(self, mod) -> _Named:
        """A module seen for the first time (or whose id was reused). One called from
        inside a running module that never named it as a child is unlisted: its ops stay
        with its caller."""
        orphan = bool(self.stack) and mod not in self._names
        name = self._full_name(mod)
        named = self._by_id[id(mod)] = _Named(mod, name, not orphan and name.count(".") < self.depth)
        if self.on_new_module is not None:
            self.on_new_module(mod)
        return named

    # -- hooks -----------------------------------------------------------------------
    def _pre_hook(self, mod, args) -> None:
        if get_ident() != self._thread:
            return
        named = self._by_id.get(id(mod))
        if named is None or named.ref() is not mod:  # first sight, or an id reused
            named = self._named(mod)
        if not named.listed:
            return  # deeper than depth: its ops go to its listed ancestor's current segment
        info = self.modules.get(named.name)
        if info is None:
            info = self.modules[named.name] = ModuleInfo(named.name, named.cls, 0, named.params,
                                                         named.param_bytes)
        info.calls += 1
        stack = self.stack
        if stack and stack[-1].info.calls == 1:
            stack[-1].info.children.append(named.name)
        stack.append(_Frame(id(mod), named.name, info))
        self.scope = named.scope

    def _post_hook(self, mod, args, kwargs, output) -> None:
        if get_ident() != self._thread:
            return
        stack = self.stack
        if not stack or stack[-1].module_id != id(mod):
            if not any(f.module_id == id(mod) for f in stack):
                return  # an unlisted module
            while stack[-1].module_id != id(mod):  # modules left out of order: drop them
                stack.pop()
        frame = stack.pop()
        if frame.info.calls == 1:
            _fill_io(frame.info, args, kwargs, output)
        if stack:
            top = stack[-1]
            top.segment += 1
            self.scope = (top.name, top.segment)
        else:
            self.top_segment += 1
            self.scope = ("", self.top_segment)


def _first_tensor(values):
    """The first tensor among values, or among the items of a list, tuple or dict in them."""
    for v in values:
        if isinstance(v, Tensor):
            return v
        if isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, Tensor):
                    return t
        elif isinstance(v, dict):
            for t in v.values():
                if isinstance(t, Tensor):
                    return t
    return None


def _fill_io(info: ModuleInfo, args, kwargs, output) -> None:
    """A module's first call: its input x (the first tensor argument, positional before
    keyword) and its output (the first tensor it returned): shape and bytes. The shape is
    kept raw here; `trace.build_trace` writes it out once per phase."""
    x = _first_tensor(args)
    if x is None and kwargs:
        x = _first_tensor(kwargs.values())
    if x is not None:
        info.input_shapes = (x.shape,)
        info.input_bytes = x.numel() * x.element_size()
    y = output if isinstance(output, Tensor) else _first_tensor(
        output.values() if isinstance(output, dict) else (output,))
    if y is not None:
        info.output_bytes = y.numel() * y.element_size()


def check_depth(depth, *, none_ok: bool = False):
    """depth itself when it is a positive int (or None, with none_ok); else a ValueError."""
    if depth is None and none_ok:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int{' or None' if none_ok else ''}, "
                         f"got {depth!r}")
    return depth
