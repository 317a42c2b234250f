"""The state repository: read `desired/` at a commit, write `status/`, commit, and push.

Status commits touch only `status/` (a person's staged changes are never swept in), use the
configured identity, and reach the remote by fetch-rebase-push with retries; never a force push.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import git

from desired.parse import SETTINGS_FILE

STATUS_DIR = "status"
DESIRED_DIR = "desired"


class GitError(Exception):
    """The repository cannot be read or updated; the message says which and why."""


class StateRepo:
    def __init__(self, path: str | os.PathLike[str], *, remote: str | None = None,
                 name: str = "reconciler", email: str = "reconciler@localhost") -> None:
        self.path = Path(path).expanduser().resolve()
        try:
            self.repo = git.Repo(self.path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise GitError(f"{self.path} is not a git repository; run `reconciler init {self.path}` "
                           "or point --repo at a clone of your state repository") from exc
        self.remote = remote
        self.name = name
        self.email = email

    # ---- reading ----------------------------------------------------------------------------
    def head(self) -> str:
        try:
            return self.repo.head.commit.hexsha
        except ValueError as exc:
            raise GitError(f"{self.path} has no commits yet; commit a manifest under desired/ first") from exc

    def root_commit(self) -> str:
        """The first commit of the history (the oldest root, if histories were merged): it names the
        repository in every clone, so it can serve as the repository's identity."""
        try:
            roots: str = self.repo.git.rev_list("--max-parents=0", "HEAD")
        except git.GitCommandError as exc:
            raise GitError(f"{self.path} has no commits yet; commit a manifest under desired/ first") from exc
        return roots.split()[-1]

    def read_files(self, commit: str, folder: str) -> dict[str, bytes]:
        """All blobs under `folder` at `commit`, keyed by their path in the repository."""
        try:
            tree = self.repo.commit(commit).tree
            sub = tree / folder
        except KeyError:
            return {}
        out: dict[str, bytes] = {}
        for item in sub.traverse():
            if isinstance(item, git.Blob):
                out[str(item.path)] = item.data_stream.read()
        return out

    def read_file(self, commit: str, path: str) -> bytes | None:
        try:
            blob = self.repo.commit(commit).tree / path
        except KeyError:
            return None
        data: bytes = blob.data_stream.read()
        return data

    def read_settings(self, commit: str) -> bytes | None:
        return self.read_file(commit, SETTINGS_FILE)

    def tree_id(self, commit: str, folder: str) -> str | None:
        """The id of a folder's tree, to tell whether `desired/` changed between two commits."""
        try:
            return str((self.repo.commit(commit).tree / folder).hexsha)
        except KeyError:
            return None

    def last_change(self, commit: str, paths: list[str]) -> str | None:
        """The newest commit up to `commit` that touched `paths`: the desired state acted on."""
        try:
            out: str = self.repo.git.log("-1", "--format=%H", commit, "--", *paths)
        except git.GitCommandError:
            return None
        return out.strip() or None

    def messages_since(self, commit: str, since: str, limit: int = 200) -> list[str]:
        """Messages of the commits from `since` (included) up to `commit`, newest first."""
        try:
            out: str = self.repo.git.log(f"-{limit}", "--format=%H%x00%B%x01", commit)
        except git.GitCommandError:
            return []
        messages = []
        for entry in out.split("\x01"):
            sha, _, body = entry.strip().partition("\x00")
            if not sha:
                continue
            messages.append(body)
            if sha == since:
                break
        return messages

    def history(self, path: str, limit: int = 100, commit: str = "HEAD") -> list[tuple[str, float, str]]:
        """The newest `limit` commits up to `commit` that changed `path`, newest first: (id, commit
        time, subject). The status page reads a job's audit trail with it."""
        try:
            out: str = self.repo.git.log(f"-{int(limit)}", "--format=%H%x00%ct%x00%s", commit, "--", path)
        except git.GitCommandError:
            return []
        entries = []
        for line in out.splitlines():
            sha, _, rest = line.partition("\x00")
            stamp, _, subject = rest.partition("\x00")
            if sha and stamp.isdigit():
                entries.append((sha, float(stamp), subject))
        return entries

    def remote_url(self, name: str = "origin") -> str | None:
        """The URL of a remote, or None when the clone has none by that name."""
        try:
            return str(self.repo.remote(name).url)
        except (ValueError, git.GitCommandError):
            return None

    # ---- writing ----------------------------------------------------------------------------
    def commit_status(self, files: dict[str, str | None], message: str) -> str | None:
        """Writes `status/` files (None deletes) and commits only them. Returns the new commit,
        or None when nothing differs from HEAD."""
        paths = []
        for rel, text in files.items():
            if not rel.startswith(STATUS_DIR + "/") or ".." in rel.split("/"):
                raise GitError(f"refusing to write {rel!r}: the reconciler writes only under status/")
            target = self.path / rel
            if text is None:
                if target.exists():
                    target.unlink()
                    paths.append(rel)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
            paths.append(rel)
        if not paths:
            return None
        env = {
            "GIT_AUTHOR_NAME": self.name, "GIT_AUTHOR_EMAIL": self.email,
            "GIT_COMMITTER_NAME": self.name, "GIT_COMMITTER_EMAIL": self.email,
        }
        g = self.repo.git
        last: Exception | None = None
        for attempt in range(5):
            # A person committing in the same checkout holds the index lock for a moment: wait.
            try:
                g.add("--all", "--", *paths)
                if not g.diff("--cached", "--name-only", "--", *paths).strip():
                    return None
                with self.repo.git.custom_environment(**env):
                    g.commit("--no-verify", "-q", "-m", message, "--only", "--", *paths)
                return self.head()
            except git.GitCommandError as exc:
                last = exc
                time.sleep(0.1 * (2**attempt))
        raise GitError(f"cannot commit status in {self.path}: {_first_line(last)}; "
                       "the next tick writes it again")

    # ---- remote -----------------------------------------------------------------------------
    def branch(self) -> str:
        try:
            return self.repo.active_branch.name
        except TypeError as exc:
            raise GitError(f"{self.path} is on a detached HEAD; check out the branch to reconcile") from exc

    def pull(self) -> None:
        """Brings the remote's commits in, keeping our status commits on top."""
        if not self.remote:
            return
        branch = self.branch()
        try:
            self.repo.git.fetch(self.remote, branch)
            self.repo.git.rebase(f"{self.remote}/{branch}")
        except git.GitCommandError as exc:
            self._abort_rebase()
            raise GitError(f"cannot update from remote {self.remote!r}: {_first_line(exc)}") from exc

    def push(self, attempts: int = 5) -> None:
        """Fetch, rebase, push; on a rejected push (someone else pushed) start over. Never force."""
        if not self.remote:
            return
        branch = self.branch()
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                self.repo.git.fetch(self.remote, branch)
                self.repo.git.rebase(f"{self.remote}/{branch}")
                self.repo.git.push(self.remote, f"HEAD:refs/heads/{branch}")
                return
            except git.GitCommandError as exc:
                self._abort_rebase()
                last = exc
                time.sleep(min(2.0, 0.2 * (2**attempt)))
        raise GitError(f"cannot push status to {self.remote!r} after {attempts} tries: "
                       f"{_first_line(last)}; the commits stay local and go out with the next push")

    def _abort_rebase(self) -> None:
        if (Path(self.repo.git_dir) / "rebase-merge").exists() or (Path(self.repo.git_dir) / "rebase-apply").exists():
            try:
                self.repo.git.rebase("--abort")
            except git.GitCommandError:
                pass


def _first_line(exc: Exception | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, git.GitCommandError):
        text = (exc.stderr or str(exc)).strip().replace("stderr: ", "").strip("' ")
        return text.splitlines()[-1] if text else str(exc)
    return str(exc).splitlines()[0]


def init_repo(path: str | os.PathLike[str]) -> git.Repo:
    p = Path(path).expanduser()
    p.mkdir(parents=True, exist_ok=True)
    try:
        return git.Repo(p)
    except git.InvalidGitRepositoryError:
        return git.Repo.init(p, initial_branch="main")
