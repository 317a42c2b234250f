"""The data position: a resumed loop reads exactly the batches an uninterrupted one reads next.

In-process tests take a loader's state mid-epoch (after a round trip through a real checkpoint),
build a fresh loader as a restarted process would, and compare every batch that follows. The
process tests SIGKILL real training processes (shuffled DataLoader with two workers, and the
word language model example) and compare batch order and final weights bit for bit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from reconciler.worker import Carry, ResumableLoader, open_run
from reconciler.worker.loop import Position
from tests.worker.harness import (
    References,
    Store,
    assert_same,
    child_env,
    free_port,
    join_ranks,
    load,
    spawn,
)
from tests.worker.workloads.data_train import rank_child
from tests.zygote import ForkedPopen, start

ROOT = Path(__file__).resolve().parents[2]
N = 37  # not a multiple of the batch size: the last batch is short


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(N))


def flat(batches: list[Any]) -> list[list[int]]:
    return [(b[0] if isinstance(b, list | tuple) else b).tolist() for b in batches]


def take(loader: Any, n: int) -> list[Any]:
    """`n` batches from the loader's position on, crossing epoch ends (as a training loop does)."""
    out: list[Any] = []
    while len(out) < n:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
    return out


def through_checkpoint(tmp_path: Path, obj: Any, fresh: Any) -> Any:
    """Save `obj` with the SDK and restore the checkpoint into `fresh`."""
    folder_uri = str(tmp_path / f"run-{time.monotonic_ns()}")
    with open_run(uri=folder_uri, install_signal_handlers=False) as run:
        run.save(1, data=obj)
        run.wait()
    with open_run(uri=folder_uri, install_signal_handlers=False) as run:
        assert run.restore(data=fresh) == 1
    return fresh


def read_twice(tmp_path: Path, build: Any, n: int, stop_at: int) -> tuple[list[list[int]], list[list[int]]]:
    """The first `n` batches of a fresh loader, and the same `n` read by one that stopped after
    `stop_at`, went through a checkpoint and was rebuilt as a restarted process would."""
    uninterrupted = flat(take(build(), n))
    first = build()
    head = flat(take(first, stop_at))
    resumed = through_checkpoint(tmp_path, first, build())
    return uninterrupted, head + flat(take(resumed, n - stop_at))


def test_resumable_loader_gives_the_standard_dataloaders_shuffled_batches() -> None:
    plain = DataLoader(dataset(), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7))
    ours = ResumableLoader(dataset(), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7))
    expected = [b for _ in range(3) for b in plain]
    assert flat(take(ours, len(expected))) == flat(expected)
    assert (ours.epoch, ours.index) == (2, len(ours))  # the third epoch's end is seen at the next pass


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_at", [1, 5, 8, 11, 17])
def test_shuffled_loader_resumes_mid_epoch_batch_for_batch(tmp_path: Path, workers: int, stop_at: int) -> None:
    def build() -> ResumableLoader:
        return ResumableLoader(dataset(), batch_size=5, shuffle=True, num_workers=workers, seed=11)

    uninterrupted, resumed = read_twice(tmp_path, build, 30, stop_at)
    assert resumed == uninterrupted
    assert len({tuple(b) for b in uninterrupted[:8]}) == 8 and uninterrupted[:8] != uninterrupted[8:16]


def test_a_generator_in_use_before_the_epoch_resumes_from_the_epoch_start_state(tmp_path: Path) -> None:
    """The state is the generator's at the epoch start, before the sampler drew the permutation:
    a state taken afterwards (or a saved DataLoader iterator) would shuffle the rest differently."""
    def build() -> ResumableLoader:
        g = torch.Generator().manual_seed(3)
        torch.rand(4, generator=g)  # the user's generator has been used before
        return ResumableLoader(dataset(), batch_size=4, shuffle=True, generator=g)

    uninterrupted, resumed = read_twice(tmp_path, build, 25, 13)
    assert resumed == uninterrupted


@pytest.mark.parametrize("stop_at", [2, 4, 9])
def test_distributed_sampler_ranks_resume_mid_epoch(tmp_path: Path, stop_at: int) -> None:
    for rank in range(2):
        def build(rank: int = rank) -> ResumableLoader:
            sampler = DistributedSampler(dataset(), num_replicas=2, rank=rank, shuffle=True, seed=5)
            return ResumableLoader(dataset(), batch_size=3, sampler=sampler, seed=1)

        uninterrupted, resumed = read_twice(tmp_path, build, 14, stop_at)
        assert resumed == uninterrupted
        assert uninterrupted[:7] != uninterrupted[7:14], "set_epoch was not called: every epoch is the same"


