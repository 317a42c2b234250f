"""A fake RunPod GraphQL API on 127.0.0.1: `POST /graphql`, Bearer auth, pods run as local processes.

It parses every request with graphql-core (so both our variables and the official SDK's
interpolated queries are read the same way), resolves the operations we and the SDK use —
`myself { clientBalance pods {...} }`, `pod(input:{podId})`, `gpuTypes(input:{id}) { lowestPrice }`,
`podRentInterruptable`, `podFindAndDeployOnDemand`, `podTerminate`, `podStop` — and answers only
the fields asked for (an unknown field is an error, as on a schema-checked server). Errors come as
`{"errors": [{"message": ...}]}` with HTTP 200, as RunPod sends them.

A pod runs its `dockerArgs` (the container's command, split into words as Docker splits a CMD
string; ours is `sh -c '<script>'`, whose script execs the bootstrap so that it is the container's
main process and receives RunPod's SIGTERM) as a `Machine` whose env is the pod's env with every
`{{ RUNPOD_SECRET_<name> }}` resolved from the fake's secret store (plus RUNPOD_POD_ID, as RunPod
sets it). A container whose command ends is restarted (RESTARTING, then RUNNING again, billing on), as
RunPod does; only podStop/podTerminate ends a pod. Each pod gets RUNPOD_API_KEY, a key of its own
that may read and stop that pod only (RunPod: "Pod-scoped API key", docs.runpod.io/pods/templates/
environment-variables; what it allows beyond stopping its own pod is not documented, so nothing more).
A stop (outbid, podTerminate, a drained balance) sends SIGTERM, then SIGKILL after
`kill_grace` seconds (RunPod: 5 s, docs.runpod.io FAQ "OnDemand vs Spot Pod": SIGTERM, then SIGKILL
5 seconds later); `desiredStatus` becomes EXITED (TERMINATED for podTerminate)
once the container has stopped [UNCONFIRMED at RunPod: when the word flips]. A terminated pod stays
listed for `retention` seconds, then is gone. Balance is spent at each pod's costPerHr; at zero every
pod is stopped and creates are refused.

Faults on demand: `fail_next(...)` (HTTP status with Retry-After, garbage JSON, a GraphQL error with
HTTP 200), `act_then_stall(seconds)` (a create that acts, then answers too late), `outbid(pod_id)`,
`drain_balance()`, `set_capacity(gpu, 0)` (no instances of a GPU type).
Standalone: `python -m tests.fakes.runpod --port N` prints its base URL and serves until killed.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from graphql import FieldNode, GraphQLError, OperationDefinitionNode, parse
from graphql.utilities import value_from_ast_untyped

from tests.fakes import HostedKit, machine_kit, standalone
from tests.fakes.machine import Machine
from tests.fakes.server import FakeServer, Reply, Request

API_KEY = "rp-fake-key-4f2a9c"
SECRET_REF = re.compile(r"\{\{\s*RUNPOD_SECRET_([A-Za-z0-9_]+)\s*\}\}")
NO_INSTANCES = ("There are no longer any instances available with the requested specifications. "
                "Please refresh and try again.")
GPU_TYPES = {  # id -> (display name, memory GB, on-demand $/h, minimum bid $/h)
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 24, 0.69, 0.35),
    "NVIDIA A100 80GB PCIe": ("A100 80GB", 80, 1.64, 0.82),
}


class GqlError(Exception):
    """Becomes `{"errors": [{"message": ...}]}` with HTTP 200."""


@dataclass
class Fault:
    operation: str | None  # a top-level field name (podRentInterruptable, myself, ...) or None: any
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stall: float = 0.0  # act first, then wait this long before answering (a create that times out)


@dataclass
class FakePod:
    id: str
    input: dict[str, Any]
    spot: bool
    cost_per_hr: float
    created: float
    status: str = "CREATED"
    machine: Machine | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stopping: str | None = None  # EXITED or TERMINATED once the container has stopped
    last_change: str = "Created"
    restarts: int = 0  # times the container was restarted because its command ended
    restart_at: float | None = None

    def env_list(self) -> list[str]:
        return [f"{e['key']}={e['value']}" for e in self.input.get("env") or []]

    def uptime(self, now: float) -> int:
        if self.started_at is None:
            return 0
        return int((self.ended_at or now) - self.started_at)

    def view(self, now: float) -> dict[str, Any]:
        inp = self.input
        return {
            "id": self.id, "name": inp.get("name"), "desiredStatus": self.status,
            "lastStatusChange": self.last_change, "uptimeSeconds": self.uptime(now),
            "costPerHr": self.cost_per_hr, "adjustedCostPerHr": self.cost_per_hr, "gpuCount": inp.get("gpuCount", 1),
            "imageName": inp.get("imageName"), "env": self.env_list(), "dockerArgs": inp.get("dockerArgs", ""),
            "dockerId": None, "podType": "INTERRUPTABLE" if self.spot else "RESERVED",
            "containerDiskInGb": inp.get("containerDiskInGb"), "volumeInGb": inp.get("volumeInGb", 0),
            "volumeMountPath": inp.get("volumeMountPath"), "memoryInGb": inp.get("minMemoryInGb", 1),
            "vcpuCount": inp.get("minVcpuCount", 1), "machineId": f"m-{self.id}", "port": None,
            "ports": inp.get("ports") or "",
            "runtime": {"ports": [], "uptimeInSeconds": self.uptime(now)} if self.status == "RUNNING" else None,
            "machine": {"gpuDisplayName": GPU_TYPES.get(inp.get("gpuTypeId", ""), ("?",))[0],
                        "podHostId": f"{self.id}-host"},
        }


@dataclass(eq=False)
class FakeRunpod(FakeServer):
    """The server and its state, serving from its creation. `url` is the API base (GraphQL at
    `url + '/graphql'`)."""

    http_methods = ("POST",)

    root: Path
    _: KW_ONLY
    api_key: str = API_KEY
    port: int = 0
    start_delay: float = 0.2
    kill_grace: float = 5.0
    retention: float = 600.0
    balance: float = 100.0

    def __post_init__(self) -> None:
        self.secrets: dict[str, str] = {}
        self.pods: dict[str, FakePod] = {}
        self.capacity: dict[str, int | None] = {gpu: None for gpu in GPU_TYPES}  # None: plenty
        self.faults: list[Fault] = []
        self.requests: list[dict[str, Any]] = []  # every request body received (query and variables)
        # every request answered with data: (query, variables, data), for the conformance test
        self.exchanges: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self._last_spend = time.time()
        self.start_serving(self.port)

    # ---- test controls -------------------------------------------------------------------------
    def set_secret(self, name: str, value: str) -> None:
        with self.lock:
            self.secrets[name] = value

    def set_capacity(self, gpu: str, count: int | None) -> None:
        with self.lock:
            self.capacity[gpu] = count

    def fail_next(self, *, operation: str | None = None, status: int = 200, message: str | None = None,
                  body: bytes | None = None, retry_after: str | None = None, count: int = 1) -> None:
        """The next `count` requests (for `operation`, or any) fail: `message` as a GraphQL error
        with HTTP 200, or `status` with `body` (garbage: any non-JSON bytes) and Retry-After."""
        payload = body if body is not None else json.dumps({"errors": [{"message": message or "Something went wrong"}]
                                                            }).encode()
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        with self.lock:
            self.faults.extend(Fault(operation, status, payload, headers) for _ in range(count))

    def act_then_stall(self, seconds: float, operation: str | None = None) -> None:
        """The next create acts (the pod exists) but answers only after `seconds`."""
        with self.lock:
            self.faults.append(Fault(operation, stall=seconds))

    def outbid(self, pod_id: str) -> None:
        """Someone outbids a spot pod: SIGTERM now, SIGKILL after `kill_grace`, then EXITED."""
        self._stop(self.pods[pod_id], "EXITED", "Outbid")

    def drain_balance(self) -> None:
        """The balance runs out: every pod is stopped and creates are refused."""
        with self.lock:
            self.balance = 0.0
            for pod in self.pods.values():
                self._stop(pod, "EXITED", "Stopped: balance exhausted")

    def pod_named(self, name: str) -> FakePod | None:
        with self.lock:
            return next((p for p in self.pods.values() if p.input.get("name") == name), None)

    def pod_key(self, pod_id: str) -> str:
        """The key a pod is given: it may read and stop that pod only."""
        return f"rp-pod-key-{pod_id}"

    def close(self) -> None:
        self.stop_serving()
        with self.lock:
            for pod in self.pods.values():
                if pod.machine is not None:
                    pod.machine.kill_all()

    # ---- the pods' lives -----------------------------------------------------------------------
    def tick(self) -> None:
        now = time.time()
        with self.lock:
            self._spend(now)
            for pod in list(self.pods.values()):
                self._advance(pod, now)

    def _spend(self, now: float) -> None:
        running = sum(p.cost_per_hr for p in self.pods.values() if p.status == "RUNNING")
        self.balance -= running * (now - self._last_spend) / 3600.0
        self._last_spend = now
        if self.balance <= 0 and running:
            self.balance = 0.0
            for pod in self.pods.values():
                self._stop(pod, "EXITED", "Stopped: balance exhausted")

    def _advance(self, pod: FakePod, now: float) -> None:
        if pod.status == "CREATED" and pod.stopping is None and now - pod.created >= self.start_delay:
            self._start(pod, now)
        if pod.status == "RESTARTING" and pod.stopping is None and now - (pod.restart_at or now) >= self.start_delay:
            self._start(pod, pod.started_at or now)
        machine = pod.machine
        if machine is not None and pod.ended_at is None and machine.exit_code is not None and pod.stopping is None:
            if pod.status == "RUNNING":
                # RunPod restarts a container whose command ends, and the pod bills on: "the
                # container will restart" unless it is kept busy (docs.runpod.io, Pods > "Start
                # command": RunPod's own templates end theirs in `sleep infinity`). Only a stop or
                # terminate through the API (the bootstrap's own podStop, or the daemon's) ends it.
                pod.restarts += 1
                pod.status, pod.restart_at, pod.last_change = "RESTARTING", now, "Restarting: the command ended"
            return
        if machine is not None and pod.ended_at is None and machine.exit_code is not None:
            pod.ended_at = machine.ended_at or now
        if pod.stopping and (machine is None or pod.ended_at is not None) and pod.status != pod.stopping:
            pod.status = pod.stopping
            pod.ended_at = pod.ended_at or now
        if pod.status == "TERMINATED" and pod.ended_at and now - pod.ended_at > self.retention:
            del self.pods[pod.id]

    def _start(self, pod: FakePod, now: float) -> None:
        env = {e["key"]: SECRET_REF.sub(lambda m: self.secrets.get(m.group(1), ""), str(e["value"]))
               for e in pod.input.get("env") or []}
        # RunPod sets the pod's id, and gives every pod a key scoped to it (docs.runpod.io/runpodctl:
        # "a Pod-scoped API key"; that it is RUNPOD_API_KEY is assumed: README, known limits).
        env.update({"RUNPOD_POD_ID": pod.id, "RUNPOD_GPU_COUNT": str(pod.input.get("gpuCount", 1)),
                    "RUNPOD_API_KEY": self.pod_key(pod.id)})
        argv = shlex.split(str(pod.input.get("dockerArgs") or "")) or ["true"]  # a CMD string, as Docker splits it
        pod.machine = Machine(self.root / (f"{pod.id}-r{pod.restarts}" if pod.restarts else pod.id), argv, env)
        pod.machine.start()
        pod.started_at, pod.status, pod.last_change = now, "RUNNING", "Rented by User"

    def _stop(self, pod: FakePod, final: str, why: str) -> None:
        with self.lock:
            if pod.stopping is not None and pod.status == pod.stopping:
                if final == "TERMINATED":
                    pod.status = pod.stopping = final
                return
            if pod.stopping is not None and final != "TERMINATED":
                return  # a stop under way (outbid, say) keeps its reason when the pod's own podStop follows
            pod.stopping, pod.last_change = final, why
            machine = pod.machine
        if machine is not None and machine.alive:
            machine.signal(signal.SIGTERM)
            timer = threading.Timer(self.kill_grace, machine.kill_all)
            timer.daemon = True
            timer.start()

    # ---- GraphQL -------------------------------------------------------------------------------
    def respond(self, request: Request) -> Reply:
        if request.path != "/graphql":
            return Reply(404, _errors("not found"), {"Content-Type": "application/json"})
        status, payload, headers, stall = self.handle(request.lower_headers(), request.body)
        return Reply(status, payload, {"Content-Type": "application/json", **headers}, delay=stall)

    def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes, dict[str, str], float]:
        auth = headers.get("authorization") or ""
        scope = next((i for i in self.pods if auth == f"Bearer {self.pod_key(i)}"), None)
        if auth != f"Bearer {self.api_key}" and scope is None:
            return 401, _errors("Unauthorized: invalid API key"), {}, 0.0
        try:
            request = json.loads(body)
            query, variables = request["query"], request.get("variables") or {}
            document = parse(query)
        except (ValueError, KeyError, TypeError, GraphQLError) as exc:
            return 400, _errors(f"cannot parse the request: {' '.join(str(exc).split())[:200]}"), {}, 0.0
        with self.lock:
            self.requests.append({"query": query, "variables": variables, "pod_key": scope})
        operation = next(d for d in document.definitions if isinstance(d, OperationDefinitionNode))
        fields = [s for s in operation.selection_set.selections if isinstance(s, FieldNode)]
        if scope is not None and any(f.name.value not in ("pod", "podStop")
                                     or _args(f, variables).get("input", {}).get("podId") != scope for f in fields):
            return 403, _errors("Forbidden: a pod's key may read and stop that pod only"), {}, 0.0
        fault = self._take_fault({f.name.value for f in fields})
        if fault is not None and not fault.stall:
            return fault.status, fault.body, fault.headers, 0.0
        try:
            data = {(f.alias or f.name).value: self._resolve_top(f, variables) for f in fields}
        except GqlError as exc:
            return 200, _errors(str(exc)), {}, 0.0
        with self.lock:
            self.exchanges.append((query, variables, data))
        return 200, json.dumps({"data": data}).encode(), {}, fault.stall if fault else 0.0

    def _take_fault(self, names: set[str]) -> Fault | None:
        with self.lock:
            for i, fault in enumerate(self.faults):
                if fault.operation is None or fault.operation in names:
                    return self.faults.pop(i)
        return None

    def _resolve_top(self, node: FieldNode, variables: dict[str, Any]) -> Any:
        args = _args(node, variables)
        resolver = RESOLVERS.get(node.name.value)
        if resolver is None:
            raise GqlError(f'Cannot query field "{node.name.value}" on type "Query".')
        with self.lock:
            value = resolver(self, args.get("input") or {})
        return _project(value, node, variables)

    def _myself(self, _inp: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        return {"id": "user-fake", "pubKey": "", "networkVolumes": [], "clientBalance": round(self.balance, 6),
                "currentSpendPerHr": sum(p.cost_per_hr for p in self.pods.values() if p.status == "RUNNING"),
                "pods": [p.view(now) for p in self.pods.values()]}

    def _pod(self, inp: dict[str, Any]) -> dict[str, Any] | None:
        pod = self.pods.get(str(inp.get("podId")))
        return pod.view(time.time()) if pod else None

    def _gpu_types(self, inp: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for gpu, (display, memory, price, bid) in GPU_TYPES.items():
            if inp.get("id") not in (None, gpu):
                continue
            out.append({
                "id": gpu, "displayName": display, "memoryInGb": memory, "maxGpuCount": 8, "manufacturer": "Nvidia",
                "cudaCores": 0, "secureCloud": True, "communityCloud": True, "securePrice": price,
                "communityPrice": price, "communitySpotPrice": bid, "secureSpotPrice": bid, "oneWeekPrice": price,
                "oneMonthPrice": price, "threeMonthPrice": price,
                "lowestPrice": lambda a, p=price, b=bid: {"minimumBidPrice": b, "uninterruptablePrice": p,
                                                          "gpuCount": (a.get("input") or {}).get("gpuCount", 1)},
            })
        return out

    def _create(self, inp: dict[str, Any], spot: bool) -> dict[str, Any]:
        for key in ("name", "imageName", "gpuTypeId"):
            if not isinstance(inp.get(key), str) or not inp.get(key):
                raise GqlError(f"{key} is required")
        gpu = inp["gpuTypeId"]
        if gpu not in GPU_TYPES:
            raise GqlError(f"GPU type {gpu!r} does not exist")
        count = int(inp.get("gpuCount") or 1)
        _, _, price, minimum = GPU_TYPES[gpu]
        rate = price * count
        if spot:
            bid = inp.get("bidPerGpu")
            if not isinstance(bid, (int, float)) or bid < minimum:
                raise GqlError(f"Your bid of {bid} per GPU is below the current minimum bid price of {minimum}")
            rate = float(bid) * count
        if self.balance < rate:  # RunPod wants an hour of balance for the configuration
            raise GqlError("Your balance is too low to deploy this pod: at least one hour of credit is required")
        missing = sorted({m for e in inp.get("env") or [] for m in SECRET_REF.findall(str(e.get("value")))}
                         - set(self.secrets))
        if missing:
            raise GqlError(f"Secret {missing[0]} does not exist")
        if self.capacity.get(gpu) is not None:
            if self.capacity[gpu] <= 0:
                raise GqlError(NO_INSTANCES)
            self.capacity[gpu] = (self.capacity[gpu] or 0) - 1
        pod = FakePod(id=f"pod{next(self._ids):04d}x", input=dict(inp), spot=spot, cost_per_hr=round(rate, 4),
                      created=time.time())
        self.pods[pod.id] = pod
        return pod.view(time.time())

    def _terminate(self, inp: dict[str, Any]) -> None:
        pod = self.pods.get(str(inp.get("podId")))
        if pod is None:
            raise GqlError("Pod not found")
        self._stop(pod, "TERMINATED", "Terminated by user")
        if pod.machine is None:
            pod.status, pod.ended_at = "TERMINATED", time.time()

    def _stop_pod(self, inp: dict[str, Any]) -> dict[str, Any]:
        pod = self.pods.get(str(inp.get("podId")))
        if pod is None:
            raise GqlError("Pod not found")
        self._stop(pod, "EXITED", "Stopped by user")
        return pod.view(time.time())


RESOLVERS: dict[str, Callable[[FakeRunpod, dict[str, Any]], Any]] = {
    "myself": FakeRunpod._myself,
    "pod": FakeRunpod._pod,
    "gpuTypes": FakeRunpod._gpu_types,
    "podRentInterruptable": lambda fake, inp: fake._create(inp, spot=True),
    "podFindAndDeployOnDemand": lambda fake, inp: fake._create(inp, spot=False),
    "podTerminate": FakeRunpod._terminate,
    "podStop": FakeRunpod._stop_pod,
}


def _args(node: FieldNode, variables: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for arg in node.arguments or ():
        out[arg.name.value] = value_from_ast_untyped(arg.value, variables)
    return out


def _project(value: Any, node: FieldNode, variables: dict[str, Any]) -> Any:
    """Only the fields the query selected; an unknown field is an error."""
    if node.selection_set is None or value is None:
        return value
    if isinstance(value, list):
        return [_project(v, node, variables) for v in value]
    out = {}
    for sel in node.selection_set.selections:
        if not isinstance(sel, FieldNode):
            continue
        name = sel.name.value
        if name == "__typename":
            out[(sel.alias or sel.name).value] = "Object"
            continue
        if name not in value:
            raise GqlError(f'Cannot query field "{name}" on type "{node.name.value}".')
        item = value[name]
        if callable(item):
            item = item(_args(sel, variables))
        out[(sel.alias or sel.name).value] = _project(item, sel, variables)
    return out


def _errors(message: str) -> bytes:
    return json.dumps({"errors": [{"message": message}]}).encode()


# ---- the adapter contract suite's kit ---------------------------------------------------------


def contract_kit(request: Any, workdir: Path) -> HostedKit:
    """A fake per test (spot pods, a 5 s kill grace as RunPod's); RUNPOD_API_KEY set for the adapter."""
    from adapters.runpod import RunpodAdapter
    from desired.models import RunpodSettings

    fake = FakeRunpod(workdir / "runpod-machines")
    request.addfinalizer(fake.close)
    request.getfixturevalue("monkeypatch").setenv("RUNPOD_API_KEY", API_KEY)
    settings = RunpodSettings(api_url=fake.url, request_timeout_seconds=10)

    def make(owner: str = "repo-a") -> RunpodAdapter:
        return RunpodAdapter("runpod", settings, owner=owner)

    return machine_kit(make, lambda pod_id: fake.pods[pod_id].machine, fake.set_secret, cancels=True,
                       run_folder=True, own_env=("RECONCILER_GRACE",))


def main() -> None:
    standalone(__doc__ or "", "/tmp/fake-runpod", lambda root, port: FakeRunpod(root, port=port),
               lambda fake: f"RUNPOD_API_KEY={API_KEY} RUNPOD_API_BASE_URL={fake.url}")


if __name__ == "__main__":
    main()
