"""The fp8 linear (W8A8, TensorRT-LLM's FP8): float8_e4m3fn weights and activations.

    quantize_model(model, "fp8")     # quantize.py: every nn.Linear becomes a Float8Linear

Stored: the weight [N, K] as float8_e4m3fn (one byte an element) and one float32 scale for
the whole tensor (4 B): N·K + 4 bytes, w ≈ weight · weight_scale. Per call the activation
x [M, K] is quantized per tensor, dynamically, as two kernels do it (vLLM's
`scaled_fp8_quant` without a static scale): an abs-max reduction (`perfcounter::fp8_scale`:
reads x, writes a 4-byte scale) and a scaled, saturating cast (`perfcounter::fp8_cast`:
reads x and the scale, writes M·K bytes). The product is `aten._scaled_mm` (fp8 × fp8 on
fp8 tensor cores, both scales applied to the float32 accumulator, output in x's dtype, the
bias added in its epilogue): 2·M·N·K FLOPs at float8_e4m3fn, priced at the device's fp8
peak; it reads both fp8 operands and the scales and writes M·N elements of x's dtype.

What a fused engine kernel skips. TensorRT-LLM's FP8 uses static activation scales from
calibration (no abs-max pass: its 4-byte scale is a constant) and writes the fp8 activation
from the kernel that produces it (RMSNorm, SiLU·mul, attention's output), so the cast's
separate read of x disappears too; in the `compiled` and `cudagraphs` regimes the
prediction fuses both records into their neighbours (fused IO), which is close to
that. Eager (and PyTorch on a GPU without such fusion) pays both passes, as counted.

`aten._scaled_mm` runs on CPU tensors in torch 2.13, real and fake, so an fp8 model can be
counted config only (FakeTensorMode) and run with real weights on a CPU alike.
Imports torch and quant.ops only.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor

from perfcounter.quant.ops import FP8, quantize_fp8_per_tensor

aten = torch.ops.aten


class Float8Linear(nn.Module):
    """y = fp8(x / sx) @ (fp8 weight [N, K])ᵀ · sx · weight_scale (+ bias), in x's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 bias_dtype=torch.bfloat16, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8,
                                               device=device), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.ones((), dtype=torch.float32, device=device),
                                         requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Float8Linear:
        """An nn.Linear's fp8 twin: real weights quantized; fake or meta ones (no values)
        give empty tensors of the stored layout."""
        w = linear.weight
        new = cls(w.shape[1], w.shape[0], linear.bias is not None, bias_dtype=w.dtype,
                  device=w.device)
        if not w.is_meta and not isinstance(w, FakeTensor):
            new.load_float(w, linear.bias)
        return new

    @torch.no_grad()
    def load_float(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """Quantize a float weight [N, K] into this module (per tensor); copy the bias."""
        q, scale = quantize_fp8_per_tensor(weight.detach())
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        if bias is not None:
            self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)  # [M, K]
        x_scale = torch.ops.perfcounter.fp8_scale(rows)  # [] float32
        xq = torch.ops.perfcounter.fp8_cast(rows, x_scale)  # [M, K] float8_e4m3fn
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else \
            self.bias.to(x.dtype)
        y = aten._scaled_mm(xq, self.weight.t(), x_scale, self.weight_scale, bias=bias,
                            out_dtype=x.dtype)  # [M, N]
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight=float8_e4m3fn per tensor")
