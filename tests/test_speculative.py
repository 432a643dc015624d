"""Speculative decoding (gpt-fast's): the draft and verify phases counted as the forwards
they are, greedy speculation equal to greedy decoding, the cost per accepted token by hand,
config-only pricing at a stated acceptance rate, and bad input.

Tiny models (conftest): the target is tiny_args() — dim 32, 4 heads of 8, 2 kv heads,
ffn 48, 2 layers, vocab 64: matmul weights per token wqkv (4 + 2*2)*8*32 = 2048, wo 32*32 =
1024, ffn 3*32*48 = 4608 -> 7680 a layer, 2 layers 15360, output 64*32 = 2048 -> 17408.
The draft is DRAFT — dim 16, 2 heads of 8, 1 kv head, ffn 32, 1 layer, vocab 64: wqkv
(2 + 2*1)*8*16 = 512, wo 16*16 = 256, ffn 3*16*32 = 1536, output 64*16 = 1024 -> 3328.
"""
import copy
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import randomize_, tiny_args
from perfcounter import TransformerPerformanceCounter
from perfcounter.models.loading import save_checkpoint
from perfcounter.models.model import Transformer
from perfcounter.generation.speculative import (Acceptance, Sampler, SpeculativeArgumentError,
                                     count_speculative_config, draft_steps,
                                     speculative_generate, verify)
from perfcounter.generation.speculative_cost import (Cost, expected_cost, expected_tokens_per_round,
                                          format_speculative, measured_cost, speculative_costs)

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

DRAFT = dict(n_layer=1, dim=16, n_head=2, n_local_heads=1, intermediate_size=32)
TARGET_MM, DRAFT_MM = 17408, 3328  # matmul weights per token (module doc)


def mm_flops(stats) -> int:
    return sum(r.flops for r in stats.trace.records if r.op.startswith("aten.mm"))


def counter():
    return TransformerPerformanceCounter(device_spec="generic-cpu")


@pytest.fixture
def target():
    return randomize_(Transformer(tiny_args()))


@pytest.fixture
def draft():
    return randomize_(Transformer(tiny_args(**DRAFT)), seed=1)


# -- the phases are the forwards they stand for ------------------------------------------------

def test_verify_is_the_target_forward_over_k_plus_1_tokens(target):
    target.setup_caches(1, 16)
    c = counter()
    token, drafted = torch.tensor([[3]], dtype=torch.int), torch.tensor([7, 1, 9, 4])
    picks = verify(target, token, drafted, 5, phase=c.count)
    assert picks.shape == (5,)
    direct = counter()  # the same forward, counted as it is (inputs made outside, as verify's)
    ids, positions = torch.tensor([[3, 7, 1, 9, 4]], dtype=torch.int), torch.arange(5, 10)
    with direct.count("verify", num_tokens=5):
        torch.argmax(target(ids, positions)[0], dim=-1)
    got, want = c.counts["verify"], direct.counts["verify"]
    assert (got.total_flops, got.total_io, got.num_tokens) == (want.total_flops, want.total_io, 5)
    assert mm_flops(got) == 2 * 5 * TARGET_MM == 174_080  # k + 1 = 5 tokens through the target


def test_draft_phase_is_k_decode_steps(draft):
    k, pos = 4, 6
    draft.setup_caches(1, 16)
    c = counter()
    tokens, probs = draft_steps(draft, torch.tensor([[3]], dtype=torch.int), pos, k, phase=c.count)
    assert tokens.shape == (k,) and probs is None  # greedy: no probabilities to keep
    draft.setup_caches(1, 16)  # generate.py's own decode steps at the same positions
    steps = counter()
    gen.decode_n_tokens(draft, torch.tensor([[3]], dtype=torch.int), torch.tensor([pos]), k,
                        phase=steps.count, temperature=0)
    got, want = c.counts["draft"], steps.counts["decode"]
    assert (got.total_flops, got.total_io, got.steps, got.num_tokens) == \
        (want.total_flops, want.total_io, k, k)
    assert mm_flops(got) == k * 2 * DRAFT_MM == 26_624  # 4 steps * 2 * 3328


