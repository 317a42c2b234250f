"""The `slurm` compute adapter: one batch job per worker, submitted with `sbatch` on this machine.

The reconciler runs where `sbatch`, `squeue`, `scontrol` and `scancel` work (a login node) and the
provider's `workdir` must be visible at the same path on the compute nodes (a shared home or
scratch). Each worker gets the same folder as on SSH hosts,
`<workdir>/workers/<owner>.<job>.<run_id>.e<epoch>/` (0700; its log 0600), `owner` being the state
repository's identity; its batch script execs the worker agent (`adapters/bootstrap.py`), which reads
the argv, env and secrets from a 0600 `payload.json` and deletes it at once, so secrets never reach
the command line, the job's recorded environment or a readable file. `sbatch` itself runs with a
minimal environment (PATH, HOME, locale, SLURM_*), and the agent gives the command only the minimal
base environment, the SLURM_* variables of its job, its env and its secrets.

Labels: the job comment is `reconciler:<owner>:<provider>:<job>:<run_id>:<epoch>` and the job name
`rc-<owner>-<job>`, found again with `scontrol show job -o` after a restart. Jobs of other owners
(another repository or person on the same cluster) are counted in `foreign_workers` and never
cancelled or adopted. A job's `gpu_model` becomes `--gres=gpu:<model>:<n>`.
With the provider's `tasks` above 1 the job asks for that many tasks on one node (the job's CPUs
shared between them) and the agent starts the command with `srun`, once per task, ending all of
the others `SRUN_WAIT_SECONDS` after the first one ends (`--wait`; not `--kill-on-bad-exit`, which
would kill the other ranks the moment the first exits 75 after a clean stop, before they finish
theirs); srun passes the environment on, the agent hands a stop
to the tasks as SIGUSR1 (which srun forwards; on SIGTERM srun would end the step at once), and the
worker SDK takes each task's rank from Slurm's variables.
Jobs are submitted with `--no-requeue` (a relaunch is a new
epoch decided by the planner, never a silent restart of a fenced one). With a time limit the job asks
for `--signal=B:USR1@<signal_seconds>`; the agent turns that warning into SIGTERM for the worker, which
checkpoints and exits 75, and `RECONCILER_DEADLINE` carries the limit to the worker.

State table (Slurm's word -> WorkerPhase), one place for every state Slurm documents:

    PENDING CONFIGURING REQUEUED REQUEUE_HOLD REQUEUE_FED RESV_DEL_HOLD SUSPENDED STOPPED -> pending
    RUNNING COMPLETING SIGNALING STAGE_OUT RESIZING                                     -> running
    COMPLETED FAILED SPECIAL_EXIT                                                       -> exited(code)
    OUT_OF_MEMORY                                                                       -> exited, oom
    CANCELLED (by someone other than the reconciler)                                    -> exited, signal
    TIMEOUT DEADLINE                                                                    -> session-limit
    PREEMPTED NODE_FAIL BOOT_FAIL REVOKED                                               -> preempted
    CANCELLED (by the reconciler: a `terminated` marker in the folder)                  -> preempted
    anything else                                                                       -> lost

Evidence, not verdicts (the planner classifies): a death by a signal (`ExitCode` `0:<sig>`) carries
`signal` (e.g. "SIGKILL") with the shell's exit code 128+sig; OUT_OF_MEMORY carries `oom=True`; an
outsider's CANCELLED is an exit: by the signal scancel sent (SIGTERM unless Slurm says otherwise), or
with the command's own code when it caught the signal (75 after a final checkpoint), its detail
naming who when accounting (`sacct`) can tell. Only Slurm's own word (PREEMPTED, NODE_FAIL,
BOOT_FAIL, REVOKED) is an interruption. A job that received the time-limit warning and then exited 75
(checkpointed, as asked) or died of the SIGTERM it was sent is session-limit, not a job error.
`RECONCILER_DEADLINE` is the earlier of the job's deadline and the job's start + its time limit.
Suspended jobs are pending: they hold their allocation but make no progress and will resume.
Finished jobs leave the controller after MinJobAge; then `sacct` (if accounting is on) or
the exit record the agent wrote in the folder tells how they ended.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from adapters.bootstrap import agent_digest, agent_source, describe
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
from adapters.wire import is_decimal
from desired.models import Capacity, SlurmSettings

FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")
SUBMIT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SHELL", "TMPDIR")

STATES: dict[str, WorkerPhase] = {
    "PENDING": WorkerPhase.PENDING,
    "CONFIGURING": WorkerPhase.PENDING,
    "REQUEUED": WorkerPhase.PENDING,
    "REQUEUE_HOLD": WorkerPhase.PENDING,
    "REQUEUE_FED": WorkerPhase.PENDING,
    "RESV_DEL_HOLD": WorkerPhase.PENDING,
    "SUSPENDED": WorkerPhase.PENDING,
    "STOPPED": WorkerPhase.PENDING,
    "RUNNING": WorkerPhase.RUNNING,
    "COMPLETING": WorkerPhase.RUNNING,
    "SIGNALING": WorkerPhase.RUNNING,
    "STAGE_OUT": WorkerPhase.RUNNING,
    "RESIZING": WorkerPhase.RUNNING,
    "COMPLETED": WorkerPhase.EXITED,
    "FAILED": WorkerPhase.EXITED,
    "SPECIAL_EXIT": WorkerPhase.EXITED,
    "OUT_OF_MEMORY": WorkerPhase.EXITED,
    "TIMEOUT": WorkerPhase.SESSION_LIMIT,
    "DEADLINE": WorkerPhase.SESSION_LIMIT,
    "PREEMPTED": WorkerPhase.PREEMPTED,
    "NODE_FAIL": WorkerPhase.PREEMPTED,
    "BOOT_FAIL": WorkerPhase.PREEMPTED,
    "REVOKED": WorkerPhase.PREEMPTED,
    "CANCELLED": WorkerPhase.EXITED,  # by us: PREEMPTED (see map_state)
}
INTERRUPTED_EXIT = 75  # the worker's "stopped after a final checkpoint"


def parse_exit_code(text: str) -> int | None:
    """Slurm's `code:signal`; a death by signal becomes 128+signal, as a shell would say."""
    if not text:
        return None
    code, _, sig = text.partition(":")
    try:
        number, signum = int(code), int(sig or 0)
    except ValueError:
        return None
    return 128 + signum if number == 0 and signum else number


