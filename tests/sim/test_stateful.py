"""Hypothesis drives random sequences of faults through the real loop (reconciler/sim/stateful.py);
any broken invariant is shrunk to the shortest sequence that shows it. CI runs a modest number
of examples; `python bench/soak.py --stateful N` runs many more."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, settings

from reconciler.sim.stateful import ChaosMachine

logging.getLogger("reconciler").setLevel(logging.CRITICAL)

ChaosMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=20, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestRandomFaultSequencesKeepTheGuarantee = ChaosMachine.TestCase
