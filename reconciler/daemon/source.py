"""Where the desired state lives: which repository, which branch, which subfolder.

These are given on the command line (or in the environment), never in `reconciler.yaml`: that file
is itself inside the subfolder, on the branch, in the repository they name. A repository may be a
checkout (`--repo`) or a URL (`--repo-url`) that the daemon clones for itself into a cache folder
(one clone per URL, reused across restarts, fetched every tick; its remote is `origin`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # the CLI imports this module at start-up: git is loaded only when a repository is opened
    from adapters.gitrepo import StateRepo

BranchOption = Annotated[str | None, typer.Option(
    "--branch", envvar="RECONCILER_BRANCH",
    help="the branch to reconcile (default: the one checked out, or the URL's default branch)")]
PathOption = Annotated[str, typer.Option(
    "--path", envvar="RECONCILER_PATH",
    help="the folder inside the repository that holds desired/ and reconciler.yaml (a monorepo)")]
UrlOption = Annotated[str | None, typer.Option(
    "--repo-url", envvar="RECONCILER_REPO_URL",
    help="a repository URL to clone and reconcile, instead of the checkout --repo names (the clone is kept "
         "under $XDG_CACHE_HOME/reconciler/clones)")]


@dataclass(frozen=True)
class Source:
    repo: Path = Path(".")
    url: str | None = None
    branch: str | None = None
    path: str = ""


def clone_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "reconciler" / "clones"


def open_state(source: Source) -> StateRepo:
    """The state repository the source names, cloning a URL on first use. Raises GitError, also for
    a --path that names no folder."""
    from adapters.gitrepo import StateRepo, check_branch_name, clean_subdir, clone_cached

    if source.branch:  # checked before anything is cloned
        check_branch_name(source.branch, "--branch")
    clean_subdir(source.path)
    folder = clone_cached(source.url, source.branch, clone_cache()) if source.url else source.repo
    state = StateRepo(folder, branch=source.branch, subdir=source.path)
    state.check_folder()
    return state


def remote_of(source: Source) -> str | None:
    """A URL's clone reconciles with the URL itself, whatever reconciler.yaml says about remotes."""
    return "origin" if source.url else None
