"""What counting produces: plain data, no torch state.

The dispatch mode (mode.py) logs every aten op it sees into a `Block`;
`build_trace` aggregates one or more blocks into `OpRecord`s, one per (op,
module, segment, dtype, arguments: shapes, strides, dtypes). A `Trace` is the records of one
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
- segment: where in its module's forward the op ran: k = after the module's k-th
  child call returned (0: before any); with `ModuleInfo.children` it gives the
  time order of one forward (simulate.py places a parent's own ops with it).
"""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

from perfcounter import trace_args
from perfcounter._util import PerfcounterWarning, did_you_mean
from perfcounter.trace_args import args_from_text  # also importable from here, its old home

KINDS = ("add", "mul", "div", "sqrt", "exp", "special", "cmp")
ROLES = ("weight", "kv_cache", "activation", "input", "buffer")
IO_MODELS = ("per_op", "compulsory")


def check_io_model(io_model) -> str:
    """io_model itself when it is one of IO_MODELS; else a ValueError naming the valid ones."""
    if io_model not in IO_MODELS:
        raise ValueError(f"unknown io_model {io_model!r}; valid: {', '.join(IO_MODELS)}"
                         f"{did_you_mean(io_model, IO_MODELS, n=1, quote=True)}")
    return io_model


def _zeros() -> list[int]:
    return [0] * len(ROLES)


def _by_role(d: dict) -> list[int]:
    """A {role: bytes} dict as a list by ROLES (a role added since a file was written: 0)."""
    return [d.get(r, 0) for r in ROLES]


@dataclass(slots=True)
class OpRecord:
    """All calls of one op with one argument signature under one module.

    Every call aggregated here has the same FLOPs and the same byte count, so
    per-call figures are the totals divided by `calls`. args: the op's arguments as
    data (trace_args.py: each tensor's shape, stride and dtype, scalars as values);
    `shapes` is their display text, derived from args. The key holds both: records
    whose text is equal but whose strides differ stay apart (NB: pricing needs it: an
    elementwise op on a stride-2 view runs 1.6-4.2x its stride-blind prediction, and
    op_bench times each record on tensors of its own strides); the text keeps scalars
    of equal value but another type apart (1, 1.0, True).
    """

    op: str  # "aten.mm.default"
    module: str  # innermost module path, "" outside any module
    dtype: str  # compute dtype of the op ("bfloat16"), "" when no tensor
    args: tuple = ()  # (TensorArg((6, 4096), (4096, 1), "bfloat16"), TensorArg(...)); () views
    calls: int = 0
    flops: int = 0
    executed_flops: int = 0
    kinds: list[int] = field(default_factory=lambda: [0] * len(KINDS))
    read: list[int] = field(default_factory=_zeros)  # bytes, by ROLES
    written: list[int] = field(default_factory=_zeros)  # bytes, by ROLES
    has_formula: bool = True
    segment: int = 0  # see the module doc
    _text: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def shapes(self) -> str:
        """The display text of args ("[6, 4096], [4096, 4096]"): reports, JSON, grouping."""
        if self._text is None:
            self._text = trace_args.signature(self.args)
        return self._text

    @property
    def bytes(self) -> int:
        return sum(self.read) + sum(self.written)

    @property
    def key(self) -> tuple[str, str, int, str, str, tuple]:
        return (self.op, self.module, self.segment, self.dtype, self.shapes, self.args)

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
        out = OpRecord(self.op, self.module, self.dtype, self.args, self.calls,
                       self.flops, self.executed_flops, list(self.kinds),
                       list(self.read), list(self.written), self.has_formula, self.segment)
        out._text = self._text
        return out

    def to_dict(self) -> dict:
        return {
            "op": self.op, "module": self.module, "dtype": self.dtype,
            "shapes": self.shapes, "args": trace_args.to_json(self.args), "calls": self.calls,
            "flops": self.flops, "executed_flops": self.executed_flops,
            "kinds": dict(zip(KINDS, self.kinds)),
            "read": dict(zip(ROLES, self.read)),
            "written": dict(zip(ROLES, self.written)),
            "has_formula": self.has_formula,
            "segment": self.segment,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "OpRecord":
        args = trace_args.from_json(d["args"]) if "args" in d else args_from_text(d["shapes"], d["dtype"])
        return cls(d["op"], d["module"], d["dtype"], args, d["calls"],
                   d["flops"], d["executed_flops"],
                   [d["kinds"][k] for k in KINDS],
                   _by_role(d["read"]), _by_role(d["written"]), d["has_formula"],
                   d.get("segment", 0))


@dataclass(slots=True)
class ModuleInfo:
    """One module that ran in a phase (modules are listed in the order they first ran).

    path is the module's full name as records carry it ("LlamaForCausalLM.model.layers.0.mlp");
    only modules no deeper than the counter's depth are listed. params / param_bytes: the
    parameters the module owns itself (not its children's). input_shapes / input_bytes: the
    shape and bytes of its first call's input x (its first tensor argument, positional
    before keyword: what a transfer point sends); output_bytes: the bytes of the first
    tensor it returned (per call). children: the paths of the listed modules it called
    during its first call, in call order (a module called twice appears twice)."""

    path: str
    cls: str
    calls: int = 0
    params: int = 0
    param_bytes: int = 0
    input_shapes: str = ""
    input_bytes: int = 0
    output_bytes: int = 0
    children: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"path": self.path, "cls": self.cls, "calls": self.calls, "params": self.params,
                "param_bytes": self.param_bytes, "input_shapes": self.input_shapes,
                "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
                "children": list(self.children)}

    @classmethod
    def from_dict(cls, d: dict) -> "ModuleInfo":
        return cls(d["path"], d["cls"], d["calls"], d["params"], d["param_bytes"],
                   d["input_shapes"], d["input_bytes"], d.get("output_bytes", 0),
                   list(d.get("children", [])))


