"""Microbenchmark of the fused sparse attention (ops/kernels/attention.py) at V4-Flash / V4.1-Flash shapes, one GPU.

    python benchmarks/kernels/attention.py [--out DIR] [--quick]

Decode: R rows of one token each at 64K context; each token reads its 128 window rows from the ring and 512 compressed
entries (CSA picks out of 16K, or HCA's 512 visible entries), from pools in their stored formats. Achieved GB/s is on the
bytes the step must read (window + entry records, queries, outputs) against the HBM copy ceiling measured in the same
run (issue target: >= 60% at batch 32). Prefill: one 4K-token chunk, TFLOP/s on QK + PV against the bf16 matmul
ceiling (target: >= 35%). Each case is checked against the plain-torch reference first; tile variants are timed side by
side so the committed config can be chosen from one run.
"""

from __future__ import annotations

import argparse

import torch
from common import bench_graph_many, bench_ms, describe, measure_ceilings, write_json

from v4serve.cache.formats import Codec
from v4serve.cache.pool import RowPool
from v4serve.ops import attention as attn
from v4serve.ops.indexer import Entries
from v4serve.ops.kernels import attention as kernel

H, D, RD, W = 64, 512, 64, 128
CONTEXT, BLOCK = 65536, 256
FORMATS = {"v4": ("v4_fp8", "v4_fp8"), "v41": ("fp8_b32", "nvfp4"), "bf16": ("plain", "plain")}
# Config(heads, rows, dsplit, warps, stages)
VARIANTS = {"default": None, "n16": kernel.Config(16, 16, 4, 4, 1), "n64w8": kernel.Config(16, 64, 4, 8, 1),
            "w8": kernel.Config(16, 32, 4, 8, 1), "d2w8": kernel.Config(16, 32, 2, 8, 1),
            "d8": kernel.Config(16, 32, 8, 4, 1), "s2": kernel.Config(16, 32, 4, 4, 2),
            "h32w8": kernel.Config(32, 32, 4, 8, 1), "h64w8": kernel.Config(64, 32, 4, 8, 1)}


def pool(kind: str, rows: int) -> RowPool:
    codec = Codec(kind, D, RD, torch.bfloat16)
    p = RowPool(codec, rows, "cuda")
    for lo in range(0, rows + 1, 1 << 16):
        hi = min(rows + 1, lo + (1 << 16))
        p.data[lo:hi] = codec.encode(torch.randn(hi - lo, D, device="cuda"))
    return p


