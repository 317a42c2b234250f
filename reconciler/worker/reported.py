"""The metrics a worker reports (`run.heartbeat(step, loss=...)`, the callbacks' logged values):
checked, thinned and written to the run folder beside each heartbeat (adapters/series.py says
where and why). A metric that cannot be kept is said once in the worker's log and left out; it
never stops the training."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from adapters import series
from adapters.storage import RunFolder, StorageError

log = logging.getLogger("reconciler.worker")


class Reported:
    """One attempt's reported metrics: the newest values for the heartbeat, the series for the run."""

    def __init__(self, folder: RunFolder, epoch: int) -> None:
        self.folder, self.epoch = folder, epoch
        self.series = series.Series()
        self._said: set[str] = set()
        self.last: dict[str, float] = {}  # each metric's newest value (every heartbeat and the completion carry them)

    def beat(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Each metric's newest value, for the heartbeat (a metric reported now and then, an eval
        loss, keeps its last value); the values fit to keep are added to the series and written (a
        storage error is only logged: the heartbeat matters more than its metrics)."""
        kept, dropped = series.clean(metrics)
        self.last = {**self.last, **kept}
        for sentence in dropped:
            if sentence not in self._said:
                self._said.add(sentence)
                log.warning("%s", sentence)
        if self.series.add(step, kept):
            try:
                series.write(self.folder.store, self.epoch, self.series)
            except (StorageError, OSError) as exc:
                log.debug("could not write the metrics series: %s", exc)
        return dict(self.last)
