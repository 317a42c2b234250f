"""What storage says about one run: the planner's input from the run store, read by tick and judge."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.drills import Seen


@dataclass(frozen=True)
class RunObservation:
    """What storage says about one run."""

    lease_epoch: int = 0
    durable_step: int = 0
    heartbeat_step: int | None = None
    heartbeat_epoch: int | None = None
    heartbeat_time: float | None = None
    heartbeat_stopping: str | None = None  # the SDK's last beat said why it stops: deadline, signal, request
    heartbeat_save_seconds: float | None = None  # the worker's last save, until durable (its final save's cost)
    heartbeat_save_every_seconds: float | None = None  # from one save's start to the next (unless steps pin them)
    # Each metric's newest value the worker reported (adapters/series.py): shown, never judged.
    heartbeat_metrics: dict[str, float] = field(default_factory=dict, compare=False)
    # The highest step the heartbeat's epoch finished, from the heartbeat and the worker's cheap
    # per-step mark (reached-e<epoch>): what a killed attempt did after its last heartbeat.
    reached_step: int | None = None
    done: bool = False
    done_time: float | None = None  # the worker's clock when it wrote the completion record
    done_step: int | None = None  # the last step, as the completion record says
    # The outputs the completion record lists, (path, bytes) by path (adapters/artifacts.py).
    outputs: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    error: str | None = None  # storage could not be read
    # Since when (reconciler's clock) and over how many observations the heartbeat has not changed;
    # None when the loop has no such memory yet (just started): then nothing is judged stalled.
    heartbeat_unchanged_since: float | None = None
    heartbeat_unchanged_ticks: int = 0
    heartbeat_first_observation: bool = False  # this reconciler process has not watched the run before
    drill: Seen | None = field(default=None, compare=False)  # the records of the drill the status has under way
