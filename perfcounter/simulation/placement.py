"""Placement: which device runs each module, from a layer mapping in UPMEM's notation.

    mapping = Mapping.load({"q_proj": "PIM-AI-4chip,t", "LlamaRMSNorm": "host",
                            "model.layers.1?.mlp": "PIM-AI-1dimm,tp=4"})
    placed = mapping.place(trace.modules)        # path -> Placed

A mapping is a dict (or a YAML / JSON file holding one) from a key to
"device[,option...]". Keys, from least to most specific:
- a class name ("LlamaRMSNorm"): every module of that class;
- a leaf name, UPMEM's "context" ("q_proj", "lm_head"): the attribute a module
  is stored under, the last part of its path;
- a glob over module paths ("model.layers.*.self_attn.q_proj", "layers.1?.*"),
  matched against every tail of the path that starts at a dot, so the root class
  ("LlamaForCausalLM.") may be written or left out; `*` crosses dots. Of two
  globs, the one with more literal characters is the more specific;
- a path without wildcards ("model.layers.0.mlp"), matched the same way.
On perfcounter's model transformers' names read as its own (hf_names.py). The most
specific key that matches a module wins; two keys of equal specificity that place a module
differently are an error. A module no key matches runs where its nearest placed ancestor
runs, and with no placed ancestor where the previous module ran (UPMEM's behaviour), or on
the default device when one is given.

Options: `t`, a transfer point (the module's input comes back through the host: the device
it was on sends it to the host, the host sends it on); `m`, a MoE transfer point (as `t`,
but the input shared by sibling modules this key matches, e.g. one block's experts, is sent
once); `tp=N`, tensor parallelism over N devices of that kind. Letters may be joined ("tm").

Device names resolve as UPMEM writes them: any case, `_` or `-`; "host" is the host;
UPMEM's own profile names (H100, Snapdragon8gen3, DGX100, ...) mean the registry's UPMEM
profiles ("upmem-h100"), other names the registry's entries, "FILE.yaml:ENTRY" a file.

Device figures beyond one device come from the DeviceSpec (YAML `peak_fraction`, the device
link and interconnect figures), and an option given to simulate() (or the CLI's
--peak_fraction, --device_link_GBs, --interconnect_GBs) overrides them:
- peak_fraction: one number for every device > {device: fraction} for that device >
  the spec's `peak_fraction` > 1 (peak);
- a device<->device transfer: the `device_link` option (one fabric between all non-host
  devices) > both specs' device links (pricing/links.py's `between`) > through the host;
- a tensor-parallel all-reduce: the `interconnect` option > the spec's interconnect, priced
  as every all-reduce (pricing/links.py's `within`) > through the host.
A link without a pJ/bit charges 0 J and warns (once per link and simulation).
"""
from __future__ import annotations

import enum
import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from perfcounter._util import did_you_mean
from perfcounter.devices import get_device_spec, list_device_specs
from perfcounter.simulation import hf_names
from perfcounter.strict_yaml import DuplicateKey, load_yaml, one_line

HOST = "host"
OPTION_HELP = "t (transfer point), m (MoE transfer point), tp=N (tensor parallel degree)"
MAX_TP = 4096  # devices in one tensor-parallel group: beyond any machine a mapping prices


class MappingError(ValueError):
    """A mapping entry, a mapping file or a device name in it is invalid."""


class Kind(enum.IntEnum):
    """How a key matched a module; a higher value is more specific."""
    CLASS = 1
    NAME = 2
    GLOB = 3
    PATH = 4


@dataclass(frozen=True, slots=True)
class Assignment:
    """One mapping value: the device as written and its options."""

    device: str
    transfer: bool = False  # t
    moe: bool = False  # m
    tp: int = 1

    def __str__(self) -> str:
        opts = ("t" if self.transfer else "") + ("m" if self.moe else "")
        return ",".join([self.device] + ([opts] if opts else []) +
                        ([f"tp={self.tp}"] if self.tp > 1 else []))


@dataclass(frozen=True, slots=True)
class Rule:
    key: str  # as the mapping writes it (reports, unmatched keys)
    value: Assignment
    pattern: re.Pattern | None  # globs and paths: matches a whole path's tail
    literal: int  # characters of a glob that are not wildcards
    name: str = ""  # a name or class key as matched (transformers' names read as ours)


