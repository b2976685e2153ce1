"""Mega-Gate router kernel vs the plain-torch reference on one GPU (E=256, D=4096, k=6, bf16, V4-Flash's gate).

    python benchmarks/kernels/router.py --out DIR [--sweep]

Decode sizes (T <= 64) and the mid sizes 256, 1024 are timed from a CUDA graph of LAYERS calls, each on its own
gate weight copy (more bytes than the L2, as a decode step's layers are), divided by LAYERS; prefill sizes by
`common.bench_ms` on one call.
Bytes counted: gate weight + x + bias + outputs, each once. The kernel is validated against the reference first
(id mismatches outside near-ties of the reference's scores, weight error, bitwise repeatability). --sweep also
times alternative configs. At T = 1 the launch is also timed writing x's FP8 simulation per 1 x 128 for the routed
experts (`xq=`, as the one-token decode step runs it; its bytes add x's simulation written), checked against
`quant.fp8_simulate`.
"""

from __future__ import annotations

import argparse

import common
import torch

from v4serve.ops import quant, router
from v4serve.ops.kernels import router as rk

E, D, K = 256, 4096, 6
LAYERS = 48  # 48 x 2 MiB of gate weights > the H200's 60 MB L2
DECODE, PREFILL = (1, 8, 32, 64, 256, 1024), (4096, 16384)  # graph-timed / eager-timed
ARGS = {"tid2eid": None, "token_ids": None, "topk": K, "score_func": "sqrtsoftplus", "route_scale": 1.5, "eps": 1e-20,
        "norm": True}


def _inputs(t: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, D, device="cuda", generator=g).bfloat16()
    w = (torch.randn(E, D, device="cuda", generator=g) * D**-0.5 * 2).bfloat16()
    b = torch.randn(E, device="cuda", generator=g) * 0.3
    return x, w, b


def validate(t: int) -> dict:
    x, w, b = _inputs(t, seed=t)
    gw, gi = rk.route(x, w, b, **ARGS)
    rw, ri = router.route_reference(x, w, b, **ARGS)
    sel = torch.nn.functional.softplus(x.float() @ w.float().t()).sqrt() + b
    top = sel.topk(K + 1, dim=-1).values
    near = ((top[:, :-1] - top[:, 1:]).abs() <= 1e-4).any(-1)
    bad = (gi != ri).any(-1)
    same = ~bad
    rel = ((gw[same] - rw[same]).abs() / rw[same].abs()).max().item() if same.any() else 0.0
    repeat = all(torch.equal(rk.route(x, w, b, **ARGS)[0], gw) for _ in range(20))
    return {"mismatch_tokens": int(bad.sum()), "mismatch_outside_near_ties": int((bad & ~near).sum()),
            "max_rel_weight_err": rel, "bitwise_repeatable": repeat}


def time_one(t: int, fn_kernel, fn_ref) -> tuple[float, float]:
    """-> (kernel ms per call, reference ms per call; nan without fn_ref)."""
    if t in DECODE:
        x, _, b = _inputs(t, seed=0)
        ws = [_inputs(1, seed=1000 + i)[1] for i in range(LAYERS)]
        kern = common.bench_graph_ms(lambda: [fn_kernel(x, w, b) for w in ws]) / LAYERS
        ref = common.bench_graph_ms(lambda: [fn_ref(x, w, b) for w in ws]) / LAYERS if fn_ref else float("nan")
        return kern, ref
    x, w, b = _inputs(t, seed=0)
    ref = common.bench_ms(lambda: fn_ref(x, w, b)) if fn_ref else float("nan")
    return common.bench_ms(lambda: fn_kernel(x, w, b)), ref


