"""A step table's counts with perfcounter's fused q/k/v projection split, as simulate splits it.

A mapping in transformers' names may put q_proj, k_proj and v_proj on different devices
(simulation/hf_names.py). simulate then splits each fused `wqkv` record into three records
under it (`wqkv.q_proj`, `wqkv.k_proj`, `wqkv.v_proj`): each keeps the fused op's calls (a
kernel of its own) and takes its output's share of every other figure (FLOPs, bytes by
role), q n_head and k, v n_local_heads heads each, read from the attention's SDPA call
(hf_names.qkv_shares). `split_counts(counts)` is the step table's counts split the same way:
each wqkv group becomes three groups, its coefficients (calls but) times the part's share,
its counted traces split by hf_names.split_trace, so that a placement prices each part on the
device that ran it. The whole model's compulsory bytes and fused IO are the step's, unsplit.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from perfcounter.generation.figures import Figures as RecordFigures
from perfcounter.serve.steps import StepCounts, group_key
from perfcounter.simulation.hf_names import FUSED, QKV, qkv_shares, split_trace

# the figure column a part keeps whole, by its name in the record figures' order
_CALLS = RecordFigures.from_values(range(len(RecordFigures().values()))).calls


def fused_parents(where: dict) -> dict[str, set]:
    """{fused projection path: the devices its parts ran on} from a replay's
    {(module path, segment): device} (parts `...wqkv.q_proj`)."""
    out: dict[str, set] = {}
    for (path, _), device in where.items():
        parent, _, leaf = path.rpartition(".")
        if leaf in QKV and parent.rsplit(".", 1)[-1] == FUSED:
            out.setdefault(parent, set()).add(device)
    return out


def split_counts(counts: StepCounts) -> StepCounts:
    """`counts` with each wqkv group split into its q, k and v parts (the module doc)."""
    first = counts.fit_traces[0]
    keys, coef, layers, sample = [], [], [], {}
    for g, key in enumerate(counts.keys):
        r = counts.sample[key]
        if r.module.rsplit(".", 1)[-1] != FUSED:
            keys.append(key)
            coef.append(counts.coef[g])
            layers.append(counts.layers[g])
            sample[key] = r
            continue
        shares = qkv_shares(first, r.module.rsplit(".", 1)[0])
        for name, share in zip(QKV, shares):
            part = dataclasses.replace(r, module=f"{r.module}.{name}", segment=0)
            scaled = counts.coef[g] * share
            scaled[_CALLS] = counts.coef[g][_CALLS]  # each part a kernel of its own
            keys.append(group_key(part))
            coef.append(scaled)
            layers.append(counts.layers[g])
            sample[keys[-1]] = part
    return dataclasses.replace(counts, keys=keys, coef=np.stack(coef),
                               layers=np.array(layers, float), sample=sample,
                               fit_traces=[split_trace(t) for t in counts.fit_traces])
