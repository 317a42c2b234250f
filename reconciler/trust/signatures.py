"""Walks the history of the guarded paths and keeps the trust verdicts of reconciler.trust.policy, so a
tick re-checks only the commits that arrived since the last one (a restart or a rewritten history
walks again from the first commit; the signatures are in git, so nothing else is remembered)."""

from __future__ import annotations

import logging
import posixpath
from dataclasses import replace

from adapters.gitrepo import DESIRED_DIR
from adapters.signatures import Signatures
from desired.models import SignaturePolicy
from desired.parse import SETTINGS_FILE, DesiredState, ManifestError, parse_settings
from reconciler.trust.policy import Trust, Verdict, advance, judge, unguarded

log = logging.getLogger("reconciler")


class SignedHistory:
    def __init__(self, signatures: Signatures, subdir: str = "") -> None:
        self.sig = signatures
        # The state's folder in a monorepo (--path): its reconciler.yaml binds, and so does the one at
        # the repository root where the folder's sets no `signatures:` (settings_files).
        self.subdir = subdir
        self._head: str | None = None
        self._trust = Trust()
        self._policy: SignaturePolicy | None = None
        # A commit's verdict under the keys of a trusted commit does not change: a rebase of our own
        # status commits (which makes the walk start over) checks no signature twice.
        self._verdicts: dict[tuple[str, str, SignaturePolicy], Verdict] = {}
        self._anchor: str | None = None  # as last written to the anchor ref by this process

    def trust(self, head: str) -> Trust:
        before = self._trust.held
        recheck = bool(self._trust.held) and on_machine(self._policy)  # a key file here may have been edited
        if self._head == head and not recheck:
            return self._trust
        if self._head is None or not self.sig.is_ancestor(self._head, head):
            self._start(head)  # first walk, or history rewritten
        elif recheck:
            self._head, self._trust = self._trust.acted, Trust(self._trust.acted)  # judge the held ones again
        since, trust, policy = self._head, self._trust, self._policy
        while True:
            if policy is None:  # only a change to the settings can turn the checks on
                since, trust, policy = self._unguarded(head, since, trust)
                if policy is None:
                    break
            restart = False
            for commit in self.sig.changes(head, since, guarded_paths(policy, self.subdir)):
                verdict = self._verdict(commit, policy, trust.acted or commit)
                trust = advance(trust, verdict)
                if not verdict.trusted:
                    continue
                new_policy = self._policy_at(commit, policy)
                if new_policy != policy:
                    since, policy, restart = commit, new_policy, True  # other keys or files from here on
                    break
            if not restart:
                break
        if trust.held and trust.held != before:
            log.warning("commit %s held: %s", trust.held[-1].commit[:12], trust.held[-1].reason)
        self._head, self._trust, self._policy = head, trust, policy
        self._keep_anchor(trust, policy)
        return trust

    def _start(self, head: str) -> None:
        """Where a walk starts. Once signatures were asked for, the last trusted change is kept in a
        ref of this clone alone, so neither a restart nor a rewritten history (a force-push to
        origin of one that never asked for signatures) can make the checks start over unguarded:
        the new commits are judged with the keys of that change."""
        if self._head is None:
            self._anchor = self.sig.anchor(self.subdir)
        anchor = self._trust.acted if self._policy is not None else self._anchor
        policy = self._policy if self._policy is not None else (
            self._policy_at(anchor, None) if anchor else None)
        if anchor is None or policy is None:
            self._head, self._trust, self._policy = None, Trust(), None  # from the first commit
            return
        if self.sig.is_ancestor(anchor, head):
            self._head = anchor
        else:
            self._head = self.sig.merge_base(anchor, head)
            log.warning("history rewritten: the changes after %s are judged with the keys of %s, the last trusted "
                        "change", (self._head or "the first commit")[:12], anchor[:12])
        self._trust, self._policy = Trust(anchor), policy

    def _keep_anchor(self, trust: Trust, policy: SignaturePolicy | None) -> None:
        if trust.acted and (policy is not None or self._anchor is not None) and trust.acted != self._anchor:
            self.sig.set_anchor(trust.acted, self.subdir)
            self._anchor = trust.acted

    def _verdict(self, commit: str, policy: SignaturePolicy, at: str) -> Verdict:
        key = (commit, at, policy)
        if key in self._verdicts:
            return self._verdicts[key]
        check = self.sig.check(commit, policy, at)
        verdict = judge(commit, check.code, check.key, check.signer, check.problem)
        if verdict.trusted or not on_machine(policy):  # a key file on this machine may be edited: ask it again
            self._verdicts[key] = verdict
        return verdict

    def _unguarded(self, head: str, since: str | None, trust: Trust) -> tuple[str | None, Trust,
                                                                              SignaturePolicy | None]:
        """Trusts every change up to the first settings change that asks for signatures (or HEAD)."""
        for commit in self.sig.changes(head, since, settings_files(self.subdir)):
            policy = self._policy_at(commit, None)
            if policy is not None:
                for earlier in self.sig.changes(commit, since, guarded_paths(None, self.subdir))[-1:]:
                    trust = advance(trust, unguarded(earlier))
                return commit, trust, policy
        for last in self.sig.changes(head, since, guarded_paths(None, self.subdir))[-1:]:
            trust = advance(trust, unguarded(last))
        return head, trust, None

    def _policy_at(self, commit: str, previous: SignaturePolicy | None) -> SignaturePolicy | None:
        """The signature policy a trusted commit sets: the state folder's, else the repository
        root's, with key paths made relative to the repository. Settings with errors keep the
        previous one: a broken reconciler.yaml must not switch the checks off."""
        for path in settings_files(self.subdir):
            settings, errors = parse_settings(self.sig.read(commit, path))
            if errors:
                return previous
            if settings.signatures is not None:
                return in_repository(settings.signatures, path.rpartition("/")[0])
        return None


