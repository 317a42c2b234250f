"""`signatures:` binds however the state is named: the working tree, --path, --repo-url, --branch, a
clone with a status branch, and a plain folder (which cannot verify anything, so acts on nothing).
Real keys, real `git commit -S`, the real loop launching local workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.gitrepo import GitError
from reconciler.daemon.loop import Reconciler
from reconciler.daemon.source import Source, open_state, remote_of
from reconciler.sim.repo import SimRepo
from tests import zygote
from tests.conftest import StateRepoFixture, _git
from tests.daemon.test_loop_local import job
from tests.trust.test_signatures import SLEEP, launched, need, ssh_key

MODES = ["worktree", "path", "path-root-policy", "branch", "repo-url", "status-branch", "path-cli"]
SIGNERS = ["alice", "unsigned", "mallory"]  # alice's key is the one allowed


def commit(work: Path, message: str, key: Path | None) -> str:
    _git(work, "add", "-A")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S"] if key else ["commit"]
    _git(work, *sign, "-q", "-m", message)
    return _git(work, "rev-parse", "HEAD").strip()


def write(work: Path, rel: str, text: str) -> None:
    (work / rel).parent.mkdir(parents=True, exist_ok=True)
    (work / rel).write_text(text)


def author_repo(tmp_path: Path, mode: str, alice: Path, signer: Path | None) -> tuple[Path, str]:
    """A repository that asks for signatures (in a commit alice signed), then a change adding job `a`
    made by `signer`. Returns the repository and the state's folder in it."""
    work = tmp_path / "author"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    write(work, "app.py", "print('the application')\n")
    commit(work, "the application", None)
    if mode == "branch":
        _git(work, "checkout", "-q", "-b", "jobs")
    folder = "infra/jobs" if mode.startswith("path") else ""
    state = work / folder
    settings = f"storage: file://{tmp_path / 'runs'}\ntick_seconds: 0.5\n"
    settings += "status_branch: reconciler/status\n" if mode == "branch" else ""
    settings += "remote: origin\n" if mode == "status-branch" else ""
    keys_at = "./.reconciler/allowed_signers" if mode == "path" else ".reconciler/allowed_signers"  # the same file
    policy = f"signatures:\n  allowed_signers: {keys_at}\n"
    keys = f"alice@example.com {alice.with_suffix('.pub').read_text()}"
    policy_at = work if mode == "path-root-policy" else state  # the root's reconciler.yaml binds a folder too
    write(policy_at, ".reconciler/allowed_signers", keys)
    write(state, "reconciler.yaml", settings + ("" if mode == "path-root-policy" else policy))
    if mode == "path-root-policy":
        write(work, "reconciler.yaml", policy)
    commit(work, "act only on signed changes", alice)
    write(state, "desired/a.yaml", job("a", SLEEP))
    commit(work, "add a", signer)
    if mode == "branch":
        _git(work, "checkout", "-q", "main")  # the reconciled branch is not the one checked out
    return work, folder


def tick(tmp_path: Path, mode: str, work: Path, folder: str) -> set[str]:
    """The jobs one tick launches, with the state named the way `mode` says."""
    if mode == "path-cli":  # the command of the report: `reconciler run --once --path infra/jobs`
        done = zygote.run([sys.executable, "-m", "reconciler", "run", "--once", "--repo", str(work),
                           "--path", folder], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert done.returncode == 0, done.stderr
        workers = Path(os.environ["RECONCILER_LOCAL_WORKDIR"]) / "workers"
        return {p.name.split(".")[1] for p in workers.iterdir()} if workers.exists() else set()
    if mode in ("repo-url", "status-branch"):
        origin = tmp_path / "origin.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(origin)], check=True)
        if mode == "status-branch":
            clone = tmp_path / "clone"
            subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)
            source = Source(clone)
        else:
            source = Source(url=f"file://{origin}")
    else:
        source = Source(work, branch="jobs" if mode == "branch" else None, path=folder)
    rec = Reconciler(open_state(source), remote=remote_of(source))
    report = rec.tick()
    if not launched(report):
        assert any("is held" in e for e in report.errors), report.errors
    return launched(report)


