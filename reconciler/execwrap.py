"""`reconciler exec -- CMD ARGS...`: run a program that does not use the Python SDK as a run attempt.

The wrapper reads the same environment as `open_run` (RECONCILER_RUN_URI, RECONCILER_EPOCH, ...),
heartbeats progress.json while the child runs, forwards SIGTERM, SIGINT and SIGUSR1 to it, and
maps its exit onto the contract of DESIGN.md §3:

- child exits 0            -> the files in RECONCILER_OUTPUT_DIR are uploaded, then done.json is
                              created (fenced) listing them, exit 0
- a forwarded signal came  -> exit 75 (interrupted; the child had the notice to save its own state)
- RECONCILER_DEADLINE near -> the child gets SIGTERM RECONCILER_GRACE seconds (default 30) before
                              it, exit 75, as for a forwarded SIGTERM; the command is not started
                              at all when the deadline is already that close
- a stop request (stop.json
  in the run folder, read
  at each heartbeat)       -> the child gets SIGTERM, exit 75, as for a forwarded SIGTERM
- the attempt was replaced -> the child is terminated, exit 75, nothing more is written
- otherwise                -> the child's exit code (128+N when it died of signal N)

Before the child starts, the outputs of the jobs this one runs after are downloaded and verified
under RECONCILER_INPUT_DIR (adapters/artifacts.py); a missing one fails the attempt, exit 1.

The child may report progress by writing its step, optionally followed by a JSON object of
metrics (``1200 {"loss": 0.5}``), to the file named by RECONCILER_STEP_FILE in its environment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from adapters import artifacts
from adapters.storage import Fenced, RunFolder, StorageError

EXIT_INTERRUPTED = 75
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
DEFAULT_GRACE = 30.0


def _say(message: str) -> None:
    print(f"reconciler exec: {message}", file=sys.stderr, flush=True)


def _read_step(path: str) -> tuple[int | None, dict[str, float]]:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None, {}
    if not text:
        return None, {}
    head, _, rest = text.partition(" ")
    try:
        step = int(head)
    except ValueError:
        return None, {}
    metrics: dict[str, float] = {}
    if rest.strip():
        try:
            metrics = {k: float(v) for k, v in json.loads(rest).items()}
        except (ValueError, TypeError, AttributeError):
            metrics = {}
    return step, metrics


def main(argv: list[str]) -> int:
    """Run `argv` (after an optional leading "--") as this run's attempt; returns the exit code."""
    args = argv[1:] if argv and argv[0] == "--" else list(argv)
    if not args:
        _say("nothing to run: use `reconciler exec -- CMD ARGS...`")
        return 2
    env = os.environ
    uri = env.get("RECONCILER_RUN_URI")
    if not uri:
        _say("RECONCILER_RUN_URI is not set: start this through the reconciler, or set it to the run's folder")
        return 2
    try:
        epoch_text = env.get("RECONCILER_EPOCH")
        interval = float(env.get("RECONCILER_HEARTBEAT_INTERVAL") or 10.0)
        target = int(env["RECONCILER_TARGET_STEPS"]) if env.get("RECONCILER_TARGET_STEPS") else None
        epoch = int(epoch_text) if epoch_text else None
        deadline = float(env["RECONCILER_DEADLINE"]) if env.get("RECONCILER_DEADLINE") else None
        grace = float(env.get("RECONCILER_GRACE") or DEFAULT_GRACE)
    except ValueError as exc:
        _say(
            f"bad worker environment: {exc}: fix RECONCILER_EPOCH / RECONCILER_HEARTBEAT_INTERVAL / "
            "RECONCILER_DEADLINE / RECONCILER_GRACE"
        )
        return 2
    try:
        folder = RunFolder(uri)
        folder.store.check_conditional_writes()
        if epoch is None:
            epoch = folder.bump_lease(holder=f"exec:{socket.gethostname()}:{os.getpid()}")
        folder.check_epoch(epoch)
    except Fenced as exc:
        _say(f"{exc}; not starting")
        return EXIT_INTERRUPTED
    except StorageError as exc:
        _say(str(exc))
        return 2
    try:
        output_dir, input_dir = artifacts.attempt_dirs(env)
        artifacts.fetch_inputs(folder, env, input_dir)
    except (StorageError, OSError) as exc:
        _say(f"the inputs could not be fetched: {exc}")
        return 1
    stop_at = None if deadline is None else deadline - grace
    return _supervise(args, _Attempt(folder, epoch, interval, target, stop_at, output_dir))


@dataclass
class _Attempt:
    folder: RunFolder
    epoch: int
    interval: float
    target: int | None
    stop_at: float | None  # unix time at which the child gets SIGTERM (deadline minus grace)
    output_dir: Path  # RECONCILER_OUTPUT_DIR: uploaded when the command succeeds
    step_file: str = ""
    tag: str | None = None
    last: int = 0  # the child's last reported step