def settings_files(subdir: str) -> list[str]:
    """The reconciler.yaml files whose `signatures:` bind, first the one that wins: the state
    folder's, then (in a monorepo) the repository root's, so that a repository whose owner asked
    for signatures cannot be acted on unsigned by naming one of its folders."""
    return [f"{subdir}/{SETTINGS_FILE}", SETTINGS_FILE] if subdir else [SETTINGS_FILE]


def in_repository(policy: SignaturePolicy, folder: str) -> SignaturePolicy:
    """The policy of the reconciler.yaml in `folder`, its key files named from the repository root
    (a relative key path is relative to the folder of the reconciler.yaml that names it)."""
    def moved(path: str | None) -> str | None:
        if not path or path.startswith(("/", "~")):
            return path  # a file on the daemon's machine
        return posixpath.normpath(posixpath.join(folder, path))  # `./keys` and `keys` name one blob
    return policy.model_copy(update={"allowed_signers": moved(policy.allowed_signers),
                                     "gpg_keys": moved(policy.gpg_keys)})


def guarded_paths(policy: SignaturePolicy | None, subdir: str = "") -> list[str]:
    """What a change must be signed to touch: desired state, settings (the root's too, in a
    monorepo) and the allowed keys kept in the repository."""
    paths = [f"{subdir}/{DESIRED_DIR}" if subdir else DESIRED_DIR, *settings_files(subdir)]
    if policy is not None:
        paths += [p for p in (policy.allowed_signers, policy.gpg_keys) if p and not p.startswith(("/", "~"))]
    return paths


def with_hold(desired: DesiredState, held: str | None, errors: list[str]) -> DesiredState:
    """The desired state with the hold listed among its errors (status/README.md shows them)."""
    if held is None:
        return desired
    errors.append(held)
    return replace(desired, errors=[*desired.errors, ManifestError("signatures", held)])


def on_machine(policy: SignaturePolicy | None) -> bool:
    """The policy names a key file on the daemon's machine (read anew on every check)."""
    return policy is not None and any(p and p.startswith(("/", "~")) for p in (policy.allowed_signers,
                                                                                 policy.gpg_keys))
