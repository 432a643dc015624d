"""Step counts kept on disk between runs: a table counted once is read back, not counted again.

Counting a step table (steps.count_table, steps_hf.count_hf_table) runs a model of one layer
of each kind at 9 to 17 steps on fake tensors: 1.5 s for a dense model, 10-15 s for DeepSeek-V3
or gpt-oss on a 2-core machine, and a plan counts one per weight format, KV dtype and
parallel layout (tens of them). A person asks, looks, changes one flag and asks again; the
second question's tables are the first's. So each table counted is saved in

    $PERFCOUNTER_HOME/step-counts/<key>.pkl     (devices.perfcounter_home(): ~/.cache/perfcounter)

and read back by any later run, plan's worker processes included. The key is a SHA-256 of
what the counts depend on: the counts' key in the process cache (pricing.CountsKey: the
model's every field, or a transformers config's JSON with its tensor- and expert-parallel
sizes and stage; the dtype, weight scheme and KV dtype), perfcounter's own source files, and
the versions of torch, transformers and numpy. Any change to the code or those packages makes
a new key, so a table is never read by code other than the one that counted it. A llama.cpp
file's tables (weights a GgufFile) are not kept: their counts follow the file's contents,
which a path does not name.

Files are written atomically (_util.atomic_write); the folder is held to MAX_BYTES, the
least recently read files removed first. A file that cannot be read back (cut short, another
version of pickle) is removed and the table counted again, with a warning; a folder that
cannot be written is warned about once and the run goes on without it.
$PERFCOUNTER_TABLE_CACHE=0 neither reads nor writes (the test suite sets it, so that each test
counts what it checks); `perfcounter.serve.counts_cache.clear()` empties the folder.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import pickle
import warnings
from pathlib import Path

from perfcounter._util import atomic_write
from perfcounter.devices.registry import perfcounter_home
from perfcounter.serve.errors import ServeError

ENV = "PERFCOUNTER_TABLE_CACHE"
FOLDER = "step-counts"
MAX_BYTES = 512 << 20  # the folder's size kept (a table's counts: 0.3-1 MB)
_WARNED: set = set()
_STATS = {"read": 0, "written": 0}


def enabled() -> bool:
    """False where $PERFCOUNTER_TABLE_CACHE is "0"; a ServeError naming the valid values
    where it is set to anything but "0" or "1" (as $PERFCOUNTER_MEASURE is read)."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ServeError(f"{ENV}={os.environ[ENV]!r} is not valid; valid: 0 (step tables "
                         "neither read from nor written to disk) or 1 (the default)")
    return value == "1"


def folder() -> Path:
    return perfcounter_home() / FOLDER


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@functools.cache
def code_digest() -> str:
    """SHA-256 of perfcounter's source and data files (their paths and bytes) and the
    versions of torch, transformers and numpy: what a table's counts follow besides its key."""
    root = Path(__file__).resolve().parents[1]  # the perfcounter package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".yaml", ".json") and path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    for package in ("torch", "transformers", "numpy"):
        h.update(f"{package}={_version(package)};".encode())
    return h.hexdigest()


def path_of(key) -> Path:
    """The file of counts `key` (a pricing.CountsKey: its repr names every field)."""
    digest = hashlib.sha256(f"{code_digest()}\n{key!r}".encode()).hexdigest()[:40]
    return folder() / f"{digest}.pkl"


def _warn_once(what: str, error: Exception) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(f"step-table cache: {what}: {error}; set {ENV}=0 to turn it off",
                      stacklevel=3)


def load(key):
    """The counts saved under `key`, or None (not saved, the cache off, or unreadable)."""
    if not enabled():
        return None
    path = path_of(key)
    try:
        with open(path, "rb") as f:
            counts = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a file cut short or of another pickle: counted again
        _warn_once(f"{path} could not be read back and is counted again", e)
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # read now: the last to be removed
    except OSError:
        pass
    _STATS["read"] += 1
    return counts


def save(key, counts) -> None:
    """Keep `counts` under `key` (atomically), then hold the folder to MAX_BYTES."""
    if not enabled():
        return
    try:
        atomic_write(path_of(key), pickle.dumps(counts, protocol=pickle.HIGHEST_PROTOCOL),
                     mkdir=True)
    except OSError as e:
        _warn_once(f"cannot write in {folder()}", e)
        return
    _STATS["written"] += 1
    _trim()


def _trim() -> None:
    files = []
    for p in folder().glob("*.pkl"):
        try:
            s = p.stat()
        except OSError:  # removed by another process meanwhile
            continue
        files.append((s.st_mtime, s.st_size, p))
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files):
        if total <= MAX_BYTES:
            break
        p.unlink(missing_ok=True)
        total -= size


def stats() -> dict:
    """{"read": tables read back, "written": tables saved} by this process."""
    return dict(_STATS)


def clear() -> int:
    """Remove every saved table; the number removed."""
    n = 0
    for p in folder().glob("*.pkl"):
        p.unlink(missing_ok=True)
        n += 1
    return n


__all__ = ["ENV", "MAX_BYTES", "clear", "code_digest", "enabled", "folder", "load", "path_of",
           "save", "stats"]
