"""Eager calls of one decode op at V4-Flash shapes, for Nsight Compute (where the hardware counters can be read).

    ncu --clock-control none -k regex:gate_up --launch-skip 4 --launch-count 1 --section WarpStateStats \
        python3 benchmarks/kernels/ncu_targets.py moe 1

Targets: `moe T [--model PRESET --experts E]` (the routed experts over FP4 stacks, the default config, T tokens of
random routing; V4-Flash's geometry unless a preset's is named), `gemv N K [M] [--block B]` (one FP8 block-scaled
decode linear through ops.linear as the step calls it: M rows, default 1; B x B weight blocks with 1 x B activation
groups, default 128 — V4.1's `wo_b` at batch 32 is `gemv 5120 8192 32 --block 32`), `mhc T D` (the mHC seam
`hc_post_pre`: the expansion and the next sub-layer's hc_pre with its norm, T tokens of streams D wide, n = 4, fn on
its own copy a call) and `indexer B` (the lightning indexer's logits + select at 64K context, 16K entries, top-512,
B decode rows, MXFP4 keys). Each call uses other weights than the one before (the routed experts hit differ; the GEMV
rotates copies), so a profiled launch reads its weights from HBM even when ncu keeps the caches. Prints nothing but
the op's name and the calls made: the figures are ncu's.
"""

from __future__ import annotations

import argparse

import torch
from fp8_gemm import weight
from indexer import K, copy_pool, entries_for, make_pool, queries
import moe as moe_bench

from v4serve.ops import backend
from v4serve.ops.kernels import indexer as ik
from v4serve.ops.kernels import mhc as hk
from v4serve.ops.kernels import moe as mk
from v4serve.ops.linear import linear


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", choices=("moe", "gemv", "indexer", "mhc"))
    ap.add_argument("shape", type=int, nargs="+", help="moe: T; gemv: N K [M]; indexer: B; mhc: T D")
    ap.add_argument("--block", type=int, default=128, help="gemv: the weight's scale block (and activation group)")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--model", default=None, help="moe: a preset's MoE geometry (as benchmarks/kernels/moe.py)")
    ap.add_argument("--experts", type=int, default=None, help="moe: routed experts (default: the geometry's)")
    args = ap.parse_args()
    if args.target == "moe":
        mb = moe_bench
        if args.model:  # the preset's geometry, as moe.py --model sets it
            from v4serve.presets import get_preset

            c = get_preset(args.model)
            mb.D, mb.I, mb.K, mb.ACT_GROUP = c.dim, c.moe_inter_dim, c.n_activated_experts, c.weight_block
            mb.E = c.n_routed_experts
        mb.E = args.experts or mb.E
        ex = mb.make_experts()
        calls = [mb.inputs(args.shape[0], seed=s) for s in range(args.calls)]
        for x, w, ids in calls:  # one token: x's FP8 simulation handed over, as the step's router does (no sort)
            mk.experts_forward(x, ex, w, ids, mb.LIMIT, mb.ACT_GROUP, mb.BEFORE, xq=mb.simulated(x, ex))
    elif args.target == "mhc":
        t, d = args.shape
        n, iters, eps = 4, 20, 1e-6
        x = torch.randn(t, n, d, device="cuda").bfloat16()
        f = torch.randn(t, d, device="cuda").bfloat16()
        post = torch.rand(t, n, device="cuda") * 2
        comb = torch.softmax(torch.randn(t, n, n, device="cuda"), dim=-1)
        base, scale = torch.randn((2 + n) * n, device="cuda"), torch.ones(3, device="cuda")
        w = torch.ones(d, device="cuda").bfloat16()
        for _ in range(args.calls):
            fn = torch.randn((2 + n) * n, n * d, device="cuda") * (n * d) ** -0.5
            hk.hc_post_pre(f, x, post, comb, fn, base, scale, n, iters, eps, eps, norm_weight=w, norm_eps2=eps)
    elif args.target == "indexer":
        b = args.shape[0]
        base = make_pool("mxfp4", b, seed=b)
        pools = [base] + [copy_pool(base) for _ in range(args.calls - 1)]
        ent = entries_for(b, b, decode=True)
        q, w, _ = queries(b, seed=1, fp8=False)
        for pool in pools:
            ik.index_topk(q, w, pool, ent, K)
    else:
        n, k, m = (*args.shape, 1)[:3]
        b = args.block
        weights = [weight(n, k, b) for _ in range(args.calls)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for q, s in weights:
            linear(x, q, s, b, b, backend.TRITON)
    torch.cuda.synchronize()
    print(f"{args.target} {args.shape}: {args.calls} calls", flush=True)


if __name__ == "__main__":
    main()
