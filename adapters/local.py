"""The `local` compute adapter: workers are detached processes on this machine.

Each worker gets a folder `<workdir>/workers/<job>.<run_id>.e<epoch>/` holding its labels, the
supervisor's pid and start time, the output log and, once the command ends, its exit code. A
small supervisor (`python -m adapters.local_supervisor`) runs in its own session, so workers
survive the daemon, and a restarted daemon finds them again by reading those folders.

State table (the process's fate -> WorkerPhase):

| what the folder shows                               | phase      |
|-----------------------------------------------------|------------|
| supervisor alive, command not started yet           | pending    |
| supervisor alive, command running                   | running    |
| exit code >= 0 recorded                             | exited     |
| exit code < 0 recorded (killed by a signal)         | preempted  |
| no exit code and the supervisor is gone             | lost       |
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

from adapters.compute import LaunchSpec, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from desired.models import LocalSettings

DEFAULT_WORKDIR = "~/.reconciler/local"


def process_start_time(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot, to tell a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return None


def alive(pid: int, start_time: str | None) -> bool:
    current = process_start_time(pid)
    if current is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return False
    except OSError:
        return False
    return start_time is None or current == start_time


class LocalAdapter:
    def __init__(self, name: str, settings: LocalSettings | None = None) -> None:
        self.name = name
        settings = settings or LocalSettings()
        self.root = Path(os.path.expanduser(settings.workdir or os.environ.get(
            "RECONCILER_LOCAL_WORKDIR", DEFAULT_WORKDIR))) / "workers"

    # ---- helpers ---------------------------------------------------------------------------
    def _folder(self, job: str, run_id: str, epoch: int) -> Path:
        return self.root / f"{job}.{run_id}.e{epoch}"

    def _ref_of(self, folder: Path) -> WorkerRef | None:
        try:
            labels = json.loads((folder / "labels.json").read_text())
            if labels.get("provider") != self.name:
                return None
            return WorkerRef(self.name, folder.name, labels["job"], labels["run_id"], int(labels["epoch"]))
        except (OSError, ValueError, KeyError):
            return None

    def _read(self, folder: Path, name: str) -> str | None:
        try:
            return (folder / name).read_text().strip()
        except OSError:
            return None

    def _state(self, folder: Path) -> WorkerState:
        code = self._read(folder, "exit_code")
        if code is not None and code.lstrip("-").isdigit():
            rc = int(code)
            if rc < 0:
                sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
                return WorkerState(WorkerPhase.PREEMPTED, rc, f"killed by {sig}")
            return WorkerState(WorkerPhase.EXITED, rc, f"exited {rc}")
        pid = self._read(folder, "supervisor.pid")
        if pid and pid.isdigit() and alive(int(pid), self._read(folder, "supervisor.start")):
            if self._read(folder, "child.pid"):
                return WorkerState(WorkerPhase.RUNNING, None, "running")
            return WorkerState(WorkerPhase.PENDING, None, "starting")
        if pid is None and (folder / "launching").exists():
            return WorkerState(WorkerPhase.PENDING, None, "starting")
        return WorkerState(WorkerPhase.LOST, None, "supervisor gone without an exit code")

    # ---- the contract ------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> WorkerRef:
        folder = self._folder(spec.job, spec.run_id, spec.epoch)
        ref = WorkerRef(self.name, folder.name, spec.job, spec.run_id, spec.epoch)
        try:
            folder.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            return ref  # already launched with these labels: adopt
        except OSError as exc:
            raise ProviderUnavailable(f"local provider {self.name!r}: cannot create {folder}: {exc}") from exc
        labels = {"provider": self.name, "job": spec.job, "run_id": spec.run_id, "epoch": spec.epoch}
        (folder / "labels.json").write_text(json.dumps(labels))
        (folder / "launching").touch()
        env = {**os.environ, **spec.env, **spec.secret_env}
        cwd = os.path.expanduser(spec.workdir) if spec.workdir else None
        log = open(folder / "log", "ab")
        try:
            subprocess.Popen(
                [sys.executable, "-m", "adapters.local_supervisor", str(folder), "--", *spec.command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            (folder / "exit_code").write_text("127")
            log.write(f"cannot start the worker: {exc}\n".encode())
            raise ProviderUnavailable(f"local provider {self.name!r}: cannot start the worker: {exc}") from exc
        finally:
            log.close()
        return ref

    def observe(self) -> dict[WorkerRef, WorkerState]:
        found: dict[WorkerRef, WorkerState] = {}
        if not self.root.exists():
            return found
        for folder in sorted(self.root.iterdir()):
            ref = self._ref_of(folder)
            if ref is not None:
                found[ref] = self._state(folder)
        return found

    def terminate(self, ref: WorkerRef) -> None:
        """SIGTERM to the worker's process group: the supervisor gives the command a grace period
        to checkpoint, then kills it."""
        folder = self.root / ref.id
        (folder / "terminate-requested").touch(exist_ok=True)
        pid = self._read(folder, "supervisor.pid")
        if pid and pid.isdigit() and alive(int(pid), self._read(folder, "supervisor.start")):
            try:
                os.killpg(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_worker(self, ref: WorkerRef, sig: int = signal.SIGKILL) -> bool:
        """Sends `sig` to the worker command itself, as a crash or a preemption would (chaos, tests)."""
        child = self._read(self.root / ref.id, "child.pid")
        if not child or not child.isdigit():
            return False
        try:
            os.kill(int(child), sig)
            return True
        except ProcessLookupError:
            return False

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        try:
            with open(self.root / ref.id / "log", errors="replace") as fh:
                return "".join(deque(fh, maxlen=tail))
        except OSError:
            return ""

    def free_slots(self) -> int | None:
        return None
