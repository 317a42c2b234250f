"""The placement policy: where a run with a deadline should be now, given what was measured. Pure.

The planner hands a `Situation` (the time left, the work left, and every allowed provider as an
`Option` with its price, rate, reliability and whether it can take a worker now) to a
`PlacementPolicy`, and launches, waits or moves as the `Choice` says. The product's policy is
`choose`; benchmarks pass others (bench/deadline.py runs the published baselines through the same
loop).

`choose` follows Wu et al., "Can't Be Late" (NSDI'24): take cheap capacity whenever it is there,
keep a reliable fallback in reserve, and use the fallback only as much as the deadline needs.
Its rules, in order:

1. Infeasible: not even the fastest option can finish the rest by the deadline, or no option can
   finish it within what is left of the budget: say so at once, and go on as fast as allowed (the
   checkpoints keep their value if the deadline moves; the deadline guard stops the run when it comes).
2. Safety net: the slack is the time left beyond what the rest needs on the reliable fallback.
   Cheap capacity is used while the slack covers two changeovers to the fallback plus the next
   interruption there (the work since the last checkpoint: the worst this run has lost, else two
   changeovers). Below that, the run goes to the fallback and stays to the end; a wait is judged
   on the slack a tick later, when the next look comes. The status also says how much the rest
   is expected to lose on cheap capacity (interruptions from the measured
   MTBF, each a changeover plus half a checkpoint interval of work).
3. Exploit: a live attempt on cheap capacity stays there while rule 2 allows it.
4. Cheap first: free capacity (quota, credits), then spot, whenever one can take a worker now and
   rule 2 allows it.
5. Kept slack: with nothing cheap to run on, go to the fallback only while the slack is below
   what is kept for the rest: the job's own slack ratio (its slack at the first launch over its
   whole work on the fallback), at most KEPT_PER_HOUR, times the rest's hours there. Uniform
   Progress's straight line keeps the whole ratio (a run behind the line has less slack per hour
   of rest than it started with); with a loose deadline that buys on-demand hours early that
   waiting for spot would have saved. A run on the fallback leaves it for cheap capacity that can
   start when rule 2 allows it on the slack it will have once it has left (the way back costs a
   changeover, the move a tick, and the stop may lose the work since the last checkpoint) and the
   slack is above what is kept by two changeovers (the paper's hysteresis); with nothing cheap,
   it stops there and waits (`Choice.leave`) once that slack is above what is
   kept by LEAVE_LEAD_SECONDS, after the job's first hour. Without that, a run sent to the
   fallback stayed there until cheap capacity came back, however far ahead it was.
6. A move must pay: the run leaves the fallback for cheap capacity only when the stay there is
   expected to save more than the stop may lose (`stay_gain`: from the MTBF's record and the
   checkpoint interval, the work kept before the next interruption, less the stay's price and
   both ends of the trip; the stop: the work since the last checkpoint, where its save is cut
   short), and stops to wait only when such a stay would also pay for a wait in vain (the way
   back), at a tick with at most half a checkpoint interval unsaved.

With `deadline_policy: lookahead` in reconciler.yaml (`Situation.lookahead`), rules 3 to 6 give way,
for priced spot, to the expected-cost lookahead (`_looked_ahead`, reconciler.planner.outlook.lookahead);
rule 1 and rule 2's safety net of two changeovers still hold, a run takes spot only where the net
would survive the worst interruption there (`_way_in_covered`), and free capacity keeps the rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from reconciler.planner.outlook import lookahead
from reconciler.planner.outlook.reliability import PRIOR_ROOM_WAIT_SECONDS, RoomShape
from status.models import hours as _h

RISK_OK = "on track"
RISK_AT_RISK = "at risk"
RISK_INFEASIBLE = "infeasible"
KEPT_PER_HOUR = 0.4  # most slack kept per hour of the rest (Uniform Progress keeps the job's whole ratio)
LEAVE_LEAD_SECONDS = 1800.0  # a run leaves the fallback to wait only this far above what is kept
LEAVE_AFTER_SECONDS = 3600.0  # nor before the job's first hour: a rate from minutes of record misleads
INFEASIBLE_MARGIN = 1.1  # said only when the rest needs this much more than the time left: rates are estimates


@dataclass(frozen=True)
class Option:
    """One allowed provider, as the policy sees it."""

    provider: str
    price: float  # $/h
    interruptible: bool  # spot: its machines can be taken away
    free: bool  # costs no money (a quota, credits, or price 0)
    available: bool  # could take a worker of this job now
    rate: float | None  # steps per second of attempt time for this job here; None: unknown
    rate_measured: bool  # False: borrowed from the provider where the job is fastest
    mtbf_seconds: float  # mean attempt time between interruptions or session ends
    changeover_seconds: float  # launch to first heartbeat
    hours_left: float | None = None  # attempt hours its quota or credits can still carry (None: no limit)
    mtbf_shape: float = 1.0  # the interruptions the MTBF rests on, weighed by age, its prior's included
    room_wait_seconds: float = PRIOR_ROOM_WAIT_SECONDS  # mean time it stays without room once it has none
    room_shape: RoomShape = RoomShape()  # how its room periods spread, and how long it has had room now
    # The MTBF the lookahead plans with: the same record's posterior mean, its prior never capped
    # (reliability.expected_mean); None: mtbf_seconds.
    mtbf_expected_seconds: float | None = None

    def hours_for(self, steps: int, moving: bool = True) -> float | None:
        """Attempt hours to do `steps` here, with the changeover when the run must move here."""
        if self.rate is None:
            return None
        return (steps / self.rate + (self.changeover_seconds if moving else 0.0)) / 3600.0

    def survival(self, seconds: float) -> float:
        """The chance that a machine here lasts `seconds` from its launch: exponential times between
        interruptions whose rate is as uncertain as the MTBF's record (a Gamma posterior resting on
        `mtbf_shape` interruptions, whose Laplace transform this is)."""
        if not math.isfinite(self.mtbf_seconds):
            return 1.0
        if self.mtbf_seconds <= 0 or self.mtbf_shape <= 0:
            return 0.0
        return (1.0 + seconds / (self.mtbf_shape * self.mtbf_seconds)) ** -self.mtbf_shape

    def expected_stay(self, seconds: float) -> float:
        """Expected machine time here, up to `seconds`, before an interruption: the integral of `survival`."""
        if not math.isfinite(self.mtbf_seconds):
            return seconds
        if self.mtbf_seconds <= 0 or self.mtbf_shape <= 0:
            return 0.0
        a, b = self.mtbf_shape, self.mtbf_shape * self.mtbf_seconds
        if abs(a - 1.0) < 1e-9:
            return b * math.log1p(seconds / b)
        return b / (a - 1.0) * (1.0 - (1.0 + seconds / b) ** (1.0 - a))

    def unsaved_seconds(self, checkpoint_seconds: float | None) -> float:
        """The work an interruption here loses, on average: half the checkpoint interval (a
        changeover stands in for it while the interval is unknown)."""
        return checkpoint_seconds / 2 if checkpoint_seconds else self.changeover_seconds

    def loss_seconds(self, checkpoint_seconds: float | None) -> float:
        """What one interruption here costs, on average: the work lost and the way back."""
        return self.changeover_seconds + self.unsaved_seconds(checkpoint_seconds)

    def expected_losses_hours(self, steps: int, checkpoint_seconds: float | None = None) -> float:
        """Hours expected to be lost to interruptions while doing `steps` here (the measured MTBF)."""
        hours = self.hours_for(steps, moving=False) or 0.0
        return hours * 3600.0 / self.mtbf_seconds * self.loss_seconds(checkpoint_seconds) / 3600.0


@dataclass(frozen=True)
class Situation:
    job: str
    now: float
    deadline: float | None
    budget_left: float | None  # dollars, after what is spent
    done_steps: int
    target_steps: int | None
    window_start: float  # when the job first launched (the uniform-progress line starts there)
    current: str | None  # provider of the live attempt, None when nothing runs
    options: tuple[Option, ...]  # allowed providers, best first (free, then cheapest)
    lost_work_seconds: float | None = None  # the most an interruption has cost this run: lost work + relaunch
    checkpoint_seconds: float | None = None  # attempt seconds between checkpoints (declared or measured); None: unknown
    unsaved_seconds: float = 0.0  # the live attempt's work since its last checkpoint (lost if a stop's save is cut)
    rate_stated: bool = False  # the options' rates are the manifest's step_seconds (nothing measured yet)
    tick_seconds: float = 30.0  # the daemon's pace: the policy is asked once a tick
    lookahead: bool = False  # reconciler.yaml's `deadline_policy: lookahead`: spot, fallback or wait by expected cost

    @property
    def remaining_steps(self) -> int | None:
        return None if self.target_steps is None else max(0, self.target_steps - self.done_steps)


@dataclass(frozen=True)
class Choice:
    provider: str | None  # where the run should be now; None: wait
    reason: str  # one line for the status: "headline: figures", e.g. "on spot: 14 h of slack covers ..."
    risk: str = ""  # RISK_OK, RISK_AT_RISK, RISK_INFEASIBLE, or "" without a deadline
    slack_hours: float | None = None
    leave: bool = False  # with provider None: stop the live attempt and wait (else None keeps it)

    @property
    def headline(self) -> str:
        """The reason without its figures, which move every tick: what the job's message may carry
        (a message that changed every tick committed every tick)."""
        return self.reason.split(":", 1)[0]


PlacementPolicy = Callable[[Situation], Choice]


def first_available(s: Situation, why: str) -> Choice:
    """No deadline to plan for (or nothing measured yet): stay, else the best option that can start."""
    if s.current is not None:
        return Choice(s.current, f"on {s.current}: {why}")
    for o in s.options:
        if o.available:
            return Choice(o.provider, f"{o.provider} is the {_kind(o, s.options)} that can start now ({why})")
    names = ", ".join(o.provider for o in s.options) or "no provider"
    return Choice(None, f"waiting for capacity on {names}")


def _kind(o: Option, options: tuple[Option, ...]) -> str:
    """What the option costs, in exact words: free only at a price of 0; credits or a quota that
    pay for a priced option make it prepaid, not free."""
    if o.price == 0:
        return "free option"
    rate = f"${o.price:.2f}/h" if round(o.price, 2) == o.price else f"${o.price:g}/h"
    if o.free:
        return f"prepaid option ({rate}, from its credits or quota)"
    if all(o.price <= x.price for x in options if x.available):
        return f"cheapest option ({rate})"
    return f"first option in placement order ({rate})"


def fallback_of(s: Situation) -> Option | None:
    """The reliable option the deadline rests on: not interruptible, rate known, fastest then cheapest."""
    reliable = [o for o in s.options if not o.interruptible and o.rate is not None and not o.free]
    reliable = reliable or [o for o in s.options if not o.interruptible and o.rate is not None]
    if not reliable:
        return None
    return min(reliable, key=lambda o: (o.hours_for(1_000_000) or 0.0, o.price))


def infeasible(s: Situation, remaining: int) -> str:
    """Why no option can finish the rest by the deadline within the budget, or ""."""
    assert s.deadline is not None
    left = (s.deadline - s.now) / 3600.0
    timed = [(o.hours_for(remaining, o.provider != s.current) or 0.0, o) for o in s.options if o.rate is not None]
    if timed and min(h for h, _ in timed) > left * INFEASIBLE_MARGIN:
        h, o = min(timed, key=lambda x: x[0])
        basis = "the manifest's step_seconds" if s.rate_stated else "the measured rate"
        return (f"infeasible: the rest needs at least {_h(h)} (on {o.provider}, at {basis}) and "
                f"{_h(max(0.0, left))} are left before the deadline; move the deadline or allow faster providers")
    if s.budget_left is not None:
        cost = [(h * o.price, o) for h, o in timed if h <= left]
        if cost and min(c for c, _ in cost) > s.budget_left:
            c, o = min(cost, key=lambda x: x[0])
            return (f"infeasible: finishing by the deadline costs at least ${c:.2f} (on {o.provider}) and "
                    f"${max(0.0, s.budget_left):.2f} of the budget is left; raise budget_usd or move the deadline")
    return ""


def choose(s: Situation) -> Choice:
    """The product's policy (see the module's docstring)."""
    remaining = s.remaining_steps
    if s.deadline is None or remaining is None:
        return first_available(s, "no deadline to plan for")
    if not any(o.rate is not None for o in s.options):
        return first_available(s, "rate not measured yet")
    why_not = infeasible(s, remaining)
    fb = fallback_of(s)
    if why_not:
        return _best_effort(s, fb, why_not)
    left = (s.deadline - s.now) / 3600.0
    if fb is None:  # nothing reliable to fall back on: cheap capacity is all there is
        choice = first_available(s, "no reliable provider to fall back on")
        return Choice(choice.provider, choice.reason, RISK_AT_RISK)
    on_fb = s.current == fb.provider
    need = fb.hours_for(remaining, moving=not on_fb) or 0.0
    slack = left - need
    reserve = 2 * fb.changeover_seconds / 3600.0
    risk = RISK_OK if slack > reserve else RISK_AT_RISK
    if not any(o.price < fb.price or o.free for o in s.options if o is not fb):  # nothing cheaper to wait for
        choice = first_available(s, f"nothing allowed is cheaper; {_h(slack)} of slack")
        return Choice(choice.provider, choice.reason, risk, slack)

    # Leaving the fallback is judged on the slack the run will have once it has left: the way back
    # is a changeover again (judged on today's slack, runs flapped off the fallback and straight
    # back to it), the move takes a tick (the worker stops on one, the launch comes on the next),
    # and the stop may lose the work since the last checkpoint, where its save is cut short (as
    # `_stop_loss` counts it). Without the last two, a run left on-demand with 11 minutes of slack
    # for spot and missed its deadline (bench/deadline.py, us-west-2b, 2023, 1.5 W, rotation 22).
    stop_cost = (2 * fb.changeover_seconds + s.tick_seconds + s.unsaved_seconds) / 3600
    off_fb = left - (fb.hours_for(remaining, moving=True) or 0.0) - stop_cost

    def covers(o: Option) -> tuple[bool, str]:
        """Cheap capacity is worth its risk while the slack covers the next interruption there:
        the work since the last checkpoint (the worst seen, else two changeovers) and the way in."""
        room = off_fb if on_fb else slack
        way_in = 0.0 if o.provider == s.current else o.changeover_seconds / 3600
        expected = o.expected_losses_hours(remaining, s.checkpoint_seconds) + way_in
        if room > reserve + expected:
            return True, f"{_h(room)} of slack covers the expected {_h(expected)} of losses"
        lost = max(s.lost_work_seconds or 0.0, 2 * o.changeover_seconds) / 3600
        return room > reserve + way_in + lost, (f"{_h(room)} of slack covers one more interruption "
                                               f"({_h(way_in + lost)}; {_h(expected)} expected over the rest)")

    spot = _lookahead_spot(s, fb)
    if s.lookahead and spot is not None and remaining > 0:  # at the target, the live attempt saves its last steps
        return _looked_ahead(s, spot, fb, slack, risk)
    current = next((o for o in s.options if o.provider == s.current), None)
    if current is not None and current is not fb:
        ok, why = covers(current)
        if ok:
            return Choice(current.provider, f"on {current.provider}: {why}", risk, slack)
        return Choice(fb.provider, f"moving to {fb.provider}: {_h(slack)} of slack no longer covers an interruption "
                      f"on {current.provider}", RISK_AT_RISK, slack)
    for o in sorted(s.options, key=lambda o: not o.free):  # free first (quota, credits), then in order
        if o is fb or not o.available or (o.price >= fb.price and not o.free):
            continue
        ok, why = covers(o)
        pays = not on_fb or (_ahead(s, fb, slack, 2 * fb.changeover_seconds)
                             and stay_gain(s, o, fb) > _stop_loss(s, fb))
        if ok and pays:
            return Choice(o.provider, f"on {o.provider}: {why}", risk, slack)
    return _nothing_cheap(s, fb, slack, off_fb, risk)


def _lookahead_spot(s: Situation, fb: Option) -> Option | None:
    """The spot capacity the lookahead weighs against the fallback: the live attempt's, else the
    first priced interruptible option that can start, else the first such one (a wait is for it).
    None where free capacity is in play (its quota runs out, which the lookahead does not model) or
    the live attempt is on other cheap capacity: the rules decide there."""
    if any(o.free and (o.available or o.provider == s.current) for o in s.options if o is not fb):
        return None
    spots = [o for o in s.options if o is not fb and o.interruptible and not o.free and o.price < fb.price
             and o.rate is not None]
    if s.current is not None and s.current != fb.provider:
        return next((o for o in spots if o.provider == s.current), None)
    return next((o for o in spots if o.available), spots[0] if spots else None)


def _looked_ahead(s: Situation, spot: Option, fb: Option, slack: float, risk: str) -> Choice:
    """`deadline_policy: lookahead`: spot, the fallback or a wait, whichever the lookahead
    (reconciler.planner.outlook.lookahead) expects to finish for least, from this run's measured
    rate, checkpoint interval and changeovers, spot's MTBF, its wait for room and how its room periods
    spread (RoomWatch: how many are short, and how long room has been back now). Spot or a wait
    only above the safety net (two changeovers of slack); rule 2's cover for the next interruption
    holds only on the way onto spot (`_way_in_covered`): a run there stays by the lookahead's
    weighing of the risk."""
    assert s.deadline is not None and spot.rate is not None and fb.rate is not None
    model = lookahead.Model(
        step_seconds=s.tick_seconds, spot_price=spot.price, fallback_price=fb.price,
        changeover_spot=spot.changeover_seconds, changeover_fallback=fb.changeover_seconds,
        up_seconds=spot.mtbf_seconds if spot.mtbf_expected_seconds is None else spot.mtbf_expected_seconds,
        down_seconds=spot.room_wait_seconds,
        unsaved_seconds=spot.unsaved_seconds(s.checkpoint_seconds), fallback_speed=fb.rate / spot.rate,
        reserve_seconds=2 * fb.changeover_seconds, short_share=spot.room_shape.short_share,
        room_age_seconds=spot.room_shape.age_seconds)
    loc = lookahead.SPOT if s.current == spot.provider else \
        lookahead.FALLBACK if s.current == fb.provider else lookahead.NOWHERE
    durable = (s.remaining_steps or 0) / spot.rate
    unsaved = s.unsaved_seconds * (fb.rate / spot.rate if loc == lookahead.FALLBACK else 1.0)
    room = spot.available or loc == lookahead.SPOT
    left = s.deadline - s.now
    act, cost = lookahead.decide(model, left, max(0.0, durable - unsaved), durable, loc, room, spot.available)
    said = {lookahead.RUN_SPOT: f"on {spot.provider}", lookahead.RUN_FALLBACK: f"on {fb.provider}",
            lookahead.WAIT: "waiting", lookahead.STOP: f"leaving {s.current}"}
    expected = ", ".join(f"{said[k]} ${cost[k]:.2f}" for k in sorted(cost, key=lambda k: cost[k]))
    figures = f"{_h(slack)} of slack; expected cost to finish: {expected}" if cost else f"{_h(slack)} of slack"
    reserve = 2 * fb.changeover_seconds / 3600.0
    if act == lookahead.RUN_SPOT and slack > reserve and (loc == lookahead.SPOT or _way_in_covered(s, spot, fb, slack)):
        verb = "moving to" if loc == lookahead.FALLBACK else "on"
        return Choice(spot.provider, f"{verb} {spot.provider}: {figures}", risk, slack)
    if act == lookahead.WAIT and slack > reserve:
        if loc == lookahead.NOWHERE:
            return Choice(None, f"waiting for cheaper capacity: {figures}", risk, slack)
        return Choice(None, f"leaving {s.current} to wait for cheaper capacity: {figures}", risk, slack, leave=True)
    if loc == lookahead.SPOT:
        return Choice(fb.provider, f"moving to {fb.provider}: {figures}", risk, slack)
    if loc == lookahead.FALLBACK or fb.available:
        return Choice(fb.provider, f"on {fb.provider}: {figures}", risk, slack)
    return Choice(None, f"waiting for {fb.provider}: {figures}, nothing can start", risk, slack)


def _way_in_covered(s: Situation, spot: Option, fb: Option, slack: float) -> bool:
    """Whether a run that is not on spot keeps, once there, slack above the safety net after the worst
    interruption its checkpoints allow: a whole interval of work lost and a tick until the loop sees
    it. The lookahead prices the average loss; near the deadline the worst one decides, and a run that
    took spot there on 17 minutes of slack, to save cents, missed its deadline (bench/deadline.py,
    us-east-1c, 2023, 2 W, a week watched, rotation 11)."""
    way_in = spot.changeover_seconds
    if s.current == fb.provider:  # the stop takes a tick, may lose the unsaved work, and the way back is longer
        way_in += s.tick_seconds + s.unsaved_seconds + fb.changeover_seconds
    worst = (s.checkpoint_seconds or 2 * spot.changeover_seconds) + s.tick_seconds
    return slack - (way_in + worst) / 3600 > 2 * fb.changeover_seconds / 3600


def stay_gain(s: Situation, o: Option, fb: Option) -> float:
    """Dollars a move from the fallback to cheap option `o` is expected to save over its stay there,
    until the next interruption or the end of the run: the fallback time that the work saved there
    spares, less the stay's price (the way in included) and, if interrupted, the way back to the
    fallback. Work since the last checkpoint is lost, so a stay much shorter than the checkpoint
    interval saves little and pays for both ends of the trip. The expectation is over what the
    MTBF's record allows (`Option.survival`): one early interruption does not rule a provider out."""
    remaining = s.remaining_steps or 0
    if o.rate is None or fb.rate is None or remaining <= 0:
        return 0.0
    work = remaining / o.rate
    end = work + o.changeover_seconds
    interval = s.checkpoint_seconds or 2 * o.changeover_seconds
    k = min(int(work // interval), 10_000)
    kept = sum(interval * o.survival(o.changeover_seconds + i * interval) for i in range(1, k + 1))
    kept += (work - k * interval) * o.survival(end)
    interrupted = 1.0 - o.survival(end)
    price = 0.0 if o.free else o.price
    return (kept * o.rate / fb.rate * fb.price - o.expected_stay(end) * price
            - interrupted * fb.changeover_seconds * fb.price) / 3600


def _nothing_cheap(s: Situation, fb: Option, slack: float, off_fb: float, risk: str) -> Choice:
    """With nothing cheap that may start: the fallback while the slack is below what is kept for
    the rest (`_kept`), else wait; a run on the fallback well above it stops there and waits."""
    reserve = 2 * fb.changeover_seconds / 3600.0
    # A wait lasts a tick before the next look: judged on the slack left then, or a run waiting with
    # its last save to redo found 2 minutes of slack a tick later, too few to launch (bench/deadline.py,
    # us-west-2a, 2022, 2 W).
    if slack - s.tick_seconds / 3600 <= reserve:
        return Choice(fb.provider, f"on {fb.provider} to the end: {_h(slack)} of slack is all that is left",
                      RISK_AT_RISK, slack)
    kept = _h(_kept(s, fb, s.remaining_steps or 0))
    if s.current == fb.provider:
        if fb.rate_measured and s.now - s.window_start >= LEAVE_AFTER_SECONDS and \
                _ahead(s, fb, off_fb, LEAVE_LEAD_SECONDS) and _wait_pays(s, fb):
            return Choice(None, f"leaving {fb.provider} to wait for cheaper capacity: {_h(slack)} of slack, "
                          f"{kept} kept for the rest", risk, slack, leave=True)
        return Choice(fb.provider, f"on {fb.provider} until cheaper capacity can start: {_h(slack)} of slack",
                      risk, slack)
    if not _ahead(s, fb, slack):
        if not fb.available:
            return Choice(None, f"waiting for {fb.provider}: {_h(slack)} of slack, {kept} kept for the rest, "
                          "nothing can start", risk, slack)
        return Choice(fb.provider, f"on {fb.provider}: {_h(slack)} of slack, {kept} kept for the rest, nothing "
                      "cheaper can start", risk, slack)
    return Choice(None, f"waiting for cheaper capacity: {_h(slack)} of slack, {kept} kept for the rest", risk,
                  slack)


def _stop_loss(s: Situation, fb: Option) -> float:
    """Dollars a stop on the fallback may lose: the work since the last checkpoint, where the
    worker's save does not finish within the provider's grace (in the simulation it never does)."""
    return s.unsaved_seconds * fb.price / 3600


def _wait_pays(s: Situation, fb: Option) -> bool:
    """A stop on the fallback to wait pays only if the stay on cheap capacity it waits for is
    expected to pay for the way back to the fallback, which a wait in vain ends with, and for
    the work the stop may lose. A run that is ahead has no hurry: it stops only where less than
    half a checkpoint interval of work is at risk (a later tick would find less)."""
    if s.unsaved_seconds > fb.unsaved_seconds(s.checkpoint_seconds):
        return False
    way_back = fb.changeover_seconds * fb.price / 3600 + _stop_loss(s, fb)
    return any(stay_gain(s, o, fb) > way_back for o in s.options
               if o is not fb and (o.price < fb.price or o.free))


def _best_effort(s: Situation, fb: Option | None, why_not: str) -> Choice:
    """Said at once, and the run goes on as fast as it is allowed to: its checkpoints keep their
    value if the deadline is moved, and the deadline guard stops it when the deadline comes."""
    fastest = [o for o in s.options if o.rate is not None and (o.available or o.provider == s.current)]
    where = s.current if s.current is not None else (fb.provider if fb is not None and fb.available else None)
    if where is None and fastest:
        where = max(fastest, key=lambda o: o.rate or 0.0).provider
    return Choice(where, f"{why_not} (running on {where or 'the first provider that can take it'} meanwhile)",
                  RISK_INFEASIBLE)


def _kept(s: Situation, fb: Option, remaining: int) -> float:
    """Hours of slack kept back for the rest: the job's own slack ratio (its slack at the first
    launch over its whole work on the fallback), at most KEPT_PER_HOUR, times the rest's hours there."""
    assert s.deadline is not None and s.target_steps is not None
    whole = fb.hours_for(s.target_steps, moving=False) or 0.0
    ratio = max(0.0, (s.deadline - s.window_start) / 3600 / whole - 1) if whole > 0 else 0.0
    return min(ratio, KEPT_PER_HOUR) * (fb.hours_for(remaining, moving=False) or 0.0)


def _ahead(s: Situation, fb: Option, slack: float, lead_seconds: float = 0.0) -> bool:
    """The slack (hours) is above what is kept back for the rest, by `lead_seconds`."""
    remaining = s.remaining_steps or 0
    return slack >= _kept(s, fb, remaining) + lead_seconds / 3600
