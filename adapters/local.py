"""The `local` compute adapter: workers are detached processes on this machine.

Each worker gets a folder `<workdir>/<owner>.<job>.<run_id>.e<epoch>/` (0700; without `workdir`,
in ~/.reconciler/local/workers/) holding its labels (provider, owner, job, run_id, epoch), the
supervisor's pid and start time, the output log (0600) and, once the command ends, its exit code.
`owner` is the state repository's identity: two repositories sharing this machine never see, stop
or read each other's workers (`observe` counts the others' live workers in `foreign_workers`). A
small supervisor (`python -m adapters.local_supervisor`) runs in its own session, so workers
survive the daemon, and a restarted daemon finds them again by reading those folders. The
supervisor gets the command's environment on its stdin (never in its own environment or in a
file); the command gets only the minimal base environment (`adapters.compute.worker_base_env`),
its `env` and its named secrets.

State table (the process's fate -> WorkerState):

| what the folder shows                               | phase      | evidence                        |
|-----------------------------------------------------|------------|---------------------------------|
| supervisor alive, command not started yet           | pending    |                                 |
| supervisor alive, command running                   | running    |                                 |
| exit code >= 0 recorded                             | exited     | exit_code                       |
| exit code < 0 recorded (killed by a signal)         | exited     | exit_code=-signum, signal name; |
|                                                     |            | oom when the cgroup's oom_kill  |
|                                                     |            | counter rose across a SIGKILL   |
| ... after the reconciler asked it to stop           | preempted  | signal, "stopped by the         |
|                                                     |            | reconciler"                     |
| no exit code and the supervisor is gone             | lost       |                                 |

A death by signal is reported as a fact (which signal, whether the reconciler had asked for the
stop, whether the kernel's OOM killer acted); the planner decides what it means.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path

from adapters.bootstrap import process_start_time
from adapters.compute import (
    ANY_OWNER,
    JobConfigError,
    LaunchRefused,
    LaunchSpec,
    ProviderConfigError,
    WorkerPhase,
    WorkerRef,
    WorkerState,
    check_owner,
    output_mask,
    with_deadline,
    worker_base_env,
    worker_deadline,
    worker_folder_name,
)
from desired.models import Capacity, LocalSettings

DEFAULT_WORKDIR = "~/.reconciler/local"


def alive(pid: int, start_time: str | None) -> bool:
    """The process `pid` runs (not a zombie) and is the one that started at `start_time`, when given."""
    current = process_start_time(pid)
    return current is not None and (start_time is None or current == start_time)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _meminfo_gb() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gpu_count() -> int:
    """Lines of `nvidia-smi -L`; 0 when there is no nvidia-smi or it fails."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if proc.returncode != 0:
        return 0
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))


def package_root() -> str:
    """The folder this package is imported from, so the supervisor runs the daemon's own code."""
    return str(Path(__file__).resolve().parent.parent)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def workers_root(settings: LocalSettings | None = None) -> Path:
    """The folder that holds one folder per worker (the daemon watches it for exit records): the
    provider's `workdir` itself, else `workers/` in RECONCILER_LOCAL_WORKDIR or ~/.reconciler/local."""
    settings = settings or LocalSettings()
    if settings.workdir:
        return Path(os.path.expanduser(settings.workdir))
    return Path(os.path.expanduser(os.environ.get("RECONCILER_LOCAL_WORKDIR", DEFAULT_WORKDIR))) / "workers"


def worker_roots(settings: LocalSettings | None = None) -> tuple[Path, ...]:
    """Where workers may be found: `workers_root`, and `<workdir>/workers/`, where earlier versions
    put them when `workdir` was set, while that folder exists (its workers are still observed,
    stopped and read; new ones go to `workers_root`)."""
    root = workers_root(settings)
    earlier = root / "workers"
    return (root, earlier) if settings is not None and settings.workdir and earlier.is_dir() else (root,)


