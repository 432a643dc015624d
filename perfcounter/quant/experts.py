"""Quantized experts of a mixture of experts: models.model.ConditionalFeedForward's stacked
weights (w1, w3 [E, I, dim], w2 [E, dim, I]) stored as quantize.py stores one linear's weight.

    quantize_experts(model, "int4", group_size=128)   # quantize.quantize_model calls it

Stored, per stacked weight of E experts of [N, K] each (bytes as for E linears):
- int8: `weight` [E, N, K] int8 + `scales` [E, N] in the model's dtype: E·N·K + E·N·itemsize;
- int4-G: `weight` [E, N, K/2] uint8 (two nibbles a byte; once tiled, each expert in the CPU
  kernel's layout, same bytes) + `scales_and_zeros` [E, K/G, N, 2]: E·N·K/2 + E·(K/G)·N·2·2
  (16-bit scales);
- fp8: `weight` [E, N, K] float8_e4m3fn + `weight_scale` [E] float32 (one per expert, as
  fp8.Float8Linear has one per tensor): E·N·K + 4·E.

Running. Each expert that gets rows runs its SwiGLU once on exactly those rows, each weight
through the kernel its linear twin uses: int8 `aten._weight_int8pack_mm` (M·N·K MACs + M·N
scale muls), int4 `aten._weight_int4pack_mm_for_cpu` (M·N·K MACs), fp8 `aten._scaled_mm`
(the rows quantized once for w1 and w3 and once for w2, as a fused MoE's w13 does), so each
touched expert's weights are read once as stored and the FLOPs are the float matmul's at the
activations' dtype. Elsewhere (CUDA, or an int4 weight whose N is no multiple of 16) an
expert's weight is dequantized eagerly (`kernel = "dequant"`), as the linears do. Real
tensors: the experts the router picked. Fake tensors (no values): the T·A routed rows split as
`routing` says (counting's ExpertLoad, set by config_only.routed) or, with none, evenly over
min(T·A, E) experts (ExpertLoad's balanced split) — the same kernels on the same rows as a real
run of that routing (unlike the float module's `_balanced`, no row is padded).
Imports torch and quant.ops only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor

from perfcounter.quant.ops import (FP8, dequantize_int4, int4_cpu_layout, int4_scale_dtype,
                                   quantize_fp8_per_tensor, quantize_int4_groupwise,
                                   quantize_int8_per_channel)

aten = torch.ops.aten
NAMES = ("w1", "w2", "w3")  # ConditionalFeedForward's stacked weights


def _param(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)  # a parameter: the counter's `weight` role


class StackedWeight(nn.Module):
    """E experts' [N, K] weights stored quantized; `matmul(e, x)` = x [M, K] @ w[e]ᵀ -> [M, N]."""

    kind = ""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.num_experts = num_experts
        self.in_features, self.out_features = in_features, out_features

    def quantize_input(self, x: Tensor):
        """What the kernel needs of x beyond x itself, shared by weights that read the same x."""
        return None

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, {self.kind}")


class Int8Experts(StackedWeight):
    """int8 [E, N, K] and a scale per expert and row [E, N] (WeightOnlyInt8Linear's, stacked)."""

    kind = "int8"

    def __init__(self, e: int, k: int, n: int, *, scale_dtype=torch.bfloat16, device=None):
        super().__init__(e, k, n)
        self.weight = _param(torch.empty(e, n, k, dtype=torch.int8, device=device))
        self.scales = _param(torch.empty(e, n, dtype=scale_dtype, device=device))
        self.kernel = "fused"

    @torch.no_grad()
    def load_float(self, w: Tensor) -> None:
        e, n, k = w.shape  # per row of each expert: the same as per expert
        q, scales = quantize_int8_per_channel(w.detach().reshape(e * n, k), w.dtype)
        self.weight, self.scales = _param(q.view(e, n, k)), _param(scales.view(e, n))

    def matmul(self, e: int, x: Tensor, xq=None) -> Tensor:
        scales = self.scales[e] if self.scales.dtype == x.dtype else self.scales[e].to(x.dtype)
        if self.kernel == "fused" and x.device.type == "cpu":
            return aten._weight_int8pack_mm(x, self.weight[e], scales)
        return F.linear(x, self.weight[e].to(x.dtype)) * scales


