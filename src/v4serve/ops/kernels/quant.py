"""FP8 activation quantization per 1 x group with power-of-two (ue8m0) scales, in Triton.

The same values as `ops.quant.fp8_quantize` / `fp8_simulate`: amax per group floored at 1e-4, scale =
2**ceil(log2(amax / 448)) from the float32 bit pattern, q = clamp(x / scale, +-448) rounded to e4m3 (nearest even).
Dividing by a power of two is exact, so the one rounding is the cast to e4m3, as in the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import cdiv, interpreting, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch

FP8_MAX = 448.0


@triton.jit
def pow2_ceil(s):
    """2**ceil(log2(s)) for positive normal float32 s, exactly (exponent bits, +1 when a mantissa bit is set)."""
    bits = s.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return (exp << 23).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_round(v):
    """v (float32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, as float32.

    Done by hand rather than by the cast: Triton's interpreter (CPU tests) converts float32 -> e4m3 wrongly (ties away
    from zero, a lost carry into the exponent, subnormals flushed); the hardware cast (RNE) agrees with this, so the
    following cast of an exact e4m3 value is exact on both. Rounding to a multiple of the binade's spacing u by
    (v + C) - C with C = 1.5 * 2**23 * u uses the float adder's own round-to-nearest-even.
    """
    bits = v.to(tl.int32, bitcast=True)
    exp = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # below 2**-6 e4m3 is subnormal with spacing 2**-9
    c = ((exp - 3 + 23 + 127) << 23).to(tl.float32, bitcast=True) * 1.5
    return (v + c) - c


@triton.jit
def quantize_rows(x):
    """Activation groups [R, G] quantized as act_quant does, per row: amax floored at 1e-4, power-of-two scale, e4m3
    RNE. Returns (the e4m3 values, the float32 scales [R]): act_quant's kernel, and the kernels that quantize their own
    inputs (fp8_gemv) or outputs (fp8_gemv's finish, norm.py)."""
    xf = x.to(tl.float32)
    x_scale = pow2_ceil(tl.maximum(tl.max(tl.abs(xf), 1), 1e-4) / 448.0)
    xq = e4m3_round(tl.minimum(tl.maximum(xf / x_scale[:, None], -448.0), 448.0)).to(tl.float8e4nv)
    return xq, x_scale


@triton.jit
def fp8_simulate_tile(v, R: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """[R, C] float32 -> FP8 quant-dequant per 1 x G (ops.quant.fp8_simulate), in registers: amax floored at 1e-4,
    scale 2^ceil(log2(amax / 448)) from the float32 bits, q = e4m3(clamp(v / scale, +-448)) * scale. The kernels
    that simulate their own inputs' or outputs' FP8 (the MoE's, the router's copy of x for it)."""
    g = tl.reshape(v, (R, C // G, G))
    scale = pow2_ceil(tl.maximum(tl.max(tl.abs(g), 2), 1e-4) / 448.0)
    inv = 1.0 / scale  # exact: a power of two
    q = tl.clamp(g * inv[:, :, None], -448.0, 448.0)
    return tl.reshape(e4m3_round(q) * scale[:, :, None], (R, C))


@step_jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, n_pairs, n_groups, stride_xm, stride_qm, stride_sm, stride_sg,
                      GROUP: tl.constexpr, PAIRS: tl.constexpr, SIMULATE: tl.constexpr, PDL: tl.constexpr = False):
    """One program quantizes PAIRS (row, group) pairs: a [PAIRS, GROUP] tile, amax per tile row."""
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    p = tl.program_id(0) * PAIRS + tl.arange(0, PAIRS)
    ok = p < n_pairs
    row, grp = p // n_groups, p % n_groups
    cols = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    q, scale = quantize_rows(tl.load(x_ptr + row[:, None] * stride_xm + cols, mask=ok[:, None], other=0.0))
    if SIMULATE:  # quant-dequant round trip in x's dtype
        tl.store(q_ptr + row[:, None] * stride_qm + cols,
                 (q.to(tl.float32) * scale[:, None]).to(q_ptr.dtype.element_ty), mask=ok[:, None])
    else:
        tl.store(q_ptr + row[:, None] * stride_qm + cols, q, mask=ok[:, None])
        tl.store(s_ptr + row * stride_sm + grp * stride_sg, scale, mask=ok)


def _launch(x2: torch.Tensor, out: torch.Tensor, scales: torch.Tensor | None, group: int, simulate: bool) -> None:
    M, K = x2.shape
    n_groups = K // group
    n_pairs = M * n_groups
    if n_pairs == 0:
        return
    # a few KB per program on the GPU; the CPU interpreter pays per program, so it takes large tiles
    pairs = 1024 if interpreting() else max(1, 4096 // group)
    pairs = min(pairs, next_pow2(n_pairs))
    s_strides = scales.stride() if scales is not None else (0, 1)
    _act_quant_kernel[(cdiv(n_pairs, pairs),)](
        x2, out, scales if scales is not None else out, n_pairs, n_groups, x2.stride(0), out.stride(0), *s_strides,
        GROUP=group, PAIRS=pairs, SIMULATE=simulate, **pdl_launch(out))


def _rows(x: torch.Tensor, group: int) -> torch.Tensor:
    if x.shape[-1] % group:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the quantization group {group}")
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def act_quant(x: torch.Tensor, group: int, scale_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (float8_e4m3fn [..., K], float32 scales [..., K / group]). scale_rows (>= x's rows): the scales
    are a view of a transposed buffer [K / group, scale_rows] (a row's scales at stride scale_rows, a group's rows at
    unit stride; the rows past x's unwritten), for kernels that read one group's scales of many rows at once."""
    x2 = _rows(x, group)
    q = torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if scale_rows:
        if scale_rows < x2.shape[0]:
            raise ValueError(f"{x2.shape[0]} rows do not fit a transposed scale buffer of {scale_rows}")
        s = torch.empty(x2.shape[1] // group, scale_rows, dtype=torch.float32, device=x.device).t()[:x2.shape[0]]
    else:
        s = torch.empty(x2.shape[0], x2.shape[1] // group, dtype=torch.float32, device=x.device)
    _launch(x2, q, s, group, False)
    return q.view(x.shape), s.view(*x.shape[:-1], -1)


def act_simulate(x: torch.Tensor, group: int) -> torch.Tensor:
    """The quant-dequant round trip in x's dtype (what the reference's `fp8_simulate` returns)."""
    x2 = _rows(x, group)
    out = torch.empty_like(x2)
    _launch(x2, out, None, group, True)
    return out.view(x.shape)
