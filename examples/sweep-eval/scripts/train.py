"""One member of the learning-rate sweep: trains the model with `--lr`, checkpointing through the
worker SDK (a killed attempt resumes from its newest checkpoint), then leaves its final weights
and its validation loss in run.output_dir, which `run.complete` uploads as the run's outputs:

    model.pt       the final state_dict
    metrics.json   {"lr": ..., "val_loss": ..., "steps": ...}
"""

from __future__ import annotations

import argparse
import json

import torch
from model import build, held_out, loss_on
from torch import nn

from reconciler.worker import open_run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer = build(args.lr)
    with open_run() as run:
        target = run.target or 200
        start = run.restore(model=model, optimizer=optimizer)
        for step in range(start + 1, target + 1):
            x, y = held_out(seed=1000 + step, size=64)  # each step's batch depends on its step alone
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.heartbeat(step, loss=float(loss))
            if run.should_checkpoint(step):
                run.save(step, model=model, optimizer=optimizer)
            run.exit_if_stopping(step, model=model, optimizer=optimizer)
        val_loss = loss_on(model, held_out(seed=1))
        torch.save(model.state_dict(), run.output_dir / "model.pt")
        metrics = {"lr": args.lr, "val_loss": val_loss, "steps": target}
        (run.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"lr={args.lr}: validation loss {val_loss:.6f}", flush=True)
        run.complete(target, val_loss=val_loss)


if __name__ == "__main__":
    main()
