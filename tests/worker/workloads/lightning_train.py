"""A tiny PyTorch Lightning job for the integration tests: an MLP with dropout, AdamW and a
per-step StepLR on a shuffled synthetic dataset (torchdata's StatefulDataLoader, whose position
Lightning checkpoints), trained with the SDK's Lightning callback.

Run as ``python -m tests.worker.workloads.lightning_train '{json cfg}'``. cfg keys: steps, seed,
out (final weights), log (file of "restored N" and "step N" lines), sleep (seconds per step),
term_at (a step at whose end the job SIGTERMs itself, after the SDK's callback ran).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import lightning
import torch
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from reconciler.worker.integrations.lightning import ReconcilerCallback


def note(cfg: dict[str, Any], line: str) -> None:
    if cfg.get("log"):
        with open(cfg["log"], "a") as fh:
            fh.write(line + "\n")


class Tiny(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.1), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return ((self.net(x) - y) ** 2).mean()

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Pace(lightning.Callback):
    """Logs each finished step (before the SDK's callback sees it) and slows training down."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        note(self.cfg, f"step {trainer.global_step}")
        time.sleep(float(self.cfg.get("sleep", 0)))


class LateSigterm(lightning.Callback):
    """SIGTERMs this process at step cfg["term_at"], after the SDK's callback has looked at the
    step: Lightning's own handler then ends the loop, and the SDK's callback saves on that."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.cfg.get("term_at"):
            os.kill(os.getpid(), signal.SIGTERM)


def main(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    lightning.seed_everything(int(cfg.get("seed", 0)), verbose=False)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 4))
    # Lightning saves and restores the position of a stateful loader: exact resume mid-epoch
    loader = StatefulDataLoader(data, batch_size=8, shuffle=True)
    model = Tiny()
    callback = ReconcilerCallback()
    ckpt_path = callback.checkpoint_path()
    note(cfg, f"restored {callback.restored_step}")
    trainer = lightning.Trainer(
        max_steps=int(cfg["steps"]), accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[Pace(cfg), callback, LateSigterm(cfg)],
    )
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    if cfg.get("out"):
        torch.save(model.state_dict(), cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
