"""Fused sparse attention over the stored KV pools, in Triton (Hopper), with the signature of ops/attention.attend.

One program per (token, block of heads): it normalises (V4) and RoPE-rotates its queries, streams the token's window
rows (the ring's stored records, or this step's fresh rows) and then its compressed entries (the CSA picks, or every
visible HCA entry, with the pool rows found through the block table), decodes each record in registers (bf16/f32,
V4's 584-B FP8 record, V4.1's 528-B FP8-per-32 row and 288-B NVFP4 entry), runs an online softmax that starts from the
sink logit, and writes the output rotated back by the inverse RoPE. K = V: one tile feeds both dots.

The work per token scales with its own window and selection (the dense loop's bound is read from device memory), never
with max_model_len; there is no host synchronisation, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import interpreting
from .split_grid import TL_DTYPES, hi_lo

PLAIN, V4_FP8, FP8_B32, NVFP4 = 0, 1, 2, 3
FORMATS = {"plain": PLAIN, "v4_fp8": V4_FP8, "fp8_b32": FP8_B32, "nvfp4": NVFP4}
NO_ENTRIES, PICKED, DENSE = 0, 1, 2


@dataclass(frozen=True)
class Config:
    heads: int  # BH: query heads per program (the M of both dots)
    rows: int  # BN: KV rows per tile
    num_warps: int
    num_stages: int


# Chosen on the H200 (benchmarks/kernels/attention.py); the interpreter gets the smallest legal tiles.
GPU_CONFIG = Config(heads=16, rows=32, num_warps=4, num_stages=2)
INTERPRETER_CONFIG = Config(heads=16, rows=16, num_warps=1, num_stages=1)


@triton.jit
def _e8m0(b):
    """e8m0 bytes -> float32 2^(b-127) (b = 0 is the subnormal 2^-127)."""
    b = b.to(tl.int32)
    return tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)


@triton.jit
def _decode(rows, ok, u8_ptr, h16_ptr, val_ptr, stride, FMT: tl.constexpr, D: tl.constexpr, RD: tl.constexpr,
            DT: tl.constexpr):
    """Stored records at pool rows [BN] (ok [BN]: which are read) -> values [BN, D] in DT (exact for every format)."""
    c = tl.arange(0, D)[None, :]
    m = ok[:, None]
    base = rows.to(tl.int64)[:, None] * stride
    if FMT == 0:  # plain values
        v = tl.load(val_ptr + base + c, mask=m, other=0.0).to(DT)
    elif FMT == 1:  # V4: FP8 nope dims with one e8m0 scale per 64, BF16 rope dims, scales, pad
        NOPE: tl.constexpr = D - RD
        nope = c < NOPE
        q = tl.load(u8_ptr + base + c, mask=m & nope, other=0).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        s = _e8m0(tl.load(u8_ptr + base + NOPE + 2 * RD + c // 64, mask=m & nope, other=127))
        r = tl.load(h16_ptr + rows.to(tl.int64)[:, None] * (stride // 2) + NOPE // 2 + (c - NOPE),
                    mask=m & (c >= NOPE), other=0.0).to(tl.float32)
        v = tl.where(nope, q * s, r).to(DT)
    elif FMT == 2:  # V4.1 window: FP8 with one e8m0 scale per 32
        q = tl.load(u8_ptr + base + c, mask=m, other=0).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v = (q * _e8m0(tl.load(u8_ptr + base + D + c // 32, mask=m, other=127))).to(DT)
    else:  # NVFP4: e2m1 codes two per byte (low nibble = even dim), one E4M3 scale per 16
        byte = tl.load(u8_ptr + base + c // 2, mask=m, other=0).to(tl.int32)
        code = (byte >> ((c & 1) * 4)) & 0xF
        # the 3 magnitude bits at float32 bits 22..24 read as value * 2^-126; the sign moves to bit 31
        mag = (((code & 7) << 22) | ((code & 8) << 28)).to(tl.float32, bitcast=True) * 8.507059173023462e37
        s = tl.load(u8_ptr + base + D // 2 + c // 16, mask=m, other=0).to(tl.float8e4nv, bitcast=True)
        v = (mag * s.to(tl.float32)).to(DT)
    return v


@triton.jit
def _tile(q, kv, ok, m_i, l_i, acc, scale_hi, scale_lo, ACC: tl.constexpr, DT: tl.constexpr, HALF: tl.constexpr,
          INTERPRET: tl.constexpr):
    """One online-softmax step over a tile of KV rows [BN, D] (ok: which rows count)."""
    if HALF and INTERPRET:  # the interpreter's bf16 tl.dot is wrong; bf16 values are exact in fp32
        s = tl.dot(q.to(tl.float32), tl.trans(kv.to(tl.float32)), input_precision="ieee")
    elif HALF:
        s = tl.dot(q, tl.trans(kv))
    else:
        s = tl.dot(q, tl.trans(kv), input_precision="ieee", out_dtype=ACC)
    s = s.to(ACC)
    s = s * scale_hi + s * scale_lo  # the scale as two fp32 halves: fp64 runs need its full precision
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if HALF and INTERPRET:
        pv = tl.dot(p.to(DT).to(tl.float32), kv.to(tl.float32), input_precision="ieee")
    elif HALF:
        pv = tl.dot(p.to(DT), kv)
    else:
        pv = tl.dot(p.to(DT), kv, input_precision="ieee", out_dtype=ACC)
    acc = acc * alpha[:, None] + pv.to(ACC)
    return m_new, l_i, acc


@triton.jit
def _rotate(x, cos, sin, INVERSE: tl.constexpr, BH: tl.constexpr, D: tl.constexpr):
    """Interleaved-pair rotation of x [BH, D] by per-pair cos/sin [D/2] (1 and 0 on the nope pairs)."""
    a, b = tl.split(tl.reshape(x, (BH, D // 2, 2)))
    c, s = cos[None, :], sin[None, :]
    if INVERSE:
        s = -s
    return tl.reshape(tl.join(a * c - b * s, a * s + b * c), (BH, D))


@triton.jit
def _attend_kernel(q_ptr, cos_ptr, sin_ptr, fresh_ptr, sink_ptr, out_ptr,
                   win_src_ptr, win_ok_ptr, ring_ptr, wu8_ptr, wh16_ptr, wval_ptr, w_stride,
                   cu8_ptr, ch16_ptr, cval_ptr, c_stride,
                   bt_ptr, bt_stride, tok_row_ptr, pick_ptr, pick_stride, vis_ptr,
                   H, RW, n_picks, ratio, block_size, epb, trash_block,
                   scale_hi, scale_lo, eps,
                   stride_qt, stride_qh, stride_ct, stride_ft, stride_ot, stride_oh,
                   D: tl.constexpr, RD: tl.constexpr, W: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr,
                   WFMT: tl.constexpr, CFMT: tl.constexpr, CMODE: tl.constexpr, QNORM: tl.constexpr,
                   DT: tl.constexpr, ACC: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = h < H
    c = tl.arange(0, D)
    # --- queries: (per-head RMS norm,) RoPE on the trailing RD dims, in the model dtype as the reference rounds them
    q = tl.load(q_ptr + t * stride_qt + h[:, None] * stride_qh + c[None, :], mask=h_ok[:, None], other=0.0)
    QT = q.dtype
    if QNORM:
        qf = q.to(ACC)
        q = (qf / tl.sqrt(tl.sum(qf * qf, 1) / D + eps)[:, None]).to(QT)
    pair = tl.arange(0, D // 2)
    rope = pair >= (D - RD) // 2
    ri = tl.where(rope, pair - (D - RD) // 2, 0)
    cos = tl.where(rope, tl.load(cos_ptr + t * stride_ct + ri, mask=rope, other=1.0), 1.0)
    sin = tl.where(rope, tl.load(sin_ptr + t * stride_ct + ri, mask=rope, other=0.0), 0.0)
    RT = tl.float64 if ACC == tl.float64 else tl.float32
    q = _rotate(q.to(RT), cos.to(RT), sin.to(RT), False, BH, D).to(QT).to(DT)

    m_i = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(ACC)  # the sink: a logit in the denominator only
    l_i = tl.full((BH,), 1.0, ACC)
    acc = tl.zeros((BH, D), ACC)
    n = tl.arange(0, BN)
    # --- window: the ring's stored rows before this step, or this step's fresh rows
    for k0 in range(0, W, BN):
        k = k0 + n
        k_in = k < W
        src = tl.load(win_src_ptr + t * W + k, mask=k_in, other=0)
        ok = tl.load(win_ok_ptr + t * W + k, mask=k_in, other=0) != 0
        ring = src < RW
        prow = tl.load(ring_ptr + src, mask=ok & ring, other=0)
        kv = _decode(prow, ok & ring, wu8_ptr, wh16_ptr, wval_ptr, w_stride, WFMT, D, RD, DT)
        fresh = tl.load(fresh_ptr + (src - RW).to(tl.int64)[:, None] * stride_ft + c[None, :],
                        mask=(ok & ~ring)[:, None], other=0.0).to(DT)
        kv = tl.where(ring[:, None], kv, fresh)
        m_i, l_i, acc = _tile(q, kv, ok, m_i, l_i, acc, scale_hi, scale_lo, ACC, DT, HALF, INTERPRET)
    # --- compressed entries: the picks (CSA) or every visible entry (HCA), through the block table
    if CMODE != 0:
        r = tl.load(tok_row_ptr + t)
        if CMODE == 1:
            hi = n_picks
        else:
            hi = tl.load(vis_ptr + t)
        for j0 in range(0, hi, BN):
            if CMODE == 1:
                j = tl.load(pick_ptr + t * pick_stride + j0 + n, mask=j0 + n < n_picks, other=-1)
                ok = j >= 0
            else:
                j = j0 + n
                ok = j < hi
            j = tl.where(ok, j, 0).to(tl.int64)
            blk = tl.load(bt_ptr + r * bt_stride + (j * ratio) // block_size, mask=ok, other=-1)
            blk = tl.where(blk < 0, trash_block, blk)
            prow = blk * epb + j % epb
            kv = _decode(prow, ok, cu8_ptr, ch16_ptr, cval_ptr, c_stride, CFMT, D, RD, DT)
            m_i, l_i, acc = _tile(q, kv, ok, m_i, l_i, acc, scale_hi, scale_lo, ACC, DT, HALF, INTERPRET)
    # --- output: normalise, rotate back (inverse RoPE), store in the query dtype
    o = _rotate((acc / l_i[:, None]).to(QT).to(RT), cos.to(RT), sin.to(RT), True, BH, D)
    tl.store(out_ptr + t * stride_ot + h[:, None] * stride_oh + c[None, :], o.to(QT), mask=h_ok[:, None])


def _views(data: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bytes, bf16 view, values) of one pool's storage; unused views are the storage itself."""
    if kind == "plain":
        return data, data, data
    h16 = data.view(torch.bfloat16) if kind == "v4_fp8" else data
    return data, h16, data


