"""What a counted block switches so that every op runs eagerly under the dispatch mode.

A dispatch mode sees the eager ops of compiled code anyway; two switches keep the
compiler out of the counted block: the compiler stance (Dynamo must not trace the
mode's own frames) and flex_attention's debug switch (its eager path compiles).
Both are restored when the block ends.
"""
from __future__ import annotations

import sys

import torch


class _NoStance:
    def __exit__(self, *exc) -> None:
        pass


def force_eager():
    """Compiled code runs eagerly in a counted block: a dispatch mode sees the eager ops in
    any case, and Dynamo must not trace the mode's own frames (see mode.CountingMode._should_skip_dynamo).
    Without torch._dynamo imported nothing is compiled (and its import takes a second)."""
    if "torch._dynamo" not in sys.modules:
        return _NoStance()
    return torch.compiler.set_stance("force_eager")  # in force now; __exit__ restores


def set_flex_eager(value: bool) -> bool:
    """flex_attention's eager path wraps itself in torch.compile, which refuses to run
    under a dispatch mode; its documented debug switch runs it eagerly instead."""
    try:
        import torch.nn.attention.flex_attention as fa  # deferred: absent from older torch releases
    except ImportError:
        return False
    old = getattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = value
    return old
