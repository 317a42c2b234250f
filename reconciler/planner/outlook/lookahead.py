"""The lookahead of `deadline_policy: lookahead`: spot, the fallback or a wait, whichever is expected
to finish the run for least. Pure.

The window left before the deadline is cut into steps of one tick. At each step the run is nowhere,
on spot or on the fallback (never interrupted), and spot has room or not. Spot's room comes and goes
as a Markov chain: once spot has no room, room comes back after a mean of `down_seconds` (what the
daemon has seen: reconciler.planner.outlook.reliability.RoomWatch; bench/deadline.py's reference
gives it the trace's own mean periods), and a machine there lasts a mean of `up_seconds` (its
MTBF). A room period is short (mean `short_seconds`) with chance `short_share` and long
otherwise (RoomWatch: a share borrowed from the public AWS spot traces, where 29 to 51 % of room
periods end within 20 minutes, then the one the daemon sees; 0 reads as memoryless), so room that has just
come back is likelier to go soon: the chain then counts the steps since room came back, one state
a step for three short means, before room is taken as settled. A launch pays its changeover,
billed, before any work; an interruption loses, on average, `unsaved_seconds` of work and leaves
the run nowhere; a stop keeps only the durable work and leaves the run nowhere until the next tick
(a move is a stop, then a launch).
Work left at the deadline, one tick early, costs MISS_PENALTY per unit, far above any price, so the
cheapest plan meets the deadline wherever the fallback still can. Where the slack is not above the
policy's safety net (`reserve_seconds`), the plan has the run on the fallback, as the policy will:
planned without it, a launch on spot just above the net was moved off a tick later at the price
of two changeovers, and a run finished 30 s late.

The expected cost of every state is computed backwards from the deadline each time it is asked
(dynamic programming, the work in tenths of a step, two layers of the table in memory at once); a
window longer than MAX_STEPS ticks is cut into MAX_STEPS longer steps, so the table has at most
MAX_STEPS layers whatever the tick and the window, each of three rows per room state (two, or up to
eight with short room periods) of ten cells per step of work left.

Where Uniform Progress (Wu et al., NSDI'24) keeps a straight line and ROSS (Bhuyan et al.,
INFOCOM'26) a threshold on the ratio of time left to work left, this prices each choice from the
provider's measured figures: the forecast used in placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

NOWHERE, SPOT, FALLBACK = 0, 1, 2
WAIT, RUN_SPOT, RUN_FALLBACK, STOP = "wait", "spot", "fallback", "stop"
MISS_PENALTY = 1000.0  # dollars per unit of work left at the deadline
UNITS_PER_STEP = 10  # the grain of work: a tenth of a tick
MAX_STEPS = 288  # a window longer than 288 ticks is solved in longer steps (a day at 5 minutes)
SHORT_ROOM_SECONDS = 600.0  # the mean of spot's short room periods (docs/guides/deadlines-budgets.md)
MAX_FRESH_STEPS = 6  # at most this many room states for room that came back recently


@dataclass(frozen=True)
class Model:
    """The run and its two kinds of capacity, as the lookahead sees them (seconds, $/h). Work is
    counted in seconds on spot; the fallback does `fallback_speed` of them a second."""

    step_seconds: float  # one decision step: the tick
    spot_price: float
    fallback_price: float
    changeover_spot: float
    changeover_fallback: float
    up_seconds: float  # mean time a machine on spot lasts (its MTBF)
    down_seconds: float  # mean time spot stays without room once it has none
    unsaved_seconds: float  # work an interruption loses on average
    fallback_speed: float = 1.0
    # The safety net the policy keeps (deadline.py, rule 2): where the slack (the time left beyond
    # the rest on the fallback, a changeover to it included) is not above it, the run is on the fallback.
    reserve_seconds: float = 0.0
    # Spot's room periods as a mix of two kinds (hyperexponential): a share `short_share` of them
    # short, of mean `short_seconds`, the rest long, with `up_seconds` the mean of all; 0 reads as
    # one kind (memoryless). Room that came back recently is then likelier to go again soon: the room
    # state counts the steps since it came back, up to a few short means (`fresh_steps`).
    short_share: float = 0.0
    short_seconds: float = SHORT_ROOM_SECONDS
    room_age_seconds: float | None = None  # how long spot has had room now (None: long enough)

    @property
    def unit(self) -> float:
        return self.step_seconds / UNITS_PER_STEP

    def units(self, seconds: float) -> int:
        return max(0, int(round(seconds / self.unit)))

    @cached_property
    def _share(self) -> float:
        """The short share, none where the mean leaves no room for a long kind longer than the short."""
        q, s, mean = self.short_share, self.short_seconds, self.up_seconds
        return q if 0 < q < 1 and s > 0 and mean > 2 * s else 0.0

    @cached_property
    def long_seconds(self) -> float:
        """The mean of the long room periods: what is left of `up_seconds` beside the short ones."""
        q = self._share
        return (self.up_seconds - q * self.short_seconds) / (1 - q)

    def _lasts(self, seconds: float) -> float:
        """The chance a room period lasts beyond `seconds` after room came back."""
        q = self._share
        short = q * math.exp(-seconds / self.short_seconds) if q else 0.0
        return short + (1 - q) * math.exp(-seconds / self.long_seconds) if self.long_seconds > 0 else short

    @cached_property
    def fresh_steps(self) -> int:
        """The room states for room that came back recently: one a step, for three short means."""
        return min(MAX_FRESH_STEPS, math.ceil(3 * self.short_seconds / self.step_seconds)) if self._share else 0

    @property
    def rooms(self) -> int:
        """Room states: 0 no room, 1..fresh_steps room back that many steps ago (less one), then settled."""
        return self.fresh_steps + 2

    @cached_property
    def keeps(self) -> tuple[float, ...]:
        """For each room state, the chance spot has room a step later."""
        t = self.step_seconds
        fresh = tuple(self._lasts((j + 1) * t) / self._lasts(j * t) for j in range(self.fresh_steps))
        return (self.p_up, *fresh, 1.0 - self.p_down)

    def after(self, room: int) -> int:
        """The room state a step after `room`, where spot has room then."""
        return min(room + 1, self.fresh_steps + 1)

    def mix(self, nxt: np.ndarray, loc: int, room: int) -> np.ndarray:
        """The next layer at `loc`, weighed by whether spot has room then."""
        keep = self.keeps[room]
        return keep * nxt[loc, self.after(room)] + (1 - keep) * nxt[loc, 0]

    def room_now(self, room: bool) -> int:
        """The room state now: none, fresh (by `room_age_seconds`) or settled."""
        if not room:
            return 0
        if self.room_age_seconds is None:
            return self.fresh_steps + 1
        return min(1 + int(self.room_age_seconds // self.step_seconds), self.fresh_steps + 1)

    @property
    def p_down(self) -> float:
        """The chance a machine on spot on settled room is interrupted within one step."""
        return 1.0 - math.exp(-self.step_seconds / self.long_seconds) if self.long_seconds > 0 else 1.0

    @property
    def p_up(self) -> float:
        """The chance room comes back on spot within one step."""
        return 1.0 - math.exp(-self.step_seconds / self.down_seconds) if self.down_seconds > 0 else 1.0


def _solve(m: Model, steps: int, work_units: int, beyond: float, least: int = 0) -> np.ndarray:
    """The least expected cost V[loc, room, w] with `steps` steps left, at `loc`, in room state `room`
    (Model.rooms) and with w units of work left; only two layers of the table are ever kept, each
    computed for every room state at once. `beyond`: the seconds the deadline is past the last step
    (the safety net is judged on the time left to it). `least`: the least work left the caller asks
    about. A step does at most `_most_done` units, so a layer j steps before the last is needed
    only from j + 1 such steps below `least`: work levels below that are never reached from where
    the run is, and are left uncomputed (their cells hold nothing meaningful); every other cell is
    the full table's to the bit (tests/planner/test_lookahead_policy.py). This and computing the
    three places' next steps together cut a call by 12-16 % (bench/policy_cost.py --quick)."""
    w = np.arange(work_units + 1)
    nxt = np.broadcast_to((w * MISS_PENALTY)[None, None, :], (3, m.rooms, work_units + 1)).copy()
    v_next = np.full_like(nxt, np.nan)
    full, spot_in = m.units(m.step_seconds), m.units(m.step_seconds - m.changeover_spot)
    fb_full = m.units(m.step_seconds * m.fallback_speed)
    fb_in = m.units((m.step_seconds - m.changeover_fallback) * m.fallback_speed)
    most = _most_done(m)
    c_spot, c_fb = m.spot_price * m.step_seconds / 3600, m.fallback_price * m.step_seconds / 3600
    back = _back(m, work_units)
    need = w * m.unit / m.fallback_speed  # the rest on the fallback (a changeover more from elsewhere)
    keep, after = np.array(m.keeps)[:, None], [m.after(r) for r in range(m.rooms)]
    lose = 1 - keep
    slacks = (np.arange(1, steps + 1)[:, None] * m.step_seconds + beyond) - need  # each layer's, by work left
    nets, nets_fb = slacks - m.changeover_fallback <= m.reserve_seconds, slacks <= m.reserve_seconds
    for k in range(1, steps + 1):
        lo = max(0, least - (steps - k + 1) * most)  # the least work level this layer is read at
        below = max(0, lo - most)  # ... and the least the layer before is read at
        done = _shifter(work_units, below, lo)
        net, net_fb = nets[k - 1, lo:], nets_fb[k - 1, lo:]
        # A step later, every place in the room state after each (room kept) or without room:
        after_room = nxt[:, after, below:]
        mixed = keep * after_room + lose * nxt[:, :1, below:]
        idle, fb_next, spot_next = mixed[NOWHERE, :, lo - below:], mixed[FALLBACK], after_room[SPOT]
        gone = lose * (c_spot / 2 + nxt[NOWHERE, 0][back[lo:]])
        launch = c_fb + done(fb_next, fb_in)
        best = np.minimum(idle, launch)
        # A step on spot from each room state (room state 0 has none: its row is not used).
        best[1:] = np.minimum(best[1:], (keep * (c_spot + done(spot_next, spot_in)) + gone)[1:])
        v = v_next
        v[NOWHERE, :, lo:] = np.where(net, launch, best)
        stay = c_fb + done(fb_next, fb_full)
        v[FALLBACK, :, lo:] = np.where(net_fb, stay, np.minimum(stay, idle))
        stay_spot = keep * (c_spot + done(spot_next, full)) + gone
        stay_spot[0] = v[NOWHERE, 0, lo:]
        v[SPOT, :, lo:] = np.where(net, v[NOWHERE, :, lo:], np.minimum(stay_spot, v[NOWHERE, :, lo:]))
        nxt, v_next = v, nxt
    return nxt


