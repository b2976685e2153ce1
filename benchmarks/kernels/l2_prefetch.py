"""Can a decode GEMV's weight be in L2 before the GEMV starts? A probe for prefetching the next weights on a side stream
while the main stream runs latency-bound kernels (the mHC, attention, the finishes: ~35% of a V4 batch-1 step with the
HBM nearly idle).

For each weight shape: the L2 is flushed (a 256 MB write), then the main stream runs a spin kernel (one program
waiting `--spin-us` on the global timer: a stand-in for latency-bound work, and long enough for the host to have queued
everything after it: events time the GPU's timeline, so a kernel the host is still launching counts as idle time)
followed by the one-row GEMV, timed between events around the GEMV alone. Variants:
  cold       no prefetch (the GEMV reads its weight from HBM, as in the step today)
  bulk       a side-stream kernel issues `cp.async.bulk.prefetch.L2` over the weight (and its scales) during the spin
  lines      the same with `prefetch.global.L2` per 128-byte line
  warm       the GEMV run once before the timed one (its weight left in L2: the ceiling of prefetching)
Then whether the prefetch traffic slows a latency-bound kernel beside it: the mHC's hc_post_pre at T=1 alone and with
a 32 MB bulk prefetch on the side stream. Prints µs and the GEMV's effective GB/s beside the HBM copy ceiling.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from common import describe, measure_ceilings, write_json

from v4serve.ops import quant
from v4serve.ops.kernels import fp8_gemv
from v4serve.ops.kernels import mhc as mk

SHAPES = {"wq_b": (32768, 1024), "wo_b": (4096, 8192), "wq_a": (1024, 4096), "shared_w1": (2048, 4096),
          "wo_a_flat": (8192, 4096)}


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _spin_kernel(out_ptr, ns):
    t0 = _now()
    t = t0
    while t - t0 < ns:
        t = _now()
    tl.store(out_ptr, (t - t0).to(tl.int32))


@triton.jit
def _bulk_kernel(base_ptr, nbytes, CHUNK: tl.constexpr, PER_PROG: tl.constexpr):
    offs = (tl.program_id(0) * PER_PROG + tl.arange(0, PER_PROG)).to(tl.int64) * CHUNK
    ptrs = (base_ptr + offs).to(tl.int64, bitcast=True)
    size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)
    size = tl.where(size > 0, size, 0) // 16 * 16
    tl.inline_asm_elementwise("{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; }"
                              " mov.u32 $0, 0;", "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _lines_kernel(base_ptr, nbytes, PER_PROG: tl.constexpr):
    offs = (tl.program_id(0) * PER_PROG + tl.arange(0, PER_PROG)).to(tl.int64) * 128
    ok = offs < nbytes
    ptrs = (base_ptr + tl.where(ok, offs, 0)).to(tl.int64, bitcast=True)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


def prefetch(t: torch.Tensor, how: str) -> None:
    nbytes = t.numel() * t.element_size()
    base = t.view(torch.uint8)
    if how == "bulk":
        chunk, per = 16384, 64
        _bulk_kernel[(triton.cdiv(nbytes, chunk * per),)](base, nbytes, CHUNK=chunk, PER_PROG=per, num_warps=2)
    else:
        per = 1024
        _lines_kernel[(triton.cdiv(nbytes, 128 * per),)](base, nbytes, PER_PROG=per, num_warps=4)


def timed(main, side=None, spin_ns: int = 0, reps: int = 30, before=None) -> float:
    """Median µs of main() between events, after an L2 flush, a spin of spin_ns on the main stream and before() (if
    any), with side() (if any) launched on a second stream right after the flush."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.empty(1, dtype=torch.int32, device="cuda")
    other = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    times = []
    for _ in range(reps):
        flush.fill_(1)
        other.wait_stream(cur)
        if spin_ns:
            _spin_kernel[(1,)](sink, spin_ns, num_warps=1)
        if side is not None:
            with torch.cuda.stream(other):
                side()
        if before is not None:
            before()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        main()
        e1.record()
        cur.wait_stream(other)
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def _side(fn) -> None:
    """fn on a second stream that starts where the current stream is now (not joined: the timing ends first)."""
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        fn()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--spin-us", type=float, default=400.0)
    args = ap.parse_args()
    ceil = measure_ceilings()
    print(describe(ceil), flush=True)
    hbm = ceil["hbm_bytes_per_s"]
    spin = int(args.spin_us * 1e3)
    rows = []
    g = torch.Generator().manual_seed(0)
    for name, (N, K) in SHAPES.items():
        q, s = quant.fp8_block_quantize_weight(torch.randn(N, K, generator=g) * K ** -0.5, 128)
        q, s = q.cuda(), s.view(torch.uint8).cuda()
        x = torch.randn(1, 1, K, device="cuda", dtype=torch.bfloat16)
        gemv = lambda: fp8_gemv.run(x, q, s, 128, 128, torch.bfloat16)  # noqa: E731
        gemv()
        both = lambda how: (lambda: (prefetch(q, how), prefetch(s, how)))  # noqa: E731
        wbytes = q.numel() + s.numel()
        res = {"cold": timed(gemv, None, spin), "bulk": timed(gemv, both("bulk"), spin),
               "lines": timed(gemv, both("lines"), spin), "warm": timed(gemv, None, spin, before=gemv)}
        for v, us in res.items():
            rows.append({"shape": name, "N": N, "K": K, "variant": v, "us": us,
                         "gb_s": wbytes / us / 1e3, "pct_hbm": wbytes / (us * 1e-6) / hbm * 100})
        print(f"{name:10s} {wbytes / 2**20:6.1f} MiB  " + "  ".join(
            f"{v} {us:6.1f} us ({wbytes / (us * 1e-6) / hbm * 100:5.1f}% HBM)" for v, us in res.items()), flush=True)
    # does a side-stream prefetch slow a latency-bound kernel beside it?
    D, n = 4096, 4
    f = torch.randn(1, D, device="cuda", dtype=torch.bfloat16)
    xs = torch.randn(1, n, D, device="cuda", dtype=torch.bfloat16)
    post, comb = torch.rand(1, n, device="cuda"), torch.rand(1, n, n, device="cuda")
    fn = torch.randn((2 + n) * n, n * D, device="cuda") * (n * D) ** -0.5
    base, scale = torch.randn((2 + n) * n, device="cuda"), torch.ones(3, device="cuda")
    big = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    hc = lambda: mk.hc_post_pre(f, xs, post, comb, fn, base, scale, n, 20, 1e-6, 1e-6)  # noqa: E731
    hc()
    # the prefetch launched on the side stream just before the timed kernel (spin: the host queues ahead)
    alone = timed(hc, None, spin)
    beside = timed(hc, None, spin, before=lambda: _side(lambda: prefetch(big, "bulk")))
    print(f"hc_post_pre T=1: alone {alone:.1f} us, beside a 32 MB bulk prefetch {beside:.1f} us", flush=True)
    rows.append({"shape": "hc_post_pre", "variant": "alone", "us": alone})
    rows.append({"shape": "hc_post_pre", "variant": "beside_prefetch", "us": beside})
    write_json(args.out, "l2_prefetch", {"ceilings": ceil, "spin_us": args.spin_us, "rows": rows})


if __name__ == "__main__":
    main()
