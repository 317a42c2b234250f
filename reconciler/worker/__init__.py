"""Worker SDK: what a training script uses to restore, checkpoint, heartbeat and complete a run.

    from reconciler.worker import open_run

    with open_run() as run:
        start = run.restore(model=model, optimizer=opt, scheduler=sched)
        for step in range(start + 1, total + 1):
            loss = train_step()
            run.heartbeat(step, loss=loss)
            if run.should_checkpoint(step):
                run.save(step, model=model, optimizer=opt, scheduler=sched)
            run.exit_if_stopping(step, model=model, optimizer=opt, scheduler=sched)
        run.complete(total)

A loop over epochs and batches keeps its shape and lets the SDK restore, checkpoint and stop:

    for epoch in run.epochs(n_epochs, model=model, optimizer=opt):
        lr = run.carry(lr=lr)                                  # what one epoch hands the next
        hidden = model.init_hidden(batch_size)
        for i, batch in run.enumerate(loader, carry=lambda: hidden):
            ...
    run.complete()

with the data position saved (`ResumableLoader`, or any sized sequence that repeats itself) and
plain values changed at every step held in a `Carry` (see reconciler/worker/loop.py and data.py).
Training with PyTorch Lightning or Hugging Face's Trainer: one callback does all of the above
(`reconciler.worker.integrations.lightning` / `.huggingface`, optional extras).

See docs/guides/worker-sdk.md for the contract (docs/design.md §3).
"""

from typing import TYPE_CHECKING, Any

from adapters.storage import CheckpointName, StorageError
from reconciler.worker.carried import Carry
from reconciler.worker.loop import EpochLoop
from reconciler.worker.run import EXIT_INTERRUPTED, Run, RunConfigError, Superseded, open_run

if TYPE_CHECKING:
    from reconciler.worker.data import ResumableLoader


def __getattr__(name: str) -> Any:
    """`ResumableLoader` is a torch DataLoader's wrapper: importing it imports torch, so it is
    imported when asked for, and a script that does not use torch never loads it (lazy_torch.py)."""
    if name == "ResumableLoader":
        from reconciler.worker.data import ResumableLoader

        return ResumableLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "EXIT_INTERRUPTED",
    "Carry",
    "CheckpointName",
    "EpochLoop",
    "ResumableLoader",
    "Run",
    "RunConfigError",
    "StorageError",
    "Superseded",
    "open_run",
]
