"""A tiny Hugging Face Trainer job for the integration tests: a one-layer GPT-2 built from a
config (nothing downloaded) on a synthetic token dataset, trained with the SDK's callback.

Run as ``python -m tests.worker.workloads.hf_train '{json cfg}'``. cfg keys: steps, seed, out
(final weights), log (file of "restored N" and "step N" lines), sleep (seconds per step), output_dir.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from reconciler.worker.integrations.huggingface import ReconcilerCallback


def note(cfg: dict[str, Any], line: str) -> None:
    if cfg.get("log"):
        with open(cfg["log"], "a") as fh:
            fh.write(line + "\n")


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, length: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):  # type: ignore[misc]
    """Logs each finished step (before the SDK's callback sees it) and slows training down."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        note(self.cfg, f"step {state.global_step}")
        time.sleep(float(self.cfg.get("sleep", 0)))


def main(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    seed = int(cfg.get("seed", 0))
    set_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    callback = ReconcilerCallback()
    resume = callback.checkpoint_path()
    note(cfg, f"restored {callback.restored_step}")
    args = TrainingArguments(
        output_dir=cfg["output_dir"], max_steps=int(cfg["steps"]), per_device_train_batch_size=8,
        learning_rate=1e-3, lr_scheduler_type="linear", save_strategy="no", logging_steps=5, report_to=[],
        use_cpu=True, seed=seed, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(48, 16), callbacks=[Pace(cfg), callback])
    trainer.train(resume_from_checkpoint=resume)
    if cfg.get("out"):
        torch.save(model.state_dict(), cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
