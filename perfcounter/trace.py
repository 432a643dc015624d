"""What counting produces: plain data, no torch state.

The dispatch mode (mode.py) aggregates every aten op it sees into `OpRecord`s,
one per (op, module, dtype, shape signature). A `Trace` is the records of one
phase plus the per-phase figures that cannot be summed op by op (compulsory
IO, which counts each storage once). Everything downstream — stats, roofline,
energy, reports — reads a Trace, so a phase can be re-costed for any device
without running the model again.

Conventions (see DESIGN.md):
- flops: 2 per multiply-accumulate (torch.utils.flop_counter); dense attention.
- executed_flops: what the kernel really computes (causal kernels skip masked
  blocks); equals flops for every other op. The roofline uses this one.
- kinds: primitive counts by KINDS (a matmul is M·N·K mul + M·N·K add).
- read / written: bytes by ROLES, the region each op touches (numel·itemsize).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfcounter._util import did_you_mean

KINDS = ("add", "mul", "div", "sqrt", "exp", "special", "cmp")
ROLES = ("weight", "kv_cache", "activation", "input")
IO_MODELS = ("per_op", "compulsory")


def check_io_model(io_model) -> str:
    """io_model itself when it is one of IO_MODELS; else a ValueError naming the valid ones."""
    if io_model not in IO_MODELS:
        raise ValueError(f"unknown io_model {io_model!r}; valid: {', '.join(IO_MODELS)}"
                         f"{did_you_mean(io_model, IO_MODELS, n=1, quote=True)}")
    return io_model


def _zeros() -> list[int]:
    return [0, 0, 0, 0]


@dataclass(slots=True)
class OpRecord:
    """All calls of one op with one shape signature under one module.

    Every call aggregated here has the same FLOPs and the same byte count, so
    per-call figures are the totals divided by `calls`.
    """

    op: str  # "aten.mm.default"
    module: str  # innermost module path, "" outside any module
    dtype: str  # compute dtype of the op ("bfloat16"), "" when no tensor
    shapes: str  # shape signature "[6, 4096]x[4096, 4096]"
    calls: int = 0
    flops: int = 0
    executed_flops: int = 0
    kinds: list[int] = field(default_factory=lambda: [0] * len(KINDS))
    read: list[int] = field(default_factory=_zeros)  # bytes, by ROLES
    written: list[int] = field(default_factory=_zeros)  # bytes, by ROLES
    has_formula: bool = True

    @property
    def bytes(self) -> int:
        return sum(self.read) + sum(self.written)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.op, self.module, self.dtype, self.shapes)

    def add(self, other: "OpRecord") -> None:
        """Accumulate another record with the same key into this one."""
        self.calls += other.calls
        self.flops += other.flops
        self.executed_flops += other.executed_flops
        for i, v in enumerate(other.kinds):
            self.kinds[i] += v
        for i in range(len(ROLES)):
            self.read[i] += other.read[i]
            self.written[i] += other.written[i]

    def copy(self) -> "OpRecord":
        return OpRecord(self.op, self.module, self.dtype, self.shapes, self.calls,
                        self.flops, self.executed_flops, list(self.kinds),
                        list(self.read), list(self.written), self.has_formula)

    def to_dict(self) -> dict:
        return {
            "op": self.op, "module": self.module, "dtype": self.dtype,
            "shapes": self.shapes, "calls": self.calls, "flops": self.flops,
            "executed_flops": self.executed_flops,
            "kinds": dict(zip(KINDS, self.kinds)),
            "read": dict(zip(ROLES, self.read)),
            "written": dict(zip(ROLES, self.written)),
            "has_formula": self.has_formula,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "OpRecord":
        return cls(d["op"], d["module"], d["dtype"], d["shapes"], d["calls"],
                   d["flops"], d["executed_flops"],
                   [d["kinds"][k] for k in KINDS],
                   [d["read"][r] for r in ROLES],
                   [d["written"][r] for r in ROLES], d["has_formula"])


@dataclass(slots=True)
class ModuleInfo:
    """One module that ran in a phase (modules are listed in the order they first ran).

    path is the module's full name as records carry it ("LlamaForCausalLM.model.layers.0.mlp");
    only modules no deeper than the counter's depth are listed. params / param_bytes: the
    parameters the module owns itself (not its children's). input_shapes / input_bytes: its
    first call's tensor arguments (positional, then keyword), and the bytes of the first one
    (the layer's input x, what a transfer point sends); output_bytes: the bytes of the first
    tensor it returned (per call)."""

    path: str
    cls: str
    calls: int = 0
    params: int = 0
    param_bytes: int = 0
    input_shapes: str = ""
    input_bytes: int = 0
    output_bytes: int = 0

    def to_dict(self) -> dict:
        return {"path": self.path, "cls": self.cls, "calls": self.calls, "params": self.params,
                "param_bytes": self.param_bytes, "input_shapes": self.input_shapes,
                "input_bytes": self.input_bytes, "output_bytes": self.output_bytes}

    @classmethod
    def from_dict(cls, d: dict) -> "ModuleInfo":
        return cls(d["path"], d["cls"], d["calls"], d["params"], d["param_bytes"],
                   d["input_shapes"], d["input_bytes"], d.get("output_bytes", 0))


def merge_modules(a: list[ModuleInfo], b: list[ModuleInfo]) -> list[ModuleInfo]:
    """a then b's new modules, in first-run order; calls of a module in both are summed."""
    out = {m.path: ModuleInfo(**m.to_dict()) for m in a}
    for m in b:
        if m.path in out:
            out[m.path].calls += m.calls
        else:
            out[m.path] = ModuleInfo(**m.to_dict())
    return list(out.values())


@dataclass
class Trace:
    """One phase's records plus its whole-phase figures.

    compulsory_read / compulsory_written: bytes by ROLES when each distinct
    storage region is read at most once and written at most once in the phase
    (the lower bound perfect fusion reaches). kv_cache_valid_read: bytes of KV
    cache holding valid positions that attention read (a static cache is read
    whole as executed; this is the part that mattered). steps: how many count
    blocks were accumulated into this trace.
    """

    records: list[OpRecord] = field(default_factory=list)
    compulsory_read: list[int] = field(default_factory=_zeros)
    compulsory_written: list[int] = field(default_factory=_zeros)
    kv_cache_valid_read: int = 0
    uncounted_ops: dict[str, int] = field(default_factory=dict)  # op -> calls
    steps: int = 1
    overhead_s: float = 0.0  # time spent inside the counter's own bookkeeping
    modules: list[ModuleInfo] = field(default_factory=list)  # in the order they first ran

    # -- totals ------------------------------------------------------------
    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.records)

    @property
    def executed_flops(self) -> int:
        return sum(r.executed_flops for r in self.records)

    @property
    def per_op_read(self) -> list[int]:
        return [sum(r.read[i] for r in self.records) for i in range(len(ROLES))]

    @property
    def per_op_written(self) -> list[int]:
        return [sum(r.written[i] for r in self.records) for i in range(len(ROLES))]

    @property
    def per_op_bytes(self) -> int:
        return sum(r.bytes for r in self.records)

    @property
    def compulsory_bytes(self) -> int:
        return sum(self.compulsory_read) + sum(self.compulsory_written)

    @property
    def kinds(self) -> dict[str, int]:
        return {k: sum(r.kinds[i] for r in self.records) for i, k in enumerate(KINDS)}

    @property
    def coverage(self) -> tuple[float, float]:
        """(share of bytes, share of op calls) that had a cost formula."""
        total_b = self.per_op_bytes
        total_c = sum(r.calls for r in self.records)
        ok_b = sum(r.bytes for r in self.records if r.has_formula)
        ok_c = sum(r.calls for r in self.records if r.has_formula)
        return (ok_b / total_b if total_b else 1.0, ok_c / total_c if total_c else 1.0)

    # -- accumulation --------------------------------------------------------
    def merge(self, other: "Trace") -> "Trace":
        """A new trace with both phases' numbers summed (a repeated label)."""
        by_key = {r.key: r.copy() for r in self.records}
        for r in other.records:
            if r.key in by_key:
                by_key[r.key].add(r)
            else:
                by_key[r.key] = r.copy()
        uncounted = dict(self.uncounted_ops)
        for op, n in other.uncounted_ops.items():
            uncounted[op] = uncounted.get(op, 0) + n
        return Trace(
            records=list(by_key.values()),
            compulsory_read=[a + b for a, b in zip(self.compulsory_read, other.compulsory_read)],
            compulsory_written=[a + b for a, b in zip(self.compulsory_written, other.compulsory_written)],
            kv_cache_valid_read=self.kv_cache_valid_read + other.kv_cache_valid_read,
            uncounted_ops=uncounted,
            steps=self.steps + other.steps,
            overhead_s=self.overhead_s + other.overhead_s,
            modules=merge_modules(self.modules, other.modules),
        )

    def to_dict(self) -> dict:
        return {
            "records": [r.to_dict() for r in self.records],
            "compulsory_read": dict(zip(ROLES, self.compulsory_read)),
            "compulsory_written": dict(zip(ROLES, self.compulsory_written)),
            "kv_cache_valid_read": self.kv_cache_valid_read,
            "uncounted_ops": dict(self.uncounted_ops),
            "steps": self.steps,
            "overhead_s": self.overhead_s,
            "modules": [m.to_dict() for m in self.modules],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        return cls(
            records=[OpRecord.from_dict(r) for r in d["records"]],
            compulsory_read=[d["compulsory_read"][r] for r in ROLES],
            compulsory_written=[d["compulsory_written"][r] for r in ROLES],
            kv_cache_valid_read=d["kv_cache_valid_read"],
            uncounted_ops=dict(d["uncounted_ops"]),
            steps=d["steps"],
            overhead_s=d["overhead_s"],
            modules=[ModuleInfo.from_dict(m) for m in d.get("modules", [])],
        )
