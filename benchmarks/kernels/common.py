"""Shared pieces of the kernel microbenchmarks: ceilings measured in the same run, timing, JSON output.

Ceilings (METHOD.md): HBM = a large device-to-device copy (bytes read + written); FP8 peak = `torch._scaled_mm` on
8192^3 e4m3 operands; bf16 peak = an 8192^3 bf16 matmul. All on random data, median of CUDA-event timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def bench_ms(fn, warmup: int = 10, iters: int = 50) -> float:
    """Median milliseconds of fn() by CUDA events (a graph of one call when it captures, to drop launch gaps)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=iters, return_mode="median"))


def bench_graph_ms(fn, iters: int = 20) -> float:
    """Median ms of fn() replayed from a CUDA graph (the way decode runs); falls back to eager timing."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return bench_ms(g.replay, iters=iters)
    except Exception:  # noqa: BLE001 - some paths cannot be captured; time them eagerly
        return bench_ms(fn, iters=iters)


def bench_graph_many(fns, iters: int = 20) -> float:
    """Median ms per call of fns[0](), fns[1](), ... replayed back to back from one CUDA graph: the in-step cost of a
    kernel (no per-launch graph latency), each call on its own operands so that none is served from L2 (50 MB on the
    H200) by the call before it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    return bench_ms(g.replay, iters=iters) / len(fns)


def copies_past_l2(nbytes: int, budget: int = 256 << 20, cap: int = 64) -> int:
    """How many copies of an operand of nbytes make a rotation that L2 cannot hold."""
    return max(2, min(cap, -(-budget // max(1, nbytes))))


def measure_ceilings(device: str = "cuda") -> dict[str, float]:
    n = 1 << 30
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    copy_ms = bench_ms(lambda: b.copy_(a))
    del a, b
    m = 8192
    x = torch.randn(m, m, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(m, m, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    fp8_ms = bench_ms(lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    xb = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    bf16_ms = bench_ms(lambda: xb @ xb)
    return {"hbm_bytes_per_s": 2 * n / (copy_ms * 1e-3), "fp8_flops": 2 * m**3 / (fp8_ms * 1e-3),
            "bf16_flops": 2 * m**3 / (bf16_ms * 1e-3)}


def describe(ceil: dict[str, float]) -> str:
    return (f"ceilings (same run): HBM copy {ceil['hbm_bytes_per_s'] / 1e12:.2f} TB/s, FP8 _scaled_mm "
            f"{ceil['fp8_flops'] / 1e12:.0f} TFLOP/s, bf16 matmul {ceil['bf16_flops'] / 1e12:.0f} TFLOP/s")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return "unknown"


def write_json(out: str | None, name: str, payload: dict) -> None:
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    payload = {"gpu": torch.cuda.get_device_name(), "commit": commit(), "date": time.strftime("%Y-%m-%d"),
               **payload}
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(payload, f, indent=2)
