"""The leader lease on every store: one holder at a time, renewal, takeover after expiry, a clean
give-up, and many contenders racing for a free lease (compare-and-swap, not last-writer-wins)."""

from __future__ import annotations

import json
import threading

import pytest

from adapters.leader import Election
from adapters.stores import open_store
from tests.worker.conftest import in_process_store, s3_endpoint  # noqa: F401 - fixtures
from tests.worker.harness import Store

NOW = 1_800_000_000.0


@pytest.fixture
def store(in_process_store: Store) -> Store:  # noqa: F811
    """Run folders and leases in this process: memory:// as well as local disk and S3."""
    return in_process_store


def hold(election: Election, st: Store, now: float) -> bool:
    return election.hold(st.base, st.options, "repo-key", 10.0, now).leading


def test_one_holder_renews_and_the_other_waits_until_it_expires(store: Store) -> None:  # noqa: F811
    a, b = Election(), Election()
    assert hold(a, store, NOW)
    standby = b.hold(store.base, store.options, "repo-key", 10.0, NOW + 1)
    assert not standby.leading and standby.holder == a.holder and standby.expires >= NOW + 30
    assert hold(a, store, NOW + 20)  # renewed: good until NOW + 50
    assert not hold(b, store, NOW + 45)
    assert hold(b, store, NOW + 51)  # a stopped renewing: b takes over
    assert not hold(a, store, NOW + 52)


def expires(st: Store) -> float:
    record = json.loads(open_store(f"{st.base}/.leader", st.options).read("repo-key.json") or b"{}")
    return float(record["expires"])


def test_keep_alive_renews_a_led_lease_between_ticks_and_never_takes_one(store: Store) -> None:  # noqa: F811
    a, b = Election(), Election()
    assert hold(a, store, NOW)
    a.keep_alive(NOW + 5)  # less than a third of 30 s: no write
    assert expires(store) == NOW + 30
    a.keep_alive(NOW + 11)
    assert expires(store) == NOW + 41
    assert not hold(b, store, NOW + 12)
    b.keep_alive(NOW + 100)  # a standby's keep-alive does not take the expired lease
    assert expires(store) == NOW + 41


def test_a_leader_that_resigns_lets_the_standby_in_at_once(store: Store) -> None:  # noqa: F811
    a, b = Election(), Election()
    assert hold(a, store, NOW)
    a.resign(NOW + 1)
    assert hold(b, store, NOW + 2)


def test_a_new_process_on_the_same_clone_takes_its_dead_predecessors_lease(store: Store) -> None:  # noqa: F811
    dead, other_clone = Election(clone="/repo"), Election(clone="/elsewhere")
    assert hold(dead, store, NOW)
    assert not hold(other_clone, store, NOW + 1)
    assert hold(Election(clone="/repo"), store, NOW + 1)


def test_contenders_for_a_free_lease_elect_exactly_one(store: Store) -> None:  # noqa: F811
    elections = [Election() for _ in range(8)]
    results: list[bool] = []
    start = threading.Barrier(len(elections))

    def contend(e: Election) -> None:
        start.wait()
        results.append(hold(e, store, NOW))

    threads = [threading.Thread(target=contend, args=(e,)) for e in elections]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
