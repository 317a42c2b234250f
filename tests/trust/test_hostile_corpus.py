"""A corpus of hostile manifests (tests/corpus/hostile/ plus big ones made here): each bad file
yields errors naming that file, the good job beside it is still parsed, nothing escapes, and
`reconciler validate` says so without a traceback."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

from desired.parse import parse_desired
from reconciler.daemon.loop import Reconciler
from status.models import Phase
from tests import zygote
from tests.conftest import StateRepoFixture

CORPUS = Path(__file__).parent.parent / "corpus" / "hostile"

GOOD = """\
apiVersion: reconciler.dev/v1
kind: Job
metadata: {name: good}
spec:
  command: ["true"]
"""

# What each committed file must be refused for: one reason a user can act on.
REASONS = {
    "alias_bomb.yaml": "aliases are not allowed",
    "binary.yaml": "NUL byte",
    "deep_block_nesting.yaml": "deeper than 64 levels",
    "deep_flow_nesting.yaml": "deeper than 64 levels",
    "duplicate_keys.yaml": "duplicate key 'command'",
    "duplicate_nested_key.yaml": "duplicate key 'name'",
    "escape_in_name.yaml": "not a valid name",
    "huge_number.yaml": "spec.target_steps",
    "infinite_budget.yaml": "finite",
    "many_documents.yaml": "more than 200 documents",
    "newline_in_name.yaml": "not a valid name",
    "non_utf8.yaml": "not UTF-8",
    "not_a_mapping.yaml": "must be a mapping",
    "nul_byte.yaml": "NUL byte",
    "nul_escape.yaml": "NUL character",
    "raw_control_char.yaml": "control character U+0007",
    "reserved_secret.yaml": "reserved",
    "rich_markup_key.yaml": "duplicate key '[/red]'",
    "tabs.yaml": "'\\t'",
    "utf16_bom.yaml": "UTF-16",
}


def generated() -> dict[str, bytes]:
    """Files too big to commit: over the size cap in several shapes, and a nesting bomb under it."""
    return {
        "huge_file.yaml": (GOOD + "# padding\n" * 300_000).encode(),
        "megabyte_line.yaml": (GOOD + "# " + "x" * 1_100_000 + "\n").encode(),
        "nesting_bomb.yaml": b"a: " + b"[" * 900_000,
        "many_empty_documents.yaml": b"--- 1\n" * 100_000,
    }


@functools.cache
def corpus() -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(CORPUS.glob("*.yaml"))}
    assert set(files) == set(REASONS), "every corpus file states the reason it must be refused for"
    return files | generated()


@pytest.mark.parametrize("name", sorted(corpus()))
def test_hostile_file_is_an_error_of_its_own_and_the_good_job_still_parses(name: str) -> None:
    path = f"desired/{name}"
    state = parse_desired({path: corpus()[name], "desired/good.yaml": GOOD})
    assert list(state.jobs) == ["good"]
    assert state.errors and {e.file for e in state.errors} == {path}, state.errors
    assert any(REASONS.get(name, "") in str(e) for e in state.errors), state.errors


def test_whole_corpus_at_once_leaves_only_the_good_job() -> None:
    files = {f"desired/{n}": data for n, data in corpus().items()}
    state = parse_desired({**files, "desired/good.yaml": GOOD})
    assert list(state.jobs) == ["good"]
    assert state.files_with_errors == set(files)


def test_validate_on_a_hostile_repository_names_every_bad_file_without_a_traceback(
        state_repo: StateRepoFixture) -> None:
    for name, data in corpus().items():
        (state_repo.path / "desired" / name).write_bytes(data)
    state_repo.write("desired/good.yaml", GOOD)
    res = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path)],
                     capture_output=True, text=True, errors="replace", timeout=120,
                     env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for name in corpus():
        assert f"desired/{name}" in res.stderr, name
    assert "1 job(s)" in res.stdout


def test_a_tick_on_a_hostile_repository_still_launches_the_good_job(state_repo: StateRepoFixture) -> None:
    for name, data in corpus().items():
        (state_repo.path / "desired" / name).write_bytes(data)
    state_repo.write("desired/good.yaml", GOOD)
    state_repo.commit("a good job among hostile files")
    report = Reconciler(state_repo.path).tick()
    assert list(report.statuses) == ["good"] and report.statuses["good"].phase == Phase.LAUNCHING
    for name in corpus():
        assert any(f"desired/{name}" in e for e in report.errors), name
    index = (state_repo.path / "status" / "README.md").read_text()
    assert "desired/deep_flow_nesting.yaml" in index


def test_validate_reads_only_regular_files_inside_the_repository(state_repo: StateRepoFixture,
                                                                 tmp_path: Path) -> None:
    """A link leaving the repository (to this process's environment), a FIFO and a link to a device
    are refused naming the file, not read and not skipped; a link to a file inside is read."""
    desired = state_repo.path / "desired"
    (desired / "good.yaml").write_text(GOOD)
    (desired / "leak.yaml").symlink_to("/proc/self/environ")
    os.mkfifo(desired / "pipe.yaml")
    (desired / "zero.yml").symlink_to("/dev/zero")
    shared = state_repo.path / "shared" / "other.yaml"
    shared.parent.mkdir()
    shared.write_text(GOOD.replace("name: good", "name: other"))
    (desired / "linked.yaml").symlink_to(shared)
    done = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path)],
                      capture_output=True, text=True, timeout=60, env={**os.environ, "LEAK_CANARY": "c4n4ry-9q"})
    said = " ".join(done.stderr.split())
    assert done.returncode == 1 and "2 job(s)" in done.stdout  # good and other (through the link inside)
    assert "desired/leak.yaml is a symbolic link to /proc/" in said and "outside the repository" in said
    assert "desired/pipe.yaml is a FIFO (named pipe), not a regular file" in said
    assert "desired/zero.yml is a symbolic link to /dev/zero" in said
    assert "c4n4ry-9q" not in done.stdout + done.stderr
    (state_repo.path / "reconciler.yaml").unlink()
    (state_repo.path / "reconciler.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    (tmp_path / "elsewhere.yaml").write_text("tick_seconds: 1\n")
    (state_repo.path / "outside").symlink_to(tmp_path)
    settings = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path)],
                          capture_output=True, text=True, timeout=60)
    assert "reconciler.yaml is a symbolic link to" in " ".join(settings.stderr.split())
    folder = zygote.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(state_repo.path),
                         "--path", "outside"], capture_output=True, text=True, timeout=60)
    assert folder.returncode == 2 and "--path outside is a symbolic link to" in " ".join(folder.stderr.split())


def test_a_committed_link_is_never_followed(state_repo: StateRepoFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """git keeps a link as the name of its target: the daemon reads that name, never the target."""
    monkeypatch.setenv("LEAK_CANARY", "c4n4ry-7z")
    (state_repo.path / "desired" / "leak.yaml").symlink_to("/proc/self/environ")
    state_repo.commit("a link out")
    report = Reconciler(state_repo.path, environ={}).tick()
    assert any(e.startswith("desired/leak.yaml") and "must be a mapping" in e for e in report.errors)
    assert "c4n4ry-7z" not in " ".join(report.errors) + state_repo.git("log", "-p", "--all")
