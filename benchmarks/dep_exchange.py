"""DEP token exchange: the collectives one MoE layer can use to move tokens between data-parallel ranks, timed.

    python benchmarks/dep_exchange.py [--ranks 2] [--dim 4096] [--tokens 16 256] [--backend gloo|nccl]

Per rank [T, dim] float32 activations. Dispatch: all-gather of every rank's tokens. Combine (the sum of every rank's
partial outputs for a rank's tokens): reduce-scatter, an all-to-all of the partials plus a local sum in rank order,
or an all-reduce of all gathered rows. Numbers for docs/parallel.md (gloo, 2 ranks on 2 CPU cores: all-gather 0.8 /
6.7 ms, reduce-scatter 0.8 / 9.2 ms, all-to-all + sum 0.8 / 4.2 ms, all-reduce 2.1 / 7.8 ms at T = 16 / 256).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _run(rank: int, world: int, port: int, backend: str, dim: int, tokens: list[int], reps: int) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, rank=rank, world_size=world)
    for T in tokens:
        x = torch.randn(T, dim, device=dev)
        big = torch.randn(world * T, dim, device=dev)

        def a2a_sum() -> None:
            out = torch.empty_like(big)
            dist.all_to_all_single(out, big)
            out.view(world, T, dim).sum(0)

        ops = {"all-gather (dispatch)": lambda: _gather(torch.empty(world * T, dim, device=dev), x),
               "reduce-scatter (combine)": lambda: _rs(torch.empty(T, dim, device=dev), big),
               "all-to-all + sum (combine)": a2a_sum,
               "all-reduce of all rows (combine)": lambda: dist.all_reduce(big.clone())}
        for name, fn in ops.items():
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / reps
            if rank == 0:
                print(f"{backend} ranks={world} T={T} dim={dim} {name}: {dt * 1e3:.2f} ms", flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 256])
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(a.ranks, port, a.backend, a.dim, a.tokens, a.reps), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
