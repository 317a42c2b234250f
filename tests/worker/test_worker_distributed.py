"""The worker SDK under torchrun: 2 and 4 real ranks (gloo on CPU, one process per rank, launched as
torchrun launches them, and once by torchrun itself). One checkpoint and one commit record per
step whatever the number of ranks; a rank killed in the middle of a save leaves that checkpoint
uncommitted and the next attempt resumes from the one before, bit-identical to an uninterrupted
run; sharded state saved by 4 ranks resumes on 2; a stop notice on one rank stops every rank at
the same step after one final checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from adapters.compute import WorkerPhase, WorkerState
from adapters.storage import COMMIT_FILE, RunFolder
from reconciler.daemon.loop import read_run
from reconciler.planner.judge import classify
from status.models import Attempt, Outcome
from tests.worker.harness import References, Store, assert_same, join_ranks, load, run_ranks, start_ranks

STEPS = 12
EVERY = 4
QUIET = {"RECONCILER_CHECKPOINT_EVERY": EVERY, "RECONCILER_HEARTBEAT_INTERVAL": 1000}


def notes(log: Path, rank: int, word: str) -> list[int]:
    path = Path(f"{log}.{rank}")
    if not path.exists():
        return []
    return [int(line.split()[1]) for line in path.read_text().splitlines() if line.startswith(word + " ")]


def checkpoint_dirs(folder: RunFolder) -> dict[str, set[str]]:
    base = Path(folder.store.os_path("checkpoints"))
    return {d.name: {f.name for f in d.iterdir()} for d in base.iterdir()} if base.exists() else {}


def reference(store: Store, tmp: Path, mode: str, world: int) -> Any:
    folder = store.folder()
    out = tmp / f"ref-{mode}-{world}.pt"
    codes = run_ranks(store.env(folder, folder.bump_lease(), **QUIET),
                      {"mode": mode, "steps": STEPS, "seed": 3, "out": str(out)}, world)
    assert codes == [0] * world
    return load(str(out))


@pytest.fixture(scope="module")
def ranks_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return Store("file", str(tmp_path_factory.mktemp("runs")))


def shared_reference(references: References, mode: str, world: int) -> Any:
    """`reference` on local disk, made once per test session (across the xdist workers) and shared by
    this module and tests/worker/test_worker_sharded_background.py, which compare against the same run."""

    def produce(folder: Path) -> None:
        reference(Store("file", str(folder / "runs")), folder, mode, world)  # leaves ref-{mode}-{world}.pt

    return load(str(references.get(f"dist-{mode}-{world}-steps{STEPS}-every{EVERY}-seed3", produce)
                    / f"ref-{mode}-{world}.pt"))


@pytest.fixture(scope="module")
def sharded_on_two(references: References) -> Any:
    """The sharded job run start to end on 2 ranks: what any resume on 2 ranks must equal."""
    return shared_reference(references, "sharded", 2)


def test_ddp_on_two_ranks_commits_once_per_checkpoint_and_survives_rank0_killed_mid_save(
        ranks_store: Store, tmp_path: Path) -> None:
    store = ranks_store
    expected = reference(store, tmp_path, "ddp", 2)
    folder = store.folder()
    log = tmp_path / "ddp.log"
    cfg = {"mode": "ddp", "steps": STEPS, "seed": 3, "log": str(log)}
    # Rank 0's storage writes: 2 for its one heartbeat, then about 14 per save: die inside the
    # second save's upload (rank 1 writes nothing; the launcher then ends it, as torchrun does).
    codes = run_ranks(store.env(folder, folder.bump_lease(), **QUIET), cfg, 2,
                      rank_env={0: {"RECONCILER_FAULT_KILL_AT": 2 + 14 + 4}})
    assert codes[0] == -9, codes
    assert folder.durable_step() == EVERY
    dirs = checkpoint_dirs(folder)
    assert COMMIT_FILE not in dirs.get(f"{2 * EVERY:012d}-e1", set()), "a checkpoint cut short must not be committed"
    out = tmp_path / "resumed.pt"
    codes = run_ranks(store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "out": str(out)}, 2)
    assert codes == [0, 0]
    assert [notes(log, r, "restored")[-1] for r in (0, 1)] == [EVERY, EVERY], "every rank resumes from one checkpoint"
    assert_same(expected, load(str(out)), "resumed DDP state")
    committed = {name for name, files in checkpoint_dirs(folder).items() if COMMIT_FILE in files}
    # One record each: the two newest, and the one restored from (kept while this attempt runs).
    assert committed == {f"{4:012d}-e1", f"{8:012d}-e2", f"{12:012d}-e2"}, committed
    assert folder.done()["step"] == STEPS


def test_sharded_state_of_four_ranks_one_killed_mid_save_resumes_on_two_ranks(
        ranks_store: Store, sharded_on_two: Any, tmp_path: Path) -> None:
    store = ranks_store
    folder = store.folder()
    log = tmp_path / "sharded.log"
    cfg = {"mode": "sharded", "steps": STEPS, "seed": 3, "log": str(log)}
    # Rank 1 hashes one file per save after writing its shard: it dies in the second save,
    # after every rank wrote its part and before rank 0 could commit.
    codes = run_ranks(store.env(folder, folder.bump_lease(), **QUIET), cfg, 4,
                      rank_env={1: {"RECONCILER_FAULT_KILL_AT": 2}})
    assert codes[1] == -9, codes
    assert folder.durable_step() == EVERY
    cut = checkpoint_dirs(folder)[f"{2 * EVERY:012d}-e1"]
    assert "__1_0.distcp" in cut and COMMIT_FILE not in cut, cut
    out = tmp_path / "resumed.pt"
    codes = run_ranks(store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "out": str(out)}, 2)
    assert codes == [0, 0]
    assert [notes(log, r, "restored")[-1] for r in (0, 1)] == [EVERY, EVERY]
    assert_same(sharded_on_two, load(str(out)), "sharded state resumed on 2 ranks")


def test_a_stop_notice_on_one_rank_stops_all_ranks_at_the_same_step(
        ranks_store: Store, sharded_on_two: Any, tmp_path: Path) -> None:
    store = ranks_store
    folder = store.folder()
    log = tmp_path / "stop.log"
    cfg = {"mode": "sharded", "steps": STEPS, "seed": 3, "log": str(log), "sleep": 0.25}
    procs = start_ranks(store.env(folder, folder.bump_lease(), **QUIET), cfg, 4)
    deadline = time.monotonic() + 60
    while not notes(log, 2, "step") or notes(log, 2, "step")[-1] < 2:
        assert time.monotonic() < deadline, "rank 2 never got going"
        time.sleep(0.05)
    os.kill(procs[2].pid, signal.SIGTERM)  # a notice that reached one rank only
    assert join_ranks(procs, 60) == [75, 75, 75, 75]
    stopped = {r: notes(log, r, "stopped") for r in range(4)}
    assert all(len(s) == 1 for s in stopped.values()) and len({s[0] for s in stopped.values()}) == 1, \
        f"every rank stops once, at one step: {stopped}"
    step = stopped[0][0]
    assert step < STEPS and folder.durable_step() == step
    assert folder.progress() is not None and folder.progress().stopping == "signal"
    out = tmp_path / "resumed.pt"
    codes = run_ranks(store.env(folder, folder.bump_lease(), **QUIET), {**cfg, "sleep": 0, "out": str(out)}, 2)
    assert codes == [0, 0] and notes(log, 0, "restored")[-1] == step
    assert_same(sharded_on_two, load(str(out)), "state saved by 4 ranks on a stop, resumed on 2")


def test_ddp_under_torchrun_stops_on_sigterm_and_the_reconciler_counts_it_as_an_interruption(
        ranks_store: Store, tmp_path: Path) -> None:
    folder = ranks_store.folder()
    epoch = folder.bump_lease()
    env = {**os.environ, **ranks_store.env(folder, epoch, **QUIET), "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    script = Path(__file__).parent / "workloads" / "dist_train.py"
    log = tmp_path / "tr.log"
    cfg = {"mode": "ddp", "steps": STEPS, "seed": 3, "log": str(log)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
         json.dumps({**cfg, "sleep": 0.2})], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not notes(log, 1, "step") or notes(log, 1, "step")[-1] < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks never got going"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # what a provider's stop does to the launcher
    output, _ = proc.communicate(timeout=120)
    # torchrun turns the ranks' 75 into 1; the SDK's stopping beat tells the reconciler what it was.
    assert proc.returncode == 1, output[-3000:]
    stopped = [notes(log, r, "stopped") for r in (0, 1)]
    assert stopped[0] == stopped[1] and len(stopped[0]) == 1, stopped
    step = stopped[0][0]
    assert folder.durable_step() == step < STEPS
    seen = read_run(ranks_store.base, "job", folder.uri.rsplit("/", 1)[-1], {})
    assert seen.heartbeat_stopping == "signal"
    verdict = classify(desired_job(), Attempt(epoch=epoch, provider="p", worker="w", started=0.0),
                       WorkerState(WorkerPhase.EXITED, 1), seen)
    assert verdict is not None and verdict.outcome == Outcome.INTERRUPTION
    # The next attempt (same world size) finishes the run; every save committed once.
    assert run_ranks(ranks_store.env(folder, folder.bump_lease(), **QUIET), cfg, 2) == [0, 0]
    assert [notes(log, r, "restored")[-1] for r in (0, 1)] == [step, step]
    committed = {n for n, files in checkpoint_dirs(folder).items() if COMMIT_FILE in files}
    assert {f"{8:012d}-e2", f"{12:012d}-e2"} <= committed
    assert folder.done()["step"] == STEPS


def desired_job() -> Any:
    from desired.parse import parse_desired

    manifest = "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {name: job}\n" \
               "spec: {command: [python, train.py], target_steps: 12}\n"
    state = parse_desired({"desired/job.yaml": manifest})
    assert not state.errors, state.errors
    return state.jobs["job"]


def test_a_process_group_the_script_initialised_itself_is_used(ranks_store: Store, tmp_path: Path) -> None:
    # As under torch.multiprocessing.spawn: no RANK/WORLD_SIZE in the environment, only the group.
    folder = ranks_store.folder()
    log = tmp_path / "own.log"
    cfg = {"mode": "ddp", "steps": STEPS, "seed": 3, "log": str(log), "own_group": True}
    assert run_ranks(ranks_store.env(folder, folder.bump_lease(), **QUIET), cfg, 2) == [0, 0]
    committed = sorted(n for n, files in checkpoint_dirs(folder).items() if COMMIT_FILE in files)
    assert committed == [f"{8:012d}-e1", f"{12:012d}-e1"]
    assert folder.done()["step"] == STEPS
