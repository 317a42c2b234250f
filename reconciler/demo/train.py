"""The demo's training job: a small PyTorch regression model, checkpointed through the worker SDK.

Run by the reconciler as `python -m reconciler.demo.train`; any attempt may be killed at any
moment and the next one resumes from the newest good checkpoint, bit-identically.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from reconciler.worker import open_run


def build() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    return model, optimizer, scheduler


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, true_w: torch.Tensor) -> torch.Tensor:
    """One step on a fresh synthetic batch; draws from torch's global RNG, which the SDK restores."""
    x = torch.randn(64, 16)
    y = torch.sin(x @ true_w) + 0.01 * torch.randn(64, 1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


def true_weights() -> torch.Tensor:
    return torch.linspace(-1, 1, 16).unsqueeze(1)


def main() -> None:
    step_seconds = float(os.environ.get("DEMO_STEP_SECONDS", "0.03"))
    torch.set_num_threads(1)
    model, optimizer, scheduler = build()
    true_w = true_weights()
    with open_run(heartbeat_interval=0.2) as run:
        target = run.target or 400
        start = run.restore(model=model, optimizer=optimizer, scheduler=scheduler)
        print(f"attempt {run.epoch}: {'resuming at step ' + str(start) if start else 'fresh start'}", flush=True)
        loss = torch.tensor(0.0)
        for step in range(start + 1, target + 1):
            loss = train_step(model, optimizer, scheduler, true_w)
            time.sleep(step_seconds)
            run.heartbeat(step, loss=float(loss))
            if run.should_checkpoint(step):
                run.save(step, model=model, optimizer=optimizer, scheduler=scheduler)
            run.exit_if_stopping(step, model=model, optimizer=optimizer, scheduler=scheduler)
        with torch.no_grad():
            digest = float(sum(p.double().sum() for p in model.parameters()))
        print(f"done: loss={float(loss):.5f} parameter_sum={digest:.10f}", flush=True)
        run.complete(target, loss=float(loss), parameter_sum=digest)


if __name__ == "__main__":
    main()
