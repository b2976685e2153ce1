"""The lightning indexer in two launches (the reference is ops/indexer.py): paged/sparse MQA logits and a radix top-k.

1. `_logits_kernel`, programs over (token block, split). A token block's tokens of one row share each key tile: the
   program walks the entry tiles j < max visible of its tokens (tile = pid_split, + splits, ...: the loop bound is read
   from device memory, so the work follows `visible`, not E_max), reads the records straight from the pool through
   the block table, dequantizes them in registers (plain values, MXFP4 = e2m1 nibbles x ue8m0 per 32, FP8 row = e4m3 x
   one float32 scale), computes keys [BLOCK_E, d] x q^T [d, tokens*heads] (the heads on the N side, so that the sum
   over heads is a row reduction), ReLU, weights by w, sums over heads and stores float32 scores for j < visible[t]
   only. With `candidates` each program takes one token and walks its candidate blocks instead (sparse MQA logits);
   with `publish` it also stores the block maxima (the newest block forced to +inf) for j < visible.
2. `_select_kernel`, one program per token, over the 64-bit keys (order-preserving 32 bits of the float32 score <<
   ID_BITS | (ID_MASK - entry id)). With `Config.select_hist` (a step of <= HIST_ROWS tokens) launch 1
   has also counted each token's scores in 4096 bins (the top 12 key bits; global atomics spread over its programs):
   the select reads the counts, finds the bin of the k-th largest key, makes ONE pass that puts the keys above that
   bin among the picks and the bin's own keys in a scratch row, and radix-selects the missing picks among the bin's
   keys in registers (a bin of more than `select_cap` keys, e.g. many equal scores, takes the plain radix instead);
   it zeroes the counts again for the next launch. The plain radix: per digit (`Config.select_digit` bits, from the
   top) one pass over the token's scores (or, with `Config.select_resident`, over its keys kept in registers when the
   row fits one block) builds a histogram of the keys that still match the chosen prefix and fixes the next digit of
   the k-th largest key; it stops as soon as every key matching the prefix is taken. Either way the picked keys land
   in the output row (as scratch); the program sorts them (descending, `tl.sort`; with `Config.select_narrow`, 256
   wide when there are that few picks) and writes the entry ids, -1 past the picks. Ties therefore go to the lower
   entry id exactly as ops.indexer.ordered_keys orders them. The same kernel picks the published candidate blocks
   from the block maxima (no bins there).

Precision: scores accumulate in float32 (float64 for float64 queries: the CPU interpreter's exactness runs) and are
rounded to float32 before the selection, as the reference's ordered_keys does. Decoded keys are rounded to the
query dtype first (bf16 on GPU), as the reference decodes them. The interpreter takes bf16 / fp8 dots through fp32
(its bf16 tl.dot is wrong, see ops/kernels/__init__.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..env import get as env_get
from ..indexer import Entries, KeyPool
from ..precision import hi_lo
from . import cdiv, next_pow2, step_jit
from .finish import cast_rounded
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .split_grid import FLOATS, TL_DTYPES, ArrivalCounters, last_to_arrive, runs_here

FORMATS = {"plain": 0, "mxfp4": 1, "fp8_row": 2}
SCORE_BUDGET = 256 << 20  # bytes of float32 scores per launch pair: longer prefills run a chunk of tokens at a time
MAX_ID_BITS = 24  # entry ids < 2^24 (64M-token contexts at ratio 4): 32 + 24 key bits fit the int64 radix shifts
HIST_BINS = 4096  # score bins of Config.select_hist (_score_bin: the top 12 of the 32 order-preserving bits)
HIST_ROWS = 256  # tokens a launch pair can bin (4 MiB of int32 counts per device, left zeroed by the select)
_HIST = ArrivalCounters(HIST_ROWS * HIST_BINS)
_SPLIT_ARRIVALS = ArrivalCounters(HIST_ROWS)  # the split select's per-token arrivals (binned steps: <= HIST_ROWS)
SPLIT_ENV = "V4SERVE_SELECT_SPLIT"  # programs a token for the decode configs' binned select ("1": one; A/B runs)


@dataclass(frozen=True)
class Config:
    block_t: int  # tokens per logits program (a power of two; 1 with candidates)
    block_e: int  # entries per key tile (a power of two, a multiple of the candidate block)
    split: int = 0  # logits programs per token block along the entries; 0 = enough to fill the GPU
    num_warps: int = 4
    num_stages: int = 2
    select_block: int = 2048  # scores per step of the select passes
    select_warps: int = 8
    # The plain radix (select_hist off, or a crowded bin). Bits per radix digit: narrower digits take more passes, each
    # with a cheaper histogram (tl.histogram: log2(bins) ballots plus bins/32 x log2(bins) bitwise ops a register of
    # keys); sm_90 SASS of a pass over 16 keys a thread: ~1,300 instructions at 8 bits, ~950 at 5. H200, 16K entries,
    # the plain select alone: 5-bit digits on 16384-position blocks 51.7 us (B=1) / 55.0 (B=32) against 8-bit on 8192
    # 57.7 / 67.9 (`indexer.py --select-sweep`)
    select_digit: int = 8
    # tokens with at most `_small_sort(K)` picks sort that many slots, not K_PAD (H200: 200 visible 16.5 -> 15.4 us;
    # GPU-tested, off in the GPU configs, which the score bins now serve)
    select_narrow: bool = True
    # a row of <= select_block positions: its keys computed once and kept in registers through the radix passes
    # (otherwise each pass reloads the scores and redoes the 64-bit key arithmetic); spills at 8192 positions on 16
    # warps, none at 4096 (H200, 4096-position blocks: 200 visible 16.5 -> 10.2 us, 4000 visible 30.0 -> 17.4;
    # GPU-tested, off in the GPU configs, which the score bins now serve)
    select_resident: bool = True
    # steps of up to HIST_ROWS tokens: the logits launch also counts each token's scores (entries or candidate
    # slots) in 4096 bins (global atomics spread over its programs); the select then finds the k-th largest key's bin
    # from the counts and makes one pass over the row, radix-selecting only within that bin when it holds <= select_cap
    # keys (else the plain radix). Off: the plain radix everywhere
    select_hist: bool = True
    select_cap: int = 4096
    # False: the picks in the order the select found them (the keys above the k-th key's score bin by position, then
    # that bin's picks by position; the plain radix: by position), ids only, no bitonic sort of K_PAD 64-bit keys. The
    # same set, deterministic (ordered compactions, no atomics), in an order that depends on the row alone. Off in the
    # GPU configs (H200, 16K entries, logits + select, `indexer.py --binned-sweep`, nineteenth session: 29.3 -> 26.6 us
    # at batch 1, 166 -> 163 at 32, 200 visible 13.6 -> 11.0, 4000 visible 16.2 -> 13.6); the interpreter's keep the
    # reference's order
    select_sorted: bool = True
    # programs a token for the binned select (a power of two; capped so that a step's programs fit the SMs once): each
    # takes a contiguous chunk of the row and the last to arrive finishes (`_select_split_kernel`); 1: one program
    select_split: int = 1


# --- logits ---------------------------------------------------------------------------------------------------------

@triton.jit
def _round_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32: the interpreter's own fp32 -> bf16 cast
    truncates (triton 3.6), where torch and the GPU round to nearest."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e2m1(code):
    """4-bit e2m1 codes -> fp32 values (bit 3 = sign; magnitudes 0 .5 1 1.5 2 3 4 6), exact."""
    mag = code & 7
    p2 = (((mag >> 1) + 125) << 23).to(tl.float32, bitcast=True)  # 2^((mag >> 1) - 2)
    v = tl.where(mag < 2, mag.to(tl.float32) * 0.5, ((mag & 1) + 2).to(tl.float32) * p2)
    return tl.where(code >= 8, -v, v)


@triton.jit
def _key_tile(data_ptr, prow, e_ok, stride_row, REC_ALIGN: tl.constexpr, BLOCK_E: tl.constexpr, D: tl.constexpr,
              FORMAT: tl.constexpr, KEY: tl.constexpr, DOT: tl.constexpr, RAW_FP8: tl.constexpr,
              ROUND_BF16: tl.constexpr):
    """Records at pool rows prow [BLOCK_E] -> (keys [BLOCK_E, D] in DOT, per-entry scale [BLOCK_E] for RAW_FP8).
    Keys pass through KEY, the dtype the reference decodes them to (ROUND_BF16: bf16 emulated in fp32)."""
    offs_d = tl.arange(0, D)
    # A record is aligned only as its stride is (REC_ALIGN: 4 B for 132-B FP8 rows and 68-B MXFP4 rows). Triton 3.6's
    # axis analysis credits prow = blk * EPB + ids % EPB with the divisibility of its aligned terms and vectorized
    # the record loads to 8 / 16 B ("misaligned address" on the H200): the hint states the offset's true alignment.
    rec = data_ptr + tl.multiple_of(prow.to(tl.int64) * stride_row, REC_ALIGN)
    base = rec[:, None]
    m2 = e_ok[:, None]
    scale = tl.full(prow.shape, 1.0, tl.float32)
    if FORMAT == 0:  # plain values
        x = tl.load(base + offs_d[None, :], mask=m2, other=0.0)
    elif FORMAT == 1:  # MXFP4: e2m1 codes (low nibble = even element), then one ue8m0 scale per 32
        byte = tl.load(base + tl.arange(0, D // 2)[None, :], mask=m2, other=0).to(tl.int32)  # each byte once
        v = tl.interleave(_e2m1(byte & 15), _e2m1(byte >> 4))  # [BLOCK_E, D]
        sb = tl.load(base + D // 2 + tl.arange(0, D // 32)[None, :], mask=m2, other=127).to(tl.int32)
        sc = tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)  # 2^(b-127); b = 0: subnormal
        x = tl.reshape(tl.reshape(v, [BLOCK_E, D // 32, 32]) * sc[:, :, None], [BLOCK_E, D])
    else:  # FP8 row: e4m3 values, then one float32 scale
        f8 = tl.load(base + offs_d[None, :], mask=m2, other=0).to(tl.float8e4nv, bitcast=True)
        s = tl.load((rec + D).to(tl.pointer_type(tl.float32)), mask=e_ok, other=0.0)
        if RAW_FP8:  # the scale is applied after the dot (FP8 tensor cores)
            x = f8
            scale = s
        else:
            x = f8.to(tl.float32) * s[:, None]
    if RAW_FP8:
        k = x.to(DOT)
    elif ROUND_BF16:
        k = _round_bf16(x.to(tl.float32)).to(DOT)
    else:
        k = x.to(KEY).to(DOT)
    return k, scale


@triton.jit
def _score_tile(data_ptr, bt_row, n_cols, trash, stride_btc, stride_row, ids, offs_p, e_ok, tile, qt, wm, seg, vis,
                offs_t, out_ptr, stride_ot, blk_ptr, stride_bo, hist_ptr, REC_ALIGN: tl.constexpr,
                D: tl.constexpr, RATIO: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_E: tl.constexpr, H_PAD: tl.constexpr, CB: tl.constexpr, FORMAT: tl.constexpr,
                PUBLISH: tl.constexpr, RAW_FP8: tl.constexpr, KEY: tl.constexpr, DOT: tl.constexpr,
                ACC: tl.constexpr, ROUND_BF16: tl.constexpr, HIST: tl.constexpr):
    """Entries `ids` [BLOCK_E] (at score positions offs_p) of one row against the block's q rows: store the scores
    of each token's visible entries (with PUBLISH, also the block maxima; with HIST, count them in each token's
    histogram of score bins)."""
    EPB: tl.constexpr = BLOCK_SIZE // RATIO
    NBT: tl.constexpr = BLOCK_E // CB
    col = tl.minimum(ids * RATIO // BLOCK_SIZE, n_cols - 1)
    blk = tl.load(bt_row + col * stride_btc, mask=e_ok, other=-1).to(tl.int64)
    blk = tl.where(blk < 0, trash, blk)  # unallocated: the trash block, as the reference addresses it
    keys, ks = _key_tile(data_ptr, blk * EPB + ids % EPB, e_ok, stride_row, REC_ALIGN, BLOCK_E, D, FORMAT, KEY, DOT,
                         RAW_FP8, ROUND_BF16)
    s = tl.dot(keys, tl.trans(qt), input_precision="ieee", out_dtype=ACC)  # [BLOCK_E, BLOCK_T * H_PAD]
    s = tl.maximum(s, 0.0) * wm[None, :]
    sc = tl.sum(tl.reshape(s, [BLOCK_E, BLOCK_T, H_PAD]), axis=2)  # [BLOCK_E, BLOCK_T]: heads summed
    if RAW_FP8:
        sc = sc * ks[:, None].to(ACC)
    sc = sc.to(tl.float32)
    keep = e_ok[:, None] & seg[None, :] & (ids[:, None] < vis[None, :])
    tl.store(out_ptr + offs_t.to(tl.int64)[None, :] * stride_ot + offs_p[:, None], sc, mask=keep)
    if HIST:
        tl.atomic_add(hist_ptr + offs_t.to(tl.int64)[None, :] * 4096 + _score_bin(sc), 1, mask=keep, sem="relaxed")
    if PUBLISH:  # block maxima over the visible entries; the block of entry visible-1 is forced in
        bm = tl.max(tl.reshape(tl.where(keep, sc, float("-inf")), [NBT, CB, BLOCK_T]), axis=1)
        offs_b = tile * NBT + tl.arange(0, NBT)
        newest = tl.maximum(vis - 1, 0) // CB
        bm = tl.where(offs_b[:, None] == newest[None, :], float("inf"), bm)
        tl.store(blk_ptr + offs_t.to(tl.int64)[None, :] * stride_bo + offs_b[:, None], bm,
                 mask=seg[None, :] & (offs_b[:, None] * CB < vis[None, :]))


@step_jit
def _logits_kernel(q_ptr, qs_ptr, w_ptr, data_ptr, bt_ptr, row_ptr, vis_ptr, cand_ptr, out_ptr, blk_ptr, hist_ptr,
                   T, n_cols, trash, n_cand,
                   stride_qt, stride_qh, stride_qd, stride_qst, stride_qsh, stride_wt, stride_wh, stride_row,
                   stride_btr, stride_btc, stride_ct, stride_ot, stride_bo,
                   H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr, RATIO: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, CB: tl.constexpr,
                   FORMAT: tl.constexpr, CAND: tl.constexpr, PUBLISH: tl.constexpr, QFP8: tl.constexpr,
                   RAW_FP8: tl.constexpr, KEY: tl.constexpr, DOT: tl.constexpr, ACC: tl.constexpr,
                   ROUND_BF16: tl.constexpr, REC_ALIGN: tl.constexpr = 1, HIST: tl.constexpr = False,
                   W_SCALED: tl.constexpr = False, ws_hi=1.0, ws_lo=0.0, W_ROUND: tl.constexpr = False,
                   W_DT: tl.constexpr = tl.bfloat16, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    NBT: tl.constexpr = BLOCK_E // CB  # candidate blocks per tile
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    n_split = tl.num_programs(1)
    t0 = pid_t * BLOCK_T
    offs_t = t0 + tl.arange(0, BLOCK_T)
    t_ok = offs_t < T
    rows = tl.load(row_ptr + offs_t, mask=t_ok, other=-1)
    vis = tl.load(vis_ptr + offs_t, mask=t_ok, other=0)
    # the q rows of the block: m = (token, head), heads padded to H_PAD with zero q and w (no contribution)
    offs_m = tl.arange(0, BLOCK_T * H_PAD)
    tm = t0 + offs_m // H_PAD
    hm = offs_m % H_PAD
    offs_d = tl.arange(0, D)
    t_end = tl.minimum(t0 + BLOCK_T, T)
    cur = t0
    while cur < t_end:  # runs of tokens of one row (one run unless the block straddles rows)
        r = tl.load(row_ptr + cur)
        seg_end = tl.min(tl.where(t_ok & (offs_t > cur) & (rows != r), offs_t, t_end))
        seg = (offs_t >= cur) & (offs_t < seg_end)
        m_ok = (hm < H) & (tm >= cur) & (tm < seg_end)
        qt = tl.load(q_ptr + tm.to(tl.int64)[:, None] * stride_qt + hm[:, None] * stride_qh
                     + offs_d[None, :] * stride_qd, mask=m_ok[:, None], other=0.0).to(DOT)
        wm = tl.load(w_ptr + tm.to(tl.int64) * stride_wt + hm * stride_wh, mask=m_ok, other=0.0)
        if W_ROUND:  # float32 sums of the head weights' GEMM, rounded to their own dtype as they load
            wm = cast_rounded(wm.to(tl.float32), W_DT, False).to(tl.float32)
        wm = wm.to(ACC)
        if W_SCALED:  # ops.indexer.weighted_heads: the scale's two float32 parts summed in ACC
            wm = wm * (tl.cast(ws_hi, ACC) + tl.cast(ws_lo, ACC))
        if QFP8:  # relu(s q8 . k) = s relu(q8 . k) for the positive per-row scale s: fold it into the head weight
            wm = wm * tl.load(qs_ptr + tm.to(tl.int64) * stride_qst + hm * stride_qsh, mask=m_ok, other=0.0).to(ACC)
        v_max = tl.max(tl.where(seg, vis, 0))  # the run's longest visible prefix: the loop bound, from memory
        if CAND:
            n_tiles = tl.cdiv(n_cand, NBT)
        else:
            n_tiles = tl.cdiv(v_max, BLOCK_E)
        bt_row = bt_ptr + r.to(tl.int64) * stride_btr
        for tile in range(pid_s, n_tiles, n_split):
            offs_p = tile * BLOCK_E + tl.arange(0, BLOCK_E)  # positions in the score row
            if CAND:  # slot p holds entry cand[p // CB] * CB + p % CB
                cb = tl.load(cand_ptr + t0.to(tl.int64) * stride_ct + offs_p // CB, mask=offs_p // CB < n_cand,
                             other=-1)
                ids = cb.to(tl.int64) * CB + offs_p % CB
                e_ok = (cb >= 0) & (ids < v_max)
                if tl.max(e_ok.to(tl.int32)) > 0:  # a tile of empty candidate slots costs one load
                    _score_tile(data_ptr, bt_row, n_cols, trash, stride_btc, stride_row, ids, offs_p, e_ok, tile, qt,
                                wm, seg, vis, offs_t, out_ptr, stride_ot, blk_ptr, stride_bo, hist_ptr, REC_ALIGN, D,
                                RATIO, BLOCK_SIZE, BLOCK_T, BLOCK_E, H_PAD, CB, FORMAT, PUBLISH, RAW_FP8, KEY, DOT,
                                ACC, ROUND_BF16, HIST)
            else:  # no branch in the dense loop: the key loads pipeline across tiles
                ids = offs_p.to(tl.int64)
                _score_tile(data_ptr, bt_row, n_cols, trash, stride_btc, stride_row, ids, offs_p, ids < v_max, tile,
                            qt, wm, seg, vis, offs_t, out_ptr, stride_ot, blk_ptr, stride_bo, hist_ptr, REC_ALIGN, D,
                            RATIO, BLOCK_SIZE, BLOCK_T, BLOCK_E, H_PAD, CB, FORMAT, PUBLISH, RAW_FP8, KEY, DOT, ACC,
                            ROUND_BF16, HIST)
        cur = seg_end


# --- select ---------------------------------------------------------------------------------------------------------

@triton.jit
def _keys(s_ptr, cand_ptr, t, p0, n_pos, vis, stride_st, stride_ct, CAND: tl.constexpr, CB: tl.constexpr,
          ID_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Positions p0.. of token t's score row -> (64-bit keys, valid): the order-preserving bits of the float32 score,
    then ID_MASK - entry id (ties go to the lower id), as ops.indexer.ordered_keys."""
    ID_MASK: tl.constexpr = (1 << ID_BITS) - 1
    offs = p0 + tl.arange(0, BLOCK)
    if CAND:
        cb = tl.load(cand_ptr + t * stride_ct + offs // CB, mask=offs < n_pos, other=-1)
        ids = cb.to(tl.int64) * CB + offs % CB
        ok = (cb >= 0) & (ids < vis)
    else:
        ids = offs.to(tl.int64)
        ok = offs < n_pos
    sc = tl.load(s_ptr + t * stride_st + offs, mask=ok, other=0.0)
    key = ((_ordered(sc).to(tl.int64) + 2147483648) << ID_BITS) | (ID_MASK - ids)
    return key, ok


@triton.jit
def _ordered(sc):
    """float32 scores -> their order-preserving int32 bits (-0.0 ties with +0.0), as ops.indexer.ordered_keys."""
    bits = tl.where(sc == 0.0, 0, sc.to(tl.int32, bitcast=True))
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _score_bin(sc):
    """float32 scores -> their bin of HIST_BINS = 4096: the top 12 of the unsigned order-preserving bits (sign,
    exponent, 3 mantissa bits), i.e. _keys' 64-bit key >> (ID_BITS + 20); monotone in the score."""
    return (_ordered(sc) >> 20) + 2048


@step_jit
def _select_kernel(s_ptr, vis_ptr, cand_ptr, out_ptr, hist_ptr, scratch_ptr, n_cand, stride_st, stride_ct, stride_ot,
                   K: tl.constexpr, K_PAD: tl.constexpr, CAND: tl.constexpr, CB: tl.constexpr, DIV: tl.constexpr,
                   ID_BITS: tl.constexpr, BLOCK: tl.constexpr, DIGIT: tl.constexpr = 8, SMALL: tl.constexpr = 0,
                   RESIDENT: tl.constexpr = False, HIST: tl.constexpr = False, CAP: tl.constexpr = 1,
                   SORT: tl.constexpr = True, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    ID_MASK: tl.constexpr = (1 << ID_BITS) - 1
    t = tl.program_id(0).to(tl.int64)
    vis = tl.load(vis_ptr + t)
    row = out_ptr + t * stride_ot
    if CAND:
        n_pos = n_cand * CB
    else:
        n_pos = (vis + DIV - 1) // DIV  # DIV = 1: entries; DIV = block: the blocks holding visible entries
    if HIST:  # the logits launch counted the row's scores per bin: the k-th largest key's bin without a pass
        b, gt, eq, kk = _kth_bin(hist_ptr, t, K)
        tl.store(hist_ptr + t * 4096 + tl.arange(0, 4096), tl.zeros([4096], tl.int32))  # zeroed for the next launch
        binned = eq <= CAP  # else a bin crowded by equal or close scores: the plain radix
        if binned:
            kk = _select_binned(s_ptr, cand_ptr, t, n_pos, vis, row, scratch_ptr + t * CAP, stride_st, stride_ct, b,
                                gt, eq, kk, K, CAND, CB, ID_BITS, BLOCK, DIGIT, CAP)
    else:
        kk = tl.full([], 0, tl.int32)
        binned = False
    if not binned:
        kk = _select_plain(s_ptr, cand_ptr, t, n_pos, vis, row, stride_st, stride_ct, K, CAND, CB, ID_BITS, BLOCK,
                           DIGIT, RESIDENT)
    tl.debug_barrier()  # this program's scratch stores precede its loads
    if not SORT:
        _ids_of_picks(row, kk, K, K_PAD, ID_MASK)
    elif SMALL < K_PAD and kk <= SMALL:  # few picks (short contexts; V4.1's 2048 candidate blocks early on)
        _sort_picks(row, kk, K, SMALL, ID_MASK)
        slots = tl.arange(0, K_PAD)
        tl.store(row + slots, -1, mask=(slots >= SMALL) & (slots < K))
    else:
        _sort_picks(row, kk, K, K_PAD, ID_MASK)


@triton.jit
def _kth_bin(hist_ptr, t, K: tl.constexpr):
    """Token t's score counts per bin -> (b: the bin of its k-th largest key, gt: its keys above b, all picks, eq: its
    keys in b, of which kk - gt are picks, kk: its picks)."""
    hb = tl.arange(0, 4096)
    h = tl.load(hist_ptr + t * 4096 + hb)
    total = tl.sum(h)
    kk = tl.minimum(total, K)
    b = tl.max(tl.where(total - tl.cumsum(h, 0) + h >= kk, hb, 0))  # the last bin with >= kk keys at or above
    gt = tl.sum(tl.where(hb > b, h, 0))
    eq = tl.sum(tl.where(hb == b, h, 0))
    return b, gt, eq, kk


@step_jit
def _select_split_kernel(s_ptr, vis_ptr, cand_ptr, out_ptr, hist_ptr, scratch_ptr, count_ptr, arrive_ptr, n_cand,
                         stride_st, stride_ct, stride_ot, K: tl.constexpr, K_PAD: tl.constexpr, CAND: tl.constexpr,
                         CB: tl.constexpr, ID_BITS: tl.constexpr, BLOCK: tl.constexpr, DIGIT: tl.constexpr,
                         CAP: tl.constexpr, P: tl.constexpr, SORT: tl.constexpr = True, PDL: tl.constexpr = False):
    """The binned select of `_select_kernel` over P programs a token (`Config.select_split`): program c takes the
    c-th contiguous chunk of the row, puts its keys above the k-th largest key's bin (from launch 1's counts) and
    its keys in that bin into its own scratch slots (in position order) and stores both counts; the last of the P to
    arrive concatenates the chunks in chunk order (so the picks and their order are the one-program kernel's), radix-
    selects within the bin, writes the row (ids, or keys it then sorts) and zeroes the counts and the arrival
    counter for the next launch. A bin of more than CAP keys: the last program runs the plain radix over the row."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    ID_MASK: tl.constexpr = (1 << ID_BITS) - 1
    SLOTS: tl.constexpr = K_PAD + CAP  # a chunk's scratch: its keys above the bin (< K of them), then its bin's
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    vis = tl.load(vis_ptr + t)
    row = out_ptr + t * stride_ot
    if CAND:
        n_pos = n_cand * CB
    else:
        n_pos = vis
    b, gt, eq, kk = _kth_bin(hist_ptr, t, K)
    binned = eq <= CAP
    if binned:
        span = tl.cdiv(tl.cdiv(n_pos, P), BLOCK) * BLOCK
        lo = c * span
        hi = tl.minimum(lo + span, n_pos)
        own = scratch_ptr + (t * P + c) * SLOTS
        n_above, n_at = _partition(s_ptr, cand_ptr, t, lo, hi, vis, own, own + K_PAD, b, stride_st, stride_ct, CAND,
                                   CB, ID_BITS, BLOCK)
        tl.store(count_ptr + (t * P + c) * 2, n_above)
        tl.store(count_ptr + (t * P + c) * 2 + 1, n_at)
    if last_to_arrive(arrive_ptr + t, P):
        tl.store(arrive_ptr + t, 0)
        tl.store(hist_ptr + t * 4096 + tl.arange(0, 4096), tl.zeros([4096], tl.int32))
        if binned:
            chunk = tl.arange(0, P)
            area = scratch_ptr + t * P * SLOTS
            n_above = tl.load(count_ptr + (t * P + chunk) * 2, cache_modifier=".cg")
            n_at = tl.load(count_ptr + (t * P + chunk) * 2 + 1, cache_modifier=".cg")
            slots = tl.arange(0, K_PAD)
            key = _concat(area, n_above, slots, gt, P, SLOTS)
            _put(row + slots, key, slots < gt, SORT, ID_MASK)
            offs = tl.arange(0, CAP)
            cok = offs < eq
            ck = _concat(area + K_PAD, n_at, offs, eq, P, SLOTS)
            sel, kk = _bin_picks(ck, cok, b, gt, eq, kk, K, ID_BITS, DIGIT)
            _put(row + gt + tl.cumsum(sel.to(tl.int32), 0) - 1, ck, sel, SORT, ID_MASK)
            if SORT:
                tl.debug_barrier()  # this program's key stores precede its loads
                _sort_picks(row, kk, K, K_PAD, ID_MASK)
            else:
                tl.store(row + slots, -1, mask=(slots >= kk) & (slots < K))
        else:
            kk = _select_plain(s_ptr, cand_ptr, t, n_pos, vis, row, stride_st, stride_ct, K, CAND, CB, ID_BITS, BLOCK,
                               DIGIT, False)
            tl.debug_barrier()  # this program's key stores precede its loads
            if SORT:
                _sort_picks(row, kk, K, K_PAD, ID_MASK)
            else:
                _ids_of_picks(row, kk, K, K_PAD, ID_MASK)


@triton.jit
def _concat(area, counts, slots, n, P: tl.constexpr, SLOTS: tl.constexpr):
    """Slots [0, n) of the P chunks' key lists laid end to end in chunk order (chunk c's list at area + c * SLOTS,
    counts[c] long) -> their keys (0 past n)."""
    ends = tl.cumsum(counts, 0)
    chunk = tl.sum((slots[:, None] >= ends[None, :]).to(tl.int32), 1)  # the chunk holding each slot
    first = tl.sum(tl.where(tl.arange(0, P)[None, :] == chunk[:, None], (ends - counts)[None, :], 0), 1)
    return tl.load(area + chunk.to(tl.int64) * SLOTS + (slots - first), mask=slots < n, other=0,
                   cache_modifier=".cg")


@triton.jit
def _put(ptr, key, mask, SORT: tl.constexpr, ID_MASK: tl.constexpr):
    """Picked keys into the output row: as keys where the row is sorted next, else as their entry ids."""
    if SORT:
        tl.store(ptr, key, mask=mask)
    else:
        tl.store(ptr, ID_MASK - (key & ID_MASK), mask=mask)


@triton.jit
def _select_plain(s_ptr, cand_ptr, t, n_pos, vis, row, stride_st, stride_ct, K: tl.constexpr, CAND: tl.constexpr,
                  CB: tl.constexpr, ID_BITS: tl.constexpr, BLOCK: tl.constexpr, DIGIT: tl.constexpr,
                  RESIDENT: tl.constexpr):
    """The radix select over the row's n_pos positions, from the top digit: per digit one pass builds the histogram of
    the keys matching the prefix fixed so far; the picks land in row[:kk]. -> kk."""
    BINS: tl.constexpr = 1 << DIGIT
    STAGES: tl.constexpr = (32 + ID_BITS + DIGIT - 1) // DIGIT
    TOP: tl.constexpr = DIGIT * STAGES  # key bits, rounded up to whole digits
    bins = tl.arange(0, BINS)
    pref = tl.full([], 0, tl.int64)  # the digits of the k-th largest key fixed so far
    last_shift = tl.full([], TOP, tl.int64)
    need = tl.full([], 0, tl.int32)  # picks still to make among the keys that match the prefix
    kk = tl.full([], 0, tl.int32)
    done = tl.full([], 0, tl.int32)
    if RESIDENT and n_pos <= BLOCK:  # the row's keys computed once, kept in registers through every pass
        key, ok = _keys(s_ptr, cand_ptr, t, 0, n_pos, vis, stride_st, stride_ct, CAND, CB, ID_BITS, BLOCK)
        for stage in tl.static_range(STAGES):
            if done == 0:
                shift: tl.constexpr = TOP - DIGIT * (stage + 1)
                hist = _digit_hist(key, ok, pref, shift, DIGIT)
                kk, need, pref, done = _fix_digit(hist, bins, stage, kk, need, pref, K, BINS)
                last_shift = tl.full([], shift, tl.int64)
        # the picks: keys whose fixed digits are >= the prefix (exactly kk of them), in the output row as scratch
        sel = ok & ((key >> last_shift) >= pref)
        tl.store(row + tl.cumsum(sel.to(tl.int32), 0) - 1, key, mask=sel)
    else:
        for stage in tl.static_range(STAGES):
            if done == 0:
                shift: tl.constexpr = TOP - DIGIT * (stage + 1)
                hist = tl.zeros([BINS], tl.int32)
                for p0 in range(0, n_pos, BLOCK):
                    key, ok = _keys(s_ptr, cand_ptr, t, p0, n_pos, vis, stride_st, stride_ct, CAND, CB, ID_BITS,
                                    BLOCK)
                    hist += _digit_hist(key, ok, pref, shift, DIGIT)
                kk, need, pref, done = _fix_digit(hist, bins, stage, kk, need, pref, K, BINS)
                last_shift = tl.full([], shift, tl.int64)
        count = tl.full([], 0, tl.int32)
        for p0 in range(0, n_pos, BLOCK):
            key, ok = _keys(s_ptr, cand_ptr, t, p0, n_pos, vis, stride_st, stride_ct, CAND, CB, ID_BITS, BLOCK)
            sel = ok & ((key >> last_shift) >= pref)
            pos = count + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(row + pos, key, mask=sel)
            count += tl.sum(sel.to(tl.int32))
    return kk


@triton.jit
def _select_binned(s_ptr, cand_ptr, t, n_pos, vis, row, crow, stride_st, stride_ct, b, gt, eq, kk, K: tl.constexpr,
                   CAND: tl.constexpr, CB: tl.constexpr, ID_BITS: tl.constexpr, BLOCK: tl.constexpr,
                   DIGIT: tl.constexpr, CAP: tl.constexpr):
    """The picks of a row (its entries, or its candidate slots) whose k-th largest key lies in score bin b, with gt
    keys above that bin and eq <= CAP in it: one pass puts the keys above the bin in row[:gt] and the bin's keys in
    crow[:eq]; a radix select over the bin's keys (in registers) then appends the kk - gt largest of them. -> kk (the
    picks in row[:kk])."""
    _partition(s_ptr, cand_ptr, t, 0, n_pos, vis, row, crow, b, stride_st, stride_ct, CAND, CB, ID_BITS, BLOCK)
    tl.debug_barrier()  # the bin's keys stored by every thread before they are read back
    offs = tl.arange(0, CAP)
    cok = offs < eq
    ck = tl.load(crow + offs, mask=cok, other=0, cache_modifier=".cg")
    sel, kk = _bin_picks(ck, cok, b, gt, eq, kk, K, ID_BITS, DIGIT)
    tl.store(row + gt + tl.cumsum(sel.to(tl.int32), 0) - 1, ck, mask=sel)
    return kk


@triton.jit
def _partition(s_ptr, cand_ptr, t, lo, hi, vis, above_ptr, at_ptr, b, stride_st, stride_ct, CAND: tl.constexpr,
               CB: tl.constexpr, ID_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Positions [lo, hi) of token t's row, in order: the keys above score bin b to above_ptr[0..], those in b to
    at_ptr[0..] -> (how many of each)."""
    n_above = tl.full([], 0, tl.int32)
    n_at = tl.full([], 0, tl.int32)
    for p0 in range(lo, hi, BLOCK):  # BLOCK < 2^16: both running counts in one int32 scan
        key, ok = _keys(s_ptr, cand_ptr, t, p0, hi, vis, stride_st, stride_ct, CAND, CB, ID_BITS, BLOCK)
        kb = key >> (ID_BITS + 20)  # _score_bin of the key's score
        above = ok & (kb > b)
        at = ok & (kb == b)
        both = tl.cumsum(above.to(tl.int32) + (at.to(tl.int32) << 16), 0)
        tl.store(above_ptr + n_above + (both & 0xFFFF) - 1, key, mask=above)
        tl.store(at_ptr + n_at + (both >> 16) - 1, key, mask=at)
        n_above += tl.sum(above.to(tl.int32))
        n_at += tl.sum(at.to(tl.int32))
    return n_above, n_at


