"""A step's addressing in one launch for the window and one per compression ratio (the Triton bodies of
ops.addressing): the integer arithmetic of the references, element by element, and the RoPE tables as their float32
products' cos and sin.

`_window_kernel`: programs t < cdiv(T, BT) take BT tokens x the W window positions (src, valid), their window write
row and RoPE tables; programs after them take BT rows' ring rows.
`_compression_kernel`: programs of BG groups each; every program reads all R rows' group counts (R <= MAX_ROWS) and
finds its groups' rows as the reference's searchsorted over the counts' prefix sums does, then their entries, pool
rows and RoPE; the first cdiv(T, BG) programs also write BG tokens' visible counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ..addressing import Compression, WindowAddressing, WindowRows
from ..compressor import Groups, StepRows
from . import cdiv, interpreting, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch

MAX_ROWS = 4096  # the compression kernel holds every row's count in registers
BT = 16  # tokens (or rows) a window program
BG = 16  # groups a compression program


def supports(step: StepRows) -> bool:
    t = step.positions
    return (t.is_cuda or (t.device.type == "cpu" and interpreting())) and 0 < step.num_rows <= MAX_ROWS \
        and step.num_tokens > 0


@step_jit
def _window_kernel(pos_ptr, row_ptr, start_ptr, len_ptr, offset_ptr, slot_ptr, floor_ptr, src_ptr, valid_ptr,
                   ring_ptr, write_ptr, f0_ptr, cos0_ptr, sin0_ptr, f1_ptr, cos1_ptr, sin1_ptr, T, R, trash_slot,
                   W: tl.constexpr, BW: tl.constexpr, NT, HALF: tl.constexpr, BH: tl.constexpr,
                   N_ROPE: tl.constexpr, BT: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    k = tl.arange(0, BW)
    km = k < W
    if pid < NT:
        t = pid * BT + tl.arange(0, BT)
        tm = t < T
        pos = tl.load(pos_ptr + t, mask=tm, other=0)
        r = tl.load(row_ptr + t, mask=tm, other=0)
        start = tl.load(start_ptr + r, mask=tm, other=0)
        floor = tl.load(floor_ptr + r, mask=tm, other=0)
        off = tl.load(offset_ptr + r, mask=tm, other=0)
        slot = tl.load(slot_ptr + r, mask=tm, other=0)
        rlen = tl.load(len_ptr + r, mask=tm, other=0)
        p = pos[:, None] - (W - 1) + k[None, :]
        valid = (p >= 0) & (p >= floor[:, None])
        fresh_idx = tl.maximum(off[:, None] + (p - start[:, None]), 0)
        ring_idx = r[:, None] * W + ((p % W) + W) % W  # torch.remainder: non-negative for negative p
        src = tl.where(p >= start[:, None], R * W + fresh_idx, ring_idx)
        m2 = tm[:, None] & km[None, :]
        o2 = t[:, None].to(tl.int64) * W + k[None, :]
        tl.store(src_ptr + o2, src, mask=m2)
        tl.store(valid_ptr + o2, valid.to(tl.int8), mask=m2)
        keep = (pos >= start + rlen - W) & (pos >= floor)
        wslot = tl.where(keep, slot, trash_slot)
        tl.store(write_ptr + t, wslot * W + pos % W, mask=tm)
        if N_ROPE > 0:
            h = tl.arange(0, BH)
            hm = h < HALF
            mr = tm[:, None] & hm[None, :]
            orr = t[:, None].to(tl.int64) * HALF + h[None, :]
            f0 = tl.load(f0_ptr + h, mask=hm, other=0.0)
            a0 = pos.to(tl.float32)[:, None] * f0[None, :]
            tl.store(cos0_ptr + orr, tl.cos(a0), mask=mr)
            tl.store(sin0_ptr + orr, tl.sin(a0), mask=mr)
            if N_ROPE > 1:
                f1 = tl.load(f1_ptr + h, mask=hm, other=0.0)
                a1 = pos.to(tl.float32)[:, None] * f1[None, :]
                tl.store(cos1_ptr + orr, tl.cos(a1), mask=mr)
                tl.store(sin1_ptr + orr, tl.sin(a1), mask=mr)
    else:
        rr = (pid - NT) * BT + tl.arange(0, BT)
        rm = rr < R
        slot = tl.load(slot_ptr + rr, mask=rm, other=0)
        o2 = rr[:, None].to(tl.int64) * W + k[None, :]
        tl.store(ring_ptr + o2, slot[:, None] * W + k[None, :], mask=rm[:, None] & km[None, :])


def window_addressing(step: WindowRows, window: int, trash_slot: int,
                      freqs: Sequence[torch.Tensor]) -> WindowAddressing:
    """The Triton body of ops.addressing.window_addressing over a ring of `window` slots a row (KVPools.window_rows:
    slot * window + position mod window) with its trash slot; at most two freqs."""
    if len(freqs) > 2:
        raise ValueError("the window kernel writes at most two RoPE tables")
    T, R, W = step.num_tokens, step.num_rows, window
    pos = step.positions
    dev = pos.device
    src = torch.empty(T, W, dtype=torch.int64, device=dev)
    valid = torch.empty(T, W, dtype=torch.bool, device=dev)
    ring = torch.empty(R * W, dtype=torch.int64, device=dev)
    write = torch.empty(T, dtype=torch.int64, device=dev)
    half = int(freqs[0].shape[0]) if freqs else 1
    tables = [(torch.empty(T, half, dtype=torch.float32, device=dev),
               torch.empty(T, half, dtype=torch.float32, device=dev)) for _ in freqs]
    f = [fr.to(torch.float32).contiguous() for fr in freqs] + [pos] * (2 - len(freqs))
    cs = [c for pair in tables for c in pair] + [src] * (4 - 2 * len(tables))
    nt = cdiv(T, BT)
    _window_kernel[(nt + cdiv(R, BT),)](
        pos, step.token_row, step.row_start, step.row_len, step.row_offset, step.row_slot, step.window_floor, src,
        valid.view(torch.int8), ring, write, f[0], cs[0], cs[1], f[1], cs[2], cs[3], T, R, trash_slot, W=W,
        BW=next_pow2(W), NT=nt, HALF=half, BH=next_pow2(half), N_ROPE=len(freqs), BT=BT,
        num_warps=4, **pdl_launch(pos))
    return WindowAddressing(src, valid, ring, write, tables)


@step_jit
def _compression_kernel(pos_ptr, start_ptr, len_ptr, cached_ptr, bt_ptr, bt_stride, bt_cols, freq_ptr, grow_ptr,
                        entry_ptr, gvalid_ptr, rows_ptr, cos_ptr, sin_ptr, vis_ptr, T, R, G, num_blocks,
                        M: tl.constexpr, BLOCK_SIZE: tl.constexpr, BR: tl.constexpr, HALF: tl.constexpr,
                        BH: tl.constexpr, BG: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    PER_BLOCK: tl.constexpr = BLOCK_SIZE // M
    # visible counts of BG tokens
    t = pid * BG + tl.arange(0, BG)
    tm = t < T
    pos = tl.load(pos_ptr + t, mask=tm, other=0)
    tl.store(vis_ptr + t, (pos + 1) // M, mask=tm)
    # every row's count of groups completed in this step, and their prefix sums
    r = tl.arange(0, BR)
    rm = r < R
    s = tl.load(start_ptr + r, mask=rm, other=0)
    e = s + tl.load(len_ptr + r, mask=rm, other=0)
    count = tl.where(rm, e // M - s // M, 0)
    cum = tl.cumsum(count, 0)
    total = tl.sum(count, 0)
    g = pid * BG + tl.arange(0, BG)
    gm = g < G
    # searchsorted(cum, g, right=True) over the R real rows, clamped to the last row
    row = tl.sum(((cum[None, :] <= g[:, None]) & rm[None, :]).to(tl.int64), 1)
    row = tl.minimum(row, R - 1)
    before = tl.sum(tl.where(r[None, :] < row[:, None], count[None, :], 0), 1)
    first = tl.load(start_ptr + row, mask=gm, other=0) // M
    entry = first + (g - before)
    valid = g < total
    # dest_rows: the row's block for entry j, or the trash block for padding and already cached entries
    j = tl.maximum(entry, 0)
    cached = tl.load(cached_ptr + row, mask=gm, other=0)
    fresh = valid & ((entry + 1) * M > cached)
    col = tl.minimum(tl.maximum(j * M // BLOCK_SIZE, 0), bt_cols - 1)
    blk = tl.load(bt_ptr + row.to(tl.int64) * bt_stride + col, mask=gm, other=0).to(tl.int64)
    blk = tl.where(blk < 0, num_blocks, blk)
    dest = tl.where(fresh, blk * PER_BLOCK + j % PER_BLOCK, num_blocks * PER_BLOCK + j % PER_BLOCK)
    tl.store(grow_ptr + g, row, mask=gm)
    tl.store(entry_ptr + g, entry, mask=gm)
    tl.store(gvalid_ptr + g, valid.to(tl.int8), mask=gm)
    tl.store(rows_ptr + g, dest, mask=gm)
    h = tl.arange(0, BH)
    hm = h < HALF
    f = tl.load(freq_ptr + h, mask=hm, other=0.0)
    ang = (entry * M).to(tl.float32)[:, None] * f[None, :]
    o = g[:, None].to(tl.int64) * HALF + h[None, :]
    m2 = gm[:, None] & hm[None, :]
    tl.store(cos_ptr + o, tl.cos(ang), mask=m2)
    tl.store(sin_ptr + o, tl.sin(ang), mask=m2)


def _rows_tile(rows: int) -> int:
    """The compression kernel's row tile: at least 64 (a constexpr; a power of two of the step's row count made each
    new count class a kernel variant compiled while serving)."""
    return max(64, next_pow2(rows))


def compression_addressing(step: StepRows, ratio: int, block_size: int, num_blocks: int,
                           freqs: torch.Tensor) -> Compression:
    """The Triton body of ops.addressing.compression_addressing (arguments and result as there)."""
    T, R = step.num_tokens, step.num_rows
    G = T // ratio + R  # ops.compressor.completed_groups' static padding
    pos = step.positions
    dev = pos.device
    half = int(freqs.shape[0])
    grow, entry, rows = (torch.empty(G, dtype=torch.int64, device=dev) for _ in range(3))
    gvalid = torch.empty(G, dtype=torch.bool, device=dev)
    cos, sin = (torch.empty(G, half, dtype=torch.float32, device=dev) for _ in range(2))
    visible = torch.empty(T, dtype=torch.int64, device=dev)
    bt = step.block_table
    _compression_kernel[(cdiv(max(G, T), BG),)](
        pos, step.row_start, step.row_len, step.cached_len, bt, bt.stride(0), bt.shape[1],
        freqs.to(torch.float32).contiguous(), grow, entry, gvalid.view(torch.int8), rows, cos, sin, visible, T, R, G,
        num_blocks, M=ratio, BLOCK_SIZE=block_size, BR=_rows_tile(R), HALF=half,
        BH=next_pow2(half), BG=BG, num_warps=4, **pdl_launch(pos))
    return Compression(Groups(grow, entry, gvalid), rows, cos, sin, visible)
