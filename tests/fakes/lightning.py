"""A local server speaking Lightning AI's jobs REST API (the one `lightning-sdk`'s generated client calls).

Routes and JSON follow the SDK's OpenAPI models (lightning_sdk/lightning_cloud/openapi, 2026.10.13):
`POST/GET /v1/projects/{projectId}/jobs` (JobsServiceCreateJobBody -> V1Job; V1ListJobsResponse
{jobs, nextPageToken}), `GET .../jobs/find?name=`, `GET/PUT/DELETE .../jobs/{id}` (PUT takes
JobsServiceUpdateJobBody {"state": "stop"}), `GET .../jobs/{id}/page-logs` (V1JobLogsResponse
{pages: [V1JobLogsPage {pageNumber, url, totalLines, start, end}]}, each page's `url` a signed URL
answering a JSON array of entries {message, line, timestamp, severity, resource_id}, as the SDK's
`parse_log_entries` reads them) and `GET /v1/projects/{projectId}/billing/balance`
(V1GetProjectBalanceResponse {accountId, balance, balanceLimit, projectId}). Errors use the
grpc-gateway shape the API is generated from: {"code": <grpc code>, "message": ..., "details": []}.
Every /v1 request must carry the Authorization header Lightning's login rules produce.

Each job's `command` runs as a real local process (`machine.Machine`): `sh -c <command>` for an
image job, `bash -c "set -e; <command>"` for a Studio (cloudspaceId) job, with the machine's clean
environment plus the spec's env entries, `fromSecret` ones resolved from the teamspace's secrets
(`set_secret`); an image job on a `-slim` or `-alpine` image finds no git on its PATH (see
`_without_git`). States: pending (`pending_seconds`) -> running -> complete/fail (a short transient
while "collecting logs") -> completed (exit 0) / failed (non-zero; `message` says the code). A PUT
{"state": "stop"}: stopping -> SIGTERM to the machine's main process, `stop_grace` seconds, kill
-> stopped.

Faults, on demand (the parts of Lightning's behaviour its docs leave open are assumptions, marked):
- `interrupt(job_id, notice_seconds)`: an interruptible machine is reclaimed. With a notice the job
  shows `interruptionNoticeReceived: true` (and `...At`) for `notice_seconds`, then the machine
  disappears (every process killed at once). ASSUMPTION (Lightning's docs do not say, see
  docs/reference provider-apis §3.6): with `maxRunAttempts: 1` the job ends `failed` with a
  message naming the interruption; with attempts left it goes `restarting` and runs again.
- `set_balance(x)` / `price_per_hour`: credits are spent per second of running machines; at 0 every
  running job is stopped (as a PUT stop would) and ends `stopped` with a message about credits, and
  a create is refused (400, code 9, "insufficient balance").
- `out_of_capacity = True`: a create is refused with 400 {"code": 9 (FAILED_PRECONDITION),
  "message": "no capacity available for machine ..."} (ASSUMPTION: a plausible shape).
- `fail_next(method, path_regex, status, body=..., headers=..., count=...)`: any answer, e.g. 401,
  500, 429 with Retry-After, or 200 with garbage instead of JSON.
- `act_then_stall(seconds)`: the next create creates the job, then answers only after `seconds`
  (the client times out after the job exists).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import secrets as pysecrets
import shutil
import signal
import sys
import threading
import time
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.fakes import HostedKit, machine_kit, standalone
from tests.fakes.machine import Machine
from tests.fakes.server import FakeServer, Reply, Request

USER_ID, API_KEY = "fake-user-0001", "fake-api-key-5e1f"


def basic_header(user_id: str = USER_ID, api_key: str = API_KEY) -> str:
    return "Basic " + base64.b64encode(f"{user_id}:{api_key}".encode()).decode()


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    body: bytes
    headers: dict[str, str]
    count: int


@dataclass
class FakeJob:
    id: str
    name: str
    spec: dict[str, Any]
    created_at: float
    state: str = "pending"
    started_at: float | None = None
    stopped_at: float | None = None
    message: str = ""
    restart_count: int = 0
    notice_at: float | None = None
    kill_at: float | None = None  # the interruption takes the machine at this time
    stop_at: float | None = None  # the stop's grace ends at this time
    settle_at: float | None = None  # end of the transient complete/fail/stop state
    final: str = ""
    total_cost: float = 0.0
    machine: Machine | None = None
    attempt: int = 0
    billed_at: float | None = None

    def to_json(self, project_id: str) -> dict[str, Any]:
        spec = dict(self.spec, currentRunAttempt=max(1, self.attempt))
        data: dict[str, Any] = {
            "id": self.id, "name": self.name, "projectId": project_id, "userId": USER_ID, "state": self.state,
            "spec": spec, "createdAt": iso(self.created_at), "startedAt": iso(self.started_at),
            "stoppedAt": iso(self.stopped_at), "message": self.message, "restartCount": self.restart_count,
            "interruptionNoticeReceived": self.notice_at is not None,
            "interruptionNoticeReceivedAt": iso(self.notice_at), "totalCost": round(self.total_cost, 6),
            "isHealthy": self.state == "running", "tags": [],
        }
        return {k: v for k, v in data.items() if v is not None}


@dataclass(eq=False)
class FakeLightning(FakeServer):
    """The server; `url` is its base URL (settings.api_url). Thread-safe through one lock. It serves
    from its creation; `auth` is the Authorization header it accepts (default: `basic_header()`)."""

    tick_seconds = 0.05

    root: Path
    project_id: str = "proj-fake-01"
    _: KW_ONLY
    auth: str | None = None
    pending_seconds: float = 0.2
    stop_grace: float = 5.0
    collect_seconds: float = 0.2
    balance: float = 100.0
    price_per_hour: float = 0.36
    port: int = 0

    def __post_init__(self) -> None:
        self.auth = self.auth or basic_header()
        self.out_of_capacity = False
        self.secrets: dict[str, str] = {}
        self.jobs: dict[str, FakeJob] = {}
        self.requests: list[tuple[str, str, bytes]] = []  # method, path, body: for the tests' checks
        self.lock = threading.RLock()
        self._faults: list[Fault] = []
        self._stall: float = 0.0
        self._ids = itertools.count(1)
        self._sign_key = pysecrets.token_hex(8)
        self.start_serving(self.port)

    # ---- test controls ------------------------------------------------------------------------

    def set_secret(self, name: str, value: str) -> None:
        with self.lock:
            self.secrets[name] = value

    def set_balance(self, value: float) -> None:
        with self.lock:
            self.balance = value

    def fail_next(self, method: str, path: str, status: int, body: Any = None, headers: dict[str, str] | None = None,
                  count: int = 1) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(
            body if body is not None else {"code": 13, "message": f"injected HTTP {status}", "details": []}).encode()
        with self.lock:
            self._faults.append(Fault(method, re.compile(path), status, raw, headers or {}, count))

    def act_then_stall(self, seconds: float) -> None:
        with self.lock:
            self._stall = seconds

    def interrupt(self, job_id: str, notice_seconds: float = 0.0) -> None:
        """The interruptible machine is reclaimed, after a notice of `notice_seconds` (0: none)."""
        with self.lock:
            job = self.jobs[job_id]
            now = time.time()
            if notice_seconds > 0:
                job.notice_at = now
            job.kill_at = now + notice_seconds
        self.tick()

    def job_named(self, name: str) -> FakeJob | None:
        with self.lock:
            return next((j for j in self.jobs.values() if j.name == name), None)

    def close(self) -> None:
        self.stop_serving()
        with self.lock:
            machines = [j.machine for j in self.jobs.values() if j.machine is not None]
        for machine in machines:
            machine.kill_all()

    # ---- the jobs' lives ----------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            now = time.time()
            for job in self.jobs.values():
                self._advance(job, now)
            self._spend(now)

    def _advance(self, job: FakeJob, now: float) -> None:
        if job.state == "pending" and now >= job.created_at + self.pending_seconds:
            self._start(job, now)
        elif job.state in ("running", "restarting"):
            if job.kill_at is not None and now >= job.kill_at:
                self._reclaim(job, now)
            elif job.machine is not None and not job.machine.alive:
                code = job.machine.exit_code or 0
                self._settle(job, now, "completed" if code == 0 else "failed",
                             "" if code == 0 else f"The job's command exited with code {code}")
        elif job.state == "stopping":
            if job.machine is None or not job.machine.alive:
                self._settle(job, now, "stopped", job.message)
            elif job.stop_at is not None and now >= job.stop_at:
                job.machine.kill_all()
                self._settle(job, now, "stopped", job.message)
        elif job.settle_at is not None and now >= job.settle_at:
            job.state, job.settle_at = job.final, None

    def _start(self, job: FakeJob, now: float) -> None:
        job.attempt += 1
        job.state, job.started_at = "running", job.started_at or now
        folder = self.root / f"{job.name}.{job.attempt}"
        env = self._env(job.spec)
        if _without_git(job.spec.get("image")):
            env["PATH"] = str(_bare_bin(self.root))
        job.machine = Machine(folder, self._argv(job.spec), env)
        job.machine.start()

    @staticmethod
    def _argv(spec: dict[str, Any]) -> list[str]:
        if spec.get("cloudspaceId") and not spec.get("image"):
            return ["bash", "-c", "set -e\n" + spec["command"]]
        return ["sh", "-c", spec["command"]]

    def _env(self, spec: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for entry in spec.get("env") or []:
            if "fromSecret" in entry:
                if entry["fromSecret"] in self.secrets:
                    env[entry["name"]] = self.secrets[entry["fromSecret"]]
            else:
                env[entry["name"]] = str(entry.get("value", ""))
        return env

    def _reclaim(self, job: FakeJob, now: float) -> None:
        """ASSUMPTION (see the module docstring): the machine is gone; a job with attempts left
        restarts, otherwise it ends failed with a message naming the interruption."""
        if job.machine is not None:
            job.machine.kill_all()
        job.kill_at = None
        if job.attempt < int(job.spec.get("maxRunAttempts") or 1):
            job.restart_count += 1
            job.state = "restarting"
            job.notice_at = None
            self._start(job, now)
            job.state = "running"
            return
        self._settle(job, now, "failed", "The interruptible machine was reclaimed by the cloud provider "
                                         "(spot interruption)")

    def _settle(self, job: FakeJob, now: float, final: str, message: str) -> None:
        job.state = {"completed": "complete", "failed": "fail", "stopped": "stopped"}[final]
        job.final, job.message = final, message
        job.stopped_at = job.stopped_at or now
        job.settle_at = now + (self.collect_seconds if final != "stopped" else 0)
        if final == "stopped":
            job.state, job.settle_at = "stopped", None

    def _stop(self, job: FakeJob, message: str = "") -> None:
        if job.state == "pending":
            job.message = message
            self._settle(job, time.time(), "stopped", message)
        elif job.state in ("running", "restarting"):
            job.state, job.message, job.stop_at = "stopping", message, time.time() + self.stop_grace
            if job.machine is not None:
                job.machine.signal(signal.SIGTERM)

    def _spend(self, now: float) -> None:
        running = [j for j in self.jobs.values() if j.state in ("running", "restarting", "stopping")]
        for job in running:
            cost = (now - (job.billed_at or job.started_at or now)) * self.price_per_hour / 3600
            job.total_cost += cost
            self.balance -= cost
            job.billed_at = now
        if self.balance <= 0:
            self.balance = max(self.balance, 0.0)
            for job in running:
                if job.state != "stopping":
                    self._stop(job, "Job stopped: insufficient credits, the teamspace's balance reached 0")

    # ---- the API ------------------------------------------------------------------------------

    def respond(self, request: Request) -> Reply:
        return Reply(*self.handle(request.method, request.target, request.lower_headers(), request.body))

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, dict]:
        parsed = urlparse(raw_path)
        path, query = parsed.path, {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        with self.lock:
            self.requests.append((method, path, body))
            if path.startswith("/logs/"):
                return self._log_page(path, query)
            fault = self._fault(method, path)
            if fault is not None:
                return fault.status, fault.body, fault.headers
            if headers.get("authorization") != self.auth:
                return _error(401, 16, "unauthenticated: invalid or missing credentials")
            try:
                data = json.loads(body) if body else {}
            except ValueError:
                return _error(400, 3, "invalid JSON body")
            return self._route(method, path, query, data)

    def _fault(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if fault.method == method and fault.path.search(path) and fault.count > 0:
                fault.count -= 1
                return fault
        return None

    def _route(self, method: str, path: str, query: dict[str, str], data: Any) -> tuple[int, bytes, dict]:
        base = f"/v1/projects/{self.project_id}"
        if path == f"{base}/billing/balance" and method == "GET":
            return _ok({"accountId": "acct-fake", "balance": round(self.balance, 6), "balanceLimit": 0,
                        "projectId": self.project_id})
        if path == f"{base}/secrets" and method == "GET":
            # SecretServiceApi.secret_service_list_secrets (lightning_sdk/lightning_cloud/openapi/api/
            # secret_service_api.py): V1ListSecretsResponse {secrets: [V1Secret {id, name, projectId, type}]},
            # names only, never values; a generic secret is SECRET_TYPE_UNSPECIFIED (api/teamspace_api.py)
            listed = [{"id": f"sec-{i:03d}", "name": name, "projectId": self.project_id,
                       "type": "SECRET_TYPE_UNSPECIFIED"} for i, name in enumerate(sorted(self.secrets))]
            return _ok({"secrets": listed})
        if not path.startswith(f"{base}/jobs"):
            return _error(404, 5, f"no route for {method} {path}")
        rest = path[len(f"{base}/jobs"):].strip("/")
        if rest == "" and method == "POST":
            return self._create(data)
        if rest == "" and method == "GET":
            return self._list(query)
        if rest == "find" and method == "GET":
            job = self.job_named(query.get("name", ""))
            return _ok(job.to_json(self.project_id)) if job else _error(404, 5, "job not found")
        job_id, _, sub = rest.partition("/")
        job = self.jobs.get(job_id)
        if job is None:
            return _error(404, 5, f"job {job_id} not found")
        return self._on_job(method, job, sub, data)

    def _on_job(self, method: str, job: FakeJob, sub: str, data: Any) -> tuple[int, bytes, dict]:
        if sub == "page-logs" and method == "GET":
            return self._pages(job)
        if sub:
            return _error(404, 5, f"no route for {sub}")
        if method == "GET":
            return _ok(job.to_json(self.project_id))
        if method == "PUT":
            if data.get("state") == "stop":
                self._stop(job)
            return _ok(job.to_json(self.project_id))
        if method == "DELETE":
            self._stop(job)
            job.state = "deleted" if job.state == "stopped" else job.state
            return _ok({})
        return _error(405, 12, "method not allowed")

    def _create(self, data: Any) -> tuple[int, bytes, dict]:
        name, spec = data.get("name"), data.get("spec")
        if not isinstance(name, str) or not name or not isinstance(spec, dict) or not spec.get("command"):
            return _error(400, 3, "name and spec.command are required")
        if self.job_named(name) is not None:
            return _error(409, 6, f"a job named {name} already exists in this teamspace")
        if self.out_of_capacity:
            return _error(400, 9, f"no capacity available for machine {spec.get('instanceName')}"
                                  f"{' (interruptible)' if spec.get('spot') else ''}; try again later")
        if self.balance <= 0:
            return _error(400, 9, "insufficient balance to start a job")
        job = FakeJob(id=f"job-{next(self._ids):05d}-{pysecrets.token_hex(3)}", name=name, spec=spec,
                      created_at=time.time())
        self.jobs[job.id] = job
        answer = _ok(job.to_json(self.project_id))
        if self._stall:
            stall, self._stall = self._stall, 0.0
            self.lock.release()  # let the world go on while this answer is late
            try:
                time.sleep(stall)
            finally:
                self.lock.acquire()
        return answer

    def _list(self, query: dict[str, str]) -> tuple[int, bytes, dict]:
        jobs = sorted(self.jobs.values(), key=lambda j: j.created_at, reverse=True)
        limit = int(query.get("limit") or 50)
        start = int(query.get("pageToken") or 0)
        page = jobs[start:start + limit]
        token = str(start + limit) if start + limit < len(jobs) else ""
        return _ok({"jobs": [j.to_json(self.project_id) for j in page], "nextPageToken": token,
                    "previousPageToken": str(max(0, start - limit)) if start else ""})

    def _pages(self, job: FakeJob) -> tuple[int, bytes, dict]:
        if job.machine is None:
            return _ok({"pages": []})
        lines = job.machine.log_text().count("\n")
        sig = hashlib.sha256(f"{self._sign_key}:{job.id}".encode()).hexdigest()[:16]
        return _ok({"pages": [{"pageNumber": "0", "url": f"{self.url}/logs/{job.id}/0?signature={sig}",
                               "totalLines": str(lines), "start": iso(job.started_at),
                               "end": iso(job.stopped_at or time.time())}]})

    def _log_page(self, path: str, query: dict[str, str]) -> tuple[int, bytes, dict]:
        """A signed log page: no Authorization needed, the signature is."""
        parts = path.strip("/").split("/")
        job = self.jobs.get(parts[1]) if len(parts) == 3 else None
        sig = hashlib.sha256(f"{self._sign_key}:{parts[1] if len(parts) > 1 else ''}".encode()).hexdigest()[:16]
        if job is None or query.get("signature") != sig:
            return 403, b"<Error><Code>AccessDenied</Code></Error>", {"Content-Type": "application/xml"}
        text = job.machine.log_text() if job.machine else ""
        stamp = iso(time.time())
        entries = [{"message": line, "line": i + 1, "timestamp": stamp, "severity": "info", "resource_id": job.id}
                   for i, line in enumerate(text.splitlines())]
        return 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}


def _ok(data: Any) -> tuple[int, bytes, dict]:
    return 200, json.dumps(data).encode(), {"Content-Type": "application/json"}


def _error(status: int, code: int, message: str) -> tuple[int, bytes, dict]:
    return status, json.dumps({"code": code, "message": message, "details": []}).encode(), \
        {"Content-Type": "application/json"}


# ---- the adapter contract suite's kit ---------------------------------------------------------


def contract_kit(request: Any, workdir: Path) -> HostedKit:
    """A fake per test; adapters on it authenticate with LIGHTNING_API_KEY + LIGHTNING_USER_ID."""
    from adapters.lightning import LightningAdapter
    from desired.models import LightningSettings

    fake = FakeLightning(workdir / "lightning-machines", stop_grace=5.0)
    request.addfinalizer(fake.close)
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("LIGHTNING_USER_ID", USER_ID)
    monkeypatch.setenv("LIGHTNING_API_KEY", API_KEY)
    monkeypatch.delenv("LIGHTNING_AUTH_TOKEN", raising=False)
    settings = LightningSettings(api_url=fake.url, project_id=fake.project_id, machine="cpu-4",
                                 request_timeout_seconds=10)

    def make(owner: str = "repo-a") -> LightningAdapter:
        return LightningAdapter("lightning", settings, owner=owner)

    return machine_kit(make, lambda job_id: fake.jobs[job_id].machine, fake.set_secret, cancels=True)


def main() -> None:
    standalone(__doc__ or "", "/tmp/fake-lightning", lambda root, port: FakeLightning(root, port=port),
               lambda fake: f"project_id={fake.project_id} LIGHTNING_USER_ID={USER_ID} LIGHTNING_API_KEY={API_KEY}")


if __name__ == "__main__":
    main()


def _without_git(image: Any) -> bool:
    """Images that have no git: Docker Hub's `python` image documents its `-slim` and `-alpine`
    variants as holding only what Python needs (its "Image Variants"), while the full tag is built on
    `buildpack-deps`, which carries git. A job's machine for such an image finds no git on its PATH."""
    tag = str(image or "").rsplit(":", 1)[-1]
    return "slim" in tag or "alpine" in tag


def _bare_bin(root: Path) -> Path:
    """A PATH folder with what a slim Debian image has (a shell, coreutils, python3), no git."""
    folder = root / "bare-bin"
    if not folder.is_dir():
        folder.mkdir(parents=True)
        for name in SLIM_TOOLS:
            target = sys.executable if name.startswith("python") else shutil.which(name)
            if target:
                (folder / name).symlink_to(target)
    return folder


SLIM_TOOLS = ("sh", "bash", "python3", "python", "cat", "echo", "env", "false", "grep", "head", "id", "kill", "ls",
              "mkdir", "mktemp", "printf", "rm", "sed", "sleep", "tail", "test", "true")