class LocalAdapter:
    def __init__(self, name: str, settings: LocalSettings | None = None, *, owner: str = ANY_OWNER) -> None:
        self.name = name
        self.owner = check_owner(owner)
        self.foreign_workers = 0
        self.root = workers_root(settings)
        self.roots = worker_roots(settings)
        self._capacity: Capacity | None = None

    # ---- helpers ---------------------------------------------------------------------------
    def _labels(self, folder: Path) -> dict | None:
        try:
            labels = json.loads((folder / "labels.json").read_text())
        except (OSError, ValueError):
            return None
        return labels if isinstance(labels, dict) else None

    def _ours(self, labels: dict | None) -> bool:
        if labels is None or labels.get("provider") != self.name:
            return False
        return self.owner == ANY_OWNER or labels.get("owner") == self.owner

    def _ref_of(self, folder: Path, labels: dict) -> WorkerRef | None:
        try:
            return WorkerRef(self.name, folder.name, labels["job"], labels["run_id"], int(labels["epoch"]))
        except (KeyError, ValueError, TypeError):
            return None

    def _own_folder(self, ref: WorkerRef) -> Path | None:
        """The folder of one of our workers; None for a name that is not a folder of ours."""
        if ref.id != os.path.basename(ref.id) or ref.id in ("", ".", ".."):
            return None
        return next((root / ref.id for root in self.roots if self._ours(self._labels(root / ref.id))), None)

    def _read(self, folder: Path, name: str) -> str | None:
        try:
            return (folder / name).read_text().strip()
        except OSError:
            return None

    def _ended(self, folder: Path, rc: int) -> WorkerState:
        by_us = (folder / "terminate-requested").exists()
        if not by_us and (folder / "preempted").exists():  # kill_worker(preempt=True): the provider's word
            sig = signal_name(-rc) if rc < 0 else None
            return WorkerState(WorkerPhase.PREEMPTED, rc, f"killed by {sig}" if sig else f"exited {rc}",
                               "a preemption, simulated on the local machine", signal=sig)
        if rc >= 0:
            return WorkerState(WorkerPhase.EXITED, rc, f"exited {rc}", "stopped by the reconciler" if by_us else "")
        sig = signal_name(-rc)
        if by_us:  # the stop we asked for (SIGTERM, SIGKILL after the grace): never the job's own crash
            return WorkerState(WorkerPhase.PREEMPTED, rc, f"killed by {sig}", "stopped by the reconciler", signal=sig)
        oom = (folder / "oom").exists()
        detail = "killed by the kernel's OOM killer" if oom else f"killed by {sig}, not by the reconciler"
        return WorkerState(WorkerPhase.EXITED, rc, f"killed by {sig}", detail, signal=sig, oom=oom)

    def _state(self, folder: Path) -> WorkerState:
        code = self._read(folder, "exit_code")
        if code is not None and code.lstrip("-").isdigit():
            return replace(self._ended(folder, int(code)), ended_at=_mtime(folder / "exit_code"))
        pid = self._read(folder, "supervisor.pid")
        if pid and pid.isdigit() and alive(int(pid), self._read(folder, "supervisor.start")):
            if self._read(folder, "child.pid"):
                return WorkerState(WorkerPhase.RUNNING, None, "running")
            return WorkerState(WorkerPhase.PENDING, None, "starting")
        if pid is None and (folder / "launching").exists():
            return WorkerState(WorkerPhase.PENDING, None, "starting")
        return WorkerState(WorkerPhase.LOST, None, "supervisor gone without an exit code")

    def _start(self, folder: Path, spec: LaunchSpec) -> None:
        """Starts the supervisor with a minimal environment; the command's own environment and the
        mask of its secrets go to it on stdin, so no secret is in the supervisor's environment, argv
        or a file, and none reaches the log."""
        child_env = {**worker_base_env(os.environ), **with_deadline(spec.env, worker_deadline(spec)),
                     **spec.secret_env}
        own_env = {**worker_base_env(os.environ), "PYTHONPATH": package_root()}
        if "RECONCILER_GRACE_SECONDS" in os.environ:  # the supervisor's own setting, not the command's
            own_env["RECONCILER_GRACE_SECONDS"] = os.environ["RECONCILER_GRACE_SECONDS"]
        cwd = os.path.expanduser(spec.workdir) if spec.workdir else None
        log = os.open(folder / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "adapters.local_supervisor", str(folder), "--", *spec.command],
                cwd=cwd, env=own_env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            (folder / "exit_code").write_text("127")
            os.write(log, f"cannot start the worker: {exc}\n".encode())
            raise LaunchRefused(f"local provider {self.name!r}: cannot start the worker: {exc}") from exc
        finally:
            os.close(log)
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps({"env": child_env, "mask": output_mask(spec)}).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the supervisor died at once; it records nothing, so observe reports the worker lost

    # ---- the contract ------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> WorkerRef:
        if self.owner == ANY_OWNER:
            raise ProviderConfigError(f"local provider {self.name!r}: an adapter without an owner cannot launch")
        if spec.workdir and not os.path.isdir(os.path.expanduser(spec.workdir)):
            raise JobConfigError(f"code.path {spec.workdir} is not a folder on this machine (local provider "
                                 f"{self.name!r}); fix the job's manifest")
        folder = self.root / worker_folder_name(self.owner, spec.job, spec.run_id, spec.epoch)
        ref = WorkerRef(self.name, folder.name, spec.job, spec.run_id, spec.epoch)
        if self.root.exists() and not self.root.is_dir():  # mkdir would take the file for the folder
            raise LaunchRefused(f"local provider {self.name!r}: its workdir {self.root} is a file, not a "
                                      "directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.mkdir(mode=0o700)
        except FileExistsError:
            return ref  # already launched with these labels: adopt
        except OSError as exc:
            raise LaunchRefused(f"local provider {self.name!r}: cannot create {folder}: {exc}") from exc
        folder.chmod(0o700)
        labels = {"provider": self.name, "owner": self.owner, "job": spec.job, "run_id": spec.run_id,
                  "epoch": spec.epoch}
        (folder / "labels.json").write_text(json.dumps(labels))
        (folder / "launching").touch()
        self._start(folder, spec)
        return ref

    def observe(self) -> dict[WorkerRef, WorkerState]:
        found: dict[WorkerRef, WorkerState] = {}
        foreign = 0
        for folder in (f for root in self.roots if root.is_dir() for f in sorted(root.iterdir())):
            labels = self._labels(folder)
            if labels is None:
                continue
            if not self._ours(labels):
                foreign += labels.get("owner") != self.owner and self._live(folder)
                continue
            ref = self._ref_of(folder, labels)
            if ref is not None:
                found[ref] = self._state(folder)
        self.foreign_workers = foreign
        return found

    def _live(self, folder: Path) -> bool:
        return self._state(folder).phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING)

    def terminate(self, ref: WorkerRef) -> None:
        """SIGTERM to the worker's process group: the supervisor gives the command a grace period
        to checkpoint, then kills it. Only our own workers: another owner's folder is left alone.
        Signalled once: the daemon asks again on every tick until the worker is gone, and a second
        SIGTERM landing after the command restored its default handler (the SDK does, saved and on
        its way to exit 75) would kill it mid-exit; the supervisor's grace timer does the rest."""
        folder = self._own_folder(ref)
        if folder is None:
            return
        (folder / "terminate-requested").touch(exist_ok=True)
        if (folder / "terminate-signalled").exists():
            return
        pid = self._read(folder, "supervisor.pid")
        if pid and pid.isdigit() and alive(int(pid), self._read(folder, "supervisor.start")):
            try:
                os.killpg(int(pid), signal.SIGTERM)
                (folder / "terminate-signalled").touch()
            except ProcessLookupError:
                pass

    def kill(self, ref: WorkerRef) -> None:
        """No notice: SIGKILL to the worker command, as a machine that vanishes (a drill). The stop
        is ours (marked as terminate's is), so its end reads as stopped by the reconciler."""
        folder = self._own_folder(ref)
        if folder is None:
            return
        (folder / "terminate-requested").touch(exist_ok=True)
        self.kill_worker(ref, signal.SIGKILL)

    def kill_worker(self, ref: WorkerRef, sig: int = signal.SIGKILL, preempt: bool = False) -> bool:
        """Sends `sig` to the worker command itself, as a crash would (chaos, tests); with `preempt`,
        the worker's end is then reported as a preemption, the word a cloud provider gives."""
        folder = self._own_folder(ref)
        child = self._read(folder, "child.pid") if folder is not None else None
        if folder is None or not child or not child.isdigit():
            return False
        if preempt:
            (folder / "preempted").touch()
        try:
            os.kill(int(child), sig)
            return True
        except ProcessLookupError:
            return False

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        folder = self._own_folder(ref)
        if folder is None:
            return ""
        try:
            with open(folder / "log", errors="replace") as fh:
                return "".join(deque(fh, maxlen=tail))
        except OSError:
            return ""

    def free_slots(self) -> int | None:
        return None

    def capacity(self) -> Capacity | None:
        """This machine: CPUs, memory (MemTotal) and GPUs (`nvidia-smi -L`), asked once."""
        if self._capacity is None:
            self._capacity = Capacity(cpus=os.cpu_count() or 1, memory_gb=_meminfo_gb(), gpus=_gpu_count())
        return self._capacity
