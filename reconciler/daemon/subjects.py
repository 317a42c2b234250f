"""The message of a status commit: a subject within git's 72 characters that names each job and
what happened to it, so that `git log --oneline` reads as the audit trail; the body holds every
change whole, one line a job, when the subject had to shorten anything."""

from __future__ import annotations

import re

from status.models import JobStatus

SUBJECT_LIMIT = 72
_CLAUSE_END = re.compile(r" \(|; |, ")  # where a message's first clause ends


def _drill(old: JobStatus | None, new: JobStatus) -> str:
    """`train: drill exact` (or `drill diverged: first difference at step 21`) when this change
    holds a drill's verdict; "" otherwise."""
    d = new.drill
    if d is None or d.verdict is None or (old is not None and old.drill == d):
        return ""
    what = f"{new.job}: drill {d.verdict}"
    clause = _first_clause(d.detail)
    return f"{what}: {clause}" if d.verdict not in ("exact", "within tolerance") and clause else what


def _what(old: JobStatus | None, new: JobStatus) -> str:
    """What happened to one job, in a few words: `train: Running -> Succeeded`."""
    if drilled := _drill(old, new):
        return drilled
    if old is None or old.phase == new.phase:
        if old is not None and old.progress.step != new.progress.step:
            pct = new.progress.percent()
            return f"{new.job}: step {new.progress.step}" + (f" ({pct:.0f}%)" if pct is not None else "")
        return f"{new.job}: {new.phase.value}"
    return f"{new.job}: {old.phase.value} -> {new.phase.value}"


def _first_clause(message: str) -> str:
    cut = _CLAUSE_END.search(message)
    return message[:cut.start()] if cut else message


def _launch(old: JobStatus | None, new: JobStatus) -> str:
    """`train: attempt 3 on local after interrupted: killed by SIGKILL` when this change launched
    an attempt (why: how the one before it ended); "" otherwise."""
    launched = new.current
    if launched is None or new.total_attempts <= (old.total_attempts if old is not None else 0):
        return ""
    what = f"{new.job}: attempt {launched.epoch} on {launched.provider}"
    before = new.attempts[-2] if new.total_attempts > 1 and len(new.attempts) > 1 else None
    return f"{what} after {_first_clause(before.detail)}" if before is not None and before.detail else what


def _one(line: str, old: JobStatus | None, new: JobStatus, message: str) -> str:
    """One job's subject: the whole change line if it fits, else the first of shorter tellings that does."""
    what = _what(old, new)
    clause = _first_clause(message)
    live = new.current
    where = f"{what} (attempt {live.epoch} on {live.provider})" if live is not None else ""
    for candidate in (_drill(old, new), line, _launch(old, new), f"{what} ({clause})" if clause else "", where, what):
        if candidate and len(candidate) <= SUBJECT_LIMIT:
            return candidate
    return what[:SUBJECT_LIMIT]


def _by_sweep(changes: list[tuple[JobStatus | None, JobStatus]]) -> list[tuple[str, int]]:
    """Each job's few words and how many jobs they tell of: the members of one sweep to which the
    same happened are told once, in the place of the first (`sweep lr: 12 members Running -> Succeeded`)."""
    told = [(new.sweep, _what(old, new).removeprefix(f"{new.job}: ")) for old, new in changes]
    alike: dict[tuple[str | None, str], int] = {}
    for sweep, what in told:
        if sweep:
            alike[(sweep, what)] = alike.get((sweep, what), 0) + 1
    pieces: dict[str, int] = {}
    for (sweep, what), (_, new) in zip(told, changes, strict=True):
        count = alike.get((sweep, what), 0)
        if count < 2:
            pieces[f"{new.job}: {what}"] = 1
        else:
            pieces[f"sweep {sweep}: {count} members {what}"] = count
    return list(pieces.items())


def status_message(lines: list[str], changes: list[tuple[JobStatus | None, JobStatus]], messages: list[str]) -> str:
    """`lines` are the whole change lines (redacted, one line each), `changes` the (old, new) status
    of each job in the same order and `messages` their redacted messages."""
    if len(lines) == 1:
        subject = _one(lines[0], *changes[0], messages[0])
    else:
        pieces = _by_sweep(changes)
        subject = ""
        for n in range(len(pieces), 0, -1):  # as many jobs as fit, then how many more
            rest = sum(count for _, count in pieces[n:])
            subject = "; ".join(p for p, _ in pieces[:n]) + (f"; {rest} more job{'s' if rest > 1 else ''}"
                                                            if rest else "")
            if len(subject) <= SUBJECT_LIMIT:
                break
        else:
            subject = f"{len(changes)} jobs changed"
    if len(lines) == 1 and subject == lines[0]:
        return subject
    return subject + "\n\n" + "\n".join(f"- {line}" for line in lines)
