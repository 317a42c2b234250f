"""`reconciler suspend|resume|cancel JOB`: the change is a commit to the job's manifest, as if the
user had edited it (GitOps: the daemon learns of it the way it learns of any change, and git keeps
who did what and when).

- suspend / resume set the Job's `spec.suspend` to true / false;
- drill sets the Job's `spec.drill_request` (a new id asks for a new drill: reconciler drill);
- cancel removes the Job's document (the file, when it was the file's only document): a deleted
  manifest cancels its run (DESIGN.md §2). Its commit carries the cancel-confirmation trailer: the
  user asked for this cancel by name, so the mass-cancel guard of the planner need not hold it.

The file is edited with ruamel.yaml's round trip, which keeps comments, key order and quoting (a
re-indented sequence is the most it may change). A file with uncommitted changes is refused, so the
commit holds only this change. After the commit, it is pushed to the settings' `remote` when one is
set; a push that fails leaves the commit in place and says so.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import git
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from adapters.gitrepo import DESIRED_DIR, GitError, StateRepo
from adapters.localfiles import Refused, inside
from desired.parse import DesiredState, parse_desired, parse_settings
from reconciler.planner.plan import CONFIRM_CANCEL_TRAILER

FALLBACK_IDENTITY = {"GIT_AUTHOR_NAME": "reconciler", "GIT_AUTHOR_EMAIL": "reconciler@localhost",
                     "GIT_COMMITTER_NAME": "reconciler", "GIT_COMMITTER_EMAIL": "reconciler@localhost"}


class Change(StrEnum):
    SUSPEND = "suspend"
    RESUME = "resume"
    CANCEL = "cancel"
    DRILL = "drill"


class EditError(Exception):
    """The change cannot be made; the message is one sentence for the user."""


@dataclass
class Edited:
    file: str
    commit: str | None  # None: the manifest already said so, nothing was committed
    pushed_to: str | None = None
    push_error: str = ""


def change_job(path: Path, job: str, change: Change, subdir: str = "",
               drill: dict[str, Any] | None = None) -> Edited:
    """Edits the manifest of `job` in the checkout at `path` (under `subdir` in a monorepo) and
    commits it (and pushes it). `drill`: the request a DRILL writes."""
    try:
        repo = StateRepo(path, subdir=subdir)
        head = repo.head()
    except GitError as exc:
        raise EditError(str(exc)) from exc
    desired = parse_desired(repo.read_files(head, DESIRED_DIR), repo.read_settings(head))
    rel = repo.repo_relative(_manifest_of(desired, job, change))
    if repo.repo.git.status("--porcelain", "--", rel).strip():
        raise EditError(f"{rel} has uncommitted changes; commit or stash them first, so that this commit "
                        f"holds only the {change.value}")
    try:  # the file is written as well as read: never through a link out of the checkout
        target = inside(repo.path / rel, repo.path, rel)
    except Refused as exc:
        raise EditError(str(exc)) from exc
    text = edit_text(target.read_text(), job, change, drill)
    if text == target.read_text():
        return Edited(file=rel, commit=None)
    if text is None:
        repo.repo.git.rm("-q", "--", rel)
    else:
        target.write_text(text)
    commit = _commit(repo.repo, rel, job, change, _drill_words(drill))
    settings, _ = parse_settings(repo.read_settings(head))
    edited = Edited(file=rel, commit=commit)
    if settings.remote:
        edited.pushed_to = settings.remote
        edited.push_error = _push(repo, settings.remote)
    return edited


def _manifest_of(desired: DesiredState, job: str, change: Change) -> str:
    """The file that defines `job`: a sweep is edited as a whole, through the document that holds
    its matrix; one member alone has no document of its own to edit."""
    if job in desired.sweeps:
        return desired.sweeps[job].file
    if change is Change.DRILL and (job in desired.sweeps or job in desired.sweep_of):
        raise EditError(f"{job} is a sweep or one of its members, which share one document: a drill is asked of "
                        "one job with a manifest of its own; drill a job outside the sweep")
    if job in desired.sweep_of:
        sweep = desired.sweep_of[job]
        raise EditError(f"{job} is a member of sweep {sweep}, which has no document of its own: "
                        f"{change.value} the whole sweep (`reconciler {change.value} {sweep}`), or edit the "
                        "sweep's matrix (`exclude`) to leave this member out")
    if job in desired.job_files:
        return desired.job_files[job]
    known = ", ".join(sorted({*(n for n in desired.jobs if n not in desired.sweep_of), *desired.sweeps})) or "none"
    raise EditError(f"no job named {job} in desired/ at HEAD (jobs and sweeps: {known})")


def edit_text(text: str, job: str, change: Change, drill: dict[str, Any] | None = None) -> str | None:
    """The manifest file with the change made; None when the file is left with no document."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a user's long line
    try:
        docs = list(yaml.load_all(text))
    except YAMLError as exc:
        raise EditError(f"the manifest of {job} cannot be read as YAML: {str(exc).splitlines()[0]}") from exc
    index = next((i for i, d in enumerate(docs) if _is_job(d, job)), None)
    if index is None:
        raise EditError(f"the manifest file has no Job document named {job}")
    if change is Change.CANCEL:
        del docs[index]
        if not [d for d in docs if d is not None]:
            return None
    elif change is Change.DRILL:
        docs[index].setdefault("spec", {})["drill_request"] = dict(drill or {})
    else:
        spec = docs[index].setdefault("spec", {})
        wanted = change is Change.SUSPEND
        if bool(spec.get("suspend", False)) == wanted:
            return text
        spec["suspend"] = wanted
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return out.getvalue()


