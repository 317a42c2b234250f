"""The `lightning` compute adapter: workers as Lightning AI jobs in one teamspace, paid from its credits.

Why it looks the way it does: Lightning's REST API (the one its `lightning-sdk` wraps, camelCase
JSON from a generated OpenAPI client) reports a job's state, cost and log pages, never an exit
code or a signal. So each job runs the generated bootstrap (adapters/hosted.py), which prints one
`reconciler-bootstrap: exit {...}` line; the adapter reads it from the job's log pages once the job
has ended. The job's secrets are teamspace secrets: the launch names them (`{name, fromSecret}`
env entries) and never carries a value (`secrets_at_provider`).

Labels: the job name is deterministic per (owner, job, run, epoch), `rc-<owner>-<job>-<run>-e<epoch>`
(cut and suffixed with a short hash past 63 characters), so a launch looks the name up first
(`GET .../jobs/find?name=`) and adopts what it finds, also after a create that timed out after
acting; a create answered 409 (the name exists after all) looks the name up again and adopts it
when the labels are ours, and is a configuration error otherwise. The labels themselves travel
in one plain env entry, RECONCILER_LABELS (JSON: owner, provider, job, run_id, epoch), read
back from each listed job's `spec.env`; the bootstrap passes only the attempt's own env to the
command, so the command never sees it. Lightning's `tags` are
workload-tag ids that must be created first, so they are not used for labels. Jobs of other owners
(or other providers) are counted in `foreign_workers`, never stopped or read.

State table (Lightning's `state` -> WorkerState; `provider_state` keeps Lightning's word):

| state                         | phase      | evidence                                               |
|-------------------------------|------------|--------------------------------------------------------|
| pending, creating             | pending    |                                                        |
| running                       | running    | `interruptionNoticeReceived`: provider_state "running  |
|                               |            | (interruption notice)", detail says the machine goes   |
| restarting                    | running    | see "Restarts" below                                   |
| stopping, stop, delete,       | running    | transient (Lightning collects logs/artifacts); pending |
|   complete, fail              |            | if the job never started                               |
| stopped, deleted              | preempted  | we asked (terminate): "stopped by the reconciler"      |
|                               | preempted  | credits ran out (`message` says credits/balance)       |
|                               | preempted  | an interruption (notice received, or `message` says    |
|                               |            | interrupted/preempted/spot)                            |
|                               | exited     | otherwise: signal from the exit record, else SIGTERM   |
|                               |            | ("stopped outside the reconciler")                     |
| completed                     | exited     | the exit record's code (0 when there is none)          |
| failed                        | exited     | the exit record's code/signal/reason; without one:     |
|                               | preempted  |   an interruption or credits (as above), else code 1   |
|                               |            |   with `message` as detail                             |
| gone from the list            | (absent)   | purged by someone; observe no longer reports it        |
| anything else                 | pending    | (as the SDK does)                                      |

Restarts: every launch sets `maxRunAttempts: 1` (a relaunch is the planner's decision, with a new
epoch). Should Lightning restart the machine anyway (`restarting`, `restartCount` > 0), the same
bootstrap runs again at the same epoch and resumes from the run's checkpoint; fencing keeps it
safe. It is reported RUNNING (provider_state "restarting", the detail says Lightning restarted it),
not PREEMPTED: a preempted report would make the planner start a second worker while the first
is still running and being billed.

Preemption on Lightning is not documented (what an interrupted interruptible job ends as depends
on `maxRunAttempts`, "UNCONFIRMED"); the adapter therefore trusts Lightning's own words
(`interruptionNoticeReceived`, `message`) and, failing those, reports the evidence (exit record,
signal) as for any other provider. A stop by the reconciler is remembered by this process only:
after a daemon restart such a job reads as stopped outside the reconciler (the planner knows it
asked). `cost(ref)` offers each job's `totalCost` (credits) from the last observe, for billing;
`allowance()` the teamspace's credit balance (`GET /v1/projects/{id}/billing/balance`).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from adapters import compute
from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from adapters.hosted import SECRETS_FROM_ENV, UNPACK_PY, Bootstrap, bootstrap_script, packed, parse_exit_record
from adapters.hosted_base import HostedAdapter, worker_name
from adapters.http import HostedApi, HttpRefused
from adapters.preflight import Check, fail, ok
from adapters.wire import MONEY_MAX, load_json
from desired.models import Capacity, LightningSettings

LABELS_ENV = "RECONCILER_LABELS"
DEFAULT_IMAGE = "python:3.11"
"""The image of a job that names none (nor a Studio): Docker's full `python` variant, built on
`buildpack-deps` and so carrying git, which a job whose code is `code.git` needs to fetch it. The
`-slim` variant (the former default) holds only what Python needs, no git (Docker Hub, the `python`
image's "Image Variants")."""
NAME_LIMIT = 63
CREDENTIALS_HINT = ("credentials are read from LIGHTNING_API_KEY and LIGHTNING_USER_ID (or LIGHTNING_AUTH_TOKEN), "
                    "or from ~/.lightning/credentials.json (LIGHTNING_CREDENTIAL_PATH)")
PENDING_STATES = frozenset({"pending", "creating"})
ENDING_STATES = frozenset({"stopping", "stop", "delete", "complete", "fail"})
STOPPED_STATES = frozenset({"stopped", "deleted"})
FINISHED_STATES = STOPPED_STATES | {"completed", "failed"}
CAPACITY_WORDS = re.compile(
    r"capacity|unavailable|no (available )?machines?|out of stock|insufficient (balance|credit)", re.I)
CREDIT_WORDS = re.compile(r"credit|balance|funds|billing", re.I)
INTERRUPT_WORDS = re.compile(r"interrupt|preempt|spot|reclaim", re.I)
# Machine slugs (lightning_sdk.machine.Machine): lit-<gpu>-<count>[-small], cpu-<n>, data-prep-*.
GPU_SLUG = re.compile(r"lit-(?P<model>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<count>\d+)(?:-small)?")
GPU_MODELS = {"t4": "T4", "l4": "L4", "l40s": "L40S", "a100": "A100", "h100": "H100", "h200": "H200",
              "b200": "B200", "rtx-6000-pro": "RTX-6000-PRO", "a10g": "A10G"}


def auth_header(environ: Mapping[str, str] | None = None) -> str:
    """Lightning's own rules (lightning_cloud/login.py): a JWT auth token => Bearer; an API key with
    a user id => Basic base64(user_id:api_key); an API key alone => Bearer. Env first, then the file."""
    env = os.environ if environ is None else environ
    creds = {"user_id": env.get("LIGHTNING_USER_ID"), "api_key": env.get("LIGHTNING_API_KEY"),
             "auth_token": env.get("LIGHTNING_AUTH_TOKEN")}
    if not (creds["api_key"] or creds["auth_token"]):
        creds = _credentials_file(env)
    if creds.get("auth_token"):
        return f"Bearer {creds['auth_token']}"
    if creds.get("api_key"):
        if creds.get("user_id"):
            token = base64.b64encode(f"{creds['user_id']}:{creds['api_key']}".encode()).decode()
            return f"Basic {token}"
        return f"Bearer {creds['api_key']}"
    raise ProviderConfigError(f"lightning: no credentials found; {CREDENTIALS_HINT}")


def _credentials_file(env: Mapping[str, str]) -> dict[str, Any]:
    path = Path(env.get("LIGHTNING_CREDENTIAL_PATH") or Path(env.get("HOME", "~")) / ".lightning" / "credentials.json")
    try:
        data = json.loads(path.expanduser().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def job_name(owner: str, job: str, run_id: str, epoch: int) -> str:
    """One name per worker, unique in the teamspace; cut with a short hash past NAME_LIMIT."""
    return worker_name(owner, job, run_id, epoch, NAME_LIMIT)


def shell_command(script: str) -> str:
    """The job's `command` (run by `sh -c`, or by bash with set -e in a Studio): the bootstrap,
    zlib-compressed and base64 in single quotes (no character of it can mean anything to a shell),
    decoded to a file by python3 and exec'd, so the bootstrap is the machine's main process and gets
    its signals. `packed` keeps it under Linux's 128 KiB limit on one argument (`sh -c <command>`)."""
    return (f"B='{packed(script)}'\nF=\"${{TMPDIR:-/tmp}}/reconciler-bootstrap-$$.py\"\n"
            f"printf %s \"$B\" | python3 -c '{UNPACK_PY}' > \"$F\" && exec python3 \"$F\"\n")


def machine_capacity(slug: str) -> Capacity | None:
    """What one machine offers, from its slug: lit-t4-1 = one T4, lit-a100-4 = four A100s, cpu-4 = 4 CPUs."""
    cpu = re.fullmatch(r"cpu-(\d+)", slug)
    if cpu:
        return Capacity(cpus=int(cpu.group(1)), gpus=0)
    gpu = GPU_SLUG.fullmatch(slug)
    if gpu and gpu.group("model") in GPU_MODELS:
        return Capacity(gpus=int(gpu.group("count")), gpu_models=[GPU_MODELS[gpu.group("model")]])
    return None


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value or value.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class LightningAdapter(HostedAdapter):
    """Jobs in one Lightning teamspace (`settings.project_id`); see the module docstring."""

    kind = "lightning"
    settings: LightningSettings

    def __init__(self, name: str, settings: LightningSettings, *, owner: str = compute.ANY_OWNER) -> None:
        super().__init__(name, settings, owner)
        self._stopped: set[str] = set()  # job ids this process asked to stop
        self._ended: dict[str, tuple[str, dict[str, Any] | None]] = {}  # job id -> (log text, exit record)
        self._costs: dict[str, float] = {}
        self._ours: dict[str, WorkerRef] = {}

    def connect(self) -> HostedApi:
        return self.client(self.base_url, auth_header(), CREDENTIALS_HINT)

    @property
    def base_url(self) -> str:
        """settings.api_url when the manifest sets it, else LIGHTNING_CLOUD_URL (the SDK's), else the default."""
        if "api_url" in self.settings.model_fields_set:
            return self.settings.api_url
        return os.environ.get("LIGHTNING_CLOUD_URL", "").rstrip("/") or self.settings.api_url

    def _path(self, rest: str = "") -> str:
        return f"/v1/projects/{self.settings.project_id}/jobs{rest}"

    # ---- launch -------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        self.launch_labels(spec)
        name = job_name(self.owner, spec.job, spec.run_id, spec.epoch)
        found = self._find(name, spec)
        if found is not None:
            return found
        try:
            created = self.api.call("POST", self._path(), json_body=self._create_body(name, spec), acts=True)
        except HttpRefused as exc:
            if exc.status == 409:  # the name exists after all (a create that acted late): adopt it
                found = self._find(name, spec)
                if found is not None:
                    return found
            raise self._refusal(exc) from None
        if not isinstance(created, dict) or not created.get("id"):
            raise ProviderUnavailable(f"{self.who}: the create answer carries no job id")
        return self._ref(created["id"], spec)

    def _find(self, name: str, spec: LaunchSpec) -> WorkerRef | None:
        """The job already launched with these labels (`GET .../jobs/find?name=`), if any."""
        found = self.api.call("GET", self._path("/find"), params={"name": name}, allow=(404,))
        if isinstance(found, dict) and found.get("id") and self._labels(found) == self.launch_labels(spec):
            return self._ref(found["id"], spec)
        return None

    def _refusal(self, exc: HttpRefused) -> Exception:
        """Out of capacity (or of credits) is the provider's state, not a configuration error; a name
        taken by a job that is not ours (409) waits for a person, and is said so."""
        if exc.status == 409:
            return ProviderConfigError(f"{self.who}: a job that does not carry our labels already has the name; "
                                       f"rename or delete it in the teamspace ({exc.detail})")
        if CAPACITY_WORDS.search(exc.detail):
            return ProviderUnavailable(f"{self.who} cannot start a {self.settings.machine} machine now: "
                                       f"{exc.detail or 'HTTP ' + str(exc.status)}")
        return exc

    def _ref(self, job_id: str, spec: LaunchSpec) -> WorkerRef:
        ref = WorkerRef(self.name, job_id, spec.job, spec.run_id, spec.epoch)
        self._ours[job_id] = ref
        return ref

    def _create_body(self, name: str, spec: LaunchSpec) -> dict[str, Any]:
        labels = self.launch_labels(spec)
        boot = Bootstrap(provider="lightning", secrets_source=SECRETS_FROM_ENV)
        script = bootstrap_script(spec, labels, boot, code_git=spec.code_git, code_ref=spec.code_ref)
        env = [{"name": LABELS_ENV, "value": json.dumps(labels, sort_keys=True)}]
        env += [{"name": k, "fromSecret": k} for k in sorted(spec.secret_env)]
        body: dict[str, Any] = {
            "command": shell_command(script),
            "env": env,
            "instanceName": self.settings.machine,
            "spot": self.settings.interruptible,
            "maxRunAttempts": 1,
        }
        image = spec.image or self.settings.image
        if image or not self.settings.cloudspace_id:
            body["image"] = image or DEFAULT_IMAGE
            body["entrypoint"] = "sh -c"
        else:
            body["cloudspaceId"] = self.settings.cloudspace_id
        return {"name": name, "spec": body}

    # ---- observe ------------------------------------------------------------------------------

    def observe(self) -> dict[WorkerRef, WorkerState]:
        out: dict[WorkerRef, WorkerState] = {}
        foreign = 0
        for job in self._list_jobs():
            labels = self._labels(job)
            if labels is None:
                continue
            ref = self._ref_of(job, labels)
            if ref is None:
                foreign += job.get("state") not in FINISHED_STATES
                continue
            self._ours[ref.id] = ref
            state = self._state(job)
            cost = self.numbers.number(job.get("totalCost"), "job totalCost", high=MONEY_MAX)
            if cost is not None:
                self._costs[ref.id] = cost
                state = replace(state, cost_usd=cost)  # Lightning's own bill, 1 credit = $1
            out[ref] = state
        self.foreign_workers = foreign
        seen = {ref.id for ref in out}
        self._ended = {k: v for k, v in self._ended.items() if k in seen}  # purged jobs' logs go too
        return out

    def _list_jobs(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = []
        token = ""
        for _ in range(100):
            params = {"limit": 100, **({"pageToken": token} if token else {})}
            page = self.api.call("GET", self._path(), params=params)
            if not isinstance(page, dict):
                raise ProviderUnavailable(f"{self.who}: the job list is not a JSON object")
            jobs += [j for j in page.get("jobs") or [] if isinstance(j, dict)]
            token = page.get("nextPageToken") or ""
            if not token:
                break
        return jobs

    @staticmethod
    def _labels(job: Mapping[str, Any]) -> dict[str, Any] | None:
        for entry in (job.get("spec") or {}).get("env") or []:
            if isinstance(entry, dict) and entry.get("name") == LABELS_ENV:
                try:
                    labels = load_json(entry.get("value") or "")
                except ValueError:
                    return None
                return labels if isinstance(labels, dict) else None
        return None

    def _ref_of(self, job: Mapping[str, Any], labels: Mapping[str, Any]) -> WorkerRef | None:
        """Our ref for a listed job, or None when another owner (or another provider) launched it."""
        if labels.get("provider") != self.name or not self.owns(labels.get("owner")):
            return None
        try:
            return WorkerRef(self.name, str(job["id"]), str(labels["job"]), str(labels["run_id"]), int(labels["epoch"]))
        except (KeyError, TypeError, ValueError):
            return None

    def _state(self, job: Mapping[str, Any]) -> WorkerState:
        state = str(job.get("state") or "")
        if state == "running" or state == "restarting" or (state in ENDING_STATES and job.get("startedAt")):
            return self._running(job, state)
        if state not in FINISHED_STATES:
            return WorkerState(WorkerPhase.PENDING, provider_state=state or "pending")
        return self._finished(job, state)

    def _running(self, job: Mapping[str, Any], state: str) -> WorkerState:
        restarts = self.numbers.count(job.get("restartCount") or 0, "job restartCount") or 0
        if state == "restarting" or (state == "running" and restarts > 0):
            return WorkerState(WorkerPhase.RUNNING, provider_state=state, detail=(
                f"Lightning restarted the machine after an interruption (restart {job.get('restartCount') or 1}); "
                "the worker resumes from its checkpoint at the same epoch"))
        if state == "running" and job.get("interruptionNoticeReceived"):
            return WorkerState(WorkerPhase.RUNNING, provider_state="running (interruption notice)",
                               detail="Lightning announced that the interruptible machine will be taken away",
                               notice="Lightning announced that the interruptible machine will be taken away")
        return WorkerState(WorkerPhase.RUNNING, provider_state=state)

    def _finished(self, job: Mapping[str, Any], state: str) -> WorkerState:
        job_id = str(job["id"])
        record = self._exit_record(job_id)
        message = str(job.get("message") or "")
        ended = _timestamp(job.get("stoppedAt"))
        said = f"{state}: {message}" if message else state
        if state in STOPPED_STATES and job_id in self._stopped:
            signal = (record or {}).get("signal")
            return WorkerState(WorkerPhase.PREEMPTED, (record or {}).get("code"), said, "stopped by the reconciler",
                               signal=signal, ended_at=ended)
        taken = self._taken_away(job, message, record, state)
        if taken:
            return WorkerState(WorkerPhase.PREEMPTED, None, said, taken, ended_at=ended)
        if state == "completed":
            return WorkerState(WorkerPhase.EXITED, int((record or {}).get("code", 0)), said, ended_at=ended)
        if record is not None:
            return self._from_record(record, said, state, ended)
        if state in STOPPED_STATES:
            return WorkerState(WorkerPhase.EXITED, 128 + 15, said, "stopped outside the reconciler",
                               signal="SIGTERM", ended_at=ended)
        return WorkerState(WorkerPhase.EXITED, 1, said, message or "failed with no exit record", ended_at=ended)

    @staticmethod
    def _taken_away(job: Mapping[str, Any], message: str, record: dict[str, Any] | None, state: str) -> str:
        """Why Lightning took the machine (credits, an interruption), or '' when it did not say so.
        A bootstrap that finished by itself (its exit record without a signal) was not taken away."""
        if record is not None and not record.get("signal") and state not in STOPPED_STATES:
            return ""
        if CREDIT_WORDS.search(message):
            return f"the teamspace's credits ran out ({message})"
        if job.get("interruptionNoticeReceived") or INTERRUPT_WORDS.search(message):
            return "Lightning interrupted the interruptible machine" + (f" ({message})" if message else "")
        return ""

    @staticmethod
    def _from_record(record: dict[str, Any], said: str, state: str, ended: float | None) -> WorkerState:
        code = record.get("code")
        code = int(code) if isinstance(code, int) else 1
        signal = record.get("signal") if isinstance(record.get("signal"), str) else None
        detail = str(record.get("reason") or "")
        if signal:
            by = "stopped outside the reconciler" if state in STOPPED_STATES else "killed outside the reconciler"
            detail = f"{by} ({signal})" + (f"; {detail}" if detail else "")
        return WorkerState(WorkerPhase.EXITED, code, said, detail, signal=signal, ended_at=ended)

    def _exit_record(self, job_id: str) -> dict[str, Any] | None:
        """The bootstrap's exit record, read once per ended job (its logs do not change any more)."""
        if job_id not in self._ended:
            text = self._log_text(job_id)
            self._ended[job_id] = (text, parse_exit_record(text))
        return self._ended[job_id][1]

    # ---- stop, logs, money --------------------------------------------------------------------

    def terminate(self, ref: WorkerRef) -> None:
        """PUT state "stop" (Lightning sends SIGTERM, then kills); only for our own jobs, quiet when
        the job is gone or already ended."""
        if not self._is_ours(ref):
            return
        self._stopped.add(ref.id)
        job = self.api.call("GET", self._path(f"/{ref.id}"), allow=(404,))
        if not isinstance(job, dict) or job.get("state") in FINISHED_STATES | ENDING_STATES:
            return
        try:
            self.api.call("PUT", self._path(f"/{ref.id}"), json_body={"state": "stop"}, allow=(404,))
        except HttpRefused as exc:
            if exc.status not in (400, 409):  # already stopping or ended meanwhile
                raise

    def _is_ours(self, ref: WorkerRef) -> bool:
        if ref.provider != self.name:
            return False
        if self.operator or self._ours.get(ref.id) == ref:
            return True
        job = self.api.call("GET", self._path(f"/{ref.id}"), allow=(404,))
        labels = self._labels(job) if isinstance(job, dict) else None
        return labels is not None and self._ref_of(job, labels) == ref

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        if tail <= 0 or not self._is_ours(ref):
            return ""
        text = self._ended[ref.id][0] if ref.id in self._ended else self._log_text(ref.id)
        lines = text.splitlines()[-tail:]
        return "\n".join(lines) + ("\n" if lines else "")

    def _log_text(self, job_id: str) -> str:
        """The job's log lines: `page-logs` lists pages, each page a JSON array of entries {message, ...}
        at its (usually signed) URL."""
        listing = self.api.call("GET", self._path(f"/{job_id}/page-logs"), allow=(404,))
        pages = listing.get("pages") if isinstance(listing, dict) else None
        lines: list[str] = []
        for page in pages or []:
            url = page.get("url") if isinstance(page, dict) else None
            if url:
                lines += self._page_lines(url)
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def _page_lines(self, url: str) -> list[str]:
        if not urlparse(url).netloc:
            body = self.api.call("GET", "/" + url.lstrip("/"))
        else:  # a signed URL: fetched without our credentials, which must not leave for another host
            body = self.api.get_signed(url, "log page") or []
        entries = body if isinstance(body, list) else [body]
        return [str(e.get("message") or "") if isinstance(e, dict) else str(e) for e in entries if e is not None]

    def cost(self, ref: WorkerRef) -> float | None:
        """The job's `totalCost` in credits, as of the last observe; None when not known."""
        return self._costs.get(ref.id)

    def allowance(self) -> compute.Allowance:
        """The teamspace's credit balance: `GET /v1/projects/{projectId}/billing/balance`."""
        answer = self.api.call("GET", f"/v1/projects/{self.settings.project_id}/billing/balance")
        balance = self.numbers.number(answer.get("balance") if isinstance(answer, dict) else None,
                                      "balance", low=-MONEY_MAX, high=MONEY_MAX)
        if balance is None:
            raise ProviderUnavailable(f"{self.who}: the balance answer carries no balance")
        return compute.Allowance(unit="credits", remaining=balance, minimum=self.settings.min_credits,
                         applies_to_cpu=True)

    def capacity(self) -> Capacity | None:
        return machine_capacity(self.settings.machine)

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        """`reconciler doctor`: the teamspace has a secret of each name a job's env refers to
        (`GET /v1/projects/{projectId}/secrets`, the SDK's secret_service_list_secrets: names only)."""
        wanted = [s for s in specs if s.secret_env]
        if not wanted:
            return []
        answer = self.api.call("GET", f"/v1/projects/{self.settings.project_id}/secrets")
        rows = answer.get("secrets") if isinstance(answer, dict) else None
        have = {r.get("name") for r in rows or [] if isinstance(r, dict)}
        checks = []
        for spec in wanted:
            missing = sorted(set(spec.secret_env) - have)
            what = f"secrets of {spec.job}"
            if missing:
                checks.append(fail(self.name, what, f"the teamspace has no secret named {', '.join(missing)}",
                                   f"add {', '.join(missing)} to the teamspace's secrets (lightning.ai: "
                                   "Teamspace settings -> Secrets)"))
            else:
                checks.append(ok(self.name, what, f"{', '.join(sorted(spec.secret_env))} are teamspace secrets"))
        return checks

