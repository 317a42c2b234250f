"""The warm fork server the tests start commands from (tests/zygote.py) stands in for a fresh process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote

HELP = [sys.executable, "-m", "reconciler", "--help"]


def test_a_forked_command_prints_what_a_fresh_one_prints_at_the_width_its_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server was started 100 columns wide; each fork takes the width its own environment says."""
    monkeypatch.setenv("COLUMNS", "100")
    server = zygote.Zygote(zygote.CLI_PRELOAD)
    try:
        for columns in ("60", "200"):
            env = {**os.environ, "COLUMNS": columns}
            forked = zygote.ForkedPopen(HELP, server=server, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env)
            stdout, stderr = forked.communicate(timeout=60)
            fresh = subprocess.run(HELP, capture_output=True, text=True, env=env, timeout=60)
            assert (forked.returncode, stdout, stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
            assert max(len(line) for line in stdout.splitlines()) == int(columns)
    finally:
        server.close()


def test_a_forked_process_has_its_own_pid_exit_code_stdin_and_signals(tmp_path: Path) -> None:
    script = tmp_path / "echo_exit.py"
    script.write_text("import os, sys\nprint(os.getpid(), sys.stdin.read().strip())\nsys.exit(7)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(zygote.ROOT), str(tmp_path)))}
    done = zygote.run([sys.executable, "-m", "echo_exit"], input="hello", capture_output=True, text=True,
                      env=env, timeout=60, preload=())
    pid, word = done.stdout.split()
    assert done.returncode == 7 and word == "hello" and int(pid) not in (os.getpid(), os.getppid())

    (tmp_path / "sleeper.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    sleeper = zygote.popen([sys.executable, "-m", "sleeper"], stdout=subprocess.PIPE, text=True, env=env, preload=())
    assert sleeper.stdout is not None and sleeper.stdout.readline() == "up\n"
    sleeper.send_signal(signal.SIGTERM)
    assert sleeper.wait(30) == -signal.SIGTERM


def test_an_environment_that_hides_a_module_gets_a_fresh_python(tmp_path: Path) -> None:
    """A fork cannot unimport what the server has imported, so this one must start fresh."""
    (tmp_path / "typer").mkdir()
    (tmp_path / "typer" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    process = zygote.popen(HELP, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = process.communicate(timeout=60)
    assert not isinstance(process, zygote.ForkedPopen)
    assert process.returncode == 1 and "hidden by the test" in stderr
