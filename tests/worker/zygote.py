"""A warm start for workload processes: a server that has imported heavy modules once (torch,
Lightning, transformers), and forks a real process for each workload run as ``python -m``.

Importing Lightning costs about 6 CPU-seconds here, transformers' Trainer about 7, and torch with
the `torch._dynamo` an optimizer imports about 3.5; the trainer and data-position tests start a
couple of dozen such processes between them. A fork of this server is still a real
process of its own (a pid to SIGKILL or SIGTERM, its own exit code, DataLoader workers of its
own), and it runs the workload module from the top as `python -m` would. What it does not repeat
is the import. Unlike the stdlib forkserver (one per process, children daemonic), a test process
may hold one server per preload list, and the children may have children.

The server reads JSON requests on stdin and answers on stdout: ``{"pid": N}`` for each start, and
``{"exit": N, "code": C}`` when that child ends (C negative for a signal, as subprocess says).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


# ---- the server ---------------------------------------------------------------------------------------------
def _serve(requests: Any, answer: Any) -> dict[str, Any] | None:
    """Fork a child per request; returns the request in the child, None in the server at EOF."""
    lock = threading.Lock()

    def reap(pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        with lock:
            answer.write(json.dumps({"exit": pid, "code": code}) + "\n")
            answer.flush()

    for line in requests:
        request = json.loads(line)
        with lock:  # no reaper is half-way through a write while the fork copies the process
            pid = os.fork()
            if pid == 0:
                return dict(request)
            answer.write(json.dumps({"pid": pid}) + "\n")
            answer.flush()
        threading.Thread(target=reap, args=(pid,), daemon=True).start()
    return None


def _become(request: dict[str, Any]) -> None:
    """In the child: the environment, folder, output and argv of `python -m module args...`."""
    import runpy
    import tempfile

    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    # fresh stream objects: the server's could have been locked by another thread at the fork
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    tempfile.tempdir = None  # TMPDIR is read again, from this attempt's environment
    sys.argv = [request["module"], *request["argv"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main() -> None:
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the imports print goes to stderr, never into the answers
    for name in sys.argv[1:]:
        __import__(name)
    request = _serve(sys.stdin, answer)
    if request is not None:
        answer.close()
        _become(request)  # and the interpreter ends as after `python -m`: atexit, flushed streams


# ---- the client ---------------------------------------------------------------------------------------------
class Child:
    """A process forked by the server: enough of subprocess.Popen for the tests."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.log: Path | None = None  # where its stdout and stderr go
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """One server process with `preload` imported; `start` forks a workload from it."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self._server = subprocess.Popen([sys.executable, "-m", "tests.worker.zygote", *preload], cwd=ROOT, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._lock = threading.Lock()
        self._children: dict[int, Child] = {}
        self._started: list[int] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._server.stdout is not None
        for line in self._server.stdout:
            message = json.loads(line)
            with self._changed:
                if "pid" in message:
                    self._children[message["pid"]] = Child(message["pid"])
                    self._started.append(message["pid"])
                else:
                    self._children[message["exit"]]._end(message["code"])
                self._changed.notify_all()

    def start(self, module: str, argv: list[str], env: dict[str, str], log: Path, timeout: float = 120) -> Child:
        """`python -m module *argv` with exactly `env`, in the worktree, output appended to `log`."""
        request = {"module": module, "argv": argv, "env": env, "cwd": str(ROOT), "log": str(log)}
        with self._lock:
            assert self._server.stdin is not None
            self._server.stdin.write(json.dumps(request) + "\n")
            deadline = time.monotonic() + timeout
            with self._changed:
                while not self._started:
                    if self._server.poll() is not None or not self._changed.wait(deadline - time.monotonic()):
                        raise RuntimeError(f"the zygote did not start {module} (server exit {self._server.poll()})")
                child = self._children[self._started.pop(0)]
        child.log = log
        return child

    def close(self) -> None:
        if self._server.stdin is not None:
            self._server.stdin.close()
        self._server.wait(30)


_zygotes: dict[tuple[str, ...], Zygote] = {}
_zygotes_lock = threading.Lock()


def zygote(*preload: str) -> Zygote:
    """This test process's server for `preload`, started on first use, ended when this process is."""
    with _zygotes_lock:
        if preload not in _zygotes:
            if not _zygotes:
                atexit.register(_close_all)
            _zygotes[preload] = Zygote(preload)
        return _zygotes[preload]


def _close_all() -> None:
    for server in _zygotes.values():
        server.close()


if __name__ == "__main__":
    main()
