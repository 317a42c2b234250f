"""Status on a branch of its own: a real bare repository as origin, the daemon's clone and a user's
clone. The users' branch is only read; a user's push is never rejected because of the reconciler;
a person's force-push and an unreachable remote lose no status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from adapters.gitrepo import StateRepo
from reconciler.daemon.loop import Reconciler
from tests import zygote
from tests.conftest import StateRepoFixture, _git

STATUS = "reconciler/status"


def job(name: str, seconds: int = 120) -> str:
    return (f"apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
            f"spec:\n  command: [sleep, '{seconds}']\n")


class Shared:
    """origin (bare), the daemon's clone and a user's clone of it."""

    def __init__(self, state_repo: StateRepoFixture, tmp: Path, settings: str = "remote: origin\n") -> None:
        self.origin = tmp / "origin.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(self.origin)], check=True)
        state_repo.write("reconciler.yaml", (state_repo.path / "reconciler.yaml").read_text() + settings)
        state_repo.commit("shared settings")
        state_repo.git("remote", "add", "origin", str(self.origin))
        state_repo.git("push", "-q", "origin", "main")
        self.daemon = tmp / "daemon-clone"
        self.user = tmp / "user-clone"
        for path in (self.daemon, self.user):
            subprocess.run(["git", "clone", "-q", str(self.origin), str(path)], check=True)

    def push(self, rel: str, text: str, message: str) -> subprocess.CompletedProcess[str]:
        """A person's commit and plain push; they never pull first."""
        (self.user / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.user / rel).write_text(text)
        _git(self.user, "add", "-A")
        _git(self.user, "commit", "-q", "-m", message)
        return subprocess.run(["git", "-C", str(self.user), "push", "origin", "main"], capture_output=True, text=True)

    def origin_git(self, *args: str) -> str:
        return _git(self.origin, *args)

    def status_log(self, where: Path | None = None, ref: str = STATUS) -> list[tuple[str, str, str]]:
        """(sha, author, Desired-Commit trailer) of each status commit, newest first (none yet: [])."""
        if subprocess.run(["git", "-C", str(where or self.origin), "rev-parse", "-q", "--verify", ref],
                          capture_output=True).returncode != 0:
            return []
        out = _git(where or self.origin, "log", "--format=%H %an %(trailers:key=Desired-Commit,valueonly,separator=)",
                   ref)
        return [tuple(line.split(" ", 2)) for line in out.splitlines()]  # type: ignore[misc]

    def status_of(self, job_name: str, where: Path | None = None, ref: str = STATUS) -> dict:
        text = _git(where or self.origin, "show", f"{ref}:status/{job_name}.yaml")
        data = yaml.safe_load(text)
        assert isinstance(data, dict)
        return data


def tick_until(rec: Reconciler, cond, timeout: float = 30):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while True:
        report = rec.tick()
        if cond(report):
            return report
        assert time.time() < deadline, f"timed out; errors {report.errors}"
        time.sleep(0.2)


