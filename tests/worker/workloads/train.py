"""A tiny deterministic training job for the worker tests: MLP with dropout, AdamW, StepLR,
plus Python/NumPy randomness and growing user state, so that any lost or mis-restored piece of
state (parameters, optimizer moments, scheduler, RNG streams, user state) changes the result.

Run as a script (``python train.py '{"steps": 40, ...}'``) or call `main(cfg)` in a forked child.
cfg keys: steps, seed, out (final state file), die_at (step), die_phase ("before_save" or
"after_save"), sleep (seconds per step), log (file of "saving N" lines), width.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from typing import Any

import numpy as np
import torch

from reconciler.worker import open_run


def build(seed: int, width: int = 32) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, width), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(width, 4)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
    return model, opt, sched


def _note(cfg: dict[str, Any], line: str) -> None:
    if cfg.get("log"):
        with open(cfg["log"], "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def main(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    steps = int(cfg["steps"])
    model, opt, sched = build(int(cfg.get("seed", 0)), int(cfg.get("width", 32)))
    extra: dict[str, Any] = {"noise": []}
    die_at = cfg.get("die_at")
    last_loss = 0.0
    with open_run() as run:
        start = run.restore(model=model, optimizer=opt, scheduler=sched, extra=extra)
        _note(cfg, f"restored {start}")
        for step in range(start + 1, steps + 1):
            x = torch.randn(16, 8)
            y = torch.randn(16, 4)
            noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
            loss = ((model(x) - y) ** 2).mean() + noise
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            extra["noise"].append(noise)
            last_loss = float(loss.detach())
            if die_at == step and cfg.get("die_phase") == "before_save":
                os.kill(os.getpid(), signal.SIGKILL)
            run.heartbeat(step, loss=last_loss)
            if run.should_checkpoint(step):
                run.save(step, model=model, optimizer=opt, scheduler=sched, extra=extra)
                _note(cfg, f"saved {step}")
            if die_at == step:
                os.kill(os.getpid(), signal.SIGKILL)
            if cfg.get("sleep"):
                time.sleep(float(cfg["sleep"]))
            run.exit_if_stopping(step, model=model, optimizer=opt, scheduler=sched, extra=extra)
        if cfg.get("out"):
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
            torch.save({**state, "extra": extra}, cfg["out"])
        run.complete(steps, loss=last_loss)
    if os.environ.get("RECONCILER_FAULT_KILL_AT"):
        import adapters.stores.base

        _note(cfg, f"points {adapters.stores.base.fault_count}")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
