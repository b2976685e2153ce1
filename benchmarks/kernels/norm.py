"""Microbenchmark of the wide-row RMS norm (ops/kernels/norm.py: the q latent, the model width) against the torch
reference, one GPU.

    python benchmarks/kernels/norm.py [--out DIR]
    python benchmarks/kernels/norm.py --cpu      # a smoke run under Triton's interpreter (checks only, no timing)
    python benchmarks/kernels/norm.py --fp8 128  # the norm that also quantizes its rows for the GEMM they feed
                                                 # (rms_norm_fp8, one launch) beside the norm + act_quant (two)

Rows of V4-Flash's q latent (1,024), V4-Pro's (1,536) and the model widths (4,096 / 7,168) in bf16, decode (1, 32, 64
rows, in-step timing over copies past L2) and prefill (4,096 rows, CUDA events). Bytes: rows read and written, the
weight read; achieved GB/s beside the HBM copy ceiling measured in the same run. Checked against ops.norm.rms_norm
first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

WIDTHS = (1024, 1536, 4096, 7168)
ROWS = (("decode", 1), ("decode", 32), ("decode", 64), ("prefill", 4096))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu", action="store_true", help="smoke run under Triton's CPU interpreter: checks only")
    ap.add_argument("--fp8", type=int, default=0, metavar="GROUP",
                    help="time rms_norm_fp8 (norm + FP8 quantization per 1 x GROUP in one launch) instead")
    args = ap.parse_args()
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    from common import bench_graph_many, bench_ms, copies_past_l2, measure_ceilings, write_json

    from v4serve.ops import quant
    from v4serve.ops.kernels import norm as kernel
    from v4serve.ops.kernels.quant import act_quant
    from v4serve.ops.norm import rms_norm

    G = args.fp8
    if G:  # the fused launch against the two it replaces; checked bit for bit against fp8_quantize of its own rows
        def fast(a):
            return kernel.rms_norm_fp8(a, w, 1e-6, G)

        def slow(a):
            return act_quant(kernel.rms_norm(a, w, 1e-6), G)

        def error(a) -> float:
            y, q = fast(a)
            values, scales = quant.fp8_quantize(y, G)
            same = torch.equal(q.values.float(), values.float()) and torch.equal(q.scales, scales)
            return float((y.float() - rms_norm(a, w, 1e-6).float()).abs().max()) if same else float("inf")
    else:
        def fast(a):
            return kernel.rms_norm(a, w, 1e-6)

        def slow(a):
            return rms_norm(a, w, 1e-6)

        def error(a) -> float:
            return float((fast(a).float() - slow(a).float()).abs().max())

    dev = "cpu" if args.cpu else "cuda"
    hbm = None if args.cpu else measure_ceilings()["hbm_bytes_per_s"]
    if hbm:
        print(f"HBM copy ceiling (same run): {hbm / 1e12:.2f} TB/s", flush=True)
    rows_out = []
    for d in WIDTHS:
        w = (torch.rand(d, device=dev) + 0.5).bfloat16()
        for phase, n in ROWS[:2] if args.cpu else ROWS:
            x = torch.randn(n, d, device=dev).bfloat16()
            if G and d % G:
                continue
            err = error(x)  # inf: the fused quantization differs from fp8_quantize of its rows
            if args.cpu:
                print(f"D={d:5d} N={n:4d} max abs err vs reference {err:.2e}", flush=True)
                continue
            moved = 2 * n * d * 2 + d * 2 + (n * d + n * d // G * 4 if G else 0)
            if phase == "decode":
                xs = [torch.randn(n, d, device=dev).bfloat16() for _ in range(copies_past_l2(moved, cap=32))]
                ms = bench_graph_many([lambda a=a: fast(a) for a in xs])
                ref = bench_graph_many([lambda a=a: slow(a) for a in xs])
            else:
                ms, ref = bench_ms(lambda: fast(x)), bench_ms(lambda: slow(x))
            gbs = moved / ms / 1e6
            row = {"dim": d, "phase": phase, "rows": n, "ms": ms, "reference_ms": ref, "gb_s": gbs,
                   "pct_hbm": gbs * 1e9 / hbm * 100, "max_abs_err": err, "fp8_group": G}
            rows_out.append(row)
            print(f"D={d:5d} {phase:7s} N={n:5d} {ms * 1e3:8.2f} us {gbs:7.0f} GB/s ({row['pct_hbm']:5.1f}% HBM)  "
                  f"{'norm + act_quant' if G else 'torch'} {ref * 1e3:8.2f} us  err {err:.1e}", flush=True)
    if not args.cpu:
        write_json(args.out, f"norm_fp8_{G}" if G else "norm", {"hbm_bytes_per_s": hbm, "rows": rows_out})


if __name__ == "__main__":
    main()