@triton.jit
def _bin_picks(ck, cok, b, gt, eq, kk, K: tl.constexpr, ID_BITS: tl.constexpr, DIGIT: tl.constexpr):
    """The keys ck (valid where cok: the eq keys of score bin b, gt keys lying above it) -> (the kk - gt largest of
    them, kk): a radix select in registers over the bits below the bin."""
    # PAD low zero bits make the bits below the bin whole digits (keys < 2^56: no sign bit)
    REM: tl.constexpr = 20 + ID_BITS
    STAGES: tl.constexpr = (REM + DIGIT - 1) // DIGIT
    TOP: tl.constexpr = DIGIT * STAGES
    PAD: tl.constexpr = TOP - REM
    BINS: tl.constexpr = 1 << DIGIT
    bins = tl.arange(0, BINS)
    ck = ck << PAD
    need = kk - gt
    pref = b.to(tl.int64)
    done = (need == eq).to(tl.int32)
    last_shift = tl.full([], TOP, tl.int64)
    for stage in tl.static_range(STAGES):
        if done == 0:
            shift: tl.constexpr = TOP - DIGIT * (stage + 1)
            hist = _digit_hist(ck, cok, pref, shift, DIGIT)
            kk, need, pref, done = _fix_digit(hist, bins, 1, kk, need, pref, K, BINS)
            last_shift = tl.full([], shift, tl.int64)
    return cok & ((ck >> last_shift) >= pref), kk


