"""generate.py: phases, loaders agreeing, config-only counts (seed 004), JSON, errors."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from conftest import make_hf_model, tiny_args
from perfcounter import PerformanceCounterMode, TransformerPerformanceCounter
from perfcounter.generation.config_only import count_config_only
from perfcounter.devices import DeviceSpecError
from perfcounter.models.loading import CheckpointNotFoundError, load_model, save_checkpoint
from perfcounter.models.args import UnknownModelError

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

QUIET = dict(quiet=True, device_spec="generic-cpu", temperature=0)


@pytest.fixture
def tiny_dir(tmp_path, tiny_model, sp_model_file):
    """Our safetensors layout + the SentencePiece tokenizer (vocab 60 <= 64)."""
    save_checkpoint(tmp_path, tiny_args(), tiny_model.state_dict())
    (tmp_path / "tokenizer.model").write_bytes(sp_model_file.read_bytes())
    return tmp_path


def test_pth_and_safetensors_generate_the_same_tokens(tmp_path, tiny_model):
    torch.save(tiny_model.state_dict(), tmp_path / "model.pth")
    (tmp_path / "config.json").write_text(json.dumps(tiny_args().__dict__))
    safetensors = save_checkpoint(tmp_path / "st", tiny_args(), tiny_model.state_dict())
    prompt = torch.tensor([[1, 5, 9, 2]])
    outs = [gen.generate(load_model(path).model, prompt, 8, temperature=0)
            for path in (tmp_path / "model.pth", safetensors)]
    outs.append(gen.generate(tiny_model, prompt, 8, temperature=0))
    assert outs[0].shape == (1, 12)  # 4 prompt tokens + 8 new
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert len(set(outs[0][0, 4:].tolist())) > 1  # not one token repeated: the weights matter


def test_generate_wraps_each_phase_from_outside(tiny_model):
    seen = []

    def phase(label, num_tokens):
        seen.append((label, num_tokens))
        return torch.no_grad()

    gen.generate(tiny_model, torch.zeros(3, 5, dtype=torch.long), 4, phase=phase, temperature=0)
    # prefill: 3 sequences * 5 tokens; then 4 - 1 decode steps of 3 tokens each
    assert seen == [("prefill", 15), ("decode", 3), ("decode", 3), ("decode", 3)]


def test_decode_never_feeds_a_step_its_own_output_buffer():
    """CUDA graphs (torch.compile's reduce-overhead) overwrite a step's output on the next
    replay, and refuse an input that is such an output: each step's token is a copy."""
    out = torch.zeros(1, 1, dtype=torch.int)  # the one buffer a graph would return each step
    seen = []

    def graph_step(model, cur_token, input_pos, **_):
        seen.append(cur_token.data_ptr() == out.data_ptr())
        out.copy_(cur_token + 1)
        return out

    tokens = gen.decode_n_tokens(None, torch.zeros(1, 1, dtype=torch.int), torch.tensor([0]), 3,
                                 decode_fn=graph_step)
    assert seen == [False, False, False]
    assert [t.item() for t in tokens] == [1, 2, 3]  # each kept token is its own copy


def test_config_only_llama_2_7b_reproduces_seed_004():
    result = gen.main(model="llama-2-7b", prompt_length=6, max_new_tokens=2, precision="bfloat16",
                      quiet=True, device_spec="h100-sxm")
    counts = result["counter"].counts
    # seed 004: prefill 79.31 GFLOPs, 13.25 GB; decode 13.22 GFLOPs, 13.22 GB.
    # FLOPs by hand: matmul weights = 6_607_343_616 active - 32*8192 - 4096 (norms) = 6_607_077_376
    #   prefill 2 * 6 * 6_607_077_376 = 79.285 G + attention 4 * 32 heads * 6 * 8 * 128 * 32 = 0.025 G
    #   decode  2 * 1 * 6_607_077_376 = 13.214 G + 4 * 32 * 1 * 8 * 128 * 32 = 0.004 G
    # IO: bf16 weights 2 * 6_607_077_376 = 13.21 GB read once per phase, plus activations
    for label, flops, io in (("prefill", 79.31e9, 13.25e9), ("decode", 13.22e9, 13.22e9)):
        assert counts[label].total_flops == pytest.approx(flops, rel=0.01)
        assert counts[label].total_io == pytest.approx(io, rel=0.01)
    assert counts["prefill"].num_tokens == 6 and counts["decode"].num_tokens == 1
    assert counts["decode"].latency is None and result["measured"] == {"prefill": None, "decode": None}
    assert result["params"] == (6_607_343_616, 6_738_415_616)


def test_config_only_counting_from_the_package():
    counter = TransformerPerformanceCounter(device_spec="generic-cpu")
    count_config_only(tiny_args(), counter, batch_size=2, prompt_length=5, max_new_tokens=3)
    prefill, decode = counter.counts["prefill"], counter.counts["decode"]
    # greedy by default: prefill of 2 sequences * 5 tokens, then 3 - 1 decode steps of 2 tokens
    assert (prefill.num_tokens, decode.num_tokens, decode.steps) == (10, 4, 2)
    assert prefill.latency is None and prefill.total_flops > 0  # fake tensors: counted, not timed
    # generate.py's own generation (sampling included) counts the same model, plus its sampling
    sampled = TransformerPerformanceCounter(device_spec="generic-cpu")
    count_config_only(tiny_args(), sampled, batch_size=2, prompt_length=5, max_new_tokens=3,
                      generate=gen.generate, temperature=0.8, top_k=10)
    mm = [sum(r.flops for r in c.counts["prefill"].trace.records if r.op.startswith("aten.mm"))
          for c in (counter, sampled)]
    assert mm[0] == mm[1] and sampled.counts["prefill"].total_flops > prefill.total_flops


def test_config_only_moe_decode_reads_only_the_routed_experts(tmp_path):
    args = tiny_args(num_experts=4, num_activated_experts=2)
    (tmp_path / "config.json").write_text(json.dumps(args.__dict__))
    counts = gen.main(config=tmp_path / "config.json", prompt_length=3, max_new_tokens=2,
                      precision="float32", quiet=True, device_spec="generic-cpu")["counter"].counts
    read = counts["decode"].io_by_role["read"]["weight"]
    # per layer: wqkv 2048 + wo 1024 + norms 64 + gate 128 + 2 of 4 experts 2*3*32*48 = 9216
    # -> 12480; 2 layers 24960 + final norm 32 + output 2048 + one embedding row 32 = 27072
    # float32: 27072 * 4 = 108_288 bytes
    assert read == 108_288
    # prefill, 3 tokens * 2 slots = 6 >= 4 experts: every expert read once per layer
    # per layer 2048 + 1024 + 64 + 128 + 4*3*32*48 = 21696; 2 layers 43392 + 32 + 2048
    # + three embedding rows 96 = 45568 params; * 4 bytes = 182_272
    assert counts["prefill"].io_by_role["read"]["weight"] == 182_272


def test_config_only_from_a_hugging_face_config(tmp_path):
    make_hf_model("qwen2").config.save_pretrained(tmp_path)
    result = gen.main(config=tmp_path / "config.json", prompt_length=4, max_new_tokens=2,
                      precision="float32", quiet=True, device_spec="generic-cpu")
    mm = sum(r.flops for r in result["counter"].counts["prefill"].trace.records
             if r.op.startswith(("aten.mm", "aten.addmm")))
    # matmul weights: per layer wqkv (32+16+16)*32 + wo 32*32 + ffn 3*32*48 = 7680, 2 layers
    # + output 64*32 (tied, still a matmul) = 17408; 2 * 4 tokens * 17408 = 139_264
    # + the q/k/v bias added by addmm: 4 tokens * 64 * 2 layers = 512 -> 139_776
    assert mm == 139_776


def test_real_run_reports_measured_next_to_roofline(tiny_dir, capsys):
    result = gen.main(checkpoint_path=tiny_dir, prompt="hello my name is", max_new_tokens=4,
                      num_samples=2, precision="float32", batch_size=2, **QUIET)
    counts = result["counter"].counts
    prompt_tokens = counts["prefill"].num_tokens // 2
    assert prompt_tokens >= 2 and counts["decode"].num_tokens == 2 * 3  # batch 2, 3 decode steps
    assert len(result["texts"]) == 2 and all(t.startswith("hello my name is") for t in result["texts"])
    assert len(result["samples"]) == 2
    assert all(v > 0 for v in result["measured"].values())
    out = capsys.readouterr().out
    assert "Predicted vs measured on generic-cpu" in out
    decode_row = next(line for line in out.splitlines() if line.strip().startswith("decode"))
    assert decode_row.rstrip().endswith("x")  # measured / roofline ratio


def test_save_path_json_carries_both_phases(tmp_path):
    path = tmp_path / "out" / "stats.json"
    gen.main(model="smollm2-135m", prompt_length=5, max_new_tokens=3, save_path=path, quiet=True,
             device_spec="a100-sxm4-80gb")
    doc = json.loads(path.read_text())
    assert set(doc) == {"prefill", "decode"}  # torchao's layout: labels at the top level
    run = doc["decode"]["perfcounter"]["run"]
    assert run["prompt_tokens"] == 5 and run["config_only"] is True
    again = TransformerPerformanceCounter.from_json(path)
    assert again.counts["decode"].num_tokens == 2  # 3 new tokens: 1 from prefill, 2 decode steps


def test_compile_times_compiled_code_but_counts_eagerly(tiny_dir, monkeypatch):
    calls = []

    def fake_compile(fn, **kwargs):
        def compiled(*args, **kw):
            calls.append(any(isinstance(m, PerformanceCounterMode)
                             for m in _get_current_dispatch_mode_stack()))
            return fn(*args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    result = gen.main(checkpoint_path=tiny_dir, max_new_tokens=3, compile=True, precision="float32",
                      **QUIET)
    # warm-up + 1 timed sample, each 1 prefill + 2 decode steps, never under the counter
    assert calls == [False] * 6
    assert result["counter"].counts["decode"].num_tokens == 2


def test_hf_flag_runs_transformers_and_agrees_with_ours(tmp_path, hf_tokenizer_file):
    make_hf_model("llama").save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_tokenizer_file.parent / name).read_bytes())
    ours = gen.main(checkpoint_path=tmp_path, max_new_tokens=5, precision="float32", **QUIET)
    theirs = gen.main(checkpoint_path=tmp_path, hf=True, max_new_tokens=5, precision="float32", **QUIET)
    assert theirs["texts"] == ours["texts"]
    assert theirs["counter"].counts["decode"].num_tokens == 4


