"""Helpers shared by the torch.distributed tests: a free loopback port, a server's health, the relative error of two
tensors, and the set-up of one gloo rank in a spawned process."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    """A server's /health answers 200 (False for 503, or no answer: a server that stopped)."""
    import httpx

    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@contextlib.contextmanager
def gloo_rank(rank: int, world: int, port: int) -> Iterator[None]:
    """This process as rank `rank` of a gloo group on localhost:port (one thread: the ranks share the cores)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def state_bytes(lm) -> int:
    """Bytes of the rank's model state (what its share of the checkpoint became)."""
    return sum(t.numel() * t.element_size() for t in lm.model.state_dict().values())
