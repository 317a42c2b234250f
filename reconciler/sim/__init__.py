"""Deterministic simulation of the whole loop (issue 5): the real tick in simulated time
against providers, storage and git that fail on purpose, with invariants checked every step."""

from reconciler.sim.driver import Faults, JobPlan, ProviderPlan, SimConfig, SimCrash, Simulation

__all__ = ["Faults", "JobPlan", "ProviderPlan", "SimConfig", "SimCrash", "Simulation"]
