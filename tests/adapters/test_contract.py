"""The contract every compute adapter keeps (adapters/compute.py), run against each real backend:
local processes, a real sshd on 127.0.0.1 and a real single-node Slurm. A new adapter joins by
adding a case to `KINDS` and a branch in `kit`: how to build it (for a given owner, the state
repository's identity), and how an outsider interrupts one of its workers (a kill on the host, an
admin's scancel). Hosted providers run against their fake servers (tests/fakes/<kind>.py, which
provides `contract_kit(request, workdir) -> HostedKit`)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adapters.compute import BASE_ENV, ComputeAdapter, LaunchSpec, WorkerPhase, WorkerRef, WorkerState

PROBE = str(Path(__file__).with_name("probe.py"))
HOSTED = {kind: f"tests.fakes.{kind}" for kind in ("kaggle", "lightning", "vast", "runpod")}
KINDS = ["local", "ssh", "slurm", *HOSTED]
# Kaggle's API cannot cancel a run (a stop is a request in the run folder, tested in
# tests/adapters/test_kaggle.py), and hosted workers run on the provider's machines, in no folder of
# ours: the tests of those behaviours run over the kinds that have them (the kit checks the lists).
CANCELLING = [kind for kind in KINDS if kind != "kaggle"]
IN_OUR_FOLDERS = [kind for kind in KINDS if kind not in HOSTED]
OWNER = "repo-a"


@dataclass
class Kit:
    kind: str
    workdir: Path
    tmp: Path
    make: Callable[..., ComputeAdapter]  # make(owner=OWNER)
    interrupt: Callable[[ComputeAdapter, WorkerRef], None]
    launched: list[tuple[ComputeAdapter, WorkerRef]] = field(default_factory=list)
    counter: int = 0
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # jobs of earlier tests linger in Slurm
    prepare: Callable[[LaunchSpec], None] | None = None  # hosted: put the secrets in the provider's store
    own_env: tuple[str, ...] = ()  # variables the provider's machine or bootstrap sets, not the daemon
    cancels: bool = True  # False: the provider has no cancel (Kaggle); stops go through the run folder
    run_folder: bool = False  # True: no log API (RunPod); each probe gets a run folder for its log and exit

    def spec(self, *args: str, epoch: int = 1, **env: str) -> LaunchSpec:
        """A probe launch; `env` keys are PROBE_* settings (SLEEP, EXIT, LINES, ON_TERM, ...)."""
        self.counter += 1
        out = self.tmp / f"probe-{self.counter}.jsonl"
        plain = {"PROBE_OUT": str(out), **{f"PROBE_{k.upper()}": v for k, v in env.items() if k != "secret"}}
        plain.update({"RECONCILER_RUN_ID": "r-contract", "RECONCILER_EPOCH": str(epoch)})
        if self.run_folder:
            plain["RECONCILER_RUN_URI"] = (self.tmp / "runs" / f"job{self.counter}-{self.tag}" / "r-contract").as_uri()
        secret = {"PROBE_SECRET": env["secret"]} if "secret" in env else {}
        return LaunchSpec(
            job=f"job{self.counter}-{self.tag}",
            run_id="r-contract",
            epoch=epoch,
            command=[sys.executable, "-u", PROBE, *args],
            env=plain,
            secret_env=secret,
        )

    def launch(self, adapter: ComputeAdapter, spec: LaunchSpec) -> WorkerRef:
        if self.prepare is not None:
            self.prepare(spec)
        ref = adapter.launch(spec)
        self.launched.append((adapter, ref))
        return ref


def probe_records(spec: LaunchSpec, timeout: float = 30) -> list[dict]:
    """What the probe recorded, once it has started (one line per start)."""
    return records_at(Path(spec.env["PROBE_OUT"]), timeout)


def records_at(path: Path, timeout: float = 30) -> list[dict]:
    """The probe's records in `path` (one JSON line per start), once there is a whole line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return [json.loads(line) for line in path.read_text().splitlines()]
        time.sleep(0.1)
    raise AssertionError(f"the worker never started (no {path})")


def wait_state(
    adapter: ComputeAdapter, ref: WorkerRef, accept: Callable[[WorkerState], bool], timeout: float = 30,
    every: float = 0.2,
) -> WorkerState:
    """The worker's state once `accept` takes it, observing every `every` seconds."""
    deadline = time.monotonic() + timeout
    last: WorkerState | None = None
    while time.monotonic() < deadline:
        last = adapter.observe().get(ref)
        if last is not None and accept(last):
            return last
        time.sleep(every)
    raise AssertionError(f"{ref.id}: last state {last}")


