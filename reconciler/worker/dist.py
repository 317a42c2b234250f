"""The ranks of one attempt under `torchrun` (or any launcher that sets RANK and WORLD_SIZE).

One process (world size 1) is the degenerate case: every collective here is then a plain
return, so `Run` is written once for both. With several ranks the SDK coordinates over a gloo
process group of its own (CPU tensors, a handful of bytes per step), created next to the user's
group so that its small collectives never interleave with the training's (NCCL or gloo).

`torch.distributed` is initialised from the environment (`env://`: MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE) when the script has not done it before `open_run()`; a script that initialises
it itself (any backend) keeps its group, and the SDK adds its gloo group beside it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

COORDINATION_TIMEOUT = timedelta(minutes=10)


class Group:
    """This attempt's ranks; rank 0 is the one that talks to the run folder."""

    def __init__(self, rank: int = 0, world: int = 1, pg: Any = None) -> None:
        self.rank = rank
        self.world = world
        self.pg = pg

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier(group=self.pg)

    def max(self, values: list[int]) -> list[int]:
        """Element-wise maximum of `values` over the ranks (the same list on every rank)."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.pg)
        return [int(v) for v in t.tolist()]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.main else None]
        torch.distributed.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0; None on the others."""
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.main else None
        torch.distributed.gather_object(obj, out, dst=0, group=self.pg)
        return out


def env_world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) without one."""
    from reconciler.worker.run import _env_int

    world = _env_int("WORLD_SIZE", os.environ.get("WORLD_SIZE")) or 1
    rank = _env_int("RANK", os.environ.get("RANK")) or 0
    if world < 1 or not 0 <= rank < world:
        from reconciler.worker.run import RunConfigError

        raise RunConfigError(f"RANK={rank} WORLD_SIZE={world} do not describe a rank: fix the launcher's environment")
    return rank, world


def from_env() -> Group:
    """This process's group: the script's own process group when it initialised one (with
    `torch.multiprocessing.spawn`, say), else one initialised from the launcher's environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() == 1:
            return Group()
        if "WORLD_SIZE" not in os.environ:
            return Group(dist.get_rank(), dist.get_world_size(), _own_group())
    rank, world = env_world()
    if world == 1:
        return Group()
    if not dist.is_available():
        raise RuntimeError(f"WORLD_SIZE={world} but this torch build has no torch.distributed")
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=COORDINATION_TIMEOUT)
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError(
            f"torch.distributed has rank {dist.get_rank()} of {dist.get_world_size()} but the environment "
            f"says RANK={rank} WORLD_SIZE={world}: initialise the process group from the launcher's environment"
        )
    return Group(rank, world, _own_group())


def _own_group() -> Any:
    """A gloo group over all ranks for the SDK's small CPU collectives (a collective call: every
    rank creates it, in open_run)."""
    return torch.distributed.new_group(backend="gloo", timeout=COORDINATION_TIMEOUT)
