"""What a command prints besides its report: no third-party noise, our warnings one line each.

Entry points only (`perfcounter ...`, `python generate.py`): a library user who imports
perfcounter keeps every filter and logger as they set them.

- `quiet_third_party()` silences, narrowly, what the libraries we run print to a user
  who did nothing wrong: transformers' FutureWarnings and DeprecationWarnings about its
  own API and its log lines below ERROR (`TRANSFORMERS_VERBOSITY`, unless the user set
  it) and progress bars (`HF_HUB_DISABLE_PROGRESS_BARS`, `TQDM_DISABLE`: ours pass
  disable=False), torchao's "Failed to load ..." lines for kernels of other platforms, and torch's
  pytree registration notices that importing torchao triggers. Each by category and
  module (or by the library's own logger), never globally.
- `collected_warnings()` holds every warning raised while a command works and prints
  each distinct one once, after the report, as one line: `perfcounter: warning: ...`
  for ours (PerfcounterWarning), `warning: <Category> (<module>): ...` for anyone
  else's — never the echoed source line Python's default adds, never inside a table.
- `progress(...)`: the one progress bar of every long job (plan, sweep, serve, generate.py's
  loading and runs, the machine measurement): tqdm on stderr with the count, the rate and the
  time left, and the best answer so far where the job has one (`bar.set_postfix_str`); off
  where the stream is not a terminal (CI logs and pipes read the same as without it) or the
  command was given --quiet. `waiting(...)`: the same for one long step that counts nothing
  (a model's loading): its elapsed time, redrawn every half second. `counting(fn, bar)`: `fn`
  with each call counted on a bar, its result described in the postfix (serve's runs).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from contextlib import contextmanager

from tqdm import tqdm

from perfcounter._util import PerfcounterWarning

# loggers of libraries whose WARNING lines are about their own set-up, not the user's run
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
# (category, module regex) of the warnings libraries raise about their own API
QUIET_WARNINGS = ((FutureWarning, r"transformers(\.|$)"), (DeprecationWarning, r"transformers(\.|$)"),
                  (FutureWarning, r"torchao(\.|$)"), (DeprecationWarning, r"torchao(\.|$)"),
                  (UserWarning, r"torch\.utils\._pytree"))


def quiet_third_party() -> None:
    """Silence third-party notices for this process (an entry point's first call)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bars
    os.environ.setdefault("TQDM_DISABLE", "1")  # a library's own tqdm (GGUF dequantizing);
    # ours pass disable=False explicitly, which the variable does not override
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, module in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", category=category, module=module)


def warning_line(w: warnings.WarningMessage) -> str:
    """One line for a caught warning (see the module doc)."""
    text = " ".join(str(w.message).split())
    if issubclass(w.category, PerfcounterWarning):
        return f"perfcounter: warning: {text.removeprefix('perfcounter: ')}"
    module = os.path.splitext(os.path.basename(w.filename or ""))[0] or "?"
    return f"warning: {w.category.__name__} ({module}): {text}"


@contextmanager
def collected_warnings(stream=None):
    """Hold the warnings raised inside the block; print each distinct one once at its end
    (on `stream`, default stderr), whether the block returned or raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PerfcounterWarning)
        try:
            yield caught
        finally:
            seen = []
            for w in caught:
                line = warning_line(w)
                if line not in seen:
                    seen.append(line)
            out = stream or sys.stderr
            for line in seen:
                print(line, file=out)


def is_terminal(stream) -> bool:
    """Whether `stream` is a terminal (False for a closed stream or one without isatty)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def progress(iterable=None, *, total: float | None = None, desc: str = "", unit: str = "it",
             quiet: bool = False, file=None, **kwargs) -> tqdm:
    """A progress bar (tqdm) over `iterable` or up to `total` on `file` (default: stderr):
    shown where that stream is a terminal and not `quiet`, else off (tqdm's disable: nothing
    written). It leaves no line behind once closed; kwargs go to tqdm (unit_scale, ...)."""
    stream = sys.stderr if file is None else file
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, leave=False,
                dynamic_ncols=True, disable=quiet or not is_terminal(stream), **kwargs)


@contextmanager
def waiting(desc: str, *, quiet: bool = False, file=None):
    """A bar of one long step that counts nothing (a model's loading): `desc` and the time
    elapsed, redrawn every half second while the block runs (progress()'s rules: off where
    the stream is no terminal or `quiet`)."""
    bar = progress(total=None, desc=desc, quiet=quiet, file=file,
                   bar_format="{desc}: {elapsed}")
    done = threading.Event()

    def tick():
        while not done.wait(0.5):
            bar.refresh()
    ticker = threading.Thread(target=tick, daemon=True)
    if not bar.disable:
        ticker.start()
    try:
        yield bar
    finally:
        done.set()
        if ticker.is_alive():
            ticker.join()
        bar.close()


def counting(fn, bar: tqdm, describe=None):
    """`fn`, each call of it counted on `bar` once it returns, the bar's postfix
    `describe(result)` where given (the last run's figures, the best so far)."""
    def counted(*args, **kwargs):
        result = fn(*args, **kwargs)
        if describe is not None:
            bar.set_postfix_str(describe(result), refresh=False)
        bar.update(1)
        return result
    counted.bar = bar  # to close it
    return counted
