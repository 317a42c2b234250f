"""The job commands on a real state repository: describe, suspend/resume/cancel as commits (kept
comments, pushed to a real bare remote, refused on a dirty file), status's progress bars, --version,
run's start-up line, and a description on every field of the schema."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli.jobs import announce
from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests import zygote
from tests.cli.test_cli import cli
from tests.cli.test_cli_logs import SECRET, printing_job
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import WORKLOAD, job, tick_until


def counter(step_seconds: float) -> list[str]:
    """The loop tests' counter workload, run as `python -c` so that the worker imports the package
    from its working directory, wherever the package is installed."""
    return [sys.executable, "-c", Path(WORKLOAD).read_text(), str(step_seconds)]


COMMENTED = """\
# the nightly sweep; ask Bob before changing the target
apiVersion: reconciler.dev/v1
kind: Job
metadata:
  name: sweep   # keep this name: dashboards use it
spec:
  command: ["python", "-c", "print(1)"]
  target_steps: 10  # ten epochs
---
apiVersion: reconciler.dev/v1
kind: Job
metadata:
  name: other
spec:
  command: ["true"]
"""


def test_version_prints_the_package_version() -> None:
    out = cli("--version").stdout
    assert out.startswith("reconciler ") and out.split()[1][0].isdigit()


def test_describe_shows_attempts_and_events_with_secrets_masked(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/echo.yaml", printing_job("echo"))
    state_repo.commit("add echo")
    env = {"API_TOKEN": SECRET}
    tick_until(Reconciler(state_repo.path, environ={**os.environ, **env}),
               lambda r: r.statuses["echo"].phase.terminal)
    out = cli("describe", "echo", "--repo", str(state_repo.path), env=env).stdout
    assert "echo: Succeeded" in out and "manifest: desired/echo.yaml" in out
    rows = [line for line in out.splitlines() if line.count("│") > 3 and line.split("│")[2].strip() == "local"]
    assert len(rows) == 2 and "job-error" in rows[0] and "succeeded" in rows[1], out
    assert rows[1].split("│")[1].strip() == "2"  # attempts are numbered from the first
    assert "events (status commits, newest first)" in out and "echo: Launching (attempt 1 launched on local" in out
    assert "Succeeded" in out.split("events")[1]
    assert SECRET not in out
    res = cli("describe", "nope", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1 and "error: no job named nope (jobs: echo)" in res.stderr


def test_describe_lists_attempts_per_run_this_run_first(state_repo: StateRepoFixture) -> None:
    """Issue 27 item 1: after a changed command started a new run, describe mixed both runs' attempts
    in one table under the new run's count."""
    state_repo.write("desired/count.yaml", job("count", counter(0.01)))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    first = tick_until(rec, lambda r: r.statuses["count"].phase.terminal).statuses["count"].run_id
    state_repo.write("desired/count.yaml", job("count", counter(0.02)))
    state_repo.commit("a changed command: a new run")
    second = tick_until(rec, lambda r: r.statuses["count"].run_id != first
                        and r.statuses["count"].phase.terminal).statuses["count"]
    out = cli("describe", "count", "--repo", str(state_repo.path)).stdout
    assert f"run: {second.run_id}" in out and "attempts this run: 1" in out
    this_run, earlier = out.split(f"attempts of run {second.run_id} (this run)")[1].split("events (")[0].split(
        f"attempts of earlier run {first}")
    def rows(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.count("│") > 3 and "local" in line]
    assert len(rows(this_run)) == 1 and "succeeded" in rows(this_run)[0], out
    assert len(rows(earlier)) == 1 and "succeeded" in rows(earlier)[0], out
    assert second.attempts[-1].run_id == second.run_id and second.attempts[0].run_id == first