def test_user_pushes_are_never_rejected_while_the_daemon_runs(state_repo: StateRepoFixture, tmp_path: Path,
                                                               local_workdir: Path) -> None:
    shared = Shared(state_repo, tmp_path)  # ticks every 0.5 s
    daemon_head = _git(shared.daemon, "rev-parse", "HEAD")
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = zygote.popen([sys.executable, "-m", "reconciler", "run", "--repo", str(shared.daemon)],
                            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"})
    rejected = []
    try:
        for i in range(12):
            pushed = shared.push(f"desired/j{i}.yaml", job(f"j{i}"), f"add j{i}")
            if pushed.returncode != 0:
                rejected.append(pushed.stderr)
            time.sleep(0.5)  # a tick or two of the daemon between pushes
        assert rejected == [], f"{len(rejected)} of 12 user pushes rejected: {rejected[0]}"
        tip = _git(shared.user, "rev-parse", "HEAD").strip()
        deadline = time.time() + 60
        while not any(t == tip for _sha, _an, t in shared.status_log()):
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, f"no status computed from the last push; daemon log:\n{log.read_text()}"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    # The users' branch holds only the people's commits; the daemon's clone was left as it was.
    assert set(shared.origin_git("log", "--format=%an", "main").split()) == {"alice"}
    assert shared.origin_git("ls-tree", "-r", "--name-only", "main", "status") == ""
    assert _git(shared.daemon, "rev-parse", "HEAD") == daemon_head
    assert _git(shared.daemon, "status", "--porcelain") == ""
    # The status branch is the audit trail: every commit by the reconciler, naming a desired commit.
    trail = shared.status_log()
    people = set(shared.origin_git("log", "--format=%H", "main").split())
    assert trail and all(an == "reconciler" and t in people for _sha, an, t in trail)
    assert {shared.status_of(f"j{i}")["job"] for i in range(12)} == {f"j{i}" for i in range(12)}


def test_a_force_push_by_a_person_is_the_new_history_and_no_status_is_lost(
        state_repo: StateRepoFixture, tmp_path: Path, local_workdir: Path) -> None:
    shared = Shared(state_repo, tmp_path)
    base = _git(shared.user, "rev-parse", "HEAD").strip()
    assert shared.push("desired/old.yaml", job("old"), "add old").returncode == 0
    rec = Reconciler(shared.daemon)
    tick_until(rec, lambda r: "old" in r.statuses and r.statuses["old"].phase.value == "Running")
    before = shared.status_log()
    # A person rewrites main: `old` never happened, `new` did.
    _git(shared.user, "reset", "-q", "--hard", base)
    (shared.user / "desired").mkdir(exist_ok=True)
    (shared.user / "desired" / "new.yaml").write_text(job("new"))
    _git(shared.user, "add", "-A")
    _git(shared.user, "commit", "-q", "-m", "rewritten: add new")
    _git(shared.user, "push", "-q", "--force", "origin", "main")
    forced = _git(shared.user, "rev-parse", "HEAD").strip()
    report = rec.tick()
    assert report.commit == forced
    assert report.errors == []
    assert set(report.statuses) == {"old", "new"}
    # Gone from desired/: its worker is stopped and it is cancelled, its status kept as history.
    tick_until(rec, lambda r: r.statuses["old"].phase.value == "Cancelled")
    after = shared.status_log()
    assert after[0][2] == forced  # computed from the person's new history
    assert [c for c in after if c in before] == before  # every earlier status commit is still there
    assert shared.status_of("old")["phase"] == "Cancelled" and shared.status_of("new")["job"] == "new"
    assert shared.origin_git("rev-parse", "main").strip() == forced  # nothing pushed over the person's commit


def test_status_queues_while_the_remote_is_unreachable_and_goes_out_in_order(
        state_repo: StateRepoFixture, tmp_path: Path, local_workdir: Path) -> None:
    shared = Shared(state_repo, tmp_path)
    assert shared.push("desired/a.yaml", job("a"), "add a").returncode == 0
    assert shared.push("desired/quick.yaml", job("quick", 1), "add quick").returncode == 0
    rec = Reconciler(shared.daemon)
    rec.tick()
    pushed_before = shared.status_log()
    away = tmp_path / "origin-away.git"
    shared.origin.rename(away)
    made = []
    deadline = time.time() + 40
    while len(made) < 3:
        started = time.time()
        report = rec.tick()
        assert time.time() - started < 10, "an unreachable remote must not stall the tick"
        assert any("cannot update from remote" in e for e in report.errors)
        if report.status_commit:
            made.append(report.status_commit)
        assert time.time() < deadline, f"too few status changes while away: {made}"
        time.sleep(0.3)
    away.rename(shared.origin)
    report = rec.tick()
    assert not [e for e in report.errors if "remote" in e]
    local = _git(shared.daemon, "rev-parse", f"refs/heads/{STATUS}").strip()
    assert shared.origin_git("rev-parse", STATUS).strip() == local
    trail = [sha for sha, _an, _t in reversed(shared.status_log())]
    assert [s for s in trail if s in made] == made  # every commit made while away, in order
    assert trail[:len(pushed_before)] == [sha for sha, _an, _t in reversed(pushed_before)]


def test_a_fresh_clone_reads_recorded_status_from_the_remote_copy(
        state_repo: StateRepoFixture, tmp_path: Path, local_workdir: Path) -> None:
    shared = Shared(state_repo, tmp_path)
    assert shared.push("desired/a.yaml", job("a"), "add a").returncode == 0
    first = tick_until(Reconciler(shared.daemon), lambda r: r.statuses["a"].phase.value == "Running")
    # `reconciler status` in a user's clone: no local status branch, only origin's after a fetch.
    _git(shared.user, "fetch", "-q", "origin")
    out = zygote.run([sys.executable, "-m", "reconciler", "status", "--repo", str(shared.user), "--json"],
                     capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "300"}).stdout
    rows = json.loads(out)
    assert [(r["job"], r["phase"], r["attempts"]) for r in rows] == [("a", "Running", 1)]
    described = zygote.run([sys.executable, "-m", "reconciler", "describe", "a", "--repo", str(shared.user)],
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "300"})
    assert described.returncode == 0 and "a: Running" in described.stdout, described.stderr
    # A new daemon clone carries on from the recorded status: same run, same attempt, no relaunch.
    fresh = tmp_path / "fresh-clone"
    subprocess.run(["git", "clone", "-q", str(shared.origin), str(fresh)], check=True)
    report = Reconciler(fresh).tick()
    st = report.statuses["a"]
    assert st.run_id == first.statuses["a"].run_id and st.total_attempts == 1 and not report.actions


