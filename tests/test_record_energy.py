"""pricing/energy.record_energies: the one place a record's energy is priced (the phase's
compute energy, the plots' bars, the simulator's steps and the serving steps sum it).

Figures of UPMEM's PIM-AI 4chip: 0.4 pJ/FLOP (bfloat16), memory 0.95 pJ/bit."""
from typing import NamedTuple

import pytest
import torch

from perfcounter.devices import DeviceSpec
from perfcounter.pricing.energy import compute_energy_j, record_energies
from perfcounter.trace import Trace

FIGURES = dict(device_type="pim", bandwidth=409.6e9, flops_per_s=20e12, dtype=torch.bfloat16)


class Rec(NamedTuple):  # what record_energies reads of an OpRecord
    executed_flops: int
    dtype: str
    bytes: int


RECORDS = [Rec(16_384, "bfloat16", 16_768), Rec(0, "int64", 64)]


def test_record_energies_by_hand():
    spec = DeviceSpec(name="pim", mem_pj_per_bit=0.95, pj_per_flop_by_dtype={"bfloat16": 0.4},
                      **FIGURES)
    mm, index = record_energies(RECORDS, spec)
    assert mm.compute_pj == pytest.approx(6_553.6)  # 16,384 FLOPs * 0.4 pJ
    assert mm.memory_pj == pytest.approx(127_436.8)  # 16,768 B * 8 * 0.95 pJ/bit
    assert mm.compute_j == pytest.approx(6_553.6e-12)
    assert index.compute_pj == 0.0  # no FLOPs: 0 pJ, whatever its dtype
    assert index.memory_pj == pytest.approx(486.4)  # 64 B * 8 * 0.95 pJ/bit
    assert compute_energy_j(Trace(records=RECORDS), spec) == pytest.approx(6_553.6e-12)


def test_a_figure_the_spec_lacks_is_none():
    spec = DeviceSpec(name="bare", **FIGURES)  # neither pJ/FLOP nor memory pJ/bit
    mm, index = record_energies(RECORDS, spec)
    assert mm.compute_pj is None and mm.compute_j is None and mm.memory_pj is None
    assert index.compute_pj == 0.0 and index.memory_j is None
    assert compute_energy_j(Trace(records=RECORDS), spec) is None