def _most_done(m: Model) -> int:
    """The most units of work one step can do, anywhere."""
    return max(m.units(m.step_seconds), m.units(m.step_seconds * m.fallback_speed), 1)


def _on_spot(m: Model, nxt: np.ndarray, done: Callable[[np.ndarray, int], np.ndarray], progress: int, c_spot: float,
             back: np.ndarray, room: int) -> np.ndarray:
    """A step on spot in room state `room`: it lasts (the work is done) or it is interrupted (half
    the step billed, the work since the last checkpoint lost, nowhere and no room after)."""
    keep = m.keeps[room]
    kept = c_spot + done(nxt[SPOT, m.after(room)], progress)
    gone = c_spot / 2 + nxt[NOWHERE, 0][back]
    return keep * kept + (1 - keep) * gone


def _steps(m: Model, seconds_left: float) -> tuple[Model, int]:
    """The model at the grain it is solved with, and the whole steps left, one tick early (a move
    takes one more). A long window is cut into at most MAX_STEPS steps, each then longer than a tick."""
    m = replace(m, step_seconds=max(m.step_seconds, seconds_left / MAX_STEPS))
    return m, max(0, int(seconds_left // m.step_seconds) - 1)


def choose(m: Model, seconds_left: float, live_work: float, durable_work: float, loc: int,
           room: bool) -> tuple[str, dict[str, float]]:
    """The cheapest action now and every action's expected cost to finish, in dollars. A live
    attempt can stay or stop: a stop keeps only `durable_work` and leaves the run nowhere until the
    next tick (a move is a stop, then a launch), so its figure is that of the best launch, or wait,
    a tick later (`then`). `live_work` counts the live attempt's unsaved work as done (spot seconds, both)."""
    m, steps = _steps(m, seconds_left)
    live, durable = int(math.ceil(live_work / m.unit)), int(math.ceil(durable_work / m.unit))
    if steps <= 2:
        return RUN_FALLBACK, {}
    units = max(live, durable) + 1
    nxt = _solve(m, steps - 1, units, seconds_left - steps * m.step_seconds, least=min(live, durable))
    if loc == NOWHERE:
        out = _launches(m, nxt, live, room)
        return min(out, key=lambda k: out[k]), out
    now = m.room_now(room)
    stopped = m.mix(nxt, NOWHERE, now)[durable]
    if loc == FALLBACK:
        done = max(0, live - m.units(m.step_seconds * m.fallback_speed))
        out = {RUN_FALLBACK: m.fallback_price * m.step_seconds / 3600 + float(m.mix(nxt, FALLBACK, now)[done]),
               STOP: float(stopped)}
    else:
        stay = _on_spot(m, nxt, _shifter(units), m.units(m.step_seconds), m.spot_price * m.step_seconds / 3600,
                        _back(m, units), now)
        out = {RUN_SPOT: float(stay[live]), STOP: float(stopped)}
    return min(out, key=lambda k: out[k]), out


def decide(m: Model, seconds_left: float, live_work: float, durable_work: float, loc: int, room: bool,
           room_for_another: bool) -> tuple[str, dict[str, float]]:
    """`choose`, with a stop resolved into where the run goes next: spot, the fallback (a move) or
    a wait; a stop whose next step is back where it was reads as a wait (it stops, then waits).
    `room`: spot has room for this run (a live attempt there counts); `room_for_another`: it could
    take a new worker now."""
    act, cost = choose(m, seconds_left, live_work, durable_work, loc, room)
    if act == STOP:
        act = then(m, seconds_left, durable_work, room_for_another)
        if act == {SPOT: RUN_SPOT, FALLBACK: RUN_FALLBACK}.get(loc):
            act = WAIT
    return act, cost


def then(m: Model, seconds_left: float, durable_work: float, room: bool) -> str:
    """After a stop: what the run is expected to do a tick later, from nowhere (spot where it has
    room now, else the fallback or a wait)."""
    m, steps = _steps(m, seconds_left)
    durable = int(math.ceil(durable_work / m.unit))
    if steps <= 3:
        return RUN_FALLBACK
    out = _launches(m, _solve(m, steps - 2, durable + 1, seconds_left - steps * m.step_seconds, least=durable),
                    durable, room)
    return min(out, key=lambda k: out[k])


def _launches(m: Model, nxt: np.ndarray, work: int, room: bool) -> dict[str, float]:
    """From nowhere, the next layer being `nxt`: wait, launch on the fallback or, with room, on spot."""
    units, now = nxt.shape[-1] - 1, m.room_now(room)
    fb_in = m.units((m.step_seconds - m.changeover_fallback) * m.fallback_speed)
    on_fb = m.fallback_price * m.step_seconds / 3600 + m.mix(nxt, FALLBACK, now)[max(0, work - fb_in)]
    out = {WAIT: float(m.mix(nxt, NOWHERE, now)[work]), RUN_FALLBACK: float(on_fb)}
    if room:
        out[RUN_SPOT] = float(_on_spot(m, nxt, _shifter(units), m.units(m.step_seconds - m.changeover_spot),
                                       m.spot_price * m.step_seconds / 3600, _back(m, units), now)[work])
    return out


def _shifter(units: int, base: int = 0, lo: int = 0) -> Callable[[np.ndarray, int], np.ndarray]:
    """`done(x, k)`: x with k more units of work done (work never below none), for the work levels
    from `lo` to `units`, where x holds the levels from `base` (at most `lo`) to `units`."""
    def done(x: np.ndarray, k: int) -> np.ndarray:
        k = min(max(k, 0), units + 1)
        if lo - k >= base:  # every level reads one that x holds: a view
            return x[..., lo - k - base:units + 1 - k - base]
        out = np.empty(x.shape[:-1] + (units + 1 - lo,))  # here base is 0: some levels read none left
        out[..., k - lo:], out[..., :k - lo] = x[..., :units + 1 - k], x[..., :1]
        return out
    return done


def _back(m: Model, units: int) -> np.ndarray:
    """Each work level after an interruption: the work since the last checkpoint is to do again."""
    return np.minimum(np.arange(units + 1) + m.units(max(0.0, m.unsaved_seconds - m.step_seconds / 2)), units)
