"""An in-memory state repository with StateRepo's methods, for the simulation.

Why: the real StateRepo shells out to git, which would make a simulated day of ticks take hours
and hide the loop's own cost. This keeps git's semantics that the loop relies on: immutable
commits, reading `desired/` and `status/` at a commit, `last_change`, status-only commits,
and a remote that a person pushes to, which the reconciler pulls from (rebasing its own status
commits on top) and pushes to. Faults: a rejected push or a failed pull (GitError), and a hook
the driver uses to crash the reconciler at a chosen call.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.gitrepo import STATUS_DIR, GitError
from desired.parse import SETTINGS_FILE


@dataclass(frozen=True)
class Commit:
    id: str
    parent: str | None
    files: dict[str, bytes]
    changed: frozenset[str]
    message: str
    author: str


@dataclass
class RepoFaults:
    push_reject_rate: float = 0.0
    pull_error_rate: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    hook: Callable[[str], None] | None = None
    rejected_pushes: int = 0


class SimRepo:
    """`remote_head` is the shared repository; `local` is the reconciler's clone (it survives a crash,
    like a clone on disk). People commit to the remote."""

    def __init__(self, files: dict[str, bytes] | None = None, faults: RepoFaults | None = None) -> None:
        self.commits: dict[str, Commit] = {}
        self.faults = faults or RepoFaults()
        root = self._make(None, dict(files or {}), "initial", "alice")
        self.root = root
        self.remote_head = root
        self.remote: str | None = "origin"  # the remote's name; the loop sets it from reconciler.yaml
        self.local = root
        self.base = root  # the remote commit the local clone is built on
        self.unpushed: list[tuple[dict[str, bytes | None], str]] = []
        self._last_change: dict[tuple[str, tuple[str, ...]], str | None] = {}

    def _make(self, parent: str | None, files: dict[str, bytes], message: str, author: str,
              changed: frozenset[str] | None = None) -> str:
        digest = hashlib.sha1(f"{parent}:{len(self.commits)}:{message}".encode()).hexdigest()
        if changed is None:
            changed = frozenset(files)
        self.commits[digest] = Commit(digest, parent, files, changed, message, author)
        return digest

    @staticmethod
    def _apply(files: dict[str, bytes], change: dict[str, bytes | None]) -> tuple[dict[str, bytes], set[str]]:
        out = dict(files)
        touched = set()
        for path, data in change.items():
            if data is None:
                if path in out:
                    del out[path]
                    touched.add(path)
            elif out.get(path) != data:
                out[path] = data
                touched.add(path)
        return out, touched

    def _hook(self, what: str) -> None:
        if self.faults.hook is not None:
            self.faults.hook(what)

    # ---- what a person does ------------------------------------------------------------------
    def user_commit(self, change: dict[str, bytes | None], message: str = "edit") -> str:
        files, touched = self._apply(self.commits[self.remote_head].files, change)
        self.remote_head = self._make(self.remote_head, files, message, "alice", frozenset(touched))
        return self.remote_head

    # ---- StateRepo's reading side ----------------------------------------------------------------
    def head(self) -> str:
        return self.local

    def root_commit(self) -> str:
        return self.root

    def read_files(self, commit: str, folder: str) -> dict[str, bytes]:
        prefix = folder.rstrip("/") + "/"
        return {p: b for p, b in self.commits[commit].files.items() if p.startswith(prefix)}

    def read_file(self, commit: str, path: str) -> bytes | None:
        return self.commits[commit].files.get(path)

    def read_settings(self, commit: str) -> bytes | None:
        return self.read_file(commit, SETTINGS_FILE)

    def tree_id(self, commit: str, folder: str) -> str | None:
        files = self.read_files(commit, folder)
        if not files:
            return None
        h = hashlib.sha1()
        for p in sorted(files):
            h.update(p.encode() + b"\0" + hashlib.sha1(files[p]).digest())
        return h.hexdigest()

    def last_change(self, commit: str, paths: list[str]) -> str | None:
        key_paths = tuple(paths)
        chain: list[str] = []
        cur: str | None = commit
        found: str | None = None
        while cur is not None:
            if (cur, key_paths) in self._last_change:
                found = self._last_change[(cur, key_paths)]
                break
            c = self.commits[cur]
            if any(p == q or p.startswith(q.rstrip("/") + "/") for p in c.changed for q in paths):
                found = cur
                chain.append(cur)
                break
            chain.append(cur)
            cur = c.parent
        for cid in chain:
            self._last_change[(cid, key_paths)] = found
        return found

    def messages_since(self, commit: str, since: str, limit: int = 200) -> list[str]:
        out: list[str] = []
        cur: str | None = commit
        while cur is not None and len(out) < limit:
            out.append(self.commits[cur].message)
            if cur == since:
                break
            cur = self.commits[cur].parent
        return out

    # ---- writing ---------------------------------------------------------------------------------
    def commit_status(self, files: dict[str, str | None], message: str) -> str | None:
        self._hook("git.commit")
        change: dict[str, bytes | None] = {}
        for rel, text in files.items():
            if not rel.startswith(STATUS_DIR + "/") or ".." in rel.split("/"):
                raise GitError(f"refusing to write {rel!r}: the reconciler writes only under status/")
            change[rel] = None if text is None else text.encode()
        new_files, touched = self._apply(self.commits[self.local].files, change)
        if not touched:
            return None
        self.local = self._make(self.local, new_files, message, "reconciler", frozenset(touched))
        self.unpushed.append(({p: change[p] for p in touched}, message))
        self._hook("git.commit.done")
        return self.local

    def _rebase(self) -> None:
        """Replays unpushed status commits on the remote's head (they touch only status/)."""
        if self.base == self.remote_head:
            return
        head = self.remote_head
        for change, message in self.unpushed:
            files, touched = self._apply(self.commits[head].files, change)
            if touched:
                head = self._make(head, files, message, "reconciler", frozenset(touched))
        self.local = head
        self.base = self.remote_head

    def pull(self) -> None:
        self._hook("git.pull")
        if self.faults.pull_error_rate and self.faults.rng.random() < self.faults.pull_error_rate:
            raise GitError("cannot update from remote 'origin': injected fetch failure")
        self._rebase()

    def push(self) -> None:
        self._hook("git.push")
        if self.faults.push_reject_rate and self.faults.rng.random() < self.faults.push_reject_rate:
            self.faults.rejected_pushes += 1
            raise GitError("cannot push status to 'origin' after 5 tries: injected rejection; the commits "
                           "stay local and go out with the next push")
        self._rebase()
        self.remote_head = self.local
        self.base = self.local
        self.unpushed = []
        self._hook("git.push.done")
