"""The shared expert's gate and up projections with their SwiGLU, in ONE decode launch (M <= 64 rows).

h = silu(min(g, limit)) * clamp(u, -limit, limit) with g = x W1^T, u = x W3^T (limit 0: no clamp), written in x's
dtype: the input of the down projection (w2), which the one-launch decode GEMV (fp8_gemv) then runs. Two launches for
the shared expert instead of three GEMVs plus the elementwise SwiGLU.

Each program streams the same [BN, K-slice] tile of both weights (two separate tensors of identical shape and block
scales, as the two `Linear` modules store them) against one x tile, into two float32 accumulators:

* the activations are quantized in registers once per 1 x block for both dots, by fp8_gemv's own `quantize_rows`
  (bit-identical to kernels/quant.py and to fp8_gemv), W8A16 when there is no activation quantization;
* split-K as fp8_gemv: each program writes both partial tiles to a float32 workspace and the last program to arrive
  at an output tile (per-tile arrival counters, acq_rel) adds them in split order and runs the epilogue; with
  the same tiles and splits, g and u are the very sums fp8_gemv computes for w1 and w3 alone (paired_config: fp8_gemv's
  tiles, half its splits on the GPU);
* the epilogue rounds g and u to x's dtype and back before the SwiGLU (the rounding points of the reference, whose
  linears return x's dtype), computes the SwiGLU in float32 as ops/moe.swiglu does (silu(g) = g / (1 + exp(-g))), and
  rounds h once to x's dtype. So h equals ops/moe.swiglu of fp8_gemv's w1 and w3 outputs, up to the float32 exp (and
  division) of the SwiGLU: bit-exact under the interpreter (tests/ops/test_shared_expert.py); on the GPU, where
  tl.exp is the fast exp2-based one, within one ulp of x's dtype (what the GPU tests assert).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..env import switch as env_switch
from . import cdiv, interpreting, step_jit
from .fp8_gemv import (FMA_ONE_ROW, act_block, block_dot, config, e8m0_to_f32, fit_fma, fma_acc, fma_w, fma_x,
                       scale_block, split_count)
from .fp8_gemv import supports as gemv_supports
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .quant import act_quant
from .split_grid import ArrivalCounters, last_to_arrive

_COUNTERS = ArrivalCounters()
# Rows of the tensor-core form with their activations quantized by one act_quant launch before (cfg "prequant"): the
# in-register quantization of each [BM, block] x tile inside the K loop (amax reductions, shuffles, e4m3 rounding)
# leaves Triton 3.6 staging none of the x loads (sm_90 SASS, V4.1 at 32 rows: 1,121 instructions a K tile against
# 636). H100, `fp8_gemm.py --shared-expert` (µs, in-register -> prequantized): V4.1 M=8 28.0 -> 23.8, M=32 32.9 ->
# 30.3; V4 M=32 18.1 -> 15.5 but M=8 12.4 -> 13.2. With fp8_gemv's lean K loop (its default for 32-wide blocks), H100,
# thirty-seventh session: V4.1 M=8 28.1 -> 22.6, M=32 33.1 -> 27.3 (V4 M=8 12.3 -> 14.5, slower); the V4.1 batch-32
# step's replay 22.52 -> 21.68 ms with both (22.19 with the lean loop alone). The default for 32-wide blocks (V4.1);
# V4SERVE_SWIGLU_PREQUANT=1 / 0 (read per config) forces it on / off.
PREQUANT_ENV = "V4SERVE_SWIGLU_PREQUANT"


def supports(x2: torch.Tensor, w1: tuple, w3: tuple, act_group: int) -> bool:
    """Decode rows (x [M, K], M <= 64) over two FP8 weights (weight, scale, block) of the same shape, scales and
    block, where fp8_gemv takes each of them."""
    (q1, s1, b1), (q3, s3, b3) = w1, w3
    return (x2.dim() == 2 and s1 is not None and s3 is not None and b1 == b3 and q1.shape == q3.shape
            and q3.dtype == q1.dtype and s1.shape == s3.shape and q1.shape[1] == x2.shape[1]
            and q1.device == x2.device == q3.device and gemv_supports(x2, q1, b1, act_group))


@triton.jit
def bf16_rne(v):
    """float32 v rounded to the nearest bfloat16 value (ties to even), as float32: Triton's interpreter casts float32
    to bfloat16 by truncation; the hardware cast (and torch) round to nearest even, as this does."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def to_out(v, out_ptr, HAND_RNE: tl.constexpr):
    """float32 v -> the output dtype, rounded to nearest even (by hand for bf16 under the interpreter)."""
    if HAND_RNE:
        v = bf16_rne(v)
    return v.to(out_ptr.dtype.element_ty)


