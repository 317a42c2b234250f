"""Workers' reported metrics (loss, accuracy, throughput: whatever `heartbeat()` is given) over steps.

Where they are kept, and why: the worker writes its own attempt's series into the run folder,
`metrics/e<epoch>.json`, whole-file beside each heartbeat. Not in the job's status: the status is
committed to git, and a loss that moves every heartbeat would commit every tick and grow the
file; in run storage the series lives as long as the run's checkpoints, survives any restart of
the reconciler, and costs the reconciler nothing until someone looks (the page, `describe`,
`status --json`). One file per attempt: no attempt can overwrite another's (like `reached-e<N>`),
and a zombie only ever writes its own.

Bounded: at most MAX_POINTS points per attempt, spread over the whole attempt (when full, every
other point is dropped and the stride doubles), at most MAX_NAMES names, finite numbers only,
names of at most 64 plain characters. Reading merges a run's attempts in epoch order; the steps a
resumed attempt did again replace the ones its predecessor did before it was interrupted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.stores import Store

MAX_POINTS = 200  # per attempt
MAX_NAMES = 16  # per run
EPOCHS_READ = 20  # the newest attempts' series a reader merges
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}$")
FOLDER = "metrics"
FILE = re.compile(r"^e(?P<epoch>\d+)\.json$")


def clean(metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
    """The metrics fit to keep (finite numbers under plain names), and a sentence for each one left out."""
    kept: dict[str, float] = {}
    dropped: list[str] = []
    for name, value in metrics.items():
        if not isinstance(name, str) or not NAME.match(name):
            dropped.append(f"metric name {str(name)[:80]!r} is not kept: use letters, digits and _ . : / - "
                           "(at most 64, starting with a letter or _)")
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one value
            dropped.append(f"metric {name} is not kept: {type(value).__name__} is not a number")
            continue
        if not math.isfinite(number):
            dropped.append(f"metric {name} is not kept while it is {number} (only finite values are)")
            continue
        if name not in kept and len(kept) >= MAX_NAMES:
            dropped.append(f"metric {name} is not kept: at most {MAX_NAMES} metrics are")
            continue
        kept[name] = number
    return kept, dropped


@dataclass
class Series:
    """One attempt's points, (step, {name: value}), evenly thinned to at most MAX_POINTS, and the
    newest report besides (so the series always ends where the attempt is)."""

    max_points: int = MAX_POINTS
    points: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    stride: int = 1
    _seen: int = 0
    _tail: tuple[int, dict[str, float]] | None = None

    def add(self, step: int, values: dict[str, float]) -> bool:
        """Keeps every `stride`-th report, and the newest one; True when what is kept changed."""
        if not values:
            return False
        self._seen += 1
        if (self._seen - 1) % self.stride:
            self._tail = (int(step), dict(values))
            return True
        self._tail = None
        if self.points and self.points[-1][0] == step:
            self.points[-1] = (step, {**self.points[-1][1], **values})
            return True
        self.points.append((int(step), dict(values)))
        if len(self.points) > self.max_points:
            self.points = self.points[::2]
            self.stride *= 2
        return True

    def kept(self) -> list[tuple[int, dict[str, float]]]:
        tail = [self._tail] if self._tail and (not self.points or self._tail[0] > self.points[-1][0]) else []
        return self.points + tail

    def record(self, epoch: int) -> bytes:
        return json.dumps({"epoch": epoch, "points": [[s, v] for s, v in self.kept()]}, sort_keys=True).encode()


def write(store: Store, epoch: int, series: Series) -> None:
    store.write(f"{FOLDER}/e{int(epoch)}.json", series.record(epoch))


def read(store: Store, epochs: int = EPOCHS_READ) -> dict[str, list[tuple[int, float]]]:
    """The run's series by metric name, steps ascending, merged over its newest `epochs` attempts.
    A damaged file is skipped (the others still show); a store that cannot be listed raises."""
    found = sorted(int(m["epoch"]) for rel in store.list(FOLDER)
                   if (m := FILE.match(rel.rsplit("/", 1)[-1])))
    merged: list[tuple[int, dict[str, float]]] = []
    for epoch in found[-epochs:]:
        points = _points(store.read(f"{FOLDER}/e{epoch}.json"))
        if points:
            merged = [p for p in merged if p[0] < points[0][0]] + points
    out: dict[str, list[tuple[int, float]]] = {}
    for step, values in merged:
        for name, value in values.items():
            out.setdefault(name, []).append((step, value))
    return dict(sorted(out.items()))


def _points(blob: bytes | None) -> list[tuple[int, dict[str, float]]]:
    if not blob:
        return []
    try:
        data = json.loads(blob)
        points = [(int(s), clean(v)[0]) for s, v in data.get("points", []) if isinstance(v, dict)]
    except (ValueError, TypeError, AttributeError):
        return []
    return sorted((p for p in points if p[1]), key=lambda p: p[0])


def latest(series: Mapping[str, list[tuple[int, float]]]) -> dict[str, dict[str, float]]:
    """Each metric's newest point: {name: {"step": s, "value": v}}."""
    return {name: {"step": pts[-1][0], "value": pts[-1][1]} for name, pts in series.items() if pts}


__all__ = ["MAX_NAMES", "MAX_POINTS", "Series", "clean", "latest", "read", "write"]
