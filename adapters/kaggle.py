"""The `kaggle` compute adapter: each job is one private Kaggle kernel (a script run as batch
versions), and each attempt is a new version of it whose source is the generated bootstrap
(adapters/hosted.py). One kernel per job because Kaggle secrets can only be attached by hand, per
kernel, in the editor: attached once to the job's kernel, they serve every later attempt.

Kaggle's API (docs: shared/reference/provider-apis.md §1) is `POST {api_url}/v1/{Service}/{Method}`
with camelCase JSON and defaults left out; we speak it through `adapters.http.HostedApi` rather
than through the `kaggle` package, which authenticates (and may exit) at import and cannot be
pointed at another endpoint. Calls used: SaveKernel (launch), GetKernelSessionStatus (state),
ListKernelSessionOutput (log), ListKernels + GetKernel (find our kernels after a restart),
GetAcceleratorQuotaStatistics (weekly GPU quota), IntrospectToken (the user behind a bare token).

Names. A kernel's slug is deterministic per (provider name, owner, job): `rc-<owner>-<job>-<hash8>`,
lower-cased and at most 49 characters, the hash of the full identity keeping it unique; its title
is the slug itself (Kaggle derives slugs from titles). Every push sends the same slug and title, as
`kaggle kernels push` does: a new slug creates the kernel, an existing one gets a new version that
starts running. Before pushing attempt N, launch reads the kernel's current source: if it already
is (run, N), it is adopted (a push that timed out after acting, a daemon restart), never pushed
twice; if an older attempt's version is still queued or running, nothing is pushed over it (what
Kaggle does to a running version on a new push is not documented; the fake replaces the run) and
the launch is refused as unavailable until it ends.

Finding workers. Kaggle has no labels. `observe` lists the account's kernels (ListKernels with
the CLI's `--mine` query: group PROFILE, user, sorted by run date, paged), keeps those whose slug
starts with `rc-` and ran in the last RECENT_DAYS, and reads each one's labels from the source of
its current version (GetKernel: the bootstrap's PLAN holds provider, owner, job, run id and epoch),
again only when the listing shows a newer version. Each kernel is reported once, as the attempt of
its current version with that version's status; older versions were replaced and are not reported
(the planner launches a new attempt only after the previous one ended). Right after a push Kaggle
may still report the previous version's end: each version's bootstrap prints which attempt it is,
and a finished status whose log names another attempt is read as pending. Kernels of
another owner or another provider entry are counted in `foreign_workers` while live (their status
is read, never their log), and are never touched. Finished states
(with their exit records and logs) are cached, so each finished version is read once per process.
No local state file: everything is read back from Kaggle, so a fresh daemon adopts what it finds.

State table (GetKernelSessionStatus `status` -> WorkerState; `provider_state` keeps Kaggle's word):

| Kaggle status                       | phase          | evidence                                      |
|-------------------------------------|----------------|-----------------------------------------------|
| (no `status`: QUEUED), NEW_SCRIPT   | pending        |                                               |
| RUNNING                             | running        |                                               |
| ERROR whose failureMessage names    | session-limit  | Kaggle's cut (the record, if any, shows only  |
|   the session or time limit         |                | the kill)                                     |
| ERROR, record code 75 near the cut  | session-limit  | the SDK saved and left before Kaggle's cut    |
| ERROR whose failureMessage says the | exited, oom    | Kaggle's memory kill                          |
|   kernel ran out of memory          |                |                                               |
| COMPLETE / ERROR with an exit record| exited(code)   | code, signal, reason of the bootstrap         |
| COMPLETE without a record           | exited(0)      |                                               |
| ERROR otherwise                     | exited(1)      | failureMessage in detail                      |
| CANCEL_REQUESTED/ACKNOWLEDGED       | preempted      | cancelled on Kaggle, not by the reconciler    |
| kernel gone (403, or 404)           | lost           |                                               |

Stopping. Kaggle has no public cancel (CancelKernelSession needs a session id that neither push
nor status returns). `terminate` therefore does nothing remote: the executor writes a stop request
into the run folder, which the worker SDK honours at its next heartbeat (exit 75). A worker that
never heartbeats runs until its session ends.

Secrets are Kaggle user secrets (`secrets_at_provider`) that a person attaches once to the job's
kernel, https://www.kaggle.com/code/<user>/<slug>, in the editor (Add-ons -> Secrets); the
bootstrap reads them with `kaggle_secrets`. The first attempt creates the kernel, so it cannot have
them yet: it ends at once with exit SECRET_NOT_ATTACHED, whose reason names the secret and the
kernel's URL; the planner charges that once and avoids Kaggle for the job for a while, and the next
attempt after the attachment uses it. Kaggle documents attachment as per notebook and lasting across
its versions; that it survives versions pushed through the API is [UNCONFIRMED].
Kaggle answers a read of a missing kernel with 403 (see NO_SUCH_KERNEL), so a first launch reads
403 and pushes. Unconfirmed against the live service: the session-limit message.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from adapters import compute
from adapters.compute import LaunchSpec, ProviderConfigError, ProviderUnavailable, WorkerPhase, WorkerRef, WorkerState
from adapters.hosted import SECRET_NOT_ATTACHED, Bootstrap, bootstrap_script, parse_exit_record, script_plan
from adapters.hosted_base import HostedAdapter
from adapters.http import HostedApi
from adapters.preflight import Check, warn
from adapters.wire import YEAR_SECONDS, Numbers, load_json
from desired.models import Capacity, KaggleSettings

KERNELS = "/v1/kernels.KernelsApiService/"
# How Kaggle answers a read of a kernel of ours that does not exist (yet): 403, not 404, since it
# does not tell anyone who cannot see a kernel whether it exists (a Kaggle maintainer,
# github.com/Kaggle/kaggle-cli/issues/548). A token that may not read kernels at all is refused
# again by the push that follows, and that refusal is the error the user sees.
NO_SUCH_KERNEL = (403, 404)
INTROSPECT = "/v1/security.OAuthService/IntrospectToken"
SLUG_PREFIX = "rc-"
KERNEL_WEB = "https://www.kaggle.com/code/"
ATTEMPT_MARK = "reconciler-bootstrap: kaggle attempt "
LABEL_KEYS = ("provider", "owner", "job", "run_id", "epoch")
EXIT_INTERRUPTED = 75
# The worker SDK stops at most this long before RECONCILER_DEADLINE (reconciler.worker.run's cap),
# which the bootstrap sets `save_margin_seconds` before Kaggle's cut: an exit 75 with less than
# margin + this left of the session is the session ending, not a stop request.
SDK_MAX_MARGIN = 1800.0
# Kernels whose last run began longer ago than this are not read: a session lasts at most 12 hours,
# so they ended long ago, and an account's old kernels would otherwise be read after every restart.
RECENT_DAYS = 7
FINAL = frozenset({"COMPLETE", "ERROR", "CANCEL_ACKNOWLEDGED"})
# Kaggle's failureMessage at its cut, as a user's script compares it: "Your notebook was stopped
# because it exceeded the max allowed execution duration." (github.com/xhluca/bm25-benchmarks,
# analysis/download_results.py); the other words are kept for wordings not seen yet.
SESSION_WORDS = re.compile(r"session|time ?limit|timed? ?out|max(imum)? allowed execution duration|"
                           r"maximum.*(time|hours|runtime)", re.IGNORECASE)
# ...and for memory, from the same script: "Your notebook tried to allocate more memory than is available."
OOM_WORDS = re.compile(r"allocate more memory than is available|out of memory", re.IGNORECASE)
CREDENTIAL_PLACES = ("$KAGGLE_API_TOKEN (a token or a file holding one), ~/.kaggle/access_token, "
                     "$KAGGLE_USERNAME with $KAGGLE_KEY, or kaggle.json in $KAGGLE_CONFIG_DIR or ~/.kaggle")
# GPUs one worker gets per machine shape. Kaggle's UI offers "T4 x2", but the API's shape name
# does not say the count [UNCONFIRMED], so one GPU is promised: a job asking for more is refused.
# Kaggle's T4 accelerator is two T4s ("GPU T4 x2" in its editor); the others are one GPU each.
SHAPE_GPUS = {"NvidiaTeslaT4": ("T4", 2), "NvidiaTeslaT4Highmem": ("T4", 2), "NvidiaTeslaP100": ("P100", 1),
              "NvidiaL4": ("L4", 1), "NvidiaL4X1": ("L4", 1), "NvidiaTeslaA100": ("A100", 1),
              "NvidiaH100": ("H100", 1), "NvidiaRtxPro6000": ("RTX-PRO-6000", 1)}

KAGGLE_SECRETS = '''
def load_secrets(names):
    """Kaggle keeps the job's secrets as user secrets attached to the job's kernel (Add-ons -> Secrets),
    which every version of it sees. Says first which attempt this version is: right after a push,
    Kaggle's status may still be the previous version's, and this line tells them apart."""
    say("kaggle attempt " + json.dumps([PLAN["labels"]["run_id"], PLAN["labels"]["epoch"]]))
    if not names:
        return {}
    try:
        from kaggle_secrets import UserSecretsClient
    except ImportError:
        fail("kaggle_secrets cannot be imported: this script must run as a Kaggle kernel")
    client, found, missing = UserSecretsClient(), {}, []
    for name in names:
        try:
            found[name] = client.get_secret(name)
        except Exception:
            missing.append(name)
    if missing:
        which = ", ".join(missing)
        fail("secret " + which + " is not attached to this job's kernel; attach secret " + which + " to kernel "
             "__KERNEL_URL__ in the Kaggle editor (Add-ons → Secrets); the next attempt uses it", __CODE__)
    return found
'''


def secrets_source(kernel_url: str) -> str:
    """The bootstrap's secrets loader, naming the kernel a person must attach missing secrets to."""
    return KAGGLE_SECRETS.replace("__KERNEL_URL__", kernel_url).replace("__CODE__", str(SECRET_NOT_ATTACHED))


