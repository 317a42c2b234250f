"""A Job's `spec.matrix` expanded into its members, one Job each (a sweep), as GitHub Actions does.

Pure: a validated Job in, member Jobs (or the problems that stop the expansion) out.

- Members: every combination of the matrix's lists, in the order written (the first key varies
  slowest), less those matching an `exclude` entry (every key of the entry equal); then each
  `include` entry is merged into every combination whose original matrix values it leaves as they
  are (its other keys are added, or overwrite keys an earlier entry added), and an entry that fits
  none is a member of its own. As GitHub Actions does it.
- Names: the job's name, then `-KEY-VALUE` for each of the member's keys in the matrix's order
  (its lists', then the keys `include` adds, as first written), lowercased, each run of other
  characters than `a-z` and `0-9` made one `-` (`lr: 0.001` gives `lr-0-001`). A value that does
  not read back from its part (anything but letters, digits and inner dashes, or a plain decimal
  number), or a name longer than 63 characters, gets `-` and 8 hex digits of a digest of the
  member's values instead of the tail: a name depends on the job's name and the member's own
  values alone, so adding a member never renames another. Two members still named alike (values
  that differ only in case, say) are an error.
- Values: `${{ matrix.KEY }}` in `command` items and `env` values is replaced by the member's value
  (`true`/`false` for booleans, numbers in their shortest form: `1.50` is `1.5`; empty for a key
  only other members have), and each key is also passed as `RECONCILER_MATRIX_<KEY>` (upper case, `-` as `_`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from desired.models import DNS_LABEL, MATRIX_KEY, Job, Matrix
from desired.suggest import did_you_mean

MAX_MEMBERS = 1000
MAX_COMBINATIONS = 10 * MAX_MEMBERS  # the lists' product before exclude: bounds the work a typo can cause
ENV_PREFIX = "RECONCILER_MATRIX_"
NAME_LIMIT = 63
DIGEST_CHARS = 8
REFERENCE = re.compile(r"\$\{\{\s*matrix\.([A-Za-z0-9_-]*)\s*\}\}")
_PLAIN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*|[0-9]+\.[0-9]+")
_OTHER = re.compile(r"[^a-z0-9]+")

Value = str | int | float | bool


@dataclass(frozen=True)
class Problem:
    """Why a matrix cannot be expanded, with the field to name in the error."""

    message: str
    field: str = "spec.matrix"


@dataclass(frozen=True)
class Sweep:
    """A job with a matrix, as parsed: its members are jobs of their own in the desired state."""

    name: str
    file: str
    max_parallel: int | None = None
    members: dict[str, dict[str, Value]] = field(default_factory=dict)  # member name -> its values, in order


def value_text(value: Value) -> str:
    """A value as it is substituted, passed in the environment and named."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace("-", "_")


def expand(job: Job, file: str) -> tuple[Sweep | None, list[Job], list[Problem]]:
    """The sweep `job` (from `file`) makes and its members as Jobs, or the problems that stop it
    (then none of it runs)."""
    matrix = job.spec.matrix
    assert matrix is not None
    problems = _check_keys(matrix) + _check_env(job)
    combos: list[dict[str, Value]] = []
    if not problems:
        combos, problems = combinations(matrix)
    if not problems:
        problems = _check_references(job, list(dict.fromkeys(k for c in combos for k in c)))
    members = [] if problems else [_member(job, values) for values in combos]
    problems = problems or _duplicates(members, combos)
    if problems:
        return None, [], problems
    values = {m.name: v for m, v in zip(members, combos, strict=True)}
    return Sweep(job.name, file, matrix.max_parallel, values), members, []


def combinations(matrix: Matrix) -> tuple[list[dict[str, Value]], list[Problem]]:
    """Every member's values: the lists' product less `exclude`, then `include` (GitHub's rules)."""
    axes = matrix.axes
    size = math.prod(len(v) for v in axes.values()) if axes else 0
    if size > MAX_COMBINATIONS:
        return [], [Problem(f"the matrix's lists make {size:,} combinations; at most {MAX_COMBINATIONS:,} are "
                            f"read (and {MAX_MEMBERS:,} members run): shorten the lists or split the job")]
    combos = [dict(zip(axes, values, strict=True)) for values in product(*axes.values())] if axes else []
    combos = [c for c in combos if not any(_matches(c, entry) for entry in matrix.exclude)]
    original = len(combos)
    for entry in matrix.include:
        fits = [c for c in combos[:original] if all(_same(c[k], v) for k, v in entry.items() if k in axes)]
        for c in fits:
            c.update(entry)
        if not fits:
            combos.append(dict(entry))
    if not combos:
        what = "every combination is excluded" if axes else "it has no keys with values and no include entries"
        return [], [Problem(f"the matrix makes no members ({what}); give it values, or remove `matrix`")]
    if len(combos) > MAX_MEMBERS:
        return [], [Problem(f"the matrix makes {len(combos):,} members; at most {MAX_MEMBERS:,} are allowed: "
                            "shorten its lists or split the job into several")]
    order = list(dict.fromkeys([*axes, *(k for entry in matrix.include for k in entry)]))
    return [{k: c[k] for k in order if k in c} for c in combos], []


