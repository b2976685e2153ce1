"""Block-scaled FP8 GEMMs for the dense linears, in Triton (Hopper), with the same signatures as ops/linear.py.

y[m, g, n] = sum_k x[m, g, k] W[g*N + n, k] for a weight held as stored: FP8 e4m3 with e8m0 block scales (128 x 128
for V4, 32 x 32 for V4.1) or plain bf16/f32. G > 1 is V4's grouped `wo_a`; plain linears have G = 1.

Modes, by what the activations are:
* W8A8 (bf16/fp16 x with FP8 activation quantization, `act_group` = the block): x is quantized per 1 x block
  (kernels/quant.py) and each K block accumulates dot(x_q, W_q) * x_scale[m] * w_scale[n]: FP8 tensor cores.
* W8A16 and wider (no activation quantization, or fp32/fp64 x): W tiles are dequantized in registers to the dot
  dtype (bf16 for bf16 x; fp32/fp64 with IEEE dots for wide x; the e4m3 value times 2**e is exact in each).

Small M (decode) splits K across programs so that enough of them stream the weight; the partial sums go to a
float32 workspace and a second launch adds them in a fixed order (no atomics: results never depend on timing).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..env import get as env_get
from ..quant import Quantized, fp8_dequantize
from . import cdiv, fp8_gemv, fp8_widen, interpreting, next_pow2, scaled_mm, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .quant import act_quant, act_simulate
from .split_grid import N_COUNTERS, ArrivalCounters, last_to_arrive

_DOT_FP8, _DOT_HALF, _DOT_F32, _DOT_F64 = 0, 1, 2, 3
_SMS = 132  # H200 multiprocessors: decode splits K until about two waves of programs stream the weight
_COUNTERS = ArrivalCounters()  # split-K tiles finished in the kernel at decode (kernels/split_grid.py)
# Prefill rows from which the weight is widened to bf16 per call and the product runs on cuBLAS's bf16 GEMM
# (_widened_bmm): grouped weights (G > 1: V4's wo_a, its G projections one batched GEMM) and plain linears whose
# blocks cuBLAS's FP8 GEMM has no recipe for (V4.1's 32 x 32: this kernel rescales its accumulator every 32 of K).
# H200, wo_a (G 8, K 4096, N 1024; benchmarks/kernels/fp8_gemm.py, graphed, twenty-first session): at 512 / 2,048 /
# 8,192 rows 119 / 481 / 1,715 us on this kernel, 77 / 202 / 776 on the batched GEMM (47% of the FP8 peak at 8K; the
# widening included). V4.1's linears on this kernel: 106 of a 2,048-token chunk's 553 ms, ~17% of the FP8 peak
# (v41-flash-e16-engram1m, profile_step.py, twenty-second session).
BMM_MIN_ROWS = 512
# Plain (G = 1) linears of 32-block weights past one 128-row tile: there the half dot's grids (2 x N/128 tiles, K no
# longer split) left most of the GPU idle. H100, V4.1's shapes, `fp8_gemm.py --prefill-only` (twenty-seventh
# session), the half dot (whole tiles) against the widened weight on cuBLAS at 192 / 256 rows: wq_a 35.8 / 23.0 and
# 37.5 / 23.9 us, wo_b 118.6 / 94.7 and 122.1 / 95.1, the shared expert's w13 79.4 / 58.2 and 78.6 / 60.2, w2 40.2 /
# 30.2 and 40.1 / 31.4, wq_b 83.3 / 92.8 and 87.2 / 95.4 (the one loss); at 128 the half dot wins all but wq_a and
# w2 (wo_b 58.5 / 90.9, wq_b 47.3 / 92.6). The grouped wo_a keeps the half dot (256 rows: 62.9 / 79.2)
BMM_MIN_ROWS_B32 = 129
# The half dot widens each K tile of a 32-block weight at once (`_whole_tile`: one dot and one wgmma wait a tile) where
# a program walks at least this many K tiles. H100, 128 rows (twenty-seventh session), per-block dots against whole
# tiles: wq_b 62.4 / 47.8 us, wo_b 71.1 / 59.5, wo_a 51.6 / 40.2, w13 50.6 / 43.4, w2 (6 K tiles a program) 32.5 /
# 30.2; wq_a (4 K tiles a program: 13 K shares) 30.8 / 36.2
WHOLE_MIN_TILES = 5


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """FP8 and plain float weights; bf16/fp16/fp32 activations (fp64 only under the CPU interpreter)."""
    if weight.dtype not in (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32):
        return False
    if x.dtype == torch.float64:
        return not x.is_cuda and weight.dtype != torch.float16
    return x.dtype in (torch.bfloat16, torch.float16, torch.float32)


@step_jit
def _gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, out_ptr, cnt_ptr,
                 M, N, K, k_per_split,
                 stride_xm, stride_xg, stride_xsm, stride_xsg, stride_wn, stride_wsn,
                 stride_ys, stride_ym, stride_yg, stride_om, stride_og,
                 SB: tl.constexpr, W_FP8: tl.constexpr, A_FP8: tl.constexpr, DOT: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                 INTERPRET: tl.constexpr, W_F32: tl.constexpr, SPLITS: tl.constexpr = 1,
                 FINISH: tl.constexpr = False, PDL: tl.constexpr = False, WHOLE: tl.constexpr = False):
    """WHOLE (the half dot over FP8 weights whose scale blocks are narrower than BK): the K tile widened at once, each
    row's SB-wide scales applied by a reshape, then ONE dot over BK, instead of a load and a dot per SB of K."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid = tl.program_id(0)
    g = tl.program_id(1)
    split = tl.program_id(2)
    # grouped ordering: programs that run together share W columns and x rows in L2
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP_M * n_n
    first_m = (pid // width) * GROUP_M
    rows_here = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % rows_here
    pid_n = (pid % width) // rows_here

    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    w_rows = g * N + offs_n  # the weight's global rows (G projections stacked)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.float64 if DOT == 3 else tl.float32)
    k_lo = split * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    for k0 in range(k_lo, k_hi, BK):
        if WHOLE:
            acc = _whole_tile(x_ptr, w_ptr, ws_ptr, acc, offs_m, w_rows, m_ok, n_ok, g, k0, k_hi, stride_xm, stride_xg,
                              stride_wn, stride_wsn, SB, BN, BK, INTERPRET)
        else:
            for sub in tl.static_range(BK // SB):  # one scale block of K at a time
                offs_k = k0 + sub * SB + tl.arange(0, SB)
                k_ok = offs_k < k_hi
                x = tl.load(x_ptr + offs_m[:, None] * stride_xm + g * stride_xg + offs_k[None, :],
                            mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptr + w_rows[:, None] * stride_wn + offs_k[None, :],
                            mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                kb = (k0 + sub * SB) // SB
                kb_ok = k0 + sub * SB < k_hi  # a sub-block past K: its tiles load as zeros, its scales must not be read
                if W_FP8:
                    wsb = tl.load(ws_ptr + (w_rows // SB) * stride_wsn + kb, mask=n_ok & kb_ok, other=127)
                    w_scale = ((wsb.to(tl.int32) & 0xFF) << 23).to(tl.float32, bitcast=True)  # e8m0 -> 2**(b-127)
                if A_FP8:  # FP8 x FP8 on the tensor cores, both scales applied to the block's partial product
                    x_scale = tl.load(xs_ptr + offs_m * stride_xsm + g * stride_xsg + kb, mask=m_ok & kb_ok, other=1.0)
                    part = tl.dot(x, tl.trans(w))
                    acc += part * x_scale[:, None] * w_scale[None, :]
                else:
                    if DOT == 1:
                        dt = x_ptr.dtype.element_ty
                        wf = w.to(tl.float32)
                        if W_FP8:
                            wf = wf * w_scale[:, None]
                        if INTERPRET:  # same bf16 operands, fp32 products (see kernels.interpreting)
                            acc += tl.dot(x.to(tl.float32), tl.trans(wf.to(dt).to(tl.float32)), input_precision="ieee")
                        else:
                            acc += tl.dot(x, tl.trans(wf.to(dt)))
                    elif DOT == 2:
                        wf = w.to(tl.float32)
                        if W_FP8:
                            wf = wf * w_scale[:, None]
                        if INTERPRET or W_F32:
                            acc += tl.dot(x.to(tl.float32), tl.trans(wf), input_precision="ieee")
                        else:
                            # float32 x against a bf16-exact weight (the LM head, compressors): x = hi + lo in two bf16
                            # parts, two bf16 tensor-core dots (x kept to 16 mantissa bits; FMA-based fp32 dots are
                            # ~20x slower here)
                            wb = tl.trans(wf.to(tl.bfloat16))
                            xf = x.to(tl.float32)
                            hi = xf.to(tl.bfloat16)
                            lo = (xf - hi.to(tl.float32)).to(tl.bfloat16)
                            acc += tl.dot(hi, wb) + tl.dot(lo, wb)
                    else:
                        wf = w.to(tl.float32).to(tl.float64)  # (the interpreter has no e4m3 -> f64 cast)
                        if W_FP8:
                            wf = wf * w_scale[:, None].to(tl.float64)
                        acc += tl.dot(x.to(tl.float64), tl.trans(wf))
    y = y_ptr + split * stride_ys + offs_m[:, None] * stride_ym + g * stride_yg + offs_n[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
    if FINISH:  # split K: the last program to arrive at this output tile adds the partials in split order
        tile = g * (n_m * n_n) + pid
        if last_to_arrive(cnt_ptr + tile, SPLITS):
            part = y_ptr + offs_m[:, None] * stride_ym + g * stride_yg + offs_n[None, :]
            total = tl.load(part, mask=out_ok, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLITS):
                total += tl.load(part + s * stride_ys, mask=out_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + offs_m[:, None] * stride_om + g * stride_og + offs_n[None, :],
                     total.to(out_ptr.dtype.element_ty), mask=out_ok)
            tl.store(cnt_ptr + tile, 0)  # ready for the next launch / graph replay


@triton.jit
def _whole_tile(x_ptr, w_ptr, ws_ptr, acc, offs_m, w_rows, m_ok, n_ok, g, k0, k_hi, stride_xm, stride_xg, stride_wn,
                stride_wsn, SB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + x [BM, BK] @ (the FP8 weight tile [BN, BK] times its e8m0 scales, widened to x's dtype)^T: the scales of
    the tile's BK / SB blocks [BN, BK / SB] broadcast over a [BN, BK / SB, SB] view (exact: value * 2^e)."""
    offs_k = k0 + tl.arange(0, BK)
    k_ok = offs_k < k_hi
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + g * stride_xg + offs_k[None, :],
                mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    w = tl.load(w_ptr + w_rows[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    kb = k0 // SB + tl.arange(0, BK // SB)
    wsb = tl.load(ws_ptr + (w_rows // SB)[:, None] * stride_wsn + kb[None, :],
                  mask=n_ok[:, None] & (kb * SB < k_hi)[None, :], other=127)
    w_scale = ((wsb.to(tl.int32) & 0xFF) << 23).to(tl.float32, bitcast=True)  # e8m0 -> 2**(b-127)
    wf = tl.reshape(tl.reshape(w.to(tl.float32), (BN, BK // SB, SB)) * w_scale[:, :, None], (BN, BK))
    dt = x_ptr.dtype.element_ty
    if INTERPRET:  # same bf16 operands, fp32 products (see kernels.interpreting)
        return acc + tl.dot(x.to(tl.float32), tl.trans(wf.to(dt).to(tl.float32)), input_precision="ieee")
    return acc + tl.dot(x, tl.trans(wf.to(dt)))


@step_jit
def _sum_splits_kernel(p_ptr, y_ptr, total, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """y = sum over splits of the partials, in split order (deterministic)."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.load(p_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(p_ptr + s * total + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


def _config(M: int, N: int, K: int, G: int, sb: int, fp8_dot: bool, wide: bool = False,
            split_x: bool = False) -> dict:
    """Tile shapes: small M streams the weight (split K to fill the GPU); large M is compute bound. split_x: float32 x
    over a plain bf16 weight (x split into two bf16 parts in each tile: the LM head)."""
    bk = max(sb, 128)
    if interpreting():  # few, large programs: the CPU interpreter pays per program, not per element
        bm, bn = max(16, min(64, next_pow2(M))), min(512, max(16, next_pow2(N)))
        splits = max(1, min(cdiv(K, bk), 4 // max(1, cdiv(N, bn) * G)))
        return {"BM": bm, "BN": bn, "BK": bk, "splits": splits, "num_warps": 4, "num_stages": 1}
    if M <= 64:
        bm = max(16, next_pow2(M))
        head = head_tiles(M, N) if split_x else None
        if head is not None:
            return {"BM": bm, "splits": 1, **head}
        bn = 64
        tiles = cdiv(N, bn) * G * cdiv(M, bm)
        k_blocks = cdiv(K, bk)
        splits = max(1, min(k_blocks, cdiv(2 * _SMS, tiles)))
        return {"BM": bm, "BN": bn, "BK": bk, "splits": splits, "num_warps": 4, "num_stages": 4}
    if not fp8_dot and wide:  # fp32 / fp64 tiles: 4x the shared memory of FP8 ones
        return {"BM": 64, "BN": 64, "BK": bk, "splits": 1, "num_warps": 4, "num_stages": 2}
    bm = 128 if M >= 128 else 64
    splits = prefill_splits(cdiv(M, bm) * cdiv(N, 128) * G, cdiv(K, bk))
    return {"BM": bm, "BN": 128, "BK": bk, "splits": splits, "num_warps": 8, "num_stages": 4 if fp8_dot else 3}


# The LM head at decode (float32 x, bf16 weight, N = the vocabulary): with 64-wide N tiles x's float32 tile is as many
# bytes as the weight's, so at 32 rows each program streams twice the weight's bytes through shared memory and four
# 32 KB stages leave one CTA an SM (H100 step at batch 32: 731 us against 438 at batch 1). From 17 rows (32-row tiles)
# wider N tiles on 64-deep K tiles halve x's share and its stage: H100, `benchmarks/kernels/fp8_gemm.py --head`
# (thirty-eighth session), 32 rows 584.7 -> 382.2 us (60 -> 92% of HBM) with n128k64, the other choices 394-755; one row
# 348 us in every choice. The V4.1 batch-32 step's replay -0.17 to -0.28 ms, V4's -0.20 to -0.26. HEAD_TILES_ENV names
# a choice (A/B); "off" keeps the general decode tiles.
HEAD_TILES = {
    "n128k64": {"BN": 128, "BK": 64, "num_warps": 4, "num_stages": 4},
    "n128k64w8": {"BN": 128, "BK": 64, "num_warps": 8, "num_stages": 4},
    "n256k64w8": {"BN": 256, "BK": 64, "num_warps": 8, "num_stages": 3},
    "n64k64": {"BN": 64, "BK": 64, "num_warps": 4, "num_stages": 6},
    "n128k128w8": {"BN": 128, "BK": 128, "num_warps": 8, "num_stages": 3},
}
HEAD_TILES_ENV = "V4SERVE_HEAD_TILES"
# Up to 16 rows the general tiles are 16 rows tall (x's float32 tile half the weight's) and stay faster: H100,
# `fp8_gemm.py --head --rows 2,8,16,64` (thirty-ninth session, µs, n128k64 against the general tiles): 2 rows 393.5 /
# 360.3, 8 rows 396.5 / 365.4, 16 rows 398.8 / 369.0, but 64 rows 408.2 / 639.5 (32 rows: 382.2 / 584.7); one row ~348
HEAD_MIN_ROWS, HEAD_MIN_N = 17, 16384


def head_tiles(M: int, N: int) -> dict | None:
    """The head's decode tiles for M rows over N outputs, or None for the general ones."""
    name = env_get(HEAD_TILES_ENV) or "n128k64"
    if name == "off" or M < HEAD_MIN_ROWS or N < HEAD_MIN_N:
        return None
    if name not in HEAD_TILES:
        raise ValueError(f"{HEAD_TILES_ENV}={name!r}: one of off, {', '.join(HEAD_TILES)}")
    return HEAD_TILES[name]


def prefill_splits(tiles: int, k_blocks: int, sms: int = _SMS) -> int:
    """K shares for a grid of `tiles` output tiles under one wave (a CTA an SM): as many as still fit one wave, at
    least 2 K blocks a share. V4.1's decoder layers run their linears on 128-token suffixes, where a 5120-wide output
    is 40 tiles on 132 SMs (`wq_a` 14) that each walked all of K: 17.5 of a 640-token mixed step's 92 ms of GPU (H100,
    profile_step.py, twenty-sixth session)."""
    return max(1, min(sms // max(1, tiles), k_blocks // 2, 16))


def _dot_mode(x: torch.Tensor, a_fp8: bool) -> int:
    if a_fp8:
        return _DOT_FP8
    if x.dtype in (torch.bfloat16, torch.float16):
        return _DOT_HALF
    return _DOT_F64 if x.dtype == torch.float64 else _DOT_F32


def _run(x3: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int, act_group: int,
         out_dtype: torch.dtype, quant_out: int = 0, xs: torch.Tensor | None = None) -> torch.Tensor | Quantized:
    """x3 [M, G, K] -> y [M, G, N] with W [G*N, K]: decode rows in fp8_gemv (one launch; two for large W8A8 weights;
    plain weights in x's dtype too), the rest here. xs: x3 is already quantized (e4m3, its scales [M, G, K/block]).
    quant_out: the GEMV quantizes its output per 1 x quant_out for the consumer (a Quantized in out_dtype) where it
    can (fp8_gemv.quantizes_output); elsewhere the plain output, which its consumer quantizes as usual."""
    if xs is None and (scale is not None or weight.dtype == x3.dtype) and fp8_gemv.supports(x3, weight, block,
                                                                                            act_group):
        if fp8_gemv.quantizes_output(weight, x3.shape[1], quant_out, x3.shape[0]):
            return fp8_gemv.run(x3, weight, scale, block, act_group, out_dtype, quant_out=quant_out)
        return fp8_gemv.run(x3, weight, scale, block, act_group, out_dtype)
    if xs is not None and x3.shape[0] <= 64:
        return fp8_gemv.run(x3, weight, scale, block, block, out_dtype, quantized=xs)
    return general(x3, weight, scale, block, act_group, out_dtype, xs=xs)


def general(x3: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int, act_group: int,
            out_dtype: torch.dtype, cfg: dict | None = None, xs: torch.Tensor | None = None) -> torch.Tensor:
    """Any M and mode: activation quantization, the GEMM, and a split-K sum when split; W8A8 prefill rows of
    128-block weights go to cuBLAS (scaled_mm.py) where it has the recipe. `cfg` overrides the tile choice and keeps
    the Triton kernel (benchmarks). xs: x3 is already quantized (e4m3, its float32 scales [M, G, K/block])."""
    M, G, K = x3.shape
    N = weight.shape[0] // G
    if M == 0:  # e.g. the head of a prefill chunk that samples nothing (no tiles: no config either)
        return torch.empty(M, G, N, dtype=out_dtype, device=x3.device)
    w_fp8 = weight.dtype == torch.float8_e4m3fn
    widen = _takes_bmm(x3, weight, scale, block, cfg, out_dtype if xs is not None else x3.dtype)
    # W8A8 on the FP8 tensor cores where the activations quantize per the weight's block; cfg {"a_fp8": False} (by
    # default half_dot_default's rows) runs the same values as W8A16 instead (x FP8-simulated in bf16, exact, against
    # the weight widened per tile on the bf16 tensor cores: no per-block rescale of the accumulator), each K tile
    # widened at once where a program walks WHOLE_MIN_TILES K tiles or more (cfg {"whole": bool} decides instead)
    half_dot = not widen and not (cfg or {}).get("a_fp8", not half_dot_default(M, block, x3.is_cuda
                                                                              and not interpreting()))
    if xs is not None and (widen or half_dot) and out_dtype in (torch.bfloat16, torch.float16):
        # quantized by its producer (the norm): its values in x's dtype, what act_simulate gives
        x3, xs, act_group = fp8_dequantize(x3, xs, block).to(out_dtype), None, 0
    if widen:
        return _widened_bmm(x3, weight, scale, block, act_group, out_dtype)
    half = x3.dtype in (torch.bfloat16, torch.float16)
    a_fp8 = xs is not None or (bool(act_group) and half and w_fp8 and act_group == block and not half_dot)
    if a_fp8 and xs is None:  # (xs given: quantized by its producer)
        x3, xs = act_quant(x3, block)
    elif not a_fp8 and act_group:
        x3 = act_simulate(x3, act_group)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    if a_fp8 and G == 1 and cfg is None and scaled_mm.supports(x3[:, 0], weight, block, out_dtype):
        return scaled_mm.gemm(x3[:, 0], xs[:, 0], weight, scale, out_dtype).view(M, 1, N)  # prefill rows: cuBLAS
    sb = block if w_fp8 else 128  # plain float weights: no scale blocks
    wide = x3.dtype in (torch.float32, torch.float64)
    split_x = x3.dtype == torch.float32 and weight.dtype == torch.bfloat16 and x3.is_cuda and G == 1
    cfg = {**_config(M, N, K, G, sb, a_fp8, wide, split_x), **(cfg or {})}
    splits, bk = cfg["splits"], cfg["BK"]
    if not w_fp8:
        sb = bk  # no scale blocks: the K loop's sub-block is the whole tile
    k_per_split = k_share(K, splits, bk)
    splits = cdiv(K, k_per_split)
    y = torch.empty(M, G, N, dtype=out_dtype, device=x3.device)
    acc_t = torch.float64 if x3.dtype == torch.float64 else torch.float32
    part = torch.empty(splits, M, G, N, dtype=acc_t, device=x3.device) if splits > 1 else y.unsqueeze(0)
    scale_t = scale if scale is not None else weight
    xs_t = xs if xs is not None else x3
    grid = (cdiv(M, cfg["BM"]) * cdiv(N, cfg["BN"]), G, splits)
    # split K (decode rows, short prefill grids): the partials are added by the last program to arrive at each tile
    # (no second launch)
    finish = splits > 1 and cfg.get("finish", True) and grid[0] * G <= N_COUNTERS
    cnt = _COUNTERS.get(x3.device) if finish else y
    dot = _dot_mode(x3, a_fp8)
    _gemm_kernel[grid](
        x3, xs_t, weight, scale_t, part, y, cnt, M, N, K, k_per_split,
        x3.stride(0), x3.stride(1), xs_t.stride(0) if xs is not None else 0, xs_t.stride(1) if xs is not None else 0,
        weight.stride(0), scale_t.stride(0) if scale is not None else 0,
        part.stride(0), part.stride(1), part.stride(2), y.stride(0), y.stride(1), SPLITS=splits, FINISH=finish,
        WHOLE=bool(cfg.get("whole", half_dot and whole_tiles(k_per_split, bk))) and w_fp8
        and dot == _DOT_HALF and sb < bk,
        SB=sb, W_FP8=w_fp8, A_FP8=a_fp8, DOT=dot, BM=cfg["BM"], BN=cfg["BN"], BK=bk, GROUP_M=8,
        INTERPRET=interpreting(), W_F32=weight.dtype == torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(x3))
    if splits > 1 and not finish:
        total = M * G * N
        _sum_splits_kernel[(cdiv(total, 1024),)](part, y, total, SPLITS=splits, BLOCK=1024,
                                                           **pdl_launch(y))
    return y


def k_share(K: int, splits: int, block_k: int) -> int:
    """The K a program walks with K split in `splits` shares, whole K tiles each."""
    return cdiv(cdiv(K, splits), block_k) * block_k


def whole_tiles(k_per_split: int, block_k: int) -> bool:
    """The half dot's default form: whole K tiles widened at once from WHOLE_MIN_TILES tiles a program."""
    return k_per_split >= WHOLE_MIN_TILES * block_k


def half_dot_default(rows: int, block: int, on_gpu: bool) -> bool:
    """W8A8 prefill rows below the widened weight's (`_takes_bmm`) of weights whose blocks cuBLAS FP8 has no recipe for
    (V4.1's 32 x 32) run as W8A16 on the bf16 dot (the same values, no rescale of the accumulator every 32 of K).
    H100, 128 rows with K split (benchmarks/kernels/fp8_gemm.py, twenty-sixth session), FP8 dots against bf16: wq_b
    81.2 / 61.4 us, wo_b 91.0 / 70.7, the shared expert's w13 61.0 / 50.4 and w2 35.0 / 32.3, wq_a 30.7 / 30.5, wo_a
    50.8 / 51.2."""
    return on_gpu and block != scaled_mm.BLOCK and 64 < rows < BMM_MIN_ROWS


def _takes_bmm(x3: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
               cfg: dict | None, dtype: torch.dtype) -> bool:
    """Prefill rows of an FP8 weight on the GPU where the weight is grouped (from BMM_MIN_ROWS) or its blocks are not
    cuBLAS FP8's 128 (from BMM_MIN_ROWS_B32), for activations of a half dtype (given quantized: the dtype they stand
    for); cfg {"bmm": True} forces it (benchmarks, tests), any other cfg keeps the Triton kernel."""
    if not fp8_widen.supports(weight, scale) or dtype not in (torch.bfloat16, torch.float16):
        return False
    if cfg is not None:
        return bool(cfg.get("bmm"))
    if not x3.is_cuda or (x3.shape[1] == 1 and block == scaled_mm.BLOCK):
        return False
    return x3.shape[0] >= (BMM_MIN_ROWS if x3.shape[1] > 1 else BMM_MIN_ROWS_B32)


def _widened_bmm(x3: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: int, act_group: int,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """x3 [M, G, K] against W [G*N, K] as the reference computes it: x FP8-simulated in its dtype (act_group), W
    widened exactly to that dtype, G products in one batched GEMM (cuBLAS: fp32 accumulation), written in place."""
    M, G, K = x3.shape
    N = weight.shape[0] // G
    if act_group:
        x3 = act_simulate(x3, act_group)
    w = fp8_widen.widen(weight, scale, block, x3.dtype).view(G, N, K)
    y = torch.empty(M, G, N, dtype=x3.dtype, device=x3.device)
    torch.bmm(x3.transpose(0, 1), w.transpose(1, 2), out=y.transpose(0, 1))
    return y if out_dtype == x3.dtype else y.to(out_dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
           act_group: int = 0, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x W^T; x [..., K], W [N, K] stored -> [..., N] in out_dtype (default x's dtype: ops/linear.linear)."""
    lead = x.shape[:-1]
    out = out_dtype or x.dtype
    if weight.dtype == x.dtype == out and not act_group:  # a plain float weight in x's own dtype: cuBLAS as is
        return torch.nn.functional.linear(x, weight)
    if out == torch.float64 and x.dtype != out:  # fp64 math (CPU interpreter runs): x widened first
        x = x.to(out)
    y = _run(x.reshape(-1, 1, x.shape[-1]), weight, scale, block, act_group, out)
    return y.view(*lead, weight.shape[0])


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, block: int,
                   act_group: int = 0, quant_out: int = 0) -> torch.Tensor | Quantized:
    """x [T, G, K], W [G*N, K] -> [T, G, N] in x's dtype (quant_out > 0: quantized per 1 x quant_out in the decode
    GEMV's finish where it can, ops.linear.grouped_linear)."""
    return _run(x, weight, scale, block, act_group, x.dtype, quant_out)


def supports_quantized(x: Quantized, weight: torch.Tensor, block: int, act_group: int) -> bool:
    """Activations quantized by their producer, for an FP8 weight whose activation quantization they are."""
    v = x.values
    return (weight.dtype == torch.float8_e4m3fn and x.group == act_group == block and v.dim() >= 1
            and x.dtype in (torch.bfloat16, torch.float16) and (v.is_cuda or interpreting())
            and x.scales.dtype == torch.float32)


def linear_quantized(x: Quantized, weight: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """y = x W^T in x's dtype from the producer's e4m3 values and scales (no activation quantization here)."""
    K = x.shape[-1]
    lead = x.shape[:-1]
    xs = x.scales.reshape(-1, 1, K // block)
    y = _run(x.values.reshape(-1, 1, K), weight, scale, block, block, x.dtype, xs=xs)
    return y.view(*lead, weight.shape[0])
