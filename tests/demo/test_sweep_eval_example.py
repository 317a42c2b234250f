"""examples/sweep-eval end to end: its manifests and scripts copied into a real state repository,
reconciled on the local provider by in-process ticks (real git, real worker processes, run storage
on disk) until the learning-rate sweep and the evaluation that runs after it have succeeded; then
`reconciler artifacts ls|pull` read what they left. And a missing output of a member holds the
evaluation back, naming the file, until it is restored."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from adapters.storage import RunFolder
from reconciler.cli.main import app
from reconciler.daemon.loop import Reconciler, TickReport
from status.models import Phase
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import phase, tick_until

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "sweep-eval"
MEMBERS = ["train-lr-0-01", "train-lr-0-03", "train-lr-0-1"]


def install(repo: StateRepoFixture, manifests: tuple[str, ...] = ("train.yaml", "eval.yaml")) -> None:
    """The example's scripts and `manifests`, as a user copies them in, committed. Two changes a test
    needs: `python` is this interpreter, and PYTHONPATH names this checkout (a worker gets a minimal
    environment, and this checkout's SDK is the one under test)."""
    shutil.copytree(EXAMPLE / "scripts", repo.path / "scripts", dirs_exist_ok=True)
    for name in manifests:
        doc = yaml.safe_load((EXAMPLE / "desired" / name).read_text())
        spec = doc["spec"]
        spec["command"] = [sys.executable if part == "python" else part for part in spec["command"]]
        spec["env"] = {**spec.get("env", {}), "PYTHONPATH": str(ROOT)}
        repo.write(f"desired/{name}", yaml.safe_dump(doc, sort_keys=False))
    repo.commit(f"sweep-eval example: {', '.join(manifests)}")


def all_succeeded(*jobs: str) -> Any:
    def done(report: TickReport) -> bool:
        failed = [j for j in jobs if j in report.statuses and report.statuses[j].phase == Phase.FAILED]
        assert not failed, {j: report.statuses[j].message for j in failed}
        return all(j in report.statuses and report.statuses[j].phase == Phase.SUCCEEDED for j in jobs)
    return done


def artifacts(repo: StateRepoFixture, *args: str) -> str:
    result = CliRunner().invoke(app, ["artifacts", *args, "--repo", str(repo.path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def run_id(repo: StateRepoFixture, job: str) -> str:
    rec = Reconciler(repo.path)
    return rec.read_recorded(rec.repo.head())[job].run_id


def stored(repo: StateRepoFixture, job: str) -> dict[str, bytes]:
    """The outputs of the job's succeeded run as run storage holds them, by path (from its record)."""
    done = RunFolder.for_run(f"file://{repo.storage}", job, run_id(repo, job)).done()
    assert done is not None
    folder = repo.storage / job / run_id(repo, job) / done["outputs"]["folder"]
    return {rel: (folder / rel).read_bytes() for rel in done["outputs"]["files"]}


def test_the_example_picks_the_member_with_the_lowest_validation_loss_and_pulls_verified_bytes(
        state_repo: StateRepoFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(state_repo.path)  # `reconciler run` from the repository: the commands name scripts/
    install(state_repo)
    tick_until(Reconciler(state_repo.path), all_succeeded(*MEMBERS, "eval"), timeout=120, between=0.3)

    artifacts(state_repo, "pull", "train", str(tmp_path / "members"))
    artifacts(state_repo, "pull", "eval", str(tmp_path / "results"))
    losses = {m: json.loads((tmp_path / "members" / m / "metrics.json").read_text())["val_loss"] for m in MEMBERS}
    best = json.loads((tmp_path / "results" / "best.json").read_text())
    assert best["member"] == min(losses, key=losses.__getitem__)
    assert best["val_loss"] == losses[best["member"]] and best["members"] == losses
    assert (tmp_path / "results" / "model.pt").read_bytes() == (tmp_path / "members" / best["member"] /
                                                                "model.pt").read_bytes()
    pulled = {"eval": tmp_path / "results", **{m: tmp_path / "members" / m for m in MEMBERS}}
    for job, folder in pulled.items():
        held = stored(state_repo, job)
        assert sorted(held) == (["best.json", "model.pt"] if job == "eval" else ["metrics.json", "model.pt"])
        assert {rel: (folder / rel).read_bytes() for rel in held} == held, job
    listed = artifacts(state_repo, "ls", "train") + artifacts(state_repo, "ls", "eval")
    rows = {tuple(line.split()[:3]) for line in listed.splitlines()}
    for job in pulled:
        for rel in stored(state_repo, job):
            assert (job, run_id(state_repo, job), rel) in rows, listed


def test_a_missing_member_output_holds_eval_pending_naming_it_until_it_is_restored(
        state_repo: StateRepoFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(state_repo.path)
    install(state_repo, ("train.yaml",))
    rec = Reconciler(state_repo.path)
    tick_until(rec, all_succeeded(*MEMBERS), timeout=120, between=0.3)
    member = MEMBERS[1]
    st = rec.read_recorded(rec.repo.head())[member]
    lost = next((state_repo.storage / member / st.run_id / "outputs").glob("e*/model.pt"))
    kept = lost.read_bytes()
    lost.unlink()  # after the member succeeded, before eval exists: eval's first launch finds it gone

    install(state_repo, ("eval.yaml",))
    for _ in range(3):
        report = rec.tick()
    held = report.statuses["eval"]
    assert held.phase == Phase.PENDING, held.message
    assert held.message.startswith("held: an input is not available:"), held.message
    assert f"output model.pt of {member} (run {st.run_id}) is missing" in held.message, held.message
    assert f"restore it, or change {member}'s manifest so that it runs again" in held.message, held.message
    assert held.total_attempts == 0 and not (state_repo.storage / "eval").exists()
    assert report.all_terminal, "run --until-done stops: every job is finished or held"

    lost.write_bytes(kept)
    final = tick_until(rec, phase("eval"), timeout=60, between=0.3)
    assert final.statuses["eval"].phase == Phase.SUCCEEDED, final.statuses["eval"].message