def _is_job(doc: Any, job: str) -> bool:
    return (isinstance(doc, dict) and doc.get("kind") == "Job" and isinstance(doc.get("metadata"), dict)
            and doc["metadata"].get("name") == job)


def _drill_words(drill: dict[str, Any] | None) -> str:
    """The drill's settings as the command line spelled them, for the commit message."""
    if not drill:
        return ""
    words = [f"--lookahead {drill['lookahead']}"]
    if drill.get("tolerance"):
        words.append(f"--tolerance {drill['tolerance']:g}")
    if drill.get("notice"):
        words.append("--notice")
    if drill.get("to"):
        words.append(f"--to {drill['to']}")
    return " " + " ".join(words)


def _commit(repo: git.Repo, rel: str, job: str, change: Change, options: str = "") -> str:
    message = f"{change.value} {job}\n\nMade by `reconciler {change.value} {job}{options}`."
    if change is Change.CANCEL:
        message += f"\n\n{CONFIRM_CANCEL_TRAILER}"
    args = ("--no-verify", "-q", "-m", message, "--only", "--", rel)
    try:
        repo.git.commit(*args)
    except git.GitCommandError as exc:
        if "tell me who you are" not in str(exc).lower() and "identity" not in str(exc).lower():
            raise EditError(f"cannot commit {rel}: {_first_line(exc)}") from exc
        with repo.git.custom_environment(**FALLBACK_IDENTITY):  # no git identity configured here
            repo.git.commit(*args)
    return str(repo.head.commit.hexsha)


def _push(repo: StateRepo, remote: str) -> str:
    """'' when pushed, else why not (the commit stays; a later push, or the daemon's, carries it)."""
    try:
        repo.repo.git.push(remote, f"HEAD:refs/heads/{repo.branch()}")
    except (git.GitCommandError, GitError) as exc:
        return _first_line(exc)
    return ""


def _first_line(exc: Exception) -> str:
    text = exc.stderr if isinstance(exc, git.GitCommandError) and exc.stderr else str(exc)
    lines = [ln.strip() for ln in str(text).replace("stderr:", "").strip(" '\n").splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__
