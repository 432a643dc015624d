"""The step table's packing by name: counts.coef's columns (a record's figures, generation/
figures.py) become the pricing Figures' fields (pricing/figures.py) by their names, whatever
the order or number of KINDS and ROLES."""
import dataclasses

import numpy as np
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.generation.figures import Figures as RecordFigures
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.figures import Figures
from perfcounter.serve.pricing import RooflinePricer
from perfcounter.serve.steps import FEATURES, count_table
from perfcounter.serve.table import ROWS, StepTable, group_rows
from perfcounter.trace import ROLES

TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)
NFIG = len(RecordFigures().values())
# one distinct power of two a column: every sum of columns is distinct, so a figure read from a
# wrong column (or a sum missing or adding one) cannot come back equal
DISTINCT = RecordFigures.from_values([2.0 ** c for c in range(NFIG)])


def by_name(fig: RecordFigures) -> dict:
    """What the table's rows hold, from a record's figures by field name alone."""
    weight, kv = ROLES.index("weight"), ROLES.index("kv_cache")
    return {"calls": fig.calls, "flops": fig.flops, "executed_flops": fig.executed_flops,
            "bytes": sum(fig.read) + sum(fig.written), "streamed": fig.read[weight] + fig.read[kv],
            "link_bytes": sum(fig.written)}


def test_rows_are_pricing_figures_fields():
    fields = {f.name for f in dataclasses.fields(Figures)}
    assert set(ROWS) <= fields and len(set(ROWS)) == len(ROWS)


def test_group_rows_read_each_figure_by_name():
    # calls 1, FLOPs 2, executed 4, kinds 8 .. 2^(2 + KINDS), then read and written by ROLES:
    # bytes = the read and written columns' sum, streamed = read[weight] + read[kv_cache]
    coef = np.array(DISTINCT.values())[None, :, None]  # [1 group, figures, 1 feature]
    rows = group_rows(coef)
    assert rows.shape == (1, len(ROWS), 1)
    assert dict(zip(ROWS, rows[0, :, 0].tolist())) == by_name(DISTINCT)


@pytest.fixture(scope="module")
def distinct_counts():
    """TINY's counts with each group's figures at a step replaced by DISTINCT x (group + 1)."""
    counts = count_table(TINY, torch.bfloat16)
    coef = np.zeros_like(counts.coef)
    for g in range(coef.shape[0]):
        coef[g, :, FEATURES.index("step")] = np.array(DISTINCT.values()) * (g + 1)
    return dataclasses.replace(counts, coef=coef)


@pytest.mark.parametrize("share", [False, True], ids=["whole", "share"])
def test_a_step_table_gives_back_each_figure_by_name(distinct_counts, share):
    # a step of features (step 1, the rest 0): each group's figures are its coefficients
    # x its layers, through the table's matrix and figures(), the whole model's path and a
    # device's share (a placement's path) alike; the bound: no varlen kernel, one call a piece
    counts = distinct_counts
    spec = get_device_spec("h100-sxm", dtype=torch.bfloat16)
    table = StepTable(counts, RooflinePricer(spec), counts.repeats if share else None)
    assert table.whole is not share
    f = np.zeros(len(FEATURES))
    f[FEATURES.index("step")] = 1.0
    got = table.figures(f)
    assert isinstance(got, Figures) and len(got) == len(counts.keys)
    for g, layers in enumerate(counts.layers):
        want = by_name(RecordFigures.from_values(counts.coef[g, :, 0]))
        want = {k: v * layers for k, v in want.items()}
        want["link_bytes"] = want["link_bytes"] if got.collective[g] else 0.0  # no collective
        assert {name: float(getattr(got, name)[g]) for name in ROWS} == want, counts.keys[g]
