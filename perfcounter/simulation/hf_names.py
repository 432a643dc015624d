"""transformers' module names on perfcounter's model: a layer mapping written for transformers'
Llama (as UPMEM's framework writes them) placed, unchanged, on perfcounter's Transformer.

    translate("model.layers.*.self_attn.o_proj")   # "layers.*.attention.wo"
    phases = split_qkv(phases, mapping)              # q_proj / k_proj / v_proj: wqkv split

perfcounter's model keeps gpt-fast's names. A mapping key in transformers' names reads as
ours (`translate`, segment by segment): q_proj, k_proj, v_proj -> wqkv (the fused
projection), o_proj -> wo, gate_proj -> w1, up_proj -> w3, down_proj -> w2, lm_head ->
output, embed_tokens -> tok_embeddings, self_attn -> attention, mlp -> feed_forward,
input_layernorm -> attention_norm, post_attention_layernorm -> ffn_norm, a leading `model.`
dropped (a path matches from any dot); classes <Arch>RMSNorm, <Arch>Attention, <Arch>MLP,
<Arch>DecoderLayer (Arch: Llama, Mistral, Mixtral, Qwen2) -> RMSNorm, Attention,
FeedForward, TransformerBlock. Only on our model (`is_ours`: a `wqkv` module); a
transformers model (--hf) has these names itself.

A mapping that names q_proj, k_proj or v_proj may put them on different devices: the fused
projection is then split (`split_qkv`) into three modules under it, `wqkv.q_proj`,
`wqkv.k_proj`, `wqkv.v_proj`, each with its output's share of the fused op's FLOPs and
bytes (q: n_head, k and v: n_kv_heads heads each, read from the attention's SDPA call), each
taking the projection's input, so that a part on another device receives it; on one device
the three cost what the fused op does.
"""
from __future__ import annotations

import dataclasses
import re

QKV = ("q_proj", "k_proj", "v_proj")
NAMES = {"q_proj": "wqkv", "k_proj": "wqkv", "v_proj": "wqkv", "o_proj": "wo",
         "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "lm_head": "output",
         "embed_tokens": "tok_embeddings", "self_attn": "attention", "mlp": "feed_forward",
         "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm"}
CLASSES = {"RMSNorm": "RMSNorm", "Attention": "Attention", "MLP": "FeedForward",
           "DecoderLayer": "TransformerBlock"}
_CLASS = re.compile(r"^(?:Llama|Mistral|Mixtral|Qwen2)(RMSNorm|Attention|MLP|DecoderLayer)$")
FUSED = "wqkv"


def is_ours(modules) -> bool:
    """Whether these modules (path, cls) are perfcounter's model: it has a fused wqkv."""
    return any(m.path.rsplit(".", 1)[-1] == FUSED for m in modules)


def names_qkv(keys) -> bool:
    """Whether a mapping's keys name q_proj, k_proj or v_proj (as a name or a path's leaf)."""
    return any(re.split(r"[.]", k)[-1] in QKV for k in keys)


def translate(key: str, split: bool = False) -> str:
    """A mapping key in our names (the module doc); `split`: q/k/v name the parts of a
    split wqkv (wqkv.q_proj) rather than the fused projection."""
    hit = _CLASS.match(key)
    if hit:
        return CLASSES[hit.group(1)]
    parts = key.split(".")
    if len(parts) > 1 and parts[0] == "model":
        parts = parts[1:]
    out = []
    for part in parts:
        if part in QKV and split:
            out += [FUSED, part] if len(parts) > 1 else [part]
        else:
            out.append(NAMES.get(part, part))
    return ".".join(out)


def qkv_shares(trace, attention: str) -> tuple[float, float, float]:
    """The q, k and v shares of a fused projection's output: n_head : n_kv : n_kv, from the
    SDPA call under `attention` (its q [B, H, S, D] and k [B, H_kv, S, D]); None where
    the trace holds none."""
    for r in trace.records:
        if r.module.startswith(attention) and "scaled_dot_product" in r.op and len(r.args) >= 2:
            q, k = (getattr(a, "shape", None) for a in r.args[:2])
            if q and k and len(q) == len(k) == 4:
                total = q[1] * q[3] + 2 * k[1] * k[3]
                return q[1] * q[3] / total, k[1] * k[3] / total, k[1] * k[3] / total
    return None


def _parts(value: int, shares) -> list[int]:
    """`value` split by `shares`, whole numbers adding up to it."""
    first = [round(value * s) for s in shares[:-1]]
    return [*first, value - sum(first)]


def _split_record(r, path: str, shares) -> list:
    out = []
    for i, name in enumerate(QKV):
        def cut(values):
            return [_parts(v, shares)[i] for v in values]
        out.append(dataclasses.replace(
            r, module=f"{path}.{name}", flops=_parts(r.flops, shares)[i],
            executed_flops=_parts(r.executed_flops, shares)[i], kinds=cut(r.kinds),
            read=cut(r.read), written=cut(r.written), segment=0))
    return out


def split_trace(trace):
    """`trace` with each fused wqkv split into q_proj, k_proj and v_proj modules (the module
    doc); unchanged where it holds no wqkv or no SDPA call to read the heads from."""
    fused = {m.path for m in trace.modules if m.path.rsplit(".", 1)[-1] == FUSED}
    shares = {p: qkv_shares(trace, p.rsplit(".", 1)[0]) for p in fused}
    shares = {p: s for p, s in shares.items() if s is not None}
    if not shares:
        return trace
    records = []
    for r in trace.records:
        records += _split_record(r, r.module, shares[r.module]) if r.module in shares else [r]
    modules = []
    for m in trace.modules:
        if m.path not in shares:
            modules.append(m)
            continue
        s, parts = shares[m.path], [f"{m.path}.{name}" for name in QKV]
        modules.append(dataclasses.replace(m, params=0, param_bytes=0, children=parts))
        modules += [dataclasses.replace(
            m, path=part, params=_parts(m.params, s)[i], param_bytes=_parts(m.param_bytes, s)[i],
            output_bytes=_parts(m.output_bytes, s)[i], children=[])
            for i, part in enumerate(parts)]
    return dataclasses.replace(trace, records=records, modules=modules)


def split_modules(modules) -> list:
    """Modules (path, cls) as split_trace lists them: each wqkv followed by its three parts."""
    out = []
    for m in modules:
        out.append(m)
        if m.path.rsplit(".", 1)[-1] == FUSED:
            out += [dataclasses.replace(m, path=f"{m.path}.{name}") if dataclasses.is_dataclass(m)
                    else type(m)(f"{m.path}.{name}", m.cls) for name in QKV]
    return out


def split_qkv(phases: dict, keys) -> dict:
    """{label: (trace, tokens)} with wqkv split where the mapping's `keys` name q_proj,
    k_proj or v_proj and the traces are of our model; else as given."""
    if not names_qkv(keys) or not any(is_ours(t.modules) for t, _ in phases.values()):
        return phases
    return {label: (split_trace(trace), tokens) for label, (trace, tokens) in phases.items()}

