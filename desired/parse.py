"""Turns the files of `desired/` at one commit into a DesiredState plus per-file errors.

Pure: it takes file contents, not paths to open. A broken file yields errors that name the
file, the document and the field; it never stops the other files from being read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from desired.models import Job, Provider, Settings, default_local_provider

MAX_FILE_BYTES = 1_000_000
MAX_DOCUMENTS = 200
SETTINGS_FILE = "reconciler.yaml"


@dataclass(frozen=True)
class ManifestError:
    file: str
    message: str
    document: int | None = None  # 1-based index of the YAML document in the file
    field: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.document is not None:
            where += f" (document {self.document})"
        if self.field:
            where += f" field {self.field}"
        return f"{where}: {self.message}"


@dataclass
class DesiredState:
    jobs: dict[str, Job] = field(default_factory=dict)
    providers: dict[str, Provider] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)
    errors: list[ManifestError] = field(default_factory=list)
    job_files: dict[str, str] = field(default_factory=dict)  # job name -> file it came from

    @property
    def files_with_errors(self) -> set[str]:
        return {e.file for e in self.errors}


class _NoAliasLoader(yaml.SafeLoader):
    """Safe loading without anchors/aliases, so a small file cannot expand into a huge one."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"YAML aliases are not allowed (line {event.start_mark.line + 1})")
        return super().compose_node(parent, index)


def load_documents(text: str | bytes) -> list[Any]:
    """All documents of one YAML text; raises ValueError with a readable reason."""
    if len(text) > MAX_FILE_BYTES:
        raise ValueError(f"file is {len(text)} bytes; the limit is {MAX_FILE_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError("file is not UTF-8 text") from exc
    loader = _NoAliasLoader(text)
    docs: list[Any] = []
    try:
        while loader.check_data():
            docs.append(loader.get_data())
            if len(docs) > MAX_DOCUMENTS:
                raise ValueError(f"more than {MAX_DOCUMENTS} documents in one file")
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML: {str(exc).splitlines()[0]}") from exc
    finally:
        loader.dispose()
    return [d for d in docs if d is not None]


def _validation_errors(file: str, doc_index: int, exc: ValidationError) -> list[ManifestError]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see `reconciler schema`)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        out.append(ManifestError(file, msg, doc_index, loc or None))
    return out


def _validate(model: type[BaseModel], data: Any, file: str, index: int) -> tuple[Any, list[ManifestError]]:
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, _validation_errors(file, index, exc)


def parse_settings(text: str | bytes | None, file: str = SETTINGS_FILE) -> tuple[Settings, list[ManifestError]]:
    if text is None:
        return Settings(), []
    try:
        docs = load_documents(text)
    except ValueError as exc:
        return Settings(), [ManifestError(file, str(exc))]
    if not docs:
        return Settings(), []
    settings, errors = _validate(Settings, docs[0], file, 1)
    return (settings or Settings()), errors


def parse_desired(files: Mapping[str, str | bytes], settings_text: str | bytes | None = None) -> DesiredState:
    """`files` maps paths (e.g. 'desired/train.yaml') to contents. Only .yaml/.yml files count."""
    state = DesiredState()
    state.settings, state.errors = parse_settings(settings_text)
    job_origin: dict[str, str] = {}
    provider_origin: dict[str, str] = {}
    for path in sorted(files):
        if not path.endswith((".yaml", ".yml")):
            continue
        try:
            docs = load_documents(files[path])
        except ValueError as exc:
            state.errors.append(ManifestError(path, str(exc)))
            continue
        for index, doc in enumerate(docs, start=1):
            if not isinstance(doc, dict):
                state.errors.append(ManifestError(path, "a manifest must be a mapping", index))
                continue
            kind = doc.get("kind")
            if kind == "Job":
                job, errors = _validate(Job, doc, path, index)
                state.errors.extend(errors)
                if job is None:
                    continue
                if job.name in job_origin:
                    state.errors.append(
                        ManifestError(path, f"job {job.name!r} is already defined in {job_origin[job.name]}",
                                      index, "metadata.name")
                    )
                    continue
                job_origin[job.name] = path
                state.jobs[job.name] = job
                state.job_files[job.name] = path
            elif kind == "Provider":
                provider, errors = _validate(Provider, doc, path, index)
                state.errors.extend(errors)
                if provider is None:
                    continue
                if provider.name in provider_origin:
                    state.errors.append(
                        ManifestError(path, f"provider {provider.name!r} is already defined in "
                                      f"{provider_origin[provider.name]}", index, "metadata.name")
                    )
                    continue
                provider_origin[provider.name] = path
                state.providers[provider.name] = provider
            else:
                state.errors.append(
                    ManifestError(path, f"unknown kind {kind!r}; expected Job or Provider", index, "kind")
                )
    if not state.providers:
        state.providers["local"] = default_local_provider()
    # A job naming a provider that does not exist is a config error of that job alone.
    for name, job in list(state.jobs.items()):
        missing = [p for p in job.spec.placement.providers if p not in state.providers]
        if missing and len(missing) == len(job.spec.placement.providers):
            state.errors.append(
                ManifestError(state.job_files[name], f"no provider named {', '.join(missing)} is defined",
                              None, "spec.placement.providers")
            )
    return state