class Stream(IterableDataset):
    """An iterable dataset with a state: a seeded stream whose position and RNG are its state,
    and that starts its next epoch when iterated at its end."""

    def __init__(self, n: int = 23) -> None:
        self.n = n
        self.pos = 0
        self.rng = torch.Generator().manual_seed(99)

    def __iter__(self) -> Any:
        if self.pos >= self.n:
            self.pos = 0
        while self.pos < self.n:
            self.pos += 1
            yield torch.randint(0, 1000, (1,), generator=self.rng)[0]

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos, "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = int(state["pos"])
        self.rng.set_state(torch.as_tensor(state["rng"]).clone())


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_at", [3, 5, 9])
def test_iterable_dataset_with_a_state_resumes_batch_for_batch(tmp_path: Path, workers: int, stop_at: int) -> None:
    def build() -> ResumableLoader:
        return ResumableLoader(Stream(), batch_size=4, num_workers=workers, seed=2)

    uninterrupted, resumed = read_twice(tmp_path, build, 16, stop_at)
    assert resumed == uninterrupted
    if workers == 0:
        assert uninterrupted[:6] != uninterrupted[6:12], "the stream's epochs differ (its RNG moves on)"


def test_carry_saves_a_hidden_state_with_its_graph_and_plain_values(tmp_path: Path) -> None:
    w = torch.ones(3, requires_grad=True)
    hidden = (w * 2, w * 3)  # not graph leaves: they cannot be deep-copied
    restored = through_checkpoint(tmp_path, Carry(lr=0.5, best=None, hidden=hidden), Carry(lr=1.0))
    assert restored.lr == 0.5 and restored.best is None
    assert_same(restored.hidden, (torch.full((3,), 2.0), torch.full((3,), 3.0)))
    assert not restored.hidden[0].requires_grad


def test_a_plain_dataloader_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="ResumableLoader"):
        Position(DataLoader(dataset(), batch_size=4, shuffle=True))