class _Notice:
    """Forwards stop signals to the child. Installed before the child starts, so a notice that
    lands while it starts is held and sent once it exists, instead of killing the wrapper (the
    default action) and leaving the child running unwatched.
    """

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None
        self._forwarded = False

    def __call__(self, signum: int, frame: FrameType | None = None) -> None:
        self.signalled = signum
        self._send(signum)

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        if self.signalled is not None and not self._forwarded:
            self._send(self.signalled)

    def _send(self, signum: int) -> None:
        if self.child is None:
            return
        self._forwarded = True
        try:
            self.child.send_signal(signum)
        except ProcessLookupError:
            pass


def _supervise(args: list[str], att: _Attempt) -> int:
    notice = _Notice()
    old = {sig: signal.signal(sig, notice) for sig in FORWARDED}
    try:
        with tempfile.TemporaryDirectory(prefix="reconciler-exec-") as tmp:
            att.step_file = os.path.join(tmp, "step")
            return _run_child(args, att, notice)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _run_child(args: list[str], att: _Attempt, notice: _Notice) -> int:
    if att.stop_at is not None and time.time() >= att.stop_at:
        _say("the deadline (RECONCILER_DEADLINE) is closer than RECONCILER_GRACE: not starting the command")
        return EXIT_INTERRUPTED
    if notice.signalled is not None:
        return EXIT_INTERRUPTED
    child_env = dict(os.environ, RECONCILER_STEP_FILE=att.step_file, RECONCILER_EPOCH=str(att.epoch))
    try:
        child = subprocess.Popen(args, env=child_env)
    except OSError as exc:
        _say(f"cannot start {args[0]!r}: {exc}")
        return 127
    notice.attach(child)
    code = _watch(child, att, notice)
    if code is None or not _beat(att) or notice.signalled is not None:
        return EXIT_INTERRUPTED
    return _finish(code, att)


def _watch(child: subprocess.Popen[bytes], att: _Attempt, notice: _Notice) -> int | None:
    """Heartbeat until the child exits (its code); SIGTERM it near the deadline or on a stop
    request. None: replaced."""
    next_beat = 0.0
    while True:
        try:
            return child.wait(timeout=min(0.2, max(att.interval, 0.01)))
        except subprocess.TimeoutExpired:
            pass
        if att.stop_at is not None and notice.signalled is None and time.time() >= att.stop_at:
            _say("the deadline (RECONCILER_DEADLINE) is near: asking the command to stop (SIGTERM)")
            notice(signal.SIGTERM)
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + att.interval
            if not _beat(att):
                _say(f"attempt epoch {att.epoch} was replaced; stopping the command")
                _stop(child)
                return None
            if notice.signalled is None and (reason := _stop_request(att)) is not None:
                _say(f"stop requested by the reconciler: {reason}; asking the command to stop (SIGTERM)")
                notice(signal.SIGTERM)


def _finish(code: int, att: _Attempt) -> int:
    """Map the child's exit onto the contract: done.json after 0, else its code (128+N for signal N)."""
    if code != 0:
        return 128 - code if code < 0 else code
    step, metrics = _read_step(att.step_file)
    record = {"step": step if step is not None else att.last, "metrics": metrics, "time": time.time()}
    try:
        att.folder.check_epoch(att.epoch)  # a replaced attempt uploads nothing
        found = artifacts.upload_outputs(att.folder, att.epoch, att.output_dir)
        if found is not None:
            record["outputs"] = found
        att.folder.mark_done(att.epoch, record)
    except Fenced as exc:
        _say(f"{exc}; not marking the run done")
        return EXIT_INTERRUPTED
    except StorageError as exc:
        _say(f"the command succeeded but its outputs or done.json could not be written: {exc}")
        return 1
    return 0


def _beat(att: _Attempt) -> bool:
    """One heartbeat; False when the attempt was replaced. Storage hiccups are logged, not fatal."""
    step, metrics = _read_step(att.step_file)
    if step is not None:
        att.last = step
    record = {"epoch": att.epoch, "step": att.last, "target": att.target, "time": time.time(), "metrics": metrics}
    try:
        att.tag = att.folder.write_progress(att.epoch, record, att.tag)
    except Fenced:
        return False
    except StorageError as exc:
        _say(f"heartbeat failed (will retry): {exc}")
    return True


def _stop_request(att: _Attempt) -> str | None:
    """The reconciler's stop request for this attempt, if any. Unreadable storage is no request:
    the command keeps running and the next heartbeat looks again."""
    try:
        return att.folder.stop_request(att.epoch)
    except StorageError:
        return None


def _stop(child: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    try:
        child.terminate()
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        child.kill()
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
