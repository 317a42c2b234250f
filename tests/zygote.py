"""A warm start for the processes the tests run as `python -m module`: a server that has imported the
heavy modules once, and forks a real process from itself for each run.

What it saves, per process started: the daemon's imports (`reconciler run`) about 0.5 CPU-seconds,
the other commands' about 0.24 (bench/startup.py, on an idle machine; more under the suite's load),
Lightning about 6, transformers' Trainer about 7, torch with the `torch._dynamo` an optimizer imports
about 3.5. The tests start a few hundred such processes.

A fork of the server is still a real process of its own: its own pid to signal, its own exit code,
its own children, and the standard streams the test asked for (pipes, files, /dev/null), passed to
the server over a Unix socket. `popen` answers with a `subprocess.Popen` whose child was forked there
instead of exec'd here, so `communicate`, `wait`, `poll`, `send_signal` and the pipes are Popen's
own. The child runs the module from the top, as `python -m` would, with exactly the environment,
folder and arguments given; what it does not repeat is the import. So a module may not read its
environment at import time (the forks would all see the server's): the preload lists below leave out
the modules that do (the command line's rich consoles are made at import and read NO_COLOR then), and the
server refuses to serve if a preload has started a thread, which a fork would not carry. A process
whose environment would start Python differently (another PYTHON* setting, or a folder on PYTHONPATH
the server lacks, as a test that hides a module behind a stand-in has) is started fresh instead.

Unlike the stdlib forkserver (children daemonic, one per process), a test process holds one server
per preload list, and the children may have children (DataLoader workers, a daemon's workers).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# what `python -m reconciler` imports before it reads its arguments, less the command line's own
# modules (their consoles are created at import, from the environment)
CLI_PRELOAD = ("reconciler.daemon.loop", "reconciler.daemon.service", "adapters.leader", "typer", "rich.table",
               "rich.progress")
_MESSAGE = 1 << 16


# ---- the server ---------------------------------------------------------------------------------------------
def _serve(channel: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a child per request; returns the request and its streams in the child, None at EOF."""
    lock = threading.Lock()

    def answer(message: dict[str, Any]) -> None:
        with lock:
            channel.send(json.dumps(message).encode())

    def reap(pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        answer({"exit": pid, "code": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)})

    while True:
        data, fds, _, _ = socket.recv_fds(channel, _MESSAGE, 3)
        if not data:
            return None
        with lock:  # no reaper is half-way through a send while the fork copies the process
            pid = os.fork()
            if pid == 0:
                return json.loads(data), fds
            channel.send(json.dumps({"pid": pid}).encode())
        for fd in fds:
            os.close(fd)
        threading.Thread(target=reap, args=(pid,), daemon=True).start()


