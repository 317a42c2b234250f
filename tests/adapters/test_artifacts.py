"""Artifacts (issue 25, item 3): outputs uploaded under the completing epoch and listed in the fenced
completion record, verified wherever they are read; a dependent job's inputs; a zombie's outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters import artifacts
from adapters.artifacts import ArtifactError, Input
from adapters.storage import Fenced, RunFolder
from reconciler.worker import open_run


def folder_at(tmp_path: Path, job: str = "train", run: str = "r-1") -> RunFolder:
    return RunFolder.for_run(f"file://{tmp_path / 'runs'}", job, run)


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


FILES = {"model.pt": os.urandom(300_000), "metrics.json": b'{"loss": 0.25}', "plots/a b.txt": b"", "deep/x/y.bin": b"y"}


def complete_with(folder: RunFolder, epoch: int, source: Path) -> dict:
    found = artifacts.upload_outputs(folder, epoch, source)
    return folder.mark_done(epoch, {"step": 1, **({"outputs": found} if found else {})})


def test_outputs_round_trip_with_their_tree_and_an_empty_file(tmp_path: Path) -> None:
    folder = folder_at(tmp_path)
    epoch = folder.bump_lease()
    complete_with(folder, epoch, write_tree(tmp_path / "out", FILES))
    items = artifacts.outputs(folder)
    assert items is not None and {a.path: a.size for a in items} == {k: len(v) for k, v in FILES.items()}
    seen: list[int] = []
    artifacts.download(folder, items, tmp_path / "pulled", seen.append)
    assert {k: (tmp_path / "pulled" / k).read_bytes() for k in FILES} == FILES
    assert sum(seen) == sum(map(len, FILES.values()))
    assert artifacts.missing(folder, items) == []


def test_a_run_without_outputs_lists_none_and_one_not_completed_says_so(tmp_path: Path) -> None:
    folder = folder_at(tmp_path)
    assert artifacts.outputs(folder) is None
    epoch = folder.bump_lease()
    complete_with(folder, epoch, tmp_path / "nothing-here")
    assert artifacts.outputs(folder) == []


def test_a_changed_or_missing_output_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = folder_at(tmp_path)
    epoch = folder.bump_lease()
    complete_with(folder, epoch, write_tree(tmp_path / "out", FILES))
    items = artifacts.outputs(folder) or []
    stored = Path(folder.store.os_path(f"outputs/e{epoch}/metrics.json"))
    stored.write_bytes(b'{"loss": 9.99}')  # same size, other bytes
    with pytest.raises(ArtifactError, match="metrics.json does not match its"):
        artifacts.download(folder, items, tmp_path / "pulled")
    assert not (tmp_path / "pulled" / "metrics.json").exists(), "a file that failed its digest is not left"
    stored.unlink()
    assert artifacts.missing(folder, items) == ["metrics.json"]
    with pytest.raises(ArtifactError, match="metrics.json is missing from run storage"):
        artifacts.download(folder, items, tmp_path / "pulled")


def test_a_completion_record_naming_a_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = folder_at(tmp_path)
    epoch = folder.bump_lease()
    bad = {"folder": f"outputs/e{epoch}", "files": {"../../escape": {"size": 1, "sha256": "0" * 64}}}
    folder.mark_done(epoch, {"step": 1, "outputs": bad})
    with pytest.raises(ArtifactError, match="not a relative path inside the run's outputs"):
        artifacts.outputs(folder)


def test_a_zombies_outputs_never_become_the_runs(tmp_path: Path) -> None:
    """Attempt 1 is replaced while it runs; it completes late with its own files: the completion is
    refused (fenced) and the outputs are those of attempt 2, which completed."""
    folder = folder_at(tmp_path)
    zombie = folder.bump_lease()
    current = folder.bump_lease()
    complete_with(folder, current, write_tree(tmp_path / "current", {"model.pt": b"good"}))
    with pytest.raises(Fenced):
        complete_with(folder, zombie, write_tree(tmp_path / "zombie", {"model.pt": b"evil", "extra": b"x"}))
    items = artifacts.outputs(folder) or []
    artifacts.download(folder, items, tmp_path / "pulled")
    assert [a.path for a in items] == ["model.pt"] and (tmp_path / "pulled" / "model.pt").read_bytes() == b"good"


def sdk_env(monkeypatch: pytest.MonkeyPatch, folder: RunFolder, epoch: int, tmp_path: Path, **extra: str) -> None:
    for key, value in {"RECONCILER_RUN_URI": folder.uri, "RECONCILER_RUN_ID": "r-2", "RECONCILER_JOB": "eval",
                       "RECONCILER_EPOCH": str(epoch), "RECONCILER_HEARTBEAT_INTERVAL": "1000",
                       "RECONCILER_OUTPUT_DIR": str(tmp_path / "eval-out"),
                       "RECONCILER_INPUT_DIR": str(tmp_path / "eval-in"), **extra}.items():
        monkeypatch.setenv(key, value)


def test_the_sdk_fetches_inputs_before_the_script_and_uploads_its_outputs_at_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train = folder_at(tmp_path, "train", "r-1")
    complete_with(train, train.bump_lease(), write_tree(tmp_path / "train-out", FILES))
    evaluation = folder_at(tmp_path, "eval", "r-2")
    epoch = evaluation.bump_lease()
    inputs = artifacts.hand_over(evaluation, epoch, [Input("train", "train", "r-1", f"file://{tmp_path / 'runs'}")],
                                 lambda s: {})
    sdk_env(monkeypatch, evaluation, epoch, tmp_path, **inputs)
    with open_run(install_signal_handlers=False) as run:
        assert run.input_dir == tmp_path / "eval-in" and os.environ["RECONCILER_INPUT_DIR"] == str(run.input_dir)
        assert (run.input_dir / "train" / "model.pt").read_bytes() == FILES["model.pt"]
        assert run.output_dir is not None
        (run.output_dir / "best.json").write_text('{"best": "train"}')
        run.complete(1)
    done = evaluation.done() or {}
    assert list(done["outputs"]["files"]) == ["best.json"]


def test_the_sdk_refuses_to_start_when_an_input_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train = folder_at(tmp_path, "train", "r-1")
    epoch = train.bump_lease()
    complete_with(train, epoch, write_tree(tmp_path / "train-out", FILES))
    Path(train.store.os_path(f"outputs/e{epoch}/model.pt")).unlink()
    evaluation = folder_at(tmp_path, "eval", "r-2")
    epoch = evaluation.bump_lease()
    inputs = artifacts.hand_over(evaluation, epoch, [Input("train", "train", "r-1", f"file://{tmp_path / 'runs'}")],
                                 lambda s: {})
    sdk_env(monkeypatch, evaluation, epoch, tmp_path, **inputs)
    with pytest.raises(ArtifactError, match="inputs could not be fetched: .*model.pt is missing from run storage"):
        open_run(install_signal_handlers=False)


def test_the_daemon_side_check_names_the_missing_output_and_what_to_do(tmp_path: Path) -> None:
    train = folder_at(tmp_path, "train", "r-1")
    epoch = train.bump_lease()
    complete_with(train, epoch, write_tree(tmp_path / "train-out", FILES))
    given = [Input("train", "train", "r-1", f"file://{tmp_path / 'runs'}")]
    assert artifacts.unavailable_inputs(given, lambda s: {}) == ""
    Path(train.store.os_path(f"outputs/e{epoch}/metrics.json")).unlink()
    why = artifacts.unavailable_inputs(given, lambda s: {})
    assert why.startswith("output metrics.json of train (run r-1) is missing from file://"), why
    assert "restore it, or change train's manifest so that it runs again" in why


def test_reconciler_exec_hands_inputs_to_the_command_and_uploads_what_it_writes(tmp_path: Path) -> None:
    train = folder_at(tmp_path, "train", "r-1")
    complete_with(train, train.bump_lease(), write_tree(tmp_path / "train-out", {"n.txt": b"41"}))
    report = folder_at(tmp_path, "report", "r-3")
    epoch = report.bump_lease()
    env = {**os.environ, "RECONCILER_RUN_URI": report.uri, "RECONCILER_EPOCH": str(epoch),
           "RECONCILER_JOB": "report", "RECONCILER_RUN_ID": "r-3", "RECONCILER_HEARTBEAT_INTERVAL": "0.1",
           **artifacts.hand_over(report, epoch, [Input("train", "train", "r-1", f"file://{tmp_path / 'runs'}")],
                                 lambda s: {})}
    env.pop("RECONCILER_OUTPUT_DIR", None)
    env.pop("RECONCILER_INPUT_DIR", None)
    script = 'echo $(( $(cat "$RECONCILER_INPUT_DIR/train/n.txt") + 1 )) > "$RECONCILER_OUTPUT_DIR/answer.txt"'
    wrapper = [sys.executable, "-m", "reconciler", "exec", "--", "sh", "-c", script]
    assert subprocess.run(wrapper, env=env, timeout=120).returncode == 0
    items = artifacts.outputs(report) or []
    artifacts.download(report, items, tmp_path / "pulled")
    assert (tmp_path / "pulled" / "answer.txt").read_text().strip() == "42"


def test_the_inputs_are_handed_over_in_a_file_of_the_attempts_own_run_folder(tmp_path: Path) -> None:
    """A sweep of 1,000 members would not fit in one environment variable (Linux: 128 KiB)."""
    store = f"file://{tmp_path / 'runs'}"
    own = folder_at(tmp_path, "eval", "r-2")
    members = [Input(f"sweep/sweep-lr-{i}", f"sweep-lr-{i}", f"r-{i:012d}", store) for i in range(1000)]
    env = artifacts.hand_over(own, 3, members, lambda s: {})
    assert env == {"RECONCILER_INPUTS": "inputs-e3.json"}
    listed = list(artifacts.listed_inputs(own, env))
    seventh = folder_at(tmp_path, "sweep-lr-7", f"r-{7:012d}").uri
    assert len(listed) == 1000 and listed[7] == ("sweep/sweep-lr-7", seventh)
    assert artifacts.hand_over(own, 4, [], lambda s: {}) == {}
    with pytest.raises(ArtifactError, match="is not the name of an inputs file"):
        list(artifacts.listed_inputs(own, {"RECONCILER_INPUTS": "../../etc/passwd"}))
