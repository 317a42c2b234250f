"""The SDK's checkpoint interval: Young/Daly from the save cost it measures and the MTBF the
reconciler passes (RECONCILER_MTBF_SECONDS), re-estimated at every save, unless the job pins
`checkpoint_every`. Saves run on a real run folder; time is a fake clock the slow parts advance."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.storage import RunFolder
from reconciler.checkpoint_policy import (
    DEFAULT_PRIOR_MTBF_SECONDS,
    IntervalPolicy,
    checkpoint_interval,
    daly_interval,
    estimate_mtbf,
)
from reconciler.worker import open_run, snapshot
from reconciler.worker.run import Run, RunConfigError

M = 3600.0  # the MTBF the reconciler passed


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class SlowSaves:
    """Each save blocks the caller for `blocked` seconds (the copy) and takes `durable` more to
    commit (the write, let through by `release()` once the caller has been measured)."""

    def __init__(self, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock, self.blocked, self.durable = clock, 0.0, 0.0
        self.gate = threading.Event()
        capture, write = snapshot.capture, snapshot.write

        def slow_capture(*args: Any, **kw: Any) -> Any:
            self.clock.t += self.blocked
            return capture(*args, **kw)

        def slow_write(*args: Any, **kw: Any) -> Any:
            assert self.gate.wait(30), "the test never released the write"
            self.clock.t += self.durable
            return write(*args, **kw)

        monkeypatch.setattr(snapshot, "capture", slow_capture)
        monkeypatch.setattr(snapshot, "write", slow_write)

    def save(self, run: Run, step: int, blocked: float, durable: float) -> None:
        self.blocked, self.durable = blocked, durable
        self.gate.clear()
        run.save(step, state={"w": [1.0] * 100})
        self.gate.set()
        run.wait()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_run(tmp_path: Path, clock: Clock) -> Iterator[Any]:
    runs: list[Run] = []

    def make(**kw: Any) -> Run:
        folder = RunFolder(str(tmp_path / f"run{len(runs)}"))
        run = Run(folder, "r", folder.bump_lease(), install_signal_handlers=False, heartbeat_interval=1e9,
                  clock=clock, **kw)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()


def due_after(run: Run, clock: Clock, seconds: float, step: int) -> bool:
    clock.t = run._last_save_time + seconds
    return run.should_checkpoint(step)


@pytest.mark.parametrize(
    ("blocked", "durable", "mtbf", "expected"),
    [
        (None, None, M, 60.0),  # nothing measured: the first save comes early and measures
        (2.0, 5.0, M, daly_interval(2.0, M)),  # Daly for the blocked cost
        (2.0, 5.0, None, daly_interval(2.0, DEFAULT_PRIOR_MTBF_SECONDS)),  # no figure: the prior
        (0.01, 0.1, M, 60.0),  # a tiny cost: the minimum
        (2.0, 400.0, M, 400.0),  # a write longer than Daly's interval: never overlap two writes
        (1000.0, 1000.0, 1e9, 6 * 3600.0),  # the maximum
    ],
)
def test_the_policy_is_daly_for_the_blocked_cost_within_bounds(
        blocked: float | None, durable: float | None, mtbf: float | None, expected: float) -> None:
    policy = IntervalPolicy(mtbf=mtbf)
    if blocked is not None or durable is not None:
        policy.saved(blocked=blocked, durable=durable)
    assert policy.interval() == pytest.approx(expected)


def test_interruptions_the_worker_sees_pool_with_the_given_mtbf() -> None:
    policy = IntervalPolicy(mtbf=M)
    policy.saved(blocked=2.0, durable=2.0)
    before = policy.interval()
    policy.interrupted(600.0)
    assert policy.failure_mtbf == estimate_mtbf(600.0, 1, M)
    assert 600.0 <= policy.failure_mtbf <= 2 * 600.0  # its own interruption outweighs the figure it was given
    assert policy.interval() == pytest.approx(checkpoint_interval(2.0, policy.failure_mtbf))
    assert policy.interval() < before


def test_on_machines_that_fail_every_minute_the_sdk_saves_at_daly_s_interval_not_once_a_minute() -> None:
    policy = IntervalPolicy(mtbf=60.0)
    assert policy.interval() == pytest.approx(6.0)  # the first save: a tenth of the MTBF, not a minute
    policy.saved(blocked=5.0, durable=5.0)
    assert policy.interval() == pytest.approx(daly_interval(5.0, 60.0))  # about 21 s
    hourly = IntervalPolicy(mtbf=3600.0)
    hourly.saved(blocked=0.01, durable=0.01)
    assert hourly.interval() == 60.0  # a tiny cost on reliable machines: still once a minute at most


def test_the_sdk_saves_at_the_young_daly_interval_of_its_measured_cost(
        make_run: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(mtbf=M)
    slow = SlowSaves(clock, monkeypatch)
    assert run.checkpoint_interval == 60.0
    assert not due_after(run, clock, 59.0, 1) and due_after(run, clock, 60.0, 2)
    slow.save(run, 2, blocked=2.0, durable=5.0)
    assert run.interval.blocked == pytest.approx(2.0)
    assert run.interval.durable == pytest.approx(7.0)  # from the save's start to its commit
    assert run._save_seconds == pytest.approx(7.0)  # the deadline margin sees the same figure
    tau = daly_interval(2.0, M)
    assert run.checkpoint_interval == pytest.approx(tau) and 110 < tau < 125
    # From one save's start to the next: the blocked copy plus tau of training.
    assert not due_after(run, clock, tau + 2.0 - 0.5, 3)
    assert due_after(run, clock, tau + 2.0 + 0.5, 4)


def test_the_heartbeat_says_how_often_the_worker_saves_unless_a_step_count_pins_it(
        make_run: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconciler weighs what an interruption loses by the seconds from one save's start to
    the next: the Young/Daly interval plus the blocked copy, as the worker plans them."""
    run = make_run(mtbf=M)
    SlowSaves(clock, monkeypatch).save(run, 2, blocked=2.0, durable=5.0)
    run._heartbeat(3, {}, force=True)
    said = run.folder.progress()
    assert said is not None and said.save_every_seconds == pytest.approx(daly_interval(2.0, M) + 2.0, abs=0.05)
    pinned = make_run(mtbf=M, checkpoint_every=100)
    pinned._heartbeat(1, {}, force=True)
    beat = pinned.folder.progress()
    assert beat is not None and beat.save_every_seconds is None  # steps pin it: the interval is checkpoint_every


