"""What the daemon has seen of each provider's room survives a restart (status/room.yaml): the
real tick in the simulator, restarted as `reconciler run` would be."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from adapters.gitrepo import GitError
from adapters.sim import PreemptionTrace, ProviderModel
from reconciler.daemon.loop import ROOM_PATH, ROOM_SUBJECT
from reconciler.sim.driver import JobPlan, ProviderPlan, SimConfig, Simulation
from status.room import ROOM_ALONE_SECONDS, parse_room

HOUR = 3600.0


def simulation(jobs: list[JobPlan], tick: float = 300.0) -> Simulation:
    """Spot without room for the first hour, then room."""
    trace = PreemptionTrace(300.0, (0,) * 12 + (1,) * 1000)
    spot = ProviderModel("spot", launch_delay_seconds=60.0, price_per_hour=1.0, trace=trace)
    return Simulation(SimConfig(providers=[ProviderPlan(spot, concurrency=1, interruptible=True)], jobs=jobs,
                                tick_seconds=tick))


@pytest.fixture
def sim() -> Iterator[Simulation]:
    s = simulation([JobPlan("job", target_steps=100_000)])
    yield s
    s.close()


def room_file(s: Simulation) -> bytes | None:
    return s.repo.read_file(s.reconciler.status_source(s.repo.head()), ROOM_PATH)


def test_a_restarted_daemon_goes_on_from_what_it_had_seen(sim: Simulation) -> None:
    """Stopped a tick after the job's launch onto room just back, which committed the file."""
    for _ in range(13):
        sim.step()
    before = sim.reconciler.room
    saved = room_file(sim)
    assert saved is not None and parse_room(saved)["spot"].room_returns > 0.9  # rode along with the statuses
    readme = sim.repo.read_file(sim.reconciler.status_source(sim.repo.head()), "status/README.md")
    wait = before.mean_wait("spot") / HOUR  # an hour without room seen, the one-hour prior weighing half a wait
    assert readme is not None and f"| without room for {wait:.1f} h on average |" in readme.decode()
    sim.step(fresh=True)
    after = sim.reconciler.room
    assert after is not before
    assert after.mean_wait("spot") == pytest.approx(before.mean_wait("spot"), rel=0.01)
    assert after.returns["spot"] == pytest.approx(before.returns["spot"], rel=0.01)
    age, was = after.shapes()["spot"].age_seconds, before.shapes()["spot"].age_seconds
    assert age is not None and was is not None  # room back since the hour: still known after the restart
    assert after.last["spot"][0] - age == before.last["spot"][0] - was


def test_a_daemon_with_nothing_to_commit_still_saves_every_few_hours() -> None:
    s = simulation([], tick=HOUR)
    try:
        for _ in range(int(ROOM_ALONE_SECONDS / HOUR)):  # the first look, and the hours after it
            s.step()
        assert room_file(s) is None
        s.step()
        saved = room_file(s)
        assert saved is not None and parse_room(saved)["spot"].seen_at == s.reconciler.room.latest()
        tip = s.reconciler.status_source(s.repo.head())
        assert s.repo.commits[tip].message.splitlines()[0] == ROOM_SUBJECT
    finally:
        s.close()


def test_a_save_whose_commit_failed_is_tried_again_next_tick() -> None:
    s = simulation([], tick=HOUR)
    failures = []

    def refuse_once(what: str) -> None:
        if what == "git.commit" and not failures:
            failures.append(what)
            raise GitError("disk full")

    try:
        for _ in range(int(ROOM_ALONE_SECONDS / HOUR)):
            s.step()
        s.repo.faults.hook = refuse_once
        s.step()  # the save is due: its commit fails
        assert failures and room_file(s) is None
        s.step()  # the next tick, not six hours later
        saved = room_file(s)
        assert saved is not None and parse_room(saved)["spot"].seen_at == s.reconciler.room.latest()
    finally:
        s.close()


def test_a_damaged_file_is_said_once_and_rewritten(sim: Simulation, caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(3):
        sim.step()
    sim.repo.commit_status({ROOM_PATH: "providers: [1, 2\n"}, "someone edited it")
    with caplog.at_level(logging.WARNING, logger="reconciler"):
        sim.step(fresh=True)
        sim.step()
    said = [r.getMessage() for r in caplog.records if ROOM_PATH in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{ROOM_PATH} cannot be read: invalid YAML at line 2, column 1: ")
    assert said[0].endswith("; the deadline policy learns each provider's room afresh, and the next status commit "
                            "rewrites the file")
    for _ in range(14):
        sim.step()
    saved = room_file(sim)
    assert saved is not None and parse_room(saved)["spot"].room_returns > 0.9
