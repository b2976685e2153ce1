"""Microbenchmark of the dense linears (ops/kernels/fp8_gemm.py) at V4-Flash / V4.1-Flash shapes on one GPU.

    python benchmarks/kernels/fp8_gemm.py [--out DIR] [--quick] [--shared-expert]

Decode (M <= 64): achieved GB/s on the weight bytes (FP8 + e8m0 scales; bf16 for the head) against the HBM copy
ceiling, beside cuBLAS's bf16 GEMM on the same shape (which reads twice the bytes). Prefill (M >= 4096): TFLOP/s
against the FP8 `torch._scaled_mm` ceiling. Each row also checks the kernel against the float32 reference.
Tile variants are timed side by side so the committed configs can be chosen from one run.

Shared expert (V4-Flash D=4096, I=2048, 128-blocks; V4.1-Flash D=5120, I=2304, 32-blocks), decode rows: the paired
kernel (gate + up + SwiGLU in one launch, kernels/fp8_swiglu.py) and w2's GEMV, as dense_mlp runs them, against the
three linears and the elementwise SwiGLU (the path before it), with % HBM on the three weights' bytes. In the normal
run (not with --shapes); `--shared-expert` runs only these rows.
"""

from __future__ import annotations

import argparse
import os

import torch
from common import bench_graph_many, bench_ms, copies_past_l2, describe, measure_ceilings, write_json

from v4serve.ops import backend, quant
from v4serve.ops.kernels import fp8_gemm, fp8_gemv, fp8_swiglu, fp8_widen
from v4serve.ops.kernels import quant as kquant
from v4serve.ops.linear import dequantize as linear_dequantize
from v4serve.ops.linear import linear, linear_reference
from v4serve.ops.moe import dense_mlp, swiglu

