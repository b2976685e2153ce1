"""FP8 block-scaled weights widened to bf16 / fp16 / fp32 in one pass, exactly (ops.linear.dequantize's values).

An e4m3 value times its e8m0 block scale 2**(b-127) is a power-of-two rescale of a 4-bit significand: exact in bf16
(barring underflow below 2**-133, which no stored weight reaches) and in fp32. Prefill GEMMs that cuBLAS runs better
than our block-scaled kernel (the grouped `wo_a`: a batched GEMM) take the widened copy, made per call: the weight is
read once (1 B/element) and written once (2 B), a few tens of microseconds against milliseconds of GEMM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import cdiv, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch


def supports(weight: torch.Tensor, scale: torch.Tensor | None) -> bool:
    """An e4m3 weight with e8m0 block scales (bytes)."""
    return (weight.dtype == torch.float8_e4m3fn and scale is not None and weight.dim() == 2
            and scale.dtype in (torch.uint8, torch.float8_e8m0fnu))


@step_jit
def _widen_kernel(w_ptr, s_ptr, out_ptr, R, K, stride_w, stride_s, stride_o,
                  SB: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    ok = (r < R)[:, None] & (k < K)[None, :]
    w = tl.load(w_ptr + r.to(tl.int64)[:, None] * stride_w + k[None, :], mask=ok, other=0.0).to(tl.float32)
    b = tl.load(s_ptr + (r // SB)[:, None] * stride_s + (k // SB)[None, :], mask=ok, other=127).to(tl.int32)
    s = tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)  # e8m0 -> 2**(b-127), b = 0 subnormal
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_o + k[None, :], (w * s).to(out_ptr.dtype.element_ty),
             mask=ok)


def widen(weight: torch.Tensor, scale: torch.Tensor, block: int, dtype: torch.dtype = torch.bfloat16,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """weight e4m3 [R, K] with e8m0 scales [ceil(R/block), ceil(K/block)] -> [R, K] in dtype (into `out` if
    given, a [R, K] tensor with unit column stride)."""
    R, K = weight.shape
    if out is None:
        out = torch.empty(R, K, dtype=dtype, device=weight.device)
    s = scale.view(torch.uint8)
    br, bk = 32, 128
    _widen_kernel[(cdiv(R, br), cdiv(K, bk))](weight, s, out, R, K, weight.stride(0), s.stride(0), out.stride(0),
                                               SB=block, BR=br, BK=bk, num_warps=4, **pdl_launch(out))
    return out
