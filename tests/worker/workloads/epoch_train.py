"""A `run.epochs()` loop for the resume tests, killed for real (SIGKILL) mid-epoch by the tests.

Each epoch's preamble draws from every global RNG (Python, NumPy, torch) without passing the
draws through `carry=` when cfg "draws" is set, and builds the value the batches carry: a
tensor (cfg "carry": "tensor") or a tuple holding a tensor, a `Carry` and a dict with a list of
tensors ("nested"). The batches draw noise too, and the learning rate carried from epoch to
epoch is annealed. Anything not put back exactly on a resume changes the final weights.

cfg keys: out (final state file), die_at (the step to SIGKILL itself in, once the checkpoints
before it are durable), carry ("tensor" or "nested"), draws (bool).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from typing import Any

import numpy as np
import torch

from reconciler.worker import Carry, open_run

EPOCHS = 3
PER_EPOCH = 5


def preamble(cfg: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    """What an epoch starts with: a shift drawn from the RNGs (not carried) and the carried value."""
    shift = torch.zeros(3)
    if cfg.get("draws"):
        shift = torch.rand(3) + random.random() + float(np.random.rand())
    if cfg.get("carry") == "nested":
        return shift, (torch.zeros(3), Carry(total=0.0, seen=[]), {"cell": [torch.zeros(3)]})
    return shift, torch.zeros(3)


def step(carried: Any, x: int) -> tuple[Any, torch.Tensor]:
    """One batch: the carried value moves on (in place and rebound), with fresh noise."""
    if isinstance(carried, torch.Tensor):
        carried = carried * 0.5 + x + torch.rand(3)
        return carried, carried
    hidden, counts, cells = carried
    hidden.mul_(0.5).add_(x + torch.rand(3))
    counts.total += float(hidden.sum())
    counts.seen = [*counts.seen, x]
    cells["cell"][0] = cells["cell"][0] * 0.9 + torch.rand(3)
    return carried, hidden + cells["cell"][0] + counts.total * 1e-3 + len(counts.seen)


def main(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    w = torch.zeros(3)
    lr = 1.0
    with open_run() as run:
        for epoch in run.epochs(EPOCHS, w=w):
            lr = run.carry(lr=lr)
            shift, carried = preamble(cfg)
            for _, x in run.enumerate(range(PER_EPOCH), carry=lambda: carried):  # noqa: B023 - the current value
                carried, update = step(carried, x)
                w += lr * (update + shift)
                if run.step == cfg.get("die_at"):
                    run.wait()  # the step's checkpoint, if one fell due, is durable
                    os.kill(os.getpid(), signal.SIGKILL)
            if epoch % 2 == 0:
                lr /= 2.0
        torch.save({"w": w, "lr": lr}, cfg["out"])
        run.complete()


def child(env: dict[str, str], cfg: dict[str, Any]) -> None:
    """One attempt, in a fork of the tests' fork server (see tests/worker/harness.py spawn)."""
    os.environ.update(env)
    main(cfg)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