# name: (N, K, groups); V4-Flash unless noted
SHAPES = {
    "wq_a": (1024, 4096, 1), "wq_b": (32768, 1024, 1), "wkv": (512, 4096, 1), "wo_a(grouped)": (1024, 4096, 8),
    "wo_b": (4096, 8192, 1), "shared_w1": (2048, 4096, 1), "shared_w2": (4096, 2048, 1),
    "idx_wq_b": (8192, 1024, 1), "v41_wq_a": (1280, 5120, 1), "v41_wo_b": (5120, 8192, 1),
    # V4.1's other linears (32 x 32 blocks): its decoder layers run them on 128-token suffixes in prompt chunks
    "v41_wq_b": (32768, 1280, 1), "v41_wo_a(grouped)": (1024, 4096, 8), "v41_shared_w13": (4608, 5120, 1),
    "v41_shared_w2": (5120, 2304, 1),
}
QUICK = ("wq_b", "wo_a(grouped)", "wo_b", "shared_w1", "wq_a", "v41_wo_b")
DECODE_M = (1, 8, 32, 64)
PREFILL_M = (4096, 8192, 16384)
# decode: the one-launch kernel (fp8_gemv, "default") and its tile variants beside the 3-launch general path
DECODE_VARIANTS = {"default": None, "bn16": {"BN": 16}, "bn32": {"BN": 32}, "bn128": {"BN": 128},
                   "bk256": {"BK": 256}, "bk512": {"BK": 512}, "bn32bk256": {"BN": 32, "BK": 256},
                   "bn128w8": {"BN": 128, "num_warps": 8}, "bk256s3": {"BK": 256, "num_stages": 3},
                   "stages2": {"num_stages": 2}, "stages6": {"num_stages": 6}, "w8": {"num_warps": 8},
                   "w2": {"num_warps": 2}, "split1": {"splits": 1}, "s3": {"splits": 3}, "s5": {"splits": 5},
                   "s6": {"splits": 6}, "s8": {"splits": 8}, "split2x": "double", "split4x": "quadruple",
                   "in-register": "in-register", "prequantized": "prequantized", "general": "general",
                   # the weight as wgmma's operand (fp8_gemv.block_dot SWAP: no FP8 -> f16 conversions on sm_90)
                   "swap": {"swap": True}, "swap-bn128": {"swap": True, "BN": 128},
                   "swap-s6": {"swap": True, "num_stages": 6}, "swap-bk256": {"swap": True, "BK": 256},
                   "swap-s2": {"swap": True, "num_stages": 2}, "swap-bn128w8": {"swap": True, "BN": 128, "num_warps": 8},
                   # W8A8 values on bf16 tensor cores (fp8_gemv.block_dot DEQ: both operands dequantized, one dot
                   # chained over K instead of a product waited for and scaled per block)
                   "deq": {"deq": True}, "deq-swap": {"deq": True, "swap": True},
                   # leaner K-loop addressing (fp8_gemv.LEAN_ENV): no K masks on whole tiles ("full"), the
                   # prequantized x's scales transposed ("scales_t"; weights over MAX_WEIGHT_BYTES)
                   # and the two scales multiplied first ("pair_scales")
                   "lean": {"full": True, "scales_t": True, "pair_scales": True},
                   "lean2": {"full": True, "scales_t": True},
                   "lean-s6": {"full": True, "scales_t": True, "pair_scales": True, "num_stages": 6},
                   "lean-bn128": {"full": True, "scales_t": True, "pair_scales": True, "BN": 128},
                   # up to 4 rows on the CUDA cores (fp8_gemv.fma_acc; x quantized in registers at every size unless
                   # "prequant"), "programs": the split target
                   "fma": {"fma": True, "BK": 512}, "fma-pre": {"fma": True, "BK": 512, "prequant": True},
                   "fma-bk256": {"fma": True, "BK": 256}, "fma-bk1024": {"fma": True, "BK": 1024, "BN": 32},
                   "fma-w8": {"fma": True, "BK": 512, "num_warps": 8},
                   "fma-bn128w8": {"fma": True, "BN": 128, "BK": 512, "num_warps": 8},
                   "fma-bn32": {"fma": True, "BN": 32, "BK": 512},
                   "fma-p396": {"fma": True, "BK": 512, "programs": 396},
                   "fma-p132": {"fma": True, "BK": 512, "programs": 132},
                   "fma-bk256-pre": {"fma": True, "BK": 256, "prequant": True},
                   "fma-bk256w2": {"fma": True, "BK": 256, "num_warps": 2},
                   # the weight loads pipelined through shared memory (fp8_gemv FMA_STAGES: cp.async stages)
                   "fma-s2": {"fma": True, "BN": 32, "BK": 512, "fma_stages": 2},
                   "fma-s3": {"fma": True, "BN": 32, "BK": 512, "fma_stages": 3},
                   "fma-bk256-s3": {"fma": True, "BN": 32, "BK": 256, "fma_stages": 3},
                   "fma-bk256-s4": {"fma": True, "BN": 32, "BK": 256, "fma_stages": 4},
                   "fma-bn64-bk256-s3": {"fma": True, "BN": 64, "BK": 256, "fma_stages": 3}}
# prefill: "default" = the dispatch (cuBLAS's block-scaled recipe for 128-block W8A8, ops/kernels/scaled_mm.py, where
# it applies), "triton" = fp8_gemm's kernel with its default tiles
# "bf16dot": the W8A8 values through the bf16 dot (x FP8-simulated, the weight widened per tile; no per-block
# rescale: V4.1's 32-wide blocks); "bmm": the weight widened to bf16 per call (kernels/fp8_widen.py) and cuBLAS's
# (batched) bf16 GEMM, the dispatch for grouped rows from fp8_gemm.BMM_MIN_ROWS (plain 32-block ones from
# BMM_MIN_ROWS_B32)
PREFILL_VARIANTS = {"default": None, "triton": {}, "bf16dot": {"a_fp8": False}, "bmm": {"bmm": True},
                    "bf16dot-bn256": {"a_fp8": False, "BN": 256, "num_warps": 8, "num_stages": 3}, "bm64": {"BM": 64}, "stages4": {"num_stages": 4},
                    "bn256w8": {"BN": 256, "num_warps": 8, "num_stages": 3},
                    # short grids (V4.1's 128-token decoder suffixes): the Triton kernel without its K shares
                    # (fp8_gemm.prefill_splits); "bf16dot" takes them too
                    "nosplit": {"splits": 1}, "bf16dot-nosplit": {"a_fp8": False, "splits": 1},
                    # the half dot's K tile widened at once (one dot a tile, not one per 32 of K; by default from
                    # fp8_gemm.WHOLE_MIN_TILES K tiles a program) or per 32-block ("tiles")
                    "bf16dot-whole": {"a_fp8": False, "whole": True},
                    "bf16dot-tiles": {"a_fp8": False, "whole": False},
                    "bf16dot-whole-s4": {"a_fp8": False, "whole": True, "num_stages": 4}}


