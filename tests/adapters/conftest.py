"""Real services for the compute adapter tests: an OpenSSH server and a single-node Slurm on 127.0.0.1.

Both are started from scratch in temp dirs with generated keys and configs, on free ports, and
stopped at the end of the session. Needs (Debian): openssh-server, openssh-client, slurm-wlm, munge,
and root for Slurm (munged runs as the munge user; slurmctld/slurmd with SlurmUser=root).
With CI=true a service that cannot start fails the test; otherwise the test is skipped with the reason.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from filelock import FileLock

from desired.models import SlurmSettings, SshHost, SshSettings

IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """A missing service is a failure in CI and a skip (with the reason) on a developer's machine."""
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Ports the kernel handed out and nobody held a moment ago, all different: the sockets stay
    bound until every port is chosen, so two calls in a row cannot return the same one."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_process(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# ---- sshd -------------------------------------------------------------------------------------------


@dataclass
class Sshd:
    root: Path
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    config: Path
    log: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        Path("/run/sshd").mkdir(exist_ok=True)  # the privilege separation folder Debian's sshd wants
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        if not wait_for(lambda: port_open(self.port), 10):
            stop_process(self.proc)
            raise RuntimeError(f"sshd did not listen on port {self.port}: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Stops the listener only; sessions and the workers they started keep running, as on a real host."""
        stop_process(self.proc)
        wait_for(lambda: not port_open(self.port), 5)

    def host(self, name: str = "box", max_workers: int = 4) -> SshHost:
        return SshHost(
            name=name,
            address="127.0.0.1",
            port=self.port,
            user=self.user,
            key_file=str(self.key_file),
            max_workers=max_workers,
            python=sys.executable,
        )

    def settings(self, workdir: Path, **extra: object) -> SshSettings:
        values: dict[str, object] = {
            "hosts": [self.host()],
            "known_hosts": str(self.known_hosts),
            "workdir": str(workdir),
            "connect_timeout_seconds": 3,
            "terminate_grace_seconds": 3,
        }
        values.update(extra)
        return SshSettings.model_validate(values)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    for program in ("sshd", "ssh", "ssh-keygen"):
        if not (shutil.which(program) or Path(f"/usr/sbin/{program}").exists()):
            unavailable(f"{program} is not installed (apt-get install openssh-server openssh-client)")
    root = tmp_path_factory.mktemp("sshd")
    root.chmod(0o700)
    port = free_port()
    for kind in ("host", "user"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / f"{kind}_key")],
            check=True,
            capture_output=True,
        )
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    (root / "authorized_keys").chmod(0o600)
    host_pub = (root / "host_key.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {root / 'host_key'}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PrintMotd no",
                "LogLevel ERROR",
                "MaxStartups 100",
                "MaxSessions 100",
                # bash sources ~/.bashrc for a command sshd starts unless it is a nested shell
                # (SHLVL >= 2 once bash has counted itself: bash's shell.c, run_startup_files).
                # This machine's root .bashrc runs `pyenv init` (about 30 processes, 0.9 s), which
                # would be paid by every session of every SSH and git-over-SSH test; the adapter
                # names the worker's python by path and needs nothing from it.
                "SetEnv SHLVL=1",
                "",
            ]
        )
    )
    server = Sshd(
        root=root,
        port=port,
        user=getpass.getuser(),
        key_file=root / "user_key",
        known_hosts=root / "known_hosts",
        config=config,
        log=root / "sshd.log",
    )
    try:
        server.start()
    except (RuntimeError, OSError) as exc:
        unavailable(f"sshd could not start: {exc}")
    yield server
    server.stop()


# ---- slurm ------------------------------------------------------------------------------------------


@dataclass
class Slurm:
    root: Path
    conf: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True, check=check)

    def settings(self, workdir: Path, **extra: object) -> SlurmSettings:
        values: dict[str, object] = {
            "partition": "debug",
            "workdir": str(workdir),
            "python": sys.executable,
        }
        values.update(extra)
        return SlurmSettings.model_validate(values)


def munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if cred.returncode != 0:
            return False
        return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_munge() -> None:
    """munged refuses to run as root and wants /run/munge owned by its user. One munged serves the
    machine: a lock keeps pytest-xdist's workers (and a second test run) from starting two, the
    second of which would fail on the first's socket."""
    if munge_works():
        return
    with FileLock(Path(tempfile.gettempdir()) / "reconciler-tests-munge.lock"):
        if not munge_works():
            _start_munged()


def _start_munged() -> None:
    """Creates munge's folders (and key, where none exists) and starts munged as its user."""
    run_dir = Path("/run/munge")
    run_dir.mkdir(exist_ok=True)
    for folder in (run_dir, Path("/var/log/munge"), Path("/var/lib/munge")):
        folder.mkdir(exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown(key, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, capture_output=True)
    if not wait_for(munge_works, 10):
        raise RuntimeError("munged started but credentials do not verify")


SLURM_CONF = """\
ClusterName=rctest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
SlurmdParameters=config_overrides
MinJobAge=60
KillWait=5
OverTimeLimit=0
InactiveLimit=0
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
NodeName={host} NodeAddr=127.0.0.1 CPUs=16 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    for program in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "munged"):
        if not (shutil.which(program) or Path(f"/usr/sbin/{program}").exists()):
            unavailable(f"{program} is not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        unavailable("the single-node Slurm of the tests needs root (SlurmUser=root)")
    try:
        start_munge()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        unavailable(f"munge could not start: {exc}")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    ctld_port, slurmd_port = free_ports(2)
    conf.write_text(SLURM_CONF.format(host=host, root=root, ctld_port=ctld_port, slurmd_port=slurmd_port))
    cluster = Slurm(root=root, conf=conf, env={"SLURM_CONF": str(conf)})
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)  # adapters and the reconciler's subprocesses find our cluster
    sbin = Path("/usr/sbin")
    try:
        for daemon in ("slurmctld", "slurmd"):
            program = shutil.which(daemon) or str(sbin / daemon)
            # -N: the node is named in slurm.conf after the short hostname, whatever slurmd would guess
            argv = [program, "-D", "-f", str(conf)] + (["-i"] if daemon == "slurmctld" else ["-N", host])
            log = open(root / f"{daemon}.out", "ab")
            cluster.procs.append(
                subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ}, start_new_session=True)
            )
            if daemon == "slurmctld":
                wait_for(lambda: cluster.run("scontrol", "ping", check=False).returncode == 0, 20)
        idle = wait_for(
            lambda: cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip() in ("idle", "mixed"),
            30,
        )
        if not idle:
            state = cluster.run("sinfo", "-h", "-o", "%T %E", check=False).stdout
            logs = "".join(
                (root / f).read_text()[-1500:] for f in ("slurmctld.log", "slurmd.log") if (root / f).exists()
            )
            raise RuntimeError(f"the node did not become idle (state {state.strip()!r}): {logs}")
    except (OSError, RuntimeError) as exc:
        for proc in reversed(cluster.procs):
            stop_process(proc)
        unavailable(f"slurm could not start: {exc}")
    yield cluster
    cluster.run("scancel", "--user", getpass.getuser(), check=False)
    for proc in reversed(cluster.procs):
        stop_process(proc)
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
