"""Which commit of desired state to act on, when reconciler.yaml asks for signed changes (pure).

The changes to the guarded paths (desired/, reconciler.yaml, an allowed-keys file kept in the
repository) are taken oldest first. Each is judged against the keys allowed at the last trusted
change: one that verifies becomes the trusted change (its signature covers its whole tree,
including earlier unsigned changes its signer built on), one that does not is held. The daemon
acts on HEAD while nothing is held (status commits need no signature), else on the last trusted
change, and says which commit it holds and why.
"""

from __future__ import annotations

from dataclasses import dataclass

# What `git log --format=%G?` means when only the allowed keys are in view.
REASONS = {
    "N": "it is not signed",
    "B": "its signature does not verify (the commit was changed after signing, or the signature is damaged)",
    "U": "it is signed by a key that is not allowed",
    "E": "it is signed by a key that is not allowed (or its signature cannot be checked)",
    "X": "its signature has expired",
    "Y": "it is signed by an expired key",
    "R": "it is signed by a revoked key",
}


@dataclass(frozen=True)
class Verdict:
    commit: str
    trusted: bool
    reason: str


@dataclass(frozen=True)
class Trust:
    acted: str | None = None  # the newest trusted change (None: no change yet)
    held: tuple[Verdict, ...] = ()  # later changes that did not verify, oldest first


def judge(commit: str, code: str, key: str = "", signer: str = "", problem: str = "") -> Verdict:
    """A verdict from git's signature check of one commit."""
    if problem:
        return Verdict(commit, False, problem)
    if code == "G":
        return Verdict(commit, True, f"signed by {signer or key}")
    reason = REASONS.get(code, f"its signature cannot be checked (git says {code!r})")
    return Verdict(commit, False, reason + (f" ({key})" if key and code in "UEYR" else ""))


def unguarded(commit: str) -> Verdict:
    """A change made while no signatures were asked for is trusted as it is."""
    return Verdict(commit, True, "no signatures were required")


def advance(trust: Trust, verdict: Verdict) -> Trust:
    if verdict.trusted:
        return Trust(verdict.commit, ())
    return Trust(trust.acted, (*trust.held, verdict))


def act_on(head: str, trust: Trust) -> str:
    """The commit whose desired state the tick reads."""
    if trust.held and trust.acted is not None:
        return trust.acted
    return head


def hold_note(trust: Trust) -> str | None:
    """One line for the status while a change is held; None when nothing is."""
    if not trust.held:
        return None
    newest = trust.held[-1]
    more = f" (and {len(trust.held) - 1} earlier unverified change(s))" if len(trust.held) > 1 else ""
    acting = f"acting on {trust.acted[:12]}" if trust.acted else "acting on nothing"
    return (f"commit {newest.commit[:12]} is held: {newest.reason}{more}; {acting} until a change signed by "
            "an allowed key arrives")