def _become(request: dict[str, Any], streams: list[int]) -> None:
    """In the child: the streams, session, environment, folder and argv of `python -m module args...`."""
    import runpy
    import tempfile

    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    for fd in set(streams):
        if fd > 2:
            os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.environ.clear()
    os.environ.update(request["env"])
    # fresh stream objects (the server's could have been locked by another thread at the fork), made
    # as python makes its own
    sys.stdin, sys.stdout, sys.stderr = (_stdio(0, sys.__stdin__), _stdio(1, sys.__stdout__),
                                         _stdio(2, sys.__stderr__))
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # as `python -m` puts its folder first
    tempfile.tempdir = None  # TMPDIR is read again, from this process's environment
    sys.argv = [request["module"], *request["argv"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _stdio(fd: int, like: Any) -> io.TextIOWrapper:
    """A standard stream on `fd` as python's start-up makes one: the encoding of `like` (the server's,
    started with the same PYTHON* settings), unbuffered under PYTHONUNBUFFERED, stderr line-buffered."""
    writing = fd != 0
    unbuffered = writing and bool(os.environ.get("PYTHONUNBUFFERED"))
    raw = io.FileIO(fd, "wb" if writing else "rb", closefd=False)
    buffer: Any = raw if unbuffered else io.BufferedWriter(raw) if writing else io.BufferedReader(raw)
    return io.TextIOWrapper(buffer, encoding=like.encoding, errors=like.errors, write_through=unbuffered,
                            line_buffering=writing and (fd == 2 or raw.isatty()))


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    os.dup2(2, 1)  # what the imports print goes to stderr
    for name in sys.argv[2:]:
        __import__(name)
    if threading.active_count() > 1:
        raise SystemExit(f"zygote: a preload started a thread, which forks would not have: {sys.argv[2:]}")
    served = _serve(channel)
    if served is not None:
        channel.close()
        _become(*served)  # and the interpreter ends as after `python -m`: atexit, flushed streams


# ---- the client ---------------------------------------------------------------------------------------------
class _Ending:
    """A forked child's exit code, told by the server's reaper."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.told = threading.Event()


class Zygote:
    """One server process with `preload` imported; `fork` starts a module from it."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self._channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self._python_settings = _python_settings(env)
        self._server = subprocess.Popen([sys.executable, "-m", "tests.zygote", str(theirs.fileno()), *preload],
                                        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()
        self._lock = threading.Lock()
        self._endings: dict[int, _Ending] = {}
        self._started: list[int] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while data := self._channel.recv(_MESSAGE):
            message = json.loads(data)
            with self._changed:
                if "pid" in message:
                    self._endings[message["pid"]] = _Ending()
                    self._started.append(message["pid"])
                else:
                    ending = self._endings[message["exit"]]
                    ending.code = message["code"]
                    ending.told.set()
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def fork(self, module: str, argv: list[str], *, env: dict[str, str], cwd: str, streams: list[int],
             new_session: bool = False, timeout: float = 120) -> tuple[int, _Ending]:
        """A child running `python -m module *argv` on `streams` (stdin, stdout, stderr): its pid and ending."""
        request = {"module": module, "argv": argv, "env": env, "cwd": cwd, "new_session": new_session}
        with self._lock:
            socket.send_fds(self._channel, [json.dumps(request).encode()], streams)
            with self._changed:
                if not self._changed.wait_for(lambda: self._started or self._server.poll() is not None, timeout):
                    raise RuntimeError(f"the zygote did not start {module} in {timeout} s")
                if not self._started:
                    raise RuntimeError(f"the zygote ended (exit {self._server.poll()}) before starting {module}")
                pid = self._started.pop(0)
                return pid, self._endings[pid]

    def starts_alike(self, env: Mapping[str, str]) -> bool:
        """Whether `python` started with `env` imports as this server did, so a fork can stand in for it."""
        settings = _python_settings(env)
        path = settings.pop("PYTHONPATH", "")
        theirs = dict(self._python_settings)
        server_path = set(theirs.pop("PYTHONPATH", "").split(os.pathsep))
        return settings == theirs and set(filter(None, path.split(os.pathsep))) <= server_path

    def close(self) -> None:
        self._channel.shutdown(socket.SHUT_WR)
        self._server.wait(30)


def _python_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


class ForkedPopen(subprocess.Popen):  # type: ignore[type-arg]  # str or bytes, as Popen's text= says
    """`subprocess.Popen([sys.executable, "-m", module, ...])` whose child is forked from a zygote."""

    log: Path | None = None  # the file `start` sends the output to

    def __init__(self, args: list[str], *, server: Zygote, **kwargs: Any) -> None:
        self._server = server
        self._ending = _Ending()
        super().__init__(args, **kwargs)

    def _execute_child(self, args: list[str], executable: Any, preexec_fn: Any, close_fds: bool, pass_fds: Any,  # type: ignore[override]
                       cwd: Any, env: Any, startupinfo: Any, creationflags: int, shell: bool,
                       p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int, errread: int, errwrite: int,
                       restore_signals: bool, gid: Any, gids: Any, uid: Any, umask: int,
                       start_new_session: bool, process_group: Any) -> None:
        python, flag, module, *argv = args
        assert python == sys.executable and flag == "-m" and not (shell or preexec_fn or pass_fds), args
        assert gid is None and gids is None and uid is None and umask < 0 and process_group in (None, -1), args
        streams = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                   errwrite if errwrite != -1 else 2]
        try:
            self.pid, self._ending = self._server.fork(
                module, argv, env=dict(os.environ if env is None else env), cwd=os.fspath(cwd or os.getcwd()),
                streams=streams, new_session=start_new_session)
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:  # type: ignore[override]
        if self.returncode is None and self._ending.told.is_set():
            self.returncode = self._ending.code
        return self.returncode

    def _wait(self, timeout: float | None) -> int:  # type: ignore[override]
        if not self._ending.told.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.returncode = self._ending.code
        assert self.returncode is not None
        return self.returncode


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


def popen(args: list[str], *, preload: tuple[str, ...] = CLI_PRELOAD, **kwargs: Any) -> subprocess.Popen[Any]:
    """As `subprocess.Popen(args, **kwargs)` for `args` = [sys.executable, "-m", module, ...]: forked
    warm, or started fresh where its environment would start Python otherwise than the server."""
    server = zygote(*preload)
    env = kwargs.get("env")
    if not server.starts_alike(os.environ if env is None else env):
        return subprocess.Popen(args, **kwargs)
    return ForkedPopen(args, server=server, **kwargs)


def run(args: list[str], *, input: Any = None, capture_output: bool = False, timeout: float | None = None,
        check: bool = False, preload: tuple[str, ...] = CLI_PRELOAD, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """As `subprocess.run(args, ...)` for `args` = [sys.executable, "-m", module, ...], started by `popen`."""
    if input is not None:
        if "stdin" in kwargs:
            raise ValueError("stdin and input may not both be used")
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, preload=preload, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        code = process.poll()
    assert code is not None
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)


def start(module: str, argv: list[str], env: dict[str, str], log: Path, preload: tuple[str, ...]) -> ForkedPopen:
    """`python -m module *argv` with exactly `env`, in the worktree, stdout and stderr appended to `log`."""
    server = zygote(*preload)
    assert server.starts_alike(env), "this environment would start Python otherwise than the server"
    with open(log, "ab") as out:
        process = ForkedPopen([sys.executable, "-m", module, *argv], server=server, env=env, cwd=ROOT,
                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    process.log = log
    return process


if __name__ == "__main__":
    main()
