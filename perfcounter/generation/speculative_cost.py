"""Speculative decoding priced per accepted token, from the phases speculative.py counts.

    costs = speculative_costs(counter, speculate_k=5, acceptance=acceptance,   # a real run
                              acceptance_rate=0.8, baseline=target_decode_step(...))
    print(format_speculative(costs, acceptance, device="h100-sxm"))

Cost per accepted token (here "accepted" is every token a round emits, the target's own
included): a round's draft and verify figures (FLOPs, bytes, roofline latency, energy)
divided by the tokens a round emits, and the expected tokens/s from the roofline = tokens
per round / roofline seconds per round. Tokens per round:
  measured (a real run): the mean emitted per round, from gpt-fast's accept_counts
      (counts[i] = rounds that accepted i draft tokens); its per-token acceptance rate is
      stated as a = accepted / (accepted + rejections), each round ending in one rejection
      unless all k were accepted;
  expected (--acceptance_rate a; config only, or beside the measurement): each draft token
      accepted independently with probability a (Leviathan et al. 2023, eq. 1), so a round
      emits sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a) tokens (k + 1 when a = 1), and the
      draft runs k + a^k forwards (the fill step when all k are accepted).
Prefills are their own phases and are left out of the per-token figures.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from perfcounter.format import format_table, si
from perfcounter.generation.speculative import Acceptance, check_acceptance_rate, check_speculate_k


class Cost(NamedTuple):
    """FLOPs, bytes (the counter's io model), roofline seconds and joules (None: not priced)."""

    flops: float
    bytes: float
    roofline_s: float | None
    energy_j: float | None

    @classmethod
    def of(cls, stats) -> "Cost":
        return cls(stats.total_flops, stats.total_io, stats.roofline_latency, stats.energy_j)

    def times(self, f: float) -> "Cost":
        return Cost(*(None if v is None else v * f for v in self))

    def plus(self, other: "Cost") -> "Cost":
        return Cost(*(None if a is None or b is None else a + b for a, b in zip(self, other)))


def expected_tokens_per_round(acceptance_rate: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a) = sum_{i=0..k} a^i: tokens a round emits when each draft
    token is accepted with probability a (Leviathan et al. 2023, eq. 1); k + 1 at a = 1."""
    a = check_acceptance_rate(acceptance_rate)
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


@dataclasses.dataclass(frozen=True, slots=True)
class SpeculativeCost:
    """One acceptance assumption priced: per round (draft and verify) and per token."""

    source: str  # "measured (N rounds)" or "--acceptance_rate a"
    speculate_k: int
    acceptance_rate: float  # per draft token
    tokens_per_round: float
    draft_steps_per_round: float
    draft: Cost  # per round
    verify: Cost  # per round
    baseline: Cost | None = None  # one plain decode step of the target

    @property
    def round(self) -> Cost:
        return self.draft.plus(self.verify)

    @property
    def per_token(self) -> Cost:
        return self.round.times(1 / self.tokens_per_round)

    @property
    def tokens_per_s(self) -> float | None:
        s = self.round.roofline_s
        return None if not s else self.tokens_per_round / s

    @property
    def speedup(self) -> float | None:
        """Roofline tokens/s over the target decoding alone (one token a step)."""
        if self.tokens_per_s is None or self.baseline is None or not self.baseline.roofline_s:
            return None
        return self.tokens_per_s * self.baseline.roofline_s

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("draft", "verify", "baseline"):
            d[key] = None if d[key] is None else d[key]._asdict()
        return {**d, "per_token": self.per_token._asdict(), "tokens_per_s": self.tokens_per_s,
                "speedup": self.speedup}


def expected_cost(draft_step: Cost, verify: Cost, *, speculate_k: int, acceptance_rate: float,
                  baseline: Cost | None = None) -> SpeculativeCost:
    """A round at a per-token acceptance rate a: k + a^k draft steps, one verify, emitting
    (1 - a^(k+1)) / (1 - a) tokens."""
    a, k = check_acceptance_rate(acceptance_rate), check_speculate_k(speculate_k)
    steps = k + a ** k
    return SpeculativeCost(f"--acceptance_rate {a:g}", k, a, expected_tokens_per_round(a, k),
                           steps, draft_step.times(steps), verify, baseline)


def measured_cost(draft_total: Cost, verify_total: Cost, acceptance: Acceptance, *,
                  draft_steps: int, baseline: Cost | None = None) -> SpeculativeCost:
    """The rounds of a real run: its totals over its rounds, its mean tokens per round."""
    r = acceptance.rounds
    return SpeculativeCost(f"measured ({r} rounds)", len(acceptance.counts) - 1, acceptance.rate,
                           acceptance.tokens_per_round, draft_steps / r,
                           draft_total.times(1 / r), verify_total.times(1 / r), baseline)


def speculative_costs(counter, *, speculate_k: int, acceptance: Acceptance | None = None,
                      acceptance_rate: float | None = None, baseline=None) -> list[SpeculativeCost]:
    """The counter's "draft" and "verify" phases priced as measured (`acceptance`, a run
    with rounds) and/or at `acceptance_rate`; baseline: the target's plain decode step."""
    counts = counter.counts
    if "draft" not in counts or "verify" not in counts:
        return []
    draft, check = counts["draft"], counts["verify"]
    base = None if baseline is None else Cost.of(baseline).times(1 / baseline.steps)
    costs = []
    if acceptance is not None and acceptance.rounds:
        costs.append(measured_cost(Cost.of(draft), Cost.of(check), acceptance,
                                   draft_steps=draft.steps, baseline=base))
    if acceptance_rate is not None:
        costs.append(expected_cost(Cost.of(draft).times(1 / draft.steps),
                                   Cost.of(check).times(1 / check.steps), speculate_k=speculate_k,
                                   acceptance_rate=acceptance_rate, baseline=base))
    return costs


