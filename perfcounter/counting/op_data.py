"""The few numbers an op's cost reads from tensor values, or assumes when there are none.

Most plans depend on shapes alone (op_plan.py). Two kinds of op compute or read
an amount that only the data says; they are `OpKind.DATA`, and `DATA_OPS[op]`
returns their numbers as (name, value) pairs, which join the plan's cache key
and reach the op's formula as keywords:

- attention with an explicit mask (`kept_pairs`): the query-key pairs a kernel
  that skips masked blocks computes, for `executed` FLOPs (`total_flops` stays
  dense). Real tensors: the pairs the mask keeps, whatever its structure
  (causal, sliding window, padding), counted once per mask and block. Fake
  tensors have no values: the running attention module says the structure —
  transformers' attention modules and ours carry `is_causal` and
  `sliding_window` (from the config) — aligned so that the queries are the last
  positions of the valid keys (a static cache is read whole but valid only as far
  as it was written; storage.py keeps that). No such module: dense.
- `_grouped_mm` over experts (`groups_hit`, `rows`): FLOPs are rows·K·N whatever
  the routing (each row meets one expert), but only the experts that received
  rows have their weights read. Real tensors: from `offs`. Fake tensors: from the
  counter's `ExpertLoad`, balanced by default (the rows spread evenly:
  min(E, rows) experts) or a distribution over the experts (`--expert_load`).

`attention_structure(module)` reads what an attention module declares (is_causal, its
window) when the counter first sees it.

`CALLS[op]` runs an op whose own kernel cannot: `_grouped_mm` on fake tensors of
any dtype and layout (torch's meta kernel accepts only bfloat16 with 16-byte
aligned strides; the output shape depends on neither).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor

from perfcounter.costs.attention import window_pairs

aten = torch.ops.aten


# --- MoE routing under fake tensors ---------------------------------------------------


class ExpertLoad:
    """How routed rows spread over the experts when there are no values (fake tensors).

    `ExpertLoad()` is balanced: rows spread evenly, so min(E, rows) experts are hit.
    `ExpertLoad([4, 2, 1, 1])` is a distribution over the experts (any positive
    weights, normalized): an expert gets its share of the rows, rounded by largest
    remainder; an expert is hit when it gets at least one row."""

    def __init__(self, shares: Sequence[float] | None = None):
        if shares is not None:
            shares = [float(s) for s in shares]
            if not shares or any(not math.isfinite(s) or s < 0 for s in shares) or not sum(shares):
                raise ValueError(f"expert_load must be non-negative numbers, one per expert, "
                                 f"not all 0; got {shares}")
            total = sum(shares)
            shares = tuple(s / total for s in shares)
        self.shares = shares

    @classmethod
    def parse(cls, value) -> "ExpertLoad":
        """None or "balanced"; a list of weights; or the same as text: "4,2,1,1"."""
        if value is None or isinstance(value, ExpertLoad):
            return value or cls()
        if isinstance(value, str):
            if value.strip().lower() == "balanced":
                return cls()
            try:
                value = [float(v) for v in value.replace(" ", "").split(",") if v]
            except ValueError:
                raise ValueError(f"expert_load {value!r}: expected 'balanced' or comma-separated "
                                 f"weights per expert, such as '4,2,1,1'") from None
        return cls(value)

    def rows_per_expert(self, rows: int, experts: int) -> list[int]:
        if self.shares is None:
            return [rows // experts + (1 if e < rows % experts else 0) for e in range(experts)]
        if len(self.shares) != experts:
            raise ValueError(f"expert_load has {len(self.shares)} weights, but this layer routes "
                             f"over {experts} experts")
        exact = [rows * s for s in self.shares]
        out = [math.floor(x) for x in exact]
        order = sorted(range(experts), key=lambda e: (out[e] - exact[e], e))  # largest remainder
        for e in order[:rows - sum(out)]:
            out[e] += 1
        return out

    def experts_hit(self, rows: int, experts: int) -> int:
        return sum(1 for n in self.rows_per_expert(rows, experts) if n)

    def expected_hit(self, tokens: float, experts: int, top_k: int) -> float:
        """Distinct experts `tokens` tokens touch in expectation, each routing to `top_k`
        distinct experts of `experts` independently, expert e taking its share s_e of the
        routed rows: a token picks it with probability k s_e, so Σ_e 1 - (1 - k s_e)^T
        (balanced, s_e = 1/E: E (1 - (1 - k/E)^T)). A share above 1/k is refused: k distinct
        picks a token give no expert more than one of its k rows."""
        if not experts or tokens <= 0:
            return 0.0
        shares = self.shares or (1.0 / experts,) * experts
        if len(shares) != experts:
            raise ValueError(f"expert_load has {len(shares)} weights, but this model routes "
                             f"over {experts} experts")
        if max(shares) * top_k > 1 + 1e-9:
            e = shares.index(max(shares))
            raise ValueError(f"expert_load: expert {e}'s share {max(shares):.3g} of the routed "
                             f"rows exceeds 1/k = {1 / top_k:.3g} (each token picks {top_k} "
                             "distinct experts)")
        return sum(1.0 - (1.0 - min(1.0, top_k * s)) ** tokens for s in shares)

    def __str__(self) -> str:
        return "balanced" if self.shares is None else ",".join(f"{s:.4g}" for s in self.shares)

    def __eq__(self, other) -> bool:
        return isinstance(other, ExpertLoad) and self.shares == other.shares

    def __repr__(self) -> str:
        return f"ExpertLoad({'' if self.shares is None else list(self.shares)})"


def _grouped_mm_data(ctx, args, kwargs) -> tuple:
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    if offs is None or a.dim() != 2 or b.dim() != 3:
        return ()
    experts, rows = b.shape[0], a.shape[0]
    if isinstance(offs, FakeTensor):
        return ("groups_hit", ctx.expert_load.experts_hit(rows, experts)), ("rows", rows)
    ends = offs.tolist()
    hit = sum(1 for lo, hi in zip([0] + ends, ends) if hi > lo)
    return ("groups_hit", hit), ("rows", min(rows, ends[-1]) if ends else rows)


def _grouped_mm_any_dtype(a, b, offs=None, bias=None, out_dtype=None):
    """_grouped_mm; on fake tensors, MoE's [M, K] x [E, K, N] -> [M, N] in any dtype and
    layout, other forms through the meta kernel in bfloat16."""
    if isinstance(a, FakeTensor):
        if a.dim() == 2 and b.dim() == 3:
            if a.shape[1] != b.shape[1]:
                raise RuntimeError(f"_grouped_mm: [M, K] x [E, K, N] with K {a.shape[1]} and "
                                   f"{b.shape[1]}")
            return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype or a.dtype)
        if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
            bf16 = torch.bfloat16
            out = aten._grouped_mm.default(a.to(bf16), b.to(bf16), offs,
                                           None if bias is None else bias.to(bf16))
            return out.to(out_dtype or a.dtype)
    return aten._grouped_mm.default(a, b, offs, bias, out_dtype)


# --- attention masks ------------------------------------------------------------------


def mask_pairs(mask: torch.Tensor) -> int:
    """Entries of a real mask that keep their score: True (bool), or above the dtype's
    lowest value (an additive mask: -inf, or transformers' finfo.min, masks)."""
    keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    return int(keep.sum())


def _attention_data(mask_arg: str | int):
    def data(ctx, args, kwargs) -> tuple:
        mask = kwargs.get(mask_arg) if isinstance(mask_arg, str) else (
            args[mask_arg] if len(args) > mask_arg else kwargs.get("attn_bias"))
        if mask is None:
            return ()  # dense, or is_causal: the formula's own business
        q, k = args[0], args[1]
        b, hq, sq, _ = q.shape
        sk = k.shape[-2]
        if isinstance(mask, FakeTensor):
            structure = ctx.attention_structure()
            if structure is None or not structure[0]:
                return ()  # no causal module around it: dense
            # a mask row broadcast over several queries is one position (transformers folds
            # the query heads of a group into the query dim when decoding)
            positions = mask.shape[-2] if mask.dim() >= 2 and sq % mask.shape[-2] == 0 else sq
            pairs = window_pairs(positions, ctx.kv_positions(k), structure[1]) * (sq // positions)
            return (("kept_pairs", b * hq * pairs),)
        kept = ctx.mask_pairs(mask)
        return (("kept_pairs", kept * (b * hq * sq * sk) // max(mask.numel(), 1)),)

    return data


DATA_OPS = {
    aten._grouped_mm: _grouped_mm_data,
    aten._scaled_dot_product_flash_attention_for_cpu: _attention_data("attn_mask"),
    aten._scaled_dot_product_efficient_attention: _attention_data(3),
    aten._scaled_dot_product_cudnn_attention: _attention_data(3),
    torch.ops.perfcounter.quantized_kv_sdpa: _attention_data(5),  # quant/ops.py (costs imports it)
}
CALLS = {aten._grouped_mm: _grouped_mm_any_dtype}


def attention_structure(mod) -> tuple[bool, int | None] | None:
    """An attention module's mask structure: transformers' attention modules and ours say
    `is_causal`; the window is their `sliding_window`, else the config's for a layer that
    slides (config.layer_types, where the model has them)."""
    causal = getattr(mod, "is_causal", None)
    if not isinstance(causal, bool):
        return None
    if hasattr(mod, "sliding_window"):
        window = mod.sliding_window
    else:
        config = getattr(mod, "config", None)
        window = getattr(config, "sliding_window", None)
        types, layer = getattr(config, "layer_types", None), getattr(mod, "layer_idx", None)
        if window and types and isinstance(layer, int) and layer < len(types) \
                and types[layer] != "sliding_attention":
            window = None
    return causal, window if isinstance(window, int) and window > 0 else None
