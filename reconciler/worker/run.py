"""The worker side of a run: restore, save in the background, heartbeat, complete, stop on notice.

Exit codes follow DESIGN.md §3: 0 after `complete()`; 75 (EX_TEMPFAIL) when the attempt stops on
a preemption notice or on a stop request in the run folder (read at each heartbeat: the only stop
a provider without a cancel API has) after its final checkpoint, or when it finds it was replaced
by a newer attempt (`Superseded`, a SystemExit, so a broad `except Exception` in user code cannot
keep a replaced worker alive).

A known end (RECONCILER_DEADLINE: the job's deadline or the provider's session limit, whichever
comes first) is a notice given in advance: the attempt stops as on SIGTERM once the deadline is
closer than `deadline_margin`, time enough for one more save (see `deadline_margin`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from adapters.storage import CheckpointName, CorruptCheckpoint, Fenced, RunFolder, StorageError
from reconciler.checkpoint_policy import IntervalPolicy
from reconciler.worker import dist, handover, loop, snapshot
from reconciler.worker import sharded as dcp_format
from reconciler.worker.dist import Group
from reconciler.worker.drilling import Drilling
from reconciler.worker.reported import Reported
from reconciler.worker.storefault import StoreFaults
from reconciler.worker.terms import (
    EXIT_INTERRUPTED,
    MAX_DEADLINE_MARGIN,
    RunConfigError,
    Superseded,
    deadline_margin,
    env_float,
    env_int,
)

log = logging.getLogger("reconciler.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Run:
    """One attempt of a run, holding lease epoch `epoch`. Create it with `open_run()`."""

    def __init__(
        self,
        folder: RunFolder,
        run_id: str,
        epoch: int,
        *,
        deadline: float | None = None,
        checkpoint_every: int | None = None,
        checkpoint_seconds: float | None = None,
        mtbf: float | None = None,
        target: int | None = None,
        grace: float = 30.0,
        heartbeat_interval: float = 10.0,
        keep: int = 2,
        install_signal_handlers: bool = True,
        group: Group | None = None,
        sharded: bool = False,
        clock: Callable[[], float] = time.monotonic,
        output_dir: Path | None = None,
        input_dir: Path | None = None,
    ) -> None:
        self.folder = folder
        # What the attempt leaves for others (uploaded at `complete`), and what the jobs it runs
        # after left (downloaded by `open_run`): RECONCILER_OUTPUT_DIR and RECONCILER_INPUT_DIR.
        self.output_dir = output_dir
        self.input_dir = input_dir
        self.group = group or Group()
        self.sharded = sharded
        self._peer_stop = False  # another rank got a stop notice (agreed at the step's collective)
        self._agreed: tuple[int, bool, bool] | None = None  # (step, stop, due) of the last agreement
        self.run_id = run_id
        self.epoch = epoch
        self.deadline = deadline
        self.checkpoint_every = checkpoint_every
        self.checkpoint_seconds = checkpoint_seconds  # pinned seconds between saves; None: `interval`
        self.interval = IntervalPolicy(mtbf=mtbf)  # Young/Daly from the measured save cost and the MTBF
        self._clock = clock  # what the interval is measured with (tests pass a fake one)
        self.target = target
        self.grace = grace
        self.heartbeat_interval = heartbeat_interval
        self.keep = keep
        self.restored: dict[str, Any] = {}
        self.stop_signal: int | None = None
        self.stop_reason: str | None = None  # the reconciler's stop request (stop.json), once seen
        self._stopping: str | None = None  # why the last beat is the last: written for the reconciler
        self._stop_at = 0.0
        self._pool = snapshot.io_pool()
        self._upload: snapshot.Background | None = None
        self._io: Group | None = None  # the sharded writes' own group, made at the first sharded save
        self._upload_error: BaseException | None = None
        self._faults = StoreFaults()  # a full or read-only store is waited out, never a crash
        self._buffers: dict[str, snapshot.HostBuffer] = {}  # reused by each save
        self._last_saved_step: int | None = None
        self._last_save_time = clock()
        self._save_seconds: float | None = None
        self._last_committed: str | None = None
        self._restored_from: str | None = None
        self._last_beat = float("-inf")
        self._progress_tag: str | None = None
        self._reported = Reported(self.folder, self.epoch)
        # A drill's part (reconciler/worker/drilling.py): one process only; under torchrun no drill is taken up.
        self._drill = Drilling(self.folder, self.epoch, clock) if not self.group.distributed else None
        self._closed = False
        self._completed = False
        self._past_target_warned = False
        self._old_handlers: dict[int, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    @property
    def rank(self) -> int:
        """This process's rank under torchrun (0 in a single process)."""
        return self.group.rank

    @property
    def world_size(self) -> int:
        """How many ranks this attempt has (1 in a single process)."""
        return self.group.world

    # ---- stopping --------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._noticed():
            self._stop_at = time.monotonic()
        self.stop_signal = signum

    def _noticed(self) -> bool:
        """A stop notice came (signal, stop request, or another rank's notice); its grace period
        runs from `_stop_at`."""
        return self.stop_signal is not None or self.stop_reason is not None or self._peer_stop

    def _agree(self, step: int) -> tuple[bool, bool]:
        """(stop now, checkpoint due by time) as every rank sees it at `step`: one small collective
        per step under torchrun (cached for the step), so that all ranks stop, and checkpoint, at
        the same step. A stop notice on any rank becomes a notice on all of them."""
        stop = self.stop_requested
        # Rank 0 decides: the other ranks measure no save cost (rank 0 writes), their clocks differ.
        due = self.group.main and self._clock() - self._last_save_time >= self._period()
        if not self.group.distributed:
            return stop, due
        if self._agreed is not None and self._agreed[0] == step:
            return self._agreed[1], self._agreed[2]
        any_stop, any_due, high, neg_low = self.group.max([int(stop), int(due), int(step), -int(step)])
        if high != -neg_low:
            raise RuntimeError(
                f"the ranks are at different steps ({-neg_low} to {high}) in should_checkpoint/exit_if_stopping: "
                "call them once per step, with the same step, on every rank"
            )
        if any_stop and not stop:
            self._peer_stop = True
            self._stop_at = time.monotonic()
        self._agreed = (step, bool(any_stop), bool(any_due))
        return self._agreed[1], self._agreed[2]

    def _check_stop_request(self) -> None:
        """Read stop.json (one small read, at heartbeat cadence). A storage error is not a stop:
        the provider's own notice, the lease and the next heartbeat still stand behind it."""
        if self._noticed():
            return
        try:
            reason = self.folder.stop_request(self.epoch)
        except StorageError as exc:
            log.debug("could not read the stop request: %s", exc)
            return
        if reason is not None:
            self._stop_at = time.monotonic()
            self.stop_reason = reason
            log.warning("stop requested by the reconciler: %s", reason)

    def _grace_left(self) -> float:
        """Seconds left before the provider is expected to kill us."""
        left = float("inf")
        if self._noticed():
            left = self.grace - (time.monotonic() - self._stop_at)
        if self.deadline is not None:
            left = min(left, self.deadline - time.time())
        return left

    @property
    def deadline_margin(self) -> float:
        """How long before RECONCILER_DEADLINE this attempt stops: `grace`, or twice its last save."""
        return deadline_margin(self._save_seconds, self.grace)

    @property
    def stop_requested(self) -> bool:
        """True after SIGTERM/SIGUSR1 or a stop request, or once the deadline is closer than
        `deadline_margin`."""
        if self._noticed():
            return True
        return self.deadline is not None and time.time() >= self.deadline - self.deadline_margin

    def exit_if_stopping(self, step: int, **objects: Any) -> None:
        """When a stop was requested: checkpoint `step` (unless saved already), wait for it, exit 75.

        Call it once per step, after the step's work. It returns normally when no stop is pending.
        Under torchrun every rank calls it with the same step; a notice on any rank stops all.
        """
        if not self._agree(step)[0]:
            return
        reason = self._stop_description()
        log.warning("stopping at step %d (%s): final checkpoint, then exit %d", step, reason, EXIT_INTERRUPTED)
        if objects and self._last_saved_step != step:
            self.save(step, **objects)
        if self._upload is not None:
            self._upload.join(timeout=max(0.0, self._grace_left() - 1.0))
            if self._upload.is_alive():
                # Out of time: the previous checkpoint stands; leave before the provider kills us.
                log.error("the final checkpoint did not finish within the grace period; exiting without it")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_INTERRUPTED)
        self.wait()
        if self._drill is not None and self._last_saved_step is not None:
            self._drill.stopped(self._last_saved_step, time.monotonic() - self._stop_at)
        self._stopping = "signal" if self.stop_signal or self._peer_stop else (
            "request" if self.stop_reason else "deadline")  # read by the reconciler: which kind of end
        self._heartbeat(step, {}, force=True)
        self.close()
        raise SystemExit(EXIT_INTERRUPTED)

    def _stop_description(self) -> str:
        if self.stop_signal is not None:
            return f"signal {signal.Signals(self.stop_signal).name}"
        if self.stop_reason is not None:
            return f"stop requested by the reconciler: {self.stop_reason}"
        if self._peer_stop:
            return "a stop notice on another rank"
        return "deadline near"

    # ---- restore -----------------------------------------------------------------------------------------
    def restore(self, **objects: Any) -> int:
        """Load the newest good checkpoint into `objects`; returns its step, or 0 for a fresh start.

        Every file is verified against the commit record before anything is loaded; a corrupt or
        incomplete checkpoint is withdrawn and the one before it is used. RNG states are restored
        too. Plain values can be read afterwards from `run.restored[name]`. Under torchrun every
        rank calls it and every rank loads the same checkpoint (rank 0 chooses it).
        """
        if not self.sharded:
            for name, obj in objects.items():
                snapshot.restorable(name, obj)
        candidates = self._on_main(self.folder.accepted_checkpoints)
        for ckpt in candidates:
            try:
                loaded = self._read(ckpt)
                problem = None
            except CorruptCheckpoint as exc:
                loaded, problem = None, str(exc)
            if self.group.max([int(problem is not None)])[0]:
                log.warning("checkpoint %s is unusable (%s); falling back to the one before",
                            ckpt.dirname, problem or "a file another rank read is damaged")
                self._on_main(lambda c=ckpt: self.folder.discard_checkpoint(self.epoch, c))
                continue
            step = self._apply(ckpt, loaded, objects)
            self._restored_from = self._last_committed = ckpt.dirname
            self._last_saved_step = step
            self._last_save_time = self._clock()
            log.info("restored step %d from %s", step, self.folder.url("checkpoints/" + ckpt.dirname))
            return self._restored_step(step)
        return self._restored_step(0)

    def _restored_step(self, step: int) -> int:
        if self._drill is not None:
            self._drill.restored(step)
        return step

    def _read(self, ckpt: CheckpointName) -> dict[str, Any]:
        """Read and verify this rank's part of a checkpoint (all of it unless sharded)."""
        if not self.sharded:
            return snapshot.read(self.folder, ckpt, self._pool)
        record = self.folder.read_commit(ckpt)
        if not dcp_format.is_sharded(record):
            raise CorruptCheckpoint(f"{ckpt.dirname} is not a sharded checkpoint but this run saves sharded state")
        problem = dcp_format.verify(self.folder, ckpt, record, self.group)
        if problem:
            raise CorruptCheckpoint(problem)
        return record

    def _apply(self, ckpt: CheckpointName, loaded: Any, objects: dict[str, Any]) -> int:
        if self.sharded:
            dcp_format.load(self.folder, ckpt, objects, self.group)
            return int(loaded["step"])
        saved = loaded["objects"]
        missing = [n for n in objects if n not in saved]
        if missing:
            raise KeyError(
                f"checkpoint {self.folder.url('checkpoints/' + ckpt.dirname)} has no "
                f"{', '.join(missing)}: it holds {', '.join(sorted(saved))}"
            )
        for name, obj in objects.items():
            snapshot.apply(name, obj, saved[name])
        self.restored = dict(saved)
        per_rank = loaded.get(snapshot.RNG_RANKS_KEY) or [loaded[snapshot.RNG_KEY]]
        self.set_rng_states(per_rank, f"checkpoint {ckpt.dirname}")
        return int(loaded["step"])

    def rng_states(self) -> list[dict[str, Any]]:
        """Every rank's RNG states (Python, NumPy, torch, CUDA), in rank order, on every rank."""
        return self.from_every_rank(snapshot.rng_state())

    def from_every_rank(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (a collective under torchrun)."""
        return self.group.all_gather(obj)

    def set_rng_states(self, per_rank: list[dict[str, Any]], saved_at: str) -> None:
        """Set this rank's RNG states from `per_rank` (as `rng_states` gave them, or rank 0's
        alone); when another number of ranks saved them, only rank 0 takes rank 0's."""
        if len(per_rank) == self.group.world:
            snapshot.set_rng_state(per_rank[self.group.rank])
        elif self.group.main:
            snapshot.set_rng_state(per_rank[0])
        else:
            log.warning("the RNG states of %s were saved by another number of ranks: this rank's are not restored",
                        saved_at)

    def _on_main(self, action: Any) -> Any:
        """Run `action` on rank 0 only and hand its result (or its failure) to every rank."""
        result: Any = None
        err: BaseException | None = None
        if self.group.main:
            try:
                result = action()
            except StorageError as exc:
                err = exc
        self._raise_shared(err)
        return self.group.broadcast(result)

    # ---- save --------------------------------------------------------------------------------------------
    @property
    def checkpoint_interval(self) -> float:
        """Seconds of training between saves when no step count is pinned: `checkpoint_seconds`
        if the script pinned it, else the Young/Daly interval of `interval` (re-estimated at
        every save from its measured cost, with the MTBF the reconciler passed at launch)."""
        return self.checkpoint_seconds if self.checkpoint_seconds is not None else self.interval.interval()

    def _period(self) -> float:
        """Seconds from one save's start to the next: the interval plus what a save blocks."""
        if self.checkpoint_seconds is not None:
            return self.checkpoint_seconds
        return self.interval.interval() + (self.interval.blocked or 0.0)

    def should_checkpoint(self, step: int) -> bool:
        """True every `checkpoint_every` steps (RECONCILER_CHECKPOINT_EVERY, the job's pin), else
        every `checkpoint_interval` seconds, and when stopping. Under torchrun rank 0's clock and
        measurements decide and the answer is the same on every rank (see `_agree`)."""
        stop, due = self._agree(step)
        if stop:
            return True
        if self.checkpoint_every:
            return step % self.checkpoint_every == 0
        return due

    def save(self, step: int, **objects: Any) -> None:
        """Checkpoint `objects` at `step`. Blocks only while the state is copied to host memory
        (and, if the previous save is still uploading, until that one is done); the upload and
        commit run in the background. A failed upload is raised by the next save/wait/complete.

        Under torchrun every rank calls it. Replicated state (DDP): rank 0 writes the one
        checkpoint (with every rank's RNG state) and the others go on; the next save, `wait` or
        `complete` is a barrier on which all ranks learn how the write ended. Sharded state
        (`open_run(sharded=True)`): every rank copies its part to host memory and writes it in the
        background through torch.distributed.checkpoint; rank 0 commits the whole once every
        rank has written, and the next save/wait/complete is where every rank learns how it ended.
        """
        self._check_open()
        if self._drill is not None and self._drill.holding:
            return  # a drill's lookahead: the run must resume at the drill's checkpoint
        entered = self._clock()
        if self._faults.active and self._upload is not None and self._upload.is_alive() and not self.sharded:
            return  # the last save waits for the store: training goes on, and that save lands first
        self.wait()
        if step == self._last_saved_step:
            return
        if not objects:
            raise ValueError("save() needs the objects to checkpoint, e.g. run.save(step, model=model)")
        started = self._clock()
        if self.group.distributed and self._loop is not None and loop.LOOP_KEY in objects:
            self._loop.share_ranks()
        if self.sharded:
            self._save_sharded(step, objects, started, entered)
            return
        rngs = self.group.gather(snapshot.rng_state()) if self.group.distributed else None
        self._last_saved_step = step
        self._last_save_time = started
        if not self.group.main:
            return
        snap = snapshot.capture(step, objects, self._buffers)
        if rngs is not None:
            snap.meta[snapshot.RNG_RANKS_KEY] = rngs
        self._buffers = snap.sections
        self._upload = snapshot.Background(self._write, snap, started)
        self.interval.saved(blocked=self._clock() - entered)
        if self._drill is not None and self._drill.armed:
            self.wait()  # the drill starts once this checkpoint is durable
            self._drill.saved(step)

    def _save_sharded(self, step: int, objects: dict[str, Any], started: float, entered: float) -> None:
        if self._io is None:  # a gloo group for the background write's collectives (every rank, first save)
            self._io = Group(self.rank, self.world_size, dist.own_group()) if self.group.distributed else Group()
        written = dcp_format.begin(self.folder, self.epoch, step, objects, self._io)
        self._last_saved_step = step
        self._last_save_time = started
        self._upload = snapshot.Background(self._finish_sharded, step, written, started)
        self.interval.saved(blocked=self._clock() - entered)

    def _finish_sharded(self, step: int, written: Any, started: float) -> None:
        try:
            assert self._io is not None
            ckpt = dcp_format.finish(self.folder, self.epoch, step, written, self._io, self._last_committed)
            self._save_seconds = self._clock() - started
            self.interval.saved(durable=self._save_seconds)
            if ckpt is not None:
                self._after_commit(ckpt)
        except BaseException as exc:  # kept and raised on every rank by the next save/wait/complete
            self._upload_error = exc

    def _write(self, snap: snapshot.Snapshot, started: float) -> None:
        try:
            ckpt = self._faults.retrying(lambda: snapshot.write(self.folder, self.epoch, snap, self._last_committed,
                                                                self._pool), f"save the checkpoint of step {snap.step}")
            self._save_seconds = self._clock() - started  # copy + upload + commit: what a final save costs
            self.interval.saved(durable=self._save_seconds)
            self._after_commit(ckpt)
        except BaseException as exc:  # kept and raised in the training thread
            self._upload_error = exc

    def _after_commit(self, ckpt: CheckpointName) -> None:
        """Rank 0, once a checkpoint is committed: remember it, collect the old ones."""
        self._last_committed = ckpt.dirname
        protect = frozenset([self._restored_from]) if self._restored_from else frozenset()
        try:
            self.folder.collect(self.epoch, keep=self.keep, protect=protect)
        except StorageError as exc:
            if isinstance(exc, Fenced):
                raise
            log.warning("could not collect old checkpoints: %s", exc)

    def wait(self) -> None:
        """Wait for the pending upload; raise its error if it failed (Superseded when fenced).
        Under torchrun all ranks call it together and all raise when rank 0's upload failed."""
        if self._upload is not None:
            self._upload.join()
            self._upload = None
        err, self._upload_error = self._upload_error, None
        self._raise_shared(err)

    def _raise_shared(self, err: BaseException | None) -> None:
        """Raise `err` (Superseded when fenced); under torchrun a collective, so that every rank
        raises when any rank failed (a Superseded everywhere when rank 0 was fenced)."""
        if self.group.distributed:
            code = 0 if err is None else 2 if isinstance(err, Fenced) else 1
            worst = self.group.max([code])[0]
            if err is None and worst == 2:
                err = Fenced(f"rank 0 found the lease at {self.folder.url('lease.json')} moved past epoch {self.epoch}")
            elif err is None and worst == 1:
                err = StorageError(f"another rank of run {self.run_id} could not write or read the run folder "
                                   f"{self.folder.uri}: see its log")
        if err is None:
            return
        if isinstance(err, Fenced):
            raise self._superseded(err) from None
        raise err

    # ---- heartbeat and completion -----------------------------------------------------------------------
    def heartbeat(self, step: int, **metrics: float) -> None:
        """Report progress (written at most every `heartbeat_interval` seconds). Raises Superseded
        when the attempt was replaced, so a zombie stops at its next heartbeat; a stop request in
        the run folder, read at the same cadence, makes `stop_requested` true as SIGTERM does.
        """
        self._warn_past_target(step)
        if self._drill is not None:
            self._drill.seen(step, metrics)  # every step, before the heartbeat's throttle
        self._heartbeat(step, metrics, force=False)

    def _heartbeat(self, step: int, metrics: dict[str, Any], force: bool) -> None:
        if not self.group.main:
            return  # rank 0 reports for all: the ranks agree on the step (see _agree)
        self._mark(step)
        now = time.monotonic()
        if not force and now - self._last_beat < self.heartbeat_interval:
            return
        self._last_beat = now
        record = {
            "epoch": self.epoch,
            "step": int(step),
            "target": self.target,
            "time": time.time(),
            "metrics": self._reported.beat(step, metrics),
            **({"stopping": self._stopping} if self._stopping else {}),
            **({"save_seconds": round(self._save_seconds, 1)} if self._save_seconds is not None else {}),
            # Seconds from one save's start to the next (unless a step count pins them): the planner
            # weighs what an interruption loses by it.
            **({"save_every_seconds": round(self._period(), 1)} if not self.checkpoint_every else {}),
        }
        try:
            self._progress_tag = self.folder.write_progress(self.epoch, record, self._progress_tag)
        except Fenced as exc:
            raise self._superseded(exc) from None
        except StorageError as exc:
            if not self._faults.tolerate(exc, f"write the heartbeat of step {step}"):
                raise
        if not force:
            self._check_stop_request()
            if self._drill is not None:
                self._drill.check()

    def _mark(self, step: int) -> None:
        """The cheap per-step record of how far this attempt got (see RunFolder.mark_reached)."""
        try:
            self.folder.mark_reached(self.epoch, step)
        except (OSError, StorageError) as exc:
            log.debug("could not record the step reached: %s", exc)

    def complete(self, step: int | None = None, **metrics: float) -> None:
        """Mark the run done: waits for the pending upload, then creates done.json once (fenced).
        Without a step, the target (set by `epochs()` or RECONCILER_TARGET_STEPS) is the last step."""
        self._check_open()
        if step is None:
            if self.target is None:
                raise ValueError("complete() needs the last step: pass it, or set the target (epochs() does)")
            step = self.target
        self.wait()
        err: BaseException | None = None
        if self.group.main:
            try:
                self._heartbeat(step, metrics, force=True)
                record = {
                    "step": int(step),
                    "run_id": self.run_id,
                    "time": time.time(),
                    "metrics": self._reported.last,
                }
                record.update(handover.outputs_record(self.folder, self.epoch, self.output_dir, self._faults))
                self._faults.retrying(lambda: self.folder.mark_done(self.epoch, record), "write the completion record")
            except Superseded:
                err = Fenced(f"run {self.run_id} epoch {self.epoch} was replaced before it completed")
            except StorageError as exc:
                err = exc
        self._raise_shared(err)
        self._completed = True
        self.close()

    # ---- epochs and batches as positions ----------------------------------------------------------------
    _loop: loop.EpochLoop | None = None  # the last run.epochs() loop: what batches/carry/step refer to

    def epochs(self, epochs: int | range, *batches: Any, **objects: Any) -> loop.EpochLoop:
        """`for epoch in run.epochs(n_epochs, model=model, ...)`: restores the objects and the loop's
        position, then yields the epoch numbers still to run (0 to n-1, or those of a range), the
        interrupted one first. Each epoch runs its batches through `run.batches`/`run.enumerate`,
        which set the target to epochs x batches. See reconciler/worker/loop.py."""
        if batches:
            raise TypeError("run.epochs() takes the epochs and the objects to restore; the batches go inside "
                            "each epoch: `for batch in run.batches(loader):`")
        self._loop = loop.EpochLoop(self, epochs, objects)
        return self._loop

    def batches(self, batches: Any, carry: Callable[[], Any] | None = None) -> Iterator[Any]:
        """The epoch's remaining batches (a `ResumableLoader`, or a sized sequence that repeats
        itself: a range, a list); after each one a heartbeat, a checkpoint when due, a stop on a
        notice. On the resumed epoch the value `carry()` returns is restored in place first."""
        return (batch for _, batch in self._active_loop().enumerate(batches, carry))

    def enumerate(self, batches: Any, carry: Callable[[], Any] | None = None) -> Iterator[tuple[int, Any]]:
        """`run.batches` as (index within the epoch, batch), as `enumerate(batches)` gives them."""
        return self._active_loop().enumerate(batches, carry)

    def carry(self, **values: Any) -> Any:
        """At the top of an epoch: `lr, best = run.carry(lr=lr, best=best)` saves the values the
        epoch starts with, and returns them (on the resumed epoch, the saved ones)."""
        return self._active_loop().carry(**values)

    @property
    def step(self) -> int:
        """The last step the `run.epochs()` loop ran (0 before it)."""
        return 0 if self._loop is None else self._loop.step

    def _active_loop(self) -> loop.EpochLoop:
        if self._loop is None:
            raise RuntimeError("run.batches(), run.enumerate() and run.carry() belong inside "
                               "`for epoch in run.epochs(...)`")
        return self._loop

    def expect_steps(self, total: int) -> None:
        """The loop will run `total` steps: the target reported in progress.json from now on."""
        if self.target is not None and self.target != total:
            log.warning("the target was %d steps (RECONCILER_TARGET_STEPS) but the loop has %d: reporting %d",
                        self.target, total, total)
        self.target = total

    def _warn_past_target(self, step: int) -> None:
        if self.target is None or step <= self.target or self._past_target_warned:
            return
        self._past_target_warned = True
        log.warning("step %d is past the target of %d steps: progress will read %d/%d; set the target to the "
                    "loop's real length (RECONCILER_TARGET_STEPS, or let run.epochs() count it)",
                    step, self.target, step, self.target)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the pending upload (logging, not raising, its failure) and release resources."""
        if self._closed:
            return
        self._closed = True
        self._faults.stopped.set()
        if self._upload is not None:
            self._upload.join()
            self._upload = None
        if self._upload_error is not None:
            log.error("the last checkpoint upload failed: %s", self._upload_error)
        self.folder.close_marks()
        for sig, handler in self._old_handlers.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        self._old_handlers = {}

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Run is closed; open a new one with open_run()")

    def _superseded(self, exc: BaseException) -> Superseded:
        err = Superseded(f"run {self.run_id} attempt epoch {self.epoch} was superseded: {exc}")
        print(f"reconciler.worker: {err}; exiting {EXIT_INTERRUPTED}", file=sys.stderr, flush=True)
        self._closed_after_fence()
        return err

    def _closed_after_fence(self) -> None:
        # A replaced worker must not linger: drop the pending upload's outcome, stop cleanly.
        self._upload_error = None
        try:
            self.close()
        except Exception:  # noqa: BLE001 - closing must not hide the fence
            pass

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_run(
    *,
    uri: str | None = None,
    run_id: str | None = None,
    epoch: int | None = None,
    deadline: float | None = None,
    checkpoint_every: int | None = None,
    checkpoint_seconds: float | None = None,
    mtbf: float | None = None,
    target: int | None = None,
    grace: float | None = None,
    heartbeat_interval: float | None = None,
    keep: int = 2,
    storage_options: dict[str, Any] | None = None,
    install_signal_handlers: bool = True,
    sharded: bool = False,
) -> Run:
    """Open this attempt's run from the environment (arguments override it).

    Reads RECONCILER_RUN_URI, RECONCILER_RUN_ID, RECONCILER_EPOCH, RECONCILER_DEADLINE (unix
    seconds), RECONCILER_CHECKPOINT_EVERY (steps: the job pins the interval), RECONCILER_MTBF_SECONDS
    (the provider's measured mean time between failures, for the Young/Daly interval used when
    no interval is pinned: see `Run.checkpoint_interval`) and, optionally, RECONCILER_TARGET_STEPS,
    RECONCILER_GRACE (seconds, default 30: the time a stop notice gives, and the least margin
    kept before the deadline) and RECONCILER_HEARTBEAT_INTERVAL (seconds, default 10).
    Without an epoch (a script started by hand) it takes the lease itself by bumping it.

    Under torchrun (RANK and WORLD_SIZE set) every rank calls it; it initialises
    torch.distributed from the environment unless the script did, and rank 0 alone takes care of
    the lease, heartbeats, commits and completion. `sharded=True` saves through
    torch.distributed.checkpoint, every rank its own part (FSDP, DTensor): see `save`.
    """
    env = os.environ
    uri = uri or env.get("RECONCILER_RUN_URI")
    if not uri:
        raise RunConfigError(
            "RECONCILER_RUN_URI is not set: start this script through the reconciler, "
            "or pass open_run(uri=...) with the run's storage folder"
        )
    folder = RunFolder(uri, storage_options)
    run_id = run_id or env.get("RECONCILER_RUN_ID") or folder.uri.rsplit("/", 1)[-1]
    epoch = _or_env(epoch, "RECONCILER_EPOCH", env_int)
    deadline = _or_env(deadline, "RECONCILER_DEADLINE", env_float)
    checkpoint_every = _or_env(checkpoint_every, "RECONCILER_CHECKPOINT_EVERY", env_int)
    mtbf = _or_env(mtbf, "RECONCILER_MTBF_SECONDS", env_float)
    target = _or_env(target, "RECONCILER_TARGET_STEPS", env_int)
    grace = _or_env(grace, "RECONCILER_GRACE", env_float)
    heartbeat_interval = _or_env(heartbeat_interval, "RECONCILER_HEARTBEAT_INTERVAL", env_float)
    folder.store.check_conditional_writes()
    if sharded:
        dcp_format.check_folder(folder)
    group = dist.from_env()
    if epoch is None:
        epoch = group.broadcast(
            folder.bump_lease(holder=f"worker:{socket.gethostname()}:{os.getpid()}") if group.main else None)
    current = group.broadcast(folder.lease_epoch() if group.main else None)
    if current > epoch:
        raise Superseded(f"lease at {folder.url('lease.json')} is at epoch {current}; this attempt has {epoch}")
    if current < epoch:
        raise RunConfigError(
            f"lease at {folder.url('lease.json')} is at epoch {current} but this worker was given epoch "
            f"{epoch}: the launcher must bump the lease before starting the worker"
        )
    if group.main:
        handover.tidy(folder, epoch)
    output_dir, input_dir = handover.attempt_dirs(folder, group, storage_options)
    return Run(
        folder,
        run_id,
        epoch,
        deadline=deadline,
        checkpoint_every=checkpoint_every,
        checkpoint_seconds=checkpoint_seconds,
        mtbf=mtbf,
        target=target,
        grace=30.0 if grace is None else grace,
        heartbeat_interval=10.0 if heartbeat_interval is None else heartbeat_interval,
        keep=keep,
        install_signal_handlers=install_signal_handlers,
        group=group,
        sharded=sharded,
        output_dir=output_dir,
        input_dir=input_dir,
    )


def _or_env(given: Any, name: str, parse: Callable[[str, str | None], Any]) -> Any:
    """An argument of open_run, else the environment variable that stands for it."""
    return given if given is not None else parse(name, os.environ.get(name))


__all__ = [
    "EXIT_INTERRUPTED",
    "MAX_DEADLINE_MARGIN",
    "CheckpointName",
    "Run",
    "RunConfigError",
    "Superseded",
    "deadline_margin",
    "open_run",
]
