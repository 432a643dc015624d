"""Counting a model from its config alone, under FakeTensorMode.

    counter = TransformerPerformanceCounter(device_spec="h100-sxm")
    count_config_only(ModelArgs.from_name("llama-3-8b"), counter, prompt_length=128,
                      max_new_tokens=4)
    print(counter.compare(["h100-sxm", "a100-sxm4-80gb"]))

`count_config_only` builds our Transformer with fake parameters (loading's
`fake_model`: shapes and dtypes, no data, no memory, so a 70B model counts on
a laptop) and feeds it a synthetic prompt of zeros through one generation — a
prefill block, then one decode block per further token, each inside
`counter.count` — so the counter sees every aten op that real weights would
run. The generation is a function `generate(model, prompt, max_new_tokens,
phase=counter.count, **sampling_kwargs)`: `greedy_generate` here by default;
generate.py passes its own, and its sampling ops count too.
"""
from __future__ import annotations

import torch

from perfcounter.loading import fake_model
from perfcounter.model import ModelArgs


def _argmax_token(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].argmax(dim=-1, keepdim=True)  # [B, S, vocab] -> [B, 1]


@torch.no_grad()
def greedy_generate(model, prompt: torch.Tensor, max_new_tokens: int, *, phase):
    """prompt [B, S] -> [B, S + max_new_tokens], each new token the argmax of the logits;
    `phase(label, num_tokens)` wraps the prefill and each decode step."""
    batch, length = prompt.shape
    model.setup_caches(max_batch_size=batch, max_seq_length=length + max_new_tokens)
    input_pos = torch.arange(0, length, device=prompt.device)
    with phase("prefill", num_tokens=batch * length):
        token = _argmax_token(model(prompt, input_pos))
    tokens = [prompt, token]
    input_pos = torch.tensor([length], device=prompt.device)
    for _ in range(max_new_tokens - 1):
        with phase("decode", num_tokens=batch):
            token = _argmax_token(model(token, input_pos))
        input_pos += 1
        tokens.append(token)
    return torch.cat(tokens, dim=-1)


def count_config_only(args: ModelArgs, counter, *, batch_size: int = 1, prompt_length: int,
                      max_new_tokens: int, dtype=torch.bfloat16, device: str = "cpu",
                      generate=greedy_generate, **sampling_kwargs):
    """Count one generation of a weightless model (FakeTensorMode) with `counter`: labels
    "prefill" and "decode". Returns the fake model."""
    if "cuda" in device and not torch.cuda.is_available():
        device = "cpu"  # fake CUDA modules cannot be initialised without CUDA; counts agree
    model, fake_mode = fake_model(args, dtype=dtype, device=device)
    with fake_mode:
        x = torch.zeros(batch_size, prompt_length, dtype=torch.int64, device=device)
        generate(model, x, max_new_tokens, phase=counter.count, **sampling_kwargs)
    return model
