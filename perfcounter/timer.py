"""PerformanceTimer, CUDAPerformanceTimer and total_model_params (torchao's names).

    with PerformanceTimer("prefill") as t:
        model(x)
    t.latency, t.total_flops, t.total_io, t.flop_counts, t.get_summary_io_counts()

A timer is a context manager over a PerformanceCounterMode that also measures
the block's wall time: PerformanceTimer with time.perf_counter (no device
synchronization, as torchao), CUDAPerformanceTimer with CUDA events, the device
synchronized. TransformerPerformanceCounter makes one timer per count() block
from its `timer_cls` and hands it its own mode (the `mode=` keyword), so that
the roles learned in prefill (weights, KV cache) still hold in decode.

Differences from torchao, on purpose: `latency` excludes the mode's own
bookkeeping (`raw_latency` includes it, `timing` says how it was measured); a
block run on fake or meta tensors has latency None (nothing was executed);
`display=True` prints the block's line on exit, as torchao did.
"""
from __future__ import annotations

import itertools
import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from perfcounter.counting.mode import PerformanceCounterMode
from perfcounter.counting.module_path import check_depth


def _fake_mode_active() -> bool:
    """True when a FakeTensorMode is on the dispatch stack (no real execution)."""
    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


class _RealityProbe:
    """Tells whether a block really executes: no FakeTensorMode active, and the
    first module called in it holds (or, without weights, receives) neither
    meta nor fake tensors. The probe's global forward pre-hook removes itself
    at its first answer, so it costs one hook call per block."""

    def __enter__(self):
        self.real = not _fake_mode_active()
        self._handle = None
        if self.real:
            self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._look)
        return self

    def _look(self, module, args):
        tensors = itertools.chain(module.parameters(), module.buffers(),
                                  (a for a in args if isinstance(a, torch.Tensor)))
        t = next(tensors, None)
        if t is not None:
            self.real = not (t.is_meta or is_fake(t))
            self._remove()

    def _remove(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __exit__(self, *exc):
        self._remove()


class PerformanceTimer:
    """Counts FLOPs and bytes of a block and times it with time.perf_counter.

    name: the block's name (printed with display=True); precision: decimals of that
    line; depth: module depth of the counts; mode: an existing PerformanceCounterMode
    to count with (the counter passes its own), else a new one."""

    method = "time.perf_counter"

    def __init__(self, name: str = "", precision: int = 1, display: bool = False, depth: int = 10,
                 *, mode=None):
        self.name, self.precision, self.display = str(name), precision, display
        self.depth = check_depth(depth)
        self.perf_counter = mode if mode is not None else PerformanceCounterMode(
            display=display, depth=depth)
        self.latency: float | None = None  # seconds, the mode's bookkeeping excluded
        self.raw_latency: float | None = None  # seconds, bookkeeping included
        self.timing = ""  # how latency was measured, or why it was not
        self._probe = None

    # -- the clock (CUDAPerformanceTimer overrides these two) -------------------------
    def _start(self) -> None:
        self._t0 = time.perf_counter()

    def _stop(self) -> float:
        return time.perf_counter() - self._t0

    # -- the block -----------------------------------------------------------------
    def __enter__(self):
        self.perf_counter.__enter__()
        try:
            self._probe = _RealityProbe().__enter__()
            self._start()
        except BaseException as e:
            if self._probe is not None:
                self._probe.__exit__(type(e), e, e.__traceback__)
            self.perf_counter.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            raw = self._stop()  # first: time the work, not the bookkeeping of leaving
        finally:
            self._probe.__exit__(exc_type, exc, tb)
            self.perf_counter.__exit__(exc_type, exc, tb)
        if self._probe.real:
            overhead = self.perf_counter.last_block().overhead_s
            self.raw_latency, self.latency = raw, max(raw - overhead, 0.0)
            self.timing = self.method
        else:
            self.raw_latency = self.latency = None
            self.timing = "not measured: fake or meta tensors"
        if self.display and exc_type is None:
            print(self._exit_line(), flush=True)  # asked for explicitly, as torchao's flag
        return False

    def _exit_line(self) -> str:
        gflops = round(self.total_flops / 1e9, self.precision)
        ms = "n/a" if self.latency is None else f"{round(self.latency * 1e3, self.precision)} ms"
        return f"{self.name.upper()}:  latency = {ms}, FLOPS = {gflops} GFLOPs"

    # -- torchao's accessors (the last block) ------------------------------------------
    @property
    def total_flops(self) -> int:
        return self.perf_counter.get_total_flops()

    @property
    def total_io(self) -> int:
        return self.perf_counter.get_total_io()

    @property
    def flop_counts(self) -> dict[str, dict]:
        return self.perf_counter.get_flop_counts()

    @property
    def io_counts(self) -> dict[str, dict]:
        return self.perf_counter.get_io_counts()

    def get_summary_flop_counts(self) -> dict[str, int]:
        return self.perf_counter.get_summary_flop_counts()

    def get_summary_io_counts(self) -> dict[str, int]:
        return self.perf_counter.get_summary_io_counts()

    @property
    def flops_table(self) -> str:
        """FLOPs per module, indented by depth (torchao returned FlopCounterMode's table)."""
        return self.perf_counter.pretty_summary_counts("flops")

    def get_pretty_summary(self, depth: int | None = None) -> str:
        return self.perf_counter.pretty_summary_counts(depth=depth if depth is not None else self.depth)


class CUDAPerformanceTimer(PerformanceTimer):
    """PerformanceTimer timed with CUDA events; the device is synchronized before and after."""

    method = "cuda events, synchronized"

    def __init__(self, name: str = "", precision: int = 1, display: bool = False, depth: int = 10,
                 *, mode=None):
        require_cuda(type(self).__name__)
        super().__init__(name, precision, display, depth, mode=mode)

    def _start(self) -> None:
        torch.cuda.synchronize()
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._begin.record()

    def _stop(self) -> float:
        self._end.record()
        torch.cuda.synchronize()
        return self._begin.elapsed_time(self._end) * 1e-3


def require_cuda(what: str) -> None:
    """A ValueError when CUDA is not available here."""
    if not torch.cuda.is_available():
        raise ValueError(f"{what} needs a CUDA device and torch.cuda.is_available() is False "
                         "here; use PerformanceTimer")


def default_timer_cls() -> type[PerformanceTimer]:
    """CUDAPerformanceTimer when CUDA is in use (initialized), else PerformanceTimer."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return CUDAPerformanceTimer if cuda else PerformanceTimer


def check_timer_cls(timer_cls) -> type[PerformanceTimer] | None:
    """timer_cls itself when it is PerformanceTimer or a subclass (or None: chosen per block);
    else a TypeError. A CUDA timer without CUDA is a ValueError, raised here, not mid-run."""
    if timer_cls is None:
        return None
    if not (isinstance(timer_cls, type) and issubclass(timer_cls, PerformanceTimer)):
        raise TypeError(f"timer_cls must be PerformanceTimer, CUDAPerformanceTimer or a subclass "
                        f"of them, got {timer_cls!r}")
    if issubclass(timer_cls, CUDAPerformanceTimer):
        require_cuda(timer_cls.__name__)
    return timer_cls


def total_model_params(model: torch.nn.Module, exclude_embeddings: bool = True,
                       embedding_key: str = "tok_embeddings") -> int:
    """Parameters of `model` (shared ones once), less the embedding table's weight when
    exclude_embeddings (torchao's convention, which subtracts it even when the output head
    shares it; `perfcounter.models.model.count_params` does not). embedding_key may be a dotted
    path ("model.embed_tokens" for a transformers model)."""
    total = sum(p.numel() for p in model.parameters())
    if not exclude_embeddings:
        return total
    try:
        embedding = model.get_submodule(embedding_key)
    except AttributeError:
        found = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
        raise ValueError(f"{type(model).__name__} has no module {embedding_key!r}; pass "
                         f"embedding_key= one of: {', '.join(found) or 'none (no nn.Embedding)'}, "
                         "or exclude_embeddings=False") from None
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{embedding_key!r} of {type(model).__name__} has no weight tensor")
    return total - weight.numel()
