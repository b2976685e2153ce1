"""mHC in one Triton launch per call (the reference is ops/mhc.py): `hc_pre`, `hc_post` and `hc_post_pre`.

hc_pre, one launch: for a block of tokens, the mixes x_flat @ fn^T (fp32 accumulation) and sum(x^2) in one pass
over the n streams in D chunks; then in registers: the RMS scale, sigmoid/scale/base for pre and post, the row
softmax and every Sinkhorn iteration of the n x n comb; then the collapse y = sum_i pre_i x_i (the caller's
`collapse_pre` instead for V4.1's lagged form), stored in x's dtype, and optionally the sub-layer's RMSNorm: a second
pass reads back the y this program just stored (y is 1/n of x) and scales it by the weight, or, where one chunk of
`block_dc` covers D (single decode tokens), y stays in registers for the norm (no store and read back).

Two grid shapes, both one launch:
- token blocks (prefill): one program per block of tokens reads all of fn (1.5 MiB at D=4096, from L2 after the
  first) and finishes its tokens.
- split grid (decode): one program per (token block, D slice), so that the fn read is spread over many SMs; each
  writes its partial mixes and sum(x^2) to scratch and bumps a per-token-block arrival counter (acq_rel, gpu scope);
  the last to arrive sums the partials in a fixed order (deterministic whichever came last), finishes the token
  block over all of D and resets its counter to zero for the next launch or CUDA-graph replay (as the router
  kernel, ops/kernels/router.py). The counters are one persistent buffer per device: two hc_pre launches must not
  run concurrently on different streams. The finishing program's collapse and norm passes take wide D chunks
  (`block_dc`), so a 1-token block crosses D in a few steps instead of many latency-bound ones.

Prefill chunks of bf16 streams (129-4096 tokens) split hc_pre in two launches (PreConfig.collapse_apart): the split
grid over 64-token blocks, whose finishing programs compute only the coefficients, then `_collapse_kernel`, one
token a program, for the collapse and norm (the same arithmetic): token blocks big enough for the tensor-core mixes
made the finishing programs' collapse of all of D for 64 tokens the serial tail of the launch.

The mixes GEMM: fp32 operands ("ieee") in general; with bf16 x on the GPU ("bf16x3") fn is split in registers
into three bf16 parts (hi + mid + lo = fn to 24 bits) so that the tensor cores give fp32-GEMM accuracy: bf16 x bf16
products are exact in fp32. The interpreter multiplies raw bf16 bits in tl.dot, so there the split parts go through
fp32 dots (tests exercise the split that way). Blocks of 1-2 tokens on the GPU ("fma", `PreConfig.fma`) take no dots:
elementwise fp32 products summed over each D chunk once, a GEMV (H200, T=1: hc_pre 15.0 -> 11.5 us, the 16-row MMA
tiles were 1/16 used and their operands went through shared memory). A 1-token block's FMA mixes are 2-D ("flat":
fn's [rows, D chunk] tile times the token's row, in the tile's load layout, summed over D inside a warp).

hc_post, one launch: out_k = post_k f + sum_j comb[j, k] x_j over a 2-D grid of (token block, D chunk).

The n x n comb is handled as a [BLOCK_T, n, n] tile, so n must be a power of two; n >= 4 keeps tl.dot's N >= 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..env import get as env_get
from ..peer_sum import PartialSum
from ..precision import hi_lo
from . import cdiv, interpreting, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .split_grid import FLOATS as _FLOATS
from .split_grid import N_COUNTERS, ArrivalCounters, last_to_arrive, runs_here
from .split_grid import TL_DTYPES as _TL

_COUNTERS = ArrivalCounters()
# No FMA contraction (ptxas --fmad=false): where a product and a sum fuse is otherwise ptxas's choice per kernel, and
# the fused post+pre launch must give the bits of hc_post then hc_pre (on the H200, 7 of 24 small cases differed).
# The hot products are explicit tl.fma calls, which stay fused.
_EXACT = {"enable_fp_fusion": False}


# up to how many tokens the decode grid takes 1-token blocks (default 128; "4": the rule of the thirty-first session)
ONE_TOKEN_ENV = "V4SERVE_MHC_ONE_TOKEN_MAX"
HOIST_ENV = "V4SERVE_MHC_HOIST"  # "1": the decode grids of up to 4 tokens take PreConfig.hoist (opt-in until timed)
FLAT_ENV = "V4SERVE_MHC_FLAT"  # "0": the decode grids' 1-token FMA mixes in 3-D, as before `PreConfig.flat` (A/B)


@dataclass(frozen=True)
class PreConfig:
    block_t: int  # tokens per program (a power of two; tl.dot pads M < 16 itself)
    block_d: int  # D chunk of every pass (a power of two, >= 16)
    split_d: int  # programs along D for the mixes (> 1 selects the split grid)
    block_dc: int = 0  # D chunk of the collapse and norm passes (0 = block_d): wide when the token block is small
    num_warps: int = 4
    num_stages: int = 2
    # the split-fn bf16 GEMM; None = for bf16 x on the GPU. It reads x as bf16: GPU streams of another dtype take the
    # fp32 dots instead (float32 streams in bf16 dots lost ~4e-3 of their coefficients' accuracy, H100)
    bf16x3: bool | None = None
    promote: bool = False  # bf16x3: each D chunk's dots summed apart, then added in float32 (`_dot`'s PROMOTE)
    fma: bool | None = None  # the mixes in fp32 FMAs, no dots (`_chunk_start`); None = for 1-2-token blocks on the GPU
    # fma on 1-token blocks: fn's [rows, D chunk] tiles times the token's row in 2-D ("flat"), summed over D within a
    # warp, instead of [1, rows, D chunk] products whose layout spread D over the warps (sm_90 SASS of hc_post_pre at
    # T = 1, D = 5120: 77 barriers and 8 shared-memory layout conversions of fn tiles per chunk)
    flat: bool = True
    # hc_post_pre as two launches, hc_post then hc_pre (the same bits): for the tensor-core mixes, whose fused form
    # was 4-5x slower than the pre side alone at prefill sizes (H200, `mhc.py --sweep`, nineteenth session)
    post_apart: bool = False
    # the collapse and norm as a launch of their own (`_collapse_kernel`: `collapse_t` tokens a program over D chunks
    # of `collapse_dc`, 0 = 8192 / collapse_t; `collapse_warps` warps) after the mixes and coefficients: token blocks
    # large enough for the tensor-core mixes leave the finishing programs' serial collapse of all of D for many tokens
    # on few SMs. The same arithmetic (the same bits where the token block, D chunk and warps are the same). Implies
    # post_apart
    collapse_apart: bool = False
    collapse_t: int = 1
    collapse_dc: int = 0
    collapse_warps: int = 4
    # where one chunk covers D (decode): the finishing program loads the 4 streams (and the norm weight) before the
    # coefficients, so that their latency passes under the Sinkhorn iterations rather than after them (sm_90 SASS at
    # T = 1, D = 5120: the loads ahead of the iteration loop, 140 -> 255 registers, no spills: for small grids only).
    # The same bits; not yet timed on a GPU, so opt-in (V4SERVE_MHC_HOIST=1 for the decode grids of up to 4 tokens)
    hoist: bool = False


@dataclass(frozen=True)
class PostConfig:
    block_t: int
    block_d: int
    num_warps: int = 4


# ------------------------------------------------------------------------------------------------
# hc_pre
# ------------------------------------------------------------------------------------------------

@triton.jit
def _div(a, b, ACC: tl.constexpr):
    # IEEE division in fp32 as torch (Triton's `/` is the approximate div.full.f32)
    if ACC == tl.float32:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def _rsqrt(v, ACC: tl.constexpr):
    if ACC == tl.float32:
        return tl.rsqrt(v)
    else:
        return 1.0 / tl.sqrt(v)


@triton.jit
def _dot(acc, xt, w, ACC: tl.constexpr, X3: tl.constexpr, INTERPRET: tl.constexpr, PROMOTE: tl.constexpr = False):
    """acc + xt [BT, BD] @ w^T (w [R, BD]). PROMOTE (X3): the chunk's three dots summed in a fresh accumulator, then
    added to acc in float32 registers, rather than chained through the tensor cores' accumulator over every chunk
    (which put the prefill grid's coefficients 3.7e-4 from the float32 reference at T = 4096 on the H200)."""
    wt = tl.trans(w)
    if X3:
        wf = wt.to(tl.float32)
        hi = wf.to(tl.bfloat16)
        r = wf - hi.to(tl.float32)  # exact: hi holds the top bits of wf
        mid = r.to(tl.bfloat16)
        lo = (r - mid.to(tl.float32)).to(tl.bfloat16)
        if PROMOTE:
            part = tl.zeros(acc.shape, acc.dtype)
        else:
            part = acc
        if INTERPRET:
            xs = xt.to(tl.float32)
            part = tl.dot(xs, hi.to(tl.float32), part, input_precision="ieee")
            part = tl.dot(xs, mid.to(tl.float32), part, input_precision="ieee")
            part = tl.dot(xs, lo.to(tl.float32), part, input_precision="ieee")
        else:
            xb = xt.to(tl.bfloat16)
            part = tl.dot(xb, hi, part)
            part = tl.dot(xb, mid, part)
            part = tl.dot(xb, lo, part)
        if PROMOTE:
            acc = acc + part
        else:
            acc = part
    else:
        acc = tl.dot(xt.to(ACC), wt.to(ACC), acc, input_precision="ieee", out_dtype=ACC)
    return acc


@triton.jit
def _mix_add(acc_pp, acc_c, ss, xt, f_pp, f_c, kk, pp_mask, d_mask, EVEN_D: tl.constexpr, ACC: tl.constexpr,
             MIX: tl.constexpr, INTERPRET: tl.constexpr):
    """One stream's D chunk xt [BT, BD] into the mixes: fn's columns kk (pre/post rows f_pp, comb rows f_c; d_mask
    unless EVEN_D), the dots and sum(x^2). MIX "fma": no dots, the accumulators are `_chunk_start`'s products and
    squares, summed over D once per chunk by `_chunk_end`; "flat" the same for one token in 2-D tiles."""
    if EVEN_D:  # no mask along D keeps the loads vectorised
        wpp = tl.load(f_pp + kk, mask=pp_mask[:, None], other=0.0)
        wc = tl.load(f_c + kk)
    else:
        wpp = tl.load(f_pp + kk, mask=pp_mask[:, None] & d_mask[None, :], other=0.0)
        wc = tl.load(f_c + kk, mask=d_mask[None, :], other=0.0)
    xf = xt.to(ACC)
    if MIX == "fma":  # explicit FMAs: the kernels launch without contraction (`_EXACT`)
        ss = tl.fma(xf, xf, ss)
        acc_pp = tl.fma(xf[:, None, :], wpp.to(ACC)[None, :, :], acc_pp)
        acc_c = tl.fma(xf[:, None, :], wc.to(ACC)[None, :, :], acc_c)
    elif MIX == "flat":  # one token: its row [1, BD] broadcast over fn's rows, 2-D products in fn's load layout
        ss = tl.fma(xf, xf, ss)
        acc_pp = tl.fma(xf, wpp.to(ACC), acc_pp)
        acc_c = tl.fma(xf, wc.to(ACC), acc_c)
    else:
        ss += tl.sum(xf * xf, axis=1)
        acc_pp = _dot(acc_pp, xt, wpp, ACC, MIX != "ieee", INTERPRET, MIX == "x3p")
        acc_c = _dot(acc_c, xt, wc, ACC, MIX != "ieee", INTERPRET, MIX == "x3p")
    return acc_pp, acc_c, ss


@triton.jit
def _chunk_start(acc_pp, acc_c, ss, BLOCK_T: tl.constexpr, PP: tl.constexpr, NN: tl.constexpr,
                 BLOCK_D: tl.constexpr, ACC: tl.constexpr, MIX: tl.constexpr):
    """The accumulators a D chunk's `_mix_add` calls take: the mixes themselves, or for "fma" zeroed elementwise
    products [BT, PP, BD], [BT, NN, BD] and squares [BT, BD] (a few rows of x: a GEMV in fp32 FMAs, where a 16-row
    tensor-core tile would be 1/16 used and each dot's operands pass through shared memory)."""
    if MIX == "fma":
        return (tl.zeros([BLOCK_T, PP, BLOCK_D], ACC), tl.zeros([BLOCK_T, NN, BLOCK_D], ACC),
                tl.zeros([BLOCK_T, BLOCK_D], ACC))
    elif MIX == "flat":  # BLOCK_T = 1
        return tl.zeros([PP, BLOCK_D], ACC), tl.zeros([NN, BLOCK_D], ACC), tl.zeros([1, BLOCK_D], ACC)
    else:
        return acc_pp, acc_c, ss


@triton.jit
def _chunk_end(acc_pp, acc_c, ss, c_pp, c_c, c_ss, MIX: tl.constexpr):
    """The mixes after a D chunk: "fma" / "flat" sum the chunk's products over D (once for all n streams)."""
    if MIX == "fma":
        return acc_pp + tl.sum(c_pp, axis=2), acc_c + tl.sum(c_c, axis=2), ss + tl.sum(c_ss, axis=1)
    elif MIX == "flat":
        return acc_pp + tl.sum(c_pp, axis=1)[None, :], acc_c + tl.sum(c_c, axis=1)[None, :], ss + tl.sum(c_ss, axis=1)
    else:
        return c_pp, c_c, c_ss


@triton.jit
def _mix_init(fn_ptr, sf_r, N: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr, ACC: tl.constexpr):
    """Zero mixes (pre/post [BT, PP], comb [BT, N*N], sum(x^2) [BT]), fn's pre/post and comb row pointers and the
    mask of the PP padding."""
    NN: tl.constexpr = N * N
    offs_pp = tl.arange(0, PP)
    f_pp = fn_ptr + offs_pp[:, None] * sf_r
    f_c = fn_ptr + (2 * N + tl.arange(0, NN))[:, None] * sf_r
    return (tl.zeros([BLOCK_T, PP], ACC), tl.zeros([BLOCK_T, NN], ACC), tl.zeros([BLOCK_T], ACC), f_pp, f_c,
            offs_pp < 2 * N)


@triton.jit
def _mix_partial(x_ptr, fn_ptr, offs_t, t_mask, d_lo, d_hi, D, sx_t, sx_n, sx_d, sf_r, sf_k,
                 N: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                 EVEN_D: tl.constexpr, ACC: tl.constexpr, MIX: tl.constexpr, INTERPRET: tl.constexpr):
    """Over streams i and d in [d_lo, d_hi): x @ fn^T split as the pre/post columns [BT, PP] and the comb columns
    [BT, N*N], and sum(x^2) [BT]."""
    acc_pp, acc_c, ss, f_pp, f_c, pp_mask = _mix_init(fn_ptr, sf_r, N, PP, BLOCK_T, ACC)
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * sx_t
    # D chunks outside, the n streams unrolled inside: a chunk's 3n loads are independent and issue together (with the
    # streams outside, each stream's chunk loop was its own basic block, one memory latency after another: a decode
    # program's 4 chunks cost 4 round trips)
    for d0 in range(d_lo, d_hi, BLOCK_D):
        c_pp, c_c, c_ss = _chunk_start(acc_pp, acc_c, ss, BLOCK_T, PP, N * N, BLOCK_D, ACC, MIX)
        for i in tl.static_range(N):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            k = (i * D + offs_d).to(tl.int64)[None, :] * sf_k
            xp = x_rows + i * sx_n + offs_d[None, :] * sx_d
            d_mask = offs_d < d_hi
            if EVEN_D:  # no mask along D keeps the loads vectorised
                xt = tl.load(xp, mask=t_mask[:, None], other=0.0)
            else:
                xt = tl.load(xp, mask=t_mask[:, None] & d_mask[None, :], other=0.0)
            c_pp, c_c, c_ss = _mix_add(c_pp, c_c, c_ss, xt, f_pp, f_c, k, pp_mask, d_mask, EVEN_D, ACC, MIX,
                                       INTERPRET)
        acc_pp, acc_c, ss = _chunk_end(acc_pp, acc_c, ss, c_pp, c_c, c_ss, MIX)
    return acc_pp, acc_c, ss


@triton.jit
def _coefficients(acc_pp, acc_c, ss, offs_t, t_mask, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, D,
                  neps_hi, neps_lo, heps_hi, heps_lo, N: tl.constexpr, ITERS: tl.constexpr, PP: tl.constexpr,
                  BLOCK_T: tl.constexpr, ACC: tl.constexpr):
    """Summed mixes of a token block -> pre, post, comb stored; returns pre [BT, PP] (its first n columns)."""
    NN: tl.constexpr = N * N
    offs_pp = tl.arange(0, PP)
    offs_c = tl.arange(0, NN)
    is_pre = offs_pp < N
    is_post = (offs_pp >= N) & (offs_pp < 2 * N)
    # fp32 scalar arguments carry hi and lo halves (exact enough for fp64)
    neps = tl.cast(neps_hi, ACC) + tl.cast(neps_lo, ACC)
    heps = tl.cast(heps_hi, ACC) + tl.cast(heps_lo, ACC)

    rs = _rsqrt(ss / (N * D) + neps, ACC)
    s0 = tl.load(scale_ptr).to(ACC)
    s1 = tl.load(scale_ptr + 1).to(ACC)
    s2 = tl.load(scale_ptr + 2).to(ACC)

    # pre / post: sigmoid(mix * scale + base), as the reference: (+eps) and (x2)
    b_pp = tl.load(base_ptr + offs_pp, mask=is_pre | is_post, other=0.0).to(ACC)
    sc_pp = tl.where(is_pre, s0, s1)
    sg = tl.sigmoid((acc_pp * rs[:, None]) * sc_pp[None, :] + b_pp[None, :])
    pre = sg + heps
    row = offs_t[:, None] * N
    tl.store(pre_ptr + row + offs_pp[None, :], pre, mask=t_mask[:, None] & is_pre[None, :])
    tl.store(post_ptr + row + (offs_pp - N)[None, :], 2 * sg, mask=t_mask[:, None] & is_post[None, :])

    # comb: row softmax (+eps), column normalisation, then ITERS-1 times rows then columns
    b_c = tl.load(base_ptr + 2 * N + offs_c).to(ACC)
    lg = tl.reshape((acc_c * rs[:, None]) * s2 + b_c[None, :], [BLOCK_T, N, N])
    e = tl.exp(lg - tl.max(lg, axis=2)[:, :, None])
    c = _div(e, tl.sum(e, axis=2)[:, :, None], ACC) + heps
    c = _div(c, tl.sum(c, axis=1)[:, None, :] + heps, ACC)
    for _ in range(ITERS - 1):
        c = _div(c, tl.sum(c, axis=2)[:, :, None] + heps, ACC)
        c = _div(c, tl.sum(c, axis=1)[:, None, :] + heps, ACC)
    tl.store(comb_ptr + offs_t[:, None] * NN + offs_c[None, :], tl.reshape(c, [BLOCK_T, NN]),
             mask=t_mask[:, None])
    return pre


@triton.jit
def _collapse_weights(pre, offs_t, t_mask, cpre_ptr, scp_t, scp_n, N: tl.constexpr, PP: tl.constexpr,
                      HAS_CPRE: tl.constexpr, COLL: tl.constexpr):
    """The collapse weights [BT, PP] in their dtype: this sub-layer's pre, or the caller's (V4.1's lagged form)."""
    if HAS_CPRE:
        offs_pp = tl.arange(0, PP)
        return tl.load(cpre_ptr + offs_t[:, None] * scp_t + offs_pp[None, :] * scp_n,
                       mask=t_mask[:, None] & (offs_pp < N)[None, :], other=0.0).to(COLL)
    else:
        return pre.to(COLL)


@triton.jit
def _collapse_chunk(x_rows, pc, offs_d, m, sx_n, sx_d, N: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr,
                    BLOCK_DC: tl.constexpr, COLL: tl.constexpr, Y: tl.constexpr):
    """y = sum_i pc_i x_i over the D columns offs_d, in COLL, rounded to Y (as hc_collapse)."""
    offs_pp = tl.arange(0, PP)
    y = tl.zeros([BLOCK_T, BLOCK_DC], COLL)
    for i in tl.static_range(N):
        p_i = tl.sum(tl.where(offs_pp[None, :] == i, pc, 0.0), axis=1)  # column i, exactly
        xi = tl.load(x_rows + i * sx_n + offs_d[None, :] * sx_d, mask=m, other=0.0).to(COLL)
        y += p_i[:, None] * xi
    return y.to(Y)


@triton.jit
def _finish(acc_pp, acc_c, ss, offs_t, t_mask, x_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr, pre_ptr,
            post_ptr, comb_ptr, D, sx_t, sx_n, sx_d, scp_t, scp_n,
            neps_hi, neps_lo, heps_hi, heps_lo, eps2_hi, eps2_lo,
            N: tl.constexpr, ITERS: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DC: tl.constexpr,
            HAS_CPRE: tl.constexpr, HAS_NORM: tl.constexpr, ACC: tl.constexpr, COLL: tl.constexpr,
            ONE_CHUNK: tl.constexpr, COLLAPSE: tl.constexpr = True, HOIST: tl.constexpr = False):
    """Summed mixes of a token block -> pre, post, comb stored; y (collapsed, optionally normed) stored, by this one
    program over all of D (in one chunk of BLOCK_DC where ONE_CHUNK), unless COLLAPSE is off (`_collapse_kernel`
    does it after this launch)."""
    HOISTED: tl.constexpr = COLLAPSE and ONE_CHUNK and HOIST and N == 4
    if HOISTED:
        # the 4 streams (and the norm weight) loaded before the coefficients: their latency (L2: the other programs'
        # stores) passes under the Sinkhorn iterations instead of following them (a decode program's tail)
        x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * sx_t
        offs_d = tl.arange(0, BLOCK_DC)
        d_mask = offs_d < D
        m = t_mask[:, None] & d_mask[None, :]
        x0 = tl.load(x_rows + offs_d[None, :] * sx_d, mask=m, other=0.0)
        x1 = tl.load(x_rows + sx_n + offs_d[None, :] * sx_d, mask=m, other=0.0)
        x2 = tl.load(x_rows + 2 * sx_n + offs_d[None, :] * sx_d, mask=m, other=0.0)
        x3 = tl.load(x_rows + 3 * sx_n + offs_d[None, :] * sx_d, mask=m, other=0.0)
        if HAS_NORM:
            w = tl.load(nw_ptr + offs_d, mask=d_mask, other=0.0)
        else:
            w = None
    pre = _coefficients(acc_pp, acc_c, ss, offs_t, t_mask, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, D,
                        neps_hi, neps_lo, heps_hi, heps_lo, N, ITERS, PP, BLOCK_T, ACC)
    if COLLAPSE:
        pc = _collapse_weights(pre, offs_t, t_mask, cpre_ptr, scp_t, scp_n, N, PP, HAS_CPRE, COLL)
        if HOISTED:
            offs_pp = tl.arange(0, PP)
            y = tl.zeros([BLOCK_T, BLOCK_DC], COLL)  # as _collapse_chunk: sum_i p_i x_i in order
            y += tl.sum(tl.where(offs_pp[None, :] == 0, pc, 0.0), axis=1)[:, None] * x0.to(COLL)
            y += tl.sum(tl.where(offs_pp[None, :] == 1, pc, 0.0), axis=1)[:, None] * x1.to(COLL)
            y += tl.sum(tl.where(offs_pp[None, :] == 2, pc, 0.0), axis=1)[:, None] * x2.to(COLL)
            y += tl.sum(tl.where(offs_pp[None, :] == 3, pc, 0.0), axis=1)[:, None] * x3.to(COLL)
            _store_y(y.to(y_ptr.dtype.element_ty), w, offs_t, offs_d, m, y_ptr, D, eps2_hi, eps2_lo, HAS_NORM, ACC)
        else:
            _collapse_norm(pc, offs_t, t_mask, x_ptr, nw_ptr, y_ptr, D, sx_t, sx_n, sx_d, eps2_hi, eps2_lo, N, PP,
                           BLOCK_T, BLOCK_DC, HAS_NORM, ACC, COLL, ONE_CHUNK)


@triton.jit
def _store_y(yo, w, offs_t, offs_d, m, y_ptr, D, eps2_hi, eps2_lo, HAS_NORM: tl.constexpr, ACC: tl.constexpr):
    """One chunk covering D: y (rounded to its dtype) stored, RMS-normed by the weight w where HAS_NORM."""
    y_rows = y_ptr + offs_t.to(tl.int64)[:, None] * D
    if HAS_NORM:
        yf = yo.to(ACC)
        r = _norm_scale(tl.sum(yf * yf, axis=1), D, eps2_hi, eps2_lo, ACC)
        tl.store(y_rows + offs_d[None, :], _normed(yf, r, w, ACC).to(yo.dtype), mask=m)
    else:
        tl.store(y_rows + offs_d[None, :], yo, mask=m)


@triton.jit
def _collapse_norm(pc, offs_t, t_mask, x_ptr, nw_ptr, y_ptr, D, sx_t, sx_n, sx_d, eps2_hi, eps2_lo, N: tl.constexpr,
                   PP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DC: tl.constexpr, HAS_NORM: tl.constexpr,
                   ACC: tl.constexpr, COLL: tl.constexpr, ONE_CHUNK: tl.constexpr):
    """y = sum_i pc_i x_i (pc [BT, PP] in COLL) over all of D, optionally normed, stored for the token block."""
    Y = y_ptr.dtype.element_ty
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * sx_t
    y_rows = y_ptr + offs_t.to(tl.int64)[:, None] * D
    if ONE_CHUNK:  # y stays in registers for the norm: no store and read back (a decode program's last round trip)
        offs_d = tl.arange(0, BLOCK_DC)
        d_mask = offs_d < D
        m = t_mask[:, None] & d_mask[None, :]
        if HAS_NORM:
            w = tl.load(nw_ptr + offs_d, mask=d_mask, other=0.0)  # issued beside the streams' loads
        else:
            w = None
        yo = _collapse_chunk(x_rows, pc, offs_d, m, sx_n, sx_d, N, PP, BLOCK_T, BLOCK_DC, COLL, Y)
        _store_y(yo, w, offs_t, offs_d, m, y_ptr, D, eps2_hi, eps2_lo, HAS_NORM, ACC)
    else:
        ssy = tl.zeros([BLOCK_T], ACC)
        for d0 in range(0, D, BLOCK_DC):
            offs_d = d0 + tl.arange(0, BLOCK_DC)
            m = t_mask[:, None] & (offs_d < D)[None, :]
            yo = _collapse_chunk(x_rows, pc, offs_d, m, sx_n, sx_d, N, PP, BLOCK_T, BLOCK_DC, COLL, Y)
            tl.store(y_rows + offs_d[None, :], yo, mask=m)
            if HAS_NORM:
                yf = yo.to(ACC)
                ssy += tl.sum(yf * yf, axis=1)
        if HAS_NORM:
            # rms_norm of the stored (rounded) y: w * (y * rsqrt(mean(y^2) + eps))
            tl.debug_barrier()  # every thread's y stores precede the loads below
            r = _norm_scale(ssy, D, eps2_hi, eps2_lo, ACC)
            for d0 in range(0, D, BLOCK_DC):
                offs_d = d0 + tl.arange(0, BLOCK_DC)
                d_mask = offs_d < D
                m = t_mask[:, None] & d_mask[None, :]
                yf = tl.load(y_rows + offs_d[None, :], mask=m, other=0.0).to(ACC)
                w = tl.load(nw_ptr + offs_d, mask=d_mask, other=0.0)
                tl.store(y_rows + offs_d[None, :], _normed(yf, r, w, ACC).to(Y), mask=m)


@triton.jit
def _norm_scale(ssy, D, eps2_hi, eps2_lo, ACC: tl.constexpr):
    eps2 = tl.cast(eps2_hi, ACC) + tl.cast(eps2_lo, ACC)
    return _rsqrt(ssy / D + eps2, ACC)


@triton.jit
def _normed(yf, r, w, ACC: tl.constexpr):
    """rms_norm's output w * (y * r) (yf: the rounded y in ACC, r: its rsqrt(mean(y^2) + eps) per token)."""
    return w.to(ACC)[None, :] * (yf * r[:, None])


@triton.jit
def _program_slice(T, D, d_per_split, BLOCK_T: tl.constexpr):
    """This program's token block and D slice: (pid_t, pid_d, its tokens and their mask, [d_lo, d_hi))."""
    pid_t = tl.program_id(0)
    pid_d = tl.program_id(1)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    d_lo = pid_d * d_per_split
    return pid_t, pid_d, offs_t, offs_t < T, d_lo, tl.minimum(d_lo + d_per_split, D)


@triton.jit
def _split_partials(acc_pp, acc_c, ss, part_ptr, cnt_ptr, pid_t, pid_d, offs_t, N: tl.constexpr, PP: tl.constexpr,
                    BLOCK_T: tl.constexpr, SPLIT_D: tl.constexpr, ACC: tl.constexpr):
    """The split grid's meeting point: this program's partial mixes go to scratch [SPLIT_D, T_pad, W] (pre/post mixes,
    comb mixes, sum(x^2)); the last of the token block's programs to arrive gets every program's partials summed in a
    fixed order (the sums do not depend on who came last). -> (last, the sums)."""
    NN: tl.constexpr = N * N
    W: tl.constexpr = PP + NN + 1
    offs_pp = tl.arange(0, PP)
    offs_c = tl.arange(0, NN)
    t_pad = tl.num_programs(0) * BLOCK_T
    rows = part_ptr + (pid_d * t_pad + offs_t) * W
    tl.store(rows[:, None] + offs_pp[None, :], acc_pp)
    tl.store(rows[:, None] + PP + offs_c[None, :], acc_c)
    tl.store(rows + PP + NN, ss)
    last = last_to_arrive(cnt_ptr + pid_t, SPLIT_D)
    if last:
        acc_pp = tl.zeros([BLOCK_T, PP], ACC)
        acc_c = tl.zeros([BLOCK_T, NN], ACC)
        ss = tl.zeros([BLOCK_T], ACC)
        for s in tl.static_range(SPLIT_D):
            rows = part_ptr + (s * t_pad + offs_t) * W
            acc_pp += tl.load(rows[:, None] + offs_pp[None, :], cache_modifier=".cg")
            acc_c += tl.load(rows[:, None] + PP + offs_c[None, :], cache_modifier=".cg")
            ss += tl.load(rows + PP + NN, cache_modifier=".cg")
    return last, acc_pp, acc_c, ss


@step_jit
def _hc_pre_kernel(x_ptr, fn_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr, pre_ptr, post_ptr, comb_ptr,
                   part_ptr, cnt_ptr, T, D, d_per_split, sx_t, sx_n, sx_d, sf_r, sf_k, scp_t, scp_n,
                   neps_hi, neps_lo, heps_hi, heps_lo, eps2_hi, eps2_lo,
                   N: tl.constexpr, ITERS: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, SPLIT_D: tl.constexpr, EVEN_D: tl.constexpr,
                   HAS_CPRE: tl.constexpr,
                   HAS_NORM: tl.constexpr, ACC: tl.constexpr, COLL: tl.constexpr, ONE_CHUNK: tl.constexpr,
                   MIX: tl.constexpr,
                   INTERPRET: tl.constexpr, PDL: tl.constexpr = False, COLLAPSE: tl.constexpr = True,
                   HOIST: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid_t, pid_d, offs_t, t_mask, d_lo, d_hi = _program_slice(T, D, d_per_split, BLOCK_T)
    acc_pp, acc_c, ss = _mix_partial(x_ptr, fn_ptr, offs_t, t_mask, d_lo, d_hi, D, sx_t, sx_n, sx_d, sf_r, sf_k,
                                     N, PP, BLOCK_T, BLOCK_D, EVEN_D, ACC, MIX, INTERPRET)
    if SPLIT_D > 1:
        last, acc_pp, acc_c, ss = _split_partials(acc_pp, acc_c, ss, part_ptr, cnt_ptr, pid_t, pid_d, offs_t, N, PP,
                                                  BLOCK_T, SPLIT_D, ACC)
        if last:
            _finish(acc_pp, acc_c, ss, offs_t, t_mask, x_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr,
                    pre_ptr, post_ptr, comb_ptr, D, sx_t, sx_n, sx_d, scp_t, scp_n, neps_hi, neps_lo, heps_hi,
                    heps_lo, eps2_hi, eps2_lo, N, ITERS, PP, BLOCK_T, BLOCK_DC, HAS_CPRE, HAS_NORM, ACC, COLL,
                    ONE_CHUNK, COLLAPSE, HOIST)
            tl.store(cnt_ptr + pid_t, 0)  # ready for the next launch / graph replay
    else:
        _finish(acc_pp, acc_c, ss, offs_t, t_mask, x_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr, pre_ptr,
                post_ptr, comb_ptr, D, sx_t, sx_n, sx_d, scp_t, scp_n, neps_hi, neps_lo, heps_hi, heps_lo,
                eps2_hi, eps2_lo, N, ITERS, PP, BLOCK_T, BLOCK_DC, HAS_CPRE, HAS_NORM, ACC, COLL, ONE_CHUNK,
                COLLAPSE, HOIST)


@step_jit
def _collapse_kernel(x_ptr, pc_ptr, nw_ptr, y_ptr, T, D, sx_t, sx_n, sx_d, spc_t, spc_n, eps2_hi, eps2_lo,
                     N: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DC: tl.constexpr,
                     HAS_NORM: tl.constexpr, ACC: tl.constexpr, COLL: tl.constexpr, ONE_CHUNK: tl.constexpr,
                     PDL: tl.constexpr = False):
    """hc_pre's collapse and norm apart (PreConfig.collapse_apart): the collapse weights pc [T, n] (the launch
    before's pre, or the caller's lagged ones) read back, then `_finish`'s own collapse."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = offs_t < T
    pc = _collapse_weights(pc_ptr, offs_t, t_mask, pc_ptr, spc_t, spc_n, N, PP, True, COLL)
    _collapse_norm(pc, offs_t, t_mask, x_ptr, nw_ptr, y_ptr, D, sx_t, sx_n, sx_d, eps2_hi, eps2_lo, N, PP, BLOCK_T,
                   BLOCK_DC, HAS_NORM, ACC, COLL, ONE_CHUNK)


# ------------------------------------------------------------------------------------------------
# hc_post
# ------------------------------------------------------------------------------------------------

@triton.jit
def _load_f(f_ptr, peers_ptr, offs, mask, PEERS: tl.constexpr, FDT: tl.constexpr, ACC: tl.constexpr):
    """The sub-layer output f at element offsets `offs`, in ACC. PEERS > 0: f is a tensor-parallel sum left to this
    load (ops/peer_sum.py): the PEERS ranks' partials, read where they lie through the address table peers_ptr and
    summed in rank order in ACC, rounded to FDT as the all-reduce would give it."""
    # (an else, not an early return: the GPU compiler types the code after a constexpr-if's return as well)
    if PEERS == 0:
        f = tl.load(f_ptr + offs, mask=mask, other=0.0).to(ACC)
    else:
        P = f_ptr.dtype.element_ty
        s = tl.load(tl.load(peers_ptr).to(tl.pointer_type(P)) + offs, mask=mask, other=0.0).to(ACC)
        for r in tl.static_range(1, PEERS):
            s += tl.load(tl.load(peers_ptr + r).to(tl.pointer_type(P)) + offs, mask=mask, other=0.0).to(ACC)
        f = s.to(FDT).to(ACC)
    return f


@step_jit
def _hc_post_kernel(f_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, T, D, sf_t, sf_d, sx_t, sx_n, sx_d, sp_t, sp_n,
                    sc_t, sc_j, sc_k, N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                    ACC: tl.constexpr, peers_ptr=None, PEERS: tl.constexpr = 0, FDT: tl.constexpr = None,
                    PDL: tl.constexpr = False):
    """out[t, k, d] = post[t, k] f[t, d] + sum_j comb[t, j, k] x[t, j, d] (out contiguous [T, N, D])."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, N)
    t_mask = offs_t < T
    m = t_mask[:, None] & (offs_d < D)[None, :]
    t64 = offs_t.to(tl.int64)
    x_rows = x_ptr + t64[:, None] * sx_t + offs_d[None, :] * sx_d
    mixed = tl.zeros([BLOCK_T, N, BLOCK_D], ACC)
    for j in tl.static_range(N):  # sum over j in order, as the reference's einsum over 4 terms
        c_j = tl.load(comb_ptr + offs_t[:, None] * sc_t + j * sc_j + offs_k[None, :] * sc_k,
                      mask=t_mask[:, None], other=0.0).to(ACC)
        x_j = tl.load(x_rows + j * sx_n, mask=m, other=0.0).to(ACC)
        mixed = tl.fma(c_j[:, :, None], x_j[:, None, :], mixed)
    f = _load_f(f_ptr, peers_ptr, t64[:, None] * sf_t + offs_d[None, :] * sf_d, m, PEERS, FDT, ACC)
    p = tl.load(post_ptr + offs_t[:, None] * sp_t + offs_k[None, :] * sp_n, mask=t_mask[:, None], other=0.0)
    out = tl.fma(p.to(ACC)[:, :, None], f[:, None, :], mixed)
    o = out_ptr + t64[:, None, None] * (N * D) + offs_k[None, :, None] * D + offs_d[None, None, :]
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=m[:, None, :])


# ------------------------------------------------------------------------------------------------
# hc_post + the next sub-layer's hc_pre, one launch
# ------------------------------------------------------------------------------------------------

@triton.jit
def _expand_mix_partial(f_ptr, xo_ptr, post_ptr, comb_ptr, out_ptr, fn_ptr, offs_t, t_mask, d_lo, d_hi, D,
                        sf_t, sxo_t, sxo_n, sf_r, sf_k,
                        N: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                        EVEN_D: tl.constexpr, ACC: tl.constexpr, MIX: tl.constexpr, INTERPRET: tl.constexpr,
                        peers_ptr, PEERS: tl.constexpr, FDT: tl.constexpr):
    """Over d in [d_lo, d_hi): the expansion out_k = post_k f + sum_j comb[j, k] x_j (as `_hc_post_kernel`, stored in
    x's dtype into out [T, N, D]) and, from the stored values, the next sub-layer's mixes out @ fn^T split as the
    pre/post columns [BT, PP] and the comb columns [BT, N*N], and sum(out^2) [BT] (as `_mix_partial`)."""
    NN: tl.constexpr = N * N
    acc_pp, acc_c, ss, f_pp, f_c, pp_mask = _mix_init(fn_ptr, sf_r, N, PP, BLOCK_T, ACC)
    t64 = offs_t.to(tl.int64)
    OUT = out_ptr.dtype.element_ty
    for d0 in range(d_lo, d_hi, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        if EVEN_D:  # no mask along D keeps the loads and stores vectorised (broadcast by each access)
            m = t_mask[:, None]
        else:
            m = t_mask[:, None] & (offs_d < d_hi)[None, :]
        fv = _load_f(f_ptr, peers_ptr, t64[:, None] * sf_t + offs_d[None, :], m, PEERS, FDT, ACC)
        c_pp, c_c, c_ss = _chunk_start(acc_pp, acc_c, ss, BLOCK_T, PP, NN, BLOCK_D, ACC, MIX)
        for k in tl.static_range(N):
            mixed = tl.zeros([BLOCK_T, BLOCK_D], ACC)
            for j in tl.static_range(N):  # sum over j in order, as _hc_post_kernel
                c_jk = tl.load(comb_ptr + offs_t * NN + j * N + k, mask=t_mask, other=0.0).to(ACC)
                x_j = tl.load(xo_ptr + t64[:, None] * sxo_t + j * sxo_n + offs_d[None, :], mask=m, other=0.0)
                mixed = tl.fma(c_jk[:, None], x_j.to(ACC), mixed)
            p_k = tl.load(post_ptr + offs_t * N + k, mask=t_mask, other=0.0).to(ACC)
            xt = tl.fma(p_k[:, None], fv, mixed).to(OUT)
            tl.store(out_ptr + t64[:, None] * (N * D) + k * D + offs_d[None, :], xt, mask=m)
            # the next sub-layer's mixes, from the stored (rounded) streams
            kk = (k * D + offs_d).to(tl.int64)[None, :] * sf_k
            c_pp, c_c, c_ss = _mix_add(c_pp, c_c, c_ss, xt, f_pp, f_c, kk, pp_mask, offs_d < d_hi, EVEN_D, ACC, MIX,
                                       INTERPRET)
        acc_pp, acc_c, ss = _chunk_end(acc_pp, acc_c, ss, c_pp, c_c, c_ss, MIX)
    return acc_pp, acc_c, ss


@step_jit
def _hc_post_pre_kernel(f_ptr, xo_ptr, po_ptr, co_ptr, x_ptr, fn_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr,
                        pre_ptr, post_ptr, comb_ptr, part_ptr, cnt_ptr, T, D, d_per_split, sf_t, sxo_t, sxo_n,
                        sf_r, sf_k, scp_t, scp_n, neps_hi, neps_lo, heps_hi, heps_lo, eps2_hi, eps2_lo,
                        N: tl.constexpr, ITERS: tl.constexpr, PP: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, SPLIT_D: tl.constexpr, EVEN_D: tl.constexpr,
                        HAS_CPRE: tl.constexpr, HAS_NORM: tl.constexpr, ACC: tl.constexpr, COLL: tl.constexpr,
                        ONE_CHUNK: tl.constexpr, MIX: tl.constexpr, INTERPRET: tl.constexpr,
                        peers_ptr=None, PEERS: tl.constexpr = 0, FDT: tl.constexpr = None,
                        PDL: tl.constexpr = False, HOIST: tl.constexpr = False):
    """x = hc_post(f, xo, po, co) stored, then hc_pre of x for the next sub-layer (as `_hc_pre_kernel`, whose finishing
    program reads the new streams back: its own (after a barrier) or, on the split grid, every program's (after the
    acq_rel arrival))."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid_t, pid_d, offs_t, t_mask, d_lo, d_hi = _program_slice(T, D, d_per_split, BLOCK_T)
    acc_pp, acc_c, ss = _expand_mix_partial(f_ptr, xo_ptr, po_ptr, co_ptr, x_ptr, fn_ptr, offs_t, t_mask, d_lo, d_hi,
                                            D, sf_t, sxo_t, sxo_n, sf_r, sf_k, N, PP, BLOCK_T, BLOCK_D, EVEN_D, ACC,
                                            MIX, INTERPRET, peers_ptr, PEERS, FDT)
    if SPLIT_D > 1:
        last, acc_pp, acc_c, ss = _split_partials(acc_pp, acc_c, ss, part_ptr, cnt_ptr, pid_t, pid_d, offs_t, N, PP,
                                                  BLOCK_T, SPLIT_D, ACC)
        if last:
            _finish(acc_pp, acc_c, ss, offs_t, t_mask, x_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr,
                    pre_ptr, post_ptr, comb_ptr, D, N * D, D, 1, scp_t, scp_n, neps_hi, neps_lo, heps_hi,
                    heps_lo, eps2_hi, eps2_lo, N, ITERS, PP, BLOCK_T, BLOCK_DC, HAS_CPRE, HAS_NORM, ACC, COLL,
                    ONE_CHUNK, HOIST=HOIST)
            tl.store(cnt_ptr + pid_t, 0)  # ready for the next launch / graph replay
    else:
        tl.debug_barrier()  # every thread's stores of the new streams precede the collapse's loads
        _finish(acc_pp, acc_c, ss, offs_t, t_mask, x_ptr, base_ptr, scale_ptr, cpre_ptr, nw_ptr, y_ptr, pre_ptr,
                post_ptr, comb_ptr, D, N * D, D, 1, scp_t, scp_n, neps_hi, neps_lo, heps_hi, heps_lo,
                eps2_hi, eps2_lo, N, ITERS, PP, BLOCK_T, BLOCK_DC, HAS_CPRE, HAS_NORM, ACC, COLL, ONE_CHUNK,
                HOIST=HOIST)


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------

def supports(x: torch.Tensor, collapse_pre: torch.Tensor | None = None) -> bool:
    """True where the kernels run: x [T, n, D] float with n a power of two in [4, 16] and D >= 16; CUDA without
    float64 (fp64 exists only for the CPU interpreter), or the CPU under Triton's interpreter (TRITON_INTERPRET).
    A `collapse_pre` must be float32/float64 [T, n] on x's device."""
    if x.dim() != 3 or x.dtype not in _FLOATS:
        return False
    n = x.shape[1]
    if n not in (4, 8, 16) or x.shape[2] < 16:
        return False
    if not runs_here(x):
        return False
    if collapse_pre is not None:
        if collapse_pre.dtype not in (torch.float32, torch.float64) or collapse_pre.device != x.device:
            return False
        if tuple(collapse_pre.shape) != tuple(x.shape[:2]):
            return False
    return True


def default_pre_config(t: int, d: int, on_gpu: bool, bf16: bool = True) -> PreConfig:
    """GPU: from `benchmarks/kernels/mhc.py --sweep` on the H200 (decode at 1-64 tokens, prefill chunks at 528 and
    2048 and 8192 tokens): the split grid, small token blocks over D slices (the finishing program's collapse covers
    only its own tokens); bf16: x's dtype (the prefill grid's tensor-core mixes are for bf16 streams). The
    interpreter gets few, large programs (numpy cost per op, not speed)."""
    if not on_gpu:
        return PreConfig(block_t=min(64, next_pow2(t)), block_d=min(128, _pow2_at_least_16(d)),
                         split_d=1)
    if t > 1024 and not bf16:  # fp32 FMA dots on 16-token blocks over 4 D slices (eighteenth session)
        return PreConfig(block_t=16, block_d=64, split_d=4, block_dc=256, num_warps=4, num_stages=2, bf16x3=False)
    if 128 < t <= 4096 and bf16:
        # the mixes on 64-token blocks over 16 D slices of 64-wide chunks (the bf16x3 tensor-core GEMM promoted per
        # chunk), the collapse and norm a launch of their own (one token a program) and hc_post apart. H100, D = 5120,
        # `mhc.py --sweep` (twenty-seventh session), against the grids before (8-token blocks over 8 slices up to
        # 1024, then 32-token ones over 4): T = 640 hc_pre 121.6 -> 67.7 us, hc_post_pre 149.7 -> 94.4; T = 2048
        # 242.2 -> 142.3 and 324.1 -> 219.2 (the coefficients as close to the float32 reference: 5.1e-7 / 6.4e-7
        # scaled error); at T = 128 the same as the 2-token blocks (hc_post_pre 59.2 / 60.7 us)
        return PreConfig(block_t=64, block_d=64, split_d=16, block_dc=64, num_warps=4, num_stages=2, bf16x3=True,
                         promote=True, post_apart=True, collapse_apart=True)
    if t > 1024:
        # the bf16x3 tensor-core GEMM promoted per D chunk (chained through the MMA's accumulator, it put the
        # coefficients 3.7e-4 (relative) from the float32 reference at T=4096; promoted they are as close as fp32
        # dots'), 64-wide D chunks over 4 D slices, hc_post_pre as two launches (fused, the tensor-core mixes were 4-5x
        # the pre side alone). H200, `mhc.py --sweep`, nineteenth session, against the fp32 FMA dots on 16-token
        # blocks used before: T=2048 (32-token blocks) hc_pre 648 -> 190 us, hc_post_pre 684 -> 243 us; T=8192
        # (64-token blocks) 2,437 -> 422 and 2,564 -> 632 us; the coefficients' scaled error 1.2e-6 (both), 4096 not
        # measured (64-token blocks at 2048: hc_post_pre 317 us)
        return PreConfig(block_t=64 if t > 4096 else 32, block_d=64, split_d=4, block_dc=64 if t > 4096 else 128,
                         num_warps=4, num_stages=2, bf16x3=True, promote=True, post_apart=True)
    # up to 64 tokens: 2-token blocks over 32 D-splits (H200, `mhc.py --sweep --tokens 32,8`, eleventh session: at
    # T=32 hc_pre 23.6 -> 20.4 us and hc_post_pre 32.4 -> 22.2 us against (4, 16); at T=8 the same as before); up to
    # 1024, 8-token blocks over 8 (eighteenth session, T=528, the prefill chunk of a mixed step: hc_pre 116 -> 86 us and
    # hc_post_pre 360 -> 158 us against 16-token blocks over 4)
    # up to 128 (V4.1's decoder suffixes, batched decode): 2-token blocks too, with hc_post apart (H100, D = 5120,
    # twenty-sixth session, T = 128: hc_post_pre 80.7 -> 60.6 us against 8-token blocks, hc_pre 53.0 / 55.5)
    # up to 128 tokens, 1-token blocks (their mixes "flat"; H100, D = 5120, `mhc.py --sweep`, against 2-token blocks:
    # T = 32 hc_pre 23.45 -> 18.25 us, hc_post_pre 31.64 -> 21.36 (thirty-second session); T = 64 33.36 -> 25.91 and
    # 43.66 -> 30.67, T = 96 46.22 -> 32.73 and 50.43 -> 37.27, T = 128 55.61 -> 38.49 and 60.72 -> 43.49 (thirty-third).
    # The graphed V4.1 step at batch 32 / 4K: replay 23.20 -> 22.63 ms against 1-token blocks to 4 tokens only
    # (`V4SERVE_MHC_ONE_TOKEN_MAX=4`)
    one = int(env_get(ONE_TOKEN_ENV) or 128)
    block_t, split_d = ((1, 32) if t <= one else (2, 32) if t <= 128 else (8, 8))
    # the finishing collapse: ~4096-element tiles, so that a 1-token block crosses D=4096 in one step (its y then
    # stays in registers for the norm) rather than 32 latency-bound ones; a single token crosses V4.1's D=5120 in
    # one 8192 tile too (H200, `mhc.py --sweep --dim 5120`: hc_pre 16.3 -> 15.4 us, hc_post_pre 17.9 -> 16.7 us)
    cap = 8192 if block_t == 1 else 4096 // block_t
    block_dc = max(128, min(next_pow2(d), cap))
    # above 64 tokens hc_post_pre runs as hc_post then hc_pre (the same bits): fused, it took twice hc_pre's time on
    # these grids (H100, D = 5120, `mhc.py --sweep`, twenty-sixth session: T = 640 245.6 against 119.9 us; T = 256
    # 106.6 / 77.0; T = 1024 364.7 / 179.8)
    return PreConfig(block_t=block_t, block_d=128, split_d=max(1, min(split_d, d // 128)), block_dc=block_dc,
                     num_warps=4, post_apart=t > 64, flat=env_get(FLAT_ENV) != "0",
                     hoist=t <= 4 and env_get(HOIST_ENV) == "1")


def default_post_config(t: int, d: int, on_gpu: bool) -> PostConfig:
    if not on_gpu:
        return PostConfig(block_t=min(64, next_pow2(t)), block_d=min(128, _pow2_at_least_16(d)))
    if t <= 16:
        return PostConfig(block_t=1, block_d=256, num_warps=4)
    return PostConfig(block_t=4, block_d=256, num_warps=8)


def _pow2_at_least_16(v: int) -> int:
    return max(16, next_pow2(v))


@dataclass(frozen=True)
class _PreLaunch:
    """A hc_pre launch's grid and arguments around its x and strides: kernel[grid](<x args>, *head, <x strides>,
    fn.stride(0), fn.stride(1), *tail, **const)."""
    grid: tuple[int, int]
    head: tuple
    tail: tuple
    const: dict
    collapse: _CollapseLaunch | None = None  # PreConfig.collapse_apart: the launch after


@dataclass(frozen=True)
class _CollapseLaunch:
    """`_collapse_kernel`'s grid and arguments after x: kernel[grid](x, *args[:5], <x strides>, *args[5:], **const)."""
    grid: tuple[int]
    args: tuple
    const: dict

    def run(self, x: torch.Tensor) -> None:
        _collapse_kernel[self.grid](x, *self.args[:5], x.stride(0), x.stride(1), x.stride(2), *self.args[5:],
                                    **self.const, **pdl_launch(x), **_EXACT)


def _pre_launch(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
                norm_eps: float, hc_eps: float, collapse_pre: torch.Tensor | None,
                norm_weight: torch.Tensor | None, norm_eps2: float | None, config: PreConfig | None
                ) -> tuple[tuple[torch.Tensor, ...], _PreLaunch | None]:
    """The outputs (y, pre, post, comb) of a hc_pre over x, and its launch (None for no tokens). x may be the new
    streams a fused launch is about to write: only its shape, dtype and device are read here."""
    t, nx, d = x.shape
    if nx != n or tuple(fn.shape) != ((2 + n) * n, n * d) or base.numel() != (2 + n) * n or scale.numel() < 3:
        raise ValueError(f"mHC shapes do not fit: x {list(x.shape)}, fn {list(fn.shape)}, base {list(base.shape)}, "
                         f"scale {list(scale.shape)}, n={n}")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    dev = x.device
    outs = (torch.empty(t, d, dtype=x.dtype, device=dev), torch.empty(t, n, dtype=acc, device=dev),
            torch.empty(t, n, dtype=acc, device=dev), torch.empty(t, n, n, dtype=acc, device=dev))
    if t == 0:
        return outs, None
    cfg = config or default_pre_config(t, d, x.is_cuda, x.dtype == torch.bfloat16)
    block_dc = cfg.block_dc or cfg.block_d
    if any(v & (v - 1) for v in (cfg.block_t, cfg.block_d, block_dc)) or cfg.block_d < 16:
        raise ValueError(f"block sizes must be powers of two (block_d >= 16): {cfg}")
    x3 = cfg.bf16x3 if cfg.bf16x3 is not None else x.is_cuda
    x3 = x3 and (x.dtype == torch.bfloat16 or not x.is_cuda)  # on a GPU the split GEMM reads x as bf16
    if x3 and acc != torch.float32:
        raise ValueError("the bf16x3 GEMM is for float32 accumulation")
    fma = cfg.fma if cfg.fma is not None else (x.is_cuda and cfg.block_t <= 2)
    if fma:
        mix = "flat" if cfg.flat and cfg.block_t == 1 else "fma"
    else:
        mix = ("x3p" if cfg.promote else "x3") if x3 else "ieee"
    pp = max(16, next_pow2(2 * n))
    n_tb = cdiv(t, cfg.block_t)
    d_per_split = cdiv(cdiv(d, cfg.split_d), cfg.block_d) * cfg.block_d
    split_d = cdiv(d, d_per_split)
    pre = outs[1]
    if split_d > 1:
        if n_tb > N_COUNTERS:
            raise ValueError(f"split grid over {n_tb} token blocks (max {N_COUNTERS}): use larger token blocks")
        part = torch.empty(split_d, n_tb * cfg.block_t, pp + n * n + 1, dtype=acc, device=dev)
        cnt = _COUNTERS.get(dev)
    else:
        part = cnt = pre  # unused
    has_cpre, has_norm = collapse_pre is not None, norm_weight is not None
    cpre = collapse_pre if has_cpre else pre
    coll = collapse_pre.dtype if has_cpre else acc
    nw = norm_weight if has_norm else pre
    if has_norm and (norm_weight.numel() != d or norm_weight.dim() != 1 or not norm_weight.is_contiguous()):
        raise ValueError(f"norm weight of shape {list(norm_weight.shape)} does not fit D={d}")
    neps, heps = hi_lo(float(norm_eps)), hi_lo(float(hc_eps))
    eps2 = hi_lo(float(norm_eps if norm_eps2 is None else norm_eps2))
    base_c, scale_c = base.reshape(-1), scale.reshape(-1)  # tiny; [(2+n)n] and [3] read by index
    head = (fn, base_c, scale_c, cpre, nw, *outs, part, cnt, t, d, d_per_split)
    tail = (cpre.stride(0), cpre.stride(1), *neps, *heps, *eps2)
    const = {"N": n, "ITERS": int(iters), "PP": pp, "BLOCK_T": cfg.block_t, "BLOCK_D": cfg.block_d,
             "BLOCK_DC": block_dc, "SPLIT_D": split_d, "EVEN_D": d % cfg.block_d == 0, "HAS_CPRE": has_cpre,
             "HAS_NORM": has_norm, "ACC": _TL[acc], "COLL": _TL[coll], "MIX": mix, "INTERPRET": interpreting(),
             "ONE_CHUNK": block_dc >= d, "HOIST": cfg.hoist and block_dc >= d,
             "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    collapse = None
    if cfg.collapse_apart:
        const["COLLAPSE"] = False
        ct = cfg.collapse_t
        if ct & (ct - 1):
            raise ValueError(f"collapse_t must be a power of two: {cfg}")
        cdc = cfg.collapse_dc or max(16, min(next_pow2(d), 8192 // ct))
        if cdc & (cdc - 1):
            raise ValueError(f"collapse_dc must be a power of two: {cfg}")
        collapse = _CollapseLaunch(
            (cdiv(t, ct),), (cpre, nw, outs[0], t, d, cpre.stride(0), cpre.stride(1), *eps2),
            {"N": n, "PP": pp, "BLOCK_T": ct, "BLOCK_DC": cdc, "HAS_NORM": has_norm, "ACC": _TL[acc], "COLL": _TL[coll],
             "ONE_CHUNK": cdc >= d, "num_warps": cfg.collapse_warps})
    return outs, _PreLaunch((n_tb, split_d), head, tail, const, collapse)


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
           norm_eps: float, hc_eps: float, collapse_pre: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, norm_eps2: float | None = None,
           config: PreConfig | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (y [T, D] in x's dtype, pre [T, n], post [T, n], comb [T, n, n]), as ops.mhc.hc_pre_reference."""
    outs, launch = _pre_launch(x, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre, norm_weight, norm_eps2,
                               config)
    if launch is not None:
        _hc_pre_kernel[launch.grid](x, *launch.head, x.stride(0), x.stride(1), x.stride(2), fn.stride(0),
                                    fn.stride(1), *launch.tail, **launch.const, **pdl_launch(x), **_EXACT)
        if launch.collapse is not None:
            launch.collapse.run(x)
    return outs


def _peers(f: torch.Tensor | PartialSum) -> tuple[torch.Tensor, dict]:
    """(the tensor the kernel reads f's dtype and strides from, the launch arguments of a PartialSum's fused load)."""
    if not isinstance(f, PartialSum):
        return f, {}
    return f.parts[0], {"peers_ptr": f.pointers(), "PEERS": len(f.parts), "FDT": _TL[f.out_dtype]}


def hc_post_pre(f: torch.Tensor | PartialSum, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int, norm_eps: float,
                hc_eps: float, collapse_pre: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                norm_eps2: float | None = None, config: PreConfig | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_post(f, x, post, comb) and hc_pre of its result in one launch -> (the new streams [T, n, D] in x's dtype,
    y, pre, post, comb of the next sub-layer), as ops.mhc.hc_post_pre_reference. The hc_pre config's grid. f may be
    a PartialSum (ops/peer_sum.py): the ranks' partials are summed as the expansion loads them."""
    t, _, d = x.shape
    cfg = config or default_pre_config(t, d, x.is_cuda, x.dtype == torch.bfloat16)
    if cfg.post_apart or cfg.collapse_apart:
        new = hc_post(f, x, post, comb)
        return (new, *hc_pre(new, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre, norm_weight, norm_eps2,
                             cfg))
    f, fused = _peers(f)
    if tuple(f.shape) != (t, d) or tuple(post.shape) != (t, n) or tuple(comb.shape) != (t, n, n):
        raise ValueError(f"mHC expand shapes do not fit: f {list(f.shape)}, x {list(x.shape)}, "
                         f"post {list(post.shape)}, comb {list(comb.shape)}")
    new = torch.empty(t, n, d, dtype=x.dtype, device=x.device)
    outs, launch = _pre_launch(new, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre, norm_weight,
                               norm_eps2, cfg)
    if launch is not None:
        f = f if f.stride(-1) == 1 else f.contiguous()
        x = x if x.stride(-1) == 1 else x.contiguous()
        post, comb = post.contiguous(), comb.contiguous()
        _hc_post_pre_kernel[launch.grid](f, x, post, comb, new, *launch.head, f.stride(0), x.stride(0), x.stride(1),
                                         fn.stride(0), fn.stride(1), *launch.tail, **launch.const, **fused,
                                         **pdl_launch(x), **_EXACT)
    return (new, *outs)


def hc_post(f: torch.Tensor | PartialSum, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            config: PostConfig | None = None) -> torch.Tensor:
    """X'_k = post_k f + sum_j comb[j, k] X_j in x's dtype, as ops.mhc.hc_expand (f may be a PartialSum, as in
    `hc_post_pre`)."""
    f, fused = _peers(f)
    t, n, d = x.shape
    if tuple(f.shape) != (t, d) or tuple(post.shape) != (t, n) or tuple(comb.shape) != (t, n, n):
        raise ValueError(f"mHC expand shapes do not fit: f {list(f.shape)}, x {list(x.shape)}, "
                         f"post {list(post.shape)}, comb {list(comb.shape)}")
    acc = torch.float64 if torch.float64 in (x.dtype, comb.dtype) else torch.float32
    out = torch.empty(t, n, d, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    cfg = config or default_post_config(t, d, x.is_cuda)
    grid = (cdiv(t, cfg.block_t), cdiv(d, cfg.block_d))
    _hc_post_kernel[grid](f, x, post, comb, out, t, d, f.stride(0), f.stride(1), x.stride(0), x.stride(1),
                          x.stride(2), post.stride(0), post.stride(1), comb.stride(0), comb.stride(1),
                          comb.stride(2), N=n, BLOCK_T=cfg.block_t, BLOCK_D=cfg.block_d, ACC=_TL[acc],
                          num_warps=cfg.num_warps, **fused, **pdl_launch(x), **_EXACT)
    return out
