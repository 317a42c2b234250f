"""Where a job's (or a sweep's members') outputs are: the completed runs its status names, read
from run storage for `reconciler artifacts` and the status page (adapters/artifacts.py has the format)."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.artifacts import Artifact, ArtifactError, outputs
from adapters.storage import RunFolder, StorageError
from desired.parse import DesiredState
from reconciler.daemon.execute import store_options
from status.models import JobStatus, Phase


@dataclass(frozen=True)
class RunOutputs:
    job: str
    run_id: str
    folder: RunFolder
    items: list[Artifact]


@dataclass(frozen=True)
class Located:
    found: list[RunOutputs]  # each completed run, in the order of the jobs (a sweep's members' order)
    not_done: list[str]  # "member (Running)": jobs asked for whose run has not completed


def members(name: str, desired: DesiredState, recorded: dict[str, JobStatus]) -> list[str]:
    """The jobs `name` stands for: a sweep's members, else the job itself. ArtifactError naming the
    known jobs when there is no such job."""
    if name in desired.sweeps:
        return list(desired.sweeps[name].members)
    if name in desired.jobs or name in recorded:
        return [name]
    known = sorted(set(desired.jobs) | set(recorded) | set(desired.sweeps))
    raise ArtifactError(f"no job or sweep named {name} (known: {', '.join(known) or 'none'})")


def locate(name: str, desired: DesiredState, recorded: dict[str, JobStatus]) -> Located:
    """The completed runs of `name` with their outputs, read from run storage."""
    found, not_done = [], []
    for job in members(name, desired, recorded):
        st = recorded.get(job)
        if st is None or st.phase != Phase.SUCCEEDED:
            not_done.append(f"{job} ({st.phase.value if st else 'New'})")
            continue
        store = st.storage or desired.settings.storage
        try:
            folder = RunFolder.for_run(store, job, st.run_id, store_options(store, desired.settings))
            items = outputs(folder)
        except (StorageError, OSError, ValueError) as exc:
            raise ArtifactError(f"the outputs of {job} (run {st.run_id}) cannot be read: {exc}") from exc
        if items is None:
            raise ArtifactError(f"{job} says Succeeded but run {st.run_id} has no completion record in "
                                f"{folder.url()}: was the run folder deleted or moved?")
        found.append(RunOutputs(job, st.run_id, folder, items))
    return Located(found, not_done)
