"""Fused sparse attention over the stored KV pools, in Triton (Hopper), with the signature of ops/attention.attend.

One program per (token, block of heads): it normalises (V4) and RoPE-rotates its queries, streams the token's window
rows (the ring's stored records, or this step's fresh rows) and then its compressed entries (the CSA picks, or every
visible HCA entry, with the pool rows found through the block table), decodes each record in registers (bf16/f32,
V4's 584-B FP8 record, V4.1's 528-B FP8-per-32 row and 288-B NVFP4 entry), runs an online softmax that starts from the
sink logit, and writes the output rotated back by the inverse RoPE. K = V: one tile feeds both dots.

The work per token scales with its own window and selection (the dense loop's bound is read from device memory), never
with max_model_len; there is no host synchronisation, so a decode step can be captured in a CUDA graph.

Two modes, chosen by Config.mode (the default configs use "heads"; "flash" is selected explicitly until a GPU sweep
decides):

* "heads" (_attend_kernel): grid (token, head block, D chunk x kv split). Each program re-reads and re-decodes its
  token's records: once per head block and once per D chunk.
* "flash" (_flash_kernel), split-KV flash decoding over all heads: grid (head blocks, kv splits, tokens), with
  heads = 64 = H meaning one head block, so each record is fetched from HBM and decoded once per token. A program takes
  one BN-aligned slice of its token's rows [window | compressed], runs all BH heads over it tile by tile, and stores its
  partial (m, l, acc). The last split to arrive (ArrivalCounters) combines the NSPLIT partials in a fixed order and
  applies the inverse RoPE. Design choices:
  - Registers. The [64, 512] fp32 accumulator is 128 KB: 128 registers per thread at 8 warps, 64 at 16 warps, which is
    FlashMLA's budget (each warpgroup owns part of the output dims). It stays in registers as D / dchunk (1, 2 or 4)
    separate [BH, dchunk] accumulators, because Triton cannot update a slice of one tensor. Each tile is decoded once,
    chunk by chunk: each chunk's fp32 decode transients die at its DT cast, and the DT chunks feed QK^T (summed over
    chunks into S [BH, BN]) and then P.V (chunk c into acc c). So the transients are [BN, dchunk], not [BN, 512]. The
    alternatives were rejected: splitting D over programs re-reads each record per part (the "heads" mode's dsplit);
    keeping acc in global scratch means a 128 KB read-modify-write per tile.
  - Queries: normalised and rotated once per program, dchunk dims at a time, into a scratch row. Each tile reads
    [BH, dchunk] slices back from L1/L2, so no [64, 512] query tile stays live across the loop. That is 64 KB of L1/L2
    reads per tile against BN x 584 B of HBM: more rows per tile amortise it.
  - Gather chain. The addresses are software-pipelined over four tiles: the sources or picks of tile i+3 and the ring
    rows or block table of tile i+2 load while tile i computes, and with Config.prefetch the records of tile i+1 are
    L2-prefetched (prefetch.global.L2 per 128-B line; GPU only). Each dependent load's result is first used one tile
    after it was issued.
  - Splits. kv_splits = 0 gives up to about one wave over the GPU (132 // programs, rounded down to a power of two:
    a constexpr, one variant per class) at decode, 1 for big batches. The
    partials (BH x (D + 2) fp32 = 128 KB per split per token, mostly L2) cost about as much as a token's 374 KB of
    records at 3 splits, so big batches want few splits.
  - Smem (Triton's operand staging): query chunk [BH, dchunk] + trans(K) chunk + K chunk per dot, about 80-130 KB at
    BH = 64, BN = 16-32, one CTA per SM.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..env import get as env_get
from ..precision import hi_lo
from . import attention_stage, attention_twopass, cdiv, interpreting, next_pow2, step_jit
from .attention_rows import (FORMATS, dot, entry_count, entry_idx, entry_rows, finish, pair_cos_sin, prepare_queries,
                             rotate, rows_kv, softmax_step, win_rows, win_src)
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .split_grid import N_COUNTERS, TL_DTYPES, ArrivalCounters, last_to_arrive

NO_ENTRIES, PICKED, DENSE = 0, 1, 2


HEADS, FLASH, TWOPASS = "heads", "flash", "twopass"


@dataclass(frozen=True)
class Config:
    heads: int  # BH: query heads per program (the M of both dots)
    rows: int  # BN: KV rows per tile
    dsplit: int  # programs per (token, head block), each owning D / dsplit output dims (also the QK chunk width);
    # "flash" mode: 2 = two programs each owning a half of D (one KV split; _flash_tile_half), else 1
    num_warps: int
    num_stages: int
    kv_splits: int = 0  # programs per token's KV rows (0 = by the grid size; the partials combine in the last)
    mode: str = HEADS  # "heads": the kernel above; "flash": split-KV flash decoding over all heads (_flash_kernel);
    # "twopass": scores, softmax and P.V as separate launches over a scratch (attention_twopass.py; rows = its tiles,
    # dchunk = P.V's output chunk; heads: all of them)
    dchunk: int = 0  # "flash" mode: D / dchunk (1, 2 or 4; else D) chunks of the decode, the dots' D dims and the
    # output accumulators (0 = D: one full-width chunk)
    prefetch: int = 0  # "flash" mode on the GPU: 1 = L2-prefetch the next tile's records while this tile computes


# Chosen on the H200 (benchmarks/kernels/attention.py); the interpreter gets the smallest legal tiles (and two D
# chunks, so that the chunked paths run in the tests).
GPU_CONFIG = Config(heads=16, rows=32, dsplit=2, num_warps=8, num_stages=1)
# Batched decode: flash mode, 32 heads a program, L2 prefetch. H200, 64 heads x 512, 128 window rows: over V4's 584-B
# records with 512 CSA picks, T=32 101 us vs 390 us for GPU_CONFIG (2026-12-01); over bf16 records at 64K context
# (benchmarks/kernels/attention.py --format bf16), CSA T=32 64.4 us and T=64 105.6 (2026-12-02); in the V4 step at
# batch 32 and 2K context (bf16 records), the graph replay 23.83 -> 21.59 ms with CSA layers on it, 21.11 with HCA's
# too. Single rows keep GPU_CONFIG (bf16 CSA T=1: 16.2 vs 35.3 us), as do prefill chunks and V4.1's formats (not
# measured in this mode).
FLASH_DECODE_CONFIG = Config(heads=32, rows=32, dsplit=1, num_warps=8, num_stages=1, mode=FLASH, dchunk=128,
                             prefetch=1)
FLASH_DECODE_TOKENS = (16, 128)
# Batched decode over V4.1's records (FP8-per-32 window rows, NVFP4 entries): the heads mode with 32 heads a program,
# the whole D in one program and 8 KV splits. H100, 64K context, CSA picks (benchmarks/kernels/attention.py --format
# v41 --decode-only, twenty-fifth session): T=32 382 -> 190 us, T=64 740 -> 338 us against GPU_CONFIG; single rows
# keep GPU_CONFIG (37.2 us; 8 or 32 splits 37.0 / 35.6).
V41_DECODE_CONFIG = Config(heads=32, rows=32, dsplit=1, num_warps=8, num_stages=1, kv_splits=8)
# A single decode row over staged picks (attention_stage.stage_picks: 128 window + up to 512 picked bf16 rows): 64-row
# tiles over 10 KV splits, one tile a split. H100, V4.1 at 64K, staging included (attention.py --format v41
# --decode-only --decode-rows 1 --layers csa, thirtieth session): 24.9 -> 21.9 us (32-row tiles over 20 splits 26.1,
# 16-row over 40 43.2, GPU_CONFIG over 32 31.3).
SINGLE_PICKS_CONFIG = Config(heads=16, rows=64, dsplit=2, num_warps=8, num_stages=1, kv_splits=10)
SINGLE_ENV = "V4SERVE_ATTN_SINGLE"  # A/B switch: "0" gives those rows GPU_CONFIG
# A/B switch for batched decode (16-128 tokens) over plain picks (bf16 records, or staged ones): "heads" gives them
# GPU_CONFIG, "flash" (or unset) FLASH_DECODE_CONFIG. H100, V4.1 at batch 32 and 4K over staged picks (thirty-first
# session, `profile_step.py --graph-only`, two rounds): replay 23.1 / 24.3 ms in flash mode, 26.3 / 27.1 with heads
# (unstaged, V41_DECODE_CONFIG: 27.9 / 27.0); at 64K, 32 rows (`attention.py --format v41`): flash 103 us, heads 188
BATCHED_ENV = "V4SERVE_ATTN_BATCHED"
FLASH_DECODE_FORMATS = {"v4_fp8": ("picks",), "plain": ("picks", "dense")}  # record format -> entry kinds timed
# Prefill chunks (more than 128 query tokens) take flash mode where timed: over bf16 records at 64K context, a 4K-token
# chunk (benchmarks/kernels/attention.py --format bf16 --prefill-only, H200): the decode config took CSA 18.36 -> 5.86
# ms and HCA 17.36 -> 5.44 against GPU_CONFIG (thirteenth session); 64-row tiles without the L2 prefetch take them to
# 3.60 and 3.43 ms (twenty-first session: the tile loop is bound by its gathers' latency at one program an SM, so more
# rows a tile amortise it, and at prefill the records are L2-resident, where the prefetch only costs issue slots:
# with it 4.37 / 4.05; 128-row tiles 4.68 / 3.57; 16 heads on 4 warps 4.36 / 4.04; the output halves on 64 heads
# 6.35+ / 5.18+; 16 warps slower). One KV split at these sizes (_flash_splits).
FLASH_PREFILL_CONFIG = Config(heads=32, rows=64, dsplit=1, num_warps=8, num_stages=1, mode=FLASH, dchunk=128)
# A/B switch: the prefill chunks' config, flash "heads,rows,warps[,prefetch[,halves]]" or "twopass,rows,warps,dchunk"
PREFILL_ENV = "V4SERVE_ATTN_PREFILL"
INTERPRETER_CONFIG = Config(heads=16, rows=16, dsplit=2, num_warps=1, num_stages=1, kv_splits=2)
_SMS = 132  # H200 multiprocessors
_COUNTERS = ArrivalCounters()
TOKEN_CHUNK = 2048  # tokens per launch: bounds the prepared-query scratch of long prefills


@triton.jit
def _tile(qp, h_ok, rows, ok, ring, fresh_ptr, stride_ft, fresh_row, pid_d, m_i, l_i, acc,
          u8_ptr, h16_ptr, val_ptr, stride, scale_hi, scale_lo,
          FMT: tl.constexpr, FRESH: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr,
          BH: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr, HALF: tl.constexpr,
          INTERPRET: tl.constexpr):
    """One online-softmax step over a tile of KV rows (ok: which count; ring: pool rows, else this step's fresh rows).

    QK^T runs over D in DC-wide chunks (bounded registers); the chunk this program owns is kept for P.V."""
    s = tl.zeros((BH, BN), ACC)
    own = tl.zeros((BN, DC), DT)
    cd = tl.arange(0, DC)
    for ci in tl.static_range(D // DC):
        kv = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, fresh_row, ci * DC, u8_ptr, h16_ptr, val_ptr, stride, FMT,
                     FRESH, DC, D, RD, DT)
        q = tl.load(qp + ci * DC + cd[None, :], mask=h_ok[:, None], other=0.0)
        s += dot(q, tl.trans(kv), ACC, HALF, INTERPRET)
        own = tl.where(pid_d == ci, kv, own)
    m_new, l_i, alpha, p = softmax_step(s, ok, m_i, l_i, scale_hi, scale_lo, DT)
    acc = acc * alpha[:, None] + dot(p, own, ACC, HALF, INTERPRET)
    return m_new, l_i, acc


@triton.jit
def _split_rows(vis_ptr, t, n_picks, pid_s, W: tl.constexpr, CMODE: tl.constexpr, NSPLIT: tl.constexpr,
                BN: tl.constexpr):
    """Split pid_s's share [lo, hi) of token t's rows [window W | compressed n_c] (n_c: none, its picks, or its
    visible entries), in BN-aligned spans."""
    n_c = entry_count(vis_ptr, t, n_picks, CMODE)
    span = tl.cdiv(tl.cdiv(W + n_c, NSPLIT), BN) * BN
    lo = pid_s * span
    return lo, tl.minimum(lo + span, W + n_c)


@step_jit
def _attend_kernel(q_ptr, qp_ptr, cos_ptr, sin_ptr, fresh_ptr, sink_ptr, out_ptr, part_ptr, cnt_ptr,
                   win_src_ptr, win_ok_ptr, ring_ptr, wu8_ptr, wh16_ptr, wval_ptr, w_stride,
                   cu8_ptr, ch16_ptr, cval_ptr, c_stride,
                   bt_ptr, bt_stride, tok_row_ptr, pick_ptr, pick_stride, vis_ptr,
                   H, RW, n_picks, ratio, block_size, epb, trash_block,
                   scale_hi, scale_lo, eps,
                   stride_qt, stride_qh, stride_ct, stride_ft, stride_ot, stride_oh,
                   D: tl.constexpr, RD: tl.constexpr, W: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr,
                   DC: tl.constexpr, NSPLIT: tl.constexpr, WFMT: tl.constexpr, CFMT: tl.constexpr,
                   CMODE: tl.constexpr, QNORM: tl.constexpr, DT: tl.constexpr, ACC: tl.constexpr,
                   HALF: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    h = hb * BH + tl.arange(0, BH)
    pid_d = tl.program_id(2) // NSPLIT
    pid_s = tl.program_id(2) % NSPLIT
    h_ok = h < H
    c = tl.arange(0, D)
    RT = tl.float64 if ACC == tl.float64 else tl.float32
    # --- queries: (per-head RMS norm,) RoPE on the trailing RD dims, rounded to the model dtype as the reference
    # does; written to a scratch row that the D chunks read back (every program of this token and head block writes
    # the same bits, so the copies cannot disagree)
    q = tl.load(q_ptr + t * stride_qt + h[:, None] * stride_qh + c[None, :], mask=h_ok[:, None], other=0.0)
    QT = q.dtype
    if QNORM:
        qf = q.to(ACC)
        q = (qf / tl.sqrt(tl.sum(qf * qf, 1) / D + eps)[:, None]).to(QT)
    cos, sin = pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, 0, D // 2, D, RD, RT)
    q = rotate(q.to(RT), cos, sin, False, BH, D).to(QT).to(DT)
    qp = qp_ptr + t * stride_qt + h[:, None] * stride_qh
    tl.store(qp + c[None, :], q, mask=h_ok[:, None])
    tl.debug_barrier()  # the scratch row is complete before any thread reads it back

    # --- this program's share of the token's rows [window W | compressed n_c]: split pid_s of NSPLIT (decode
    # splits a token's rows over programs so that enough gathers are in flight; the last to arrive combines)
    lo, hi = _split_rows(vis_ptr, t, n_picks, pid_s, W, CMODE, NSPLIT, BN)
    m_i = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(ACC)  # the sink: a logit in the denominator only,
    l_i = tl.full((BH,), 1.0, ACC) * (pid_s == 0).to(ACC)  # counted once (split 0); m starts finite everywhere
    acc = tl.zeros((BH, DC), ACC)
    # --- window: the ring's stored rows before this step, or this step's fresh rows
    for k0 in range(lo, tl.minimum(hi, W), BN):
        src, ok = win_src(t, k0, tl.minimum(hi, W), W, win_src_ptr, win_ok_ptr, BN)
        prow, ring = win_rows(src, ok, ring_ptr, RW)
        m_i, l_i, acc = _tile(qp, h_ok, prow, ok, ring, fresh_ptr, stride_ft, src - RW, pid_d, m_i, l_i, acc,
                              wu8_ptr, wh16_ptr, wval_ptr, w_stride, scale_hi, scale_lo, WFMT, True, D, RD, DC, BH,
                              BN, ACC, DT, HALF, INTERPRET)
    # --- compressed entries: the picks (CSA) or every visible entry (HCA), through the block table
    if CMODE != 0:
        r = tl.load(tok_row_ptr + t)
        for j0 in range(tl.maximum(lo, W) - W, hi - W, BN):
            j, ok = entry_idx(t, j0, hi - W, pick_ptr, pick_stride, CMODE, BN)
            prow = entry_rows(j, ok, bt_ptr, r, bt_stride, ratio, block_size, epb, trash_block)
            m_i, l_i, acc = _tile(qp, h_ok, prow, ok, ok, fresh_ptr, stride_ft, j, pid_d, m_i, l_i, acc,
                                  cu8_ptr, ch16_ptr, cval_ptr, c_stride, scale_hi, scale_lo, CFMT, False, D, RD, DC,
                                  BH, BN, ACC, DT, HALF, INTERPRET)
    cd = tl.arange(0, DC)
    if NSPLIT > 1:  # partial (m, l, acc) to the workspace; the last program of (token, head block, D chunk) combines
        slot = (t * tl.num_programs(1) + hb) * (tl.num_programs(2) // NSPLIT) + pid_d
        base = part_ptr + (slot * NSPLIT) * (BH * (DC + 2))
        own = base + pid_s * (BH * (DC + 2)) + tl.arange(0, BH)[:, None] * (DC + 2)
        tl.store(own + cd[None, :], acc)
        tl.store(own + DC + tl.zeros((BH, 1), tl.int32), m_i[:, None])
        tl.store(own + DC + 1 + tl.zeros((BH, 1), tl.int32), l_i[:, None])
        if last_to_arrive(cnt_ptr + slot, NSPLIT):
            rows = tl.arange(0, BH)[:, None] * (DC + 2)
            m_all = tl.full((BH,), float("-inf"), ACC)
            for sp in tl.static_range(NSPLIT):
                m_all = tl.maximum(m_all, tl.reshape(tl.load(base + sp * (BH * (DC + 2)) + rows + DC,
                                                             cache_modifier=".cg"), (BH,)))
            l_i = tl.zeros((BH,), ACC)
            acc = tl.zeros((BH, DC), ACC)
            for sp in tl.static_range(NSPLIT):  # fixed order: the sum does not depend on who came last
                p = base + sp * (BH * (DC + 2)) + rows
                w = tl.exp(tl.reshape(tl.load(p + DC, cache_modifier=".cg"), (BH,)) - m_all)
                l_i += tl.reshape(tl.load(p + DC + 1, cache_modifier=".cg"), (BH,)) * w
                acc += tl.load(p + cd[None, :], cache_modifier=".cg") * w[:, None]
            finish(acc, l_i, cos_ptr, sin_ptr, t, stride_ct, pid_d, out_ptr, stride_ot, stride_oh, h, h_ok, QT,
                    D, RD, DC, BH, RT)
            tl.store(cnt_ptr + slot, 0)  # ready for the next launch / graph replay
    else:
        finish(acc, l_i, cos_ptr, sin_ptr, t, stride_ct, pid_d, out_ptr, stride_ot, stride_oh, h, h_ok, QT,
                D, RD, DC, BH, RT)


# --- "flash" mode: split-KV flash decoding over all heads ------------------------------------------------------------


@triton.jit
def _qk_chunks(qp, h_ok, rows, ok, ring, fresh_ptr, stride_ft, fresh_row, u8_ptr, h16_ptr, val_ptr, stride,
               FMT: tl.constexpr, FRESH: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr,
               ACC: tl.constexpr, DT: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """A flash tile's raw scores S [BH, BN] = q' K^T, the tile decoded in NCH = D / DC chunks (1, 2 or 4) summed in
    order, and the decoded chunks k0..k3 in DT for P.V (those past NCH repeat k0, unused)."""
    NCH: tl.constexpr = D // DC
    cd = tl.arange(0, DC)
    k0 = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, fresh_row, 0, u8_ptr, h16_ptr, val_ptr, stride, FMT, FRESH,
                 DC, D, RD, DT)
    s = dot(tl.load(qp + cd[None, :], mask=h_ok[:, None], other=0.0), tl.trans(k0), ACC, HALF, INTERPRET)
    k1, k2, k3 = k0, k0, k0
    if NCH > 1:
        k1 = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, fresh_row, DC, u8_ptr, h16_ptr, val_ptr, stride, FMT,
                     FRESH, DC, D, RD, DT)
        s += dot(tl.load(qp + DC + cd[None, :], mask=h_ok[:, None], other=0.0), tl.trans(k1), ACC, HALF, INTERPRET)
    if NCH > 2:
        k2 = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, fresh_row, 2 * DC, u8_ptr, h16_ptr, val_ptr, stride, FMT,
                     FRESH, DC, D, RD, DT)
        s += dot(tl.load(qp + 2 * DC + cd[None, :], mask=h_ok[:, None], other=0.0), tl.trans(k2), ACC, HALF,
                 INTERPRET)
        k3 = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, fresh_row, 3 * DC, u8_ptr, h16_ptr, val_ptr, stride, FMT,
                     FRESH, DC, D, RD, DT)
        s += dot(tl.load(qp + 3 * DC + cd[None, :], mask=h_ok[:, None], other=0.0), tl.trans(k3), ACC, HALF,
                 INTERPRET)
    return s, k0, k1, k2, k3


@triton.jit
def _flash_tile(qp, h_ok, rows, ok, ring, fresh_ptr, stride_ft, fresh_row, m_i, l_i, acc0, acc1, acc2, acc3,
                u8_ptr, h16_ptr, val_ptr, stride, scale_hi, scale_lo,
                FMT: tl.constexpr, FRESH: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr,
                BH: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr, HALF: tl.constexpr,
                INTERPRET: tl.constexpr):
    """One online-softmax step of all the program's heads over a tile of KV rows.

    The tile is decoded once, in NCH = D / DC chunks (1, 2 or 4) that stay in DT for both dots: QK^T sums the chunks'
    products, P.V updates the chunk's own accumulator acc<c> [BH, DC] (unused accumulators are [1, 1] placeholders).
    Chunking bounds the decode's fp32 transients to [BN, DC]; all of acc0..3 together cover the D output dims."""
    NCH: tl.constexpr = D // DC
    s, k0, k1, k2, k3 = _qk_chunks(qp, h_ok, rows, ok, ring, fresh_ptr, stride_ft, fresh_row, u8_ptr, h16_ptr,
                                   val_ptr, stride, FMT, FRESH, D, RD, DC, ACC, DT, HALF, INTERPRET)
    m_new, l_i, alpha, p = softmax_step(s, ok, m_i, l_i, scale_hi, scale_lo, DT)
    acc0 = acc0 * alpha[:, None] + dot(p, k0, ACC, HALF, INTERPRET)
    if NCH > 1:
        acc1 = acc1 * alpha[:, None] + dot(p, k1, ACC, HALF, INTERPRET)
    if NCH > 2:
        acc2 = acc2 * alpha[:, None] + dot(p, k2, ACC, HALF, INTERPRET)
        acc3 = acc3 * alpha[:, None] + dot(p, k3, ACC, HALF, INTERPRET)
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _flash_tile_half(qp, h_ok, rows, ok, ring, fresh_ptr, stride_ft, fresh_row, pd, m_i, l_i, acc0, acc1,
                     u8_ptr, h16_ptr, val_ptr, stride, scale_hi, scale_lo,
                     FMT: tl.constexpr, FRESH: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr,
                     BH: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr, HALF: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """_flash_tile for a program that owns output half pd of D (two programs per token and head block): QK^T runs
    over all NCH = D / DC chunks (2 or 4) in _flash_tile's order (the same scores, bit for bit), and only the own
    half's chunks (1 or 2, into acc0 / acc1) are kept for P.V. Half the accumulator registers let 64 heads (wgmma's
    M) fit without spilling, for twice the QK^T and record reads of a token."""
    NCH: tl.constexpr = D // DC
    s, k0, k1, k2, k3 = _qk_chunks(qp, h_ok, rows, ok, ring, fresh_ptr, stride_ft, fresh_row, u8_ptr, h16_ptr,
                                   val_ptr, stride, FMT, FRESH, D, RD, DC, ACC, DT, HALF, INTERPRET)
    if NCH > 2:
        own0 = tl.where(pd == 0, k0, k2)
        own1 = tl.where(pd == 0, k1, k3)
    else:
        own0 = tl.where(pd == 0, k0, k1)
        own1 = own0
    m_new, l_i, alpha, p = softmax_step(s, ok, m_i, l_i, scale_hi, scale_lo, DT)
    acc0 = acc0 * alpha[:, None] + dot(p, own0, ACC, HALF, INTERPRET)
    if NCH > 2:
        acc1 = acc1 * alpha[:, None] + dot(p, own1, ACC, HALF, INTERPRET)
    return m_new, l_i, acc0, acc1


@triton.jit
def _prefetch(base_ptr, rows, row_bytes, NL: tl.constexpr):
    """Ask L2 for the records at pool rows [BN] (every 128-B line of each row_bytes-long record; NL >= lines + 1)."""
    b = base_ptr.to(tl.pointer_type(tl.uint8))
    off = tl.minimum(tl.arange(0, NL) * 128, row_bytes - 1)
    ptrs = b + rows.to(tl.int64)[:, None] * row_bytes + off[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@step_jit
def _flash_kernel(q_ptr, qp_ptr, cos_ptr, sin_ptr, fresh_ptr, sink_ptr, out_ptr, part_ptr, cnt_ptr,
                  win_src_ptr, win_ok_ptr, ring_ptr, wu8_ptr, wh16_ptr, wval_ptr, w_stride,
                  cu8_ptr, ch16_ptr, cval_ptr, c_stride,
                  bt_ptr, bt_stride, tok_row_ptr, pick_ptr, pick_stride, vis_ptr,
                  H, RW, n_picks, ratio, block_size, epb, trash_block,
                  scale_hi, scale_lo, eps,
                  stride_qt, stride_qh, stride_ct, stride_ft, stride_ot, stride_oh, w_row_bytes, c_row_bytes,
                  D: tl.constexpr, RD: tl.constexpr, W: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr,
                  DC: tl.constexpr, NSPLIT: tl.constexpr, WFMT: tl.constexpr, CFMT: tl.constexpr,
                  CMODE: tl.constexpr, QNORM: tl.constexpr, DT: tl.constexpr, ACC: tl.constexpr,
                  HALF: tl.constexpr, INTERPRET: tl.constexpr, PREFETCH: tl.constexpr, WNL: tl.constexpr,
                  CNL: tl.constexpr, WAL: tl.constexpr, CAL: tl.constexpr, DS: tl.constexpr = 1,
                  PDL: tl.constexpr = False):
    """Grid (head blocks x DS output halves, kv splits, tokens): head blocks and halves fastest, so that the programs
    reading the same records run side by side (the second read hits L2). DS = 2 (one KV split only): each program
    owns half of the D output dims (_flash_tile_half)."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    # the pools' row strides are multiples of WAL / CAL (V4's 584-B record: 8): said so, the record loads vectorise
    # (Triton only infers divisibility by 16 for integer arguments; else every byte is its own load)
    w_stride = (w_stride // WAL) * WAL
    c_stride = (c_stride // CAL) * CAL
    hb = tl.program_id(0) // DS
    pd = tl.program_id(0) % DS
    pid_s = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    h = hb * BH + tl.arange(0, BH)
    h_ok = h < H
    cd = tl.arange(0, DC)
    RT = tl.float64 if ACC == tl.float64 else tl.float32
    QT: tl.constexpr = q_ptr.dtype.element_ty
    # --- queries: written to a scratch row that the tiles read back (all splits of a token write the same bits)
    qp = prepare_queries(q_ptr, qp_ptr, cos_ptr, sin_ptr, t, h, h_ok, stride_qt, stride_qh, stride_ct, eps, D, RD,
                          DC, BH, QNORM, ACC, DT)

    # --- split pid_s of NSPLIT of the token's rows [window W | compressed n_c], in BN-aligned spans
    lo, hi = _split_rows(vis_ptr, t, n_picks, pid_s, W, CMODE, NSPLIT, BN)
    m_i = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(ACC)  # the sink, counted once (split 0)
    l_i = tl.full((BH,), 1.0, ACC) * (pid_s == 0).to(ACC)
    NCH: tl.constexpr = D // DC  # 1, 2 or 4 output chunks, each with its accumulator (see _flash_tile)
    NOWN: tl.constexpr = NCH // DS  # the accumulators this program keeps (DS = 2: its half's)
    acc0 = tl.zeros((BH, DC), ACC)
    acc1 = tl.zeros((BH, DC) if NOWN > 1 else (1, 1), ACC)
    acc2 = tl.zeros((BH, DC) if NOWN > 2 else (1, 1), ACC)
    acc3 = tl.zeros((BH, DC) if NOWN > 2 else (1, 1), ACC)
    # --- window tiles. The gather chain is software-pipelined over tiles i (records decoded and multiplied now),
    # i+1 (pool rows known: optionally L2-prefetched), i+2 (ring rows loading) and i+3 (sources loading): each load's
    # result is first used one tile after it was issued, so the dependent loads overlap the current tile's work
    wend = tl.minimum(hi, W)
    src0, ok0 = win_src(t, lo, wend, W, win_src_ptr, win_ok_ptr, BN)
    row0, ring0 = win_rows(src0, ok0, ring_ptr, RW)
    src1, ok1 = win_src(t, lo + BN, wend, W, win_src_ptr, win_ok_ptr, BN)
    row1, ring1 = win_rows(src1, ok1, ring_ptr, RW)
    src2, ok2 = win_src(t, lo + 2 * BN, wend, W, win_src_ptr, win_ok_ptr, BN)
    for k0 in range(lo, wend, BN):
        src3, ok3 = win_src(t, k0 + 3 * BN, wend, W, win_src_ptr, win_ok_ptr, BN)
        row2, ring2 = win_rows(src2, ok2, ring_ptr, RW)
        if PREFETCH:
            _prefetch(wval_ptr, row1, w_row_bytes, WNL)
        if DS == 2:
            m_i, l_i, acc0, acc1 = _flash_tile_half(
                qp, h_ok, row0, ok0, ring0, fresh_ptr, stride_ft, src0 - RW, pd, m_i, l_i, acc0, acc1, wu8_ptr,
                wh16_ptr, wval_ptr, w_stride, scale_hi, scale_lo, WFMT, True, D, RD, DC, BH, BN, ACC, DT, HALF,
                INTERPRET)
        else:
            m_i, l_i, acc0, acc1, acc2, acc3 = _flash_tile(
                qp, h_ok, row0, ok0, ring0, fresh_ptr, stride_ft, src0 - RW, m_i, l_i, acc0, acc1, acc2, acc3,
                wu8_ptr, wh16_ptr, wval_ptr, w_stride, scale_hi, scale_lo, WFMT, True, D, RD, DC, BH, BN, ACC, DT,
                HALF, INTERPRET)
        src0, ok0, row0, ring0 = src1, ok1, row1, ring1
        src1, ok1, row1, ring1 = src2, ok2, row2, ring2
        src2, ok2 = src3, ok3
    # --- compressed tiles (CSA picks or every visible HCA entry), pipelined the same way: picks three tiles ahead,
    # block table two ahead, (prefetch) one ahead
    if CMODE != 0:
        r = tl.load(tok_row_ptr + t)
        j_lo = tl.maximum(lo, W) - W
        j_hi = hi - W
        j0_, okj0 = entry_idx(t, j_lo, j_hi, pick_ptr, pick_stride, CMODE, BN)
        rowj0 = entry_rows(j0_, okj0, bt_ptr, r, bt_stride, ratio, block_size, epb, trash_block)
        j1_, okj1 = entry_idx(t, j_lo + BN, j_hi, pick_ptr, pick_stride, CMODE, BN)
        rowj1 = entry_rows(j1_, okj1, bt_ptr, r, bt_stride, ratio, block_size, epb, trash_block)
        j2_, okj2 = entry_idx(t, j_lo + 2 * BN, j_hi, pick_ptr, pick_stride, CMODE, BN)
        for j0 in range(j_lo, j_hi, BN):
            j3_, okj3 = entry_idx(t, j0 + 3 * BN, j_hi, pick_ptr, pick_stride, CMODE, BN)
            rowj2 = entry_rows(j2_, okj2, bt_ptr, r, bt_stride, ratio, block_size, epb, trash_block)
            if PREFETCH:
                _prefetch(cval_ptr, rowj1, c_row_bytes, CNL)
            if DS == 2:
                m_i, l_i, acc0, acc1 = _flash_tile_half(
                    qp, h_ok, rowj0, okj0, okj0, fresh_ptr, stride_ft, j0_, pd, m_i, l_i, acc0, acc1, cu8_ptr,
                    ch16_ptr, cval_ptr, c_stride, scale_hi, scale_lo, CFMT, False, D, RD, DC, BH, BN, ACC, DT, HALF,
                    INTERPRET)
            else:
                m_i, l_i, acc0, acc1, acc2, acc3 = _flash_tile(
                    qp, h_ok, rowj0, okj0, okj0, fresh_ptr, stride_ft, j0_, m_i, l_i, acc0, acc1, acc2, acc3,
                    cu8_ptr, ch16_ptr, cval_ptr, c_stride, scale_hi, scale_lo, CFMT, False, D, RD, DC, BH, BN, ACC,
                    DT, HALF, INTERPRET)
            j0_, okj0, rowj0 = j1_, okj1, rowj1
            j1_, okj1, rowj1 = j2_, okj2, rowj2
            j2_, okj2 = j3_, okj3
    if NSPLIT > 1:  # partial (m, l, acc) to the workspace; the last split of (token, head block) to arrive combines
        slot = t * tl.num_programs(0) + hb
        base = part_ptr + (slot * NSPLIT) * (BH * (D + 2))
        rows = tl.arange(0, BH)[:, None] * (D + 2)
        own = base + pid_s * (BH * (D + 2)) + rows
        tl.store(own + cd[None, :], acc0)
        if NCH > 1:
            tl.store(own + DC + cd[None, :], acc1)
        if NCH > 2:
            tl.store(own + 2 * DC + cd[None, :], acc2)
            tl.store(own + 3 * DC + cd[None, :], acc3)
        tl.store(own + D + tl.zeros((BH, 1), tl.int32), m_i[:, None])
        tl.store(own + D + 1 + tl.zeros((BH, 1), tl.int32), l_i[:, None])
        if last_to_arrive(cnt_ptr + slot, NSPLIT):
            m_all = tl.full((BH,), float("-inf"), ACC)
            for sp in tl.static_range(NSPLIT):
                m_all = tl.maximum(m_all, tl.reshape(tl.load(base + sp * (BH * (D + 2)) + rows + D,
                                                             cache_modifier=".cg"), (BH,)))
            l_i = tl.zeros((BH,), ACC)
            for sp in tl.static_range(NSPLIT):  # fixed order: the sums do not depend on who came last
                p = base + sp * (BH * (D + 2)) + rows
                w = tl.exp(tl.reshape(tl.load(p + D, cache_modifier=".cg"), (BH,)) - m_all)
                l_i += tl.reshape(tl.load(p + D + 1, cache_modifier=".cg"), (BH,)) * w
            for ci in tl.static_range(D // DC):  # the output DC dims at a time: bounded registers
                acc_c = tl.zeros((BH, DC), ACC)
                for sp in tl.static_range(NSPLIT):
                    p = base + sp * (BH * (D + 2)) + rows
                    w = tl.exp(tl.reshape(tl.load(p + D, cache_modifier=".cg"), (BH,)) - m_all)
                    acc_c += tl.load(p + ci * DC + cd[None, :], cache_modifier=".cg") * w[:, None]
                finish(acc_c, l_i, cos_ptr, sin_ptr, t, stride_ct, ci, out_ptr, stride_ot, stride_oh, h, h_ok, QT,
                        D, RD, DC, BH, RT)
            tl.store(cnt_ptr + slot, 0)  # ready for the next launch / graph replay
    elif DS == 2:  # this program's half: chunks pd * NOWN ..
        finish(acc0, l_i, cos_ptr, sin_ptr, t, stride_ct, pd * NOWN, out_ptr, stride_ot, stride_oh, h, h_ok, QT, D,
                RD, DC, BH, RT)
        if NOWN > 1:
            finish(acc1, l_i, cos_ptr, sin_ptr, t, stride_ct, pd * NOWN + 1, out_ptr, stride_ot, stride_oh, h, h_ok,
                    QT, D, RD, DC, BH, RT)
    else:
        finish(acc0, l_i, cos_ptr, sin_ptr, t, stride_ct, 0, out_ptr, stride_ot, stride_oh, h, h_ok, QT, D, RD, DC, BH,
                RT)
        if NCH > 1:
            finish(acc1, l_i, cos_ptr, sin_ptr, t, stride_ct, 1, out_ptr, stride_ot, stride_oh, h, h_ok, QT, D, RD,
                    DC, BH, RT)
        if NCH > 2:
            finish(acc2, l_i, cos_ptr, sin_ptr, t, stride_ct, 2, out_ptr, stride_ot, stride_oh, h, h_ok, QT, D, RD,
                    DC, BH, RT)
            finish(acc3, l_i, cos_ptr, sin_ptr, t, stride_ct, 3, out_ptr, stride_ot, stride_oh, h, h_ok, QT, D, RD,
                    DC, BH, RT)


def _views(data: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bytes, bf16 view, values) of one pool's storage; unused views are the storage itself."""
    if kind == "plain":
        return data, data, data
    h16 = data.view(torch.bfloat16) if kind == "v4_fp8" else data
    return data, h16, data


def _pow2_floor(n: int) -> int:
    """A computed split count as a power of two (>= 1): NSPLIT is a constexpr, and every token count of a step gave
    its own count, a kernel variant compiled while serving (seventeenth session's AgentX run: 2.5-8.5 s steps)."""
    return 1 << (max(1, n).bit_length() - 1)


def _kv_splits(cfg: Config, programs: int, rows_hint: int) -> int:
    """Programs per token's rows: up to about two waves over the GPU at decode (each keeping >= 2 row tiles; a power
    of two), one for prefills (plenty of tokens) or when the combine's arrival counters would not suffice."""
    if cfg.kv_splits:
        return cfg.kv_splits
    if programs > N_COUNTERS:
        return 1
    return _pow2_floor(min(cdiv(2 * _SMS, programs), rows_hint // (2 * cfg.rows), 16))


PART_BUDGET = 1 << 26  # flash mode: partial-accumulator elements per launch (long prefills with explicit kv_splits)


def _lines(row_bytes: int) -> int:
    """Prefetch addresses per record: its 128-B lines (+1: a record need not start on a line), a power of two."""
    return next_pow2(cdiv(row_bytes, 128) + 1)


def _flash_splits(cfg: Config, tokens: int, head_blocks: int, rows_hint: int) -> int:
    """Flash mode's programs per token's rows: explicit, or up to about one wave over the GPU (a program of all 64
    heads holds most of an SM's registers) as a power of two, each split keeping >= 2 row tiles, at most 16; one when
    the combine's arrival counters would not suffice for one launch."""
    if cfg.kv_splits:
        n = cfg.kv_splits
    else:
        n = _pow2_floor(min(_SMS // (tokens * head_blocks), rows_hint // (2 * cfg.rows), 16))
    return n if head_blocks <= N_COUNTERS else 1


@functools.lru_cache(maxsize=8)
def _parse_prefill(spec: str) -> Config:
    if spec.startswith("twopass,"):
        try:
            rows, warps, dchunk = (int(v) for v in spec.split(",")[1:])
        except ValueError:
            raise ValueError(f"{PREFILL_ENV}={spec!r}: expected twopass,rows,warps,dchunk (integers)") from None
        if rows not in (16, 32, 64, 128) or warps not in (4, 8) or dchunk not in (64, 128, 256):
            raise ValueError(f"{PREFILL_ENV}={spec!r}: rows in 16-128, warps 4 or 8, dchunk 64/128/256")
        return Config(64, rows, 1, warps, 1, mode=TWOPASS, dchunk=dchunk)
    try:
        heads, rows, warps, *rest = (int(v) for v in spec.split(","))
    except ValueError:
        raise ValueError(f"{PREFILL_ENV}={spec!r}: expected heads,rows,warps[,prefetch[,halves]] (integers)") from None
    if len(rest) > 2 or heads not in (16, 32, 64) or rows not in (16, 32, 64) or warps not in (4, 8, 16):
        raise ValueError(f"{PREFILL_ENV}={spec!r}: heads and rows in 16/32/64, warps in 4/8/16, at most 5 fields")
    prefetch, halves = (rest + [0, 0])[:2]
    return Config(heads, rows, 2 if halves else 1, warps, 1, mode=FLASH, dchunk=128, prefetch=int(bool(prefetch)))


def prefill_config() -> Config:
    """Prefill chunks' flash config: FLASH_PREFILL_CONFIG, or $V4SERVE_ATTN_PREFILL's."""
    spec = env_get(PREFILL_ENV)
    return _parse_prefill(spec) if spec else FLASH_PREFILL_CONFIG


def gpu_config(tokens: int, window, entries) -> Config:
    """The measured choice on the GPU: prefill chunks take prefill_config() in every record format (window-only
    layers too: twenty-fifth session); batched decode takes flash mode where it was timed (FLASH_DECODE_FORMATS: CSA
    picks over V4's 584-B records; CSA picks and HCA's visible entries over bf16 records, which staged rows are:
    attention_stage.py) and V4.1's records take V41_DECODE_CONFIG; a single row over staged picks SINGLE_PICKS_CONFIG;
    GPU_CONFIG otherwise."""
    lo, hi = FLASH_DECODE_TOKENS
    if tokens > hi:
        return prefill_config()
    if entries is None:
        return GPU_CONFIG
    if tokens < lo:
        staged = isinstance(entries.pool, attention_stage.StagedPool) and entries.picks is not None
        return SINGLE_PICKS_CONFIG if tokens == 1 and staged and env_get(SINGLE_ENV) != "0" else GPU_CONFIG
    if (window.pool.codec.kind, entries.pool.codec.kind) == ("fp8_b32", "nvfp4"):
        return V41_DECODE_CONFIG
    if window.pool.codec.kind != entries.pool.codec.kind:
        return GPU_CONFIG
    kind = "picks" if entries.picks is not None else "dense"
    if kind == "picks" and entries.pool.codec.kind == "plain" and env_get(BATCHED_ENV) == "heads":
        return GPU_CONFIG
    return FLASH_DECODE_CONFIG if kind in FLASH_DECODE_FORMATS.get(entries.pool.codec.kind, ()) else GPU_CONFIG


def flash_chunks(cfg: Config, D: int) -> tuple[int, int]:
    """Flash mode's decode / dot chunk width DC (cfg.dchunk where it splits D in 1, 2 or 4 even parts, else D) and
    its output halves per program DS (2 for dsplit 2 over 2 or 4 chunks: one KV split; else 1)."""
    dc = cfg.dchunk if cfg.dchunk and cfg.dchunk % 2 == 0 and D % cfg.dchunk == 0 and D // cfg.dchunk in (1, 2, 4) \
        else D
    return dc, 2 if cfg.dsplit == 2 and D // dc in (2, 4) else 1


def supports(q: torch.Tensor, kinds: tuple[str, ...]) -> bool:
    if any(k not in FORMATS for k in kinds):
        return False
    if q.is_cuda:
        return q.dtype in (torch.bfloat16, torch.float16, torch.float32)
    return q.device.type == "cpu" and interpreting() and q.dtype in (torch.bfloat16, torch.float32, torch.float64)


def attend(q, cos, sin, fresh, sink, scale, q_norm_eps, window, entries, config: Config | None = None,
           stage: bool | str | None = None):
    """The Triton body of ops.attention.attend (arguments as there); returns [T, H, D] in q's dtype. stage: decode
    the records once into staging rows first (attention_stage.py; True: every record the block tables address,
    "picks": the window rings and the CSA picks only; None = where its rules say)."""
    T, H, D = q.shape
    out = torch.empty_like(q)
    if T == 0:
        return out
    if stage is None:
        stage = attention_stage.wanted(T, window, entries, q.dtype, q.device) or (
            attention_stage.PICKS if attention_stage.picks_wanted(window, entries, q.dtype) else False)
    if stage == attention_stage.PICKS:
        window, entries = attention_stage.stage_picks(window, entries, q.dtype)
    elif stage:
        window, entries = attention_stage.stage(window, entries, q.dtype)
    cfg = config or (INTERPRETER_CONFIG if interpreting() else gpu_config(T, window, entries))
    dsplit = cfg.dsplit if D % cfg.dsplit == 0 and D // cfg.dsplit >= 2 * cos.shape[-1] else 1
    W = window.src.shape[1]
    RD = 2 * cos.shape[-1]
    q, fresh = q.contiguous(), fresh.contiguous()
    wdata = window.pool.data
    wkind = window.pool.codec.kind
    wu8, wh16, wval = _views(wdata, wkind)
    ring = window.ring_rows
    if entries is None:
        cmode, ckind, cdata, bt, tok_row, picks, vis = NO_ENTRIES, "plain", wdata, ring, ring, ring, ring
        ratio = block_size = epb = trash = n_picks = 1
    else:
        cdata, ckind, where = entries.pool.data, entries.pool.codec.kind, entries.where
        bt, tok_row = where.block_table, where.token_row
        ratio, block_size = where.ratio, where.block_size
        epb, trash = block_size // ratio, where.num_blocks
        if entries.picks is not None:
            cmode, picks, vis, n_picks = PICKED, entries.picks, entries.picks, entries.picks.shape[1]
        else:
            cmode, picks, vis, n_picks = DENSE, where.visible, where.visible, 0
    cu8, ch16, cval = _views(cdata, ckind)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dt = acc if q.dtype in (torch.float32, torch.float64) else q.dtype
    s_hi, s_lo = hi_lo(scale)
    per_token = picks.dim() > 1
    HB = cdiv(H, cfg.heads)

    def rows_for(lo: int, hi: int) -> dict:
        """Tokens [lo, hi)'s window addressing, pools, compressed entries and sizes, in the kernels' order."""
        return {"window": (window.src[lo:hi], window.valid[lo:hi], ring),
                "pools": (wu8, wh16, wval, wdata.stride(0), cu8, ch16, cval, cdata.stride(0)),
                "entries": (bt, bt.stride(0), tok_row[lo:hi] if entries is not None else tok_row,
                            picks[lo:hi] if per_token or cmode == DENSE else picks,
                            picks.stride(0) if per_token else 0, vis[lo:hi] if cmode == DENSE else vis),
                "sizes": (ring.shape[0], n_picks, ratio, block_size, epb, trash)}

    def row_args(lo: int, hi: int, qc: torch.Tensor, qp: torch.Tensor, part: torch.Tensor, cnt: torch.Tensor) -> tuple:
        """The arguments both kernels take for tokens [lo, hi), in their order."""
        a = rows_for(lo, hi)
        return (qc, qp, cos[lo:hi], sin[lo:hi], fresh, sink, out[lo:hi], part, cnt, *a["window"], *a["pools"],
                *a["entries"], H, *a["sizes"], s_hi, s_lo, q_norm_eps if q_norm_eps is not None else 0.0,
                qc.stride(0), qc.stride(1), cos.stride(0), fresh.stride(0), out.stride(0), out.stride(1))

    # every kernel's record formats, entry kind and precisions; the record strides' alignment (flash, twopass)
    tiles = dict(WFMT=FORMATS[wkind], CFMT=FORMATS[ckind], CMODE=cmode, DT=TL_DTYPES[dt], ACC=TL_DTYPES[acc],
                 HALF=dt in (torch.bfloat16, torch.float16), INTERPRET=interpreting())
    align = dict(WAL=math.gcd(wdata.stride(0), 16), CAL=math.gcd(cdata.stride(0), 16))
    if cfg.mode == TWOPASS and attention_twopass.supports(W, cfg.rows, D, cfg.dchunk or D):
        return attention_twopass.attend(q, cos, sin, fresh, sink, q_norm_eps, window, entries, cfg, rows_for,
                                        {**tiles, **align}, (s_hi, s_lo), n_picks, dt)

    if cfg.mode == FLASH:
        dc, ds = flash_chunks(cfg, D)
        nsplit = 1 if ds == 2 else _flash_splits(cfg, T, HB, W + (n_picks if cmode == PICKED else 4 * cfg.rows))
        chunk = TOKEN_CHUNK
        if nsplit > 1:  # the combine's counters and a bounded partials workspace
            chunk = max(1, min(TOKEN_CHUNK, N_COUNTERS // HB, PART_BUDGET // (HB * nsplit * cfg.heads * (D + 2))))
        cnt = _COUNTERS.get(q.device) if nsplit > 1 else out
        w_bytes, c_bytes = wdata.stride(0) * wdata.element_size(), cdata.stride(0) * cdata.element_size()
        for lo in range(0, T, chunk):
            hi = min(T, lo + chunk)
            qc = q[lo:hi]
            qp = torch.empty_like(qc)
            part = (torch.empty((hi - lo) * HB * nsplit * cfg.heads * (D + 2), dtype=acc, device=q.device)
                    if nsplit > 1 else out)
            _flash_kernel[(HB * ds, nsplit, hi - lo)](
                *row_args(lo, hi, qc, qp, part, cnt), w_bytes, c_bytes,
                D=D, RD=RD, W=W, BH=cfg.heads, BN=cfg.rows, DC=dc, NSPLIT=nsplit, QNORM=q_norm_eps is not None,
                PREFETCH=bool(cfg.prefetch) and not interpreting(), WNL=_lines(w_bytes), CNL=_lines(c_bytes), DS=ds,
                **tiles, **align, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(q))
        return out
    nsplit = _kv_splits(cfg, min(T, TOKEN_CHUNK) * HB * dsplit, W + (n_picks if cmode == PICKED else 4 * cfg.rows))
    cnt = _COUNTERS.get(q.device) if nsplit > 1 else out
    for lo in range(0, T, TOKEN_CHUNK):
        hi = min(T, lo + TOKEN_CHUNK)
        qc = q[lo:hi]
        qp = torch.empty_like(qc)  # the prepared queries (same strides as qc)
        part = (torch.empty((hi - lo) * HB * dsplit * nsplit * cfg.heads * (D // dsplit + 2), dtype=acc,
                            device=q.device) if nsplit > 1 else out)
        _attend_kernel[(hi - lo, HB, dsplit * nsplit)](
            *row_args(lo, hi, qc, qp, part, cnt),
            D=D, RD=RD, W=W, BH=cfg.heads, BN=cfg.rows, DC=D // dsplit, NSPLIT=nsplit, QNORM=q_norm_eps is not None,
            **tiles, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(q))
    return out