def _signal_of(exit_code: str) -> str | None:
    """The signal part of Slurm's `code:signal`, as a name; None when there is none."""
    number = exit_code.partition(":")[2]
    if not number.isdigit() or int(number) == 0:
        return None
    try:
        return signal.Signals(int(number)).name
    except ValueError:
        return f"signal {number}"


def _cancelled(state: str, exit_code: str, by_reconciler: bool, cancelled_by: str) -> WorkerState:
    code = parse_exit_code(exit_code)
    if by_reconciler:
        return WorkerState(WorkerPhase.PREEMPTED, code, state, "cancelled by the reconciler")
    who = cancelled_by or (state.split(" by ", 1)[1] if " by " in state else "")
    detail = "cancelled outside the reconciler" + (f" by {who}" if who else " (no accounting to tell who)")
    sig = _signal_of(exit_code)
    if sig is None and not code:  # no word from the command: it died of what scancel sends
        sig = "SIGTERM"
    return WorkerState(WorkerPhase.EXITED, code, state, detail, signal=sig)


def _exited(word: str, state: str, exit_code: str, by_reconciler: bool, warned: bool) -> WorkerState:
    code = parse_exit_code(exit_code)
    code = 0 if code is None and word == "COMPLETED" else code
    oom = word == "OUT_OF_MEMORY"
    if oom:  # Slurm says 0:125 here; report the kernel OOM killer's usual 137
        code = int(exit_code.partition(":")[0] or 0) or 137
    if warned and code in (INTERRUPTED_EXIT, 128 + 15):
        return WorkerState(
            WorkerPhase.SESSION_LIMIT, code, state, "time-limit warning received; worker checkpointed and stopped"
        )
    detail = "stopped by the reconciler" if by_reconciler else ("out of memory" if oom else "")
    sig = None if oom else _signal_of(exit_code)
    return WorkerState(WorkerPhase.EXITED, code, state, detail, signal=sig, oom=oom)


