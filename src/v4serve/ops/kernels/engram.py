"""Engram's gated stream update in one launch (the reference is ops/engram.py `engram_mix_reference`).

One program per (token, stream): the first pass over D in chunks of BD sums x^2, key^2 and x * w * key (per lane,
then across lanes), the second re-reads x (from L2) with the shared value row and stores x + gate * value in x's
dtype. The weight is q_weight * k_weight taken in float32 as the reference does (exact: the same IEEE product), so
the layer's cast and product launches go too. A decode step has only T * hc programs of D = 5120 (~0.3 MB moved
in all at T = 1): the chains of chunk loads, not bandwidth, should bound it; a split over D would need a second
launch or arrival counters (ops/kernels/split_grid.py), not worth it before a GPU timing says so.

Precision: accumulation in float32, float64 when any input is float64 (the interpreter: the exactness tests' model).
The divisions and square roots are IEEE-rounded (`div_rn`, `sqrt_rn`; Triton's `/` and `sqrt` are approximate on
the GPU), copysign reads the sign bit (a -0.0 dot gives the negative root, as torch's), the floor and D^-0.5 are
constexprs materialised in the accumulation dtype (exact in float64, where a float argument would reach the kernel as
float32), and the launch turns off FMA contraction so that x + gate * value rounds twice, as the reference. Only the
order of the D sums differs from torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..engram import GATE_FLOOR
from ..precision import hi_lo
from . import interpreting, next_pow2, step_jit
from .finish import cast_rounded, rms_inv, widen
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch

# D chunk on the GPU: 8 warps, 8 values a thread per operand; D = 5120 takes 3 a pass (the last half masked). A decode
# step has few programs (T * hc), each a chain of dependent chunk loads, so fewer, wider chunks; not yet timed.
MAX_BLOCK = 2048
_EXACT = {"enable_fp_fusion": False}  # the update's product and sum round separately (as torch's two ops)
_GPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@step_jit
def _engram_mix_kernel(x_ptr, key_ptr, value_ptr, qw_ptr, kw_ptr, live_ptr, out_ptr, sx_t, sx_n, sk_t, sk_n, sv_t,
                       sw_n, so_t, so_n, eps_hi, eps_lo, D: tl.constexpr, BD: tl.constexpr, F64: tl.constexpr,
                       FLOOR: tl.constexpr, SCALE: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    ACC: tl.constexpr = tl.float64 if F64 else tl.float32
    t = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1).to(tl.int64)
    x_row = x_ptr + t * sx_t + k * sx_n
    key_row = key_ptr + t * sk_t + k * sk_n
    c = tl.arange(0, BD)
    ss_x = tl.zeros([BD], ACC)
    ss_k = tl.zeros([BD], ACC)
    s_dot = tl.zeros([BD], ACC)
    for d0 in range(0, D, BD):
        d = d0 + c
        m = d < D
        h = widen(tl.load(x_row + d, mask=m, other=0.0), ACC)
        kk = widen(tl.load(key_row + d, mask=m, other=0.0), ACC)
        # q_weight * k_weight in float32, the reference's product
        w = (widen(tl.load(qw_ptr + k * sw_n + d, mask=m, other=0.0), tl.float32)
             * widen(tl.load(kw_ptr + k * sw_n + d, mask=m, other=0.0), tl.float32)).to(ACC)
        ss_x += h * h
        ss_k += kk * kk
        s_dot += h * w * kk  # (h * w) * key, the reference's order
    if F64:
        ms_x = tl.sum(ss_x, 0) / D
        ms_k = tl.sum(ss_k, 0) / D
    else:
        ms_x = tl.math.div_rn(tl.sum(ss_x, 0), D * 1.0)
        ms_k = tl.math.div_rn(tl.sum(ss_k, 0), D * 1.0)
    rstd = rms_inv(ms_x, eps_hi, eps_lo, F64) * rms_inv(ms_k, eps_hi, eps_lo, F64)
    dot = tl.sum(s_dot, 0) * rstd * tl.full([], SCALE, ACC)
    a = tl.maximum(tl.abs(dot), tl.full([], FLOOR, ACC))
    if F64:
        root = tl.sqrt(a)
        negative = dot.to(tl.int64, bitcast=True) < 0  # copysign: the sign bit, -0.0 included
        root = tl.where(negative, -root, root)
        gate = 1.0 / (1.0 + tl.exp(-root))
    else:
        root = tl.math.sqrt_rn(a)
        negative = dot.to(tl.int32, bitcast=True) < 0
        root = tl.where(negative, -root, root)
        gate = tl.math.div_rn(1.0, 1.0 + tl.exp(-root))
    gate = tl.where(tl.load(live_ptr + t) != 0, gate, 0.0).to(ACC)  # dead tokens (image placeholders): unchanged
    v_row = value_ptr + t * sv_t
    o_row = out_ptr + t * so_t + k * so_n
    for d0 in range(0, D, BD):
        d = d0 + c
        m = d < D
        h = widen(tl.load(x_row + d, mask=m, other=0.0), ACC)
        v = widen(tl.load(v_row + d, mask=m, other=0.0), ACC)
        tl.store(o_row + d, cast_rounded(h + gate * v, out_ptr.dtype.element_ty, F64), mask=m)


def supports(x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
             live: torch.Tensor) -> bool:
    if x.dim() != 3 or key.shape != x.shape or value.shape != (x.shape[0], x.shape[2]) or live.shape != x.shape[:1]:
        return False
    if live.dtype != torch.bool or q_weight.shape != x.shape[1:] or k_weight.shape != x.shape[1:]:
        return False
    floats = (x, key, value, q_weight, k_weight)
    if any(t.device != x.device for t in (*floats, live)):
        return False
    if x.is_cuda:
        return all(t.dtype in _GPU_DTYPES for t in floats)
    return x.device.type == "cpu" and interpreting() and all(t.dtype in (*_GPU_DTYPES, torch.float64) for t in floats)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()  # the kernel walks D with unit stride


def engram_mix(x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_weight: torch.Tensor,
               k_weight: torch.Tensor, live: torch.Tensor, eps: float, block: int | None = None) -> torch.Tensor:
    """ops.engram.engram_mix_reference in one launch (shapes there). `block`: the D chunk (a power of two; tests use
    small ones to cross several chunks and a masked tail)."""
    T, n, D = x.shape
    x, key, value, qw, kw = (_rows(t) for t in (x, key, value, q_weight, k_weight))
    if qw.stride(0) != kw.stride(0):
        qw, kw = qw.contiguous(), kw.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if T == 0 or n == 0 or D == 0:
        return out
    f64 = any(t.dtype == torch.float64 for t in (x, key, value))  # the weights' product is float32 (as .float())
    bd = block or min(next_pow2(D), (1 << 16) if interpreting() else MAX_BLOCK)  # the interpreter pays per chunk
    eps_hi, eps_lo = hi_lo(float(eps))
    live8 = _rows(live).view(torch.int8)
    _engram_mix_kernel[(T, n)](
        x, key, value, qw, kw, live8, out, x.stride(0), x.stride(1), key.stride(0), key.stride(1), value.stride(0),
        qw.stride(0), out.stride(0), out.stride(1), eps_hi, eps_lo, D=D, BD=bd, F64=f64, FLOOR=GATE_FLOOR,
        SCALE=D ** -0.5, num_warps=max(1, min(8, bd // 256)), **pdl_launch(out), **_EXACT)
    return out
