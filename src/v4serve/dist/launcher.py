"""torchrun (torch.distributed.run) as the launcher: each process it starts is one rank.

`torchrun --nproc-per-node N [--nnodes M --node-rank K --master-addr A --master-port P] -m v4serve.cli serve MODEL -tp N*M`
runs the same command in every process. Rank 0 serves HTTP and runs the engine, which then spawns no worker of its
own; every other rank runs the worker loop of dist/workers.py on cuda:LOCAL_RANK. They meet in torch.distributed's
default process group at torchrun's MASTER_ADDR / MASTER_PORT.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def from_environment(env: Mapping[str, str] = os.environ) -> LauncherEnv | None:
    """This process's place when torchrun started it with more than one process (its RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); None otherwise."""
    if "LOCAL_RANK" not in env or int(env.get("WORLD_SIZE", "1")) <= 1:
        return None
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise ValueError(f"a torchrun launch without {', '.join(missing)} in the environment")
    world = int(env["WORLD_SIZE"])
    return LauncherEnv(int(env["RANK"]), world, int(env["LOCAL_RANK"]), int(env.get("LOCAL_WORLD_SIZE", world)),
                       env["MASTER_ADDR"], int(env["MASTER_PORT"]))
