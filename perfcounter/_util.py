"""Small helpers every part of perfcounter shares: the one atomic file writer, the
one "did you mean" hint, and `settle_objects` for the command-line entry points.

`atomic_write(path, text_or_bytes)` (or `atomic_write(path, writer=fn)`, where
fn(tmp_path) writes the file, for libraries that write to a path themselves)
writes beside the target (`.NAME.perfcounter-PID-XXXX.tmp`) and renames over it, so a
reader never sees half a file and a failed write leaves the old one; a temporary that a
killed writer left behind is removed by the next write to the same target. It refuses a
target that is not a regular file (a device node, a FIFO, a directory): renaming over
those would replace them. A symlink is written through to its target. An existing file
keeps its permission bits; a new one gets the usual 0666 & ~umask.
"""
from __future__ import annotations

import difflib
import glob
import gc
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable

VERSION = "0.1.0"  # the release; setup.cfg reads it from here


class PerfcounterWarning(UserWarning):
    """Every warning perfcounter itself gives (a fallback it took, a figure it lacks):
    one category, so that a user or a test can filter or catch ours alone."""


class UnsafeTargetError(OSError):
    """The path exists and is not a regular file: writing would replace it."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable_target(path) -> Path:
    """The real path a write to `path` would land on; raises UnsafeTargetError for a
    target that is not a regular file and OSError when its folder cannot take a new file.
    Call it before a long run so that results are not lost to a bad --save_path."""
    target = Path(os.path.realpath(Path(path).expanduser()))
    if target.exists() and not target.is_file():
        kind = "a directory" if target.is_dir() else "not a regular file"
        raise UnsafeTargetError(f"refusing to write {path}: {target} is {kind}")
    folder = target.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot write {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {path}: folder {folder} is not writable")
    return target


def atomic_write(path, data: str | bytes | None = None, *,
                 writer: Callable[[str], None] | None = None, mkdir: bool = False) -> Path:
    """Write `data` (str: UTF-8) or let `writer(tmp_path)` write, then rename over `path`.

    Returns the path written (a symlink's target). mkdir: create missing parent folders."""
    if (data is None) == (writer is None):
        raise TypeError("atomic_write takes either data or writer, not both or neither")
    if mkdir:
        Path(os.path.realpath(Path(path).expanduser())).parent.mkdir(parents=True, exist_ok=True)
    target = check_writable_target(path)
    mode = (stat.S_IMODE(target.stat().st_mode) if target.exists()
            else 0o666 & ~_umask())
    remove_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{TMP_TAG}-{os.getpid()}-",
                               suffix=".tmp")
    try:
        if writer is None:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        else:
            os.close(fd)
            writer(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


TMP_TAG = "perfcounter"  # .NAME.perfcounter-PID-XXXX.tmp: a write to NAME under way, by PID


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove the temporaries that writes to `target` left behind when their process was
    killed (SIGKILL, power loss): those whose writer's PID no longer runs. A write under way
    in a live process keeps its file. Returns what was removed."""
    removed = []
    for tmp in target.parent.glob(f".{glob.escape(target.name)}.{TMP_TAG}-*-*.tmp"):
        pid = tmp.name[len(f".{target.name}.{TMP_TAG}-"):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # its writer is gone
            try:
                tmp.unlink()
                removed.append(tmp)
            except OSError:
                pass
        except (PermissionError, OverflowError):  # another user's live process, or no pid
            pass
    return removed


def did_you_mean(value, choices: Iterable[str], n: int = 3, cutoff: float = 0.6,
                 quote: bool = False) -> str:
    """'; did you mean a, b?' for the choices closest to `value`, or '' when none is close.
    quote=True writes them as reprs ('a'), for names a user types as strings."""
    close = difflib.get_close_matches(str(value), list(choices), n=n, cutoff=cutoff)
    if not close:
        return ""
    return "; did you mean " + ", ".join(repr(c) if quote else c for c in close) + "?"


def settle_objects() -> None:
    """Move every object made so far out of the cyclic garbage collector's sight
    (`gc.freeze`). For a command-line process: its modules, torch's operator tables and
    a loaded model live until exit anyway, and every full collection, the one at exit
    included, would walk them again (torch._dynamo, which FakeTensorMode imports, is
    most of those objects). Called after the imports and again before exit; objects
    made later are collected as usual."""
    gc.freeze()


def sum_or_none(*values):
    """Σ values, or None when any is None: a phase that was not measured has no total."""
    return None if any(v is None for v in values) else sum(values)