@triton.jit
def swiglu_rounded(g, u, limit, out_ptr, CLAMP: tl.constexpr, HAND_RNE: tl.constexpr):
    """The epilogue: g and u rounded to the output dtype (the reference's linears return it), the clamped SwiGLU in
    float32, h in the output dtype."""
    g = to_out(g, out_ptr, HAND_RNE).to(tl.float32)
    u = to_out(u, out_ptr, HAND_RNE).to(tl.float32)
    if CLAMP:
        u = tl.minimum(tl.maximum(u, -limit), limit)
        g = tl.minimum(g, limit)
    return to_out(g / (1.0 + tl.exp(-g)) * u, out_ptr, HAND_RNE)


@step_jit
def _swiglu_gemv_kernel(x_ptr, xs_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, part_ptr, h_ptr, cnt_ptr,
                        M, N, K, k_per_split, limit,
                        stride_xm, stride_xsm, stride_xsk, stride_w1n, stride_w3n, stride_s1n, stride_s3n, stride_hm,
                        SB: tl.constexpr, A_FP8: tl.constexpr, CLAMP: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, SPLITS: tl.constexpr, INTERPRET: tl.constexpr,
                        HAND_RNE: tl.constexpr, PDL: tl.constexpr = False, SWAP: tl.constexpr = False,
                        FMA: tl.constexpr = False, EVEN_K: tl.constexpr = False, DEQ: tl.constexpr = False,
                        A_PRE: tl.constexpr = False, FULL: tl.constexpr = False, PAIR: tl.constexpr = False):
    # A_PRE: x already in e4m3 with its per-block float32 scales at xs_ptr (kernels/quant.act_quant, `prequant`)
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if SWAP:  # the transposed accumulators (fp8_gemv.block_dot)
        acc_g = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    k_lo = split * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    if FMA:  # one row on the CUDA cores (fp8_gemv.fma_acc): both weight tiles in flight, x quantized once
        for k0 in range(k_lo, k_hi, BK):
            w1, ws1 = fma_w(w1_ptr, s1_ptr, offs_n, n_ok, k0, k_hi, stride_w1n, stride_s1n, SB, BK, True, EVEN_K)
            w3, ws3 = fma_w(w3_ptr, s3_ptr, offs_n, n_ok, k0, k_hi, stride_w3n, stride_s3n, SB, BK, True, EVEN_K)
            x, x_scale = fma_x(x_ptr, x_ptr, M > 0, k0, k_hi, SB, BK, A_FP8, False, EVEN_K)
            acc_g = fma_acc(acc_g, 0, w1, ws1, x, x_scale, SB)
            acc_u = fma_acc(acc_u, 0, w3, ws3, x, x_scale, SB)
    else:
        for k0 in range(k_lo, k_hi, BK):
            for sub in tl.static_range(BK // SB):  # one scale block of K at a time
                kb0, offs_k, k_ok, kb_ok = scale_block(k0, sub, k_hi, SB, FULL)
                wk_ok = n_ok[:, None] & k_ok[None, :]
                x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                            mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w1 = tl.load(w1_ptr + offs_n[:, None] * stride_w1n + offs_k[None, :], mask=wk_ok, other=0.0)
                w3 = tl.load(w3_ptr + offs_n[:, None] * stride_w3n + offs_k[None, :], mask=wk_ok, other=0.0)
                s_ok = n_ok & kb_ok
                s1 = e8m0_to_f32(tl.load(s1_ptr + (offs_n // SB) * stride_s1n + kb0 // SB, mask=s_ok, other=127))
                s3 = e8m0_to_f32(tl.load(s3_ptr + (offs_n // SB) * stride_s3n + kb0 // SB, mask=s_ok, other=127))
                # one quantization (or prequantized block) serves both dots; W8A16: s1 stands in
                x, x_scale = act_block(x, xs_ptr, offs_m, m_ok, stride_xsm, stride_xsk, 0, kb0 // SB, kb_ok, s1, A_FP8,
                                       A_PRE)
                acc_g = block_dot(acc_g, x, w1, x_scale, s1, A_FP8 or A_PRE, INTERPRET, SWAP, True, DEQ, PAIR)
                acc_u = block_dot(acc_u, x, w3, x_scale, s3, A_FP8 or A_PRE, INTERPRET, SWAP, True, DEQ, PAIR)
    if SWAP:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    h = h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if SPLITS == 1:
        tl.store(h, swiglu_rounded(acc_g, acc_u, limit, h_ptr, CLAMP, HAND_RNE), mask=out_ok)
    else:
        slot = offs_m[:, None] * BN + tl.arange(0, BN)[None, :]
        tile_part = part_ptr + pid_n * (SPLITS * 2 * BM * BN)  # per split: the g tile, then the u tile
        tl.store(tile_part + split * (2 * BM * BN) + slot, acc_g)
        tl.store(tile_part + split * (2 * BM * BN) + BM * BN + slot, acc_u)
        if last_to_arrive(cnt_ptr + pid_n, SPLITS):  # the last of this tile's programs: add the partials in split order
            total_g = tl.zeros((BM, BN), dtype=tl.float32)
            total_u = tl.zeros((BM, BN), dtype=tl.float32)
            for s in tl.static_range(SPLITS):
                total_g += tl.load(tile_part + s * (2 * BM * BN) + slot, cache_modifier=".cg")
                total_u += tl.load(tile_part + s * (2 * BM * BN) + BM * BN + slot, cache_modifier=".cg")
            tl.store(h, swiglu_rounded(total_g, total_u, limit, h_ptr, CLAMP, HAND_RNE), mask=out_ok)
            tl.store(cnt_ptr + pid_n, 0)  # ready for the next launch / graph replay


def paired_config(M: int, N: int, K: int, block: int, w8a8: bool = True) -> dict:
    """fp8_gemv's tiles with half its K splits on the GPU: a program streams two weights, and fewer, longer programs
    measured faster (H200, benchmarks/kernels/fp8_gemm.py --shared-expert: V4 M=1 12.7 us vs 14.5 us, M=64 23.7 vs
    29.8 us). The interpreter keeps fp8_gemv's choice. `swap` as fp8_gemv's (V4 M=1 12.6 -> 11.6 us, M=32 20.0 ->
    13.9; V4.1 M=1 27.3 -> 27.1, M=32 36.7 -> 32.5). One row runs on the CUDA cores (fp8_gemv.fma_acc) with 64-row
    tiles 512 wide over about two waves: V4 11.6 -> 9.6 us, V4.1 27.1 -> 13.7 (`--shared-expert --rows 1`)."""
    cfg = config(M, N, K, 1, block, w8a8=w8a8, one_row_fma=False)
    cfg["prequant"] = env_switch(PREQUANT_ENV, block == 32)
    if not interpreting():
        cfg["splits"] = max(1, cfg["splits"] // 2)
        if M == 1 and FMA_ONE_ROW:  # one row on the CUDA cores, as fp8_gemv's (V4SERVE_GEMV_FMA=0: off)
            cfg.update(BM=1, BN=64, BK=512, splits=split_count(N, K, 1, 64, 512), num_stages=1, swap=False, fma=True)
    return cfg


def run(x2: torch.Tensor, w1: torch.Tensor, s1: torch.Tensor, w3: torch.Tensor, s3: torch.Tensor, block: int,
        act_group: int, limit: float, cfg: dict | None = None) -> torch.Tensor:
    """x2 [M, K] (M <= 64) -> h [M, N] in x's dtype, for W1 and W3 [N, K] FP8 with their e8m0 block scales.
    `cfg` overrides fp8_gemv's tile choice (benchmarks, tests); its "prequant" (PREQUANT_ENV) quantizes the
    activations by one act_quant launch before, for the tensor-core form (the same values and scales)."""
    M, K = x2.shape
    N = w1.shape[0]
    h = torch.empty(M, N, dtype=x2.dtype, device=x2.device)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if w1.stride(-1) != 1 or w3.stride(-1) != 1:
        w1, w3 = w1.contiguous(), w3.contiguous()
    given = cfg or {}
    # (the kernel's CUDA-core form takes one row)
    cfg = fit_fma({**paired_config(M, N, K, block, w8a8=bool(act_group)), **given}, given, M, N, K, 1, 1)
    bk = cfg["BK"]
    k_per_split = cdiv(cdiv(K, cfg["splits"]), bk) * bk
    splits = cdiv(K, k_per_split)
    n_tiles = cdiv(N, cfg["BN"])
    part = (torch.empty(n_tiles * splits * 2 * cfg["BM"] * cfg["BN"], dtype=torch.float32, device=x2.device)
            if splits > 1 else h)
    cnt = _COUNTERS.get(x2.device)
    if n_tiles > cnt.numel():
        raise ValueError(f"{n_tiles} output tiles exceed the {cnt.numel()} arrival counters")
    pre = bool(cfg.get("prequant")) and act_group == block and not cfg["fma"]
    # (cfg "scales_t": the scales transposed, fp8_gemv.LEAN_ENV)
    xq, xs = act_quant(x2, block, scale_rows=cfg["BM"] if cfg.get("scales_t") else 0) if pre else (x2, x2)
    _swiglu_gemv_kernel[(n_tiles, splits)](
        xq, xs, w1, w3, s1, s3, part, h, cnt, M, N, K, k_per_split, float(limit),
        xq.stride(0), xs.stride(0), xs.stride(-1), w1.stride(0), w3.stride(0), s1.stride(0), s3.stride(0), h.stride(0),
        SB=block, A_FP8=act_group == block, CLAMP=limit > 0, BM=cfg["BM"], BN=cfg["BN"], BK=bk, SPLITS=splits,
        INTERPRET=interpreting(), HAND_RNE=interpreting() and x2.dtype == torch.bfloat16,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], SWAP=cfg["swap"], FMA=cfg["fma"],
        EVEN_K=K % block == 0, DEQ=bool(cfg.get("deq")), A_PRE=pre, FULL=bool(cfg.get("full")) and K % bk == 0,
        PAIR=bool(cfg.get("pair_scales")), **pdl_launch(x2))
    return h
