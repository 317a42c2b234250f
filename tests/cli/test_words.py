"""The words a user reads about attempts and status commits: each thing said once, and the reason
a launch gives is the true one."""

from __future__ import annotations

from adapters.compute import WorkerPhase, WorkerState
from reconciler.cli.logs import _attempt_state
from reconciler.daemon.subjects import SUBJECT_LIMIT, status_message
from reconciler.planner.judge import classify
from reconciler.planner.plan import Launch, Observed, RunObservation, plan
from status.models import Attempt, JobStatus, Outcome, Phase, Progress
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.planner.test_plan import NOW, desired, job_yaml, with_attempt


def test_a_kill_is_said_once() -> None:
    d = desired(job_yaml())
    st = with_attempt(d)
    state = WorkerState(WorkerPhase.PREEMPTED, provider_state="killed by SIGKILL",
                        detail="killed by SIGKILL, not by the reconciler")
    verdict = classify(d.jobs["train"], st.attempts[-1], state, RunObservation())
    assert verdict is not None and verdict.detail == "interrupted: killed by SIGKILL, not by the reconciler"
    other = WorkerState(WorkerPhase.PREEMPTED, provider_state="preempted", detail="the spot price rose")
    verdict = classify(d.jobs["train"], st.attempts[-1], other, RunObservation())
    assert verdict is not None and verdict.detail == "interrupted: preempted (the spot price rose)"


def test_the_first_launch_of_a_new_run_is_not_a_relaunch_after_the_old_one() -> None:
    old = desired(job_yaml())
    st = with_attempt(old, outcome=Outcome.SUCCEEDED, ended=NOW - 10, detail="completed")
    st.phase = Phase.SUCCEEDED
    new = desired(job_yaml(command='["python", "train2.py"]'))
    p = plan(new, Observed(), {"train": st}, NOW)
    assert p.actions == [Launch("train", new.jobs["train"].run_id(), "free", "first launch of the new run")]


def test_logs_says_how_a_suspended_attempt_ended() -> None:
    att = Attempt(epoch=2, provider="local", worker="w", started=NOW - 60, ended=NOW,
                  outcome=Outcome.CANCELLED, detail="suspended by the manifest")
    assert _attempt_state(att) == "ended: suspended by the manifest"


def status(job: str, phase: Phase, message: str, step: int = 0) -> JobStatus:
    return JobStatus(job=job, phase=phase, message=message, progress=Progress(step=step, target=400))


def test_a_status_commit_subject_names_each_job_and_what_happened_within_72_characters() -> None:
    changes = [(status("train", Phase.RUNNING, "attempt 2 running"), status("train", Phase.SUCCEEDED, "run completed")),
               (status("eval", Phase.PENDING, "new job"), status("eval", Phase.LAUNCHING, "attempt 1 launched")),
               (status("sweep", Phase.RUNNING, "x", 10), status("sweep", Phase.RUNNING, "x", 120))]
    lines = [f"{new.job}: whole line {n}" for n, (_, new) in enumerate(changes)]
    message = status_message(lines, changes, [new.message for _, new in changes])
    subject, _, body = message.partition("\n\n")
    assert subject == "train: Running -> Succeeded; eval: Pending -> Launching; 1 more job"
    assert body.splitlines() == [f"- {line}" for line in lines]  # every change whole in the body
    many = [(None, status(f"job-{n}", Phase.PENDING, "new job")) for n in range(12)]
    subject = status_message([f"l{n}" for n in range(12)], many, ["new job"] * 12).split("\n")[0]
    assert len(subject) <= SUBJECT_LIMIT and subject.endswith("more jobs") and subject.startswith("job-0: Pending")


def test_members_of_one_sweep_to_which_the_same_happened_are_told_once_in_the_subject() -> None:
    members = [(status(f"lr-{n}", Phase.RUNNING, ""), status(f"lr-{n}", Phase.SUCCEEDED, "")) for n in range(12)]
    for _, new in members:
        new.sweep = "lr"
    members[3][1].phase = Phase.FAILED
    changes = [*members, (status("prep-data", Phase.RUNNING, ""), status("prep-data", Phase.SUCCEEDED, ""))]
    lines = [f"{new.job}: whole line" for _, new in changes]
    subject, _, body = status_message(lines, changes, [""] * len(changes)).partition("\n\n")
    assert subject == "sweep lr: 11 members Running -> Succeeded; 2 more jobs"
    assert len(body.splitlines()) == 13  # every member's change whole in the body
    subject = status_message(lines[:-1], changes[:-1], [""] * 12).split("\n")[0]
    assert subject == "sweep lr: 11 members Running -> Succeeded; lr-3: Running -> Failed"
    crowded = status_message(lines, [(None, status(f"job-{n}", Phase.PENDING, "")) for n in range(3)] + changes[3:],
                             [""] * 13).split("\n")[0]
    assert crowded.endswith("; 10 more jobs"), crowded  # the members a piece left out are counted as jobs


