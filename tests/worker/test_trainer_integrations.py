"""The Lightning and Hugging Face callbacks in real processes: a training attempt is SIGKILLed,
the next one resumes from the checkpoint's step (not from 0) and is SIGTERMed (final checkpoint,
exit 75), the last one finishes; the run folder then says done and the final weights are
bit-identical to an uninterrupted run's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from adapters import series
from adapters.storage import RunFolder
from reconciler.worker import Run, open_run
from reconciler.worker.integrations import files
from tests.worker.harness import References, Store, assert_same, load
from tests.zygote import ForkedPopen, start

ROOT = Path(__file__).resolve().parents[2]
# package, workload, steps, checkpoint every. Lightning's job has 8 batches an epoch: its
# checkpoints fall on epoch ends, so the kill resumes at an epoch's start and the stop notice's
# final checkpoint (almost always) in the middle of one; both resume paths are taken.
TRAINERS = {
    "lightning": ("lightning", "tests.worker.workloads.lightning_train", 40, 8),
    "huggingface": ("transformers", "tests.worker.workloads.hf_train", 30, 5),
}


def need(package: str) -> None:
    """Found, not imported: the training runs in processes of its own, and importing Lightning
    here would cost this test process seconds of CPU for nothing."""
    if importlib.util.find_spec(package) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{package} is not installed (the dev extra installs it)", pytrace=False)
        pytest.skip(f"{package} is not installed")


# Lightning and transformers are imported once, by the server every attempt is forked from.
PRELOAD = ("torch", "lightning.pytorch", "torchdata.stateful_dataloader", "transformers.trainer",
           "transformers.models.gpt2.modeling_gpt2")


def launch(module: str, env: dict[str, str], cfg: dict[str, Any], out: Path) -> ForkedPopen:
    """One training attempt: a real process of its own, running the worktree's code."""
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    return start(module, [json.dumps(cfg)], full, out, PRELOAD)


def finish(proc: ForkedPopen, timeout: float = 300) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"training attempt did not finish within {timeout}s") from None


