"""Sparse attention for prefill chunks in three launches over a score scratch (ops/attention.attend's signature).

Why: the flash kernel keeps one token's [heads, 512] float32 accumulator in registers for its whole row loop: ~255
registers a thread, one program an SM, and each row tile waits on its own gathers (H200, twenty-first session: 12% of
the bf16 peak on a 4K chunk at its best tiles). Here every program holds a small tile, so several share an SM and
hide each other's gathers:

1. scores: program (row tile, token). S[t, :, tile] = q'(t) K(tile)^T x scale for all heads at once (64 heads: the
   tensor cores' M), -inf where a row does not count, into a float32 scratch [T, H, R] (R: the tiles' rows).
2. softmax: program (head block, token). The sink joins the row maximum and the sum (a logit in the denominator
   only); P = exp(S - m) / l in the dot dtype, into a second scratch.
3. P.V: program (D chunk, token). O[t, :, chunk] = P(t) K(rows)[:, chunk] over the token's tiles, then the inverse
   RoPE; each record is read once per D chunk.

A token's rows are [window W | compressed n_c(t)] as in the flash kernel (CSA picks, or HCA's visible entries: the
work follows each token's own count); a tile is all window or all compressed (its rows divide W). The queries are
prepared (norm, RoPE) once per token by a fourth, small launch. Scratch: (4 + dot bytes) x H x R per token, bounded
per launch by SCRATCH_BYTES (within engine/memory.activation_reserve's attention term, 16 x H x R per token).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import cdiv, interpreting, next_pow2, step_jit
from .attention_rows import (dot, entry_count, entry_idx, entry_rows, finish, prepare_queries, rows_kv, win_rows,
                             win_src)
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch

SCRATCH_BYTES = 1 << 30  # scores + probabilities per launch (long contexts' HCA rows: fewer tokens a launch)


@step_jit
def _prepare_kernel(q_ptr, qp_ptr, cos_ptr, sin_ptr, H, stride_qt, stride_qh, stride_ct, eps,
                    D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr, BH: tl.constexpr, QNORM: tl.constexpr,
                    ACC: tl.constexpr, DT: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    t = tl.program_id(1).to(tl.int64)
    h = tl.program_id(0) * BH + tl.arange(0, BH)
    prepare_queries(q_ptr, qp_ptr, cos_ptr, sin_ptr, t, h, h < H, stride_qt, stride_qh, stride_ct, eps, D, RD, DC, BH,
                    QNORM, ACC, DT)


@step_jit
def _scores_kernel(qp_ptr, fresh_ptr, s_ptr, win_src_ptr, win_ok_ptr, ring_ptr, wu8_ptr, wh16_ptr, wval_ptr, w_stride,
                   cu8_ptr, ch16_ptr, cval_ptr, c_stride, bt_ptr, bt_stride, tok_row_ptr, pick_ptr, pick_stride,
                   vis_ptr, H, RW, n_picks, ratio, block_size, epb, trash_block, scale_hi, scale_lo,
                   stride_qt, stride_qh, stride_ft, stride_st, stride_sh,
                   D: tl.constexpr, RD: tl.constexpr, W: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr,
                   DC: tl.constexpr, WFMT: tl.constexpr, CFMT: tl.constexpr, CMODE: tl.constexpr, DT: tl.constexpr,
                   ACC: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr, WAL: tl.constexpr,
                   CAL: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (row tiles, tokens): one tile of a token's rows against all its heads."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    w_stride = (w_stride // WAL) * WAL  # said so, the record loads vectorise (as in the flash kernel)
    c_stride = (c_stride // CAL) * CAL
    r0 = tl.program_id(0) * BR
    t = tl.program_id(1).to(tl.int64)
    n_c = entry_count(vis_ptr, t, n_picks, CMODE)
    if r0 < W + n_c:
        h = tl.arange(0, BH)
        h_ok = h < H
        cd = tl.arange(0, DC)
        qp = qp_ptr + t * stride_qt + h[:, None] * stride_qh
        s = tl.zeros((BH, BR), ACC)
        if r0 < W:
            src, ok = win_src(t, r0, W, W, win_src_ptr, win_ok_ptr, BR)
            rows, ring = win_rows(src, ok, ring_ptr, RW)
            for ci in tl.static_range(D // DC):
                k = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, src - RW, ci * DC, wu8_ptr, wh16_ptr, wval_ptr,
                            w_stride, WFMT, True, DC, D, RD, DT)
                s += dot(tl.load(qp + ci * DC + cd[None, :], mask=h_ok[:, None], other=0.0), tl.trans(k), ACC,
                         HALF, INTERPRET)
        else:
            j, ok = entry_idx(t, r0 - W, n_c, pick_ptr, pick_stride, CMODE, BR)
            rows = entry_rows(j, ok, bt_ptr, tl.load(tok_row_ptr + t), bt_stride, ratio, block_size, epb,
                              trash_block)
            for ci in tl.static_range(D // DC):
                k = rows_kv(rows, ok, ok, fresh_ptr, stride_ft, j, ci * DC, cu8_ptr, ch16_ptr, cval_ptr, c_stride,
                            CFMT, False, DC, D, RD, DT)
                s += dot(tl.load(qp + ci * DC + cd[None, :], mask=h_ok[:, None], other=0.0), tl.trans(k), ACC,
                         HALF, INTERPRET)
        s = s * scale_hi + s * scale_lo  # the scale as two fp32 halves: fp64 runs need its full precision
        s = tl.where(ok[None, :], s, float("-inf"))
        cols = r0 + tl.arange(0, BR)
        tl.store(s_ptr + t * stride_st + h[:, None] * stride_sh + cols[None, :], s, mask=h_ok[:, None])


@step_jit
def _softmax_kernel(s_ptr, p_ptr, sink_ptr, vis_ptr, H, n_picks, stride_st, stride_sh, stride_pt, stride_ph,
                    W: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr, CMODE: tl.constexpr, ACC: tl.constexpr,
                    PDL: tl.constexpr = False):
    """Grid (head blocks, tokens): P = softmax over [sink | the token's rows], the sink's share dropped."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    t = tl.program_id(1).to(tl.int64)
    h = tl.program_id(0) * BH + tl.arange(0, BH)
    h_ok = h < H
    n = W + entry_count(vis_ptr, t, n_picks, CMODE)
    srow = s_ptr + t * stride_st + h[:, None] * stride_sh
    prow = p_ptr + t * stride_pt + h[:, None] * stride_ph
    m = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(ACC)
    l_i = tl.full((BH,), 1.0, ACC)
    for r0 in range(0, n, BR):  # online max and sum
        c = r0 + tl.arange(0, BR)
        x = tl.load(srow + c[None, :], mask=h_ok[:, None] & (c < n)[None, :], other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 1))
        l_i = l_i * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
        m = m_new
    for r0 in range(0, n, BR):
        c = r0 + tl.arange(0, BR)
        x = tl.load(srow + c[None, :], mask=h_ok[:, None] & (c < n)[None, :], other=float("-inf"))
        p = tl.exp(x - m[:, None]) / l_i[:, None]
        tl.store(prow + c[None, :], p.to(p_ptr.dtype.element_ty), mask=h_ok[:, None] & (c < n)[None, :])