@pytest.mark.parametrize("signer", SIGNERS)
@pytest.mark.parametrize("mode", MODES)
def test_signatures_bind_however_the_state_is_named(tmp_path: Path, local_workdir: Path,
                                                    monkeypatch: pytest.MonkeyPatch, mode: str, signer: str) -> None:
    need("ssh-keygen")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    alice, mallory = ssh_key(tmp_path, "alice"), ssh_key(tmp_path, "mallory")
    work, folder = author_repo(tmp_path, mode, alice, {"alice": alice, "mallory": mallory}.get(signer))
    assert tick(tmp_path, mode, work, folder) == ({"a"} if signer == "alice" else set())


def test_a_plain_folder_that_asks_for_signatures_acts_on_nothing(tmp_path: Path, local_workdir: Path) -> None:
    need("ssh-keygen")
    alice = ssh_key(tmp_path, "alice")
    work, _ = author_repo(tmp_path, "worktree", alice, alice)
    plain = tmp_path / "plain"
    shutil.copytree(work, plain, ignore=shutil.ignore_patterns(".git"))
    with pytest.raises(GitError, match="is not a git repository"):
        open_state(Source(plain))
    with pytest.raises(GitError, match=r"is a folder inside the git repository .*author.*; pass --repo .* --path "
                                       "desired"):  # named as --repo, a folder of a repository is no repository
        open_state(Source(work / "desired"))
    # The in-memory state of the simulator has no signatures to check either: nothing is acted on.
    files = {str(p.relative_to(plain)): p.read_bytes() for p in plain.rglob("*") if p.is_file()}
    report = Reconciler(SimRepo(files), environ={}).tick()
    assert not launched(report) and report.statuses == {}
    assert any("not in a git repository, so no signature can be checked" in e for e in report.errors)


def test_a_key_list_on_the_machine_that_is_a_fifo_holds_changes_and_does_not_hang(
        state_repo: StateRepoFixture, local_workdir: Path, tmp_path: Path) -> None:
    need("ssh-keygen")
    alice = ssh_key(tmp_path, "alice")
    keys = tmp_path / "allowed_signers"
    os.mkfifo(keys)  # a read would wait for a writer forever
    settings = (state_repo.path / "reconciler.yaml").read_text()
    state_repo.write("reconciler.yaml", settings + f"signatures:\n  allowed_signers: {keys}\n")
    commit(state_repo.path, "require signed changes", alice)
    state_repo.write("desired/a.yaml", job("a", SLEEP))
    added = commit(state_repo.path, "add a", alice)
    report = Reconciler(state_repo.path).tick()
    assert not launched(report)
    assert any(added[:12] in e and f"the allowed keys file {keys} cannot be read" in e for e in report.errors)


def test_each_folder_of_a_clone_keeps_its_own_last_trusted_change(tmp_path: Path, local_workdir: Path) -> None:
    """One clone reconciled as --path a, then as --path b: b's unsigned change is not accepted
    because a later commit was trusted under a's keys."""
    need("ssh-keygen")
    alice, bob = ssh_key(tmp_path, "alice"), ssh_key(tmp_path, "bob")
    work = tmp_path / "mono"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    for folder, key in (("a", alice), ("b", bob)):
        signer = f"{key.name}@example.com {key.with_suffix('.pub').read_text()}"
        write(work, f"{folder}/.reconciler/allowed_signers", signer)
        write(work, f"{folder}/reconciler.yaml", f"storage: file://{tmp_path / 'runs'}\nsignatures:\n"
                                                 "  allowed_signers: .reconciler/allowed_signers\n")
    first = commit(work, "both folders ask for signatures", alice)
    write(work, "b/desired/x.yaml", job("x", SLEEP))
    unsigned = commit(work, "x, unsigned", None)
    write(work, "a/desired/y.yaml", job("y", SLEEP))
    commit(work, "y, signed by alice", alice)
    assert launched(Reconciler(open_state(Source(work, path="a"))).tick()) == {"y"}
    report = Reconciler(open_state(Source(work, path="b"))).tick()
    assert not launched(report) and report.commit == first
    assert any(unsigned[:12] in e and "is held: it is not signed" in e for e in report.errors)
