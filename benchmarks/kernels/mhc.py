"""mHC kernels (hc_pre, hc_post, hc_post_pre) vs the plain-torch reference bodies on one GPU (n=4, D=4096, bf16).

    python benchmarks/kernels/mhc.py --out DIR

hc_pre is timed in V4's form (own pre, the sub-layer's RMSNorm fused); hc_post is the expansion; hc_post_pre is the
two in one launch (an expansion and the next sub-layer's hc_pre, V4's attention -> FFN seam). Decode sizes
(T <= 64) are timed from a CUDA graph of LAYERS calls, each on its own fn copy (more bytes than the L2, as a decode
step's sub-layers are), divided by LAYERS; prefill sizes by `common.bench_ms` on one call.
Bytes counted (what must move, once each): hc_pre = x read + fn read + norm weight + y written + pre/post/comb
written; hc_post = x read + f read + out written + post/comb read; hc_post_pre = hc_post's bytes + fn, norm weight,
y and the coefficients of hc_pre (its new streams are read from registers). Each size is validated against the reference
first (y / out relative to their largest magnitude, coefficients elementwise, bitwise repeatability; hc_post_pre bit for
bit against hc_post then hc_pre), and the CUDA
kernels per call of either body are counted with the profiler.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import common
import torch

from v4serve.ops import mhc
from v4serve.ops.kernels import mhc as mk

N, D, ITERS, EPS = 4, 4096, 20, 1e-6
LAYERS = 48  # 48 x 1.5 MiB of fn > the H200's 60 MB L2
DECODE, PREFILL = (1, 8, 32, 64), (4096, 8192)  # graph-timed / eager-timed


def _inputs(t: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    m = (2 + N) * N
    x = torch.randn(t, N, D, device="cuda", generator=g).bfloat16()
    fn = torch.randn(m, N * D, device="cuda", generator=g) * (N * D) ** -0.5
    base = torch.randn(m, device="cuda", generator=g)
    scale = torch.randn(3, device="cuda", generator=g) * 0.1 + 1
    w = (torch.randn(D, device="cuda", generator=g) * 0.1 + 1).bfloat16()
    f = torch.randn(t, D, device="cuda", generator=g).bfloat16()
    return x, fn, base, scale, w, f


def _pre(body, x, fn, base, scale, w):
    return body(x, fn, base, scale, N, ITERS, EPS, EPS, norm_weight=w, norm_eps2=EPS)


def _post_pre(body, f, x, post, comb, fn, base, scale, w):
    return body(f, x, post, comb, fn, base, scale, N, ITERS, EPS, EPS, norm_weight=w, norm_eps2=EPS)


def _scaled(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def head_rows(hbm: float) -> list[dict]:
    """ops.mhc.hc_head, the head's collapse + final norm (hc_pre's launch over the head's n pre rows padded to a
    sub-layer's (2+n)n), against its torch reference (~16 launches), graph-timed; bytes = x, the padded fn (served
    from L2 when replayed back to back) and y."""
    from v4serve.ops import backend, mhc

    rows = []
    for t in (1, 32, 128):
        x, fn, base, scale, w, _ = _inputs(t, seed=t)
        args = (x, fn[:N].contiguous(), base[:N].contiguous(), scale[:1].contiguous(), EPS, EPS, w, EPS)
        err = _scaled(mhc.hc_head(*args, backend.TRITON), mhc.hc_head(*args, backend.REFERENCE))
        us = common.bench_graph_ms(lambda: mhc.hc_head(*args, backend.TRITON)) * 1e3
        ref_us = common.bench_graph_ms(lambda: mhc.hc_head(*args, backend.REFERENCE)) * 1e3
        moved = x.numel() * 2 + (2 + N) * N * N * D * 4 + t * D * 2
        gbs = moved / us / 1e3
        rows.append({"T": t, "kernel_us": us, "reference_us": ref_us, "bytes": moved, "GB_per_s": gbs,
                     "pct_hbm": gbs * 1e9 / hbm * 100, "y_err": err})
        print(f"hc_head T={t:4d} {us:7.2f} us ({gbs:6.0f} GB/s, {gbs * 1e9 / hbm * 100:5.1f}% HBM); reference "
              f"{ref_us:7.2f} us; y err {err:.1e} of its largest value", flush=True)
    return rows


def validate(t: int, config: mk.PreConfig | None = None) -> dict:
    x, fn, base, scale, w, f = _inputs(t, seed=t)
    got = _pre(functools.partial(mk.hc_pre, config=config), x, fn, base, scale, w)
    ref = _pre(mhc.hc_pre_reference, x, fn, base, scale, w)
    coef = max(((g - r).abs() / r.abs()).max().item() for g, r in zip(got[1:], ref[1:]))
    out = mk.hc_post(f, x, got[2], got[3])
    repeat = all(all(torch.equal(a, b) for a, b in zip(_pre(functools.partial(mk.hc_pre, config=config), x, fn, base,
                                                              scale, w), got))
                 for _ in range(10))
    fused = _post_pre(mk.hc_post_pre, f, x, got[2], got[3], fn, base, scale, w)
    two = (out, *_pre(functools.partial(mk.hc_pre, config=config), out, fn, base, scale, w))
    return {"y_err": _scaled(got[0], ref[0]), "coef_rel_err": coef,
            "post_out_err": _scaled(out, mhc.hc_expand(f, x, got[2], got[3])), "bitwise_repeatable": repeat,
            "post_pre_equals_two_launches": all(torch.equal(a, b) for a, b in zip(fused, two))}


def launches(fn) -> int:
    """CUDA kernels one call of fn launches (after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def time_pair(t: int, kernel, reference) -> tuple[float, float]:
    """-> (kernel ms, reference ms) per call of `kernel(x, fn)` / `reference(x, fn)`."""
    x, fn, *_ = _inputs(t, seed=0)
    if t in DECODE:
        fns = [_inputs(1, seed=1000 + i)[1] for i in range(LAYERS)]
        kern = common.bench_graph_ms(lambda: [kernel(x, f) for f in fns]) / LAYERS
        ref = common.bench_graph_ms(lambda: [reference(x, f) for f in fns]) / LAYERS
        return kern, ref
    return common.bench_ms(lambda: kernel(x, fn)), common.bench_ms(lambda: reference(x, fn))


def measure(t: int, hbm: float) -> dict:
    """Launch counts, kernel and reference times, bytes and bandwidth of hc_pre and hc_post at T=t."""
    x, fn, base, scale, w, f = _inputs(t, seed=0)
    _, _, post, comb = _pre(mhc.hc_pre_reference, x, fn, base, scale, w)
    row = {"pre_launches": launches(lambda: _pre(mk.hc_pre, x, fn, base, scale, w)),
           "pre_ref_launches": launches(lambda: _pre(mhc.hc_pre_reference, x, fn, base, scale, w)),
           "post_launches": launches(lambda: mk.hc_post(f, x, post, comb)),
           "post_ref_launches": launches(lambda: mhc.hc_expand(f, x, post, comb)),
           "post_pre_launches": launches(lambda: _post_pre(mk.hc_post_pre, f, x, post, comb, fn, base, scale, w)),
           "post_pre_ref_launches": launches(
               lambda: _post_pre(mhc.hc_post_pre_reference, f, x, post, comb, fn, base, scale, w))}
    pre_k, pre_r = time_pair(t, lambda xx, ff: _pre(mk.hc_pre, xx, ff, base, scale, w),
                             lambda xx, ff: _pre(mhc.hc_pre_reference, xx, ff, base, scale, w))
    # hc_post has no weights: the graph's LAYERS calls share inputs (the streams are L2-hot in decode too)
    post_k, post_r = time_pair(t, lambda xx, _ff: mk.hc_post(f, xx, post, comb),
                               lambda xx, _ff: mhc.hc_expand(f, xx, post, comb))
    post_pre_k, post_pre_r = time_pair(
        t, lambda xx, ff: _post_pre(mk.hc_post_pre, f, xx, post, comb, ff, base, scale, w),
        lambda xx, ff: _post_pre(mhc.hc_post_pre_reference, f, xx, post, comb, ff, base, scale, w))
    m = (2 + N) * N
    pre_bytes = t * N * D * 2 + m * N * D * 4 + D * 2 + t * D * 2 + t * (2 * N + N * N) * 4
    post_bytes = 2 * t * N * D * 2 + t * D * 2 + t * (N + N * N) * 4
    post_pre_bytes = post_bytes + pre_bytes - t * N * D * 2
    for name, k_ms, r_ms, nbytes in (("pre", pre_k, pre_r, pre_bytes), ("post", post_k, post_r, post_bytes),
                                     ("post_pre", post_pre_k, post_pre_r, post_pre_bytes)):
        gbs = nbytes / (k_ms * 1e-3) / 1e9
        row |= {f"{name}_kernel_us": k_ms * 1e3, f"{name}_reference_us": r_ms * 1e3, f"{name}_bytes": nbytes,
                f"{name}_GB_per_s": gbs, f"{name}_pct_hbm": 100 * gbs * 1e9 / hbm}
    row["pre_config"] = mk.default_pre_config(t, D, True).__dict__
    row["post_config"] = mk.default_post_config(t, D, True).__dict__
    return row


# hc_pre variants at decode: tile choices, the mixes by tensor-core dots or FMAs, the finishing collapse in one chunk
# (y kept for the norm) or two, and two diagnostics that change the work (Sinkhorn iterations, the fused norm) to show
# where the time goes
PRE_VARIANTS = {
    "default": {}, "dots": {"fma": False}, "fma": {"fma": True}, "dc2048": {"block_dc": 2048},
    # 1-token blocks: the FMA mixes as [1, rows, D chunk] products (before the thirty-second session), not "flat"
    "noflat": {"flat": False},
    "dots-dc2048": {"fma": False, "block_dc": 2048}, "w2": {"num_warps": 2}, "w8": {"num_warps": 8},
    "split16": {"split_d": 16}, "split64": {"split_d": 64, "block_d": 64}, "split128": {"split_d": 128, "block_d": 32},
    # D = 5120 at one token: the default's 32 slices round up to 256-wide ones (20 programs); 40 of 128
    "s40": {"split_d": 40},
    # D = 5120 (V4.1): one collapse chunk of 8192 (ptxas on the CPU: hc_post_pre 156 registers at 4 warps, hc_pre 255
    # with spills at 4 warps, 218 without at 8)
    "dc8192": {"block_dc": 8192}, "dc8192-w8": {"block_dc": 8192, "num_warps": 8},
    "diag:iters1": "iters1", "diag:no-norm": "no-norm",
    # the finishing program's stream loads before the coefficients (PreConfig.hoist; opt-in, V4SERVE_MHC_HOIST=1)
    "hoist": {"hoist": True}, "nohoist": {"hoist": False},
    # batched decode (T = 8..64; the default there is 4-token blocks x 16 D slices, never swept): smaller token blocks
    # so that the finishing programs' serial work (Sinkhorn, collapse, norm per token) runs on more SMs at once
    "bt1": {"block_t": 1, "split_d": 32, "block_dc": 8192}, "bt1-s16": {"block_t": 1, "split_d": 16, "block_dc": 8192},
    "bt2": {"block_t": 2, "split_d": 32, "block_dc": 2048}, "bt2-s16": {"block_t": 2, "split_d": 16, "block_dc": 2048},
    "bt8-s8": {"block_t": 8, "split_d": 8, "block_dc": 512},
    # prefill chunks and mixed steps (T = 256..8K; eighteenth session: a 528-token mixed step spent 5.4 of its 22.5 ms
    # GPU in the mHC, ~300 us a launch, against 13 us at one token): token blocks x D splits, the mixes by the bf16x3
    # dots ("x3"), fp32 dots ("ieee", bf16x3 off) or FMAs
    "p-bt16-s4": {"block_t": 16, "split_d": 4, "block_dc": 256},
    "p-bt16-s4-w8": {"block_t": 16, "split_d": 4, "block_dc": 256, "num_warps": 8},
    "p-bt16-s4-ieee": {"block_t": 16, "split_d": 4, "block_dc": 256, "bf16x3": False},
    "p-bt8-s8": {"block_t": 8, "split_d": 8, "block_dc": 512},
    "p-bt4-s16": {"block_t": 4, "split_d": 16, "block_dc": 1024},
    "p-bt16-s1": {"block_t": 16, "split_d": 1, "block_dc": 256},
    "p-bt32-s1-ieee": {"block_t": 32, "block_d": 64, "split_d": 1, "bf16x3": False},
    "p-bt32-s2": {"block_t": 32, "split_d": 2, "block_dc": 128},
    "p-bt64-s1": {"block_t": 64, "block_d": 64, "split_d": 1, "block_dc": 64},
    # every field explicit (the ones above inherit bf16x3 and block_d from the default at their T, so "p-bt16-s4" was
    # fp32 dots at 2048 and bf16x3 at 528). sm_90 compiles (CPU, eighteenth session): 8-token blocks lower even the
    # bf16x3 dots to FMAs, 16/32-token blocks to mma.sync, 64-token blocks to wgmma
    "x3-bt16-s4": {"block_t": 16, "block_d": 128, "split_d": 4, "block_dc": 256, "bf16x3": True},
    "x3p-bt16-s4": {"block_t": 16, "block_d": 128, "split_d": 4, "block_dc": 256, "bf16x3": True, "promote": True},
    "x3-bt32-s4": {"block_t": 32, "block_d": 128, "split_d": 4, "block_dc": 128, "bf16x3": True},
    "x3p-bt64-s2": {"block_t": 64, "block_d": 128, "split_d": 2, "block_dc": 64, "bf16x3": True, "promote": True},
    "x3p-bt64-s4": {"block_t": 64, "block_d": 128, "split_d": 4, "block_dc": 64, "bf16x3": True, "promote": True},
    "ieee-bt16-s4-d128": {"block_t": 16, "block_d": 128, "split_d": 4, "block_dc": 256, "bf16x3": False},
    "ieee-bt16-s8": {"block_t": 16, "block_d": 64, "split_d": 8, "block_dc": 256, "bf16x3": False},
    # hc_post_pre as hc_post + hc_pre (PreConfig.post_apart): the fused form with tensor-core mixes was 4-5x the pre
    # side alone at 2K-8K tokens (nineteenth session: x3-bt32-s4 at 8192, hc_pre 629 us, hc_post_pre 4,639 us)
    "a-ieee": {"block_t": 16, "block_d": 64, "split_d": 4, "block_dc": 256, "bf16x3": False, "post_apart": True},
    "a-x3p-bt16-s4": {"block_t": 16, "block_d": 128, "split_d": 4, "block_dc": 256, "bf16x3": True, "promote": True,
                      "post_apart": True},
    "a-x3p-bt16-d64-s4": {"block_t": 16, "block_d": 64, "split_d": 4, "block_dc": 256, "bf16x3": True,
                          "promote": True, "post_apart": True},
    "a-x3-bt32-s4": {"block_t": 32, "block_d": 128, "split_d": 4, "block_dc": 128, "bf16x3": True, "post_apart": True},
    "a-x3p-bt32-s4": {"block_t": 32, "block_d": 128, "split_d": 4, "block_dc": 128, "bf16x3": True, "promote": True,
                      "post_apart": True},
    "a-x3p-bt32-d64-s4": {"block_t": 32, "block_d": 64, "split_d": 4, "block_dc": 128, "bf16x3": True,
                          "promote": True, "post_apart": True},
    "a-x3p-bt32-s2": {"block_t": 32, "block_d": 128, "split_d": 2, "block_dc": 128, "bf16x3": True, "promote": True,
                      "post_apart": True},
    "a-x3p-bt64-d64-s4": {"block_t": 64, "block_d": 64, "split_d": 4, "block_dc": 64, "bf16x3": True,
                          "promote": True, "post_apart": True},
    "a-x3p-bt64-d64-s4-st1": {"block_t": 64, "block_d": 64, "split_d": 4, "block_dc": 64, "bf16x3": True,
                              "promote": True, "num_stages": 1, "post_apart": True},
    "a-x3p-bt64-d32-s4": {"block_t": 64, "block_d": 32, "split_d": 4, "block_dc": 64, "bf16x3": True,
                          "promote": True, "post_apart": True},
    "a-x3-bt64-d64-s4-w8": {"block_t": 64, "block_d": 64, "split_d": 4, "block_dc": 64, "bf16x3": True,
                            "num_warps": 8, "post_apart": True},
    # mixed steps on V4.1 (D = 5120, T = 128..1024; twenty-sixth session, H100: the default's fused hc_post_pre was
    # twice its hc_pre, 245.6 against 119.9 us at T = 640): the default's tiles with hc_post apart; fp32 FMA dots
    # ("ieee") where the 8-token blocks lower the bf16x3 split's three dots to FMAs too (three times the products)
    "apart": {"post_apart": True}, "ieee": {"bf16x3": False}, "ieee-apart": {"bf16x3": False, "post_apart": True},
    "bt4-s16-ieee-apart": {"block_t": 4, "split_d": 16, "block_dc": 1024, "bf16x3": False, "post_apart": True},
    "bt16-s8-ieee-apart": {"block_t": 16, "split_d": 8, "block_dc": 256, "bf16x3": False, "post_apart": True},
    "bt8-s16-ieee-apart": {"block_t": 8, "split_d": 16, "block_dc": 512, "bf16x3": False, "post_apart": True},
    "bt2-fma-apart": {"block_t": 2, "split_d": 32, "block_dc": 2048, "fma": True, "post_apart": True},
    # the collapse and norm in a launch of their own (PreConfig.collapse_apart; twenty-seventh session): the mixes on
    # token blocks that reach the tensor cores (bf16x3, promoted), their finishing programs only the coefficients
    "c-bt8-s8": {"block_t": 8, "split_d": 8, "block_dc": 512, "collapse_apart": True},
    "c-x3p-bt16-s8": {"block_t": 16, "block_d": 128, "split_d": 8, "bf16x3": True, "promote": True,
                      "collapse_apart": True},
    "c-x3p-bt32-s4": {"block_t": 32, "block_d": 128, "split_d": 4, "bf16x3": True, "promote": True,
                      "collapse_apart": True},
    "c-x3p-bt32-s8": {"block_t": 32, "block_d": 128, "split_d": 8, "bf16x3": True, "promote": True,
                      "collapse_apart": True},
    "c-x3p-bt32-s8-cw8": {"block_t": 32, "block_d": 128, "split_d": 8, "bf16x3": True, "promote": True,
                          "collapse_apart": True, "collapse_warps": 8},
    "c-x3p-bt32-s8-ct2": {"block_t": 32, "block_d": 128, "split_d": 8, "bf16x3": True, "promote": True,
                          "collapse_apart": True, "collapse_t": 2},
    "c-x3p-bt64-s8": {"block_t": 64, "block_d": 128, "split_d": 8, "bf16x3": True, "promote": True,
                      "collapse_apart": True},
    "c-x3p-bt64-d64-s16": {"block_t": 64, "block_d": 64, "split_d": 16, "bf16x3": True, "promote": True,
                           "collapse_apart": True},
}
# batched decode (T = 8..128; forty-second session): the 1-token blocks' finishing programs read all of fn (2 MiB at
# D = 5120) once a token from L2 (64 MiB at T = 32); token blocks on the tensor cores read it once a block, over many
# narrow D slices so that the grid fills the GPU (the variants above had 32 programs at T = 128): "c-x3p-bt{T}[-d{D
# chunk}]-s{slices}"
for _bt, _bd, _split in ((16, 128, 40), (16, 64, 80), (32, 128, 40), (32, 64, 80), (64, 64, 80)):
    PRE_VARIANTS[f"c-x3p-bt{_bt}{'' if _bd == 128 else f'-d{_bd}'}-s{_split}"] = {
        "block_t": _bt, "block_d": _bd, "split_d": _split, "bf16x3": True, "promote": True, "collapse_apart": True}


def sweep(ts: tuple[int, ...], only: list[str] | None = None) -> list[dict]:
    """hc_pre and hc_post_pre per variant at decode sizes (graph of LAYERS calls on distinct fn copies), each checked
    first (hc_pre's y against the reference)."""
    from dataclasses import replace

    rows = []
    fns = [_inputs(1, seed=1000 + i)[1] for i in range(LAYERS)]
    for t in ts:
        x, fn, base, scale, w, f = _inputs(t, seed=0)
        ref = _pre(mhc.hc_pre_reference, x, fn, base, scale, w)
        _, _, post, comb = ref
        base_cfg = mk.default_pre_config(t, D, True)
        for name, v in PRE_VARIANTS.items():
            if only and name not in only:
                continue
            cfg = base_cfg if isinstance(v, str) else replace(base_cfg, **v)
            iters = 1 if v == "iters1" else ITERS
            nw = None if v == "no-norm" else w

            def call(ff, cfg=cfg, iters=iters, nw=nw, x=x, base=base, scale=scale):
                return mk.hc_pre(x, ff, base, scale, N, iters, EPS, EPS, norm_weight=nw, norm_eps2=EPS, config=cfg)

            def call_pp(ff, cfg=cfg, iters=iters, nw=nw, x=x, base=base, scale=scale, f=f, post=post, comb=comb):
                return mk.hc_post_pre(f, x, post, comb, ff, base, scale, N, iters, EPS, EPS, norm_weight=nw,
                                      norm_eps2=EPS, config=cfg)
            try:
                out = call(fn)
                err = _scaled(out[0], ref[0]) if not isinstance(v, str) else float("nan")
                comb_err = _scaled(out[3], ref[3]) if not isinstance(v, str) else float("nan")
                us = common.bench_graph_ms(lambda: [call(f) for f in fns]) / LAYERS * 1e3
                us_pp = common.bench_graph_ms(lambda: [call_pp(f) for f in fns]) / LAYERS * 1e3
            except Exception as exc:  # noqa: BLE001 - a variant the compiler rejects
                print(f"T={t} {name}: failed {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            rows.append({"T": t, "variant": name, "config": cfg.__dict__, "us": us, "post_pre_us": us_pp,
                         "y_err": err, "comb_err": comb_err})
            print(f"hc_pre T={t:>3} {name:<12} {us:8.2f} us  hc_post_pre {us_pp:8.2f} us  y err {err:.1e}  "
                  f"comb err {comb_err:.1e}", flush=True)
    return rows


