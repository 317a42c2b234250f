"""The `vast` compute adapter: one rented Vast.ai instance per worker, found by its label.

Vast.ai is a marketplace of other people's machines. A launch searches the offers
(`POST /api/v0/bundles/`) for the job's resources, host reliability and the price cap, and rents the
cheapest (then most reliable) with `PUT /api/v0/asks/{offer}/`: interruptible with a bid (`price` =
the offer's `min_bid` plus a small margin, never above `max_price_per_hour`), or on-demand at its
`dph_total`. An offer gone between search and rent is skipped for the next one. The instance is an
"args" launch (`runtype: args`, `onstart: sh`, `args: ["-c", <script>]`, as the official CLI's
`--onstart-cmd bash --args -c ...` example): the container's main process is our script, so the
instance shows `exited` when the worker ends and Docker's stop signal reaches the bootstrap. The
script writes the generated bootstrap (adapters/hosted.py), carried base64, and execs it with
python3, so no argument or variable of the job ever passes through a shell.

Secrets travel in the create request's `env` object (Vast's documented path; it has no per-instance
secret store): they are visible to the host machine, never written to a log, label or message here.
The job's plain env travels inside the bootstrap, so the `env` object holds the secrets alone.

Labels: `reconciler:<owner>:<job>:<run_id>:<epoch>` (':' cannot occur in a label part), listed with
`GET /api/v1/instances/` (paged). Instances of other owners are counted in `foreign_workers`, never
touched. A launch first looks for an instance with its label, so a create that timed out after
acting is adopted, never doubled.

State table (Vast's `actual_status` / `intended_status` -> WorkerPhase):

    null created loading scheduling (cur_state)         -> pending; still loading after
                                                           `loading_timeout_seconds`: destroyed, lost
                                                           ("capacity unavailable")
    running                                             -> running
    stopped, intended running (outbid)                  -> preempted ("outbid")
    stopped otherwise (credit spent, host stop)         -> preempted (Vast's status_msg)
    offline unknown                                     -> running while it may be a blip; preempted
                                                           ("host offline") after `offline_grace_seconds`
    exited                                              -> exited, with the bootstrap's exit record
                                                           read from the instance's logs
    destroyed by this reconciler                        -> preempted ("destroyed by the reconciler")
    rebooting frozen (transitional), or any state       -> running while it lasts; still in it after
    Vast's docs do not list                                TRANSITION_TIMEOUT_SECONDS (15 min):
                                                           destroyed, lost
    gone from the list, seen before by this process     -> lost ("gone from Vast's list")

The documented `actual_status` values are vastai's SKILL.md table (null created loading running
stopped frozen exited rebooting unknown offline); `scheduling` is a `cur_state` (create-instance
help: stuck in it means the machine's resources are unavailable).

Money: `cost_usd` = the instance's `dph_total` x its time from `start_date` to `end_date` (or now).
Finished instances still bill their disk, so an instance reported ended (exited, stopped, offline)
is destroyed on the next observation (the planner stops only live workers: `finish`, `hold_finished`),
not at once, so a daemon restarted in between still reads how it ended; this process remembers its
last state for an hour. `terminate` destroys (not stops); a destroy that fails
raises, and the planner repeats it every tick. `allowance()` is the account's credit balance.

Bids: `price` is $/h for the whole instance (vastai's create-instance help: "per machine bid price"),
compared with the offer's `min_bid` and the cap as they are, whatever the offer's GPU count.

Launch mode (confirmed from the official client, not on a real host): in the `args` runtype Vast runs
the image as is and the request's `onstart` is the entrypoint override (vastai's CLI sets
`onstart_cmd = entrypoint` when no onstart script is given; docs.vast.ai's launch-modes page: the
entrypoint is the main process), so `onstart: sh` + `args` makes our script the container's main process.

Known limit: an outbid instance is destroyed and relaunched (a new epoch from the last checkpoint),
never resumed by raising the bid. vastai's SKILL.md documents that an outbid instance moves to
`stopped`; that `intended_status` stays `running` then is assumed.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from adapters import compute
from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from adapters.hosted import SECRETS_FROM_ENV, UNPACK_PY, Bootstrap, bootstrap_script, packed, parse_exit_record
from adapters.hosted_base import HostedAdapter
from adapters.http import HostedApi, HttpRefused
from adapters.preflight import Check, fail, ok
from adapters.wire import DATE_MAX, MONEY_MAX, PRICE_MAX, is_decimal
from desired.models import Capacity, VastSettings

LABEL_PREFIX = "reconciler"
KEY_PLACES = ("the VAST_API_KEY environment variable, $XDG_CONFIG_HOME/vastai/vast_api_key "
              "(or ~/.config/vastai/vast_api_key) or ~/.vast_api_key")
PENDING = {None, "", "created", "loading", "scheduling"}
OFFLINE = {"offline", "unknown"}
# Documented `actual_status` values that pass (vastai's SKILL.md status table: `rebooting` "restarting
# (transient)", `frozen` "paused with memory"): a live instance in one is waited for, not replaced.
TRANSITIONAL = {"rebooting", "frozen"}
TRANSITION_TIMEOUT_SECONDS = 900.0
"""How long a live instance may stay in a transitional (or an undocumented) state before it is
destroyed and counted lost: a reboot takes minutes, and a healthy instance that reboots must not be
replaced (a new epoch from the last checkpoint) the moment Vast reports it."""
FORGET_AFTER_SECONDS = 3600.0
BID_MARGIN = 1.05  # bid 5% over the offer's minimum, so a small rise does not outbid us at once
SEARCH_QUOTA = "search_quota_exceeded"
# A refusal that concerns this offer only (rented by someone else, or its minimum bid rose above
# ours since the search): the next offer is tried.
GONE_OFFER = ("no_such_ask", "not available", "unavailable", "no longer", "already rented", "invalid_price")


def read_api_key(environ: dict[str, str] | None = None) -> str | None:
    """The key from Vast's standard places, in the official client's order."""
    env = os.environ if environ is None else environ
    if env.get("VAST_API_KEY"):
        return env["VAST_API_KEY"].strip()
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    for path in (Path(config) / "vastai" / "vast_api_key", Path.home() / ".vast_api_key"):
        try:
            key = path.read_text().strip()
        except OSError:
            continue
        if key:
            return key
    return None


def onstart_script(bootstrap: str) -> str:
    """The `sh -c` script that unpacks the bootstrap (zlib and base64: nothing in it can mean
    anything to a shell) and execs it with python3 as the container's main process."""
    return (f'cd "$(mktemp -d)" && printf %s {packed(bootstrap)} | python3 -c "{UNPACK_PY}" > bootstrap.py '
            f"&& exec python3 -u bootstrap.py\n")


