"""Futures: the rest of a run simulated a few hundred times, for its spread of time and cost. Pure.

Each future walks the run attempt by attempt on a `Lane` (one provider as measured) until the work
left is done:

- an attempt pays the changeover (launch to the first step of work, billed) and then works at the lane's
  rate until the work is done, an interruption comes, the session limit or the quota ends it; where
  the worker has said what a save costs, the work is done once its final save is durable, and the
  saves ahead are counted whole from its last checkpoint (the rate only spreads their cost);
- time to interruption (from the launch: a changeover can be interrupted too) is exponential with
  the lane's failure rate, and that rate is itself drawn,
  once per future, from the Gamma posterior the MTBF estimate comes from
  (as reconciler.checkpoint_policy.estimate_mtbf: the interruptions seen over the machine time
  seen, with half a pseudo-interruption of the prior at most): a provider measured over two interruptions
  gives futures far apart, one measured over fifty gives them close;
- an interruption loses the work since the last checkpoint (progress is durable only at whole
  checkpoint intervals) and is followed by a wait for capacity (exponential, its mean drawn per
  future like the failure rate) and a new changeover; a session limit or the end of a quota loses
  nothing (the worker saves first);
- when the quota is spent the run moves to the fallback lane if there is one, else waits for the
  refill; with a deadline and a fallback, an interrupted run moves to the fallback instead of
  waiting when, after the wait, the move there (a changeover) and two more changeovers of slack would
  no longer fit before the deadline (the safety net of
  the placement policy, reconciler.planner.outlook.deadline; its other rules are not replayed);
- cost is attempt hours times the lane's price.

Time runs from the moment the inputs describe. The random draws are seeded by the caller (the
run id), so the same inputs give the same figures.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

FUTURES = 400
# The evidence counted as this share of itself (failure rates, waits): 1 keeps the MTBF's own
# posterior. Lower values were tried on bench/forecast.py's tuning traces and widened nothing that
# helped (docs/performance.md).
DISCOUNT = 1.0
WAIT_DISCOUNT = 1.0
# The prior weighs this many interruptions at most: half, a Gamma prior of shape 1/2 (Jeffreys'
# for a rate) with the prior's mean. Weighed as one, it outweighed hours of evidence (a 24 h
# provider read as a 9 h one after 4 h without interruption: docs/performance.md).
PRIOR_EVENTS = 0.5
MAX_ATTEMPTS = 5000  # a future that has not finished after this many attempts counts as never


@dataclass(frozen=True)
class Evidence:
    """What a rate of events rests on: events seen over a span of exposure, and the prior's mean
    gap between events (a reliable provider's is a month): the posterior of
    reconciler.checkpoint_policy.estimate_mtbf, its prior weighed as PRIOR_EVENTS events."""

    events: float
    exposure_seconds: float
    prior_seconds: float

    def gamma(self, discount: float = 1.0) -> tuple[float, float]:
        """(shape, rate) of the posterior of the event rate, per second. `discount` counts the
        evidence as that share of itself: the same mean, a wider spread."""
        if self.events <= 0:
            return PRIOR_EVENTS, self.exposure_seconds * discount + PRIOR_EVENTS * self.prior_seconds
        weight = PRIOR_EVENTS * min(self.prior_seconds, self.exposure_seconds / self.events)
        return (self.events * discount + weight / self.prior_seconds,
                self.exposure_seconds * discount + weight)

    @property
    def mean_seconds(self) -> float:
        shape, rate = self.gamma()
        return rate / shape


@dataclass(frozen=True)
class Lane:
    """One provider as the futures see it."""

    provider: str
    price: float  # $/h
    rate: float  # steps per second of attempt time, checkpoints included
    interruptions: Evidence  # machine time between interruptions or session ends the provider made
    wait: Evidence  # after an interruption: time until the next attempt is launched
    changeover_seconds: float  # launch to the first step of work, billed, paid on every attempt
    checkpoint_steps: float  # steps between durable checkpoints: what an interruption can lose
    session_seconds: float | None = None  # an attempt's limit (Kaggle's 12 h), the save margin taken off
    quota_seconds: float | None = None  # attempt seconds its quota or credits still carry (None: no limit)
    refill_in_seconds: float | None = None  # when the quota refills, from now
    refill_seconds: float | None = None  # attempt seconds a refill gives
    refill_every_seconds: float = 7 * 24 * 3600.0  # and again this long after
    save_seconds: float = 0.0  # one save until durable (the worker's word; 0: unknown): see _need


@dataclass(frozen=True)
class Run:
    remaining_steps: int
    spent_usd: float = 0.0
    deadline_in_seconds: float | None = None  # from now
    budget_usd: float | None = None  # the whole budget (spent included)
    live_seconds: float | None = None  # a live attempt has run this long (no changeover to pay); None: to launch
    waiting: bool = False  # the last attempt was interrupted and none runs: a wait for capacity comes first
    unsaved_steps: float = 0.0  # of the live attempt's work done, the steps since its last checkpoint


@dataclass(frozen=True)
class Spread:
    futures: int
    unfinished: int  # futures that had not finished after MAX_ATTEMPTS attempts
    seconds: tuple[float, float]  # P50, P90 of the time to finish, from now (inf: beyond the futures)
    cost_usd: tuple[float, float]  # P50, P90 of the whole run's cost, spent included
    p_deadline: float | None  # the share of futures that finish by the deadline
    p_budget: float | None  # the share whose whole cost is within the budget


def seed_of(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def spread(run: Run, lane: Lane, fallback: Lane | None = None, *, seed: int, futures: int = FUTURES) -> Spread:
    """P50 and P90 of the time and cost to finish, and the chance of meeting the deadline and budget."""
    rng = np.random.default_rng(seed)
    t, cost = walk(run, (lane,) if fallback is None else (lane, fallback), rng, futures)
    total = run.spent_usd + cost
    done = np.isfinite(t)
    return Spread(
        futures=futures, unfinished=int((~done).sum()),
        seconds=(_quantile(t, 0.5), _quantile(t, 0.9)),
        cost_usd=(_quantile(np.where(done, total, np.inf), 0.5), _quantile(np.where(done, total, np.inf), 0.9)),
        p_deadline=None if run.deadline_in_seconds is None else float((t <= run.deadline_in_seconds).mean()),
        p_budget=None if run.budget_usd is None else float((done & (total <= run.budget_usd + 1e-9)).mean()))


def walk(run: Run, lanes: tuple[Lane, ...], rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Seconds to finish (inf: never, within MAX_ATTEMPTS) and dollars spent from now, per future."""
    w = _World(run, lanes, rng, n)
    if run.waiting and run.live_seconds is None:
        w.after_interruption(np.flatnonzero(w.active))
    for attempt in range(MAX_ATTEMPTS):
        idx = np.flatnonzero(w.active)
        if idx.size == 0:
            break
        w.attempt(idx, live=attempt == 0 and run.live_seconds is not None)
    w.finish_at[w.active] = np.inf
    return w.finish_at, w.cost


class _World:
    """The futures' state, one entry per future; lane parameters indexed by each future's lane."""

    def __init__(self, run: Run, lanes: tuple[Lane, ...], rng: np.random.Generator, n: int) -> None:
        self.run, self.lanes, self.rng = run, lanes, rng
        inf = math.inf
        self.price = np.array([x.price for x in lanes])
        self.rate = np.array([x.rate for x in lanes])
        self.changeover = np.array([x.changeover_seconds for x in lanes])
        self.ckpt = np.array([max(1.0, x.checkpoint_steps) for x in lanes])
        self.save = np.array([max(0.0, min(x.save_seconds, x.checkpoint_steps / x.rate)) for x in lanes])
        self.session = np.array([x.session_seconds or inf for x in lanes])
        self.fail = np.stack([_rates(x.interruptions, rng, n) for x in lanes])  # per second, per future
        self.wait_gamma = np.array([x.wait.gamma(WAIT_DISCOUNT) for x in lanes])  # (shape, rate) per lane
        self.quota = np.array([[inf if x.quota_seconds is None else x.quota_seconds] * n for x in lanes])
        self.refill_at = np.array([[inf if x.refill_in_seconds is None else x.refill_in_seconds] * n for x in lanes])
        self.lane = np.zeros(n, dtype=int)
        self.t, self.cost = np.zeros(n), np.zeros(n)
        self.left = np.full(n, float(run.remaining_steps))
        self.unsaved = np.full(n, float(run.unsaved_steps if run.live_seconds is not None else 0.0))
        self.active = self.left > 0
        self.finish_at = np.zeros(n)

    def attempt(self, idx: np.ndarray, live: bool) -> None:
        """One attempt of each future in `idx`: launch, work until done, interrupted or cut off."""
        lane = self.lane[idx]
        c = np.zeros(idx.size) if live else self.changeover[lane]
        session = self.session[lane] - (self.run.live_seconds or 0.0 if live else 0.0)
        room = np.maximum(0.0, np.minimum(session, self.quota[lane, idx]) - c)  # work time before a save-end
        hit = self.rng.exponential(1.0, idx.size) / self.fail[lane, idx]  # from the launch
        early = hit < c  # interrupted in the changeover: no work done
        need = self._need(idx, lane)
        work = np.where(early, 0.0, np.minimum(need, np.minimum(hit - c, room)))
        done = ~early & (need <= np.minimum(hit - c, room))
        cut = ~done & ~early & (room <= hit - c)  # the session or the quota ends it: the worker saves first
        spent = np.where(early, hit, c + work)
        self.t[idx] += spent
        self.cost[idx] += spent / 3600.0 * self.price[lane]
        self.quota[lane, idx] -= spent
        gained = work * self.rate[lane]
        unsaved = self.unsaved[idx]
        saved = np.floor((unsaved + gained) / self.ckpt[lane]) * self.ckpt[lane] - unsaved
        self.left[idx] -= np.where(done | cut, gained, saved)
        self.unsaved[idx] = 0.0  # every later attempt starts from a checkpoint
        self.finish_at[idx[done]] = self.t[idx[done]]
        self.active[idx[done]] = False
        self._after_cut(idx[cut])
        self.after_interruption(idx[~done & ~cut])

    def _need(self, idx: np.ndarray, lane: np.ndarray) -> np.ndarray:
        """Attempt seconds to finish the work left. The rate spreads the saves' cost over the steps
        (1/rate = a step's work + save/ckpt), but the worker pays whole saves: one at each checkpoint
        boundary it crosses, counted from its last checkpoint, and a final one before the completion."""
        left, unsaved, ckpt, save = self.left[idx], self.unsaved[idx], self.ckpt[lane], self.save[lane]
        saves = np.floor((unsaved + left) / ckpt + 1e-9) + 1.0
        return left * (1.0 / self.rate[lane] - save / ckpt) + save * np.where(save > 0, saves, 0.0)

    def _after_cut(self, idx: np.ndarray) -> None:
        """A spent quota: on to the fallback, else wait for the refill (never, without one)."""
        spent = idx[self.quota[self.lane[idx], idx] <= 1e-6]
        if spent.size == 0:
            return
        on_first = self.lane[spent] == 0
        if len(self.lanes) > 1:
            self.lane[spent[on_first]] = 1
            spent = spent[~on_first]
        lane = self.lane[spent]
        at = self.refill_at[lane, spent]
        self.t[spent] = np.maximum(self.t[spent], at)
        self.quota[lane, spent] = [self.lanes[x].refill_seconds or 0.0 for x in lane]
        self.refill_at[lane, spent] = at + [self.lanes[x].refill_every_seconds for x in lane]
        never = spent[~np.isfinite(self.t[spent]) | (self.quota[lane, spent] <= 0)]
        self.finish_at[never], self.active[never] = np.inf, False

    def after_interruption(self, idx: np.ndarray) -> None:
        """The wait for capacity; with a deadline and a fallback, the move there when, after the
        wait, the rest there plus three of its changeovers (the move and two of slack) would not fit."""
        lane = self.lane[idx]
        shape, rate = self.wait_gamma[lane, 0], self.wait_gamma[lane, 1]
        back = np.maximum(self.rng.gamma(shape, 1.0 / rate), 1e-12)  # each wait's own rate: heavy-tailed waits
        wait = self.rng.exponential(1.0, idx.size) / back
        deadline = self.run.deadline_in_seconds
        if deadline is not None and len(self.lanes) > 1:
            fb = self.lanes[1]
            need = self.left[idx] / fb.rate + 3 * fb.changeover_seconds
            move = (lane == 0) & (self.t[idx] + wait + need > deadline)
            self.lane[idx[move]] = 1
            wait = np.where(move, 0.0, wait)
        self.t[idx] += wait


def _rates(e: Evidence, rng: np.random.Generator, n: int) -> np.ndarray:
    """Per future, a rate of events drawn from the evidence's posterior (per second, > 0), the
    evidence discounted (DISCOUNT)."""
    shape, rate = e.gamma(DISCOUNT)
    return np.maximum(rng.gamma(shape, 1.0 / rate, n), 1e-12)


def _quantile(x: np.ndarray, q: float) -> float:
    """The `q` quantile as a value some future reached (the lower one), inf when beyond them."""
    k = int(math.ceil(q * len(x))) - 1
    return float(np.partition(x, k)[k])
