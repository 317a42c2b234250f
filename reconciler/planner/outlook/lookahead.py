"""The lookahead of `deadline_policy: lookahead`: spot, the fallback or a wait, whichever is expected
to finish the run for least. Pure.

The window left before the deadline is cut into steps of one tick. At each step the run is nowhere,
on spot or on the fallback (never interrupted), and spot has room or not. Spot's room comes and goes
as a two-state Markov chain: a machine there lasts a mean of `up_seconds` (its MTBF) and, once spot
has no room, room comes back after a mean of `down_seconds` (what the daemon has seen:
reconciler.planner.outlook.reliability.RoomWatch; bench/deadline.py's reference gives it the
trace's own mean periods). A launch pays its changeover, billed, before any work; an interruption
loses, on average, `unsaved_seconds` of work and leaves the run nowhere; a stop keeps only the
durable work and leaves the run nowhere until the next tick (a move is a stop, then a launch).
Work left at the deadline, one tick early, costs MISS_PENALTY per unit, far above any price, so the
cheapest plan meets the deadline wherever the fallback still can. Where the slack is not above the
policy's safety net (`reserve_seconds`), the plan has the run on the fallback, as the policy will:
planned without it, a launch on spot just above the net was moved off a tick later at the price
of two changeovers, and a run finished 30 s late.

The expected cost of every state is computed backwards from the deadline each time it is asked
(dynamic programming, the work in tenths of a step, two layers of the table in memory at once); a
window longer than MAX_STEPS ticks is cut into MAX_STEPS longer steps, so the table has at most
MAX_STEPS layers whatever the tick and the window, each of six rows of ten cells per step of work left.

Where Uniform Progress (Wu et al., NSDI'24) keeps a straight line and ROSS (Bhuyan et al.,
INFOCOM'26) a threshold on the ratio of time left to work left, this prices each choice from the
provider's measured figures: the forecast used in placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

NOWHERE, SPOT, FALLBACK = 0, 1, 2
WAIT, RUN_SPOT, RUN_FALLBACK, STOP = "wait", "spot", "fallback", "stop"
MISS_PENALTY = 1000.0  # dollars per unit of work left at the deadline
UNITS_PER_STEP = 10  # the grain of work: a tenth of a tick
MAX_STEPS = 288  # a window longer than 288 ticks is solved in longer steps (a day at 5 minutes)


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

    @property
    def unit(self) -> float:
        return self.step_seconds / UNITS_PER_STEP

    def units(self, seconds: float) -> int:
        return max(0, int(round(seconds / self.unit)))

    @property
    def p_down(self) -> float:
        """The chance a machine on spot is interrupted within one step."""
        return 1.0 - math.exp(-self.step_seconds / self.up_seconds) if self.up_seconds > 0 else 1.0

    @property
    def p_up(self) -> float:
        """The chance room comes back on spot within one step."""
        return 1.0 - math.exp(-self.step_seconds / self.down_seconds) if self.down_seconds > 0 else 1.0


def _solve(m: Model, steps: int, work_units: int, beyond: float) -> np.ndarray:
    """The least expected cost V[loc, room, w] with `steps` steps left, at `loc`, spot with room (1)
    or not, and w units of work left; only two layers of the table are ever kept. `beyond`: the
    seconds the deadline is past the last step (the safety net is judged on the time left to it)."""
    w = np.arange(work_units + 1)
    nxt = np.broadcast_to((w * MISS_PENALTY)[None, None, :], (3, 2, work_units + 1)).copy()

    def done(x: np.ndarray, k: int) -> np.ndarray:
        """x with k more units of work done."""
        return x[np.maximum(w - k, 0)]

    full, spot_in = m.units(m.step_seconds), m.units(m.step_seconds - m.changeover_spot)
    fb_full = m.units(m.step_seconds * m.fallback_speed)
    fb_in = m.units((m.step_seconds - m.changeover_fallback) * m.fallback_speed)
    c_spot, c_fb = m.spot_price * m.step_seconds / 3600, m.fallback_price * m.step_seconds / 3600
    back = _back(m, work_units)
    need = w * m.unit / m.fallback_speed  # the rest on the fallback (a changeover more from elsewhere)
    for k in range(1, steps + 1):
        v = np.empty_like(nxt)
        slack = k * m.step_seconds + beyond - need
        net, net_fb = slack - m.changeover_fallback <= m.reserve_seconds, slack <= m.reserve_seconds
        for room in (0, 1):
            p = (m.p_up, 1 - m.p_down)[room]  # room at the next step
            idle = p * nxt[NOWHERE, 1] + (1 - p) * nxt[NOWHERE, 0]
            fb_next = p * nxt[FALLBACK, 1] + (1 - p) * nxt[FALLBACK, 0]
            launch = c_fb + done(fb_next, fb_in)
            best = np.minimum(idle, launch)
            if room:
                best = np.minimum(best, _on_spot(m, nxt, done, spot_in, c_spot, back))
            v[NOWHERE, room] = np.where(net, launch, best)
            stay = c_fb + done(fb_next, fb_full)
            v[FALLBACK, room] = np.where(net_fb, stay, np.minimum(stay, idle))
        v[SPOT, 1] = np.where(net, v[NOWHERE, 1], np.minimum(_on_spot(m, nxt, done, full, c_spot, back), v[NOWHERE, 1]))
        v[SPOT, 0] = v[NOWHERE, 0]
        nxt = v
    return nxt


def _on_spot(m: Model, nxt: np.ndarray, done: Callable[[np.ndarray, int], np.ndarray], progress: int, c_spot: float,
             back: np.ndarray) -> np.ndarray:
    """A step on spot: it lasts (the work is done) or it is interrupted (half the step billed, the
    work since the last checkpoint lost, nowhere and no room after)."""
    kept = c_spot + done(nxt[SPOT, 1], progress)
    gone = c_spot / 2 + nxt[NOWHERE, 0][back]
    return (1 - m.p_down) * kept + m.p_down * gone


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
    nxt = _solve(m, steps - 1, units, seconds_left - steps * m.step_seconds)
    if loc == NOWHERE:
        out = _launches(m, nxt, live, room)
        return min(out, key=lambda k: out[k]), out
    p = (m.p_up, 1 - m.p_down)[room]
    stopped = p * nxt[NOWHERE, 1][durable] + (1 - p) * nxt[NOWHERE, 0][durable]
    if loc == FALLBACK:
        fb_next = p * nxt[FALLBACK, 1] + (1 - p) * nxt[FALLBACK, 0]
        done = max(0, live - m.units(m.step_seconds * m.fallback_speed))
        out = {RUN_FALLBACK: m.fallback_price * m.step_seconds / 3600 + float(fb_next[done]), STOP: float(stopped)}
    else:
        stay = _on_spot(m, nxt, _shifter(units), m.units(m.step_seconds), m.spot_price * m.step_seconds / 3600,
                        _back(m, units))
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
    out = _launches(m, _solve(m, steps - 2, durable + 1, seconds_left - steps * m.step_seconds), durable, room)
    return min(out, key=lambda k: out[k])


def _launches(m: Model, nxt: np.ndarray, work: int, room: bool) -> dict[str, float]:
    """From nowhere, the next layer being `nxt`: wait, launch on the fallback or, with room, on spot."""
    units = nxt.shape[-1] - 1
    p = (m.p_up, 1 - m.p_down)[room]

    def mix(at: int) -> np.ndarray:
        return p * nxt[at, 1] + (1 - p) * nxt[at, 0]

    fb_in = m.units((m.step_seconds - m.changeover_fallback) * m.fallback_speed)
    out = {WAIT: float(mix(NOWHERE)[work]),
           RUN_FALLBACK: m.fallback_price * m.step_seconds / 3600 + float(mix(FALLBACK)[max(0, work - fb_in)])}
    if room:
        out[RUN_SPOT] = float(_on_spot(m, nxt, _shifter(units), m.units(m.step_seconds - m.changeover_spot),
                                       m.spot_price * m.step_seconds / 3600, _back(m, units))[work])
    return out


def _shifter(units: int) -> Callable[[np.ndarray, int], np.ndarray]:
    w = np.arange(units + 1)

    def done(x: np.ndarray, k: int) -> np.ndarray:
        return x[np.maximum(w - k, 0)]
    return done


def _back(m: Model, units: int) -> np.ndarray:
    """Each work level after an interruption: the work since the last checkpoint is to do again."""
    return np.minimum(np.arange(units + 1) + m.units(max(0.0, m.unsaved_seconds - m.step_seconds / 2)), units)
