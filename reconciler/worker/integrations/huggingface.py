"""Hugging Face `transformers.Trainer`: a callback that resumes, checkpoints and completes a run.

    from reconciler.worker.integrations.huggingface import ReconcilerCallback

    callback = ReconcilerCallback()            # opens the run (RECONCILER_* from the environment)
    args = TrainingArguments("out", max_steps=10_000, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.checkpoint_path())

The Trainer writes its own `checkpoint-N/` folder (weights, optimizer, scheduler, RNG states,
trainer state with the global step and epoch) on the SDK's schedule; the SDK stores it verified
and fenced, removes the local copy, and the Trainer's own resume reads it back (skipping the
batches already trained on). A stop notice ends training with a final checkpoint and exit 75.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "reconciler.worker.integrations.huggingface needs transformers: pip install 'reconciler[huggingface]'"
    ) from exc

from reconciler.worker.integrations import files
from reconciler.worker.run import Run, open_run


class ReconcilerCallback(TrainerCallback):  # type: ignore[misc]
    """Restore at train start, save on the SDK's schedule and on a stop notice, heartbeat, complete.

    `run` defaults to `open_run()`. Use `save_strategy="no"` so that only the SDK's schedule saves
    (saves the Trainer makes by its own strategy are stored too, and their folders kept).
    """

    def __init__(self, run: Run | None = None, scratch: str | None = None) -> None:
        self.run = run or open_run()
        self.scratch = files.Scratch(scratch, prefix="reconciler-hf-")
        self.restored_step: int | None = None  # set by checkpoint_path()
        self._requested: int | None = None  # the step whose save this callback asked for
        self._metrics: dict[str, float] = {}

    def checkpoint_path(self) -> str | None:
        """Restore the run's newest good checkpoint to a local folder for
        `train(resume_from_checkpoint=...)`; None on a fresh start."""
        packed: dict[str, Any] = {}
        self.restored_step = self.run.restore(huggingface=packed)
        if self.restored_step == 0:
            return None
        target = f"{PREFIX_CHECKPOINT_DIR}-{self.restored_step}"
        return str(files.unpack(packed, self.scratch.sub(target)))

    # ---- hooks -------------------------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if self.restored_step is None and self.run.folder.accepted_checkpoints():
            raise RuntimeError(
                "this run has a checkpoint but train() was not given it: call "
                "trainer.train(resume_from_checkpoint=callback.checkpoint_path())"
            )
        if self.run.target is None and state.max_steps > 0:
            self.run.target = int(state.max_steps)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._metrics.update({k: v for k, v in (logs or {}).items() if isinstance(v, int | float)})  # train and eval

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        step = state.global_step
        self.run.heartbeat(step, **self._metrics)
        if self.run.should_checkpoint(step):
            control.should_save = True  # the Trainer saves right after this hook, then calls on_save
            self._requested = step

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        step = state.global_step
        folder = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if args.should_save:
            self.run.save(step, huggingface=files.pack(folder))
            if self._requested == step:
                shutil.rmtree(folder, ignore_errors=True)
        self.scratch.exit_if_stopping(self.run, step)  # on a stop notice: this was the final checkpoint; exits 75

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.scratch.tidy()
        self.run.complete(state.global_step, **self._metrics)


__all__ = ["ReconcilerCallback"]