def format_speculative(costs: list[SpeculativeCost], acceptance: Acceptance | None = None,
                       device: str = "") -> str:
    """The cost per accepted token of each assumption, and the target alone, as a table."""
    if not costs:
        return "Speculative decoding: no rounds (the prefill made the only new token)"
    k = costs[0].speculate_k
    lines = [f"Speculative decoding on {device}: the draft proposes k = {k} tokens, the target "
             f"verifies {k + 1} per round",
             "  tokens per round: measured, the mean a round emitted; expected, "
             "(1 - a^(k+1)) / (1 - a) for a per-token acceptance rate a (Leviathan et al. 2023);",
             "  per token: per token a round emits (accepted draft tokens + the target's own); "
             "tokens/s: from the roofline; speedup: over the target decoding alone"]
    if acceptance is not None and acceptance.rounds:
        lines.append(f"  accept counts (rounds that accepted 0..{k} draft tokens): "
                     f"{list(acceptance.counts)}; mean accepted "
                     f"{acceptance.tokens_per_round - 1:.2f}; a = accepted / (accepted + "
                     f"rejections) = {acceptance.rate:.3f}")
        if acceptance.rate > 0:
            lines[-1] += (f" (the formula gives {expected_tokens_per_round(acceptance.rate, k):.2f}"
                          " tokens per round at that a)")
    head = ["acceptance", "a", "tokens/round", "draft steps", "FLOPs/token", "bytes/token",
            "roofline/token", "energy/token", "tokens/s", "speedup"]
    rows = [_row(c.source, f"{c.acceptance_rate:.3f}", f"{c.tokens_per_round:.2f}",
                 f"{c.draft_steps_per_round:.2f}", c.per_token, c.tokens_per_s, c.speedup)
            for c in costs]
    base = costs[0].baseline
    if base is not None:
        rows.append(_row("target decode alone", "", "1", "", base,
                         1 / base.roofline_s if base.roofline_s else None, 1.0))
    lines.append(format_table(rows, head, indent=2))
    return "\n".join(lines)


def _row(name: str, a: str, tokens: str, steps: str, cost: Cost, tokens_per_s, speedup) -> list:
    return [name, a, tokens, steps, si(cost.flops, "FLOP"), si(cost.bytes, "B"),
            si(cost.roofline_s, "s", 3), si(cost.energy_j, "J"),
            "n/a" if tokens_per_s is None else f"{tokens_per_s:,.1f}",
            "n/a" if speedup is None else f"{speedup:.2f}x"]
