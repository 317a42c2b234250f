"""The `runpod` compute adapter: one RunPod pod per worker, through RunPod's GraphQL API.

Requests go to `POST {api_url}/graphql` with `Authorization: Bearer <key>`; every value travels in
the request's `variables` (JSON), never pasted into the query text (the official SDK pastes values
unescaped: a quote in an env value breaks its query, or rewrites it). The key is read from
RUNPOD_API_KEY, else from `~/.runpod/config.toml` (`[default] api_key`, written by `runpod config`).

Launch: spot pods with `podRentInterruptable` (`bidPerGpu` = the settings' bid, else the current
`minimumBidPrice` of the GPU type), on-demand pods with `podFindAndDeployOnDemand`. The pod's
`dockerArgs` is a shell command that decodes the bootstrap (adapters/hosted.py: zlib + base64, no
character of it means anything to a shell) to a file and execs it with python3, so the bootstrap is
the container's main process and gets RunPod's SIGTERM. The job's env and argv travel in the
bootstrap only: RunPod substitutes `{{ RUNPOD_SECRET_... }}` in pod env values, so a plain value
must not go there. The pod's `env` holds only what the daemon reads back (RECONCILER_RUN_URI and
the S3 endpoint), RECONCILER_LABELS (`owner/job/run_id/e<epoch>`: whose worker it is) and each
secret as a reference `{{ RUNPOD_SECRET_<name> }}` that RunPod resolves from the account's
secrets: secret values never travel in the launch (`secrets_at_provider`). The pod's
name is `rc-<owner>-<job>-<run_id>-e<epoch>` (cut with a hash past 60 characters); a launch first
looks the name up among our pods and adopts it, so a create that timed out after acting is adopted
at the next tick, never repeated. RECONCILER_GRACE=5 tells the worker SDK how long a stop gives.
RunPod restarts a container whose command ends, so the bootstrap stops its own pod as it ends
(SELF_STOP below); the adapter's release of an ended pod is the second line.

Exit codes: RunPod has no log API and reports no exit code. The bootstrap copies its output's tail
and its exit record (`reconciler-bootstrap: exit {...}`) into the run folder (`logs/e<epoch>.log`);
observe reads that record for an ended pod, through the RECONCILER_RUN_URI the pod's env carries,
with the daemon's own storage credentials (environment; the endpoint from the pod's
AWS_ENDPOINT_URL_S3). `logs()` returns that file's tail. Without a record the exit code is unknown
and the detail says so.

State table (RunPod's `desiredStatus` -> WorkerPhase):

    CREATED                                                        -> pending
    RESTARTING with an exit record of a command that ended by
        itself (the bootstrap's own podStop failed; RunPod restarts
        a container whose command ends)                           -> as EXITED with that record, released
    RUNNING, RESTARTING                                            -> running (the word is kept; a
        restart of a spot pod is RunPod resuming it: the worker starts over from its checkpoint,
        fenced by its epoch; the heartbeat watch judges it)
    EXITED, PAUSED with an exit record saying the bootstrap got a
        SIGTERM (RunPod stopped the machine: outbid, balance)      -> preempted (code, e.g. 75 after a save)
    EXITED, PAUSED with any other exit record in the run folder    -> exited (code, signal)
    EXITED, PAUSED, spot pod, no exit record                       -> preempted (outbid: SIGTERM,
        SIGKILL 5 s later, before the bootstrap could write its exit)
    EXITED, PAUSED, on-demand pod, no exit record                  -> exited, code unknown
    TERMINATED with an exit record of a command that ended by
        itself (the adapter releases every ended pod)              -> as EXITED with that record
    TERMINATED otherwise                                           -> preempted (podTerminate: by
        the reconciler, or by a person in RunPod's console)
    DEAD                                                           -> lost
    a pod seen before and gone from the list                       -> lost (preempted if this
        adapter terminated it)

`cost_usd` is the pod's `costPerHr` times its `uptimeSeconds`. Pods of other owners (their
RECONCILER_LABELS name another owner) are counted in `foreign_workers` and never touched; pods
without our labels are not ours and not counted.
"""

from __future__ import annotations

