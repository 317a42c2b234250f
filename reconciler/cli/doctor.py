"""`reconciler doctor`: what a careful user checks before the first paid run, in one command.

For each provider in desired/, with the daemon's own credentials and read-only calls only: the
key is accepted and the quota, credits or balance (the provider's `allowance()`), each job placed
there fits it (the planner's own placement rules), every image a job would use exists (a
registry manifest lookup, adapters/images.py), the secrets each job names are where its worker
will read them, and the adapter's own checks (`preflight`: offers and prices, a Kaggle kernel, an
SSH host answering). Then run storage: a probe object written, read back and deleted with the
credentials the workers get. Nothing is ever created, rented, launched or pushed, apart from that
probe object (deleted at once).
"""

from __future__ import annotations

import json
import os
import secrets as random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from adapters.compute import (
    SECRETS_AT_PROVIDER,
    Allowance,
    ComputeAdapter,
    LaunchSpec,
    ProviderConfigError,
    ProviderUnavailable,
)
from adapters.images import ImageLookup
from adapters.preflight import Check, Outcome, Preflight, fail, ok, warn
from adapters.stores import open_store
from desired.models import Job, Provider, Settings
from desired.parse import DesiredState
from reconciler.planner.outlook.placement import place
from reconciler.trust.shown import escape
from status.models import when

if TYPE_CHECKING:
    from reconciler.daemon.loop import Reconciler

AdapterFactory = Callable[[Provider, str], ComputeAdapter]
STORAGE_KEYS = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN"}
PROBE_FOLDER = ".reconciler-doctor"


def examine(desired: DesiredState, owner: str, make: AdapterFactory, *, environ: Mapping[str, str] | None = None,
            images: ImageLookup | None = None) -> list[Check]:
    """Every check, in the order a person fixes them: manifests, then each provider, then storage."""
    environ = os.environ if environ is None else environ
    lookup = images or ImageLookup()
    checks = [fail("desired/", e.file, e.message, "run `reconciler validate` and fix the file") for e in desired.errors]
    try:
        for name, provider in sorted(desired.providers.items()):
            jobs = placed_on(name, desired.jobs.values())
            try:
                checks += provider_checks(name, provider, jobs, owner, make, environ, lookup)
            except Exception as exc:  # noqa: BLE001 - one provider's surprise must not hide the others' rows
                checks.append(fail(name, "checks", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                                   "run doctor again; if it repeats, report it with this message"))
    finally:
        if images is None:
            lookup.close()
    checks += storage_checks(desired.settings, desired.jobs.values(), environ)
    return checks


def placed_on(name: str, jobs: Iterable[Job]) -> list[Job]:
    """The jobs whose placement allows this provider (an empty list allows every provider)."""
    return sorted((j for j in jobs if not j.spec.placement.providers or name in j.spec.placement.providers),
                  key=lambda j: j.name)


def launch_spec(job: Job) -> LaunchSpec:
    """What a launch of this job would ask for (secret names only: doctor never handles values)."""
    r = job.spec.resources
    return LaunchSpec(job=job.name, run_id="doctor", epoch=0, command=list(job.spec.command),
                      secret_env={s: "" for s in job.spec.secrets}, workdir=job.spec.code.path, cpus=r.cpus,
                      memory_gb=r.memory_gb, gpus=r.gpus, gpu_model=r.gpu_model, gpu_memory_gb=r.gpu_memory_gb,
                      cuda=r.cuda, code_git=job.spec.code.git, code_ref=job.spec.code.ref, image=job.spec.code.image,
                      max_price_per_hour=job.spec.placement.max_price_per_hour)


def provider_checks(name: str, provider: Provider, jobs: list[Job], owner: str, make: AdapterFactory,
                    environ: Mapping[str, str], lookup: ImageLookup) -> list[Check]:
    try:
        adapter = make(provider, owner)
    except ProviderConfigError as exc:
        return [fail(name, "credentials", str(exc), "set the provider's credentials where the message says")]
    allowance, checks = allowance_checks(name, adapter)
    if checks and checks[0].outcome is Outcome.FAIL:
        return checks  # the key is refused or the API is down: nothing else can be asked
    checks += [fit_check(name, provider, job, adapter, allowance) for job in jobs]
    checks += image_checks(name, provider, jobs, lookup)
    checks += secret_checks(name, adapter, jobs, environ)
    if isinstance(adapter, Preflight):
        try:
            checks += adapter.preflight([launch_spec(job) for job in jobs])
        except (ProviderConfigError, ProviderUnavailable) as exc:
            checks.append(fail(name, "provider checks", str(exc), "fix what the message names, then run doctor again"))
    close = getattr(adapter, "close", None)
    if callable(close):
        close()
    return checks


