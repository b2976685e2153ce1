"""The fused attention kernels' shared device functions (ops/kernels/attention.py's flash and heads modes, and
attention_twopass.py): decoding the stored KV records of every format, the addresses of a token's window rows and
compressed entries, the dot in each precision, RoPE, the queries' preparation and the output's finish.
"""

from __future__ import annotations

import triton
import triton.language as tl

# the record formats' codes, `decode`'s FMT (cache/formats.py's codec kinds)
PLAIN, V4_FP8, FP8_B32, NVFP4 = 0, 1, 2, 3
FORMATS = {"plain": PLAIN, "v4_fp8": V4_FP8, "fp8_b32": FP8_B32, "nvfp4": NVFP4}


@triton.jit
def e8m0(b):
    """e8m0 bytes -> float32 2^(b-127) (b = 0 is the subnormal 2^-127)."""
    b = b.to(tl.int32)
    return tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)


@triton.jit
def decode(rows, ok, col0, u8_ptr, h16_ptr, val_ptr, stride, FMT: tl.constexpr, WIDTH: tl.constexpr,
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
        s = e8m0(tl.load(u8_ptr + base + NOPE + 2 * RD + c // 64, mask=m & nope, other=127))
        r = tl.load(h16_ptr + rows.to(tl.int64)[:, None] * (stride // 2) + NOPE // 2 + (c - NOPE),
                    mask=m & (c >= NOPE), other=0.0).to(tl.float32)
        v = tl.where(nope, q * s, r).to(DT)
    elif FMT == 2:  # V4.1 window: FP8 with one e8m0 scale per 32
        q = tl.load(u8_ptr + base + c, mask=m, other=0).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v = (q * e8m0(tl.load(u8_ptr + base + D + c // 32, mask=m, other=127))).to(DT)
    else:  # NVFP4: e2m1 codes two per byte (low nibble = even dim), one E4M3 scale per 16
        byte = tl.load(u8_ptr + base + c // 2, mask=m, other=0).to(tl.int32)
        code = (byte >> ((c & 1) * 4)) & 0xF
        # the 3 magnitude bits at float32 bits 22..24 read as value * 2^-126; the sign moves to bit 31
        mag = (((code & 7) << 22) | ((code & 8) << 28)).to(tl.float32, bitcast=True) * 8.507059173023462e37
        s = tl.load(u8_ptr + base + D // 2 + c // 16, mask=m, other=0).to(tl.float8e4nv, bitcast=True)
        v = (mag * s.to(tl.float32)).to(DT)
    return v


@triton.jit
def dot(a, b, ACC: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """a [M, K] @ b [K, N] accumulated in ACC."""
    if HALF and INTERPRET:  # the interpreter's bf16 tl.dot is wrong; bf16 values are exact in fp32
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif HALF:
        r = tl.dot(a, b)
    else:
        r = tl.dot(a, b, input_precision="ieee", out_dtype=ACC)
    return r.to(ACC)


@triton.jit
def rotate(x, cos, sin, INVERSE: tl.constexpr, BH: tl.constexpr, W: tl.constexpr):
    """Interleaved-pair rotation of x [BH, W] by per-pair cos/sin [W/2] (1 and 0 on the nope pairs)."""
    a, b = tl.split(tl.reshape(x, (BH, W // 2, 2)))
    c, s = cos[None, :], sin[None, :]
    if INVERSE:
        s = -s
    return tl.reshape(tl.join(a * c - b * s, a * s + b * c), (BH, W))


@triton.jit
def pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, pair0, NPAIRS: tl.constexpr, D: tl.constexpr, RD: tl.constexpr,
                  RT: tl.constexpr):
    """cos/sin of pairs pair0 .. pair0 + NPAIRS - 1 of a token (1 / 0 on the nope pairs)."""
    pair = pair0 + tl.arange(0, NPAIRS)
    rope = pair >= (D - RD) // 2
    ri = tl.where(rope, pair - (D - RD) // 2, 0)
    cos = tl.where(rope, tl.load(cos_ptr + t * stride_ct + ri, mask=rope, other=1.0), 1.0)
    sin = tl.where(rope, tl.load(sin_ptr + t * stride_ct + ri, mask=rope, other=0.0), 0.0)
    return cos.to(RT), sin.to(RT)


@triton.jit
def finish(acc, l_i, cos_ptr, sin_ptr, t, stride_ct, pid_d, out_ptr, stride_ot, stride_oh, h, h_ok, QT: tl.constexpr,
            D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr, BH: tl.constexpr, RT: tl.constexpr):
    """Normalise, rotate back (inverse RoPE) and store this program's D chunk in the query dtype."""
    cos, sin = pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, pid_d * (DC // 2), DC // 2, D, RD, RT)
    o = rotate((acc / l_i[:, None]).to(QT).to(RT), cos, sin, True, BH, DC)
    cd = pid_d * DC + tl.arange(0, DC)
    tl.store(out_ptr + t * stride_ot + h[:, None] * stride_oh + cd[None, :], o.to(QT), mask=h_ok[:, None])


@triton.jit
def prepare_queries(q_ptr, qp_ptr, cos_ptr, sin_ptr, t, h, h_ok, stride_qt, stride_qh, stride_ct, eps,
                     D: tl.constexpr, RD: tl.constexpr, DC: tl.constexpr, BH: tl.constexpr, QNORM: tl.constexpr,
                     ACC: tl.constexpr, DT: tl.constexpr):
    """Token t's heads h, DC dims at a time: (per-head RMS norm,) RoPE, rounded to the model dtype as the reference
    does, stored in DT to the scratch rows at qp_ptr (q's strides); returns the heads' scratch row pointers [BH, 1],
    complete (a barrier) before any thread of the program reads them back."""
    RT = tl.float64 if ACC == tl.float64 else tl.float32
    QT: tl.constexpr = q_ptr.dtype.element_ty
    cd = tl.arange(0, DC)
    qrow = q_ptr + t * stride_qt + h[:, None] * stride_qh
    qp = qp_ptr + t * stride_qt + h[:, None] * stride_qh
    rms = tl.full((BH,), 1.0, ACC)
    if QNORM:
        ss = tl.zeros((BH,), ACC)
        for ci in tl.static_range(D // DC):
            qf = tl.load(qrow + ci * DC + cd[None, :], mask=h_ok[:, None], other=0.0).to(ACC)
            ss += tl.sum(qf * qf, 1)
        rms = tl.sqrt(ss / D + eps)
    for ci in tl.static_range(D // DC):
        qc = tl.load(qrow + ci * DC + cd[None, :], mask=h_ok[:, None], other=0.0)
        if QNORM:
            qc = (qc.to(ACC) / rms[:, None]).to(QT)
        cos, sin = pair_cos_sin(cos_ptr, sin_ptr, t, stride_ct, ci * (DC // 2), DC // 2, D, RD, RT)
        qc = rotate(qc.to(RT), cos, sin, False, BH, DC).to(QT).to(DT)
        tl.store(qp + ci * DC + cd[None, :], qc, mask=h_ok[:, None])
    tl.debug_barrier()
    return qp


@triton.jit
def rows_kv(rows, ok, ring, fresh_ptr, stride_ft, fresh_row, col0, u8_ptr, h16_ptr, val_ptr, stride,
             FMT: tl.constexpr, FRESH: tl.constexpr, WIDTH: tl.constexpr, D: tl.constexpr, RD: tl.constexpr,
             DT: tl.constexpr):
    """Dims [col0, col0 + WIDTH) of a tile's rows -> [BN, WIDTH] in DT: the stored records at pool rows `rows`, or
    (FRESH) this step's fresh rows where `ring` is false; zeros where `ok` is false."""
    kv = decode(rows, ok & ring, col0, u8_ptr, h16_ptr, val_ptr, stride, FMT, WIDTH, D, RD, DT)
    if FRESH:
        f = tl.load(fresh_ptr + fresh_row.to(tl.int64)[:, None] * stride_ft + col0 + tl.arange(0, WIDTH)[None, :],
                    mask=(ok & ~ring)[:, None], other=0.0).to(DT)
        kv = tl.where(ring[:, None], kv, f)
    return kv


@triton.jit
def win_src(t, k0, end, W, win_src_ptr, win_ok_ptr, BN: tl.constexpr):
    """Stage 1 of a window tile's addresses: the sources (ring slot or fresh row) of window positions [k0, k0 + BN)
    below `end`, and which count."""
    k = k0 + tl.arange(0, BN)
    k_in = k < end
    src = tl.load(win_src_ptr + t * W + k, mask=k_in, other=0).to(tl.int32)  # int32 addresses: fewer registers
    ok = (tl.load(win_ok_ptr + t * W + k, mask=k_in, other=0) != 0) & k_in
    return src, ok


@triton.jit
def win_rows(src, ok, ring_ptr, RW):
    """Stage 2: the pool rows of the ring slots (ring: which sources are stored rows, not fresh ones)."""
    ring = src < RW
    return tl.load(ring_ptr + src, mask=ok & ring, other=0).to(tl.int32), ring


@triton.jit
def entry_idx(t, j0, end, pick_ptr, pick_stride, CMODE: tl.constexpr, BN: tl.constexpr):
    """Stage 1 of a compressed tile's addresses: entry indices [j0, j0 + BN) of the token's list below `end` (the
    CSA picks, -1 = none; HCA: the indices themselves), and which count."""
    jj = j0 + tl.arange(0, BN)
    j_in = jj < end
    if CMODE == 1:
        j = tl.load(pick_ptr + t * pick_stride + jj, mask=j_in, other=-1)
        ok = j >= 0
    else:
        j = jj
        ok = j_in
    return tl.where(ok, j, 0).to(tl.int32), ok


@triton.jit
def entry_rows(j, ok, bt_ptr, r, bt_stride, ratio, block_size, epb, trash_block):
    """Stage 2: the entries' pool rows through the token's block table (unallocated blocks read the trash block)."""
    blk = tl.load(bt_ptr + r * bt_stride + (j * ratio) // block_size, mask=ok, other=-1).to(tl.int32)
    blk = tl.where(blk < 0, trash_block, blk)
    return blk * epb + j % epb  # pool rows < 2^31 (the byte offsets are formed in int64 by decode)


@triton.jit
def entry_count(vis_ptr, t, n_picks, CMODE: tl.constexpr):
    """Token t's compressed rows: none (CMODE 0), its picks (1: a fixed width, -1 = none) or its visible entries (2)."""
    if CMODE == 0:
        n_c = 0
    elif CMODE == 1:
        n_c = n_picks
    else:
        n_c = tl.load(vis_ptr + t).to(tl.int32)
    return n_c


@triton.jit
def softmax_step(s, ok, m_i, l_i, scale_hi, scale_lo, DT: tl.constexpr):
    """One online-softmax step over a tile's raw scores s [BH, BN] (ok: the rows that count): the scale as two fp32
    halves (fp64 runs need its full precision), the new running max and sum, the old sum's factor alpha and the
    unnormalised probabilities in DT."""
    s = s * scale_hi + s * scale_lo
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), alpha, p.to(DT)
