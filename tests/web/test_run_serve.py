"""`reconciler run --serve`: the real daemon with the local provider, its status page beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests import zygote
from tests.conftest import StateRepoFixture
from tests.web.conftest import ROOT, free_port


def _daemon(state_repo: StateRepoFixture, log: Path, *args: str,
            env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`reconciler run ARGS` on a repository with one job that sleeps a minute, its output in `log`."""
    state_repo.write("desired/sleeper.yaml", yaml.safe_dump({
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "sleeper"},
        "spec": {"command": [sys.executable, "-c", "import time; time.sleep(60)"], "target_steps": 10}}))
    state_repo.commit("sleeper")
    with open(log, "wb") as out:
        return zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path), *args],
                            stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", **(env or {})})


def test_run_with_serve_shows_the_daemon_s_job_on_the_page(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "daemon.log"
    proc = _daemon(state_repo, log, "--serve", f"127.0.0.1:{port}")
    try:
        deadline, text = time.time() + 60, ""
        while time.time() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text
                if 'data-job="sleeper"' in text and ("p-running" in text or "p-launching" in text):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise AssertionError(f"the page never showed the job launched: {text[-500:]}\n{log.read_text()}")
        assert f"status page: http://127.0.0.1:{port}/" in log.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_serve_and_metrics_on_the_listen_address_are_served_by_one_server(
        state_repo: StateRepoFixture, tmp_path: Path) -> None:
    """`--serve` and `--metrics` naming `--listen`'s address: one port, GET / the page, GET /metrics
    the metrics, POST /webhook the webhook."""
    from reconciler.daemon.webhook import SECRET_ENV
    from tests.daemon.test_webhook import SECRET, github, push

    port = free_port()
    log = tmp_path / "daemon.log"
    at = f"127.0.0.1:{port}"
    proc = _daemon(state_repo, log, "--listen", at, "--serve", at, "--metrics", at, env={SECRET_ENV: SECRET})
    try:
        deadline, text = time.time() + 60, ""
        while time.time() < deadline and 'data-job="sleeper"' not in text:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text
            except httpx.HTTPError:
                time.sleep(0.3)
        assert 'data-job="sleeper"' in text, log.read_text()
        body = push()
        answer = httpx.post(f"http://127.0.0.1:{port}/webhook", content=body, headers=github(body), timeout=5)
        assert answer.status_code == 202, answer.text
        assert f"status page: http://127.0.0.1:{port}/, with the webhook" in log.read_text()
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert metrics.status_code == 200 and "reconciler_tick_duration_seconds" in metrics.text
        assert f"metrics: http://127.0.0.1:{port}/metrics" in log.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_listen_without_the_web_extra_is_one_sentence(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    (tmp_path / "uvicorn.py").write_text("raise ImportError('not installed', name='uvicorn')\n")
    from reconciler.daemon.webhook import SECRET_ENV

    res = zygote.run([sys.executable, "-m", "reconciler", "run", "--repo", str(state_repo.path), "--listen", ":0"],
                     capture_output=True, text=True, timeout=60,
                     env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "COLUMNS": "300",
                          SECRET_ENV: "s3cret"})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "--listen needs the web extra (uvicorn is missing): pip install 'reconciler[web]'" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (state_repo.path / ".git" / "reconciler.lock").exists()
