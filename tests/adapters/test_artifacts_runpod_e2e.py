"""Artifacts end to end on the fake RunPod server: the real `reconciler run --until-done`, run storage
on S3 (the moto server), the storage credentials RunPod secrets. `train` leaves a file in its
outputs; `eval` runs after it on another pod, finds train's file under $RECONCILER_INPUT_DIR/train/
(RECONCILER_INPUTS travelled in the pod's launch), and leaves what it read, with its digest, in its
own outputs; `reconciler artifacts pull eval` brings those bytes back here."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from reconciler.cli.main import app
from tests.adapters import e2e
from tests.adapters.test_runpod_e2e import pods_on_s3
from tests.conftest import StateRepoFixture
from tests.worker.conftest import s3_endpoint  # noqa: F401 - a fixture

MAKE_WEIGHTS = 'bytes(range(256)) * 300 + b"the end"'  # 76,807 bytes: not one chunk of anything
WEIGHTS = bytes(range(256)) * 300 + b"the end"

TRAIN = f"""
from reconciler.worker import open_run
with open_run() as run:
    (run.output_dir / "weights.bin").write_bytes({MAKE_WEIGHTS})
    run.complete(1)
"""

EVAL = """
import hashlib, json
from reconciler.worker import open_run
with open_run() as run:
    got = (run.input_dir / "train" / "weights.bin").read_bytes()
    (run.output_dir / "copy.bin").write_bytes(got)
    summary = {"size": len(got), "sha256": hashlib.sha256(got).hexdigest()}
    (run.output_dir / "result.json").write_text(json.dumps(summary))
    run.complete(1)
"""


def hosted_job(name: str, code: str, after: list[str]) -> str:
    job = e2e.s3_job(name, "pods", 0.1, 1)
    job["spec"]["command"] = [sys.executable, "-c", code]
    job["spec"]["checkpoint_every"] = 1
    if after:
        job["spec"]["after"] = after
    return yaml.safe_dump(job)


@pytest.mark.slow
def test_eval_on_a_runpod_pod_reads_trains_outputs_and_its_result_pulls_back_byte_for_byte(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    fake, _ = pods_on_s3(state_repo, tmp_path, monkeypatch, s3_endpoint, interruptible=False)
    try:
        state_repo.write("desired/train.yaml", hosted_job("train", TRAIN, []))
        state_repo.write("desired/eval.yaml", hosted_job("eval", EVAL, ["train"]))
        state_repo.commit("train, then eval after it, on runpod with storage on s3")
        log = tmp_path / "daemon.log"
        with e2e.daemon_running(state_repo, log) as daemon:
            e2e.finish(daemon, log, timeout=120)
        e2e.succeeded(state_repo, "train")
        e2e.succeeded(state_repo, "eval")

        pulled = CliRunner().invoke(app, ["artifacts", "pull", "eval", str(tmp_path / "out"),
                                          "--repo", str(state_repo.path)])
        assert pulled.exit_code == 0, pulled.output
        assert (tmp_path / "out" / "copy.bin").read_bytes() == WEIGHTS
        result = yaml.safe_load((tmp_path / "out" / "result.json").read_text())
        assert result == {"size": len(WEIGHTS), "sha256": hashlib.sha256(WEIGHTS).hexdigest()}
        assert len([p for p in fake.pods.values() if "-eval-" in p.input["name"]]) == 1
    finally:
        fake.close()


EXAMPLE = Path(__file__).parents[2] / "examples" / "sweep-eval"


def example_on_pods(name: str) -> str:
    """One of examples/sweep-eval's manifests placed on `pods`: its scripts named by absolute path (a
    pod's work folder is its own), the storage credentials as RunPod secrets."""
    doc = yaml.safe_load((EXAMPLE / "desired" / name).read_text())
    spec, hosted = doc["spec"], e2e.s3_job("x", "pods", 0.1, 1)["spec"]
    spec["command"] = [sys.executable if part == "python" else str(EXAMPLE / part) if part.startswith("scripts/")
                       else part for part in spec["command"]]
    spec.update(secrets=hosted["secrets"], placement=hosted["placement"], env={**spec.get("env", {}), **hosted["env"]})
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.slow
def test_the_sweep_eval_example_runs_on_runpod_pods_and_its_best_member_pulls_back(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        s3_endpoint: str) -> None:  # noqa: F811 - a fixture
    """The example as it stands, on the hosted fake: three members, then eval after the sweep."""
    fake, _ = pods_on_s3(state_repo, tmp_path, monkeypatch, s3_endpoint, interruptible=False)
    try:
        for name in ("train.yaml", "eval.yaml"):
            state_repo.write(f"desired/{name}", example_on_pods(name))
        state_repo.commit("the sweep-eval example on runpod, storage on s3")
        log = tmp_path / "daemon.log"
        with e2e.daemon_running(state_repo, log) as daemon:
            e2e.finish(daemon, log, timeout=300)
        e2e.succeeded(state_repo, "eval")
        runner = CliRunner()
        for job in ("eval", "train"):
            pulled = runner.invoke(app, ["artifacts", "pull", job, str(tmp_path / job), "--repo", str(state_repo.path)])
            assert pulled.exit_code == 0, pulled.output
        members = {m.name: json.loads((m / "metrics.json").read_text()) for m in (tmp_path / "train").iterdir()}
        best = json.loads((tmp_path / "eval" / "best.json").read_text())
        lowest = min(members, key=lambda m: members[m]["val_loss"])
        assert len(members) == 3 and best["member"] == lowest, (best, members)
        chosen = (tmp_path / "eval" / "model.pt").read_bytes()
        assert chosen == (tmp_path / "train" / lowest / "model.pt").read_bytes()
        assert len([p for p in fake.pods.values() if "-eval-" in p.input["name"]]) == 1
    finally:
        fake.close()