def allowance_checks(name: str, adapter: ComputeAdapter) -> tuple[Allowance | None, list[Check]]:
    """The provider's quota, credits or balance: one read that also proves the key is accepted."""
    ask = getattr(adapter, "allowance", None)
    if not callable(ask):
        return None, []
    try:
        allowance = ask()
    except ProviderConfigError as exc:
        return None, [fail(name, "credentials", str(exc), "fix the key where the message says, then run doctor again")]
    except ProviderUnavailable as exc:
        return None, [fail(name, "credentials", str(exc), "the provider could not be asked: try again later")]
    accepted = ok(name, "credentials", "the key is accepted")
    if not isinstance(allowance, Allowance):
        return None, [accepted]
    return allowance, [accepted, allowance_check(name, allowance)]


def allowance_check(name: str, allowance: Allowance) -> Check:
    if allowance.unit == "credits":
        left = f"${allowance.remaining:,.2f} of credit left"
        what, fix = "balance", "add credit to the account before the first run"
    else:
        total = f" of {allowance.total:g}" if allowance.total is not None else ""
        left = f"{allowance.remaining:g}{total} {allowance.unit} left this period"
        what, fix = "quota", "wait for the quota's refill, or place the jobs elsewhere"
    if allowance.resets_at:
        left += f", refills {when(allowance.resets_at)} UTC"
    if allowance.remaining <= allowance.minimum:
        kept = f" (the settings keep {allowance.minimum:g} aside)" if allowance.minimum else ""
        return fail(name, what, f"{left}: nothing can start{kept}", fix)
    return ok(name, what, left)


def fit_check(name: str, provider: Provider, job: Job, adapter: ComputeAdapter, allowance: Allowance | None) -> Check:
    """The planner's own rule (placement.place) for this job on this provider alone."""
    reported = adapter.capacity()
    placed = place(job, {name: provider}, time.time(), {name: reported} if reported else None,
                   {name: allowance} if allowance else None)
    why = placed.excluded.get(name)
    if why:
        return fail(name, f"fits {job.name}", why,
                    f"change {job.name}'s resources or placement, or the provider's settings")
    return ok(name, f"fits {job.name}", "resources, price cap and allowance allow it")


def image_for(provider: Provider, job: Job) -> str | None:
    """The image a worker of this job would run here: providers that run containers have an
    `image` setting (the default when the job names none); the others use no image."""
    if not hasattr(provider.spec.settings, "image"):
        return None
    return job.spec.code.image or getattr(provider.spec.settings, "image", None)


def image_checks(name: str, provider: Provider, jobs: list[Job], lookup: ImageLookup) -> list[Check]:
    wanted: dict[str, list[str]] = {}
    for job in jobs:
        image = image_for(provider, job)
        if image:
            wanted.setdefault(image, []).append(job.name)
    checks = []
    for image, users in sorted(wanted.items()):
        answer = lookup.check(image)
        what = f"image {image}"
        if answer.found:
            checks.append(ok(name, what, f"{answer.detail}; used by {', '.join(users)}"))
        elif not answer.reachable:
            checks.append(fail(name, what, answer.detail, "check the network and the registry's status, then run "
                                                          "doctor again"))
        else:
            checks.append(fail(name, what, answer.detail, f"correct the image of {', '.join(users)} (code.image) or "
                                                          "the provider's `image` setting, or push the image"))
    return checks


def secret_checks(name: str, adapter: ComputeAdapter, jobs: list[Job], environ: Mapping[str, str]) -> list[Check]:
    """Secrets the daemon passes on must be in its environment; secrets the provider keeps are the
    adapter's preflight to check, or said to be unchecked when it has none."""
    at_provider = getattr(adapter, SECRETS_AT_PROVIDER, False)
    checks = []
    for job in (j for j in jobs if j.spec.secrets):
        names = ", ".join(job.spec.secrets)
        what = f"secrets of {job.name}"
        if at_provider:
            if not isinstance(adapter, Preflight):
                checks.append(warn(name, what, f"{names} are kept by the provider and cannot be checked from here",
                                   f"make sure {names} exist in the provider's secret store"))
            continue
        missing = [s for s in job.spec.secrets if not environ.get(s)]
        if missing:
            checks.append(fail(name, what, f"{', '.join(missing)} not set in the reconciler's environment",
                               f"set {', '.join(missing)} in the environment the daemon runs in"))
        else:
            checks.append(ok(name, what, f"{names} set in the reconciler's environment"))
    return checks


