"""generation/figures.py: a record's and a phase's figures by name, and the integer
arithmetic derivation does on them; every expected number by hand."""
import pytest

from perfcounter.generation.figures import DeriveError, Figures, PhaseFigures
from perfcounter.trace import OpRecord, Trace
from perfcounter.trace_args import contiguous


def test_figures_of_a_record_and_back():
    r = OpRecord("aten.mm.default", "M", "float32", (contiguous((1, 8)), contiguous((8, 8))),
                 2, 256, 256, [128, 128, 0, 0, 0, 0, 0], [512, 0, 64, 0, 0], [0, 0, 64, 0, 0])
    f = Figures.of(r)
    assert (f.calls, f.flops, f.read, f.written) == (2, 256, (512, 0, 64, 0, 0), (0, 0, 64, 0, 0))
    assert f.record(r.op, r.module, r.dtype, r.args, True, 0) == r
    assert Figures.from_values(f.values()) == f and len(f.values()) == 3 + 7 + 2 * 5


def test_arithmetic_by_name():
    a = Figures(1, 10, 8, (5,) * 7, (4, 0, 2, 0, 0), (0, 0, 2, 0, 0))
    b = Figures(1, 12, 8, (6,) * 7, (4, 0, 4, 0, 0), (0, 0, 2, 0, 0))
    with pytest.raises(DeriveError, match="from 5 to 6 over 2 steps"):  # kinds: 1/2 a step
        a.slope_to(b, 2)
    slope = a.slope_to(b, 1)
    assert slope == Figures(0, 2, 0, (1,) * 7, (0, 0, 2, 0, 0), (0,) * 5)
    assert a.along(slope, 3) == Figures(1, 16, 8, (8,) * 7, (4, 0, 8, 0, 0), (0, 0, 2, 0, 0))
    assert a.plus(b).minus(b) == a and a.scaled(3).flops == 30
    assert a.minus(b).lowest() == -2 and Figures().nonzero() is False


def test_phase_figures_fill_a_trace():
    t = Trace(compulsory_read=[1, 2, 3, 4, 5], compulsory_written=[0, 0, 6, 0, 0],
              kv_cache_valid_read=7, fused_read=[0, 1, 2, 3, 0], fused_written=[0, 4, 5, 0, 0])
    p = PhaseFigures.of(t)
    assert p.scaled(2).trace_fields() == {"compulsory_read": [2, 4, 6, 8, 10],
                                          "compulsory_written": [0, 0, 12, 0, 0],
                                          "kv_cache_valid_read": 14,
                                          "fused_read": [0, 2, 4, 6, 0],
                                          "fused_written": [0, 8, 10, 0, 0]}
