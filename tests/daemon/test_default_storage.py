"""A repository that sets no `storage:` keeps its run data in a folder of its own.

Before, every such repository on a machine (and every one `reconciler init` made, which wrote the
shared default out) kept runs in ~/.reconciler/runs, keyed by job name and run identity only: a
second repository with the same job (the one `init` writes, say) found the first one's completed
run and recorded its job Succeeded without launching anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from desired.models import REPOSITORY_STORAGE
from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests import zygote
from tests.daemon.test_loop_local import counter, job, phase, tick_until


def init(path: Path) -> Path:
    res = zygote.run([sys.executable, "-m", "reconciler", "init", str(path)], capture_output=True, text=True,
                     timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return path


def commit(repo: Path, message: str) -> None:
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                    "commit", "-q", "-m", message], check=True)


def test_init_leaves_storage_unset_so_each_repository_gets_its_own_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = init(tmp_path / "state")
    settings = yaml.safe_load((repo / "reconciler.yaml").read_text())
    assert "storage" not in settings
    rec = Reconciler(repo)
    resolved = rec.read_desired(rec.repo.head()).settings.storage
    assert resolved == REPOSITORY_STORAGE.format(key=settings["identity"])
    assert resolved == f"file://~/.reconciler/repos/{settings['identity']}/runs"


def test_two_repositories_with_the_same_job_each_run_it(tmp_path: Path, local_workdir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    reports = {}
    for name in ("first", "second"):
        repo = init(tmp_path / name)
        (repo / "desired" / "hello.yaml").unlink()
        (repo / "desired" / "count.yaml").write_text(job("count", counter(0.01), "target_steps: 20"))
        (repo / "reconciler.yaml").write_text((repo / "reconciler.yaml").read_text().replace(
            "tick_seconds: 30", "tick_seconds: 0.5"))
        commit(repo, "a counting job")
        reports[name] = tick_until(Reconciler(repo), phase("count"), timeout=90, between=0.1)
    for name, report in reports.items():
        st = report.statuses["count"]
        assert st.phase == Phase.SUCCEEDED, (name, st.message)
        assert len(st.attempts) >= 1, f"{name}: recorded done without launching: {st.message}"
    folders = sorted(p.name for p in (tmp_path / "home" / ".reconciler" / "repos").iterdir())
    identities = sorted(yaml.safe_load((tmp_path / n / "reconciler.yaml").read_text())["identity"]
                        for n in ("first", "second"))
    assert folders == identities
    assert not (tmp_path / "home" / ".reconciler" / "runs").exists()


def test_a_storage_set_in_reconciler_yaml_is_used_as_written(tmp_path: Path) -> None:
    repo = tmp_path / "state"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "desired").mkdir()
    (repo / "reconciler.yaml").write_text("storage: file://~/.reconciler/runs\n")
    commit(repo, "shared storage, as init wrote it before")
    rec = Reconciler(repo)
    assert rec.read_desired(rec.repo.head()).settings.storage == "file://~/.reconciler/runs"
    assert rec.settings_at(rec.repo.head()).storage == "file://~/.reconciler/runs"