# -- decoding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_new_tokens", [11, 9])
def test_greedy_with_the_target_as_draft_accepts_all_and_equals_greedy(target, max_new_tokens):
    prompt, k = torch.tensor([[1, 5, 9, 2]]), 4
    c = counter()
    ids, acceptance = speculative_generate(target, copy.deepcopy(target), prompt, max_new_tokens,
                                           speculate_k=k, phase=c.count)
    assert torch.equal(ids, gen.generate(target, prompt, max_new_tokens, temperature=0))
    # the prefill makes 1 token, each round k + 1 = 5: 11 -> 1 + 5 + 5 (2 rounds), and 9 -> the
    # same 2 rounds, the last cut to 3 tokens; every round accepts all 4 draft tokens
    assert acceptance.counts == (0, 0, 0, 0, 2) and acceptance.rate == 1.0
    draft, check = c.counts["draft"], c.counts["verify"]
    # a round: 4 draft steps + 1 fill step (all accepted), 1 verify of 5 tokens
    assert (draft.steps, draft.num_tokens, check.steps, check.num_tokens) == (10, 8, 2, 10)
    # per round 5 draft forwards + 5 verified tokens, each 2 * 17408 matmul FLOPs
    assert mm_flops(draft) + mm_flops(check) == 2 * (5 + 5) * 2 * TARGET_MM
    measured = speculative_costs(c, speculate_k=k, acceptance=acceptance)[0]
    assert measured.tokens_per_round == 5 and measured.draft_steps_per_round == 5
    assert measured.per_token.flops == pytest.approx((draft.total_flops + check.total_flops) / 10)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_greedy_speculation_keeps_the_targets_tokens_with_another_draft(target, draft):
    prompt = torch.tensor([[1, 5, 9, 2]])
    ids, acceptance = speculative_generate(target, draft, prompt, 20, speculate_k=3)
    assert torch.equal(ids, gen.generate(target, prompt, 20, temperature=0))
    assert acceptance.rounds >= 19 / 4 and acceptance.counts[-1] < acceptance.rounds
    c = counter()  # one new token: the prefill makes it, no round runs
    ids, acceptance = speculative_generate(target, draft, prompt, 1, speculate_k=3, phase=c.count)
    assert ids.shape == (1, 5) and acceptance.rounds == 0 and "draft" not in c.counts
    assert speculative_costs(c, speculate_k=3, acceptance=acceptance) == []
    assert format_speculative([]).endswith("no rounds (the prefill made the only new token)")


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_sampled_speculation(target, draft):
    torch.manual_seed(0)
    sampler = Sampler(0.8, 10, gen.logits_to_probs, gen.multinomial_sample_one_no_sync)
    c = counter()
    ids, acceptance = speculative_generate(target, draft, torch.tensor([[1, 5, 9, 2]]), 16,
                                           speculate_k=3, phase=c.count, sampler=sampler)
    assert ids.shape == (1, 20) and 0 <= ids.min() and ids.max() < 64
    # each round 3 draft steps, plus a fill step in each round that accepted all 3
    assert c.counts["draft"].steps == 3 * acceptance.rounds + acceptance.counts[3]
    assert c.counts["verify"].steps == acceptance.rounds >= 15 / 4
    # its own draft: q = p for every drafted token, so min(1, q / p) = 1 and all are accepted
    _, acceptance = speculative_generate(target, copy.deepcopy(target), torch.tensor([[1, 5]]),
                                         9, speculate_k=3, sampler=sampler)
    assert acceptance.counts == (0, 0, 0, 2)  # 1 + 4 + 4 = 9 tokens


# -- cost per accepted token ----------------------------------------------------------------------

def test_expected_cost_by_hand():
    # k = 3, a = 0.5: tokens per round 1 + 0.5 + 0.25 + 0.125 = 1.875 = (1 - 0.5^4) / (1 - 0.5);
    # draft forwards 3 + 0.5^3 = 3.125 (the fill step when all 3 are accepted)
    assert expected_tokens_per_round(0.5, 3) == 1.875 and expected_tokens_per_round(1, 3) == 4
    c = expected_cost(Cost(10, 100, 1e-3, 0.01), Cost(100, 400, 4e-3, 0.05), speculate_k=3,
                      acceptance_rate=0.5, baseline=Cost(40, 300, 5e-3, 0.04))
    assert (c.tokens_per_round, c.draft_steps_per_round) == (1.875, 3.125)
    # a round: FLOPs 3.125 * 10 + 100 = 131.25, bytes 312.5 + 400 = 712.5,
    # roofline 3.125 ms + 4 ms = 7.125 ms, energy 0.03125 + 0.05 = 0.08125 J
    # per token (/ 1.875): 70 FLOPs, 380 B, 3.8 ms, 0.04333 J
    assert c.per_token.flops == pytest.approx(70) and c.per_token.bytes == pytest.approx(380)
    assert c.per_token.roofline_s == pytest.approx(3.8e-3)
    assert c.per_token.energy_j == pytest.approx(0.08125 / 1.875)
    # tokens/s = 1.875 / 7.125 ms = 263.16; the target alone 1 / 5 ms = 200 -> 1.3158x
    assert c.tokens_per_s == pytest.approx(263.1578947) and c.speedup == pytest.approx(1.3157895)


