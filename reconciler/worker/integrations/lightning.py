"""PyTorch Lightning: a callback that resumes, checkpoints and completes a run through the SDK.

    from reconciler.worker.integrations.lightning import ReconcilerCallback

    callback = ReconcilerCallback()            # opens the run (RECONCILER_* from the environment)
    trainer = lightning.Trainer(max_steps=10_000, callbacks=[callback], enable_checkpointing=False)
    trainer.fit(model, datamodule, ckpt_path=callback.checkpoint_path())

Lightning writes its own full checkpoint (weights, optimizers, schedulers, loop position,
callbacks) into a local scratch folder on the SDK's schedule; the SDK stores it verified and
fenced, and Lightning's own resume reads it back. A stop notice ends `fit` with a final
checkpoint and exit code 75, as the SDK does.
"""

from __future__ import annotations

import shutil
from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "reconciler.worker.integrations.lightning needs PyTorch Lightning: pip install 'reconciler[lightning]'"
    ) from exc

from reconciler.worker import snapshot
from reconciler.worker.integrations import files
from reconciler.worker.run import Run, open_run

CKPT = "last.ckpt"


class ReconcilerCallback(Callback):
    """Restore at fit start, save on the SDK's schedule and on a stop notice, heartbeat, complete.

    `run` defaults to `open_run()`; open it before `fit` (as this constructor does) so that the
    SDK's SIGTERM handler is in place when Lightning adds its own next to it.
    """

    def __init__(self, run: Run | None = None, scratch: str | None = None) -> None:
        self.run = run or open_run()
        self.scratch = files.Scratch(scratch, prefix="reconciler-lightning-")
        self.restored_step: int | None = None  # set by checkpoint_path()
        self._rng: dict[str, Any] | None = None  # the restored RNG states, until the first batch
        self._epoch_rng: dict[str, Any] | None = None  # the RNG states when the resumed epoch started

    def checkpoint_path(self) -> str | None:
        """Restore the run's newest good checkpoint to a local file for `fit(ckpt_path=...)`;
        None on a fresh start."""
        packed: dict[str, Any] = {}
        self.restored_step = self.run.restore(lightning=packed)
        if self.restored_step == 0:
            return None
        self._rng = snapshot.rng_state()
        folder = files.unpack(packed, self.scratch.sub(f"restored-{self.restored_step}"))
        return str(folder / CKPT)

    # ---- hooks -------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.restored_step is None and self.run.folder.accepted_checkpoints():
            raise RuntimeError(
                "this run has a checkpoint but fit() was not given it: call "
                "trainer.fit(..., ckpt_path=callback.checkpoint_path())"
            )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.run.target is None:
            total = trainer.estimated_stepping_batches
            self.run.target = int(total) if total != float("inf") else None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._rng is not None and self._epoch_rng is None:
            self._epoch_rng = snapshot.rng_state()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # A resumed fit makes random draws an uninterrupted one does not (Lightning creates the
        # data iterator a second time, and each creation draws a seed), which would shift every
        # later dropout mask. Before the first batch, put back what the uninterrupted run had:
        # mid-epoch, the checkpoint's RNG states; at an epoch's start, the states after that
        # epoch's one iterator was created (as they were when the epoch started here).
        rng, epoch_rng = self._rng, self._epoch_rng
        self._rng = self._epoch_rng = None
        if rng is not None:
            snapshot.set_rng_state(rng if batch_idx > 0 or epoch_rng is None else epoch_rng)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        self.run.heartbeat(step, **_metrics(trainer, outputs))
        if self.run.should_checkpoint(step):
            self.save(trainer)
        self.scratch.exit_if_stopping(self.run, step)  # saved just above: should_checkpoint is true on a notice

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A SIGTERM that lands after on_train_batch_end looked is seen by Lightning's own handler,
        # which ends the loop with SIGTERMException, a SystemExit with code 0: the process would
        # exit 0 as if done. Take the final checkpoint here instead and leave with 75.
        if not isinstance(exception, SIGTERMException) or not self.run.stop_requested:
            return
        self.save(trainer)
        self.scratch.exit_if_stopping(self.run, trainer.global_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.scratch.tidy()
        self.run.complete(trainer.global_step)

    # ---- saving ------------------------------------------------------------------------------------------
    def save(self, trainer: Trainer) -> None:
        """Checkpoint now: Lightning writes its checkpoint locally, the SDK stores it."""
        step = trainer.global_step
        folder = self.scratch.path / f"save-{step}"
        trainer.save_checkpoint(folder / CKPT)
        try:
            self.run.save(step, lightning=files.pack(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _metrics(trainer: Trainer, outputs: Any) -> dict[str, Any]:
    """The batch's loss and what the module logs (`self.log`), as they are: the SDK turns them into
    numbers only when it writes a heartbeat (a tensor's value waits for the GPU)."""
    logged = dict(getattr(trainer, "callback_metrics", None) or {})
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if loss is not None:
        logged.setdefault("loss", loss.detach() if hasattr(loss, "detach") else loss)
    return logged
