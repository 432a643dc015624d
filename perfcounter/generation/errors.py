"""generate.py's precisions and the error its flags raise, shared by options.py and run.py."""
from __future__ import annotations

import torch

PRECISIONS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class GenerateArgumentError(ValueError):
    """Flags that do not fit together."""
