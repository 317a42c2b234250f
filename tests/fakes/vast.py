"""A local server speaking Vast.ai's documented REST API (routes and JSON as the `vastai` 1.9.1 client
sends and reads them; see docs/providers/vast.md), running each rented instance's
container as a real local process (`machine.Machine`): an "args" launch runs `<onstart> <args...>`
(the entrypoint and its arguments), any other runtype runs `sh -c <onstart>`.

Routes: `POST /api/v0/bundles/` (search, the query object's eq/neq/gt/gte/lt/lte/in/notin, order,
limit), `PUT /api/v0/asks/{offer}/` (create), `GET /api/v1/instances/` (paged) and
`GET /api/v0/instances[/]?owner=me`, `GET|PUT|DELETE /api/v0/instances/{id}/`,
`PUT /api/v0/instances/request_logs/{id}/` (-> `result_url`, served without auth),
`GET /api/v0/users/current`. Every /api route needs `Authorization: Bearer <key>`.

Instances: `loading` (for `loading_seconds`, a slow image pull), `running` (the machine runs),
`exited` (the container's main process ended), `stopped` (outbid: intended
running; credit spent: intended stopped), `offline` (host lost its network; gone from the list
`gone_after` seconds later). A destroy drops the instance from the list at once and stops its
container as Docker does: SIGTERM to the main process, SIGKILL after `stop_grace` seconds.
Credit falls by each running instance's `dph_total` over time; at zero every instance stops.

Faults on demand (`fail(route, kind, ...)`): HTTP status with a body and Retry-After, garbage JSON,
a create that acts and then answers too late, a redirect, an answer that hangs until `released`;
`vanish(offer_id)` (rented by someone else at rent
time), `raise_min_bid_at_rent(offer_id, p)` (a bid enough at search is below the minimum at rent),
`outbid(id)`, `host_offline(id, gone_after)`, `credit`. Nothing a request carries (the create's
`env` holds secrets) is written to disk.

Standalone: `python -m tests.fakes.vast --port N [--key K]` prints its base URL and serves until killed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes import machine_kit, serve_until_interrupted
from tests.fakes.machine import Machine
from tests.fakes.server import FakeServer, Reply, Request, json_reply, raw_reply

DEFAULT_OFFERS = (
    {"id": 1001, "machine_id": 501, "host_id": 41, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564,
     "cpu_ram": 64000, "disk_space": 200.0, "dph_total": 0.40, "min_bid": 0.20, "reliability": 0.995,
     "verified": True, "rentable": True, "rented": False, "external": False,
     "cuda_max_good": 12.4, "geolocation": "Nowhere, ZZ"},
    {"id": 1002, "machine_id": 502, "host_id": 42, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576,
     "cpu_ram": 32000, "disk_space": 100.0, "dph_total": 0.30, "min_bid": 0.15, "reliability": 0.99,
     "verified": True, "rentable": True, "rented": False, "external": False,
     "cuda_max_good": 12.2, "geolocation": "Nowhere, ZZ"},
)


@dataclass
class Instance:
    id: int
    offer: dict[str, Any]
    label: str
    dph_total: float
    machine: Machine
    env: dict[str, str]
    image: str
    start_date: float
    ready_at: float
    actual: str | None = None
    intended: str = "running"
    status_msg: str = ""
    end_date: float | None = None
    gone_at: float | None = None
    back_at: float | None = None
    destroyed: bool = False
    runtype: str = "ssh"
    args: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "id": self.id, "machine_id": self.offer.get("machine_id"), "host_id": self.offer.get("host_id"),
            "actual_status": self.actual, "intended_status": self.intended, "cur_state": _cur_state(self),
            "next_state": self.intended, "status_msg": self.status_msg, "label": self.label,
            "image_uuid": self.image, "image_runtype": self.runtype, "image_args": self.args,
            "extra_env": [[k, v] for k, v in self.env.items()], "start_date": self.start_date,
            "end_date": self.end_date, "uptime_mins": max(0.0, ((self.end_date or time.time()) - self.start_date) / 60),
            "dph_total": self.dph_total, "num_gpus": self.offer.get("num_gpus"), "gpu_name": self.offer.get("gpu_name"),
            "gpu_util": 0.0, "ssh_host": "127.0.0.1", "ssh_port": 0, "public_ipaddr": "127.0.0.1", "ports": {},
        }


def _cur_state(inst: Instance) -> str:
    return "running" if inst.actual in (None, "created", "loading", "running") else "stopped"


@dataclass
class Fault:
    kind: str  # "status" | "garbage" | "late" (a create that acts, then answers after `seconds`) | "redirect"
    # (a 3xx with Location, and `body` if given) | "hang" (answers normally after `seconds` or `release()`)
    status: int = 500
    body: dict[str, Any] = field(default_factory=dict)
    retry_after: str | None = None
    seconds: float = 0.0


class FakeVast(FakeServer):
    """The fake service's state; `serve()` starts it on 127.0.0.1 in a thread."""

    protocol_version = "HTTP/1.1"

    def __init__(self, workdir: Path, key: str = "vast-test-key", offers: list[dict[str, Any]] | None = None,
                 credit: float = 100.0, loading_seconds: float = 0.0, stop_grace: float = 10.0) -> None:
        self.workdir = workdir
        self.key = key
        self.offers = [dict(o) for o in (offers if offers is not None else DEFAULT_OFFERS)]
        self.credit = credit
        self.loading_seconds = loading_seconds
        self.stop_grace = stop_grace
        self.instances: dict[int, Instance] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.vanishing: set[int] = set()
        self.rising: dict[int, float] = {}
        self.requests: list[tuple[str, str]] = []  # (route, method): what was asked, for the tests
        # every JSON request answered: (route, method, query params, body, status, answer), for the
        # conformance test that holds both to the official client's definitions
        self.exchanges: list[tuple[str, str, dict[str, str], Any, int, Any]] = []
        self.creates: list[dict[str, Any]] = []  # create bodies without env (never the secrets)
        self.logs: dict[str, str] = {}
        self.lock = threading.RLock()
        self._ids = itertools.count(7001)
        self.released = threading.Event()  # ends every "hang" fault at once
        self._last_tick = time.time()

    # ---- control ----------------------------------------------------------------------------------

    def serve(self, port: int = 0) -> str:
        self._last_tick = time.time()  # the clock starts with the service
        return self.start_serving(port)

    def close(self) -> None:
        self.released.set()
        self.stop_serving()
        for inst in list(self.instances.values()):
            inst.machine.kill_all()

    def fail(self, route: str, kind: str = "status", times: int = 1, **how: Any) -> None:
        """The next `times` requests to `route` (search, create, list, show, logs, destroy, user) fail so."""
        with self.lock:
            self.faults.setdefault(route, []).extend(Fault(kind, **how) for _ in range(times))

    def vanish(self, offer_id: int) -> None:
        """Someone else rents this offer between our search and our rent."""
        self.vanishing.add(offer_id)

    def raise_min_bid_at_rent(self, offer_id: int, min_bid: float) -> None:
        """The market minimum for this offer rises between our search and our rent."""
        self.rising[offer_id] = min_bid

    def outbid(self, iid: int) -> None:
        """A higher bid takes the machine: processes killed at once (no notice), instance stopped."""
        with self.lock:
            inst = self.instances[iid]
            inst.machine.kill_all()
            inst.actual, inst.intended, inst.status_msg = "stopped", "running", "outbid"
            inst.end_date = time.time()

    def host_offline(self, iid: int, gone_after: float = 2.0) -> None:
        """The host loses its network: the instance is offline, then gone from the list."""
        with self.lock:
            inst = self.instances[iid]
            inst.machine.kill_all()
            inst.actual, inst.status_msg = "offline", "host is offline"
            inst.end_date = time.time()
            inst.gone_at = time.time() + gone_after

    def transition(self, iid: int, actual: str, seconds: float) -> None:
        """The instance passes through `actual` (e.g. `rebooting`: "Restarting (transient)", vastai's
        SKILL.md status table) for `seconds`, then shows `running` again; its processes are left as they
        are (a model of the state only, not of a container restart)."""
        with self.lock:
            inst = self.instances[iid]
            inst.actual, inst.status_msg = actual, f"{actual}"
            inst.back_at = time.time() + seconds

    def live(self) -> list[Instance]:
        with self.lock:
            return [i for i in self.instances.values() if not i.destroyed]

    def count(self, route: str) -> int:
        return sum(1 for r, _ in self.requests if r == route)

    # ---- time -------------------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.time()
        with self.lock:
            self._tick(now, now - self._last_tick)
        self._last_tick = now

    def _tick(self, now: float, dt: float) -> None:
        for inst in list(self.instances.values()):
            if inst.destroyed:
                continue
            if inst.actual in ("created", "loading") and now >= inst.ready_at:
                inst.machine.start()
                inst.actual = "running"
            elif inst.actual == "running" and inst.machine.exit_code is not None:
                inst.actual, inst.status_msg = "exited", f"exited with code {inst.machine.exit_code}"
                inst.end_date = inst.machine.ended_at or now
            elif inst.back_at is not None and now >= inst.back_at:
                inst.actual, inst.status_msg, inst.back_at = "running", "", None
            elif inst.gone_at is not None and now >= inst.gone_at:
                del self.instances[inst.id]
                continue
            if inst.actual == "running":
                self.credit -= inst.dph_total * dt / 3600
        if self.credit <= 0:
            self.credit = 0.0
            for inst in self.instances.values():
                if inst.actual in ("running", "loading", "created") and not inst.destroyed:
                    inst.machine.kill_all()
                    inst.actual, inst.intended, inst.status_msg = "stopped", "stopped", "insufficient credit"
                    inst.end_date = now

    # ---- routes -----------------------------------------------------------------------------------

    def search(self, query: dict[str, Any]) -> dict[str, Any]:
        offers = [o for o in self.offers if _matches(o, query)]
        for col, direction in reversed(query.get("order") or []):
            offers.sort(key=lambda o, c=col: (o.get(c) is None, o.get(c) or 0), reverse=direction == "desc")
        limit = int(query.get("limit") or 64)
        return {"offers": offers[:limit]}

    def create(self, offer_id: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        offer = next((o for o in self.offers if o["id"] == offer_id), None)
        if offer is None or offer_id in self.vanishing:
            self.vanishing.discard(offer_id)
            self.offers = [o for o in self.offers if o["id"] != offer_id]
            return 400, {"success": False, "error": "no_such_ask", "msg": "Instance type no longer available."}
        if offer_id in self.rising:
            offer["min_bid"] = self.rising.pop(offer_id)
        price = body.get("price")  # the bid, $/h for the whole instance: vastai's create-instance help
        # says "--bid_price ... per machine bid price in $/hour"; the offer's min_bid is in the same unit
        if price is not None and float(price) < float(offer.get("min_bid") or 0):
            return 400, {"success": False, "error": "invalid_price", "msg": "Your bid is below the minimum bid."}
        if self.credit <= 0:
            return 400, {"success": False, "error": "insufficient_credit", "msg": "Add credit to your account."}
        self.creates.append({k: v for k, v in body.items() if k != "env"})
        iid = next(self._ids)
        env = {str(k): str(v) for k, v in (body.get("env") or {}).items()}
        python_dir = os.path.dirname(sys.executable)
        machine_env = {**env, "PATH": python_dir + os.pathsep + os.environ.get("PATH", os.defpath)}
        machine = Machine(self.workdir / f"instance-{iid}", _container_argv(body), machine_env)
        now = time.time()
        self.instances[iid] = Instance(
            id=iid, offer=offer, label=str(body.get("label") or ""), env=env, image=str(body.get("image")),
            dph_total=float(price) if price is not None else float(offer["dph_total"]), machine=machine,
            start_date=now, ready_at=now + self.loading_seconds, actual="loading",
            runtype=str(body.get("runtype") or "ssh"), args=[str(a) for a in body.get("args") or []])
        return 200, {"success": True, "new_contract": iid}

    def destroy(self, iid: int) -> tuple[int, dict[str, Any]]:
        inst = self.instances.get(iid)
        if inst is None or inst.destroyed:
            return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found."}
        inst.destroyed = True
        inst.end_date = inst.end_date or time.time()
        del self.instances[iid]
        threading.Thread(target=self._docker_stop, args=(inst.machine,), daemon=True).start()
        return 200, {"success": True}

    def _docker_stop(self, machine: Machine) -> None:
        """What `docker stop` does: SIGTERM to the main process, SIGKILL after the grace."""
        machine.signal(signal.SIGTERM)
        deadline = time.time() + self.stop_grace
        while machine.alive and time.time() < deadline:
            time.sleep(0.05)
        machine.kill_all()

    def request_logs(self, iid: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        inst = self.instances.get(iid)
        if inst is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found."}
        lines = inst.machine.log_text().splitlines(keepends=True)
        tail = int(body.get("tail") or 0)
        token = uuid.uuid4().hex
        self.logs[token] = "".join(lines[-tail:] if tail else lines)
        return 200, {"success": True, "result_url": f"{self.url}/logs/{token}.log", "msg": "logs requested"}

    def list_page(self, params: dict[str, Any]) -> dict[str, Any]:
        rows = sorted((i.row() for i in self.live()), key=lambda r: r["id"])
        after = params.get("after_token")
        if after:
            rows = [r for r in rows if r["id"] > int(after)]
        limit = int(params.get("limit") or 25)
        page = rows[:limit]
        more = len(rows) > limit
        return {"instances": page, "next_token": str(page[-1]["id"]) if more else None,
                "total_instances": len(self.live()), "label_counts": {}}

    # ---- HTTP -------------------------------------------------------------------------------------

    def respond(self, request: Request) -> Reply:
        if request.method == "GET" and request.path.startswith("/logs/"):
            text = self.logs.get(request.path[6:].removesuffix(".log"))
            return raw_reply(404, b"not ready", "text/plain") if text is None else \
                raw_reply(200, text.encode(), "text/plain")
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return json_reply(401, {"success": False, "error": "invalid_user_key", "msg": "Invalid user key."})
        try:
            body = json.loads(request.body) if request.body else {}
        except ValueError:
            return json_reply(400, {"success": False, "error": "invalid_json", "msg": "Bad JSON."})
        route, handler = _route(self, request.method, request.path, request.query, body)
        with self.lock:
            self.requests.append((route, request.method))
            faults = self.faults.get(route) or []
            fault = faults.pop(0) if faults else None
        if fault is not None and fault.kind not in ("late", "hang"):
            return _fault_reply(fault)
        if fault is not None and fault.kind == "hang":  # answers, but only after `seconds` (or `release()`)
            self.released.wait(fault.seconds)
        with self.lock:
            status, answer = handler()
            self.exchanges.append((route, request.method, request.query, body, status, answer))
        reply = json_reply(status, answer)
        if fault is not None and fault.kind == "late":
            reply.delay = fault.seconds  # acted, and answers too late for the client
        return reply


def _container_argv(body: dict[str, Any]) -> list[str]:
    """What the container runs: the entrypoint and its args ("args" launch), else the onstart script
    (the fake's container ends with it; Vast's ssh launches keep running)."""
    onstart = str(body.get("onstart") or "true")
    if body.get("runtype") == "args":
        return [onstart, *[str(a) for a in body.get("args") or []]]
    return ["sh", "-c", onstart]


def _matches(offer: dict[str, Any], query: dict[str, Any]) -> bool:
    ops = {"eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "gt": lambda a, b: a > b,
           "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b,
           "in": lambda a, b: a in b, "notin": lambda a, b: a not in b}
    for col, test in query.items():
        if not isinstance(test, dict):
            continue  # order, type, limit, allocated_storage
        for op, want in test.items():
            have = offer.get(col)
            if have is None or op not in ops:
                return False
            try:
                if isinstance(have, (int, float)) and not isinstance(have, bool) and isinstance(want, str):
                    want = float(want)  # the CLI sends numbers as strings
                if not ops[op](have, want):
                    return False
            except TypeError:
                return False
    return True


def _route(s: FakeVast, method: str, path: str, params: dict[str, str], body: Any) -> tuple[str, Any]:
    found = re.fullmatch(r"/api/v0/(asks|instances|instances/request_logs)/(\d+)/?", path)
    num = int(found.group(2)) if found else 0
    kind = found.group(1) if found else ""
    table: dict[tuple[str, str], tuple[str, Any]] = {
        ("POST", "/api/v0/bundles/"): ("search", lambda: (200, s.search(body))),
        ("GET", "/api/v1/instances/"): ("list", lambda: (200, s.list_page(_json_params(params)))),
        ("GET", "/api/v0/instances"): ("list", lambda: (200, {"instances": [i.row() for i in s.live()]})),
        ("GET", "/api/v0/instances/"): ("list", lambda: (200, {"instances": [i.row() for i in s.live()]})),
        ("GET", "/api/v0/users/current"): ("user", lambda: (200, _user(s))),
        ("GET", "/api/v0/users/current/"): ("user", lambda: (200, _user(s))),
        ("PUT", "asks"): ("create", lambda: s.create(num, body)),
        ("GET", "instances"): ("show", lambda: (200, {"instances": s.instances[num].row()
                                                      if num in s.instances else None})),
        ("PUT", "instances"): ("update", lambda: _update(s, num, body)),
        ("DELETE", "instances"): ("destroy", lambda: s.destroy(num)),
        ("PUT", "instances/request_logs"): ("logs", lambda: s.request_logs(num, body)),
    }
    return table.get((method, path)) or table.get((method, kind)) or (
        "unknown", lambda: (404, {"success": False, "error": "not_found", "msg": f"no route {method} {path}"}))


def _fault_reply(fault: Fault) -> Reply:
    if fault.kind == "garbage":
        return raw_reply(200, b"<html>502 Bad Gateway</html>", "text/html")
    if fault.kind == "redirect":  # a proxy or login wall in front of the API (RFC 9110 §15.4: Location)
        data = json.dumps(fault.body).encode() if fault.body else b""
        return raw_reply(fault.status, data, "application/json", {"Location": "https://cloud.vast.ai/"})
    headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
    return json_reply(fault.status, fault.body or {"success": False, "error": "server_error", "msg": "Oops."}, headers)


def _json_params(params: dict[str, str]) -> dict[str, Any]:
    """The v1 list's query values are JSON (the client json-dumps non-strings)."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def _user(s: FakeVast) -> dict[str, Any]:
    return {"id": 1, "username": "fake", "email": "fake@example.invalid", "credit": round(s.credit, 6),
            "balance": 0.0, "has_billing": True}


def _update(s: FakeVast, iid: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    inst = s.instances.get(iid)
    if inst is None:
        return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found."}
    if "label" in body:
        inst.label = str(body["label"])
    if body.get("state") == "stopped" and inst.actual == "running":
        inst.intended = "stopped"
        threading.Thread(target=s._docker_stop, args=(inst.machine,), daemon=True).start()
    return 200, {"success": True}


# ---- the contract suite's kit ----------------------------------------------------------------------


def contract_kit(request: Any, workdir: Path) -> Any:
    """A fake Vast for tests/adapters/test_contract.py (a fresh one per test)."""
    from adapters.vast import VastAdapter
    from desired.models import VastSettings

    fake = FakeVast(workdir / "vast")
    fake.serve()
    request.addfinalizer(fake.close)
    request.getfixturevalue("monkeypatch").setenv("VAST_API_KEY", fake.key)
    settings = VastSettings(api_url=fake.url, request_timeout_seconds=5, max_price_per_hour=1.0)

    def make(owner: str = "repo-a") -> Any:
        return VastAdapter("vast", settings, owner=owner)

    return machine_kit(make, lambda iid: fake.instances[int(iid)].machine, cancels=True)


def served(workdir: Path, monkeypatch: Any, **options: Any) -> Iterator[FakeVast]:
    """A fixture's body: a FakeVast serving for one test, VAST_API_KEY set to its key."""
    service = FakeVast(workdir, **options)
    service.serve()
    monkeypatch.setenv("VAST_API_KEY", service.key)
    yield service
    service.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key", default="vast-test-key")
    parser.add_argument("--workdir", default=None, help="where instances' folders go (default: a temporary one)")
    args = parser.parse_args(argv)
    import tempfile

    fake = FakeVast(Path(args.workdir or tempfile.mkdtemp(prefix="fake-vast-")), key=args.key)
    print(fake.serve(args.port), flush=True)
    serve_until_interrupted(fake.close)
    return 0


if __name__ == "__main__":
    sys.exit(main())
