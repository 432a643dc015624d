"""Reading a counts document back: what `TransformerPerformanceCounter.to_json()` writes.

Three layouts are read: this version's (torchao's, {label: stats dict} with a "perfcounter"
block in each: schema, version, io_model, depth, run), the version-1 envelope ({"schema",
"version": 1, "io_model", "depth", "device", "counts"}) and torchao's own to_dict() (no
block: its figures held as given). `read_counts(doc, source)` returns the phases and the
counter's settings as plain data; every malformed document is one ValueError naming
`source`, the phase and the field.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from perfcounter.counting.module_path import check_depth
from perfcounter.stats import PerformanceStats
from perfcounter.stats_dict import spec_from_dict
from perfcounter.trace import check_io_model

SCHEMA = "perfcounter.counts"
SCHEMA_VERSION = 2  # 2: torchao's layout, {label: stats + "perfcounter" block}; 1: the envelope
META_KEY = "perfcounter"  # the block in each label's dict


@dataclass
class ReadCounts:
    """A counts document as read: the counter's settings and its phases by label."""

    depth: int = 10
    io_model: str = "per_op"
    device_spec: object | None = None
    phases: dict[str, PerformanceStats] = field(default_factory=dict)


def _settings(meta: dict, where: str) -> ReadCounts:
    try:
        return ReadCounts(depth=check_depth(meta.get("depth", 10)),
                          io_model=check_io_model(meta.get("io_model", "per_op")))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _check_meta(meta, where: str) -> None:
    """The "perfcounter" block of a phase: an object of this schema, a version read here."""
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        what = f"has schema {meta.get('schema')!r:.40}" if isinstance(meta, dict) and \
            "schema" in meta else "is not a perfcounter block"
        raise ValueError(f"{where}: field {META_KEY!r} {what} (expected an object with "
                         f"\"schema\": {SCHEMA!r})")
    if meta.get("version") != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema version {meta.get('version')!r} is not supported "
                         f"(this perfcounter reads version {SCHEMA_VERSION})")


def read_counts_file(path: str):
    """The JSON document in a counts file; every failure to read one is one ValueError."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a JSON text file (not UTF-8; a binary file?)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:  # json nests by recursion: a counts document is a few levels deep
        raise ValueError(f"{path}: JSON nested too deep to be a counts document (a counts "
                         "file holds phases of stats, a few levels deep)") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a JSON file") from None
    except FileNotFoundError:
        raise ValueError(f"{path}: no such counts file (--save_path of `perfcounter count` "
                         "or generate.py writes one)") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None


def read_counts(doc, source: str = "document") -> ReadCounts:
    """The phases and settings of a counts document (see the module doc)."""
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: expected a JSON object of phases by label, got "
                         f"{type(doc).__name__}")
    if "schema" in doc and not isinstance(doc["schema"], dict):  # the version-1 envelope
        if not isinstance(doc["schema"], str):  # (a label maps to a dict)
            raise ValueError(f"{source}: not a perfcounter counts document (schema "
                             f"{doc['schema']!r:.40}; expected {SCHEMA!r})")
        return _read_envelope(doc, source)
    read = None
    for label, d in doc.items():
        where = f"{source}: phase {label!r}"
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object of stats fields, got "
                             f"{type(d).__name__}")
        meta = d.get(META_KEY)
        if meta is not None:
            _check_meta(meta, where)
        elif "schema" in d:  # a schema where no phase has one: name it, not a missing field
            raise ValueError(f"{where}: schema {d['schema']!r:.40} is not a perfcounter "
                             f"counts document's (expected a {META_KEY!r} block with "
                             f"\"schema\": {SCHEMA!r})")
        if read is None:
            read = _settings(meta or {}, where)
        stats = PerformanceStats.from_dict(d, where)
        if read.device_spec is None and stats.totals is None:
            read.device_spec = stats.device_spec
        read.phases[label] = stats
    return read if read is not None else ReadCounts()


def _read_envelope(doc: dict, source: str) -> ReadCounts:
    """Version 1: {"schema", "version": 1, "io_model", "depth", "device", "counts"}."""
    if doc["schema"] != SCHEMA:
        raise ValueError(f"{source}: not a perfcounter counts document (schema "
                         f"{doc['schema']!r}; expected {SCHEMA!r})")
    if doc.get("version") != 1:
        raise ValueError(f"{source}: schema version {doc.get('version')!r} is not supported "
                         f"(this perfcounter reads version 1 envelopes and version "
                         f"{SCHEMA_VERSION} label maps)")
    try:
        read = _settings({"depth": doc["depth"], "io_model": doc["io_model"]}, source)
        device, counts = doc["device"], doc["counts"]
    except KeyError as e:
        raise ValueError(f"{source}: field {e} is missing; the document is incomplete "
                         f"(written by perfcounter {doc.get('perfcounter', '?')})") from None
    if device is not None and not isinstance(device, dict):
        raise ValueError(f"{source}: field 'device' must be an object (DeviceSpec.to_dict()) "
                         f"or null, got {type(device).__name__} {device!r:.40}")
    if not isinstance(counts, dict):
        raise ValueError(f"{source}: field 'counts' must be an object of phases by label, "
                         f"got {type(counts).__name__}")
    if device is not None:
        try:
            read.device_spec = spec_from_dict(device)
        except ValueError as e:
            raise ValueError(f"{source}: field 'device': {e}") from None
    for label, d in counts.items():
        stats = PerformanceStats.from_dict(d, f"{source}: phase {label!r}")
        read.phases[label] = dataclasses.replace(stats, device_spec=read.device_spec)
    return read
