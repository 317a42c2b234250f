"""A `run.epochs()` loop for the resume tests, killed for real (SIGKILL) mid-epoch by the tests.

Each epoch's preamble draws from every global RNG (Python, NumPy, torch) without passing the
draws through `carry=` when cfg "draws" is set, and builds the value the batches carry: a
tensor (cfg "carry": "tensor"), a tuple holding a tensor, a `Carry` and a dict with a list of
tensors ("nested"), or nothing ("none"). The batches draw noise too, and the learning rate
carried from epoch to epoch is annealed. Anything not put back exactly on a resume changes the
final weights. Under torchrun (WORLD_SIZE) each rank seeds its RNGs with its rank and the
updates are summed over the ranks, as DDP averages gradients: every rank's draws count.

cfg keys: out (final state file), die_at (the step to SIGKILL itself in, once the checkpoints
before it are durable; the last rank does), carry ("tensor", "nested" or "none"), draws (bool).
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
    return shift, None if cfg.get("carry") == "none" else torch.zeros(3)


def step(carried: Any, x: int) -> tuple[Any, torch.Tensor]:
    """One batch: the carried value moves on (in place and rebound), with fresh noise."""
    if carried is None:
        return None, x + torch.rand(3)
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
    seed = int(os.environ.get("RANK", "0"))
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    w = torch.zeros(3)
    lr = 1.0
    with open_run() as run:
        for epoch in run.epochs(EPOCHS, w=w):
            lr = run.carry(lr=lr)
            shift, carried = preamble(cfg)
            carry = None if carried is None else lambda: carried  # noqa: B023 - the current value
            for _, x in run.enumerate(range(PER_EPOCH), carry=carry):
                carried, update = step(carried, x)
                update = update + shift
                if run.world_size > 1:
                    torch.distributed.all_reduce(update)
                w += lr * update
                if run.step == cfg.get("die_at"):
                    run.wait()  # the checkpoints before this step are durable
                    if run.rank == run.world_size - 1:
                        os.kill(os.getpid(), signal.SIGKILL)
            if epoch % 2 == 0:
                lr /= 2.0
        torch.save({"w": w, "lr": lr}, f"{cfg['out']}.{run.rank}" if run.world_size > 1 else cfg["out"])
        run.complete()


def child(env: dict[str, str], cfg: dict[str, Any]) -> None:
    """One attempt, in a fork of the tests' fork server (see tests/worker/harness.py spawn)."""
    os.environ.update(env)
    main(cfg)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