@dataclass(frozen=True, slots=True)
class Placed:
    """Where one module runs: its own key's assignment, or the one it inherits."""

    assignment: Assignment | None  # None: where the previous module ran (or the default)
    key: str | None  # the key that matched this module itself; None when inherited or unplaced


def parse_value(key: str, value) -> Assignment:
    """'PIM-AI-4chip,t' -> Assignment('PIM-AI-4chip', transfer=True); errors name the entry."""
    if not isinstance(value, str) or not value.strip():
        raise MappingError(f"mapping entry {key!r}: expected 'device[,options]' as a string, "
                           f"got {value!r}")
    device, *opts = [p.strip() for p in value.split(",")]
    if not device:
        raise MappingError(f"mapping entry {key!r}: {value!r} names no device")
    transfer = moe = False
    tp = 1
    for opt in opts:
        if opt.lower().startswith("tp="):
            text = opt[3:].strip()
            if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_TP:
                raise MappingError(f"mapping entry {key!r}: {opt!r} needs a whole number from 1 "
                                   f"to {MAX_TP:,} (tp=2); valid options: {OPTION_HELP}")
            tp = int(text)
        elif opt and set(opt.lower()) <= {"t", "m"}:
            transfer |= "t" in opt.lower()
            moe |= "m" in opt.lower()
        else:
            raise MappingError(f"mapping entry {key!r}: unknown option {opt!r} in {value!r}; "
                               f"valid options: {OPTION_HELP}")
    return Assignment(device, transfer, moe, tp)


def _rule(key, value, match: str | None = None) -> Rule:
    """A mapping entry as a rule; `match`: the key as matched (default: the key)."""
    if not isinstance(key, str) or not key.strip() or key != key.strip():
        raise MappingError(f"mapping key {key!r}: expected a module name, class or path glob "
                           "without surrounding blanks")
    assignment = parse_value(key, value) if not isinstance(value, Assignment) else value
    m = key if match is None else match
    if any(c in m for c in "*?["):
        body = fnmatch.translate(m)
        literal = len(re.sub(r"\[[^\]]*\]|[*?]", "", m))
        return Rule(key, assignment, re.compile(r"(?:.*\.)?" + body, re.S), literal, m)
    if "." in m:
        return Rule(key, assignment, re.compile(r"(?:.*\.)?" + re.escape(m) + r"\Z", re.S),
                    len(m), m)
    return Rule(key, assignment, None, len(m), m)