def merge_modules(*lists: list[ModuleInfo]) -> list[ModuleInfo]:
    """The modules of several phases or blocks, in first-run order (a module's first
    sighting describes it); calls of a module seen in several are summed."""
    out: dict[str, ModuleInfo] = {}
    for modules in lists:
        for m in modules:
            seen = out.get(m.path)
            if seen is None:
                out[m.path] = ModuleInfo(m.path, m.cls, m.calls, m.params, m.param_bytes,
                                         m.input_shapes, m.input_bytes, m.output_bytes,
                                         list(m.children))
            else:
                seen.calls += m.calls
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

    fused_read / fused_written: bytes by ROLES that a compiled program moves outside its
    matmul and attention kernels (counting/storage.py's fused IO: what crosses a fused
    kernel's boundary, intermediates kept in registers). All zero in a file written before
    they were counted; pricing then falls back on compulsory bytes (pricing/predict.py).
    """

    records: list[OpRecord] = field(default_factory=list)
    compulsory_read: list[int] = field(default_factory=_zeros)
    compulsory_written: list[int] = field(default_factory=_zeros)
    kv_cache_valid_read: int = 0
    uncounted_ops: dict[str, int] = field(default_factory=dict)  # op -> calls
    steps: int = 1
    overhead_s: float = 0.0  # time spent inside the counter's own bookkeeping
    modules: list[ModuleInfo] = field(default_factory=list)  # in the order they first ran
    fused_read: list[int] = field(default_factory=_zeros)
    fused_written: list[int] = field(default_factory=_zeros)

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
    def fused_bytes(self) -> int:
        return sum(self.fused_read) + sum(self.fused_written)

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
            fused_read=[a + b for a, b in zip(self.fused_read, other.fused_read)],
            fused_written=[a + b for a, b in zip(self.fused_written, other.fused_written)],
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
            "fused_read": dict(zip(ROLES, self.fused_read)),
            "fused_written": dict(zip(ROLES, self.fused_written)),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        return cls(
            records=[OpRecord.from_dict(r) for r in d["records"]],
            compulsory_read=_by_role(d["compulsory_read"]),
            compulsory_written=_by_role(d["compulsory_written"]),
            kv_cache_valid_read=d["kv_cache_valid_read"],
            uncounted_ops=dict(d["uncounted_ops"]),
            steps=d["steps"],
            overhead_s=d["overhead_s"],
            modules=[ModuleInfo.from_dict(m) for m in d.get("modules", [])],
            fused_read=_by_role(d.get("fused_read", {})),
            fused_written=_by_role(d.get("fused_written", {})),
        )


@dataclass(slots=True)
class Block:
    """One counted block, raw: built into a Trace only when someone asks.

    log: one (scope, plan, roles) per counted call, where scope is (module, segment) and
    plan an op_plan.OpPlan; views: one (scope, op name) per view call; compulsory: the
    block's storage.Compulsory state (its `totals()` are bytes by ROLES; its `fused_read`
    and `fused_written` the fused IO by ROLES)."""

    log: list
    views: list
    compulsory: object
    kv_valid_read: int
    overhead_s: float
    modules: list[ModuleInfo]


_WARNED: set[str] = set()


def build_trace(blocks: list[Block]) -> Trace:
    """One Trace from one or more blocks (steps = len(blocks)): calls are counted before
    records are built, so a phase of many decode steps is built once."""
    calls, views = Counter(), Counter()
    for b in blocks:
        calls.update(b.log)
        views.update(b.views)
    records: dict[tuple, OpRecord] = {}
    uncounted: dict[str, int] = {}
    for ((module, segment), plan, roles), n in calls.items():
        key = (plan.name, module, segment, plan.dtype, plan.shapes, plan.args)  # OpRecord.key
        rec = records.get(key)
        if rec is None:
            rec = records[key] = OpRecord(plan.name, module, plan.dtype, plan.args,
                                          has_formula=plan.has_formula, segment=segment)
        rec.calls += n
        rec.flops += n * plan.flops
        rec.executed_flops += n * plan.executed_flops
        for i, c in enumerate(plan.cost.kinds):
            if c:
                rec.kinds[i] += n * c
        read, written = plan.contribution(roles)
        for i in range(len(ROLES)):
            rec.read[i] += n * read[i]
            rec.written[i] += n * written[i]
        if not plan.has_formula:
            uncounted[plan.name] = uncounted.get(plan.name, 0) + n
    for ((module, segment), name), n in views.items():
        key = (name, module, segment, "", "", ())
        rec = records.get(key) or records.setdefault(key, OpRecord(name, module, "", (),
                                                                   segment=segment))
        rec.calls += n
    for name in uncounted:
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"perfcounter: no cost formula for {name}; its bytes are counted, "
                          f"its FLOPs are not (listed in uncounted_ops)", PerfcounterWarning, stacklevel=3)
    read, written, fused_read, fused_written = _zeros(), _zeros(), _zeros(), _zeros()
    modules = merge_modules(*(b.modules for b in blocks))
    for m in modules:  # the tracker keeps shapes raw (torch.Size tuples): written out once here
        if not isinstance(m.input_shapes, str):
            m.input_shapes = "x".join(str(list(s)) for s in m.input_shapes)
    for b in blocks:
        r, w = b.compulsory.totals()
        read = [x + y for x, y in zip(read, r)]
        written = [x + y for x, y in zip(written, w)]
        fused_read = [x + y for x, y in zip(fused_read, b.compulsory.fused_read)]
        fused_written = [x + y for x, y in zip(fused_written, b.compulsory.fused_written)]
    return Trace(records=list(records.values()), compulsory_read=read, compulsory_written=written,
                 kv_cache_valid_read=sum(b.kv_valid_read for b in blocks), uncounted_ops=uncounted,
                 steps=len(blocks), overhead_s=sum(b.overhead_s for b in blocks), modules=modules,
                 fused_read=fused_read, fused_written=fused_written)


def op_packet(op: str) -> str:
    """'aten.mm.default' -> 'aten.mm' (the name without its overload)."""
    parts = op.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else op