def test_persistent_workers_and_a_seed_beside_a_generator_are_refused() -> None:
    with pytest.raises(ValueError, match="persistent_workers"):
        ResumableLoader(dataset(), batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.raises(ValueError, match="either a generator or a seed"):
        ResumableLoader(dataset(), batch_size=4, shuffle=True, generator=torch.Generator(), seed=1)


def steps_of(run: Any, n_epochs: int, batches: Any, stop_at: int | None = None) -> list[tuple[int, int, int, Any]]:
    """(step, epoch, index, batch) for every batch the nested loops train on, until step `stop_at`."""
    seen: list[tuple[int, int, int, Any]] = []
    for epoch in run.epochs(n_epochs):
        for index, batch in run.enumerate(batches):
            seen.append((run.step, epoch, index, batch))
            if run.step == stop_at:
                return seen
    return seen


def test_epochs_derive_the_target_and_resume_mid_epoch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri = str(tmp_path / "run")
    with open_run(uri=uri, checkpoint_every=4, target=10, install_signal_handlers=False) as run:
        with caplog.at_level(logging.WARNING, logger="reconciler.worker"):
            seen = steps_of(run, 3, range(0, 50, 10), stop_at=6)
        assert "the target was 10 steps" in caplog.text
        assert run.target == 15
        run.wait()
    assert seen == [(1, 0, 0, 0), (2, 0, 1, 10), (3, 0, 2, 20), (4, 0, 3, 30), (5, 0, 4, 40), (6, 1, 0, 0)]
    with open_run(uri=uri, checkpoint_every=4, install_signal_handlers=False) as run:
        rest = steps_of(run, 3, range(0, 50, 10))
        run.complete()
        assert run.folder.done()["step"] == 15
    assert rest[0] == (5, 0, 4, 40) and rest[-1] == (15, 2, 4, 40) and len(rest) == 11


def test_a_stop_notice_inside_epochs_saves_the_position_and_exits_75(tmp_path: Path) -> None:
    uri = str(tmp_path / "run")
    loader = ResumableLoader(dataset(), batch_size=5, shuffle=True, seed=8)
    expected = flat(take(ResumableLoader(dataset(), batch_size=5, shuffle=True, seed=8), 16))
    seen: list[Any] = []
    with pytest.raises(SystemExit) as stopped, open_run(uri=uri) as run:
        for _ in run.epochs(2):
            for batch in run.batches(loader):
                seen.append(batch)
                if run.step == 11:
                    os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 75
    with open_run(uri=uri) as run:
        again = ResumableLoader(dataset(), batch_size=5, shuffle=True, seed=8)
        rest = [batch for _ in run.epochs(2) for batch in run.batches(again)]
        run.complete()
    assert flat(seen) == expected[:11] and flat(seen + rest) == expected


def test_progress_past_the_target_is_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_run(uri=str(tmp_path / "run"), target=3, install_signal_handlers=False) as run:
        with caplog.at_level(logging.WARNING, logger="reconciler.worker"):
            for step in range(1, 6):
                run.heartbeat(step)
    assert caplog.text.count("past the target of 3 steps") == 1


# ---- real processes, SIGKILLed ---------------------------------------------------------------------------
# What every workload here imports (an optimizer's first step imports torch._dynamo: 1.4 CPU-seconds)
PRELOAD = ("torch", "torch._dynamo", "torch.optim", "torch.utils.data", "numpy")


def start_child(module: str, env: dict[str, str], cfg: dict[str, Any]) -> ForkedPopen:
    """`python -m module cfg`, forked from a server that has imported torch (tests/zygote.py)."""
    log = Path(tempfile.mkstemp(prefix="data-position-", suffix=".log")[1])
    return start(module, [json.dumps(cfg)], env, log, PRELOAD)


def wait_child(proc: ForkedPopen, module: str, timeout: float = 240) -> int:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.log is not None
    output = proc.log.read_text(errors="replace")
    proc.log.unlink()
    if code not in (0, -9):
        raise AssertionError(f"{module} exited {code}:\n{output[-3000:]}")
    return code


def run_child(module: str, env: dict[str, str], cfg: dict[str, Any], timeout: float = 240) -> int:
    return wait_child(start_child(module, env, cfg), module, timeout)


def read_order(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def reference(references: References, key: str, module: str, cfg: Callable[[Path], dict[str, Any]],
              every: int) -> Path:
    """The folder of the uninterrupted run `key`, trained once (`cfg(folder)` names its files there)
    for every test and store that compares a resumed run against it."""
    def produce(out: Path) -> None:
        store = Store("file", str(out / "runs"))
        folder = store.folder()
        assert run_child(module, child_env(store, folder, folder.bump_lease(), every), cfg(out)) == 0
    return references.get(key, produce)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_shuffled_loader_with_workers_survives_sigkill_mid_epoch(store: Store, tmp_path: Path, kind: str,
                                                                references: References) -> None:
    module = "tests.worker.workloads.data_train"
    folder = store.folder()
    order = tmp_path / "order.txt"
    cfg = {"kind": kind, "out": str(tmp_path / "resumed.pt"), "order": str(order)}
    killed_run = start_child(module, child_env(store, folder, folder.bump_lease(), 3), {**cfg, "die_at": 15})
    ref = reference(references, f"data-{kind}", module,
                    lambda out: {"kind": kind, "out": str(out / "ref.pt"), "order": str(out / "ref-order.txt")}, 3)
    assert wait_child(killed_run, module) == -9
    expected = read_order(ref / "ref-order.txt")
    killed = read_order(order)
    assert killed == expected[:15]
    durable = folder.durable_step()
    # saves every 3 steps, 8 batches an epoch: the resume is in the middle of an epoch
    assert durable is not None and 0 < durable < 15 and durable % 8 != 0
    order.unlink()
    assert run_child(module, child_env(store, folder, folder.bump_lease(), 3), cfg) == 0
    assert killed[:durable] + read_order(order) == expected
    assert_same(load(str(ref / "ref.pt")), load(str(tmp_path / "resumed.pt")))
    assert folder.done() is not None


def ddp_ranks(store: Store, folder: Any, cfg: dict[str, Any]) -> list[int]:
    """Two ranks of the ddp workload (gloo, one process each as torchrun starts them); exit codes."""
    env = {**store.env(folder, folder.bump_lease(), RECONCILER_CHECKPOINT_EVERY=3), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}
    procs = [spawn(rank_child, {**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cfg) for r in range(2)]
    return join_ranks(procs, timeout=180)


def ddp_reference(references: References) -> tuple[Path, list[list[str]]]:
    """The uninterrupted 2-rank run both DDP tests compare against (the batches a rank reads do not
    depend on how many DataLoader workers read them), and each rank's order of batches."""
    def produce(out: Path) -> None:
        store = Store("file", str(out / "runs"))
        cfg = {"kind": "ddp", "out": str(out / "ref.pt"), "order": str(out / "ref-order")}
        assert ddp_ranks(store, store.folder(), cfg) == [0, 0]
    ref = references.get("ddp", produce)
    expected = [read_order(ref / f"ref-order.{r}") for r in range(2)]
    assert len(expected[0]) == len(expected[1]) == 12 and expected[0] != expected[1]
    return ref / "ref.pt", expected


def test_two_ranks_resume_their_distributed_sampler_positions(tmp_path: Path, references: References) -> None:
    """A 2-rank DDP job reading through a shuffled DistributedSampler: rank 1 is SIGKILLed
    mid-epoch, the other rank is ended, and the resumed ranks each read the rest of their own
    share, batch for batch."""
    store = Store("file", str(tmp_path / "runs"))
    folder = store.folder()
    cfg = {"kind": "ddp", "out": str(tmp_path / "resumed.pt"), "order": str(tmp_path / "order")}
    assert -9 in ddp_ranks(store, folder, {**cfg, "die_at": 7})
    killed = [read_order(tmp_path / f"order.{r}") for r in range(2)]
    durable = folder.durable_step()
    assert durable in (3, 6), durable  # 4 batches an epoch per rank: the resume is mid-epoch
    for r in range(2):
        (tmp_path / f"order.{r}").unlink()
    assert ddp_ranks(store, folder, cfg) == [0, 0]
    ref, expected = ddp_reference(references)
    for r in range(2):
        assert killed[r][:durable] + read_order(tmp_path / f"order.{r}") == expected[r], f"rank {r}"
    assert_same(load(str(ref)), load(str(tmp_path / "resumed.pt")))


def test_torchrun_ranks_with_two_loader_workers_each_resume_their_share(tmp_path: Path,
                                                                       references: References) -> None:
    """The same under torchrun itself, every rank reading through two DataLoader workers."""
    store = Store("file", str(tmp_path / "runs"))

    def torchrun(folder: Any, cfg: dict[str, Any]) -> int:
        env = child_env(store, folder, folder.bump_lease(), 3)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "tests.worker.workloads.data_train", json.dumps({**cfg, "workers": 2})]
        proc = subprocess.run(cmd, env={**env, "GLOO_SOCKET_IFNAME": "lo"}, cwd=ROOT, timeout=300,
                              capture_output=True, text=True)
        return proc.returncode

    folder = store.folder()
    cfg = {"kind": "ddp", "out": str(tmp_path / "resumed.pt"), "order": str(tmp_path / "order")}
    assert torchrun(folder, {**cfg, "die_at": 7}) != 0
    killed = [read_order(tmp_path / f"order.{r}") for r in range(2)]
    durable = folder.durable_step()
    assert durable in (3, 6), durable
    for r in range(2):
        (tmp_path / f"order.{r}").unlink()
    assert torchrun(folder, cfg) == 0
    ref, expected = ddp_reference(references)
    for r in range(2):
        assert killed[r][:durable] + read_order(tmp_path / f"order.{r}") == expected[r], f"rank {r}"
    assert_same(load(str(ref)), load(str(tmp_path / "resumed.pt")))


def test_word_language_model_example_survives_sigkill_mid_epoch(store: Store, tmp_path: Path,
                                                              references: References) -> None:
    module = "tests.worker.workloads.lm_child"
    ref = reference(references, "word-language-model", module, lambda out: {
        "args": ["--epochs", "3", "--save", str(out / "ref-best.pt")], "order": str(out / "ref-order.txt"),
        "final": str(out / "ref.pt")}, 5)
    expected = read_order(ref / "ref-order.txt")
    per_epoch = len(expected) // 3
    die_at = per_epoch + per_epoch // 2 + 1  # in the middle of the second epoch

    folder = store.folder()
    order = tmp_path / "order.txt"
    cfg = {"args": ["--epochs", "3", "--save", str(tmp_path / "best.pt")], "order": str(order),
           "final": str(tmp_path / "resumed.pt")}
    assert run_child(module, child_env(store, folder, folder.bump_lease(), 5), {**cfg, "die_at": die_at}) == -9
    killed = read_order(order)
    assert killed == expected[:die_at]
    durable = folder.durable_step()
    assert durable is not None and 0 < durable < die_at and durable % per_epoch != 0, "resumes mid-epoch"
    order.unlink()
    assert run_child(module, child_env(store, folder, folder.bump_lease(), 5), cfg) == 0
    assert killed[:durable] + read_order(order) == expected
    assert_same(load(str(ref / "ref.pt")), load(str(tmp_path / "resumed.pt")))
    assert_same(load(str(ref / "ref-best.pt")), load(str(tmp_path / "best.pt")))
    assert folder.done()["step"] == len(expected)
