"""A damaged checkpoint is detected before anything is loaded, and the one before it is used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from adapters.storage import CheckpointName, RunFolder
from reconciler.worker import Run, open_run
from tests.worker.harness import Store, assert_same


class RecordingModel(torch.nn.Linear):
    """A model that remembers every state handed to load_state_dict."""

    def __init__(self) -> None:
        super().__init__(4, 3)
        self.loaded: list[dict[str, torch.Tensor]] = []

    def load_state_dict(self, state: Any, *args: Any, **kwargs: Any) -> Any:
        self.loaded.append({k: v.clone() for k, v in state.items()})
        return super().load_state_dict(state, *args, **kwargs)


def open_attempt(store: Store, folder: RunFolder) -> Run:
    return open_run(
        uri=folder.uri, storage_options=store.options, epoch=folder.bump_lease(), install_signal_handlers=False
    )


def two_checkpoints(store: Store) -> tuple[RunFolder, dict[str, torch.Tensor]]:
    """A run with checkpoints at steps 10 and 20; returns the folder and the step-10 model state."""
    folder = store.folder()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with open_attempt(store, folder) as run:
        for step in (10, 20):
            with torch.no_grad():
                model.weight.add_(1.0)
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            if step == 10:
                at_10 = {k: v.clone() for k, v in model.state_dict().items()}
            run.save(step, model=model, optimizer=opt, user={"step": step})
            run.wait()
    return folder, at_10


def newest(folder: RunFolder) -> str:
    return f"checkpoints/{folder.committed_checkpoints()[0].dirname}"


def flip_bit(folder: RunFolder) -> None:
    name = f"{newest(folder)}/model.0000.bin"
    data = bytearray(folder.store.read(name) or b"")
    data[len(data) // 2] ^= 0x10
    folder.store.write(name, bytes(data))


def truncate(folder: RunFolder) -> None:
    name = f"{newest(folder)}/optimizer.0000.bin"
    data = folder.store.read(name) or b""
    folder.store.write(name, data[: len(data) // 2])


def remove_file(folder: RunFolder) -> None:
    folder.store.delete(f"{newest(folder)}/meta.pkl")


def remove_commit(folder: RunFolder) -> None:
    folder.store.delete(f"{newest(folder)}/COMMIT.json")


def garble_commit(folder: RunFolder) -> None:
    folder.store.write(f"{newest(folder)}/COMMIT.json", b'{"files": ')


@pytest.mark.parametrize(
    "damage",
    [flip_bit, truncate, remove_file, remove_commit, garble_commit],
    ids=["bit-flip", "truncated", "missing-file", "missing-commit", "garbled-commit"],
)
def test_damaged_newest_checkpoint_is_detected_before_load_and_previous_is_used(
    store: Store, damage: Callable[[RunFolder], None]
) -> None:
    folder, at_10 = two_checkpoints(store)
    damage(folder)
    model = RecordingModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    user: dict[str, int] = {}
    with open_attempt(store, folder) as run:
        assert run.restore(model=model, optimizer=opt, user=user) == 10
    assert len(model.loaded) == 1, "only the good checkpoint may reach load_state_dict"
    assert_same(at_10, model.loaded[0])
    assert user == {"step": 10}
    assert folder.durable_step() == 10, "the damaged checkpoint no longer counts as durable"


def test_no_good_checkpoint_means_a_fresh_start(store: Store) -> None:
    folder, _ = two_checkpoints(store)
    for c in folder.committed_checkpoints():
        folder.store.delete(f"checkpoints/{c.dirname}/meta.pkl")
    model = RecordingModel()
    with open_attempt(store, folder) as run:
        assert run.restore(model=model) == 0
    assert model.loaded == []


def test_saves_keep_only_the_two_newest_checkpoints(store: Store) -> None:
    folder = store.folder()
    model = torch.nn.Linear(2, 2)
    with open_attempt(store, folder) as run:
        for step in range(1, 6):
            run.save(step, model=model)
        run.wait()
    dirs = {name.split("/")[0] for name in folder.store.list("checkpoints")}
    assert dirs == {CheckpointName(5, run.epoch).dirname, CheckpointName(4, run.epoch).dirname}


def test_restore_refuses_an_immutable_object_with_a_clear_message(store: Store) -> None:
    folder = store.folder()
    with open_attempt(store, folder) as run, pytest.raises(TypeError, match="pass it inside a dict"):
        run.restore(step=3)


def test_plain_state_and_tensors_round_trip(store: Store) -> None:
    folder = store.folder()
    ema = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    scalars = torch.tensor(3.5)
    state = {"seen": [1, 2, 3], "name": "x", "t": torch.zeros(0), "half": torch.ones(3, dtype=torch.float16)}
    with open_attempt(store, folder) as run:
        run.save(7, ema=ema, scalars=scalars, state=state)
        run.complete(7)
    ema2, scalars2, state2 = torch.zeros(2, 3, dtype=torch.bfloat16), torch.tensor(0.0), {}
    with open_attempt(store, folder) as run:
        assert run.restore(ema=ema2, scalars=scalars2, state=state2) == 7
    assert_same(ema, ema2)
    assert_same(scalars, scalars2)
    assert_same(state, state2)
