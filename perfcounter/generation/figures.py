"""The figures derivation does integer arithmetic on, by name.

`Figures`: one record's calls, FLOPs, executed FLOPs, primitive counts (by KINDS) and
bytes read and written (by ROLES). `PhaseFigures`: what a phase holds that its records
cannot (compulsory bytes read and written by ROLES, valid KV-cache bytes read, fused IO
read and written by ROLES). Both
add, subtract, scale, step along a line (`at.along(slope, d)` = at + slope·d) and give
the integer slope between two of them (`slope_to`, DeriveError when there is none);
`values()` lists every number in field order (a message, a least-squares row) and
`from_values` reads such a list back.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfcounter.trace import KINDS, ROLES, OpRecord, Trace

_NO_KINDS, _NO_ROLES = (0,) * len(KINDS), (0,) * len(ROLES)


class DeriveError(ValueError):
    """A count that cannot be derived (the counts do not follow the model): count it."""


class _Arithmetic:
    """Field-wise integer arithmetic over a slots dataclass of ints and tuples of ints."""

    __slots__ = ()

    def _parts(self) -> list:
        return [getattr(self, name) for name in self.__slots__]

    def along(self, slope, d: int):
        """self + slope·d."""
        return type(self)(*[tuple([a + s * d for a, s in zip(v, w)]) if type(v) is tuple
                            else v + w * d for v, w in zip(self._parts(), slope._parts())])

    def plus(self, other):
        return self.along(other, 1)

    def minus(self, other):
        return self.along(other, -1)

    def scaled(self, n: int):
        return type(self)(*[tuple([a * n for a in v]) if type(v) is tuple else v * n
                            for v in self._parts()])

    def slope_to(self, other, dx: int):
        """The integer slope from self to other over dx steps; DeriveError when a figure
        does not move by a multiple of dx."""
        def step(u, v):
            if (v - u) % dx:
                raise DeriveError(f"a figure goes from {u} to {v} over {dx} steps: no integer slope")
            return (v - u) // dx
        return type(self)(*[tuple(map(step, v, w)) if type(v) is tuple else step(v, w)
                            for v, w in zip(self._parts(), other._parts())])

    def values(self) -> list:
        out = []
        for v in self._parts():
            if type(v) is tuple:
                out += v
            else:
                out.append(v)
        return out

    @classmethod
    def from_values(cls, values):
        """The figures a `values()` list holds (any numbers: numpy rows too)."""
        it, zero = iter(values), cls()
        return cls(*[tuple(next(it) for _ in v) if type(v) is tuple else next(it)
                     for v in (getattr(zero, n) for n in cls.__slots__)])

    def lowest(self):
        return min(self.values())

    def nonzero(self) -> bool:
        return any(self.values())


@dataclass(frozen=True, slots=True)
class Figures(_Arithmetic):
    """One record's figures (see the module doc)."""

    calls: int = 0
    flops: int = 0
    executed_flops: int = 0
    kinds: tuple[int, ...] = _NO_KINDS
    read: tuple[int, ...] = _NO_ROLES  # bytes, by ROLES
    written: tuple[int, ...] = _NO_ROLES

    @classmethod
    def of(cls, r: OpRecord) -> Figures:
        return cls(r.calls, r.flops, r.executed_flops, tuple(r.kinds), tuple(r.read),
                   tuple(r.written))

    def along(self, slope: Figures, d: int) -> Figures:  # the hot one, written out
        """self + slope·d."""
        return Figures(self.calls + slope.calls * d, self.flops + slope.flops * d,
                       self.executed_flops + slope.executed_flops * d,
                       tuple([a + s * d for a, s in zip(self.kinds, slope.kinds)]),
                       tuple([a + s * d for a, s in zip(self.read, slope.read)]),
                       tuple([a + s * d for a, s in zip(self.written, slope.written)]))

    def record(self, op: str, module: str, dtype: str, args: tuple, has_formula: bool,
               segment: int) -> OpRecord:
        return OpRecord(op, module, dtype, args, self.calls, self.flops, self.executed_flops,
                        list(self.kinds), list(self.read), list(self.written), has_formula,
                        segment)


@dataclass(frozen=True, slots=True)
class PhaseFigures(_Arithmetic):
    """A phase's figures that records cannot hold (see the module doc)."""

    compulsory_read: tuple[int, ...] = _NO_ROLES  # bytes, by ROLES
    compulsory_written: tuple[int, ...] = _NO_ROLES
    kv_cache_valid_read: int = 0
    fused_read: tuple[int, ...] = _NO_ROLES  # bytes, by ROLES (Trace.fused_read)
    fused_written: tuple[int, ...] = _NO_ROLES

    @classmethod
    def of(cls, t: Trace) -> PhaseFigures:
        return cls(tuple(t.compulsory_read), tuple(t.compulsory_written), t.kv_cache_valid_read,
                   tuple(t.fused_read), tuple(t.fused_written))

    def trace_fields(self) -> dict:
        """Trace(**...) keywords."""
        return {"compulsory_read": list(self.compulsory_read),
                "compulsory_written": list(self.compulsory_written),
                "kv_cache_valid_read": self.kv_cache_valid_read,
                "fused_read": list(self.fused_read), "fused_written": list(self.fused_written)}
