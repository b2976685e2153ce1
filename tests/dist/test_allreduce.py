"""dist/allreduce.py: the TP all-reduce's choice (NCCL / gloo, or one-shot over symmetric memory) and, on two GPUs, the
one-shot path against NCCL — the same sums on every rank, eager and inside a captured CUDA graph."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from v4serve.dist import allreduce


def _on_two_ranks(target, timeout: float) -> dict:
    """Run target(rank, port, queue) in two spawned processes; {rank: what it put}."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return got


def _gloo_rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), V4SERVE_ALLREDUCE="symm")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        x = torch.arange(6, dtype=torch.float64).view(2, 3) * (rank + 1)
        y = allreduce.all_reduce(x)
        q.put((rank, y.tolist()))
    finally:
        dist.destroy_process_group()


def test_cpu_tensors_take_gloo_whatever_the_choice() -> None:
    """V4SERVE_ALLREDUCE=symm only concerns CUDA tensors: on the CPU the sum is gloo's, exact."""
    got = _on_two_ranks(_gloo_rank, 120)
    want = (torch.arange(6, dtype=torch.float64).view(2, 3) * 3).tolist()
    assert got == {0: want, 1: want}


def test_the_choice_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("V4SERVE_ALLREDUCE", "custom")
    with pytest.raises(ValueError, match="V4SERVE_ALLREDUCE"):
        allreduce.mode()
    monkeypatch.delenv("V4SERVE_ALLREDUCE")
    assert allreduce.mode() == allreduce.NCCL  # the default until timed on two GPUs


ON_GPUS = os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") and torch.cuda.device_count() >= 2


def _nccl_rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    try:
        out = {}
        g = torch.Generator(device="cuda").manual_seed(rank)
        for dtype in (torch.bfloat16, torch.float32):
            for rows in (1, 7, 32, 64):
                x = torch.randn(rows, 4096, device="cuda", dtype=dtype, generator=g)
                os.environ["V4SERVE_ALLREDUCE"] = "symm"
                one = allreduce.all_reduce(x.clone())
                os.environ["V4SERVE_ALLREDUCE"] = "nccl"
                ref = allreduce.all_reduce(x.clone())
                out[(str(dtype), rows)] = (one.cpu(), ref.cpu())
        # inside a graph: the buffers exist (allocated above); two replays with new inputs
        os.environ["V4SERVE_ALLREDUCE"] = "symm"
        x = torch.zeros(16, 4096, device="cuda", dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            allreduce.all_reduce(x.clone())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
                y = allreduce.all_reduce(x * 1)
        torch.cuda.current_stream().wait_stream(s)
        for k in range(2):
            x.copy_(torch.full_like(x, float(rank + 1 + k)))
            graph.replay()
            torch.cuda.synchronize()
            out[("graph", k)] = y.cpu()
        q.put((rank, out))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not ON_GPUS, reason="needs V4SERVE_TEST_DEVICE=cuda and two GPUs (NCCL, symmetric memory)")
def test_one_shot_matches_nccl_on_two_gpus() -> None:
    got = _on_two_ranks(_nccl_rank, 240)
    for key, (one, ref) in ((k, v) for k, v in got[0].items() if k[0] != "graph"):
        other = got[1][key][0]
        assert torch.equal(one, other), f"{key}: the ranks hold different sums"
        tol = 1e-2 if one.dtype == torch.bfloat16 else 1e-5
        assert torch.allclose(one.float(), ref.float(), rtol=tol, atol=tol), key
    for k in range(2):
        want = float((1 + k) + (2 + k))
        assert bool((got[0][("graph", k)] == want).all()) and bool((got[1][("graph", k)] == want).all())
