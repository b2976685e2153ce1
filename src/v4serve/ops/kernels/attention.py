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
from .split_grid import N_COUNTERS, TL_DTYPES, ArrivalCounters, hi_lo

PLAIN, V4_FP8, FP8_B32, NVFP4 = 0, 1, 2, 3
FORMATS = {"plain": PLAIN, "v4_fp8": V4_FP8, "fp8_b32": FP8_B32, "nvfp4": NVFP4}
NO_ENTRIES, PICKED, DENSE = 0, 1, 2


@dataclass(frozen=True)
class Config:
    heads: int  # BH: query heads per program (the M of both dots)
    rows: int  # BN: KV rows per tile
    dsplit: int  # programs per (token, head block), each owning D / dsplit output dims (also the QK chunk width)
    num_warps: int
    num_stages: int
    kv_splits: int = 0  # programs per token's KV rows (0 = by the grid size; the partials combine in the last)


# Chosen on the H200 (benchmarks/kernels/attention.py); the interpreter gets the smallest legal tiles (and two D
# chunks, so that the chunked paths run in the tests).
GPU_CONFIG = Config(heads=16, rows=32, dsplit=2, num_warps=8, num_stages=1)
INTERPRETER_CONFIG = Config(heads=16, rows=16, dsplit=2, num_warps=1, num_stages=1, kv_splits=2)
_SMS = 132  # H200 multiprocessors
_COUNTERS = ArrivalCounters()
TOKEN_CHUNK = 2048  # tokens per launch: bounds the prepared-query scratch of long prefills


@triton.jit
def _e8m0(b):
    """e8m0 bytes -> float32 2^(b-127) (b = 0 is the subnormal 2^-127)."""
    b = b.to(tl.int32)
    return tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)


@triton.jit
def _decode(rows, ok, col0, u8_ptr, h16_ptr, val_ptr, stride, FMT: tl.constexpr, WIDTH: tl.constexpr,
            D: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr):
    """Dims [col0, col0 + WIDTH) of the stored records at pool rows [BN] (ok: which are read) -> [BN, WIDTH] in DT,
    exactly for every format."""
    c = col0 + tl.arange(0, WIDTH)[None, :]
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
def _dot(a, b, ACC: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """a [M, K] @ b [K, N] accumulated in ACC."""
    if HALF and INTERPRET:  # the interpreter's bf16 tl.dot is wrong; bf16 values are exact in fp32
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif HALF:
        r = tl.dot(a, b)
    else:
        r = tl.dot(a, b, input_precision="ieee", out_dtype=ACC)
    return r.to(ACC)


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
        kv = _decode(rows, ok & ring, ci * DC, u8_ptr, h16_ptr, val_ptr, stride, FMT, DC, D, RD, DT)
        if FRESH:
            f = tl.load(fresh_ptr + fresh_row.to(tl.int64)[:, None] * stride_ft + ci * DC + cd[None, :],
                        mask=(ok & ~ring)[:, None], other=0.0).to(DT)
            kv = tl.where(ring[:, None], kv, f)
        q = tl.load(qp + ci * DC + cd[None, :], mask=h_ok[:, None], other=0.0)
        s += _dot(q, tl.trans(kv), ACC, HALF, INTERPRET)
        own = tl.where(pid_d == ci, kv, own)
    s = s * scale_hi + s * scale_lo  # the scale as two fp32 halves: fp64 runs need its full precision
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(DT), own, ACC, HALF, INTERPRET)
    return m_new, l_i, acc