@triton.jit
def _digit_hist(key, ok, pref, shift: tl.constexpr, DIGIT: tl.constexpr):
    """The histogram of the digit at `shift` over the valid keys whose higher digits are the prefix."""
    match = ok & ((key >> (shift + DIGIT)) == pref)
    return tl.histogram(((key >> shift) & ((1 << DIGIT) - 1)).to(tl.int32), 1 << DIGIT, mask=match)


@triton.jit
def _fix_digit(hist, bins, stage: tl.constexpr, kk, need, pref, K: tl.constexpr, BINS: tl.constexpr):
    """One radix pass's histogram of the keys matching the prefix -> (picks, picks still to make among the keys with
    the new prefix, the prefix with the k-th largest key's next digit, 1 when every key with it is a pick)."""
    if stage == 0:
        kk = tl.minimum(tl.sum(hist), K)
        need = kk
    ge = tl.sum(hist) - tl.cumsum(hist, 0) + hist  # keys with this digit or a larger one
    b = tl.max(tl.where(ge >= need, bins, 0))
    gt = tl.sum(tl.where(bins > b, hist, 0))
    eq = tl.sum(tl.where(bins == b, hist, 0))
    need = need - gt
    return kk, need, pref * BINS + b, (need == eq).to(tl.int32)


@triton.jit
def _sort_picks(row_ptr, kk, K, N: tl.constexpr, ID_MASK: tl.constexpr):
    """The kk picked keys at row_ptr[:kk] (scratch) -> their entry ids, descending by key, -1 in slots kk..N-1 (< K)."""
    slots = tl.arange(0, N)
    got = tl.load(row_ptr + slots, mask=slots < kk, other=-1, cache_modifier=".cg")
    got = tl.sort(got, descending=True)
    ids = tl.where(slots < kk, ID_MASK - (got & ID_MASK), -1)
    tl.store(row_ptr + slots, ids, mask=slots < K)


