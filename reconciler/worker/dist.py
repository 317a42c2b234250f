"""The ranks of one attempt under `torchrun` (or any launcher that sets RANK and WORLD_SIZE), or
under Slurm's `srun` with several tasks.

One process (world size 1) is the degenerate case: every collective here is then a plain
return, so `Run` is written once for both. With several ranks the SDK coordinates over a gloo
process group of its own (CPU tensors, a handful of bytes per step), created next to the user's
group so that its small collectives never interleave with the training's (NCCL or gloo).

`torch.distributed` is initialised from the environment (`env://`: MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE) when the script has not done it before `open_run()`; a script that initialises
it itself (any backend) keeps its group, and the SDK adds its gloo group beside it.

Under `srun` (SLURM_STEP_NUM_TASKS > 1) without torchrun's variables, `slurm_env` fills them in
from Slurm's: RANK from SLURM_PROCID, LOCAL_RANK from SLURM_LOCALID, WORLD_SIZE from the step's
task count, MASTER_ADDR the first host of the step's node list and MASTER_PORT one derived from
the job id (when not set). torchrun's own variables win when both are there (torchrun started
by srun, once per node).
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

from reconciler.worker import lazy_torch
from reconciler.worker.terms import RunConfigError, env_int

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
            lazy_torch.require().distributed.barrier(group=self.pg)

    def max(self, values: list[int]) -> list[int]:
        """Element-wise maximum of `values` over the ranks (the same list on every rank)."""
        if not self.distributed:
            return list(values)
        torch = lazy_torch.require()
        t = torch.tensor(values, dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.pg)
        return [int(v) for v in t.tolist()]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.main else None]
        lazy_torch.require().distributed.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0; None on the others."""
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.main else None
        lazy_torch.require().distributed.gather_object(obj, out, dst=0, group=self.pg)
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        lazy_torch.require().distributed.all_gather_object(out, obj, group=self.pg)
        return out


SLURM_PORT_BASE = 20000  # MASTER_PORT under srun: SLURM_PORT_BASE + job id mod SLURM_PORT_SPAN
SLURM_PORT_SPAN = 10000


def slurm_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """torchrun's variables derived from Slurm's for a task of an `srun` step with several tasks;
    {} outside one, or when the launcher set WORLD_SIZE itself. Only the variables not already
    set are returned (an explicit MASTER_ADDR or MASTER_PORT wins)."""
    env = os.environ if environ is None else environ
    tasks = env.get("SLURM_STEP_NUM_TASKS")  # set by srun for its step (the batch step has SLURM_NTASKS only)
    if "WORLD_SIZE" in env or not tasks or tasks == "1" or "SLURM_PROCID" not in env:
        return {}
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    hosts = hostnames(nodes)
    derived = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": tasks,
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": hosts[0] if hosts else "127.0.0.1",
        "MASTER_PORT": str(SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0") or 0) % SLURM_PORT_SPAN),
    }
    return {k: v for k, v in derived.items() if k not in env}


_RANGE_GROUP = re.compile(r"\[([^\]]*)\]")


def hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed host list expanded (`gpu[01-03,7],login` -> gpu01 gpu02 gpu03 gpu7 login),
    as `scontrol show hostnames` does for the common forms, zero padding kept."""
    hosts: list[str] = []
    for item in _split_top(nodelist.strip()):
        hosts.extend(_expand(item))
    return hosts


def _split_top(nodelist: str) -> list[str]:
    """The comma-separated items of a node list, commas inside brackets left alone."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    return [item for item in items if item]


def _expand(item: str) -> list[str]:
    match = _RANGE_GROUP.search(item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    names: list[str] = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"cannot read the Slurm node list {item!r}: {part!r} is not a number or a range")
        for n in range(int(low), int(high or low) + 1):
            names.extend(f"{head}{n:0{len(low)}d}{rest}" for rest in _expand(tail))
    return names


def env_world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) without one."""
    world = env_int("WORLD_SIZE", os.environ.get("WORLD_SIZE")) or 1
    rank = env_int("RANK", os.environ.get("RANK")) or 0
    if world < 1 or not 0 <= rank < world:
        raise RunConfigError(f"RANK={rank} WORLD_SIZE={world} do not describe a rank: fix the launcher's environment")
    return rank, world


def from_env() -> Group:
    """This process's group: the script's own process group when it initialised one (with
    `torch.multiprocessing.spawn`, say), else one initialised from the launcher's environment.
    A single process whose script has not imported torch is rank 0 of 1 without importing it: no
    process group can exist without torch."""
    os.environ.update(slurm_env())  # under srun: torchrun's variables, for torch and for the script
    if lazy_torch.loaded() is None and env_world()[1] == 1:
        return Group()
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() == 1:
            return Group()
        if "WORLD_SIZE" not in os.environ:
            return Group(dist.get_rank(), dist.get_world_size(), own_group())
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
    return Group(rank, world, own_group())


def own_group() -> Any:
    """A gloo group over all ranks for the SDK's small CPU collectives (a collective call: every
    rank makes it at the same point: open_run, the first sharded save)."""
    return lazy_torch.require().distributed.new_group(backend="gloo", timeout=COORDINATION_TIMEOUT)
