"""Runs one local worker command and records how it ended.

Started by the local adapter in a session of its own: `python -m adapters.local_supervisor
FOLDER -- CMD...`. It writes `supervisor.pid`/`supervisor.start`, starts the command, writes
`child.pid`, and when the command ends writes `exit_code` (negative: killed by that signal).
On SIGTERM it passes the signal on and, after the grace period, kills the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from adapters.local import process_start_time

GRACE_SECONDS = float(os.environ.get("RECONCILER_GRACE_SECONDS", "30"))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    command = argv[2:] if len(argv) > 1 and argv[1] == "--" else argv[1:]
    _write(folder / "supervisor.start", process_start_time(os.getpid()) or "")
    _write(folder / "supervisor.pid", str(os.getpid()))
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"reconciler: cannot start {command[0]!r}: {exc}", flush=True)
        _write(folder / "exit_code", "127")
        return 127
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
    _write(folder / "exit_code", str(code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