@triton.jit
def _ids_of_picks(row_ptr, kk, K, N: tl.constexpr, ID_MASK: tl.constexpr):
    """The kk picked keys at row_ptr[:kk] -> their entry ids in place (in the order found), -1 in slots kk..K-1."""
    slots = tl.arange(0, N)
    got = tl.load(row_ptr + slots, mask=slots < kk, other=-1, cache_modifier=".cg")
    tl.debug_barrier()  # every key read before any slot is overwritten
    tl.store(row_ptr + slots, tl.where(slots < kk, ID_MASK - (got & ID_MASK), -1), mask=slots < K)


# --- host side ------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(index).multi_processor_count


def _programs_to_fill(device: torch.device) -> int:
    """Logits programs that fill the device: eight per SM, so that each program walks few entry tiles (a block-table
    load, then the dependent record loads, a tile) and more of that latency overlaps (H200, 32 decode rows of 16K
    entries, logits + select: split 32 against the 9 of two per SM, 163 -> 122 us; `indexer.py --binned-sweep`,
    nineteenth session). A few on the CPU interpreter, to exercise the split."""
    if device.type != "cuda":
        return 3
    return 8 * _sm_count(device)


def _select_programs(t: int, split: int, device: torch.device) -> int:
    """Programs a token of the binned select: `split` (a power of two), halved until t tokens' programs fit the
    SMs once (the interpreter: `split`)."""
    if split & (split - 1) or split < 1:
        raise ValueError(f"select_split must be a power of two: {split}")
    if device.type == "cuda":
        while split > 1 and t * split > _sm_count(device):
            split //= 2
    return split