class Int4Experts(StackedWeight):
    """Nibbles [E, N, K/2] and scales_and_zeros [E, K/G, N, 2] (WeightOnlyInt4Linear's, stacked)."""

    kind = "int4"

    def __init__(self, e: int, k: int, n: int, group_size: int, *, scale_dtype=torch.bfloat16,
                 device=None):
        super().__init__(e, k, n)
        self.group_size = group_size
        self.weight = _param(torch.empty(e, n, k // 2, dtype=torch.uint8, device=device))
        self.scales_and_zeros = _param(torch.empty(e, k // group_size, n, 2, dtype=scale_dtype,
                                                   device=device))
        self.kernel = "dequant"  # "fused" once each expert is in the CPU kernel's tiled layout

    @torch.no_grad()
    def load_float(self, w: Tensor) -> None:
        e, n, k = w.shape  # groups run along K within a row: all experts' rows at once
        q, sz = quantize_int4_groupwise(w.detach().reshape(e * n, k), self.group_size,
                                        self.scales_and_zeros.dtype)  # [E·N, K/2], [K/G, E·N, 2]
        self.weight = _param(q.view(e, n, k // 2))
        self.scales_and_zeros = _param(sz.view(k // self.group_size, e, n, 2)
                                       .transpose(0, 1).contiguous())

    def use_cpu_kernel(self, *, convert: bool = True) -> None:
        """Tile each expert for aten._weight_int4pack_mm_for_cpu (same bytes), as
        WeightOnlyInt4Linear.use_cpu_kernel; convert=False for weights with no values."""
        if self.kernel == "fused" or self.out_features % 16 or self.weight.device.type != "cpu":
            return
        if convert:
            self.weight = _param(torch.stack([int4_cpu_layout(w) for w in self.weight.data]))
        self.kernel = "fused"

    def matmul(self, e: int, x: Tensor, xq=None) -> Tensor:
        sz = self.scales_and_zeros[e]
        sz = sz if sz.dtype == x.dtype else sz.to(x.dtype)
        if self.kernel == "fused" and x.device.type == "cpu":
            return aten._weight_int4pack_mm_for_cpu(x, self.weight[e], self.group_size, sz)
        return F.linear(x, dequantize_int4(self.weight[e], sz, self.group_size, x.dtype))


class Float8Experts(StackedWeight):
    """float8_e4m3fn [E, N, K] and one float32 scale per expert [E] (Float8Linear's, stacked)."""

    kind = "fp8"

    def __init__(self, e: int, k: int, n: int, *, device=None):
        super().__init__(e, k, n)
        self.weight = _param(torch.empty(e, n, k, dtype=FP8, device=device))
        self.weight_scale = _param(torch.ones(e, dtype=torch.float32, device=device))

    @torch.no_grad()
    def load_float(self, w: Tensor) -> None:
        parts = [quantize_fp8_per_tensor(we) for we in w.detach()]
        self.weight = _param(torch.stack([q for q, _ in parts]))
        self.weight_scale = _param(torch.stack([s for _, s in parts]))

    def quantize_input(self, x: Tensor):
        scale = torch.ops.perfcounter.fp8_scale(x)  # [] float32, one abs-max pass
        return torch.ops.perfcounter.fp8_cast(x, scale), scale  # [M, K] float8

    def matmul(self, e: int, x: Tensor, xq=None) -> Tensor:
        xq, x_scale = self.quantize_input(x) if xq is None else xq
        return aten._scaled_mm(xq, self.weight[e].t(), x_scale, self.weight_scale[e],
                               out_dtype=x.dtype)


class QuantizedExperts(nn.Module):
    """ConditionalFeedForward with w1, w2, w3 stored quantized; the same call:
    x [T, dim], expert_indices [T, A] -> [T, A, dim]."""

    def __init__(self, w1: StackedWeight, w2: StackedWeight, w3: StackedWeight):
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3
        self.routing = None  # as ConditionalFeedForward's: an ExpertLoad under fake tensors

    @property
    def num_experts(self) -> int:
        return self.w1.num_experts

    def expert(self, e: int, h: Tensor) -> Tensor:
        """Expert e's SwiGLU on its rows h [n, dim] -> [n, dim]."""
        hq = self.w1.quantize_input(h)  # fp8: once for w1 and w3
        g = F.silu(self.w1.matmul(e, h, hq)) * self.w3.matmul(e, h, hq)
        return self.w2.matmul(e, g)

    def forward(self, x: Tensor, expert_indices: Tensor) -> Tensor:
        top_k = expert_indices.shape[1]
        if isinstance(x, FakeTensor):
            return self._without_values(x, top_k)
        out = x.new_empty(*expert_indices.shape, x.shape[-1])
        for e in expert_indices.unique().tolist():  # each expert in use is read once
            t, a = torch.where(expert_indices == e)
            out[t, a] = self.expert(e, x[t])
        return out

    def rows_per_expert(self, rows: int) -> list[int]:
        """How `rows` routed rows split over the experts without values: `routing`'s split,
        or evenly (ExpertLoad's balanced: the first rows % E experts one more)."""
        e = self.num_experts
        if getattr(self.routing, "shares", None) is not None:
            return self.routing.rows_per_expert(rows, e)
        return [rows // e + (1 if i < rows % e else 0) for i in range(e)]

    def _without_values(self, x: Tensor, top_k: int) -> Tensor:
        slots = x.repeat_interleave(top_k, dim=0)  # [T·A, dim]
        out, start = torch.empty_like(slots), 0
        for e, n in enumerate(self.rows_per_expert(slots.shape[0])):
            if n:  # one copy per expert (a cat of as many pieces as experts would change form)
                out[start:start + n] = self.expert(e, slots[start:start + n])
                start += n
        return out.view(x.shape[0], top_k, -1)


def is_float_experts(module: nn.Module) -> bool:
    """A ConditionalFeedForward (models.model, a higher layer): w1, w2, w3 stacked 3-D
    float parameters [E, N, K]."""
    ws = [getattr(module, n, None) for n in NAMES]
    return all(isinstance(w, nn.Parameter) and w.dim() == 3 and w.is_floating_point()
               for w in ws)


def float_experts(model: nn.Module) -> list[tuple[nn.Module, str, str, nn.Module]]:
    """(parent, attribute, path, module) of every float ConditionalFeedForward, in order."""
    return [(parent, name, f"{path}.{name}" if path else name, child)
            for path, parent in model.named_modules() for name, child in parent.named_children()
            if is_float_experts(child)]


def widths(module: nn.Module) -> dict[str, int]:
    """In features (K) of each stacked weight: w1, w3 dim; w2 the intermediate size."""
    return {n: getattr(module, n).shape[2] for n in NAMES}


def _stacked(w: Tensor, kind: str, group_size, tile: bool) -> StackedWeight:
    e, n, k = w.shape
    if kind == "int8":
        new = Int8Experts(e, k, n, scale_dtype=w.dtype, device=w.device)
    elif kind == "int4":
        new = Int4Experts(e, k, n, group_size, scale_dtype=int4_scale_dtype(w.dtype),
                          device=w.device)
    else:
        new = Float8Experts(e, k, n, device=w.device)
    if w.is_meta:  # to be loaded (the stored layout), then quantize.use_kernels
        return new
    if not isinstance(w, FakeTensor):
        new.load_float(w)
    if kind == "int4" and tile:  # fake: no values to tile, the bytes are the same
        new.use_cpu_kernel(convert=not isinstance(w, FakeTensor))
    return new


def quantize_experts(module: nn.Module, kind: str, group_size=None, *,
                     tile: bool = True) -> QuantizedExperts:
    """A float ConditionalFeedForward's quantized twin (kind "int8", "int4" with group_size,
    "fp8"); its routing carried over. Fake or meta weights give empty tensors of the stored
    layout (fake ones inside their FakeTensorMode)."""
    new = QuantizedExperts(*(_stacked(getattr(module, n), kind, group_size, tile)
                             for n in NAMES))
    new.routing = getattr(module, "routing", None)
    return new
