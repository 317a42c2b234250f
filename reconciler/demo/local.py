"""`reconciler demo`: a state repository with one PyTorch job on the local provider, reconciled to
completion while chaos preempts the worker at random moments (SIGKILL, which the local provider
then reports as a preemption, as a cloud's would).

Everything is real: a git repository, run storage on local disk, detached worker processes, the
same daemon as `reconciler run`. Nothing leaves this machine.
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import git
import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from adapters.compute import WorkerPhase
from adapters.local import LocalAdapter
from adapters.storage import RunFolder
from desired.models import LocalSettings
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.service import Daemon
from reconciler.trust.shown import escape
from status.models import JobStatus, parse_status

MARKER = ".reconciler-demo"
JOB = "train-demo"


def _manifests(root: Path, steps: int) -> dict[str, str]:
    provider = {
        "apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "local"},
        "spec": {"settings": {"type": "local", "workdir": str(root / "workers")}, "concurrency": 1},
    }
    job = {
        "apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": JOB},
        "spec": {
            "command": [sys.executable, "-m", "reconciler.demo.train"],
            "env": {"DEMO_STEP_SECONDS": "0.03"},
            "target_steps": steps,
            "checkpoint_every": 20,
            "placement": {"providers": ["local"]},
            "retry": {"max_retries": 3, "backoff_seconds": 1},
            "stall_timeout_seconds": 120,
        },
    }
    return {
        "desired/providers.yaml": yaml.safe_dump(provider, sort_keys=False),
        "desired/train-demo.yaml": yaml.safe_dump(job, sort_keys=False),
        "reconciler.yaml": f"storage: file://{root / 'runs'}\ntick_seconds: 0.5\n",
    }


def create_demo_repo(root: Path, steps: int) -> Path:
    if root.exists():
        if not (root / MARKER).exists():
            raise FileExistsError(f"{root} exists and is not a demo folder; pass --dir with a new path")
        _stop_leftover_workers(root)
        shutil.rmtree(root)
    repo_dir = root / "repo"
    repo_dir.mkdir(parents=True)
    (root / MARKER).write_text("created by `reconciler demo`; safe to delete\n")
    repo = git.Repo.init(repo_dir, initial_branch="main")
    for rel, text in _manifests(root, steps).items():
        (repo_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / rel).write_text(text)
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "Add the demo training job", env={
        "GIT_AUTHOR_NAME": "demo user", "GIT_AUTHOR_EMAIL": "user@example.com",
        "GIT_COMMITTER_NAME": "demo user", "GIT_COMMITTER_EMAIL": "user@example.com"})
    return repo_dir


def _stop_leftover_workers(root: Path) -> None:
    adapter = LocalAdapter("local", LocalSettings(workdir=str(root / "workers")))
    for ref, state in adapter.observe().items():
        if state.phase in (WorkerPhase.RUNNING, WorkerPhase.PENDING):
            adapter.kill_worker(ref, signal.SIGKILL)
            adapter.terminate(ref)


class Chaos(threading.Thread):
    """Preempts the running worker at random moments (SIGKILL, reported by the local provider as a
    preemption: a kill with no provider's word is not a free interruption twice in a row), but only
    once it has written a checkpoint of its own, so that the run always moves forward."""

    def __init__(self, root: Path, rng: random.Random, kills: int, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="chaos")
        self.adapter = LocalAdapter("local", LocalSettings(workdir=str(root / "workers")))
        self.runs = root / "runs" / JOB
        self.rng = rng
        self.kills_left = kills
        self.stop = stop
        self.killed: list[tuple[int, int]] = []  # (epoch, heartbeat step at the kill)

    def run(self) -> None:
        while self.kills_left > 0 and not self.stop.wait(self.rng.uniform(1.5, 5.0)):
            for ref, state in self.adapter.observe().items():
                if state.phase != WorkerPhase.RUNNING:
                    continue
                folder = RunFolder(str(self.runs / ref.run_id))
                beat = folder.progress()
                if beat is None or beat.epoch != ref.epoch:
                    continue  # still importing torch: give it a chance to train
                if not any(c.epoch == ref.epoch for c in folder.committed_checkpoints()):
                    continue  # nothing saved by this attempt yet
                if self.adapter.kill_worker(ref, signal.SIGKILL, preempt=True):
                    self.killed.append((ref.epoch, beat.step))
                    self.kills_left -= 1


def reference_parameter_sum(steps: int) -> float:
    """The same training, uninterrupted and in-process, to check the resumed run bit for bit."""
    import torch

    from reconciler.demo.train import build, train_step, true_weights

    model, optimizer, scheduler = build()
    true_w = true_weights()
    for _ in range(steps):
        train_step(model, optimizer, scheduler, true_w)
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def run_demo(root: Path, *, chaos: bool = True, seed: int | None = None, steps: int = 400,
             console: Console | None = None, kills: int | None = None) -> int:
    console = console or Console()
    root = root.resolve()
    rng = random.Random(seed)
    try:
        repo_dir = create_demo_repo(root, steps)
    except FileExistsError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except OSError as exc:  # a name too long, a folder it may not write in, a full disk
        why = exc.strerror or str(exc)
        console.print(f"[red]error:[/red] cannot create the demo folder at {escape(str(root))}: {escape(why)}; "
                      "pass --dir a folder you can write to")
        return 2
    console.print(f"demo state repository: {escape(str(repo_dir))}")
    console.print(f"run storage: {escape(str(root / 'runs'))}   chaos: {'on' if chaos else 'off'}")
    stop = threading.Event()
    chaos_thread = Chaos(root, rng, kills if kills is not None else rng.randint(2, 4), stop)
    if chaos:
        chaos_thread.start()

    def show(report: TickReport) -> None:
        for line in report.changed:
            console.print(f"  [dim]{time.strftime('%H:%M:%S')}[/dim] {line}")

    started = time.time()
    daemon = Daemon(Reconciler(repo_dir), until_done=True, on_tick=show)
    try:
        daemon.run()
    finally:
        stop.set()
    elapsed = time.time() - started

    status = parse_status((repo_dir / "status" / f"{JOB}.yaml").read_bytes())
    if status is None:
        console.print("[red]demo: no status was written[/red]")
        return 1
    console.print(attempts_table(status))
    console.print(f"chaos kills (attempt, step at the kill): {chaos_thread.killed or 'none'}")
    done = RunFolder.for_run(f"file://{root / 'runs'}", JOB, status.run_id).done() or {}
    metrics = done.get("metrics", {}) if isinstance(done.get("metrics"), dict) else {}
    if "parameter_sum" in metrics:
        reference = reference_parameter_sum(steps)
        same = metrics["parameter_sum"] == reference
        console.print(f"final parameters equal an uninterrupted run: {'yes' if same else 'NO'} "
                      f"({metrics['parameter_sum']!r} vs {reference!r})")
    log = git.Repo(repo_dir).git.log("--format=%h %an: %s", "--", "status/")
    console.print("git log -- status/:")
    print(log, flush=True)
    outcome = status.phase.value.lower()
    # A command to copy: never wrapped, whatever the width (rich wraps at 80 columns in a pipe).
    history = f"git -C {escape(str(repo_dir))} log -p -- status/{JOB}.yaml"
    console.print(f"elapsed: {elapsed:.1f}s; status history: {history}", soft_wrap=True)
    print(f"demo: {outcome}: attempts={status.total_attempts} interruptions={status.interruptions} "
          f"lost_steps={status.steps_lost}", flush=True)
    return 0 if outcome == "succeeded" else 1


def attempts_table(status: JobStatus) -> Table:
    """The run's attempts, short enough for an 80-column terminal: the steps each resumed from and
    had saved at its end (`120-180`), what it lost, and the detail last, the one cell that may wrap."""
    table = Table("attempt", "outcome", "steps", "lost", "detail", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for col in table.columns[:4]:
        col.no_wrap = True
    for a in status.attempts:
        table.add_row(str(a.epoch), a.outcome.value if a.outcome else "open",
                      f"{a.step_start}-{'' if a.step_end is None else a.step_end}", str(a.steps_lost), escape(a.detail))
    return table


def main() -> None:  # pragma: no cover - convenience for `python -m reconciler.demo.local`
    sys.exit(run_demo(Path("demo-state")))


if __name__ == "__main__":  # pragma: no cover
    main()
