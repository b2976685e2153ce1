"""Engram's gated stream update (ops/kernels/engram.py) against its torch reference on one GPU, V4.1-Flash's shapes.

    python benchmarks/kernels/engram.py [--out DIR] [--tokens 1,8,32,128,2048] [--block 2048]

Per T: streams x [T, 4, 5120] bf16, key and value as views of one float32 projection [T, 5 * 5120] (as the layer
has them), bf16 q / k weights [4, 5120]. Both bodies are checked against each other first, then timed from a CUDA
graph over rotated operand copies (none served from L2 by the call before). Bytes counted once each: x read and
written, key, value, both weights. GB/s against the HBM copy ceiling measured in the same run; at decode sizes the
launch is latency bound (~0.5 MB moved at T = 1), so the reference's ~29 launches are the comparison that matters.
"""

from __future__ import annotations

import argparse

import common
import torch

from v4serve.ops.engram import engram_mix_reference
from v4serve.ops.kernels import engram as kernel

HC, D = 4, 5120


def inputs(t: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, HC, D, device="cuda", generator=g).bfloat16()
    kv = torch.randn(t, (HC + 1) * D, device="cuda", generator=g)
    qw = (1 + 0.1 * torch.randn(HC, D, device="cuda", generator=g)).bfloat16()
    kw = (1 + 0.1 * torch.randn(HC, D, device="cuda", generator=g)).bfloat16()
    live = torch.ones(t, dtype=torch.bool, device="cuda")
    return x, kv[:, : HC * D].view(t, HC, D), kv[:, HC * D:], qw, kw, live


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", default="1,8,32,128,2048")
    ap.add_argument("--block", type=int, default=None, help="the kernel's D chunk (default: its own choice)")
    args = ap.parse_args()
    ceil = common.measure_ceilings()
    print(common.describe(ceil), flush=True)
    hbm = ceil["hbm_bytes_per_s"]
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        nbytes = 2 * t * HC * D * 2 + (t * HC * D + t * D) * 4 + 2 * HC * D * 2
        sets = [inputs(t, seed=t + i) for i in range(common.copies_past_l2(nbytes, cap=16))]
        got = kernel.engram_mix(*sets[0], 1e-20, block=args.block)
        want = engram_mix_reference(*sets[0], 1e-20)
        err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        k_ms = common.bench_graph_many([lambda s=s: kernel.engram_mix(*s, 1e-20, block=args.block) for s in sets])
        r_ms = common.bench_graph_many([lambda s=s: engram_mix_reference(*s, 1e-20) for s in sets])
        row = {"tokens": t, "kernel_us": k_ms * 1e3, "reference_us": r_ms * 1e3, "bytes": nbytes,
               "gb_s": nbytes / (k_ms * 1e-3) / 1e9, "pct_hbm": nbytes / (k_ms * 1e-3) / hbm * 100, "rel_err": err}
        rows.append(row)
        print(f"engram_mix T={t:5d}  kernel {row['kernel_us']:8.1f} us  reference {row['reference_us']:8.1f} us  "
              f"{row['gb_s']:7.0f} GB/s ({row['pct_hbm']:5.1f}% HBM)  err {err:.1e}", flush=True)
    common.write_json(args.out, "engram", {"ceilings": ceil, "rows": rows})


if __name__ == "__main__":
    main()
