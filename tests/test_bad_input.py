"""Bad input, tried as a new user would: each ends in one clear line naming the value and
what is valid (exit code 2 on the command line, never a traceback), and nothing is lost
or replaced on the way: odd output targets, unwritable save paths, remote code."""
import importlib.util
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_hf_model, tiny_args
from perfcounter import TransformerPerformanceCounter
from perfcounter._util import UnsafeTargetError, atomic_write, check_writable_target
from perfcounter.counts_doc import SCHEMA
from perfcounter.models.loading import (CheckpointError, check_device, load_hf_model, load_model,
                                 read_config, save_checkpoint)
from perfcounter.models.args import ModelArgs
from perfcounter.models.tokenizer import HFTokenizer, TokenizerError, encode_prompt

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", REPO / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

CONFIG_ONLY = dict(model="llama-2-7b", prompt_length=2, max_new_tokens=2, quiet=True,
                   device_spec="h100-sxm")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- the atomic writer ------------------------------------------------------------------

def test_writer_refuses_a_device_node_and_leaves_it():
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(UnsafeTargetError, match="refusing to write /dev/null: .* not a regular file"):
        atomic_write("/dev/null", "{}")
    with pytest.raises(UnsafeTargetError):
        check_writable_target("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # still the device


def test_writer_refuses_a_fifo_and_a_directory(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeTargetError, match="not a regular file"):
        atomic_write(fifo, "{}")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(UnsafeTargetError, match="is a directory"):
        atomic_write(tmp_path, "{}")
    assert leftovers(tmp_path) == []


def test_writer_writes_through_a_symlink(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    assert atomic_write(link, "new") == target
    assert link.is_symlink() and target.read_text() == "new"


def test_writer_keeps_permissions_and_uses_the_umask_for_new_files(tmp_path):
    old = tmp_path / "kept.json"
    old.write_text("x")
    old.chmod(0o640)
    atomic_write(old, "y")
    assert stat.S_IMODE(old.stat().st_mode) == 0o640 and old.read_text() == "y"
    mask = os.umask(0o027)
    try:
        atomic_write(tmp_path / "new.json", "z")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640  # 0o666 & ~0o027


def test_writer_cleans_up_after_a_failed_write(tmp_path, monkeypatch):
    path = tmp_path / "stats.json"
    path.write_text("precious")

    def broken_writer(tmp):
        Path(tmp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, writer=broken_writer)
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("no rename")))
    with pytest.raises(OSError, match="no rename"):
        atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "precious" and leftovers(tmp_path) == []


def test_counter_to_json_refuses_a_device_node():
    counter = TransformerPerformanceCounter()
    with pytest.raises(UnsafeTargetError):
        counter.to_json("/dev/null")


# -- generate.py: the save path -------------------------------------------------------------

def test_save_path_is_checked_before_the_run(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(gen, "count_config_only", lambda *a, **k: ran.append(1))
    with pytest.raises(gen.GenerateArgumentError, match=f"--save_path {tmp_path}: .*is a directory"):
        gen.main(**CONFIG_ONLY, save_path=tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(gen.GenerateArgumentError, match="--save_path .*file/out.json"):
        gen.main(**CONFIG_ONLY, save_path=tmp_path / "file" / "out.json")
    with pytest.raises(gen.GenerateArgumentError, match="refusing to write /dev/null"):
        gen.main(**CONFIG_ONLY, save_path=Path("/dev/null"))
    assert ran == []  # nothing was counted: the run never started


def test_failed_save_keeps_the_results(tmp_path, monkeypatch, capsys):
    def full_disk(path, doc):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gen, "write_json_atomic", full_disk)
    wanted = tmp_path / "stats.json"
    result = gen.main(**CONFIG_ONLY, save_path=wanted)
    kept = result["saved_to"]
    assert kept != wanted and not wanted.exists()
    err = capsys.readouterr().err
    assert f"could not write {wanted} (No space left on device); the results are in {kept}" in err
    doc = json.loads(kept.read_text())
    assert set(doc) == {"prefill", "decode"} and doc["decode"]["perfcounter"]["run"]
    kept.unlink()


# -- generate.py: arguments -----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=math.nan), r"--temperature must be a finite number >= 0 \(0 for greedy\), got nan"),
    (dict(temperature=-1.0), r"--temperature must be a finite number >= 0 .*got -1.0"),
    (dict(temperature=math.inf), r"--temperature .*got inf"),
    (dict(top_k=0), r"--top_k must be an int >= 1, got 0"),
    (dict(top_k=-5), r"--top_k must be an int >= 1, got -5"),
    (dict(depth=0), r"--depth must be a positive int, got 0"),
    (dict(device="tpu"), r"--device 'tpu' is not one a model runs on here; valid: cpu, cuda, "
                         r"cuda:N, mps"),
    (dict(prompt_length=4095, max_new_tokens=2),  # Llama-2's context: 4,096
     r"max_seq_length=4097 exceeds the model's block_size=4096 \(a prompt of 4095 tokens"),
])
def test_generate_arguments(kwargs, message):
    with pytest.raises(gen.GenerateArgumentError, match=message):
        gen.main(**{**CONFIG_ONLY, **kwargs})