@triton.jit
def _rotate(x, cos, sin, INVERSE: tl.constexpr, BH: tl.constexpr, W: tl.constexpr):
    """Interleaved-pair rotation of x [BH, W] by per-pair cos/sin [W/2] (1 and 0 on the nope pairs)."""
    a, b = tl.split(tl.reshape(x, (BH, W // 2, 2)))
    c, s = cos[None, :], sin[None, :]
    if INVERSE:
        s = -s
    return tl.reshape(tl.join(a * c - b * s, a * s + b * c), (BH, W))


@triton.jit
def _pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, pair0, NPAIRS: tl.constexpr, D: tl.constexpr, RD: tl.constexpr,
                  RT: tl.constexpr):
    """cos/sin of pairs pair0 .. pair0 + NPAIRS - 1 of a token (1 / 0 on the nope pairs)."""
    pair = pair0 + tl.arange(0, NPAIRS)
    rope = pair >= (D - RD) // 2
    ri = tl.where(rope, pair - (D - RD) // 2, 0)
    cos = tl.where(rope, tl.load(cos_ptr + t * stride_ct + ri, mask=rope, other=1.0), 1.0)
    sin = tl.where(rope, tl.load(sin_ptr + t * stride_ct + ri, mask=rope, other=0.0), 0.0)
    return cos.to(RT), sin.to(RT)


@triton.jit
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
                   HALF: tl.constexpr, INTERPRET: tl.constexpr):
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
    cos, sin = _pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, 0, D // 2, D, RD, RT)
    q = _rotate(q.to(RT), cos, sin, False, BH, D).to(QT).to(DT)
    qp = qp_ptr + t * stride_qt + h[:, None] * stride_qh
    tl.store(qp + c[None, :], q, mask=h_ok[:, None])
    tl.debug_barrier()  # the scratch row is complete before any thread reads it back

    # --- this program's share of the token's rows [window W | compressed n_c]: split pid_s of NSPLIT (decode
    # splits a token's rows over programs so that enough gathers are in flight; the last to arrive combines)
    if CMODE == 0:
        n_c = 0
    elif CMODE == 1:
        n_c = n_picks
    else:
        n_c = tl.load(vis_ptr + t).to(tl.int32)
    span = tl.cdiv(tl.cdiv(W + n_c, NSPLIT), BN) * BN
    lo = pid_s * span
    hi = tl.minimum(lo + span, W + n_c)
    m_i = tl.load(sink_ptr + h, mask=h_ok, other=0.0).to(ACC)  # the sink: a logit in the denominator only,
    l_i = tl.full((BH,), 1.0, ACC) * (pid_s == 0).to(ACC)  # counted once (split 0); m starts finite everywhere
    acc = tl.zeros((BH, DC), ACC)
    n = tl.arange(0, BN)
    # --- window: the ring's stored rows before this step, or this step's fresh rows
    for k0 in range(lo, tl.minimum(hi, W), BN):
        k = k0 + n
        k_in = k < tl.minimum(hi, W)
        src = tl.load(win_src_ptr + t * W + k, mask=k_in, other=0)
        ok = (tl.load(win_ok_ptr + t * W + k, mask=k_in, other=0) != 0) & k_in
        ring = src < RW
        prow = tl.load(ring_ptr + src, mask=ok & ring, other=0)
        m_i, l_i, acc = _tile(qp, h_ok, prow, ok, ring, fresh_ptr, stride_ft, src - RW, pid_d, m_i, l_i, acc,
                              wu8_ptr, wh16_ptr, wval_ptr, w_stride, scale_hi, scale_lo, WFMT, True, D, RD, DC, BH,
                              BN, ACC, DT, HALF, INTERPRET)
    # --- compressed entries: the picks (CSA) or every visible entry (HCA), through the block table
    if CMODE != 0:
        r = tl.load(tok_row_ptr + t)
        for j0 in range(tl.maximum(lo, W) - W, hi - W, BN):
            jj = j0 + n
            j_in = jj < hi - W
            if CMODE == 1:
                j = tl.load(pick_ptr + t * pick_stride + jj, mask=j_in, other=-1)
                ok = j >= 0
            else:
                j = jj
                ok = j_in
            j = tl.where(ok, j, 0).to(tl.int64)
            blk = tl.load(bt_ptr + r * bt_stride + (j * ratio) // block_size, mask=ok, other=-1)
            blk = tl.where(blk < 0, trash_block, blk)
            prow = blk * epb + j % epb
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
        tl.debug_barrier()  # every thread's stores precede the release below
        arrived = tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel", scope="gpu")
        if arrived == NSPLIT - 1:
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
            _finish(acc, l_i, cos_ptr, sin_ptr, t, stride_ct, pid_d, out_ptr, stride_ot, stride_oh, h, h_ok, QT,
                    D, RD, DC, BH, RT)
            tl.store(cnt_ptr + slot, 0)  # ready for the next launch / graph replay
    else:
        _finish(acc, l_i, cos_ptr, sin_ptr, t, stride_ct, pid_d, out_ptr, stride_ot, stride_oh, h, h_ok, QT,
                D, RD, DC, BH, RT)


@triton.jit
def _finish(acc, l_i, cos_ptr, sin_ptr, t, stride_ct, pid_d, out_ptr, stride_ot, stride_oh, h, h_ok, QT: tl.constexpr,
            D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr, BH: tl.constexpr, RT: tl.constexpr):
    """Normalise, rotate back (inverse RoPE) and store this program's D chunk in the query dtype."""
    cos, sin = _pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, pid_d * (DC // 2), DC // 2, D, RD, RT)
    o = _rotate((acc / l_i[:, None]).to(QT).to(RT), cos, sin, True, BH, DC)
    cd = pid_d * DC + tl.arange(0, DC)
    tl.store(out_ptr + t * stride_ot + h[:, None] * stride_oh + cd[None, :], o.to(QT), mask=h_ok[:, None])


def _views(data: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bytes, bf16 view, values) of one pool's storage; unused views are the storage itself."""
    if kind == "plain":
        return data, data, data
    h16 = data.view(torch.bfloat16) if kind == "v4_fp8" else data
    return data, h16, data


def _kv_splits(cfg: Config, programs: int, rows_hint: int) -> int:
    """Programs per token's rows: enough for about two waves over the GPU at decode (each keeping >= 2 row tiles),
    one for prefills (plenty of tokens) or when the combine's arrival counters would not suffice."""
    if cfg.kv_splits:
        return cfg.kv_splits
    if programs > N_COUNTERS:
        return 1
    return max(1, min(triton.cdiv(2 * _SMS, programs), rows_hint // (2 * cfg.rows), 16))


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
    HB = triton.cdiv(H, cfg.heads)
    nsplit = _kv_splits(cfg, min(T, TOKEN_CHUNK) * HB * dsplit, W + (n_picks if cmode == PICKED else 4 * cfg.rows))
    cnt = _COUNTERS.get(q.device) if nsplit > 1 else out
    for lo in range(0, T, TOKEN_CHUNK):
        hi = min(T, lo + TOKEN_CHUNK)
        qc = q[lo:hi]
        qp = torch.empty_like(qc)  # the prepared queries (same strides as qc)
        part = (torch.empty((hi - lo) * HB * dsplit * nsplit * cfg.heads * (D // dsplit + 2), dtype=acc,
                            device=q.device) if nsplit > 1 else out)
        _attend_kernel[(hi - lo, HB, dsplit * nsplit)](
            qc, qp, cos[lo:hi], sin[lo:hi], fresh, sink, out[lo:hi], part, cnt,
            window.src[lo:hi], window.valid[lo:hi], ring, wu8, wh16, wval, wdata.stride(0),
            cu8, ch16, cval, cdata.stride(0),
            bt, bt.stride(0), tok_row[lo:hi] if entries is not None else tok_row,
            picks[lo:hi] if per_token or cmode == DENSE else picks, picks.stride(0) if per_token else 0,
            vis[lo:hi] if cmode == DENSE else vis,
            H, ring.shape[0], n_picks, ratio, block_size, epb, trash,
            s_hi, s_lo, q_norm_eps if q_norm_eps is not None else 0.0,
            qc.stride(0), qc.stride(1), cos.stride(0), fresh.stride(0), out.stride(0), out.stride(1),
            D=D, RD=RD, W=W, BH=cfg.heads, BN=cfg.rows, DC=D // dsplit, NSPLIT=nsplit, WFMT=FORMATS[wkind], CFMT=FORMATS[ckind],
            CMODE=cmode, QNORM=q_norm_eps is not None, DT=TL_DTYPES[dt], ACC=TL_DTYPES[acc],
            HALF=dt in (torch.bfloat16, torch.float16), INTERPRET=interpreting(),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