def weight(n: int, k: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    s = torch.randint(118, 124, (-(-n // block), -(-k // block)), dtype=torch.uint8, device="cuda")
    return q, s


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(make, graph: bool, copies) -> float:
    """Decode: one graph of calls over rotating weight copies (in-step cost, weights from HBM); prefill: a graph of
    calls over up to four copies too (eager timing of 2K-row calls measured the host's launches: ~120 us for any
    shape, twenty-first session), eager where a path cannot be captured."""
    if graph:
        return bench_graph_many([make(qc, sc) for qc, sc in copies])
    try:
        return bench_graph_many([make(qc, sc) for qc, sc in copies[:4]])
    except Exception:  # noqa: BLE001 - not capturable: eager
        return bench_ms(make(*copies[0]))


# name: (D, I, block) of the shared expert; paired-kernel tile variants beside fp8_gemv's config
SHARED = {"v4": (4096, 2048, 128), "v41": (5120, 2304, 32)}
PAIRED_VARIANTS = {"default": None, "bn32": {"BN": 32}, "split2x": "double", "split_half": "half",
                   "swap": {"swap": True}, "swap-bn128": {"swap": True, "BN": 128},
                   "deq": {"deq": True}, "deq-swap": {"deq": True, "swap": True},
                   # the activations quantized by one act_quant launch before (fp8_swiglu.PREQUANT_ENV)
                   "pre": {"prequant": True},
                   # fp8_gemv's leaner K-loop addressing (LEAN_ENV), with and without the prequantized x
                   "lean": {"full": True, "scales_t": True, "pair_scales": True},
                   "pre-lean": {"prequant": True, "full": True, "scales_t": True, "pair_scales": True},
                   # one row on the CUDA cores (fp8_gemv.fma_acc for both weights; M = 1 only)
                   "fma": {"fma": True, "BK": 512}, "fma-bk256": {"fma": True, "BK": 256},
                   "fma-p264": {"fma": True, "BK": 512, "programs": 264}, "fma-bn32": {"fma": True, "BK": 512, "BN": 32},
                   "fma-w8": {"fma": True, "BK": 512, "num_warps": 8}}


def three_linears(x, w1, w2, w3, limit: float, act: int) -> torch.Tensor:
    """The shared expert before the paired kernel: w1 and w3's GEMVs, the elementwise SwiGLU, w2's GEMV."""
    t = backend.TRITON
    h = swiglu(linear(x, *w1, act, t), linear(x, *w3, act, t), limit).to(x.dtype)
    return linear(h, *w2, act, t).float()


def shared_weights(D: int, I: int, block: int) -> tuple:
    """(w1, w2, w3), each (FP8 weight, e8m0 scales, block)."""
    return tuple((*weight(n, k, block), block) for n, k in ((I, D), (D, I), (I, D)))


def shared_expert_rows(hbm: float, rows_m: tuple[int, ...] = (), only: tuple[str, ...] = ()) -> list[dict]:
    """Decode rows of the shared expert: paired kernel + w2 (dense_mlp) against the three-linear path, and the paired
    kernel alone in tile variants (`only`: these variant names)."""
    rows = []
    limit = 10.0  # swiglu_limit of both presets (the shared expert's clamp)
    t = backend.TRITON
    for model, (D, I, block) in SHARED.items():
        first = shared_weights(D, I, block)
        wbytes = sum(q.numel() + s.numel() for q, s, _ in first)  # three FP8 weights + their e8m0 scales
        sets = [first] + [shared_weights(D, I, block) for _ in range(copies_past_l2(wbytes) - 1)]
        for M in rows_m or DECODE_M:
            x = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
            ref = dense_mlp(x.float(), *first, limit, block, backend.REFERENCE)
            ref_h = swiglu(linear_reference(x.float(), *first[0], block), linear_reference(x.float(), *first[2], block),
                           limit)
            base = fp8_gemv.config(M, I, D, 1, block)
            paths = {"three_linears": lambda w1, w2, w3, x=x, b=block: three_linears(x, w1, w2, w3, limit, b),
                     "paired+w2": lambda w1, w2, w3, x=x, b=block: dense_mlp(x, w1, w2, w3, limit, b, t)}
            for vname, cfg in PAIRED_VARIANTS.items():
                if (isinstance(cfg, dict) and cfg.get("fma") and M > 1) or (only and vname not in only):
                    continue
                if cfg in ("double", "half"):
                    cfg = {"splits": max(1, base["splits"] * 2 if cfg == "double" else base["splits"] // 2)}
                paths[f"paired({vname})"] = lambda w1, w2, w3, x=x, b=block, c=cfg: fp8_swiglu.run(
                    x, w1[0], w1[1], w3[0], w3[1], b, b, limit, c)
            for pname, fn in paths.items():
                try:
                    got = fn(*first)
                    err = rel(got, ref if got.shape == ref.shape else ref_h)  # the paired kernel alone: h
                    ms = bench_graph_many([lambda w=w, fn=fn: fn(*w) for w in sets])
                except Exception as e:  # noqa: BLE001 - a variant the compiler rejects (e.g. shared memory)
                    print(f"shared_{model} M={M} {pname}: failed ({type(e).__name__}: {e})", flush=True)
                    continue
                nbytes = wbytes if not pname.startswith("paired(") else 2 * (first[0][0].numel() + first[0][1].numel())
                row = {"shape": f"shared_{model}", "D": D, "I": I, "M": M, "variant": pname, "ms": ms,
                       "pct_hbm": nbytes / (ms * 1e-3) / hbm * 100, "rel_err": err}
                rows.append(row)
                print(f"shared_{model:4s} M={M:3d} {pname:18s} {ms * 1e3:8.1f} us  ({row['pct_hbm']:5.1f}% HBM on "
                      f"{nbytes / 2**20:.1f} MiB)  err {err:.1e}", flush=True)
    return rows


# the compressors' stacked wkv / wgate (bf16 weights, bf16 x, float32 out): a CSA layer's main + indexer compressors
# (2 x 1024 + 2 x 256 rows) and the indexer's weights_proj (64 rows), a HCA layer's one (2 x 512)
COMPRESSOR = {"csa": (2624, 4096), "hca": (1024, 4096)}
COMPRESSOR_VARIANTS = {"default": None, "bn128": {"BN": 128}, "bn32": {"BN": 32}, "stages2": {"num_stages": 2},
                       "split_half": "half", "split2x": "double", "w8": {"num_warps": 8}, "bf16-x": "bf16-x",
                       "cublas-bf16": "cublas",
                       # the decode GEMV without scales (fp8_gemv, plain weights: the path linear() takes now)
                       "gemv": ("gemv", None), "gemv-bn128": ("gemv", {"BN": 128}), "gemv-bn32": ("gemv", {"BN": 32}),
                       "gemv-s2": ("gemv", {"num_stages": 2}), "gemv-s6": ("gemv", {"num_stages": 6}),
                       "gemv-bk256": ("gemv", {"BK": 256}), "gemv-w8": ("gemv", {"num_warps": 8}),
                       "gemv-split2x": ("gemv", "double"), "gemv-split-half": ("gemv", "half")}


def compressor_rows(hbm: float) -> list[dict]:
    """The compressors' projection at decode rows: the general kernel's tiles, x given as bf16 (it holds bf16 values:
    the block's input widened), and cuBLAS's bf16 GEMM (bf16 out)."""
    rows = []
    for name, (N, K) in COMPRESSOR.items():
        wbytes = 2 * N * K
        wbs = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(copies_past_l2(wbytes))]
        for M in (1, 8, 32):
            x = torch.randn(M, 1, K, device="cuda").bfloat16().float()
            ref = linear_reference(x.view(M, K), wbs[0], None, 0, 0)
            base = fp8_gemm._config(M, N, K, 1, 128, False, True)
            gbase = fp8_gemv.config(M, N, K, 1, 128, False, plain=True)
            for vname, cfg in COMPRESSOR_VARIANTS.items():
                if isinstance(cfg, tuple):  # the GEMV: bf16 x (the block's input as it is), float32 out
                    gcfg = cfg[1]
                    if gcfg in ("half", "double"):
                        gcfg = {"splits": max(1, gbase["splits"] // 2 if gcfg == "half" else 2 * gbase["splits"])}
                    xb = x.bfloat16()
                    make = lambda w, _, xb=xb, c=gcfg: (  # noqa: E731
                        lambda: fp8_gemv.run(xb, w, None, 128, 0, torch.float32, c))
                elif cfg in ("half", "double"):
                    cfg = {"splits": max(1, base["splits"] // 2) if cfg == "half" else 2 * base["splits"]}
                    make = lambda w, _, c=cfg, x=x: (  # noqa: E731
                        lambda: fp8_gemm.general(x, w, None, 128, 0, torch.float32, c))
                elif cfg == "bf16-x":
                    xb = x.bfloat16()
                    make = lambda w, _, xb=xb: (  # noqa: E731
                        lambda: fp8_gemm.general(xb, w, None, 128, 0, torch.float32))
                elif cfg == "cublas":
                    xb = x.view(M, K).bfloat16()
                    make = lambda w, _, xb=xb: (lambda: xb @ w.t())  # noqa: E731
                else:
                    make = lambda w, _, c=cfg, x=x: (  # noqa: E731
                        lambda: fp8_gemm.general(x, w, None, 128, 0, torch.float32, c))
                try:
                    err = rel(make(wbs[0], None)().view(M, N), ref)
                    ms = run(make, True, [(w, None) for w in wbs])
                except Exception as e:  # noqa: BLE001 - a variant the compiler rejects
                    print(f"compressor {name} M={M} {vname}: failed ({type(e).__name__}: {str(e)[:120]})", flush=True)
                    continue
                pct = wbytes / (ms * 1e-3) / hbm * 100
                rows.append({"shape": f"compressor_{name}", "N": N, "K": K, "M": M, "variant": vname, "ms": ms,
                             "pct_hbm": pct, "rel_err": err})
                print(f"compressor {name} N={N} M={M:3d} {vname:12s} {ms * 1e3:7.2f} us  {pct:5.1f}% HBM  err {err:.1e}",
                      flush=True)
    return rows


# the grouped wo_a with its output quantized for wo_b in the GEMV's finish (a 1 x 128 group over two 64-column tiles is
# finished by the last of their programs), beside the two launches it replaces (the GEMV, then kernels/quant.act_quant)
WO_A = {"v4": (1024, 4096, 8, 128), "v41": (1024, 4096, 8, 32)}
WO_A_VARIANTS = {"gemv+act_quant": "two", "quant_out": {}, "quant_out-2x-splits": "double",
                 "quant_out-bn128": {"BN": 128}, "quant_out-bn128-2x-splits": "double-bn128"}


def wo_a_rows(hbm: float) -> list[dict]:
    rows = []
    for name, (N, K, G, block) in WO_A.items():
        q, s = weight(G * N, K, block)
        wbytes = q.numel() + s.numel()
        copies = [(q, s)] + [weight(G * N, K, block) for _ in range(copies_past_l2(wbytes) - 1)]
        for M in (1, 8, 32):
            x = torch.randn(M, G, K, device="cuda", dtype=torch.bfloat16)
            base = fp8_gemv.config(M, N, K, G, block, w8a8=False)
            for vname, cfg in WO_A_VARIANTS.items():
                if cfg == "two":
                    make = lambda qc, sc: (lambda: kquant.act_quant(  # noqa: E731
                        fp8_gemv.run(x, qc, sc, block, 0, torch.bfloat16), block))
                else:
                    if isinstance(cfg, str):
                        cfg = {"splits": min(16, 2 * base["splits"]), **({"BN": 128} if "bn128" in cfg else {})}
                    make = lambda qc, sc, c=cfg: (lambda: fp8_gemv.run(  # noqa: E731
                        x, qc, sc, block, 0, torch.bfloat16, c, quant_out=block))
                try:
                    got, same = make(q, s)(), None
                    if isinstance(cfg, dict):  # against the plain output of the same tiles and splits
                        want = quant.fp8_rows(fp8_gemv.run(x, q, s, block, 0, torch.bfloat16, {**base, **cfg}), block)
                        same = bool(torch.equal(got.values.float(), want.values.float()))
                    ms = run(make, True, copies)
                except Exception as e:  # noqa: BLE001 - a variant the compiler rejects
                    print(f"wo_a {name} M={M} {vname}: failed ({type(e).__name__}: {str(e)[:120]})", flush=True)
                    continue
                pct = wbytes / (ms * 1e-3) / hbm * 100
                rows.append({"shape": f"wo_a_{name}", "N": N, "K": K, "G": G, "M": M, "variant": vname, "ms": ms,
                             "pct_hbm": pct, "equal_to_gemv_then_quant": same})
                print(f"wo_a {name} M={M:3d} {vname:24s} {ms * 1e3:7.2f} us  {pct:5.1f}% HBM  same {same}", flush=True)
    return rows


def widen_rows(hbm: float) -> list[dict]:
    """kernels/fp8_widen.py alone (the grouped prefill's per-call bf16 copy): the FP8 weight and its scales read, the
    bf16 copy written, against the HBM copy ceiling; checked against the reference's dequantization first."""
    rows = []
    for name, (N, K, G, block) in WO_A.items():
        copies = [weight(G * N, K, block) for _ in range(4)]
        q, s = copies[0]
        assert torch.equal(fp8_widen.widen(q, s, block), linear_dequantize(q, s, block, torch.bfloat16))
        outs = [torch.empty(G * N, K, device="cuda", dtype=torch.bfloat16) for _ in copies]
        ms = bench_graph_many([lambda c=c, o=o: fp8_widen.widen(*c, block, out=o) for c, o in zip(copies, outs)])
        nbytes = q.numel() * 3 + s.numel()
        rows.append({"shape": f"widen_wo_a_{name}", "ms": ms, "gb_s": nbytes / ms / 1e6,
                     "pct_hbm": nbytes / (ms * 1e-3) / hbm * 100})
        print(f"widen wo_a {name} ({G * N} x {K}, block {block}): {ms * 1e3:6.1f} us  {rows[-1]['gb_s']:6.0f} GB/s "
              f"({rows[-1]['pct_hbm']:5.1f}% HBM)", flush=True)
    return rows


# the LM head's decode tiles (fp8_gemm.HEAD_TILES, chosen by $V4SERVE_HEAD_TILES; "off" = the general decode tiles)
HEAD_VARIANTS = ("default", "off", *fp8_gemm.HEAD_TILES)


def head_rows(hbm: float, rows_m: tuple[int, ...] = (1, 8, 32, 64), only: tuple[str, ...] = ()) -> list[dict]:
    """The LM head: a bf16 weight [129280, 4096] read as stored under float32 activations (no per-step upcast), each
    tile choice against the float64 product (the kernel splits x into two bf16 parts: ~1e-5)."""
    head = torch.randn(129280, 4096, device="cuda", dtype=torch.bfloat16)
    out = []
    for M in rows_m:
        h = torch.randn(M, 4096, device="cuda")
        ref = h.double() @ head.double().T
        for vname in only or HEAD_VARIANTS:
            if vname == "default":
                os.environ.pop(fp8_gemm.HEAD_TILES_ENV, None)
            else:
                os.environ[fp8_gemm.HEAD_TILES_ENV] = vname
            try:
                err = float((fp8_gemm.linear(h, head, None, 0).double() - ref).abs().max() / ref.abs().max())
                ms = bench_graph_many([lambda: fp8_gemm.linear(h, head, None, 0)] * 2)
            except Exception as e:  # noqa: BLE001 - a tile choice the compiler rejects (shared memory)
                print(f"head M={M} {vname}: failed ({type(e).__name__}: {str(e)[:120]})", flush=True)
                continue
            finally:
                os.environ.pop(fp8_gemm.HEAD_TILES_ENV, None)
            pct = head.numel() * 2 / ms / 1e-3 / hbm * 100
            print(f"head (bf16 W, fp32 x) M={M:3d} {vname:11s} {ms * 1e3:8.1f} us, {head.numel() * 2 / ms / 1e6:5.0f}"
                  f" GB/s ({pct:5.1f}% HBM)  err {err:.1e}", flush=True)
            out.append({"shape": "head", "M": M, "variant": vname, "ms": ms, "pct_hbm": pct, "rel_err": err})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default configs only")
    ap.add_argument("--decode-only", action="store_true", help="decode rows only (M <= 64), every tile variant")
    ap.add_argument("--prefill-only", action="store_true", help="prefill rows only (M >= 4096)")
    ap.add_argument("--prefill-rows", default=None, help="comma-separated prefill row counts (default 4096,8192,16384)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (default: all, or QUICK)")
    ap.add_argument("--variants", default=None, help="comma-separated decode/prefill variant names (default: all)")
    ap.add_argument("--rows", default=None, help="comma-separated decode row counts (default: 1,8,32,64)")
    ap.add_argument("--shared-expert", action="store_true", help="only the shared expert's decode rows")
    ap.add_argument("--head", action="store_true", help="only the LM head's decode rows, every tile choice")
    ap.add_argument("--compressor", action="store_true", help="only the compressors' bf16 projections (f32 x)")
    ap.add_argument("--wo-a-quant", action="store_true", help="only wo_a with its output quantized for wo_b")
    ap.add_argument("--widen", action="store_true", help="only the FP8 -> bf16 widening of the grouped wo_a")
    args = ap.parse_args()
    ceil = measure_ceilings()
    print(describe(ceil), flush=True)
    hbm, fp8 = ceil["hbm_bytes_per_s"], ceil["fp8_flops"]
    rows = []
    if args.shared_expert:
        rows_m = tuple(int(m) for m in args.rows.split(",")) if args.rows else ()
        only = tuple(args.variants.split(",")) if args.variants else ()
        write_json(args.out, "fp8_gemm_shared_expert", {"ceilings": ceil, "rows": shared_expert_rows(hbm, rows_m, only)})
        return
    if args.head:
        rows_m = tuple(int(m) for m in args.rows.split(",")) if args.rows else (1, 8, 32, 64)
        only = tuple(args.variants.split(",")) if args.variants else ()
        write_json(args.out, "fp8_gemm_head", {"ceilings": ceil, "rows": head_rows(hbm, rows_m, only)})
        return
    if args.compressor:
        write_json(args.out, "fp8_gemm_compressor", {"ceilings": ceil, "rows": compressor_rows(hbm)})
        return
    if args.widen:
        write_json(args.out, "fp8_gemm_widen", {"ceilings": ceil, "rows": widen_rows(hbm)})
        return
    if args.wo_a_quant:
        write_json(args.out, "fp8_gemm_wo_a_quant", {"ceilings": ceil, "rows": wo_a_rows(hbm)})
        return
    wanted = args.shapes.split(",") if args.shapes else (QUICK if args.quick else tuple(SHAPES))
    shapes = {k: v for k, v in SHAPES.items() if k in wanted}
    for name, (N, K, G) in shapes.items():
        block = 32 if name.startswith("v41") else 128
        q, s = weight(G * N, K, block)
        wbytes = q.numel() + s.numel()
        copies = [(q, s)] + [weight(G * N, K, block) for _ in range(copies_past_l2(wbytes) - 1)]
        wbs = [torch.randn(G * N, K, device="cuda", dtype=torch.bfloat16)
               for _ in range(copies_past_l2(2 * G * N * K))]
        prefill = PREFILL_M if name in ("wq_b", "wo_b", "shared_w1") or name.startswith("v41") else ()
        if args.decode_only:
            prefill = ()
        decode_m = tuple(int(m) for m in args.rows.split(",")) if args.rows else DECODE_M
        if args.prefill_only:
            decode_m, prefill = (), PREFILL_M
        if args.prefill_rows and prefill:
            prefill = tuple(int(m) for m in args.prefill_rows.split(","))
        for M in (decode_m + prefill) if not args.quick else (1, 32, 64) + prefill[1:2]:
            decode = M <= 64
            x = torch.randn(M, G, K, device="cuda", dtype=torch.bfloat16)
            act = 0 if G > 1 else block  # wo_a runs W8A16 (the reference's bf16 einsum), the rest W8A8
            ref = linear_reference(x.float().view(M * G, K) if G == 1 else x.float()[:, 0], q[:N] if G > 1 else q,
                                   s, block, act)
            out = fp8_gemm._run(x, q, s, block, act, torch.bfloat16)
            err = rel(out[:, 0], ref)
            variants = {"default": None} if args.quick else (DECODE_VARIANTS if decode else PREFILL_VARIANTS)
            if args.variants:
                variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
            xb = x.view(M, G * K) if G == 1 else x[:, 0].contiguous()
            xg = x.transpose(0, 1)  # grouped: all G products in one batched GEMM (bf16 weights)
            cublas = run(lambda wb, _: (lambda: torch.bmm(xg, wb.view(G, N, K).transpose(1, 2)) if G > 1
                                        else xb @ wb.t()), decode, [(wb, None) for wb in wbs])
            gemv_ok = fp8_gemv.supports(x, q, block, act)
            for vname, cfg in variants.items():
                if decode and gemv_ok and cfg != "general":
                    pre = None  # by the weight's size (fp8_gemv.prequantize)
                    if cfg in ("in-register", "prequantized"):
                        pre, cfg = cfg == "prequantized", None
                    if isinstance(cfg, dict) and "prequant" in cfg:
                        cfg = dict(cfg)
                        pre = cfg.pop("prequant")
                    if cfg in ("double", "quadruple"):
                        cfg = {"splits": (2 if cfg == "double" else 4) * fp8_gemv.config(M, N, K, G, block)["splits"]}
                    make = lambda qc, sc, c=cfg, p=pre: (  # noqa: E731
                        lambda: fp8_gemv.run(x, qc, sc, block, act, torch.bfloat16, c, prequant=p))
                else:
                    make = lambda qc, sc, c=cfg: (  # noqa: E731
                        lambda: fp8_gemm.general(x, qc, sc, block, act, torch.bfloat16, c if isinstance(c, dict) else None))
                try:
                    got = make(q, s)()  # every variant checked, not only the default
                    verr = rel((got.view(M, G, N) if G > 1 else got.view(M, 1, N))[:, 0], ref)
                    ms = run(make, decode, copies)
                except Exception as e:  # noqa: BLE001 - a variant the compiler rejects (e.g. shared memory)
                    print(f"{name} M={M} {vname}: failed ({type(e).__name__})", flush=True)
                    continue
                flops = 2 * M * G * N * K
                row = {"shape": name, "N": N, "K": K, "G": G, "M": M, "variant": vname, "ms": ms,
                       "gb_s": (wbytes + x.numel() * 2) / ms / 1e6, "pct_hbm": (wbytes / ms / 1e-3) / hbm * 100,
                       "tflops": flops / ms / 1e9, "pct_fp8": flops / (ms * 1e-3) / fp8 * 100,
                       "cublas_bf16_ms": cublas, "rel_err": err, "variant_rel_err": verr}
                rows.append(row)
                print(f"{name:14s} M={M:5d} {vname:8s} {ms * 1e3:9.1f} us  {row['gb_s']:7.0f} GB/s "
                      f"({row['pct_hbm']:5.1f}% HBM)  {row['tflops']:7.1f} TFLOP/s ({row['pct_fp8']:5.1f}% FP8)  "
                      f"cuBLAS bf16 {cublas * 1e3:8.1f} us  err {verr:.1e}", flush=True)
    if not args.shapes:
        rows += shared_expert_rows(hbm)
    if not args.decode_only:
        rows += head_rows(hbm, (1, 32), ("default",))
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
