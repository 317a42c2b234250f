"""The executor: carries out the planner's actions and reports what happened. It decides nothing.

A launch bumps the run's lease epoch in storage BEFORE the worker starts, so that any older
worker of the run is fenced out by the time the new one can write. A terminate writes a stop
request to the run's folder BEFORE asking the provider, so that a worker that heartbeats saves and
exits even where the provider has no cancel API (Kaggle), and saves first where it has one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from adapters import artifacts, drills
from adapters.compute import (
    SECRETS_AT_PROVIDER,
    ComputeAdapter,
    JobConfigError,
    Kills,
    LaunchRefused,
    LaunchSpec,
    ProviderConfigError,
    ProviderUnavailable,
    with_mtbf,
)
from adapters.migrate import migrate_run
from adapters.storage import RunFolder, StorageError
from desired.models import Job, Settings
from reconciler.planner.plan import (
    Action,
    ArmDrill,
    Launch,
    LaunchResult,
    MoveResult,
    MoveRunData,
    RequestStop,
    Terminate,
)

log = logging.getLogger("reconciler")


@dataclass
class ExecutionReport:
    launches: list[LaunchResult] = field(default_factory=list)
    terminated: list[Terminate] = field(default_factory=list)
    moves: list[MoveResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def worker_env(job: Job, folder: RunFolder, run_id: str, epoch: int) -> dict[str, str]:
    """The worker environment every adapter passes on (DESIGN.md §3), secrets excluded."""
    env = dict(job.spec.env)
    if "AWS_ENDPOINT_URL" not in env:  # a worker elsewhere needs the store's endpoint too
        env.update(folder.store.worker_env())
    env.update({
        "RECONCILER_JOB": job.name,
        "RECONCILER_RUN_URI": folder.uri,
        "RECONCILER_RUN_ID": run_id,
        "RECONCILER_EPOCH": str(epoch),
    })
    if job.spec.checkpoint_every:
        env["RECONCILER_CHECKPOINT_EVERY"] = str(job.spec.checkpoint_every)
    if job.spec.target_steps:
        env["RECONCILER_TARGET_STEPS"] = str(job.spec.target_steps)
    return env


def resolve_secrets(job: Job, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    values = {name: environ[name] for name in job.spec.secrets if name in environ}
    missing = [name for name in job.spec.secrets if name not in environ]
    return values, missing


def execute(actions: list[Action], *, jobs: dict[str, Job], adapters: dict[str, ComputeAdapter],
            settings: Settings, environ: Mapping[str, str] | None = None) -> ExecutionReport:
    environ = os.environ if environ is None else environ
    report = ExecutionReport()
    for action in actions:
        if isinstance(action, Terminate):
            _terminate(action, adapters, settings, report)
            continue
        if isinstance(action, MoveRunData):
            report.moves.append(_move(action, settings))
            continue
        if isinstance(action, RequestStop):
            request_stop(action, settings)
            continue
        if isinstance(action, ArmDrill):
            _arm_drill(action, settings, report)
            continue
        report.launches.append(_launch(action, jobs[action.job], adapters, settings, environ))
    return report


def _terminate(action: Terminate, adapters: dict[str, ComputeAdapter], settings: Settings,
               report: ExecutionReport) -> None:
    """Stop request first (it works even when the provider is gone or cannot cancel), then the provider.
    A hard stop (a drill) gives no notice where the adapter can `kill`; elsewhere it is the ordinary
    stop (a provider without a cancel API has only the stop request), and the drilled worker's held
    saves still make the run resume at the drill's checkpoint."""
    hard = action.hard and isinstance(adapters.get(action.ref.provider), Kills)
    if not hard:
        request_stop(action, settings)
    adapter = adapters.get(action.ref.provider)
    if adapter is None:
        report.errors.append(f"cannot terminate {action.ref.id}: provider {action.ref.provider!r} is gone")
        return
    try:
        if hard and isinstance(adapter, Kills):
            adapter.kill(action.ref)
        else:
            adapter.terminate(action.ref)
        report.terminated.append(action)
        log.info("terminated %s on %s: %s", action.ref.id, action.ref.provider, action.reason)
    except Exception as exc:  # a provider failure must not stop the other actions
        report.errors.append(f"terminate {action.ref.id} on {action.ref.provider} failed: {exc}")


def _arm_drill(action: ArmDrill, settings: Settings, report: ExecutionReport) -> None:
    """Write the drill's request where the worker reads it at its next heartbeat."""
    store = action.store or settings.storage
    try:
        folder = RunFolder.for_run(store, action.ref.job, action.ref.run_id, store_options(store, settings))
        drills.write_request(folder, drills.Request(action.drill_id, action.epoch, action.lookahead, action.notice))
        log.info("%s: drill %s asked of attempt %d", action.ref.job, action.drill_id, action.epoch)
    except (StorageError, OSError, ValueError) as exc:
        report.errors.append(f"cannot write the request of drill {action.drill_id} for {action.ref.job}: {exc}")


def request_stop(action: Terminate | RequestStop, settings: Settings) -> None:
    """Write the stop request for the worker's epoch to its run folder. Best effort: a store that
    cannot be written is logged and the provider's terminate still goes ahead."""
    ref = action.ref
    store = action.store or settings.storage
    try:
        folder = RunFolder.for_run(store, ref.job, ref.run_id, store_options(store, settings))
        folder.request_stop(ref.epoch, action.reason)
    except Exception as exc:  # noqa: BLE001 - any storage failure: the terminate must still happen
        log.warning("%s: could not write the stop request for %s to %s (%s); terminating through %s only",
                    ref.job, ref.id, store, exc, ref.provider)


