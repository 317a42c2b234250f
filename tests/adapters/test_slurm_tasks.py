"""Several tasks per Slurm job: the provider's `tasks` becomes `--ntasks` on one node and the agent
starts the command under `srun`; the worker SDK reads each task's rank from Slurm's variables.
Run on the tests' real single-node Slurm with the distributed workload of the worker tests (DDP,
gloo on CPU): both tasks train as ranks 0 and 1 of one world, each checkpoint is committed once,
and a task killed mid-run is resumed by the next job from the last checkpoint, ending
bit-identical to an uninterrupted 2-rank run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

from adapters.compute import LaunchSpec, WorkerPhase
from adapters.slurm import SlurmAdapter
from adapters.storage import COMMIT_FILE
from desired.models import SlurmSettings
from tests.adapters.conftest import Slurm
from tests.adapters.test_contract import ended, wait_state
from tests.worker.harness import Store, assert_same, load
from tests.worker.test_worker_distributed import EVERY, QUIET, STEPS, checkpoint_dirs, notes, reference

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "tests" / "worker" / "workloads" / "dist_train.py"


def test_tasks_become_ntasks_on_one_node_and_an_srun_command() -> None:
    settings = SlurmSettings(workdir="/tmp/wd", tasks=4)
    adapter = SlurmAdapter("slurm", settings, owner="o")
    spec = LaunchSpec(job="j", run_id="r", epoch=1, command=["python3", "train.py"], cpus=8)
    argv = adapter._sbatch_argv(spec, Path("/tmp/wd/f"), Path("/tmp/wd/f/batch.sh"))
    assert {"--nodes=1", "--ntasks=4", "--cpus-per-task=2"} <= set(argv), argv
    command = adapter._payload(spec)["command"]
    assert command[0] == "srun" and {"--ntasks=4", "--kill-on-bad-exit=0", "--wait=30"} <= set(command)
    assert command[-2:] == ["python3", "train.py"]
    single = SlurmAdapter("slurm", SlurmSettings(workdir="/tmp/wd"), owner="o")
    assert single._payload(spec)["command"] == ["python3", "train.py"]
    assert "--cpus-per-task=8" in single._sbatch_argv(spec, Path("/tmp/f"), Path("/tmp/f/b.sh"))
    assert not any(a.startswith("--ntasks") for a in single._sbatch_argv(spec, Path("/tmp/f"), Path("/tmp/f/b.sh")))


def launch(adapter: SlurmAdapter, store: Store, folder: object, epoch: int, cfg: dict[str, object],
           job: str) -> object:
    env = {**store.env(folder, epoch, **QUIET), "PYTHONPATH": str(ROOT)}  # type: ignore[arg-type]
    spec = LaunchSpec(job=job, run_id="r-tasks", epoch=epoch, cpus=2, env=env,
                      command=[sys.executable, "-u", str(WORKLOAD), json.dumps(cfg)])
    return adapter.launch(spec)


def test_a_two_task_job_trains_as_two_ranks_commits_once_per_checkpoint_and_resumes_after_a_kill(
        slurm: Slurm, tmp_path: Path) -> None:
    store = Store("file", str(tmp_path / "runs"))
    expected = reference(store, tmp_path, "ddp", 2)
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", tasks=2), owner="repo-a")
    folder = store.folder()
    log = tmp_path / "tasks.log"
    job = f"tasks-{uuid.uuid4().hex[:6]}"
    cfg = {"mode": "ddp", "steps": STEPS, "seed": 3, "log": str(log), "die_at": EVERY + 2, "die_rank": 1}
    first = wait_state(adapter, launch(adapter, store, folder, folder.bump_lease(), cfg, job), ended, 180)
    assert first.phase is WorkerPhase.EXITED and first.exit_code != 0, first
    assert notes(log, 1, "step")[-1] == EVERY + 2 and notes(log, 0, "saved") == [EVERY]
    assert folder.durable_step() == EVERY
    out = tmp_path / "resumed.pt"
    cfg = {k: v for k, v in cfg.items() if k not in ("die_at", "die_rank")}
    second = wait_state(adapter, launch(adapter, store, folder, folder.bump_lease(), {**cfg, "out": str(out)}, job),
                        ended, 180)
    logs = (tmp_path / "wd").rglob("log")
    assert (second.phase, second.exit_code) == (WorkerPhase.EXITED, 0), [p.read_text()[-2000:] for p in logs]
    assert [notes(log, r, "restored")[-1] for r in (0, 1)] == [EVERY, EVERY], "each task is a rank of one world"
    assert_same(expected, load(str(out)), "DDP state of a 2-task Slurm job resumed after a kill")
    committed = {name for name, files in checkpoint_dirs(folder).items() if COMMIT_FILE in files}
    assert committed == {f"{EVERY:012d}-e1", f"{2 * EVERY:012d}-e2", f"{STEPS:012d}-e2"}, committed
    assert folder.done()["step"] == STEPS
    assert not os.path.exists(f"{log}.2"), "two tasks, two ranks"


def test_the_batch_step_of_a_several_task_job_is_not_taken_for_a_rank(slurm: Slurm, tmp_path: Path) -> None:
    # A job that asked for 2 tasks but runs its command once, in the batch step (no srun): one process.
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", sbatch_options=["--ntasks=2"]), owner="repo-a")
    out = tmp_path / "derived.json"
    code = f"import json; from reconciler.worker.dist import slurm_env; json.dump(slurm_env(), open({str(out)!r}, 'w'))"
    spec = LaunchSpec(job=f"batch-{uuid.uuid4().hex[:6]}", run_id="r-batch", epoch=1, env={"PYTHONPATH": str(ROOT)},
                      command=[sys.executable, "-c", code])
    state = wait_state(adapter, adapter.launch(spec), ended, 60)
    assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, 0), state
    assert json.loads(out.read_text()) == {}


def test_the_time_limit_warning_reaches_every_task_through_srun_and_they_stop_at_one_step(
        slurm: Slurm, tmp_path: Path) -> None:
    store = Store("file", str(tmp_path / "runs"))
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd", tasks=2), owner="repo-a")
    folder = store.folder()
    log = tmp_path / "warned.log"
    cfg = {"mode": "ddp", "steps": 400, "seed": 3, "log": str(log), "sleep": 0.1}
    ref = launch(adapter, store, folder, folder.bump_lease(), cfg, f"warned-{uuid.uuid4().hex[:6]}")
    deadline = time.monotonic() + 120
    while len(notes(log, 1, "step")) < 3:
        assert time.monotonic() < deadline, "the tasks never got going"
        time.sleep(0.2)
    slurm.run("scancel", "--batch", "--signal=USR1", ref.id)  # what --signal=B:USR1@N sends the batch step
    state = wait_state(adapter, ref, ended, 120)
    stopped = [notes(log, r, "stopped") for r in (0, 1)]
    assert stopped[0] == stopped[1] and len(stopped[0]) == 1, stopped
    assert folder.durable_step() == stopped[0][0] < 400
    assert state.exit_code == 75, state
