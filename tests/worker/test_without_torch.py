"""The SDK without torch: a script that does not import torch checkpoints and resumes bit-identically
without loading it, and needs no torch installed (reconciler/worker/lazy_torch.py)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from adapters.storage import RunFolder
from tests.worker.harness import Store, child_env

ROOT = Path(__file__).parents[2]
PLAIN = str(Path(__file__).parent / "workloads" / "plain_train.py")
STEPS = 24
EVERY = 3


def _attempt(store: Store, folder: RunFolder, cfg: dict[str, Any]) -> int:
    env = child_env(store, folder, folder.bump_lease(), EVERY)
    proc = subprocess.run([sys.executable, PLAIN, json.dumps({"steps": STEPS, "seed": 7, **cfg})], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, -9), proc.stderr
    return proc.returncode


def _finished(path: Path) -> dict[str, Any]:
    return dict(pickle.loads(path.read_bytes()))


def test_importing_the_sdk_imports_neither_torch_nor_its_loader() -> None:
    code = ("import sys, reconciler.worker; "
            "print(sorted(m for m in ('torch', 'reconciler.worker.data') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_resumable_loader_is_still_importable_from_the_sdk() -> None:
    code = "from reconciler.worker import ResumableLoader; print(ResumableLoader.__module__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "reconciler.worker.data"


def test_a_run_where_torch_cannot_be_imported_resumes_after_sigkills_bit_identically(
    store: Store, tmp_path: Path
) -> None:
    reference = tmp_path / "reference.pkl"
    assert _attempt(store, store.folder(), {"no_torch": True, "out": str(reference)}) == 0
    folder = store.folder()
    for step in (6, 15):
        assert _attempt(store, folder, {"no_torch": True, "die_at": step}) == -9
        assert folder.durable_step() == step
    resumed = tmp_path / "resumed.pkl"
    assert _attempt(store, folder, {"no_torch": True, "out": str(resumed)}) == 0
    assert _finished(resumed) == _finished(reference)
    assert len(_finished(resumed)["history"]["loss"]) == STEPS
    assert folder.done() is not None


def test_checkpoints_with_and_without_torch_resume_each_other(tmp_path: Path) -> None:
    """A checkpoint written where torch was not imported (its meta a plain pickle) is resumed by a
    script that imports torch, and one written with torch imported (torch's archive) by a script
    that does not: the SDK imports torch then, to read it and put torch's generator back. (The
    meta file's form does not depend on the store: local disk only.)"""
    store = Store("file", str(tmp_path / "runs"))
    reference = tmp_path / "reference.pkl"
    assert _attempt(store, store.folder(), {"out": str(reference)}) == 0
    assert _finished(reference)["torch_imported"] is False
    folder = store.folder()
    assert _attempt(store, folder, {"die_at": 9}) == -9
    assert _attempt(store, folder, {"with_torch": True, "die_at": 18}) == -9
    resumed = tmp_path / "resumed.pkl"
    assert _attempt(store, folder, {"out": str(resumed)}) == 0
    finished = _finished(resumed)
    assert finished["torch_imported"] is True  # to read the checkpoint of step 18
    assert {k: v for k, v in finished.items() if k != "torch_imported"} == {
        k: v for k, v in _finished(reference).items() if k != "torch_imported"}


def test_a_checkpoint_with_torchs_state_names_the_missing_package_where_torch_cannot_be_imported(
    tmp_path: Path
) -> None:
    store = Store("file", str(tmp_path / "runs"))
    folder = store.folder()
    assert _attempt(store, folder, {"with_torch": True, "die_at": 6}) == -9
    env = child_env(store, folder, folder.bump_lease(), EVERY)
    proc = subprocess.run([sys.executable, PLAIN, json.dumps({"steps": STEPS, "seed": 7, "no_torch": True})],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "import of torch halted" in proc.stderr or "No module named 'torch'" in proc.stderr, proc.stderr
    assert "install the same packages as the job that saved it" in proc.stderr



def test_a_buffer_kept_from_a_save_without_torch_is_not_reused_for_a_device_tensor() -> None:
    """Saves before torch was imported keep bytearrays; a device tensor needs a pinned buffer, so a
    bytearray of the right size (an empty tensor's: 0 bytes) is replaced, never asked if it is pinned."""
    import torch

    from reconciler.worker import snapshot, staging

    class PlainPinned(staging.Stager):  # the real `usable`; a plain allocation, as no CUDA is here
        def alloc(self, nbytes: int) -> torch.Tensor:
            return torch.empty(nbytes, dtype=torch.uint8)

    class EveryTensorStaged(staging.Stagers):
        def for_tensor(self, t: torch.Tensor) -> staging.Stager:
            return PlainPinned(torch.device("cpu"), cuda=object())

    kept = {"x": bytearray(0)}
    snap = snapshot.capture(1, {"x": {"t": torch.empty(0)}}, kept, EveryTensorStaged())
    assert isinstance(snap.sections["x"], torch.Tensor)
