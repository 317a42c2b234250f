"""A reference policy for bench/deadline.py, not the product's: spot, on-demand or a wait, chosen by
the expected cost of the rest of the window under a model of spot told the trace's statistics.

The window left before the deadline is cut into steps of one tick. At each step the run is nowhere,
on spot or on on-demand (never interrupted), and spot has room or not. Spot's room comes and goes as
a two-state Markov chain: room lasts a mean of `up_seconds` and, once gone, comes back after a mean
of `down_seconds` (bench/deadline.py gives it the trace's own mean periods: what an online policy
could learn about a zone, not its future). A launch pays its changeover, billed, before any work; an
interruption loses, on average, `unsaved_seconds` of work and leaves the run nowhere; a stop keeps
only the durable work and leaves the run nowhere until the next tick (a move is a stop, then a
launch). Work left at the deadline, one tick early, costs MISS_PENALTY per unit, far above any price.

The expected cost of every state is computed backwards from the deadline (dynamic programming, the
work in tenths of a tick); the choice is the cheapest action now. The table depends only on the
model and is kept for the ticks after (`_CACHE`).
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
_CACHE: dict[Model, np.ndarray] = {}
_CACHE_SIZE = 64


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

    def rounded(self) -> Model:
        """Two significant figures for the measured times, so that the table is reused across ticks."""
        return replace(self, up_seconds=_sig(self.up_seconds), down_seconds=_sig(self.down_seconds),
                       fallback_speed=_sig(self.fallback_speed), unsaved_seconds=_sig(self.unsaved_seconds),
                       changeover_spot=_sig(self.changeover_spot),
                       changeover_fallback=_sig(self.changeover_fallback))

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


def _sig(x: float) -> float:
    if not math.isfinite(x) or x <= 0:
        return x
    return float(f"{x:.2g}")


def table(m: Model, steps: int, work_units: int) -> np.ndarray:
    """V[t, loc, room, w]: the least expected cost with t steps left, at `loc`, spot with room
    (1) or not, and w units of work left; reused from the cache where it is big enough."""
    cached = _CACHE.get(m)
    if cached is not None and cached.shape[0] > steps and cached.shape[3] > work_units:
        return cached
    if cached is not None:
        steps, work_units = max(steps, cached.shape[0] - 1), max(work_units, cached.shape[3] - 1)
    v = _solve(m, steps, work_units)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[m] = v
    return v


def _solve(m: Model, steps: int, work_units: int) -> np.ndarray:
    w = np.arange(work_units + 1)
    v = np.empty((steps + 1, 3, 2, work_units + 1))
    v[0] = (w * MISS_PENALTY)[None, None, :]

    def done(x: np.ndarray, k: int) -> np.ndarray:
        """x with k more units of work done."""
        return x[np.maximum(w - k, 0)]

    full, spot_in = m.units(m.step_seconds), m.units(m.step_seconds - m.changeover_spot)
    fb_full = m.units(m.step_seconds * m.fallback_speed)
    fb_in = m.units((m.step_seconds - m.changeover_fallback) * m.fallback_speed)
    lost = m.units(max(0.0, m.unsaved_seconds - m.step_seconds / 2))
    c_spot, c_fb = m.spot_price * m.step_seconds / 3600, m.fallback_price * m.step_seconds / 3600
    back = np.minimum(w + lost, work_units)
    for t in range(1, steps + 1):
        nxt = v[t - 1]
        for room in (0, 1):
            p = (m.p_up, 1 - m.p_down)[room]  # room at the next step
            idle = p * nxt[NOWHERE, 1] + (1 - p) * nxt[NOWHERE, 0]
            fb_next = p * nxt[FALLBACK, 1] + (1 - p) * nxt[FALLBACK, 0]
            best = np.minimum(idle, c_fb + done(fb_next, fb_in))
            if room:
                best = np.minimum(best, _on_spot(m, nxt, done, spot_in, c_spot, back))
            v[t, NOWHERE, room] = best
            v[t, FALLBACK, room] = np.minimum(c_fb + done(fb_next, fb_full), idle)
        v[t, SPOT, 1] = np.minimum(_on_spot(m, nxt, done, full, c_spot, back), v[t, NOWHERE, 1])
        v[t, SPOT, 0] = v[t, NOWHERE, 0]
    return v


def _on_spot(m: Model, nxt: np.ndarray, done: Callable[[np.ndarray, int], np.ndarray], progress: int, c_spot: float,
             back: np.ndarray) -> np.ndarray:
    """A step on spot: it lasts (the work is done) or it is interrupted (half the step billed, the
    work since the last checkpoint lost, nowhere and no room after)."""
    kept = c_spot + done(nxt[SPOT, 1], progress)
    gone = c_spot / 2 + nxt[NOWHERE, 0][back]
    return (1 - m.p_down) * kept + m.p_down * gone


def choose(m: Model, seconds_left: float, live_work: float, durable_work: float, loc: int,
           room: bool) -> tuple[str, dict[str, float]]:
    """The cheapest action now and every action's expected cost to finish, in dollars. A live
    attempt can stay or stop: a stop keeps only `durable_work` and leaves the run nowhere until the
    next tick (a move is a stop, then a launch), so its figure is that of the best launch, or wait,
    a tick later (`then`). `live_work` counts the live attempt's unsaved work as done (spot seconds, both)."""
    m = m.rounded()
    steps = max(0, int(seconds_left // m.step_seconds) - 1)  # finish a tick early: a move takes one more
    live, durable = int(math.ceil(live_work / m.unit)), int(math.ceil(durable_work / m.unit))
    if steps <= 1:
        return RUN_FALLBACK, {}
    v = table(m, steps, max(live, durable) + 1)
    if loc == NOWHERE:
        out = _launches(m, v, steps, live, room)
        return min(out, key=lambda k: out[k]), out
    p = (m.p_up, 1 - m.p_down)[room]
    stopped = p * v[steps - 1, NOWHERE, 1][durable] + (1 - p) * v[steps - 1, NOWHERE, 0][durable]
    if loc == FALLBACK:
        fb_next = p * v[steps - 1, FALLBACK, 1] + (1 - p) * v[steps - 1, FALLBACK, 0]
        stay = m.fallback_price * m.step_seconds / 3600 + float(fb_next[max(0, live - m.units(m.step_seconds
                                                                                               * m.fallback_speed))])
        out = {RUN_FALLBACK: stay, STOP: float(stopped)}
    else:
        stay = float(_on_spot(m, v[steps - 1], _shifter(v), m.units(m.step_seconds),
                              m.spot_price * m.step_seconds / 3600, _back(m, v))[live])
        out = {RUN_SPOT: stay, STOP: float(stopped)}
    return min(out, key=lambda k: out[k]), out


def then(m: Model, seconds_left: float, durable_work: float, room: bool) -> str:
    """After a stop: what the run is expected to do a tick later, from nowhere (spot where it has
    room now, else the fallback or a wait)."""
    m = m.rounded()
    steps = max(0, int(seconds_left // m.step_seconds) - 2)
    durable = int(math.ceil(durable_work / m.unit))
    if steps <= 1:
        return RUN_FALLBACK
    out = _launches(m, table(m, steps, durable + 1), steps, durable, room)
    return min(out, key=lambda k: out[k])


def _launches(m: Model, v: np.ndarray, steps: int, work: int, room: bool) -> dict[str, float]:
    """From nowhere, with `steps` left: wait, launch on the fallback or, with room, on spot."""
    nxt = v[steps - 1]
    p = (m.p_up, 1 - m.p_down)[room]

    def mix(at: int) -> np.ndarray:
        return p * nxt[at, 1] + (1 - p) * nxt[at, 0]

    fb_in = m.units((m.step_seconds - m.changeover_fallback) * m.fallback_speed)
    out = {WAIT: float(mix(NOWHERE)[work]),
           RUN_FALLBACK: m.fallback_price * m.step_seconds / 3600 + float(mix(FALLBACK)[max(0, work - fb_in)])}
    if room:
        out[RUN_SPOT] = float(_on_spot(m, nxt, _shifter(v), m.units(m.step_seconds - m.changeover_spot),
                                       m.spot_price * m.step_seconds / 3600, _back(m, v))[work])
    return out


def _shifter(v: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    w = np.arange(v.shape[3])

    def done(x: np.ndarray, k: int) -> np.ndarray:
        return x[np.maximum(w - k, 0)]
    return done


def _back(m: Model, v: np.ndarray) -> np.ndarray:
    """Each work level after an interruption: the work since the last checkpoint is to do again."""
    top = v.shape[3] - 1
    return np.minimum(np.arange(top + 1) + m.units(max(0.0, m.unsaved_seconds - m.step_seconds / 2)), top)