import logging
import math
import os
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters import compute
from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from adapters.hosted import SECRETS_FROM_ENV, UNPACK_PY, Bootstrap, bootstrap_script, packed, parse_exit_record
from adapters.hosted_base import HostedAdapter, worker_name
from adapters.http import HostedApi
from adapters.preflight import Check, fail, ok, warn
from adapters.wire import DATE_MAX, MONEY_MAX, PRICE_MAX, is_decimal
from desired.models import Capacity, RunpodSettings

log = logging.getLogger("reconciler.runpod")

KEY_HINT = "the key is read from RUNPOD_API_KEY, else from ~/.runpod/config.toml ([default] api_key)"
LABELS_VAR = "RECONCILER_LABELS"
# The only job variables also put in the pod's own env, for the daemon to read back (where the
# exit record is). The job's env travels in the bootstrap alone: RunPod rewrites any env value
# holding `{{ RUNPOD_SECRET_... }}`, so a plain value could pull in a secret or fail the launch.
POD_ENV = ("RECONCILER_RUN_URI", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
GRACE_SECONDS = 5  # RunPod: SIGTERM, then SIGKILL 5 s later
NAME_LIMIT = 60
CAPACITY_WORDS = ("no longer any instances available", "no instances", "not enough", "capacity", "unavailable")
BALANCE_WORDS = ("balance", "insufficient funds", "credit")
BID_WORDS = ("minimum bid", "bid price", "bidpergpu", "outbid")
GONE_WORDS = ("not found", "does not exist", "no pod")

POD_FIELDS = "id name desiredStatus lastStatusChange uptimeSeconds costPerHr gpuCount imageName env podType"
Q_PODS = f"query Pods {{ myself {{ pods {{ {POD_FIELDS} }} }} }}"
Q_POD = f"query Pod($podId: String!) {{ pod(input: {{podId: $podId}}) {{ {POD_FIELDS} }} }}"
Q_GPU = ("query Gpu($id: String!, $gpuCount: Int!) { gpuTypes(input: {id: $id}) { id displayName memoryInGb "
         "lowestPrice(input: {gpuCount: $gpuCount}) { minimumBidPrice uninterruptablePrice } } }")
Q_BALANCE = "query Balance { myself { id clientBalance } }"
M_SPOT = ("mutation Rent($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) "
          "{ id name desiredStatus costPerHr } }")
M_ON_DEMAND = ("mutation Deploy($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) "
               "{ id name desiredStatus costPerHr } }")
M_TERMINATE = "mutation Terminate($podId: String!) { podTerminate(input: {podId: $podId}) }"
M_STOP = "mutation Stop($podId: String!) { podStop(input: {podId: $podId}) { id desiredStatus } }"
# The bootstrap's last act on RunPod. RunPod restarts a container whose command ends (its own
# templates end in `sleep infinity`), so a finished pod would run and bill on: the pod stops
# itself with its own id (RUNPOD_POD_ID) and the key RunPod puts in every pod, not the user's:
# RUNPOD_API_KEY, "Pod-scoped API key" (docs.runpod.io/pods/templates/environment-variables), the
# key the runpodctl preinstalled in every pod uses (docs.runpod.io/runpodctl/overview), whose
# `stop pod` sends this same podStop (runpodctl api/pod.go). The user grants nothing for it; that
# this key may stop its own pod through GraphQL is [UNCONFIRMED] live (RunPod does not say what
# "pod-scoped" allows). podStop, not podTerminate: a terminated pod leaves the list at
# once, and the daemon reads how it ended from a listed EXITED pod (then releases it). With no
# volume (volumeInGb 0) a stopped pod bills nothing: its container disk is only paid while running.
# A failed call is said in the log; the daemon's own release stays the second line of defence.
SELF_STOP = """
def at_exit(record):
    pod, key = os.environ.get("RUNPOD_POD_ID"), os.environ.get("RUNPOD_API_KEY")
    if not pod or not key:
        return say("not stopping this pod: RUNPOD_POD_ID or RUNPOD_API_KEY is unset; the reconciler will")
    import urllib.request
    body = json.dumps({"query": %(query)r, "variables": {"podId": pod}}).encode()
    request = urllib.request.Request(%(url)r, body, {"Content-Type": "application/json",
                                                     "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            errors = json.loads(answer.read()).get("errors")
    except Exception as exc:
        errors = [{"message": type(exc).__name__ + ": " + str(exc)[:200]}]
    if errors:
        say("could not stop this pod (the reconciler will): " + str(errors)[:300])
"""

ENDED_STATES = ("EXITED", "PAUSED", "TERMINATED", "DEAD")
SOON_STATES = {"CREATED": WorkerPhase.PENDING, "RUNNING": WorkerPhase.RUNNING, "RESTARTING": WorkerPhase.RUNNING}


def read_api_key(environ: Mapping[str, str], home: Path) -> str | None:
    """RunPod's standard places: RUNPOD_API_KEY, then the SDK's config file (profile `default`)."""
    if environ.get("RUNPOD_API_KEY"):
        return environ["RUNPOD_API_KEY"]
    path = home / ".runpod" / "config.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    value = data.get("default", {}).get("api_key") if isinstance(data.get("default"), dict) else None
    return value if isinstance(value, str) and value else None


def pod_name(owner: str, job: str, run_id: str, epoch: int) -> str:
    """`rc-<owner>-<job>-<run_id>-e<epoch>`, cut and suffixed with a hash when too long for a name."""
    return worker_name(owner, job, run_id, epoch, NAME_LIMIT, keep_epoch=True)


def start_command(script: str) -> str:
    """dockerArgs: `sh -c '...'` decoding the bootstrap to a file and exec'ing it. The inner script
    holds no single quote (base64 in double quotes, a Python one-liner without quotes of either
    kind inside), so it is one argument whether RunPod runs dockerArgs through a shell or splits it."""
    inner = (f'B="{packed(script)}"; F="${{TMPDIR:-/tmp}}/reconciler-bootstrap-$$.py"; '
             f'printf %s "$B" | python3 -c "{UNPACK_PY}" > "$F" && exec python3 "$F"')
    return f"sh -c '{inner}'"


def env_map(raw: Any) -> dict[str, str]:
    """A pod's env as RunPod returns it (["K=V", ...] or [{key, value}]) as a dict."""
    out: dict[str, str] = {}
    for item in raw or []:
        if isinstance(item, str) and "=" in item:
            key, value = item.split("=", 1)
            out[key] = value
        elif isinstance(item, dict) and isinstance(item.get("key"), str):
            out[item["key"]] = str(item.get("value", ""))
    return out


def parse_labels(value: str | None) -> tuple[str, str, str, int] | None:
    parts = (value or "").split("/")
    if len(parts) != 4 or not parts[3].startswith("e") or not is_decimal(parts[3][1:]):
        return None
    return parts[0], parts[1], parts[2], int(parts[3][1:])


class RunpodAdapter(HostedAdapter):
    """RunPod pods through the GraphQL API (see the module docstring for the state table)."""

    kind = "runpod"
    settings: RunpodSettings
    # An ended pod is terminated once seen ended this long: never while RunPod's 5 s stop may
    # still be running its final save (desiredStatus may flip before the container is gone).
    release_after = 30.0

    def __init__(self, name: str, settings: RunpodSettings, *, owner: str = compute.ANY_OWNER,
                 environ: Mapping[str, str] | None = None, home: Path | None = None) -> None:
        super().__init__(name, settings, owner)
        self.environ = os.environ if environ is None else environ
        self._home = home or Path.home()
        self._api = self.connect()  # now: a missing key is said when the adapter is made, not at its first call
        self._pods: dict[str, dict[str, Any]] = {}  # pod id -> last seen pod (ours)
        self._refs: dict[str, WorkerRef] = {}  # pod id -> ref, for pods that later vanish
        self._terminated: set[str] = set()
        self._records: dict[str, dict[str, Any]] = {}  # pod id -> exit record (final, cached)
        self._final: dict[str, WorkerState] = {}  # pod id -> how it ended, as reported before its release
        self._ended_since: dict[str, float] = {}  # pod id -> when this process first saw it ended

    # ---- GraphQL -----------------------------------------------------------------------------
    def connect(self) -> HostedApi:
        key = read_api_key(self.environ, self._home)
        if not key:
            raise ProviderConfigError(f"{self.who} has no API key: {KEY_HINT}")
        return self.client(self.settings.api_url, f"Bearer {key}", KEY_HINT)

    def graphql(self, query: str, variables: dict[str, Any] | None = None, *, acts: bool = False) -> dict[str, Any]:
        """One GraphQL request; its `errors` (sent with HTTP 200) mapped to our exceptions."""
        body = self.api.call("POST", "/graphql", json_body={"query": query, "variables": variables or {}}, acts=acts)
        if not isinstance(body, dict):
            raise ProviderUnavailable(f"{self.who} answered with something that is not a GraphQL response")
        errors = body.get("errors")
        if errors:
            raise self._error(errors)
        data = body.get("data")
        if not isinstance(data, dict):
            raise ProviderUnavailable(f"{self.who} answered a GraphQL request without data")
        return data

    def _error(self, errors: Any) -> Exception:
        first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else {}
        message = " ".join(str(first.get("message", "unknown error")).split())[:200]
        words = message.lower()
        if "unauthorized" in words or "api key" in words:
            return ProviderConfigError(f"{self.who}: the key was refused ({message}); {KEY_HINT}")
        if any(w in words for w in BALANCE_WORDS):
            return ProviderUnavailable(f"{self.who}: the account's balance is too low ({message})")
        if any(w in words for w in BID_WORDS):
            return ProviderUnavailable(f"{self.who}: the bid is below the market ({message})")
        if any(w in words for w in CAPACITY_WORDS):
            return ProviderUnavailable(f"{self.who} has no capacity for {self.settings.gpu_type_id} ({message})")
        return ProviderConfigError(f"{self.who} refused the request: {message}")

    # ---- launch ------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> WorkerRef:
        self.launch_labels(spec)
        name = pod_name(self.owner, spec.job, spec.run_id, spec.epoch)
        for pod in self._list_pods():
            if pod.get("name") == name and self._owner_of(pod) == self.owner:
                return self._ref(pod)  # adopt: launched before, maybe by a create that timed out
        mutation, field = (M_SPOT, "podRentInterruptable") if self.settings.interruptible \
            else (M_ON_DEMAND, "podFindAndDeployOnDemand")
        data = self.graphql(mutation, {"input": self._pod_input(spec, name)}, acts=True)
        created = data.get(field)
        if not isinstance(created, dict) or not created.get("id"):
            raise ProviderUnavailable(f"{self.who} created no pod for {name}")
        ref = WorkerRef(self.name, str(created["id"]), spec.job, spec.run_id, spec.epoch)
        self._refs[ref.id] = ref
        return ref

    def _pod_input(self, spec: LaunchSpec, name: str) -> dict[str, Any]:
        env = compute.with_deadline(spec.env, compute.worker_deadline(spec))
        env.setdefault("RECONCILER_GRACE", str(GRACE_SECONDS))
        spec = LaunchSpec(**{**spec.__dict__, "env": env})
        labels = {"owner": self.owner, "provider": self.name, "job": spec.job, "run_id": spec.run_id,
                  "epoch": spec.epoch}
        stop = SELF_STOP % {"query": M_STOP, "url": self.settings.api_url.rstrip("/") + "/graphql"}
        script = bootstrap_script(spec, labels, Bootstrap("runpod", SECRETS_FROM_ENV, None, at_exit_source=stop),
                                  code_git=spec.code_git, code_ref=spec.code_ref)
        pod_env = {k: env[k] for k in POD_ENV if k in env}
        pod_env[LABELS_VAR] = f"{self.owner}/{spec.job}/{spec.run_id}/e{spec.epoch}"
        pod_env.update({s: f"{{{{ RUNPOD_SECRET_{s} }}}}" for s in sorted(spec.secret_env)})
        body: dict[str, Any] = {
            "name": name, "imageName": spec.image or self.settings.image, "cloudType": self.settings.cloud_type,
            "gpuTypeId": self.settings.gpu_type_id, "gpuCount": max(1, spec.gpus),
            "volumeInGb": 0, "containerDiskInGb": self.settings.container_disk_gb,
            "minVcpuCount": max(1, spec.cpus), "minMemoryInGb": max(1, math.ceil(spec.memory_gb or 1)),
            "dockerArgs": start_command(script), "ports": "", "volumeMountPath": "/workspace",
            "env": [{"key": k, "value": v} for k, v in pod_env.items()],
        }
        cap = spec.max_price_per_hour
        if self.settings.interruptible:
            body["bidPerGpu"] = self.settings.bid_per_gpu or self.minimum_bid(body["gpuCount"])
            if cap is not None and body["bidPerGpu"] * body["gpuCount"] > cap:
                raise ProviderUnavailable(
                    f"{self.who}: the spot bid of ${body['bidPerGpu']:g}/h per GPU for {body['gpuCount']} GPU(s) "
                    f"is above the job's cap of ${cap:g}/h")
        elif cap is not None:
            price = self.numbers.number(self.lowest_prices(body["gpuCount"]).get("uninterruptablePrice"),
                                        "uninterruptablePrice", high=PRICE_MAX)
            if price is None:  # an unknown price cannot be shown to be under the cap
                raise ProviderUnavailable(f"{self.who} did not say what on-demand {self.settings.gpu_type_id} costs, "
                                          f"so the job's cap of ${cap:g}/h cannot be checked")
            if price * body["gpuCount"] > cap:
                raise ProviderUnavailable(
                    f"{self.who}: on-demand {self.settings.gpu_type_id} costs ${price:g}/h per GPU, above the "
                    f"job's cap of ${cap:g}/h for {body['gpuCount']} GPU(s)")
        return body

    def lowest_prices(self, gpus: int) -> dict[str, Any]:
        """The GPU type's current lowest prices per GPU: minimumBidPrice and uninterruptablePrice."""
        data = self.graphql(Q_GPU, {"id": self.settings.gpu_type_id, "gpuCount": gpus})
        types = data.get("gpuTypes") or []
        found = types[0].get("lowestPrice") if types and isinstance(types[0], dict) else None
        return found if isinstance(found, dict) else {}

    def minimum_bid(self, gpus: int) -> float:
        """The GPU type's current minimum spot bid per GPU."""
        price = self.numbers.number(self.lowest_prices(gpus).get("minimumBidPrice"), "minimumBidPrice",
                                    high=PRICE_MAX)
        if price is None or price <= 0:
            raise ProviderUnavailable(f"{self.who} offers no spot price for {self.settings.gpu_type_id} now")
        return price

    # ---- observe -----------------------------------------------------------------------------
    def _list_pods(self) -> list[dict[str, Any]]:
        pods = ((self.graphql(Q_PODS).get("myself") or {}).get("pods")) or []
        return [p for p in pods if isinstance(p, dict) and p.get("id")]

    def _owner_of(self, pod: dict[str, Any]) -> str | None:
        labels = parse_labels(env_map(pod.get("env")).get(LABELS_VAR))
        return labels[0] if labels else None

    def _ref(self, pod: dict[str, Any]) -> WorkerRef:
        labels = parse_labels(env_map(pod.get("env")).get(LABELS_VAR))
        assert labels is not None
        ref = WorkerRef(self.name, str(pod["id"]), labels[1], labels[2], labels[3])
        self._refs[ref.id] = ref
        return ref

    def observe(self) -> dict[WorkerRef, WorkerState]:
        out: dict[WorkerRef, WorkerState] = {}
        foreign = 0
        listed: set[str] = set()
        for pod in self._list_pods():
            owner = self._owner_of(pod)
            if owner is None:
                continue
            if not self.owns(owner):
                foreign += 1
                continue
            ref = self._ref(pod)
            listed.add(ref.id)
            self._pods[ref.id] = pod
            out[ref] = self._final.get(ref.id) or self._state(pod)
            if ref.id not in self._final and (pod.get("desiredStatus") in ENDED_STATES
                                              or out[ref].phase not in (WorkerPhase.PENDING, WorkerPhase.RUNNING)):
                self._settle(ref, pod, out[ref])
        for pod_id, ref in self._refs.items():
            if pod_id not in listed and pod_id in self._pods:
                out[ref] = self._final.get(pod_id) or self._vanished(pod_id)
        self.foreign_workers = foreign
        return out

    def _settle(self, ref: WorkerRef, pod: dict[str, Any], state: WorkerState) -> None:
        """Once a pod has been seen ended for `release_after`, its state is final (no more reads of
        the run folder for it), and a stopped pod is released."""
        since = self._ended_since.setdefault(ref.id, time.monotonic())
        if time.monotonic() - since < self.release_after:
            return
        if pod.get("desiredStatus") in ("EXITED", "PAUSED", "RESTARTING") and not self.operator:
            self._release(ref, state)
        else:
            self._final[ref.id] = state

    def _release(self, ref: WorkerRef, state: WorkerState) -> None:
        """An ended pod is terminated (a stopped pod still holds its disk, and is listed forever);
        this process keeps reporting how it ended, and a restarted one reads the same from the
        exit record (see TERMINATED in the state table). A failed release is tried next tick."""
        try:
            self.graphql(M_TERMINATE, {"podId": ref.id})
        except (ProviderUnavailable, ProviderConfigError) as exc:
            log.debug("%s: releasing ended pod %s failed (%s); next tick", self.who, ref.id, exc)
            return
        self._final[ref.id] = state

    def _vanished(self, pod_id: str) -> WorkerState:
        if pod_id in self._terminated:
            return WorkerState(WorkerPhase.PREEMPTED, provider_state="gone",
                               detail="terminated by the reconciler (podTerminate); the pod is gone")
        return WorkerState(WorkerPhase.LOST, provider_state="gone", detail="the pod is no longer listed by RunPod")

    def _state(self, pod: dict[str, Any]) -> WorkerState:
        word = str(pod.get("desiredStatus") or "")
        cost = self._cost(pod)
        if word == "RESTARTING" and self._ended_by_itself(pod):  # its stop failed: RunPod would run it again
            return self._ended(pod, word, cost)
        if word in SOON_STATES:
            return WorkerState(SOON_STATES[word], provider_state=word, cost_usd=cost)
        if word == "TERMINATED":
            if self._ended_by_itself(pod):  # it had ended by itself, then was released
                return self._ended(pod, "EXITED", cost)
            return WorkerState(WorkerPhase.PREEMPTED, provider_state=word, cost_usd=cost,
                               detail="terminated by the reconciler or by a person in RunPod's console (podTerminate)")
        if word == "DEAD":
            return WorkerState(WorkerPhase.LOST, provider_state=word, cost_usd=cost,
                               detail="RunPod reports the pod dead")
        if word in ("EXITED", "PAUSED"):
            return self._ended(pod, word, cost)
        return WorkerState(WorkerPhase.LOST, provider_state=word or "unknown", cost_usd=cost,
                           detail=f"RunPod state {word!r} is not one this adapter knows")

    def _ended_by_itself(self, pod: dict[str, Any]) -> bool:
        """The run folder holds an exit record of a command that ended without RunPod's SIGTERM."""
        record, _ = self._exit_record(pod)
        return record is not None and not record.get("received")

    def _ended(self, pod: dict[str, Any], word: str, cost: float | None) -> WorkerState:
        record, why = self._exit_record(pod)
        if record is not None:
            code = record.get("code")
            code = code if isinstance(code, int) else None
            sig = record.get("signal")
            if record.get("received"):  # RunPod stopped the machine (outbid, balance): not the job's doing
                return WorkerState(WorkerPhase.PREEMPTED, exit_code=code, provider_state=word, signal=sig,
                                   cost_usd=cost, detail=f"stopped by RunPod ({pod.get('lastStatusChange') or word}):"
                                   f" {record['received']} reached the worker, which exited with code {code}")
            detail = str(record.get("reason") or "")
            if sig:
                detail = f"the command died of {sig}, which the reconciler did not send"
            return WorkerState(WorkerPhase.EXITED, exit_code=code, provider_state=word, detail=detail, signal=sig,
                               cost_usd=cost)
        if str(pod.get("podType") or "").upper() in ("INTERRUPTABLE", "INTERRUPTIBLE", "BID") or (
                not pod.get("podType") and self.settings.interruptible):
            return WorkerState(WorkerPhase.PREEMPTED, provider_state=word, cost_usd=cost,
                               detail="spot pod stopped by RunPod (outbid: SIGTERM, SIGKILL 5 s later) "
                                      f"before the worker wrote its exit ({why})")
        return WorkerState(WorkerPhase.EXITED, provider_state=word, cost_usd=cost,
                           detail=f"exit code unknown: RunPod reports none and {why}")

    def _exit_record(self, pod: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """The bootstrap's exit record from the run folder, or None and why not."""
        pod_id = str(pod["id"])
        if pod_id in self._records:
            return self._records[pod_id], ""
        text, why = self._stored_log(pod)
        record = parse_exit_record(text) if text else None
        if record is not None:
            self._records[pod_id] = record
        return record, why or "the run folder holds no exit record for it"

    def _stored_log(self, pod: dict[str, Any]) -> tuple[str, str]:
        env = env_map(pod.get("env"))
        uri, labels = env.get("RECONCILER_RUN_URI"), parse_labels(env.get(LABELS_VAR))
        if not uri or labels is None:
            return "", "the pod names no run folder"
        from adapters.storage import RunFolder

        options: dict[str, Any] = {}
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if endpoint and uri.startswith("s3://"):
            options["endpoint_url"] = endpoint
        try:
            return RunFolder(uri, options).attempt_log(labels[3]), ""
        except Exception as exc:  # noqa: BLE001 - storage of any kind; the reason goes into the detail
            return "", f"the run folder could not be read ({' '.join(str(exc).split())[:120]})"

    def _cost(self, pod: dict[str, Any]) -> float | None:
        rate = self.numbers.number(pod.get("costPerHr"), "pod costPerHr", high=PRICE_MAX)
        uptime = self.numbers.number(pod.get("uptimeSeconds"), "pod uptimeSeconds", high=DATE_MAX)
        if rate is None or uptime is None:
            return None
        return round(rate * uptime / 3600.0, 6)

    # ---- terminate, logs, money --------------------------------------------------------------
    def terminate(self, ref: WorkerRef) -> None:
        if ref.provider != self.name:
            return
        pod = self._find(ref.id)
        if pod is None or not self.owns(self._owner_of(pod)):
            return  # gone already, or not ours: never touched
        try:
            self.graphql(M_TERMINATE, {"podId": ref.id})
        except ProviderConfigError as exc:
            if not any(w in str(exc).lower() for w in GONE_WORDS):
                raise
        self._terminated.add(ref.id)

    def _find(self, pod_id: str) -> dict[str, Any] | None:
        try:
            pod = self.graphql(Q_POD, {"podId": pod_id}).get("pod")
        except ProviderConfigError as exc:
            if any(w in str(exc).lower() for w in GONE_WORDS):
                return None
            raise
        return pod if isinstance(pod, dict) and pod.get("id") else None

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        """RunPod has no log API: the tail the bootstrap copied into the run folder, if ours."""
        pod = self._pods.get(ref.id) or self._find(ref.id)
        if pod is None or not self.owns(self._owner_of(pod)):
            return ""
        text, _ = self._stored_log(pod)
        return "\n".join(text.splitlines()[-tail:])

    def allowance(self) -> compute.Allowance:
        """The account's prepaid balance (USD) as credits."""
        me = self.graphql(Q_BALANCE).get("myself") or {}
        balance = self.numbers.number(me.get("clientBalance"), "clientBalance", low=-MONEY_MAX, high=MONEY_MAX)
        if balance is None:
            raise ProviderUnavailable(f"{self.who} did not say the account's balance")
        return compute.Allowance(unit="credits", remaining=balance, minimum=0.0)

    def capacity(self) -> Capacity | None:
        return Capacity(gpu_models=[self.settings.gpu_type_id])

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        """`reconciler doctor`: the GPU type's price now for each job, against its cap (no pod made);
        secrets live in RunPod's store, which its API does not list: said, not checked."""
        checks = []
        for spec in specs:
            gpus = max(1, spec.gpus)
            prices = self.lowest_prices(gpus)
            word = "minimumBidPrice" if self.settings.interruptible else "uninterruptablePrice"
            price = self.settings.bid_per_gpu if self.settings.interruptible and self.settings.bid_per_gpu \
                else prices.get(word)
            checks.append(self._price_check(spec, gpus, price))
            if spec.secret_env:
                names = ", ".join(sorted(spec.secret_env))
                checks.append(warn(self.name, f"secrets of {spec.job}", f"{names} are read from RunPod's secret "
                                   "store, which its API does not list", f"make sure RunPod has secrets named {names} "
                                   "(console: Secrets)"))
        return checks

    def _price_check(self, spec: LaunchSpec, gpus: int, price: Any) -> Check:
        what, gpu = f"price for {spec.job}", self.settings.gpu_type_id
        if not isinstance(price, (int, float)) or price <= 0:
            return fail(self.name, what, f"RunPod offers no {'spot' if self.settings.interruptible else 'on-demand'} "
                        f"price for {gpu} now", "choose another gpu_type_id, or try again later")
        total, cap = price * gpus, spec.max_price_per_hour
        detail = f"{gpus} x {gpu} at ${price:g}/h per GPU (${total:g}/h)"
        if cap is not None and total > cap:
            return fail(self.name, what, f"{detail} is above the job's cap of ${cap:g}/h",
                        "raise the job's max_price_per_hour or choose a cheaper gpu_type_id")
        return ok(self.name, what, detail)


__all__ = ["RunpodAdapter", "read_api_key", "pod_name", "start_command", "KEY_HINT"]