def read_mapping_file(path) -> dict:
    """The dict a YAML or JSON mapping file holds (one-line errors name the file)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise MappingError(f"cannot read mapping file {str(path)!r}: "
                           f"{exc.strerror or exc}") from None
    return _parse_text(text, str(path))


def _parse_text(text: str, where: str) -> dict:
    try:
        if where.lower().endswith(".json"):
            data = json.loads(text)
        else:
            data = load_yaml(text)
    except DuplicateKey as dup:
        key = ".".join(map(str, dup.path))
        raise MappingError(f"{where}: key {key!r} is given twice (lines {dup.lines[0]} and "
                           f"{dup.lines[1]}); give it once") from None
    except Exception as exc:  # yaml.YAMLError or json.JSONDecodeError: one line, with where
        raise MappingError(f"{where}: not a valid mapping file ({one_line(exc)})") from None
    if not isinstance(data, dict) or not data:
        raise MappingError(f"{where}: expected a non-empty mapping of layer -> "
                           f"'device[,options]', got {type(data).__name__}")
    return data


class Mapping:
    """A parsed layer mapping: rules by key, and where each module of a model runs."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.plain: dict[str, list[Rule]] = {}
        for r in rules:
            if r.pattern is None:
                self.plain.setdefault(r.name or r.key, []).append(r)
        self.patterned = [r for r in rules if r.pattern is not None]

    @classmethod
    def load(cls, source) -> "Mapping":
        """From a Mapping, a dict, None (empty), a YAML / JSON file path, or inline
        YAML / JSON text ("{q_proj: pim-ai-4chip}", or lines of "key: value")."""
        if isinstance(source, Mapping):
            return source
        if source is None:
            return cls([])
        if isinstance(source, dict):
            data = source
        elif isinstance(source, (str, Path)) and not str(source).strip():
            raise MappingError("--mapping '': expected a YAML / JSON file or inline text, not "
                               "an empty string")
        elif isinstance(source, str) and (source.lstrip().startswith("{") or "\n" in source):
            data = _parse_text(source, "inline mapping")
        elif isinstance(source, (str, Path)):
            data = read_mapping_file(source)
        else:
            raise MappingError(f"expected a mapping dict, a YAML/JSON file or inline text, "
                               f"got {type(source).__name__}")
        return cls([_rule(k, v) for k, v in data.items()])

    def to_dict(self) -> dict[str, str]:
        return {r.key: str(r.value) for r in self.rules}

    def for_modules(self, modules) -> "Mapping":
        """This mapping as it reads on `modules` (transformers' names on our model)."""
        if not hf_names.is_ours(modules):
            return self
        split = any(m.path.rsplit(".", 1)[-1] in hf_names.QKV for m in modules)
        return Mapping([_rule(r.key, r.value, hf_names.translate(r.key, split))
                        for r in self.rules])

    def _matches(self, path: str, cls: str) -> list[tuple[tuple[int, int], Rule]]:
        leaf = path.rsplit(".", 1)[-1]
        found = [((Kind.NAME, 0), r) for r in self.plain.get(leaf, [])]
        if cls != leaf:
            found += [((Kind.CLASS, 0), r) for r in self.plain.get(cls, [])]
        for r in self.patterned:
            if r.pattern.match(path):
                kind = Kind.GLOB if any(c in r.key for c in "*?[") else Kind.PATH
                found.append(((kind, r.literal), r))
        return found

    def match(self, path: str, cls: str) -> Rule | None:
        """The most specific rule for a module; MappingError when two tie and disagree."""
        return (self.best(path, cls) or [None])[0]

    def best(self, path: str, cls: str) -> list[Rule]:
        """The most specific rules for a module, all of one value (q_proj, k_proj, v_proj)."""
        found = self._matches(path, cls)
        if not found:
            return []
        best = max(rank for rank, _ in found)
        top = [r for rank, r in found if rank == best]
        if len({r.value for r in top}) > 1:
            keys = ", ".join(repr(r.key) for r in top)
            why = ("put parts of perfcounter's fused q/k/v projection on different devices; this "
                   "command prices it whole: give them one device (simulate splits it)") \
                if path.rsplit(".", 1)[-1] == hf_names.FUSED else (
                "match it equally specifically with different devices; make one more specific "
                "(a path glob beats a name, a name beats a class)")
            raise MappingError(f"module {path!r} ({cls}): keys {keys} {why}")
        return top

    def place(self, modules) -> tuple[dict[str, Placed], set[str]]:
        """Where each module (ModuleInfo-like: path, cls) runs, and the keys that matched.
        A module takes its own rule, else its nearest placed ancestor's."""
        placed: dict[str, Placed] = {}
        used: set[str] = set()
        mapping = self.for_modules(modules)  # transformers' names, on our model
        for m in sorted(modules, key=lambda m: m.path.count(".")):  # parents first
            top = mapping.best(m.path, m.cls)
            if top:
                used.update(r.key for r in top)
                placed[m.path] = Placed(top[0].value, top[0].key)
                continue
            parent = m.path
            inherited = None
            while "." in parent and inherited is None:
                parent = parent.rsplit(".", 1)[0]
                if parent in placed:
                    inherited = placed[parent].assignment
            placed[m.path] = Placed(inherited, None)
        return placed, used

    def unmatched(self, used: set[str], modules) -> list[str]:
        """One line per key that matched no module, with the nearest names the model has."""
        names = sorted({m.path.rsplit(".", 1)[-1] for m in modules} | {m.cls for m in modules})
        return [f"mapping key {r.key!r} ({r.value}) matches no module of the model"
                f"{did_you_mean(r.key, names, quote=True)}"
                for r in self.rules if r.key not in used]


# -- device names ---------------------------------------------------------------------------
def resolve_device(name: str, host_spec, *, where: str = "", extra: dict | None = None):
    """The DeviceSpec a device name means (see the module doc); `extra` maps names (any
    case) to DeviceSpecs that come before the registry. `where` prefixes errors
    ("mapping entry 'q_proj'", "--default_device")."""

    text = name.strip()
    if text.lower() == HOST:
        return host_spec
    for k, spec in (extra or {}).items():
        if k.lower() == text.lower():
            return spec
    where = f"{where}: " if where else ""
    if ":" in text or text.lower().endswith((".yaml", ".yml")):
        try:
            return get_device_spec(text)
        except (KeyError, ValueError, OSError) as exc:
            raise MappingError(f"{where}{exc}") from None
    norm = text.lower().replace("_", "-")
    known = {n.lower(): n for n in list_device_specs()}
    for candidate in ("upmem-" + norm, norm):
        if candidate in known:
            return get_device_spec(known[candidate])
    try:
        return get_device_spec(text)  # an alias ("h100", "sd8g3")
    except (KeyError, ValueError):
        pass
    hint = did_you_mean(norm, [HOST, *(extra or {})] + sorted(known), n=3, cutoff=0.5)
    raise MappingError(f"{where}unknown device {name!r}{hint} (valid: host, a name that "
                       "`perfcounter devices` lists, UPMEM's profile names such as "
                       "PIM-AI-4chip or H100, or FILE.yaml:ENTRY)")