def ended(state: WorkerState) -> bool:
    return state.phase not in (WorkerPhase.PENDING, WorkerPhase.RUNNING)


def running(state: WorkerState) -> bool:
    return state.phase is WorkerPhase.RUNNING


@pytest.fixture(params=KINDS)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    kind: str = request.param
    workdir = tmp_path / "workdir"
    probes = tmp_path / "probes"
    probes.mkdir()
    if kind == "local":
        from adapters.local import LocalAdapter
        from desired.models import LocalSettings

        def make(owner: str = OWNER) -> ComputeAdapter:
            return LocalAdapter("local", LocalSettings(workdir=str(workdir)), owner=owner)

        def interrupt(adapter: ComputeAdapter, ref: WorkerRef) -> None:
            assert isinstance(adapter, LocalAdapter) and adapter.kill_worker(ref, signal.SIGKILL)

    elif kind == "ssh":
        from adapters.ssh import SshAdapter

        sshd = request.getfixturevalue("sshd")
        settings = sshd.settings(workdir)

        def make(owner: str = OWNER) -> ComputeAdapter:
            return SshAdapter("ssh", settings, owner=owner)

        def interrupt(adapter: ComputeAdapter, ref: WorkerRef) -> None:
            """Someone on the host kills the worker process (the host is this machine)."""
            folder = workdir / "workers" / ref.id.split("/", 1)[1]
            os.kill(json.loads((folder / "child.pid").read_text())["pid"], signal.SIGKILL)

    elif kind in HOSTED:
        hosted = importlib.import_module(HOSTED[kind]).contract_kit(request, workdir)
        assert hosted.cancels == (kind in CANCELLING), f"{kind}: CANCELLING disagrees with its fake"
        the_kit = Kit(kind=kind, workdir=workdir, tmp=probes, make=hosted.make, interrupt=hosted.interrupt,
                      prepare=hosted.prepare,
                      # the bootstrap's own: the SDK's path, and the session's end (Kaggle's limit)
                      own_env=("PYTHONPATH", "RECONCILER_DEADLINE", *hosted.own_env),
                      cancels=hosted.cancels, run_folder=hosted.run_folder)
        yield the_kit
        _clean_up(the_kit)
        return
    else:
        from adapters.slurm import SlurmAdapter

        cluster = request.getfixturevalue("slurm")
        settings = cluster.settings(workdir)

        def make(owner: str = OWNER) -> ComputeAdapter:
            return SlurmAdapter("slurm", settings, owner=owner)

        def interrupt(adapter: ComputeAdapter, ref: WorkerRef) -> None:
            """An admin cancels the job behind the reconciler's back."""
            cluster.run("scancel", ref.id)

    the_kit = Kit(kind=kind, workdir=workdir, tmp=probes, make=make, interrupt=interrupt)
    yield the_kit
    _clean_up(the_kit)


def _clean_up(the_kit: Kit) -> None:
    for adapter, ref in the_kit.launched:
        try:
            adapter.terminate(ref)
        except Exception:  # noqa: BLE001 - cleanup of a test; the test itself has reported
            pass


def test_adapter_satisfies_the_protocol_and_has_its_name(kit: Kit) -> None:
    adapter = kit.make()
    assert isinstance(adapter, ComputeAdapter)
    assert adapter.name == kit.kind
    assert adapter.owner == OWNER


