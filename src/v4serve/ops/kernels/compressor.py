"""The compressor's gated pooling in one launch (the Triton body of ops.compressor.pool_groups).

Programs 0 .. G-1 each pool one (padded) group: they find the group's row and entry from the rows' completed-group
counts (a cumulative sum over the rows, in registers), resolve each of the group's m (2m with overlap) positions to
this step's fresh projections (plus the APE bias) or the row's state, and take the per-channel softmax-weighted sum;
they also compute the entry's pool row. Programs G .. G+R-1 each build one row's next state (its partial group and,
with overlap, the last complete one) into a scratch buffer: the state is copied into place after the launch, since
the group programs still read the old state. All shapes are static given (T, R), so the launch is graph-safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreting
from .split_grid import TL_DTYPES

BLOCK_D = 64  # channels per tile (an HCA group is 128 positions x 64 channels)


@triton.jit
def _resolve(pos, s, e, cur0, off, M: tl.constexpr, OVERLAP: tl.constexpr):
    """Where position `pos` (of a row starting this step at s, ending at e) lives: (fresh token index or -1,
    state position index or -1)."""
    fresh = (pos >= s) & (pos < e)
    t = tl.where(fresh, off + pos - s, -1)
    pm = tl.where(pos >= 0, pos % M, 0)
    in_cur = (pos < s) & (pos >= cur0)
    st = tl.where(in_cur, pm + (M if OVERLAP else 0), -1)
    if OVERLAP:
        in_prev = (pos < cur0) & (pos >= cur0 - M) & (pos >= 0)
        st = tl.where(in_prev, pm, st)
    return t, st


@triton.jit
def _load_cols(t, st, pm, chan0, cols, kv_ptr, sc_ptr, stride_kv, stride_sc, ape_ptr, skv_ptr, ssc_ptr, sbase,
               W: tl.constexpr, HAS_APE: tl.constexpr, ACC: tl.constexpr):
    """kv and score [slots, BD]: slot k's channels chan0[k] + cols, from its source (sentinel: kv 0, score -inf)."""
    fresh = t >= 0
    inst = st >= 0
    f2, s2 = fresh[:, None], inst[:, None]
    c2 = chan0[:, None] + cols[None, :]
    kv = tl.load(kv_ptr + t[:, None] * stride_kv + c2, mask=f2, other=0.0).to(ACC)
    sc = tl.load(sc_ptr + t[:, None] * stride_sc + c2, mask=f2, other=0.0).to(ACC)
    if HAS_APE:
        sc += tl.load(ape_ptr + pm[:, None] * W + c2, mask=f2, other=0.0).to(ACC)
    soff = sbase + st[:, None] * W + c2
    kv = tl.where(s2, tl.load(skv_ptr + soff, mask=s2, other=0.0).to(ACC), kv)
    sc = tl.where(s2, tl.load(ssc_ptr + soff, mask=s2, other=0.0).to(ACC), sc)
    sc = tl.where(f2 | s2, sc, float("-inf"))
    return kv, sc


