"""A training job that reads real batches through `ResumableLoader` with two DataLoader workers,
so that a resume which re-reads or skips a batch changes the weights and the order log.

Run as ``python -m tests.worker.workloads.data_train '{"kind": "map", ...}'``. cfg keys: kind
("map": a shuffled map-style dataset; "iterable": a sharded stream with a state; "ddp": every
rank of a DistributedDataParallel job reads its share through a shuffled DistributedSampler,
started by torchrun or by `rank_child`), workers (DataLoader workers under ddp), epochs, out
(final state file, rank 0), order (one line per batch trained on; `<order>.<rank>` under ddp),
die_at (SIGKILL itself at that step, before the step's checkpoint; under ddp only rank 1 does).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, get_worker_info

from reconciler.worker import ResumableLoader, open_run

ITEMS = 40
BATCH = 5


def item(epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(1000 * epoch + index)
    return torch.randn(8, generator=g), torch.randn(4, generator=g), index


class Table(Dataset):
    """Map-style: item i is the same every epoch; the order comes from the shuffle."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return item(0, index)


class Stream(IterableDataset):
    """Iterable with a state: every worker reads its share of positions; the epoch changes the
    items (set by the loader through set_epoch) and is part of the state."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return ITEMS

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for index in range(worker, ITEMS, workers):
            yield item(self.epoch, index)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])


def main(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ddp = cfg["kind"] == "ddp"
    if cfg["kind"] == "map":
        loader = ResumableLoader(Table(), batch_size=BATCH, shuffle=True, num_workers=2)
    elif cfg["kind"] == "iterable":
        loader = ResumableLoader(Stream(), batch_size=BATCH, num_workers=2)
    with open_run() as run:
        if ddp:
            from torch.nn.parallel import DistributedDataParallel

            net: torch.nn.Module = DistributedDataParallel(model)
            loader = ResumableLoader(Table(), batch_size=BATCH, sampler=DistributedSampler(Table(), seed=3), seed=4,
                                     num_workers=int(cfg.get("workers", 0)))
        else:
            net = model
        order = open(f"{cfg['order']}.{run.rank}" if ddp else cfg["order"], "a")  # noqa: SIM115
        for epoch in run.epochs(int(cfg.get("epochs", 3)), model=model, optimizer=opt):
            for x, y, ids in run.batches(loader):
                loss = ((net(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                order.write(f"{epoch} {ids.tolist()}\n")
                order.flush()
                if cfg.get("die_at") == run.step and run.rank == (1 if ddp else 0):
                    os.kill(os.getpid(), signal.SIGKILL)
                run.heartbeat(run.step, loss=float(loss))
        if run.rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, cfg["out"])
        run.complete()


def rank_child(env: dict[str, str], cfg: dict[str, Any]) -> None:
    """One rank, in a fork of the tests' fork server (see tests/worker/harness.py start_ranks)."""
    os.environ.update(env)
    main(cfg)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
