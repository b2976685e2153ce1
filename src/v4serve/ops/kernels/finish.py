"""Finishing rows in one launch (the reference is ops/finish.py): RMS norm, RoPE, Walsh-Hadamard, the quant-dequant
simulation, the finished values and the stored record.

Programs walk blocks of BM rows (a row is one [D] vector: a token, or a (token, head) of x [N, H, D]). Each stage
rounds to x's dtype exactly where the reference does (norm, RoPE and rotation each return x's dtype; the simulations
quantize the float32 values and return x's dtype), so the finished values match the reference's bit for bit up to
the order of the sums (norm, rotation). The record is then encoded from the finished values as `Codec.encode` does:
not reused from the simulation, because re-quantizing a simulated group can choose another scale (an FP8 group whose
amax rounds down to 224 * s is encoded with s / 2), and the bytes must equal `encode(finished values)`.

Exactness: divisions by non-powers of two use IEEE division (`div_rn`; Triton's `/` is approximate on the GPU),
powers of two are applied through their exact reciprocals; e4m3 and bf16 rounding are done by hand (the interpreter's
casts to them truncate or flush subnormals, see ops/kernels/quant.py), so the interpreter and the GPU agree. Under the
interpreter float64 inputs run in float64 (the reference's float64 path: norm, RoPE and rotation in float64, the
simulations and records on the float32 values).

Rotation: x @ (S * n^-1/2) with S the Sylvester +-1 matrix, built in registers from the parity of popcount(i & j).
D > 128 is split as H_D = H_{D/128} (x) H_128: one [BM * D/128, 128] dot, then a +-1 sum over the D/128 blocks.
Float32 dots use IEEE fp32 (never TF32); bf16/fp16 rows (exact in their dtype) use the tensor cores against the
exact +-1 matrix with fp32 accumulation on the GPU; float64 under the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from ..precision import hi_lo
from . import cdiv, interpreting, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .quant import e4m3_round, pow2_ceil
from .split_grid import TL_DTYPES

SIM = {None: 0, "v4_fp8": 1, "fp8_b32": 2, "nvfp4": 3, "mxfp4": 4}
KINDS = {"plain": 1, "v4_fp8": 2, "fp8_b32": 3, "nvfp4": 4, "mxfp4": 5, "fp8_row": 6}
GROUPS = {"v4_fp8": 64, "fp8_b32": 32, "nvfp4": 16, "mxfp4": 32, "fp8_row": 1, "plain": 1}
HADAMARD_BLOCK = 128  # the largest +-1 matrix built per program (64 KB of fp32)
_SMS = 132  # H200 multiprocessors


@dataclass(frozen=True)
class Config:
    rows: int  # BM: rows per block (>= 16 when rotating: the M of the dot)
    num_warps: int = 4
    programs: int = 0  # grid cap (programs loop over blocks, reusing the +-1 matrix); 0 = one program per block


def default_config(m: int, d: int, rotate: bool) -> Config:
    """Interpreter: large blocks (it pays per program). GPU: about 2K values per block, smaller blocks when that leaves
    the GPU idle; rotations take blocks of 16 rows on 8 warps (the fp32 dot's operands spill on 4) and loop over
    blocks on a capped grid, building the +-1 matrix once per program."""
    if interpreting():
        return Config(max(16 if rotate else 1, min(64, next_pow2(m))), 1)
    if rotate:
        return Config(16, 8, 8 * _SMS)
    bm = max(1, min(64, 2048 // d))
    while bm > 1 and cdiv(m, bm) < 2 * _SMS:
        bm //= 2
    return Config(bm, 4)


# --- roundings --------------------------------------------------------------------------------------------------------

@triton.jit
def _bf16_f32(v):
    """float32 v rounded to the nearest bf16 value, ties to even, kept in float32."""
    b = v.to(tl.int32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _bf16(v, F64: tl.constexpr):
    """v rounded to bf16, kept in v's dtype. float64 goes through float32 first, as torch's float64 -> bf16 cast does
    (c10::BFloat16 is built from a float: two roundings)."""
    if F64:
        return _bf16_f32(v.to(tl.float32)).to(tl.float64)
    else:
        return _bf16_f32(v)


@triton.jit
def _round(v, DT: tl.constexpr):
    """float32 v onto the grid of DT (bf16 / fp16), kept in float32; float32 / float64 unchanged."""
    if DT == tl.bfloat16:
        v = _bf16_f32(v)
    elif DT == tl.float16:
        v = v.to(tl.float16).to(tl.float32)
    return v


@triton.jit
def cast_rounded(v, T: tl.constexpr, F64: tl.constexpr):
    """v (float32 / float64) -> T, rounding to nearest even (bf16 by hand: the interpreter's cast truncates; float64
    to a 16-bit type through float32, as torch casts)."""
    if T == tl.bfloat16:
        return _bf16(v, F64).to(tl.float32).to(tl.bfloat16)  # exact after the rounding
    elif T == tl.float16:
        return v.to(tl.float32).to(tl.float16)
    else:
        return v.to(T)


@triton.jit
def widen(v, ACC: tl.constexpr):
    """A loaded operand (norm weight, cos/sin) in the accumulation dtype, as torch promotes it (bf16 through float32:
    the interpreter's bf16 -> float64 cast reads the raw bits)."""
    if v.dtype == tl.bfloat16:
        v = v.to(tl.float32)
    return v.to(ACC)


@triton.jit
def rms_inv(ms, eps_hi, eps_lo, F64: tl.constexpr):
    """1 / sqrt(mean square + eps) of rms_norm: float32 through IEEE sqrt and division (Triton's own are approximate
    on the GPU); float64 (the interpreter) with eps's low half too (float scalars reach kernels as float32)."""
    if F64:
        return 1.0 / tl.sqrt(ms + eps_hi + eps_lo)
    else:
        return tl.math.div_rn(1.0, tl.math.sqrt_rn(ms + eps_hi))


@triton.jit
def _inv_pow2(s):
    """1 / s exactly for a power of two s (float32, 2^-126 .. 2^126)."""
    return ((254 << 23) - s.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3(v):
    """float32 v (|v| <= 448) -> the nearest e4m3 value, ties to even, keeping the sign of a zero result."""
    r = e4m3_round(tl.abs(v)).to(tl.int32, bitcast=True)
    return (r | ((v.to(tl.int32, bitcast=True) >> 31) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_bits(q):
    """An exact e4m3 value (float32) -> its byte (int32)."""
    b = q.to(tl.int32, bitcast=True)
    a = b & 0x7FFFFFFF
    e = (a >> 23) - 127
    normal = ((e + 7) << 3) | ((a >> 20) & 7)
    sub = (a.to(tl.float32, bitcast=True) * 512.0).to(tl.int32)  # subnormal: a multiple of 2^-9
    return tl.where(e >= -6, normal, sub) | ((b >> 24) & 0x80)


@triton.jit
def _fp4(w):
    """float32 w (already scaled) -> (nearest e2m1 value with w's sign, 4-bit code); ties to the even code."""
    a = tl.minimum(tl.abs(w), 6.0)
    idx = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
           + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32))
    p2 = (((idx >> 1) + 125) << 23).to(tl.float32, bitcast=True)  # 2^((idx >> 1) - 2)
    mag = tl.where(idx < 2, idx.to(tl.float32) * 0.5, ((idx & 1) + 2).to(tl.float32) * p2)
    sign = (w.to(tl.int32, bitcast=True) >> 31) << 31
    val = (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return val, idx | tl.where((w < 0) & (idx > 0), 8, 0)


@triton.jit
def _fp8_groups(v, BM: tl.constexpr, D: tl.constexpr, G: tl.constexpr):
    """quant.fp8_quantize per G on float32 v [BM, D]: (dequantized [BM, D], e4m3 values [BM, D/G, G], scales)."""
    g = tl.reshape(v, (BM, D // G, G))
    amax = tl.maximum(tl.max(tl.abs(g), 2), 1e-4)
    s = pow2_ceil(tl.math.div_rn(amax, 448.0))
    q = _e4m3(tl.minimum(tl.maximum(g * _inv_pow2(s)[:, :, None], -448.0), 448.0))
    return tl.reshape(q * s[:, :, None], (BM, D)), q, s


@triton.jit
def _fp4_groups(v, BM: tl.constexpr, D: tl.constexpr, G: tl.constexpr, E4M3: tl.constexpr):
    """quant.fp4_quantize per G on float32 v [BM, D]: (dequantized [BM, D], codes [BM, D], scales [BM, D/G])."""
    g = tl.reshape(v, (BM, D // G, G))
    amax = tl.max(tl.abs(g), 2)
    if E4M3:  # NVFP4: amax floored at 6 * 2^-9, amax / 6 rounded to e4m3
        s = e4m3_round(tl.minimum(tl.math.div_rn(tl.maximum(amax, 0.01171875), 6.0), 448.0))
        w = tl.math.div_rn(g, s[:, :, None])
    else:  # ue8m0: amax floored at 6 * 2^-126
        s = pow2_ceil(tl.math.div_rn(tl.maximum(amax, 7.052966104933725e-38), 6.0))
        w = g * _inv_pow2(s)[:, :, None]
    val, code = _fp4(w)
    return tl.reshape(val * s[:, :, None], (BM, D)), tl.reshape(code, (BM, D)), s


@triton.jit
def _simulate(z, c, BM: tl.constexpr, D: tl.constexpr, SR: tl.constexpr, FMT: tl.constexpr, F64: tl.constexpr):
    """ops.finish.simulate on z [BM, D] (values of x's dtype, in the accumulation dtype); same dtype out."""
    zq = z.to(tl.float32)  # quant._grouped: the simulations see float32 values
    if FMT == 1:  # V4: FP8 per 64 on the nope dims, the rope dims rounded to bf16 (from z itself)
        y, _q, _s = _fp8_groups(zq, BM, D, 64)
        y = tl.where((c < D - SR)[None, :], y.to(z.dtype), _bf16(z, F64))
    elif FMT == 2:
        y, _q, _s = _fp8_groups(zq, BM, D, 32)
    else:  # NVFP4 (e4m3 per 16) / MXFP4 (ue8m0 per 32)
        y, _code, _s = _fp4_groups(zq, BM, D, 16 if FMT == 3 else 32, FMT == 3)
    return y.to(z.dtype)


@triton.jit
def _parity(v):
    """popcount(v) & 1 for 0 <= v < 256."""
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    return v & 1


@triton.jit
def _store_record(y, rec_ptr, base, ok, c, BM: tl.constexpr, D: tl.constexpr, KR: tl.constexpr,
                  KIND: tl.constexpr, PT: tl.constexpr, F64: tl.constexpr):
    """cache.formats.Codec.encode of the finished rows y [BM, D] at byte/element offsets base [BM] of the pool."""
    m2 = ok[:, None]
    row = rec_ptr + base[:, None]
    y32 = y.to(tl.float32)  # the quantized encodings read x.float()
    if KIND == 1:  # plain values in the pool's dtype
        tl.store(row + c[None, :], cast_rounded(y, PT, F64), mask=m2)
    elif KIND == 2:  # V4: e4m3 nope | bf16 rope (little-endian) | e8m0 per 64 | pad
        NOPE: tl.constexpr = D - KR
        _, q, s = _fp8_groups(y32, BM, D, 64)
        nope = (c < NOPE)[None, :]
        tl.store(row + c[None, :], tl.reshape(_e4m3_bits(q), (BM, D)).to(tl.uint8), mask=m2 & nope)
        h = (_bf16(y, F64).to(tl.float32).to(tl.int32, bitcast=True) >> 16) & 0xFFFF
        r = row + NOPE + 2 * (c[None, :] - NOPE)
        tl.store(r, (h & 0xFF).to(tl.uint8), mask=m2 & ~nope)
        tl.store(r + 1, (h >> 8).to(tl.uint8), mask=m2 & ~nope)
        gi = tl.arange(0, D // 64)[None, :]
        e = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF
        tl.store(row + NOPE + 2 * KR + gi, e.to(tl.uint8), mask=m2 & (gi < NOPE // 64))
        tl.store(rec_ptr + base + NOPE + 2 * KR + NOPE // 64, tl.zeros((BM,), tl.uint8), mask=ok)
    elif KIND == 3:  # V4.1 window: e4m3 | e8m0 per 32
        _, q, s = _fp8_groups(y32, BM, D, 32)
        tl.store(row + c[None, :], tl.reshape(_e4m3_bits(q), (BM, D)).to(tl.uint8), mask=m2)
        e = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF
        tl.store(row + D + tl.arange(0, D // 32)[None, :], e.to(tl.uint8), mask=m2)
    elif KIND == 4 or KIND == 5:  # NVFP4 (e4m3 per 16) / MXFP4 (e8m0 per 32): packed codes | scales
        G: tl.constexpr = 16 if KIND == 4 else 32
        _, code, s = _fp4_groups(y32, BM, D, G, KIND == 4)
        lo, hi = tl.split(tl.reshape(code, (BM, D // 2, 2)))
        tl.store(row + tl.arange(0, D // 2)[None, :], (lo | (hi << 4)).to(tl.uint8), mask=m2)
        if KIND == 4:
            sb = _e4m3_bits(s)
        else:
            sb = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF
        tl.store(row + D // 2 + tl.arange(0, D // G)[None, :], sb.to(tl.uint8), mask=m2)
    else:  # FP8 row: e4m3 of y / s | float32 s = max(amax, 1e-8) / 448 (IEEE divisions, as torch)
        s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y32), 1), 1e-8), 448.0)
        q = _e4m3(tl.minimum(tl.maximum(tl.math.div_rn(y32, s[:, None]), -448.0), 448.0))
        tl.store(row + c[None, :], _e4m3_bits(q).to(tl.uint8), mask=m2)
        k = tl.arange(0, 4)[None, :]
        sb = (s.to(tl.int32, bitcast=True)[:, None] >> (8 * k)) & 0xFF
        tl.store(row + D + k, sb.to(tl.uint8), mask=m2)


@step_jit
def _finish_kernel(x_ptr, out_ptr, pre_ptr, w_ptr, cos_ptr, sin_ptr, rows_ptr, rec_ptr,
                   M, H, n_blocks, stride_xn, stride_xh, stride_c, stride_rec, eps_hi, eps_lo, hc_hi, hc_lo,
                   D: tl.constexpr, RD: tl.constexpr, SR: tl.constexpr, KR: tl.constexpr, BM: tl.constexpr,
                   NORM: tl.constexpr, ROTATE: tl.constexpr, HB: tl.constexpr, FMT: tl.constexpr, KIND: tl.constexpr,
                   DT: tl.constexpr, PT: tl.constexpr, F64: tl.constexpr, HALF_DOT: tl.constexpr,
                   STORE_PRE: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    ACC: tl.constexpr = tl.float64 if F64 else tl.float32
    c = tl.arange(0, D)
    if ROTATE:
        HA: tl.constexpr = D // HB
        ib = tl.arange(0, HB)
        sign = tl.where(_parity(ib[:, None] & ib[None, :]) == 1, -1.0, 1.0)  # Sylvester +-1, [HB, HB]
        if HALF_DOT:
            S = sign.to(DT)
        else:
            S = sign.to(ACC)
    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        m = blk * BM + tl.arange(0, BM)
        ok = m < M
        n = (m // H).to(tl.int64)
        src = n * stride_xn + (m % H).to(tl.int64) * stride_xh
        x = tl.load(x_ptr + src[:, None] + c[None, :], mask=ok[:, None], other=0.0)
        if F64:
            z = x.to(tl.float64)
        else:
            z = x.to(tl.float32)  # bf16 / fp16 rows hold their exact values in float32
        if NORM:  # rms_norm: w * (x * rsqrt(mean(x^2) + eps)) in the accumulation dtype, rounded to x's dtype
            r = rms_inv(tl.sum(z * z, 1) / D, eps_hi, eps_lo, F64)
            w = widen(tl.load(w_ptr + c), ACC)
            z = _round(w[None, :] * (z * r[:, None]), DT)
        if RD > 0:  # apply_rope: interleaved pairs of the last RD dims, float32 (float64) math, rounded
            pair = tl.arange(0, D // 2)
            rp = pair >= (D - RD) // 2
            ri = tl.where(rp, pair - (D - RD) // 2, 0)
            cm = ok[:, None] & rp[None, :]
            cs = widen(tl.load(cos_ptr + n[:, None] * stride_c + ri[None, :], mask=cm, other=1.0), ACC)
            sn = widen(tl.load(sin_ptr + n[:, None] * stride_c + ri[None, :], mask=cm, other=0.0), ACC)
            a, b = tl.split(tl.reshape(z, (BM, D // 2, 2)))
            rot = tl.reshape(tl.join(a * cs - b * sn, a * sn + b * cs), (BM, D))
            z = tl.where((c >= D - RD)[None, :], _round(rot, DT), z)  # the nope dims pass untouched
        if ROTATE:  # hadamard_rotate: x @ (S * n^-1/2), H_D = H_HA (x) H_HB
            z2 = tl.reshape(z, (BM * HA, HB))
            if HALF_DOT:  # exact bf16/fp16 values against exact +-1 on the tensor cores, fp32 accumulation
                u = tl.dot(z2.to(DT), S)
            else:
                u = tl.dot(z2, S, input_precision="ieee", out_dtype=ACC)
            if HA > 1:  # the +-1 combination of the HA blocks (H_HA[ia, ja] from the same parity rule)
                ia = tl.arange(0, HA)
                sign_a = tl.where(_parity(ia[:, None] & ia[None, :]) == 1, -1.0, 1.0).to(ACC)
                u = tl.sum(tl.reshape(u, (BM, HA, 1, HB)) * tl.reshape(sign_a, (1, HA, HA, 1)), 1)
            u = tl.reshape(u, (BM, D))
            if F64:  # n^-1/2 as two float32 halves (float scalars reach kernels as float32)
                z = u * hc_hi + u * hc_lo
            else:
                z = _round(u * hc_hi, DT)
        dst = m.to(tl.int64)[:, None] * D + c[None, :]
        if STORE_PRE:  # the values before the simulation (tests: the simulation must be exact on them)
            tl.store(pre_ptr + dst, cast_rounded(z, DT, F64), mask=ok[:, None])
        if FMT != 0:
            z = _simulate(z, c, BM, D, SR, FMT, F64)
        tl.store(out_ptr + dst, cast_rounded(z, DT, F64), mask=ok[:, None])
        if KIND != 0:
            prow = tl.load(rows_ptr + m, mask=ok, other=0).to(tl.int64)
            _store_record(z, rec_ptr, prow * stride_rec, ok, c, BM, D, KR, KIND, PT, F64)


# --- host ---------------------------------------------------------------------------------------------------------------

def _dtypes_here(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    if x.is_cuda:
        return (torch.bfloat16, torch.float16, torch.float32)  # float64 exists only for the CPU interpreter's tests
    if x.device.type == "cpu" and interpreting():
        return (torch.bfloat16, torch.float16, torch.float32, torch.float64)
    return ()


def supports(x: torch.Tensor, fmt: str | None, pool: Any = None, rotate: bool = False) -> bool:
    """Whether the kernel takes this call (the reference runs the rest)."""
    if x.dtype not in _dtypes_here(x) or fmt not in SIM or x.dim() not in (2, 3):
        return False
    d = x.shape[-1]
    # a row is one register tile (tl.arange needs a power of two), >= 16 for the rotation's dot; the tiles and the
    # rotation's [BM, D/128, D/128, 128] block combination are sized for the models' rows (D <= 512)
    if d & (d - 1) or not 16 <= d <= 512:
        return False
    # on the H200 a 512-wide rotation needs 233,472 B of shared memory (1 KB over the limit); the models rotate only
    # 128-wide index keys and queries
    if x.is_cuda and rotate and d > 256:
        return False
    # fp8_row records (a float32 scale per row, not a power of two, so the division rounds): on the H200 the bytes
    # differ from torch's encode of the same values (measured 2026-12-01; cause not yet found), so the reference
    # writes them until they are bit-identical; the interpreter's are
    if x.is_cuda and pool is not None and pool.codec.kind == "fp8_row":
        return False
    if pool is not None:
        codec = pool.codec
        if codec.kind not in KINDS or codec.dim != d or pool.data.stride(-1) != 1 or pool.data.device != x.device:
            return False
        if codec.kind == "plain" and codec.dtype not in _dtypes_here(x):
            return False
    return True


def _check(d: int, fmt: str | None, rope_dim: int, pool: Any) -> None:
    """The reference's shape errors (it raises where a group would straddle the row)."""
    if fmt is not None and (d - (rope_dim if fmt == "v4_fp8" else 0)) % GROUPS[fmt]:
        raise ValueError(f"last dim {d} (rope {rope_dim}) is not a multiple of the {fmt} quantization group")
    if pool is not None:
        k = pool.codec
        if (k.dim - (k.rope_dim if k.kind == "v4_fp8" else 0)) % GROUPS[k.kind]:
            raise ValueError(f"record dim {k.dim} (rope {k.rope_dim}) is not a multiple of the {k.kind} group")


def finish_rows(x: torch.Tensor, norm: torch.Tensor | None, eps: float, cos: torch.Tensor | None,
                sin: torch.Tensor | None, rotate: bool, fmt: str | None, rope_dim: int, pool: Any = None,
                rows: torch.Tensor | None = None, config: Config | None = None,
                pre: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton body of ops.finish.finish_rows (arguments as there): x [N, D] or [N, H, D] -> finished rows in
    x's dtype; with a pool, their records are written at `rows` (one per row of x, in row-major order). `pre`
    (contiguous, x's shape and dtype; tests) receives the values before the simulation from the same launch."""
    D = x.shape[-1]
    H = x.shape[1] if x.dim() == 3 else 1
    M = x.shape[0] * H
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _check(D, fmt, rope_dim, pool)
    if pre is not None and (pre.shape != x.shape or pre.dtype != x.dtype or not pre.is_contiguous()):
        raise ValueError("pre must be a contiguous tensor of x's shape and dtype")
    if M == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    rd = 0 if cos is None else 2 * cos.shape[-1]
    if rd > D:
        raise ValueError(f"RoPE over {rd} dims of a {D}-dim row")
    if cos is not None:
        cos, sin = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)
        if cos.stride(-1) != 1 or sin.stride() != cos.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
    kind, rec, prow, stride_rec, pt, kr = 0, out, out, 0, x.dtype, 0
    if pool is not None:
        if rows is None or rows.numel() != M:
            raise ValueError(f"{M} rows to store, {None if rows is None else rows.numel()} row indices")
        kind, rec, prow = KINDS[pool.codec.kind], pool.data, rows.reshape(-1).contiguous()
        stride_rec, kr, pt = rec.stride(0), pool.codec.rope_dim, pool.codec.dtype
    cfg = config or default_config(M, D, rotate)
    n_blocks = cdiv(M, cfg.rows)
    grid = min(n_blocks, cfg.programs) if cfg.programs else n_blocks
    f64 = x.dtype == torch.float64
    eps_hi, eps_lo = hi_lo(float(eps))
    hc_hi, hc_lo = hi_lo(D ** -0.5)
    half_dot = x.dtype in (torch.bfloat16, torch.float16) and not interpreting()
    _finish_kernel[(grid,)](
        x, out, pre if pre is not None else out, norm if norm is not None else x, cos if cos is not None else x, sin if sin is not None else x,
        prow, rec, M, H, n_blocks, x.stride(0), x.stride(1) if H > 1 else 0,
        cos.stride(0) if cos is not None else 0, stride_rec, eps_hi, eps_lo, hc_hi, hc_lo,
        D=D, RD=rd, SR=rope_dim, KR=kr, BM=cfg.rows, NORM=norm is not None, ROTATE=bool(rotate),
        HB=min(D, HADAMARD_BLOCK), FMT=SIM[fmt],
        KIND=kind, DT=TL_DTYPES[x.dtype], PT=TL_DTYPES[pt], F64=f64, HALF_DOT=half_dot,
        STORE_PRE=pre is not None, num_warps=cfg.num_warps, **pdl_launch(x))
    return out