def test_measured_cost_by_hand():
    acceptance = Acceptance((1, 0, 2, 1))  # k = 3; 4 rounds accepting 0, 2, 2 and 3 tokens
    # accepted 2 + 2 + 3 = 7; tokens per round 7 / 4 + 1 = 2.75; rejections: the 3 rounds
    # that did not accept all 3 -> a = 7 / (7 + 3) = 0.7
    assert (acceptance.rounds, acceptance.accepted, acceptance.tokens_per_round) == (4, 7, 2.75)
    assert acceptance.rate == pytest.approx(0.7)
    # 4 rounds * 3 draft steps + 1 fill step = 13 draft forwards
    c = measured_cost(Cost(130, 1300, 13e-3, None), Cost(400, 1600, 16e-3, None), acceptance,
                      draft_steps=13)
    # per round: FLOPs 32.5 + 100 = 132.5 -> 132.5 / 2.75 = 48.18 a token; roofline
    # 3.25 ms + 4 ms = 7.25 ms -> 2.75 / 7.25 ms = 379.3 tokens/s; no energy figure: None
    assert c.draft_steps_per_round == 3.25 and c.per_token.flops == pytest.approx(132.5 / 2.75)
    assert c.tokens_per_s == pytest.approx(2.75 / 7.25e-3) and c.per_token.energy_j is None
    assert c.speedup is None and c.source == "measured (4 rounds)"


# -- config only, and generate.py ------------------------------------------------------------------

def test_config_only_with_an_acceptance_rate():
    c = counter()
    model, alone = count_speculative_config(tiny_args(), tiny_args(**DRAFT), c, prompt_length=5,
                                            max_new_tokens=8, speculate_k=3, dtype=torch.float32)
    counts = c.counts
    assert list(counts) == ["draft_prefill", "prefill", "draft", "verify"]
    assert mm_flops(counts["draft_prefill"]) == 2 * 5 * DRAFT_MM  # 5 prompt tokens: 33_280
    assert mm_flops(counts["draft"]) == 3 * 2 * DRAFT_MM == 19_968  # 3 steps, no fill step
    assert mm_flops(counts["verify"]) == 2 * 4 * TARGET_MM == 139_264  # k + 1 = 4 tokens
    assert mm_flops(alone) == 2 * TARGET_MM and alone.num_tokens == 1
    cost, = speculative_costs(c, speculate_k=3, acceptance_rate=0.5, baseline=alone)
    # matmul FLOPs a round: draft 3.125 steps * 6656 = 20_800 + verify 139_264 = 160_064;
    # per token / 1.875 = 85_367.5 (total FLOPs add norms, attention, argmax)
    step = counts["draft"].total_flops / 3
    assert cost.per_token.flops == pytest.approx(
        (3.125 * step + counts["verify"].total_flops) / 1.875)
    assert cost.speedup == pytest.approx(cost.tokens_per_s * alone.roofline_latency)


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_config_only_prints_the_cost_per_accepted_token(capsys):
    result = gen.main(model="smollm2-360m", draft_model="smollm2-135m", speculate_k=4,
                      acceptance_rate=0.8, prompt_length=8, max_new_tokens=16, quiet=True,
                      device_spec="h100-sxm")
    cost, = result["speculative"]
    # (1 - 0.8^5) / (1 - 0.8) = (1 - 0.32768) / 0.2 = 3.3616 tokens a round
    assert cost.tokens_per_round == pytest.approx(3.3616)
    assert cost.source == "--acceptance_rate 0.8" and cost.tokens_per_s > 0
    out = capsys.readouterr().out
    assert "Speculative decoding on h100-sxm" in out and "(1 - a^(k+1)) / (1 - a)" in out


