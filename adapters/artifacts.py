"""Artifacts: the files a run's completing attempt leaves in RECONCILER_OUTPUT_DIR, kept in run storage.

Layout, beside the checkpoints (docs/design.md §3)::

    <storage>/<job>/<run-id>/outputs/e<epoch>/<path>   each file as that attempt wrote it

The attempt uploads its outputs just before it completes, and their list (path, size, digests) goes
into the completion record, which only the holder of the lease can create (`RunFolder.mark_done`).
A replaced attempt (a zombie) uploads under its own epoch and cannot complete, so its files are
never a run's outputs. Everyone who reads them (`reconciler artifacts pull`, a dependent job's
inputs) verifies each file against that list.

A job that runs `after` others gets their outputs as inputs: the reconciler writes where the
completed runs are into the attempt's run folder (inputs-e<epoch>.json, named by RECONCILER_INPUTS),
and the worker (the SDK's `open_run`, or `reconciler exec`) downloads them under
RECONCILER_INPUT_DIR/<job>/ (a sweep: <sweep>/<member>/) before the training starts.
"""

from __future__ import annotations

import mmap
import os
import re
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from adapters import digest
from adapters.storage import RunFolder, StorageError

OUTPUTS = "outputs"
OUTPUT_DIR_VAR = "RECONCILER_OUTPUT_DIR"
INPUT_DIR_VAR = "RECONCILER_INPUT_DIR"
INPUTS_VAR = "RECONCILER_INPUTS"  # the file in the run folder that lists the attempt's inputs
INPUTS_FILE = "inputs-e{epoch}.json"  # {"inputs": [{"dir": "<job>" or "<sweep>/<member>", "uri": "<run folder>"}]}

Progress = Callable[[int], None]  # told each number of bytes as it is read or written


class ArtifactError(StorageError):
    """An output is missing, differs from its record, or its record is not usable."""


@dataclass(frozen=True)
class Artifact:
    path: str  # relative, with '/'
    size: int
    record: dict[str, Any]  # size and digests, as in the completion record


@dataclass(frozen=True)
class Input:
    """One completed run whose outputs a launch passes on: `dir` under RECONCILER_INPUT_DIR."""

    dir: str
    job: str
    run_id: str
    storage: str


# ---- writing (the completing attempt) -------------------------------------------------------------
def upload_outputs(folder: RunFolder, epoch: int, source: Path) -> dict[str, Any] | None:
    """Upload every file under `source` to outputs/e<epoch>/ and return the record for the
    completion record, or None when there is nothing to upload. Symbolic links are followed."""
    paths = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else []
    if not paths:
        return None
    prefix = f"{OUTPUTS}/e{epoch}"
    files = {}
    for path in paths:
        rel = path.relative_to(source).as_posix()
        with _mapped(path) as view:
            folder.store.write_payload(f"{prefix}/{rel}", view)
            digests = {name: _digest(name, view) for name in digest.written()}
            files[rel] = digest.record(len(view), digests)
    return {"folder": prefix, "files": files}


def _digest(algorithm: str, view: memoryview) -> str:
    hasher = digest.new(algorithm)
    hasher.update(view)
    return str(hasher.hexdigest())


