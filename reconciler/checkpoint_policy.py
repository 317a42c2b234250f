"""How often to checkpoint: the Young/Daly interval from the observed failure rate and the cost
of one checkpoint, plus the exact expected efficiency used to judge any interval.

Why pure: it takes what a worker can know (the save costs it measured, the failure rate the
reconciler measured and passed at launch) and returns an interval, so it is table-tested, and
the worker SDK and the simulation run the same code. `IntervalPolicy` is what the SDK
(`reconciler.worker.run.Run`) asks before each step unless the job pins `checkpoint_every` (or
the script passes `checkpoint_seconds`); the simulation's "young-daly" policy (bench/goodput.py)
asks the same class.

Model (Daly 2006): failures arrive as a Poisson process with mean time between failures M;
each segment computes `tau` seconds and then saves for C seconds; after a failure the run pays
R seconds to restart and redoes the lost segment. The expected wall time of one segment is
`M * exp(R/M) * (exp((tau + C)/M) - 1)`, so the useful fraction is `tau` divided by that.

With background saves (the SDK's), C is the time the training is blocked by a save (the copy to
host memory); the durable write runs alongside the next segment. It delays when a checkpoint
becomes durable, which adds about its length to the work lost per failure whatever the interval
(so it does not move the optimum), but a segment shorter than the write would make the next save
wait for it: the interval is never shorter than the last durable write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_PRIOR_MTBF_SECONDS = 6 * 3600.0
MIN_MTBF_SECONDS = 1.0  # no estimate or interval below this, whatever the record says
FLOOR_SHARE_OF_MTBF = 0.1  # the interval's floor is at most this share of the MTBF


def young_interval(checkpoint_cost: float, mtbf: float) -> float:
    """First-order optimum: sqrt(2 C M)."""
    return math.sqrt(2.0 * checkpoint_cost * mtbf)


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly's higher-order estimate of the optimal compute time between checkpoints."""
    c, m = checkpoint_cost, mtbf
    if c <= 0:
        return 0.0
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def expected_efficiency(interval: float, checkpoint_cost: float, restart_cost: float, mtbf: float) -> float:
    """Useful fraction of wall time for a given interval, under exponential failures."""
    if interval <= 0:
        return 0.0
    m = mtbf
    expected = m * math.exp(restart_cost / m) * math.expm1((interval + checkpoint_cost) / m)
    return interval / expected


def optimal_interval(checkpoint_cost: float, restart_cost: float, mtbf: float) -> float:
    """The interval that maximises `expected_efficiency` (golden-section search; it is unimodal)."""
    lo, hi = 1e-3, 20.0 * mtbf
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa = expected_efficiency(a, checkpoint_cost, restart_cost, mtbf)
    fb = expected_efficiency(b, checkpoint_cost, restart_cost, mtbf)
    for _ in range(200):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = expected_efficiency(b, checkpoint_cost, restart_cost, mtbf)
        else:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = expected_efficiency(a, checkpoint_cost, restart_cost, mtbf)
        if hi - lo < 1e-6 * mtbf:
            break
    return (lo + hi) / 2.0


def estimate_mtbf(exposure_seconds: float, failures: float, prior_mtbf: float = DEFAULT_PRIOR_MTBF_SECONDS) -> float:
    """Mean time between failures: the mean of a Gamma posterior whose prior keeps the prior's mean
    but weighs one pseudo-failure at most, and never more machine time than one interval observed
    (exposure / failures). Without failures it is one pseudo-failure over `prior_mtbf` (quiet time
    lengthens the estimate); failures overturn it within a few. A prior worth its own length of
    exposure (30 days) outweighed twelve interruptions in ten minutes. `failures` may be fractional
    (reconciler.planner.outlook.reliability weighs old ones less)."""
    if failures <= 0:
        return exposure_seconds + prior_mtbf
    weight = min(prior_mtbf, exposure_seconds / failures)  # the prior's pseudo-exposure
    return max(MIN_MTBF_SECONDS, (exposure_seconds + weight) / (failures + weight / prior_mtbf))


def interval_floor(minimum: float, mtbf: float) -> float:
    """The shortest interval: `minimum`, unless failures come so often that a tenth of the MTBF is
    shorter (a once-a-minute floor would lose most work on machines that fail every minute)."""
    return max(MIN_MTBF_SECONDS, min(minimum, FLOOR_SHARE_OF_MTBF * mtbf))


def checkpoint_interval(checkpoint_cost: float, mtbf: float | None, *, minimum: float = 60.0,
                        maximum: float = 6 * 3600.0) -> float:
    """Seconds of compute between checkpoints. Without a failure estimate, use the prior. The
    bounds keep a tiny measured cost from making saves continuous (`interval_floor`) and a huge
    MTBF from leaving hours unsaved (a failure the estimate does not know about still loses at
    most `maximum`)."""
    m = mtbf if mtbf and mtbf > 0 else DEFAULT_PRIOR_MTBF_SECONDS
    return min(maximum, max(interval_floor(minimum, m), daly_interval(max(checkpoint_cost, 0.0), m)))


@dataclass
class IntervalPolicy:
    """The SDK's checkpoint interval, re-estimated as the run learns: each save's measured cost
    (`saved`), the MTBF the reconciler passed at launch (RECONCILER_MTBF_SECONDS), and, optionally,
    interruptions the worker sees itself (`interrupted`, pooled with that MTBF as `estimate_mtbf`
    pools evidence with a prior). Until a save is measured it asks for the first checkpoint after
    the floor (`minimum` seconds, less for a short MTBF), which measures the cost and secures the
    first progress early."""

    mtbf: float | None = None  # what the reconciler measured for the provider; None: the prior
    minimum: float = 60.0
    maximum: float = 6 * 3600.0
    smoothing: float = 0.5  # weight of the newest save in the running cost estimate
    blocked: float | None = None  # seconds the training waits per save (running estimate)
    durable: float | None = None  # seconds from a save's start to its commit (the latest)
    exposure: float = 0.0  # seconds this worker has run, for `interrupted`
    failures: int = 0

    def saved(self, blocked: float | None = None, durable: float | None = None) -> None:
        """Record one save: the time the caller was blocked and/or the time to its commit."""
        if blocked is not None:
            b = max(0.0, blocked)
            self.blocked = b if self.blocked is None else self.smoothing * b + (1 - self.smoothing) * self.blocked
        if durable is not None:
            self.durable = max(0.0, durable)

    def interrupted(self, exposure_seconds: float) -> None:
        """This worker saw an interruption after `exposure_seconds` of running (e.g. a restore)."""
        self.exposure += max(0.0, exposure_seconds)
        self.failures += 1

    @property
    def failure_mtbf(self) -> float:
        """The MTBF in use: the launch figure (or the prior), updated by interruptions seen here."""
        given = self.mtbf if self.mtbf and self.mtbf > 0 else DEFAULT_PRIOR_MTBF_SECONDS
        return estimate_mtbf(self.exposure, self.failures, given) if self.failures else given

    def interval(self) -> float:
        """Seconds of compute between checkpoints (Daly's estimate within the bounds, and not
        shorter than the last durable write); the floor until a save was measured."""
        if self.blocked is None and self.durable is None:
            return interval_floor(self.minimum, self.failure_mtbf)
        tau = checkpoint_interval(self.blocked or 0.0, self.failure_mtbf, minimum=self.minimum, maximum=self.maximum)
        return max(tau, min(self.durable or 0.0, self.maximum))