def test_status_shows_a_progress_bar(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(0.02)))
    state_repo.commit("add count")
    tick_until(Reconciler(state_repo.path), lambda r: r.statuses["count"].phase.terminal)
    table = cli("status", "--repo", str(state_repo.path), "--output", "wide").stdout  # the bar is wide's
    assert "━" * 10 in table.split("┃ progress")[1] and "60/60 100% (saved 60)" in table
    rows = json.loads(cli("status", "--json", "--repo", str(state_repo.path)).stdout)
    assert rows[0]["metrics"] == {"total": 60 * 61 / 2}  # what the worker reported (issue 27 item 3)
    described = cli("describe", "count", "--repo", str(state_repo.path)).stdout
    assert "metrics the worker reported" in described
    total = next(line for line in described.splitlines() if "│ total" in line).split("│")
    assert [c.strip() for c in total[2:4]] == ["1830", "60"]  # newest value, at step


def test_suspend_resume_cancel_are_commits_that_keep_comments(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/jobs.yaml", COMMENTED)
    state_repo.commit("two jobs")
    repo = str(state_repo.path)
    out = cli("suspend", "sweep", "--repo", repo).stdout
    assert "sweep suspended: committed" in out
    text = (state_repo.path / "desired/jobs.yaml").read_text()
    assert "suspend: true" in text and "# keep this name: dashboards use it" in text
    assert "# the nightly sweep; ask Bob" in text and "target_steps: 10  # ten epochs" in text
    assert state_repo.git("log", "-1", "--format=%s").strip() == "suspend sweep"
    assert state_repo.git("status", "--porcelain").strip() == ""
    assert "already suspended" in cli("suspend", "sweep", "--repo", repo).stdout
    cli("resume", "sweep", "--repo", repo)
    assert "suspend: false" in (state_repo.path / "desired/jobs.yaml").read_text()
    cli("cancel", "sweep", "--repo", repo)
    text = (state_repo.path / "desired/jobs.yaml").read_text()
    assert "name: other" in text and "sweep" not in text  # only its document went
    assert "Reconciler-Confirm: cancel" in state_repo.git("log", "-1", "--format=%B")
    cli("cancel", "other", "--repo", repo)
    assert not (state_repo.path / "desired/jobs.yaml").exists()
    assert state_repo.git("status", "--porcelain").strip() == ""


def test_a_monorepo_subfolder_is_validated_edited_and_described_with_path(state_repo: StateRepoFixture) -> None:
    state_repo.write("infra/jobs/desired/jobs.yaml", COMMENTED)
    state_repo.commit("jobs in a monorepo folder")
    repo = str(state_repo.path)
    assert "2 job(s), 1 provider(s), 0 error(s)" in cli("validate", "--repo", repo, "--path", "infra/jobs").stdout
    res = cli("validate", "--repo", repo, "--path", "../elsewhere", check=False)
    assert res.returncode == 2 and "must be a folder inside the repository" in res.stderr
    out = cli("suspend", "sweep", "--repo", repo, "--path", "infra/jobs").stdout
    assert "sweep suspended: committed" in out and "infra/jobs/desired/jobs.yaml" in out
    assert "suspend: true" in (state_repo.path / "infra/jobs/desired/jobs.yaml").read_text()
    assert state_repo.git("status", "--porcelain").strip() == ""
    cli("cancel", "other", "--repo", repo, "--path", "infra/jobs")
    assert "name: other" not in (state_repo.path / "infra/jobs/desired/jobs.yaml").read_text()
    described = cli("describe", "sweep", "--repo", repo, "--path", "infra/jobs").stdout
    assert "sweep:" in described and "desired/jobs.yaml" in described


def test_a_dirty_manifest_or_unknown_job_is_refused(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/jobs.yaml", COMMENTED)
    state_repo.commit("two jobs")
    head = state_repo.git("rev-parse", "HEAD")
    state_repo.write("desired/jobs.yaml", COMMENTED + "# half-done edit\n")
    res = cli("suspend", "sweep", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1
    assert "error: desired/jobs.yaml has uncommitted changes; commit or stash them first" in res.stderr
    res = cli("cancel", "ghost", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1
    assert "no job named ghost in desired/ at HEAD (jobs and sweeps: other, sweep)" in res.stderr
    assert state_repo.git("rev-parse", "HEAD") == head


def test_the_commit_is_pushed_and_a_failed_push_is_said(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    state_repo.git("remote", "add", "origin", str(bare))
    settings = (state_repo.path / "reconciler.yaml").read_text()
    state_repo.write("reconciler.yaml", settings + "remote: origin\n")
    state_repo.write("desired/jobs.yaml", COMMENTED)
    state_repo.commit("two jobs")
    state_repo.git("push", "-q", "origin", "main")
    out = cli("suspend", "sweep", "--repo", str(state_repo.path)).stdout
    assert "pushed to origin" in out
    pushed = subprocess.run(["git", "-C", str(bare), "log", "-1", "--format=%s", "main"], check=True,
                            capture_output=True, text=True).stdout.strip()
    assert pushed == "suspend sweep"
    state_repo.git("remote", "set-url", "origin", str(tmp_path / "gone.git"))
    res = cli("resume", "sweep", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1 and "sweep resumed: committed" in res.stdout
    assert "error: the commit stays local: pushing it to origin failed" in res.stderr
    assert state_repo.git("log", "-1", "--format=%s").strip() == "resume sweep"


def test_the_daemon_suspends_a_running_job_after_the_suspend_commit(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(0.3)))
    state_repo.commit("add count")
    rec = Reconciler(state_repo.path)
    tick_until(rec, lambda r: r.statuses["count"].phase is Phase.RUNNING)
    cli("suspend", "count", "--repo", str(state_repo.path))
    final = tick_until(rec, lambda r: r.statuses["count"].phase is Phase.SUSPENDED)
    assert final.statuses["count"].current is None


def test_run_says_what_it_reconciles_with_credentials_masked(state_repo: StateRepoFixture,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    state_repo.write("reconciler.yaml", "storage: s3://AKIDEXAMPLE:wJalrXUtnFEMIK7MDENG@bucket/runs\n"
                                        "tick_seconds: 7\n")
    state_repo.write("desired/count.yaml", job("count", counter(0.05)))
    state_repo.commit("s3 storage")
    with caplog.at_level(logging.INFO, logger="reconciler"):
        announce(Reconciler(state_repo.path), None)
    line, where = (r.getMessage() for r in caplog.records[-2:])
    assert f"reconciling {state_repo.path}, branch main" in line
    assert "is stored in s3://***@bucket/runs" in where and "wJalrXUtnFEMIK7MDENG" not in line + where
    assert "providers: local (local)" in line and "1 job(s)" in line and "tick every 7s" in line


def test_every_schema_field_has_a_description() -> None:
    doc = json.loads(cli("schema").stdout)
    missing = []
    for kind, schema in doc.items():
        for name, definition in [(kind, schema), *schema.get("$defs", {}).items()]:
            for field, prop in definition.get("properties", {}).items():
                if not prop.get("description"):
                    missing.append(f"{name}.{field}")
    assert not missing, f"fields without a description: {', '.join(sorted(set(missing)))}"


def test_run_once_prints_the_start_up_line(state_repo: StateRepoFixture) -> None:
    res = cli("run", "--once", "--repo", str(state_repo.path))
    said = " ".join(res.stderr.split())
    assert f"reconciling {state_repo.path}, branch main; providers: local (local); 0 job(s); tick every 0.5s" in said
    assert f"is stored in {state_repo.storage} on this machine, outside the repository" in said, said


def test_describe_at_80_columns_lists_attempts_as_lines_without_cut_cells(state_repo: StateRepoFixture) -> None:
    """A table of eleven columns at 80 cut every cell to a few letters (`sta…`, `prov…`)."""
    state_repo.write("desired/count.yaml", job("count", counter(0.01)))
    state_repo.commit("add count")
    st = tick_until(Reconciler(state_repo.path), lambda r: r.statuses["count"].phase.terminal).statuses["count"]
    out = zygote.run([sys.executable, "-m", "reconciler", "describe", "count", "--repo", str(state_repo.path)],
                     capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, check=True).stdout
    attempts = out.split(f"attempts of run {st.run_id} (this run)")[1].split("events (")[0]
    assert "…" not in attempts, out
    assert "1. succeeded on local, steps 0→60 (gained 60, lost 0)" in " ".join(attempts.split()), out
    assert st.attempts[0].worker in "".join(attempts.split()), out
