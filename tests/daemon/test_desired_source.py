"""Where the desired state lives: a branch other than the checked-out one, a subfolder of a monorepo,
and a URL the daemon clones for itself. Real repositories: a bare repository reached by file:// URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adapters.gitrepo import GitError, StateRepo
from reconciler.daemon.loop import Reconciler
from tests import zygote
from tests.conftest import _git

JOB = """apiVersion: reconciler.dev/v1
kind: Job
metadata: {name: %s}
spec:
  command: [sleep, '120']
"""


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return zygote.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True,
                      env={**os.environ, "COLUMNS": "300", **env}, timeout=120)


@pytest.fixture
def monorepo(tmp_path: Path, local_workdir: Path) -> Path:
    """origin.git: `main` holds an application; branch `jobs` holds it too, plus infra/jobs/ with
    desired/ and reconciler.yaml."""
    work = tmp_path / "author"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "app.py").write_text("print('the application')\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "the application")
    _git(work, "checkout", "-q", "-b", "jobs")
    jobs = work / "infra" / "jobs"
    (jobs / "desired").mkdir(parents=True)
    (jobs / "desired" / "train.yaml").write_text(JOB % "train")
    (jobs / "reconciler.yaml").write_text(f"storage: file://{tmp_path / 'runs'}\ntick_seconds: 0.5\n")
    (work / "desired").mkdir()
    (work / "desired" / "decoy.yaml").write_text(JOB % "decoy")  # outside the subfolder: not ours
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "jobs in infra/jobs")
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(origin)], check=True)
    _git(origin, "symbolic-ref", "HEAD", "refs/heads/main")
    return origin


def test_run_clones_a_url_and_reconciles_a_branch_and_subfolder(monorepo: Path, tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    url = f"file://{monorepo}"
    jobs_tip = _git(monorepo, "rev-parse", "jobs").strip()
    done = cli("run", "--once", "--repo-url", url, "--branch", "jobs", "--path", "infra/jobs", env=env)
    assert done.returncode == 0, done.stderr
    # Status went to origin's status branch, under the subfolder, computed from the jobs branch.
    files = _git(monorepo, "ls-tree", "-r", "--name-only", "reconciler/status").split()
    assert "infra/jobs/status/train.yaml" in files
    assert not any("decoy" in f for f in files)
    status = yaml.safe_load(_git(monorepo, "show", "reconciler/status:infra/jobs/status/train.yaml"))
    assert status["phase"] == "Launching"
    trailer = _git(monorepo, "log", "-1", "--format=%(trailers:key=Desired-Commit,valueonly)", "reconciler/status")
    assert trailer.strip() == jobs_tip
    assert _git(monorepo, "rev-parse", "jobs").strip() == jobs_tip  # the reconciled branch is only read
    clones = list((tmp_path / "cache" / "reconciler" / "clones").iterdir())
    assert len(clones) == 1
    # A person pushes a change to the subfolder; the next run fetches it into the same clone.
    author = tmp_path / "author"
    (author / "infra" / "jobs" / "desired" / "eval.yaml").write_text(JOB % "eval")
    _git(author, "add", "-A")
    _git(author, "commit", "-q", "-m", "add eval")
    _git(author, "push", "-q", str(monorepo), "jobs")
    again = cli("run", "--once", "--repo-url", url, "--branch", "jobs", "--path", "infra/jobs", env=env)
    assert again.returncode == 0, again.stderr
    assert list((tmp_path / "cache" / "reconciler" / "clones").iterdir()) == clones
    shown = cli("status", "--json", "--repo-url", url, "--branch", "jobs", "--path", "infra/jobs", env=env)
    assert shown.returncode == 0, shown.stderr
    phases = {r["job"]: r["phase"] for r in json.loads(shown.stdout)}
    assert phases["eval"] == "Launching" and phases["train"] in ("Launching", "Running") and len(phases) == 2


def test_a_checkout_reconciles_the_named_branch_not_the_checked_out_one(monorepo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(monorepo), str(clone)], check=True)  # main checked out
    report = Reconciler(StateRepo(clone, branch="jobs", subdir="infra/jobs"), remote="origin").tick()
    assert report.errors == [] and set(report.statuses) == {"train"}
    assert report.commit == _git(monorepo, "rev-parse", "jobs").strip()
    assert "infra/jobs/status/train.yaml" in _git(monorepo, "ls-tree", "-r", "--name-only", "reconciler/status")
    assert _git(clone, "status", "--porcelain") == "" and _git(clone, "branch", "--show-current").strip() == "main"


def test_same_branch_status_needs_the_named_branch_checked_out(monorepo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(monorepo), str(clone)], check=True)
    _git(clone, "branch", "-q", "jobs", "origin/jobs")
    report = Reconciler(StateRepo(clone, branch="jobs", subdir="infra/jobs")).tick()
    assert any("not checked out" in e and "status_branch" in e for e in report.errors)
    assert _git(clone, "status", "--porcelain") == ""


@pytest.mark.parametrize(("args", "says"), [
    (["--path", "../elsewhere"], "must be a folder inside the repository"),
    (["--branch", "-x"], "is not a usable branch name"),
    (["--repo-url", "file:///nonexistent/origin.git"], "cannot clone file:///nonexistent/origin.git"),
    (["--branch", "jobs", "--path", "infra/nope"], "--path infra/nope: no such folder"),
    (["--branch", "jobs", "--path", "./infra/jobs/desired/train.yaml"], "no such folder"),  # a file, not a folder
])
def test_bad_sources_are_one_sentence_errors(monorepo: Path, tmp_path: Path, args: list[str], says: str) -> None:
    url = ["--repo-url", f"file://{monorepo}"] if "--repo-url" not in args else []
    done = cli("run", "--once", *url, *args, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 1
    assert says in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def test_a_token_in_a_url_never_reaches_the_error(tmp_path: Path) -> None:
    from adapters.gitrepo import clone_cached

    with pytest.raises(GitError) as caught:
        clone_cached("http://user:s3cr3t-token@127.0.0.1:9/repo.git", None, tmp_path / "cache")
    assert "s3cr3t-token" not in str(caught.value) and "***@" in str(caught.value)


def test_plan_base_reviews_a_change_to_a_subfolder(monorepo: Path, tmp_path: Path) -> None:
    author = tmp_path / "author"
    done = cli("plan", "--repo", str(author), "--base", "main", "--head", "jobs", "--path", "infra/jobs",
               "--format", "json", env={})
    assert done.returncode == 0, done.stderr
    assert "train" in done.stdout and "decoy" not in done.stdout


@pytest.mark.parametrize("command", [["run", "--once"], ["status"], ["plan"], ["validate"]])
def test_a_path_that_names_no_folder_is_an_error(monorepo: Path, tmp_path: Path, command: list[str]) -> None:
    author = tmp_path / "author"  # a checkout of the jobs branch: infra/jobs exists, infra/job does not
    done = cli(*command, "--repo", str(author), "--path", "infra/job", env={})
    assert done.returncode == 1, done.stdout
    assert "--path infra/job: no such folder" in " ".join(done.stderr.split())
    assert "0 job(s)" not in done.stdout and "Traceback" not in done.stderr


def test_plan_base_with_a_path_that_names_no_folder_at_either_commit_is_an_error(monorepo: Path,
                                                                                  tmp_path: Path) -> None:
    done = cli("plan", "--repo", str(tmp_path / "author"), "--base", "main", "--head", "jobs", "--path",
               "infra/job", env={})
    assert done.returncode == 1 and "--path infra/job: no such folder at main nor at jobs" in done.stderr
