"""`spec.after` end to end: real worker processes on the local provider and a real git repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from reconciler.daemon.loop import Reconciler, TickReport
from status.models import Phase
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job, tick_until

FAILING = [sys.executable, "-c", "import sys; sys.exit(3)"]


def both_settled(report: TickReport) -> bool:
    return report.all_terminal and {"a", "b"} <= set(report.statuses)


def test_a_job_after_another_starts_only_once_that_one_has_succeeded(state_repo: StateRepoFixture,
                                                                     local_workdir: Path) -> None:
    state_repo.write("desired/a.yaml", job("a", counter(0.02)))
    state_repo.write("desired/b.yaml", job("b", counter(0.02), "after: [a]"))
    state_repo.commit("b runs after a")
    plan = zygote.run([sys.executable, "-m", "reconciler", "plan", "--repo", str(state_repo.path)],
                      capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "240"})
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    b_at = lines.index("  b: Pending — waiting for: a (New)")
    assert lines[b_at + 1] == "    after: a (Launching)"  # as this plan leaves a
    said: list[str] = []

    def watch(report: TickReport) -> None:
        a, b = report.statuses.get("a"), report.statuses.get("b")
        if a is not None and b is not None and a.phase != Phase.SUCCEEDED:
            said.append(b.message)
            assert b.total_attempts == 0, "b started before a succeeded"

    final = tick_until(Reconciler(state_repo.path), both_settled, each=watch)
    a, b = final.statuses["a"], final.statuses["b"]
    assert (a.phase, b.phase) == (Phase.SUCCEEDED, Phase.SUCCEEDED), (a.message, b.message)
    assert "waiting for: a (Running)" in said
    a_done = a.attempts[-1].ended
    assert a_done is not None and b.attempts[0].started >= a_done


def test_a_job_after_a_failed_one_is_held_then_goes_on_once_a_new_run_of_it_succeeds(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/a.yaml", job("a", FAILING, "retry: {max_retries: 0}"))
    state_repo.write("desired/b.yaml", job("b", counter(0.02), "after: [a]"))
    state_repo.commit("b runs after a, which fails")
    rec = Reconciler(state_repo.path)
    held = tick_until(rec, both_settled)  # run --until-done would stop here
    a, b = held.statuses["a"], held.statuses["b"]
    assert a.phase == Phase.FAILED
    assert (b.phase, b.total_attempts) == (Phase.PENDING, 0)
    assert b.message == "held: a (Failed) will not succeed as it is; this job starts once it is fixed and succeeds"
    state_repo.write("desired/a.yaml", job("a", counter(0.02)))
    state_repo.commit("fix a")
    final = tick_until(rec, lambda r: both_settled(r) and r.statuses["b"].phase.terminal)
    a, b = final.statuses["a"], final.statuses["b"]
    assert (a.phase, b.phase) == (Phase.SUCCEEDED, Phase.SUCCEEDED), (a.message, b.message)
    a_done = a.attempts[-1].ended
    assert a_done is not None and b.attempts[0].started >= a_done
