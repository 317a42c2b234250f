"""The `slurm` compute adapter: one batch job per worker, submitted with `sbatch` on this machine.

The reconciler runs where `sbatch`, `squeue`, `scontrol` and `scancel` work (a login node) and the
provider's `workdir` must be visible at the same path on the compute nodes (a shared home or
scratch). Each worker gets the same folder as on SSH hosts, `<workdir>/workers/<job>.<run_id>.e<epoch>/`;
its batch script execs the worker agent (`adapters/bootstrap.py`), which reads the argv, env and
secrets from a 0600 `payload.json` and deletes it at once, so secrets never reach the command line,
the job's recorded environment or a readable file. `sbatch` itself runs with a minimal environment
(PATH, HOME, locale, SLURM_*), so other jobs' secrets in the reconciler's own environment are not
exported into the job.

Labels: the job comment is `reconciler:<provider>:<job>:<run_id>:<epoch>`, found again with
`scontrol show job -o` after a restart. Jobs are submitted with `--no-requeue` (a relaunch is a new
epoch decided by the planner, never a silent restart of a fenced one). With a time limit the job asks
for `--signal=B:USR1@<signal_seconds>`; the agent turns that warning into SIGTERM for the worker, which
checkpoints and exits 75, and `RECONCILER_DEADLINE` carries the limit to the worker.

State table (Slurm's word -> WorkerPhase), one place for every state Slurm documents:

    PENDING CONFIGURING REQUEUED REQUEUE_HOLD REQUEUE_FED RESV_DEL_HOLD SUSPENDED STOPPED -> pending
    RUNNING COMPLETING SIGNALING STAGE_OUT RESIZING                                     -> running
    COMPLETED FAILED SPECIAL_EXIT OUT_OF_MEMORY                                         -> exited(code)
    TIMEOUT DEADLINE                                                                    -> session-limit
    PREEMPTED NODE_FAIL BOOT_FAIL REVOKED                                               -> preempted
    CANCELLED                                                                           -> preempted
    anything else                                                                       -> lost

Decisions: a job that received the time-limit warning and then exited 75 (checkpointed, as asked) or
died of the SIGTERM it was sent is session-limit, not a job error. CANCELLED is preempted, an
interruption that does not count against the job's retry budget: when the reconciler cancelled it (a
`terminated` marker in the folder) the detail says so; otherwise the detail says it was cancelled
outside the reconciler, naming the uid when accounting (`sacct`) is available. A person who wants a
job to stop sets `suspend: true` or deletes the manifest; a `scancel` by an admin is treated like a
preemption. Suspended jobs are pending: they hold their allocation but make no progress and will
resume. Finished jobs leave the controller after MinJobAge; then `sacct` (if accounting is on) or
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
import subprocess
import time
from collections import deque
from pathlib import Path

from adapters.bootstrap import agent_digest, agent_source, describe
from adapters.compute import (
    LaunchSpec,
    ProviderConfigError,
    ProviderUnavailable,
    WorkerPhase,
    WorkerRef,
    WorkerState,
    check_label,
)
from desired.models import SlurmSettings

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
    "CANCELLED": WorkerPhase.PREEMPTED,
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
    code = parse_exit_code(exit_code)
    if word == "CANCELLED":
        if by_reconciler:
            return WorkerState(phase, code, state, "cancelled by the reconciler")
        who = cancelled_by or (state.split(" by ", 1)[1] if " by " in state else "")
        detail = "cancelled outside the reconciler" + (
            f" by {who}" if who else " (no accounting to tell who)"
        )
        return WorkerState(phase, code, state, detail)
    if phase is WorkerPhase.EXITED:
        code = 0 if code is None and word == "COMPLETED" else code
        if word == "OUT_OF_MEMORY":  # Slurm says 0:125 here; report the kernel OOM killer's usual 137
            code = int(exit_code.partition(":")[0] or 0) or 137
        if warned and code in (INTERRUPTED_EXIT, 128 + 15):
            return WorkerState(
                WorkerPhase.SESSION_LIMIT,
                code,
                state,
                "time-limit warning received; worker checkpointed and stopped",
            )
        detail = (
            "stopped by the reconciler"
            if by_reconciler
            else ("out of memory" if word == "OUT_OF_MEMORY" else "")
        )
        return WorkerState(phase, code, state, detail)
    if phase is WorkerPhase.SESSION_LIMIT:
        return WorkerState(
            phase, code, state, "time limit reached" if word == "TIMEOUT" else "deadline reached"
        )
    if phase is WorkerPhase.LOST:
        return WorkerState(phase, None, state or "unknown", f"Slurm state {state!r} is not one we know")
    if phase is WorkerPhase.PREEMPTED:
        return WorkerState(
            phase,
            code,
            state,
            {"NODE_FAIL": "node failure", "BOOT_FAIL": "node failed to boot"}.get(
                word, "preempted by a higher-priority job" if word == "PREEMPTED" else ""
            ),
        )
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


class SlurmAdapter:
    def __init__(self, name: str, settings: SlurmSettings) -> None:
        self.name = name
        self.settings = settings
        self.workdir = Path(os.path.expanduser(settings.workdir))
        self.workers = self.workdir / "workers"
        self.agent = self.workdir / "bin" / f"agent-{agent_digest()}.py"
        self.comment_prefix = f"reconciler:{name}:"
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

    def _controller_jobs(self) -> dict[str, dict[str, str]]:
        proc = self._run(["scontrol", "show", "job", "-o"])
        if proc.returncode != 0:
            raise ProviderUnavailable(
                f"slurm provider {self.name!r}: cannot list jobs "
                f"({proc.stderr.strip() or proc.stdout.strip()}); "
                "check that slurmctld is up and SLURM_CONF points at the cluster"
            )
        jobs = {}
        for line in proc.stdout.splitlines():
            if "JobId=" not in line:
                continue
            fields = parse_scontrol(line)
            if fields.get("Comment", "").startswith(self.comment_prefix):
                jobs[fields["JobId"]] = fields
        return jobs

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
    def _folder(self, job: str, run_id: str, epoch: int) -> Path:
        check_label(job, "job name")
        check_label(run_id, "run id")
        return self.workers / f"{job}.{run_id}.e{epoch}"

    def _labels_of(self, fields: dict[str, str]) -> tuple[str, str, int] | None:
        parts = fields.get("Comment", "")[len(self.comment_prefix) :].split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            return None
        return parts[0], parts[1], int(parts[2])

    def _state_of(self, fields: dict[str, str], folder: Path) -> WorkerState:
        state = fields.get("JobState", "")
        by_us = (folder / "terminated").exists()
        who = ""
        if state.startswith("CANCELLED") and not by_us:
            who = self._who_cancelled(fields["JobId"])
        return map_state(
            state,
            fields.get("ExitCode", ""),
            by_reconciler=by_us,
            warned=(folder / "warned").exists(),
            cancelled_by=who,
            reason=fields.get("Reason", ""),
        )

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
            detail = (
                "stopped by the reconciler"
                if by_us
                else (f"killed by signal {ended['signal']}; Slurm has forgotten the job, so who is unknown")
            )
            return WorkerState(WorkerPhase.PREEMPTED, 128 + int(ended["signal"]), "gone", detail)
        return WorkerState(
            WorkerPhase.LOST, None, "gone", f"Slurm has forgotten job {job_id} and it left no exit record"
        )

    # ---- the contract ---------------------------------------------------------------------------
    def observe(self) -> dict[WorkerRef, WorkerState]:
        jobs = self._controller_jobs()
        found: dict[WorkerRef, WorkerState] = {}
        for job_id, fields in jobs.items():
            labels = self._labels_of(fields)
            if labels is None:
                continue
            ref = WorkerRef(self.name, job_id, *labels)
            folder = self._folder(*labels)
            state = self._state_of(fields, folder)
            if state.phase not in (WorkerPhase.PENDING, WorkerPhase.RUNNING):
                self._finished[job_id] = state
                _forget_payload(folder)  # a job cancelled before it started never read its secrets
            found[ref] = state
        if not self.workers.is_dir():
            return found
        for folder in sorted(self.workers.iterdir()):
            entry = describe(str(folder))
            if not entry or entry["labels"].get("provider") != self.name or not entry.get("slurm_job_id"):
                continue
            job_id = entry["slurm_job_id"]
            if job_id in jobs:
                continue
            labels = entry["labels"]
            ref = WorkerRef(self.name, job_id, labels["job"], labels["run_id"], int(labels["epoch"]))
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
            f"--job-name=rc-{spec.job}",
            f"--comment={self.comment_prefix}{spec.job}:{spec.run_id}:{spec.epoch}",
            f"--output={folder / 'log'}",
            "--open-mode=append",
            "--no-requeue",
            f"--chdir={folder}",
            f"--cpus-per-task={spec.cpus}",
        ]  # fmt: skip
        if spec.memory_gb:
            argv.append(f"--mem={math.ceil(spec.memory_gb * 1024)}M")
        if spec.gpus:
            argv.append(f"--gres=gpu:{spec.gpus}")
        for flag, value in (("--partition", s.partition), ("--account", s.account), ("--qos", s.qos)):
            if value:
                argv.append(f"{flag}={value}")
        if s.time_limit:
            argv.append(f"--time={s.time_limit}")
            if s.signal_seconds:
                argv.append(f"--signal=B:USR1@{s.signal_seconds}")
        return [*argv, *s.sbatch_options, str(script)]

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        folder = self._folder(spec.job, spec.run_id, spec.epoch)
        known = (folder / "slurm_job_id").read_text().strip() if (folder / "slurm_job_id").exists() else ""
        if known:
            return WorkerRef(self.name, known, spec.job, spec.run_id, spec.epoch)
        for job_id, fields in self._controller_jobs().items():  # submitted, but the id was never written
            if self._labels_of(fields) == (spec.job, spec.run_id, spec.epoch):
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                (folder / "slurm_job_id").write_text(job_id)
                return WorkerRef(self.name, job_id, spec.job, spec.run_id, spec.epoch)
        self._write_agent()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        labels = {"provider": self.name, "job": spec.job, "run_id": spec.run_id, "epoch": spec.epoch}
        (folder / "labels.json").write_text(json.dumps({**labels, "created": time.time()}))
        payload = {
            "labels": labels,
            "command": list(spec.command),
            "env": dict(spec.env),
            "secret_env": dict(spec.secret_env),
            "cwd": spec.workdir,
            "grace": 3600,  # Slurm's KillWait decides how long a cancelled job may take
            "deadline_in": time_limit_seconds(self.settings.time_limit),
        }
        fd = os.open(folder / "payload.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh)
        script = folder / "batch.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"# reconciler worker: provider={self.name} job={spec.job} run_id={spec.run_id} "
            f"epoch={spec.epoch}\n"
            f"exec {shlex.quote(self.settings.python)} {shlex.quote(str(self.agent))} "
            f"run {shlex.quote(str(folder))}\n"
        )
        script.chmod(0o700)
        env = {k: v for k, v in os.environ.items() if k in SUBMIT_ENV or k.startswith("SLURM_")}
        proc = self._run(self._sbatch_argv(spec, folder, script), env=env)
        if proc.returncode != 0 or not proc.stdout.strip():
            shutil.rmtree(folder, ignore_errors=True)  # takes the secrets with it; a retry submits afresh
            message = "; ".join(
                line.replace("sbatch: error: ", "").strip()
                for line in (proc.stderr.strip() or proc.stdout.strip()).splitlines()
                if line.strip()
            )
            transient = any(
                w in message.lower() for w in ("unable to contact", "timed out", "try again", "busy")
            )
            text = f"slurm provider {self.name!r}: sbatch rejected the job ({message})"
            if transient:
                raise ProviderUnavailable(text + "; the controller should recover, will retry")
            raise ProviderConfigError(text + "; check partition, account, qos, time_limit and sbatch_options")
        job_id = proc.stdout.strip().split(";")[0]
        (folder / "slurm_job_id").write_text(job_id)
        return WorkerRef(self.name, job_id, spec.job, spec.run_id, spec.epoch)

    def _folder_of(self, ref: WorkerRef) -> Path:
        return self._folder(ref.job, ref.run_id, ref.epoch)

    def terminate(self, ref: WorkerRef) -> None:
        """scancel: Slurm sends SIGTERM, and SIGKILL after the cluster's KillWait."""
        folder = self._folder_of(ref)
        if folder.is_dir():
            (folder / "terminated").write_text(str(int(time.time())))
            _forget_payload(folder)
        proc = self._run(["scancel", ref.id])
        if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
            raise ProviderUnavailable(
                f"slurm provider {self.name!r}: scancel {ref.id} failed: {proc.stderr.strip()}"
            )

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        try:
            with open(self._folder_of(ref) / "log", errors="replace") as fh:
                return "".join(deque(fh, maxlen=tail)) if tail > 0 else ""
        except OSError:
            return ""

    def free_slots(self) -> int | None:
        """Slurm queues what it cannot run yet; the provider's `concurrency` is the limit that matters."""
        return None


def _forget_payload(folder: Path) -> None:
    """The payload holds secrets; once the job can no longer start, nothing should keep them."""
    try:
        (folder / "payload.json").unlink()
    except FileNotFoundError:
        pass