def default_host():
    """The host: this machine's calibrated CPU spec when there is one, else generic-cpu."""
    try:
        spec = get_device_spec("calibrated")
    except (KeyError, ValueError):
        spec = None
    return spec if spec is not None and spec.device_type == "cpu" else get_device_spec("generic-cpu")


# -- a mapping resolved against a model and the devices -----------------------------------
@dataclass(slots=True, eq=False)
class Device:
    """A device of one simulation: its spec, tensor-parallel degree and peak fraction."""

    key: str  # "host", "pim-ai-4chip", "pim-ai-1dimm,tp=4"
    spec: object
    tp: int = 1
    fraction: float = 1.0  # achievable / peak, applied to FLOP/s and bandwidth
    is_host: bool = False


def _check_fraction(where: str, f) -> float:
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        raise MappingError(f"peak_fraction {where}: expected a number in (0, 1], got {f!r}")
    return float(f)


class Plan:
    """A mapping resolved against a model's modules: the devices it uses (by key), and per
    module path the device it runs on (None: where the previous one ran), its own key and
    value. peak_fraction: one number for every device, or {name or "host": fraction},
    each overriding the spec's own `peak_fraction` (1 when the spec has none)."""

    def __init__(self, mapping: Mapping, modules, host_spec, *, default_device=None,
                 peak_fraction=None, extra: dict | None = None):
        self.extra = extra or {}
        self.host_spec = host_spec
        self.all_fraction, named = None, {}
        if isinstance(peak_fraction, dict):
            named = {str(name).strip(): _check_fraction(f"of {name!r}", f)
                     for name, f in peak_fraction.items()}
        elif peak_fraction is not None:
            self.all_fraction = _check_fraction("for every device", peak_fraction)
        self.host = Device(HOST, host_spec, 1, self._fraction(host_spec), True)
        self.devices: dict[str, Device] = {HOST: self.host}
        self._by_value: dict[tuple, Device] = {}
        placed, self.used = mapping.place(modules)
        self.default = None if default_device is None else \
            self.device(default_device, 1, "--default_device")
        self.own = {p: pl.key for p, pl in placed.items()}  # the key that placed it, or None
        self.value = {p: pl.assignment for p, pl in placed.items()}
        self.where = {p: self.device(pl.assignment.device, pl.assignment.tp,
                                     f"mapping entry {pl.key!r}" if pl.key else "mapping")
                      for p, pl in placed.items() if pl.assignment is not None}
        # per device options last, matched by entry name: a device the mapping loaded from
        # a file ("FILE.yaml:ENTRY", a new object on each load) may be named by its entry
        for name, f in named.items():
            if name.lower() == HOST:
                hit = [d for d in self.devices.values() if d.spec is host_spec]
            else:
                spec = resolve_device(name, host_spec, where="peak_fraction", extra=self.extra)
                hit = [d for d in self.devices.values() if d.spec.name == spec.name]
            for dev in hit:
                dev.fraction = f

    def _fraction(self, spec) -> float:
        """The option for every device, else the spec's own peak_fraction, else 1."""
        if self.all_fraction is not None:
            return self.all_fraction
        return 1.0 if spec.peak_fraction is None else spec.peak_fraction

    def device(self, name: str, tp: int, where: str) -> Device:
        hit = self._by_value.get((name, tp))
        if hit is None:
            spec = resolve_device(name, self.host_spec, where=where, extra=self.extra)
            on_host = spec is self.host_spec
            dkey = (HOST if on_host else spec.name) + (f",tp={tp}" if tp > 1 else "")
            hit = self.devices.get(dkey)
            if hit is None:
                hit = self.devices[dkey] = Device(dkey, spec, tp, self._fraction(spec),
                                                  on_host and tp == 1)
            self._by_value[(name, tp)] = hit
        return hit


