"""The compressor's gated pooling (the Triton body of ops.compressor.pool_groups).

`_pool_kernel`: programs (g, c), g < G, each pool channel block c of one (padded) group of the step's plan
(ops.compressor.completed_groups, computed once per step and ratio): they resolve each of the group's m (2m with
overlap) positions to this step's fresh projections (plus the APE bias) or the row's state, and take the
per-channel softmax-weighted sum (padding programs only write zeros). `_write_state_kernel` then writes each token's
projections into its position's state slot where a later step reads them: a launch of its own, since the pooling
still reads the old state, except in a step of at most one token per row (`one_token_rows`: decode steps), where
no token's slot is one a group reads from the state and the writes run as extra programs of the pooling launch.
All shapes are static given (T, R), so both launches are graph-safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreting, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .split_grid import TL_DTYPES

BLOCK_D = 64  # channels per program (an HCA group's tile is 128 positions x 64 channels)


@triton.jit
def _state_index(p, M: tl.constexpr, OVERLAP: tl.constexpr):
    """ops.compressor.state_index: position p's slot in its row's state (p >= 0)."""
    if OVERLAP:
        return ((p // M) % 2) * M + p % M
    else:
        return p % M


@triton.jit
def _resolve(pos, s, e, off, M: tl.constexpr, OVERLAP: tl.constexpr):
    """Where position `pos` (of a row starting this step at s, ending at e) lives: (fresh token index or -1, state
    index or -1). The state holds the positions of the row's last group before s (and, with overlap, the one before
    it), at their position-indexed slots (ops.compressor.state_index)."""
    fresh = (pos >= s) & (pos < e)
    t = tl.where(fresh, off + pos - s, -1)
    p0 = tl.maximum(pos, 0)
    live_from = (s // M) * M - (M if OVERLAP else 0)
    in_state = (pos < s) & (pos >= live_from) & (pos >= 0)
    return t, tl.where(in_state, _state_index(p0, M, OVERLAP), -1)


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


@step_jit
def _pool_kernel(kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, start_ptr, len_ptr, off_ptr, slot_ptr,
                 grow_ptr, gentry_ptr, gvalid_ptr, out_ptr, stride_kv, stride_sc, pos_ptr, trow_ptr, n_groups,
                 trash_slot, M: tl.constexpr, OVERLAP: tl.constexpr, HD: tl.constexpr, W: tl.constexpr,
                 SL: tl.constexpr, BD: tl.constexpr, HAS_APE: tl.constexpr, ACC: tl.constexpr, OUT: tl.constexpr,
                 BW: tl.constexpr = 1, WRITE: tl.constexpr = False, PDL: tl.constexpr = False):
    """Programs (g, c) < n_groups pool group g's channel block c; with WRITE (no row with more than one token) the
    programs (n_groups + t, 0) also write token t's state, as _write_state_kernel does: a decode token's slot is
    none that a group of this step reads from the state (a group's positions span SL consecutive slots, and the
    token is one of them, read fresh)."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    if WRITE and tl.program_id(0) >= n_groups:
        if tl.program_id(1) == 0:
            _write_token(tl.program_id(0).to(tl.int64) - n_groups, kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr,
                         pos_ptr, trow_ptr, start_ptr, len_ptr, slot_ptr, trash_slot, stride_kv, stride_sc, M,
                         OVERLAP, W, SL, BW, HAS_APE)
    else:
        _pool_group(kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, start_ptr, len_ptr, off_ptr, slot_ptr, grow_ptr,
                    gentry_ptr, gvalid_ptr, out_ptr, stride_kv, stride_sc, M, OVERLAP, HD, W, SL, BD, HAS_APE, ACC,
                    OUT)


@triton.jit
def _pool_group(kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, start_ptr, len_ptr, off_ptr, slot_ptr, grow_ptr,
                gentry_ptr, gvalid_ptr, out_ptr, stride_kv, stride_sc, M: tl.constexpr, OVERLAP: tl.constexpr,
                HD: tl.constexpr, W: tl.constexpr, SL: tl.constexpr, BD: tl.constexpr, HAS_APE: tl.constexpr,
                ACC: tl.constexpr, OUT: tl.constexpr):
    """One (padded) group of the step's plan, one block of BD channels: its softmax-weighted sum, or zeros."""
    pid = tl.program_id(0)
    row = tl.load(grow_ptr + pid)
    entry = tl.load(gentry_ptr + pid)
    valid = tl.load(gvalid_ptr + pid) != 0
    s = tl.load(start_ptr + row)
    e = s + tl.load(len_ptr + row)
    off = tl.load(off_ptr + row)
    sbase = tl.load(slot_ptr + row) * (SL * W)
    # --- the group's positions: with overlap, slots 0..m-1 are group j-1 (channels [0, hd)) and m..2m-1 group j
    # (channels [hd, 2hd)); without, slots 0..m-1 are group j
    i = tl.arange(0, SL)
    if OVERLAP:
        pos = entry * M + i - M
        chan0 = tl.where(i >= M, HD, 0)
    else:
        pos = entry * M + i
        chan0 = i * 0
    t, st = _resolve(pos, s, e, off, M, OVERLAP)
    pm = tl.where(pos >= 0, pos % M, 0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)  # this program's channels (the groups' channels in parallel)
    if valid:
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
        tl.store(out_ptr + pid * HD + cols, tl.zeros((BD,), OUT))