@step_jit
def _pv_kernel(p_ptr, fresh_ptr, out_ptr, cos_ptr, sin_ptr, win_src_ptr, win_ok_ptr, ring_ptr, wu8_ptr, wh16_ptr,
               wval_ptr, w_stride, cu8_ptr, ch16_ptr, cval_ptr, c_stride, bt_ptr, bt_stride, tok_row_ptr, pick_ptr,
               pick_stride, vis_ptr, H, RW, n_picks, ratio, block_size, epb, trash_block,
               stride_pt, stride_ph, stride_ft, stride_ct, stride_ot, stride_oh,
               D: tl.constexpr, RD: tl.constexpr, W: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr,
               DC: tl.constexpr, WFMT: tl.constexpr, CFMT: tl.constexpr, CMODE: tl.constexpr, DT: tl.constexpr,
               ACC: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr, WAL: tl.constexpr,
               CAL: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (D chunks, tokens): one chunk of a token's output dims for all heads, over all its row tiles."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    w_stride = (w_stride // WAL) * WAL
    c_stride = (c_stride // CAL) * CAL
    pd = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    RT = tl.float64 if ACC == tl.float64 else tl.float32
    h = tl.arange(0, BH)
    h_ok = h < H
    n_c = entry_count(vis_ptr, t, n_picks, CMODE)
    n = W + n_c
    prow = p_ptr + t * stride_pt + h[:, None] * stride_ph
    acc = tl.zeros((BH, DC), ACC)
    for r0 in range(0, W, BR):  # window tiles
        src, ok = win_src(t, r0, W, W, win_src_ptr, win_ok_ptr, BR)
        rows, ring = win_rows(src, ok, ring_ptr, RW)
        k = rows_kv(rows, ok, ring, fresh_ptr, stride_ft, src - RW, pd * DC, wu8_ptr, wh16_ptr, wval_ptr, w_stride,
                    WFMT, True, DC, D, RD, DT)
        c = r0 + tl.arange(0, BR)
        p = tl.load(prow + c[None, :], mask=h_ok[:, None], other=0.0)
        acc += dot(p, k, ACC, HALF, INTERPRET)
    if CMODE != 0:
        r = tl.load(tok_row_ptr + t)
        for r0 in range(W, n, BR):  # compressed tiles
            j, ok = entry_idx(t, r0 - W, n_c, pick_ptr, pick_stride, CMODE, BR)
            rows = entry_rows(j, ok, bt_ptr, r, bt_stride, ratio, block_size, epb, trash_block)
            k = rows_kv(rows, ok, ok, fresh_ptr, stride_ft, j, pd * DC, cu8_ptr, ch16_ptr, cval_ptr, c_stride,
                        CFMT, False, DC, D, RD, DT)
            c = r0 + tl.arange(0, BR)
            p = tl.load(prow + c[None, :], mask=h_ok[:, None] & (c < n)[None, :], other=0.0)
            acc += dot(p, k, ACC, HALF, INTERPRET)
    finish(acc, tl.full((BH,), 1.0, ACC), cos_ptr, sin_ptr, t, stride_ct, pd, out_ptr, stride_ot, stride_oh, h, h_ok,
           out_ptr.dtype.element_ty, D, RD, DC, BH, RT)


def supports(W: int, rows: int, D: int, dchunk: int) -> bool:
    """A tile is all window or all compressed (its rows divide W); the D chunks tile D."""
    return W % rows == 0 and D % dchunk == 0 and dchunk % 2 == 0


def attend(q, cos, sin, fresh, sink, q_norm_eps, window, entries, cfg, rows_for, consts: dict,
           scale: tuple[float, float], n_picks: int, dt: torch.dtype) -> torch.Tensor:
    """ops.attention.attend in three launches (see the module's docstring) over tokens in scratch-bounded groups, as
    kernels/attention.attend prepares them: cfg (rows a tile, dchunk = P.V's output chunk, warps), rows_for(lo, hi)
    (tokens [lo, hi)'s window, pools, entries and sizes arguments), the kernels' record / precision constexprs, the
    scale's two fp32 halves, the CSA picks' width and the dots' dtype."""
    T, H, D = q.shape
    out = torch.empty_like(q)
    W = window.src.shape[1]
    BH = next_pow2(H)
    rows, dchunk, cmode = cfg.rows, cfg.dchunk or D, consts["CMODE"]
    n_c = n_picks if cmode == 1 else (entries.where.max_entries if cmode == 2 else 0)
    R = cdiv(W + n_c, rows) * rows
    chunk = max(1, min(T, SCRATCH_BYTES // (H * R * (4 + dt.itemsize))))
    qp = torch.empty_like(q)
    shape = dict(D=D, RD=2 * cos.shape[-1], W=W, BH=BH, BR=rows, DC=dchunk)
    for lo in range(0, T, chunk):
        hi = min(T, lo + chunk)
        n = hi - lo
        a = rows_for(lo, hi)
        pbh = min(BH, 16 if interpreting() else 64)
        _prepare_kernel[(cdiv(H, pbh), n)](
            q[lo:hi], qp[lo:hi], cos[lo:hi], sin[lo:hi], H, q.stride(0), q.stride(1), cos.stride(0),
            q_norm_eps if q_norm_eps is not None else 0.0, D=D, RD=shape["RD"], DC=dchunk, BH=pbh,
            QNORM=q_norm_eps is not None, ACC=consts["ACC"], DT=consts["DT"], **pdl_launch(q))
        s = torch.empty(n, H, R, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=q.device)
        p = torch.empty(n, H, R, dtype=dt, device=q.device)
        _scores_kernel[(R // rows, n)](
            qp[lo:hi], fresh, s, *a["window"], *a["pools"], *a["entries"], H, *a["sizes"], *scale, q.stride(0),
            q.stride(1), fresh.stride(0), s.stride(0), s.stride(1), **shape, **consts, num_warps=cfg.num_warps,
            num_stages=1, **pdl_launch(q))
        sm_bh = min(BH, 16)
        _softmax_kernel[(cdiv(H, sm_bh), n)](
            s, p, sink, a["entries"][5], H, n_picks, s.stride(0), s.stride(1), p.stride(0), p.stride(1), W=W,
            BH=sm_bh, BR=rows, CMODE=cmode, ACC=consts["ACC"], num_warps=4, **pdl_launch(q))
        _pv_kernel[(D // dchunk, n)](
            p, fresh, out[lo:hi], cos[lo:hi], sin[lo:hi], *a["window"], *a["pools"], *a["entries"], H, *a["sizes"],
            p.stride(0), p.stride(1), fresh.stride(0), cos.stride(0), out.stride(0), out.stride(1), **shape,
            **consts, num_warps=cfg.num_warps, num_stages=1, **pdl_launch(q))
    return out
