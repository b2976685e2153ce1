"""Microbenchmark of a step's addressing (ops/kernels/addressing.py) at V4-Flash's geometry, one GPU.

    python benchmarks/kernels/addressing.py [--out DIR]
    python benchmarks/kernels/addressing.py --cpu      # a smoke run under Triton's interpreter (checks only)

The window launch (each token's window source rows and mask, the ring rows, its write row and both RoPE tables: 128
window positions, rope_dim 64) and one compression launch per ratio (4 and 128, 256-position blocks: the completed
groups, their pool rows and RoPE, each token's visible count), on decode steps of 1, 32 and 128 rows at 2K-64K
positions and on an 8,192-token prefill of 4 rows. Each is checked against the plain-torch reference first (integers
equal, RoPE within 2e-6), then timed in-step (replayed from one CUDA graph; the references too, one launch per op);
GB/s is on the bytes read and written against the HBM copy ceiling measured in the same run. These launches move
kilobytes: their cost is latency, which is what the reference's ~40 launches each paid.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

W, HALF, BLOCK, NUM_BLOCKS = 128, 32, 256, 4096
SHAPES = [("decode", 1, 1), ("decode", 32, 32), ("decode", 128, 128), ("prefill", 4, 8192)]  # (phase, rows, tokens)


def make_step(rows: int, tokens: int, device: str, seed: int = 0):
    """A step of `rows` rows sharing `tokens` tokens, each row at a random position in 2K-64K with its blocks."""
    from v4serve.models.step import RowSpec, build_step

    g = torch.Generator().manual_seed(seed)
    per = tokens // rows
    specs = []
    for i in range(rows):
        start = int(torch.randint(2048, 65536 - per, (1,), generator=g))
        nb = -(-(start + per) // BLOCK)
        blocks = torch.randint(0, NUM_BLOCKS, (nb,), generator=g).tolist()
        specs.append(RowSpec([1] * per, start, slot=i, blocks=blocks, cached_len=start // 2 if i % 2 else 0))
    return build_step(specs, device)


def freqs(device: str) -> list[torch.Tensor]:
    return [1.0 / (10000.0 ** (torch.arange(HALF, dtype=torch.float32, device=device) / HALF)) * s
            for s in (1.0, 0.25)]


def calls(step, device: str) -> dict:
    """name -> (kernel call, reference call, bytes moved by the kernel)."""
    from v4serve.ops import addressing as ops
    from v4serve.ops.backend import TRITON

    from v4serve.cache.pool import KVPools

    class Ring:  # the KV pools' ring layout, W slots a row, the trash slot after the rows
        window_size, trash_slot, window_rows = W, step.num_rows, KVPools.window_rows

    T, R = step.num_tokens, step.num_rows
    fr = freqs(device)
    ring = Ring()
    out = {"window": (lambda: ops.window_addressing(step, ring, fr, TRITON),
                      lambda: ops.window_addressing_reference(step, ring, fr),
                      T * 8 * 2 + R * 8 * 6 + T * W * 9 + R * W * 8 + T * 8 + 2 * 2 * T * HALF * 4)}
    for ratio in (4, 128):
        G = T // ratio + R
        e_max = 65536 // ratio
        out[f"compression/{ratio}"] = (
            lambda r=ratio, e=e_max: ops.compression_addressing(step, r, BLOCK, NUM_BLOCKS, e, fr[1], TRITON),
            lambda r=ratio, e=e_max: ops.compression_addressing_reference(step, r, BLOCK, NUM_BLOCKS, e, fr[1]),
            T * 8 * 2 + R * 8 * 3 + R * step.block_table.shape[1] * 8 + G * (3 * 8 + 1) + 2 * G * HALF * 4)
    return out


def check(got, ref) -> str:
    """Integers and masks equal, RoPE tables within 2e-6."""
    def flat(a):
        if hasattr(a, "groups"):
            return [a.groups.row, a.groups.entry, a.groups.valid, a.rows, a.visible], [a.cos, a.sin]
        return [a.src, a.valid, a.ring_rows, a.write], [t for pair in a.rope for t in pair]

    (ints_g, fl_g), (ints_r, fl_r) = flat(got), flat(ref)
    ok = all(torch.equal(a, b) for a, b in zip(ints_g, ints_r))
    err = max(float((a - b).abs().max()) for a, b in zip(fl_g, fl_r))
    return f"integers {'equal' if ok else 'DIFFER'}, RoPE max err {err:.1e}" + ("" if ok and err <= 2e-6 else " FAIL")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu", action="store_true", help="smoke run under Triton's CPU interpreter: checks only")
    args = ap.parse_args()
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    from common import bench_graph_many, bench_ms, describe, measure_ceilings, write_json

    if args.cpu:
        for rows, tokens in ((1, 1), (4, 64)):
            step = make_step(rows, tokens, "cpu")
            for name, (kern, ref, _) in calls(step, "cpu").items():
                print(f"{name:16s} rows={rows:3d} tokens={tokens:5d} {check(kern(), ref())}", flush=True)
        return
    ceil = measure_ceilings()
    print(describe(ceil), flush=True)
    hbm = ceil["hbm_bytes_per_s"]
    rows_out = []
    for phase, rows, tokens in SHAPES:
        step = make_step(rows, tokens, "cuda")
        for name, (kern, ref, moved) in calls(step, "cuda").items():
            verdict = check(kern(), ref())
            ms = bench_graph_many([kern] * 8)
            try:
                ms_ref = bench_graph_many([ref] * 8)
            except Exception:  # noqa: BLE001 - a reference op that cannot be captured: timed eagerly
                ms_ref = bench_ms(ref)
            gbs = moved / ms / 1e6
            row = {"call": name, "phase": phase, "rows": rows, "tokens": tokens, "ms": ms, "reference_ms": ms_ref,
                   "bytes": moved, "gb_s": gbs, "pct_hbm": gbs * 1e9 / hbm * 100, "check": verdict}
            rows_out.append(row)
            print(f"{name:16s} {phase:7s} R={rows:4d} T={tokens:5d} {ms * 1e3:7.2f} us ({gbs:6.1f} GB/s, "
                  f"{row['pct_hbm']:5.2f}% HBM); reference {ms_ref * 1e3:7.2f} us  {verdict}", flush=True)
    write_json(args.out, "addressing", {"ceilings": ceil, "rows": rows_out})


if __name__ == "__main__":
    main()
