"""What an attempt hands over at its ends: at the start, its folders (RECONCILER_OUTPUT_DIR and
RECONCILER_INPUT_DIR, the inputs fetched) and the tidying of what killed attempts left; at the end,
its outputs for the completion record (adapters/artifacts.py has the format)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from adapters import artifacts, series
from adapters.storage import LEASE_LOG, RunFolder, StorageError
from reconciler.worker.dist import Group
from reconciler.worker.storefault import StoreFaults

log = logging.getLogger("reconciler.worker")


def outputs_record(folder: RunFolder, epoch: int, source: Path | None, faults: StoreFaults) -> dict[str, Any]:
    """The files in `source`, uploaded under this epoch: {"outputs": ...} for the completion record,
    or {} when there are none. A replaced attempt uploads nothing (its lease check)."""
    if source is None:
        return {}
    folder.check_epoch(epoch)
    found = faults.retrying(lambda: artifacts.upload_outputs(folder, epoch, source), "upload the outputs")
    return {"outputs": found} if found is not None else {}


def attempt_dirs(folder: RunFolder, group: Group, storage_options: dict[str, Any] | None) -> tuple[Path, Path]:
    """The attempt's output and input folders (set in the environment for its child processes),
    with the inputs downloaded and verified: by the first process on each machine, the others wait."""
    output_dir, input_dir = artifacts.attempt_dirs(os.environ)
    error = None
    if os.environ.get("LOCAL_RANK", "0") == "0":
        options = storage_options if storage_options is not None else folder.store.storage_options
        try:
            artifacts.fetch_inputs(folder, os.environ, input_dir, options)
        except StorageError as exc:
            error = str(exc)
    failed = [e for e in group.all_gather(error) if e]  # every rank waits for every machine's inputs
    if failed:
        raise artifacts.ArtifactError(f"the inputs could not be fetched: {failed[0]}")
    return output_dir, input_dir


def tidy(folder: RunFolder, epoch: int) -> None:
    """What killed attempts left behind: temp files of interrupted atomic writes, and the step
    marks of attempts the reconciler has already judged (the previous epoch's is kept for it)."""
    try:
        removed = folder.store.remove_stale_temp_files("", LEASE_LOG, "logs", series.FOLDER)
        folder.forget_reached(before_epoch=epoch - 1)
    except (StorageError, OSError) as exc:
        log.debug("could not tidy the run folder: %s", exc)
        return
    if removed:
        log.info("removed temporary files left by a killed writer: %s", ", ".join(removed))