PREEMPTED_DETAIL = {
    "NODE_FAIL": "node failure",
    "BOOT_FAIL": "node failed to boot",
    "PREEMPTED": "preempted by a higher-priority job",
    "REVOKED": "revoked by a federated cluster",
}


def map_state(
    state: str,
    exit_code: str = "",
    *,
    by_reconciler: bool = False,
    warned: bool = False,
    cancelled_by: str = "",
    reason: str = "",
) -> WorkerState:
    """The one table: Slurm's word (with `CANCELLED by 1001` style suffixes allowed) -> WorkerState."""
    word = state.split()[0].rstrip("+") if state.strip() else ""
    phase = STATES.get(word, WorkerPhase.LOST)
    if word == "CANCELLED":
        return _cancelled(state, exit_code, by_reconciler, cancelled_by)
    if phase is WorkerPhase.EXITED:
        return _exited(word, state, exit_code, by_reconciler, warned)
    code = parse_exit_code(exit_code)
    if phase is WorkerPhase.SESSION_LIMIT:
        return WorkerState(
            phase, code, state, "time limit reached" if word == "TIMEOUT" else "deadline reached"
        )
    if phase is WorkerPhase.LOST:
        return WorkerState(phase, None, state or "unknown", f"Slurm state {state!r} is not one we know")
    if phase is WorkerPhase.PREEMPTED:
        return WorkerState(phase, code, state, PREEMPTED_DETAIL.get(word, ""))
    return WorkerState(phase, None, state, "" if reason in ("", "None", "(null)") else reason)


