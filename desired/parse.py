"""Turns the files of `desired/` at one commit into a DesiredState plus per-file errors.

Pure: it takes file contents, not paths to open. A broken file yields errors that name the
file, the document and the field; it never stops the other files from being read. A Job with
`spec.matrix` becomes one job per member (desired.matrix), all of them or, with an error, none.

A file is refused, with a reason naming its line, when it is larger than MAX_FILE_BYTES, holds
more than MAX_DOCUMENTS documents, is not UTF-8 text (binary, NUL bytes, UTF-16, control
characters), nests deeper than MAX_DEPTH, uses aliases, repeats a key in one mapping (a reviewer
reads the first, YAML keeps the last), or holds an integer longer than MAX_NUMBER_CHARS.
"""

from __future__ import annotations

import codecs
import difflib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from desired.matrix import Problem, Sweep, expand, stray_references
from desired.models import HOSTED_PROVIDER_TYPES, Job, Provider, Settings, default_local_provider
from desired.order import cycles
from desired.suggest import did_you_mean, fields_at

MAX_FILE_BYTES = 1_000_000
MAX_DOCUMENTS = 200
MAX_DEPTH = 64  # levels of nesting; real manifests use under 10
MAX_NUMBER_CHARS = 100
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
    sweeps: dict[str, Sweep] = field(default_factory=dict)  # jobs with a matrix, by name (desired.matrix)
    sweep_of: dict[str, str] = field(default_factory=dict)  # member job name -> its sweep's name

    @property
    def files_with_errors(self) -> set[str]:
        return {e.file for e in self.errors}


