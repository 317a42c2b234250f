"""Where a training loop is in its data (epoch, batch within the epoch, the generators that
shuffle it), saved with each checkpoint and restored, so that a resumed run reads exactly the
batches an uninterrupted run would have read next.

`ResumableLoader` builds a standard `torch.utils.data.DataLoader` and keeps its position; it is
saved like any other object (it has `state_dict`/`load_state_dict`); `run.batches()` saves it
with the loop's position (reconciler/worker/loop.py). The position counts the batches the loop
has been handed, not the ones the sampler or the workers have prefetched.

Shuffling replays from the generators' states at the start of the epoch: restoring them and
drawing again gives the same permutation (and the same seeds for the loader's workers), and
the batches already trained on are skipped as indices, without loading them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler


class _SkipBatches(Sampler[list[int]]):
    """A batch sampler whose passes start `skip` batches in (the indices are drawn all the same,
    so the sampler's generator moves exactly as in a full pass). A DataLoader with workers calls
    iter() twice per pass, so `skip` stays until the owner sets the next pass's."""

    def __init__(self, inner: Iterable[list[int]]) -> None:
        self.inner = inner
        self.skip = 0

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class ResumableLoader:
    """A DataLoader that knows its position and resumes at the next batch.

    Takes the DataLoader's arguments. Map-style datasets: `shuffle=True` shuffles with
    `generator` (a `torch.Generator`; one seeded with `seed`, or from the global torch RNG, when
    not given), as the standard DataLoader does; a `sampler` (e.g. `DistributedSampler`) or
    `batch_sampler` of your own is resumed too, and `set_epoch(epoch)` is called on it for you.
    Iterable datasets that expose `state_dict`/`load_state_dict` are resumed from their state:
    with `num_workers=0` the state at the last batch; with workers, the state at the start of
    the epoch, then the batches already trained on are loaded again and dropped (their indices
    cannot be skipped). Iterable datasets without a state are replayed the same way.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool = False,
        *,
        sampler: Any = None,
        batch_sampler: Any = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        **loader_args: Any,
    ) -> None:
        if loader_args.get("persistent_workers"):
            raise ValueError("ResumableLoader does not support persistent_workers=True: its workers' seeds "
                             "would not be drawn again at a resume; leave it False")
        if generator is not None and seed is not None:
            raise ValueError("pass either a generator or a seed, not both (the seed would be ignored)")
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()) if seed is None else seed)
        self.dataset = dataset
        self.generator = generator
        self.iterable = isinstance(dataset, IterableDataset)
        self.workers = int(loader_args.get("num_workers", 0))
        self._skipper: _SkipBatches | None = None
        if self.iterable:
            if shuffle or sampler is not None or batch_sampler is not None:
                raise ValueError("an iterable dataset orders its own items: drop shuffle/sampler/batch_sampler")
            self.loader: DataLoader[Any] = DataLoader(
                dataset, batch_size=batch_size, drop_last=drop_last, generator=generator, **loader_args)
        else:
            if batch_sampler is None:
                if sampler is not None and shuffle:
                    raise ValueError("pass either shuffle=True or a sampler, not both")
                if sampler is None:
                    sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
                if batch_size is None:
                    raise ValueError("ResumableLoader needs a batch_size (or a batch_sampler)")
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)
            self._skipper = _SkipBatches(batch_sampler)
            self.loader = DataLoader(dataset, batch_sampler=self._skipper, generator=generator, **loader_args)
        self.sampler = getattr(batch_sampler, "sampler", sampler)
        self.epoch = 0
        self.index = 0  # batches handed out in this epoch
        self._start = self._generator_states()
        self._dataset_start = self._dataset_state()

    # ---- the state that drives the order -----------------------------------------------------------------
    def _generators(self) -> list[torch.Generator]:
        """The loader's generator, and the sampler's own when it has another one."""
        found = [self.generator]
        own = getattr(self.sampler, "generator", None)
        if isinstance(own, torch.Generator) and own is not self.generator:
            found.append(own)
        return found

    def _generator_states(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self._generators()]

    def _dataset_state(self) -> Any:
        return self.dataset.state_dict() if self.iterable and _stateful(self.dataset) else None

    def _live_dataset_state(self) -> bool:
        """The dataset object in this process is the one being read (no worker copies)."""
        return self.iterable and self.workers == 0 and _stateful(self.dataset)

    # ---- iteration ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch, from the batch after the position."""
        for g, state in zip(self._generators(), self._start, strict=True):
            g.set_state(state)
        for part in (self.sampler, self.dataset):
            set_epoch = getattr(part, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
        replay = 0
        if self._skipper is not None:
            self._skipper.skip = self.index
        elif not self._live_dataset_state():
            replay = self.index
            if self._dataset_start is not None:
                self.dataset.load_state_dict(self._dataset_start)
        return self._batches(replay)

    def _batches(self, replay: int) -> Iterator[Any]:
        it = iter(self.loader)
        for _ in range(replay):
            next(it)
        for batch in it:
            self.index += 1
            yield batch
        self.epoch += 1
        self.index = 0
        self._start = self._generator_states()
        self._dataset_start = self._dataset_state()

    # ---- saved with the checkpoint -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        live = self._live_dataset_state()
        return {
            "epoch": self.epoch,
            "index": self.index,
            "generators": [s.clone() for s in self._start],
            "dataset": self.dataset.state_dict() if live else self._dataset_start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["generators"]) != len(self._generators()):
            raise ValueError(f"the saved data position has {len(state['generators'])} generator state(s) but this "
                             f"loader shuffles with {len(self._generators())}: build it as the saved run did")
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._start = [torch.as_tensor(s, dtype=torch.uint8).clone() for s in state["generators"]]
        self._dataset_start = state["dataset"]
        if self._live_dataset_state() and state["dataset"] is not None:
            self.dataset.load_state_dict(state["dataset"])


__all__ = ["ResumableLoader"]