def test_one_job_keeps_its_whole_line_or_the_first_clause_of_its_message() -> None:
    old, new = status("train-demo", Phase.RUNNING, ""), status("train-demo", Phase.PENDING, "")
    short = "train-demo: Running -> Succeeded (run completed)"
    assert status_message([short], [(old, new)], ["run completed"]) == short  # fits: as it is, no body
    message = "interrupted: killed by SIGKILL, not by the reconciler; relaunching when local has a free slot"
    line = f"train-demo: Running -> Pending ({message})"
    subject, _, body = status_message([line], [(old, new)], [message]).partition("\n\n")
    assert subject == "train-demo: Running -> Pending (interrupted: killed by SIGKILL)"
    assert body == f"- {line}"


def relaunched(epoch: int, detail: str) -> tuple[JobStatus, JobStatus]:
    """train-demo before and after attempt `epoch` was launched on local, the one before it ended so."""
    old = status("train-demo", Phase.RUNNING, f"attempt {epoch - 1} running")
    old.total_attempts = epoch - 1
    new = old.model_copy(deep=True, update={"phase": Phase.LAUNCHING, "total_attempts": epoch})
    new.attempts = [Attempt(epoch=epoch - 1, provider="local", worker="w1", started=NOW - 60, ended=NOW,
                            outcome=Outcome.INTERRUPTION, detail=detail),
                    Attempt(epoch=epoch, provider="local", worker="w2", started=NOW)]
    return old, new


def test_a_relaunch_subject_says_which_attempt_where_and_why() -> None:
    old, new = relaunched(3, "interrupted: killed by SIGKILL, not by the reconciler")
    message = "attempt 3 launched on local (relaunch after: interrupted: killed by SIGKILL, not by the reconciler)"
    line = f"train-demo: Running -> Launching ({message})"
    subject = status_message([line], [(old, new)], [message]).split("\n")[0]
    assert subject == "train-demo: attempt 3 on local after interrupted: killed by SIGKILL"


def test_a_running_subject_says_which_attempt_runs_where() -> None:
    old = status("train-demo", Phase.LAUNCHING, "attempt 5 launched on local (first launch)")
    new = status("train-demo", Phase.RUNNING, "attempt 5 running on local/r361768f2755b.train-demo.r-3d42ea961b6a.e5")
    new.attempts = [Attempt(epoch=5, provider="local", worker="r361768f2755b.train-demo.r-3d42ea961b6a.e5",
                            started=NOW)]
    line = f"train-demo: Launching -> Running ({new.message})"
    subject = status_message([line], [(old, new)], [new.message]).split("\n")[0]
    assert subject == "train-demo: Launching -> Running (attempt 5 on local)"


def test_the_docs_show_subjects_as_they_are_written() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "getting-started.md").read_text()
    shown = page.split("git log -- status/:\n", 1)[1].split("\nelapsed:", 1)[0].splitlines()
    subjects = [line.split(" reconciler: ", 1)[1] for line in shown if " reconciler: " in line]
    assert subjects and all(len(s) <= SUBJECT_LIMIT for s in subjects)
    old, new = relaunched(2, "interrupted: killed by SIGKILL, not by the reconciler, after a new checkpoint")
    line = f"train-demo: Running -> Launching (attempt 2 launched on local (relaunch after: {new.attempts[0].detail}))"
    assert status_message([line], [(old, new)], [line]).split("\n")[0] in subjects


def test_describe_tells_each_change_of_a_status_commit_once_and_whole(state_repo: StateRepoFixture) -> None:
    import os
    import sys

    from status.models import render_status

    old, new = status("train", Phase.RUNNING, ""), status("train", Phase.PENDING, "")
    message = "interrupted: killed by SIGKILL, not by the reconciler; relaunching when local has a free slot"
    new.message = message
    line = f"train: Running -> Pending ({message})"
    other = status("eval", Phase.PENDING, "new job")
    state_repo.write("status/train.yaml", render_status(new))
    state_repo.commit(status_message([line, "eval: Pending (new job)"], [(old, new), (None, other)],
                                     [message, "new job"]))
    out = zygote.run([sys.executable, "-m", "reconciler", "describe", "train", "--repo", str(state_repo.path)],
                     capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, check=True).stdout
    events = out.split("events (status commits, newest first)")[1]
    assert events.count("train: Running -> Pending") == 1 and message in events, events
    assert "eval" not in events
