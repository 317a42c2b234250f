"""Runs examples/word_language_model.py unchanged in this process, watching it from outside:
every training batch it reads is logged (position and a sum of its tokens), the process
SIGKILLs itself when it is about to train on batch `die_at`, and the final weights are saved.

``python -m tests.worker.workloads.lm_child '{"args": [...], "order": FILE, "final": FILE, "die_at": N}'``
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "word_language_model.py"


def main(cfg: dict[str, Any]) -> None:
    spec = importlib.util.spec_from_file_location("word_language_model", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    order = open(cfg["order"], "a")  # noqa: SIM115 - open for the whole process
    models: list[torch.nn.Module] = []
    train_batch_size = example.parse(cfg["args"]).batch_size
    read = example.get_batch
    base = example.RNNModel

    def get_batch(source: torch.Tensor, i: int, bptt: int) -> Any:
        data, targets = read(source, i, bptt)
        if source.size(1) == train_batch_size:  # a training batch, not validation
            order.write(f"{i} {int(data.sum())}\n")
            order.flush()
            if sum(1 for _ in open(cfg["order"])) == cfg.get("die_at"):
                os.kill(os.getpid(), signal.SIGKILL)
        return data, targets

    class Recorded(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            models.append(self)

    example.get_batch = get_batch
    example.RNNModel = Recorded
    example.main(cfg["args"])
    torch.save(models[0].state_dict(), cfg["final"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
