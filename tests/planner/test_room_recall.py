"""A restarted daemon goes on from what it had seen of each provider's room (RoomWatch.evidence and
RoomWatch.recalled, through status/room.yaml's format), instead of starting from the priors."""

from __future__ import annotations

import pytest

from reconciler.planner.outlook.reliability import RESUME_GAP_SECONDS, RoomWatch, weight
from status.room import parse_room, render_room, room_words

HOUR = 3600.0
TICK = 300.0


def flaky_week(watch: RoomWatch, start: float = 0.0) -> float:
    """A week of spot that comes back for one tick every other time: returns the time of the last look."""
    t = start
    pattern = [0] * 12 + [1] + [0] * 12 + [1] * 48
    while t < start + 7 * 24 * HOUR:
        for room in pattern:
            watch.see("spot", t, bool(room))
            t += TICK
    return t - TICK


def through_the_file(watch: RoomWatch, now: float) -> RoomWatch:
    return RoomWatch.recalled(parse_room(render_room(watch.evidence())), now)


def test_a_daemon_back_within_minutes_goes_on_as_if_it_had_never_stopped() -> None:
    """Same figures, and the room period under way at the restart is counted whole when it ends."""
    kept, restarted = RoomWatch(), RoomWatch()
    last = flaky_week(kept)
    flaky_week(restarted)
    restarted = through_the_file(restarted, last + TICK)
    assert restarted.short_share("spot") == pytest.approx(kept.short_share("spot"), rel=1e-3)
    assert restarted.short_share("spot") > 0.3  # what a week of flaky room teaches
    assert restarted.mean_wait("spot") == pytest.approx(kept.mean_wait("spot"), rel=1e-3)
    for watch in (kept, restarted):
        for k in range(1, 4):
            watch.see("spot", last + k * TICK, room=k < 3)
    assert restarted.periods["spot"] == pytest.approx(kept.periods["spot"], rel=1e-3)
    assert restarted.mean_wait("spot") == pytest.approx(kept.mean_wait("spot"), rel=1e-3)


def test_after_a_long_gap_nothing_is_guessed_about_the_time_nobody_watched() -> None:
    """A day down: the evidence fades over the day, the gap counts neither as room nor as its lack,
    and the period under way when the daemon stopped is not counted."""
    watch = RoomWatch()
    last = flaky_week(watch)  # it stopped with room, since 4 h
    saved = watch.evidence()["spot"]
    back = last + 24 * HOUR
    assert back - last > RESUME_GAP_SECONDS
    restarted = through_the_file(watch, back)
    assert restarted.shapes()["spot"].age_seconds is None  # not known how long room has been there
    restarted.see("spot", back, room=False)
    assert restarted.exposure["spot"] == pytest.approx(saved.seconds_without_room * weight(24 * HOUR), rel=1e-3)
    assert restarted.periods["spot"] == pytest.approx(saved.room_periods, rel=1e-3)  # no period ended
    restarted.see("spot", back + TICK, room=True)  # room back after the gap counts as before
    assert restarted.returns["spot"] == pytest.approx(saved.room_returns * weight(24 * HOUR + TICK) + 1, rel=1e-3)


def test_the_file_says_what_the_daemon_made_of_it_and_reads_back_as_written() -> None:
    watch = RoomWatch()
    flaky_week(watch)
    text = render_room(watch.evidence())
    assert "do not edit" in text.splitlines()[0]
    back = parse_room(text)["spot"]
    assert back.short_share == pytest.approx(watch.short_share("spot"), abs=1e-4)
    assert back.mean_wait_hours == pytest.approx(watch.mean_wait("spot") / HOUR, abs=1e-4)
    assert render_room(parse_room(text)) == text


def test_the_status_index_says_it_in_words() -> None:
    watch = RoomWatch()
    flaky_week(watch)
    words = room_words(watch.evidence()["spot"])
    share = watch.shorts["spot"] / watch.periods["spot"]  # every other room period lasts one tick
    assert 0.45 < share < 0.55
    assert words == (f"without room for {watch.mean_wait('spot') / HOUR:.1f} h on average; "
                     f"{100 * share:.0f} % of room periods end within 20 min")
    watch = RoomWatch()
    watch.see("spot", 0.0, room=True)  # no room period seen whole yet
    assert room_words(watch.evidence()["spot"]) == "without room for 1.0 h on average"


@pytest.mark.parametrize(("text", "says"), [
    ("providers: [1, 2", "invalid YAML at line 1, column 17"),
    ("a: &x [1]\nproviders: *x\n", "YAML aliases are not allowed (line 2)"),
    ("jobs: {}", "no `providers:` mapping"),
    ("providers:\n  spot: 3\n", "provider 'spot': not a mapping"),
    ("providers:\n  spot:\n    had_room: true\n", "provider 'spot': seen_at: Field required"),
    ("providers:\n  spot:\n    seen_at: yesterday\n", "provider 'spot'"),
    ("providers:\n  spot:\n    seen_at: 2026-12-07T00:00:00Z\n    room_returns: -3\n",
     "provider 'spot': room_returns: Input should be greater than or equal to 0"),
    ("providers:\n  spot:\n    seen_at: 2026-12-07T00:00:00Z\n    seconds_without_room: .nan\n",
     "provider 'spot': seconds_without_room: Input should be a finite number"),
    ("providers:\n  spot:\n    seen_at: 2026-12-07T00:00:00Z\n    room_periods: 1\n    short_room_periods: 2\n",
     "provider 'spot': short_room_periods is more than room_periods"),
])
def test_a_damaged_file_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_room(text)
    assert says in str(caught.value)
