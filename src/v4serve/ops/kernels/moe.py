"""Routed experts over FP4 (e2m1 + per-32 e8m0) weight stacks in Triton: sort, grouped gate+up, grouped down, combine.

One call = four launches, static shapes, no host sync (capturable in a CUDA graph):
  1. `_prologue_kernel`: program 0 counts the (token, slot) assignments per expert, pads each expert's run to a
     multiple of BLOCK_M ("capacity padding"), writes the assignment index of every padded position (sentinel M on
     padding) and the expert of every BLOCK_M block (-1 past the used ones: those programs exit at once); the other
     programs FP8-simulate x (act_group > 0).
  2. `_gate_up_kernel`: per block of one expert's rows, x W1^T and x W3^T tiles of the same columns, SwiGLU with the
     clamp, the routing weight (weight_before_w2), FP8 simulation of h where the tile holds whole groups; h [P, I].
  3. `_down_kernel`: h W2^T per block (h FP8-simulated on load if the gate-up tile could not), written per
     assignment row [T*k, D] in x's dtype (rounded where the reference rounds its per-expert output).
  4. `_combine_kernel`: a token's k rows summed in slot order (times the routing weight when applied after W2):
     deterministic, no atomics.
FP4 is dequantized in registers (W4A16): the low and high nibbles of a byte are the even and odd K elements, so
each K tile is two dots, (A even columns) x (low nibbles) + (A odd columns) x (high nibbles), with no interleave.
bf16 on CUDA dequantizes in PTX on 32-bit words (`_fp4_asm`, 2.5 instructions per value: decode is bound by this
issue rate as much as by HBM); float32/float64 and the interpreter use plain bit arithmetic (`_fp4_bits`).
FP8 simulation (e4m3, 1 x act_group, power-of-two scales) is bit-identical to `quant.fp8_simulate`.
`MoeConfig.body` picks the GEMMs' inner product: "dot" (here), or the decode bodies "swap" / "fma" / "fp8"
(moe_decode.py; fp8 takes x from the prologue and h from the gate-up epilogue as e4m3 bytes in the K32 order with
float32 scales, `_store_e4m3`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..backend import fused
from ..env import get as env_get
from ..linear import scale_bytes, stored_format
from . import cdiv, interpreting, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import early as pdl_early
from .pdl import launch as pdl_launch
from .quant import fp8_simulate_tile, quantize_rows
from .split_grid import N_COUNTERS, ArrivalCounters, last_to_arrive

# ------------------------------------------------------------------------------------------------------------
# In-register formats
# ------------------------------------------------------------------------------------------------------------

@triton.jit
def _k32_order(cols):
    """Where column k is stored in the fp8 decode body's activations (moe_decode.py): within each 32-group, the even
    columns first, then the odd ones (the K order of that body's FP4 -> e4m3 weight registers)."""
    kk = cols % 32
    return cols - kk + tl.where(kk % 2 == 0, kk // 2, 16 + kk // 2)


@triton.jit
def _store_e4m3(v, q_ptr, s_ptr, rows, cols, stride_q, mask_r, N, R: tl.constexpr, C: tl.constexpr,
                G: tl.constexpr):
    """Float32 rows v [R, C] (columns `cols`: whole 1 x G groups, G | C, 32 | G) quantized per 1 x G exactly as
    `fp8_simulate_tile` (its values = these e4m3 bytes times the scales): the bytes stored at q[row,
    _k32_order(col)], the float32 scales at s[row, col // G] (a row of N // G)."""
    q, sc = quantize_rows(tl.reshape(v, (R * (C // G), G)))
    mask_c = cols < N
    tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_q + _k32_order(cols)[None, :], tl.reshape(q, (R, C)),
             mask=mask_r[:, None] & mask_c[None, :])
    gcol = tl.max(tl.reshape(cols, (C // G, G)), 1) // G
    tl.store(s_ptr + rows[:, None].to(tl.int64) * (N // G) + gcol[None, :], tl.reshape(sc, (R, C // G)),
             mask=mask_r[:, None] & (gcol < N // G)[None, :])


@triton.jit
def _fp4_bits(packed, sbyte, DT: tl.constexpr):
    """packed uint8 [N, NG, 16] + e8m0 bytes [N, NG] -> (low, high) nibble values [N, NG, 16] in DT, exactly.

    The 3 magnitude bits placed at float32 bits 22..24 read as value * 2^-126 (code 1 = 0.5 as a subnormal), so
    two exact multiplies (2^126, then the scale) give the value; the sign bit moves to bit 31."""
    p = packed.to(tl.int32)
    lo = (((p & 7) << 22) | ((p & 8) << 28)).to(tl.float32, bitcast=True)
    hi = (((p & 0x70) << 18) | ((p & 0x80) << 24)).to(tl.float32, bitcast=True)
    b = sbyte.to(tl.int32)
    s = tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)[:, :, None]  # 2^(b-127); b=0 subnormal
    return ((lo * 8.507059173023462e37) * s).to(DT), ((hi * 8.507059173023462e37) * s).to(DT)


# The PTX dequant yields W * 2^-ASM_SHIFT (one multiply per pair instead of two); the GEMM epilogues multiply the
# accumulators back by 2^ASM_SHIFT, exactly. Exact for e8m0 scales 2^-93 .. 2^33 (b in [34, 160]): any real weight.
ASM_SHIFT = 32


@triton.jit
def _fp4_asm(packed, sbyte):
    """(low, high) nibble values * 2^-32 as bf16 from packed bytes [N, NG, 16] and e8m0 bytes [N, NG], in PTX on
    32-bit words (CUDA only). Per 4 bytes, prmt spreads bytes 0,1 / 2,3 to 16-bit halves; per half, a nibble masked
    and multiplied by 0x1040 (low) or 0x104 (high) holds copies of itself at bits 6.. and 12..: masking with 0x81C0
    keeps the magnitude at bf16 bits 6..8 and the sign at bit 15, which reads as value * 2^-126 (code 1 = 0.5 as a
    subnormal); one bf16x2 multiply by 2^(b - 1 - 32) scales the pair. 2.5 instructions per value."""
    f = (sbyte.to(tl.int32) + (126 - 32)) << 7  # bf16 bits of 2^(b - 1 - 32)
    f = tl.broadcast_to((f | (f << 16))[:, :, None], packed.shape)
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 t0, t1, q0, q1, q2, q3, z, s0, s1;
        mov.b32 z, 0;
        prmt.b32 t0, $4, z, 0x4140;
        prmt.b32 t1, $4, z, 0x4342;
        prmt.b32 s0, $5, $6, 0x5410;
        prmt.b32 s1, $7, $8, 0x5410;
        and.b32 q0, t0, 0x000F000F; and.b32 q1, t1, 0x000F000F;
        and.b32 q2, t0, 0x00F000F0; and.b32 q3, t1, 0x00F000F0;
        mul.lo.u32 q0, q0, 0x1040; mul.lo.u32 q1, q1, 0x1040; mul.lo.u32 q2, q2, 0x104; mul.lo.u32 q3, q3, 0x104;
        and.b32 q0, q0, 0x81C081C0; and.b32 q1, q1, 0x81C081C0; and.b32 q2, q2, 0x81C081C0; and.b32 q3, q3, 0x81C081C0;
        mul.rn.bf16x2 $0, q0, s0; mul.rn.bf16x2 $1, q1, s1; mul.rn.bf16x2 $2, q2, s0; mul.rn.bf16x2 $3, q3, s1;
        }
        """,
        constraints="=r,=r,=r,=r,r,r,r,r,r", args=[packed, f], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True,
        pack=4)


@triton.jit
def _fp4_scales(s_ptr, offs_n, N, k0, K, stride_sn, BK: tl.constexpr, EVEN_K: tl.constexpr,
                ROWS_IN: tl.constexpr = False):
    """The e8m0 bytes [BN, BK/32] of rows offs_n, K columns [k0, k0 + BK) (none past K: 127 = 1.0). EVEN_K (the
    launch's promise: K, k0 and the K shares' ends multiples of BK, stride_sn of BK/32): a tile past K (an AHEAD
    load's next tile, an empty K share's first: bytes never used) reads the last one instead, so the mask is the
    rows' alone, and the row offsets, written as multiples of BK/32, tell Triton the bytes are aligned: one vector
    per row, which Triton's pipeliner turns into an async copy (a mask that changes with k0 would also be carried
    through the pipeline: 238 registers in V4.1's gate-up against 168). Else a mask per byte (or a row stride not
    known to be aligned) keeps it byte loads that each K iteration waits for (sm_90 SASS: V4.1's down, 72-byte scale
    rows, stalled on its LDG.E.U8). ROWS_IN: offs_n are rows inside [0, N) (the caller clamped them), so no row mask
    either (a masked async copy's `other` is a select per register after it lands)."""
    NG: tl.constexpr = BK // 32
    if EVEN_K:
        grp = tl.minimum(k0 // BK, K // BK - 1) * NG + tl.arange(0, NG)
        row = offs_n * (stride_sn // NG) * NG
        if ROWS_IN:
            return tl.load(s_ptr + row[:, None] + grp[None, :])
        return tl.load(s_ptr + row[:, None] + grp[None, :], mask=(offs_n < N)[:, None], other=127)
    grp = k0 // 32 + tl.arange(0, NG)
    gmask = (grp < K // 32)[None, :] if ROWS_IN else (offs_n < N)[:, None] & (grp < K // 32)[None, :]
    return tl.load(s_ptr + offs_n[:, None] * stride_sn + grp[None, :], mask=gmask, other=127)


@triton.jit
def _fp4_groups(w_ptr, sb, offs_n, N, k0, K, stride_n, BK: tl.constexpr, DT: tl.constexpr, ASM: tl.constexpr,
                ROWS: tl.constexpr = False, ROWS_IN: tl.constexpr = False):
    """Rows offs_n, K columns [k0, k0 + BK) of one FP4 matrix with their e8m0 bytes sb -> (even, odd) K columns
    [BN, BK/32, 16] in DT (bf16 scaled by 2^-ASM_SHIFT when ASM): per 32-group, its 16 bytes' low and high nibbles.
    ROWS_IN: offs_n inside [0, N), no row mask (`_fp4_scales`)."""
    NG: tl.constexpr = BK // 32
    if ROWS:  # (whole K tiles) a row's BK/2 bytes as one run: lanes across a row's 16-byte pieces, then rows
        kb = k0 // 2 + tl.arange(0, BK // 2)
        if ROWS_IN:
            p = tl.load(w_ptr + offs_n[:, None] * stride_n + kb[None, :])
        else:
            p = tl.load(w_ptr + offs_n[:, None] * stride_n + kb[None, :], mask=(offs_n < N)[:, None], other=0)
        p = tl.reshape(p, (offs_n.shape[0], NG, 16))
    else:
        grp = k0 // 32 + tl.arange(0, NG)
        byte = tl.arange(0, 16)
        gmask = (grp < K // 32)[None, :] if ROWS_IN else (offs_n < N)[:, None] & (grp < K // 32)[None, :]
        p = tl.load(w_ptr + offs_n[:, None, None] * stride_n + grp[None, :, None] * 16 + byte[None, None, :],
                    mask=gmask[:, :, None], other=0)
    if ASM:
        return _fp4_asm(p, sb)
    else:
        return _fp4_bits(p, sb, DT)


@triton.jit
def _tile_scales(s_ptr, sb, offs_n, N, k0, k_hi, stride_sn, BK: tl.constexpr, AHEAD: tl.constexpr,
                 EVEN_K: tl.constexpr, ROWS_IN: tl.constexpr = False):
    """(The K tile at k0's e8m0 bytes, the loop's next sb.) AHEAD: sb (carried) is this tile's, loaded in the
    iteration before, and the next tile's are loaded now (past k_hi: masked) — a scale tile of under 4 bytes a thread
    is no async copy for Triton's pipeliner, so each iteration would wait a memory latency for bytes loaded in it.
    Else this tile's are loaded here (sb unused)."""
    if AHEAD:
        return sb, _fp4_scales(s_ptr, offs_n, N, k0 + BK, k_hi, stride_sn, BK, EVEN_K, ROWS_IN)
    else:
        cur = _fp4_scales(s_ptr, offs_n, N, k0, k_hi, stride_sn, BK, EVEN_K, ROWS_IN)
        return cur, cur


@triton.jit
def _fp4_tile_from(w_ptr, sb, offs_n, N, k0, K, stride_n, BN: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr,
                   ASM: tl.constexpr, ROWS: tl.constexpr = False, ROWS_IN: tl.constexpr = False):
    """Rows offs_n, K columns [k0, k0 + BK) of one FP4 matrix with their e8m0 bytes sb [BN, BK/32] -> (even, odd) K
    columns transposed, [BK/2, BN] in DT: the B operand of x @ W^T."""
    lo, hi = _fp4_groups(w_ptr, sb, offs_n, N, k0, K, stride_n, BK, DT, ASM, ROWS, ROWS_IN)
    return tl.trans(tl.reshape(lo, (BN, BK // 2))), tl.trans(tl.reshape(hi, (BN, BK // 2)))


@triton.jit
def _fp4_tile(w_ptr, s_ptr, offs_n, N, k0, K, stride_n, stride_sn,
              BN: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, ASM: tl.constexpr, EVEN_K: tl.constexpr,
              ROWS: tl.constexpr = False, ROWS_IN: tl.constexpr = False):
    """`_fp4_tile_from` with the tile's scale bytes loaded here."""
    sb = _fp4_scales(s_ptr, offs_n, N, k0, K, stride_sn, BK, EVEN_K, ROWS_IN)
    return _fp4_tile_from(w_ptr, sb, offs_n, N, k0, K, stride_n, BN, BK, DT, ASM, ROWS, ROWS_IN)


@triton.jit
def _load_rows(offs_n, N, CLAMP_N: tl.constexpr):
    """The weight rows a tile loads: CLAMP_N (`GemmConfig.clamp_rows`) clamps rows past N to the last one, so that
    the loads need no row mask (their columns are computed and never stored), else offs_n (masked loads)."""
    if CLAMP_N:
        return tl.minimum(offs_n, N - 1)
    return offs_n


@triton.jit
def _a_tile(ptrs, mask, BM: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, QUANT: tl.constexpr,
            G: tl.constexpr):
    """An activation tile [BM, BK] (FP8-simulated when QUANT), split into its even and odd columns."""
    a = tl.load(ptrs, mask=mask, other=0.0)
    if QUANT:
        a = fp8_simulate_tile(a.to(tl.float32), BM, BK, G).to(DT)
    return tl.split(tl.reshape(a, (BM, BK // 2, 2)))


@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr, ACC: tl.constexpr, F32: tl.constexpr):
    if F32:  # the interpreter multiplies bf16 as raw integers: exact bf16 products in float32 instead
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PREC, out_dtype=ACC)


@triton.jit
def _block_coords(pid, NB, num_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row blocks sweep the column tiles together (weight tiles reused from L2)."""
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size = tl.minimum(NB - first_m, GROUP_M)
    return first_m + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _expert_block(block_expert_ptr, sorted_ptr, NB, n_cols, M, BM: tl.constexpr, BN: tl.constexpr,
                  GROUP_M: tl.constexpr, DIRECT: tl.constexpr = False):
    """This program's block of sorted rows and its column tile: (the block's expert, -1 for an idle block; its first
    row and its rows' positions in the sorted order, their assignment indices and validity; the column offsets).
    DIRECT (one token, no sort): block b is assignment b alone, block_expert_ptr the routing's ids (sorted_ptr
    unused): the order the sort gives such a token's k distinct experts aside, the same blocks."""
    pid_m, pid_n = _block_coords(tl.program_id(0), NB, tl.cdiv(n_cols, BN), GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    first = pid_m * BM
    rows = first + tl.arange(0, BM)
    if DIRECT:
        a_idx = tl.where(tl.arange(0, BM) == 0, pid_m, M)
    else:
        a_idx = tl.load(sorted_ptr + rows)
    return expert, first, rows, a_idx, a_idx < M, pid_n * BN + tl.arange(0, BN)


# ------------------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------------------

@step_jit
def _prologue_kernel(ids_ptr, sorted_ptr, block_expert_ptr, cursor_ptr, M, NB, x_ptr, xq_ptr, T, D, stride_x,
                     stride_xq,
                     BM: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr,
                     QUANT_X: tl.constexpr, G: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                     PDL: tl.constexpr = False, xs_ptr=None, X8: tl.constexpr = False,
                     BLOCKS: tl.constexpr = True, EARLY: tl.constexpr = False):
    """Program 0 sorts; programs 1.. (QUANT_X) FP8-simulate x, one [BR, BC] tile each (one launch for both: a tile per
    program, so that a decode row's D is spread over programs rather than walked by one, a memory latency a chunk);
    X8 (the fp8 decode body): as e4m3 bytes in the K32 order into xq [T, D] and float32 scales xs [T, D / G].
    BLOCKS=False (moe_grouped.py, BM=1): no block_expert; the cursors end as each expert's run end. EARLY: the
    gate-up may launch before this kernel's wait (`pdl.early("moe_prologue")`)."""
    pdl_enter(PDL, EARLY)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid = tl.program_id(0)
    if pid == 0:
        _align(ids_ptr, sorted_ptr, block_expert_ptr, cursor_ptr, M, NB, BM, E_PAD, CHUNK, BLOCKS)
    elif QUANT_X:
        n_chunks = tl.cdiv(D, BC)
        rows = ((pid - 1) // n_chunks) * BR + tl.arange(0, BR)
        cols = ((pid - 1) % n_chunks) * BC + tl.arange(0, BC)
        mask = (rows < T)[:, None] & (cols < D)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        if X8:
            _store_e4m3(x.to(tl.float32), xq_ptr, xs_ptr, rows, cols, stride_xq, rows < T, D, BR, BC, G)
        else:
            y = fp8_simulate_tile(x.to(tl.float32), BR, BC, G).to(x.dtype)
            tl.store(xq_ptr + rows[:, None] * stride_xq + cols[None, :], y, mask=mask)


@triton.jit
def _align(ids_ptr, sorted_ptr, block_expert_ptr, cursor_ptr, M, NB,
           BM: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCKS: tl.constexpr = True):
    """sorted[pos] = assignment index (t * k + slot) at padded position pos, M on padding; block_expert[b] = expert of
    rows [b*BM, (b+1)*BM), -1 past the padded total. Positions inside an expert's run are taken with atomics (their
    order may vary between runs; the results do not: every row is computed on its own and combined by slot)."""
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, M, CHUNK):
        m = c0 + offs < M
        e = tl.load(ids_ptr + c0 + offs, mask=m, other=0).to(tl.int32)
        counts += tl.histogram(e, E_PAD, mask=m)
    padded = (counts + BM - 1) // BM * BM
    starts = tl.cumsum(padded, 0) - padded
    total = tl.sum(padded, 0)
    experts = tl.arange(0, E_PAD)
    tl.store(cursor_ptr + experts, starts)
    # padding rows of each expert (disjoint from the real rows written below: no ordering needed)
    r = tl.arange(0, BM)
    tl.store(sorted_ptr + starts[:, None] + counts[:, None] + r[None, :], M,
             mask=r[None, :] < (padded - counts)[:, None])
    if BLOCKS:  # each used block starts at a multiple of BM inside one expert's run
        nblk = padded // BM
        for j in range(tl.max(nblk, 0)):
            tl.store(block_expert_ptr + starts // BM + j, experts, mask=j < nblk)
        for b0 in range(0, NB, CHUNK):
            b = b0 + offs
            tl.store(block_expert_ptr + b, -1, mask=(b < NB) & (b * BM >= total))
    tl.debug_barrier()  # the cursors are in place for every thread's atomics
    for c0 in range(0, M, CHUNK):
        idx = c0 + offs
        m = idx < M
        e = tl.load(ids_ptr + idx, mask=m, other=0).to(tl.int32)
        dest = tl.atomic_add(cursor_ptr + e, 1, mask=m)
        tl.store(sorted_ptr + dest, idx, mask=m)


@triton.jit
def _swiglu_store(acc_g, acc_u, h_ptr, stride_h, rows, offs_n, rw_ptr, a_idx, valid, I, limit,
                  BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, QUANT_H: tl.constexpr,
                  WEIGHT_H: tl.constexpr, CLAMP: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr,
                  hs_ptr=None, H8: tl.constexpr = False):
    """h = silu(min(g, limit)) * clamp(u, +-limit) (* routing weight), in DT (FP8-simulated when the tile holds whole
    1 x G groups: BN % G == 0). Every row of the block is written (padding rows: zeros). H8 (the fp8 decode body,
    QUANT_H): those values as e4m3 bytes in the K32 order into h and their float32 scales into hs [P, I / G]."""
    if CLAMP:
        acc_g = tl.minimum(acc_g, limit)
        acc_u = tl.clamp(acc_u, -limit, limit)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    if WEIGHT_H:
        h *= tl.load(rw_ptr + a_idx, mask=valid, other=0.0).to(ACC)[:, None]
    h = h.to(DT)
    if H8:
        _store_e4m3(h.to(tl.float32), h_ptr, hs_ptr, rows, offs_n, stride_h, rows >= 0, I, BM, BN, G)
    else:
        if QUANT_H:
            h = fp8_simulate_tile(h.to(tl.float32), BM, BN, G).to(DT)
        tl.store(h_ptr + rows[:, None].to(tl.int64) * stride_h + offs_n[None, :], h, mask=(offs_n < I)[None, :])


@triton.jit
def _k_range(K, BK: tl.constexpr, SPLIT: tl.constexpr):
    """This program's share [lo, hi) of the K loop: whole BK tiles, split evenly over SPLIT programs."""
    per = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
    lo = tl.program_id(1) * per
    return lo, tl.minimum(lo + per, K)


@step_jit
def _gate_up_kernel(x_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, h_ptr, part_ptr, cnt_ptr, rw_ptr, sorted_ptr,
                    block_expert_ptr, M, NB, D, I, TOPK, limit,
                    stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_h, stride_ps, stride_pg,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                    SPLIT: tl.constexpr, G: tl.constexpr, QUANT_H: tl.constexpr, WEIGHT_H: tl.constexpr,
                    CLAMP: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
                    F32: tl.constexpr, EVEN_K: tl.constexpr = False, FINISH: tl.constexpr = False,
                    PDL: tl.constexpr = False, AHEAD: tl.constexpr = False, DIRECT: tl.constexpr = False,
                    ROWS: tl.constexpr = False, CLAMP_N: tl.constexpr = False):
    """x W1^T and x W3^T for BM sorted rows of one expert x BN columns; SwiGLU epilogue, or (SPLIT > 1) float
    partial sums over this program's K share, reduced by `_swiglu_kernel` or (FINISH) by the tile's last program to
    arrive. AHEAD (`MoeConfig.ahead`): each K tile's scale bytes loaded an iteration before their use. DIRECT: blocks
    straight from one token's routing (`_expert_block`). ROWS (`GemmConfig.row_loads`): with whole K tiles, the FP4
    bytes copied as whole rows (`_fp4_groups`). CLAMP_N: weight rows loaded unmasked (`_load_rows`)."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    RW: tl.constexpr = EVEN_K and ROWS
    expert, _, rows, a_idx, valid, offs_n = _expert_block(block_expert_ptr, sorted_ptr, NB, I, M, BM, BN,
                                                          GROUP_M, DIRECT)
    if expert < 0:
        return
    DT = x_ptr.dtype.element_ty
    tok = tl.where(valid, a_idx // TOPK, 0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    w1_ptr += expert * stride_we
    w3_ptr += expert * stride_we
    s1_ptr += expert * stride_se
    s3_ptr += expert * stride_se
    acc_g = tl.zeros([BM, BN], dtype=ACC)
    acc_u = tl.zeros([BM, BN], dtype=ACC)
    k_lo, k_hi = _k_range(D, BK, SPLIT)
    offs_w = _load_rows(offs_n, I, CLAMP_N)
    if AHEAD:
        sb1 = _fp4_scales(s1_ptr, offs_w, I, k_lo, k_hi, stride_sn, BK, EVEN_K, CLAMP_N)
        sb3 = _fp4_scales(s3_ptr, offs_w, I, k_lo, k_hi, stride_sn, BK, EVEN_K, CLAMP_N)
    for k0 in range(k_lo, k_hi, BK):
        a_ptrs = x_ptr + tok[:, None] * stride_x + (k0 + offs_k)[None, :]
        a_ev, a_od = _a_tile(a_ptrs, valid[:, None] & (k0 + offs_k < D)[None, :], BM, BK, DT, False, G)
        if AHEAD:  # this tile's bytes from the iteration before, the next tile's now (`_tile_scales`)
            sb1, nsb1 = _tile_scales(s1_ptr, sb1, offs_w, I, k0, k_hi, stride_sn, BK, True, EVEN_K, CLAMP_N)
            sb3, nsb3 = _tile_scales(s3_ptr, sb3, offs_w, I, k0, k_hi, stride_sn, BK, True, EVEN_K, CLAMP_N)
            w_ev, w_od = _fp4_tile_from(w1_ptr, sb1, offs_w, I, k0, D, stride_wn, BN, BK, DT, ASM, RW, CLAMP_N)
        else:
            w_ev, w_od = _fp4_tile(w1_ptr, s1_ptr, offs_w, I, k0, D, stride_wn, stride_sn, BN, BK, DT, ASM, EVEN_K,
                                   RW, CLAMP_N)
        acc_g = _dot(a_ev, w_ev, acc_g, PREC, ACC, F32)
        acc_g = _dot(a_od, w_od, acc_g, PREC, ACC, F32)
        if AHEAD:
            w_ev, w_od = _fp4_tile_from(w3_ptr, sb3, offs_w, I, k0, D, stride_wn, BN, BK, DT, ASM, RW, CLAMP_N)
            sb1 = nsb1
            sb3 = nsb3
        else:
            w_ev, w_od = _fp4_tile(w3_ptr, s3_ptr, offs_w, I, k0, D, stride_wn, stride_sn, BN, BK, DT, ASM, EVEN_K,
                                   RW, CLAMP_N)
        acc_u = _dot(a_ev, w_ev, acc_u, PREC, ACC, F32)
        acc_u = _dot(a_od, w_od, acc_u, PREC, ACC, F32)
    _gate_up_out(acc_g, acc_u, h_ptr, part_ptr, cnt_ptr, rw_ptr, rows, offs_n, a_idx, valid, I, limit, stride_h,
                 stride_ps, stride_pg, BM, BN, SPLIT, G, QUANT_H, WEIGHT_H, CLAMP, ASM, ACC, DT, FINISH)


@triton.jit
def _split_sums(p, mask, stride_ps, stride_pg, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
                ACC: tl.constexpr):
    """The SPLIT gate / up partials of a tile (p: its split-0 gate pointers) summed in split order (deterministic),
    read past L1 (other programs' stores: a kernel before, or this one's after the arrival's acquire)."""
    acc_g = tl.zeros([BM, BN], dtype=ACC)
    acc_u = tl.zeros([BM, BN], dtype=ACC)
    for j in range(SPLIT):
        acc_g += tl.load(p + j * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
        acc_u += tl.load(p + j * stride_ps + stride_pg, mask=mask, other=0.0, cache_modifier=".cg")
    return acc_g, acc_u


@triton.jit
def _gate_up_out(acc_g, acc_u, h_ptr, part_ptr, cnt_ptr, rw_ptr, rows, offs_n, a_idx, valid, I, limit, stride_h,
                 stride_ps, stride_pg, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, G: tl.constexpr,
                 QUANT_H: tl.constexpr, WEIGHT_H: tl.constexpr, CLAMP: tl.constexpr, ASM: tl.constexpr,
                 ACC: tl.constexpr, DT: tl.constexpr, FINISH: tl.constexpr = False, hs_ptr=None,
                 H8: tl.constexpr = False):
    """Gate-up accumulators [BM, BN] -> the SwiGLU epilogue, or (SPLIT > 1) float partials of the real rows in
    [SPLIT, 2, P, I]: for `_swiglu_kernel`, or (FINISH) summed here by the tile's last program to arrive (its
    arrival counter, per program_id(0), re-zeroed after), in the same order and with the same epilogue as
    `_swiglu_kernel` (a BN tile of whole FP8 groups), so the same bits in one launch fewer."""
    if ASM:
        acc_g *= 4294967296.0  # 2^ASM_SHIFT
        acc_u *= 4294967296.0
    if SPLIT == 1:
        _swiglu_store(acc_g, acc_u, h_ptr, stride_h, rows, offs_n, rw_ptr, a_idx, valid, I, limit,
                      BM, BN, G, QUANT_H, WEIGHT_H, CLAMP, ACC, DT, hs_ptr, H8)
    else:
        p = part_ptr + rows[:, None].to(tl.int64) * I + offs_n[None, :]
        mask = valid[:, None] & (offs_n < I)[None, :]
        tl.store(p + tl.program_id(1) * stride_ps, acc_g, mask=mask)
        tl.store(p + tl.program_id(1) * stride_ps + stride_pg, acc_u, mask=mask)
        if FINISH:
            tile = cnt_ptr + tl.program_id(0)
            if last_to_arrive(tile, SPLIT):
                acc_g, acc_u = _split_sums(p, mask, stride_ps, stride_pg, BM, BN, SPLIT, ACC)
                _swiglu_store(acc_g, acc_u, h_ptr, stride_h, rows, offs_n, rw_ptr, a_idx, valid, I, limit,
                              BM, BN, G, QUANT_H, WEIGHT_H, CLAMP, ACC, DT, hs_ptr, H8)
                tl.store(tile, 0)  # ready for the next launch / graph replay


@step_jit
def _swiglu_kernel(part_ptr, h_ptr, rw_ptr, sorted_ptr, block_expert_ptr, M, I, limit, stride_ps, stride_pg,
                   stride_h, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, G: tl.constexpr,
                   QUANT_H: tl.constexpr, WEIGHT_H: tl.constexpr, CLAMP: tl.constexpr, ACC: tl.constexpr,
                   PDL: tl.constexpr = False):
    """Split-K gate-up: sum the SPLIT partials in order (deterministic), then the SwiGLU epilogue."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid_m = tl.program_id(0)
    if tl.load(block_expert_ptr + pid_m) < 0:
        return
    rows = pid_m * BM + tl.arange(0, BM)
    a_idx = tl.load(sorted_ptr + rows)
    valid = a_idx < M
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = valid[:, None] & (offs_n < I)[None, :]
    p = part_ptr + rows[:, None].to(tl.int64) * I + offs_n[None, :]
    acc_g, acc_u = _split_sums(p, mask, stride_ps, stride_pg, BM, BN, SPLIT, ACC)
    _swiglu_store(acc_g, acc_u, h_ptr, stride_h, rows, offs_n, rw_ptr, a_idx, valid, I, limit,
                  BM, BN, G, QUANT_H, WEIGHT_H, CLAMP, ACC, h_ptr.dtype.element_ty)


@step_jit
def _down_kernel(h_ptr, w2_ptr, s2_ptr, y_ptr, sorted_ptr, block_expert_ptr,
                 M, NB, D, I,
                 stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_y, stride_ys,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr,
                 G: tl.constexpr, QUANT_A: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
                 F32: tl.constexpr, EVEN_K: tl.constexpr = False, PDL: tl.constexpr = False,
                 cnt_ptr=None, rw_ptr=None, add_ptr=None, out_ptr=None, T=0, stride_add=0, stride_out=0,
                 COMBINE: tl.constexpr = False, TOPK: tl.constexpr = 1, APPLY_W: tl.constexpr = False,
                 ADD: tl.constexpr = False, BT: tl.constexpr = 16, AHEAD: tl.constexpr = False,
                 DIRECT: tl.constexpr = False, ROWS: tl.constexpr = False, CLAMP_N: tl.constexpr = False):
    """h W2^T for BM sorted rows of one expert x BN columns, stored per assignment row (x's dtype), or (SPLIT > 1)
    as float partials [SPLIT, M, D] that the combine kernel sums. COMBINE (fusion `moe_combine`): the last of the
    NB * SPLIT programs of a column tile to arrive runs the combine kernel's sums over that tile for every token.
    AHEAD: each K tile's scale bytes loaded an iteration before their use. DIRECT, ROWS, CLAMP_N: as the
    gate-up's."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    RW: tl.constexpr = EVEN_K and ROWS
    expert, _, rows, a_idx, valid, offs_n = _expert_block(block_expert_ptr, sorted_ptr, NB, D, M, BM, BN,
                                                          GROUP_M, DIRECT)
    DT = h_ptr.dtype.element_ty
    if expert >= 0:  # (an idle block still arrives at its tile's counter)
        offs_k = tl.arange(0, BK)
        w2_ptr += expert * stride_we
        s2_ptr += expert * stride_se
        acc = tl.zeros([BM, BN], dtype=ACC)
        k_lo, k_hi = _k_range(I, BK, SPLIT)
        offs_w = _load_rows(offs_n, D, CLAMP_N)
        if AHEAD:
            sb = _fp4_scales(s2_ptr, offs_w, D, k_lo, k_hi, stride_sn, BK, EVEN_K, CLAMP_N)
        for k0 in range(k_lo, k_hi, BK):
            a_ptrs = h_ptr + rows[:, None].to(tl.int64) * stride_h + (k0 + offs_k)[None, :]
            a_ev, a_od = _a_tile(a_ptrs, (k0 + offs_k < I)[None, :], BM, BK, DT, QUANT_A, G)
            if AHEAD:
                sb, nsb = _tile_scales(s2_ptr, sb, offs_w, D, k0, k_hi, stride_sn, BK, True, EVEN_K, CLAMP_N)
                w_ev, w_od = _fp4_tile_from(w2_ptr, sb, offs_w, D, k0, I, stride_wn, BN, BK, DT, ASM, RW, CLAMP_N)
                sb = nsb
            else:
                w_ev, w_od = _fp4_tile(w2_ptr, s2_ptr, offs_w, D, k0, I, stride_wn, stride_sn, BN, BK, DT, ASM,
                                       EVEN_K, RW, CLAMP_N)
            acc = _dot(a_ev, w_ev, acc, PREC, ACC, F32)
            acc = _dot(a_od, w_od, acc, PREC, ACC, F32)
        _down_out(acc, y_ptr, a_idx, valid, offs_n, D, stride_y, stride_ys, ASM)
    if COMBINE:
        tile = cnt_ptr + tl.min(offs_n, 0) // BN
        if last_to_arrive(tile, NB * SPLIT):
            _combine_tile(y_ptr, rw_ptr, add_ptr, out_ptr, offs_n, T, D, stride_y, stride_ys, stride_add,
                          stride_out, BN, TOPK, SPLIT, APPLY_W, ADD, DT, ACC, BT)
            tl.store(tile, 0)  # ready for the next launch / graph replay


@triton.jit
def _combine_tile(y_ptr, rw_ptr, add_ptr, out_ptr, cols, T, D, stride_y, stride_ys, stride_add, stride_out,
                  BN: tl.constexpr, TOPK: tl.constexpr, SPLIT: tl.constexpr, APPLY_W: tl.constexpr,
                  ADD: tl.constexpr, DT: tl.constexpr, ACC: tl.constexpr, BT: tl.constexpr):
    """`_combine_rows` over columns `cols` of every token, BT tokens at a time."""
    for t0 in range(0, T, BT):
        _combine_rows(y_ptr, rw_ptr, add_ptr, out_ptr, t0 + tl.arange(0, BT), cols, T, D, stride_y, stride_ys,
                      stride_add, stride_out, TOPK, SPLIT, APPLY_W, ADD, DT, ACC)


@triton.jit
def _combine_rows(y_ptr, rw_ptr, add_ptr, out_ptr, t, cols, T, D, stride_y, stride_ys, stride_add, stride_out, TOPK,
                  SPLIT: tl.constexpr, APPLY_W: tl.constexpr, ADD: tl.constexpr, DT: tl.constexpr,
                  ACC: tl.constexpr, pos_ptr=None, GATHER: tl.constexpr = False):
    """out[t, cols] = sum over slots, in slot order, of y[t*k + s] (its split-K partials summed first and rounded to
    x's dtype, like the reference's per-expert output) (* weight[t, s]), then + add[t] (the shared expert's output,
    widened): deterministic; stored in out's dtype. Rows are read past L1 (the fused combine reads rows that programs
    on other SMs wrote). GATHER: y's row of assignment t*k + s is pos[t*k + s] (rows sorted by expert,
    moe_grouped.py)."""
    tmask = t < T
    m = tmask[:, None] & (cols < D)[None, :]
    rows_t = t.to(tl.int64)[:, None]
    acc = tl.zeros([t.shape[0], cols.shape[0]], dtype=ACC)
    for s in range(TOPK):
        y = tl.zeros([t.shape[0], cols.shape[0]], dtype=ACC)
        if GATHER:
            row = tl.load(pos_ptr + t * TOPK + s, mask=tmask, other=0).to(tl.int64)[:, None]
        else:
            row = rows_t * TOPK + s
        rows = row * stride_y + cols[None, :]
        for j in range(SPLIT):
            y += tl.load(y_ptr + j * stride_ys + rows, mask=m, other=0.0, cache_modifier=".cg").to(ACC)
        y = y.to(DT).to(ACC)
        if APPLY_W:
            y *= tl.load(rw_ptr + t * TOPK + s, mask=tmask, other=0.0).to(ACC)[:, None]
        acc += y
    if ADD:
        acc += tl.load(add_ptr + rows_t * stride_add + cols[None, :], mask=m, other=0.0).to(ACC)
    tl.store(out_ptr + rows_t * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _down_out(acc, y_ptr, a_idx, valid, offs_n, D, stride_y, stride_ys, ASM: tl.constexpr):
    """Down accumulators [BM, BN] -> the real rows of y [SPLIT, M, D] (this program's K share)."""
    if ASM:
        acc *= 4294967296.0  # 2^ASM_SHIFT
    y_ptrs = (y_ptr + tl.program_id(1) * stride_ys + tl.where(valid, a_idx, 0).to(tl.int64)[:, None] * stride_y
              + offs_n[None, :])
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n < D)[None, :])


@step_jit
def _combine_kernel(y_ptr, rw_ptr, add_ptr, out_ptr, T, D, TOPK, stride_y, stride_ys, stride_add, stride_out,
                    BD: tl.constexpr, SPLIT: tl.constexpr, APPLY_W: tl.constexpr, DT: tl.constexpr,
                    ACC: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr = False, pos_ptr=None,
                    GATHER: tl.constexpr = False):
    """`_combine_rows` of one token (program 0) over BD columns (program 1)."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    _combine_rows(y_ptr, rw_ptr, add_ptr, out_ptr, tl.program_id(0) + tl.arange(0, 1),
                  tl.program_id(1) * BD + tl.arange(0, BD), T, D, stride_y, stride_ys, stride_add, stride_out, TOPK,
                  SPLIT, APPLY_W, ADD, DT, ACC, pos_ptr, GATHER)


# ------------------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # K shares per tile (float partials summed in order): CTAs for the few-expert decode steps
    max_regs: int = 0  # ptxas's register cap a thread (Triton's maxnreg; 0: ptxas's choice): CTAs an SM
    # the dot body's FP4 K tiles copied as whole rows (`_fp4_groups`), or as [BN, BK/32, 16] (a warp over a 16-byte
    # piece of 32 rows: 2x the L2 sectors, bank-conflicted shared stores, but fewer registers after the dequant)
    row_loads: bool = True
    # the dot body's weight rows past N clamped to the last one (`_load_rows`) so that their loads take no row mask:
    # a masked async copy's `other` is one select per register after the copy lands (sm_90 SASS, V4.1's batch-32
    # gate-up: 32 of the 954 instructions of a warp's K tile were the scale bytes' selects)
    clamp_rows: bool = True


BODIES = ("dot", "swap", "fma", "fp8", "grouped")
FINISHES = ("launch", "kernel")
FOLDS = {"": 0, "tile": 1, "group": 2}  # MoeConfig.fold -> the kernels' FOLD
_COUNTERS = ArrivalCounters()  # gate-up split-K tiles finished in the kernel (kernels/split_grid.py)
_DOWN_COUNTERS = ArrivalCounters()  # down column tiles whose last program combines (fusion `moe_combine`)


@dataclass(frozen=True)
class MoeConfig:
    """block_m is shared by both GEMMs (h is laid out in the sorted, padded row order)."""
    block_m: int
    gate_up: GemmConfig
    down: GemmConfig
    group_m: int = 1
    dequant: str = "auto"  # "bits" (portable), "asm" (bf16 on CUDA, PTX), "auto" = asm where it applies
    # the K-tile product: "dot" (x @ W^T), or moe_decode.py's "swap" (W @ x^T), "fma" (no tensor cores), "fp8" (W4A8 on
    # FP8 tensor cores; where the activations are not FP8-simulated per 32-multiple groups: swap), or
    # moe_grouped.py's "grouped" (prefill: bf16 weight copies and torch's grouped GEMM; where it does not apply: dot)
    body: str = "dot"
    # gate-up split-K partials summed by `_swiglu_kernel` ("launch") or by each tile's last program to arrive
    # ("kernel": one launch fewer; H200, E=256 k=6: T=1 69.1 -> 66.1 us, T=8..64 the same)
    finish: str = "kernel"
    # the fp8 body: a K tile inside one activation group with its 32-group weight scales folded into the e4m3
    # exponents, the scales applied once a tile (moe_decode.py): "tile" (one FP8 dot a tile), "group" (the groups'
    # dots chained), "" = off; tiles across activation groups keep the per-group dots
    fold: str = ""
    # the dot body: each K tile's e8m0 scale bytes loaded an iteration before their use, by hand — a tile of under 4
    # bytes a thread (the narrow tiles: 64 rows x 2 or 4 bytes over 128 threads) is no async copy for Triton's
    # pipeliner, so each iteration would wait a memory latency for it
    ahead: bool = False

    def __post_init__(self) -> None:
        if self.body not in BODIES:
            raise ValueError(f"unknown MoE body {self.body!r}: one of {BODIES}")
        if self.finish not in FINISHES:
            raise ValueError(f"unknown MoE split-K finish {self.finish!r}: one of {FINISHES}")
        if self.body in ("swap", "fp8") and self.block_m < 16:
            raise ValueError(f"the {self.body} body needs block_m >= 16 (the dot's N)")
        if self.body == "fp8" and {self.gate_up.block_k, self.down.block_k} - {32, 64, 128}:
            raise ValueError("the fp8 body takes K tiles of 32, 64 or 128")
        if self.fold not in FOLDS:
            raise ValueError(f"unknown MoE fold {self.fold!r}: one of {tuple(FOLDS)}")
        if self.fold and self.body != "fp8":
            raise ValueError("fold is the fp8 body's option")
        if self.ahead and self.body != "dot":
            raise ValueError("ahead is the dot body's option (the decode bodies prefetch by their own rule)")


# Decode (a few rows per expert) is bound by the FP4 weight stream and, behind it, by the dequant's instruction
# issue: small BLOCK_M, K tiles of 128 (registers for 3 CTAs per SM), a gate-up N tile of 128 so h's 1 x 128 FP8
# groups are quantized once in its epilogue. Prefill is compute bound: big tiles, GROUP_M row blocks of an expert
# sweep the columns together (weight tiles reused from L2).
# The decode gate-up's rows copied whole take ptxas to 184 registers (2 CTAs an SM; the split rule plans 3): capped at
# 168 (16 bytes of spills outside the K loop). H100, `benchmarks/kernels/moe.py --model v41-flash --experts 16`
# (forty-first session): T=8 236.0 -> 195.5 us, T=32 220.9 -> 207.3 (row copies uncapped: 223.1, 210.0). MID and
# PREFILL keep the [BN, BK/32, 16] copies (not timed with rows). With the weight rows clamped (`GemmConfig.clamp_rows`)
# ptxas needs 150 registers (sm_90, V4 and V4.1): the cap no longer binds.
DECODE = MoeConfig(16, GemmConfig(128, 128, 4, 3, max_regs=168), GemmConfig(128, 128, 4, 3))
MID = MoeConfig(32, GemmConfig(128, 128, 4, 3, row_loads=False), GemmConfig(128, 128, 4, 3, row_loads=False),
                group_m=4)
PREFILL = MoeConfig(128, GemmConfig(128, 64, 8, 3, row_loads=False), GemmConfig(128, 64, 8, 3, row_loads=False),
                    group_m=8)


# One row an expert with activation groups of at most 64 (V4.1's 1 x 32): 64-wide gate-up tiles over 64 of K (whole
# groups of h in a tile, so the in-kernel split-K finish applies; V4's 1 x 128 would need the SwiGLU launch) and
# 64-wide down tiles, their K shares sized for 6 and 5 CTAs an SM. H100, `benchmarks/kernels/moe.py --model v41-flash
# --experts 64 --tokens 1` (thirty-third session): 96.9 -> 89.7 us a layer (38.6 -> 41.7% of HBM); the gate-up's tiles
# alone 92.0, every other tile or split variant 96.6-143.7. `V4SERVE_MOE_NARROW=0` keeps DECODE's tiles (A/B).
# The gate-up's [BN, BK/32, 16] copies: rows copied whole took it from 80 to 102 registers (6 -> 4 CTAs an SM); H100,
# 64 experts, T=1: 88.3 -> 94.0 us with both GEMMs' rows (forty-first session). The down takes the row copies,
# uncapped (110 registers; 104 with the clamped rows): H100, the same benchmark (forty-second session), 89.6 us with the down's old copies capped
# at 96 registers, 82.2 uncapped, 77.8 with rows (variants nw-dn-free, nw-dn-rows).
NARROW_GATE_UP = GemmConfig(64, 64, 4, 4, row_loads=False)
NARROW_DOWN = GemmConfig(64, 128, 4, 3)
NARROW_ENV = "V4SERVE_MOE_NARROW"
# the narrow tiles' scale bytes loaded an iteration ahead (MoeConfig.ahead): H100, the graphed V4.1 step at batch 1 /
# 64K, replay 9.92 -> 9.84 ms (thirty-fourth session); "0" loads them in place (A/B)
AHEAD_ENV = "V4SERVE_MOE_AHEAD"
# "0": one token sorted by the prologue launch as any other step (A/B); else its blocks come straight from the routing
# and, given x's FP8 simulation (the router's launch writes it: `takes_simulated_input`), nothing launches before the
# gate-up
DIRECT_ENV = "V4SERVE_MOE_DIRECT"


def _split(ctas: int, k_tiles: int, sms: int, waves: int = 1, per_sm: int = 3) -> int:
    """Split K until the grid has about `waves` x per_sm CTAs per SM (rounded down for one wave, to nearest for
    more), keeping >= 4 K tiles per share."""
    per = per_sm * sms * waves / max(1, ctas)
    return max(1, min(4, int(per) if waves == 1 else round(per), k_tiles // 4))


DECODE_BODY_ENV = "V4SERVE_MOE_DECODE_BODY"  # the decode configs' body: dot (unset), swap or fp8 (A/B in the step)


def _env_choice(env: str, choices) -> str:
    """The environment's choice among `choices` (unset: the first), an unknown one refused by name."""
    name = env_get(env) or next(iter(choices))
    if name not in choices:
        raise ValueError(f"{env}={name!r}: one of {', '.join(choices)}")
    return name


def _decode_body() -> str:
    return _env_choice(DECODE_BODY_ENV, ("dot", "swap", "fp8"))


PREFILL_ENV = "V4SERVE_MOE_PREFILL"  # the prefill config by name (PREFILL_CONFIGS; unset: by rows), an A/B switch
# The fp8 body's fold on 64-row blocks (128-row ones spill ~0.8 KB a thread in the gate-up, sm_90 ptxas): candidates
# for the prefill, not timed on a GPU yet. Where the fp8 body does not apply, the swap body runs instead.
PREFILL_CONFIGS = {
    "dot": PREFILL,
    # the experts dequantized to bf16 once per call, then torch's grouped GEMM (moe_grouped.py)
    "grouped": replace(PREFILL, body="grouped"),
    "fp8-tile": MoeConfig(64, GemmConfig(128, 128, 8, 3), GemmConfig(128, 128, 8, 3), group_m=8, body="fp8",
                          fold="tile"),
    "fp8-group": MoeConfig(64, GemmConfig(128, 128, 8, 3), GemmConfig(128, 128, 8, 3), group_m=8, body="fp8",
                           fold="group"),
    # V4.1 (1 x 32 activation groups: no fold): the per-group fp8 body on 32-wide K tiles (gate-up spills 16 B)
    "fp8-k32": MoeConfig(64, GemmConfig(128, 32, 8, 4), GemmConfig(128, 32, 8, 4), group_m=8, body="fp8"),
}


# Rows an expert from which the grouped body is the default (its weight copies cost a fixed ~0.3 ms a layer at 16
# V4-Flash experts). H200, benchmarks/kernels/moe.py --experts 16 (twentieth session): 384 rows an expert (1K tokens)
# grouped 1.48 ms = dot 1.49; 768 rows 1.96 against 2.73; 3,072 rows (8K) 4.56 against 10.15 (543 TFLOP/s).
GROUPED_MIN_ROWS = 512
# With 1 x 32 activation groups (V4.1's geometry, the only one measured so) the grouped body wins from fewer rows.
# H100, `benchmarks/kernels/moe.py --model v41-flash --experts 16` (twenty-sixth session): 240 rows an expert (640
# tokens) grouped 1,200 us against dot 1,262; 384 rows (1K tokens) 1,492 against 1,943.
GROUPED_MIN_ROWS_G32 = 224


def _prefill_config(per_expert: float, act_group: int = 128) -> MoeConfig:
    if not env_get(PREFILL_ENV):
        least = GROUPED_MIN_ROWS_G32 if act_group == 32 else GROUPED_MIN_ROWS
        return PREFILL_CONFIGS["grouped"] if per_expert >= least else PREFILL
    return PREFILL_CONFIGS[_env_choice(PREFILL_ENV, PREFILL_CONFIGS)]


def select_config(rows: int, num_experts: int, dim: int = 4096, inter: int = 2048,
                  device: torch.device | None = None, body: str | None = None, act_group: int = 128) -> MoeConfig:
    """By the mean rows per expert hit (rows = T * k), plus split-K when few experts are hit (T = 1, 2): static given
    the shapes, so graph-capture safe. The decode configs take `body` (default: $V4SERVE_MOE_DECODE_BODY, or dot), the
    prefill config $V4SERVE_MOE_PREFILL's (PREFILL_CONFIGS; default: grouped from GROUPED_MIN_ROWS rows an expert,
    GROUPED_MIN_ROWS_G32 with 1 x 32 activation groups, else dot)."""
    hit = max(1, min(num_experts, rows))
    per_expert = rows / hit
    if per_expert > 96:
        return _prefill_config(per_expert, act_group)
    if per_expert > 24:
        return MID
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device and device.type == "cuda" else 132
    gu, dn = DECODE.gate_up, DECODE.down
    blocks = hit * cdiv(cdiv(rows, hit), DECODE.block_m)
    if per_expert <= 1 and 0 < act_group <= 64 and env_get(NARROW_ENV) != "0":
        gu = replace(NARROW_GATE_UP, split_k=_split(blocks * cdiv(inter, 64), cdiv(dim, 64), sms, per_sm=6))
        dn = replace(NARROW_DOWN, split_k=_split(blocks * cdiv(dim, 64), cdiv(inter, 128), sms, per_sm=5))
        body = body or _decode_body()
        return replace(DECODE, gate_up=gu, down=dn, body=body, ahead=body == "dot" and env_get(AHEAD_ENV) != "0")
    # Few experts with many rows each (the e16 presets at batch 32: 16 experts x 12 rows, one 16-row block each): K
    # shares for about two waves (H200, benchmarks/kernels/moe.py --experts 16, T=32: split 3 / 2 161.3 us, the one-wave
    # rule's 1 / 1 186.2 us; at T=8, 3 rows an expert, 1 / 1 stays best, 134.8 against 138.6)
    waves = 2 if rows / hit >= 8 else 1
    gu = replace(gu, split_k=_split(blocks * cdiv(inter, gu.block_n), cdiv(dim, gu.block_k), sms, waves))
    dn = replace(dn, split_k=_split(blocks * cdiv(dim, dn.block_n), cdiv(inter, dn.block_k), sms, waves))
    return replace(DECODE, gate_up=gu, down=dn, body=body or _decode_body())


def decode_config(rows: int, num_experts: int, dim: int = 4096, inter: int = 2048, body: str = "swap",
                  block_m: int | None = None, device: torch.device | None = None) -> MoeConfig:
    """A decode config for one body (benchmarks, tests); "dot" is `select_config`'s. swap: 16-row blocks (the dot's
    N), 128 x 128 weight tiles. fma: block_m = the mean rows per expert hit rounded up to a power of two (<= 8)
    unless given; N tiles of 32 rows per warp (a thread owns a weight row: the K sums stay in-thread) and K tiles
    shrinking as block_m grows (each row of x is broadcast over a thread's K values: registers). Split-K as
    `select_config`, by the number of row blocks."""
    if body == "dot":
        return select_config(rows, num_experts, dim, inter, device, body="dot")
    hit = max(1, min(num_experts, rows))
    if block_m is None:
        block_m = 16 if body in ("swap", "fp8") else min(8, next_pow2(cdiv(rows, hit)))
    if body in ("swap", "fp8"):
        gu, dn = GemmConfig(128, 128, 4, 3), GemmConfig(128, 128, 4, 3)
    else:
        bk = 64 if block_m <= 2 else 32
        gu = GemmConfig(512, bk, 16, 3) if block_m >= 8 else GemmConfig(256, bk, 8, 3)
        dn = GemmConfig(256, bk, 8, 3)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device and device.type == "cuda" else 132
    blocks = hit * cdiv(cdiv(rows, hit), block_m)  # used row blocks, about
    gu = replace(gu, split_k=_split(blocks * cdiv(inter, gu.block_n), cdiv(dim, gu.block_k), sms))
    dn = replace(dn, split_k=_split(blocks * cdiv(dim, dn.block_n), cdiv(inter, dn.block_k), sms))
    return MoeConfig(block_m, gu, dn, body=body)


def _even_k(K: int, block_k: int, scales: torch.Tensor) -> bool:
    """The kernels' EVEN_K: whole K tiles, each row's scale bytes of a tile aligned to their count (`_fp4_scales`)."""
    return K % block_k == 0 and scales.stride(-2) % (block_k // 32) == 0


def supports(x: torch.Tensor, experts) -> bool:
    """FP4 stacks and a bf16/f32 x on CUDA (f64 only under the CPU interpreter, as a numerics check)."""
    if experts.fmt != "fp4" or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float32, torch.float64):
        return False
    if x.is_cuda:
        if x.dtype == torch.float64:
            return False
    elif not interpreting():
        return False
    E, I, half_d = experts.w1.shape
    return (x.device == experts.w1.device and x.shape[1] == 2 * half_d and half_d % 16 == 0 and I % 32 == 0
            and tuple(experts.w2.shape) == (E, x.shape[1], I // 2) and experts.s1 is not None)


def takes_simulated_input(x: torch.Tensor, experts, act_group: int) -> bool:
    """Whether `experts_forward` over x would take x's FP8 simulation per 1 x act_group made by another launch (its
    `xq`; ops.router writes it beside the gate logits) rather than simulate it in a launch of its own: one token,
    where that leaves the experts no launch before their gate-up (`_direct`)."""
    return (x.shape[0] == 1 and act_group > 0 and _quant_ok(act_group) and x.shape[1] % act_group == 0
            and supports(x, experts) and env_get(DIRECT_ENV) != "0")


def _direct(T: int, cfg: MoeConfig, act_group: int, xq: torch.Tensor | None, split: int, finish: bool) -> bool:
    """One token's blocks straight from its routing (`_expert_block`'s DIRECT; no sort): its k experts are distinct,
    so the sort would give each a block of its one row. The dot body (the others read the sorted rows themselves),
    x's simulation already made (or none needed), and no SwiGLU launch (it reads the sorted rows)."""
    return (T == 1 and cfg.body == "dot" and (act_group == 0 or xq is not None) and (split == 1 or finish)
            and env_get(DIRECT_ENV) != "0")


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer of a call (a seam for the tests, which poison them to prove each read element is written)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _quant_ok(act_group: int) -> bool:
    return act_group == 0 or (act_group & (act_group - 1) == 0 and act_group <= 256)


def _u8(t: torch.Tensor) -> torch.Tensor:
    t = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return t if t.stride(-1) == 1 else t.contiguous()


_TL = {torch.bfloat16: tl.bfloat16, torch.float32: tl.float32, torch.float64: tl.float64}


def _dot_dtypes(dtype: torch.dtype) -> tuple[str, tl.dtype]:
    if dtype == torch.float64:
        return "ieee", tl.float64
    return ("ieee" if dtype == torch.float32 else "tf32"), tl.float32


def _num_blocks(M: int, num_experts: int, block_m: int) -> int:
    """The bound on used BLOCK_M blocks: every expert's run padded to a multiple of block_m."""
    return cdiv(M + min(num_experts, M) * (block_m - 1), block_m)


def sort_launch(M: int, cursor: torch.Tensor) -> dict:
    """The sort's launch parameters for M assignments (`_align` in program 0; moe_grouped.py launches it too)."""
    big = M > 4096
    return {"E_PAD": cursor.shape[0], "CHUNK": max(16, min(1024 if big else 128, next_pow2(M))),
            "num_warps": 8 if big else 4}


def _prologue(ids: torch.Tensor, num_experts: int, block_m: int, x: torch.Tensor | None = None,
              act_group: int = 0, x8: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(sorted assignment indices, expert per block, x FP8-simulated (x8: as e4m3 bytes in the K32 order), x8's
    scales)."""
    M = ids.shape[0]
    NB = _num_blocks(M, num_experts, block_m)
    sorted_ids = _empty((NB * block_m,), torch.int32, ids.device)
    block_expert = _empty((NB,), torch.int32, ids.device)
    cursor = _empty((max(16, next_pow2(num_experts)),), torch.int32, ids.device)
    xq, xs, T, D, br, bc, grid = None, None, 0, 0, 16, 128, 1
    if x is not None and act_group:
        T, D = x.shape
        xq = _empty((T, D), torch.float8_e4m3fn if x8 else x.dtype, x.device)
        xs = _empty((T, D // act_group), torch.float32, x.device) if x8 else None
        bc = max(act_group, 128)
        grid += cdiv(T, br) * cdiv(D, bc)
    _prologue_kernel[(grid,)](ids, sorted_ids, block_expert, cursor, M, NB, None if xq is None else x, xq, T, D,
                              0 if xq is None else x.stride(0), 0 if xq is None else xq.stride(0), BM=block_m,
                              QUANT_X=xq is not None, G=max(1, act_group), BR=br, BC=bc, **sort_launch(M, cursor),
                              **pdl_launch(ids), **({"xs_ptr": xs, "X8": True} if xs is not None else {}),
                              **({"EARLY": True} if pdl_early("moe_prologue") else {}))
    return sorted_ids, block_expert, xq, xs


def align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat expert ids [M] -> (sorted assignment indices [NB * block_m], expert per block [NB]); NB is the bound
    cdiv(M + min(E, M) * (block_m - 1), block_m) on the number of used blocks (the rest are -1)."""
    return _prologue(ids, num_experts, block_m)[:2]


def _body(cfg: MoeConfig, gemm: GemmConfig, x: torch.Tensor) -> dict:
    regs = {"maxnreg": gemm.max_regs} if gemm.max_regs and x.is_cuda else {}
    if cfg.body == "dot":
        return (regs | ({"AHEAD": True} if cfg.ahead else {}) | ({"ROWS": True} if gemm.row_loads else {})
                | ({"CLAMP_N": True} if gemm.clamp_rows else {}))
    return regs | {"BODY": cfg.body, "STAGES": gemm.num_stages} | ({"FOLD": FOLDS[cfg.fold]} if cfg.fold else {})


def _fp8_body_applies(x: torch.Tensor, act_group: int, gate_up_n: int, split_launch: bool) -> bool:
    """The fp8 body needs x (the prologue) and h (the gate-up epilogue, its column tile whole groups, not the split-K
    SwiGLU launch) quantized per groups that 32-wide slices tile, and at most float32 sums (float64 x: the bf16-exact
    bodies)."""
    return (act_group > 0 and act_group % 32 == 0 and gate_up_n % act_group == 0 and not split_launch
            and x.dtype in (torch.bfloat16, torch.float32))


def experts_forward(x: torch.Tensor, experts, weights: torch.Tensor, ids: torch.Tensor, limit: float,
                    act_group: int, weight_before_w2: bool, config: MoeConfig | None = None,
                    shared: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                    join: Callable[[], None] | None = None, xq: torch.Tensor | None = None) -> torch.Tensor:
    """sum_s weights[:, s] * expert_{ids[:, s]}(x) (+ `shared` [T, D], widened) -> [T, D] in float32 (float64 for a
    float64 x), or `out_dtype` (rounded once, after the sum). `join` runs before the first launch that reads `shared`
    (the combine). `xq`: x's FP8 simulation per 1 x act_group where another launch made it (`takes_simulated_input`),
    read instead of simulating x here."""
    if not _quant_ok(act_group):  # groups that do not tile (not a power of two): the plain-torch body
        from ..moe import experts_reference
        return experts_reference(x, experts, weights, ids, limit, act_group, weight_before_w2, shared, out_dtype,
                                 join, xq)
    T, D = x.shape
    E, I = experts.w1.shape[0], experts.w1.shape[1]
    k = ids.shape[1]
    M = T * k
    acc_t = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = _empty((T, D), out_dtype or acc_t, x.device)
    if M == 0:  # no routed token (T = 0, or k = 0): the shared output alone
        if join is not None:
            join()
        return out.copy_(shared) if shared is not None else out.zero_()
    cfg = config or select_config(M, E, D, I, x.device, act_group=act_group)
    if cfg.body == "grouped":
        from . import moe_grouped
        if moe_grouped.applies(x, experts, act_group):
            return moe_grouped.experts_forward(x, experts, weights, ids, limit, act_group, weight_before_w2,
                                               shared=shared, out_dtype=out_dtype, join=join)
        cfg = replace(cfg, body="dot")
    G, BM = act_group, cfg.block_m
    use_asm = cfg.dequant == "asm" or (cfg.dequant == "auto" and x.dtype == torch.bfloat16 and x.is_cuda
                                       and not interpreting())
    prec, acc_tl = _dot_dtypes(x.dtype)
    f32 = x.dtype == torch.bfloat16 and interpreting()
    prec = "ieee" if f32 else prec
    x = x if x.stride(-1) == 1 else x.contiguous()
    rw = weights.to(acc_t).contiguous().view(-1)
    w1, w2, w3 = _u8(experts.w1), _u8(experts.w2), _u8(experts.w3)
    s1, s2, s3 = _u8(scale_bytes(experts.s1)), _u8(scale_bytes(experts.s2)), _u8(scale_bytes(experts.s3))
    assert stored_format(experts.w1) == "fp4" and w1.stride() == w3.stride() and s1.stride() == s3.stride()

    gu = cfg.gate_up
    S = gu.split_k
    NB = _num_blocks(M, E, BM)
    grid_gu = (NB * cdiv(I, gu.block_n), S)
    finish = S > 1 and cfg.finish == "kernel" and (G == 0 or gu.block_n % G == 0) and grid_gu[0] <= N_COUNTERS
    if cfg.body == "fp8" and not _fp8_body_applies(x, G, gu.block_n, S > 1 and not finish):
        cfg = replace(cfg, body="swap", fold="")
    fp8 = cfg.body == "fp8"

    # 1. sort by expert into BLOCK_M-padded runs, and FP8-simulate x (one launch; the fp8 body: e4m3 + scales) —
    # unless one token's blocks come straight from its routing and x's simulation is given or not needed (no launch)
    flat_ids = ids.contiguous().view(-1)
    direct = _direct(T, cfg, G, xq, S, finish)
    if direct:
        assert NB == M  # k <= E distinct experts: a block each
        sorted_ids, block_expert, xa, xs = flat_ids, flat_ids, x if G == 0 else xq, None
        P = NB * BM
    else:
        given = xq is not None and G > 0 and not fp8
        sorted_ids, block_expert, xsim, xs = _prologue(flat_ids, E, BM, None if given else x, G, x8=fp8)
        xa = xq if given else x if xsim is None else xsim
        P = sorted_ids.shape[0]
    xa = xa if xa.stride(-1) == 1 else xa.contiguous()
    direct_kw = {"DIRECT": True} if direct else {}

    # 2. gate + up (+ SwiGLU, clamp, routing weight, h's FP8 simulation where the tile holds whole groups); with
    # split-K, float partials and a small SwiGLU kernel (whose column tile always holds whole groups)
    bne = max(64, G)
    quant_h = G > 0 and I % G == 0 and (gu.block_n % G == 0 or S > 1)
    h = _empty((P, I), torch.float8_e4m3fn if fp8 else x.dtype, x.device)
    hs = _empty((P, I // G), torch.float32, x.device) if fp8 else None
    part = _empty((S, 2, P, I), acc_t, x.device) if S > 1 else h
    cnt = _COUNTERS.get(x.device) if finish else sorted_ids  # (unused without the finish)
    gate_up_kernel, down_kernel = _gate_up_kernel, _down_kernel
    if cfg.body != "dot":  # moe_decode.py: the same arguments, plus the body and the K loop's stage count
        from . import moe_decode
        gate_up_kernel, down_kernel = moe_decode.gate_up_kernel, moe_decode.down_kernel
    fp8_gu = {"xs_ptr": xs, "hs_ptr": hs, "HDT": _TL[x.dtype]} if fp8 else {}
    gate_up_kernel[grid_gu](
        xa, w1, w3, s1, s3, h, part, cnt, rw, sorted_ids, block_expert, M, NB, D, I, k, float(limit),
        xa.stride(0), w1.stride(0), w1.stride(1), s1.stride(0), s1.stride(1), h.stride(0), 2 * P * I, P * I,
        BM=BM, BN=gu.block_n, BK=gu.block_k, GROUP_M=cfg.group_m, SPLIT=S, G=max(G, 1), QUANT_H=quant_h,
        WEIGHT_H=weight_before_w2, CLAMP=limit > 0, ASM=use_asm, PREC=prec, ACC=acc_tl, F32=f32,
        EVEN_K=_even_k(D, gu.block_k, s1), FINISH=finish,
        num_warps=gu.num_warps, num_stages=gu.num_stages, **_body(cfg, gu, x), **fp8_gu, **direct_kw, **pdl_launch(x))
    if S > 1 and not finish:
        _swiglu_kernel[(NB, cdiv(I, bne))](
            part, h, rw, sorted_ids, block_expert, M, I, float(limit), 2 * P * I, P * I, h.stride(0),
            BM=BM, BN=bne, SPLIT=S, G=max(G, 1), QUANT_H=quant_h, WEIGHT_H=weight_before_w2, CLAMP=limit > 0,
            ACC=acc_tl, num_warps=4, **pdl_launch(x))

    # 3. down, one row per (token, slot), rounded to x's dtype like the reference's per-expert output (split-K:
    # float partials, summed and rounded by the combine)
    dn = cfg.down
    S = dn.split_k
    quant_h_in_tile = G > 0 and not quant_h
    y = _empty((S, M, D), x.dtype if S == 1 else acc_t, x.device)
    bk_dn = max(dn.block_k, G) if quant_h_in_tile else dn.block_k
    # 4. combine the k rows of each token in slot order (+ the shared output, once it is there): a launch of its own
    # after the down, or (fusion `moe_combine`, the dot body) the down kernel's last program of each column tile
    add = shared if shared is not None else out
    if add.stride(-1) != 1:
        add = add.contiguous()
    combine_in_down = cfg.body == "dot" and fused("moe_combine", T) and cdiv(D, dn.block_n) <= N_COUNTERS
    combine = {}
    if combine_in_down:
        if join is not None:  # the last program of a tile reads the shared output
            join()
        combine = {"cnt_ptr": _DOWN_COUNTERS.get(x.device), "rw_ptr": rw, "add_ptr": add, "out_ptr": out, "T": T,
                   "stride_add": add.stride(0), "stride_out": out.stride(0), "COMBINE": True, "TOPK": k,
                   "APPLY_W": not weight_before_w2, "ADD": shared is not None}
    down_kernel[(NB * cdiv(D, dn.block_n), S)](
        h, w2, s2, y, sorted_ids, block_expert, M, NB, D, I,
        h.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), y.stride(1), y.stride(0),
        BM=BM, BN=dn.block_n, BK=bk_dn, GROUP_M=cfg.group_m, SPLIT=S, G=max(G, 1), QUANT_A=quant_h_in_tile,
        ASM=use_asm, PREC=prec, ACC=acc_tl, F32=f32, EVEN_K=_even_k(I, bk_dn, s2),
        num_warps=dn.num_warps, num_stages=dn.num_stages, **_body(cfg, dn, x), **({"hs_ptr": hs} if fp8 else {}),
        **direct_kw, **combine, **pdl_launch(x))

    if combine_in_down:
        return out
    if join is not None:
        join()
    bd = min(1024, next_pow2(D))
    _combine_kernel[(T, cdiv(D, bd))](y, rw, add, out, T, D, k, y.stride(1), y.stride(0), add.stride(0),
                                             out.stride(0), BD=bd, SPLIT=S, APPLY_W=not weight_before_w2,
                                             DT=_TL[x.dtype], ACC=acc_tl, ADD=shared is not None, num_warps=4,
                                             **pdl_launch(x))
    return out
