"""RMS norm of whole rows in one launch, for rows wider than ops/kernels/finish.py takes (the q latent, the model
width): one program per row, the row in one register tile, the finish kernel's norm stage (`widen`, `rms_inv`, and its
rounding to x's dtype), i.e. ops.norm.rms_norm's steps: the mean square in the accumulation dtype, times 1/rms, times
the weight, rounded to x's dtype once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..precision import hi_lo
from . import interpreting
from .finish import cast_rounded, rms_inv, widen
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch

MAX_D = 16384


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, eps_hi, eps_lo, D: tl.constexpr, BD: tl.constexpr,
                     HAS_W: tl.constexpr, F64: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    ACC: tl.constexpr = tl.float64 if F64 else tl.float32
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BD)
    m = c < D
    x = widen(tl.load(x_ptr + r * stride_x + c, mask=m, other=0.0), ACC)
    y = x * rms_inv(tl.sum(x * x, 0) / D, eps_hi, eps_lo, F64)
    if HAS_W:
        y = widen(tl.load(w_ptr + c, mask=m, other=0.0), ACC) * y
    tl.store(out_ptr + r * stride_o + c, cast_rounded(y, out_ptr.dtype.element_ty, F64), mask=m)


def supports(x: torch.Tensor) -> bool:
    if x.shape[-1] > MAX_D or x.dim() < 1:
        return False
    if x.is_cuda:
        return x.dtype in (torch.bfloat16, torch.float16, torch.float32)
    return x.device.type == "cpu" and interpreting() and x.dtype in (torch.bfloat16, torch.float32, torch.float64)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ops.norm.rms_norm's values in one launch (x [..., D]; weight [D] or None)."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        eps_hi, eps_lo = hi_lo(float(eps))
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight if weight is not None else x2, out, x2.stride(0), out.stride(0), eps_hi, eps_lo,
            D=D, BD=triton.next_power_of_2(D), HAS_W=weight is not None, F64=x.dtype == torch.float64,
            num_warps=min(16, max(1, triton.next_power_of_2(D) // 512)), **pdl_launch(out))
    return out.view(x.shape)
