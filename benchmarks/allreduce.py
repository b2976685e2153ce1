"""The TP all-reduce at decode sizes: NCCL against the one-shot all-reduce over symmetric memory (dist/allreduce.py).

    python benchmarks/allreduce.py [--ranks 2] [--dim 4096] [--rows 1 8 32 128] [--out DIR]

Per rank a [rows, dim] bf16 partial (a row-parallel projection's output). The sum alone (NCCL, one-shot), and the sum
with the mHC expansion that consumes it (`hc_post`; in the fused mode the expansion does the sum). Each variant is
timed two ways: eager calls (host launch included) and 20 calls captured in one CUDA graph (per call: the GPU-side
latency a graphed decode step pays), with the bus bandwidth that graphed time achieves beside the ceiling measured in
the same run: NCCL's bus bandwidth on a 256 MB all-reduce (busbw = bytes * 2 (N - 1) / N / time). Needs two or more
GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CALLS = 20


def _time(fn, reps: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def _graphed(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            for _ in range(CALLS):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    return g


def _run(rank: int, world: int, port: int, dim: int, rows: list[int], out: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    from v4serve.dist import allreduce
    from v4serve.ops.kernels import mhc as mk

    big = torch.randn(128 << 20, device="cuda", dtype=torch.bfloat16)  # 256 MB
    t = _time(lambda: dist.all_reduce(big), reps=10)
    busbw = big.numel() * 2 * 2 * (world - 1) / world / t / 1e9
    report = {"ranks": world, "dim": dim, "nccl_busbw_GBps_256MB": busbw, "rows": {}}
    if rank == 0:
        print(f"ceiling: NCCL all-reduce of 256 MB, bus bandwidth {busbw:.0f} GB/s ({world} ranks)", flush=True)
    for R in rows:
        x = torch.randn(R, dim, device="cuda", dtype=torch.bfloat16)
        streams = torch.randn(R, 4, dim, device="cuda", dtype=torch.bfloat16)
        post, comb = torch.rand(R, 4, device="cuda"), torch.rand(R, 4, 4, device="cuda")
        nbytes = R * dim * 2 * 2 * (world - 1) / world  # the all-reduce's bus bytes, as NCCL counts them
        variants = {}
        # the sum alone (nccl, symm), and the sum with the mHC expansion that consumes it (every mode: fused has no
        # sum apart from it)
        for name, seam in ((allreduce.NCCL, False), (allreduce.SYMM, False), (allreduce.NCCL, True),
                           (allreduce.SYMM, True), (allreduce.FUSED, True)):
            os.environ["V4SERVE_ALLREDUCE"] = name

            def call() -> torch.Tensor:
                y = allreduce.all_reduce(x.clone() if name == allreduce.NCCL else x, defer=seam)
                return mk.hc_post(y, streams, post, comb) if seam else y

            eager = _time(call)
            g = _graphed(call)
            graphed = _time(g.replay, reps=20) / CALLS
            variants[name + ("+hc_post" if seam else "")] = {
                "eager_us": eager * 1e6, "graph_us": graphed * 1e6, "graph_busbw_GBps": nbytes / graphed / 1e9}
        report["rows"][R] = variants
        if rank == 0:
            print(f"rows={R:4d} ({R * dim * 2 / 1e6:.3f} MB)", flush=True)
            for n, v in variants.items():
                print(f"  {n:14s} eager {v['eager_us']:7.1f} us, in a graph {v['graph_us']:7.1f} us "
                      f"({v['graph_busbw_GBps']:6.1f} GB/s of {busbw:.0f})", flush=True)
    if rank == 0 and out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "allreduce.json").write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if torch.cuda.device_count() < a.ranks:
        raise SystemExit(f"needs {a.ranks} GPUs, found {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(a.ranks, port, a.dim, a.rows, a.out), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