def instance_label(owner: str, job: str, run_id: str, epoch: int) -> str:
    job, run_id = compute.check_label(job, "job name"), compute.check_label(run_id, "run id")
    return f"{LABEL_PREFIX}:{owner}:{job}:{run_id}:{epoch}"


def parse_label(label: Any) -> tuple[str, str, str, int] | None:
    """(owner, job, run_id, epoch) of one of our labels; None for anything else."""
    parts = label.split(":") if isinstance(label, str) else []
    if len(parts) != 5 or parts[0] != LABEL_PREFIX or not is_decimal(parts[4]):
        return None
    return parts[1], parts[2], parts[3], int(parts[4])


class VastAdapter(HostedAdapter):
    """Vast.ai instances (see the module docstring for the state table and the money rules)."""

    kind = "vast"
    settings: VastSettings
    secrets_at_provider = False
    offline_grace_seconds = 60.0  # an offline host this long is an interruption, not a blip
    transition_timeout_seconds = TRANSITION_TIMEOUT_SECONDS

    def __init__(self, name: str, settings: VastSettings, owner: str = compute.ANY_OWNER) -> None:
        super().__init__(name, settings, owner)
        self._seen: dict[str, WorkerRef] = {}  # instance id -> ref, for instances that vanish
        self._ended: dict[str, WorkerState] = {}  # reported ended; destroyed on the next look
        self._destroyed: dict[str, WorkerState] = {}  # destroyed by us: their last word
        self._offline_since: dict[str, float] = {}
        self._loading_since: dict[str, float] = {}
        self._transition_since: dict[str, float] = {}
        self._gone_since: dict[str, float] = {}

    # ---- HTTP -------------------------------------------------------------------------------------

    def connect(self) -> HostedApi:
        key = read_api_key()
        if not key:
            raise ProviderConfigError(f"{self.who} has no API key; it is read from {KEY_PLACES}")
        return self.client(self.settings.api_url, f"Bearer {key}", f"the API key is read from {KEY_PLACES}",
                           headers={"Accept": "application/json"}, final_errors=frozenset({SEARCH_QUOTA}))

    def _search(self, query: dict[str, Any]) -> list[dict[str, Any]]:
        """Offers; the daily search quota's 429 is not retried (it lasts until UTC midnight)."""
        try:
            answer = self.api.call("POST", "/api/v0/bundles/", json_body=query)
        except HttpRefused as exc:
            if exc.status == 429:
                raise ProviderUnavailable(
                    f"{self.who}: the search quota is spent until UTC midnight") from None
            raise
        offers = answer.get("offers") if isinstance(answer, dict) else None
        return [o for o in offers or [] if isinstance(o, dict)]

    def _instances(self) -> list[dict[str, Any]]:
        """Every instance of the account (all pages of the v1 list)."""
        rows: list[dict[str, Any]] = []
        params: dict[str, Any] = {"select_filters": "{}", "order_by": '[{"col": "id", "dir": "asc"}]', "limit": 25}
        for _ in range(200):
            page = self.api.call("GET", "/api/v1/instances/", params=params)
            if not isinstance(page, dict):
                raise ProviderUnavailable(f"{self.who} answered the instance list with no list")
            rows += [r for r in page.get("instances") or [] if isinstance(r, dict)]
            if not page.get("next_token"):
                return rows
            params["after_token"] = page["next_token"]
        raise ProviderUnavailable(f"{self.who} pages its instance list without end")

    # ---- launch -----------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> WorkerRef:
        self.launch_labels(spec)
        label = instance_label(self.owner, spec.job, spec.run_id, spec.epoch)
        for row in self._instances():
            if row.get("label") == label and str(row.get("id")) not in self._destroyed:
                return self._ref(row, spec)
        body = self._create_body(spec, label)
        for offer in self._offers(spec):
            instance_id = self._rent(offer, body)
            if instance_id is not None:
                return self._ref({"id": instance_id}, spec)
        raise ProviderUnavailable(f"{self.who} has no offer left for job {spec.job} "
                                  "within its resources and price cap")

    def _ref(self, row: dict[str, Any], spec: LaunchSpec) -> WorkerRef:
        ref = WorkerRef(self.name, str(row["id"]), spec.job, spec.run_id, spec.epoch)
        self._seen[ref.id] = ref
        return ref

    def query(self, spec: LaunchSpec) -> dict[str, Any]:
        """The offer search for this job (Vast's query object)."""
        s = self.settings
        q: dict[str, Any] = {
            "num_gpus": {"eq": spec.gpus} if spec.gpus else {"gte": 1},
            "reliability": {"gte": s.min_reliability},
            "disk_space": {"gte": s.disk_gb},
            "rentable": {"eq": True}, "rented": {"eq": False}, "external": {"eq": False},
            "order": [["dph_total", "asc"], ["reliability", "desc"]],
            **({"machine_id": {"notin": [int(h) if h.isdigit() else h for h in spec.avoid_hosts]}}
               if spec.avoid_hosts else {}),
            "type": "bid" if s.interruptible else "on-demand",
            "allocated_storage": s.disk_gb, "limit": 64,
        }
        if s.verified_only:
            q["verified"] = {"eq": True}
        if spec.gpu_model:
            q["gpu_name"] = {"eq": spec.gpu_model.replace("_", " ")}
        if spec.memory_gb:
            q["cpu_ram"] = {"gte": spec.memory_gb * 1000}  # MB, as Vast counts
        if spec.gpu_memory_gb:
            q["gpu_ram"] = {"gte": spec.gpu_memory_gb * 1000}
        if spec.cuda:
            q["cuda_max_good"] = {"gte": spec.cuda}
        if self.cap(spec) is not None and not s.interruptible:
            q["dph_total"] = {"lte": self.cap(spec)}
        return q

    def cap(self, spec: LaunchSpec | None = None) -> float | None:
        """The lower of the provider's and the job's price caps ($/h), if any."""
        caps = [c for c in (self.settings.max_price_per_hour, spec.max_price_per_hour if spec else None)
                if c is not None]
        return min(caps) if caps else None

    def price(self, offer: dict[str, Any], spec: LaunchSpec | None = None) -> float | None:
        """What we would pay per hour for this offer (the bid when interruptible); None above the cap."""
        cap = self.cap(spec)
        field = "min_bid" if self.settings.interruptible and offer.get("min_bid") else "dph_total"
        price = self.numbers.number(offer.get(field), f"offer {field}", high=PRICE_MAX)
        if price is None or (cap is not None and price > cap):
            return None
        if self.settings.interruptible:
            bid = round(price * BID_MARGIN + 0.001, 4)
            return min(bid, cap) if cap is not None else bid
        return price

    def _offers(self, spec: LaunchSpec) -> list[dict[str, Any]]:
        """Affordable offers, cheapest first, then the most reliable. Machines that lately lost a
        worker (`avoid_hosts`) are left out while any other machine fits; when none does, they are
        offered again rather than leaving the job waiting for hours."""
        found = self._priced(spec)
        if not found and spec.avoid_hosts:
            found = self._priced(replace(spec, avoid_hosts=()))
        return found

    def _priced(self, spec: LaunchSpec) -> list[dict[str, Any]]:
        priced = []
        for offer in self._search(self.query(spec)):
            price = self.price(offer, spec)
            reliability = self.numbers.number(offer.get("reliability") or 0, "offer reliability", high=1.0)
            offer_id = self.numbers.count(offer.get("id"), "offer id", high=2**63)
            if price is not None and reliability is not None and offer_id is not None:
                priced.append((price, -reliability, {**offer, "id": offer_id, "_price": price}))
        priced.sort(key=lambda p: (p[0], p[1]))
        return [p[2] for p in priced]

    def _create_body(self, spec: LaunchSpec, label: str) -> dict[str, Any]:
        labels = {"provider": self.name, "owner": self.owner, "job": spec.job, "run_id": spec.run_id,
                  "epoch": spec.epoch}
        script = bootstrap_script(spec, labels, Bootstrap(provider="vast", secrets_source=SECRETS_FROM_ENV),
                                  code_git=spec.code_git, code_ref=spec.code_ref)
        return {
            "client_id": "me", "image": spec.image or self.settings.image, "env": dict(spec.secret_env),
            "disk": self.settings.disk_gb, "label": label, "onstart": "sh", "args": ["-c", onstart_script(script)],
            "runtype": "args", "cancel_unavail": True,
        }

    def _rent(self, offer: dict[str, Any], body: dict[str, Any]) -> str | None:
        """The new instance's id, or None when the offer is gone (someone else rented it)."""
        payload = dict(body)
        if self.settings.interruptible:
            payload["price"] = offer["_price"]
        try:
            answer = self.api.call("PUT", f"/api/v0/asks/{int(offer['id'])}/", json_body=payload, acts=True)
        except HttpRefused as exc:
            if _offer_gone(exc.detail) or exc.status in (404, 410):
                return None
            raise ProviderUnavailable(f"{self.who} refused to rent offer {offer['id']}: "
                                      f"{exc.detail or exc.status}") from None
        if isinstance(answer, dict) and answer.get("success") and answer.get("new_contract") is not None:
            return str(answer["new_contract"])
        why = str((answer or {}).get("error") or (answer or {}).get("msg") or "") if isinstance(answer, dict) else ""
        if _offer_gone(why):
            return None
        raise ProviderUnavailable(
            f"{self.who} could not rent offer {offer['id']}: {why or 'no reason given'}")

    # ---- observe ----------------------------------------------------------------------------------

    def observe(self) -> dict[WorkerRef, WorkerState]:
        rows = self._instances()
        out: dict[WorkerRef, WorkerState] = {}
        foreign, listed = 0, set()
        for row in rows:
            labels = parse_label(row.get("label"))
            if labels is None or not self.owns(labels[0]):
                foreign += 1
                continue
            iid = str(row.get("id"))
            if iid in self._destroyed:
                continue
            listed.add(iid)
            ref = WorkerRef(self.name, iid, labels[1], labels[2], labels[3])
            self._seen[iid] = ref
            out[ref] = self._state(ref, row)
        self.foreign_workers = foreign
        for iid, ref in list(self._seen.items()):
            if iid in listed:
                continue
            if time.time() - self._gone_since.setdefault(iid, time.time()) > FORGET_AFTER_SECONDS:
                self._forget(iid)
                continue
            out[ref] = self._destroyed.get(iid) or self._ended.get(iid) or WorkerState(
                WorkerPhase.LOST, provider_state="gone", detail="gone from Vast's instance list")
        return out

    def _forget(self, iid: str) -> None:
        """A vanished instance's last word is kept an hour (the planner records it at once), then dropped."""
        for memory in (self._seen, self._ended, self._destroyed, self._gone_since, self._offline_since,
                       self._loading_since, self._transition_since):
            memory.pop(iid, None)

    def _state(self, ref: WorkerRef, row: dict[str, Any]) -> WorkerState:
        """One instance's state; an ended one reported before is destroyed now (its disk bills)."""
        if ref.id in self._ended:
            self._destroy_quietly(ref, self._ended[ref.id])
            return self._ended[ref.id]
        state = self._classify(ref, row)
        if row.get("machine_id") is not None:  # the planner's per-host cool-down keys on it
            state = replace(state, host=str(row["machine_id"]))
        if state.phase not in (WorkerPhase.PENDING, WorkerPhase.RUNNING) and not self.operator:
            self._ended[ref.id] = state
        return state

    def _classify(self, ref: WorkerRef, row: dict[str, Any]) -> WorkerState:
        actual, intended = row.get("actual_status"), row.get("intended_status")
        word = f"{actual}" + (f" (intended {intended})" if intended else "")
        cost, ended_at = self._cost(row)
        msg = str(row.get("status_msg") or "").strip()
        where = f" on machine {row['machine_id']}" if row.get("machine_id") is not None else ""  # per-host record
        if actual in PENDING or row.get("cur_state") == "scheduling":
            return self._pending(ref, row, word)
        if actual == "running":
            self._offline_since.pop(ref.id, None)
            self._transition_since.pop(ref.id, None)
            return WorkerState(WorkerPhase.RUNNING, provider_state=word, cost_usd=cost)
        if actual in OFFLINE:
            since = self._offline_since.setdefault(ref.id, time.time())
            if time.time() - since < self.offline_grace_seconds:
                return WorkerState(WorkerPhase.RUNNING, provider_state=word, detail="host offline for now",
                                   cost_usd=cost)
            return WorkerState(WorkerPhase.PREEMPTED, provider_state=word, cost_usd=cost,
                               detail=f"host offline{where}: {msg or actual}", ended_at=ended_at or time.time())
        if actual == "exited":
            return self._exited(ref, word, cost, ended_at)
        if actual == "stopped":
            why = "outbid (stopped by Vast while intended running)" if intended == "running" else "stopped by Vast"
            return WorkerState(WorkerPhase.PREEMPTED, provider_state=word,
                               detail=why + where + (f": {msg}" if msg else ""), ended_at=ended_at, cost_usd=cost)
        return self._transition(ref, actual, word, msg, cost)

    def _transition(self, ref: WorkerRef, actual: Any, word: str, msg: str, cost: float | None) -> WorkerState:
        """A passing state (rebooting, frozen) or one Vast's docs do not list: running while it lasts
        up to TRANSITION_TIMEOUT_SECONDS, then destroyed and lost."""
        known = actual in TRANSITIONAL
        since = self._transition_since.setdefault(ref.id, time.time())
        waited = time.time() - since
        what = f"{actual}" if known else f"undocumented Vast state {actual!r}"
        if waited <= self.transition_timeout_seconds or self.operator:
            return WorkerState(WorkerPhase.RUNNING, provider_state=word, cost_usd=cost,
                               detail=f"{what} for {waited:.0f} s" + (f": {msg}" if msg else ""))
        state = WorkerState(WorkerPhase.LOST, provider_state=word, ended_at=time.time(), cost_usd=cost,
                            detail=f"{what} for {waited:.0f} s, longer than {self.transition_timeout_seconds:.0f} s: "
                                   f"destroyed" + (f" ({msg})" if msg else ""))
        self._destroy_quietly(ref, state)  # a failed destroy is retried at the next observation
        return state

    def _pending(self, ref: WorkerRef, row: dict[str, Any], word: str) -> WorkerState:
        started = self.numbers.number(row.get("start_date"), "instance start_date", high=DATE_MAX)
        since = self._loading_since.setdefault(ref.id, started or time.time())
        waited = time.time() - since
        if waited <= self.settings.loading_timeout_seconds or self.operator:
            return WorkerState(WorkerPhase.PENDING, provider_state=word)
        state = WorkerState(WorkerPhase.LOST, provider_state=word, ended_at=time.time(),
                            detail=f"still loading after {waited:.0f} s: capacity unavailable, destroyed")
        self._destroy_quietly(ref, state)  # a failed destroy is retried at the next observation
        return state

    def _exited(self, ref: WorkerRef, word: str, cost: float | None, ended_at: float | None) -> WorkerState:
        record = parse_exit_record(self.logs(ref, 200)) or {}
        code = record.get("code")
        sig = record.get("signal")
        detail = str(record.get("reason") or "")
        if sig:
            detail = f"killed by {sig}, not by the reconciler" + (f"; {detail}" if detail else "")
        if code is None:
            detail = detail or "the container exited without the bootstrap's exit record"
        return WorkerState(WorkerPhase.EXITED, exit_code=code if isinstance(code, int) else None, provider_state=word,
                           detail=detail, signal=sig if isinstance(sig, str) else None, ended_at=ended_at,
                           cost_usd=cost)

    def _cost(self, row: dict[str, Any]) -> tuple[float | None, float | None]:
        """(dph_total x hours from start_date to end_date or now, end_date)."""
        start = self.numbers.number(row.get("start_date"), "instance start_date", high=DATE_MAX)
        rate = self.numbers.number(row.get("dph_total"), "instance dph_total", high=PRICE_MAX)
        if start is None or rate is None:
            return None, None
        end = row.get("end_date")
        ended = self.numbers.number(end, "instance end_date", high=DATE_MAX) if end else None
        hours = max(0.0, ((ended or time.time()) - start) / 3600)
        return round(rate * hours, 6), ended

    # ---- terminate, logs, money -------------------------------------------------------------------

    def terminate(self, ref: WorkerRef) -> None:
        """Destroy the instance (Docker's stop: SIGTERM, so the worker can save and exit 75, then SIGKILL)."""
        if ref.id in self._destroyed:
            return
        last = self._ended.get(ref.id)
        if last is None:
            row = self._own_row(ref)
            if row is None:
                return  # gone already, or another owner's
            cost, _ = self._cost({**row, "end_date": time.time()})
            last = WorkerState(WorkerPhase.PREEMPTED, provider_state="destroyed", signal="SIGTERM",
                               detail="destroyed by the reconciler", ended_at=time.time(), cost_usd=cost)
        self._destroy(ref, last)

    def _own_row(self, ref: WorkerRef) -> dict[str, Any] | None:
        """The instance, if it carries our owner's label (another owner's is never touched)."""
        row = self._instance(ref.id)
        labels = parse_label(row.get("label")) if row else None
        return row if labels is not None and self.owns(labels[0]) else None

    def _instance(self, iid: str) -> dict[str, Any] | None:
        if not is_decimal(iid):
            return None
        answer = self.api.call("GET", f"/api/v0/instances/{iid}/", params={"owner": "me"}, allow=(404,))
        row = answer.get("instances") if isinstance(answer, dict) else None
        return row if isinstance(row, dict) else None

    def _destroy(self, ref: WorkerRef, last: WorkerState) -> None:
        """Destroy (not stop: a stopped instance still bills its disk); raises when it fails."""
        if is_decimal(ref.id):
            self.api.call("DELETE", f"/api/v0/instances/{ref.id}/", json_body={}, allow=(404,))
        self._destroyed[ref.id] = last
        self._seen[ref.id] = ref

    def _destroy_quietly(self, ref: WorkerRef, last: WorkerState) -> None:
        try:
            self._destroy(ref, last)
        except (ProviderUnavailable, ProviderConfigError):
            pass  # tried again on the next observation

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        if self._own_row(ref) is None:
            return ""
        try:
            answer = self.api.call("PUT", f"/api/v0/instances/request_logs/{ref.id}/",
                                   json_body={"tail": str(tail)}, allow=(404,))
        except HttpRefused:
            return ""
        url = answer.get("result_url") if isinstance(answer, dict) else None
        text = _fetch_result(url) if isinstance(url, str) else ""
        return "\n".join(text.splitlines()[-tail:]) + ("\n" if text else "")

    def allowance(self) -> compute.Allowance:
        """The account's credit balance (1 credit = 1 USD)."""
        user = self.api.call("GET", "/api/v0/users/current")
        credit = self.numbers.number(user.get("credit") if isinstance(user, dict) else None, "account credit",
                                     low=-MONEY_MAX, high=MONEY_MAX)
        if credit is None:
            raise ProviderUnavailable(f"{self.who} did not say its credit balance")
        return compute.Allowance(unit="credits", remaining=credit, minimum=0.0)

    def capacity(self) -> Capacity | None:
        return None  # offers vary from one search to the next

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        """`reconciler doctor`: the offers each job would be rented from now (one search each, no rent)."""
        checks = []
        for spec in specs:
            offers, what = self._offers(spec), f"offers for {spec.job}"
            if not offers:
                checks.append(fail(self.name, what, "no offer fits its resources within the price cap now",
                                   "relax its gpu_model or memory, raise the price cap, or try again later"))
                continue
            kind = "bid" if self.settings.interruptible else "on-demand"
            checks.append(ok(self.name, what, f"{len(offers)} fit; the cheapest {kind} ${offers[0]['_price']:g}/h "
                                              f"(offer {offers[0]['id']}, {offers[0].get('gpu_name', 'GPU')})"))
        return checks


def _offer_gone(text: str) -> bool:
    return any(word in text.lower() for word in GONE_OFFER)


def _fetch_result(url: str, tries: int = 20, delay: float = 0.3) -> str:
    """Vast's log file at `result_url` (no auth: the URL is the capability), polled until ready."""
    for _ in range(tries):
        try:
            response = httpx.get(url, timeout=10)
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 200:
            return response.text
        time.sleep(delay)
    return ""
