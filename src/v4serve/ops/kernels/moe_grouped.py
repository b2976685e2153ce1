"""The routed experts at prefill sizes on grouped GEMMs (`MoeConfig.body` "grouped", ops/kernels/moe.py).

At thousands of rows an expert the FP4 experts are a FLOPs problem, and the "dot" body's in-register dequant holds
its wgmma to ~30% of the bf16 peak (H200, 8K tokens: 182-243 TFLOP/s). Here the layer's FP4 stacks are dequantized
to bf16 once per call (`_dequant_kernel`, exact: an e2m1 value times an e8m0 scale is a bf16 value for every scale
a real weight has), and torch's grouped GEMM (`torch._grouped_mm`: CUTLASS wgmma kernels on sm_90) runs each
expert's rows, sorted by expert, against them:

  1. sort the (token, slot) assignments by expert (moe._align: one launch; the order inside an expert's run may vary,
     the results do not: each row is its own), the experts' row ends `offs`; x's rows gathered in that order and
     FP8-simulated (act_group), each assignment's sorted row `pos` (`_gather_kernel`);
  2. [g | u] = x_sorted @ [W1; W3]^T, one grouped GEMM (bf16 out, as the reference's per-expert products);
  3. `_swiglu_kernel`: h = silu(min(g, limit)) * clamp(u, +-limit) (* the routing weight), FP8-simulated per group;
  4. y = h @ W2^T, one grouped GEMM, bf16 per (expert, row) as the reference's per-expert output;
  5. moe._combine_kernel through `pos`: a token's k rows summed in slot order (+ the shared output).

No host sync (offsets stay on the device; a torch sort through `torch.bincount` waited for the GPU every layer and
left an 8K prompt's prefill as slow as before). H200, 16 V4-Flash experts (benchmarks/kernels/moe.py, twentieth
session): 8K tokens 10.12 -> 4.24 ms (583 TFLOP/s), 2K 2.75 -> 1.45 ms, of which the copies take 0.30 ms. The bf16 copies of the weights are a per-call temporary of
3 x E x I x D x 2 bytes (`scratch_bytes`): the path applies where that fits `V4SERVE_MOE_GROUPED_SCRATCH` (bytes,
default 4 GiB: the e16 presets' 0.8-1.1 GB; V4-Flash's 256 experts on one GPU would need 12.9 GB and keep the dot
body).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ..env import get as env_get
from ..linear import scale_bytes
from . import cdiv, next_pow2, step_jit
from .moe import (_TL, _combine_kernel, _even_k, _fp4_groups, _fp4_scales, _prologue_kernel, _swiglu_store,
                  sort_launch)
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .quant import fp8_simulate_tile

SCRATCH_ENV = "V4SERVE_MOE_GROUPED_SCRATCH"
DEFAULT_SCRATCH = 4 << 30


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_we, stride_wn, stride_se, stride_sn, stride_oe, stride_on,
                    BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False, EVEN_K: tl.constexpr = False):
    """One expert's FP4 rows [BN] x K columns [BK] (packed bytes + e8m0 bytes) -> out's dtype in natural K order:
    byte j of a 32-group holds K elements 2j (low nibble) and 2j + 1 (high). EVEN_K: as the GEMMs' (moe._even_k),
    whole rows' bytes a warp and the scale bytes as one vector a row."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    e = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    k0 = tl.program_id(2) * BK
    sb = _fp4_scales(s_ptr + e * stride_se, offs_n, N, k0, K, stride_sn, BK, EVEN_K)
    lo, hi = _fp4_groups(w_ptr + e * stride_we, sb, offs_n, N, k0, K, stride_wn, BK, out_ptr.dtype.element_ty,
                          False, EVEN_K)
    v = tl.reshape(tl.join(lo, hi), (BN, BK))  # [BN, BK/32, 16, 2] -> the group's 32 values in order
    cols = k0 + tl.arange(0, BK)
    tl.store(out_ptr + e * stride_oe + offs_n[:, None].to(tl.int64) * stride_on + cols[None, :], v,
             mask=(offs_n < N)[:, None] & (cols < K)[None, :])


