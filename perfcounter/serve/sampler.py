"""What an engine's sampler moves on the GPU each step, by the requests' sampling parameters.

After the model's forward, an engine turns each sampled sequence's logits (one row of the
vocabulary, V entries) into a token. vLLM v1 (v0.11.1, vllm/v1/sample/sampler.py) runs that
as eager PyTorch ops outside the CUDA graph, each over [sequences, V]; every one of them is a
kernel that reads and writes whole rows. This module lists those kernels as plain data,
(aten op, bytes a vocabulary entry, kernels), each with the source line it stands for, and
prices them with the one pricing rule (pricing.price, "eager": each kernel at its op class's
achievable rate plus a kernel's fixed device time; the op class is the registry's,
pricing.op_classes). Their launches overlap the forward's graph on the GPU and are not
charged.

Which kernels run depends on what the requests ask (vLLM's SamplingParams names, `sampling=`
of deployment(), e.g. "temperature=0.8,top_p=0.95,repetition_penalty=1.1"; "greedy" is
temperature=0):

- every request: Sampler.forward's `logits.to(torch.float32)` (bf16 read 2 B, fp32 written 4);
- repetition / frequency / presence penalties (any of them set; penalties.py,
  model_executor/layers/utils.py apply_penalties): for the prompt and the output tokens,
  get_token_bin_counts_and_mask's int64 `zeros((B, V + 1))` (8 B written), its scatter_add_
  of the tokens (a row's tokens, not its vocabulary: 0 B a vocabulary entry) and
  `bin_counts > 0` (8 read, 1 written); apply_repetition_penalties_ (the CUDA op: logits and
  both masks read, 4 + 1 + 1, logits written 4); `logits -= frequency * output_bin_counts`
  (the product: int64 read 8, fp32 written 4; the in-place subtraction: 4 + 4 read, 4
  written) and `logits -= presence * output_mask` (1 read, 4 written; 4 + 4 read, 4 written):
  85 B in 11 kernels;
- temperature 0 (all greedy): greedy_sample's argmax (4 read);
- else apply_temperature's `logits.div_` (4 read, 4 written), then (topk_topp_sampler.py,
  forward_native: vLLM v0.11.1 runs FlashInfer's sampler only when VLLM_USE_FLASHINFER_SAMPLER=1
  is set, vLLM pull request 26859, "Disable FlashInfer sampler by default")
  - top_p below 1 (apply_top_k_top_p): `logits.sort(dim=-1)` (SORT_BYTES), with top_k also
    `logits_sort < top_k_mask` (4 read, 1 written) and masked_fill_ (1 + 4 read, 4 written);
    `logits_sort.softmax` (SOFTMAX_BYTES), `torch.cumsum(..., out=)` (4 read, 4 written),
    `probs_sum <= 1 - p` (4 read, 1 written), masked_fill_ (1 + 4 read, 4 written) and the
    out-of-place `logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)` (a copy, 4
    read and 4 written, then int64 indices 8 and values 4 read, 4 written: 24 B, 2 kernels);
  - top_k alone (apply_top_k_only): `logits.topk(max_top_k)` (4 read), `logits < top_k_mask`
    (4 read, 1 written), masked_fill_ (1 + 4 read, 4 written);
  - then `logits.softmax(dim=-1, dtype=torch.float32)` (SOFTMAX_BYTES) and random_sample:
    `q.exponential_()` (4 written), `probs.div_(q)` (8 read, 4 written), argmax (4 read).

SOFTMAX_BYTES: a row of V fp32 values (513 KB at V = 128,256) is larger than a block's shared
memory, so PyTorch's softmax reads it three times (its max, its sum of exponentials, then
each value to write it) and writes it once: 16 B. SORT_BYTES: PyTorch's CUDA sort of B rows of
V (aten/src/ATen/native/cuda/SortStable.cu at pytorch/pytorch@061531e, the path that sorts
all rows at once, segmented_sort_pairs_by_full_sort): fill_index_and_segment_kernel writes an
int2 an element (8 B); cub's radix_sort_pairs of the fp32 keys with the int2 values, 32 key
bits in 4 passes of 8-bit digits each reading and writing a key and a value (4 x 24) after a
histogram pass over the keys (4): 100 B; radix_sort_keys of the int64 (segment, index) pairs
on the segment's bits (up to 16: 2 passes of 16 B, a histogram of 8): 40 B;
sort_postprocess_kernel (the int2 read 8, a value gathered 4, value and int64 index written 4
+ 8): 24 B. 172 B an element in 10 kernels. That commit sorts 128 rows or more with cub's
segmented sort instead, whose passes over the same keys and values are priced alike.

Other engines fuse their sampling (SGLang: FlashInfer's sampling kernels; TensorRT-LLM: its
own top-k/top-p kernels) and publish no count of their bytes: `ENGINE_SAMPLERS` has no entry
for them and their sampler is not priced (0 s, said so in the profile's sources).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from perfcounter.pricing.figures import Figures, record_kind
from perfcounter.pricing.price import price
from perfcounter.serve.errors import ServeError

SOFTMAX_BYTES = 16  # a vocabulary entry (module doc)
SORT_BYTES = 172  # a vocabulary entry (module doc)
GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily


class Kernel(NamedTuple):
    """One sampler kernel over [sequences, V]: its aten op (its op class prices it), the bytes
    it reads and writes a vocabulary entry a sequence, and how many kernels it launches."""

    op: str
    bytes_per_entry: float
    kernels: int = 1


# vLLM v0.11.1's kernels by stage (module doc; each line the op it stands for)
TO_FLOAT = (Kernel("aten._to_copy.default", 6),)  # logits.to(torch.float32)
PENALTIES = (
    *(Kernel("aten.zeros.default", 8), Kernel("aten.scatter_add_.default", 0),
      Kernel("aten.gt.Scalar", 9)) * 2,  # prompt and output: bin counts and masks
    Kernel("aten.mul_.Tensor", 10),  # apply_repetition_penalties_ (logits, 2 masks; logits)
    Kernel("aten.mul.Tensor", 12), Kernel("aten.sub_.Tensor", 12),  # frequency penalty
    Kernel("aten.mul.Tensor", 5), Kernel("aten.sub_.Tensor", 12))  # presence penalty
GREEDY = (Kernel("aten.argmax.default", 4),)
TEMPERATURE = (Kernel("aten.div_.Tensor", 8),)
TOP_K_IN_SORT = (Kernel("aten.lt.Tensor", 5), Kernel("aten.masked_fill_.Scalar", 9))
TOP_P = (Kernel("aten.sort.stable", SORT_BYTES, 10), Kernel("aten._softmax.default", SOFTMAX_BYTES),
         Kernel("aten.cumsum.default", 8), Kernel("aten.le.Tensor", 5),
         Kernel("aten.masked_fill_.Scalar", 9), Kernel("aten.scatter.src", 24, 2))
TOP_K_ONLY = (Kernel("aten.topk.default", 4), Kernel("aten.lt.Tensor", 5),
              Kernel("aten.masked_fill_.Scalar", 9))
RANDOM = (Kernel("aten._softmax.default", SOFTMAX_BYTES), Kernel("aten.exponential_.default", 4),
          Kernel("aten.div_.Tensor", 12), Kernel("aten.argmax.default", 4))

# vLLM's SamplingParams names this module prices: (least, most, default)
PARAMS = {"temperature": (0.0, 100.0, 1.0), "top_p": (1e-9, 1.0, 1.0),
          "top_k": (-1, 1 << 30, -1), "repetition_penalty": (1e-9, 100.0, 1.0),
          "frequency_penalty": (-2.0, 2.0, 0.0), "presence_penalty": (-2.0, 2.0, 0.0)}


def parse_sampling(text) -> dict | None:
    """'temperature=0.8,top_p=0.95,repetition_penalty=1.1' (vLLM's SamplingParams names),
    'greedy' (temperature=0), a dict of them, or None (nothing priced) -> {name: value},
    each default filled; a one-line ServeError naming the value and what is valid."""
    if text is None:
        return None
    if isinstance(text, str) and text.strip().lower() == "greedy":
        given = {"temperature": 0.0}
    elif isinstance(text, dict):
        given = dict(text)
    else:
        given = {}
        for part in str(text).split(","):
            name, eq, value = part.partition("=")
            try:
                given[name.strip()] = float(value) if eq else None
            except ValueError:
                given[name.strip()] = value
    out = {name: default for name, (_, _, default) in PARAMS.items()}
    for name, value in given.items():
        if name not in PARAMS:
            raise ServeError(f"sampling {name!r} in {text!r}: expected 'greedy' or NAME=VALUE of "
                             f"{', '.join(PARAMS)}")
        lo, hi, _ = PARAMS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not lo <= value <= hi:
            raise ServeError(f"sampling {name}={value!r}: expected a number in [{lo:g}, {hi:g}]")
        out[name] = float(value)
    return out


def kernels(params: dict | None) -> tuple[Kernel, ...]:
    """vLLM v0.11.1's sampler kernels for requests of `params` (parse_sampling's; module doc)."""
    if params is None:
        return ()
    out = list(TO_FLOAT)
    if params["repetition_penalty"] != 1.0 or params["frequency_penalty"] \
            or params["presence_penalty"]:
        out += PENALTIES
    if params["temperature"] < GREEDY_EPS:
        return tuple(out + list(GREEDY))
    out += TEMPERATURE
    top_k = params["top_k"] > 0
    if params["top_p"] < 1.0:
        out += TOP_P[:1] + (TOP_K_IN_SORT if top_k else ()) + TOP_P[1:]
    elif top_k:
        out += TOP_K_ONLY
    return tuple(out + list(RANDOM))


def sampler_figures(kernel_list, vocab: int, seqs: int) -> Figures:
    """The pricing Figures of `kernel_list` over `seqs` rows of `vocab` entries (float32)."""
    n = len(kernel_list)
    zeros = np.zeros(n)
    nbytes = np.array([k.bytes_per_entry for k in kernel_list], dtype=float) * vocab * seqs
    return Figures(kind=tuple(record_kind(k.op, ()) for k in kernel_list),
                   dtype=("float32",) * n, weight=(None,) * n, dense=np.zeros(n, dtype=bool),
                   calls=np.array([k.kernels for k in kernel_list], dtype=float), flops=zeros,
                   executed_flops=zeros, bytes=nbytes, streamed=zeros, rows=zeros,
                   collective=(None,) * n, link_bytes=zeros, compulsory_bytes=float(nbytes.sum()))


class SamplerCost:
    """Seconds of the sampler's kernels on `spec` for a step of `seqs` sampled sequences of
    `vocab` entries: price(sampler_figures, spec, "eager")'s kernel work (their launches
    overlap the forward's graph: not charged); `joules`, their memory traffic's. Cached per
    sequence count (cache_info())."""

    def __init__(self, spec, vocab: int, kernel_list):
        self.spec, self.vocab, self.kernels = spec, int(vocab), tuple(kernel_list)
        self._seconds: dict[int, float] = {}

    def __call__(self, seqs: int) -> float:
        seqs = int(seqs)
        if not self.kernels or seqs <= 0:
            return 0.0
        s = self._seconds.get(seqs)
        if s is None:
            fig = sampler_figures(self.kernels, self.vocab, seqs)
            s = self._seconds[seqs] = price(fig, self.spec, "eager", detail=False).work_s
        return s

    def bytes(self, seqs: int) -> float:
        """Bytes the kernels move for `seqs` sampled sequences."""
        return sum(k.bytes_per_entry for k in self.kernels) * self.vocab * seqs

    def joules(self, seqs: int) -> float:
        """Their dynamic joules: bytes x 8 x the memory's pJ/bit (pricing/energy.py's rule; 0
        where the spec gives none)."""
        pj = getattr(self.spec, "mem_pj_per_bit", None)
        return self.bytes(seqs) * 8 * pj * 1e-12 if pj else 0.0

    def __str__(self) -> str:
        """What it prices, for a result's JSON (api.ServeResult.to_dict)."""
        return (f"{sum(k.bytes_per_entry for k in self.kernels):g} B an entry x {self.vocab:,} "
                f"entries in {sum(k.kernels for k in self.kernels)} kernels on {self.spec.name}")

    def cache_info(self) -> int:
        return len(self._seconds)

    def cache_clear(self) -> None:
        self._seconds.clear()


__all__ = ["Kernel", "SamplerCost", "kernels", "parse_sampling", "sampler_figures"]
