"""Decode bodies of the routed-experts GEMMs (ops/kernels/moe.py): the same grid, sort, split-K and epilogues as the
"dot" kernels there, with another product per K tile, picked by `MoeConfig.body`. All accumulate acc^T [BN, BM]
and transpose it once for the epilogue.

  "swap": acc^T += W [BN, BK] @ x^T [BK, BM] with `tl.dot`: the dequantized weight is the A operand, which sm_90's
          wgmma reads from registers, and the few rows of x the B operand, in shared memory (Triton 3.6 TTGIR: a
          warp_group_dot with a register A; the "dot" body at BLOCK_M=16 gets mma.sync instead).
  "fma":  no tensor cores, for 1-8 rows per block (a 16-row MMA tile would be mostly padding): a thread owns weight
          rows (BN = 32 x num_warps) and the K values of its 16-byte loads, so each row of x is broadcast to the
          weight tile in its load layout and summed over K in-thread, in float32 (float64 for a float64 x); the
          weight tile is dequantized once per K tile for all BM rows.

  "fp8":  W4A8 on FP8 tensor cores, where the activations are FP8-quantized per groups that 32-wide slices tile
          (act_group a multiple of 32): the prologue writes x, and the gate-up epilogue h, as e4m3 bytes with float32
          scales (moe._store_e4m3), each 32-group's columns in the K32 order (the even ones, then the odd ones). Per
          32-group of K the FP4 bytes become e4m3 in 9 PTX operations a 32-bit word (`_fp4_e4m3`: the magnitude bits
          moved to e4m3 bits 2..4, which reads as value * 2^-6 exactly, 0.5 as a subnormal); [low nibbles | high
          nibbles] is that same K32 order, and a thread's wgmma A registers then hold the two halves of one word of
          bytes; acc^T += (W_g @ x_g^T) * the group's weight scales, the activation scale once a tile (per group where
          a tile spans several). The products are exact; only the tensor core's accumulation inside a 32-group and
          the order of the sums differ from the bf16 bodies. Measured slower than "dot" all the same (H200,
          benchmarks/kernels/moe.py, E=256 k=6: T=1 81.2 against 65.5 us, T=8 386 / 365, T=64 1573 / 1460; the V4
          step's graph replay 10.41 against 9.85 ms at batch 1): its K loop is 678 SASS instructions a thread a
          128-wide tile against dot's 945, but each 32-group's wgmma is waited for before its scale FMAs, and its
          registers (185) allow two CTAs an SM.

        "fold" (MoeConfig.fold, prefill): where a K tile lies in one activation group (V4: 1 x 128), each weight row's
          32-group scales are folded into the e4m3 exponents relative to the tile's largest (`_fold_e4m3`: value *
          2^(b_g - b_max + 6), at most 384, exact while b_g >= b_max - 12; a group further below reads 0 — less than
          2^-13 of the tile's largest values, below bf16's resolution), so the scales 2^b_max x the activation's are
          applied once a tile as the tile's sum is promoted into the float32 running sum (DeepGEMM's promotion per
          128), not per 32-group: "tile" takes the K tile as ONE FP8 dot (one tensor-core wait a tile), "group"
          chains the groups' dots into the tile sum, converting a group at a time (fewer registers). Neither timed
          on a GPU yet.

swap and fma keep the even/odd split (low nibbles x even columns of x, high nibbles x odd columns): no interleave.
The K loops are `tl.range(..., num_stages=STAGES)`: without an explicit stage count Triton 3.6 does not pipeline loads
that feed no dot (the fma body's), and each iteration would wait for its own loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import step_jit
from .moe import (_a_tile, _dot, _down_out, _expert_block, _fp4_groups, _fp4_scales, _gate_up_out, _k_range,
                  _tile_scales)
from .pdl import enter as pdl_enter

# The fp8 body's weights are e4m3 holding value * 2^-6, and its e8m0 scales are read as 2^(b - 126) (twice the scale:
# one integer op, 2^-127 still normal): its epilogues multiply by 2^6 / 2, exactly. Scales up to 2^126.
FP8_SHIFT = tl.constexpr(32.0)


@triton.jit
def _swap(w_ptr, sb, offs_n, N, k0, K, stride_n, a_ev, a_od, acc, BN: tl.constexpr, BK: tl.constexpr,
          DT: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr, F32: tl.constexpr):
    """acc^T [BN, BM] += the K tile of W's rows offs_n (e8m0 bytes sb) @ the x tile^T (halves a_ev, a_od [BM, BK/2])."""
    w_ev, w_od = _fp4_groups(w_ptr, sb, offs_n, N, k0, K, stride_n, BK, DT, ASM)
    acc = _dot(tl.reshape(w_ev, (BN, BK // 2)), tl.trans(a_ev), acc, PREC, ACC, F32)
    return _dot(tl.reshape(w_od, (BN, BK // 2)), tl.trans(a_od), acc, PREC, ACC, F32)


@triton.jit
def _fp4_e4m3(packed, ASM: tl.constexpr):
    """FP4 e2m1 bytes -> (low, high) nibbles as e4m3 bytes holding value * 2^-6 exactly: the 3 magnitude bits at
    e4m3 bits 2..4 (exponent field 0..3; code 1 = 0.5 is the subnormal 0.5 * 2^-6), the sign at bit 7. ASM: on
    32-bit words in PTX (4 bytes at once; CUDA only), else the same bit operations per byte."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 t, u;
            shl.b32 t, $2, 2; and.b32 t, t, 0x1C1C1C1C; shl.b32 u, $2, 4; and.b32 u, u, 0x80808080;
            or.b32 $0, t, u;
            shr.b32 t, $2, 2; and.b32 t, t, 0x1C1C1C1C; and.b32 u, $2, 0x80808080; or.b32 $1, t, u;
            }
            """,
            constraints="=r,=r,r", args=[packed], dtype=(tl.float8e4nv, tl.float8e4nv), is_pure=True, pack=4)
    else:
        p = packed.to(tl.int32)
        lo = (((p & 7) << 2) | ((p & 8) << 4)).to(tl.uint8)
        hi = (((p >> 2) & 0x1C) | (p & 0x80)).to(tl.uint8)
        return lo.to(tl.float8e4nv, bitcast=True), hi.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _fp8_group(w_ptr, offs_n, N, kg, K, stride_n, xq, scale, acc, BN: tl.constexpr, ASM: tl.constexpr,
               EVEN_K: tl.constexpr):
    """acc^T [BN, BM] += (32-group kg of W's rows offs_n, as e4m3 * 2^-6 @ xq^T [32, BM] on the FP8 tensor cores) *
    scale ([BN, 1] or [BN, BM]); xq is in the K32 order (moe._k32_order), as these weight registers are; groups past K
    add zeros."""
    ok = offs_n < N
    if not EVEN_K:
        ok = ok & (kg < K // 32)
    p = tl.load(w_ptr + offs_n[:, None] * stride_n + kg * 16 + tl.arange(0, 16)[None, :], mask=ok[:, None], other=0)
    lo, hi = _fp4_e4m3(p, ASM)
    # [low nibbles | high nibbles] = K columns 0, 2, .., 30, 1, 3, .., 31: a thread's wgmma A registers hold columns
    # c..c+3 and c+16..c+19, the two halves of one 4-byte word of bytes (no byte shuffles)
    w = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BN, 32))
    return acc + tl.dot(w, tl.trans(xq)) * scale


@triton.jit
def _e8m0_x2(b):
    """e8m0 bytes -> 2^(b - 126) (twice the scale, FP8_SHIFT's halving) as float32: normal for every b < 254."""
    return ((b.to(tl.int32) << 23) + (1 << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _columns(sb, NG: tl.constexpr):
    """A K tile's e8m0 bytes [BN, NG] (NG = 1, 2 or 4 groups of 32) -> its columns as float32 (2 x scale) [BN], a
    4-tuple (repeating when NG < 4)."""
    return _split_columns(_e8m0_x2(sb), NG)


@triton.jit
def _split_columns(ws, NG: tl.constexpr):
    """[BN, NG] (NG = 1, 2 or 4) -> its columns [BN], a 4-tuple (repeating when NG < 4), by register splits: no
    selects or shuffles."""
    if NG == 1:
        c0 = tl.reshape(ws, (ws.shape[0],))
        return c0, c0, c0, c0
    elif NG == 2:
        c0, c1 = tl.split(ws)
        return c0, c1, c0, c1
    else:
        even, odd = tl.split(tl.reshape(ws, (ws.shape[0], 2, 2)))  # columns (0, 2) and (1, 3)
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        return c0, c1, c2, c3


@triton.jit
def _pick(c, g: tl.constexpr):
    """Element g (0-3) of a 4-tuple, at compile time."""
    if g == 0:
        return c[0]
    elif g == 1:
        return c[1]
    elif g == 2:
        return c[2]
    else:
        return c[3]


@triton.jit
def _fp8_rows(a8_ptr, arow, amask, kc, K, EVEN_K: tl.constexpr):
    """The e4m3 activation rows arow [BM] at columns kc [32] (K32 order); masked rows and columns past K read 0."""
    mask = amask[:, None]
    if not EVEN_K:
        mask = mask & (kc < K)[None, :]
    return tl.load(a8_ptr + arow[:, None] * K + kc[None, :], mask=mask, other=0.0)


@triton.jit
def _fold_e4m3(c, e0):
    """FP4 e2m1 codes c (0..15, int32) -> e4m3 bytes holding value * 2^(e0 - 6), e0 (int32, broadcast) in 0..12:
    magnitudes >= 1.0 move their exponent by e0 (bits (mag << 2) + (e0 << 3)), 0.5 becomes 2^(e0 - 7) (the subnormal
    4 at e0 = 0, as _fp4_e4m3), the sign at bit 7; e0 < 0 (a group more than 2^12 below the tile's largest) reads 0."""
    mag = c & 7
    half = tl.where(e0 > 0, e0 << 3, 4)
    bits = tl.where(mag >= 2, (mag << 2) + (e0 << 3), tl.where(mag == 1, half, 0)) | ((c & 8) << 4)
    bits = tl.where(e0 >= 0, bits, 0)
    return bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _fold_offsets(sb, k0, K, NG: tl.constexpr, EVEN_K: tl.constexpr):
    """A K tile's e8m0 bytes sb [BN, NG] -> (each group's exponent offset e0 = b_g - b_max + 12 [BN, NG], the row
    factor 2^(b_max - 127) / 2048 [BN] as float32: the folded operand's value times it, times the epilogue's
    FP8_SHIFT, is the weight), b_max the row's largest in the tile (groups past K kept out). A row whose largest scale
    is below 2^-115 (b_max < 12: values under 1e-34) reads 0 (e0 = -1), its factor 1."""
    b = sb.to(tl.int32)
    if not EVEN_K:
        b = tl.where((k0 // 32 + tl.arange(0, NG) < K // 32)[None, :], b, 0)
    bmax = tl.max(b, 1)
    tiny = bmax < 12
    e0 = tl.where(tiny[:, None], -1, b - bmax[:, None] + 12)
    return e0, tl.where(tiny, 1.0, ((bmax - 11) << 23).to(tl.float32, bitcast=True))


@triton.jit
def _fold_whole(w_ptr, offs_n, N, k0, K, stride_n, e0, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """The K tile [k0, k0 + BK) of W's rows offs_n as ONE e4m3 operand [BN, BK] (each 32-group in the K32 order: its
    16 low nibbles, then its 16 high ones), value * 2^(e0 - 6) with e0 [BN, BK/32] the groups' offsets (`_fold_e4m3`);
    columns past K read 0. BK = 32: one group."""
    NG: tl.constexpr = BK // 32
    kb = k0 // 2 + tl.arange(0, BK // 2)
    mask = (offs_n < N)[:, None]
    if not EVEN_K:
        mask = mask & (kb < K // 2)[None, :]
    p = tl.load(w_ptr + offs_n[:, None] * stride_n + kb[None, :], mask=mask, other=0)
    p = tl.reshape(p, (BN, NG, 16)).to(tl.int32)
    e3 = tl.reshape(e0, (BN, NG, 1))
    lo = _fold_e4m3(p & 15, e3)
    hi = _fold_e4m3(p >> 4, e3)
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 1, 3, 2)), (BN, BK))


@triton.jit
def _fp8_tile(w_ptr, sb, offs_n, N, k0, K, stride_n, a8_ptr, as_ptr, arow, amask, acc, BN: tl.constexpr,
              BK: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr, EVEN_K: tl.constexpr, FOLD: tl.constexpr = 0):
    """acc^T [BN, BM] += the K tile [k0, k0 + BK) of W (its e8m0 bytes sb [BN, BK/32]) @ the activation rows arow^T:
    e4m3 bytes a8 [rows, K] (K32 order) and float32 scales as [rows, K / G], 32-groups at a time; the activation
    scale applied once a tile when the tile lies in one of its groups (G % BK == 0), else per 32-group. BK = 32, 64
    or 128. FOLD (with G % BK == 0; 1 "tile", 2 "group"): the weights folded (`_fold_whole`, a tile or a group at a time), the
    scales once a tile."""
    offs = tl.arange(0, 32)
    if FOLD != 0 and G % BK == 0:
        e0, r = _fold_offsets(sb, k0, K, BK // 32, EVEN_K)
        # the tile's sum in its own accumulator, promoted into acc in float32 once a tile (as DeepGEMM: Hopper's FP8
        # wgmma keeps ~14 bits in its accumulation, so the running sum over all of K stays out of the tensor cores)
        if FOLD == 1:  # "tile": one dot over the whole tile (one tensor-core wait a tile)
            w = _fold_whole(w_ptr, offs_n, N, k0, K, stride_n, e0, BN, BK, EVEN_K)
            t = tl.dot(w, tl.trans(_fp8_rows(a8_ptr, arow, amask, k0 + tl.arange(0, BK), K, EVEN_K)))
        else:  # "group": the groups' dots chained, each group converted on its own (a quarter of the transients)
            e = _split_columns(e0, BK // 32)
            t = tl.zeros(acc.shape, dtype=tl.float32)
            for g in tl.static_range(BK // 32):
                xq = _fp8_rows(a8_ptr, arow, amask, k0 + g * 32 + offs, K, EVEN_K)
                w = _fold_whole(w_ptr, offs_n, N, k0 + g * 32, K, stride_n, _pick(e, g)[:, None], BN, 32, EVEN_K)
                t = tl.dot(w, tl.trans(xq), t)
        xs = tl.load(as_ptr + arow * (K // G) + k0 // G, mask=amask, other=0.0)
        # r [BN] and xs [BM] apart (a [BN, BM] product would take another accumulator's registers)
        return acc + t * r[:, None] * xs[None, :]
    ws = _columns(sb, BK // 32)
    if G % BK == 0:
        xs = tl.load(as_ptr + arow * (K // G) + k0 // G, mask=amask, other=0.0)
        t = tl.zeros(acc.shape, dtype=tl.float32)
        for g in tl.static_range(BK // 32):
            xq = _fp8_rows(a8_ptr, arow, amask, k0 + g * 32 + offs, K, EVEN_K)
            t = _fp8_group(w_ptr, offs_n, N, k0 // 32 + g, K, stride_n, xq, _pick(ws, g)[:, None], t, BN, ASM, EVEN_K)
        acc += t * xs[None, :]
    else:
        for g in tl.static_range(BK // 32):
            xq = _fp8_rows(a8_ptr, arow, amask, k0 + g * 32 + offs, K, EVEN_K)
            xs = tl.load(as_ptr + arow * (K // G) + (k0 + g * 32) // G, mask=amask & (k0 + g * 32 < K), other=0.0)
            acc = _fp8_group(w_ptr, offs_n, N, k0 // 32 + g, K, stride_n, xq, _pick(ws, g)[:, None] * xs[None, :],
                             acc, BN, ASM, EVEN_K)
    return acc


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
def _scales(s_ptr, sb, offs_n, N, k0, k_hi, stride_sn, BK: tl.constexpr, BODY: tl.constexpr, EVEN_K: tl.constexpr,
            FOLD: tl.constexpr = 0):
    """(this K tile's e8m0 bytes, the next iteration's). fma, and the fp8 body's fold: loaded a tile ahead by hand (sb,
    carried, is this tile's): bytes too narrow for the pipeliner's async copies (the fold's prefill tiles: 4 bytes a
    row over 8 warps, 2 a thread), each iteration would wait for them. swap: loaded in
    the iteration, because a loop-carried operand stops Triton from placing the dequantized tile in the wgmma A
    layout at the source (it would go through shared memory as bf16 instead: checked in the sm_90 TTGIR)."""
    return _tile_scales(s_ptr, sb, offs_n, N, k0, k_hi, stride_sn, BK, BODY == "fma" or FOLD != 0, EVEN_K)


@step_jit
def gate_up_kernel(x_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, h_ptr, part_ptr, cnt_ptr, rw_ptr, sorted_ptr,
                   block_expert_ptr, M, NB, D, I, TOPK, limit,
                   stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_h, stride_ps, stride_pg,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   SPLIT: tl.constexpr, G: tl.constexpr, QUANT_H: tl.constexpr, WEIGHT_H: tl.constexpr,
                   CLAMP: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
                   F32: tl.constexpr, BODY: tl.constexpr, STAGES: tl.constexpr, EVEN_K: tl.constexpr = False,
                   FINISH: tl.constexpr = False, PDL: tl.constexpr = False, xs_ptr=None, hs_ptr=None,
                   HDT: tl.constexpr = None, FOLD: tl.constexpr = 0):
    """`moe._gate_up_kernel` with the swap / fma / fp8 body: x W1^T and x W3^T for BM sorted rows of one expert x BN
    columns over this program's K share, the x tile loaded once per K tile for both. fp8: x is the prologue's e4m3
    bytes (K32 order) with their scales xs, and h is written the same way (bytes into h, scales into hs), rounded to
    HDT (x's dtype) first as the other bodies round it."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    expert, first, rows, a_idx, valid, offs_n = _expert_block(block_expert_ptr, sorted_ptr, NB, I, M, BM,
                                                             BN, GROUP_M)
    if expert < 0:
        return
    DT = x_ptr.dtype.element_ty if HDT is None else HDT
    tok = tl.where(valid, a_idx // TOPK, 0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    w1_ptr += expert * stride_we
    w3_ptr += expert * stride_we
    s1_ptr += expert * stride_se
    s3_ptr += expert * stride_se
    acc_g = tl.zeros([BN, BM], dtype=ACC)
    acc_u = tl.zeros([BN, BM], dtype=ACC)
    k_lo, k_hi = _k_range(D, BK, SPLIT)
    sb1 = _fp4_scales(s1_ptr, offs_n, I, k_lo, k_hi, stride_sn, BK, EVEN_K)
    sb3 = _fp4_scales(s3_ptr, offs_n, I, k_lo, k_hi, stride_sn, BK, EVEN_K)
    r = tl.arange(0, BM)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        sb1, nsb1 = _scales(s1_ptr, sb1, offs_n, I, k0, k_hi, stride_sn, BK, BODY, EVEN_K, FOLD)
        sb3, nsb3 = _scales(s3_ptr, sb3, offs_n, I, k0, k_hi, stride_sn, BK, BODY, EVEN_K, FOLD)
        kmask = k0 + offs_k < D
        if BODY == "fp8":
            acc_g = _fp8_tile(w1_ptr, sb1, offs_n, I, k0, D, stride_wn, x_ptr, xs_ptr, tok, valid, acc_g, BN, BK, G,
                              ASM, EVEN_K, FOLD)
            acc_u = _fp8_tile(w3_ptr, sb3, offs_n, I, k0, D, stride_wn, x_ptr, xs_ptr, tok, valid, acc_u, BN, BK, G,
                              ASM, EVEN_K, FOLD)
        elif BODY == "swap":
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
    if BODY == "fp8":
        acc_g *= FP8_SHIFT
        acc_u *= FP8_SHIFT
    _gate_up_out(tl.trans(acc_g), tl.trans(acc_u), h_ptr, part_ptr, cnt_ptr, rw_ptr, rows, offs_n, a_idx,
                 valid, I, limit, stride_h, stride_ps, stride_pg, BM, BN, SPLIT, G, QUANT_H, WEIGHT_H, CLAMP,
                 ASM and BODY != "fp8", ACC, DT, FINISH, hs_ptr, BODY == "fp8")


@step_jit
def down_kernel(h_ptr, w2_ptr, s2_ptr, y_ptr, sorted_ptr, block_expert_ptr,
                M, NB, D, I,
                stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_y, stride_ys,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr,
                G: tl.constexpr, QUANT_A: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr,
                F32: tl.constexpr, BODY: tl.constexpr, STAGES: tl.constexpr, EVEN_K: tl.constexpr = False,
                PDL: tl.constexpr = False, hs_ptr=None, FOLD: tl.constexpr = 0):
    """`moe._down_kernel` with the swap / fma / fp8 body: h W2^T for BM sorted rows of one expert x BN columns. fp8: h
    is the gate-up epilogue's e4m3 bytes (K32 order) with their scales hs (QUANT_A is never set with it)."""
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
    sb = _fp4_scales(s2_ptr, offs_n, D, k_lo, k_hi, stride_sn, BK, EVEN_K)
    r = tl.arange(0, BM)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        sb, nsb = _scales(s2_ptr, sb, offs_n, D, k0, k_hi, stride_sn, BK, BODY, EVEN_K, FOLD)
        kmask = k0 + offs_k < I
        if BODY == "fp8":
            acc = _fp8_tile(w2_ptr, sb, offs_n, D, k0, I, stride_wn, h_ptr, hs_ptr, rows.to(tl.int64), rows >= 0, acc,
                            BN, BK, G, ASM, EVEN_K, FOLD)
        elif BODY == "swap":
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
    if BODY == "fp8":
        acc *= FP8_SHIFT
    _down_out(tl.trans(acc), y_ptr, a_idx, valid, offs_n, D, stride_y, stride_ys, ASM and BODY != "fp8")