def test_launched_worker_is_observed_running_with_its_labels(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(sleep="60", epoch=3)
    ref = kit.launch(adapter, spec)
    assert (ref.provider, ref.job, ref.run_id, ref.epoch) == (kit.kind, spec.job, "r-contract", 3)
    probe_records(spec)
    state = wait_state(adapter, ref, running)
    assert state.exit_code is None
    assert state.provider_state


def test_worker_gets_exact_argv_env_and_secrets_and_no_file_holds_the_secret(kit: Kit) -> None:
    adapter = kit.make()
    secret = "s3cr3t-value-7f3a"
    args = ["plain", "two words", "it's", '"quoted"', "$HOME", "`id`", "a;b", "", "*"]
    spec = kit.spec(*args, plain="visible $PATH", secret=secret)
    ref = kit.launch(adapter, spec)
    wait_state(adapter, ref, ended)
    record = probe_records(spec)[0]
    assert record["argv"] == args
    assert record["env"]["PROBE_PLAIN"] == "visible $PATH"
    assert record["env"]["PROBE_SECRET"] == secret
    assert record["env"]["RECONCILER_EPOCH"] == "1"
    assert secret not in adapter.logs(ref, 1000)
    for path in kit.workdir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the secret is in {path}"


def test_a_secret_the_worker_prints_is_masked_where_its_output_is_captured(kit: Kit) -> None:
    """As-is, encoded, or split across two writes: the log the provider keeps (read directly where it
    is a file of ours) and what `logs` returns hold no form of it, whatever the reader's environment."""
    from tests.trust.test_redaction import ENCODINGS, HARD

    adapter = kit.make()
    spec = kit.spec(secret=HARD, leak="1")
    ref = kit.launch(adapter, spec)
    wait_state(adapter, ref, ended)
    shown = adapter.logs(ref, 1000)
    assert "plain *** url *** html ***\njson \"***\" basic " in shown and "split *** end\n" in shown, shown
    stored = b"".join(p.read_bytes() for p in kit.workdir.rglob("*") if p.is_file())
    for name, encode in ENCODINGS.items():
        assert encode(HARD) not in shown, f"the {name} form is in the log"
        assert encode(HARD).encode() not in stored, f"the {name} form is in a stored file"


def test_exit_codes_are_reported_as_exited(kit: Kit) -> None:
    adapter = kit.make()
    ok, bad = kit.spec(exit="0"), kit.spec(exit="3")
    ok_ref, bad_ref = kit.launch(adapter, ok), kit.launch(adapter, bad)
    for ref, code in ((ok_ref, 0), (bad_ref, 3)):
        state = wait_state(adapter, ref, ended)
        assert (state.phase, state.exit_code) == (WorkerPhase.EXITED, code)


def test_launch_twice_with_the_same_labels_starts_one_worker(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(sleep="60")
    first = kit.launch(adapter, spec)
    second = kit.launch(adapter, spec)
    third = kit.launch(kit.make(), spec)  # also from another instance, as after a daemon restart
    assert first == second == third
    probe_records(spec)
    wait_state(adapter, first, running)
    time.sleep(1)
    assert len(probe_records(spec)) == 1
    assert [r for r in adapter.observe() if r.job == spec.job] == [first]


@pytest.mark.parametrize("kit", CANCELLING, indirect=True)
def test_fresh_adapter_adopts_a_running_worker_and_can_stop_it(kit: Kit) -> None:
    old = kit.make()
    spec = kit.spec(sleep="60")
    ref = kit.launch(old, spec)
    probe_records(spec)
    wait_state(old, ref, running)
    del old  # the daemon restarts; the worker keeps running
    fresh = kit.make()
    assert running(fresh.observe()[ref])
    fresh.terminate(ref)
    state = wait_state(fresh, ref, ended)
    assert state.phase is WorkerPhase.PREEMPTED and "by the reconciler" in state.detail, state  # not a crash


@pytest.mark.parametrize("kit", CANCELLING, indirect=True)
def test_terminate_stops_the_worker_and_a_second_terminate_is_quiet(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(sleep="60")
    ref = kit.launch(adapter, spec)
    pid = probe_records(spec)[0]["pid"]
    wait_state(adapter, ref, running)
    adapter.terminate(ref)
    wait_state(adapter, ref, ended)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    assert not pid_alive(pid)
    adapter.terminate(ref)  # already gone: not an error


@pytest.mark.parametrize("kit", CANCELLING, indirect=True)
def test_terminate_lets_the_worker_checkpoint_and_exit_75(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(sleep="60", on_term="75")
    ref = kit.launch(adapter, spec)
    probe_records(spec)
    wait_state(adapter, ref, running)
    adapter.terminate(ref)
    wait_state(adapter, ref, ended)
    assert Path(spec.env["PROBE_OUT"] + ".term").exists(), "the worker never saw SIGTERM"


def test_logs_return_the_last_lines(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(lines="200")
    ref = kit.launch(adapter, spec)
    wait_state(adapter, ref, ended)
    tail = [line for line in adapter.logs(ref, 5).splitlines() if line.startswith("line ")]
    assert tail[-3:] == ["line 197", "line 198", "line 199"]
    assert "line 100" not in adapter.logs(ref, 5)


def test_worker_killed_from_outside_is_reported_as_a_signal_death_not_a_preemption(kit: Kit) -> None:
    """Evidence, not a verdict: the provider did not say "preempted", so the worker exited by a signal
    (which one, and that the reconciler did not ask for it); the planner decides what it means."""
    adapter = kit.make()
    spec = kit.spec(sleep="60")
    ref = kit.launch(adapter, spec)
    probe_records(spec)
    wait_state(adapter, ref, running)
    kit.interrupt(adapter, ref)
    state = wait_state(adapter, ref, ended)
    assert state.phase is WorkerPhase.EXITED, state
    assert state.signal in ("SIGKILL", "SIGTERM") and not state.oom, state
    assert state.provider_state and "reconciler" in state.detail, state
    assert kit.make().observe()[ref] == state  # a restarted daemon agrees


def test_a_crash_is_reported_with_its_signal(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(crash=str(int(signal.SIGSEGV)))
    ref = kit.launch(adapter, spec)
    state = wait_state(adapter, ref, ended)
    assert (state.phase, state.signal, state.oom) == (WorkerPhase.EXITED, "SIGSEGV", False), state
    assert state.exit_code in (-11, 128 + 11)  # Slurm reports what a shell would say


def test_worker_gets_only_the_minimal_environment(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the daemon's environment beyond PATH, HOME, USER/LOGNAME, LANG/LC_*, TZ, TMPDIR
    reaches the command: a job without secrets does not receive the daemon's credentials."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "daemon-only-credential")
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", "") or "/nowhere")
    adapter = kit.make()
    spec = kit.spec(secret="the-job-s-own-secret")
    ref = kit.launch(adapter, spec)
    wait_state(adapter, ref, ended)
    keys = set(probe_records(spec)[0]["env_keys"])
    allowed = set(BASE_ENV) | set(spec.env) | set(spec.secret_env) | set(kit.own_env)
    slurm_own = ("SLURM_",) if kit.kind == "slurm" else ()  # set by Slurm for the job, not by the daemon
    extra = {k for k in keys - allowed if not k.startswith(("LC_", *slurm_own))}
    assert extra == set(), f"the worker got {sorted(extra)} from outside its spec"
    assert "PROBE_SECRET" in keys and "PATH" in keys


def test_worker_gets_the_job_s_deadline(kit: Kit) -> None:
    """RECONCILER_DEADLINE = the job's deadline when the provider has no earlier session end."""
    adapter = kit.make()
    deadline = time.time() + 3600
    spec = kit.spec()
    spec = LaunchSpec(**{**spec.__dict__, "deadline": deadline})
    ref = kit.launch(adapter, spec)
    wait_state(adapter, ref, ended)
    assert probe_records(spec)[0]["env"]["RECONCILER_DEADLINE"] == str(int(deadline))


@pytest.mark.parametrize("kit", IN_OUR_FOLDERS, indirect=True)
def test_worker_folder_is_private_and_its_log_too(kit: Kit) -> None:
    adapter = kit.make()
    spec = kit.spec(lines="3", secret="x")
    ref = kit.launch(adapter, spec)
    wait_state(adapter, ref, ended)
    folders = [p for p in kit.workdir.rglob(f"*.{spec.job}.r-contract.e1") if p.is_dir()]  # local: in workdir
    assert len(folders) == 1 and folders[0].name.startswith(f"{OWNER}.")
    assert folders[0].stat().st_mode & 0o777 == 0o700
    assert (folders[0] / "log").stat().st_mode & 0o777 == 0o600


def test_another_owner_s_worker_with_the_same_labels_is_neither_adopted_seen_stopped_nor_read(kit: Kit) -> None:
    """Two state repositories sharing one provider, both with the same job, run and epoch."""
    ours, theirs = kit.make(), kit.make(owner="repo-b")
    spec = kit.spec(sleep="60", lines="1")
    their_ref = kit.launch(theirs, spec)
    probe_records(spec)
    wait_state(theirs, their_ref, running)
    our_ref = kit.launch(ours, spec)  # same labels, another owner: a worker of its own, not an adoption
    assert our_ref != their_ref
    wait_state(ours, our_ref, running)
    deadline = time.monotonic() + 30
    while len(probe_records(spec)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(probe_records(spec)) == 2
    seen = ours.observe()
    assert their_ref not in seen and our_ref in seen
    assert ours.foreign_workers >= 1
    ours.terminate(their_ref)
    assert ours.logs(their_ref, 10) == ""
    time.sleep(1)
    assert running(theirs.observe()[their_ref]), "another owner's worker was stopped"
    assert their_ref not in kit.make().observe()

def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_probe_runs_standalone(tmp_path: Path) -> None:
    """The probe itself behaves, so contract failures point at adapters, not at the probe."""
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PROBE_OUT": str(out), "PROBE_EXIT": "4", "PROBE_LINES": "2"}
    proc = subprocess.run([sys.executable, PROBE, "a b"], env=env, capture_output=True, text=True)
    assert proc.returncode == 4 and proc.stdout == "line 0\nline 1\n"
    assert json.loads(out.read_text())["argv"] == ["a b"]