def test_local_repository_with_a_status_branch_leaves_work_tree_and_index_alone(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("reconciler.yaml", (state_repo.path / "reconciler.yaml").read_text()
                     + f"status_branch: {STATUS}\n")
    state_repo.write("status/notes.md", "status kept on main before the switch\n")
    state_repo.write("desired/a.yaml", job("a"))
    head = state_repo.commit("a, status on a branch of its own")
    state_repo.write("desired/draft.yaml", "# a person's work in progress\n")
    state_repo.git("add", "desired/draft.yaml")
    report = Reconciler(state_repo.path).tick()
    assert report.status_commit is not None
    assert state_repo.git("rev-parse", "HEAD").strip() == head
    assert state_repo.git("status", "--porcelain").splitlines() == ["A  desired/draft.yaml"]
    assert state_repo.git("log", "-1", "--format=%(trailers:key=Desired-Commit,valueonly)", STATUS).strip() == head
    assert "phase: Launching" in state_repo.git("show", f"{STATUS}:status/a.yaml")
    # The first status commit carries on from status/ of the reconciled branch.
    assert "status/notes.md" in state_repo.git("ls-tree", "-r", "--name-only", STATUS).split()
    assert state_repo.git("rev-parse", STATUS).strip() == report.status_commit


def test_a_status_branch_moved_by_another_clone_gets_ours_replayed_on_top_never_forced(
        state_repo: StateRepoFixture, tmp_path: Path) -> None:
    shared = Shared(state_repo, tmp_path)
    other = tmp_path / "other-daemon"
    subprocess.run(["git", "clone", "-q", str(shared.origin), str(other)], check=True)
    ours = StateRepo(shared.daemon, remote="origin", status_branch=STATUS)
    theirs = StateRepo(other, remote="origin", status_branch=STATUS)
    ours.commit_status({"status/a.yaml": "a: 1\n", "status/gone.yaml": "x\n"}, "ours 1")
    ours.push()
    theirs.pull()
    theirs.commit_status({"status/b.yaml": "b: 1\n"}, "theirs")  # e.g. a leader before us
    theirs.push()
    ours.commit_status({"status/a.yaml": "a: 2\n", "status/gone.yaml": None}, "ours 2")
    ours.commit_status({"status/c.yaml": "c: 1\n"}, "ours 3")
    ours.push()  # rejected first (theirs moved the branch), then replayed and pushed
    subjects = shared.origin_git("log", "--format=%s", STATUS).split("\n")[:4]
    assert subjects == ["ours 3", "ours 2", "theirs", "ours 1"]
    files = {f: shared.origin_git("show", f"{STATUS}:{f}") for f in
             shared.origin_git("ls-tree", "-r", "--name-only", STATUS).split()}
    assert files == {"status/a.yaml": "a: 2\n", "status/b.yaml": "b: 1\n", "status/c.yaml": "c: 1\n"}
    assert _git(shared.daemon, "rev-parse", STATUS) == shared.origin_git("rev-parse", STATUS)


def test_switching_to_a_status_branch_takes_effect_next_tick_and_keeps_what_was_recorded(
        state_repo: StateRepoFixture, local_workdir: Path) -> None:
    state_repo.write("desired/a.yaml", job("a"))
    state_repo.commit("add a")
    rec = Reconciler(state_repo.path)
    first = tick_until(rec, lambda r: r.statuses["a"].phase.value == "Running")
    assert "phase: Running" in state_repo.status_text("a")  # on the branch itself: no remote, no setting
    state_repo.write("reconciler.yaml", (state_repo.path / "reconciler.yaml").read_text()
                     + "status_branch: audit/status\n")
    state_repo.commit("status on a branch of its own")
    state_repo.write("desired/b.yaml", job("b"))
    state_repo.commit("add b")
    report = rec.tick()  # the same daemon: settings are re-read every tick
    assert report.status_commit is not None and not [a for a in report.actions if a.startswith("launch a")]
    assert state_repo.git("log", "-1", "--format=%s").strip() == "add b"  # nothing more on the branch
    st = report.statuses["a"]
    assert st.run_id == first.statuses["a"].run_id and st.total_attempts == 1  # carried over, not relaunched
    recorded = yaml.safe_load(state_repo.git("show", "audit/status:status/a.yaml"))
    assert recorded["phase"] == "Running" and len(recorded["attempts"]) == 1
    assert "b" in state_repo.git("show", "audit/status:status/README.md")