def store_options(store: str, settings: Settings) -> dict[str, str]:
    """The settings' storage options, for the configured store or another of the same kind."""
    same_kind = store.split("://", 1)[0] == settings.storage.split("://", 1)[0]
    return dict(settings.storage_options) if same_kind else {}


def _move(action: MoveRunData, settings: Settings) -> MoveResult:
    key = (action.job, action.run_id)
    try:
        count = migrate_run(RunFolder.for_run(action.source, *key, store_options(action.source, settings)),
                            RunFolder.for_run(action.target, *key, store_options(action.target, settings)))
    except (StorageError, OSError, ValueError) as exc:
        return MoveResult(action, error=str(exc))
    log.info("%s: moved %d files of run %s from %s to %s", action.job, count, action.run_id, action.source,
             action.target)
    return MoveResult(action)


def _launch(action: Launch, job: Job, adapters: dict[str, ComputeAdapter], settings: Settings,
            environ: Mapping[str, str]) -> LaunchResult:
    adapter = adapters.get(action.provider)
    if adapter is None:
        return LaunchResult(action, error=f"provider {action.provider!r} has no working adapter")
    secrets, missing = resolve_secrets(job, environ)
    if getattr(adapter, SECRETS_AT_PROVIDER, False):  # only the names travel; the provider holds the values
        secrets, missing = {name: "" for name in job.spec.secrets}, []
    handed = [replace(i, storage=i.storage or settings.storage) for i in action.inputs]
    if (refused := _not_ready(action, missing, handed, settings)) is not None:
        return refused
    folder = RunFolder.for_run(settings.storage, job.name, action.run_id, dict(settings.storage_options))
    try:
        epoch = folder.bump_lease()
    except StorageError as exc:
        return LaunchResult(action, unavailable=False, error=f"cannot take the run's lease: {exc}")
    try:
        inputs_env = artifacts.hand_over(folder, epoch, handed, lambda store: store_options(store, settings))
    except StorageError as exc:
        _unstarted(folder, epoch)
        return LaunchResult(action, unavailable=False, error=f"cannot write the list of inputs: {exc}")
    workdir = job.spec.code.path
    spec = LaunchSpec(
        job=job.name, run_id=action.run_id, epoch=epoch, command=list(job.spec.command),
        env=with_mtbf({**worker_env(job, folder, action.run_id, epoch), **inputs_env},
                      action.mtbf_seconds),
        secret_env=secrets, workdir=workdir,
        cpus=job.spec.resources.cpus, memory_gb=job.spec.resources.memory_gb, gpus=job.spec.resources.gpus,
        gpu_model=job.spec.resources.gpu_model, gpu_memory_gb=job.spec.resources.gpu_memory_gb,
        cuda=job.spec.resources.cuda,
        deadline=job.spec.deadline.timestamp() if job.spec.deadline is not None else None,
        code_git=job.spec.code.git, code_ref=job.spec.code.ref, image=job.spec.code.image,
        avoid_hosts=action.avoid_hosts, max_price_per_hour=job.spec.placement.max_price_per_hour,
    )
    try:
        ref = adapter.launch(spec)
    except JobConfigError as exc:
        _unstarted(folder, epoch)
        return LaunchResult(action, error=str(exc), unavailable=False, job_config_error=True)
    except LaunchRefused as exc:
        _unstarted(folder, epoch)
        return LaunchResult(action, error=str(exc))
    except (ProviderUnavailable, ProviderConfigError) as exc:  # it may have started one: the epoch stays used
        return LaunchResult(action, error=str(exc))
    except Exception as exc:  # an adapter bug is the provider's failure, not the job's (it may have started one)
        return LaunchResult(action, error=f"{type(exc).__name__}: {exc}")
    log.info("launched %s attempt %d on %s as %s (%s)", job.name, epoch, action.provider, ref.id, action.reason)
    return LaunchResult(action, ref=ref)


def _not_ready(action: Launch, missing_secrets: list[str], inputs: list[artifacts.Input],
               settings: Settings) -> LaunchResult | None:
    """The refusal when the job cannot launch yet: a secret not set here, or an input gone from
    storage (held: a person restores it or reruns the job that made it). Nothing is started or
    charged; the next tick tries again."""
    if missing_secrets:
        return LaunchResult(action, unavailable=False, error=(
            f"secret {', '.join(missing_secrets)} is not set in the reconciler's environment; set it and "
            "the next tick launches"))
    if why := artifacts.unavailable_inputs(inputs, lambda store: store_options(store, settings)):
        return LaunchResult(action, unavailable=False, held=True, error=f"an input is not available: {why}")
    return None


def _unstarted(folder: RunFolder, epoch: int) -> None:
    """A launch refused before anything started (LaunchRefused, or the job's own config error) left no
    worker: the next launch takes its epoch, so the attempt numbers
    in logs and messages stay those `describe` shows. Best effort: a lost release wastes a number."""
    try:
        folder.release_unstarted(epoch)
    except StorageError as exc:
        log.warning("could not release unused epoch %d of %s (%s)", epoch, folder.uri, exc)