def test_sampling_is_checked_by_the_library_functions_too(tiny_model):
    with pytest.raises(gen.GenerateArgumentError, match="got nan"):
        gen.generate(tiny_model, torch.zeros(1, 3, dtype=torch.long), 2, temperature=math.nan)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu():
    with pytest.raises(ValueError, match="device 'cuda': no CUDA GPU is available here "
                                         r"\(valid: cpu"):
        check_device("cuda")
    assert check_device("cuda", present=False) == "cuda"  # config-only: fake tensors


@pytest.fixture
def tiny_dir(tmp_path, tiny_model, hf_tokenizer_file):
    """Our safetensors layout (vocab 64) and a word-level tokenizer.json."""
    save_checkpoint(tmp_path, tiny_args(), tiny_model.state_dict())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_tokenizer_file.parent / name).read_bytes())
    return tmp_path


def test_real_run_prompt_errors(tiny_dir):
    run = dict(checkpoint_path=tiny_dir, quiet=True, device_spec="generic-cpu", temperature=0)
    with pytest.raises(gen.GenerateArgumentError, match="--prompt is empty"):
        gen.main(**run, prompt="")
    # block_size 64: a 60-token prompt and 10 new tokens do not fit
    with pytest.raises(gen.GenerateArgumentError, match="max_seq_length=70 exceeds the model's "
                                                        "block_size=64"):
        gen.main(**run, prompt_length=60, max_new_tokens=10)


def test_tokenizer_larger_than_the_model(hf_tokenizer_file):
    tok = HFTokenizer(hf_tokenizer_file)
    ids = tok.encode("the capital of france is paris")
    assert max(ids) >= 8
    with pytest.raises(TokenizerError, match=f"token id {max(ids)}, but the model has "
                                             r"vocab_size=8 \(ids 0..7\); this tokenizer of "
                                             r"\d+ tokens does not fit the checkpoint"):
        encode_prompt(tok, "the capital of france is paris", vocab_size=8)
    with pytest.raises(TokenizerError, match="the prompt is empty"):
        encode_prompt(tok, "", vocab_size=64)


def test_tokenizer_config_that_is_a_list(hf_tokenizer_file, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(hf_tokenizer_file.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('["<s>"]')
    with pytest.raises(TokenizerError, match="tokenizer_config.json: expected a JSON object "
                                             r"\(bos_token, eos_token, ...\), got list"):
        HFTokenizer(tmp_path / "tokenizer.json")


def run_cli(*argv):
    return subprocess.run([sys.executable, "generate.py", *argv], cwd=REPO, capture_output=True,
                          text=True)


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top_k", "0"], "--top_k must be an int >= 1, got 0"),
    (["--device", "tpu"], "--device 'tpu' is not one a model runs on here"),
])
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_cli_exit_code_2_and_one_line(argv, message):
    run = run_cli("--model", "llama-2-7b", "--prompt_length", "2", "--max_new_tokens", "2",
                  "--quiet", *argv)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("generate.py: error: ")
    assert message in run.stderr and "Traceback" not in run.stderr


# -- models and checkpoints ------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("n_layer", -3, "ModelArgs.n_layer must be a positive int, got -3"),
    ("n_head", 0, "ModelArgs.n_head must be a positive int, got 0"),
    ("vocab_size", 0, "ModelArgs.vocab_size must be a positive int, got 0"),
    ("dim", "64", "ModelArgs.dim must be a positive int, got '64'"),
    ("n_local_heads", 0, "ModelArgs.n_local_heads must be a positive int, got 0"),
    ("num_experts", -1, "ModelArgs.num_experts must be an int >= 0, got -1"),
    ("norm_eps", math.nan, "ModelArgs.norm_eps must be a finite number > 0, got nan"),
    ("rope_scaling", "llama3", "ModelArgs.rope_scaling must be a dict"),
    ("rope_scaling", {"factor": 8.0}, "ModelArgs.rope_scaling lacks low_freq_factor"),
])
def test_model_args_are_checked(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ModelArgs(**{field: value})


def test_our_config_with_zero_heads_or_vocab(tmp_path):
    path = tmp_path / "config.json"
    for field in ("n_head", "vocab_size"):
        path.write_text(json.dumps({**tiny_args().__dict__, field: 0}))
        with pytest.raises(CheckpointError, match=f"config.json: invalid ModelArgs "
                                                  rf"\(ModelArgs.{field} must be a positive int, got 0\)"):
            read_config(path)
    with pytest.raises(CheckpointError, match="vocab_size must be a positive int"):
        gen.main(config=path, prompt_length=2, max_new_tokens=2, quiet=True)  # CLI: exit 2


@pytest.fixture(scope="module")
def hf_config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hfcfg")
    make_hf_model("llama").config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive integer, got 0"),
    ({"hidden_size": "64"}, "'hidden_size' must be a positive integer, got '64'"),
    ({"rope_scaling": "llama3"}, "'rope_scaling' must be an object such as"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "the llama3 rope scaling block lacks low_freq_factor, high_freq_factor, "
     "original_max_position_embeddings"),
    ({"rope_theta": -1}, "'rope_theta' must be a finite number > 0, got -1"),
    ({"num_key_value_heads": 3}, "n_head=4 is not a multiple of n_local_heads=3"),
])
def test_hf_config_errors(hf_config, tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**hf_config, **change}))
    with pytest.raises(CheckpointError, match=f"{path}: {message}".replace("(", r"\(")):
        read_config(path)