def storage_checks(settings: Settings, jobs: Iterable[Job], environ: Mapping[str, str]) -> list[Check]:
    """One probe with the daemon's storage settings, and one more for each distinct set of storage
    credentials (AWS_ACCESS_KEY_ID, ...) that jobs name as secrets, with those values."""
    probes: dict[tuple[tuple[str, str], ...], tuple[str, dict[str, Any]]] = {
        (): ("the reconciler's credentials", dict(settings.storage_options))}
    for job in sorted(jobs, key=lambda j: j.name):
        creds = {opt: environ[var] for opt, var in STORAGE_KEYS.items() if var in job.spec.secrets and var in environ}
        if "key" in creds and "secret" in creds and settings.storage.startswith("s3://"):
            key = tuple(sorted(creds.items()))
            if key not in probes:
                probes[key] = (f"the credentials {job.name}'s workers get", {**settings.storage_options, **creds})
    return [probe(settings.storage, whose, options) for whose, options in probes.values()]


def probe(url: str, whose: str, options: dict[str, Any]) -> Check:
    """Write, read back and delete one small object under the storage root."""
    name = f"{PROBE_FOLDER}/probe-{random.token_hex(6)}"
    data = b"reconciler doctor probe\n"
    what = f"run storage ({whose})"
    try:
        store = open_store(url, options)
        store.write(name, data)
        back = store.read(name)
        store.delete(name)
        gone = store.read(name) is None
    except Exception as exc:  # noqa: BLE001 - any storage failure is this check's answer
        return fail("storage", what, f"{url}: {' '.join(str(exc).split())[:300]}",
                    "check the storage URL, its endpoint and the credentials named here")
    if back != data:
        return fail("storage", what, f"{url}: a probe object read back different bytes",
                    "check the store's consistency settings (a caching proxy?)")
    if not gone:
        return warn("storage", what, f"{url}: the probe object {name} was still there after its delete",
                    f"delete {name} by hand and check the credentials may delete")
    return ok("storage", what, f"{url}: wrote, read back and deleted a probe object")


def failed(checks: list[Check]) -> bool:
    return any(c.outcome is Outcome.FAIL for c in checks)


# ---- showing ---------------------------------------------------------------------------------

MARKS = {Outcome.OK: "[green]ok[/green]", Outcome.WARN: "[yellow]warn[/yellow]", Outcome.FAIL: "[red]FAIL[/red]"}


def table(checks: list[Check]) -> Table:
    """One row per check; provider answers are untrusted text, escaped."""
    out = Table(show_lines=False, title="reconciler doctor")
    for column in ("target", "check", "result", "detail"):
        out.add_column(column, overflow="fold")
    for c in checks:
        out.add_row(escape(c.target), escape(c.what), MARKS[c.outcome], escape(c.detail))
    return out


def advice(checks: list[Check]) -> list[str]:
    """A sentence per failure (then per warning) saying what to do."""
    order = [c for c in checks if c.outcome is Outcome.FAIL] + [c for c in checks if c.outcome is Outcome.WARN]
    return [f"{'FAIL' if c.outcome is Outcome.FAIL else 'warn'} {c.target} / {c.what}: {c.fix}." for c in order]


def summary(checks: list[Check]) -> str:
    counts = {o: sum(1 for c in checks if c.outcome is o) for o in Outcome}
    verdict = "a check failed: fix it before the first paid run" if counts[Outcome.FAIL] else "ready"
    return (f"{len(checks)} checks: {counts[Outcome.OK]} ok, {counts[Outcome.WARN]} to confirm by hand, "
            f"{counts[Outcome.FAIL]} failed; {verdict}")


def report(checks: list[Check], console: Console, as_json: bool) -> int:
    """Print the checks; the exit code: 1 if any failed, else 0."""
    if as_json:
        console.print_json(json.dumps({"ok": not failed(checks), "checks": [c.as_dict() for c in checks]}))
    else:
        console.print(table(checks))
        for line in advice(checks):
            console.print(escape(line), soft_wrap=True)  # a URL in it stays whole
        console.print(summary(checks))
    return 1 if failed(checks) else 0


def run(rec: Reconciler, console: Console, as_json: bool) -> int:
    """The command's body: the repository's desired state at HEAD, checked with the daemon's adapters."""
    desired = rec.read_desired(rec.repo.head())
    return report(examine(desired, rec.identity(desired), rec.adapter_factory), console, as_json)
