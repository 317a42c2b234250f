"""A fake provider's "machine": runs one launched worker as a real local process.

The process starts in a private folder of its own with a clean environment (what a fresh hosted
machine has: PATH, HOME, LANG, plus the provider's own variables), never the test's environment,
so a credential of the daemon cannot reach a worker through the fake.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

MACHINE_ENV = ("PATH", "LANG", "TZ")
SIGKILL = signal.SIGKILL  # a default below: inside the class, `signal` names the method


class Machine:
    """One worker process: `start()`, `alive`, `exit_code`, `log_text()`, `signal()`, `kill_command()`."""

    def __init__(self, folder: Path, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.folder = folder
        self.argv = list(argv)
        self.env = {k: os.environ[k] for k in MACHINE_ENV if k in os.environ}
        self.env.update({"HOME": str(folder), "TMPDIR": str(folder / "tmp")})
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._lock = threading.Lock()

    @property
    def log_path(self) -> Path:
        return self.folder / "log"

    def start(self) -> None:
        self.folder.mkdir(parents=True, mode=0o700, exist_ok=True)
        (self.folder / "tmp").mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(self.argv, cwd=self.folder, env=self.env, stdout=fd, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(fd)
        self.started_at = time.time()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def exit_code(self) -> int | None:
        if self.proc is None:
            return None
        with self._lock:
            code = self.proc.poll()
            if code is not None and self.ended_at is None:
                self.ended_at = time.time()
            return code

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Signal the bootstrap (the machine's main process), as a provider's stop does."""
        if self.alive and self.proc is not None:
            try:
                os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def kill_all(self) -> None:
        """The machine goes away: every process of the worker dies at once."""
        if self.proc is not None:
            self.kill_command(signal.SIGKILL)  # the command runs in a session of its own
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            self.exit_code  # noqa: B018 - records ended_at

    def kill_command(self, signum: int = SIGKILL) -> bool:
        """Someone on the machine kills the job's command (the bootstrap's child), not the bootstrap."""
        if self.proc is None:
            return False
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            pids = [int(p) for p in children.read_text().split()]
        except OSError:
            return False
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return bool(pids)