class _mapped:
    """A read-only view of a whole file without reading it into memory (empty files included)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> memoryview:
        self.fh = open(self.path, "rb")  # noqa: SIM115 - closed in __exit__
        size = os.fstat(self.fh.fileno()).st_size
        self.map = mmap.mmap(self.fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.view = memoryview(self.map) if self.map is not None else memoryview(b"")
        return self.view

    def __exit__(self, *exc: object) -> None:
        self.view.release()
        if self.map is not None:
            self.map.close()
        self.fh.close()


# ---- reading ---------------------------------------------------------------------------------------
def outputs(folder: RunFolder) -> list[Artifact] | None:
    """The run's outputs from its completion record: None when the run has not completed, [] when it
    completed without any. ArtifactError when the record is malformed."""
    done = folder.done()
    if done is None:
        return None
    found = done.get("outputs")
    if not found:
        return []
    try:
        prefix, files = str(found["folder"]), found["files"]
        _safe(prefix)
        items = [Artifact(_safe(rel), int(meta["size"]), dict(meta)) for rel, meta in sorted(files.items())]
        for item in items:
            digest.check_record(item.record)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"the outputs listed in {folder.url('done.json')} are not readable: {exc}") from exc
    return items


def _safe(rel: str) -> str:
    """A relative path that stays inside the folder it is joined to (a record is untrusted input)."""
    parts = PurePosixPath(rel).parts
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("..", ".") for p in parts) or "\x00" in rel:
        raise ValueError(f"{rel!r} is not a relative path inside the run's outputs")
    return rel


def _prefix(folder: RunFolder) -> str:
    done = folder.done() or {}
    return str((done.get("outputs") or {}).get("folder", ""))


def missing(folder: RunFolder, items: list[Artifact]) -> list[str]:
    """The outputs the record lists that are absent from storage or of another size (one listing)."""
    present = folder.store.list(_prefix(folder))
    return [a.path for a in items if present.get(a.path) != a.size]


def download(folder: RunFolder, items: list[Artifact], dest: Path, progress: Progress | None = None) -> list[Path]:
    """Each output into `dest` (made if need be), verified against its record; a file already there
    with the recorded digest is kept. Written beside the target and renamed, so a target is never
    half-written. ArtifactError names the file that is missing or differs."""
    prefix = _prefix(folder)
    written = []
    for item in items:
        target = dest / item.path
        if _matches(target, item):
            if progress is not None:
                progress(item.size)
        else:
            _fetch(folder, f"{prefix}/{item.path}", item, target, progress)
        written.append(target)
    return written


def _matches(target: Path, item: Artifact) -> bool:
    if not target.is_file() or target.stat().st_size != item.size:
        return False
    algorithm, want = digest.expected(item.record)
    with _mapped(target) as view:
        return _digest(algorithm, view) == want


class _Counting:
    """A hasher that also reports each chunk's length (the store feeds it as bytes land)."""

    def __init__(self, inner: Any, progress: Progress | None) -> None:
        self.inner, self.progress = inner, progress

    def update(self, chunk: Any) -> None:
        self.inner.update(chunk)
        if self.progress is not None:
            self.progress(memoryview(chunk).nbytes)

    def hexdigest(self) -> str:
        return str(self.inner.hexdigest())


def _fetch(folder: RunFolder, name: str, item: Artifact, target: Path, progress: Progress | None) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    algorithm, want = digest.expected(item.record)
    hasher = _Counting(digest.new(algorithm), progress)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "r+b") as fh:
            if item.size:
                fh.truncate(item.size)
                with mmap.mmap(fh.fileno(), item.size) as mm:
                    got = _read_into_map(folder, name, mm, hasher)
            else:
                got = _read(folder, name, memoryview(bytearray(1)), hasher)
        if got != item.size:
            raise ArtifactError(f"{folder.url(name)} has {got} bytes, the completion record says {item.size}")
        if hasher.hexdigest() != want:
            raise ArtifactError(f"{folder.url(name)} does not match its {algorithm} in the completion record")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_into_map(folder: RunFolder, name: str, mm: mmap.mmap, hasher: Any) -> int:
    """`_read` into a writable map, whose views must all be gone before it closes: a failed read's
    traceback holds slices of it, so the error leaves without its traceback."""
    view, error = memoryview(mm), None
    try:
        got = _read(folder, name, view, hasher)
    except (StorageError, OSError) as exc:
        error, got = exc.with_traceback(None), 0
    view.release()
    if error is not None:
        raise error
    return got


def _read(folder: RunFolder, name: str, out: memoryview, hasher: Any) -> int:
    try:
        return folder.store.read_payload_into(name, out, hasher)
    except StorageError as exc:
        parent, _, base = name.rpartition("/")
        if base not in folder.store.list(parent):
            raise ArtifactError(f"{folder.url(name)} is missing from run storage") from None
        raise ArtifactError(f"{folder.url(name)} could not be read: {exc}") from None


