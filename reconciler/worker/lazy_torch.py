"""torch as the training script has it: the SDK never imports torch of its own accord.

A script that does not use torch (NumPy, scikit-learn or JAX training, an evaluation that reads
files) does not pay torch's import (about 1.8 CPU-seconds, `bench/startup.py`) nor need it
installed. This is safe because a tensor cannot exist before torch is imported: while
`loaded()` is None there is no tensor to save and no torch generator whose state a resume must
carry (torch seeds its generator the same way whenever it is imported, so a script that imports
it after a save finds it in the same state in an uninterrupted run and in a resumed one).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


def loaded() -> ModuleType | None:
    """torch, when this process has imported it (None when not, or when it is blocked)."""
    return sys.modules.get("torch")


def is_tensor(value: Any) -> bool:
    tensor = getattr(loaded(), "Tensor", None)  # None too while another thread is still importing torch
    return tensor is not None and isinstance(value, tensor)


def is_instance(value: Any, module: str, name: str) -> bool:
    """`isinstance(value, module.name)` without importing `module`: nothing can be an instance of
    a class whose module was never imported (the SDK's own ResumableLoader, torch's DataLoader)."""
    mod = sys.modules.get(module)
    return mod is not None and isinstance(value, getattr(mod, name))


def require() -> ModuleType:
    """torch, imported now (a checkpoint that holds tensors or torch's RNG state needs it)."""
    import torch

    return torch
