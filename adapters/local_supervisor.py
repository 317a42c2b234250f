"""Runs one local worker command and records how it ended.

Started by the local adapter in a session of its own: `python -m adapters.local_supervisor
FOLDER -- CMD...`, with a JSON object on stdin: the command's whole environment (`env`) and the
mask of its secrets (`mask`, from status.redact.Redactor), so secrets are in neither the
supervisor's environment, its argv nor a file. It writes `supervisor.pid`/`supervisor.start`,
starts the command with exactly that environment, its output masked on the way to the log (the
supervisor's stdout; see adapters.bootstrap.OutputMasker), writes `child.pid`, and when the command
ends writes `exit_code` (negative: killed by that signal) and, for a SIGKILL death while the
`oom_kill` counter of its cgroup rose, an `oom` marker. On SIGTERM it passes the signal on and,
after the grace period, kills the command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from adapters.bootstrap import finish_masked, oom_kills, process_start_time, start_masked

GRACE_SECONDS = float(os.environ.get("RECONCILER_GRACE_SECONDS", "30"))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _orders() -> tuple[dict[str, str], dict[str, Any] | None]:
    """The command's environment and the mask of its secrets, from stdin."""
    try:
        given = json.loads(sys.stdin.read() or "{}")
    except ValueError:
        given = {}
    env = given.get("env") if isinstance(given, dict) else None
    mask = given.get("mask") if isinstance(given, dict) else None
    return ({str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            mask if isinstance(mask, dict) else None)


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    command = argv[2:] if len(argv) > 1 and argv[1] == "--" else argv[1:]
    env, mask = _orders()
    _write(folder / "supervisor.start", process_start_time(os.getpid()) or "")
    _write(folder / "supervisor.pid", str(os.getpid()))
    ooms_before = oom_kills()
    try:
        child, pump = start_masked(
            lambda out, err: subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err),
            mask, sys.stdout.fileno())
    except OSError as exc:
        print(f"reconciler: cannot start {command[0]!r}: {exc}", flush=True)
        _write(folder / "exit_code", "127")
        return 127
    env.clear()
    mask = None
    _write(folder / "child.pid", str(child.pid))

    def on_term(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            return
        def kill_if_running() -> None:
            if child.poll() is None:
                child.kill()

        timer = threading.Timer(GRACE_SECONDS, kill_if_running)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = child.wait()
    finish_masked(pump)
    if code == -signal.SIGKILL and ooms_before is not None and (oom_kills() or 0) > ooms_before:
        _write(folder / "oom", "the oom_kill counter of this worker's cgroup rose while it ran")
    _write(folder / "exit_code", str(code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
