"""dist/allreduce.py: the TP all-reduce's choice (NCCL / gloo, one-shot over symmetric memory, or the sum left to the
mHC expansion) and, on two GPUs, those paths against NCCL — the same sums on every rank, eager and inside a captured
CUDA graph, and the fused expansion of two ranks' partials."""

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
        os.environ["V4SERVE_ALLREDUCE"] = "fused"  # a deferred sum of CPU tensors: summed here all the same
        z = allreduce.all_reduce(torch.arange(6, dtype=torch.float32).view(2, 3) * (rank + 1), defer=True,
                                 out_dtype=torch.float64)
        q.put((rank, (y.tolist(), z.dtype, z.tolist())))
    finally:
        dist.destroy_process_group()


def test_cpu_tensors_take_gloo_whatever_the_choice() -> None:
    """V4SERVE_ALLREDUCE=symm / fused only concern CUDA tensors: on the CPU the sum is gloo's, exact (a deferred
    one too, cast to the asked dtype)."""
    got = _on_two_ranks(_gloo_rank, 120)
    want = (torch.arange(6, dtype=torch.float64).view(2, 3) * 3).tolist()
    assert got == {0: (want, torch.float64, want), 1: (want, torch.float64, want)}


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
        # fused: each rank's partial staged, the expansion sums both as it loads them (against NCCL's sum)
        from v4serve.ops.kernels import mhc as mk

        os.environ["V4SERVE_ALLREDUCE"] = "fused"
        for dtype, out_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)):
            part = torch.randn(32, 4096, device="cuda", dtype=dtype, generator=g)
            streams = torch.randn(32, 4, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
            post = torch.rand(32, 4, device="cuda", generator=g)
            comb = torch.rand(32, 4, 4, device="cuda", generator=g)
            staged = allreduce.all_reduce(part.clone(), defer=True, out_dtype=out_dtype)
            fused = mk.hc_post(staged, streams, post, comb)
            torch.cuda.synchronize()
            os.environ["V4SERVE_ALLREDUCE"] = "nccl"
            summed = allreduce.all_reduce(part.clone(), out_dtype=out_dtype)
            os.environ["V4SERVE_ALLREDUCE"] = "fused"
            out[("fused", str(dtype))] = (fused.cpu(), mk.hc_post(summed, streams, post, comb).cpu())
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
    for key, (one, ref) in ((k, v) for k, v in got[0].items() if k[0] not in ("graph", "fused")):
        other = got[1][key][0]
        assert torch.equal(one, other), f"{key}: the ranks hold different sums"
        tol = 1e-2 if one.dtype == torch.bfloat16 else 1e-5
        assert torch.allclose(one.float(), ref.float(), rtol=tol, atol=tol), key
    for key in (k for k in got[0] if k[0] == "fused"):  # the fused expansion: both ranks the same bits, ~NCCL's
        assert torch.equal(got[0][key][0], got[1][key][0]), key
        assert torch.allclose(got[0][key][0].float(), got[0][key][1].float(), rtol=2e-2, atol=2e-2), key
    for k in range(2):
        want = float((1 + k) + (2 + k))
        assert bool((got[0][("graph", k)] == want).all()) and bool((got[1][("graph", k)] == want).all())
