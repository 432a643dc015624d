"""A real run that would exhaust the machine is refused before its KV cache is allocated."""
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tiny_args
from perfcounter.models.fit import MemoryFitError, Shape, check_fits, run_bytes, shape_of

REPO = Path(__file__).resolve().parent.parent
TINY = Shape(n_layer=2, n_head=4, n_kv_heads=2, head_dim=8, dim=32, intermediate=48, vocab=64)


def test_shape_of_our_args_and_of_a_transformers_config():
    assert shape_of(tiny_args()) == TINY
    hf = type("Config", (), dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 hidden_size=32, intermediate_size=48, vocab_size=64))()
    assert shape_of(hf) == TINY  # head_dim = 32 / 4 = 8
    assert shape_of(object()) is None


def test_run_bytes_by_hand():
    cache, acts = run_bytes(TINY, batch=3, prompt=5, new_tokens=7, itemsize=4)
    # KV: 2 (K, V) * 2 layers * 3 sequences * 2 KV heads * 12 positions * 8 dims * 4 B = 9,216
    assert cache == 9_216
    # activations: 3 * 5 * (64 + 3*48 + 4*32) * 4 = 20,160, + scores 3 * 4 heads * 5 * 12 * 4
    # = 2,880 -> 23,040
    assert acts == 23_040


def test_a_run_that_does_not_fit_is_refused_with_the_largest_batch_that_does():
    # one sequence: 9,216 / 3 + 23,040 / 3 = 3,072 + 7,680 = 10,752 B; 30,000 B hold 2
    with pytest.raises(MemoryFitError, match=r"^batch 3 x 12 tokens needs 9.22 kB of KV cache and "
                                             r"about 23.04 kB of activations; 30.00 kB is free here; "
                                             r"at these lengths at most --batch_size 2 fits"):
        check_fits(tiny_args(), batch=3, prompt=5, new_tokens=7, itemsize=4, device="cpu",
                   available=(30_000, "free here"))
    check_fits(tiny_args(), batch=3, prompt=5, new_tokens=7, itemsize=4, device="cpu",
               available=(32_256, "free here"))  # exactly 3 * 10,752: fits
    with pytest.raises(MemoryFitError, match="not even one sequence of these lengths fits"):
        check_fits(tiny_args(), batch=1, prompt=5, new_tokens=7, itemsize=4, device="cpu",
                   available=(10_000, "free here"))


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_refuses_a_batch_the_host_cannot_hold_before_allocating_it(tmp_path, tiny_model):
    from perfcounter.models.loading import save_checkpoint
    save_checkpoint(tmp_path, tiny_args(), tiny_model.state_dict())
    # 50,000,000 sequences of 2 positions: ~1.6 kB each (KV 256 B + activations 1,376 B at
    # float32), ~80 GB in all: more than this host has; the prompt itself is 400 MB
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "generate.py", "--checkpoint_path", str(tmp_path),
                          "--prompt_length", "1", "--max_new_tokens", "1", "--batch_size",
                          "50000000", "--device_spec", "generic-cpu", "--quiet"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in run.stderr
    assert "--batch_size" in errors[0] and "fits (--no_memory_check runs it anyway)" in errors[0]
    assert time.monotonic() - t0 < 120
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 4 << 20  # KiB: < 4 GiB
