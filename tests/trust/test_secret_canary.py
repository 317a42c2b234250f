"""Secret canary: a canary secret in the daemon's environment, named by a failing job that prints
it (plain, base64, URL-encoded) and by a succeeding one, must appear nowhere the reconciler
writes: git history, status files, its own log output; nor in a job that did not ask for it.

One real `reconciler run --until-done` on the local provider serves every check in this module.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import yaml

from tests import zygote
from tests.conftest import StateRepoFixture, kill_local_workers

CANARY = "canary-7Hq/x+Zr=9secret"
FORMS = {
    "plain": CANARY,
    "base64": base64.b64encode(CANARY.encode()).decode(),
    "base64-urlsafe": base64.urlsafe_b64encode(CANARY.encode()).decode(),
    "base64-unpadded": base64.b64encode(CANARY.encode()).decode().rstrip("="),
    "url": quote(CANARY, safe=""),
    "url-plus": quote_plus(CANARY),
    "url-lowercase": re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(CANARY, safe="")),
    "html-decimal": "".join(f"&#{ord(c)};" if c in "/+=" else c for c in CANARY),
}

PRINT_ALL = ("import os, re, base64, urllib.parse as u; s = os.environ['CANARY']; "
             "print('secret', s); print('b64', base64.b64encode(s.encode()).decode()); "
             "print('url', u.quote(s, safe=''), u.quote_plus(s)); "
             "print('lower', re.sub('%[0-9A-F]{2}', lambda m: m.group(0).lower(), u.quote(s, safe=''))); "
             "print('html', ''.join('&#%d;' % ord(c) if c in '/+=' else c for c in s))")


def job(name: str, command: list[str], **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
                           "spec": {"command": command, "retry": {"max_retries": 0}, **spec}})


def exec_python(code: str) -> list[str]:
    """A plain program run through `reconciler exec`, which marks the run done when it exits 0."""
    return [sys.executable, "-m", "reconciler", "exec", "--", sys.executable, "-c", code]


@dataclass
class CanaryRun:
    repo: StateRepoFixture
    output: str
    returncode: int
    env_dump: Path
    workers: Path  # the local provider's worker folders, with their logs


@pytest.fixture(scope="module")
def canary_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanaryRun]:
    tmp = tmp_path_factory.mktemp("canary")
    repo = StateRepoFixture(tmp / "state", tmp / "runs")
    env_dump = tmp / "third-job-env.json"
    repo.write("desired/leaky-fail.yaml", job("leaky-fail", [sys.executable, "-c", PRINT_ALL + "; raise SystemExit(1)"],
                                              secrets=["CANARY"]))
    repo.write("desired/leaky-ok.yaml", job("leaky-ok", exec_python(PRINT_ALL), secrets=["CANARY"]))
    repo.write("desired/bystander.yaml", job("bystander", exec_python(
        f"import json, os; open({str(env_dump)!r}, 'w').write(json.dumps(dict(os.environ)))")))
    repo.commit("three jobs, two with the canary secret")
    workers = tmp / "local-workers"
    env = {**os.environ, "CANARY": CANARY, "RECONCILER_LOCAL_WORKDIR": str(workers),
           "RECONCILER_GRACE_SECONDS": "3", "COLUMNS": "200"}
    try:
        res = zygote.run([sys.executable, "-m", "reconciler", "run", "--repo", str(repo.path), "--until-done",
                          "--no-watch", "--tick-seconds", "0.5", "--verbose"],
                         env=env, capture_output=True, text=True, timeout=240)
        yield CanaryRun(repo, res.stdout + res.stderr, res.returncode, env_dump, workers)
    finally:
        kill_local_workers(workers)


def leaks(text: str) -> list[str]:
    return [name for name, form in FORMS.items() if form in text]


def test_loop_ran_to_completion_with_the_failing_job_failed(canary_run: CanaryRun) -> None:
    assert canary_run.returncode == 1, canary_run.output
    assert "leaky-fail" in canary_run.output
    fail = yaml.safe_load(canary_run.repo.status_text("leaky-fail"))
    ok = yaml.safe_load(canary_run.repo.status_text("leaky-ok"))
    assert fail["phase"] == "Failed" and ok["phase"] == "Succeeded"
    # The failing job's log tail was committed, with the canary masked: the check is not vacuous.
    assert "***" in canary_run.repo.status_text("leaky-fail")
    assert "secret" in canary_run.repo.status_text("leaky-fail")


def test_no_canary_in_git_history(canary_run: CanaryRun) -> None:
    history = canary_run.repo.git("log", "-p", "--all", "--format=%H%n%an%n%B")
    assert not leaks(history)


def test_no_canary_in_status_files(canary_run: CanaryRun) -> None:
    for path in sorted((canary_run.repo.path / "status").iterdir()):
        assert not leaks(path.read_text()), path.name


def test_no_canary_in_daemon_logs(canary_run: CanaryRun) -> None:
    assert not leaks(canary_run.output)


def test_no_canary_in_the_stored_worker_logs_and_none_in_logs_from_a_shell_without_it(canary_run: CanaryRun) -> None:
    files = [p for p in canary_run.workers.rglob("*") if p.is_file()]
    assert any(p.name == "log" and b"secret ***" in p.read_bytes() for p in files)  # not vacuous
    for path in files:
        assert not leaks(path.read_bytes().decode("utf-8", "replace")), path
    shown = zygote.run([sys.executable, "-m", "reconciler", "logs", "leaky-fail", "--repo",
                        str(canary_run.repo.path)], capture_output=True, text=True, timeout=120,
                       env={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                            "RECONCILER_LOCAL_WORKDIR": str(canary_run.workers)})
    assert "secret ***" in shown.stdout, shown.stdout + shown.stderr
    assert not leaks(shown.stdout + shown.stderr)


def test_no_canary_in_environment_of_a_job_without_secrets(canary_run: CanaryRun) -> None:
    env = json.loads(canary_run.env_dump.read_text())
    assert "CANARY" not in env
    assert not leaks(json.dumps(env))


def test_plan_output_masks_a_secret_value_recorded_in_a_status(state_repo: StateRepoFixture) -> None:
    """A status written before redaction existed (or by hand) may hold a value; plan never shows it."""
    from desired.parse import parse_desired

    text = job("old", ["true"], secrets=["CANARY"])
    run_id = parse_desired({"desired/old.yaml": text}).jobs["old"].run_id()
    state_repo.write("desired/old.yaml", text)
    state_repo.write("status/old.yaml", yaml.safe_dump({"job": "old", "phase": "Failed", "run_id": run_id,
                                                        "manifest": "desired/old.yaml",
                                                        "message": f"token {FORMS['base64']} rejected"}))
    state_repo.commit("a status that holds the canary")
    res = zygote.run([sys.executable, "-m", "reconciler", "plan", "--repo", str(state_repo.path)],
                     env={**os.environ, "CANARY": CANARY}, capture_output=True, text=True, timeout=120)
    assert "old: Failed" in res.stdout, res.stdout + res.stderr
    assert "token *** rejected" in res.stdout
    assert not leaks(res.stdout + res.stderr)