def sweep(t: int) -> list[dict]:
    """Alternative configs around the defaults (the space default_config was picked from)."""
    if t in DECODE:
        cfgs = [rk.Config(bt, be, 256, sd, nw, 3, bt) for bt in (1, 2, 4, 8, 16) if bt <= t and t // bt <= 16
                for be in (32, 64) for sd in (2, 4, 8) for nw in (4, 8)]
    else:
        cfgs = [rk.Config(bt, be, 64, sd, nw, 3) for bt in (32, 64, 128) for be in (64, 128, 256) for sd in (1, 2)
                for nw in (4, 8)]
    rows = []
    for cfg in cfgs:
        try:
            ms, _ = time_one(t, lambda x, w, b, c=cfg: rk.route(x, w, b, **ARGS, config=c), None)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile (shared memory) is skipped
            rows.append({"config": cfg.__dict__, "error": type(exc).__name__})
            continue
        rows.append({"config": cfg.__dict__, "us": ms * 1e3})
        print(f"  sweep T={t} {cfg}: {ms * 1e3:.2f} us", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true")
    a = ap.parse_args()
    ceil = common.measure_ceilings()
    hbm = ceil["hbm_bytes_per_s"]
    print(common.describe(ceil), flush=True)
    rows, sweeps = [], {}
    for t in DECODE + PREFILL:
        check = validate(t)
        print(f"T={t}: validation {check}", flush=True)
        kern_ms, ref_ms = time_one(t, lambda x, w, b: rk.route(x, w, b, **ARGS),
                                   lambda x, w, b: router.route_reference(x, w, b, **ARGS))
        nbytes = E * D * 2 + t * D * 2 + E * 4 + t * K * (4 + 8)
        gbs = nbytes / (kern_ms * 1e-3) / 1e9
        cfg = rk.default_config(t, E, D, True)
        rows.append({"T": t, "kernel_us": kern_ms * 1e3, "reference_us": ref_ms * 1e3, "bytes": nbytes,
                     "GB_per_s": gbs, "pct_hbm": 100 * gbs * 1e9 / hbm, "config": cfg.__dict__,
                     "timing": "graph" if t in DECODE else "eager", **check})
        if a.sweep:
            sweeps[t] = sweep(t)
    simulated = simulated_input(hbm)
    common.write_json(a.out, "router", {"ceilings": ceil, "E": E, "D": D, "k": K, "dtype": "bf16",
                                        "decode_layers_per_graph": LAYERS, "rows": rows, "sweeps": sweeps,
                                        "simulated_input_t1": simulated})
    print(f"\nrouter E={E} D={D} k={K} bf16 sqrtsoftplus, bias [E]; {common.describe(ceil)}")
    print(f"{'T':>6} {'kernel us':>10} {'GB/s':>8} {'% HBM':>6} {'ref us':>9} {'speedup':>8} {'ids off':>8} "
          f"{'off!tie':>8} {'w rel err':>10}")
    for r in rows:
        print(f"{r['T']:>6} {r['kernel_us']:>10.2f} {r['GB_per_s']:>8.0f} {r['pct_hbm']:>6.1f} "
              f"{r['reference_us']:>9.2f} {r['reference_us'] / r['kernel_us']:>8.1f} {r['mismatch_tokens']:>8} "
              f"{r['mismatch_outside_near_ties']:>8} {r['max_rel_weight_err']:>10.2e}")
    print(f"{'1+xq':>6} {simulated['kernel_us']:>10.2f} {simulated['GB_per_s']:>8.0f} {simulated['pct_hbm']:>6.1f}"
          f"  (x's FP8 simulation written too; exact: {simulated['exact']})")


def simulated_input(hbm: float) -> dict:
    """T = 1 with x's FP8 simulation per 1 x 128 written by the same launch (the one-token step's router)."""
    group = 128
    x, w, b = _inputs(1, seed=1)
    xq = torch.empty_like(x)
    assert rk.simulates(x, w, group)
    rk.route(x, w, b, **ARGS, xq=xq, quant_group=group)
    exact = bool(torch.equal(xq, quant.fp8_simulate(x, group)))
    ms, _ = time_one(1, lambda x, w, b: rk.route(x, w, b, **ARGS, xq=xq, quant_group=group), None)
    nbytes = E * D * 2 + 2 * D * 2 + E * 4 + K * (4 + 8)
    gbs = nbytes / (ms * 1e-3) / 1e9
    return {"kernel_us": ms * 1e3, "bytes": nbytes, "GB_per_s": gbs, "pct_hbm": 100 * gbs * 1e9 / hbm,
            "exact": exact}


if __name__ == "__main__":
    main()
