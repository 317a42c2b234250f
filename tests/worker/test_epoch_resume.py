"""`run.epochs()` across real deaths: a worker process SIGKILLed mid-epoch, then resumed, ends with
the same bits as one that was never interrupted, whatever its epochs' preambles draw from the
RNGs and however the value given to `carry=` is nested (see tests/worker/workloads/epoch_train.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.worker.harness import Store, assert_same, free_port, join_ranks, load, spawn
from tests.worker.workloads.epoch_train import EPOCHS, PER_EPOCH, child

EVERY = 2
# Deaths at steps 4 (resumed from 2), 8 (from 6), 11 (from 10: epoch 1's last batch, saved when
# epoch 2's batches began, after its preamble) and 14 (from 12).
KILLS = [4, 8, 11, 14]


def attempts(store: Store, out: Path, cfg: dict[str, Any], kills: list[int], world: int = 1) -> tuple[Any, list[int]]:
    """Attempts on one run folder, each killed at its step of `kills`, then one to the end (with
    `world` ranks, as torchrun starts them): every rank's final state and the step each attempt
    resumed from."""
    folder = store.folder()
    resumed_from = []
    for die_at in [*kills, None]:
        resumed_from.append(folder.durable_step())
        env = store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=EVERY)
        if world > 1:
            env.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                       GLOO_SOCKET_IFNAME="lo")
        procs = [spawn(child, {**env, "RANK": str(r), "LOCAL_RANK": str(r)}, {**cfg, "die_at": die_at, "out": str(out)})
                 for r in range(world)]
        codes = join_ranks(procs, timeout=180)
        if die_at is None:
            assert codes == [0] * world, f"the last attempt exited {codes}"
        else:
            assert codes[-1] == -9, f"the attempt to die at step {die_at} exited {codes}"
    assert folder.done() is not None and folder.done()["step"] == EPOCHS * PER_EPOCH
    return [load(str(out) if world == 1 else f"{out}.{r}") for r in range(world)], resumed_from


@pytest.mark.parametrize(("carry", "draws"), [("tensor", True), ("nested", False), ("nested", True)])
def test_a_run_killed_mid_epoch_ends_bit_for_bit_as_an_uninterrupted_one(
        tmp_path: Path, carry: str, draws: bool) -> None:
    store = Store("file", str(tmp_path / "runs"))
    cfg = {"carry": carry, "draws": draws}
    expected, _ = attempts(store, tmp_path / "reference.pt", cfg, [])
    got, resumed_from = attempts(store, tmp_path / "resumed.pt", cfg, KILLS)
    assert resumed_from == [0, 2, 6, 10, 12]
    assert_same(expected, got)


@pytest.mark.parametrize("carry", ["none", "nested"])
def test_ranks_killed_mid_epoch_each_draw_and_carry_their_own_again(tmp_path: Path, carry: str) -> None:
    """Two ranks seeded apart, whose preambles and batches draw from the RNGs and whose updates are
    summed: the last rank is SIGKILLed mid-epoch (the other is ended), and every rank must draw
    what it drew before, in the preamble and in the batches, and carry on with its own carried
    value (not rank 0's), for the sums to come out the same."""
    store = Store("file", str(tmp_path / "runs"))
    cfg = {"carry": carry, "draws": True}
    expected, _ = attempts(store, tmp_path / "reference.pt", cfg, [], world=2)
    got, resumed_from = attempts(store, tmp_path / "resumed.pt", cfg, [8, 11], world=2)
    assert resumed_from == [0, 6, 10]
    assert_same(expected, got)