# ---- a dependent job's inputs ------------------------------------------------------------------------
def hand_over(folder: RunFolder, epoch: int, inputs: list[Input],
              options: Callable[[str], dict[str, Any]]) -> dict[str, str]:
    """Write where each completed run is into the launching attempt's run folder (a sweep of 1,000
    members would not fit in one environment variable) and return the environment that names the
    file, or {} without inputs. `options` gives a store's options."""
    if not inputs:
        return {}
    listed = [{"dir": i.dir, "uri": RunFolder.for_run(i.storage, i.job, i.run_id, options(i.storage)).uri}
              for i in inputs]
    name = INPUTS_FILE.format(epoch=epoch)
    folder.write_json(name, {"inputs": listed})
    return {INPUTS_VAR: name}


def unavailable_inputs(inputs: list[Input], options: Callable[[str], dict[str, Any]]) -> str:
    """Why the inputs cannot be handed over, in one sentence, or "" when every listed output is there."""
    for i in inputs:
        folder = RunFolder.for_run(i.storage, i.job, i.run_id, options(i.storage))
        try:
            items = outputs(folder)
            lost = missing(folder, items or [])
        except StorageError as exc:
            return f"the outputs of {i.job} (run {i.run_id}) cannot be read: {exc}"
        if items is None:
            return f"{i.job} (run {i.run_id}) has no completion record in {folder.url()}"
        if lost:
            shown = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
            return (f"output {shown} of {i.job} (run {i.run_id}) is missing from {folder.url(_prefix(folder))}; "
                    f"restore it, or change {i.job}'s manifest so that it runs again")
    return ""


def attempt_dirs(env: MutableMapping[str, str]) -> tuple[Path, Path]:
    """RECONCILER_OUTPUT_DIR and RECONCILER_INPUT_DIR for this attempt: as set, or fresh folders of
    its own under the temporary directory; both are made and set in `env`."""
    tag = "-".join(env.get(k, "") for k in ("RECONCILER_JOB", "RECONCILER_RUN_ID", "RECONCILER_EPOCH")).strip("-")
    base = Path(tempfile.gettempdir()) / "reconciler" / (tag or f"pid{os.getpid()}")
    made = []
    for var, default in ((OUTPUT_DIR_VAR, base / "outputs"), (INPUT_DIR_VAR, base / "inputs")):
        path = Path(env.get(var) or default)
        path.mkdir(parents=True, exist_ok=True)
        env[var] = str(path)
        made.append(path)
    return made[0], made[1]


def listed_inputs(own: RunFolder, env: MutableMapping[str, str]) -> Iterator[tuple[str, str]]:
    """(dir, run folder URI) of each input in the file of the attempt's run folder RECONCILER_INPUTS names."""
    name = env.get(INPUTS_VAR)
    if not name:
        return
    if not re.fullmatch(r"inputs-e\d+\.json", name):
        raise ArtifactError(f"{INPUTS_VAR}={name!r} is not the name of an inputs file (inputs-e<epoch>.json)")
    data = own.read_json(name)
    if data is None:
        raise ArtifactError(f"{own.url(name)}, the list of this attempt's inputs, is missing")
    try:
        pairs = [(_safe(str(e["dir"])), str(e["uri"])) for e in data["inputs"]]
    except (ValueError, TypeError, KeyError) as exc:
        raise ArtifactError(f"{own.url(name)} is not a list of inputs: {exc}") from exc
    yield from pairs


def fetch_inputs(own: RunFolder, env: MutableMapping[str, str], dest: Path,
                 storage_options: dict[str, Any] | None = None) -> int:
    """Download and verify every input of this attempt (its run folder `own`, RECONCILER_INPUTS)
    under `dest`; returns the bytes kept. ArtifactError, naming the run and the file, when one is
    missing or differs."""
    total = 0
    for rel, uri in listed_inputs(own, env):
        folder = RunFolder(uri, storage_options)
        items = outputs(folder)
        if items is None:
            raise ArtifactError(f"input {rel}: the run at {uri} has not completed, so it has no outputs")
        download(folder, items, dest / rel)
        total += sum(a.size for a in items)
    return total
