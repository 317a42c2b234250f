"""Epochs and batches as positions: the nested loops a training script already has, made resumable.

    for epoch in run.epochs(args.epochs, model=model, optimizer=opt):
        lr, best = run.carry(lr=lr, best=best)            # what changes from one epoch to the next
        hidden = model.init_hidden(batch_size)             # the epoch's own preamble, unchanged
        for i, batch in run.enumerate(loader, carry=lambda: hidden):
            ...                                            # one step
        ...                                                # the end of the epoch, unchanged
    run.complete()

`run.epochs` restores the objects and the loop's position (which epoch, which batch, the values
given to `run.carry`, the data position) and yields the epoch numbers still to run, the
interrupted one first, with the RNG states that epoch began with (every rank's are kept with each
checkpoint), so that its preamble draws what it drew before. Inside an epoch,
`run.batches`/`run.enumerate` count the steps, heartbeat, checkpoint on the SDK's schedule and
stop on a notice after each batch. On the resumed epoch they first put back what the epoch's
preamble just rebuilt: the carried value (`carry=`, a function returning it, restored in place:
see carried.py), the checkpoint's RNG states, and skip the batches already trained on.

The end-of-epoch code (validation, annealing) runs once per epoch across resumes: a checkpoint
that falls due on an epoch's last batch is taken after that code, when the next epoch's batches
begin, together with what it changed. A stop notice does not wait for it: the final checkpoint
is taken at the last batch and the attempt exits before the end-of-epoch code, which the resumed
attempt then runs; a notice that comes during that code is acted on when it is over. Only an
attempt that dies without notice after the end-of-epoch code and before the next checkpoint has
it run again, with the rest of the work lost since that checkpoint.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Any, cast

from reconciler.worker import carried, snapshot
from reconciler.worker.lazy_torch import is_instance

if TYPE_CHECKING:
    from reconciler.worker.data import ResumableLoader

log = logging.getLogger("reconciler.worker")

LOOP_KEY = "__loop__"  # the name the loop's position is saved under


class Position:
    """The position in any sized, re-iterable sequence of batches that gives the same items each
    pass (a range, a list, a tensor split): skipped by count at a resume."""

    def __init__(self, batches: Any) -> None:
        if is_instance(batches, "torch.utils.data", "DataLoader"):
            raise ValueError("a DataLoader draws from the global RNG each epoch and may shuffle, so it cannot be "
                             "resumed at the same batch: build it with reconciler.worker.ResumableLoader(...)")
        self.batches = batches
        self.epoch = 0
        self.index = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        for batch in itertools.islice(iter(self.batches), self.index, None):
            self.index += 1
            yield batch
        self.epoch += 1
        self.index = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class _Saved:
    """The loop's part of a checkpoint, read from the loop at each save."""

    def __init__(self, loop: EpochLoop) -> None:
        self.loop = loop

    def state_dict(self) -> dict[str, Any]:
        return self.loop.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loop.resume_from(state)


