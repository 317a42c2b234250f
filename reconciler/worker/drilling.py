"""This attempt's part in a drill (adapters/drills.py, docs/guides/drills.md).

The drilled attempt (the request names its epoch): after its next durable checkpoint N it keeps the
exact metrics of steps N+1..N+K and holds every later save, so that whatever ends it, the run can
only resume at N; once the lookahead is done it writes them and goes on until the reconciler kills
it. A notice drill holds nothing: its final checkpoint and the grace it used are written on the way
out. The next attempt (a later epoch) reports the step it restored and the metrics of the same steps.
Every storage error is only logged: a drill must never break the training it checks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from adapters import drills, series
from adapters.storage import RunFolder, StorageError

log = logging.getLogger("reconciler.worker")


class Drilling:
    def __init__(self, folder: RunFolder, epoch: int, clock: Any = time.monotonic) -> None:
        self.folder, self.epoch, self._clock = folder, epoch, clock
        self._checked = False
        self._forget()

    def _forget(self) -> None:
        """No drill taken up (yet, or any more)."""
        self.request: drills.Request | None = None
        self.step: int | None = None  # N: the checkpoint the window starts after
        self._last: int | None = None  # the last step of the window (after side: the before side's last)
        self._started = 0.0
        self.points: drills.Points = {}
        self.written = False
        self.after = False  # this attempt is the resumed one

    @property
    def holding(self) -> bool:
        """Saves are held: a hard drill's lookahead has begun (the run must resume at N)."""
        return self.step is not None and not self.after and self.request is not None and not self.request.notice

    @property
    def armed(self) -> bool:
        """The drilled attempt of a hard drill, waiting for its next durable checkpoint."""
        return (self.request is not None and not self.after and not self.request.notice and self.step is None)

    def check(self) -> None:
        """Read the request (at open and at heartbeat cadence, as stop.json is read); a new request
        once this attempt's part in the last one is written (the resumed attempt may be drilled next)."""
        self._checked = True
        if self.request is not None and not self.written:
            return
        try:
            request = drills.read_request(self.folder)
            if request is None or request.epoch > self.epoch or (self.request and request.id == self.request.id):
                return
            self._forget()
            if request.epoch == self.epoch:
                self.request = request
                self._take(request)
                log.warning("drill %s requested: %s", request.id, "stopping on the provider's notice" if request.notice
                            else f"after the next checkpoint, {request.lookahead} steps are run and then killed")
                return
            self._resumed_side(request)
        except StorageError as exc:
            log.debug("could not read the drill request: %s", exc)

    def _take(self, request: drills.Request) -> None:
        """Tell the reconciler this attempt will drill (it gives up on a request no one takes)."""
        try:
            self.folder.write_json(drills.taken_name(request.id), {"epoch": self.epoch})
        except (StorageError, OSError) as exc:
            log.warning("drill %s: could not say it was taken up (%s)", request.id, exc)

    def _resumed_side(self, request: drills.Request) -> None:
        if drills.read_side(self.folder, drills.after_name(request.id)) is not None:
            return
        before = drills.read_side(self.folder, drills.before_name(request.id))
        if before is None or before.epoch >= self.epoch:
            return
        self.request, self.after, self.step = request, True, before.step
        self._last = max(before.points, default=before.step)

    def saved(self, step: int) -> None:
        """A checkpoint of `step` is durable: an armed hard drill starts its lookahead here."""
        if self.armed:
            self.step, self._started = step, self._clock()
            log.warning("drill: checkpoint of step %d is durable; later saves are held for the drill", step)

    def restored(self, step: int) -> None:
        """The resumed attempt restored `step`: a step other than N is written at once (a failed resume)."""
        if not self._checked:
            self.check()
        if self.after and self.step is not None and not self.written and step != self.step:
            self._write(drills.Side(self.epoch, step, {}))

    def seen(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Every reported step (never thinned) inside the window is kept; the window's end writes it."""
        if not self._checked:
            self.check()
        if self.request is None or self.step is None or self.written:
            return
        if self.after and not self.points and step <= self.step:
            self._write(drills.Side(self.epoch, step - 1, {}))  # restarted below N: nothing was restored
            return
        if step > self.step:
            self.points.setdefault(int(step), {}).update(series.clean(metrics)[0])
        if self._window_done(step):
            self._write(drills.Side(self.epoch, self.step, dict(self.points)))

    def _window_done(self, step: int) -> bool:
        assert self.request is not None and self.step is not None
        if self.after:
            return self._last is not None and step >= self._last
        return len(self.points) >= self.request.lookahead or (
            bool(self.points) and self._clock() - self._started >= drills.LOOKAHEAD_SECONDS)

    def stopped(self, step: int, grace_used: float) -> None:
        """A notice drill's attempt saved `step` on its way out, `grace_used` seconds after the notice."""
        self.check()  # the notice may come before the heartbeat that would have read the request
        if self.request is not None and self.request.notice and not self.after and not self.written:
            self._write(drills.Side(self.epoch, step, {}, grace_used=grace_used))

    def _write(self, side: drills.Side) -> None:
        assert self.request is not None
        name = drills.after_name(self.request.id) if self.after else drills.before_name(self.request.id)
        try:
            drills.write_side(self.folder, name, side)
            self.written = True
            log.warning("drill %s: %s written (step %d, %d steps of metrics)", self.request.id,
                        "the resumed side" if self.after else "the lookahead", side.step, len(side.points))
        except (StorageError, OSError) as exc:
            log.warning("drill %s: could not write its record (%s); the next step tries again", self.request.id, exc)