@step_jit
def _write_state_kernel(kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, pos_ptr, trow_ptr, start_ptr, len_ptr, slot_ptr,
                        trash_slot, stride_kv, stride_sc, M: tl.constexpr, OVERLAP: tl.constexpr, W: tl.constexpr,
                        SL: tl.constexpr, BW: tl.constexpr, HAS_APE: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    _write_token(tl.program_id(0).to(tl.int64), kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, pos_ptr, trow_ptr,
                 start_ptr, len_ptr, slot_ptr, trash_slot, stride_kv, stride_sc, M, OVERLAP, W, SL, BW, HAS_APE)


@triton.jit
def _write_token(t, kv_ptr, sc_ptr, ape_ptr, skv_ptr, ssc_ptr, pos_ptr, trow_ptr, start_ptr, len_ptr, slot_ptr,
                 trash_slot, stride_kv, stride_sc, M: tl.constexpr, OVERLAP: tl.constexpr, W: tl.constexpr,
                 SL: tl.constexpr, BW: tl.constexpr, HAS_APE: tl.constexpr):
    """Token t's kv and score (+ APE) to its position's state slot when a later step reads it (from the start of its
    row's last group, with overlap the one before too), else to the trash slot."""
    pos = tl.load(pos_ptr + t)
    r = tl.load(trow_ptr + t)
    e = tl.load(start_ptr + r) + tl.load(len_ptr + r)
    keep_from = (e // M) * M - (M if OVERLAP else 0)
    slot = tl.where(pos >= keep_from, tl.load(slot_ptr + r), trash_slot)
    base = (slot * SL + _state_index(pos, M, OVERLAP)) * W
    for c0 in range(0, W, BW):
        c = c0 + tl.arange(0, BW)
        kv = tl.load(kv_ptr + t * stride_kv + c)
        sc = tl.load(sc_ptr + t * stride_sc + c)
        if HAS_APE:  # the stored score carries the APE bias, added in the score's dtype as the reference does
            sc = sc + tl.load(ape_ptr + (pos % M) * W + c).to(sc.dtype)
        tl.store(skv_ptr + base + c, kv.to(skv_ptr.dtype.element_ty))
        tl.store(ssc_ptr + base + c, sc.to(ssc_ptr.dtype.element_ty))


def supports(kv: torch.Tensor, state_kv: torch.Tensor) -> bool:
    if kv.is_cuda:
        return kv.dtype in (torch.float32, torch.bfloat16) and state_kv.is_contiguous()
    return kv.device.type == "cpu" and interpreting() and state_kv.is_contiguous()


def pool_groups(kv, score, ape, step, groups, state_kv, state_score, ratio, overlap, head_dim, out_dtype):
    """The Triton body of ops.compressor.pool_groups (arguments and result as there)."""
    T = step.num_tokens
    G = groups.row.shape[0]
    W = kv.shape[1]
    SL = (2 if overlap else 1) * ratio
    dev = kv.device
    acc = torch.float64 if torch.float64 in (kv.dtype, state_kv.dtype) else torch.float32
    # row strides are the kernel's arguments: column views of a stacked projection stay as they are
    kv, score = (t if t.stride(-1) == 1 else t.contiguous() for t in (kv, score))
    pooled = torch.empty(G, head_dim, dtype=out_dtype, device=dev)
    # at most one token per row (decode steps): the state writes ride in the pooling launch
    fused = step.one_token_rows and T > 0
    if G or fused:
        _pool_kernel[(G + (T if fused else 0), head_dim // min(BLOCK_D, head_dim))](
            kv, score, ape if ape is not None else kv, state_kv, state_score, step.row_start, step.row_len,
            step.row_offset, step.row_slot, groups.row, groups.entry, groups.valid, pooled, kv.stride(0),
            score.stride(0), step.positions, step.token_row, G, state_kv.shape[0] - 1, M=ratio, OVERLAP=overlap,
            HD=head_dim, W=W, SL=SL, BD=min(BLOCK_D, head_dim), HAS_APE=ape is not None, ACC=TL_DTYPES[acc],
            OUT=TL_DTYPES[out_dtype], BW=min(256, W), WRITE=fused, num_warps=4, **pdl_launch(kv))
    if T and not fused:  # after the pooling, which reads the positions these writes may replace
        _write_state_kernel[(T,)](
            kv, score, ape if ape is not None else kv, state_kv, state_score, step.positions, step.token_row,
            step.row_start, step.row_len, step.row_slot, state_kv.shape[0] - 1, kv.stride(0), score.stride(0),
            M=ratio, OVERLAP=overlap, W=W, SL=SL, BW=min(256, W), HAS_APE=ape is not None, num_warps=2,
            **pdl_launch(kv))
    return pooled
