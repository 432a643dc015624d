"""What kind of module this is: the one classifier and its one vocabulary, MODULE_KINDS
(embedding, attention, mlp, norm, lm_head, other), used by every part that groups a
trace by module kind (breakdown's scopes, the roofline's norms, the plots' bars, the
simulator's tensor-parallel blocks and its placement search).

A module is classified by its own name (the last component of its path) and, where the
caller knows it, its class name:
- lm_head:   named lm_head / output / embed_out, as a direct child of the root model;
- norm:      a name or a class ending in "norm" (input_layernorm, ffn_norm, LayerNorm);
- embedding: named embed_tokens / tok_embeddings / wte / word_embeddings / embed_in;
- attention: named self_attn / attention / attn / self_attention, or "attention" in
             its class (LlamaAttention, GPTNeoXAttention);
- mlp:       named mlp / feed_forward / ffn / block_sparse_moe, or "mlp", "feedforward"
             or "moe" in its class (LlamaMLP, FeedForward, MixtralSparseMoeBlock);
- other:     anything else (rotary tables, the root, a bare Linear).
The first rule that matches wins (`own_kind`). The code run in a module (its records)
counts under `module_kind`: lm_head if the path is in the output head, norm if the
module itself is a norm, else the outermost-priority kind of its enclosing modules
(embedding, then attention, then mlp), else other.

NB: names are matched exactly, path component by path component (never by substring);
class names by the words above.
"""
from __future__ import annotations

EMBEDDING, ATTENTION, MLP, NORM, LM_HEAD, OTHER = (
    "embedding", "attention", "mlp", "norm", "lm_head", "other")
MODULE_KINDS = (EMBEDDING, ATTENTION, MLP, NORM, LM_HEAD, OTHER)

NAMES = {
    EMBEDDING: frozenset({"embed_tokens", "tok_embeddings", "wte", "word_embeddings", "embed_in"}),
    ATTENTION: frozenset({"self_attn", "attention", "attn", "self_attention"}),
    MLP: frozenset({"mlp", "feed_forward", "ffn", "block_sparse_moe"}),
    LM_HEAD: frozenset({"lm_head", "output", "embed_out"}),  # only as the root's child
}
CLASS_WORDS = {ATTENTION: ("attention",), MLP: ("mlp", "feedforward", "moe")}

# llm-profiler's scope names (seeds 000/001) for our kinds; "transformer" = all but lm_head
SCOPES = ("transformer", "embedding", "attn", "mlp", "lm_head")
SCOPE_KINDS = {"embedding": EMBEDDING, "attn": ATTENTION, "mlp": MLP}


def own_kind(path: str, cls: str = "") -> str:
    """The kind of the module at `path` itself, from its own name and class name."""
    if not path:
        return OTHER
    parts = path.split(".")
    name, low = parts[-1], cls.lower()
    if len(parts) == 2 and name in NAMES[LM_HEAD]:
        return LM_HEAD
    if name.lower().endswith("norm") or low.endswith("norm"):
        return NORM
    if name in NAMES[EMBEDDING]:
        return EMBEDDING
    for kind in (ATTENTION, MLP):
        if name in NAMES[kind] or any(w in low for w in CLASS_WORDS[kind]):
            return kind
    return OTHER


def kinds_along(path: str, classes: dict | None = None) -> list[str]:
    """own_kind of each module on `path`, the root first (classes: {path: class name})."""
    if not path:
        return []
    parts, classes = path.split("."), classes or {}
    prefixes = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return [own_kind(p, classes.get(p, "")) for p in prefixes]


def module_kind(path: str, classes: dict | None = None) -> str:
    """The kind the code run in module `path` counts under (see the module doc)."""
    chain = kinds_along(path, classes)
    if LM_HEAD in chain:
        return LM_HEAD
    if chain and chain[-1] == NORM:
        return NORM
    return next((k for k in (EMBEDDING, ATTENTION, MLP) if k in chain), OTHER)


def record_scopes(module: str) -> list[str]:
    """llm-profiler's scopes a module path belongs to, by name ('transformer' = all but
    lm_head; embedding, attn, mlp where a module on the path is of that kind)."""
    chain = kinds_along(module)
    if not chain:
        return []
    if LM_HEAD in chain:
        return [LM_HEAD]
    return ["transformer"] + [s for s, kind in SCOPE_KINDS.items() if kind in chain]
