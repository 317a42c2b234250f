"""`reconciler artifacts ls|pull` as a user meets them on a real state repository and the local
provider: a job that writes outputs, one that runs after it and reads them as inputs, and one-line
errors for a name that is not there or a job that has not completed."""

from __future__ import annotations

import sys
from pathlib import Path

from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import job, tick_until

MAKE = ('mkdir -p "$RECONCILER_OUTPUT_DIR/eval" && printf 41 > "$RECONCILER_OUTPUT_DIR/n.txt" && '
        'head -c 200000 /dev/urandom > "$RECONCILER_OUTPUT_DIR/eval/weights.bin"')
USE = 'echo $(( $(cat "$RECONCILER_INPUT_DIR/make/n.txt") + 1 )) > "$RECONCILER_OUTPUT_DIR/answer.txt"'


def exec_job(name: str, script: str, extra: str = "") -> str:
    return job(name, [sys.executable, "-m", "reconciler", "exec", "--", "sh", "-c", script], extra)


def test_outputs_are_listed_pulled_and_handed_to_the_job_after(state_repo: StateRepoFixture, tmp_path: Path) -> None:
    state_repo.write("desired/make.yaml", exec_job("make", MAKE))
    state_repo.write("desired/use.yaml", exec_job("use", USE, "after: [make]"))
    state_repo.commit("make, then use")
    final = tick_until(Reconciler(state_repo.path), lambda r: all(s.phase.terminal for s in r.statuses.values()),
                       timeout=120)
    assert {n: s.phase for n, s in final.statuses.items()} == {"make": Phase.SUCCEEDED, "use": Phase.SUCCEEDED}
    listed = final.statuses["make"].outputs or []
    assert [(o.path, o.size) for o in listed] == [("eval/weights.bin", 200000), ("n.txt", 2)]

    repo = ["--repo", str(state_repo.path)]
    ls = cli("artifacts", "ls", "make", *repo).stdout
    assert "eval/weights.bin" in ls and "195.3 KiB" in ls and "n.txt" in ls and "2 B" in ls
    pulled = cli("artifacts", "pull", "use", str(tmp_path / "out"), *repo)
    assert (tmp_path / "out" / "answer.txt").read_text().strip() == "42"
    assert "1 file (3 B) verified in" in pulled.stderr
    again = cli("artifacts", "pull", "make", str(tmp_path / "made"), *repo)
    assert "2 files (195.3 KiB) verified" in again.stderr
    assert len((tmp_path / "made" / "eval" / "weights.bin").read_bytes()) == 200000
    described = cli("describe", "make", *repo).stdout
    assert "outputs: eval/weights.bin (195.3 KiB), n.txt (2 B)" in described


def test_a_name_that_is_not_there_or_a_job_not_completed_is_one_sentence(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/wait.yaml", exec_job("wait", "sleep 30"))
    state_repo.commit("a job that does not finish soon")
    repo = ["--repo", str(state_repo.path)]
    res = cli("artifacts", "ls", "nope", *repo, check=False)
    assert res.returncode == 1 and "error: no job or sweep named nope (known: wait)" in res.stderr
    res = cli("artifacts", "pull", "wait", "dest", *repo, check=False)
    assert res.returncode == 1 and "not completed yet, so without outputs: wait (New)" in res.stderr
    assert "Traceback" not in res.stderr
