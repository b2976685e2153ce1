"""Mega-Gate: the whole MoE router of DeepSeek-V4 in one Triton launch (the reference is ops/router.py).

One kernel computes the gate logits x W^T of a block of tokens (fp32 accumulation, fp64 under the CPU interpreter),
the score function, + bias ([E] or per token [T, E]), the top-k by iterative argmax in registers (or the `tid2eid`
row of each token on hash-routed layers), gathers the unbiased scores, normalises them and applies route_scale.

Two grid shapes, both one launch (default_config picks them; numbers in benchmarks/kernels/router.py):
- whole-E programs (1024 < T <= 8192 at E=256): one program per block of tokens holds all E logits in registers and
  finishes its tokens.
- split grid (decode and mid sizes, and E halves for long prefills): one program per (token block, expert block,
  D chunk), so that the gate weight read [E, D] is spread over many SMs; each writes its partial logits to a scratch
  buffer and bumps a per-token-block arrival counter (acq_rel, gpu scope); the last program to arrive sums the
  partials in a fixed order (bitwise deterministic whichever came last), runs the same epilogue over the real rows
  and resets the counter to zero, so the next launch or CUDA-graph replay finds it ready. The counters are one
  persistent buffer per device: two router launches must not run concurrently on different streams.

Ties in the top-k: among equal biased scores the LOWER expert index wins (torch.topk leaves ties unspecified).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..precision import hi_lo
from . import cdiv, next_pow2, step_jit
from .pdl import enter as pdl_enter
from .pdl import launch as pdl_launch
from .quant import fp8_simulate_tile
from .split_grid import FLOATS as _FLOATS
from .split_grid import N_COUNTERS, ArrivalCounters, last_to_arrive, runs_here
from .split_grid import TL_DTYPES as _TL

SCORE_FUNCS = {"sqrtsoftplus": 0, "softmax": 1, "sigmoid": 2}
_MAX_E = 1024  # all E logits of a token block live in registers
_COUNTERS = ArrivalCounters()


@dataclass(frozen=True)
class Config:
    block_t: int  # tokens per program (a power of two; tl.dot pads M < 16 itself)
    block_e: int  # experts per program; < e_pad selects the split grid
    block_d: int  # reduction step over D
    split_d: int  # programs along D (> 1 selects the split grid)
    num_warps: int = 4
    num_stages: int = 3
    epi_t: int = 16  # split grid: rows per epilogue step of the last program (bounds its registers)


@triton.jit
def _log1p(u):
    # log(1 + u) accurate for tiny u: the rounding error of w = 1 + u cancels in u / (w - 1) (Goldberg)
    w = 1.0 + u
    d = w - 1.0
    return tl.where(d == 0.0, u, tl.log(w) * (u / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _logits(x_ptr, w_ptr, offs_t, t_mask, offs_e, e_mask, d_lo, d_hi, stride_xt, stride_xd, stride_we, stride_wd,
            BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
            ACC: tl.constexpr, DOT: tl.constexpr):
    """x[offs_t, d_lo:d_hi] @ W[offs_e, d_lo:d_hi]^T -> [BLOCK_T, BLOCK_E] in ACC."""
    acc = tl.zeros([BLOCK_T, BLOCK_E], ACC)
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt
    w_rows = w_ptr + offs_e.to(tl.int64)[:, None] * stride_we
    for d0 in range(d_lo, d_hi, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        if EVEN_D:  # no mask along D keeps the loads vectorised
            xt = tl.load(x_rows + offs_d[None, :] * stride_xd, mask=t_mask[:, None], other=0.0)
            wt = tl.load(w_rows + offs_d[None, :] * stride_wd, mask=e_mask[:, None], other=0.0)
        else:
            d_mask = offs_d < d_hi
            xt = tl.load(x_rows + offs_d[None, :] * stride_xd, mask=t_mask[:, None] & d_mask[None, :], other=0.0)
            wt = tl.load(w_rows + offs_d[None, :] * stride_wd, mask=e_mask[:, None] & d_mask[None, :], other=0.0)
        # bf16 x bf16 products are exact in fp32, so the tensor cores match the reference's upcast GEMM
        acc = tl.dot(xt.to(DOT), tl.trans(wt.to(DOT)), acc, input_precision="ieee", out_dtype=ACC)
    return acc


@triton.jit
def _epilogue(logits, offs_t, t_mask, E, bias_ptr, stride_bt, stride_be, tid_ptr, stride_tv, stride_tk, tok_ptr,
              stride_tok, out_w_ptr, out_id_ptr, rs_hi, rs_lo, eps_hi, eps_lo, alt_bias_ptr, alt_ptr,
              BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr,
              SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, HASH: tl.constexpr, NORM: tl.constexpr,
              ACC: tl.constexpr, HAS_ALT: tl.constexpr):
    """[BLOCK_T, E_PAD] logits -> the k weights and ids of each token, stored."""
    offs_e = tl.arange(0, E_PAD)
    e_mask = offs_e < E
    if SCORE == 1:  # softmax over the E real experts
        lg = tl.where(e_mask[None, :], logits, float("-inf"))
        p = tl.exp(lg - tl.max(lg, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
    elif SCORE == 2:
        scores = tl.sigmoid(logits)
    else:  # sqrt(softplus), with torch's threshold: softplus(l) = l for l > 20
        sp = tl.where(logits > 20.0, logits, _log1p(tl.exp(tl.minimum(logits, 20.0))))
        if ACC == tl.float32:
            scores = tl.sqrt_rn(sp)  # IEEE-rounded, as torch
        else:
            scores = tl.sqrt(sp)

    offs_k = tl.arange(0, K_PAD)
    k_mask = offs_k < K
    if HASH:
        tok = tl.load(tok_ptr + offs_t * stride_tok, mask=t_mask, other=0).to(tl.int64)
        table = tl.load(tid_ptr + tok[:, None] * stride_tv + offs_k[None, :] * stride_tk,
                        mask=t_mask[:, None] & k_mask[None, :], other=0).to(tl.int64)
    else:
        sel = scores
        if HAS_BIAS:
            b = tl.load(bias_ptr + offs_t[:, None] * stride_bt + offs_e[None, :] * stride_be,
                        mask=t_mask[:, None] & e_mask[None, :], other=0.0)
            if HAS_ALT:  # tokens flagged in alt take the alternative [E] bias (V4.1's image tokens: bias_vl)
                flag = tl.load(alt_ptr + offs_t, mask=t_mask, other=0) != 0
                b2 = tl.load(alt_bias_ptr + offs_e, mask=e_mask, other=0.0)
                b = tl.where(flag[:, None], b2[None, :], b)
            sel = sel + b.to(ACC)
        sel = tl.where(e_mask[None, :], sel, float("-inf"))

    if HASH:
        id_out = table
    else:
        id_out = tl.zeros([BLOCK_T, K_PAD], tl.int32)
        for j in tl.static_range(K):
            # one (value, index) reduction; ties: the lowest expert index among the maxima wins
            _, idx = tl.max(sel, axis=1, return_indices=True, return_indices_tie_break_left=True)
            idx = tl.minimum(idx, E - 1)  # a NaN row may point into the padding: keep the id a valid expert
            sel = tl.where(offs_e[None, :] == idx[:, None], float("-inf"), sel)
            id_out = tl.where(offs_k[None, :] == j, idx[:, None], id_out)
    # the unbiased scores of the chosen experts (ids clamped so that a bad table entry cannot read out of the tile)
    w_out = tl.gather(scores, tl.minimum(tl.maximum(id_out, 0), E - 1).to(tl.int32), axis=1)
    w_out = tl.where(k_mask[None, :], w_out, 0.0)

    # fp32 scalar arguments carry the hi and lo halves of route_scale and eps (exact enough for fp64)
    if NORM and SCORE != 1:
        eps = tl.cast(eps_hi, ACC) + tl.cast(eps_lo, ACC)
        w_out = w_out / (tl.sum(w_out, axis=1)[:, None] + eps)
    w_out = w_out * (tl.cast(rs_hi, ACC) + tl.cast(rs_lo, ACC))
    o = offs_t[:, None] * K + offs_k[None, :]
    m = t_mask[:, None] & k_mask[None, :]
    tl.store(out_w_ptr + o, w_out, mask=m)
    tl.store(out_id_ptr + o, id_out.to(tl.int64), mask=m)


@triton.jit
def _simulate_x(x_ptr, xq_ptr, offs_t, t_mask, d_lo, d_hi, stride_xt, stride_xd, stride_qt, BLOCK_T: tl.constexpr,
                BLOCK_D: tl.constexpr, G: tl.constexpr):
    """xq[offs_t, d_lo:d_hi] = x's FP8 quant-dequant per 1 x G (G divides BLOCK_D and the D share), in x's dtype."""
    for d0 in range(d_lo, d_hi, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        m = t_mask[:, None] & (offs_d < d_hi)[None, :]
        v = tl.load(x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt + offs_d[None, :] * stride_xd, mask=m,
                    other=0.0)
        q = fp8_simulate_tile(v.to(tl.float32), BLOCK_T, BLOCK_D, G)
        tl.store(xq_ptr + offs_t.to(tl.int64)[:, None] * stride_qt + offs_d[None, :], q.to(v.dtype), mask=m)


@step_jit
def _router_kernel(x_ptr, w_ptr, bias_ptr, tid_ptr, tok_ptr, part_ptr, cnt_ptr, out_w_ptr, out_id_ptr,
                   alt_bias_ptr, alt_ptr, T, E, D, d_per_split,
                   stride_xt, stride_xd, stride_we, stride_wd, stride_bt, stride_be, stride_tv, stride_tk, stride_tok,
                   rs_hi, rs_lo, eps_hi, eps_lo,
                   K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_D: tl.constexpr,
                   EPI_T: tl.constexpr, EVEN_D: tl.constexpr, SCORE: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HASH: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr,
                   HAS_ALT: tl.constexpr = False, PDL: tl.constexpr = False, xq_ptr=None, stride_qt=0,
                   QUANT_G: tl.constexpr = 0):
    pdl_enter(PDL)  # wait for the kernel before, let the next one launch (kernels/pdl.py)
    pid_t = tl.program_id(0)
    pid_e = tl.program_id(1)
    pid_d = tl.program_id(2)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = offs_t < T
    d_lo = pid_d * d_per_split
    d_hi = tl.minimum(d_lo + d_per_split, D)
    n_eb = tl.num_programs(1)
    if QUANT_G > 0:  # the last expert-block column of the grid: x's FP8 simulation for the routed experts, no logits
        n_eb -= 1
        if pid_e == n_eb:
            _simulate_x(x_ptr, xq_ptr, offs_t, t_mask, d_lo, d_hi, stride_xt, stride_xd, stride_qt, BLOCK_T,
                        BLOCK_D, QUANT_G)
            return
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    acc = _logits(x_ptr, w_ptr, offs_t, t_mask, offs_e, offs_e < E, d_lo, d_hi, stride_xt, stride_xd, stride_we,
                  stride_wd, BLOCK_T, BLOCK_E, BLOCK_D, EVEN_D, ACC, DOT)
    if BLOCK_E < E_PAD or SPLIT_D > 1:
        # split grid: partial logits to scratch [SPLIT_D, T_pad, E_PAD]; the last arrival finishes the token block
        t_pad = tl.num_programs(0) * BLOCK_T
        tl.store(part_ptr + (pid_d * t_pad + offs_t[:, None]) * E_PAD + offs_e[None, :], acc)
        if last_to_arrive(cnt_ptr + pid_t, n_eb * SPLIT_D):
            offs_all = tl.arange(0, E_PAD)
            t0 = pid_t * BLOCK_T
            for r0 in range(t0, tl.minimum(t0 + BLOCK_T, T), EPI_T):  # the rows that exist, EPI_T at a time
                offs_r = r0 + tl.arange(0, EPI_T)
                logits = tl.zeros([EPI_T, E_PAD], ACC)
                for s in tl.static_range(SPLIT_D):  # fixed order: the sum does not depend on who came last
                    logits += tl.load(part_ptr + (s * t_pad + offs_r[:, None]) * E_PAD + offs_all[None, :],
                                      mask=(offs_all < E)[None, :], other=0.0, cache_modifier=".cg")
                _epilogue(logits, offs_r, offs_r < T, E, bias_ptr, stride_bt, stride_be, tid_ptr, stride_tv,
                          stride_tk, tok_ptr, stride_tok, out_w_ptr, out_id_ptr, rs_hi, rs_lo, eps_hi, eps_lo,
                          alt_bias_ptr, alt_ptr, EPI_T, E_PAD, K, K_PAD, SCORE, HAS_BIAS, HASH, NORM, ACC, HAS_ALT)
            tl.store(cnt_ptr + pid_t, 0)  # ready for the next launch / graph replay
    else:
        _epilogue(acc, offs_t, t_mask, E, bias_ptr, stride_bt, stride_be, tid_ptr, stride_tv, stride_tk, tok_ptr,
                  stride_tok, out_w_ptr, out_id_ptr, rs_hi, rs_lo, eps_hi, eps_lo, alt_bias_ptr, alt_ptr, BLOCK_T,
                  E_PAD, K, K_PAD, SCORE, HAS_BIAS, HASH, NORM, ACC, HAS_ALT)


def _e_pad(e: int) -> int:
    return max(16, next_pow2(e))


def default_config(t: int, e: int, d: int, on_gpu: bool) -> Config:
    """Picked from sweeps on an H200 at E=256, D=4096, bf16 (benchmarks/kernels/router.py --sweep). Up to 1024 tokens:
    the split grid with small token blocks (the last program's epilogue covers only real rows) and the weight read
    spread over 64-1024 programs. Prefill: 64-token blocks, all (or half) of E per program. The interpreter gets
    one program per 16 tokens (numpy cost, not speed)."""
    e_pad = _e_pad(e)
    if not on_gpu:
        return Config(block_t=16, block_e=e_pad, block_d=min(64, max(16, next_pow2(d))), split_d=1)
    if t <= 1024:
        #            T:   1      <=8     <=32    <=128   <=256   <=1024
        block_t, block_e, split_d, warps = ((1, 32, 8, 4) if t == 1 else (4, 32, 8, 4) if t <= 8 else
                                            (4, 32, 4, 4) if t <= 32 else (8, 64, 4, 8) if t <= 128 else
                                            (16, 64, 2, 8) if t <= 256 else (16, 128, 2, 8))
        return Config(block_t, min(block_e, e_pad), block_d=256, split_d=max(1, min(split_d, d // 512)),
                      num_warps=warps, num_stages=3, epi_t=block_t)
    if t <= 8192:
        return Config(64, min(256, e_pad), block_d=64, split_d=1, num_warps=8, num_stages=4)
    return Config(64, min(128, e_pad), block_d=64, split_d=1, num_warps=8, num_stages=3)


def supports(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor | None,
             alt_bias: torch.Tensor | None = None, alt: torch.Tensor | None = None) -> bool:
    """True where the kernel runs: 2-D float inputs on one device, E <= 1024, bias None / [E] / [T, E] (with an
    alternative: both [E], alt [T] bool or integer); CUDA without float64 (fp64 exists only for the CPU interpreter),
    or the CPU under Triton's interpreter (TRITON_INTERPRET)."""
    if alt is not None:
        e = gate_w.shape[0]
        if bias is None or alt_bias is None or tuple(bias.shape) != (e,) or tuple(alt_bias.shape) != (e,):
            return False
        if alt_bias.dtype not in _FLOATS or alt_bias.device != x.device or alt.device != x.device:
            return False
        if alt.shape != (x.shape[0],) or alt.dtype.is_floating_point or alt.stride(0) != 1:
            return False
    if x.dim() != 2 or gate_w.dim() != 2 or x.shape[1] != gate_w.shape[1] or not 1 <= gate_w.shape[0] <= _MAX_E:
        return False
    if x.dtype not in _FLOATS or gate_w.dtype not in _FLOATS or x.device != gate_w.device:
        return False
    if not runs_here(x):
        return False
    if bias is not None:
        e = gate_w.shape[0]
        if bias.dtype not in _FLOATS or bias.device != x.device or tuple(bias.shape) not in ((e,), (x.shape[0], e)):
            return False
    return True


def route(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
          token_ids: torch.Tensor | None, topk: int, score_func: str, route_scale: float, eps: float,
          norm: bool = True, config: Config | None = None, alt_bias: torch.Tensor | None = None,
          alt: torch.Tensor | None = None, xq: torch.Tensor | None = None,
          quant_group: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, k] float32/float64, expert ids [T, k] int64), as ops.router.route_reference. xq [T, D] (x's
    dtype, `simulates(...)` true): filled in the same launch with x's FP8 quant-dequant per 1 x quant_group, the
    routed experts' input (ops/kernels/moe.py then needs no launch of its own before its first GEMM)."""
    t, d = x.shape
    e = gate_w.shape[0]
    k = tid2eid.shape[1] if tid2eid is not None else topk
    if not 1 <= k <= e:
        raise ValueError(f"top-k {k} must be in [1, E={e}]")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w_out = torch.empty(t, k, dtype=acc, device=x.device)
    id_out = torch.empty(t, k, dtype=torch.int64, device=x.device)
    if t == 0:
        return w_out, id_out
    cfg = config or default_config(t, e, d, x.is_cuda)
    if xq is not None and not _simulation_fits(x, xq, quant_group, cfg):
        raise ValueError(f"x's FP8 simulation per {quant_group} does not fit {cfg} (check `simulates` first)")
    e_pad = _e_pad(e)
    if any(v & (v - 1) for v in (cfg.block_t, cfg.block_e, cfg.block_d, cfg.epi_t)):
        raise ValueError(f"block sizes must be powers of two: {cfg}")
    block_e = min(cfg.block_e, e_pad)
    n_tb = cdiv(t, cfg.block_t)
    n_eb = cdiv(e, block_e)
    d_per_split = cdiv(cdiv(d, cfg.split_d), cfg.block_d) * cfg.block_d
    split_d = cdiv(d, d_per_split)
    split = block_e < e_pad or split_d > 1  # the kernel's own test: the two must agree
    if split:
        if n_tb > N_COUNTERS:
            raise ValueError(f"split grid over {n_tb} token blocks (max {N_COUNTERS}): use larger token blocks")
        part = torch.empty(split_d, n_tb * cfg.block_t, e_pad, dtype=acc, device=x.device)
        cnt = _COUNTERS.get(x.device)
    else:
        part = cnt = w_out  # unused
    same_half = x.dtype == gate_w.dtype and x.dtype in (torch.bfloat16, torch.float16)
    hashed = tid2eid is not None
    has_bias = bias is not None and not hashed
    b = bias if has_bias else w_out
    stride_bt = (bias.stride(0) if bias.dim() == 2 else 0) if has_bias else 0
    stride_be = bias.stride(-1) if has_bias else 0
    tid = tid2eid if hashed else id_out
    tok = token_ids if hashed else id_out
    rs_hi, rs_lo = hi_lo(float(route_scale))
    eps_hi, eps_lo = hi_lo(float(eps))
    has_alt = has_bias and alt is not None
    quant = {} if xq is None else {"xq_ptr": xq, "stride_qt": xq.stride(0), "QUANT_G": quant_group}
    _router_kernel[(n_tb, n_eb + (xq is not None), split_d)](
        x, gate_w, b, tid, tok, part, cnt, w_out, id_out, alt_bias if has_alt else b, alt if has_alt else id_out,
        t, e, d, d_per_split,
        x.stride(0), x.stride(1), gate_w.stride(0), gate_w.stride(1), stride_bt, stride_be,
        tid.stride(0) if hashed else 0, tid.stride(1) if hashed else 0, tok.stride(0) if hashed else 0,
        rs_hi, rs_lo, eps_hi, eps_lo,
        K=k, K_PAD=next_pow2(k), E_PAD=e_pad, BLOCK_T=cfg.block_t,
        BLOCK_E=block_e, BLOCK_D=cfg.block_d, SPLIT_D=split_d, EPI_T=min(cfg.epi_t, cfg.block_t),
        EVEN_D=d % cfg.block_d == 0, SCORE=SCORE_FUNCS[score_func],
        HAS_BIAS=has_bias, HASH=hashed, NORM=bool(norm), ACC=_TL[acc], DOT=_TL[x.dtype] if same_half else _TL[acc],
        HAS_ALT=has_alt, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **quant, **pdl_launch(x))
    return w_out, id_out


def _simulation_fits(x: torch.Tensor, xq: torch.Tensor, group: int, cfg: Config) -> bool:
    """Whole 1 x group groups in every program's D chunks (a power of two dividing block_d, hence each D share), xq
    shaped and typed as x, unit stride along D."""
    return (group > 0 and group & (group - 1) == 0 and cfg.block_d % group == 0 and x.shape[1] % group == 0
            and xq.shape == x.shape and xq.dtype == x.dtype and xq.device == x.device and xq.stride(1) == 1)


def simulates(x: torch.Tensor, gate_w: torch.Tensor, group: int) -> bool:
    """Whether `route` can write x's FP8 simulation per 1 x group (xq=) in its launch, with its default config."""
    cfg = default_config(x.shape[0], gate_w.shape[0], x.shape[1], x.is_cuda)
    return _simulation_fits(x, x, group, cfg)
