"""A transformers checkpoint's weights as it ships them: the bytes of each weight its
`quantization_config` stores smaller, and the dtype its matmuls run in on the engines.

    stored = StoredFormat.of(config)        # None: the checkpoint's weights are float
    stored.nbytes(name, param)              # the bytes one parameter is stored in
    stored.ratio(name, param)               # stored bytes / float bytes at the precision

Two formats ship today's large checkpoints:
- fp8 with `weight_block_size` [b0, b1] (DeepSeek-V3/R1, Qwen3-*-FP8: quant_method "fp8",
  fmt e4m3): each converted weight is float8_e4m3fn, 1 B an element, with a float32
  `weight_scale_inv` per b0 x b1 block (transformers/integrations/finegrained_fp8.py;
  vLLM's Fp8LinearMethod with block quantization): [out, in] -> out x in + ceil(out / b0) x
  ceil(in / b1) x 4 B; stacked experts [E, out, in] the same per expert. The engines run
  these matmuls in FP8 (vLLM's block-scaled CUTLASS / DeepGEMM kernels on Hopper and
  Blackwell), so their FLOPs are priced at the device's FP8 rate.
- mxfp4 (gpt-oss: quant_method "mxfp4"): the experts' gate_up_proj and down_proj as OCP
  microscaling FP4: 4 bits an element and one 8-bit E8M0 scale per 32 elements
  (`_blocks` and `_scales` in the checkpoint; the OCP MX v1.0 specification), numel x 17 / 32
  B. On Hopper, vLLM's MXFP4 MoE (Marlin / Triton kernels) dequantizes to bf16 in the kernel:
  the FLOPs stay at the precision; the bytes are what is stored.
Converted: every nn.Linear weight and every stacked expert weight (the experts' 3-D
gate_up_proj, up_proj, down_proj), but what `modules_to_not_convert` names (fnmatch, `*` a
layer's index) and what is never converted: embeddings, the LM head, norms, routers, biases.
mxfp4 converts the experts alone.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch

FORMATS = ("fp8", "mxfp4")
EXPERT_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")  # a stacked experts module's
NEVER = ("embed_tokens", "lm_head", "norm", "router", "gate.weight", "bias")
FP8 = "float8_e4m3fn"


@dataclass(frozen=True)
class StoredFormat:
    """A checkpoint's quantization_config, as far as bytes and FLOPs go."""

    method: str
    block: tuple = (128, 128)  # fp8's weight_block_size
    skip: tuple = ()  # modules_to_not_convert

    @classmethod
    def of(cls, config) -> StoredFormat | None:
        q = getattr(config, "quantization_config", None)
        if q is None:
            return None
        q = q if isinstance(q, dict) else q.to_dict()
        method = q.get("quant_method")
        if method not in FORMATS:
            raise ValueError(f"quantization_config quant_method {method!r}: priced as stored "
                             f"for {', '.join(FORMATS)}")
        if method == "fp8" and not q.get("weight_block_size"):
            raise ValueError("quantization_config fp8 without weight_block_size: the per-tensor "
                             "fp8 format is not priced here")
        return cls(method, tuple(q.get("weight_block_size") or (128, 128)),
                   tuple(q.get("modules_to_not_convert") or ()))

    def converts(self, name: str, param: torch.Tensor) -> bool:
        """Whether parameter `name` ("model.layers.3.mlp.experts.down_proj") is stored smaller."""
        module, _, leaf = name.rpartition(".")
        if any(n in name for n in NEVER) or any(fnmatch.fnmatchcase(module, s) or
                                                 fnmatch.fnmatchcase(name, s) or
                                                 module.startswith(s + ".") for s in self.skip):
            return False
        expert = leaf in EXPERT_WEIGHTS and param.dim() == 3
        if self.method == "mxfp4":
            return expert
        return expert or (leaf == "weight" and param.dim() == 2)

    def nbytes(self, name: str, param: torch.Tensor) -> int | None:
        """Bytes `param` is stored in; None where it is not converted (float)."""
        if not self.converts(name, param):
            return None
        if self.method == "mxfp4":
            return param.numel() * 17 // 32  # 4 bits + an 8-bit scale per 32 elements
        *experts, out, inp = param.shape
        blocks = math.ceil(out / self.block[0]) * math.ceil(inp / self.block[1])
        return param.numel() + math.prod(experts) * blocks * 4

    def module_ratios(self, model) -> dict[str, float]:
        """{module path as the counter names it (the model's class, then its path): the
        bytes its own weights are stored in over their float bytes}, for each module that
        holds a converted weight."""
        root = type(model).__name__
        out: dict[str, list] = {}
        for name, p in model.named_parameters():
            module = name.rpartition(".")[0]
            stored = self.nbytes(name, p)
            full = p.numel() * p.element_size()
            acc = out.setdefault(f"{root}.{module}", [0, 0, False])
            acc[0] += full if stored is None else stored
            acc[1] += full
            acc[2] |= stored is not None
        return {m: a / b for m, (a, b, converted) in out.items() if converted}

    def runs_in(self, precision: str) -> str:
        """The dtype a converted weight's matmul runs in (the module doc)."""
        return FP8 if self.method == "fp8" else precision