def kernel_url(user: str, slug: str) -> str:
    return f"{KERNEL_WEB}{user}/{slug}"


def log_attempt(log: str) -> tuple[str, int] | None:
    """(run id, epoch) a version's bootstrap said it is, from its log; None before it said so."""
    for line in reversed(log.splitlines()):
        at = line.find(ATTEMPT_MARK)
        if at < 0:
            continue
        try:
            run_id, epoch = load_json(line[at + len(ATTEMPT_MARK):])
            return str(run_id), int(epoch)
        except (ValueError, TypeError):
            return None
    return None


@dataclass(frozen=True)
class Credentials:
    """What authenticates us: a bearer token, or a legacy username and key (HTTP Basic)."""

    header: str
    username: str | None
    source: str


def _read_text(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def read_credentials(environ: dict[str, str] | None = None) -> Credentials | None:
    """Kaggle's standard places, in the kaggle client's order: $KAGGLE_API_TOKEN (value or file),
    ~/.kaggle/access_token(.txt), $KAGGLE_USERNAME + $KAGGLE_KEY, kaggle.json. None if none is set."""
    env = dict(os.environ) if environ is None else environ
    home = Path(env.get("HOME") or os.path.expanduser("~")) / ".kaggle"
    token = env.get("KAGGLE_API_TOKEN")
    if token and Path(token).is_file():
        token = _read_text(Path(token))
    token = token or _read_text(home / "access_token") or _read_text(home / "access_token.txt")
    if token:
        return Credentials(f"Bearer {token}", None, "an access token")
    user, key = env.get("KAGGLE_USERNAME"), env.get("KAGGLE_KEY")
    if not (user and key):
        folder = Path(env["KAGGLE_CONFIG_DIR"]) if env.get("KAGGLE_CONFIG_DIR") else home
        try:
            data = json.loads((folder / "kaggle.json").read_text())
            user, key = str(data["username"]), str(data["key"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    basic = base64.b64encode(f"{user}:{key}".encode()).decode()
    return Credentials(f"Basic {basic}", user, "a legacy API key")


def slug_part(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def kernel_slug(provider: str, owner: str, job: str) -> str:
    """`rc-<owner>-<job>-<hash8>`: the job's one kernel (attempts are its versions, so secrets
    attached to it serve them all); readable, a valid Kaggle slug, unique by the hash of the identity."""
    digest = hashlib.sha256(json.dumps([provider, owner, job]).encode()).hexdigest()[:8]
    head = f"{SLUG_PREFIX}{slug_part(owner)[:10]}-{slug_part(job)[:26]}"
    head = re.sub(r"-+", "-", head)[:40].strip("-")
    return f"{head}-{digest}"


def seconds(value: Any, field: str, numbers: Numbers) -> float:
    """A protobuf duration ("108000s", "1.5s") or a number, as seconds; 0 when absent. One that is
    not a finite duration within a year refuses the whole answer (said once by `numbers`)."""
    if value is None or value == "":
        return 0.0
    text = value[:-1] if isinstance(value, str) and value.endswith("s") else value
    found = numbers.number(text, field, high=YEAR_SECONDS)
    if found is None:
        raise ProviderUnavailable(f"{numbers.who} answered a {field} that is not a duration")
    return found


def timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def log_text(raw: Any) -> str:
    """Kaggle's log (a JSON array of {stream_name, time, data}) as plain text; other text as is."""
    if not isinstance(raw, str) or not raw:
        return ""
    try:
        entries = load_json(raw)
    except ValueError:
        return raw
    if not isinstance(entries, list):
        return raw
    return "".join(str(e.get("data", "")) for e in entries if isinstance(e, dict))


def kernel_state(status: str, failure: str, log: str, session_margin: float) -> WorkerState:
    """The state table of the module docstring: Kaggle's status, its failure message and the
    kernel's log (read for finished kernels only) -> WorkerState."""
    word = status or "QUEUED"
    if word in ("QUEUED", "NEW_SCRIPT"):
        return WorkerState(WorkerPhase.PENDING, provider_state=word)
    if word == "RUNNING":
        return WorkerState(WorkerPhase.RUNNING, provider_state=word)
    if word.startswith("CANCEL"):
        return WorkerState(WorkerPhase.PREEMPTED, provider_state=word,
                           detail="cancelled on Kaggle, not by the reconciler")
    record = parse_exit_record(log)
    code = record.get("code") if record is not None else None
    if word == "ERROR" and SESSION_WORDS.search(failure):  # Kaggle's cut: the record may show only its SIGKILL
        return WorkerState(WorkerPhase.SESSION_LIMIT, code if isinstance(code, int) else None, word, failure)
    if word == "ERROR" and OOM_WORDS.search(failure):  # Kaggle's memory kill: a record, if any, shows only a kill
        sig = record.get("signal") if record is not None and isinstance(record.get("signal"), str) else None
        code = code if isinstance(code, int) else 1
        return WorkerState(WorkerPhase.EXITED, code, word, failure, signal=sig, oom=True)
    if record is not None:
        return _from_record(word, record, failure, session_margin)
    if word == "COMPLETE":
        return WorkerState(WorkerPhase.EXITED, 0, word)
    if word == "ERROR":
        return WorkerState(WorkerPhase.EXITED, 1, word, failure or "Kaggle gave no reason")
    return WorkerState(WorkerPhase.LOST, provider_state=word, detail="a status this adapter does not know")


def _from_record(word: str, record: dict[str, Any], failure: str, session_margin: float) -> WorkerState:
    code = record.get("code")
    code = code if isinstance(code, int) else 1
    left = record.get("session_left")
    if code == EXIT_INTERRUPTED and isinstance(left, (int, float)) and left <= session_margin + SDK_MAX_MARGIN:
        return WorkerState(WorkerPhase.SESSION_LIMIT, code, word, f"saved and left {left:.0f} s before the session end")
    sig = record.get("signal") if isinstance(record.get("signal"), str) else None
    detail = str(record.get("reason") or "")
    if sig:
        detail = f"killed by {sig} on Kaggle's machine, not by the reconciler"
    elif word == "ERROR" and not detail and code != 0:
        detail = failure
    return WorkerState(WorkerPhase.EXITED, code, word, detail, signal=sig)


@dataclass
class Kernel:
    """One version of an `rc-` kernel as this adapter knows it: its labels, read from that
    version's source, and, once final, its state and log."""

    slug: str
    labels: dict[str, Any] | None
    version: int | None = None
    final: WorkerState | None = None
    log: str = ""
    log_reads: int = 0

    @property
    def attempt(self) -> tuple[str, int] | None:
        if self.labels is None:
            return None
        return str(self.labels["run_id"]), int(self.labels["epoch"])


def same_attempt(labels: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    return labels is not None and all(labels.get(k) == wanted[k] for k in LABEL_KEYS)


class KaggleAdapter(HostedAdapter):
    kind = "kaggle"
    settings: KaggleSettings

    def __init__(self, name: str, settings: KaggleSettings, *, owner: str = compute.ANY_OWNER) -> None:
        super().__init__(name, settings, owner)
        self._username: str | None = settings.username
        self._current: dict[str, Kernel] = {}  # slug -> its current version, as we know it
        self._attempts: dict[tuple[str, str, int], Kernel] = {}  # (slug, run id, epoch) -> that version
        self._launched: set[str] = set()  # slugs this process pushed or adopted (a listing may lag)

    # ---- the API ----------------------------------------------------------------------------
    def connect(self) -> HostedApi:
        creds = read_credentials()
        if creds is None:
            raise ProviderConfigError(f"{self.who}: no Kaggle credentials found; set {CREDENTIAL_PLACES}")
        self._username = self._username or creds.username
        return self.client(self.settings.api_url, creds.header, f"credentials are read from {CREDENTIAL_PLACES}")

    def _rpc(self, method: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        answer = self.api.call("POST", KERNELS + method, json_body=body, **kw)
        if answer is None and not kw.get("allow"):  # every RPC answers an object, "{}" at the least
            raise ProviderUnavailable(f"{self.who} answered {method} with an empty body, not an object")
        return answer if isinstance(answer, dict) else {}

    @property
    def username(self) -> str:
        api = self.api
        if self._username is None:
            answer = api.call("POST", INTROSPECT, json_body={"token": self._token()})
            user = answer.get("username") if isinstance(answer, dict) and answer.get("active") else None
            if not user:
                raise ProviderConfigError(f"{self.who}: Kaggle does not accept the access token as active; "
                                          f"replace it ({CREDENTIAL_PLACES}) or set `username` in its settings")
            self._username = str(user)
        return self._username

    def _token(self) -> str:
        return str(self.api.headers.get("Authorization", "")).removeprefix("Bearer ")

    def _ref(self, slug: str, labels: dict[str, Any]) -> WorkerRef:
        return WorkerRef(self.name, f"{self.username}/{slug}", str(labels["job"]), str(labels["run_id"]),
                         int(labels["epoch"]))

    def _attempt_of(self, ref: WorkerRef) -> Kernel | None:
        """The version that ran this attempt, if it is ours and this process has seen it."""
        slug = ref.id.partition("/")[2]
        kernel = self._attempts.get((slug, ref.run_id, ref.epoch))
        if ref.provider != self.name or kernel is None or not self._ours(kernel.labels):
            return None
        return kernel

    def _ours(self, labels: dict[str, Any] | None) -> bool:
        return labels is not None and labels.get("provider") == self.name and self.owns(labels.get("owner"))

    def _remember(self, kernel: Kernel) -> Kernel:
        """Makes `kernel` its slug's current version, keeping what we knew of that attempt (its
        final state and log) when it is one we have seen already."""
        attempt = kernel.attempt
        if attempt is not None:
            known = self._attempts.setdefault((kernel.slug, *attempt), kernel)
            known.version = kernel.version if kernel.version is not None else known.version
            kernel = known
        self._current[kernel.slug] = kernel
        return kernel

    # ---- launch -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> WorkerRef:
        labels = self.launch_labels(spec)
        slug = kernel_slug(self.name, self.owner, spec.job)
        current = self._current.get(slug)
        if current is None or not same_attempt(current.labels, labels):
            current = self._read_kernel(slug)  # the truth, not our memory: a push may have acted
        if current is not None and same_attempt(current.labels, labels):
            self._remember(current)  # this attempt is the current version already: adopt it
        else:
            if current is not None:
                self._refuse_over_a_live_version(current)
            self._remember(Kernel(slug, labels, self._push(slug, spec, labels)))
        self._launched.add(slug)
        return self._ref(slug, labels)

    def _refuse_over_a_live_version(self, kernel: Kernel) -> None:
        """A push would replace the run of a version still queued or running: wait for its end
        (a stop request, when there is one, is already in its run folder)."""
        answer = self._status(kernel.slug)
        if answer is None or str(answer.get("status") or "QUEUED").upper() in FINAL:
            return
        what = f"attempt {kernel.attempt[1]}" if kernel.attempt else "a version not made by the reconciler"
        raise ProviderUnavailable(f"{self.who}: kernel {kernel.slug} is still running {what}; waiting for it to end")

    def _push(self, slug: str, spec: LaunchSpec, labels: dict[str, Any]) -> int | None:
        """SaveKernel on the job's slug: the kernel's first version, or a new one that starts
        running. The title is sent every time, as the CLI does; it never changes. Returns the version."""
        s = self.settings
        session = s.session_hours * 3600
        boot = Bootstrap("kaggle", secrets_source(kernel_url(self.username, slug)), session_seconds=session,
                         save_margin_seconds=s.save_margin_seconds)
        body: dict[str, Any] = {
            "slug": f"{self.username}/{slug}", "newTitle": slug, "language": "python", "kernelType": "script",
            "text": bootstrap_script(spec, labels, boot, code_git=spec.code_git, code_ref=spec.code_ref),
            "isPrivate": True, "enableInternet": s.enable_internet, "sessionTimeoutSeconds": int(session),
        }
        if spec.gpus > 0:
            body["machineShape"] = s.machine_shape
        answer = self._rpc("SaveKernel", body, acts=True)
        error = answer.get("error")
        if isinstance(error, str) and error:
            if "session count" in error.lower():
                raise ProviderUnavailable(f"{self.who} has no free session now: Kaggle says {error!r}")
            raise ProviderConfigError(f"{self.who}: Kaggle refused the kernel {slug}: {error}")
        version = answer.get("versionNumber")
        return version if isinstance(version, int) else None

    def _status(self, slug: str) -> dict[str, Any] | None:
        """Kaggle's status answer for our kernel's current version, or None when there is no such kernel."""
        answer = self.api.call("POST", KERNELS + "GetKernelSessionStatus",
                               json_body={"userName": self.username, "kernelSlug": slug}, allow=NO_SUCH_KERNEL)
        return answer if isinstance(answer, dict) else None

    def _read_kernel(self, slug: str) -> Kernel | None:
        """The kernel's current version, its labels read from its source; None when Kaggle has no
        such kernel (or does not show it yet)."""
        answer = self._rpc("GetKernel", {"userName": self.username, "kernelSlug": slug}, allow=NO_SUCH_KERNEL)
        if not answer:
            return None
        plan = script_plan(str((answer.get("blob") or {}).get("source") or ""))
        labels = plan.get("labels") if plan else None
        ok = isinstance(labels, dict) and set(LABEL_KEYS) <= set(labels)
        version = (answer.get("metadata") or {}).get("currentVersionNumber")
        return Kernel(slug, labels if ok else None, version if isinstance(version, int) else None)

    # ---- observe ----------------------------------------------------------------------------
    def observe(self) -> dict[WorkerRef, WorkerState]:
        listed = self._list_kernels()
        for slug in self._launched - listed.keys():
            listed[slug] = None
        seen: dict[WorkerRef, WorkerState] = {}
        foreign = 0
        for slug, version in sorted(listed.items()):
            kernel = self._kernel(slug, version)
            if kernel is None or kernel.labels is None:
                continue  # not shown yet, or an `rc-` kernel that is not a bootstrap of ours
            state = self._state(kernel)
            if self._ours(kernel.labels):
                seen[self._ref(slug, kernel.labels)] = state
            elif state.phase in (WorkerPhase.PENDING, WorkerPhase.RUNNING):
                foreign += 1
        self.foreign_workers = foreign
        return seen

    def _list_kernels(self, page_size: int = 100, max_pages: int = 20) -> dict[str, int | None]:
        """Slug -> current version of the account's `rc-` kernels run in the last RECENT_DAYS (the
        CLI's `kernels list --mine`, newest run first, page after page until the runs are older)."""
        body: dict[str, Any] = {"group": "PROFILE", "user": self.username, "sortBy": "DATE_RUN",
                                "pageSize": page_size, "kernelType": "all", "language": "all", "outputType": "all"}
        since = time.time() - RECENT_DAYS * 86400
        found: dict[str, int | None] = {}
        for _ in range(max_pages):
            answer = self._rpc("ListKernels", body)
            items = [i for i in answer.get("kernels") or [] if isinstance(i, dict)]
            recent = [i for i in items if (timestamp(i.get("lastRunTime")) or since) >= since]
            for item in recent:
                name = str(item.get("ref") or "").rsplit("/", 1)[-1]
                if name.startswith(SLUG_PREFIX):
                    found[name] = self.numbers.count(item.get("currentVersionNumber"), "kernel currentVersionNumber")
            token = answer.get("nextPageToken")
            if not token or len(recent) < len(items):
                break
            body["pageToken"] = token
        return found

    def _kernel(self, slug: str, listed_version: int | None) -> Kernel | None:
        """The kernel's current version: what we know, read again only when the listing shows a
        newer version than that (a lagging listing never takes us back to an older one)."""
        known = self._current.get(slug)
        stale = known is None or (listed_version is not None and known.version is not None
                                  and listed_version > known.version)
        if not stale:
            return known
        fresh = self._read_kernel(slug)
        if fresh is None:
            return known  # listed but not readable yet: asked again next time
        return self._remember(fresh)

    def _state(self, kernel: Kernel) -> WorkerState:
        if kernel.final is not None:
            return kernel.final
        answer = self._status(kernel.slug)
        if answer is None:
            return WorkerState(WorkerPhase.LOST, provider_state="not found", detail="Kaggle no longer has the kernel")
        status, failure = str(answer.get("status") or "QUEUED").upper(), str(answer.get("failureMessage") or "")
        if status not in FINAL:
            return kernel_state(status, failure, "", self.settings.save_margin_seconds)
        if not self._ours(kernel.labels):
            return WorkerState(WorkerPhase.EXITED, provider_state=status)  # not ours to read
        return self._final_state(kernel, status, failure)

    def _final_state(self, kernel: Kernel, status: str, failure: str) -> WorkerState:
        log = self._read_log(kernel.slug)
        ran = log_attempt(log)
        if ran is not None and ran != kernel.attempt:  # the previous version's end, reported late
            return WorkerState(WorkerPhase.PENDING, provider_state="QUEUED",
                               detail=f"Kaggle still reports the previous version ({status})")
        kernel.log = log
        kernel.log_reads += 1
        state = kernel_state(status, failure, log, self.settings.save_margin_seconds)
        if parse_exit_record(log) is not None or kernel.log_reads >= 3:  # a log may lag its status
            kernel.final = state
        return state

    def _read_log(self, slug: str) -> str:
        """The current version's log: the `log` field of ListKernelSessionOutput's first page. Its
        page token pages the output files only (kaggle-cli's `kernels output` keeps the first page's
        log, its `kernels logs` reads one page), so no further page is asked for."""
        answer = self._rpc("ListKernelSessionOutput", {"userName": self.username, "kernelSlug": slug},
                           allow=NO_SUCH_KERNEL)
        return log_text(answer.get("log"))

    # ---- the rest of the contract -------------------------------------------------------------
    def terminate(self, ref: WorkerRef) -> None:
        """Kaggle cannot cancel a run through its public API: the stop request the executor writes
        into the run folder is honoured by the worker SDK at its next heartbeat. Nothing to do here."""

    def logs(self, ref: WorkerRef, tail: int = 50) -> str:
        """The attempt's log: kept once final; read from Kaggle while its version is the current
        one; empty once a newer version replaced it before we saw its end."""
        kernel = self._attempt_of(ref)
        if kernel is None:
            return ""
        if kernel.final is not None:
            text = kernel.log
        elif self._current.get(kernel.slug) is kernel:
            text = self._read_log(kernel.slug)
            ran = log_attempt(text)
            if ran is not None and ran != kernel.attempt:
                return ""  # still the previous version's output: this attempt has written nothing yet
        else:
            return ""
        return "\n".join(text.splitlines()[-tail:]) if tail > 0 else ""

    def capacity(self) -> Capacity | None:
        shape = SHAPE_GPUS.get(self.settings.machine_shape)
        if shape is None:
            return None
        return Capacity(gpus=shape[1], gpu_models=[shape[0]])

    def preflight(self, specs: list[LaunchSpec]) -> list[Check]:
        """`reconciler doctor`: Kaggle's API cannot say which secrets are attached to a kernel, so for
        each job that names secrets, where to attach them, and whether its kernel exists yet (GetKernel)."""
        checks = []
        for spec in (s for s in specs if s.secret_env):
            slug = kernel_slug(self.name, self.owner, spec.job)
            url, names = kernel_url(self.username, slug), ", ".join(sorted(spec.secret_env))
            if self._read_kernel(slug) is None:
                found = (f"{names} must be attached to kernel {slug}, which the first attempt creates; that "
                         f"attempt stops at once (exit {SECRET_NOT_ATTACHED}) until they are")
            else:
                found = f"{names} must be attached to {url}; Kaggle's API cannot say whether they are"
            checks.append(warn(self.name, f"secrets of {spec.job}", found,
                               f"attach {names} at {url} (editor: Add-ons -> Secrets)"))
        return checks

    def allowance(self) -> compute.Allowance:
        """The weekly GPU quota, from Kaggle's own answer (GetAcceleratorQuotaStatistics)."""
        answer = self._rpc("GetAcceleratorQuotaStatistics", {})
        gpu = answer.get("gpuQuota")
        gpu = gpu if isinstance(gpu, dict) else {}
        total = seconds(gpu.get("totalTimeAllowed"), "gpuQuota totalTimeAllowed", self.numbers)
        used = seconds(gpu.get("timeUsed"), "gpuQuota timeUsed", self.numbers)
        reserved = seconds(gpu.get("timeReserved"), "gpuQuota timeReserved", self.numbers)
        return compute.Allowance(unit="gpu-hours", remaining=max(0.0, total - used - reserved) / 3600,
                         minimum=self.settings.min_quota_hours, total=total / 3600, used=used / 3600,
                         resets_at=timestamp(answer.get("quotaRefreshTime")), applies_to_cpu=False)