def case(wkind: str, ckind: str, rows: int, tokens_per_row: int, dense: bool, copies: int = 1):
    """Rows at CONTEXT with their last `tokens_per_row` positions in this step; CSA picks or HCA dense entries."""
    ratio = 128 if dense else 4
    T = rows * tokens_per_row
    ring = pool(wkind, rows * W)
    ring_rows = torch.randperm(rows * W, device="cuda")
    r = torch.arange(rows, device="cuda").repeat_interleave(tokens_per_row)
    pos = CONTEXT - tokens_per_row + torch.arange(T, device="cuda") % tokens_per_row
    k = torch.arange(W, device="cuda")
    p = pos.unsqueeze(1) - (W - 1) + k
    start = CONTEXT - tokens_per_row
    fresh_idx = r.unsqueeze(1) * tokens_per_row + (p - start)
    src = torch.where(p >= start, rows * W + fresh_idx, r.unsqueeze(1) * W + p % W)
    window = attn.WindowRefs(ring, src, torch.ones(T, W, dtype=torch.bool, device="cuda"), ring_rows)
    entries_per_row = CONTEXT // ratio
    blocks_per_row = CONTEXT // BLOCK
    comp = pool(ckind, rows * entries_per_row)
    visible = torch.div(pos + 1, ratio, rounding_mode="floor")
    variants = []  # rotations of block tables (and picks): each call reads other rows of the pools than the last
    for _ in range(copies):
        bt = torch.randperm(rows * blocks_per_row, device="cuda").view(rows, blocks_per_row)
        picks = None
        if not dense:
            picks = torch.rand(T, entries_per_row, device="cuda").argsort(dim=1)[:, :512].contiguous()
        where = Entries(bt, r, visible, ratio, BLOCK, rows * blocks_per_row, entries_per_row)
        variants.append(attn.EntryRefs(comp, where, picks))
    entries = variants[0]
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    fresh = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, RD, 2, dtype=torch.float32, device="cuda") / RD))
    ang = pos.float().unsqueeze(1) * freqs
    sink = torch.randn(H, device="cuda")
    n_entries = 512 if not dense else int(visible.max())
    read = T * (W * ring.codec.record_bytes + n_entries * comp.codec.record_bytes) + 2 * q.numel() * 2
    flops = 4 * T * H * D * (W + n_entries)
    args = (q, ang.cos(), ang.sin(), fresh, sink, D ** -0.5, None, window)
    return [args + (e,) for e in variants], read, flops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default config only")
    ap.add_argument("--format", choices=sorted(FORMATS), action="append",
                    help="record formats to time (default: all; a CUDA fault ends the process, so the session script "
                         "runs one format per process)")
    args = ap.parse_args()
    ceil = measure_ceilings()
    print(describe(ceil), flush=True)
    hbm, bf16 = ceil["hbm_bytes_per_s"], ceil["bf16_flops"]
    rows = []
    shapes = [("decode", 1, 1), ("decode", 32, 1), ("decode", 64, 1), ("prefill", 1, 4096)]
    for fname, (wkind, ckind) in FORMATS.items():
        if args.format and fname not in args.format:
            continue
        for layer in ("csa", "hca"):
            for phase, R, tpr in shapes:
                if args.quick and phase == "decode" and R == 64:
                    continue
                many, read, flops = case(wkind, ckind, R, tpr, layer == "hca", 8 if phase == "decode" else 1)
                a = many[0]
                ref = attn.attend_reference(*a)
                got = kernel.attend(*a)
                err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
                variants = {"default": None} if args.quick else VARIANTS
                for vname, cfg in variants.items():
                    try:
                        fns = [lambda b=b: kernel.attend(*b, config=cfg) for b in many]
                        ms = bench_graph_many(fns) if phase == "decode" else bench_ms(fns[0])
                    except Exception as e:  # noqa: BLE001 - a config the compiler rejects
                        print(f"{fname} {layer} {phase} R={R} {vname}: failed ({type(e).__name__}: {e})"[:200])
                        continue
                    row = {"format": fname, "layer": layer, "phase": phase, "rows": R, "tokens": R * tpr,
                           "variant": vname, "ms": ms, "gb_s": read / ms / 1e6, "pct_hbm": read / ms / 1e-3 / hbm * 100,
                           "tflops": flops / ms / 1e9, "pct_bf16": flops / ms / 1e-3 / bf16 * 100, "rel_err": err}
                    rows.append(row)
                    print(f"{fname:15s} {layer} {phase:7s} T={R * tpr:5d} {vname:9s} {ms * 1e3:9.1f} us "
                          f"{row['gb_s']:7.0f} GB/s ({row['pct_hbm']:5.1f}% HBM) {row['tflops']:6.1f} TFLOP/s "
                          f"({row['pct_bf16']:5.1f}% bf16)  err {err:.1e}", flush=True)
                if phase == "decode" and R == 32:
                    ms_ref = bench_ms(lambda: attn.attend_reference(*a))
                    print(f"{'':15s} reference (torch gathers) {ms_ref * 1e3:9.1f} us", flush=True)
                del a, many
                torch.cuda.empty_cache()
    write_json(args.out, "attention-" + "-".join(args.format or ["all"]), {"ceilings": ceil, "rows": rows})


if __name__ == "__main__":
    main()
