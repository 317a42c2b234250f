"""Resumed runs are bit-identical to uninterrupted ones, whatever step the worker is killed at."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.worker.harness import References, Store, assert_same, attempt, load

STEPS = 40
EVERY = 4
SEEDS = [0, 1, 2]
KILLS_PER_SEED = 7


def reference(references: References, seed: int) -> object:
    """The uninterrupted run of `seed`, made once per session on local disk and shared by the [file]
    and [s3] cases: its final state does not depend on the store the run folder is on (the resumed
    runs, on each store, are what must equal it)."""

    def produce(folder: Path) -> None:
        store = Store("file", str(folder / "runs"))
        run = store.folder()
        env = store.env(run, run.bump_lease(), RECONCILER_CHECKPOINT_EVERY=EVERY, RECONCILER_HEARTBEAT_INTERVAL=1000)
        assert attempt(env, {"steps": STEPS, "seed": seed, "out": str(folder / "ref.pt")}) == 0

    return load(str(references.get(f"resume-steps{STEPS}-every{EVERY}-seed{seed}", produce) / "ref.pt"))


def test_resume_after_sigkill_at_random_steps_is_bitwise_equal_to_uninterrupted(
        store: Store, tmp_path: Path, references: References) -> None:
    rng = random.Random(20261202)
    plans = {
        seed: [
            (k, rng.choice(["before_save", "after_save"])) for k in sorted(rng.sample(range(1, STEPS), KILLS_PER_SEED))
        ]
        for seed in SEEDS
    }
    assert sum(len(p) for p in plans.values()) >= 20

    def one_seed(seed: int) -> None:
        expected = reference(references, seed)
        folder = store.folder()
        log = tmp_path / f"log-{seed}.txt"
        for step, phase in plans[seed]:
            epoch = folder.bump_lease()
            env = store.env(folder, epoch, RECONCILER_CHECKPOINT_EVERY=EVERY, RECONCILER_HEARTBEAT_INTERVAL=1000)
            cfg = {"steps": STEPS, "seed": seed, "die_at": step, "die_phase": phase, "log": str(log)}
            assert attempt(env, cfg) == -9, f"seed {seed}: attempt should have been killed at step {step}"
            assert folder.durable_step() <= step
        epoch = folder.bump_lease()
        out = tmp_path / f"resumed-{seed}.pt"
        env = store.env(folder, epoch, RECONCILER_CHECKPOINT_EVERY=EVERY, RECONCILER_HEARTBEAT_INTERVAL=1000)
        assert attempt(env, {"steps": STEPS, "seed": seed, "out": str(out), "log": str(log)}) == 0
        restores = [int(line.split()[1]) for line in log.read_text().split("\n") if line.startswith("restored")]
        assert restores[0] == 0 and max(restores) > 0, restores
        assert_same(expected, load(str(out)))
        assert folder.done() is not None

    with ThreadPoolExecutor(len(SEEDS)) as pool:
        list(pool.map(one_seed, SEEDS))
