"""A worker killed at any point of a save never resumes from a partial checkpoint and loses at most
the one checkpoint it was writing. Kill points are every storage write of a save (the SDK kills
itself at the N-th write when RECONCILER_FAULT_KILL_AT=N), so no timer races the save.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.worker.harness import Store, assert_same, attempt, load

STEPS = 20
EVERY = 5
KILL_POINTS = 12
BASE = {"RECONCILER_CHECKPOINT_EVERY": EVERY, "RECONCILER_HEARTBEAT_INTERVAL": 1000}


def notes(log: Path, word: str) -> list[int]:
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith(word + " ")]


def test_kill_anywhere_in_a_save_never_resumes_from_a_partial_checkpoint(store: Store, tmp_path: Path) -> None:
    # Small shards: many files per checkpoint, so many places to die (fewer on the slow S3 server).
    settings = {**BASE, "RECONCILER_SHARD_BYTES": 512 if store.kind == "file" else 2048}
    # An uninterrupted run: the expected result, and how many write points a whole run has.
    folder = store.folder()
    ref_log = tmp_path / "ref.log"
    env = store.env(folder, folder.bump_lease(), RECONCILER_FAULT_KILL_AT=10**9, **settings)
    assert attempt(env, {"steps": STEPS, "seed": 1, "out": str(tmp_path / "ref.pt"), "log": str(ref_log)}) == 0
    expected = load(str(tmp_path / "ref.pt"))
    total = notes(ref_log, "points")[0]
    # Kill points spread over the middle saves (the first save starts after the first writes).
    n = KILL_POINTS if store.kind == "file" else KILL_POINTS * 2 // 3  # the S3 server is slow
    points = sorted({total * (i + 1) // (n + 1) for i in range(n)})

    def kill_at(point: int) -> tuple[int, int, int]:
        folder = store.folder()
        log = tmp_path / f"kill-{point}.log"
        env = store.env(folder, folder.bump_lease(), RECONCILER_FAULT_KILL_AT=point, **settings)
        assert attempt(env, {"steps": STEPS, "seed": 1, "log": str(log)}) == -9, f"point {point}"
        saved = notes(log, "saved")
        durable = folder.durable_step()
        # save(N) returns only once N-EVERY is committed: at most the checkpoint in flight is lost.
        assert durable >= (max(saved) - EVERY if saved else 0), (point, saved, durable)
        out = tmp_path / f"resumed-{point}.pt"
        env = store.env(folder, folder.bump_lease(), **settings)
        assert attempt(env, {"steps": STEPS, "seed": 1, "out": str(out), "log": str(log)}) == 0
        restored = notes(log, "restored")
        assert restored[-1] == durable, f"point {point}: resumed from {restored[-1]}, durable was {durable}"
        assert_same(expected, load(str(out)), f"point {point}")
        return point, durable, max(saved, default=0)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(kill_at, points))
    assert len({durable for _, durable, _ in results}) >= 3, f"kills should land across saves: {results}"
