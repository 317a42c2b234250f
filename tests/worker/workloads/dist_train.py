"""A tiny job run by several ranks (torchrun, srun, or the tests' own launcher): one rank per process,
gloo on CPU. Every rank writes its notes to `<log>.<rank>`.

cfg keys: mode ("ddp": a DistributedDataParallel model and optimizer, the same on every rank;
"sharded": a DTensor sharded over the ranks plus a replicated tensor, saved through
torch.distributed.checkpoint), steps, seed, out (the final state, written by rank 0), log,
sleep (seconds per step), die_at (step after which this rank SIGKILLs itself; only rank
die_rank when that is given), own_group (the script initialises torch.distributed itself, as
under torch.multiprocessing.spawn), slow_write (seconds every DCP write of a sharded save sleeps
first: a slow store; each save then also notes how long it blocked and whether its checkpoint
was committed when it returned).

Both modes are deterministic and independent of the RNG streams, so a resumed run must end
bit-identical to an uninterrupted one; the sharded one also to one run on another world size.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import torch

from reconciler.worker import open_run

ROWS = 64


def _note(cfg: dict[str, Any], rank: int, line: str) -> None:
    if cfg.get("log"):
        with open(f"{cfg['log']}.{rank}", "a") as fh:
            fh.write(line + "\n")


def _slow_dcp_writes(seconds: float) -> None:
    """Every DCP write (file system or fsspec) sleeps `seconds` first, on the thread that writes."""
    from torch.distributed.checkpoint import filesystem

    original = filesystem._FileSystemWriter.write_data

    def slow(self: Any, plan: Any, planner: Any) -> Any:
        time.sleep(seconds)
        return original(self, plan, planner)

    filesystem._FileSystemWriter.write_data = slow


def _committed(run: Any, step: int) -> bool:
    """Whether this step's checkpoint has its commit record yet (a run folder on local disk)."""
    base = os.environ["RECONCILER_RUN_URI"].removeprefix("file://")
    return os.path.exists(f"{base}/checkpoints/{step:012d}-e{run.epoch}/COMMIT.json")


def _ddp_state(seed: int) -> tuple[Any, Any, dict[str, Any]]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return ddp, opt, {"model": model, "optimizer": opt}


def _ddp_step(ddp: Any, opt: Any, step: int, rank: int, world: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed * 100_003 + step * world + rank)  # each rank its own batch
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    loss = ((ddp(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _sharded_state(world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(ROWS * 4, dtype=torch.float32).reshape(ROWS, 4) / 7.0
    return {"w": distribute_tensor(full, mesh, [Shard(0)]), "total": torch.zeros(3, dtype=torch.float64)}


def _sharded_step(state: dict[str, Any], step: int) -> None:
    with torch.no_grad():  # element-wise: each rank updates its own rows, whatever the world size
        state["w"].mul_(0.97).add_(0.01 * step)
        state["total"].add_(step)


def _final(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in state.items()}


def main(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    steps, seed, mode = int(cfg["steps"]), int(cfg.get("seed", 0)), cfg.get("mode", "ddp")
    if cfg.get("own_group"):  # the script initialises torch.distributed itself, without RANK/WORLD_SIZE
        rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
        address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        torch.distributed.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    if cfg.get("slow_write"):
        _slow_dcp_writes(float(cfg["slow_write"]))
    with open_run(sharded=mode == "sharded") as run:
        rank, world = run.rank, run.world_size
        if mode == "ddp":
            ddp, opt, state = _ddp_state(seed)
        else:
            state = _sharded_state(world)
        start = run.restore(**state) if mode == "ddp" else run.restore(state=state)
        _note(cfg, rank, f"restored {start}")
        for step in range(start + 1, steps + 1):
            if mode == "ddp":
                _ddp_step(ddp, opt, step, rank, world, seed)
            else:
                _sharded_step(state, step)
            _note(cfg, rank, f"step {step}")
            run.heartbeat(step)
            objects = state if mode == "ddp" else {"state": state}
            if run.should_checkpoint(step):
                entered = time.monotonic()
                run.save(step, **objects)
                _note(cfg, rank, f"saved {step}")
                if cfg.get("slow_write"):
                    _note(cfg, rank, f"returned {step} {time.monotonic() - entered:.3f} {int(_committed(run, step))}")
            if cfg.get("die_at") == step and cfg.get("die_rank", rank) == rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if cfg.get("sleep"):
                time.sleep(float(cfg["sleep"]))
            try:
                run.exit_if_stopping(step, **objects)
            except SystemExit:
                _note(cfg, rank, f"stopped {step}")
                raise
        final = {k: v.state_dict() for k, v in state.items()} if mode == "ddp" else _final(state)
        if cfg.get("out") and rank == 0:
            torch.save(final, cfg["out"])
        run.complete(steps)
        _note(cfg, rank, f"completed {steps}")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
