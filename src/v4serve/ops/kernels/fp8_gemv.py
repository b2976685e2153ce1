"""The decode form of the FP8 block-scaled GEMM (M <= 64 rows), in ONE launch per linear.

At decode a linear is a weight stream: a 4-32 MB FP8 matrix read once for a handful of rows. Three launches (activation
quantization, GEMM, split-K sum) cost more than streaming the small weights, so this kernel

* quantizes the activations in registers, per 1 x block as kernels/quant.py does (same scales, same e4m3 rounding), one
  scale block of K at a time as it meets them: no quantized copy of x is written (weights over MAX_WEIGHT_BYTES take
  them from kernels/quant.act_quant instead, one small launch before: the same values);
* splits K across programs until about two waves of them stream the weight, and finishes in the last program to
  arrive at each output tile (per-tile arrival counters, acq_rel): it adds the partial sums in split order, so the
  result does not depend on timing, and re-zeroes its counter for the next launch or graph replay.

One row (M = 1, a batch-1 decode step) runs on the CUDA cores instead (`fma_config`, `fma_acc`): whole [32, 512]
weight tiles in 16-byte loads, widened to float32 in registers, float32 products summed per scale block, the scales on
the block sums; its activations are always quantized in registers. The tensor cores' 16- or 64-row tile is 1/16 used
by one row, and that form measured 1.0-1.5x slower on every V4 decode shape (fma_config's figures). The same form
takes up to FMA_MAX_ROWS rows when a config asks for it (cfg "fma"; the weight tile widened once for all rows, an
FMA a value per row): not timed for more than one row yet, so not a default there.

W8A8 (bf16/fp16 x, activation group = weight block) and W8A16 (no activation quantization: V4's grouped `wo_a`) over
FP8 weights with e8m0 block scales (128 x 128 for V4, 32 x 32 for V4.1); G > 1 stacks G projections (grouped wo_a).
Plain half-precision weights in x's dtype take the same kernel without scales: the compressors' wkv / wgate and the
indexer's weights_proj, stacked, with a float32 output, and `grouped_linear`'s stacked plain projections (a plain
`linear` whose output is in x's dtype stays with cuBLAS, ops/kernels/fp8_gemm.linear).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..backend import fused
from ..env import get as env_get
from ..env import switch as env_switch
from ..quant import Quantized
from . import cdiv, interpreting, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .pdl import prefetch as pdl_prefetch
from .pdl import prefetch_rows
from .quant import act_quant, quantize_rows
from .split_grid import TL_DTYPES, ArrivalCounters, last_to_arrive

_SMS = 132  # H200 multiprocessors
# Measured on the H200 (benchmarks/kernels/fp8_gemm.py, 2026-11-30 and 2026-12-01): in-register activation
# quantization wins below ~16 MB of weight, where launches dominate; larger weights stream faster with the activations
# quantized before (their split-K still finished here, not by a third launch).
MAX_WEIGHT_BYTES = 16 << 20
_COUNTERS = ArrivalCounters()
# One row on the CUDA cores (fma_acc) by default on the GPU; V4SERVE_GEMV_FMA=0 keeps it on the tensor cores (A/B)
FMA_ONE_ROW = os.environ.get("V4SERVE_GEMV_FMA", "1") != "0"
FMA_MAX_ROWS = 4  # the CUDA-core form's row limit (cfg "fma"; by default one row only): each row costs an FMA a value
# Rows on the tensor cores (W8A8) as bf16 dots of the dequantized operands (cfg "deq", block_dot's DEQ): slower than
# the FP8 dots at 8 and 32 rows on every V4.1 shape (H100, thirty-second session: wo_b 41.7 -> 85.9 us, wq_b 29.8 ->
# 56.8 at 32 rows), so off unless V4SERVE_GEMV_DEQ=1 (read per config: a graph recaptured under it takes it)
DEQ_ENV = "V4SERVE_GEMV_DEQ"
# A leaner K loop for the tensor-core rows (cfg "full", "scales_t", "pair_scales"; all three with V4SERVE_GEMV_LEAN=1,
# read per config), the same bits: "full" drops the K masks when K is a multiple of the K tile (every split's tiles
# are then whole); "scales_t" has act_quant write the prequantized x's scales transposed ([K / block, BM]: a block's
# scales of all rows at unit stride), so a thread's scales of one block are a few wide loads at constant offsets;
# "pair_scales" multiplies the two power-of-two scales before the product (block_dot PAIR). sm_90 SASS of V4.1's
# wo_b, instructions a K tile: 32 rows 449 -> 346 (full + scales_t: LDG 36 -> 20, ISETP 34 -> 8; 134 -> 102
# registers) -> 314 (pair_scales: FMUL 64 -> 32); 8 rows 356 -> 270. H100 (`fp8_gemm.py --decode-only`, µs, default
# -> lean): V4.1 wo_b M=32 41.8 -> 39.7, wq_b M=32 29.9 -> 29.0, M=8 25.5 -> 25.0, but wo_b M=8 29.6 -> 30.5 and V4's
# 128-block shapes slower (wo_b M=8 19.3 -> 21.4, M=32 21.9 -> 23.5); the V4.1 batch-32 step's replay 22.52 -> 22.19
# ms (lean everywhere). So the default for 32-block FP8 weights only (`lean_loop`); V4SERVE_GEMV_LEAN=1 / 0 forces.
LEAN_ENV = "V4SERVE_GEMV_LEAN"


def lean_loop(sb: int, plain: bool = False) -> bool:
    """Whether a tensor-core config takes the lean K loop (LEAN_ENV): by default for FP8 weights of 32-wide blocks
    (V4.1's), where it was timed faster; V4SERVE_GEMV_LEAN=1 / 0 turns it on / off for every weight."""
    return env_switch(LEAN_ENV, sb == 32 and not plain)


# The tensor-core loop's scale loads (plain loads consumed in the K tile that issues them) were taken out of the tile
# twice more and timed slower both times, so the loop keeps them in place. ncu of V4.1's wo_b at 32 rows (H100,
# thirty-ninth session) put 48% of its stall samples on the weight scale byte's load, yet: (1) the scales loaded an
# iteration ahead and carried: wo_b M=32 39.7 -> 42.5 us, wq_b M=32 29.0 -> 33.9, the V4.1 batch-32 / 4K replay
# 21.47 / 21.51 -> 22.10 / 22.14 ms (177 registers on the GPU, two CTAs an SM where there were four); (2) the scales
# staged as async copies with the operands (a K tile's four e8m0 bytes a scale row read as one 32-bit word, a stage
# count on the loop; no plain load left, 90 registers in sm_90 SASS): wo_b M=32 39.7 -> 42.3, wq_b 29.1 -> 31.8, the
# rest within 0.3 us or slower. Without the byte loads the warps wait on the operands and the four waited wgmmas a tile
# instead (the thirty-sixth session's staged loop, 175 registers, was slower too). Both removed; RESULTS.md has them.
DEEP_ENV = "V4SERVE_GEMV_DEEP"
DEEP_MIN_TILES = 16


def deep_pipeline(bm: int, swap: bool, lean: bool, k_tiles: int) -> bool:
    """Opt-in (DEEP_ENV=1): six stages instead of four for the lean swapped loop over 32 rows walking >= DEEP_MIN_TILES
    K tiles a program (V4.1's wo_b, 16). Alone it is faster — H100, `fp8_gemm.py --decode-only --variants
    default,stages6` (µs, 4 -> 6 stages), V4.1 at 32 rows: wo_b 39.7 -> 37.4 and 40.0 -> 37.5 (thirty-seventh /
    thirty-eighth sessions), though wq_b (10 tiles) 28.9 -> 38.5, grouped wo_a (11) 30.2 -> 38.7, shared w2 (5) 18.8 ->
    24.0, wo_b at 8 rows 30.4 -> 31.7 — but the V4.1 step at batch 32 / 4K replayed slower with it: 21.553 / 21.615 ms
    against 21.412 / 21.484 (thirty-eighth session)."""
    return env_get(DEEP_ENV) == "1" and bm == 32 and swap and lean and k_tiles >= DEEP_MIN_TILES


def supports(x3: torch.Tensor, weight: torch.Tensor, block: int, act_group: int) -> bool:
    """Decode rows of half-precision x over an FP8 weight, with the activation quantization of the weight's block (or
    none); everything else takes fp8_gemm's general kernel."""
    M = x3.shape[0]
    if not (0 < M <= 64 and x3.dtype in (torch.bfloat16, torch.float16) and (x3.is_cuda or interpreting())):
        return False
    if weight.dtype == x3.dtype:  # a plain weight: no scales, no activation quantization
        return act_group == 0
    return weight.dtype == torch.float8_e4m3fn and act_group in (0, block)


def prequantize(weight: torch.Tensor, act_group: int) -> bool:
    """Large W8A8 weights take the activations quantized by one small launch before (kernels/quant.act_quant): the
    in-register quantization stalls their tensor-core weight stream (H200, benchmarks/kernels/fp8_gemm.py: wq_b 32 MB
    at M=1 19.1 us in-register vs 13.8 us with the separate quantization). The one-row CUDA-core form quantizes in
    registers at every size (`run`): wq_b 15.1 us vs 13.8 with the launch before, wo_b 15.1 vs 15.6, grouped wo_a
    13.5 vs 13.6 (64-row tiles; the step saves the 43 act_quant launches)."""
    return bool(act_group) and weight.numel() > MAX_WEIGHT_BYTES


@triton.jit
def e8m0_to_f32(b):
    """e8m0 scale bytes -> 2**(b-127) as float32."""
    return ((b.to(tl.int32) & 0xFF) << 23).to(tl.float32, bitcast=True)


@triton.jit
def block_dot(acc, x, w, x_scale, w_scale, FP8: tl.constexpr, INTERPRET: tl.constexpr, SWAP: tl.constexpr = False,
              W_SCALED: tl.constexpr = True, DEQ: tl.constexpr = False, PAIR: tl.constexpr = False):
    """acc + one scale block's x [BM, SB] @ w [BN, SB]^T: FP8 x FP8 on the tensor cores with both scales applied to the
    block's product (FP8: x in e4m3), or W8A16, the weight tile dequantized to x's dtype (exact) for a half-precision
    dot. SWAP: acc is the transpose [BN, BM], w @ x^T: the weight is wgmma's 64-row operand, read from shared memory
    (BM = 16 puts x there; sm_90 has FP8 MMAs only as wgmma: its mma.sync form converts both operands to f16 first).
    W_SCALED false: a plain weight in x's dtype, used as it is. DEQ (with FP8): both e4m3 operands times their
    power-of-two scales as bf16 (exact), one bf16 dot chained into acc: no product to wait for and scale per block
    (V4.1's 32-wide blocks make that a wait and three float ops an accumulator element every 32 of K). PAIR: the two
    scales multiplied first (exact: both powers of two), so that a thread whose accumulator rows share one weight
    scale block takes one multiply per column and one FMA per element, not two multiplies per element."""
    if FP8 and DEQ:
        w = (w.to(tl.float32) * w_scale[:, None]).to(tl.bfloat16)
        x = (x.to(tl.float32) * x_scale[:, None]).to(tl.bfloat16)
        lhs, rhs = (w, x) if SWAP else (x, w)
        if INTERPRET:  # the interpreter's bf16 dot is wrong (kernels.interpreting); the values are exact
            return tl.dot(lhs.to(tl.float32), tl.trans(rhs.to(tl.float32)), acc, input_precision="ieee")
        return tl.dot(lhs, tl.trans(rhs), acc)
    if not FP8 and W_SCALED:
        w = (w.to(tl.float32) * w_scale[:, None]).to(x.dtype)
    if SWAP:
        lhs, rhs, s_lhs, s_rhs = w, x, w_scale, x_scale
    else:
        lhs, rhs, s_lhs, s_rhs = x, w, x_scale, w_scale
    if INTERPRET and not FP8:  # the interpreter's bf16 dot is wrong (kernels.interpreting); the values are exact
        prod = tl.dot(lhs.to(tl.float32), tl.trans(rhs.to(tl.float32)), input_precision="ieee")
    else:
        prod = tl.dot(lhs, tl.trans(rhs))
    if FP8 and PAIR:
        prod = prod * (s_lhs[:, None] * s_rhs[None, :])
    elif FP8:
        prod = prod * s_lhs[:, None] * s_rhs[None, :]
    acc += prod
    return acc


@triton.jit
def act_block(x, xs_ptr, offs_m, m_ok, stride_xsm, stride_xsk, xs_off, kb, kb_ok, w_scale, A_FP8: tl.constexpr,
              A_PRE: tl.constexpr):
    """One scale block of x [BM, SB] for block_dot -> (x, its scales [BM]): A_PRE, x already e4m3 with its per-block
    scales at xs_ptr (+ xs_off: a group's; kernels/quant.act_quant, launched before; block kb at kb * stride_xsk);
    A_FP8, quantized here as act_quant would (amax floored at 1e-4, power-of-two scale, e4m3 RNE); else W8A16 (no
    activation scale: w_scale stands in)."""
    if A_PRE:
        x_scale = tl.load(xs_ptr + offs_m * stride_xsm + xs_off + kb * stride_xsk, mask=m_ok & kb_ok, other=1.0)
    elif A_FP8:
        x, x_scale = quantize_rows(x)
    else:
        x_scale = w_scale
    return x, x_scale  # (one return: Triton types every return of a function alike, constexpr branches included)


@triton.jit
def scale_block(k0, sub, k_hi, SB: tl.constexpr, FULL: tl.constexpr = False):
    """Scale block `sub` of the K tile at k0 -> (its first K position, its positions [SB], their mask, whether it
    starts before k_hi: a block past the split's end reads zeros and no scales). FULL: the caller's K tiles are whole
    (K a multiple of the tile, splits on tiles), so the masks are constant true and the compiler drops them."""
    kb0 = k0 + sub * SB
    offs_k = kb0 + tl.arange(0, SB)
    if FULL:
        return kb0, offs_k, tl.full([SB], 1, tl.int1), kb0 == kb0
    return kb0, offs_k, offs_k < k_hi, kb0 < k_hi


@triton.jit
def _fma_k(k0, k_hi, SB: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """A CUDA-core tile's K positions and their mask; with EVEN_K (K and the splits' bounds on scale blocks) a mask
    constant per block, which keeps the weight loads 16 B wide."""
    offs_k = k0 + tl.arange(0, BK)
    if EVEN_K:
        return offs_k, k0 + tl.arange(0, BK) // SB * SB < k_hi
    return offs_k, offs_k < k_hi


@triton.jit
def fma_w(w_ptr, ws_ptr, w_rows, n_ok, k0, k_hi, stride_wn, stride_wsn, SB: tl.constexpr, BK: tl.constexpr,
          W_SCALED: tl.constexpr, EVEN_K: tl.constexpr):
    """A whole [BN, BK] weight tile for fma_acc, loaded at once (every load in flight before the first use) and
    widened to float32, with its block scales [BN, BK / SB] (ones for a plain weight)."""
    NSB: tl.constexpr = BK // SB
    offs_k, k_ok = _fma_k(k0, k_hi, SB, BK, EVEN_K)
    w = tl.load(w_ptr + w_rows[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    if W_SCALED:
        kb = k0 // SB + tl.arange(0, NSB)
        w_scale = e8m0_to_f32(tl.load(ws_ptr + (w_rows // SB)[:, None] * stride_wsn + kb[None, :],
                                      mask=n_ok[:, None] & (kb * SB < k_hi)[None, :], other=127))
    else:
        w_scale = tl.full([w_rows.shape[0], NSB], 1.0, tl.float32)
    return w.to(tl.float32), w_scale


@triton.jit
def fma_x(x_ptr, xs_ptr, row_ok, k0, k_hi, SB: tl.constexpr, BK: tl.constexpr, A_FP8: tl.constexpr,
          A_PRE: tl.constexpr, EVEN_K: tl.constexpr):
    """One row's [BK] of x for fma_acc -> (x as float32, its per-block scales [BK / SB]): e4m3 values with
    act_quant's scales when quantized before (A_PRE) or here (A_FP8, per block as act_quant would), else as stored
    (scales of 1). A row past M (row_ok false) reads as zeros."""
    NSB: tl.constexpr = BK // SB
    offs_k, k_ok = _fma_k(k0, k_hi, SB, BK, EVEN_K)
    kb = k0 // SB + tl.arange(0, NSB)
    x = tl.load(x_ptr + offs_k, mask=k_ok & row_ok, other=0.0)
    if A_PRE:
        return x.to(tl.float32), tl.load(xs_ptr + kb, mask=(kb * SB < k_hi) & row_ok, other=1.0)
    if A_FP8:
        xq, x_scale = quantize_rows(tl.reshape(x, (NSB, SB)))
        return tl.reshape(xq, (BK,)).to(tl.float32), x_scale
    return x.to(tl.float32), tl.full([NSB], 1.0, tl.float32)


@triton.jit
def fma_acc(acc, m: tl.constexpr, w, w_scale, x, x_scale, SB: tl.constexpr):
    """Row m of acc [BM, BN] + one row's x [BK] against a widened weight tile w [BN, BK] on the CUDA cores: float32
    products summed per scale block, then the block's scales (x's and the weight's) on its sums. A few rows fill
    1/16 of a tensor-core tile; here nothing is padding and the weight needs no shared-memory stage."""
    BN: tl.constexpr = w.shape[0]
    BK: tl.constexpr = w.shape[1]
    part = tl.sum(tl.reshape(w * x[None, :], (BN, BK // SB, SB)), axis=2)  # [BN, NSB]
    row = tl.sum(part * w_scale * x_scale[None, :], axis=1)
    if acc.shape[0] == 1:
        return acc + row[None, :]
    return tl.where(tl.arange(0, acc.shape[0])[:, None] == m, acc + row[None, :], acc)


@step_jit
def _decode_gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, part_ptr, y_ptr, ys_ptr, cnt_ptr,
                        M, N, K, k_per_split,
                        stride_xm, stride_xg, stride_xsm, stride_xsg, stride_xsk, stride_wn, stride_wsn, stride_ym,
                        stride_yg, stride_ysm, stride_ysg,
                        SB: tl.constexpr, A_FP8: tl.constexpr, A_PRE: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, SPLITS: tl.constexpr, INTERPRET: tl.constexpr,
                        PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False, SWAP: tl.constexpr = False,
                        W_SCALED: tl.constexpr = True, QG: tl.constexpr = 0, OUT_DT: tl.constexpr = tl.bfloat16,
                        FMA: tl.constexpr = False, EVEN_K: tl.constexpr = False, FMA_STAGES: tl.constexpr = 1,
                        DEQ: tl.constexpr = False, FULL: tl.constexpr = False, PAIR: tl.constexpr = False):
    pid_n = tl.program_id(0)
    g = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    w_rows = g * N + offs_n
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    # the weight is never written by a predecessor: its rows may stream into L2 before the wait (kernels/pdl.py)
    W_BYTES: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_rows(w_ptr + tl.where(n_ok, w_rows, g * N) * stride_wn + k_lo, (k_hi - k_lo) * W_BYTES // 16 * 16,
                  PREFETCH)
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    if FMA:  # a few rows on the CUDA cores, the weight tile widened once for all of them; FMA_STAGES > 1: the weight
        # loads pipelined through shared memory (Triton 3.6 pipelines loads that feed no dot only when told a count)
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=FMA_STAGES):
            w, w_scale = fma_w(w_ptr, ws_ptr, w_rows, n_ok, k0, k_hi, stride_wn, stride_wsn, SB, BK, W_SCALED, EVEN_K)
            for m in tl.static_range(BM):
                x, x_scale = fma_x(x_ptr + m * stride_xm + g * stride_xg, xs_ptr + m * stride_xsm + g * stride_xsg,
                                   m < M, k0, k_hi, SB, BK, A_FP8, A_PRE, EVEN_K)
                acc = fma_acc(acc, m, w, w_scale, x, x_scale, SB)
    else:
        for k0 in range(k_lo, k_hi, BK):
            for sub in tl.static_range(BK // SB):  # one scale block of K at a time
                kb0, offs_k, k_ok, kb_ok = scale_block(k0, sub, k_hi, SB, FULL)
                x = tl.load(x_ptr + offs_m[:, None] * stride_xm + g * stride_xg + offs_k[None, :],
                            mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptr + w_rows[:, None] * stride_wn + offs_k[None, :],
                            mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                if W_SCALED:
                    w_scale = e8m0_to_f32(tl.load(ws_ptr + (w_rows // SB) * stride_wsn + kb0 // SB,
                                                  mask=n_ok & kb_ok, other=127))
                else:  # a plain weight (no scale tensor)
                    w_scale = tl.full([BN], 1.0, tl.float32)
                x, x_scale = act_block(x, xs_ptr, offs_m, m_ok, stride_xsm, stride_xsk, g * stride_xsg, kb0 // SB,
                                       kb_ok, w_scale, A_FP8, A_PRE)
                acc = block_dot(acc, x, w, x_scale, w_scale, A_FP8 or A_PRE, INTERPRET, SWAP, W_SCALED, DEQ, PAIR)
    if SWAP:
        acc = tl.trans(acc)
    # a quantization group wider than a tile spans TILES tiles: the last of all their programs finishes it
    TILES: tl.constexpr = QG // BN if QG > BN else 1
    if SPLITS == 1 and TILES == 1:
        _store_out(acc, y_ptr, ys_ptr, offs_m, pid_n * BN, g, m_ok, N, stride_ym, stride_yg, stride_ysm, stride_ysg, BM,
                   BN, QG, OUT_DT)
    else:
        tile = g * tl.num_programs(0) + pid_n
        slot = (offs_m[:, None] * BN + tl.arange(0, BN)[None, :])
        tile_part = part_ptr + tile * (SPLITS * BM * BN)
        tl.store(tile_part + split * (BM * BN) + slot, acc)
        first = tile // TILES * TILES  # the group's first tile (a group's tiles are consecutive: N % QG == 0)
        if last_to_arrive(cnt_ptr + tile // TILES, SPLITS * TILES):
            # the partials in split order, per column: the sums of the plain output, bit for bit, whoever came last
            c = tl.arange(0, BN * TILES)
            parts = (part_ptr + (first + c // BN)[None, :] * (SPLITS * BM * BN) + offs_m[:, None] * BN
                     + (c % BN)[None, :])
            total = tl.zeros((BM, BN * TILES), dtype=tl.float32)
            for s in tl.static_range(SPLITS):
                total += tl.load(parts + s * (BM * BN), cache_modifier=".cg")
            _store_out(total, y_ptr, ys_ptr, offs_m, (first - g * tl.num_programs(0)) * BN, g, m_ok, N, stride_ym,
                       stride_yg, stride_ysm, stride_ysg, BM, BN * TILES, QG, OUT_DT)
            tl.store(cnt_ptr + tile // TILES, 0)  # ready for the next launch / graph replay


@triton.jit
def _store_out(acc, y_ptr, ys_ptr, offs_m, col0, g, m_ok, N, stride_ym, stride_yg, stride_ysm, stride_ysg,
               BM: tl.constexpr, W: tl.constexpr, QG: tl.constexpr, OUT_DT: tl.constexpr):
    """Finished output columns col0 .. col0 + W - 1 (acc [BM, W]) in the output dtype, or (QG > 0, groups whole:
    W % QG == 0, col0 on a group) rounded to it (OUT_DT) and then quantized per 1 x QG as kernels/quant.act_quant would
    quantize the rounded output: e4m3 values and float32 scales. Rows past M and columns past N are not stored."""
    offs_n = col0 + tl.arange(0, W)
    y = y_ptr + offs_m[:, None] * stride_ym + g * stride_yg + offs_n[None, :]
    out_ok = m_ok[:, None] & (offs_n < N)[None, :]
    if QG == 0:
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
    else:
        NG: tl.constexpr = W // QG
        v = tl.reshape(acc.to(OUT_DT).to(tl.float32), (BM * NG, QG))
        q, scale = quantize_rows(v)
        tl.store(y, tl.reshape(q, (BM, W)), mask=out_ok)
        grp = col0 // QG + tl.arange(0, NG)
        ys = ys_ptr + offs_m[:, None] * stride_ysm + g * stride_ysg + grp[None, :]
        tl.store(ys, tl.reshape(scale, (BM, NG)), mask=m_ok[:, None] & (grp * QG < N)[None, :])


def config(M: int, N: int, K: int, G: int, sb: int, w8a8: bool = True, plain: bool = False,
           one_row_fma: bool = True) -> dict:
    """Tiles and splits: enough programs to stream the weight from every SM (about two waves). W8A8 up to 32 rows puts
    the weight first in the dot (`swap`, block_dot): H200, benchmarks/kernels/fp8_gemm.py --decode-only, M=1: wq_b
    12.8 -> 12.2 us, wo_b 15.7 -> 15.2, V4.1 wo_b 27.1 -> 25.2, the indexer's wq_b 10.4 -> 8.6; M=32: wo_b 22.5 -> 18.7;
    at 64 rows it is as often slower, and W8A16 (grouped wo_a, a bf16 dot) is slower with it (M=1 15.7 -> 22.4).
    Plain bf16 weights (`plain`: the compressors' stacked projections) take half the splits: `fp8_gemm.py
    --compressor`, H200, CSA 2624 x 4096 M=1 10.6 -> 9.1 us, M=32 12.8 -> 10.0; HCA 1024 x 4096 M=1 6.5 -> 5.3."""
    bm = max(16, next_pow2(M))
    swap = w8a8 and M <= 32
    lean = lean_loop(sb, plain)
    if interpreting():  # the CPU interpreter pays per program: few, large ones (but still a split when K allows)
        bn = min(256, max(16, next_pow2(N)))
        bk = max(sb, 128)
        return {"BM": bm, "BN": bn, "BK": bk, "splits": max(1, min(4, cdiv(K, bk))), "num_warps": 4,
                "num_stages": 1, "swap": swap, "fma": False, "full": lean, "scales_t": lean,
                "pair_scales": lean}
    if M == 1 and FMA_ONE_ROW and one_row_fma:  # (one_row_fma: false for kernels without the fma form)
        return fma_config(N, K, G)
    bn, bk = 64, max(sb, 128)
    splits = split_count(N, K, G, bn, bk)
    if plain:
        splits = max(1, splits // 2)
    stages = 6 if deep_pipeline(bm, swap, lean, cdiv(cdiv(K, splits), bk)) else 4
    return {"BM": bm, "BN": bn, "BK": bk, "splits": splits, "num_warps": 4, "num_stages": stages, "swap": swap,
            "fma": False, "deq": w8a8 and env_get(DEQ_ENV) == "1", "full": lean, "scales_t": lean,
            "pair_scales": lean}


def fma_config(N: int, K: int, G: int) -> dict:
    """One row on the CUDA cores: 32-row tiles 512 wide (1024 for K >= 8192), about two waves of programs. H200,
    `fp8_gemm.py --decode-only --rows 1` (µs, tensor-core default -> this): wq_a 6.3 -> 4.1, wq_b 12.3 -> 11.9, wkv
    5.4 -> 3.5, grouped wo_a 15.7 -> 13.1, wo_b 15.2 -> 14.2, shared w2 7.5 -> 6.0, the indexer's wq_b 8.6 -> 5.6, V4.1
    wo_b 25.1 -> 16.5 (8 warps on 64-row tiles won w2 and wo_b by 0.3-0.6 µs, lost wq_b and V4.1 wo_b by 1-3.5)."""
    bk = 1024 if K >= 8192 else 512
    return {"BM": 1, "BN": 32, "BK": bk, "splits": split_count(N, K, G, 32, bk), "num_warps": 4, "num_stages": 1,
            "swap": False, "fma": True}


def fit_fma(cfg: dict, given: dict, M: int, N: int, K: int, G: int, max_rows: int) -> dict:
    """A merged config (`given`: the caller's overrides) whose CUDA-core form (cfg "fma", fma_acc) is asked for, fitted
    to M rows: refused past `max_rows`; no 16-row tensor-core tile to pad (BM the rows' power of two) and no transposed
    accumulator; K splits for its tiles (about cfg "programs" programs) unless given. Other configs pass unchanged."""
    if not cfg.get("fma"):
        return cfg
    if M > max_rows:
        raise ValueError(f"the CUDA-core GEMV (fma) takes at most {max_rows} row{'s' * (max_rows > 1)}, not {M}")
    cfg.update(BM=next_pow2(M), swap=False)
    if "splits" not in given:
        cfg["splits"] = split_count(N, K, G, cfg["BN"], cfg["BK"], cfg.get("programs", 2 * _SMS))
    return cfg


def split_count(N: int, K: int, G: int, bn: int, bk: int, programs: int = 2 * _SMS) -> int:
    """K splits for about `programs` programs over the output tiles (at most one per K tile, at most 16)."""
    return max(1, min(cdiv(K, bk), cdiv(programs, cdiv(N, bn) * G), 16))


# Up to this many rows the grouped wo_a quantizes its output for wo_b in its finish (H200, `fp8_gemm.py --wo-a-quant`,
# in isolation: V4 M=1 17.2 us vs 16.7 for the GEMV + act_quant, M=8 17.6 vs 17.5, M=32 27.2 vs 21.1; V4.1 M=1 20.3
# vs 21.2, M=8 21.4 vs 22.5, M=32 31.0 vs 26.8): the finishing program's wider tail costs more than the launch it
# saves once the tile holds many rows. On with V4SERVE_FUSIONS=gemv_quant_out (ops/backend.fused).
QUANT_OUT_ROWS = 16


def _groups_tile(N: int, quant_out: int) -> bool:
    """Groups of a power-of-two size that tile a projection's N (so a tile holds whole groups, or a group whole
    tiles)."""
    return quant_out > 0 and quant_out & (quant_out - 1) == 0 and N % quant_out == 0


def quantizes_output(weight: torch.Tensor, G: int, quant_out: int, M: int = 1) -> bool:
    """Whether `run` quantizes its output per 1 x quant_out in its finish for M rows by default: groups that tile each
    projection's N, up to QUANT_OUT_ROWS rows, with the gemv_quant_out fusion on."""
    return _groups_tile(weight.shape[0] // G, quant_out) and M <= QUANT_OUT_ROWS and fused("gemv_quant_out")


def run(x3: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: int, act_group: int,
        out_dtype: torch.dtype, cfg: dict | None = None, prequant: bool | None = None,
        quantized: torch.Tensor | None = None, quant_out: int = 0) -> torch.Tensor | Quantized:
    """x3 [M, G, K] (M <= 64) -> y [M, G, N] with W [G*N, K] FP8 and its e8m0 block scales (or a plain weight in x's
    dtype, scale None). `prequant` (default: by the weight's size, `prequantize`) quantizes the activations in a launch
    of their own first. `quantized`: x3 is already quantized by its producer (e4m3), these are its float32 scales
    [M, G, K / block]. `quant_out` (quantizes_output): the output rounded to out_dtype, then quantized per
    1 x quant_out as the consumer's activation quantization would -> a Quantized."""
    M, G, K = x3.shape
    N = weight.shape[0] // G
    scaled = weight.dtype == torch.float8_e4m3fn
    if not scaled:  # no scale blocks: K tiles of 128, one dot each
        block, act_group, scale = 128, 0, weight
    if quant_out and not _groups_tile(N, quant_out):
        raise ValueError(f"cannot quantize outputs of {N} columns per {quant_out}")
    y = torch.empty(M, G, N, dtype=torch.float8_e4m3fn if quant_out else out_dtype, device=x3.device)
    ys = torch.empty(M, G, N // quant_out, dtype=torch.float32, device=x3.device) if quant_out else y
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    given = cfg or {}
    cfg = fit_fma({**config(M, N, K, G, block, w8a8=bool(act_group), plain=not scaled), **given}, given, M, N, K, G,
                  FMA_MAX_ROWS)
    if quantized is not None:
        pre, xs = True, quantized
    else:
        # one row's quantization in registers costs little beside its CUDA-core dots at any weight size
        by_size = prequantize(weight, act_group) and not cfg["fma"]
        pre = by_size if prequant is None else bool(prequant and act_group)
        xs = x3
        if pre:  # e4m3 [M, G, K], float32 scales [M, G, K / block]; transposed (LEAN_ENV) for the tensor-core loop of
            # one group (the CUDA-core form reads a row's scales of a K tile at once)
            t = cfg.get("scales_t") and G == 1 and not cfg["fma"]
            x3, xs = act_quant(x3, block, scale_rows=cfg["BM"] if t else 0)
    bn = cfg["BN"]
    if quant_out and (bn % quant_out if bn > quant_out else quant_out % bn):
        raise ValueError(f"tiles of {bn} columns neither hold nor tile groups of {quant_out}")
    tiles_per_group = quant_out // bn if quant_out > bn else 1
    bk = cfg["BK"]
    k_per_split = cdiv(cdiv(K, cfg["splits"]), bk) * bk
    splits = cdiv(K, k_per_split)
    n_tiles = cdiv(N, cfg["BN"])
    part = (torch.empty(n_tiles * G * splits * cfg["BM"] * cfg["BN"], dtype=torch.float32, device=x3.device)
            if splits > 1 or tiles_per_group > 1 else y)
    cnt = _COUNTERS.get(x3.device)
    if n_tiles * G > cnt.numel():
        raise ValueError(f"{n_tiles * G} output tiles exceed the {cnt.numel()} arrival counters")
    _decode_gemm_kernel[(n_tiles, G, splits)](
        x3, xs, weight, scale, part, y, ys, cnt, M, N, K, k_per_split,
        x3.stride(0), x3.stride(1), xs.stride(0), xs.stride(1), xs.stride(-1), weight.stride(0), scale.stride(0),
        y.stride(0), y.stride(1), ys.stride(0), ys.stride(1), SB=block, A_FP8=act_group == block, A_PRE=pre,
        BM=cfg["BM"], BN=cfg["BN"], BK=bk, SPLITS=splits, INTERPRET=interpreting(), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        PREFETCH=pdl_prefetch(y) and weight.stride(0) % 16 == 0 and weight.data_ptr() % 16 == 0,
        SWAP=cfg["swap"], W_SCALED=scaled, QG=quant_out, OUT_DT=TL_DTYPES[out_dtype], FMA=cfg["fma"],
        EVEN_K=K % block == 0, FMA_STAGES=cfg.get("fma_stages", 1), DEQ=bool(cfg.get("deq")),
        FULL=bool(cfg.get("full")) and K % bk == 0, PAIR=bool(cfg.get("pair_scales")), **pdl_launch(y))
    return Quantized(y, ys, quant_out, out_dtype) if quant_out else y

