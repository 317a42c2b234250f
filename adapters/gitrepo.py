"""The state repository: read `desired/` at a commit, write `status/`, commit, and push.

Two ways to record status. On a **status branch** (`status_branch`, the default when a remote is
shared) the reconciled branch is only read: the desired state is its tip (the remote's copy after a
fetch, so a person's force-push is simply the new history), and status commits are made with git
plumbing (a temporary index, `commit-tree`, a compare-and-swap `update-ref`) onto a branch of their
own, never touching the work tree or a person's index; each records the desired commit it was
computed from in a `Desired-Commit:` trailer. Only that branch is pushed; a rejected push is
replayed onto the remote's copy and tried again, never forced. On the **reconciled branch itself**
(no remote, or `status_branch: ""`) status commits touch only `status/` (a person's staged changes
are never swept in) and reach the remote by fetch-rebase-push with retries; never a force push.

A monorepo keeps `desired/`, `status/` and `reconciler.yaml` in a subfolder (`subdir`): every path
the rest of the code names is relative to it.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import time
from io import BytesIO
from pathlib import Path

import git
from gitdb import IStream

from desired.models import BRANCH_NAME
from desired.parse import SETTINGS_FILE

STATUS_DIR = "status"
DESIRED_DIR = "desired"
DEFAULT_STATUS_BRANCH = "reconciler/status"
TRAILER = "Desired-Commit"
_ZERO = "0" * 40


class GitError(Exception):
    """The repository cannot be read or updated; the message says which and why."""


def status_branch_for(setting: str | None, remote: str | None) -> str | None:
    """The branch status is committed to, None for the reconciled branch itself. Unset: a status
    branch of its own when a remote is shared (a person's push is never rejected because of us),
    the reconciled branch in a repository without a remote; "" asks for the reconciled branch."""
    if setting is None:
        return DEFAULT_STATUS_BRANCH if remote else None
    return setting or None


class StateRepo:
    def __init__(self, path: str | os.PathLike[str], *, remote: str | None = None,
                 name: str = "reconciler", email: str = "reconciler@localhost", branch: str | None = None,
                 subdir: str = "", status_branch: str | None = None) -> None:
        self.path = Path(path).expanduser().resolve()
        try:
            self.repo = git.Repo(self.path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise GitError(_not_a_repository(self.path)) from exc
        self.remote = remote
        self.name = name
        self.email = email
        self.reconciled = check_branch_name(branch, "branch") if branch else None
        self.subdir = clean_subdir(subdir)
        self.status_branch = check_branch_name(status_branch, "status_branch") if status_branch else None

    def twin(self) -> StateRepo:
        """The same repository and settings through objects of its own (GitPython's are not thread-safe)."""
        return StateRepo(self.path, remote=self.remote, name=self.name, email=self.email,
                         branch=self.reconciled, subdir=self.subdir, status_branch=self.status_branch)

    def _p(self, rel: str) -> str:
        return f"{self.subdir}/{rel}" if self.subdir else rel

    def repo_relative(self, rel: str) -> str:
        """A path relative to the state folder (`desired/x.yaml`) as git names it in a monorepo."""
        return self._p(rel)

    # ---- reading ----------------------------------------------------------------------------
    def head(self) -> str:
        """The commit that holds the desired state: the reconciled branch's tip (with a status branch
        and a remote, the remote's copy as last fetched), else HEAD."""
        if self.reconciled is None and self.status_branch is None:
            try:
                return self.repo.head.commit.hexsha
            except ValueError as exc:
                raise GitError(f"{self.path} has no commits yet; commit a manifest under desired/ first") from exc
        branch = self.branch()
        refs = [f"refs/heads/{branch}"]
        if self.remote:  # the remote's copy is the truth once status no longer rides on the branch
            refs.insert(0 if self.status_branch else 1, f"refs/remotes/{self.remote}/{branch}")
        for ref in refs:
            sha = self._resolve(ref)
            if sha:
                return sha
        raise GitError(f"{self.path} has no branch {branch!r}" + (f" (nor {self.remote}/{branch})" if self.remote
                       else "") + "; commit a manifest under desired/ on it first")

    def check_folder(self) -> None:
        """A --path that names no folder at the reconciled commit is an error, not an empty state
        (which would show `0 job(s)` and, once jobs ran, read as every manifest deleted)."""
        head = self.head()
        if not self.has_folder(head):
            raise GitError(f"--path {self.subdir}: no such folder in {self.path} at {self.branch_label()} "
                           f"({head[:12]}); name the folder that holds desired/ and reconciler.yaml")

    def has_folder(self, commit: str) -> bool:
        """Whether the state's folder (--path) is a folder at `commit`; the root always is."""
        if not self.subdir:
            return True
        try:
            return bool((self.repo.commit(commit).tree / self.subdir).type == "tree")
        except KeyError:
            return False

    def branch_label(self) -> str:
        """The reconciled branch's name for a message, or HEAD."""
        return self.reconciled or self.branch_checked_out() or "HEAD"

    def _resolve(self, ref: str) -> str | None:
        try:
            return str(self.repo.commit(ref).hexsha)
        except (git.BadName, ValueError):
            return None

    def root_commit(self) -> str:
        """The first commit of the history (the oldest root, if histories were merged): it names the
        repository in every clone, so it can serve as the repository's identity."""
        try:
            roots: str = self.repo.git.rev_list("--max-parents=0", self.head())
        except git.GitCommandError as exc:
            raise GitError(f"{self.path} has no commits yet; commit a manifest under desired/ first") from exc
        return roots.split()[-1]

    def read_files(self, commit: str, folder: str) -> dict[str, bytes]:
        """All blobs under `folder` at `commit`, keyed by their path relative to the subfolder."""
        try:
            tree = self.repo.commit(commit).tree
            sub = tree / self._p(folder)
        except KeyError:
            return {}
        cut = len(self.subdir) + 1 if self.subdir else 0
        out: dict[str, bytes] = {}
        for item in sub.traverse():
            if isinstance(item, git.Blob):
                out[str(item.path)[cut:]] = item.data_stream.read()
        return out

    def read_file(self, commit: str, path: str) -> bytes | None:
        try:
            blob = self.repo.commit(commit).tree / self._p(path)
        except KeyError:
            return None
        data: bytes = blob.data_stream.read()
        return data

    def read_settings(self, commit: str) -> bytes | None:
        return self.read_file(commit, SETTINGS_FILE)

    def tree_id(self, commit: str, folder: str) -> str | None:
        """The id of a folder's tree, to tell whether `desired/` changed between two commits."""
        try:
            return str((self.repo.commit(commit).tree / self._p(folder)).hexsha)
        except KeyError:
            return None

    def last_change(self, commit: str, paths: list[str]) -> str | None:
        """The newest commit up to `commit` that touched `paths`: the desired state acted on."""
        try:
            out: str = self.repo.git.log("-1", "--format=%H", commit, "--", *(self._p(p) for p in paths))
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
        """Writes `status/` files (None deletes) and commits only them: onto the status branch when
        one is set, else onto the checked-out branch. Returns the new commit, or None when nothing
        differs from the last status."""
        for rel in files:
            if not rel.startswith(STATUS_DIR + "/") or ".." in rel.split("/"):
                raise GitError(f"refusing to write {rel!r}: the reconciler writes only under status/")
        if self.status_branch:
            return self._commit_on_status_branch(files, message)
        self._check_checked_out()
        paths = []
        for rel, text in files.items():
            target = self.path / self._p(rel)
            if text is None:
                if target.exists():
                    target.unlink()
                    paths.append(self._p(rel))
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
            paths.append(self._p(rel))
        if not paths:
            return None
        g = self.repo.git
        last: Exception | None = None
        for attempt in range(5):
            # A person committing in the same checkout holds the index lock for a moment: wait.
            try:
                g.add("--all", "--", *paths)
                if not g.diff("--cached", "--name-only", "--", *paths).strip():
                    return None
                with self.repo.git.custom_environment(**self._identity()):
                    g.commit("--no-verify", "-q", "-m", message, "--only", "--", *paths)
                return self.repo.head.commit.hexsha
            except git.GitCommandError as exc:
                last = exc
                time.sleep(0.1 * (2**attempt))
        raise GitError(f"cannot commit status in {self.path}: {_first_line(last)}; "
                       "the next tick writes it again")

    def _identity(self) -> dict[str, str]:
        return {"GIT_AUTHOR_NAME": self.name, "GIT_AUTHOR_EMAIL": self.email,
                "GIT_COMMITTER_NAME": self.name, "GIT_COMMITTER_EMAIL": self.email}

    def _check_checked_out(self) -> None:
        if self.reconciled is not None and self.branch_checked_out() != self.reconciled:
            raise GitError(f"status goes onto the reconciled branch {self.reconciled!r}, which is not checked "
                           f"out in {self.path}; check it out, or set status_branch in reconciler.yaml")

    def branch_checked_out(self) -> str | None:
        try:
            return self.repo.active_branch.name
        except TypeError:
            return None

    # ---- the status branch --------------------------------------------------------------------
    def status_tip(self) -> str | None:
        """The newest status commit: the local status branch, or the remote's copy when the local one
        is missing or behind (a fresh clone, another clone led); None with no status branch yet.
        Without a status branch configured, None too (status lives on the reconciled branch)."""
        if not self.status_branch:
            return None
        local = self._resolve(f"refs/heads/{self.status_branch}")
        theirs = self._resolve(f"refs/remotes/{self.remote}/{self.status_branch}") if self.remote else None
        if local is None or theirs is None or local == theirs:
            return local or theirs
        return theirs if self._is_ancestor(local, theirs) else local

    def _is_ancestor(self, older: str, newer: str) -> bool:
        try:
            self.repo.git.merge_base("--is-ancestor", older, newer)
            return True
        except git.GitCommandError:
            return False

    def _commit_on_status_branch(self, files: dict[str, str | None], message: str) -> str | None:
        ref = f"refs/heads/{self.status_branch}"
        changes = {self._p(rel): text for rel, text in files.items()}
        last: Exception | None = None
        for attempt in range(5):
            old = self._resolve(ref)
            parent = self.status_tip()
            if parent is None:
                # The first status commit carries on from status/ on the reconciled branch (a
                # repository that used to keep its status there loses none of it).
                tree = self._tree_with(self._base_for_first_status(), False, changes)
            else:
                tree = self._tree_with(parent, True, changes)
                if tree == str(self.repo.commit(parent).tree.hexsha):
                    return None
            sha = self._plumb("commit-tree", tree, "-m", message, *(["-p", parent] if parent else []),
                              env=self._identity()).strip()
            try:  # compare-and-swap: fails if anyone moved the branch since we read it
                self._plumb("update-ref", "-m", "reconciler: status", ref, sha, old or _ZERO)
                return sha
            except GitError as exc:
                last = exc
                time.sleep(0.05 * (2**attempt))
        raise GitError(f"cannot commit status onto {self.status_branch}: {last}; the next tick writes it again")

    def _base_for_first_status(self) -> str | None:
        try:
            return self.head()
        except GitError:
            return None

    def _tree_with(self, start: str | None, whole: bool, changes: dict[str, str | None]) -> str:
        """A tree: `start`'s (its whole tree for a status commit, only the status folder for a commit
        of the reconciled branch) with `changes` (full paths) written or deleted, built in a temporary
        index so that neither the work tree nor a person's index is touched."""
        with tempfile.TemporaryDirectory(prefix="reconciler-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            status = self._p(STATUS_DIR)
            if start is not None and whole:
                self._plumb("read-tree", start, env=env)
            elif start is not None and self._tree_exists(start, status):
                self._plumb("read-tree", f"--prefix={status}/", f"{start}:{status}", env=env)
            lines = []
            for path, text in sorted(changes.items()):
                if text is None:
                    lines.append(f"0 {_ZERO}\t{path}")
                else:
                    data = text.encode()
                    blob = self.repo.odb.store(IStream("blob", len(data), BytesIO(data))).hexsha.decode()
                    lines.append(f"100644 {blob}\t{path}")
            if lines:
                self._plumb("update-index", "--index-info", env=env, stdin="\n".join(lines) + "\n")
            return self._plumb("write-tree", env=env).strip()

    def _tree_exists(self, commit: str, path: str) -> bool:
        try:
            return (self.repo.commit(commit).tree / path).type == "tree"
        except KeyError:
            return False

    def _plumb(self, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
        """One git plumbing command; its failure is a GitError with git's last line."""
        proc = subprocess.run(["git", "-C", str(self.path), *args], input=stdin, capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=120, check=False)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            raise GitError(f"git {args[0]} failed: {_scrub(lines[-1]) if lines else f'exit {proc.returncode}'}")
        return proc.stdout

    def _sync_status_branch(self) -> None:
        """After a fetch: a local status branch that is missing or behind takes the remote's; one
        that diverged (another clone wrote meanwhile) has its own commits replayed on top."""
        if not (self.status_branch and self.remote):
            return
        ref = f"refs/heads/{self.status_branch}"
        local = self._resolve(ref)
        theirs = self._resolve(f"refs/remotes/{self.remote}/{self.status_branch}")
        if theirs is None or local == theirs or (local is not None and self._is_ancestor(theirs, local)):
            return
        if local is None or self._is_ancestor(local, theirs):
            self._plumb("update-ref", "-m", "reconciler: status from the remote", ref, theirs, local or _ZERO)
            return
        self._plumb("update-ref", "-m", "reconciler: status replayed on the remote's", ref,
                    self._replay(local, theirs), local)

    def _replay(self, local: str, onto: str) -> str:
        """Our status commits that `onto` lacks, oldest first, re-made on top of it (same files,
        same messages): nothing another writer committed is lost, and ours stay in order."""
        mine = self.repo.git.rev_list("--reverse", "--topo-order", local, f"^{onto}").split()
        at = onto
        for sha in mine:
            commit = self.repo.commit(sha)
            before = commit.parents[0] if commit.parents else None
            changed: dict[str, str | None] = {}
            if before is None:
                for item in commit.tree.traverse():
                    if isinstance(item, git.Blob):
                        changed[str(item.path)] = item.data_stream.read().decode()
            for d in before.diff(commit) if before is not None else ():
                if d.a_path and (d.b_blob is None or d.a_path != d.b_path):  # deleted, or renamed away
                    changed[str(d.a_path)] = None
                if d.b_blob is not None:
                    changed[str(d.b_path)] = d.b_blob.data_stream.read().decode()
            tree = self._tree_with(at, True, changed)
            at = self._plumb("commit-tree", tree, "-p", at, "-m", str(commit.message),
                             env=self._identity()).strip()
        return at

    # ---- remote -----------------------------------------------------------------------------
    def branch(self) -> str:
        """The reconciled branch: the one named, else the one checked out."""
        if self.reconciled is not None:
            return self.reconciled
        name = self.branch_checked_out()
        if name is None:
            raise GitError(f"{self.path} is on a detached HEAD; check out the branch to reconcile")
        return name

    def pull(self) -> None:
        """Brings the remote's commits in. With a status branch: fetch the reconciled branch (its
        tip is what `head` reads; a force-push is just the new tip) and the status branch, touching
        no work tree. Else: rebase the local branch, keeping our status commits on top."""
        if not self.remote:
            return
        branch = self.branch()
        if self.status_branch:
            self._fetch(f"+refs/heads/{branch}:refs/remotes/{self.remote}/{branch}")
            self._fetch_status_branch()
            return
        try:
            self.repo.git.fetch(self.remote, branch)
            self.repo.git.rebase(f"{self.remote}/{branch}")
        except git.GitCommandError as exc:
            self._abort_rebase()
            raise GitError(f"cannot update from remote {self.remote!r}: {_first_line(exc)}") from exc

    def _fetch(self, refspec: str) -> None:
        try:
            self.repo.git.fetch("--no-tags", self.remote, refspec)
        except git.GitCommandError as exc:
            raise GitError(f"cannot update from remote {self.remote!r}: {_first_line(exc)}") from exc

    def _fetch_status_branch(self) -> None:
        """The remote's status branch, when it has one (a new repository has none yet)."""
        try:
            self._fetch(f"+refs/heads/{self.status_branch}:refs/remotes/{self.remote}/{self.status_branch}")
        except GitError as exc:
            if "couldn't find remote ref" not in str(exc).lower():
                raise
            return
        self._sync_status_branch()

    def push(self, attempts: int = 5) -> None:
        """Sends status to the remote; never a force push. With a status branch only that branch is
        pushed (a rejection means another writer: replay ours on theirs, try again). Else fetch,
        rebase, push; on a rejected push (someone else pushed) start over."""
        if not self.remote:
            return
        if self.status_branch:
            self._push_status_branch(attempts)
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

    def _push_status_branch(self, attempts: int) -> None:
        ref = f"refs/heads/{self.status_branch}"
        if self._resolve(ref) is None:
            return  # nothing recorded yet
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                self.repo.git.push("--no-verify", self.remote, f"{ref}:{ref}")
                return
            except git.GitCommandError as exc:
                last = exc
            try:
                self._fetch_status_branch()
            except GitError as exc:  # unreachable: trying again now only makes the tick slower
                last = exc
                break
            time.sleep(min(2.0, 0.2 * (2**attempt)))
        raise GitError(f"cannot push {self.status_branch} to {self.remote!r} after {attempts} tries: "
                       f"{_first_line(last)}; the status commits stay local and go out with the next push")

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
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # git's reason is its first fatal/error line; the lines after it are advice ("Please make sure...")
        reason = next((line for line in lines if line.startswith(("fatal:", "error:"))), lines[-1] if lines else "")
        return _scrub(reason or str(exc))
    return _scrub(str(exc).splitlines()[0])


_USERINFO = re.compile(r"(\w+://)[^/@\s]+@")


def _scrub(text: str) -> str:
    """A URL's user and password (a token) never reach a log line or a status."""
    return _USERINFO.sub(r"\1***@", text)


def _not_a_repository(path: Path) -> str:
    """Why `path` cannot be opened, and what to pass instead: a folder inside a repository is named
    with --path (so that the repository's history, and its signatures, are read)."""
    try:
        top = Path(str(git.Repo(path, search_parent_directories=True).working_tree_dir)).resolve()
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return (f"{path} is not a git repository; run `reconciler init {path}` or point --repo at a clone "
                "of your state repository")
    return (f"{path} is a folder inside the git repository {top}, not a repository itself; pass --repo {top} "
            f"--path {path.relative_to(top)}")


def check_branch_name(name: str, what: str) -> str:
    if not BRANCH_NAME.fullmatch(name):
        raise GitError(f"{what} {name!r} is not a usable branch name (letters, digits, '.', '_', '-', '/')")
    return name


def clean_subdir(subdir: str) -> str:
    """A folder inside the repository, as `a/b`: no absolute path, no `..`."""
    parts = [p for p in subdir.replace("\\", "/").split("/") if p not in ("", ".")]
    if subdir.startswith("/") or ".." in parts or any(p == ".git" for p in parts):
        raise GitError(f"--path {subdir!r} must be a folder inside the repository, like infra/jobs")
    return "/".join(parts)


def clone_cached(url: str, branch: str | None, cache: Path) -> Path:
    """A clone of `url` the daemon keeps for itself under `cache` (one folder per URL), made on first
    use and reused after (each tick fetches). A failed clone leaves nothing half-made behind."""
    if url.startswith("-"):
        raise GitError(f"{url!r} is not a repository URL")
    target = cache / hashlib.sha256(url.encode()).hexdigest()[:16]
    if (target / ".git").is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".clone-", dir=cache) as tmp:
        part = Path(tmp) / "repo"
        try:
            git.Repo.clone_from(url, part, multi_options=["--no-tags"] + ([f"--branch={branch}"] if branch else []))
        except git.GitCommandError as exc:
            raise GitError(f"cannot clone {_scrub(url)}: {_first_line(exc)}") from exc
        part.rename(target)
    return target


def init_repo(path: str | os.PathLike[str]) -> git.Repo:
    p = Path(path).expanduser()
    p.mkdir(parents=True, exist_ok=True)
    try:
        return git.Repo(p)
    except git.InvalidGitRepositoryError:
        return git.Repo.init(p, initial_branch="main")
