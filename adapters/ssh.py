"""The `ssh` compute adapter: workers on machines we can log in to (rented GPUs, lab boxes).

Everything goes through the system `ssh` binary (BatchMode, ConnectTimeout, strict host keys by
default). The first call to a host that lacks the agent (`adapters/bootstrap.py`) uploads it to
`<workdir>/bin/agent-<digest>.py`; launch then sends the worker's argv, env and secrets as JSON on
stdin, and the agent starts the command detached in its own session, so the connection can drop
and the worker keeps going. Every word of a remote command line passes through `shlex.quote`.

Worker folders are `<workdir>/workers/<owner>.<job>.<run_id>.e<epoch>` (0700, log 0600), `owner`
being the state repository's identity. One `list` call per host per `observe` reports every worker
folder carrying our provider name and owner, so a restarted daemon adopts the workers it finds, and
counts the live workers of other owners (`foreign_workers`), which are never stopped or read. The
command gets only the minimal environment (see `adapters/bootstrap.py`), its env and its secrets.

Placement: a host that declares `resources` takes only jobs that fit them (`Capacity.shortfall`);
a host that declares none takes any job. `capacity()` is an upper bound over the hosts (None when a
host declares nothing), so the planner refuses only a job that no host could take.

State table (what the host's worker folder shows -> WorkerState):

| folder / host                                          | phase         | evidence               |
|--------------------------------------------------------|---------------|------------------------|
| created, supervisor not running the command yet        | pending       |                        |
| supervisor alive, command running                      | running       |                        |
| exit code recorded                                     | exited(code)  |                        |
| killed by a signal on the host                         | exited        | exit_code=-signum,     |
|                                                        |               | signal, oom, detail    |
| killed by a signal after our terminate                 | preempted     | signal, "stopped by    |
|                                                        |               | the reconciler"        |
| no exit record and the supervisor is gone (reboot)     | lost          |                        |
| host silent: fewer than N failed probes or too recent  | last known    |
| host silent for >= lost_after_failures probes AND      |               |
|   >= lost_after_seconds since the first failure        | lost          |

A host that cannot be reached is not a verdict: its workers keep their last known state (with the
silence in `detail`) until the silence is sustained. If every host fails and nothing is yet lost,
`observe` raises ProviderUnavailable. A stop asked for while the host was silent is remembered and
carried out when the host answers again, so a stale worker on a host that comes back is stopped.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from adapters.bootstrap import agent_digest, agent_source
from adapters.compute import (
    ANY_OWNER,
    LaunchSpec,
    ProviderConfigError,
    ProviderUnavailable,
    WorkerPhase,
    WorkerRef,
    WorkerState,
    check_label,
    check_owner,
    output_mask,
    with_deadline,
    worker_deadline,
    worker_folder_name,
)
from adapters.preflight import Check, fail, ok
from adapters.wire import load_json
from desired.models import Capacity, Resources, SshHost, SshSettings

MISSING_AGENT = 86  # exit code of the remote preamble when the agent file is not there yet
WATCH_RETRY_SECONDS = 5.0  # how long the endings watch waits before it connects again to a silent host


class HostUnreachable(Exception):
    """ssh could not reach or log in to the host; the message names the host and what to do.
    `before_command` is True only when the command surely never ran (the connection was refused or
    never set up), so a launch may safely be tried on another host."""

    def __init__(self, message: str, before_command: bool = False) -> None:
        super().__init__(message)
        self.before_command = before_command


NEVER_CONNECTED = (
    "connect to host",
    "could not resolve hostname",
    "connection refused",
    "no route to host",
    "network is unreachable",
    "during banner exchange",
    "connection closed by remote host",
)


@dataclass
class HostHealth:
    failures: int = 0
    first_failure: float | None = None
    last_error: str = ""
    known: dict[WorkerRef, WorkerState] = field(default_factory=dict)  # last successful observation
    pending_stop: set[str] = field(default_factory=set)  # worker folders to stop when the host answers
    foreign: int = 0  # live workers of other owners seen there last time


def remote_path(path: str) -> str:
    """Quote a path for the remote shell, keeping a leading `~/` meaning the remote home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def explain_ssh_failure(host: SshHost, stderr: str, key_file: str | None) -> tuple[str, bool]:
    """One sentence for a person, and whether a person must act (True) or it may pass by itself."""
    where = f"ssh host {host.name!r} ({host.user}@{host.address}:{host.port})"
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "no error text"
    low = stderr.lower()
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return (
            f"{where}: its host key is not in known_hosts or does not match it; check the host's "
            f"fingerprint and add it (ssh-keyscan -p {host.port} {host.address}), or set "
            "host_key_policy: accept-new for a first contact",
            True,
        )
    if "permission denied" in low:
        return (
            f"{where}: login refused; check that the key {key_file or '(ssh default)'} is in the "
            f"authorized_keys of {host.user!r} on the host",
            True,
        )
    if "identity file" in low or ("load key" in low and "invalid format" in low) or "bad permissions" in low:
        return f"{where}: the key file {key_file!r} cannot be used ({text}); fix or replace it", True
    return f"{where} is unreachable ({text}); check that it is up and reachable", False


