"""RMS norm of whole rows in one launch, for rows wider than ops/kernels/finish.py takes (the q latent, the model
width): one program per row, the row in one register tile, the finish kernel's norm stage (`widen`, `rms_inv`, and its
rounding to x's dtype), i.e. ops.norm.rms_norm's steps: the mean square in the accumulation dtype, times 1/rms, times
the weight, rounded to x's dtype once. With a quantization group, the same program also quantizes the rounded row to
FP8 per 1 x group for the GEMM it feeds (the q latent into wq_b: that GEMM's activation quantization launch, gone)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..precision import hi_lo
from ..quant import Quantized
from . import interpreting, next_pow2, step_jit
from .finish import cast_rounded, rms_inv, widen
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .quant import quantize_rows

MAX_D = 16384


@step_jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, q_ptr, s_ptr, stride_x, stride_o, stride_q, stride_s, eps_hi, eps_lo,
                     D: tl.constexpr, BD: tl.constexpr, HAS_W: tl.constexpr, F64: tl.constexpr, QG: tl.constexpr = 0,
                     PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    ACC: tl.constexpr = tl.float64 if F64 else tl.float32
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BD)
    m = c < D
    x = widen(tl.load(x_ptr + r * stride_x + c, mask=m, other=0.0), ACC)
    y = x * rms_inv(tl.sum(x * x, 0) / D, eps_hi, eps_lo, F64)
    if HAS_W:
        y = widen(tl.load(w_ptr + c, mask=m, other=0.0), ACC) * y
    y = cast_rounded(y, out_ptr.dtype.element_ty, F64)
    tl.store(out_ptr + r * stride_o + c, y, mask=m)
    if QG:  # the rounded row quantized per 1 x QG for the GEMM it feeds (kernels/quant.quantize_rows)
        # read back as [groups, QG] from what was just stored: a reshape of y would let the compiler pick another layout
        # for the whole row, and so another order for the mean square's sum (the QG = 0 launch's y, bit for bit)
        tl.debug_barrier()  # the row's stores are visible to every thread of the program
        grp = tl.arange(0, BD // QG)
        g_ok = grp * QG < D
        at = grp[:, None] * QG + tl.arange(0, QG)[None, :]
        v = tl.load(out_ptr + r * stride_o + at, mask=g_ok[:, None], other=0.0)
        q, scale = quantize_rows(v.to(tl.float32))
        tl.store(q_ptr + r * stride_q + at, q, mask=g_ok[:, None])
        tl.store(s_ptr + r * stride_s + grp, scale, mask=g_ok)


def supports(x: torch.Tensor) -> bool:
    if x.shape[-1] > MAX_D or x.dim() < 1:
        return False
    if x.is_cuda:
        return x.dtype in (torch.bfloat16, torch.float16, torch.float32)
    return x.device.type == "cpu" and interpreting() and x.dtype in (torch.bfloat16, torch.float32, torch.float64)


def supports_quant(x: torch.Tensor, group: int) -> bool:
    """rms_norm_fp8: half-precision rows whose width is a multiple of a power-of-two group."""
    return (supports(x) and x.dtype in (torch.bfloat16, torch.float16) and group > 0 and group & (group - 1) == 0
            and x.shape[-1] % group == 0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ops.norm.rms_norm's values in one launch (x [..., D]; weight [D] or None)."""
    return _launch(x, weight, eps, 0)[0]


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor | None, eps: float, group: int
                 ) -> tuple[torch.Tensor, Quantized]:
    """ops.norm.rms_norm_fp8 in one launch: the normed rows and their FP8 quantization per 1 x group."""
    y, q, s = _launch(x, weight, eps, group)
    return y, Quantized(q, s, group, x.dtype)


def _launch(x: torch.Tensor, weight: torch.Tensor | None, eps: float, group: int
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    q = torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x.device) if group else out
    s = torch.empty(x2.shape[0], D // group, dtype=torch.float32, device=x.device) if group else out
    if x2.shape[0]:
        eps_hi, eps_lo = hi_lo(float(eps))
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight if weight is not None else x2, out, q, s, x2.stride(0), out.stride(0), q.stride(0), s.stride(0),
            eps_hi, eps_lo, D=D, BD=next_pow2(D), HAS_W=weight is not None, F64=x.dtype == torch.float64,
            QG=group, num_warps=min(16, max(1, next_pow2(D) // 512)), **pdl_launch(out))
    if not group:
        return out.view(x.shape), None, None
    return out.view(x.shape), q.view(x.shape), s.view(*x.shape[:-1], D // group)