def _same(a: Value, b: Value) -> bool:
    """Equal and of the same kind: `true` is not `1`, though Python says so."""
    return isinstance(a, bool) == isinstance(b, bool) and isinstance(a, str) == isinstance(b, str) and a == b


def _matches(combo: dict[str, Value], entry: dict[str, Value]) -> bool:
    return all(k in combo and _same(combo[k], v) for k, v in entry.items())


def _check_keys(matrix: Matrix) -> list[Problem]:
    """Keys of `include` spelled as matrix keys, `exclude` naming only keys the matrix has, and no
    two keys passed as the same environment variable."""
    axes = matrix.axes
    problems = []
    for i, entry in enumerate(matrix.exclude):
        for key in entry:
            if key not in axes:
                problems.append(Problem(f"`{key}` is not a key of the matrix{did_you_mean(key, set(axes))}; an "
                                        "exclude entry names keys the matrix lists", f"spec.matrix.exclude.{i}"))
    for i, entry in enumerate(matrix.include):
        for key in entry:
            if not MATRIX_KEY.fullmatch(key):
                problems.append(Problem(f"{key!r} is not a valid matrix key: use a letter, then letters, digits, "
                                        "'_' or '-' (at most 40)", f"spec.matrix.include.{i}"))
    seen: dict[str, str] = {}
    for key in [*axes, *(k for entry in matrix.include for k in entry)]:
        other = seen.setdefault(env_name(key), key)
        if other != key:
            problems.append(Problem(f"matrix keys `{other}` and `{key}` would both be passed as {env_name(key)}; "
                                    "rename one"))
            break
    return problems


def _check_env(job: Job) -> list[Problem]:
    return [Problem(f"{key} is set for each member from the matrix; remove it from env", f"spec.env.{key}")
            for key in job.spec.env if key.startswith(ENV_PREFIX)]


def _texts(job: Job) -> list[tuple[str, str]]:
    """(field, text) of everything `${{ matrix.KEY }}` is replaced in."""
    return ([(f"spec.command.{i}", arg) for i, arg in enumerate(job.spec.command)]
            + [(f"spec.env.{k}", v) for k, v in job.spec.env.items()])


def _check_references(job: Job, keys: list[str]) -> list[Problem]:
    problems = []
    for where, text in _texts(job):
        for key in REFERENCE.findall(text):
            if key not in keys:
                problems.append(Problem(f"`${{{{ matrix.{key} }}}}` names no key of the matrix (it has "
                                        f"{', '.join(keys)}){did_you_mean(key, set(keys))}", where))
    return problems


def stray_references(job: Job) -> list[Problem]:
    """`${{ matrix.KEY }}` in a job without a matrix would reach the worker as written."""
    if job.spec.matrix is not None:
        return []
    return [Problem(f"`{m.group(0)}` is used but the job has no `matrix`; add one or write the value", where)
            for where, text in _texts(job) for m in [REFERENCE.search(text)] if m]


def _substitute(text: str, values: dict[str, Value]) -> str:
    return REFERENCE.sub(lambda m: value_text(values[m.group(1)]) if m.group(1) in values else "", text)


def _member(job: Job, values: dict[str, Value]) -> Job:
    """One member: its own name, its values substituted and passed in its environment. Built with
    model_copy: every part was validated already (with the sweep) or is made valid here."""
    env = {k: _substitute(v, values) for k, v in job.spec.env.items()}
    env.update({env_name(k): value_text(v) for k, v in values.items()})
    spec = job.spec.model_copy(update={"matrix": None, "env": env,
                                       "command": [_substitute(arg, values) for arg in job.spec.command]})
    meta = job.metadata.model_copy(update={"name": member_name(job.name, values)})
    return job.model_copy(update={"metadata": meta, "spec": spec})


def member_name(job: str, values: dict[str, Value]) -> str:
    """`job-key-value-...`, made a valid job name; the rule is in the module's docstring."""
    parts, lossy = [job], False
    for key, value in values.items():
        text = value_text(value).lower()
        slug = _OTHER.sub("-", text).strip("-")
        lossy = lossy or not _PLAIN.fullmatch(text)
        parts += [_OTHER.sub("-", key.lower()).strip("-"), *([slug] if slug else [])]
    name = "-".join(parts)
    if lossy or len(name) > NAME_LIMIT:
        pairs = [[k, v] for k, v in values.items()]
        digest = hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()[:DIGEST_CHARS]
        name = f"{name[:NAME_LIMIT - DIGEST_CHARS - 1].rstrip('-')}-{digest}"
    assert DNS_LABEL.fullmatch(name), name
    return name


def _duplicates(members: list[Job], combos: list[dict[str, Any]]) -> list[Problem]:
    first: dict[str, dict[str, Any]] = {}
    for member, values in zip(members, combos, strict=True):
        if member.name in first:
            return [Problem(f"members {_shown(first[member.name])} and {_shown(values)} would both be named "
                            f"{member.name}; make their values differ by more than case or punctuation, or drop "
                            "the repeated one")]
        first[member.name] = values
    return []


def _shown(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in values.items()) + "}"