def test_a_slower_save_lengthens_the_interval(make_run: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(mtbf=M)
    slow = SlowSaves(clock, monkeypatch)
    slow.save(run, 1, blocked=2.0, durable=1.0)
    first = run.checkpoint_interval
    slow.save(run, 2, blocked=8.0, durable=1.0)
    assert run.interval.blocked == pytest.approx(5.0)  # half the newest, half what was known
    assert run.checkpoint_interval == pytest.approx(daly_interval(5.0, M)) and run.checkpoint_interval > first
    slow.save(run, 3, blocked=2.0, durable=300.0)  # a slow store: the write now sets the floor
    assert run.checkpoint_interval == pytest.approx(302.0)
    assert not due_after(run, clock, 300.0, 4)


def test_a_pinned_checkpoint_every_wins(make_run: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(mtbf=M, checkpoint_every=5)
    SlowSaves(clock, monkeypatch).save(run, 5, blocked=2.0, durable=1.0)
    assert [due_after(run, clock, 10 * 3600.0, s) for s in (6, 9, 10)] == [False, False, True]
    assert due_after(run, clock, 1.0, 15)  # on the step, however soon


def test_pinned_seconds_win(make_run: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(mtbf=M, checkpoint_seconds=30.0)
    SlowSaves(clock, monkeypatch).save(run, 1, blocked=2.0, durable=1.0)
    assert run.checkpoint_interval == 30.0
    assert not due_after(run, clock, 29.0, 2) and due_after(run, clock, 30.0, 3)


def test_open_run_reads_the_mtbf_and_the_pin_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    monkeypatch.setenv("RECONCILER_MTBF_SECONDS", "7200")
    with open_run(uri=folder.uri, install_signal_handlers=False) as run:
        assert run.interval.mtbf == 7200.0 and run.checkpoint_every is None
    monkeypatch.setenv("RECONCILER_CHECKPOINT_EVERY", "50")
    with open_run(uri=folder.uri, install_signal_handlers=False) as run:
        assert run.checkpoint_every == 50
        assert run.should_checkpoint(50) and not run.should_checkpoint(51)
    monkeypatch.setenv("RECONCILER_MTBF_SECONDS", "soon")
    with pytest.raises(RunConfigError, match=r"RECONCILER_MTBF_SECONDS='soon' is not a number"):
        open_run(uri=folder.uri, install_signal_handlers=False)


def test_a_real_save_is_measured_and_sets_the_interval(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    with open_run(uri=folder.uri, mtbf=M, install_signal_handlers=False) as run:
        run.save(1, state={"w": list(range(100_000))})
        run.wait()
        blocked, durable = run.interval.blocked, run.interval.durable
        assert blocked is not None and durable is not None and 0 < blocked <= durable
        assert run.checkpoint_interval == max(checkpoint_interval(blocked, M), durable)
        assert folder.durable_step() == 1


def _rank(rank: int, tmp: str, out: str) -> None:
    """One of two real gloo ranks: rank 1's clock runs far ahead of rank 0's."""
    import torch.distributed

    from reconciler.worker.dist import Group

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    clock = Clock()
    folder = RunFolder(f"{tmp}/run")
    run = Run(folder, "r", 1, install_signal_handlers=False, heartbeat_interval=1e9, clock=clock, mtbf=M,
              group=Group(rank, 2))
    answers = []
    for step, (ahead0, ahead1) in enumerate([(10.0, 1e6), (61.0, 1e6), (61.0, 0.0)], start=1):
        clock.t = 1000.0 + (ahead0 if rank == 0 else ahead1)
        answers.append(run.should_checkpoint(step))
    run.close()
    torch.distributed.destroy_process_group()
    Path(f"{out}.{rank}").write_text(json.dumps(answers))


def test_under_two_ranks_rank_0_decides(tmp_path: Path) -> None:
    RunFolder(str(tmp_path / "run")).bump_lease()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path), str(tmp_path / "answers"))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    answers = [json.loads((tmp_path / f"answers.{r}").read_text()) for r in (0, 1)]
    # Rank 1's clock alone never makes a checkpoint due; rank 0's does, on both ranks at once.
    assert answers == [[False, True, True], [False, True, True]]