def time_limit_seconds(text: str | None) -> int | None:
    """sbatch --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; Slurm rounds up to whole minutes."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days = 0
    rest = text
    if "-" in text:
        d, rest = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in rest.split(":")]
        parts += [0] * (3 - len(parts))
        seconds = days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    else:
        parts = [int(p) for p in rest.split(":")]
        if len(parts) == 1:
            seconds = parts[0] * 60
        elif len(parts) == 2:
            seconds = parts[0] * 60 + parts[1]
        else:
            seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return max(60, math.ceil(seconds / 60) * 60)


def parse_scontrol(line: str) -> dict[str, str]:
    """One `scontrol show job -o` line into its Key=Value fields (values may hold spaces)."""
    matches = list(FIELD.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[m.group(1)] = line[m.end() : end].strip()
    return fields


Labels = tuple[str, str, str, int]  # owner, job, run_id, epoch
LIVE = (WorkerPhase.PENDING, WorkerPhase.RUNNING)


class SlurmAdapter:
    def __init__(self, name: str, settings: SlurmSettings, *, owner: str = ANY_OWNER) -> None:
        self.name = name
        self.owner = check_owner(owner)
        self.foreign_workers = 0
        self.settings = settings
        self.workdir = Path(os.path.expanduser(settings.workdir))
        self.workers = self.workdir / "workers"
        self.agent = self.workdir / "bin" / f"agent-{agent_digest()}.py"
        self._owners: dict[str, str] = {}  # job id -> owner, for an operator's view (ANY_OWNER)
        self._finished: dict[str, WorkerState] = {}  # job id -> final state, once seen
        self._accounting: bool | None = None  # unknown until sacct is first asked
        try:
            time_limit_seconds(settings.time_limit)
        except ValueError as exc:
            raise ProviderConfigError(
                f"slurm provider {name!r}: time_limit {settings.time_limit!r} is not a Slurm time "
                "(use minutes, HH:MM:SS or D-HH:MM:SS)"
            ) from exc

    # ---- running the Slurm commands -------------------------------------------------------------
    def _run(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, env=env, timeout=self.settings.command_timeout_seconds
            )
        except FileNotFoundError as exc:
            raise ProviderConfigError(
                f"slurm provider {self.name!r}: `{argv[0]}` is not installed here; run the reconciler on a "
                "machine with the Slurm client commands (a login node)"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise ProviderUnavailable(
                f"slurm provider {self.name!r}: `{argv[0]}` did not answer within "
                f"{self.settings.command_timeout_seconds:.0f}s; the controller may be overloaded or down"
            ) from exc

    def _controller_jobs(self) -> tuple[dict[str, tuple[dict[str, str], Labels]], int]:
        """Our jobs the controller knows (job id -> fields, labels), and how many live jobs of other
        owners (other repositories or people using the reconciler on this cluster) it holds."""
        proc = self._run(["scontrol", "show", "job", "-o"])
        if proc.returncode != 0:
            raise ProviderUnavailable(
                f"slurm provider {self.name!r}: cannot list jobs "
                f"({proc.stderr.strip() or proc.stdout.strip()}); "
                "check that slurmctld is up and SLURM_CONF points at the cluster"
            )
        jobs, foreign = {}, 0
        for line in proc.stdout.splitlines():
            if "JobId=" not in line or "Comment=reconciler:" not in line:
                continue
            fields = parse_scontrol(line)
            labels = self._labels_of(fields)
            if labels is not None:
                jobs[fields["JobId"]] = (fields, labels)
            elif fields.get("Comment", "").startswith("reconciler:") and self._foreign(fields):
                foreign += STATES.get(fields.get("JobState", "").split(" ")[0]) in LIVE
        return jobs, foreign

    def _foreign(self, fields: dict[str, str]) -> bool:
        parts = fields.get("Comment", "").split(":")
        return len(parts) != 6 or parts[1] != self.owner

    def _who_cancelled(self, job_id: str) -> str:
        """Asks accounting who cancelled a job; '' when accounting is off (remembered, asked once)."""
        if self._accounting is False or shutil.which("sacct") is None:
            return ""
        proc = self._run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,ExitCode"])
        if proc.returncode != 0 or "disabled" in (proc.stderr + proc.stdout).lower():
            self._accounting = False
            return ""
        self._accounting = True
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            state = parts[1] if len(parts) > 1 and parts[0] == job_id else ""
            if " by " in state:
                uid = state.split(" by ", 1)[1].strip().rstrip("+")
                try:
                    return f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
                except (KeyError, ValueError):
                    return f"uid {uid}"
        return ""

    def _sacct_final(self, job_id: str) -> tuple[str, str] | None:
        if self._accounting is False or shutil.which("sacct") is None:
            return None
        proc = self._run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,ExitCode"])
        if proc.returncode != 0 or "disabled" in (proc.stderr + proc.stdout).lower():
            self._accounting = False
            return None
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 3 and parts[0] == job_id:
                return parts[1], parts[2]
        return None

    # ---- folders --------------------------------------------------------------------------------
    def _folder(self, owner: str, job: str, run_id: str, epoch: int) -> Path:
        return self.workers / worker_folder_name(owner, job, run_id, epoch)

    def _labels_of(self, fields: dict[str, str]) -> Labels | None:
        """Labels from `reconciler:<owner>:<provider>:<job>:<run_id>:<epoch>`, for our jobs only."""
        parts = fields.get("Comment", "").split(":")
        if len(parts) != 6 or parts[0] != "reconciler" or parts[2] != self.name or not is_decimal(parts[5]):
            return None
        if self.owner not in (ANY_OWNER, parts[1]):
            return None
        return parts[1], parts[3], parts[4], int(parts[5])

    def _state_of(self, fields: dict[str, str], folder: Path) -> WorkerState:
        state = fields.get("JobState", "")
        by_us = (folder / "terminated").exists()
        who = ""
        if state.startswith("CANCELLED") and not by_us:
            who = self._who_cancelled(fields["JobId"])
        mapped = map_state(
            state,
            fields.get("ExitCode", ""),
            by_reconciler=by_us,
            warned=(folder / "warned").exists(),
            cancelled_by=who,
            reason=fields.get("Reason", ""),
        )
        return _with_exit_record(mapped, folder)

    def _state_from_folder(self, job_id: str, folder: Path) -> WorkerState:
        """For a job the controller has forgotten: accounting if any, else the agent's exit record."""
        final = self._sacct_final(job_id)
        by_us = (folder / "terminated").exists()
        warned = (folder / "warned").exists()
        if final is not None:
            who = self._who_cancelled(job_id) if final[0].startswith("CANCELLED") and not by_us else ""
            return map_state(final[0], final[1], by_reconciler=by_us, warned=warned, cancelled_by=who)
        entry = describe(str(folder)) or {}
        ended = entry.get("exit")
        if isinstance(ended, dict) and "code" in ended:
            return map_state("COMPLETED" if ended["code"] == 0 else "FAILED", f"{ended['code']}:0",
                             by_reconciler=by_us, warned=warned)  # fmt: skip
        if isinstance(ended, dict) and "signal" in ended:
            num = int(ended["signal"])
            detail = (
                "stopped by the reconciler"
                if by_us
                else (f"killed by signal {num}; Slurm has forgotten the job, so who is unknown")
            )
            phase = WorkerPhase.PREEMPTED if by_us else WorkerPhase.EXITED
            return WorkerState(phase, 128 + num, "gone", detail, signal=_signal_of(f"0:{num}"),
                               oom=bool(ended.get("oom")))
        return WorkerState(
            WorkerPhase.LOST, None, "gone", f"Slurm has forgotten job {job_id} and it left no exit record"
        )

    # ---- the contract ---------------------------------------------------------------------------
    def observe(self) -> dict[WorkerRef, WorkerState]:
        jobs, self.foreign_workers = self._controller_jobs()
        found: dict[WorkerRef, WorkerState] = {}
        for job_id, (fields, labels) in jobs.items():
            ref = WorkerRef(self.name, job_id, *labels[1:])
            self._owners[job_id] = labels[0]
            folder = self._folder(*labels)
            state = self._state_of(fields, folder)
            if state.phase not in LIVE:
                self._finished[job_id] = state
                _forget_payload(folder)  # a job cancelled before it started never read its secrets
            found[ref] = state
        found.update(self._forgotten(set(jobs)))
        return found

    def _forgotten(self, known: set[str]) -> dict[WorkerRef, WorkerState]:
        """Our worker folders whose job the controller no longer knows (ended, past MinJobAge)."""
        found: dict[WorkerRef, WorkerState] = {}
        if not self.workers.is_dir():
            return found
        for folder in sorted(self.workers.iterdir()):
            entry = describe(str(folder))
            if not entry or not entry.get("slurm_job_id") or entry["slurm_job_id"] in known:
                continue
            labels = entry["labels"]
            if labels.get("provider") != self.name or self.owner not in (ANY_OWNER, labels.get("owner")):
                continue
            job_id = entry["slurm_job_id"]
            ref = WorkerRef(self.name, job_id, labels["job"], labels["run_id"], int(labels["epoch"]))
            self._owners[job_id] = str(labels.get("owner"))
            if job_id not in self._finished:
                self._finished[job_id] = self._state_from_folder(job_id, folder)
            found[ref] = self._finished[job_id]
        return found

    def _write_agent(self) -> None:
        if self.agent.exists():
            return
        self.agent.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.agent.with_name(f"{self.agent.name}.{os.getpid()}.tmp")
        tmp.write_text(agent_source())
        os.replace(tmp, self.agent)

    def _sbatch_argv(self, spec: LaunchSpec, folder: Path, script: Path) -> list[str]:
        s = self.settings
        argv = [
            "sbatch", "--parsable",
            f"--job-name=rc-{self.owner}-{spec.job}",
            f"--comment=reconciler:{self.owner}:{self.name}:{spec.job}:{spec.run_id}:{spec.epoch}",
            f"--output={folder / 'log'}",
            "--open-mode=append",
            "--no-requeue",
            f"--chdir={folder}",
            f"--cpus-per-task={_cpus_per_task(spec, s)}",
        ]  # fmt: skip
        if s.tasks > 1:
            argv += ["--nodes=1", f"--ntasks={s.tasks}"]
        if spec.memory_gb:
            argv.append(f"--mem={math.ceil(spec.memory_gb * 1024)}M")
        if spec.gpus:
            model = f"{check_label(spec.gpu_model, 'GPU model')}:" if spec.gpu_model else ""
            argv.append(f"--gres=gpu:{model}{spec.gpus}")
        for flag, value in (("--partition", s.partition), ("--account", s.account), ("--qos", s.qos)):
            if value:
                argv.append(f"{flag}={value}")
        if s.time_limit:
            argv.append(f"--time={s.time_limit}")
            if s.signal_seconds:
                argv.append(f"--signal=B:USR1@{s.signal_seconds}")
        return [*argv, *s.sbatch_options, str(script)]

    def _adopt(self, spec: LaunchSpec, folder: Path) -> WorkerRef | None:
        """A worker already submitted with these labels (its id recorded, or only in the controller)."""
        known = (folder / "slurm_job_id").read_text().strip() if (folder / "slurm_job_id").exists() else ""
        if known:
            return WorkerRef(self.name, known, spec.job, spec.run_id, spec.epoch)
        jobs, _ = self._controller_jobs()
        for job_id, (_fields, labels) in jobs.items():  # submitted, but the id was never written
            if labels == (self.owner, spec.job, spec.run_id, spec.epoch):
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                (folder / "slurm_job_id").write_text(job_id)
                return WorkerRef(self.name, job_id, spec.job, spec.run_id, spec.epoch)
        return None

    def _payload(self, spec: LaunchSpec) -> dict:
        """What the agent reads (and deletes) on the node: labels, argv, env, secrets."""
        return {
            "labels": {"provider": self.name, "owner": self.owner, "job": spec.job, "run_id": spec.run_id,
                       "epoch": spec.epoch},
            "command": _srun(spec, self.settings),
            "env": with_deadline(spec.env, worker_deadline(spec)),  # the agent adds start + time limit
            "secret_env": dict(spec.secret_env),
            "mask": output_mask(spec),  # the agent masks the job's secrets in its log
            "pass_prefixes": ["SLURM_"],  # set by Slurm for the job; nothing else of the node's environment
            "cwd": spec.workdir,
            "grace": 3600,  # Slurm's KillWait decides how long a cancelled job may take
            "deadline_in": time_limit_seconds(self.settings.time_limit),
            # srun ends its step on SIGTERM; it passes SIGUSR1 on to every task (the SDK stops on both)
            **({"stop_signal": "SIGUSR1"} if self.settings.tasks > 1 else {}),
        }

    def _prepare(self, spec: LaunchSpec, folder: Path) -> Path:
        """The worker folder (0700) with its labels, 0600 payload and log, and the batch script."""
        self._write_agent()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.chmod(0o700)
        payload = self._payload(spec)
        (folder / "labels.json").write_text(json.dumps({**payload["labels"], "created": time.time()}))
        fd = os.open(folder / "payload.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh)
        os.close(os.open(folder / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        script = folder / "batch.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"# reconciler worker: provider={self.name} owner={self.owner} job={spec.job} "
            f"run_id={spec.run_id} epoch={spec.epoch}\n"
            f"exec {shlex.quote(self.settings.python)} {shlex.quote(str(self.agent))} "
            f"run {shlex.quote(str(folder))}\n"
        )
        script.chmod(0o700)
        return script

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        if self.owner == ANY_OWNER:
            raise ProviderConfigError(f"slurm provider {self.name!r}: an adapter without an owner cannot launch")
        folder = self._folder(self.owner, spec.job, spec.run_id, spec.epoch)
        adopted = self._adopt(spec, folder)
        if adopted is not None:
            return adopted
        script = self._prepare(spec, folder)
        env = {k: v for k, v in os.environ.items() if k in SUBMIT_ENV or k.startswith("SLURM_")}
        proc = self._run(self._sbatch_argv(spec, folder, script), env=env)
        if proc.returncode != 0 or not proc.stdout.strip():
            shutil.rmtree(folder, ignore_errors=True)  # takes the secrets with it; a retry submits afresh
            raise self._rejected(proc)
        job_id = proc.stdout.strip().split(";")[0]
        (folder / "slurm_job_id").write_text(job_id)
        return WorkerRef(self.name, job_id, spec.job, spec.run_id, spec.epoch)

    def _rejected(self, proc: subprocess.CompletedProcess[str]) -> Exception:
        message = "; ".join(
            line.replace("sbatch: error: ", "").strip()
            for line in (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            if line.strip()
        )
        transient = any(w in message.lower() for w in ("unable to contact", "timed out", "try again", "busy"))
        text = f"slurm provider {self.name!r}: sbatch rejected the job ({message})"
        if transient:
            return ProviderUnavailable(text + "; the controller should recover, will retry")
        return ProviderConfigError(text + "; check partition, account, qos, time_limit and sbatch_options")

    def _folder_of(self, ref: WorkerRef) -> Path | None:
        """The folder of one of our workers: it names our owner and records this job id."""
        owner = self.owner if self.owner != ANY_OWNER else self._owners.get(ref.id)
        if owner is None:
            return None
        folder = self._folder(owner, ref.job, ref.run_id, ref.epoch)
        try:
            return folder if (folder / "slurm_job_id").read_text().strip() == ref.id else None
        except OSError:
            return None

    def terminate(self, ref: WorkerRef) -> None:
        """scancel: Slurm sends SIGTERM, and SIGKILL after the cluster's KillWait. Only a job whose
        folder is ours: another owner's job on the cluster is never cancelled."""
        folder = self._folder_of(ref)
        if folder is None:
            if self.owner != ANY_OWNER:
                return
        else:
            (folder / "terminated").write_text(str(int(time.time())))
            _forget_payload(folder)
        proc = self._run(["scancel", ref.id])
        if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
            raise ProviderUnavailable(
                f"slurm provider {self.name!r}: scancel {ref.id} failed: {proc.stderr.strip()}"
            )

    def kill(self, ref: WorkerRef) -> None:
        """No notice (a drill): `scancel --signal=KILL --full`, Slurm's harshest cancel, kills every
        step of the job and the batch script. Slurm's own job termination may still send the worker
        SIGTERM a moment before (seen in about half the runs on the test cluster); the drill holds
        its saves, so the resume is at the drill's step either way. Marked as terminate's stop is: ours."""
        folder = self._folder_of(ref)
        if folder is None:
            return
        (folder / "terminated").write_text(str(int(time.time())))
        proc = self._run(["scancel", "--signal=KILL", "--full", ref.id])
        if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
            raise ProviderUnavailable(
                f"slurm provider {self.name!r}: scancel --signal=KILL {ref.id} failed: {proc.stderr.strip()}"
            )

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        folder = self._folder_of(ref)
        if folder is None:
            return ""
        try:
            with open(folder / "log", errors="replace") as fh:
                return "".join(deque(fh, maxlen=tail)) if tail > 0 else ""
        except OSError:
            return ""

    # ---- endings seen at once (adapters.compute.WatchesEndings) ------------------------------------
    def _job_liveness(self) -> dict[str, bool] | None:
        """Our jobs the controller lists (finished ones too, until MinJobAge; only this user's are
        asked for, which keeps the call light on the controller): job id -> still live. None when
        squeue cannot answer now."""
        try:
            proc = self._run(["squeue", "-h", "-t", "all", "--user", str(os.getuid()), "-o", "%i|%T|%k"])
        except (ProviderUnavailable, ProviderConfigError):
            return None
        if proc.returncode != 0:
            return None
        jobs = {}
        for line in proc.stdout.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, comment = rest.partition("|")
            if self._labels_of({"Comment": comment}) is not None:
                jobs[job_id] = STATES.get(state.split(" ")[0]) in LIVE
        return jobs

    def watch_endings(self, stop: threading.Event, notify: Callable[[], None], interval: float = 1.0) -> None:
        """Asks squeue every `interval` seconds; a job of ours that left the live states (or the
        listing) since the last answer is an ending."""
        last: dict[str, bool] | None = None
        while not stop.is_set():
            jobs = self._job_liveness()
            if jobs is None:
                stop.wait(interval)
                continue
            if last is not None and any(
                    not jobs.get(job_id, False) and last.get(job_id, True) for job_id in {*jobs, *last}):
                notify()
            last = jobs
            stop.wait(interval)

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        """`reconciler doctor`: the controller answers `sinfo` (nothing is submitted)."""
        try:
            proc = self._run(["sinfo", "-h", "-o", "%P %a %D"])
        except (ProviderConfigError, ProviderUnavailable) as exc:
            return [fail(self.name, "controller", str(exc), "fix what the message names, then run doctor again")]
        if proc.returncode != 0:
            return [fail(self.name, "controller", f"`sinfo` failed: {proc.stderr.strip()[-300:]}",
                         "check that slurmctld is up and SLURM_CONF names this cluster")]
        partitions = [line.split()[0] for line in proc.stdout.splitlines() if line.split()]
        return [ok(self.name, "controller", f"sinfo answers; partitions: {', '.join(partitions) or 'none'}")]

    def free_slots(self) -> int | None:
        """Slurm queues what it cannot run yet; the provider's `concurrency` is the limit that matters."""
        return None

    def capacity(self) -> Capacity | None:
        """Unknown: Slurm itself places the job (or holds it pending) by its --gres and --mem."""
        return None


# After the first task of an srun step ends, the others get this long to end on their own: after a
# clean stop they exit 75 within moments; after a crash they are stuck in a collective, and srun
# then ends them.
SRUN_WAIT_SECONDS = 30


def _cpus_per_task(spec: LaunchSpec, settings: SlurmSettings) -> int:
    """The job's CPUs shared between its tasks (at least one each)."""
    return max(1, math.ceil(spec.cpus / settings.tasks))


def _srun(spec: LaunchSpec, settings: SlurmSettings) -> list[str]:
    """The command as the agent starts it: itself, or once per task under srun."""
    if settings.tasks == 1:
        return list(spec.command)
    return ["srun", f"--ntasks={settings.tasks}", f"--cpus-per-task={_cpus_per_task(spec, settings)}",
            "--kill-on-bad-exit=0", f"--wait={SRUN_WAIT_SECONDS}", *spec.command]


def _with_exit_record(state: WorkerState, folder: Path) -> WorkerState:
    """Slurm sees the agent's exit code (128+sig) where the command died of a signal; the agent's
    exit record says which signal, and whether the cgroup's OOM killer acted."""
    if state.phase is not WorkerPhase.EXITED or state.signal or state.oom:
        return state
    ended = (describe(str(folder)) or {}).get("exit")
    if not isinstance(ended, dict) or not ended.get("signal"):
        return state
    return replace(state, signal=_signal_of(f"0:{int(ended['signal'])}"), oom=bool(ended.get("oom")))


def _forget_payload(folder: Path) -> None:
    """The payload holds secrets; once the job can no longer start, nothing should keep them."""
    try:
        (folder / "payload.json").unlink()
    except FileNotFoundError:
        pass
