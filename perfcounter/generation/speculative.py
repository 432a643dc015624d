"""Speculative decoding as gpt-fast runs it, its phases counted, its cost per accepted token.

    sampler = Sampler(temperature=0)                 # or generate.py's logits_to_probs / draw
    ids, acceptance = speculative_generate(target, draft, prompt, 64, speculate_k=5,
                                           phase=counter.count, sampler=sampler)
    costs = speculative_cost.speculative_costs(counter, speculate_k=5, acceptance=acceptance)

A round (gpt-fast's `speculative_decode`): the draft model runs k decode steps from the
last token (phase "draft", k blocks of one token), the target runs one forward over that
token and the k drafted ones (phase "verify", one block of k + 1 tokens) and accepts a
prefix: greedy, while the draft's token is the target's argmax; sampled, draft token i
with probability min(1, q_i / p_i) (q the target's, p the draft's probability of it). The
round emits the accepted tokens and one target token: at the first rejection a draw from
max(q - p, 0) renormalized (greedy: the target's argmax), after k acceptances a draw from
the target's last position. When all k were accepted the draft runs one more forward
(gpt-fast's "fill last token into draft model"; a "draft" block of 0 tokens) so that both
caches hold every emitted token. The prompt goes through both models first ("draft_prefill",
"prefill"). The accept rule itself (k compares, one draw) runs outside the blocks: it is
control, O(k + vocab) elementwise, and under fake tensors it has no values to decide on.

What a round costs per accepted token: speculative_cost.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from perfcounter.counter import TransformerPerformanceCounter
from perfcounter.models.loading import HFCausalLM, fake_model

PHASES = ("draft_prefill", "prefill", "draft", "verify")


class SpeculativeArgumentError(ValueError):
    """A speculative-decoding setting that cannot work; the message names the flag."""


def check_speculate_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SpeculativeArgumentError(f"--speculate_k must be an int >= 1 (draft tokens per "
                                       f"round), got {k!r}")
    return k


def check_acceptance_rate(a) -> float:
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
        raise SpeculativeArgumentError(f"--acceptance_rate must be in (0, 1] (the chance that "
                                       f"the target accepts one draft token), got {a!r}")
    return float(a)


def check_run(*, config_only: bool, draft_checkpoint_path, draft_model, acceptance_rate,
              batch_size: int, hf: bool, compile: bool) -> bool:
    """generate.py's flags: whether the run is speculative; SpeculativeArgumentError when the
    flags cannot work together."""
    if draft_checkpoint_path is None and draft_model is None:
        if acceptance_rate is not None:
            raise SpeculativeArgumentError("--acceptance_rate needs a draft model: add "
                                           "--draft_model NAME or --draft_checkpoint_path PATH")
        return False
    if config_only and draft_checkpoint_path is not None:
        problem = "a config-only target takes a config-only draft: --draft_model NAME"
    elif hf:  # transformers' StaticCache appends: it cannot roll back a rejected draft token
        problem = ("speculative decoding runs perfcounter's model (it loads HF folders too); "
                   "drop --hf")
    elif config_only and acceptance_rate is None:
        problem = ("config only, no tokens to measure acceptance on: give --acceptance_rate "
                   "in (0, 1]")
    elif not config_only and draft_checkpoint_path is None:
        problem = (f"--draft_model {draft_model} alone is config only; a real run needs "
                   "--draft_checkpoint_path PATH")
    elif batch_size != 1:
        problem = (f"speculative decoding runs one sequence (gpt-fast's batch 1), got "
                   f"--batch_size {batch_size}")
    elif compile and not config_only:
        problem = "speculative runs are timed eagerly here; drop --compile"
    else:
        return True
    raise SpeculativeArgumentError(problem)


def check_pair(target, draft, prompt_tokens: int, max_new_tokens: int, k: int) -> None:
    """One vocabulary, and room in both caches (configs: ours or transformers')."""
    if target.vocab_size != draft.vocab_size:
        raise SpeculativeArgumentError(
            f"the draft's vocab_size {draft.vocab_size} differs from the target's "
            f"{target.vocab_size}; speculative decoding needs one vocabulary")
    need = cache_length(prompt_tokens, max_new_tokens, k)
    for which, config in (("target", target), ("draft", draft)):
        block = getattr(config, "block_size", None) or getattr(config, "max_position_embeddings",
                                                                None)
        if block is not None and need > block:
            raise SpeculativeArgumentError(
                f"the {which}'s block_size={block} is too short for speculative decoding: "
                f"{prompt_tokens} prompt + {max_new_tokens} new + --speculate_k {k} + 1 = {need} "
                "positions; shorten the prompt or lower --max_new_tokens or --speculate_k")


def cache_length(prompt_tokens: int, max_new_tokens: int, k: int) -> int:
    """Positions each cache needs: the last round may verify k + 1 tokens past the end."""
    return prompt_tokens + max_new_tokens + k + 1


@dataclasses.dataclass(frozen=True, slots=True)
class Sampler:
    """How tokens are chosen: greedy (temperature 0), or drawn by `draw` from
    `to_probs(logits, temperature, top_k)` (generate.py's logits_to_probs and
    multinomial_sample_one_no_sync)."""

    temperature: float = 0.0
    top_k: int | None = None
    to_probs: Callable | None = None
    draw: Callable | None = None

    def __post_init__(self):
        if self.temperature != 0 and (self.to_probs is None or self.draw is None):
            raise ValueError("a Sampler with temperature > 0 needs to_probs and draw")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def last(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """logits [B, S, V] -> (token [B, 1] int, probabilities [B, V] or None when greedy),
        the same ops as generate.py's sample()."""
        if self.greedy:
            return torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(dtype=torch.int), None
        probs = self.to_probs(logits[:, -1], self.temperature, self.top_k)
        return self.draw(probs), probs

    def every(self, logits: Tensor) -> Tensor:
        """logits [S, V] -> the target's choice at each position: tokens [S] (greedy) or
        probabilities [S, V]."""
        if self.greedy:
            return torch.argmax(logits, dim=-1)
        return self.to_probs(logits, self.temperature, self.top_k)


def _uncounted(label: str, num_tokens: int):
    return contextlib.nullcontext()


# -- phases --------------------------------------------------------------------------------
def prefill_both(target, draft, prompt: Tensor, *, phase=_uncounted,
                 sampler: Sampler = Sampler()) -> Tensor:
    """prompt [1, S] through the draft ("draft_prefill") and the target ("prefill");
    the target's first token [1, 1]."""
    input_pos = torch.arange(0, prompt.shape[1], device=prompt.device)
    with phase("draft_prefill", num_tokens=prompt.shape[1]):
        sampler.last(draft(prompt, input_pos))  # gpt-fast samples it too, and drops it
    with phase("prefill", num_tokens=prompt.shape[1]):
        token, _ = sampler.last(target(prompt, input_pos))
    return token


def draft_steps(draft, token: Tensor, pos: int, k: int, *, phase=_uncounted,
                sampler: Sampler = Sampler()) -> tuple[Tensor, Tensor | None]:
    """k decode steps of the draft from `token` [1, 1] at position `pos`, each a "draft"
    block: (tokens [k], probabilities [k, V] or None when greedy)."""
    tokens, probs = [], []
    for i in range(k):
        with phase("draft", num_tokens=1):
            token, p = sampler.last(draft(token, torch.tensor([pos + i], device=token.device)))
        tokens.append(token.view(1))
        probs.append(p)
    return torch.cat(tokens), None if sampler.greedy else torch.cat(probs)


def verify(target, token: Tensor, drafted: Tensor, pos: int, *, phase=_uncounted,
           sampler: Sampler = Sampler()) -> Tensor:
    """One target forward over `token` and the k `drafted` ones (positions pos .. pos + k),
    a "verify" block of k + 1 tokens: the target's tokens [k + 1] (greedy) or
    probabilities [k + 1, V]."""
    ids = torch.cat([token.view(1), drafted.to(token.dtype)]).view(1, -1)  # [1, k + 1]
    input_pos = torch.arange(pos, pos + ids.shape[1], device=ids.device)
    with phase("verify", num_tokens=ids.shape[1]):
        return sampler.every(target(ids, input_pos)[0])


def accept(drafted: Tensor, draft_probs: Tensor | None, target: Tensor,
           sampler: Sampler = Sampler()) -> Tensor:
    """The tokens a round emits [n + 1]: the n accepted draft tokens and one of the target's
    (the rule in the module doc). drafted [k]; draft_probs [k, V] or None; target: verify()'s."""
    k = drafted.numel()
    if sampler.greedy:
        rejected = (drafted != target[:k].to(drafted.dtype)).nonzero()
        n = k if rejected.numel() == 0 else int(rejected[0])
        return torch.cat([drafted[:n], target[n:n + 1].to(drafted.dtype)])
    rows = torch.arange(k, device=drafted.device)
    p, q = draft_probs[rows, drafted.long()], target[rows, drafted.long()]
    keep = torch.clamp(q / p, max=1)  # the chance of accepting each draft token
    rejected = (torch.rand_like(keep) > keep).nonzero()
    if rejected.numel() == 0:
        last = sampler.draw(target[k])
    else:
        n = int(rejected[0])
        residual = torch.clamp(target[n] - draft_probs[n], min=0)
        last = sampler.draw(residual / residual.sum())
        drafted = drafted[:n]
    return torch.cat([drafted, last.view(1).to(drafted.dtype)])


def speculative_decode(target, draft, token: Tensor, pos: int, k: int, *, phase=_uncounted,
                       sampler: Sampler = Sampler()) -> Tensor:
    """One round from `token` [1, 1] at position `pos`: the tokens it emits [n + 1]."""
    drafted, draft_probs = draft_steps(draft, token, pos, k, phase=phase, sampler=sampler)
    new = accept(drafted, draft_probs, verify(target, token, drafted, pos, phase=phase,
                                              sampler=sampler), sampler)
    if new.numel() == k + 1:  # all accepted: the draft has not seen its own last token yet
        with phase("draft", num_tokens=0):
            draft(drafted[-1:].view(1, 1), torch.tensor([pos + k], device=token.device))
    return new


class Acceptance(NamedTuple):
    """gpt-fast's accept_counts: counts[i] = rounds in which the target accepted i of the
    k draft tokens (k = len(counts) - 1)."""

    counts: tuple[int, ...]

    @property
    def rounds(self) -> int:
        return sum(self.counts)

    @property
    def accepted(self) -> int:
        return sum(i * c for i, c in enumerate(self.counts))

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens a round emits: the accepted ones + the target's (gpt-fast's Mean
        Accepted + 1)."""
        return self.accepted / self.rounds + 1

    @property
    def rate(self) -> float:
        """Per draft token: accepted / (accepted + rejections)."""
        return self.accepted / (self.accepted + self.rounds - self.counts[-1])


@torch.no_grad()
def speculative_generate(target, draft, prompt: Tensor, max_new_tokens: int, *, speculate_k: int,
                         phase=_uncounted, sampler: Sampler = Sampler()):
    """prompt [1, S] -> ([1, S + max_new_tokens], Acceptance): the target's prefill makes the
    first new token, rounds the others (the last round's surplus dropped, as gpt-fast does)."""
    check_speculate_k(speculate_k)
    check_pair(target.config, draft.config, prompt.shape[1], max_new_tokens, speculate_k)
    if isinstance(target, HFCausalLM) or isinstance(draft, HFCausalLM):
        raise SpeculativeArgumentError("transformers' StaticCache appends and cannot take back a "
                                       "rejected draft token; load the models as perfcounter's")
    if prompt.shape[0] != 1:
        raise SpeculativeArgumentError(f"speculative decoding runs one sequence (gpt-fast's "
                                       f"batch 1), got --batch_size {prompt.shape[0]}")
    size = cache_length(prompt.shape[1], max_new_tokens, speculate_k)
    for model in (target, draft):
        model.setup_caches(max_batch_size=1, max_seq_length=size)
    token = prefill_both(target, draft, prompt, phase=phase, sampler=sampler)
    out, counts, pos = [token.view(1)], [0] * (speculate_k + 1), prompt.shape[1]
    while pos < prompt.shape[1] + max_new_tokens - 1:
        new = speculative_decode(target, draft, token, pos, speculate_k, phase=phase,
                                 sampler=sampler)
        counts[new.numel() - 1] += 1
        new = new[:prompt.shape[1] + max_new_tokens - 1 - pos]
        out.append(new)
        pos += new.numel()
        token = new[-1:].view(1, 1)
    return torch.cat([prompt[0], *(t.to(prompt.dtype) for t in out)]).view(1, -1), \
        Acceptance(tuple(counts))


@torch.no_grad()
def count_speculative_config(target_args, draft_args, counter, *, prompt_length: int,
                             max_new_tokens: int, speculate_k: int, dtype=torch.bfloat16,
                             device: str = "cpu", sampler: Sampler = Sampler(), prepare=None):
    """Count, without weights (FakeTensorMode, a synthetic prompt of zeros), both prefills
    and one round (k "draft" steps, one "verify"; no fill step: expected_cost adds a^k of a
    step) with `counter`. prepare(target), when given, runs on the fake target first (e.g.
    quantizes it). Returns the fake target and its plain decode step (a PerformanceStats
    "decode", counted apart) to compare with."""
    check_pair(target_args, draft_args, prompt_length, max_new_tokens, speculate_k)
    if "cuda" in device and not torch.cuda.is_available():
        device = "cpu"  # as count_config_only: fake CUDA modules need CUDA; counts agree
    target, fake_mode = fake_model(target_args, dtype=dtype, device=device)
    draft, _ = fake_model(draft_args, dtype=dtype, device=device, fake_mode=fake_mode)
    alone = TransformerPerformanceCounter(device_spec=counter.device_spec,
                                          io_model=counter.io_model)
    with fake_mode:
        if prepare is not None:
            prepare(target)
        prompt = torch.zeros(1, prompt_length, dtype=torch.int64, device=device)
        for model in (target, draft):
            model.setup_caches(1, cache_length(prompt_length, max_new_tokens, speculate_k))
        token = prefill_both(target, draft, prompt, phase=counter.count, sampler=sampler)
        drafted, _ = draft_steps(draft, token, prompt_length, speculate_k, phase=counter.count,
                                 sampler=sampler)
        verify(target, token, drafted, prompt_length, phase=counter.count, sampler=sampler)
        with alone.count("decode", num_tokens=1):
            sampler.last(target(token, torch.tensor([prompt_length], device=device)))
    return target, alone.counts["decode"]


def target_decode_step(target, position: int, counter, sampler: Sampler = Sampler()):
    """One plain decode step of the target (caches set up) at `position`, counted apart on
    `counter`'s device: the PerformanceStats to compare speculation with."""
    alone = TransformerPerformanceCounter(device_spec=counter.device_spec,
                                          io_model=counter.io_model)
    device = next(target.parameters()).device
    with torch.no_grad(), alone.count("decode", num_tokens=1):
        sampler.last(target(torch.zeros(1, 1, dtype=torch.int, device=device),
                            torch.tensor([position], device=device)))
    return alone.counts["decode"]