class EpochLoop:
    """`for epoch in run.epochs(...)`: see the module's docstring. `step` is the last step run."""

    def __init__(self, run: Any, epochs: int | range, objects: dict[str, Any]) -> None:
        if isinstance(epochs, bool) or not isinstance(epochs, int | range):
            raise TypeError(f"run.epochs() takes a number of epochs or a range, not {type(epochs).__name__}")
        if LOOP_KEY in objects:
            raise ValueError(f"{LOOP_KEY} is the name run.epochs() saves its position under; rename that object")
        self.run = run
        self.numbers = range(epochs) if isinstance(epochs, int) else epochs
        self.objects = {**objects, LOOP_KEY: _Saved(self)}
        self.step = 0
        self.index = 0  # which of the epochs runs now, from 0 (len(numbers) once all have run)
        self.phase = "before"  # then per epoch "preamble", "batches" (from run.batches on); "done" at the end
        self._resume: dict[str, Any] | None = None  # the checkpoint's position, until its epoch used it
        self._rng: dict[str, Any] | None = None  # the checkpoint's RNG states, put back after the preamble
        self._epoch_rng: list[dict[str, Any]] | None = None  # every rank's RNG states as this epoch began
        self._built: Any = None  # the shape of what carry= returned as the epoch's batches began
        self._ranks: list[dict[str, Any]] | None = None  # under torchrun: every rank's values, for a save
        self._values: dict[str, Any] | None = None  # this epoch's run.carry() values
        self._carried: Callable[[], Any] | None = None  # this epoch's carry= function
        self._position: Position | ResumableLoader | None = None
        self._per_epoch: int | None = None
        self._started = False

    # ---- saved with each checkpoint ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "epoch": self.index,
            "rng": self._epoch_rng,
            "data": None if self._position is None else self._position.state_dict(),
            "values": self._values,
            "carries": self._carried is not None,
            "carried": self._carried_state() if self._ranks is None else None,  # else in every rank's
            "ranks": self._ranks,
        }

    def share_ranks(self) -> None:
        """Under torchrun, on every rank before a save: each rank carries values of its own (an RNN's
        hidden state over its share of the data), so the checkpoint keeps every rank's."""
        self._ranks = self.run.from_every_rank({"values": self._values, "carried": self._carried_state()})

    def _ours(self, saved: dict[str, Any], key: str) -> Any:
        """This rank's `key` ("values", "carried") of the checkpoint's loop state."""
        ranks = saved.get("ranks")
        if ranks is None:
            return saved[key]
        if len(ranks) == self.run.world_size:
            return ranks[self.run.rank][key]
        if key == "values":  # read first: said once
            log.warning("the checkpoint's carried values were saved by %d ranks and this attempt has %d: every "
                        "rank takes rank 0's", len(ranks), self.run.world_size)
        return ranks[0][key]

    def _carried_state(self) -> Any:
        """What carry= returns, as saved: refused (TypeError) if a resume could not restore it."""
        if self._carried is None:
            return None
        return carried.state(self._carried(), self._built)

    def resume_from(self, state: dict[str, Any]) -> None:
        self._resume = state

    # ---- the epochs --------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        if self._started:
            raise RuntimeError("this run.epochs() loop has already run: call run.epochs() again for another one")
        self._started = True
        return self._epochs()

    def _epochs(self) -> Iterator[int]:
        self.step = self.run.restore(**self.objects)
        first = 0
        if self._resume is not None:
            self._rng = snapshot.rng_state()
            first = int(self._resume["epoch"])
        for index in range(first, len(self.numbers)):
            self.index, self.phase = index, "preamble"
            self._values, self._carried, self._position = None, None, None
            self._begin_epoch()
            yield self.numbers[index]
            if self.phase == "preamble":
                raise RuntimeError(f"epoch {self.numbers[index]} ran no batches: put a run.batches(...) or "
                                   "run.enumerate(...) loop inside `for epoch in run.epochs(...)`")
        self.index, self.phase = len(self.numbers), "done"
        self._values, self._carried, self._position = None, None, None
        if self._per_epoch is None:  # resumed after the last epoch: the checkpoint's step is the total
            self.run.expect_steps(self.step)
        # A notice during the last epoch's end: the final checkpoint says that every epoch is done.
        self.run.exit_if_stopping(self.step, **self.objects)

    def _begin_epoch(self) -> None:
        """Record the RNG states the epoch's preamble starts from; on the resumed epoch, first set
        the ones the saved epoch started from, so that the preamble draws what it drew then."""
        saved = None if self._resume is None else self._resume.get("rng")
        if saved is not None:
            self.run.set_rng_states(saved, f"epoch {self.numbers[self.index]}'s start")
        elif self._resume is not None:
            log.warning("the checkpoint does not hold the RNG states epoch %s began with (an older SDK saved "
                        "it): random numbers its preamble draws and does not pass through carry= differ from "
                        "the saved run's", self.numbers[self.index])
        self._epoch_rng = self.run.rng_states()

    def carry(self, **values: Any) -> Any:
        """Record the values this epoch starts with; on the resumed epoch, return the saved ones."""
        if self.phase != "preamble" or self._values is not None:
            raise RuntimeError("run.carry() goes once at the top of each epoch of run.epochs(), before its batches")
        if not values:
            raise ValueError("run.carry() needs the values to carry, e.g. lr, best = run.carry(lr=lr, best=best)")
        if self._resume is not None:
            saved = self._resume["values"]
            if saved is None or list(saved) != list(values):
                raise ValueError(f"run.carry() was given {', '.join(values)} but the checkpoint carries "
                                 f"{', '.join(saved or ()) or 'nothing'}: call it as the saved run did")
            values = self._ours(self._resume, "values")
        self._values = dict(values)
        out = tuple(self._values.values())
        return out[0] if len(out) == 1 else out

    # ---- the batches of one epoch ------------------------------------------------------------------------
    def enumerate(self, batches: Any, carry: Callable[[], Any] | None = None) -> Iterator[tuple[int, Any]]:
        """(index in the epoch, batch) for the epoch's remaining batches: see the module docstring."""
        if self.phase != "preamble":
            where = "inside `for epoch in run.epochs(...)`" if self.phase in ("before", "done") else "once per epoch"
            raise RuntimeError(f"run.batches()/run.enumerate() belongs {where}")
        if carry is not None and not callable(carry):
            raise TypeError("carry= takes a function that returns the carried value, e.g. carry=lambda: hidden")
        if not isinstance(batches, Sized):
            raise TypeError(f"run.batches() needs batches with a length (len()), not {type(batches).__name__}")
        resumable = is_instance(batches, "reconciler.worker.data", "ResumableLoader")
        position: Position | ResumableLoader = cast("ResumableLoader", batches) if resumable else Position(batches)
        try:
            n = len(position)
        except TypeError:
            raise TypeError("run.batches() needs to know how many batches an epoch has: give the iterable "
                            "dataset a __len__") from None
        if n == 0:
            raise ValueError("run.batches() was given no batches: the data is empty (or smaller than one batch "
                             "with drop_last)")
        self._position, self._carried, self.phase = position, carry, "batches"
        self._built = None if carry is None else carried.shape(carry())
        resumed, self._resume = self._resume, None
        if resumed is not None:
            self._put_back(resumed, position, carry)
        elif self.step > 0:
            self._boundary()
        self._set_target(n, position.index)
        return self._walk(position, n)

    def _put_back(self, saved: dict[str, Any], position: Position | ResumableLoader,
                  carry: Callable[[], Any] | None) -> None:
        """The resumed epoch, once its preamble ran: the carried values, the data position, the RNG."""
        if saved["values"] is not None and self._values is None:
            raise RuntimeError(f"the checkpoint carries {', '.join(saved['values'])} but this epoch did not call "
                               "run.carry() before its batches")
        if saved["carries"] != (carry is not None):
            have = "carries a value (carry=)" if saved["carries"] else "carries no value (no carry=)"
            raise ValueError(f"the checkpoint {have} but run.batches() was called "
                             f"{'without' if carry is None else 'with'} one: call it as the saved run did")
        if carry is not None:
            carried.load_into(carry(), self._ours(saved, "carried"), "the value carry= returns")
        data = saved["data"]
        if data is None or set(data) != set(position.state_dict()):
            raise ValueError(f"the checkpoint's data position ({data}) was not saved from batches like these: "
                             f"pass run.batches() what the saved run did ({type(position).__name__} here)")
        position.load_state_dict(data)
        if self._rng is not None:
            snapshot.set_rng_state(self._rng)
            self._rng = None

    def _boundary(self) -> None:
        """An epoch begins after the previous one's end: the checkpoint that fell due on that
        epoch's last batch, and the stop a notice during the end-of-epoch code asks for."""
        if self.run.should_checkpoint(self.step):
            self._save()
        self.run.exit_if_stopping(self.step, **self.objects)

    def _set_target(self, n: int, done: int) -> None:
        total = self.step - done + n * (len(self.numbers) - self.index)
        if self._per_epoch is None:
            self.run.expect_steps(total)
        elif n != self._per_epoch:
            log.warning("epoch %s has %d batches but the one before had %d: the target is now %d steps",
                        self.numbers[self.index], n, self._per_epoch, total)
            self.run.target = total
        self._per_epoch = n

    def _walk(self, position: Position | ResumableLoader, n: int) -> Iterator[tuple[int, Any]]:
        for batch in position:
            self.step += 1
            yield position.index - 1, batch
            self._after_step(last=position.index == n)

    def _after_step(self, last: bool) -> None:
        run = self.run
        run.heartbeat(self.step)
        if not last and run.should_checkpoint(self.step):
            self._save()
        run.exit_if_stopping(self.step, **self.objects)

    def _save(self) -> None:
        self._carried_state()  # on every rank, before a collective save: refuse what could not be restored
        self.run.save(self.step, **self.objects)


__all__ = ["LOOP_KEY", "EpochLoop"]
