"""A sweep end to end: real worker processes on the local provider, a real git repository."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from reconciler.daemon.loop import Reconciler, TickReport
from status.models import Phase
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import WORKLOAD, live_workers, tick_until

# Notes its seed (as substituted into the command, and from the environment) and when it ran, by
# its own clock, then counts as the counter workload does.
MEMBER = """
import os, runpy, sys, time
log, seed = sys.argv[1], "${{ matrix.seed }}"
start = time.time()
sys.argv = [sys.argv[2], "0.05"]
runpy.run_path(sys.argv[0], run_name="__main__")
with open(os.path.join(log, os.environ["RECONCILER_MATRIX_SEED"]), "w") as f:
    f.write(f"{seed} {start} {time.time()}")
"""


def test_a_sweep_of_three_with_max_parallel_two_succeeds_with_never_more_than_two_live(
        state_repo: StateRepoFixture, local_workdir: Path, tmp_path: Path) -> None:
    log = tmp_path / "ran"
    log.mkdir()
    state_repo.write("desired/sweep.yaml", yaml.safe_dump_all([
        {"kind": "Provider", "metadata": {"name": "local"}, "spec": {"settings": {"type": "local"}, "concurrency": 4}},
        {"kind": "Job", "metadata": {"name": "sweep"},
         "spec": {"command": [sys.executable, "-c", MEMBER, str(log), str(WORKLOAD)], "target_steps": 40,
                  "checkpoint_every": 10, "matrix": {"seed": [1, 2, 3], "max_parallel": 2}}},
    ]))
    state_repo.commit("a sweep of three, two at a time")
    members = ["sweep-seed-1", "sweep-seed-2", "sweep-seed-3"]
    most: list[int] = []

    def count(report: TickReport) -> None:  # after a tick's launches: the most live until the next
        most.append(len(live_workers(local_workdir)))

    final = tick_until(Reconciler(state_repo.path), lambda r: all(
        m in r.statuses and r.statuses[m].phase.terminal for m in members), timeout=120, each=count)
    assert [final.statuses[m].phase for m in members] == [Phase.SUCCEEDED] * 3, final.statuses
    assert all(final.statuses[m].sweep == "sweep" for m in members)
    assert max(most) == 2
    ran = {p.name: p.read_text().split() for p in log.iterdir()}
    assert sorted(ran) == ["1", "2", "3"] and all(ran[s][0] == s for s in ran)
    spans = [(float(start), float(end)) for _, start, end in ran.values()]
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) == 2  # by the workers' own clocks
    status = yaml.safe_load(state_repo.status_text("sweep-seed-3"))
    assert status["sweep"] == "sweep" and status["phase"] == "Succeeded"