def main() -> None:
    global D
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true", help="only the hc_pre / hc_post_pre decode variants "
                    "(T = 1, 32)")
    ap.add_argument("--tokens", default="1,32", help="--sweep's token counts, comma-separated")
    ap.add_argument("--variants", default=None, help="--sweep's variants (PRE_VARIANTS names), comma-separated")
    ap.add_argument("--dim", type=int, default=4096, help="the streams' width D (V4-Flash 4096, V4.1-Flash 5120)")
    ap.add_argument("--head", action="store_true", help="only ops.mhc.hc_head (the head's collapse and final norm) "
                    "against its torch reference at 1, 32 and 128 logits rows")
    ap.add_argument("--precision", action="store_true", help="only the prefill grid's agreement (T = 4096) and time "
                    "(T = 8192) per variant: fp32 FMA dots, the bf16x3 GEMM chained or promoted per D chunk")
    a = ap.parse_args()
    D = a.dim
    if a.precision:
        # the prefill grid: its default (fp32 FMA dots), the bf16x3 GEMM chained through the tensor cores'
        # accumulator, and promoted per D chunk (PreConfig.promote), with each one's time at 8K tokens
        base_cfg = mk.default_pre_config(4096, D, on_gpu=True)
        variants = {"default": {}, "x3": {"bf16x3": True}, "x3p": {"bf16x3": True, "promote": True},
                    "x3p-s1": {"bf16x3": True, "promote": True, "num_stages": 1},
                    "x3p-bt64": {"bf16x3": True, "promote": True, "block_t": 64},
                    "x3p-bd128": {"bf16x3": True, "promote": True, "block_d": 128}}
        for name, v in variants.items():
            cfg = dataclasses.replace(base_cfg, **v)
            try:
                check = validate(4096, cfg)
                x, fn, base, scale, w, f = _inputs(8192, seed=1)
                _, _, post, comb = _pre(mhc.hc_pre_reference, x, fn, base, scale, w)
                pre_ms = common.bench_ms(lambda: mk.hc_pre(x, fn, base, scale, N, ITERS, EPS, EPS, norm_weight=w,
                                                           norm_eps2=EPS, config=cfg))
                pp_ms = common.bench_ms(lambda: mk.hc_post_pre(f, x, post, comb, fn, base, scale, N, ITERS, EPS, EPS,
                                                               norm_weight=w, norm_eps2=EPS, config=cfg))
            except Exception as exc:  # noqa: BLE001 - a variant the compiler rejects
                print(f"{name}: failed {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            print(f"{name:10s} T=4096 {check}; T=8192 hc_pre {pre_ms * 1e3:8.1f} us, hc_post_pre {pp_ms * 1e3:8.1f} us",
                  flush=True)
        return
    ceil = common.measure_ceilings()
    hbm = ceil["hbm_bytes_per_s"]
    print(common.describe(ceil), flush=True)
    if a.head:
        common.write_json(a.out, "mhc-head", {"ceilings": ceil, "rows": head_rows(hbm)})
        return
    if a.sweep:
        common.write_json(a.out, "mhc-sweep", {"ceilings": ceil,
                                               "rows": sweep(tuple(int(t) for t in a.tokens.split(",")),
                                                             a.variants.split(",") if a.variants else None)})
        return
    rows = []
    for t in DECODE + PREFILL:
        check = validate(t)
        print(f"T={t}: validation {check}", flush=True)
        rows.append({"T": t, "timing": "graph" if t in DECODE else "eager", **check, **measure(t, hbm)})
    common.write_json(a.out, "mhc", {"ceilings": ceil, "n": N, "D": D, "sinkhorn_iters": ITERS, "dtype": "bf16",
                                     "decode_layers_per_graph": LAYERS, "rows": rows})
    print(f"\nmHC n={N} D={D} bf16, {ITERS} Sinkhorn iterations, hc_pre with the RMSNorm fused; "
          f"{common.describe(ceil)}")
    print(f"{'T':>6} {'op':>8} {'kernel us':>10} {'GB/s':>8} {'% HBM':>6} {'ref us':>9} {'speedup':>8} "
          f"{'launches':>9} {'y/out err':>10} {'coef err':>9}")
    for r in rows:
        for name in ("pre", "post", "post_pre"):
            err = r["post_out_err"] if name == "post" else r["y_err"]
            coef = f"{r['coef_rel_err']:>9.1e}" if name == "pre" else f"{'':>9}"
            if name == "post_pre":  # validated bit for bit against the two launches
                coef = f"{'= 2 calls' if r['post_pre_equals_two_launches'] else 'DIFFERS':>9}"
            print(f"{r['T']:>6} {name:>8} {r[f'{name}_kernel_us']:>10.2f} {r[f'{name}_GB_per_s']:>8.0f} "
                  f"{r[f'{name}_pct_hbm']:>6.1f} {r[f'{name}_reference_us']:>9.2f} "
                  f"{r[f'{name}_reference_us'] / r[f'{name}_kernel_us']:>8.1f} "
                  f"{r[f'{name}_launches']:>4}/{r[f'{name}_ref_launches']:<4} {err:>10.1e} {coef}")


if __name__ == "__main__":
    main()
