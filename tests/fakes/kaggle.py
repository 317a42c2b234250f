"""A fake Kaggle API on 127.0.0.1: the RPC routes of shared/reference/provider-apis.md §1, run for real.

`POST {url}[/api]/v1/kernels.KernelsApiService/{Method}` with camelCase JSON, defaults left out
(a queued kernel's status has no `status` key), the auth header checked (Bearer token or HTTP
Basic username:key), errors as `{"code": n, "message": ...}` with that HTTP status, and a push
error as HTTP 200 with an `error` field, as Kaggle does. Methods: SaveKernel, GetKernel,
ListKernels, GetKernelSessionStatus, ListKernelSessionOutput, GetAcceleratorQuotaStatistics, and
security.OAuthService/IntrospectToken. The optional `/api` prefix lets kagglesdk's TEST environment
(which puts `/api` before `/v1`) talk to it.

Each pushed kernel's `text` runs as a real local process (`machine.Machine`) after the queue
delay, with the variables a Kaggle batch kernel has (KAGGLE_KERNEL_RUN_TYPE=Batch, KAGGLE_URL_BASE,
KAGGLE_USER_SECRETS_TOKEN) and a `kaggle_secrets` module on its PYTHONPATH that fetches user
secrets from `POST {KAGGLE_URL_BASE}/requests/GetUserSecretByLabelRequest`, as Kaggle's own does.
The session limit (the push's sessionTimeoutSeconds, or a shorter one set here) kills the machine
and reports ERROR with a session-limit message.

Versions: a push to a slug that exists makes a new version of that kernel (its title kept) and
starts running it, replacing the previous version's run if it was still going; the kernel's source,
status and log are then the new version's. Secrets: `secrets` are the user's, at account level; a
kernel sees only those attached to it (`attach(slug, name)`, what a person does in the editor), and
an attachment lasts across the kernel's versions, as Kaggle documents for notebooks.

Faults on demand: `queue_delay`, `session_limit`, `max_gpu_sessions` (push answered HTTP 200 with
"Maximum batch GPU session count of N reached"), `lag_status(n)`, `lag_versions(n)` (status and
log still the previous version's after a push), `push_error(msg)`,
`fail_next(method, status=500|429, retry_after=, garbage=)`, `push_timeout(seconds)` (creates the
kernel, then answers late), `set_quota` / `exhaust_quota` / `refresh_quota` (GPU time used grows
with running GPU kernels' time). Standalone: `python -m tests.fakes.kaggle --port N`.
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets as random_tokens
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.fakes import serve_until_interrupted
from tests.fakes.machine import Machine
from tests.fakes.server import FakeServer, Reply, Request, json_reply, raw_reply

SERVICE = "kernels.KernelsApiService"
# Kaggle's failureMessage when a session reaches its limit, as a user's script that reads Kaggle's
# answers compares it (github.com/xhluca/bm25-benchmarks, analysis/download_results.py).
SESSION_MESSAGE = "Your notebook was stopped because it exceeded the max allowed execution duration."

SHIM = '''"""kaggle_secrets as a Kaggle batch kernel has it (Kaggle/docker-python patches/kaggle_secrets.py),
reduced to get_secret: POST {KAGGLE_URL_BASE}/requests/GetUserSecretByLabelRequest with the JWT."""
import json
import os
import urllib.request


class BackendError(Exception):
    pass


class UserSecretsClient:
    GET_USER_SECRET_BY_LABEL_ENDPOINT = "/requests/GetUserSecretByLabelRequest"

    def __init__(self):
        self.url_base = os.environ.get("KAGGLE_URL_BASE", "https://www.kaggle.com")
        self.jwt_token = os.environ["KAGGLE_USER_SECRETS_TOKEN"]

    def get_secret(self, label):
        body = json.dumps({"Label": label, "JWE": self.jwt_token}).encode()
        request = urllib.request.Request(self.url_base + self.GET_USER_SECRET_BY_LABEL_ENDPOINT, data=body, headers={
            "Content-type": "application/json", "X-Kaggle-Authorization": "Bearer " + self.jwt_token})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        if not answer.get("wasSuccessful") or "secret" not in (answer.get("result") or {}):
            raise BackendError("Unexpected response from the service: " + json.dumps(answer))
        return answer["result"]["secret"]
'''


def compact(value: Any) -> Any:
    """Proto3 JSON: fields equal to their default (None, "", 0, False, [], {}) are left out."""
    if isinstance(value, dict):
        out = {k: compact(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, "", 0, False, [], {})}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class FakeKernel:
    user: str
    slug: str
    title: str
    text: str
    request: dict[str, Any]
    folder: Path
    pushed_at: float
    version: int = 1
    machine: Machine | None = None
    secrets_token: str = field(default_factory=lambda: random_tokens.token_hex(16))
    session_killed: bool = False
    cancelled: bool = False
    reported: dict[str, Any] | None = None  # the last status answer (for the status lag fault)
    previous: FakeKernel | None = None  # the version this one replaced (for the version lag fault)
    lagging: bool = False  # the last status answered was the previous version's

    @property
    def gpu(self) -> bool:
        return bool(self.request.get("machineShape"))

    @property
    def running(self) -> bool:
        return self.machine is not None and self.machine.alive

    @property
    def live(self) -> bool:
        return self.machine is None or self.machine.alive

    def run_seconds(self, since: float) -> float:
        m = self.machine
        if m is None or m.started_at is None:
            return 0.0
        end = m.ended_at if m.ended_at is not None else time.time()
        return max(0.0, end - max(since, m.started_at))


@dataclass
class Fault:
    method: str | None  # None: any RPC
    status: int = 500
    retry_after: str | None = None
    garbage: bool = False
    times: int = 1


class RpcError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class FakeKaggle(FakeServer):
    """The fake service; `start()` serves on 127.0.0.1, `url` is its base, `stop()` ends every kernel."""

    http_methods = ("POST",)
    protocol_version = "HTTP/1.1"

    def __init__(self, workdir: Path, *, username: str = "fakeuser", token: str | None = None,
                 key: str | None = None, port: int = 0) -> None:
        self.workdir = Path(workdir)
        self.username = username
        self.token = token or "kt-" + random_tokens.token_hex(12)
        self.key = key or random_tokens.token_hex(16)
        self.port = port
        self.kernels: dict[str, FakeKernel] = {}
        self.secrets: dict[str, str] = {}  # the user's secrets (account level)
        self.attached: dict[str, set[str]] = {}  # kernel slug -> names of the secrets attached to it
        self.calls: list[str] = []  # RPC method names, in order
        # every RPC answered 200: (service, method, request body, answer as sent), for the
        # conformance test that reads both with kagglesdk's own types
        self.exchanges: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
        self.pushes = 0
        self.queue_delay = 0.0
        self.session_limit: float | None = None  # seconds; the push's sessionTimeoutSeconds otherwise
        self.max_gpu_sessions: int | None = None
        self.quota_total = 30 * 3600.0
        self.quota_used_base = 0.0
        self.quota_since = time.time()
        self.quota_refresh_at = time.time() + 7 * 86400
        self._status_lag = 0
        self._version_lag = 0
        self._push_error: str | None = None
        self._push_delay = 0.0
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self._shim = self.workdir / "kaggle-shim"

    # ---- life -----------------------------------------------------------------------------------
    def start(self) -> FakeKaggle:
        self._shim.mkdir(parents=True, exist_ok=True)
        (self._shim / "kaggle_secrets.py").write_text(SHIM)
        self.start_serving(self.port)
        return self

    def stop(self) -> None:
        self.stop_serving()
        for kernel in list(self.kernels.values()):
            if kernel.machine is not None:
                kernel.machine.kill_all()

    def tick(self) -> None:
        self.advance()

    def advance(self) -> None:
        """Start kernels whose queue time is over; end sessions that ran past their limit."""
        with self._lock:
            for kernel in self.kernels.values():
                if kernel.machine is None and time.time() >= kernel.pushed_at + self.queue_delay:
                    self._start(kernel)
                elif kernel.running and self._over_session(kernel):
                    kernel.session_killed = True
                    assert kernel.machine is not None
                    kernel.machine.kill_all()

    def _session_seconds(self, kernel: FakeKernel) -> float | None:
        asked = kernel.request.get("sessionTimeoutSeconds")
        limits = [float(v) for v in (asked, self.session_limit) if v]
        return min(limits) if limits else None

    def _over_session(self, kernel: FakeKernel) -> bool:
        limit = self._session_seconds(kernel)
        m = kernel.machine
        return limit is not None and m is not None and m.started_at is not None and time.time() - m.started_at > limit

    def _start(self, kernel: FakeKernel) -> None:
        kernel.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        script = kernel.folder / "__script__.py"
        script.write_text(kernel.text)
        env = {"KAGGLE_KERNEL_RUN_TYPE": "Batch", "KAGGLE_URL_BASE": self.url,
               "KAGGLE_USER_SECRETS_TOKEN": kernel.secrets_token, "PYTHONPATH": str(self._shim)}
        kernel.machine = Machine(kernel.folder / "machine", [sys.executable, "-u", str(script)], env)
        kernel.machine.start()

    # ---- faults -----------------------------------------------------------------------------
    def lag_status(self, calls: int) -> None:
        """The next `calls` status answers repeat each kernel's previous answer."""
        self._status_lag = calls

    def lag_versions(self, calls: int) -> None:
        """The next `calls` status answers of a kernel with a newer version are still the previous
        version's, and so is its log meanwhile (a service slow to switch to the new version)."""
        self._version_lag = calls

    def push_error(self, message: str) -> None:
        """The next push is answered HTTP 200 with `error`, creating nothing."""
        self._push_error = message

    def push_timeout(self, seconds: float) -> None:
        """The next push creates the kernel, then answers only after `seconds`."""
        self._push_delay = seconds

    def fail_next(self, method: str | None = None, status: int = 500, *, retry_after: str | None = None,
                  garbage: bool = False, times: int = 1) -> None:
        self._faults.append(Fault(method, status, retry_after, garbage, times))

    def set_quota(self, total_hours: float, used_hours: float = 0.0) -> None:
        with self._lock:
            self.quota_total, self.quota_used_base = total_hours * 3600, used_hours * 3600
            self.quota_since = time.time()

    def exhaust_quota(self) -> None:
        self.set_quota(self.quota_total / 3600, self.quota_total / 3600)

    def refresh_quota(self) -> None:
        """The weekly refill: nothing used, the next refill a week away."""
        self.set_quota(self.quota_total / 3600, 0.0)
        self.quota_refresh_at = time.time() + 7 * 86400

    def quota_used(self) -> float:
        with self._lock:
            return self.quota_used_base + sum(k.run_seconds(self.quota_since) for k in self.kernels.values() if k.gpu)

    def kill_command(self, ref_id: str) -> bool:
        """Someone kills the kernel's command on the machine (SIGKILL), not the bootstrap."""
        kernel = self.kernels.get(ref_id.rsplit("/", 1)[-1])
        return kernel is not None and kernel.machine is not None and kernel.machine.kill_command()

    def attach(self, slug: str, *names: str) -> None:
        """A person attaches user secrets to a kernel in the editor (the kernel may not exist yet)."""
        with self._lock:
            self.attached.setdefault(slug, set()).update(names)

    def versions(self, slug: str) -> int:
        kernel = self.kernels.get(slug)
        return 0 if kernel is None else kernel.version

    # ---- the RPCs ---------------------------------------------------------------------------
    def authorized(self, header: str) -> bool:
        basic = base64.b64encode(f"{self.username}:{self.key}".encode()).decode()
        return header in (f"Bearer {self.token}", f"Basic {basic}")

    def take_fault(self, method: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method in (None, method) and fault.times > 0:
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def rpc(self, service: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(method)
        if service == "security.OAuthService" and method == "IntrospectToken":
            ok = body.get("token") == self.token
            return {"active": ok, "username": self.username if ok else ""}
        handler = getattr(self, f"rpc_{method}", None)
        if service != SERVICE or handler is None:
            raise RpcError(404, f"No such method {service}/{method}")
        with self._lock:
            self.advance()
            result: dict[str, Any] = handler(body)
            return result

    def _kernel(self, body: dict[str, Any]) -> FakeKernel:
        kernel = self.kernels.get(str(body.get("kernelSlug", "")))
        if kernel is None or body.get("userName") != kernel.user:
            # Kaggle answers 403, not 404, for a kernel the caller cannot see, one that does not
            # exist among them, so that names cannot be probed (a Kaggle maintainer in
            # github.com/Kaggle/kaggle-cli/issues/548; the message is the form quoted there).
            raise RpcError(403, "Permission 'kernels.get' was denied")
        return kernel

    def rpc_SaveKernel(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._push_error:
            error, self._push_error = self._push_error, None
            return {"error": error}
        user, _, slug = str(body.get("slug", "")).rpartition("/")
        if (user or self.username) != self.username or not slug:
            return {"error": "You do not have permission to push to this notebook"}
        if not body.get("text") or body.get("language") != "python" or body.get("kernelType") != "script":
            return {"error": "A kernel needs text, language python and kernelType script"}
        live_gpu = sum(1 for k in self.kernels.values() if k.gpu and k.live)
        if body.get("machineShape") and self.max_gpu_sessions is not None and live_gpu >= self.max_gpu_sessions:
            return {"error": f"Maximum batch GPU session count of {self.max_gpu_sessions} reached"}
        old = self.kernels.get(slug)
        if old is None and len(str(body.get("newTitle") or "")) < 5:
            return {"error": "Notebook title must be at least 5 characters"}
        if old is not None and old.machine is not None:
            old.machine.kill_all()  # a new version replaces the run
        self.pushes += 1
        version = 1 if old is None else old.version + 1
        title = old.title if old is not None else str(body.get("newTitle") or slug)
        kernel = FakeKernel(self.username, slug, title, str(body["text"]), dict(body),
                            self.workdir / "kernels" / f"{slug}-v{version}", time.time(), version, previous=old)
        self.kernels[slug] = kernel
        ref = f"{self.username}/{slug}"
        return {"ref": f"/code/{ref}", "url": f"{self.url}/code/{ref}", "versionNumber": version,
                "kernelId": 1000 + len(self.kernels)}

    def rpc_GetKernel(self, body: dict[str, Any]) -> dict[str, Any]:
        kernel = self._kernel(body)
        return {"metadata": self._metadata(kernel),
                "blob": {"source": kernel.text, "language": "python", "kernelType": "script", "slug": kernel.slug}}

    def _metadata(self, kernel: FakeKernel) -> dict[str, Any]:
        started = kernel.machine.started_at if kernel.machine and kernel.machine.started_at else kernel.pushed_at
        return {"id": 1000 + list(self.kernels).index(kernel.slug), "ref": f"{kernel.user}/{kernel.slug}",
                "title": kernel.title, "author": kernel.user, "slug": kernel.slug, "lastRunTime": iso(started),
                "language": "python", "kernelType": "script", "isPrivate": True,
                "enableGpu": kernel.gpu, "machineShape": kernel.request.get("machineShape"),
                "currentVersionNumber": kernel.version}

    def rpc_ListKernels(self, body: dict[str, Any]) -> dict[str, Any]:
        mine = [k for k in self.kernels.values() if body.get("group") == "PROFILE" or body.get("user") == k.user]
        search = str(body.get("search") or "")
        mine = [k for k in mine if search in k.slug or search in k.title]
        mine.sort(key=lambda k: k.pushed_at, reverse=True)
        start = int(body.get("pageToken") or 0)
        size = int(body.get("pageSize") or 20)
        page = mine[start:start + size]
        more = start + size < len(mine)
        return {"kernels": [self._metadata(k) for k in page], "nextPageToken": str(start + size) if more else ""}

    def rpc_GetKernelSessionStatus(self, body: dict[str, Any]) -> dict[str, Any]:
        kernel = self._kernel(body)
        kernel.lagging = self._version_lag > 0 and kernel.previous is not None
        if kernel.lagging and kernel.previous is not None:
            self._version_lag -= 1
            return self._status(kernel.previous)
        if self._status_lag > 0 and kernel.reported is not None:
            self._status_lag -= 1
            return kernel.reported
        kernel.reported = self._status(kernel)
        return kernel.reported

    def _status(self, kernel: FakeKernel) -> dict[str, Any]:
        m = kernel.machine
        if m is None:
            return {}  # QUEUED is the default, so Kaggle leaves `status` out
        code = m.exit_code
        if code is None:
            return {"status": "RUNNING"}
        if kernel.session_killed:
            return {"status": "ERROR", "failureMessage": SESSION_MESSAGE}
        if code == 0:
            return {"status": "COMPLETE"}
        return {"status": "ERROR", "failureMessage": f"Kernel run failed: the process exited with code {code}"}

    def rpc_ListKernelSessionOutput(self, body: dict[str, Any]) -> dict[str, Any]:
        """The version's output files, a page at a time (`pageSize`, default 20 as the CLI asks,
        `pageToken` -> `nextPageToken`), and its log whole on the first page only: the page token
        pages the files (kagglesdk ApiListKernelSessionOutputResponse; kaggle-cli's `kernels output`
        follows it for files and writes the log of the first page, its `kernels logs` reads one page)."""
        kernel = self._kernel(body)
        if kernel.lagging and kernel.previous is not None:
            kernel = kernel.previous
        m = kernel.machine
        if m is None:
            return {}
        start, size = int(body.get("pageToken") or 0), int(body.get("pageSize") or 20)
        names = self.output_files(kernel)
        files = [{"url": f"{self.url}/kf/{kernel.slug}/v{kernel.version}/{name}", "fileName": name}
                 for name in names[start:start + size]]
        answer: dict[str, Any] = {"files": files}
        if start + size < len(names):
            answer["nextPageToken"] = str(start + size)
        if not body.get("pageToken"):
            began = m.started_at or time.time()
            entries = [{"stream_name": "stdout", "time": round(time.time() - began, 3), "data": line}
                       for line in m.log_text().splitlines(keepends=True)]
            answer["log"] = json.dumps(entries)
        return answer

    @staticmethod
    def output_files(kernel: FakeKernel) -> list[str]:
        """What the version left in its working folder (Kaggle's /kaggle/working), as relative
        paths; the machine's own log and temporary folder are not output."""
        if kernel.machine is None or not kernel.machine.folder.is_dir():
            return []
        root = kernel.machine.folder
        return sorted(str(f.relative_to(root)) for f in root.rglob("*")
                      if f.is_file() and f != kernel.machine.log_path and root / "tmp" not in f.parents)

    def rpc_GetAcceleratorQuotaStatistics(self, body: dict[str, Any]) -> dict[str, Any]:
        used = min(self.quota_used(), max(self.quota_total, self.quota_used_base))
        gpu = {"timeUsed": f"{int(used)}s", "totalTimeAllowed": f"{int(self.quota_total)}s", "timeReserved": "0s",
               "hasEverRun": used > 0}
        return {"quotaRefreshTime": iso(self.quota_refresh_at), "gpuQuota": gpu,
                "tpuQuota": {"totalTimeAllowed": f"{20 * 3600}s"}}

    def user_secret(self, token: str, label: str) -> dict[str, Any]:
        """Kaggle's secrets endpoint: the kernel's JWT picks the kernel (and its user); the label
        picks the secret, which must be attached to that kernel."""
        kernel = next((k for k in self.kernels.values() if k.secrets_token == token), None)
        if kernel is None:
            return {"wasSuccessful": False, "errors": ["Unauthorized"]}
        if label not in self.secrets or label not in self.attached.get(kernel.slug, set()):
            return {"wasSuccessful": False, "errors": [f"No user secret with label {label} attached to this notebook"]}
        return {"wasSuccessful": True, "result": {"secret": self.secrets[label]}}


    # ---- HTTP -------------------------------------------------------------------------------
    def respond(self, request: Request) -> Reply:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return json_reply(400, {"code": 400, "message": "Request body is not JSON"})
        path = request.path.removeprefix("/api")
        if path == "/requests/GetUserSecretByLabelRequest":
            token = str(request.headers.get("X-Kaggle-Authorization", "")).removeprefix("Bearer ")
            return json_reply(200, self.user_secret(token, str(body.get("Label", ""))))
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "v1":
            return json_reply(404, {"code": 404, "message": f"No route {path}"})
        if not self.authorized(str(request.headers.get("Authorization", ""))):
            return json_reply(401, {"code": 401, "message": "Unauthenticated: invalid credentials"})
        fault = self.take_fault(parts[2])
        if fault is not None:
            return _fault_reply(fault)
        body = body if isinstance(body, dict) else {}
        try:
            answer = self.rpc(parts[1], parts[2], body)
        except RpcError as exc:
            return json_reply(exc.status, {"code": exc.status, "message": str(exc)})
        self.exchanges.append((parts[1], parts[2], body, compact(answer)))
        reply = json_reply(200, compact(answer))
        if parts[2] == "SaveKernel" and self._push_delay:
            reply.delay, self._push_delay = self._push_delay, 0.0  # acted already; the client gives up meanwhile
        return reply


def _fault_reply(fault: Fault) -> Reply:
    if fault.garbage:
        return raw_reply(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
    if 300 <= fault.status < 400:  # a login wall or proxy in front of the API (RFC 9110 §15.4)
        return raw_reply(fault.status, b"", "text/html", {"Location": "https://www.kaggle.com/account/login"})
    headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
    return json_reply(fault.status, {"code": fault.status, "message": "injected failure"}, headers)


def contract_kit(request: Any, workdir: Path) -> Any:
    """The adapter contract suite's hooks (tests/adapters/test_contract.py): a fake per test."""
    from adapters.kaggle import KaggleAdapter, kernel_slug
    from desired.models import KaggleSettings
    from tests.fakes import HostedKit

    fake = FakeKaggle(workdir).start()
    request.addfinalizer(fake.stop)
    monkeypatch = request.getfixturevalue("monkeypatch")
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAGGLE_API_TOKEN", fake.token)
    settings = KaggleSettings(api_url=fake.url, username=fake.username, request_timeout_seconds=10)

    owners: set[str] = set()

    def make(owner: str = "repo-a") -> KaggleAdapter:
        owners.add(owner)
        return KaggleAdapter("kaggle", settings, owner=owner)

    def interrupt(adapter: Any, ref: Any) -> None:
        assert fake.kill_command(ref.id), f"no command to kill for {ref.id}"

    def prepare(spec: Any) -> None:
        """The user's secrets, attached to the job's kernel of every owner the test has made."""
        fake.secrets.update(spec.secret_env)
        for owner in owners:
            fake.attach(kernel_slug("kaggle", owner, spec.job), *spec.secret_env)

    return HostedKit(make=make, interrupt=interrupt, prepare=prepare, cancels=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=None, help="the bearer token to accept (default: a new random one)")
    parser.add_argument("--username", default="fakeuser")
    parser.add_argument("--workdir", default=None, help="where kernels run (default: a new temporary folder)")
    args = parser.parse_args(argv)
    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fake-kaggle-"))
    fake = FakeKaggle(workdir, username=args.username, token=args.token, port=args.port).start()
    print(f"fake Kaggle API at {fake.url} (user {fake.username}, token {fake.token})", flush=True)
    serve_until_interrupted(fake.stop)


if __name__ == "__main__":
    main()