def test_hf_weights_of_the_wrong_shape(hf_llama_dir):
    from safetensors.torch import load_file, save_file
    tensors = load_file(hf_llama_dir / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(30, 32)
    save_file(tensors, hf_llama_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"layers.0.self_attn.q_proj.weight has shape "
                                              r"\(30, 32\), the config says \(32, 32\)"):
        load_model(hf_llama_dir)


def test_pth_of_integer_tensors(tmp_path, tiny_model):
    torch.save({k: v.to(torch.int64) for k, v in tiny_model.state_dict().items()},
               tmp_path / "model.pth")
    (tmp_path / "config.json").write_text(json.dumps(tiny_args().__dict__))
    with pytest.raises(CheckpointError, match=r"model.pth: weights must be floating point; 17 are "
                                              r"not: tok_embeddings.weight \(torch.int64\)"):
        load_model(tmp_path / "model.pth")


@pytest.mark.parametrize("meta, message", [
    ("{not json", "metadata 'perfcounter_model_args' is not JSON"),
    ("[1, 2]", "metadata 'perfcounter_model_args' must be a JSON object of ModelArgs fields, "
               "got list"),
])
def test_safetensors_metadata_that_is_not_a_json_object(tmp_path, tiny_model, meta, message):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tiny_model.state_dict().items()},
              tmp_path / "model.safetensors", metadata={"perfcounter_model_args": meta})
    with pytest.raises(CheckpointError, match=message):
        load_model(tmp_path / "model.safetensors")


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../x"])
def test_shard_names_outside_the_folder_are_refused(hf_llama_dir, shard):
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard}}
    (hf_llama_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"shard {shard!r} is outside the model folder"):
        load_model(hf_llama_dir)


# -- transformers never runs a checkpoint's code unasked -----------------------------------

def test_custom_code_in_an_hf_folder_is_not_run(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "mything", "auto_map": {"AutoConfig": "modeling.MyConfig",
                                              "AutoModelForCausalLM": "modeling.MyModel"}}))
    (tmp_path / "modeling.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(CheckpointError, match="transformers could not load this folder"):
        load_hf_model(tmp_path)
    assert not marker.exists()


def test_trust_remote_code_is_passed_false_by_default(tmp_path, monkeypatch):
    import transformers
    seen = []

    def from_pretrained(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code", "missing"))
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for trust in (False, True):
        with pytest.raises(CheckpointError):
            load_hf_model(gguf, trust_remote_code=trust)
        with pytest.raises(CheckpointError):
            load_model(gguf, trust_remote_code=trust)
    assert seen == [False, False, True, True]
    seen.clear()  # the file's config, read first, as a default Llama's (a config runs no code)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda *a, **kw: transformers.LlamaConfig())
    with pytest.raises(CheckpointError):  # generate.py's --trust_remote_code reaches transformers
        gen.main(checkpoint_path=gguf, hf=True, quiet=True, trust_remote_code=True,
                 device_spec="generic-cpu")
    assert seen == [True]


# -- reading counts back ---------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (json.dumps({"prefill": {"label": "prefill", "num_tokens": 4, "latency": None,
                             "trace": None, "total_flops": 1, "total_io": 1,
                             "device": "h100-sxm"}}),
     "phase 'prefill': field 'device' must be an object"),
    (json.dumps({"schema": SCHEMA, "version": 1, "io_model": "per_op", "depth": 10,
                 "device": "h100", "counts": {}}),
     "field 'device' must be an object .*got str 'h100'"),
    (json.dumps({"schema": SCHEMA, "version": 1, "io_model": "per_op", "depth": 10,
                 "device": None, "counts": []}),
     "field 'counts' must be an object of phases by label, got list"),
    (json.dumps({"prefill": [1, 2]}), "phase 'prefill': expected an object of stats fields"),
    (json.dumps([1, 2]), "expected a JSON object of phases by label, got list"),
    (json.dumps({"prefill": {"label": "prefill", "num_tokens": "4"}}),
     "phase 'prefill': field 'num_tokens' must be int, got str"),
])
def test_from_json_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "counts.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"{path}: .*{message}"):
        TransformerPerformanceCounter.from_json(path)


def test_from_json_of_a_binary_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x80\x81\xfe\xff" * 16)
    with pytest.raises(ValueError, match=f"{path}: not a JSON text file"):
        TransformerPerformanceCounter.from_json(path)
