"""The command line as a user meets it: plan, status, secrets, init, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from reconciler.daemon.loop import Reconciler
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, live_workers, tick_until
from tests.worker.conftest import make_bucket, s3_endpoint  # noqa: F401 - a fixture
from tests.worker.harness import S3_CREDENTIALS


def cli(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = zygote.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True,
                     env={**os.environ, **(env or {}), "COLUMNS": "240"}, timeout=120)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_plan_shows_the_launch_without_doing_it(state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    out = cli("plan", "--repo", str(state_repo.path)).stdout
    assert "launch count" in out and "on local" in out
    assert not (local_workdir / "workers").exists()
    assert not (state_repo.path / "status").exists()


def test_plan_exits_1_naming_the_broken_manifest_and_still_plans_the_rest(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.write("desired/broken.yaml", "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {name: b}\n"
                                            "spec: {command: [x], colour: blue}\n")
    state_repo.commit("one good, one broken")
    res = cli("plan", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "desired/broken.yaml" in res.stderr and "colour" in res.stderr
    assert "launch count" in res.stdout
    state_repo.remove("desired/broken.yaml")
    state_repo.commit("fixed")
    assert cli("plan", "--repo", str(state_repo.path)).returncode == 0


def test_status_lists_jobs_with_progress(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(0.02)))
    state_repo.commit("add count")
    tick_until(Reconciler(state_repo.path), lambda r: r.statuses["count"].phase.terminal)
    rows = json.loads(cli("status", "--repo", str(state_repo.path), "--json").stdout)
    assert rows[0]["job"] == "count" and rows[0]["phase"] == "Succeeded"
    assert rows[0]["step"] == 60 and rows[0]["target"] == 60
    table = cli("status", "--repo", str(state_repo.path)).stdout
    assert "count" in table and "Succeeded" in table and "60/60" in table
    assert "providers" in table and "used this period" in table  # the ledger of the last status commit


def test_secret_reaches_the_worker_but_never_git_or_status(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    secret = "s3cr3t-value-9f8e7d"
    out = tmp_path / "seen"
    probe = [sys.executable, "-c",
             "import os, sys; open(sys.argv[1], 'w').write(os.environ['API_TOKEN']); "
             "from reconciler.worker import open_run; open_run().complete(1)", str(out)]
    state_repo.write("desired/probe.yaml", job("probe", probe, "secrets: [API_TOKEN]"))
    state_repo.commit("add probe")
    missing = Reconciler(state_repo.path, environ={}).tick()
    assert "secret API_TOKEN is not set" in missing.statuses["probe"].message
    rec = Reconciler(state_repo.path, environ={**os.environ, "API_TOKEN": secret})
    final = tick_until(rec, lambda r: r.statuses["probe"].phase.terminal)
    assert final.statuses["probe"].phase.value == "Succeeded"
    assert out.read_text() == secret
    history = state_repo.git("log", "-p", "--all")
    assert secret not in history
    assert secret not in "".join(p.read_text() for p in (state_repo.path / "status").iterdir())
    assert "API_TOKEN" in (state_repo.path / "desired" / "probe.yaml").read_text()


def test_init_creates_a_repository_that_validates(tmp_path: Path) -> None:
    cli("init", str(tmp_path / "runs"))
    assert (tmp_path / "runs" / ".git").is_dir()
    assert cli("validate", "--repo", str(tmp_path / "runs")).returncode == 0
    spec = yaml.safe_load((tmp_path / "runs" / "desired" / "hello.yaml").read_text())
    assert spec["kind"] == "Job"


def test_init_shows_the_next_command_whole_whatever_the_folder_is_called(tmp_path: Path) -> None:
    where = tmp_path.joinpath(*["a-long-folder-name"] * 14, "[red]runs")  # over the 240 columns; markup is text
    res = cli("init", str(where))
    assert f"then `reconciler run --repo {where}`" in res.stdout.splitlines()[-1], res.stdout


def test_init_where_no_folder_can_be_made_says_so_in_one_sentence(tmp_path: Path) -> None:
    res = cli("init", str(tmp_path / ("x" * 300)), check=False)  # a name longer than any file system takes
    said = " ".join(res.stderr.split())  # the terminal may wrap it
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert said.startswith("error: cannot create a state repository at "), said
    assert said.endswith(": File name too long; choose a folder you can write to"), said


def test_stopping_the_daemon_leaves_workers_running(state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    daemon = zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path),
                           "--tick-seconds", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not live_workers(local_workdir):
            assert time.time() < deadline, "no worker was launched"
            time.sleep(0.2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    assert len(live_workers(local_workdir)) == 1


def test_unknown_repository_is_one_clear_sentence(tmp_path: Path) -> None:
    res = cli("run", "--once", "--repo", str(tmp_path), check=False)
    assert res.returncode == 1
    assert "is not a git repository" in res.stderr and "Traceback" not in res.stderr


def hidden(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment in which `import module` fails, as on a machine that lacks it."""
    shadow = tmp_path / f"no-{module}" / module
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text(f"raise ImportError(\"No module named '{module}'\")\n")
    return {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_a_storage_backend_that_is_not_installed_is_one_error_at_start_up(state_repo: StateRepoFixture,
                                                                           tmp_path: Path) -> None:
    """s3:// storage without its backend used to leave jobs Pending with "No module named ..."
    while every command exited 0."""
    state_repo.write("reconciler.yaml", "storage: s3://bucket/runs\n")
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("s3 storage")
    for command in (["run", "--once"], ["plan"], ["validate"]):
        res = cli(*command, "--repo", str(state_repo.path), env=hidden(tmp_path, "s3fs"), check=False)
        assert res.returncode == 1, (command, res.stdout + res.stderr)
        assert "s3fs" in res.stderr and "pip install 'reconciler[s3]'" in res.stderr
        assert "Traceback" not in res.stderr
    assert not (state_repo.path / "status").exists()


def test_memory_storage_is_refused_at_start_up(state_repo: StateRepoFixture) -> None:
    """memory:// is a store for tests inside one process: a worker could never reach it."""
    state_repo.write("reconciler.yaml", "storage: memory://runs\n")
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("memory storage")
    res = cli("run", "--once", "--repo", str(state_repo.path), check=False)
    assert res.returncode == 1 and "lives in the memory of one process" in res.stderr
    assert not (state_repo.path / "status").exists()


def test_s3_storage_needs_no_boto3(state_repo: StateRepoFixture, tmp_path: Path,
                                   s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    """The s3 extra cannot name boto3 (pip cannot resolve it beside s3fs), so nothing needs it."""
    bucket = make_bucket(s3_endpoint)
    state_repo.write("reconciler.yaml", f"storage: s3://{bucket}/runs\n"
                                        f"storage_options: {{endpoint_url: '{s3_endpoint}'}}\n")
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("s3 storage")
    env = {**hidden(tmp_path, "boto3"), **S3_CREDENTIALS}
    res = cli("plan", "--repo", str(state_repo.path), env=env)
    assert "launch count" in res.stdout and "boto3" not in res.stdout + res.stderr


def test_run_once_while_another_clone_leads_does_nothing_and_says_who_leads(state_repo: StateRepoFixture,
                                                                           local_workdir: Path) -> None:
    from adapters.leader import Election

    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    state_repo.commit("add count")
    from reconciler.daemon.loop import repository_identity

    root = repository_identity(state_repo.git("rev-list", "--max-parents=0", "HEAD").strip())
    elsewhere = Election(clone="/another/clone")
    assert elsewhere.hold(f"file://{state_repo.storage}", {}, root, 0.5, time.time()).leading
    res = cli("run", "--once", "--repo", str(state_repo.path))
    assert "standby:" in res.stdout and elsewhere.holder in res.stdout
    assert not (state_repo.path / "status").exists() and not live_workers(local_workdir)
    elsewhere.resign(time.time())
    cli("run", "--once", "--repo", str(state_repo.path))
    assert (state_repo.path / "status" / "count.yaml").exists()


def test_plan_says_what_a_job_runs_after_as_the_plan_leaves_it() -> None:
    from reconciler.cli.main import _plan_after
    from reconciler.planner.plan import Observed, RunObservation, plan
    from status.models import Attempt, JobStatus, Phase
    from tests.planner.test_plan import NOW, desired, job_yaml

    d = desired(job_yaml("a"), job_yaml("b", extra="  after: [a]"))
    run_id = d.jobs["a"].run_id()
    a = JobStatus(job="a", run_id=run_id, phase=Phase.RUNNING, total_attempts=1, attempts=[
        Attempt(run_id=run_id, epoch=1, provider="free", worker="w", started=NOW - 100)])
    running = plan(d, Observed(), {"a": a}, NOW)
    assert _plan_after("b", running.statuses["b"], d, running.statuses) == "after: a (Running)"
    ends = Observed(runs={("a", run_id): RunObservation(lease_epoch=1, done=True, done_time=NOW - 5)})
    ended = plan(d, ends, {"a": a}, NOW)  # a completes in this tick; b saw it Running
    assert ended.statuses["b"].message == "waiting for: a (Running)"
    assert _plan_after("b", ended.statuses["b"], d, ended.statuses) == \
        "after: a (Succeeded); it stops waiting at the next tick"
    assert _plan_after("a", ended.statuses["a"], d, ended.statuses) == ""
