"""`reconciler logs` through every provider that exists: local processes, a real sshd, a real Slurm,
and each hosted provider's fake server (RunPod has no log API: its log is the copy in the run
folder). A secret the worker prints is masked; --follow sees a line the worker writes after it
started following, and stops when the worker ends."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from adapters.compute import ComputeAdapter, LaunchSpec, WorkerRef
from adapters.storage import RunFolder
from reconciler.daemon.logs import LogSource, follow
from status.models import Attempt
from status.redact import Redactor
from tests.adapters.test_contract import Kit, ended, kit, wait_state  # noqa: F401 - `kit` is a fixture

CANARY = "canary-s3cr3t-4e1d9b"

# (The lines are built at run time: hosted bootstraps echo the command, which must not match.)
# Prints the secret, then a line; waits for the trigger file; prints the late line and exits.
WORKER = """
import os, sys, time
print("secret is", os.environ["PROBE_SECRET"], flush=True)
print("early" + " line", flush=True)
open(sys.argv[1] + ".started", "w").close()
deadline = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.1)
print("late" + " line", flush=True)
"""


def launch_worker(the_kit: Kit, adapter: ComputeAdapter, trigger: Path) -> tuple[LaunchSpec, WorkerRef]:
    spec = the_kit.spec(secret=CANARY)
    spec = replace(spec, command=[sys.executable, "-u", "-c", WORKER, str(trigger)])
    return spec, the_kit.launch(adapter, spec)


def source_for(adapter: ComputeAdapter, spec: LaunchSpec, ref: WorkerRef) -> LogSource:
    folder = RunFolder(spec.env["RECONCILER_RUN_URI"]) if "RECONCILER_RUN_URI" in spec.env else None
    attempt = Attempt(epoch=ref.epoch, provider=ref.provider, worker=ref.id, started=time.time())
    return LogSource(ref=ref, number=1, attempt=attempt, adapter=adapter, folder=folder,
                     redactor=Redactor({CANARY}))


def wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"the worker never started (no {path})"
        time.sleep(0.1)


def test_a_finished_workers_log_is_read_with_the_secret_masked(kit: Kit) -> None:  # noqa: F811 - the contract suite's fixture
    adapter = kit.make()
    trigger = kit.tmp / "go"
    trigger.touch()  # the worker runs straight through
    spec, ref = launch_worker(kit, adapter, trigger)
    wait_state(adapter, ref, ended, timeout=60)
    source = source_for(kit.make(), spec, ref)  # a fresh adapter, as a new `reconciler logs` process has
    text = source.read(100)
    assert "early line" in text and "late line" in text
    assert "secret is ***" in text and CANARY not in text
    assert source.read(1).strip().splitlines()[-1:] != ["early line"]  # --tail: only the end


def test_follow_prints_a_line_written_after_it_started_and_stops_when_the_worker_ends(kit: Kit) -> None:  # noqa: F811 - the contract suite's fixture
    adapter = kit.make()
    trigger = kit.tmp / "go"
    spec, ref = launch_worker(kit, adapter, trigger)
    wait_file(Path(str(trigger) + ".started"))
    source = source_for(kit.make(), spec, ref)
    printed: list[str] = []
    polls = threading.Event()

    def sleep(seconds: float) -> None:
        polls.set()  # following has read at least once before the late line exists
        time.sleep(seconds)

    thread = threading.Thread(target=follow, args=(source, 50, printed.append),
                              kwargs={"poll": 0.5, "sleep": sleep}, daemon=True)
    thread.start()
    assert polls.wait(60), "follow never polled"
    assert "late line" not in "".join(printed)
    trigger.touch()
    thread.join(120)
    assert not thread.is_alive(), f"follow did not stop after the worker ended; printed {printed}"
    out = "".join(printed)
    assert "late line" in out, out
    assert out.count("early line") <= 1, out  # a line is printed once
    assert CANARY not in out