class YamlProblem(ValueError):
    """A reason a YAML text cannot be read, with the document and field when they are known."""

    def __init__(self, message: str, document: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.document = document
        self.field = field


class _SafeLoader(yaml.SafeLoader):
    """Safe loading that refuses what lets a small file attack its reader: aliases (a small
    document expanding into a huge one) and nesting deeper than MAX_DEPTH (the composer recurses
    once per level, so 330 levels in 664 bytes used to raise RecursionError)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise YamlProblem(f"YAML aliases are not allowed (line {line})")
        if not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise YamlProblem(f"nesting is deeper than {MAX_DEPTH} levels (line {line})")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_node(node: yaml.Node, path: str) -> None:
    """Refuses duplicate keys (a reviewer reads the first, YAML keeps the last), numbers too long
    to convert (Python refuses ints over 4,300 digits) and NUL characters; `path` names the field.
    Recursion is bounded by MAX_DEPTH, which the loader enforced."""
    if isinstance(node, yaml.ScalarNode):
        _check_scalar(node, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_node(item, f"{path}.{i}" if path else str(i))
    elif isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlProblem(f"a key must be a plain value (line {line})", field=path or None)
            _check_scalar(key_node, path)
            key = (key_node.tag, key_node.value)
            where = f"{path}.{key_node.value}" if path else str(key_node.value)
            if key in seen:
                raise YamlProblem(f"duplicate key {key_node.value!r} at line {line} (first at line {seen[key]}); "
                                  "a reader sees the first, YAML would keep the last", field=where)
            seen[key] = line
            _check_node(value_node, where)


def _check_scalar(node: yaml.ScalarNode, path: str) -> None:
    line = node.start_mark.line + 1
    if node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_NUMBER_CHARS:
        raise YamlProblem(f"a number of {len(node.value)} characters (line {line}) is too large; "
                          f"the limit is {MAX_NUMBER_CHARS}", field=path or None)
    if "\x00" in node.value:
        raise YamlProblem(f"a NUL character is not allowed (line {line})", field=path or None)


def _decode(data: bytes) -> str:
    """UTF-8 text, or a reason naming what the bytes look like instead."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise YamlProblem("file is UTF-16 or UTF-32 text (it starts with a byte-order mark); save it as UTF-8")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise YamlProblem(f"file contains a NUL byte (offset {nul}): is it a binary file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlProblem(f"file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from exc


# What YAML itself refuses (its Reader's NON_PRINTABLE), found first so the reason names the line.
_UNPRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _check_printable(text: str) -> None:
    bad = _UNPRINTABLE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise YamlProblem(f"control character U+{ord(bad.group()):04X} at line {line}, column {column}; "
                          "only printable text is allowed")


def _yaml_reason(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def load_documents(text: str | bytes) -> list[Any]:
    """All non-empty documents of one YAML text; raises YamlProblem (a ValueError) with a reason."""
    return [d for d in load_all(text) if d is not None]


def load_all(text: str | bytes) -> list[Any]:
    """Every document, empty ones as None, so that positions are the file's document numbers."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise YamlProblem(f"file is {size} bytes; the limit is {MAX_FILE_BYTES} bytes")
    if isinstance(text, bytes):
        text = _decode(text)
    _check_printable(text)
    loader = _SafeLoader(text)
    docs: list[Any] = []
    try:
        while loader.check_node():
            if len(docs) >= MAX_DOCUMENTS:
                raise YamlProblem(f"more than {MAX_DOCUMENTS} documents in one file")
            docs.append(_load_one(loader, len(docs) + 1))
    except yaml.YAMLError as exc:  # found while looking for the next document
        raise YamlProblem(_yaml_reason(exc), len(docs) + 1) from exc
    finally:
        loader.dispose()
    return docs


def _load_one(loader: _SafeLoader, index: int) -> Any:
    try:
        node = loader.get_node()
        if node is None:
            return None
        _check_node(node, "")
        return loader.construct_document(node)
    except YamlProblem as exc:
        exc.document = index
        raise
    except yaml.YAMLError as exc:
        raise YamlProblem(_yaml_reason(exc), index) from exc
    except RecursionError as exc:  # a last guard; MAX_DEPTH should make it unreachable
        raise YamlProblem("nesting is too deep to read", index) from exc


def field_problems(exc: ValidationError, model: type[BaseModel]) -> list[tuple[str | None, str]]:
    """Every error pydantic found (all at once), as (the field's dotted path, what is wrong), an
    unknown field with the known field its spelling is closest to. For manifests and for files the
    daemon reads back (status/room.yaml)."""
    out: list[tuple[str | None, str]] = []
    for err in exc.errors():
        parts = [p for p in err["loc"] if not str(p).startswith("function-")]
        loc = ".".join(str(p) for p in parts)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            where, known = fields_at(model, parts)
            loc = ".".join(where)
            hint = did_you_mean(str(parts[-1]), known) if parts else ""
            msg = f"unknown field{hint}" if hint else "unknown field (check the spelling; see `reconciler schema`)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        out.append((loc or None, msg))
    return out


def _validation_errors(file: str, doc_index: int, exc: ValidationError,
                       model: type[BaseModel]) -> list[ManifestError]:
    return [ManifestError(file, msg, doc_index, loc) for loc, msg in field_problems(exc, model)]


def _validate(model: type[BaseModel], data: Any, file: str, index: int) -> tuple[Any, list[ManifestError]]:
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, _validation_errors(file, index, exc, model)


def parse_settings(text: str | bytes | None, file: str = SETTINGS_FILE) -> tuple[Settings, list[ManifestError]]:
    if text is None:
        return Settings(), []
    try:
        docs = load_documents(text)
    except ValueError as exc:
        return Settings(), [_file_error(file, exc)]
    if not docs:
        return Settings(), []
    settings, errors = _validate(Settings, docs[0], file, 1)
    return (settings or Settings()), errors


def _file_error(file: str, exc: ValueError) -> ManifestError:
    if isinstance(exc, YamlProblem):
        return ManifestError(file, str(exc), exc.document, exc.field)
    return ManifestError(file, str(exc))


def parse_desired(files: Mapping[str, str | bytes], settings_text: str | bytes | None = None) -> DesiredState:
    """`files` maps paths (e.g. 'desired/train.yaml') to contents. Only .yaml/.yml files count."""
    state = DesiredState()
    state.settings, state.errors = parse_settings(settings_text)
    origins: dict[tuple[str, str], str] = {}  # (kind, name) -> file that defined it first
    for path in sorted(files):
        if not path.endswith((".yaml", ".yml")):
            continue
        try:
            _parse_file(state, path, files[path], origins)
        except Exception as exc:  # a last guard: whatever one file does stays in that file
            state.errors.append(ManifestError(path, f"could not be read ({type(exc).__name__}: {exc})"))
    refused = _check_hosted_storage(state, origins)
    _check_placements(state, refused)
    _check_after(state)
    return state


# fsspec protocols whose data stays on (or in) the daemon's machine; a URL without a protocol is a path.
_THIS_MACHINE = frozenset({"file", "local", "asynclocal", "memory"})


def on_this_machine(url: str) -> bool:
    """The storage URL names the daemon's own disk, however spelled: file://, local://, FILE://, a
    bare path, or a chain (simplecache::file://) whose last filesystem is one of those."""
    target = url.strip().split("::")[-1]
    protocol, sep, _ = target.partition("://")
    return not sep or protocol.lower() in _THIS_MACHINE


def _storage_named(url: str) -> str:
    return f"storage {url!r}" if url else "the default storage (a folder on the daemon's machine)"


def _check_hosted_storage(state: DesiredState, origins: dict[tuple[str, str], str]) -> set[str]:
    """A hosted worker cannot see the daemon's disk: a hosted provider with run storage on this
    machine is refused (named with the storage), so nothing launches there that could never save."""
    if not on_this_machine(state.settings.storage):
        return set()
    refused = {name for name, p in state.providers.items() if p.spec.type in HOSTED_PROVIDER_TYPES}
    for name in sorted(refused):
        kind = state.providers.pop(name).spec.type
        state.errors.append(ManifestError(
            origins.get(("Provider", name), "reconciler.yaml"),
            f"{kind} provider {name!r} cannot use {_storage_named(state.settings.storage)}: its workers cannot see "
            "this machine's disk; set `storage:` in reconciler.yaml to an S3 URL they can reach",
            None, "spec.settings.type"))
    return refused


def _parse_file(state: DesiredState, path: str, content: str | bytes, origins: dict[tuple[str, str], str]) -> None:
    try:
        docs = load_all(content)
    except ValueError as exc:
        state.errors.append(_file_error(path, exc))
        return
    for index, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            state.errors.append(ManifestError(path, "a manifest must be a mapping", index))
            continue
        kind = str(doc.get("kind"))
        model = KINDS.get(kind)
        if model is None:  # the rest of the document is still checked, as the kind it is closest to
            state.errors.append(_unknown_kind(path, index, doc.get("kind")))
            guess = KINDS.get(next(iter(difflib.get_close_matches(kind, KINDS, n=1, cutoff=0.6)), ""))
            if guess is not None:
                state.errors.extend(_validate(guess, {**doc, "kind": guess.__name__}, path, index)[1])
            continue
        obj, errors = _validate(model, doc, path, index)
        state.errors.extend(errors)
        if obj is None:
            continue
        first = origins.setdefault((kind, obj.name), path)
        if obj.name in (state.jobs if isinstance(obj, Job) else state.providers) or \
                (isinstance(obj, Job) and obj.name in state.sweeps):
            where = state.job_files.get(obj.name, first) if isinstance(obj, Job) else first
            state.errors.append(ManifestError(path, f"{kind.lower()} {obj.name!r} is already defined in {where}",
                                              index, "metadata.name"))
            continue
        if isinstance(obj, Job):
            _add_job(state, obj, path, index)
        else:
            state.providers[obj.name] = obj


def _add_job(state: DesiredState, job: Job, path: str, index: int) -> None:
    """A plain job, or a sweep's members (desired.matrix): all of them, or none with the reason."""
    sweep, members, problems = (expand(job, path) if job.spec.matrix is not None
                                else (None, [job], stray_references(job)))
    taken = next((m.name for m in members if m.name in state.jobs or m.name in state.sweeps), None)
    if taken is not None and not problems:
        problems = [Problem(f"member {taken} of this sweep is already defined in "
                            f"{state.job_files.get(taken) or state.sweeps[taken].file}; rename one of the jobs",
                            "metadata.name")]
    if problems:
        state.errors.extend(ManifestError(path, p.message, index, p.field) for p in problems)
        return
    for member in members:
        state.jobs[member.name] = member
        state.job_files[member.name] = path
    if sweep is not None:
        state.sweeps[sweep.name] = sweep
        state.sweep_of.update((m.name, sweep.name) for m in members)


KINDS: dict[str, type[Job] | type[Provider]] = {"Job": Job, "Provider": Provider}


def _unknown_kind(path: str, index: int, kind: Any) -> ManifestError:
    hint = did_you_mean(str(kind), set(KINDS))
    what = "no kind" if kind is None else f"unknown kind {str(kind)[:80]!r}"
    return ManifestError(path, f"{what}; expected Job or Provider{hint}", index, "kind")


def _check_placements(state: DesiredState, refused: Collection[str] = ()) -> None:
    """A job naming only providers that do not exist is a config error of that job alone."""
    if not state.providers and not refused:
        state.providers["local"] = default_local_provider()
    said: set[ManifestError] = set()  # once for a sweep, not once for each of its members
    for name, job in list(state.jobs.items()):
        missing = [p for p in job.spec.placement.providers if p not in state.providers]
        if missing and len(missing) == len(job.spec.placement.providers):
            what = (f"provider {', '.join(missing)} is refused (see its error)" if set(missing) <= set(refused)
                    else f"no provider named {', '.join(missing)} is defined")
            error = ManifestError(state.job_files[name], what, None, "spec.placement.providers")
            if error not in said:
                said.add(error)
                state.errors.append(error)


def _check_after(state: DesiredState) -> None:
    """`spec.after` names other jobs or sweeps of this repository (a sweep stands for all its
    members), with no cycle. A job that breaks the rule is an error of its file and is left out, as
    a job that does not parse is: held as it is, never started, while the others go on (a job that
    waits for it says so). A sweep's members share their sweep's `after`: its error is said once."""
    reasons: dict[str, str] = {}
    broken = " (a manifest with errors defines none)" if state.files_with_errors - {SETTINGS_FILE} else ""
    known = set(state.jobs) | set(state.sweeps)
    for name, job in state.jobs.items():
        own = state.sweep_of.get(name, name)
        if own in job.spec.after:
            reasons[name] = f"a job cannot run after itself; remove {own} from `after`"
            continue
        unknown = [n for n in job.spec.after if n not in known]
        if unknown:
            hint = did_you_mean(unknown[0], known) if len(unknown) == 1 else ""
            todo = hint or "; name a job of this repository or remove it from `after`"
            reasons[name] = f"no job named {', '.join(unknown)} is defined{broken}{todo}"
    for group, loop in cycles({n: after_jobs(state, j.spec.after) for n, j in state.jobs.items()}):
        said = (f"`after` makes a cycle, so none of these jobs could start: {_chain(loop)}; "
                "remove one of these from `after`")
        for name in group:
            reasons.setdefault(name, said)
    told: set[ManifestError] = set()
    for name in sorted(reasons):
        error = ManifestError(state.job_files.pop(name), reasons[name], None, "spec.after")
        if error not in told:
            told.add(error)
            state.errors.append(error)
        del state.jobs[name]


def after_jobs(state: DesiredState, names: Sequence[str]) -> list[str]:
    """The jobs `after` names, a sweep's name standing for each of its members."""
    return [job for name in names for job in (state.sweeps[name].members if name in state.sweeps else [name])]


def _chain(loop: list[str], most: int = 8) -> str:
    """`a waits for b, which waits for a`; a long cycle is cut short (its size said), so that its
    message stays readable and costs the same for each of its jobs."""
    if len(loop) <= most:
        return f"{loop[0]} waits for {', which waits for '.join(loop[1:])}"
    return (f"{loop[0]} waits for {', which waits for '.join(loop[1:most - 1])}, and so on through "
            f"{len(loop) - 1} jobs back to {loop[0]}")