def _small_sort(k: int) -> int:
    """The narrower sort `_select_kernel` takes when a token has at most this many picks: a bitonic sort's cost
    follows its width, not the picks (2048 slots for V4.1's candidate blocks, 64 of them used at a 2K context)."""
    small = min(256, next_pow2(k) // 2)
    return small if small >= 2 else next_pow2(k)  # (>= K_PAD: no narrow sort)


def _alignment(stride_bytes: int) -> int:
    """The bytes every record start is aligned to (the pool itself is 16-B aligned): stride's lowest set bit, <= 16."""
    return min(16, stride_bytes & -stride_bytes) if stride_bytes else 16


def _pad16(n: int) -> int:
    return cdiv(n, 16) * 16


def _id_bits(n: int) -> int:
    """Key bits for entry ids < n, rounded up to a multiple of 8 (a constexpr: the exact count made each doubling of
    a context a new kernel variant, compiled while serving; with the default 8-bit radix digits the pass count is
    the same)."""
    return min(MAX_ID_BITS, -(-max(1, (n - 1).bit_length()) // 8) * 8)


def default_config(t: int, candidates: bool, on_gpu: bool) -> Config:
    """GPU: decode-sized steps take one token per program and small key tiles spread over the SMs, the select its
    score bins (both timed: benchmarks/kernels/indexer.py --binned-sweep); prefills take two tokens of a row per
    program (N = 2 x 64 heads) and 128-entry tiles (not swept). Both leave the picks unsorted. The interpreter gets
    small tiles (numpy cost, not speed) and the reference's order."""
    if not on_gpu:  # (a bin of up to 256 keys: small register arrays, numpy's cost per element)
        return Config(block_t=1 if candidates else 2, block_e=32, split=2, select_block=128, select_cap=256)
    if candidates or t <= 64:
        # select: the score bins, 4096-position steps on 16 warps, a bin of <= 1024 keys radix-selected in registers
        # (H200, 16K entries, top-512, logits + select: 67.2 -> 29.3 us at batch 1, 213 -> 166 us at 32, 200 visible
        # 13.4 us, 4000 visible 15.9 us; `indexer.py --binned-sweep`)
        return Config(block_t=1, block_e=64, num_warps=4, num_stages=2, select_block=4096, select_warps=16,
                      select_narrow=False, select_resident=False, select_cap=1024, select_sorted=False,
                      select_split=int(env_get(SPLIT_ENV) or 1))
    return Config(block_t=2, block_e=128, num_warps=8, num_stages=2, select_narrow=False, select_resident=False,
                  select_sorted=False)


def supports(q: torch.Tensor, w: torch.Tensor, keys: KeyPool, entries: Entries, candidates: torch.Tensor | None,
             publish: int, block: int, q_scale: torch.Tensor | None) -> bool:
    """True where the kernels run: plain / MXFP4 / FP8-row records of a power-of-two dim >= 16 (MXFP4: a multiple of
    32), float queries (FP8 ones only with a per-row scale, FP8-row keys and dim >= 32), power-of-two candidate
    blocks, entry ids below 2^24, everything on one device; CUDA without float64, or the CPU under Triton's
    interpreter."""
    codec = keys.codec
    if codec.kind not in FORMATS or q.dim() != 3 or q.shape[2] != codec.dim or w.shape != q.shape[:2]:
        return False
    d = codec.dim
    if d < 16 or d & (d - 1) or (codec.kind == "mxfp4" and d % 32):
        return False
    if codec.kind == "plain" and keys.data.dtype not in FLOATS:
        return False
    if q_scale is not None:
        if q.dtype != torch.float8_e4m3fn or codec.kind != "fp8_row" or q_scale.shape != q.shape[:2] or d < 32:
            return False
    elif q.dtype not in FLOATS:
        return False
    if (candidates is not None or publish) and (block < 1 or block & (block - 1) or block > 1024):
        return False
    if candidates is not None and publish:  # V4.1 never does both (one candidate source, later sources mask to it)
        return False
    if entries.max_entries >= 1 << MAX_ID_BITS or entries.block_size % entries.ratio:
        return False
    tensors = [w, keys.data, entries.block_table, entries.token_row, entries.visible]
    tensors += [t for t in (candidates, q_scale) if t is not None]
    if any(t.device != q.device for t in tensors):
        return False
    return runs_here(q if q.dtype in FLOATS else w)


def logits(q: torch.Tensor, w: torch.Tensor, keys: KeyPool, entries: Entries, scores: torch.Tensor, *,
           candidates: torch.Tensor | None = None, block: int = 1, block_scores: torch.Tensor | None = None,
           q_scale: torch.Tensor | None = None, config: Config | None = None, hist: torch.Tensor | None = None,
           w_scale: float = 1.0, w_dtype: torch.dtype | None = None) -> None:
    """Launch 1 over all tokens of q: float32 scores of each token's visible entries into scores [T, >= W] (W = E_max,
    or Kc * block with candidates: slot p holds entry candidates[t, p // block] * block + p % block); with
    block_scores [T, >= ceil(E_max / block)] also the block maxima (the newest block +inf) of the visible blocks; with
    hist (zeroed int32 [T * HIST_BINS]) also each token's count of scores per bin."""
    T, H, D = q.shape
    cfg = config or default_config(T, candidates is not None, q.is_cuda)
    cand, publish = candidates is not None, block_scores is not None
    cb = block if (cand or publish) else 1
    block_t = 1 if cand else cfg.block_t
    block_e = max(cfg.block_e, cb)
    if block_t & (block_t - 1) or block_e & (block_e - 1):
        raise ValueError(f"block sizes must be powers of two: {cfg}")
    n_cand = candidates.shape[1] if cand else 0
    on_gpu = q.is_cuda
    qfp8 = q_scale is not None
    raw_fp8 = qfp8 and on_gpu  # FP8 tensor-core dots; the interpreter takes them through fp32
    if on_gpu:
        dot = tl.float8e4nv if raw_fp8 else TL_DTYPES[q.dtype]
    else:  # the interpreter's bf16 / fp8 dots are wrong: fp32 (bf16 x bf16 products are exact there)
        dot = tl.float64 if q.dtype == torch.float64 else tl.float32
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    key_dt = torch.float32 if qfp8 else q.dtype  # the reference decodes keys to the (dequantized) query dtype
    n_tb = cdiv(T, block_t)
    tiles = cdiv(n_cand, block_e // cb) if cand else cdiv(entries.max_entries, block_e)
    split = max(1, min(cfg.split or cdiv(_programs_to_fill(q.device), n_tb), tiles))
    qs = q_scale if qfp8 else w
    cand_t = candidates if cand else entries.token_row
    bsc = block_scores if publish else scores
    bt, data = entries.block_table, keys.data
    if hist is not None and hist.numel() < T * HIST_BINS:
        raise ValueError("score bins need HIST_BINS counts per token")
    ws = hi_lo(w_scale)
    _logits_kernel[(n_tb, split)](
        q, qs, w, data, bt, entries.token_row, entries.visible, cand_t, scores, bsc,
        hist if hist is not None else scores,
        T, bt.shape[1], entries.num_blocks, n_cand,
        q.stride(0), q.stride(1), q.stride(2), qs.stride(0), qs.stride(1), w.stride(0), w.stride(1),
        data.stride(0), bt.stride(0), bt.stride(1), cand_t.stride(0), scores.stride(0), bsc.stride(0),
        H=H, H_PAD=max(next_pow2(H), 16 // block_t if on_gpu else 1), D=D, RATIO=entries.ratio,
        BLOCK_SIZE=entries.block_size, BLOCK_T=block_t, BLOCK_E=block_e, CB=cb, FORMAT=FORMATS[keys.codec.kind],
        CAND=cand, PUBLISH=publish, QFP8=qfp8, RAW_FP8=raw_fp8, KEY=TL_DTYPES[key_dt], DOT=dot, ACC=TL_DTYPES[acc],
        ROUND_BF16=key_dt == torch.bfloat16 and not on_gpu, REC_ALIGN=_alignment(data.stride(0)),
        HIST=hist is not None, W_SCALED=w_scale != 1.0, ws_hi=ws[0], ws_lo=ws[1],
        W_ROUND=w_dtype is not None and w_dtype != w.dtype, W_DT=TL_DTYPES[w_dtype or w.dtype], num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl_launch(scores))


def select(scores: torch.Tensor, visible: torch.Tensor, out: torch.Tensor, n_ids: int, *,
           candidates: torch.Tensor | None = None, block: int = 1, per: int = 1,
           config: Config | None = None, hist: torch.Tensor | None = None) -> None:
    """Launch 2: the top out.shape[1] of each token's scores -> out [T, K] int64 (descending, ties to the lower id,
    -1 past the picks; with `select_sorted` off the same picks in the order found). Dense rows: positions
    < ceil(visible / per) (per = 1: entries; per = block: the blocks of visible entries); with candidates: the slots
    of launch 1. n_ids bounds the ids (E_max, or the number of blocks).
    hist: launch 1's per-token score bins of these rows (entries or candidate slots, per = 1), which this launch
    zeroes again."""
    T, K = out.shape
    if T == 0 or K == 0:
        return
    cfg = config or default_config(T, candidates is not None, scores.is_cuda)
    if cfg.select_block & (cfg.select_block - 1):
        raise ValueError(f"block sizes must be powers of two: {cfg}")
    if not 2 <= cfg.select_digit <= 8:
        raise ValueError(f"select_digit is 2..8 bits: {cfg}")
    cand = candidates is not None
    cand_t = candidates if cand else visible
    K_pad = next_pow2(K)
    binned = hist is not None
    if binned and (per != 1 or hist.numel() < T * HIST_BINS or cfg.select_block >= 1 << 16
                   or cfg.select_cap & (cfg.select_cap - 1)):
        raise ValueError(f"score bins need entry rows (not blocks), HIST_BINS counts per token, select_block < 2^16 "
                         f"and a power-of-two select_cap: {cfg}")
    cap = cfg.select_cap if binned else 1
    programs = _select_programs(T, cfg.select_split, out.device) if binned else 1
    if programs > 1:
        scratch = torch.empty(T * programs * (K_pad + cap), dtype=torch.long, device=out.device)
        counts = torch.empty(T * programs * 2, dtype=torch.int32, device=out.device)
        _select_split_kernel[(T, programs)](
            scores, visible, cand_t, out, hist, scratch, counts, _SPLIT_ARRIVALS.get(out.device),
            candidates.shape[1] if cand else 0, scores.stride(0), cand_t.stride(0), out.stride(0), K=K, K_PAD=K_pad,
            CAND=cand, CB=block if cand else 1, ID_BITS=_id_bits(n_ids), BLOCK=cfg.select_block,
            DIGIT=cfg.select_digit, CAP=cap, P=programs, SORT=cfg.select_sorted, num_warps=cfg.select_warps,
            **pdl_launch(scores))
        return
    scratch = torch.empty(T, cap, dtype=torch.long, device=out.device) if binned else out
    _select_kernel[(T,)](scores, visible, cand_t, out, hist if binned else visible, scratch,
                         candidates.shape[1] if cand else 0, scores.stride(0),
                         cand_t.stride(0), out.stride(0), K=K, K_PAD=K_pad, CAND=cand,
                         CB=block if cand else 1, DIV=per, ID_BITS=_id_bits(n_ids), BLOCK=cfg.select_block,
                         DIGIT=cfg.select_digit, SMALL=_small_sort(K) if cfg.select_narrow else K_pad,
                         RESIDENT=cfg.select_resident, HIST=binned, CAP=cap, SORT=cfg.select_sorted,
                         num_warps=cfg.select_warps,
                         **pdl_launch(scores))


def index_topk(q: torch.Tensor, w: torch.Tensor, keys: KeyPool, entries: Entries, k: int, *,
               candidates: torch.Tensor | None = None, publish: int = 0, block: int = 1,
               q_scale: torch.Tensor | None = None, config: Config | None = None,
               scores_out: torch.Tensor | None = None,
               w_scale: float = 1.0, w_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> (idx [T, min(k, E_max)], blocks [T, publish] or None), as ops.indexer.index_topk_reference. The score rows
    are E_max wide (memory, not work); a step whose rows exceed SCORE_BUDGET runs a chunk of tokens at a time.
    `scores_out` (tests): the [T, >= E_max] float32 score buffer to use (only the visible part is written)."""
    T = q.shape[0]
    E, dev = entries.max_entries, q.device
    idx = torch.empty(T, min(k, E), dtype=torch.long, device=dev)
    blocks = torch.empty(T, publish, dtype=torch.long, device=dev) if publish else None
    if T == 0:
        return idx, blocks
    W = candidates.shape[1] * block if candidates is not None else E
    NB = -(-E // block)
    row_bytes = 4 * (W + (NB if publish else 0))
    chunk = T if scores_out is not None else max(1, min(T, SCORE_BUDGET // max(row_bytes, 1)))
    # row strides padded to 16 elements: Triton specialises an integer argument on its divisibility by 16 (a compile
    # key that the step's context length would otherwise change)
    scores = scores_out if scores_out is not None else torch.empty(chunk, _pad16(max(W, 1)), dtype=torch.float32,
                                                                   device=dev)
    bscores = torch.empty(chunk, _pad16(NB), dtype=torch.float32, device=dev) if publish else None
    cfg = config or default_config(T, candidates is not None, q.is_cuda)
    hist = _HIST.get(dev) if cfg.select_hist and chunk <= HIST_ROWS else None
    for lo in range(0, T, chunk):
        hi = min(T, lo + chunk)
        part = replace(entries, token_row=entries.token_row[lo:hi], visible=entries.visible[lo:hi])
        cands = candidates[lo:hi] if candidates is not None else None
        logits(q[lo:hi], w[lo:hi], keys, part, scores, candidates=cands, block=block, block_scores=bscores,
               q_scale=q_scale[lo:hi] if q_scale is not None else None, config=cfg, hist=hist, w_scale=w_scale,
               w_dtype=w_dtype)
        select(scores, part.visible, idx[lo:hi], E, candidates=cands, block=block, config=cfg, hist=hist)
        if publish:
            select(bscores, part.visible, blocks[lo:hi], NB, per=block, config=cfg)
    return idx, blocks
