"""Microbenchmark of the dense linears (ops/kernels/fp8_gemm.py) at V4-Flash / V4.1-Flash shapes on one GPU.

    python benchmarks/kernels/fp8_gemm.py [--out DIR] [--quick]

Decode (M <= 64): achieved GB/s on the weight bytes (FP8 + e8m0 scales; bf16 for the head) against the HBM copy
ceiling, beside cuBLAS's bf16 GEMM on the same shape (which reads twice the bytes). Prefill (M >= 4096): TFLOP/s
against the FP8 `torch._scaled_mm` ceiling. Each row also checks the kernel against the float32 reference.
Tile variants are timed side by side so the committed configs can be chosen from one run.
"""

from __future__ import annotations

import argparse

import torch
from common import bench_graph_many, bench_ms, copies_past_l2, describe, measure_ceilings, write_json

from v4serve.ops import quant
from v4serve.ops.kernels import fp8_gemm, fp8_gemv
from v4serve.ops.linear import linear_reference

# name: (N, K, groups); V4-Flash unless noted
SHAPES = {
    "wq_a": (1024, 4096, 1), "wq_b": (32768, 1024, 1), "wkv": (512, 4096, 1), "wo_a(grouped)": (1024, 4096, 8),
    "wo_b": (4096, 8192, 1), "shared_w1": (2048, 4096, 1), "shared_w2": (4096, 2048, 1),
    "idx_wq_b": (8192, 1024, 1), "v41_wq_a": (1280, 5120, 1), "v41_wo_b": (5120, 8192, 1),
}
QUICK = ("wq_b", "wo_a(grouped)", "wo_b", "shared_w1", "wq_a", "v41_wo_b")
DECODE_M = (1, 8, 32, 64)
PREFILL_M = (4096, 8192, 16384)
# decode: the one-launch kernel (fp8_gemv, "default") and its tile variants beside the 3-launch general path
DECODE_VARIANTS = {"default": None, "bn32": {"BN": 32}, "bn128": {"BN": 128}, "bk128": {"BK": 128},
                   "bk512": {"BK": 512}, "stages2": {"num_stages": 2}, "w8": {"num_warps": 8},
                   "split2x": "double", "general": "general"}
PREFILL_VARIANTS = {"default": None, "bm64": {"BM": 64}, "stages4": {"num_stages": 4},
                    "bn256w8": {"BN": 256, "num_warps": 8, "num_stages": 3}}


