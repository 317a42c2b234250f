"""How often to checkpoint: the Young/Daly interval from the observed failure rate and the cost
of one checkpoint, plus the exact expected efficiency used to judge any interval.

Why a pure function: it takes what a worker could know (the checkpoint cost it measured, the
interruptions its run has seen) and returns an interval, so it is table-tested and the simulation
can use it. Today only the simulation calls it (its "young-daly" policy): the worker SDK and
`reconciler exec` do not; they checkpoint every RECONCILER_CHECKPOINT_EVERY steps or every
`checkpoint_seconds` (default 600 s). See docs/simulation.md for the wiring that is missing.

Model (Daly 2006): failures arrive as a Poisson process with mean time between failures M;
each segment computes `tau` seconds and then saves for C seconds; after a failure the run pays
R seconds to restart and redoes the lost segment. The expected wall time of one segment is
`M * exp(R/M) * (exp((tau + C)/M) - 1)`, so the useful fraction is `tau` divided by that.
"""

from __future__ import annotations

import math

DEFAULT_PRIOR_MTBF_SECONDS = 6 * 3600.0


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


def estimate_mtbf(exposure_seconds: float, failures: int, prior_mtbf: float = DEFAULT_PRIOR_MTBF_SECONDS,
                  prior_weight: float = 1.0) -> float:
    """Mean time between failures from what was seen, pulled towards a prior while there is
    little evidence (a gamma prior worth `prior_weight` failures), so one early preemption does
    not make the worker checkpoint every few seconds."""
    return (exposure_seconds + prior_weight * prior_mtbf) / (failures + prior_weight)


def checkpoint_interval(checkpoint_cost: float, mtbf: float | None, *, minimum: float = 60.0,
                        maximum: float = 6 * 3600.0) -> float:
    """Seconds of compute between checkpoints. Without a failure estimate, use the prior. The
    bounds keep a tiny measured cost from making saves continuous and a huge MTBF from leaving
    hours unsaved (a failure the estimate does not know about still loses at most `maximum`)."""
    m = mtbf if mtbf and mtbf > 0 else DEFAULT_PRIOR_MTBF_SECONDS
    return min(maximum, max(minimum, daly_interval(max(checkpoint_cost, 0.0), m)))
