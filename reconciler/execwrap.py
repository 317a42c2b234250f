"""`reconciler exec -- CMD ARGS...`: run a program that does not use the Python SDK as a run attempt.

The wrapper reads the same environment as `open_run` (RECONCILER_RUN_URI, RECONCILER_EPOCH, ...),
heartbeats progress.json while the child runs, forwards SIGTERM, SIGINT and SIGUSR1 to it, and
maps its exit onto the contract of DESIGN.md §3:

- child exits 0            -> done.json is created (fenced), exit 0
- a forwarded signal came  -> exit 75 (interrupted; the child had the notice to save its own state)
- the attempt was replaced -> the child is terminated, exit 75, nothing more is written
- otherwise                -> the child's exit code (128+N when it died of signal N)

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
from types import FrameType
from typing import Any

from adapters.storage import Fenced, RunFolder, StorageError

EXIT_INTERRUPTED = 75
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


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
    except ValueError as exc:
        _say(f"bad worker environment: {exc}: fix RECONCILER_EPOCH / RECONCILER_HEARTBEAT_INTERVAL")
        return 2
    try:
        folder = RunFolder(uri)
        folder.check_conditional_writes()
        if epoch is None:
            epoch = folder.bump_lease(holder=f"exec:{socket.gethostname()}:{os.getpid()}")
        folder.check_epoch(epoch)
    except Fenced as exc:
        _say(f"{exc}; not starting")
        return EXIT_INTERRUPTED
    except StorageError as exc:
        _say(str(exc))
        return 2
    return _supervise(args, folder, epoch, interval, target)


def _supervise(args: list[str], folder: RunFolder, epoch: int, interval: float, target: int | None) -> int:
    with tempfile.TemporaryDirectory(prefix="reconciler-exec-") as tmp:
        step_file = os.path.join(tmp, "step")
        child_env = dict(os.environ, RECONCILER_STEP_FILE=step_file, RECONCILER_EPOCH=str(epoch))
        try:
            child = subprocess.Popen(args, env=child_env)
        except OSError as exc:
            _say(f"cannot start {args[0]!r}: {exc}")
            return 127

        state: dict[str, Any] = {"signalled": None, "superseded": False, "tag": None, "last": 0}

        def forward(signum: int, frame: FrameType | None) -> None:
            state["signalled"] = signum
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        old = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            next_beat = 0.0
            while True:
                try:
                    child.wait(timeout=min(0.2, max(interval, 0.01)))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() >= next_beat and not state["superseded"]:
                    next_beat = time.monotonic() + interval
                    if not _beat(folder, epoch, step_file, target, state):
                        _say(f"attempt epoch {epoch} was replaced; stopping the command")
                        state["superseded"] = True
                        _stop(child)
                        break
            code = child.wait()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        if state["superseded"]:
            return EXIT_INTERRUPTED
        if not _beat(folder, epoch, step_file, target, state):
            return EXIT_INTERRUPTED
        if state["signalled"] is not None:
            return EXIT_INTERRUPTED
        if code == 0:
            step, metrics = _read_step(step_file)
            try:
                folder.mark_done(
                    epoch,
                    {"step": step if step is not None else state["last"], "metrics": metrics, "time": time.time()},
                )
            except Fenced as exc:
                _say(f"{exc}; not marking the run done")
                return EXIT_INTERRUPTED
            except StorageError as exc:
                _say(f"the command succeeded but done.json could not be written: {exc}")
                return 1
            return 0
        return 128 - code if code < 0 else code


def _beat(folder: RunFolder, epoch: int, step_file: str, target: int | None, state: dict[str, Any]) -> bool:
    """One heartbeat; False when the attempt was replaced. Storage hiccups are logged, not fatal."""
    step, metrics = _read_step(step_file)
    if step is not None:
        state["last"] = step
    record = {"epoch": epoch, "step": state["last"], "target": target, "time": time.time(), "metrics": metrics}
    try:
        state["tag"] = folder.write_progress(epoch, record, state["tag"])
    except Fenced:
        return False
    except StorageError as exc:
        _say(f"heartbeat failed (will retry): {exc}")
    return True


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