class SshAdapter:
    def __init__(self, name: str, settings: SshSettings, *, owner: str = ANY_OWNER) -> None:
        self.name = name
        self.owner = check_owner(owner)
        self.foreign_workers = 0
        self.settings = settings
        self.hosts = {h.name: h for h in settings.hosts}
        self.health = {h.name: HostHealth() for h in settings.hosts}
        self.digest = agent_digest()
        self.workdir = settings.workdir.rstrip("/") or "/"
        self._observed = False
        self._uncertain: dict[tuple[str, str, int], str] = {}  # labels -> host where a launch may have started
        self._control_dir = tempfile.mkdtemp(prefix="rc-ssh-") if settings.control_persist_seconds else None

    # ---- talking to a host --------------------------------------------------------------------
    def _ssh_argv(self, host: SshHost) -> list[str]:
        s = self.settings
        argv = [
            "ssh",
            "-p", str(host.port),
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, round(s.connect_timeout_seconds))}",
            "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3",
            "-o", "StrictHostKeyChecking=" + ("accept-new" if s.host_key_policy == "accept-new" else "yes"),
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip
        if s.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(s.known_hosts)}"]
        if host.key_file:
            argv += ["-i", os.path.expanduser(host.key_file), "-o", "IdentitiesOnly=yes"]
        if self._control_dir:
            argv += [
                "-o", "ControlMaster=auto",
                "-o", f"ControlPath={self._control_dir}/%C",
                "-o", f"ControlPersist={round(s.control_persist_seconds or 60)}",
            ]  # fmt: skip
        return [*argv, f"{host.user}@{host.address}"]

    def _check_key(self, host: SshHost) -> None:
        if host.key_file:
            path = os.path.expanduser(host.key_file)
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                raise ProviderConfigError(
                    f"ssh provider {self.name!r}, host {host.name!r}: key file {path!r} does not exist "
                    "or cannot be read; fix key_file in the provider manifest"
                )

    def _agent_path(self) -> str:
        return f"{self.workdir}/bin/agent-{self.digest}.py"

    def _upload_agent(self, host: SshHost) -> None:
        """Writes the agent under a temporary name and renames it, so a half-written agent never runs."""
        path = self._agent_path()
        tmp = f"{path}.tmp"
        script = (
            f"umask 077 && mkdir -p {remote_path(self.workdir + '/bin')} && "
            f"cat > {remote_path(tmp)}.$$ && mv -f {remote_path(tmp)}.$$ {remote_path(path)}"
        )
        self._run(host, script, stdin=agent_source(), upload=False)

    def _run(
        self,
        host: SshHost,
        script: str,
        stdin: str | None = None,
        upload: bool = True,
        timeout: float | None = None,
    ) -> str:
        """Runs one remote shell line; uploads the agent first when the host lacks it."""
        self._check_key(host)
        if upload:
            script = f"test -f {remote_path(self._agent_path())} || exit {MISSING_AGENT}; {script}"
        argv = [*self._ssh_argv(host), "--", script]
        limit = timeout or self.settings.connect_timeout_seconds + 60
        for _attempt in range(2):
            try:
                proc = subprocess.run(argv, input=stdin or "", capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired as exc:
                raise HostUnreachable(
                    f"ssh host {host.name!r} ({host.address}) did not answer within {limit:.0f}s; "
                    "check that it is up and not overloaded"
                ) from exc
            except FileNotFoundError as exc:
                raise ProviderConfigError(
                    "the `ssh` program is not installed on the reconciler's machine; install openssh-client"
                ) from exc
            if proc.returncode == MISSING_AGENT and upload:
                self._upload_agent(host)
                continue
            if proc.returncode == 255:
                message, person = explain_ssh_failure(host, proc.stderr, host.key_file)
                if person:
                    raise ProviderConfigError(f"ssh provider {self.name!r}: {message}")
                low = proc.stderr.lower()
                raise HostUnreachable(message, before_command=any(s in low for s in NEVER_CONNECTED))
            if proc.returncode == 127:
                raise ProviderConfigError(
                    f"ssh provider {self.name!r}, host {host.name!r}: {host.python!r} was not found there "
                    f"({proc.stderr.strip()[-200:]}); install Python 3 or set `python` for the host"
                )
            if proc.returncode != 0:
                raise HostUnreachable(
                    f"ssh host {host.name!r}: the remote command failed with exit code {proc.returncode} "
                    f"({proc.stderr.strip()[-300:]}); check that {host.python!r} runs there"
                )
            return proc.stdout
        raise HostUnreachable(f"ssh host {host.name!r}: could not install the worker agent in {self.workdir}")

    def _agent(self, host: SshHost, *args: str, stdin: str | None = None) -> str:
        words = " ".join(shlex.quote(a) for a in args)
        return self._run(host, f"exec {shlex.quote(host.python)} {remote_path(self._agent_path())} {words}", stdin)

    def _folder(self, folder_name: str) -> str:
        return f"{self.workdir}/workers/{folder_name}"

    def _agent_at(self, host: SshHost, command: str, folder_name: str, *rest: str, stdin: str | None = None) -> str:
        """Agent call on one worker folder; the folder path keeps `~` for the remote shell to expand."""
        words = " ".join(shlex.quote(a) for a in rest)
        line = (
            f"exec {shlex.quote(host.python)} {remote_path(self._agent_path())} {shlex.quote(command)} "
            f"{remote_path(self._folder(folder_name))} {words}"
        )
        return self._run(host, line, stdin)

    # ---- state mapping ------------------------------------------------------------------------
    def _state_of(self, host: SshHost, entry: dict) -> WorkerState:
        where = f"on {host.name}"
        ended = entry.get("exit")
        by_us = bool(entry.get("terminated"))
        if isinstance(ended, dict):
            if ended.get("signal"):
                return self._killed(host, int(ended["signal"]), by_us, bool(ended.get("oom")))
            code = int(ended.get("code", 0))
            detail = "stopped by the reconciler" if by_us else str(ended.get("error", ""))
            return WorkerState(WorkerPhase.EXITED, code, f"exited {code}", detail)
        state = entry.get("state")
        if state == "running":
            return WorkerState(WorkerPhase.RUNNING, None, "running", f"pid {entry.get('child_pid')} {where}")
        if state == "starting":
            return WorkerState(WorkerPhase.PENDING, None, "starting", where)
        return WorkerState(
            WorkerPhase.LOST, None, "vanished", f"supervisor gone without an exit record {where} (reboot?)"
        )

    @staticmethod
    def _killed(host: SshHost, num: int, by_us: bool, oom: bool) -> WorkerState:
        try:
            sig = signal.Signals(num).name
        except ValueError:
            sig = f"signal {num}"
        if by_us:  # the stop we asked for: never the job's own crash
            return WorkerState(WorkerPhase.PREEMPTED, -num, f"killed by {sig}", "stopped by the reconciler", signal=sig)
        who = (f"killed by the kernel's OOM killer on {host.name}" if oom
               else f"killed by {sig} on {host.name}, not by the reconciler")
        return WorkerState(WorkerPhase.EXITED, -num, f"killed by {sig}", who, signal=sig, oom=oom)

    def _list_host(self, host: SshHost) -> dict[WorkerRef, WorkerState]:
        out = load_json(self._agent(host, "list", self.workdir, self.name, self.owner) or "{}")
        self.health[host.name].foreign = int(out.get("foreign", 0))
        found: dict[WorkerRef, WorkerState] = {}
        for entry in out.get("workers", []):
            labels = entry["labels"]
            ref = WorkerRef(
                self.name,
                f"{host.name}/{entry['folder']}",
                labels["job"],
                labels["run_id"],
                int(labels["epoch"]),
            )
            found[ref] = self._state_of(host, entry)
        return found

    def _probe(self, host: SshHost) -> tuple[dict[WorkerRef, WorkerState] | None, str]:
        try:
            return self._list_host(host), ""
        except (HostUnreachable, ProviderConfigError, ValueError, KeyError) as exc:
            return None, str(exc)

    # ---- the contract -------------------------------------------------------------------------
    def observe(self) -> dict[WorkerRef, WorkerState]:
        hosts = list(self.hosts.values())
        with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
            results = list(pool.map(self._probe, hosts))
        now = time.monotonic()
        found: dict[WorkerRef, WorkerState] = {}
        answered = 0
        lost = 0
        for host, (workers, error) in zip(hosts, results, strict=True):
            health = self.health[host.name]
            if workers is not None:
                answered += 1
                health.failures, health.first_failure, health.last_error = 0, None, ""
                workers = self._carry_out_pending_stops(host, workers)
                health.known = dict(workers)
                present = {(r.job, r.run_id, r.epoch) for r in workers}
                for key in [k for k, h in self._uncertain.items() if h == host.name and k not in present]:
                    del self._uncertain[key]  # the host answered and the worker is not there: it never started
                found.update(workers)
                continue
            health.failures += 1
            health.first_failure = health.first_failure if health.first_failure is not None else now
            health.last_error = error
            silent_for = now - health.first_failure
            sustained = (
                health.failures >= self.settings.lost_after_failures and silent_for >= self.settings.lost_after_seconds
            )
            for ref, last in health.known.items():
                if last.phase in (WorkerPhase.EXITED, WorkerPhase.PREEMPTED, WorkerPhase.LOST):
                    found[ref] = last
                elif sustained:
                    lost += 1
                    found[ref] = WorkerState(
                        WorkerPhase.LOST, None, "unreachable",
                        f"host {host.name} silent for {silent_for:.0f}s "
                        f"({health.failures} failed probes): {error}",
                    )  # fmt: skip
                else:
                    found[ref] = WorkerState(
                        last.phase, last.exit_code, last.provider_state,
                        f"last known; host {host.name} silent ({health.failures} failed probes): {error}",
                    )  # fmt: skip
        self._observed = self._observed or answered > 0
        self.foreign_workers = sum(h.foreign for h in self.health.values())
        if answered == 0 and lost == 0:
            errors = "; ".join(self.health[h.name].last_error for h in hosts)
            raise ProviderUnavailable(f"ssh provider {self.name!r}: no host answered: {errors}")
        return found

    def _carry_out_pending_stops(
        self, host: SshHost, workers: dict[WorkerRef, WorkerState]
    ) -> dict[WorkerRef, WorkerState]:
        health = self.health[host.name]
        if not health.pending_stop:
            return workers
        done = set()
        for folder in sorted(health.pending_stop):
            try:
                self._agent_at(host, "terminate", folder)
                done.add(folder)
            except (HostUnreachable, ProviderConfigError):
                break
        health.pending_stop -= done
        if not done:
            return workers
        try:
            return self._list_host(host)
        except (HostUnreachable, ProviderConfigError, ValueError, KeyError):
            return workers

    def _known_worker(self, spec: LaunchSpec) -> WorkerRef | None:
        for health in self.health.values():
            for ref in health.known:
                if (ref.job, ref.run_id, ref.epoch) == (spec.job, spec.run_id, spec.epoch):
                    return ref
        return None

    def _busy(self, host: SshHost) -> int:
        return sum(
            1
            for state in self.health[host.name].known.values()
            if state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING)
        )

    def _payload(self, spec: LaunchSpec) -> dict:
        labels = {"provider": self.name, "owner": self.owner, "job": spec.job, "run_id": spec.run_id,
                  "epoch": spec.epoch}
        return {
            "labels": labels,
            "command": list(spec.command),
            "env": with_deadline(spec.env, worker_deadline(spec)),
            "secret_env": dict(spec.secret_env),
            "mask": output_mask(spec),  # the agent masks the job's secrets in its log
            "cwd": spec.workdir,
            "grace": self.settings.terminate_grace_seconds,
        }

    def _fitting_hosts(self, spec: LaunchSpec) -> list[SshHost]:
        """Hosts whose declared resources fit the job (a host that declares none takes anything); a
        job that fits no host is a config error naming why."""
        need = Resources(cpus=spec.cpus, memory_gb=spec.memory_gb, gpus=spec.gpus, gpu_model=spec.gpu_model)
        why = {h.name: h.resources.shortfall(need) if h.resources else None for h in self.hosts.values()}
        fitting = [h for h in self.hosts.values() if why[h.name] is None]
        if not fitting:
            reasons = "; ".join(f"{name}: {reason}" for name, reason in why.items())
            raise ProviderConfigError(
                f"ssh provider {self.name!r}: no host offers what job {spec.job!r} needs ({reasons})")
        return fitting

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        if self.owner == ANY_OWNER:
            raise ProviderConfigError(f"ssh provider {self.name!r}: an adapter without an owner cannot launch")
        folder = worker_folder_name(self.owner, spec.job, spec.run_id, spec.epoch)
        if not spec.command:
            raise ProviderConfigError(f"job {spec.job!r}: the command is empty")
        order = self._fitting_hosts(spec)
        if not self._observed:
            try:
                self.observe()  # learn what runs where, so a restarted daemon adopts instead of duplicating
            except ProviderUnavailable:
                pass
        known = self._known_worker(spec)
        if known is not None:
            return known
        key = (spec.job, spec.run_id, spec.epoch)
        order.sort(key=lambda h: (self.health[h.name].failures > 0, self._busy(h) - h.max_workers))
        if key in self._uncertain:  # an earlier try may have started it there: never start a twin elsewhere
            order = [self.hosts[self._uncertain[key]]]
        return self._launch_on(order, spec, folder)

    def _launch_on(self, order: list[SshHost], spec: LaunchSpec, folder: str) -> WorkerRef:
        key = (spec.job, spec.run_id, spec.epoch)
        payload = json.dumps(self._payload(spec))
        errors = []
        for host in order:
            if self._busy(host) >= host.max_workers and key not in self._uncertain:
                errors.append(f"{host.name} is full ({host.max_workers} workers)")
                continue
            try:
                self._agent_at(host, "launch", folder, stdin=payload)
            except HostUnreachable as exc:
                errors.append(str(exc))
                if exc.before_command:
                    continue
                self._uncertain[key] = host.name
                break
            self._uncertain.pop(key, None)
            ref = WorkerRef(self.name, f"{host.name}/{folder}", spec.job, spec.run_id, spec.epoch)
            self.health[host.name].known[ref] = WorkerState(WorkerPhase.PENDING, None, "starting", "")
            return ref
        raise ProviderUnavailable(f"ssh provider {self.name!r}: no host could take the worker: {'; '.join(errors)}")

    def _host_of(self, ref: WorkerRef) -> tuple[SshHost, str] | None:
        """The host and folder of one of our workers; None for another owner's worker (left alone)."""
        host_name, _, folder = ref.id.partition("/")
        host = self.hosts.get(host_name)
        if host is None or not folder:
            raise ProviderConfigError(
                f"ssh provider {self.name!r}: worker {ref.id!r} names a host that is no longer in the manifest"
            )
        check_label(folder, "worker folder")
        if self.owner != ANY_OWNER and not folder.startswith(f"{self.owner}."):
            return None
        return host, folder

    def terminate(self, ref: WorkerRef) -> None:
        """SIGTERM now, SIGKILL after the grace (done by the agent on the host). An unreachable host
        gets the stop remembered and carried out when it answers again."""
        where = self._host_of(ref)
        if where is None:
            return
        host, folder = where
        try:
            self._agent_at(host, "terminate", folder)
        except HostUnreachable:
            self.health[host.name].pending_stop.add(folder)

    def kill(self, ref: WorkerRef) -> None:
        """No notice (a drill): SIGKILL to the worker on its host at once. An unreachable host gets
        the ordinary stop remembered instead: the drill's worker holds its saves, so either resumes at N."""
        where = self._host_of(ref)
        if where is None:
            return
        host, folder = where
        try:
            self._agent_at(host, "kill", folder)
        except HostUnreachable:
            self.health[host.name].pending_stop.add(folder)

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        where = self._host_of(ref)
        if where is None:
            return ""
        try:
            return self._agent_at(where[0], "logs", where[1], str(int(tail)))
        except HostUnreachable as exc:  # "no lines" and "cannot ask" are different answers
            raise ProviderUnavailable(str(exc)) from exc

    # ---- endings seen at once (adapters.compute.WatchesEndings) ------------------------------------
    def _endings_script(self) -> str:
        """A remote loop over one ssh connection: once a second it prints a checksum of our worker
        folders' exit records when that changed, else a dot (a dead connection ends it by SIGPIPE)."""
        owner = "*" if self.owner == ANY_OWNER else shlex.quote(self.owner)
        return ("prev=; while :; do "
                f"cur=$(cd {remote_path(self.workdir + '/workers')} 2>/dev/null && "
                f"ls -d {owner}.*/exit.json 2>/dev/null | cksum); "
                'if [ "$cur" != "$prev" ]; then echo "$cur"; prev=$cur; else echo .; fi; sleep 1; done')

    def watch_endings(self, stop: threading.Event, notify: Callable[[], None]) -> None:
        """One long-lived ssh connection per host that reports when a worker's supervisor writes its
        exit record (a SIGKILL, an OOM, an ordinary exit); reconnects after a drop."""
        threads = [threading.Thread(target=self._watch_host, args=(host, stop, notify), daemon=True,
                                    name=f"endings-{self.name}-{host.name}") for host in self.hosts.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _watch_host(self, host: SshHost, stop: threading.Event, notify: Callable[[], None]) -> None:
        last: str | None = None  # the exit records' checksum last seen, kept across reconnections
        while not stop.is_set():
            try:
                self._check_key(host)
                proc = subprocess.Popen([*self._ssh_argv(host), "--", self._endings_script()], text=True,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            except (ProviderConfigError, OSError):
                stop.wait(WATCH_RETRY_SECONDS * 6)
                continue
            threading.Thread(target=_end_on_stop, args=(proc, stop), daemon=True).start()
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.strip()
                if line == "." or not line:
                    continue
                if last is not None and line != last:
                    notify()
                last = line
            proc.wait()
            stop.wait(WATCH_RETRY_SECONDS)

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        """`reconciler doctor`: each host lets us log in and runs its Python (nothing is installed)."""
        checks = []
        for host in self.hosts.values():
            what = f"host {host.name}"
            try:
                version = self._run(host, f"exec {shlex.quote(host.python)} -V", upload=False).strip()
            except (ProviderConfigError, ProviderUnavailable, HostUnreachable) as exc:
                checks.append(fail(self.name, what, str(exc), "fix what the message names; doctor only logs in"))
                continue
            checks.append(ok(self.name, what, f"{host.address} answers over ssh; {version or host.python}"))
        return checks

    def free_slots(self) -> int | None:
        """Free worker places on the hosts that answered last time; None before the first observation."""
        if not self._observed:
            return None
        return sum(
            max(0, host.max_workers - self._busy(host))
            for host in self.hosts.values()
            if self.health[host.name].failures == 0
        )

    def capacity(self) -> Capacity | None:
        """An upper bound over the hosts' declared resources (the most CPUs, memory and GPUs of any
        host, every GPU model); None when some host declares nothing (it takes any job)."""
        declared = [h.resources for h in self.hosts.values()]
        if not declared or any(r is None for r in declared):
            return None
        caps = [r for r in declared if r is not None]
        return Capacity(
            cpus=max((c.cpus for c in caps if c.cpus is not None), default=None),
            memory_gb=max((c.memory_gb for c in caps if c.memory_gb is not None), default=None),
            gpus=max((c.gpus for c in caps if c.gpus is not None), default=None),
            gpu_models=sorted({m for c in caps for m in c.gpu_models}),
        )


def _end_on_stop(proc: subprocess.Popen[str], stop: threading.Event) -> None:
    """Ends a watching ssh process when the watch is stopped (its own end also ends this)."""
    while proc.poll() is None:
        if stop.wait(0.5):
            proc.kill()
            return
