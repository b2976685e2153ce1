"""Microbenchmark of the fused row finishing (ops/kernels/finish.py) at V4-Flash / V4.1-Flash shapes, one GPU.

    python benchmarks/kernels/finish.py [--out DIR] [--quick] [--case NAME ...]
    python benchmarks/kernels/finish.py --cpu      # a smoke run under Triton's interpreter (tiny shapes, no timing)

Every chain the models finish: the window KV row (norm, RoPE, FP8: V4's 584-B format alone, V4.1's FP8-per-32 with its
store into the window ring), the compressed entry (norm, RoPE, FP8 / NVFP4, stored), the V4 index key (norm, RoPE,
Hadamard, MXFP4, stored) and the index queries [N, 64, 128] (RoPE, Hadamard, MXFP4). Decode steps of 1, 32 and 64 rows
and a 4096-row prefill chunk, in bf16. Each case is checked against the plain-torch reference first (values, and the
stored records against `codec.encode` of the finished values). Decode is timed in-step (several calls on their own
operands replayed from one CUDA graph), prefill by CUDA events; achieved GB/s is on the bytes read (rows, cos/sin,
norm weight) plus written (finished rows, records) against the HBM copy ceiling measured in the same run. The torch
reference (one launch per op) is timed beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

D_KV, RD, D_IDX, HEADS, POOL_ROWS = 512, 64, 128, 64, 1 << 16
# name: (row dim, query heads or None, norm, rotate, simulation format, record kind or None)
CASES = {
    "v4-window": (D_KV, None, True, False, "v4_fp8", None),
    "v4-entry": (D_KV, None, True, False, "v4_fp8", "v4_fp8"),
    "v41-window": (D_KV, None, True, False, "fp8_b32", "fp8_b32"),
    "v41-entry": (D_KV, None, True, False, "nvfp4", "nvfp4"),
    "index-key": (D_IDX, None, True, True, "mxfp4", "mxfp4"),
    "index-query": (D_IDX, HEADS, False, True, "mxfp4", None),
}
SHAPES = [("decode", 1), ("decode", 32), ("decode", 64), ("prefill", 4096)]


def variants(kernel, rotate: bool, quick: bool) -> dict:
    if quick:
        return {"default": None}
    if rotate:
        return {"default": None, "r16w4": kernel.Config(16, 4, 8 * 132), "r16w8-all": kernel.Config(16, 8, 0),
                "r16w8-4x": kernel.Config(16, 8, 4 * 132), "r16w8-16x": kernel.Config(16, 8, 16 * 132),
                "r32w8": kernel.Config(32, 8, 8 * 132), "r64w8": kernel.Config(64, 8, 8 * 132)}
    return {"default": None, "r1w1": kernel.Config(1, 1), "r1w2": kernel.Config(1, 2), "r2w4": kernel.Config(2, 4),
            "r4w4": kernel.Config(4, 4), "r8w4": kernel.Config(8, 4), "r8w8": kernel.Config(8, 8)}


def case(name: str, n: int, device: str, dtype: torch.dtype, copies: int):
    """`copies` operand sets of one case, in finish_rows' argument order (x, weight, eps, cos, sin, rotate, fmt, rope,
    pool, rows); bytes moved per call."""
    from v4serve.cache.formats import Codec
    from v4serve.cache.pool import RowPool

    d, heads, norm, rotate, fmt, kind = CASES[name]
    shape = (n, d) if heads is None else (n, heads, d)
    pool = None
    if kind is not None:
        pool = RowPool(Codec(kind, d, RD if kind == "v4_fp8" else 0, dtype), POOL_ROWS if device == "cuda" else 64,
                       device)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, RD, 2, dtype=torch.float32, device=device) / RD))
    w = (torch.rand(d, device=device) + 0.5).to(dtype) if norm else None
    sets = []
    for _ in range(copies):
        ang = torch.randint(0, 65536, (n,), device=device).float().unsqueeze(1) * freqs
        rows = torch.randperm(pool.rows + 1, device=device)[:n] if pool is not None else None
        sets.append((torch.randn(shape, device=device, dtype=dtype), w, 1e-6, ang.cos(), ang.sin(), rotate, fmt, RD, pool,
                     rows))
    elem = torch.empty(0, dtype=dtype).element_size()
    moved = 2 * n * (heads or 1) * d * elem + 2 * n * (RD // 2) * 4 + (d * elem if norm else 0)
    if pool is not None:
        moved += n * pool.codec.record_bytes + n * 8
    return sets, moved


def check(kernel, reference, a) -> str:
    """The kernel against the reference on one operand set: max relative error, share of equal values, records."""
    x, w, eps, cos, sin, rotate, fmt, rope, pool, rows = a
    pool_ref = None
    if pool is not None:
        from v4serve.cache.pool import RowPool

        pool_ref = RowPool(pool.codec, pool.rows, x.device)
        pool_ref.data.copy_(pool.data)
    ref = reference(x, w, eps, cos, sin, rotate, fmt, rope, pool_ref, rows)
    got = kernel.finish_rows(x, w, eps, cos, sin, rotate, fmt, rope, pool, rows)
    err = float((got.double() - ref.double()).abs().max() / ref.double().abs().max())
    same = float((got == ref).double().mean())
    rec = "-"
    if pool is not None:
        enc = pool.codec.encode(got.reshape(-1, x.shape[-1]))
        ok = torch.equal(pool.data[rows].contiguous().view(torch.uint8), enc.contiguous().view(torch.uint8))
        rec = "records=encode" if ok else "RECORDS DIFFER FROM encode(values)"
    return f"err {err:.1e} equal {same * 100:.3f}% {rec}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default config only")
    ap.add_argument("--case", choices=sorted(CASES), action="append", help="cases to run (default: all)")
    ap.add_argument("--cpu", action="store_true", help="smoke run under Triton's CPU interpreter: checks only")
    args = ap.parse_args()
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    from common import bench_graph_many, bench_ms, copies_past_l2, measure_ceilings, write_json

    from v4serve.ops.finish import finish_rows_reference
    from v4serve.ops.kernels import finish as kernel

    names = args.case or list(CASES)
    if args.cpu:
        torch.manual_seed(0)
        for name in names:
            for n in (1, 5):
                sets, _ = case(name, n, "cpu", torch.bfloat16, 1)
                print(f"{name:16s} N={n:2d} {check(kernel, finish_rows_reference, sets[0])}", flush=True)
        return
    ceil = measure_ceilings()
    hbm = ceil["hbm_bytes_per_s"]
    print(f"HBM copy ceiling (same run): {hbm / 1e12:.2f} TB/s", flush=True)
    rows_out = []
    for name in names:
        rotate = CASES[name][3]
        for phase, n in SHAPES:
            one, moved = case(name, n, "cuda", torch.bfloat16, 1)
            many, _ = case(name, n, "cuda", torch.bfloat16, copies_past_l2(moved, cap=16) if phase == "decode" else 1)
            verdict = check(kernel, finish_rows_reference, one[0])
            for vname, cfg in variants(kernel, rotate, args.quick).items():
                try:
                    fns = [lambda a=a, c=cfg: kernel.finish_rows(*a, config=c) for a in many]
                    ms = bench_graph_many(fns) if phase == "decode" else bench_ms(fns[0])
                except Exception as e:  # noqa: BLE001 - a config the compiler rejects
                    print(f"{name} {phase} N={n} {vname}: failed ({type(e).__name__}: {e})"[:200], flush=True)
                    continue
                gbs = moved / ms / 1e6
                row = {"case": name, "phase": phase, "rows": n, "variant": vname, "ms": ms, "bytes": moved,
                       "gb_s": gbs, "pct_hbm": gbs * 1e9 / hbm * 100, "check": verdict}
                rows_out.append(row)
                print(f"{name:16s} {phase:7s} N={n:5d} {vname:8s} {ms * 1e3:8.2f} us {gbs:7.0f} GB/s "
                      f"({row['pct_hbm']:5.1f}% HBM)  {verdict}", flush=True)
            if n in (32, 4096):
                a = one[0]
                ms_ref = bench_ms(lambda a=a: finish_rows_reference(*a))
                print(f"{'':16s} reference (torch, one launch per op) {ms_ref * 1e3:8.2f} us", flush=True)
            del one, many
            torch.cuda.empty_cache()
    write_json(args.out, "finish-" + "-".join(args.case or ["all"]), {"ceilings": ceil, "rows": rows_out})


if __name__ == "__main__":
    main()