def test_progress_bar_only_on_a_terminal(tiny_dir, capsys, monkeypatch):
    run = dict(checkpoint_path=tiny_dir, max_new_tokens=3, precision="float32",
               device_spec="generic-cpu", temperature=0)
    gen.main(**run)
    assert "decode: " not in capsys.readouterr().err  # captured stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    gen.main(**run)
    assert "decode: " in capsys.readouterr().err


def test_bad_input_is_named():
    with pytest.raises(UnknownModelError, match="unknown model 'llama-2-7'; did you mean"):
        gen.main(model="llama-2-7", quiet=True)
    with pytest.raises(CheckpointNotFoundError, match="nope: no such file or folder"):
        gen.main(checkpoint_path=Path("nope"), quiet=True)
    with pytest.raises(gen.GenerateArgumentError, match="got 0, 1, 1"):
        gen.main(model="llama-2-7b", max_new_tokens=0, quiet=True)
    with pytest.raises(gen.GenerateArgumentError, match="unknown --precision 'fp8'"):
        gen.main(model="llama-2-7b", precision="fp8", quiet=True)
    with pytest.raises(DeviceSpecError):
        gen.main(model="llama-2-7b", device_spec="h10", quiet=True)
    with pytest.raises(ValueError, match="max_seq_length=4097 exceeds the model's block_size=4096"):
        gen.main(model="llama-2-7b", prompt_length=4096, max_new_tokens=1, quiet=True,
                 device_spec="h100-sxm")


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_cli_exits_with_the_message():
    run = subprocess.run([sys.executable, "generate.py", "--model", "lama-2-7b"], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "error: unknown model 'lama-2-7b'; did you mean" in run.stderr
    assert "UserWarning" not in run.stderr  # the name is checked before anything else runs


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_smollm2_says_paris_through_our_transformer(smollm2_dir):
    result = gen.main(checkpoint_path=smollm2_dir, prompt="The capital of France is",
                      max_new_tokens=2, precision="float32", **QUIET)
    assert result["texts"][0].startswith("The capital of France is Paris")