def dequantize_into(w: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """FP4 stack w uint8 [E, N, K/2] with e8m0 bytes s [E, N, K/32] -> out [E, N, K] (bf16 or float32; a view is
    fine: rows of a wider stack), exactly."""
    E, N, half_k = w.shape
    K = 2 * half_k
    bn, bk = 32, min(256, next_pow2(K))
    _dequant_kernel[(E, cdiv(N, bn), cdiv(K, bk))](
        w, s, out, N, K, w.stride(0), w.stride(1), s.stride(0), s.stride(1), out.stride(0), out.stride(1),
        BN=bn, BK=bk, num_warps=4, EVEN_K=_even_k(K, bk, s), **pdl_launch(out))
    return out


@step_jit
def _gather_kernel(x_ptr, xs_ptr, sorted_ptr, pos_ptr, M, D, TOPK, stride_x, stride_xs,
                   BR: tl.constexpr, BC: tl.constexpr, G: tl.constexpr, QUANT: tl.constexpr,
                   PDL: tl.constexpr = False):
    """Sorted rows [BR] x columns [BC]: xs[r] = x[token of assignment sorted[r]] (FP8-simulated per 1 x G: BC holds
    whole groups), and the first column block records pos[sorted[r]] = r."""
    pdl_enter(PDL)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = rows < M
    a = tl.load(sorted_ptr + rows, mask=ok, other=0)
    if tl.program_id(1) == 0:
        tl.store(pos_ptr + a, rows, mask=ok)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    m = ok[:, None] & (cols < D)[None, :]
    v = tl.load(x_ptr + (a // TOPK).to(tl.int64)[:, None] * stride_x + cols[None, :], mask=m, other=0.0)
    if QUANT:
        v = fp8_simulate_tile(v.to(tl.float32), BR, BC, G).to(v.dtype)
    tl.store(xs_ptr + rows.to(tl.int64)[:, None] * stride_xs + cols[None, :], v, mask=m)


@step_jit
def _swiglu_kernel(gu_ptr, h_ptr, rw_ptr, order_ptr, M, I, limit, stride_gu, stride_h,
                   BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, QUANT_H: tl.constexpr,
                   WEIGHT_H: tl.constexpr, CLAMP: tl.constexpr, PDL: tl.constexpr = False):
    """Sorted rows [BM] of [g | u] (bf16) -> h's columns [BN] (moe._swiglu_store: clamp, SwiGLU, routing weight,
    FP8 simulation per 1 x G). h has whole BM blocks of rows (the store writes every row of the block)."""
    pdl_enter(PDL)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    valid = rows < M
    a_idx = tl.load(order_ptr + rows, mask=valid, other=0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = valid[:, None] & (offs_n < I)[None, :]
    p = gu_ptr + rows[:, None].to(tl.int64) * stride_gu + offs_n[None, :]
    g = tl.load(p, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(p + I, mask=mask, other=0.0).to(tl.float32)
    _swiglu_store(g, u, h_ptr, stride_h, rows, offs_n, rw_ptr, a_idx, valid, I, limit, BM, BN, G, QUANT_H,
                  WEIGHT_H, CLAMP, tl.float32, h_ptr.dtype.element_ty)


def scratch_bytes(num_experts: int, dim: int, inter: int) -> int:
    """The bf16 weight copies of a call: W1, W3 and W2 of every expert."""
    return 3 * num_experts * dim * inter * 2


def _budget() -> int:
    return int(env_get(SCRATCH_ENV) or DEFAULT_SCRATCH)


def working_set(num_experts: int, dim: int, inter: int, rows: int) -> int:
    """Bytes a call of `rows` (token, slot) rows holds at most where the path applies (0 where the copies exceed
    the budget): the weight copies, the sorted x, [g | u], h and y in bf16."""
    scratch = scratch_bytes(num_experts, dim, inter)
    return 0 if scratch > _budget() else scratch + rows * (2 * dim + 3 * inter) * 2


def applies(x: torch.Tensor, experts, act_group: int) -> bool:
    """bf16 x (the grouped GEMM's type on CUDA; float32 too on the CPU, whose grouped GEMM takes it: the tests'
    tight check), the FP4 stacks' copies within the scratch budget, h's groups whole."""
    E, I, half_d = experts.w1.shape
    dtypes = (torch.bfloat16,) if x.is_cuda else (torch.bfloat16, torch.float32)
    return (x.dtype in dtypes and hasattr(torch, "_grouped_mm") and (act_group == 0 or I % act_group == 0)
            and scratch_bytes(E, 2 * half_d, I) <= _budget())


def _gemm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """a [M, K] rows grouped by offs, w [E, N, K] -> [M, N]: row r of group e is a[r] @ w[e]^T."""
    return torch._grouped_mm(a, w.transpose(1, 2), offs=offs)


def experts_forward(x: torch.Tensor, experts, weights: torch.Tensor, ids: torch.Tensor, limit: float,
                    act_group: int, weight_before_w2: bool, shared: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None, join: Callable[[], None] | None = None) -> torch.Tensor:
    """moe.experts_forward's contract (float32 sum, or `out_dtype`; `shared` added; `join` before it is read)."""
    T, D = x.shape
    E, I = experts.w1.shape[0], experts.w1.shape[1]
    k = ids.shape[1]
    M = T * k
    G = act_group
    dev = x.device
    x = x if x.stride(-1) == 1 else x.contiguous()
    # 1. one program sorts (moe._align with 1-row blocks: `order` holds each expert's run, the cursors end at the
    # runs' ends, the grouped GEMM's offsets); then x's rows gathered in that order, FP8-simulated, and `pos`
    order = torch.empty(M, dtype=torch.int32, device=dev)
    cursor = torch.empty(max(16, next_pow2(E)), dtype=torch.int32, device=dev)
    _prologue_kernel[(1,)](ids.contiguous().view(-1), order, order, cursor, M, M, None, None, 0, 0, 0, 0, BM=1,
                           QUANT_X=False, G=1, BR=16, BC=128, BLOCKS=False, **sort_launch(M, cursor),
                           **pdl_launch(x))
    offs = cursor[:E]
    pos = torch.empty(M, dtype=torch.int32, device=dev)
    xs = torch.empty(M, D, dtype=x.dtype, device=dev)
    br, bc = 16, max(256, G)
    _gather_kernel[(cdiv(M, br), cdiv(D, bc))](x, xs, order, pos, M, D, k, x.stride(0), xs.stride(0), BR=br, BC=bc,
                                               G=max(G, 1), QUANT=G > 0, num_warps=4,
                                               **pdl_launch(x))

    w13 = torch.empty(E, 2 * I, D, dtype=x.dtype, device=dev)
    dequantize_into(experts.w1, scale_bytes(experts.s1), w13[:, :I])
    dequantize_into(experts.w3, scale_bytes(experts.s3), w13[:, I:])
    gu = _gemm(xs, w13, offs)
    del w13, xs

    bm, bn = 32, max(128, G)
    h = torch.empty(cdiv(M, bm) * bm, I, dtype=x.dtype, device=dev)
    rw = weights.to(torch.float32).contiguous().view(-1)
    _swiglu_kernel[(cdiv(M, bm), cdiv(I, bn))](
        gu, h, rw, order, M, I, float(limit), gu.stride(0), h.stride(0), BM=bm, BN=bn, G=max(G, 1),
        QUANT_H=G > 0, WEIGHT_H=weight_before_w2, CLAMP=limit > 0, num_warps=4, **pdl_launch(x))
    del gu

    w2 = torch.empty(E, D, I, dtype=x.dtype, device=dev)
    dequantize_into(experts.w2, scale_bytes(experts.s2), w2)
    y = _gemm(h[:M], w2, offs)
    del w2, h

    out = torch.empty(T, D, dtype=out_dtype or torch.float32, device=dev)
    if join is not None:
        join()
    add = out if shared is None else (shared if shared.stride(-1) == 1 else shared.contiguous())
    bd = min(1024, next_pow2(D))
    _combine_kernel[(T, cdiv(D, bd))](y, rw, add, out, T, D, k, y.stride(0), 0, add.stride(0), out.stride(0),
                                      BD=bd, SPLIT=1, APPLY_W=not weight_before_w2, DT=_TL[x.dtype],
                                      ACC=tl.float32, ADD=shared is not None, pos_ptr=pos, GATHER=True, num_warps=4,
                                      **pdl_launch(x))
    return out