def supports(q: torch.Tensor, kinds: tuple[str, ...]) -> bool:
    if any(k not in FORMATS for k in kinds):
        return False
    if q.is_cuda:
        return q.dtype in (torch.bfloat16, torch.float16, torch.float32)
    return q.device.type == "cpu" and interpreting() and q.dtype in (torch.bfloat16, torch.float32, torch.float64)


def attend(q, cos, sin, fresh, sink, scale, q_norm_eps, window, entries, config: Config | None = None):
    """The Triton body of ops.attention.attend (arguments as there); returns [T, H, D] in q's dtype."""
    T, H, D = q.shape
    out = torch.empty_like(q)
    if T == 0:
        return out
    cfg = config or (INTERPRETER_CONFIG if interpreting() else GPU_CONFIG)
    W = window.src.shape[1]
    RD = 2 * cos.shape[-1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    fresh = fresh.contiguous()
    wdata = window.pool.data
    wkind = window.pool.codec.kind
    wu8, wh16, wval = _views(wdata, wkind)
    ring = window.ring_rows
    if entries is None:
        cmode, ckind, cdata, bt, tok_row, picks, vis = NO_ENTRIES, "plain", wdata, ring, ring, ring, ring
        ratio = block_size = epb = trash = n_picks = 1
    else:
        cdata, ckind = entries.pool.data, entries.pool.codec.kind
        bt, tok_row = entries.block_table, entries.token_row
        ratio, block_size = entries.ratio, entries.block_size
        epb, trash = block_size // ratio, entries.trash_block
        if entries.picks is not None:
            cmode, picks, vis, n_picks = PICKED, entries.picks, entries.picks, entries.picks.shape[1]
        else:
            cmode, picks, vis, n_picks = DENSE, entries.visible, entries.visible, 0
    cu8, ch16, cval = _views(cdata, ckind)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dt = acc if q.dtype in (torch.float32, torch.float64) else q.dtype
    s_hi, s_lo = hi_lo(scale)
    grid = (T, triton.cdiv(H, cfg.heads))
    _attend_kernel[grid](
        q, cos, sin, fresh, sink, out,
        window.src, window.valid, ring, wu8, wh16, wval, wdata.stride(0),
        cu8, ch16, cval, cdata.stride(0),
        bt, bt.stride(0), tok_row, picks, picks.stride(0) if picks.dim() > 1 else 0, vis,
        H, ring.shape[0], n_picks, ratio, block_size, epb, trash,
        s_hi, s_lo, q_norm_eps if q_norm_eps is not None else 0.0,
        q.stride(0), q.stride(1), cos.stride(0), fresh.stride(0), out.stride(0), out.stride(1),
        D=D, RD=RD, W=W, BH=cfg.heads, BN=cfg.rows, WFMT=FORMATS[wkind], CFMT=FORMATS[ckind], CMODE=cmode,
        QNORM=q_norm_eps is not None, DT=TL_DTYPES[dt], ACC=TL_DTYPES[acc],
        HALF=dt in (torch.bfloat16, torch.float16), INTERPRET=interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
