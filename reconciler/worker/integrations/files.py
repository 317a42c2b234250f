"""A trainer's own checkpoint files carried through the SDK: a local folder <-> uint8 tensors.

The trainers write their checkpoints in their own formats (Lightning one `.ckpt` file, Hugging
Face a `checkpoint-N/` folder); storing those files as tensors lets the SDK pack, hash, upload,
fence and verify them like any other state, and the trainer's own resume code read them back.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch


def pack(folder: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every regular file under `folder`, keyed by its path relative to it, as a uint8 tensor."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"the trainer wrote no checkpoint folder at {root}")
    packed = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = bytearray(path.read_bytes())
        packed[path.relative_to(root).as_posix()] = torch.frombuffer(data, dtype=torch.uint8) if data else (
            torch.empty(0, dtype=torch.uint8))
    return packed


def unpack(files: dict[str, torch.Tensor], folder: str | os.PathLike[str]) -> Path:
    """Write files packed by `pack` under `folder` (created); returns the folder."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = (root / name).resolve()
        if root.resolve() not in target.parents:
            raise ValueError(f"checkpoint file name {name!r} points outside {root}: refusing to write it")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.contiguous().numpy().tobytes())
    return root


class Scratch:
    """The local folder a trainer writes its checkpoints to before the SDK stores them: a new
    temporary folder (removed by `tidy`), or the caller's (only what was written in it is)."""

    def __init__(self, path: str | None, prefix: str) -> None:
        self.own = path is None
        self.path = Path(path or tempfile.mkdtemp(prefix=prefix))
        self.made: list[Path] = []

    def sub(self, name: str) -> Path:
        """A folder in the scratch folder, removed by `tidy`."""
        self.made.append(self.path / name)
        return self.made[-1]

    def tidy(self) -> None:
        for path in [self.path] if self.own else self.made:
            shutil.rmtree(path, ignore_errors=True)
        self.made = []

    def exit_if_stopping(self, run: Any, step: int) -> None:
        """`run.exit_if_stopping(step)` (exit 75 after the final checkpoint on a stop notice), tidying
        this folder first when it does exit."""
        try:
            run.exit_if_stopping(step)
        except SystemExit:
            self.tidy()
            raise