def wait_for(predicate: Any, proc: ForkedPopen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the attempt exited {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def lines(log: Path, word: str) -> list[int]:
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith(word + " ")]


def temporary(folder: RunFolder, epoch: int, tmp: Path) -> Path:
    """The TMPDIR of one attempt: its callback's scratch folder is made there."""
    return tmp / "tmp" / f"{folder.uri.rsplit('/', 1)[-1]}-{epoch}"


def attempt(store: Store, folder: RunFolder, module: str, cfg: dict[str, Any], tmp: Path,
            tag: str = "") -> ForkedPopen:
    """`tag` names its log and the trainer's own output folder, for one that runs beside another."""
    epoch = folder.bump_lease()
    scratch = temporary(folder, epoch, tmp)
    scratch.mkdir(parents=True)
    env = store.env(folder, epoch, RECONCILER_CHECKPOINT_EVERY=cfg["every"], TMPDIR=scratch)
    return launch(module, env, {**cfg, "output_dir": str(tmp / f"hf-out{tag}")}, tmp / f"worker{tag}.out")


def uninterrupted(references: References, trainer: str, cfg: dict[str, Any]) -> Future[Path]:
    """The final weights of an uninterrupted run of `cfg`, trained once for every test that
    compares against it, in a thread: the test's own attempts run beside it."""
    module = TRAINERS[trainer][1]

    def produce(out: Path) -> None:
        store = Store("file", str(out / "runs"))
        proc = attempt(store, store.folder(), module, {**cfg, "out": str(out / "ref.pt")}, out, "-ref")
        assert finish(proc) == 0, (out / "worker-ref.out").read_text()[-3000:]

    key = "-".join([trainer, *(f"{k}{v}" for k, v in sorted(cfg.items()))])
    pool = ThreadPoolExecutor(1)
    future = pool.submit(lambda: references.get(key, produce) / "ref.pt")
    pool.shutdown(wait=False)
    return future


def leftovers(folder: RunFolder, tmp: Path) -> list[str]:
    """What the current attempt left in its temporary folder (the callbacks' scratch folders)."""
    return [p.name for p in temporary(folder, folder.lease_epoch(), tmp).glob("reconciler-*")]


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_trainer_killed_then_stopped_resumes_from_its_checkpoint_and_matches_an_uninterrupted_run(
    trainer: str, tmp_path: Path, references: References
) -> None:
    package, module, steps, every = TRAINERS[trainer]
    need(package)
    store = Store("file", str(tmp_path / "runs"))
    base = {"steps": steps, "seed": 7, "every": every}
    reference = uninterrupted(references, trainer, base)

    folder = store.folder()
    log = tmp_path / "steps.log"
    slow = {**base, "sleep": 0.15, "log": str(log)}

    first = attempt(store, folder, module, slow, tmp_path)
    wait_for(lambda: folder.durable_step() >= 2 * every, first, "a second checkpoint")
    first.kill()
    assert finish(first) == -signal.SIGKILL
    assert leftovers(folder, tmp_path), "a killed attempt cannot tidy: its scratch folder is where we look"
    killed_at = folder.durable_step()
    assert 0 < killed_at < steps

    log.write_text("")
    second = attempt(store, folder, module, slow, tmp_path)
    wait_for(lambda: folder.durable_step() > killed_at and lines(log, "step"), second, "a checkpoint after resuming")
    second.send_signal(signal.SIGTERM)
    assert finish(second) == 75, (tmp_path / "worker.out").read_text()[-3000:]
    assert lines(log, "restored") == [killed_at]
    reached = lines(log, "step")
    assert reached[0] == killed_at + 1, f"resumed at step {reached[0]}, not after checkpoint {killed_at}"
    assert folder.durable_step() == reached[-1] < steps, "the stop notice's final checkpoint is the last step reached"
    assert folder.done() is None
    beat = folder.progress()
    assert beat is not None and beat.stopping == "signal" and beat.target == steps, beat
    assert leftovers(folder, tmp_path) == []

    log.write_text("")
    stopped_at = folder.durable_step()
    last = attempt(store, folder, module, {**base, "log": str(log), "out": str(tmp_path / "out.pt")}, tmp_path)
    assert finish(last) == 0, (tmp_path / "worker.out").read_text()[-3000:]
    assert lines(log, "restored") == [stopped_at]
    assert lines(log, "step")[0] == stopped_at + 1 and lines(log, "step")[-1] == steps
    done = folder.done()
    assert done is not None and done["step"] == steps
    beat = folder.progress()
    assert beat is not None and (beat.step, beat.target) == (steps, steps), "target steps come from max_steps"
    reported = series.read(folder.store)  # the losses the callbacks saw, over steps, every attempt's
    assert len(reported.get("loss", [])) > 2 and reported["loss"][-1][0] > stopped_at, reported
    assert leftovers(folder, tmp_path) == []
    assert_same(load(str(reference.result())), load(str(tmp_path / "out.pt")), f"{trainer} final weights")


def test_lightning_stopped_by_its_own_sigterm_handling_saves_that_step_and_exits_75(
        tmp_path: Path, references: References) -> None:
    """A SIGTERM that lands after the callback's per-batch check is seen first by Lightning,
    which ends the loop with SIGTERMException: the callback's exception hook takes the final
    checkpoint there, and the resumed run still ends where an uninterrupted one does."""
    need("lightning")
    _, module, steps, every = TRAINERS["lightning"]
    store = Store("file", str(tmp_path / "runs"))
    base = {"steps": steps, "seed": 7, "every": every}  # the other test's job: one reference serves both
    reference = uninterrupted(references, "lightning", base)

    folder = store.folder()
    log = tmp_path / "steps.log"
    stopped = attempt(store, folder, module, {**base, "term_at": 11, "log": str(log)}, tmp_path)
    assert finish(stopped) == 75, (tmp_path / "worker.out").read_text()[-3000:]
    assert folder.durable_step() == 11 and lines(log, "step")[-1] == 11
    beat = folder.progress()
    assert beat is not None and beat.stopping == "signal"

    log.write_text("")
    last = attempt(store, folder, module, {**base, "log": str(log), "out": str(tmp_path / "out.pt")}, tmp_path)
    assert finish(last) == 0, (tmp_path / "worker.out").read_text()[-3000:]
    assert lines(log, "restored") == [11] and lines(log, "step")[0] == 12
    assert folder.done() is not None
    assert_same(load(str(reference.result())), load(str(tmp_path / "out.pt")), "lightning final weights")


def _run_with_a_checkpoint(tmp_path: Path) -> Run:
    folder = RunFolder.for_run(str(tmp_path / "runs"), "job", "r-1")
    run = open_run(uri=folder.uri, epoch=folder.bump_lease(), install_signal_handlers=False)
    run.save(3, state={"w": torch.zeros(2)})
    run.wait()
    return run


def test_lightning_callback_refuses_a_fit_that_was_not_given_the_runs_checkpoint(tmp_path: Path) -> None:
    need("lightning")
    from reconciler.worker.integrations.lightning import ReconcilerCallback

    callback = ReconcilerCallback(run=_run_with_a_checkpoint(tmp_path))
    with pytest.raises(RuntimeError, match=r"ckpt_path=callback.checkpoint_path\(\)"):
        callback.on_fit_start(None, None)  # type: ignore[arg-type]
    callback.run.close()


def test_huggingface_callback_refuses_a_train_that_was_not_given_the_runs_checkpoint(tmp_path: Path) -> None:
    need("transformers")
    from reconciler.worker.integrations.huggingface import ReconcilerCallback

    callback = ReconcilerCallback(run=_run_with_a_checkpoint(tmp_path))
    with pytest.raises(RuntimeError, match=r"resume_from_checkpoint=callback.checkpoint_path\(\)"):
        callback.on_train_begin(None, None, None)  # type: ignore[arg-type]
    callback.run.close()


def test_trainer_files_round_trip_and_names_outside_the_folder_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "checkpoint-4"
    (source / "sub").mkdir(parents=True)
    (source / "model.bin").write_bytes(bytes(range(256)) * 3)
    (source / "sub" / "state.json").write_text('{"global_step": 4}')
    (source / "empty").write_bytes(b"")
    packed = files.pack(source)
    assert sorted(packed) == ["empty", "model.bin", "sub/state.json"]
    copy = files.unpack(packed, tmp_path / "copy")
    for name in packed:
        assert (copy / name).read_bytes() == (source / name).read_bytes()
    with pytest.raises(ValueError, match="outside"):
        files.unpack({"../evil": torch.zeros(1, dtype=torch.uint8)}, tmp_path / "third")
    assert not (tmp_path / "evil").exists()
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        files.pack(tmp_path / "missing")