@pytest.fixture
def checkpoints(tmp_path, target, draft):
    save_checkpoint(tmp_path / "target", tiny_args(), target.state_dict())
    save_checkpoint(tmp_path / "draft", tiny_args(**DRAFT), draft.state_dict())
    return tmp_path


def test_generate_real_run_measures_acceptance(checkpoints, capsys):
    out = checkpoints / "run.json"
    result = gen.main(checkpoint_path=checkpoints / "target", draft_checkpoint_path=checkpoints
                      / "draft", speculate_k=3, prompt_length=4, max_new_tokens=12, quiet=True,
                      temperature=0, device_spec="generic-cpu", acceptance_rate=0.5,
                      save_path=out)
    measured, stated = result["speculative"]
    assert measured.source.startswith("measured (") and stated.acceptance_rate == 0.5
    counts = result["counter"].counts
    assert set(counts) == {"draft_prefill", "prefill", "draft", "verify"}
    assert result["measured"]["verify"] > 0  # the timed run, per phase
    run = json.loads(out.read_text())["verify"]["perfcounter"]["run"]["speculative"]
    assert run["speculate_k"] == 3 and sum(run["accept_counts"]) == counts["verify"].steps
    assert run["costs"][0]["tokens_per_round"] == measured.tokens_per_round
    assert "accept counts" in capsys.readouterr().out


# -- bad input ----------------------------------------------------------------------------------------

CONFIG = dict(model="llama-2-7b", draft_model="llama-2-7b", acceptance_rate=0.8, prompt_length=2,
              max_new_tokens=2, quiet=True, device_spec="h100-sxm")


@pytest.mark.parametrize("change, message", [
    (dict(speculate_k=0), r"--speculate_k must be an int >= 1 \(draft tokens per round\), got 0"),
    (dict(speculate_k=-2), r"--speculate_k must be an int >= 1 .*got -2"),
    (dict(acceptance_rate=0.0), r"--acceptance_rate must be in \(0, 1\] .*got 0.0"),
    (dict(acceptance_rate=1.5), r"--acceptance_rate must be in \(0, 1\] .*got 1.5"),
    (dict(acceptance_rate=math.nan), r"--acceptance_rate must be in \(0, 1\] .*got nan"),
    (dict(acceptance_rate=None), r"config only, no tokens to measure acceptance on"),
    (dict(draft_model="llama-3.2-1b"), r"the draft's vocab_size 128256 differs from the "
                                       r"target's 32000"),
    (dict(batch_size=2), r"batch 1\), got --batch_size 2"),
    (dict(hf=True), r"speculative decoding runs perfcounter's model .*drop --hf"),
    (dict(draft_model=None, draft_checkpoint_path="x"), r"a config-only target takes a "
                                                        r"config-only draft"),
    (dict(draft_model=None), r"--acceptance_rate needs a draft model"),
    # 4089 prompt + 2 new + k 5 + 1 = 4097 positions > 4096 (Llama-2's context)
    (dict(prompt_length=4089, max_new_tokens=2), r"the target's block_size=4096 is too short"),
])
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_bad_speculative_input(change, message):
    with pytest.raises(SpeculativeArgumentError, match=message):
        gen.main(**{**CONFIG, **change})


def test_a_real_draft_of_another_vocabulary(checkpoints):
    save_checkpoint(checkpoints / "v32", tiny_args(vocab_size=32),
                    Transformer(tiny_args(vocab_size=32)).state_dict())
    with pytest.raises(SpeculativeArgumentError, match="the draft's vocab_size 32 differs from "
                                                       "the target's 64"):
        gen.main(checkpoint_path=checkpoints / "target", draft_checkpoint_path=checkpoints / "v32",
                 prompt_length=3, max_new_tokens=4, quiet=True, device_spec="generic-cpu")


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_cli_speculate_k_0_exits_2_with_one_line():
    run = subprocess.run([sys.executable, "generate.py", "--model", "llama-2-7b", "--draft_model",
                          "llama-2-7b", "--speculate_k", "0", "--acceptance_rate", "0.8"],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        "generate.py: error: --speculate_k must be an int >= 1 (draft tokens per round), got 0"]