def weight(n: int, k: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    s = torch.randint(118, 124, (-(-n // block), -(-k // block)), dtype=torch.uint8, device="cuda")
    return q, s


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(make, graph: bool, copies) -> float:
    """Decode: one graph of calls over rotating weight copies (in-step cost, weights from HBM); prefill: eager."""
    if graph:
        return bench_graph_many([make(qc, sc) for qc, sc in copies])
    return bench_ms(make(*copies[0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default configs only")
    args = ap.parse_args()
    ceil = measure_ceilings()
    print(describe(ceil), flush=True)
    hbm, fp8 = ceil["hbm_bytes_per_s"], ceil["fp8_flops"]
    rows = []
    shapes = {k: v for k, v in SHAPES.items() if not args.quick or k in QUICK}
    for name, (N, K, G) in shapes.items():
        block = 32 if name.startswith("v41") else 128
        q, s = weight(G * N, K, block)
        wbytes = q.numel() + s.numel()
        copies = [(q, s)] + [weight(G * N, K, block) for _ in range(copies_past_l2(wbytes) - 1)]
        wbs = [torch.randn(G * N, K, device="cuda", dtype=torch.bfloat16)
               for _ in range(copies_past_l2(2 * G * N * K))]
        prefill = PREFILL_M if name in ("wq_b", "wo_b", "shared_w1", "v41_wo_b") else ()
        for M in (DECODE_M + prefill) if not args.quick else (1, 32, 64) + prefill[1:2]:
            decode = M <= 64
            x = torch.randn(M, G, K, device="cuda", dtype=torch.bfloat16)
            act = 0 if G > 1 else block  # wo_a runs W8A16 (the reference's bf16 einsum), the rest W8A8
            ref = linear_reference(x.float().view(M * G, K) if G == 1 else x.float()[:, 0], q[:N] if G > 1 else q,
                                   s, block, act)
            out = fp8_gemm._run(x, q, s, block, act, torch.bfloat16)
            err = rel(out[:, 0], ref)
            variants = {"default": None} if args.quick else (DECODE_VARIANTS if decode else PREFILL_VARIANTS)
            xb = x.view(M, G * K) if G == 1 else x[:, 0].contiguous()
            cublas = run(lambda wb, _: (lambda: xb @ wb[:N].t() if G > 1 else xb @ wb.t()), decode,
                         [(wb, None) for wb in wbs])
            for vname, cfg in variants.items():
                if decode and fp8_gemv.supports(x, q, block, act) and cfg != "general":
                    if cfg == "double":
                        cfg = {"splits": 2 * fp8_gemv.config(M, N, K, G, block)["splits"]}
                    make = lambda qc, sc, c=cfg: (  # noqa: E731
                        lambda: fp8_gemv.run(x, qc, sc, block, act, torch.bfloat16, c))
                else:
                    make = lambda qc, sc, c=cfg: (  # noqa: E731
                        lambda: fp8_gemm.general(x, qc, sc, block, act, torch.bfloat16, c if isinstance(c, dict) else None))
                try:
                    ms = run(make, decode, copies)
                except Exception as e:  # noqa: BLE001 - a variant the compiler rejects (e.g. shared memory)
                    print(f"{name} M={M} {vname}: failed ({type(e).__name__})", flush=True)
                    continue
                flops = 2 * M * G * N * K
                row = {"shape": name, "N": N, "K": K, "G": G, "M": M, "variant": vname, "ms": ms,
                       "gb_s": (wbytes + x.numel() * 2) / ms / 1e6, "pct_hbm": (wbytes / ms / 1e-3) / hbm * 100,
                       "tflops": flops / ms / 1e9, "pct_fp8": flops / (ms * 1e-3) / fp8 * 100,
                       "cublas_bf16_ms": cublas, "rel_err": err}
                rows.append(row)
                print(f"{name:14s} M={M:5d} {vname:8s} {ms * 1e3:9.1f} us  {row['gb_s']:7.0f} GB/s "
                      f"({row['pct_hbm']:5.1f}% HBM)  {row['tflops']:7.1f} TFLOP/s ({row['pct_fp8']:5.1f}% FP8)  "
                      f"cuBLAS bf16 {cublas * 1e3:8.1f} us  err {err:.1e}", flush=True)
    # the LM head: bf16 weight read as stored, float32 activations (no per-step upcast)
    head = torch.randn(129280, 4096, device="cuda", dtype=torch.bfloat16)
    for M in (1, 32):
        h = torch.randn(M, 4096, device="cuda")
        ms = bench_graph_many([lambda: fp8_gemm.linear(h, head, None, 0)] * 2)
        print(f"head (bf16 W, fp32 x) M={M}: {ms * 1e3:.1f} us, {head.numel() * 2 / ms / 1e6:.0f} GB/s "
              f"({head.numel() * 2 / ms / 1e-3 / hbm * 100:.1f}% HBM)", flush=True)
        rows.append({"shape": "head", "M": M, "variant": "default", "ms": ms,
                     "pct_hbm": head.numel() * 2 / ms / 1e-3 / hbm * 100})
    best: dict = {}
    for r in rows:
        key = (r["shape"], r["M"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    print("\n| shape | M | best variant | us | % HBM (decode) / % FP8 peak (prefill) |\n|---|---|---|---|---|")
    for (shape, M), r in best.items():
        frac = r["pct_hbm"] if M <= 64 else r.get("pct_fp8", 0)
        print(f"| {shape} | {M} | {r['variant']} | {r['ms'] * 1e3:.1f} | {frac:.1f} |")
    write_json(args.out, "fp8_gemm", {"ceilings": ceil, "rows": rows})


if __name__ == "__main__":
    main()
