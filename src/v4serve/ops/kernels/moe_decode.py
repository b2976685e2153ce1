"""Decode bodies of the routed-experts GEMMs (ops/kernels/moe.py): the same grid, sort, split-K and epilogues as the
"dot" kernels there, with another product per K tile, picked by `MoeConfig.body`. Both accumulate acc^T [BN, BM]
and transpose it once for the epilogue.

  "swap": acc^T += W [BN, BK] @ x^T [BK, BM] with `tl.dot`: the dequantized weight is the A operand, which sm_90's
          wgmma reads from registers, and the few rows of x the B operand, in shared memory (Triton 3.6 TTGIR: a
          warp_group_dot with a register A; the "dot" body at BLOCK_M=16 gets mma.sync instead).
  "fma":  no tensor cores, for 1-8 rows per block (a 16-row MMA tile would be mostly padding): a thread owns weight
          rows (BN = 32 x num_warps) and the K values of its 16-byte loads, so each row of x is broadcast to the
          weight tile in its load layout and summed over K in-thread, in float32 (float64 for a float64 x); the
          weight tile is dequantized once per K tile for all BM rows.

Both keep the even/odd split (low nibbles x even columns of x, high nibbles x odd columns): no interleave. The K
loops are `tl.range(..., num_stages=STAGES)`: without an explicit stage count Triton 3.6 does not pipeline loads
that feed no dot (the fma body's), and each iteration would wait for its own loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .moe import _a_tile, _dot, _down_out, _expert_block, _fp4_groups, _fp4_scales, _gate_up_out, _k_range
from .pdl import enter as pdl_enter


@triton.jit
def _swap(w_ptr, sb, offs_n, N, k0, K, stride_n, a_ev, a_od, acc, BN: tl.constexpr, BK: tl.constexpr,
          DT: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr, F32: tl.constexpr):
    """acc^T [BN, BM] += the K tile of W's rows offs_n (e8m0 bytes sb) @ the x tile^T (halves a_ev, a_od [BM, BK/2])."""
    w_ev, w_od = _fp4_groups(w_ptr, sb, offs_n, N, k0, K, stride_n, BK, DT, ASM)
    acc = _dot(tl.reshape(w_ev, (BN, BK // 2)), tl.trans(a_ev), acc, PREC, ACC, F32)
    return _dot(tl.reshape(w_od, (BN, BK // 2)), tl.trans(a_od), acc, PREC, ACC, F32)


@triton.jit
def _fma_w(w_ptr, sb, offs_n, N, k0, K, stride_n, BK: tl.constexpr, DT: tl.constexpr, ASM: tl.constexpr,
           ACC: tl.constexpr):
    """The K tile of W's rows offs_n as (even, odd) [BN, BK/32, 16] in ACC, in its load layout: a thread owns a row
    (BN = 32 x num_warps) and the 32 values of each of its 16-byte loads, so K sums stay in-thread."""
    w_ev, w_od = _fp4_groups(w_ptr, sb, offs_n, N, k0, K, stride_n, BK, DT, ASM)
    return w_ev.to(ACC), w_od.to(ACC)


@triton.jit
def _fma_x(ptrs, mask, BK: tl.constexpr, DT: tl.constexpr, ACC: tl.constexpr, QUANT: tl.constexpr,
           G: tl.constexpr):
    """One row of x (or h) [BK], loaded on its own (each thread needs all of it: a row of a [BM, BK] tile would cost
    a shuffle per value to extract) -> (even, odd) [1, BK/32, 16] in ACC, broadcast over the weight rows."""
    a_ev, a_od = _a_tile(ptrs[None, :], mask[None, :], 1, BK, DT, QUANT, G)
    return tl.reshape(a_ev.to(ACC), (1, BK // 32, 16)), tl.reshape(a_od.to(ACC), (1, BK // 32, 16))


@triton.jit
def _fma_add(acc, w_ev, w_od, x_ev, x_od, r, m):
    """Column m of acc^T [BN, BM] += W (even, odd) . x row m (even, odd), summed over K in float."""
    s = tl.sum(tl.sum(w_ev * x_ev + w_od * x_od, 2), 1)
    return tl.where(r[None, :] == m, acc + s[:, None], acc)


@triton.jit
def _scales(s_ptr, sb, offs_n, N, k0, k_hi, stride_sn, BK: tl.constexpr, BODY: tl.constexpr, EVEN_K: tl.constexpr):
    """(this K tile's e8m0 bytes, the next iteration's). fma: loaded a tile ahead by hand (sb, carried, is this
    tile's): bytes too narrow for the pipeliner's async copies, each iteration would wait for them. swap: loaded in
    the iteration, because a loop-carried operand stops Triton from placing the dequantized tile in the wgmma A
    layout at the source (it would go through shared memory as bf16 instead: checked in the sm_90 TTGIR)."""
    if BODY == "fma":
        return sb, _fp4_scales(s_ptr, offs_n, N, k0 + BK, k_hi, stride_sn, BK, False)  # past k_hi: masked
    else:
        cur = _fp4_scales(s_ptr, offs_n, N, k0, k_hi, stride_sn, BK, EVEN_K)
        return cur, cur


@triton.jit
def gate_up_kernel(x_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, h_ptr, part_ptr, cnt_ptr, rw_ptr, sorted_ptr,
                   block_expert_ptr, M, NB, D, I, TOPK, limit,
                   stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_h, stride_ps, stride_pg,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   SPLIT: tl.constexpr, G: tl.constexpr, QUANT_H: tl.constexpr, WEIGHT_H: tl.constexpr,
                   CLAMP: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
                   F32: tl.constexpr, BODY: tl.constexpr, STAGES: tl.constexpr, EVEN_K: tl.constexpr = False,
                   FINISH: tl.constexpr = False, PDL: tl.constexpr = False):
    """`moe._gate_up_kernel` with the swap / fma body: x W1^T and x W3^T for BM sorted rows of one expert x BN
    columns over this program's K share, the x tile loaded once per K tile for both."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    expert, first, rows, a_idx, valid, offs_n = _expert_block(block_expert_ptr, sorted_ptr, NB, I, M, BM,
                                                             BN, GROUP_M)
    if expert < 0:
        return
    DT = x_ptr.dtype.element_ty
    tok = tl.where(valid, a_idx // TOPK, 0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    w1_ptr += expert * stride_we
    w3_ptr += expert * stride_we
    s1_ptr += expert * stride_se
    s3_ptr += expert * stride_se
    acc_g = tl.zeros([BN, BM], dtype=ACC)
    acc_u = tl.zeros([BN, BM], dtype=ACC)
    k_lo, k_hi = _k_range(D, BK, SPLIT)
    sb1 = _fp4_scales(s1_ptr, offs_n, I, k_lo, k_hi, stride_sn, BK, False)
    sb3 = _fp4_scales(s3_ptr, offs_n, I, k_lo, k_hi, stride_sn, BK, False)
    r = tl.arange(0, BM)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        sb1, nsb1 = _scales(s1_ptr, sb1, offs_n, I, k0, k_hi, stride_sn, BK, BODY, EVEN_K)
        sb3, nsb3 = _scales(s3_ptr, sb3, offs_n, I, k0, k_hi, stride_sn, BK, BODY, EVEN_K)
        kmask = k0 + offs_k < D
        if BODY == "swap":
            a_ptrs = x_ptr + tok[:, None] * stride_x + (k0 + offs_k)[None, :]
            a_ev, a_od = _a_tile(a_ptrs, valid[:, None] & kmask[None, :], BM, BK, DT, False, G)
            acc_g = _swap(w1_ptr, sb1, offs_n, I, k0, D, stride_wn, a_ev, a_od, acc_g, BN, BK, DT, ASM, PREC, ACC,
                          F32)
            acc_u = _swap(w3_ptr, sb3, offs_n, I, k0, D, stride_wn, a_ev, a_od, acc_u, BN, BK, DT, ASM, PREC, ACC,
                          F32)
        else:
            w1_ev, w1_od = _fma_w(w1_ptr, sb1, offs_n, I, k0, D, stride_wn, BK, DT, ASM, ACC)
            w3_ev, w3_od = _fma_w(w3_ptr, sb3, offs_n, I, k0, D, stride_wn, BK, DT, ASM, ACC)
            for m in tl.static_range(BM):
                a_m = tl.load(sorted_ptr + first + m)
                t_m = tl.where(a_m < M, a_m // TOPK, 0).to(tl.int64)
                x_ev, x_od = _fma_x(x_ptr + t_m * stride_x + k0 + offs_k, kmask & (a_m < M), BK, DT, ACC, False, G)
                acc_g = _fma_add(acc_g, w1_ev, w1_od, x_ev, x_od, r, m)
                acc_u = _fma_add(acc_u, w3_ev, w3_od, x_ev, x_od, r, m)
        sb1 = nsb1
        sb3 = nsb3
    _gate_up_out(tl.trans(acc_g), tl.trans(acc_u), h_ptr, part_ptr, cnt_ptr, rw_ptr, rows, offs_n, a_idx,
                 valid, I, limit, stride_h, stride_ps, stride_pg, BM, BN, SPLIT, G, QUANT_H, WEIGHT_H, CLAMP, ASM,
                 ACC, DT, FINISH)


@triton.jit
def down_kernel(h_ptr, w2_ptr, s2_ptr, y_ptr, sorted_ptr, block_expert_ptr,
                M, NB, D, I,
                stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_y, stride_ys,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr,
                G: tl.constexpr, QUANT_A: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
                F32: tl.constexpr, BODY: tl.constexpr, STAGES: tl.constexpr, EVEN_K: tl.constexpr = False,
                   PDL: tl.constexpr = False):
    """`moe._down_kernel` with the swap / fma body: h W2^T for BM sorted rows of one expert x BN columns."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    expert, first, rows, a_idx, valid, offs_n = _expert_block(block_expert_ptr, sorted_ptr, NB, D, M, BM,
                                                             BN, GROUP_M)
    if expert < 0:
        return
    DT = h_ptr.dtype.element_ty
    offs_k = tl.arange(0, BK)
    w2_ptr += expert * stride_we
    s2_ptr += expert * stride_se
    acc = tl.zeros([BN, BM], dtype=ACC)
    k_lo, k_hi = _k_range(I, BK, SPLIT)
    sb = _fp4_scales(s2_ptr, offs_n, D, k_lo, k_hi, stride_sn, BK, False)
    r = tl.arange(0, BM)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        sb, nsb = _scales(s2_ptr, sb, offs_n, D, k0, k_hi, stride_sn, BK, BODY, EVEN_K)
        kmask = k0 + offs_k < I
        if BODY == "swap":
            a_ptrs = h_ptr + rows[:, None].to(tl.int64) * stride_h + (k0 + offs_k)[None, :]
            a_ev, a_od = _a_tile(a_ptrs, kmask[None, :], BM, BK, DT, QUANT_A, G)
            acc = _swap(w2_ptr, sb, offs_n, D, k0, I, stride_wn, a_ev, a_od, acc, BN, BK, DT, ASM, PREC, ACC, F32)
        else:
            w_ev, w_od = _fma_w(w2_ptr, sb, offs_n, D, k0, I, stride_wn, BK, DT, ASM, ACC)
            for m in tl.static_range(BM):
                h_row = h_ptr + (first + m).to(tl.int64) * stride_h + k0 + offs_k
                x_ev, x_od = _fma_x(h_row, kmask, BK, DT, ACC, QUANT_A, G)
                acc = _fma_add(acc, w_ev, w_od, x_ev, x_od, r, m)
        sb = nsb
    _down_out(tl.trans(acc), y_ptr, a_idx, valid, offs_n, D, stride_y, stride_ys, ASM)

