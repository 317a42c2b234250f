"""`reconciler reconcile`: ask the running daemon of a clone to tick now and say what the tick did.

The daemon listens on a Unix socket beside its lock in the clone's git folder (`.git/reconciler.sock`),
made readable and writable by its owner only, and answers only a peer of the same user (the
kernel's SO_PEERCRED): nothing reaches it from the network, no secret to set, no port to pick, and
it works without `--listen`. One request is one line, `tick`; the answer is one JSON object,
written once a tick that started after the request has finished."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import struct
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reconciler.daemon.loop import TickReport

log = logging.getLogger("reconciler")

SOCKET_NAME = "reconciler.sock"
MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes on Linux
REQUEST = b"tick\n"


class NudgeError(Exception):
    """No daemon answered; the message says why and what to do."""


def socket_path(git_dir: str | os.PathLike[str]) -> Path:
    """Where the daemon of the clone with this git folder listens. A git folder too deep for a socket
    path gets one in a folder of the user's own under the temporary directory, named by a hash of it."""
    here = Path(git_dir).resolve() / SOCKET_NAME
    if len(os.fsencode(here)) <= MAX_SOCKET_PATH:
        return here
    digest = hashlib.sha256(os.fsencode(Path(git_dir).resolve())).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"reconciler-{os.getuid()}" / f"{digest}.sock"


def told(report: TickReport | None, failure: str = "") -> dict[str, Any]:
    """What a tick did, as the daemon answers a request (plain data: it crosses the socket)."""
    if report is None:
        return {"error": failure or "the tick did not run"}
    if report.standby is not None:
        return {"standby": report.standby.describe()}
    return {"commit": report.commit, "head": report.head, "status_commit": report.status_commit,
            "actions": report.actions, "changed": report.changed, "errors": report.errors,
            "seconds": round(report.seconds, 3)}


def _check_private(folder: Path) -> None:
    """The socket's folder must be the user's own: another user's could hold a socket of theirs."""
    info = folder.stat()
    if info.st_uid != os.getuid() or (folder.name.startswith("reconciler-") and info.st_mode & 0o077):
        raise NudgeError(f"{folder} is not a folder of this user's own (owner uid {info.st_uid}, mode "
                         f"{info.st_mode & 0o777:o}); remove it")


def _same_user(conn: socket.socket) -> bool:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid == os.getuid()


class NudgeServer:
    """Accepts `tick` requests on the socket; `tick_now` (the daemon's) runs one and describes it."""

    def __init__(self, git_dir: str | os.PathLike[str], tick_now: Callable[[], dict[str, Any]]) -> None:
        self.path = socket_path(git_dir)
        self.tick_now = tick_now
        self._sock: socket.socket | None = None

    def start(self) -> Path:
        """Binds the socket. Call it holding the clone's lock: a socket file left by a daemon that
        died is then stale for sure, and replaced. Raises NudgeError where the folder is not ours."""
        self.path.parent.mkdir(mode=0o700, exist_ok=True)
        _check_private(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created owner-only: no moment when another user could connect
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(8)
        self._sock = sock
        threading.Thread(target=self._serve, args=(sock,), daemon=True, name="nudge").start()
        return self.path

    def stop(self) -> None:
        if self._sock is None:
            return
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._sock = None

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._answer, args=(conn,), daemon=True, name="nudge-request").start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5.0)
                if not _same_user(conn) or _request(conn) != REQUEST:
                    return
                conn.settimeout(None)
                log.info("reconcile requested from the command line; ticking now")
                conn.sendall(json.dumps(self.tick_now()).encode() + b"\n")
            except OSError as exc:  # the asker gave up (Ctrl-C): the tick still runs
                log.debug("reconcile request: %s", exc)


def _request(conn: socket.socket) -> bytes:
    """The request line, read until its newline (a few bytes at most)."""
    got = b""
    while not got.endswith(b"\n") and len(got) <= len(REQUEST):
        chunk = conn.recv(len(REQUEST))
        if not chunk:
            break
        got += chunk
    return got


def nudge(git_dir: str | os.PathLike[str], timeout: float) -> dict[str, Any]:
    """Asks the daemon of this clone to tick now; returns its answer once that tick has finished."""
    path = socket_path(git_dir)
    if path.parent.is_dir():
        _check_private(path.parent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    with sock:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NudgeError("no daemon is running on this repository (nothing listens on "
                             f"{path}); start one with `reconciler run`, or tick once with "
                             "`reconciler run --once`") from exc
        except PermissionError as exc:
            raise NudgeError(f"{path} belongs to another user: ask the daemon's owner") from exc
        sock.sendall(REQUEST)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError as exc:
            raise NudgeError(f"the daemon did not finish a tick within {timeout:g}s; it goes on, and "
                             "its log says what it is doing") from exc
    if not chunks:
        raise NudgeError("the daemon closed the connection without an answer (it may be stopping)")
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer
