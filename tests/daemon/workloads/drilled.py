"""The demo's model with a learning-rate scheduler that changes every step; with FORGET_SCHEDULER=1
the scheduler is left out of restore() and save(), the slip a drill is there to find: a resumed
run then starts its schedule again, and its loss differs from the first step after the checkpoint."""

from __future__ import annotations

import os
import time

import torch

from reconciler.demo.train import build, train_step, true_weights
from reconciler.worker import open_run


def main() -> None:
    torch.set_num_threads(1)
    model, optimizer, _ = build()
    # Not chainable: the rate is computed from the scheduler's own count, which only its state carries.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.99 ** e)
    kept = {"model": model, "optimizer": optimizer}
    if os.environ.get("FORGET_SCHEDULER") != "1":
        kept["scheduler"] = scheduler
    step_seconds = float(os.environ.get("DEMO_STEP_SECONDS", "0.05"))
    with open_run(heartbeat_interval=0.2) as run:
        target = run.target or 400
        start = run.restore(**kept)
        for step in range(start + 1, target + 1):
            loss = train_step(model, optimizer, scheduler, true_weights())
            time.sleep(step_seconds)
            run.heartbeat(step, loss=float(loss), lr=scheduler.get_last_lr()[0])
            if run.should_checkpoint(step):
                run.save(step, **kept)
            run.exit_if_stopping(step, **kept)
        run.complete(target)


if __name__ == "__main__":
    main()
