"""A succeeded job's page links its outputs, and each link downloads the file from run storage,
verified against the run's completion record; a path the record does not list is not served, nor
is an output that holds a secret. The job runs for real (the local provider, in-process ticks),
with file names that need escaping."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from starlette.testclient import TestClient

from reconciler.web.app import create_app
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import phase, tick_until

ROOT = Path(__file__).resolve().parents[2]
FILES = {"model.pt": bytes(range(256)) * 64, 'a <b>&"c.txt': b"escaped name\n", "sub dir/x#1?.json": b"{}"}
TOKEN = "tok-3f9a1c77e2"  # the job's secret: its worker writes it, base64-encoded, into report.json
WRITE = f"""
import base64, json, os
from reconciler.worker import open_run
with open_run() as run:
    for rel, data in {FILES!r}.items():
        (run.output_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run.output_dir / rel).write_bytes(data)
    auth = base64.b64encode(("user:" + os.environ["OUTPUT_API_TOKEN"]).encode()).decode()
    (run.output_dir / "report.json").write_text(json.dumps({{"loss": 0.5, "headers": {{"Authorization": auth}}}}))
    run.complete(1)
"""
OUTPUTS = [*FILES, "report.json"]


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> StateRepoFixture:
    """A state repository whose job `make` succeeded, leaving FILES as its outputs."""
    tmp = tmp_path_factory.mktemp("outputs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECONCILER_LOCAL_WORKDIR", str(tmp / "local-workers"))
        mp.setenv("OUTPUT_API_TOKEN", TOKEN)
        repo = StateRepoFixture(tmp / "state", tmp / "runs")
        repo.write("desired/make.yaml", yaml.safe_dump({
            "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": "make"},
            "spec": {"command": [sys.executable, "-c", WRITE], "target_steps": 1, "env": {"PYTHONPATH": str(ROOT)},
                     "secrets": ["OUTPUT_API_TOKEN"], "retry": {"max_retries": 0}}}))
        repo.commit("make leaves outputs")
        from reconciler.daemon.loop import Reconciler

        final = tick_until(Reconciler(repo.path), phase("make"), timeout=60)
    assert final.statuses["make"].phase.value == "Succeeded", final.statuses["make"].message
    return repo


def test_a_succeeded_jobs_page_links_each_output_with_its_name_escaped(done: StateRepoFixture) -> None:
    page = TestClient(create_app(done.path)).get("/job/make").text
    section = re.search(r'<table class="outputs" id="outputs">(.*?)</table>', page, re.S)
    assert section, page
    links = dict(re.findall(r'<a href="([^"]+)" download>([^<]*)</a>', section.group(1)))
    assert {html.unescape(text): href for href, text in links.items()} == {
        rel: f"/job/make/outputs/{quote(rel, safe='/')}" for rel in OUTPUTS}
    assert "<b>" not in section.group(1) and "a &lt;b&gt;&amp;&#34;c.txt" in section.group(1)
    assert "reconciler artifacts pull make DEST" in page


def test_each_output_link_downloads_the_stored_bytes_as_an_attachment(done: StateRepoFixture) -> None:
    client = TestClient(create_app(done.path))
    for rel, data in FILES.items():
        got = client.get(f"/job/make/outputs/{quote(rel, safe='/')}")
        assert got.status_code == 200, got.text
        assert got.content == data, rel
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.headers["content-disposition"].startswith("attachment;")
        assert got.headers["x-content-type-options"] == "nosniff"


def test_an_output_that_holds_a_secret_is_refused_and_says_how_to_get_it(done: StateRepoFixture) -> None:
    client = TestClient(create_app(done.path, environ={"OUTPUT_API_TOKEN": TOKEN}))
    got = client.get("/job/make/outputs/report.json")
    assert got.status_code == 403
    assert "report.json holds the value of a secret" in got.text
    assert "reconciler artifacts pull make DEST" in got.text
    assert TOKEN not in got.text
    stored = next((done.storage / "make").glob("*/outputs/e*/report.json")).read_text()
    assert TOKEN not in stored, "the secret is there base64-encoded only"
    assert client.get("/job/make/outputs/model.pt").status_code == 200, "the other outputs are sent"
    # A server without the secret in its environment cannot know it: the output is sent.
    assert TestClient(create_app(done.path, environ={})).get("/job/make/outputs/report.json").status_code == 200


def test_a_path_the_completion_record_does_not_list_gets_404(done: StateRepoFixture) -> None:
    stored = next((done.storage / "make").glob("*/outputs/e*"))
    (stored / "planted.txt").write_bytes(b"not in the record")  # in storage, but no output of the run
    client = TestClient(create_app(done.path))
    for path in ("planted.txt", "nope.bin", "%2e%2e/done.json", "sub%20dir", "model.pt/x"):
        got = client.get(f"/job/make/outputs/{path}")
        assert got.status_code == 404, (path, got.text)
        assert "its page lists the outputs there are" in got.text
    assert client.get("/job/nobody/outputs/model.pt").status_code == 404


def test_a_stored_output_that_differs_from_its_record_is_not_sent(done: StateRepoFixture) -> None:
    stored = next((done.storage / "make").glob("*/outputs/e*/model.pt"))
    kept = stored.read_bytes()
    stored.write_bytes(bytes(reversed(kept)))  # the same size, other bytes
    try:
        got = TestClient(create_app(done.path)).get("/job/make/outputs/model.pt")
    finally:
        stored.write_bytes(kept)
    assert got.status_code == 502
    assert "does not match its" in got.text and "completion record" in got.text, got.text