@triton.jit
def _pool_kernel(kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, start_ptr, len_ptr, off_ptr, slot_ptr, bt_ptr, cached_ptr,
                 out_ptr, grow_ptr, gentry_ptr, gvalid_ptr, dest_ptr, nkv_ptr, nsc_ptr,
                 R, G, stride_kv, stride_sc, stride_bt, n_cols, block_size, num_blocks,
                 M: tl.constexpr, OVERLAP: tl.constexpr, HD: tl.constexpr, W: tl.constexpr, SL: tl.constexpr,
                 BLOCK_R: tl.constexpr, BD: tl.constexpr, HAS_APE: tl.constexpr, ACC: tl.constexpr,
                 OUT: tl.constexpr):
    pid = tl.program_id(0)
    if pid < G:
        # --- which row and entry: searchsorted(cumsum(completed per row), g, right=True), as the reference
        r = tl.arange(0, BLOCK_R)
        rm = r < R
        s_all = tl.load(start_ptr + r, mask=rm, other=0)
        e_all = s_all + tl.load(len_ptr + r, mask=rm, other=0)
        first_all = s_all // M
        cnt = e_all // M - first_all
        cum = tl.cumsum(cnt, 0)
        total = tl.sum(cnt, 0)
        row = tl.minimum(tl.sum((cum <= pid).to(tl.int32), 0), R - 1)
        pick = r == row
        before = tl.sum(tl.where(pick, cum - cnt, 0), 0)
        entry = tl.sum(tl.where(pick, first_all, 0), 0) + (pid - before)
        valid = pid < total
        s = tl.load(start_ptr + row)
        e = s + tl.load(len_ptr + row)
        off = tl.load(off_ptr + row)
        sbase = tl.load(slot_ptr + row) * (SL * W)
        cur0 = (s // M) * M
        # --- the group's positions: with overlap, slots 0..m-1 are group j-1 (channels [0, hd)) and m..2m-1 group j
        # (channels [hd, 2hd)); without, slots 0..m-1 are group j
        i = tl.arange(0, SL)
        if OVERLAP:
            pos = entry * M + i - M
            chan0 = tl.where(i >= M, HD, 0)
        else:
            pos = entry * M + i
            chan0 = i * 0
        t, st = _resolve(pos, s, e, cur0, off, M, OVERLAP)
        pm = tl.where(pos >= 0, pos % M, 0)
        if valid:
            for d0 in range(0, HD, BD):
                cols = d0 + tl.arange(0, BD)
                kv, sc = _load_cols(t, st, pm, chan0, cols, kv_ptr, sc_ptr, stride_kv, stride_sc, ape_ptr, skv_ptr,
                                    ssc_ptr, sbase, W, HAS_APE, ACC)
                mx = tl.max(sc, 0)
                mx = tl.where(mx == float("-inf"), 0.0, mx)
                p = tl.exp(sc - mx[None, :])
                den = tl.sum(p, 0)
                w = p / tl.where(den > 0, den, 1.0)[None, :]
                o = tl.sum(kv * w, 0)
                o = tl.where(den > 0, o, 0.0)  # a group with no position pools to 0, as the reference
                tl.store(out_ptr + pid * HD + cols, o.to(OUT))
        else:  # padding (most programs at decode): no loads; its entry goes to the trash row
            for d0 in range(0, HD, BD):
                cols = d0 + tl.arange(0, BD)
                tl.store(out_ptr + pid * HD + cols, tl.zeros((BD,), OUT))
        # --- the entry's pool row
        cached = (entry + 1) * M <= tl.load(cached_ptr + row)
        col = tl.minimum(tl.maximum(entry * M // block_size, 0), n_cols - 1)
        block = tl.load(bt_ptr + row * stride_bt + col)
        ok = valid & (~cached) & (block >= 0)
        block = tl.where(ok, block, num_blocks)
        epb = block_size // M
        tl.store(dest_ptr + pid, block * epb + tl.maximum(entry, 0) % epb)
        tl.store(grow_ptr + pid, row)
        tl.store(gentry_ptr + pid, entry)
        tl.store(gvalid_ptr + pid, valid.to(tl.int8))
    else:
        # --- row r's next state: [group before the partial one (overlap) |] the partial group, from cur0 of its end
        row = pid - G
        s = tl.load(start_ptr + row)
        e = s + tl.load(len_ptr + row)
        off = tl.load(off_ptr + row)
        sbase = tl.load(slot_ptr + row) * (SL * W)
        cur0 = (s // M) * M
        end0 = (e // M) * M
        j = tl.arange(0, SL)
        if OVERLAP:
            pos = end0 - M + j
            keep = tl.where(j < M, pos >= 0, pos < e)
        else:
            pos = end0 + j
            keep = pos < e
        t, st = _resolve(pos, s, e, cur0, off, M, OVERLAP)
        t = tl.where(keep, t, -1)
        st = tl.where(keep, st, -1)
        pm = tl.where(pos >= 0, pos % M, 0)
        zero = j * 0
        for c0 in range(0, W, BD):
            cols = c0 + tl.arange(0, BD)
            kv, sc = _load_cols(t, st, pm, zero, cols, kv_ptr, sc_ptr, stride_kv, stride_sc, ape_ptr, skv_ptr,
                                ssc_ptr, sbase, W, HAS_APE, ACC)
            dst = row * (SL * W) + j[:, None] * W + cols[None, :]
            tl.store(nkv_ptr + dst, kv.to(nkv_ptr.dtype.element_ty))
            tl.store(nsc_ptr + dst, sc.to(nsc_ptr.dtype.element_ty))


def supports(kv: torch.Tensor, state_kv: torch.Tensor) -> bool:
    if kv.is_cuda:
        return kv.dtype in (torch.float32, torch.bfloat16) and state_kv.is_contiguous()
    return kv.device.type == "cpu" and interpreting() and state_kv.is_contiguous()


def pool_groups(kv, score, ape, step, state_kv, state_score, ratio, overlap, head_dim, dest, out_dtype):
    """The Triton body of ops.compressor.pool_groups (arguments and results as there)."""
    from ..compressor import Groups

    T, R = step.num_tokens, step.num_rows
    G = T // ratio + R
    W = kv.shape[1]
    SL = (2 if overlap else 1) * ratio
    dev = kv.device
    acc = torch.float64 if torch.float64 in (kv.dtype, state_kv.dtype) else torch.float32
    kv, score = kv.contiguous(), score.contiguous()
    pooled = torch.empty(G, head_dim, dtype=out_dtype, device=dev)
    grow = torch.empty(G, dtype=torch.int64, device=dev)
    gentry = torch.empty(G, dtype=torch.int64, device=dev)
    gvalid = torch.empty(G, dtype=torch.int8, device=dev)
    rows = torch.empty(G, dtype=torch.int64, device=dev)
    new_kv = torch.empty(R, SL, W, dtype=state_kv.dtype, device=dev)
    new_sc = torch.empty(R, SL, W, dtype=state_score.dtype, device=dev)
    bt = step.block_table
    _pool_kernel[(G + R,)](
        kv, score, ape if ape is not None else kv, state_kv, state_score, step.row_start, step.row_len,
        step.row_offset, step.row_slot, bt, step.cached_len, pooled, grow, gentry, gvalid, rows, new_kv, new_sc,
        R, G, kv.stride(0), score.stride(0), bt.stride(0), bt.shape[1], dest.block_size, dest.num_blocks,
        M=ratio, OVERLAP=overlap, HD=head_dim, W=W, SL=SL, BLOCK_R=max(16, triton.next_power_of_2(R)),
        BD=min(BLOCK_D, head_dim), HAS_APE=ape is not None, ACC=TL_DTYPES[acc], OUT=TL_DTYPES[out_dtype],
        num_warps=8 if SL >= 64 else 4)
    state_kv[step.row_slot] = new_kv
    state_score[step.row_slot] = new_sc
    return pooled, Groups(grow, gentry, gvalid.bool()), rows
