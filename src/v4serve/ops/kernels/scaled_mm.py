"""Prefill GEMMs of 128 x 128-block FP8 weights on cuBLAS: `torch._scaled_mm`'s DeepSeek recipe (W8A8 with 1 x 128
activation scales and 128 x 128 weight scales; cuBLASLt >= 12.9 on sm_90), the library beside fp8_gemm.py's Triton
kernel for the same product.

Both compute sum over K blocks of (x_q . w_q) * x_scale * w_scale with exact FP8 products and float32 sums; only the
order of the sums differs. The Triton kernel applies the two scales to each block's tensor-core partial in registers
and reached 33-44% of the FP8 peak at M = 8192 on the H200; cuBLAS's kernels for the recipe are the vendor's.

Operand layouts (`torch._scaled_mm` checks them by shape and stride): a = x_q [M, K] row-major; b = W^T, i.e. the
stored [N, K] weight transposed (column-major [K, N]); scale_a float32 [M, K/128] column-major (stride (1, M));
scale_b float32 [K/128, N/128] whose transpose is the stored [N/128, K/128] row-major scale grid. cuBLASLt wants M a
multiple of 4: ragged M is padded with zero rows (their outputs dropped). V4.1's 32 x 32 blocks have no cuBLAS recipe.
"""

from __future__ import annotations

import functools

import torch

from ..env import get as env_get
from ..quant import e8m0_to_float

ENV = "V4SERVE_CUBLAS_FP8"  # 0: the Triton kernel for every M (A/B runs)
BLOCK = 128
# Where a W8A8 GEMM goes to cuBLAS: from MIN_WORK = M x N x K, and never below MIN_ROWS rows (the Triton path's
# decode and mid-size tiles). H200, `fp8_gemm.py --prefill-only` (thirteenth session; µs, cuBLAS / Triton, each call
# timed alone, host launch included): wq_b 32768 x 1024 at M = 4096 / 8192 / 16384 437 / 516, 598 / 1164, 1171 /
# 2053 (63.5-64.8% of the FP8 peak from 8192 rows); wo_b 4096 x 8192 at M = 4096 552 / 433, 8192 546 / 949, 16384
# 1091 / 1844 (69.5%); the small weights lost at every M (wq_a 1024 x 4096 at 16384 rows 383 / 269, shared_w1 2048 x
# 4096 554 / 471). cuBLAS never took less than ~440 µs a call there, whatever the size: its host-side cost, as the
# step shows — in the 43-layer profile of an 8K-token prefill chunk (GPU time only) every W8A8 GEMM on cuBLAS gave
# the linears 269 ms against the Triton kernel's 323 ms, ~41 of the 54 ms from wq_b and wo_b. From 2^36
# multiply-adds (wq_b from 2K rows, wo_b and the shared expert from 8K; not wq_a), where a prefill's GPU work per
# layer hides that host cost; smaller GEMMs (mixed steps' short chunks) keep the kernel
MIN_WORK = 1 << 36
MIN_ROWS = 256


def operands(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(a [Mp, K], b [K, N], scale_a [Mp, K/128] column-major, scale_b [K/128, N/128], M) for `torch._scaled_mm`
    from e4m3 activations xq [M, K] with float32 scales xs [M, K/128] and the stored weight [N, K] with its e8m0
    scale grid [N/128, K/128]. Mp = M rounded up to a multiple of 4 (padding rows are zeros, scale 1)."""
    M, K = xq.shape
    mp = -(-M // 4) * 4
    if mp != M:
        pad = torch.zeros(mp, K, dtype=xq.dtype, device=xq.device)
        pad[:M] = xq
        xq = pad
    sa = torch.ones(K // BLOCK, mp, dtype=torch.float32, device=xs.device)  # column-major [Mp, K/128] once transposed
    sa[:, :M] = xs.t()
    return xq, weight.t(), sa.t(), e8m0_to_float(scale).t(), M


@functools.lru_cache(maxsize=8)
def _works(index: int) -> bool:
    """Whether this torch + cuBLAS take the recipe on this GPU (sm_90 and cuBLASLt >= 12.9): one tiny call, once."""
    if torch.cuda.get_device_capability(index) != (9, 0):
        return False
    dev = torch.device("cuda", index)
    try:
        a = torch.ones(4, BLOCK, device=dev).to(torch.float8_e4m3fn)
        w = torch.ones(BLOCK, BLOCK, device=dev).to(torch.float8_e4m3fn)
        s = torch.full((1, 1), 127, dtype=torch.uint8, device=dev)
        y = gemm(a, torch.ones(4, 1, device=dev), w, s, torch.bfloat16)
        return bool((y == BLOCK).all())
    except (RuntimeError, NotImplementedError):
        return False


def supports(xq: torch.Tensor, weight: torch.Tensor, block: int, out_dtype: torch.dtype) -> bool:
    """W8A8 prefill rows (MIN_WORK multiply-adds and more) against a 128 x 128-block FP8 weight on an sm_90 GPU whose
    cuBLAS has the recipe; bf16 out; K a multiple of 512 (the weight scales' rows whole groups of 4, which some torch
    versions pad to) and N of 16."""
    if env_get(ENV, "1") == "0" or not xq.is_cuda or block != BLOCK or out_dtype != torch.bfloat16:
        return False
    if weight.dtype != torch.float8_e4m3fn or xq.dim() != 2 or xq.shape[0] < MIN_ROWS:
        return False
    N, K = weight.shape
    if xq.shape[0] * N * K < MIN_WORK:
        return False
    if K % (4 * BLOCK) or N % 16 or weight.stride(1) != 1:
        return False
    return _works(xq.device.index if xq.device.index is not None else torch.cuda.current_device())


def gemm(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
         out_dtype: torch.dtype) -> torch.Tensor:
    """y [M, N] = (xq * xs) (W * scale)^T in out_dtype, on cuBLAS (see the module docstring for the layouts)."""
    a, b, sa, sb, M = operands(xq, xs, weight, scale)
    y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    return y[:M]
