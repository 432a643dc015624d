"""DeviceSpec: what one device can do, as plain data (its errors and dtype names: dtypes.py).

A `DeviceSpec` holds memory bandwidth (B/s), peak FLOP/s per dtype (dense,
not sparse), memory size, and the energy figures the energy model needs (pJ
per bit of memory traffic, pJ per FLOP, host-link bandwidth and pJ/bit each
way, optional per-element costs of softmax / SiLU / RMSNorm). For placement
(simulate.py) it may also give a device<->device link and a tensor-parallel
interconnect (bandwidth one way, pJ/bit), the fraction of peak a real run
reaches (`peak_fraction`), and the conventions its figures follow (`profile`:
"upmem" for the UPMEM LLM framework's simulator profiles). Field names and
units of torchao's removed `DeviceSpec` are kept. `__post_init__` is the one
place where a figure is checked; a file reader learns which field was wrong
from `DeviceSpecError.field`.

Lookups by name (and the CUDA autodetecting `CUDADeviceSpec`) are in
`registry.py`; the YAML formats in `schema.py`.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields, replace

import torch

from perfcounter._util import PerfcounterWarning, did_you_mean
from perfcounter.devices.dtypes import (TF32, DeviceSpecError, UnknownDtypeError, as_dtype,
                                        dtype_name, rate_key)
from perfcounter.devices.op_keys import (  # noqa: F401 (re-exported: the names spec users import)
    CURVE_POINT, EFFICIENCY_CLASSES, EXECUTIONS, OP_CLASSES, OVERHEADS, ROW_DTYPES, row_key,
    row_table)

_warned: set[tuple[str, str, str]] = set()


def _warn_once(kind: str, spec: "DeviceSpec", dtype, used) -> None:
    key = (kind, str(spec.name), dtype_name(dtype))
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"device {spec.name!r} has no {kind} figure for {dtype_name(dtype)}; "
                      f"using its {dtype_name(used)} figure", PerfcounterWarning, stacklevel=3)


# ---------------------------------------------------------------- DeviceSpec

# figures that must be > 0, those that may be 0 (an energy figure), and fractions in (0, 1]
_POSITIVE = ("bandwidth", "flops_per_s", "vram", "roofline_balancepoint", "cache_bytes",
             "host_to_device_bw", "device_to_host_bw", "device_link_bw", "interconnect_bw",
             "node_link_bw", "gpus_per_node",
             "softmax_ns_per_element", "silu_ns_per_element", "rmsnorm_ns_per_element", "tdp_w",
             "flops_by_dtype",
             # energy of memory traffic and of a FLOP: never free (0 would print "0 J" silently)
             "mem_pj_per_bit", "pj_per_flop_by_dtype")
_NON_NEGATIVE = ("host_to_device_pj_per_bit", "device_to_host_pj_per_bit",
                 "device_link_pj_per_bit", "interconnect_pj_per_bit", "node_link_pj_per_bit",
                 "static_w", "idle_w",
                 "usd_per_hour")
_FRACTIONS = ("peak_fraction",)
_TABLES = ("flops_by_dtype", "pj_per_flop_by_dtype")
_EXPECTED = {"positive": "a positive number", "non-negative": "a non-negative number",
             "fraction": "a number in (0, 1]"}
# what `profile` may say: whose modelling conventions the figures follow
PROFILES = {"upmem": "a simulator profile of the UPMEM LLM framework (its defaults apply)"}
@dataclass(frozen=True)
class DeviceSpec:
    """One device: bandwidth in B/s, FLOP/s per dtype (dense), vram in B, energy figures.

    `flops_per_s` is the peak at `dtype` (the compute dtype); `flops_by_dtype`
    the peaks of every dtype the source gives. `roofline_balancepoint` is
    flops_per_s / bandwidth (FLOP/byte) unless given. Energy and link fields
    are None when unknown. `source` maps a field name to its citation.

    `device_link_bw` / `device_link_pj_per_bit`: the link this device uses to
    reach another non-host device (NVLink, ...), B/s one way; `interconnect_bw`
    / `interconnect_pj_per_bit`: the link within a tensor-parallel group of
    this device; `node_link_bw` / `node_link_pj_per_bit`: a device's link to another node
    (InfiniBand, one port a GPU), B/s one way, and `gpus_per_node` the devices one node
    holds (pricing/links.py: a group larger than a node talks over the node link).
    `peak_fraction`: achievable / peak, 0 < f <= 1, applied to
    FLOP/s and bandwidth by simulate(). `profile`: None, or a key of PROFILES.
    Prediction (predict.py): `op_overhead_s` per op call by execution (eager,
    compiled); `op_efficiency` achievable / peak by op class; `op_curves` measured
    rates by op class and dtype over working-set size (`perfcounter calibrate`);
    `cache_bytes` the last-level cache; `matmul_rows` {dtype: {rows M: FLOP/s}}: what
    a matmul of M rows achieves (measured by `perfcounter calibrate`; see
    predict.rows_flops): a few rows compute about as long as many.
    """

    device_type: str = "cuda"
    name: str | None = None
    bandwidth: float | None = None  # B/s
    flops_per_s: float | None = None  # FLOP/s at `dtype`
    vram: float | None = None  # bytes
    dtype: torch.dtype | None = None
    flops_by_dtype: dict = field(default_factory=dict)  # dtype -> FLOP/s, dense
    roofline_balancepoint: float | None = None  # FLOP/byte
    mem_pj_per_bit: float | None = None
    pj_per_flop_by_dtype: dict = field(default_factory=dict)  # dtype -> pJ/FLOP
    host_to_device_bw: float | None = None  # B/s
    host_to_device_pj_per_bit: float | None = None
    device_to_host_bw: float | None = None  # B/s
    device_to_host_pj_per_bit: float | None = None
    device_link_bw: float | None = None  # B/s, one way, to another non-host device
    device_link_pj_per_bit: float | None = None
    interconnect_bw: float | None = None  # B/s, one way, within a tensor-parallel group
    interconnect_pj_per_bit: float | None = None
    node_link_bw: float | None = None  # B/s, one way, to another node (one NIC port a device)
    node_link_pj_per_bit: float | None = None
    gpus_per_node: float | None = None  # devices one node holds (a whole number)
    peak_fraction: float | None = None  # achievable / peak, in (0, 1]
    softmax_ns_per_element: float | None = None
    silu_ns_per_element: float | None = None
    rmsnorm_ns_per_element: float | None = None
    tdp_w: float | None = None
    static_w: float | None = None  # W at all times, the dynamic energy model (pricing/power.py)
    idle_w: float | None = None  # W loaded and idle, clocks up: the power model (power.py)
    usd_per_hour: float | None = None  # US$ an hour of one device (a cloud list price)
    profile: str | None = None  # "upmem": one of the UPMEM framework's profiles
    op_overhead_s: dict = field(default_factory=dict)  # {execution: s per op call}
    op_efficiency: dict = field(default_factory=dict)  # {op class: achievable / peak}
    op_curves: dict = field(default_factory=dict)  # {op class: {dtype name: (CURVE_POINT, ...)}}
    cache_bytes: float | None = None  # last-level cache; a phase that fits runs warm
    matmul_rows: dict = field(default_factory=dict)  # {dtype name: {rows: FLOP/s}}
    calibration_check: dict = field(default_factory=dict)  # calibrate's checks (calibrate.py)
    source: dict = field(default_factory=dict)  # field name -> citation
    aliases: tuple = ()
    cuda_names: tuple = ()  # names or globs matched against torch.cuda.get_device_name()

    def __post_init__(self):
        put = object.__setattr__
        for name in _POSITIVE + _NON_NEGATIVE + _FRACTIONS:
            if name not in _TABLES:
                put(self, name, self._number(name, getattr(self, name)))
        if self.gpus_per_node is not None and self.gpus_per_node != int(self.gpus_per_node):
            raise DeviceSpecError(f"DeviceSpec {self._owner}: gpus_per_node must be a whole "
                                  f"number of devices, got {self.gpus_per_node!r}",
                                  field="gpus_per_node", expected="a whole number >= 1")
        if None not in (self.idle_w, self.tdp_w) and self.idle_w > self.tdp_w:
            raise DeviceSpecError(f"DeviceSpec {self._owner}: idle_W {self.idle_w:g} exceeds "
                                  f"tdp_W {self.tdp_w:g}", field="idle_w",
                                  expected=f"a number of W in [0, tdp_W = {self.tdp_w:g}]")
        if self.profile is not None:
            profile = self.profile.strip().lower() if isinstance(self.profile, str) else None
            if profile not in PROFILES:
                raise DeviceSpecError(f"DeviceSpec {self._owner}: unknown profile "
                                      f"{self.profile!r}{did_you_mean(profile or '', PROFILES)}"
                                      f" (valid: {', '.join(PROFILES)}, or None)",
                                      field="profile", expected=f"one of {', '.join(PROFILES)}")
            put(self, "profile", profile)
        dtype = None if self.dtype is None else as_dtype(self.dtype)
        if dtype == TF32:
            raise DeviceSpecError(f"DeviceSpec {self._owner}: dtype tf32 is float32 run on "
                                  "tensor cores; pass dtype=torch.float32 (CUDADeviceSpec "
                                  "use_tensorcores=True picks the tf32 rate)", field="dtype")
        flops = self._table("flops_by_dtype")
        if self.flops_per_s is not None and dtype is not None:
            flops.setdefault(rate_key(dtype), self.flops_per_s)
        if self.flops_per_s is None and dtype is not None and rate_key(dtype) in flops:
            put(self, "flops_per_s", flops[rate_key(dtype)])
        put(self, "dtype", dtype)
        put(self, "flops_by_dtype", flops)
        put(self, "pj_per_flop_by_dtype", self._table("pj_per_flop_by_dtype"))
        if self.roofline_balancepoint is None and self.flops_per_s and self.bandwidth:
            put(self, "roofline_balancepoint", self.flops_per_s / self.bandwidth)
        self._op_tables()
        put(self, "source", dict(self.source or {}))
        put(self, "aliases", tuple(self.aliases or ()))
        put(self, "cuda_names", tuple(self.cuda_names or ()))

    @property
    def _owner(self) -> str:
        return repr(self.name or "<unnamed>")

    def _number(self, name: str, value, dtype=None) -> float | None:
        """A figure as a float: None stays None; bools, strings, NaN, ±inf and
        values out of range (see _POSITIVE / _NON_NEGATIVE / _FRACTIONS) are refused."""
        if value is None:
            return None
        kind = "positive" if name in _POSITIVE else \
            "fraction" if name in _FRACTIONS else "non-negative"
        expected = _EXPECTED[kind]
        label = name if dtype is None else f"{name}[{dtype_name(dtype)}]"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} must be a number, "
                                  f"got {value!r}", field=name, dtype=dtype, expected=expected)
        number = float(value)
        bad = not math.isfinite(number) or number < 0 or (kind != "non-negative" and number == 0)
        if bad or (kind == "fraction" and number > 1):
            what = f"a {kind} finite number" if kind != "fraction" else expected
            raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} must be {what}, "
                                  f"got {value!r}", field=name, dtype=dtype, expected=expected)
        return number

    def _op_tables(self) -> None:
        """Check and normalize op_overhead_s, op_efficiency and op_curves (see predict.py):
        keys from OVERHEADS / OP_CLASSES, overheads >= 0, efficiencies in (0, 1], curve
        points CURVE_POINT of positive numbers, working sets increasing."""
        def check(table, name, keys, value):
            if not isinstance(table or {}, dict):
                raise DeviceSpecError(f"DeviceSpec {self._owner}: {name} must be a dict keyed "
                                      f"by {', '.join(keys)}, got {table!r:.60}", field=name)
            out = {}
            for key, v in (table or {}).items():
                if key not in keys:
                    raise DeviceSpecError(f"DeviceSpec {self._owner}: {name} has unknown key "
                                          f"{key!r}{did_you_mean(str(key), keys)} (valid: "
                                          f"{', '.join(keys)})", field=name)
                out[key] = value(f"{name}[{key}]", v)
            return out

        def number(kind):
            def read(label, v):
                bad = isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not math.isfinite(v) or v < 0 or (kind != "non-negative" and v == 0) \
                    or (kind == "fraction" and v > 1)
                if bad:
                    raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} must be "
                                          f"{_EXPECTED[kind]}, got {v!r}", field=label)
                return float(v)
            return read

        def curve(label, points):
            if not isinstance(points, (list, tuple)) or not points:
                raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} must be a non-empty "
                                      f"list of ({', '.join(CURVE_POINT)}), got {points!r:.60}",
                                      field=label)
            out = []
            for i, p in enumerate(points):
                if not isinstance(p, (list, tuple)) or len(p) != len(CURVE_POINT):
                    raise DeviceSpecError(f"DeviceSpec {self._owner}: {label}[{i}] must be "
                                          f"({', '.join(CURVE_POINT)}), got {p!r:.60}",
                                          field=label)
                out.append(tuple(number("positive")(f"{label}[{i}]", v) for v in p))
                if i and out[-1][0] <= out[-2][0]:
                    raise DeviceSpecError(f"DeviceSpec {self._owner}: {label}: working sets must "
                                          f"increase, got {out[-2][0]:g} then {out[-1][0]:g}",
                                          field=label)
            return tuple(out)

        def by_dtype(label, table):
            if not isinstance(table, dict) or not table:
                raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} must be a "
                                      f"{{dtype: points}} dict, got {table!r:.60}", field=label)
            return {dtype_name(as_dtype(d)): curve(f"{label}[{d}]", pts) for d, pts in table.items()}

        put = object.__setattr__
        put(self, "op_overhead_s", check(self.op_overhead_s, "op_overhead_s", OVERHEADS,
                                         number("non-negative")))
        put(self, "op_efficiency", check(self.op_efficiency, "op_efficiency",
                                         EFFICIENCY_CLASSES, number("fraction")))
        put(self, "op_curves", check(self.op_curves, "op_curves", OP_CLASSES, by_dtype))

        def by_rows(label, table):
            if not isinstance(table, dict) or not table:
                raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} must be a {{rows: "
                                      f"FLOP/s}} dict, got {table!r:.60}", field=label)
            out = {}
            for rows, v in table.items():
                n = int(rows) if isinstance(rows, str) and rows.isdigit() else rows  # JSON keys
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise DeviceSpecError(f"DeviceSpec {self._owner}: {label} rows must be "
                                          f"integers >= 1, got {rows!r}", field=label)
                out[n] = number("positive")(f"{label}[{rows}]", v)
            return dict(sorted(out.items()))

        rows = self.matmul_rows or {}
        if not isinstance(rows, dict):
            raise DeviceSpecError(f"DeviceSpec {self._owner}: matmul_rows must be a {{dtype: "
                                  f"{{rows: FLOP/s}}}} dict, got {rows!r:.60}",
                                  field="matmul_rows")
        put(self, "matmul_rows", {dtype_name(as_dtype(d)): by_rows(f"matmul_rows[{d}]", t)
                                  for d, t in rows.items()})

    def _table(self, name: str) -> dict:
        """A {dtype: figure} table keyed by rate_key, each figure checked."""
        table = getattr(self, name) or {}
        if not isinstance(table, dict):
            raise DeviceSpecError(f"DeviceSpec {self._owner}: {name} must be a "
                                  f"{{dtype: number}} dict, got {table!r}", field=name)
        out = {}
        for key, value in table.items():
            k = rate_key(key)
            if k in out:
                raise DeviceSpecError(f"DeviceSpec {self._owner}: {name} lists "
                                      f"{dtype_name(k)} twice", field=name)
            out[k] = self._number(name, value, k)
        return out

    def __hash__(self):
        return hash((type(self).__name__, self.device_type, self.name, self.dtype,
                     self.bandwidth, self.flops_per_s, self.vram))

    def __str__(self):
        def fmt(value, scale, unit):
            return "None" if value is None else f"{value / scale:,.1f}{unit}"
        return (f"DeviceSpec(device_type={self.device_type}, name={self.name}, "
                f"dtype={self.dtype}, bandwidth={fmt(self.bandwidth, 1e9, 'GB/s')}, "
                f"flops={fmt(self.flops_per_s, 1e12, 'TFLOPs')}, "
                f"vram={fmt(self.vram, 1e9, 'GB')})")

    def peak_flops(self, dtype=None, *, strict: bool = False) -> float:
        """Peak dense FLOP/s at `dtype` (a torch.dtype or a name such as "bf16").

        NB: all float8 variants share one rate, as do int4/uint4. At the spec's
        own dtype this is `flops_per_s` (an explicit constructor figure wins
        over the table). When the spec has no figure for `dtype`, the peak at
        the spec's compute dtype (`flops_per_s`) is returned and a warning is
        issued once per device and dtype; strict=True raises UnknownDtypeError.
        """
        if dtype is None and self.dtype is None:
            raise UnknownDtypeError(f"device {self.name!r} has no compute dtype; "
                                    "pass one to peak_flops(dtype)")
        key = rate_key(self.dtype if dtype is None else dtype)
        if self.dtype is not None and key == rate_key(self.dtype) \
                and self.flops_per_s is not None:
            return self.flops_per_s
        if key in self.flops_by_dtype:
            return self.flops_by_dtype[key]
        known = ", ".join(dtype_name(d) for d in self.flops_by_dtype) or "none"
        if strict or self.flops_per_s is None:
            raise UnknownDtypeError(f"device {self.name!r} has no peak FLOP/s for "
                                    f"{dtype_name(key)} (it has: {known})")
        _warn_once("peak FLOP/s", self, key, self.dtype)
        return self.flops_per_s

    def pj_per_flop(self, dtype=None) -> float | None:
        """Energy per FLOP in pJ at `dtype`; None when the spec gives none.

        NB: the one fallback rule, everywhere energy is priced: a dtype without
        its own figure uses the compute dtype's, else the first the spec lists
        (one warning line per device and dtype), as the UPMEM profiles price
        every FLOP alike; None only when the spec has no pJ/FLOP at all.
        """
        table = self.pj_per_flop_by_dtype
        if (dtype is None and self.dtype is None) or not table:
            return None
        key = rate_key(self.dtype if dtype is None else dtype)
        if key in table:
            return table[key]
        own = None if self.dtype is None else rate_key(self.dtype)
        used = own if own in table else next(iter(table))
        _warn_once("pJ/FLOP", self, key, used)
        return table[used]

    def with_dtype(self, dtype) -> "DeviceSpec":
        """This device computing in `dtype`: flops_per_s and the balance point follow."""
        dtype = as_dtype(dtype)
        return replace(self, dtype=dtype, flops_per_s=self.peak_flops(dtype),
                       roofline_balancepoint=None)

    def to_dict(self) -> dict:
        """JSON-able: dtypes as names ("bfloat16"), tuples as lists."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "dtype":
                value = None if value is None else dtype_name(value)
            elif f.name in _TABLES:
                value = {dtype_name(k): v for k, v in value.items()}
            elif isinstance(value, (tuple, dict)):
                value = list(value) if isinstance(value, tuple) else dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceSpec":
        """A DeviceSpec from to_dict(); every figure is checked again.

        NB: always a plain DeviceSpec: a subclass's own fields (CUDADeviceSpec's
        use_tensorcores) are dropped, the figures it resolved are kept.
        """
        if not isinstance(d, dict):
            raise DeviceSpecError(f"expected a dict from DeviceSpec.to_dict(), "
                                  f"got {type(d).__name__} {d!r:.60}")
        names = {f.name for f in fields(DeviceSpec)}
        return DeviceSpec(**{k: v for k, v in d.items() if k in names})
