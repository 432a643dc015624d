"""Per-op records of tiny Llama and Qwen2 prefill + decode runs, as plain data.

`snapshot()` is what tests/data/records_before_restructure.json holds: it was
written by the counting code as it stood before the counting side was split
into op_plan / storage / module_path, and test_restructure.py holds today's
code to it. Roles added since (a module buffer was an input then) are folded
into the roles that existed, and records are summed over what today's keys add
(the segment within a module), so the comparison is like for like.

Regenerated once, deliberately, for issue 11 (json.dumps(snapshot(), separators=(",", ":"),
sort_keys=True)): under inference_mode composites now run their own decomposition, so the
inference_mode records are the no_grad ones; and the static-cache decode steps' attention
(an explicit mask) carries the executed FLOPs of the pairs its mask keeps. Nothing else moved.
"""
import torch

from perfcounter.models.tokenizer import cache_keyword

OLD_ROLES = ("weight", "kv_cache", "activation", "input")
FOLD = {"buffer": "input"}  # a role added since -> the role it had before


def _tiny(arch: str):
    """A 2-layer tiny transformers model of `arch` (llama, qwen2) and a [2, 5] batch of ids."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                          "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    cfg = cfg_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    torch.manual_seed(0)
    return model_cls(cfg).eval(), torch.randint(0, 100, (2, 5))


def _old_roles(by_role: list[int]) -> list[int]:
    from perfcounter.trace import ROLES
    out = dict.fromkeys(OLD_ROLES, 0)
    for role, value in zip(ROLES, by_role):
        out[FOLD.get(role, role)] += value
    return [out[r] for r in OLD_ROLES]


def _phase(trace) -> dict:
    recs: dict[str, list] = {}
    for r in trace.records:
        key = "|".join((r.op, r.module, r.dtype, r.shapes))
        row = [r.calls, r.flops, r.executed_flops, *r.kinds, *_old_roles(r.read), *_old_roles(r.written)]
        old = recs.get(key)
        recs[key] = row if old is None else [a + b for a, b in zip(old, row)]
    return {"records": dict(sorted(recs.items())),
            "compulsory_read": _old_roles(trace.compulsory_read),
            "compulsory_written": _old_roles(trace.compulsory_written),
            "kv_cache_valid_read": trace.kv_cache_valid_read}


def snapshot() -> dict:
    """{arch/grad/cache/phase: records and whole-phase figures} for both architectures."""
    from transformers import StaticCache

    from perfcounter.counting.mode import PerformanceCounterMode

    out = {}
    for arch in ("llama", "qwen2"):
        model, ids = _tiny(arch)
        for grad in (torch.no_grad, torch.inference_mode):
            mode = PerformanceCounterMode()
            with grad():
                for cache_name in ("dynamic", "static"):
                    cache = None if cache_name == "dynamic" else StaticCache(config=model.config,
                                                                              max_cache_len=16)
                    with mode:
                        res = model(ids, use_cache=True, **{cache_keyword(model): cache})
                    out[f"{arch}/{grad.__name__}/{cache_name}/prefill"] = _phase(mode.trace())
                    for step in range(2):
                        with mode:
                            model(ids[:, step:step + 1], use_cache=True,
                                  **{cache_keyword(model): getattr(res, cache_keyword(model))})
                        out[f"{arch}/{grad.__name__}/{cache_name}/decode{step}"] = _phase(mode.trace())
    return out
