"""Conditions that hold tick after tick (a remote that does not answer, a change held for its
signature, a provider that is gone) are said once when they start and once when they end, not on
every tick: a keyed latch in front of the log. A condition whose words change (another error from
the same remote) is said again, since that is news.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable


class Conditions:
    """What is being said about each condition now, by key; logs only the changes."""

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self.log, self.level = logger, level
        self._holding: dict[Hashable, str] = {}

    def holds(self, key: Hashable, message: str, level: int | None = None) -> None:
        """The condition `key` holds now, as `message` says: logged when it starts or its words change."""
        if self._holding.get(key) != message:
            self._holding[key] = message
            self.log.log(self.level if level is None else level, "%s", message)

    def ended(self, key: Hashable, message: str | None = None) -> None:
        """The condition `key` no longer holds: said once, in `message` or as "resolved: <what it was>"."""
        was = self._holding.pop(key, None)
        if was is not None:
            self.log.info("%s", message or f"resolved: {was}")

    def exactly(self, group: str, messages: Iterable[str]) -> None:
        """Of the conditions of `group`, each keyed by its own words, exactly `messages` hold now."""
        now = {(group, m): m for m in messages}
        for key in [k for k in self._holding if isinstance(k, tuple) and k[:1] == (group,) and k not in now]:
            self.ended(key)
        for key, message in now.items():
            self.holds(key, message)
