"""Sweeps at the command line: `plan` shows what a matrix change does to each member, `status`
rolls the members up a sweep a row and still lists each, with its sweep in --json."""

from __future__ import annotations

import json
import time

from desired.parse import parse_desired
from status.models import Attempt, Forecast, JobStatus, Phase, render_status
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture


def sweep(seeds: list[int]) -> str:
    return ("kind: Job\nmetadata: {name: sweep}\nspec:\n  command: [sleep, '${{ matrix.seed }}']\n"
            f"  matrix: {{seed: {seeds}}}\n")


def record(state_repo: StateRepoFixture, seeds: list[int], phases: list[Phase]) -> None:
    """Members of `sweep(seeds)` as a daemon would have recorded them, each with $0.50 spent."""
    jobs = parse_desired({"desired/sweep.yaml": sweep(seeds)}).jobs
    now = time.time()
    for (name, job), phase in zip(jobs.items(), phases, strict=True):
        live = [Attempt(epoch=1, provider="local", worker=f"{name}.e1", started=now)] if not phase.terminal else []
        st = JobStatus(job=name, run_id=job.run_id(), phase=phase, sweep="sweep", manifest="desired/sweep.yaml",
                       cost_usd=0.5, attempts=live, forecast=Forecast(spent_usd=0.5) if live else None)
        state_repo.write(f"status/{name}.yaml", render_status(st))


def test_plan_shows_which_members_start_stop_and_keep_going(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/sweep.yaml", sweep([1, 2, 3]))
    record(state_repo, [1, 2, 3], [Phase.RUNNING, Phase.RUNNING, Phase.SUCCEEDED])
    state_repo.commit("a sweep, as recorded")
    state_repo.write("desired/sweep.yaml", sweep([2, 3, 4]))
    state_repo.commit("seed 4 instead of seed 1")
    out = cli("plan", "--repo", str(state_repo.path)).stdout
    assert ("sweep sweep: 3 members; 1 start (sweep-seed-4); 1 stop (sweep-seed-1); 1 keep going; 1 finished"
            in out), out
    assert "sweep-seed-1: Cancelled — no longer in the matrix of sweep sweep" in out
    assert "would cancel" not in out


def test_status_rolls_members_up_per_sweep_and_lists_each_with_its_sweep(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/sweep.yaml", sweep([1, 2, 3]))
    state_repo.write("desired/solo.yaml", "kind: Job\nmetadata: {name: solo}\nspec: {command: [sleep, '1']}\n")
    record(state_repo, [1, 2, 3], [Phase.RUNNING, Phase.RUNNING, Phase.SUCCEEDED])
    state_repo.commit("a sweep and a job")
    rows = json.loads(cli("status", "--repo", str(state_repo.path), "--json").stdout)
    assert {r["job"]: r["sweep"] for r in rows} == {"solo": None, "sweep-seed-1": "sweep", "sweep-seed-2": "sweep",
                                                   "sweep-seed-3": "sweep"}
    table = cli("status", "--repo", str(state_repo.path)).stdout
    assert all(f"sweep-seed-{i}" in table for i in (1, 2, 3))
    rollup = table[table.index("sweeps"):].splitlines()
    assert rollup[1].split() == ["sweep", "members", "phases", "spent"]
    assert rollup[3].split() == ["sweep", "3", "2", "Running,", "1", "Succeeded", "$1.50"]
    plain = cli("status", "--repo", str(state_repo.path), "--output", "plain").stdout
    assert "sweeps" not in plain and len(plain.splitlines()) == 5  # a header and one line a job


def test_suspend_takes_a_sweep_as_a_whole_and_refuses_one_member_naming_the_sweep(
        state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/sweep.yaml", sweep([1, 2]))
    state_repo.commit("a sweep")
    member = cli("suspend", "sweep-seed-1", "--repo", str(state_repo.path), check=False)
    assert member.returncode == 1
    assert "sweep-seed-1 is a member of sweep sweep, which has no document of its own" in " ".join(
        member.stderr.split()), member.stderr
    cli("suspend", "sweep", "--repo", str(state_repo.path))
    text = (state_repo.path / "desired" / "sweep.yaml").read_text()
    assert "suspend: true" in text and "matrix:" in text
    members = parse_desired({"desired/sweep.yaml": text}).jobs
    assert sorted(members) == ["sweep-seed-1", "sweep-seed-2"] and all(j.spec.suspend for j in members.values())
