"""Lightning-indexer kernels (ops/kernels/indexer.py) vs the plain-torch reference on one GPU, V4-Flash shapes.

    python benchmarks/kernels/indexer.py --out DIR [--quick] [--sweep]

64 index heads, d = 128, top-512, compress ratio 4, 256-position blocks (64 entries each), bf16 queries; index keys
MXFP4 (68 B) and FP8 row (132 B). Every row's context is 64K positions (16K entries visible).
* Decode (batch 1 and 32): one CUDA graph of calls, each on its own copy of the key pool (more bytes than the L2, as
  the layers of a step are), divided by the calls: the logits launch, the select launch, both (index_topk), and the
  reference (eager, one call). Bytes = the visible key records + q + w + the scores written; % of the HBM copy
  ceiling of the same run. Target: <= 25 us per layer for batch 1.
* Prefill: a 4096-token chunk at positions 60K..64K of one row, eager: the logits in TFLOP/s (2 H d per visible
  (token, entry)) against the FP8 and bf16 peaks of the same run (target: >= 40 % of FP8), and logits + select.
  With FP8-row keys also FP8 queries with one scale per row (the FP8 tensor-core path).
The kernel's picks are first compared with the reference's (bf16 on a GPU: fp32 sums in another order may swap
near-ties): rows identical, and the recall of the reference's picks.
--quick: default configs, no reference timing; --sweep: also alternative tile configs.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace

import common
import torch

from v4serve.cache.formats import Codec
from v4serve.cache.pool import RowPool
from v4serve.ops import indexer
from v4serve.ops.kernels import indexer as ik

H, D, K, RATIO, BLOCK = 64, 128, 512, 4, 256
CONTEXT = 65536
E = CONTEXT // RATIO  # entries visible at the end of the context (and E_max)
EPB = BLOCK // RATIO
DECODE, PREFILL_T = (1, 32), 4096
TARGET_DECODE_US, TARGET_PREFILL_PCT_FP8 = 25.0, 40.0


def make_pool(kind: str, rows: int, seed: int) -> RowPool:
    """Index keys of `rows` rows of CONTEXT positions each (row r owns blocks r*nb..), from random unit-RMS values."""
    nb = rows * (CONTEXT // BLOCK)
    codec = Codec(kind, D)
    pool = RowPool(codec, nb * EPB + EPB - 1, "cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    for lo in range(0, pool.data.shape[0], 1 << 18):
        hi = min(pool.data.shape[0], lo + (1 << 18))
        pool.data[lo:hi] = codec.encode(torch.randn(hi - lo, D, device="cuda", generator=g))
    return pool


def copy_pool(pool: RowPool) -> RowPool:
    twin = RowPool(pool.codec, pool.rows, "cuda")
    twin.data.copy_(pool.data)
    return twin


def entries_for(t: int, rows: int, decode: bool) -> indexer.Entries:
    """Decode: t = rows tokens, one per row, at position CONTEXT-1. Prefill: t tokens of row 0 ending there."""
    nb = CONTEXT // BLOCK
    bt = torch.arange(rows * nb, device="cuda").view(rows, nb)
    if decode:
        token_row, pos = torch.arange(rows, device="cuda"), torch.full((rows,), CONTEXT - 1, device="cuda")
    else:
        token_row = torch.zeros(t, dtype=torch.long, device="cuda")
        pos = torch.arange(CONTEXT - t, CONTEXT, device="cuda")
    return indexer.Entries(bt, token_row, (pos + 1) // RATIO, RATIO, BLOCK, rows * nb, E)


def queries(t: int, seed: int, fp8: bool):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, H, D, device="cuda", generator=g).bfloat16()
    w = torch.randn(t, H, device="cuda", generator=g) * (D ** -0.5 * H ** -0.5)
    if not fp8:
        return q, w, None
    scale = q.float().abs().amax(-1).clamp_min(1e-8) / 448.0
    return (q.float() / scale.unsqueeze(-1)).to(torch.float8_e4m3fn), w, scale


def validate(pool: RowPool, ent: indexer.Entries, q, w, q_scale, n: int | None = None) -> dict:
    if n is not None:  # a subset of the prefill chunk's tokens (the reference's [T, E] scores)
        ent = indexer.Entries(ent.block_table, ent.token_row[:n], ent.visible[:n], RATIO, BLOCK, ent.num_blocks, E)
        q, w, q_scale = q[:n], w[:n], None if q_scale is None else q_scale[:n]
    got = ik.index_topk(q, w, pool, ent, K, q_scale=q_scale)[0]
    want = indexer.index_topk_reference(q, w, pool, ent, K, q_scale=q_scale)[0]
    same_rows = int((got == want).all(-1).sum())
    hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(got, want))
    return {"rows_identical": same_rows, "rows": got.shape[0], "recall": hits / want.numel()}


def time_decode(kind: str, b: int, cfg: ik.Config | None, with_ref: bool) -> dict:
    base = make_pool(kind, b, seed=b)
    ent = entries_for(b, b, decode=True)
    q, w, _ = queries(b, seed=1, fp8=False)
    check = validate(base, ent, q, w, None)
    pools = [base] + [copy_pool(base) for _ in range(common.copies_past_l2(base.data.numel()) - 1)]
    scores = torch.empty(b, E, dtype=torch.float32, device="cuda")
    out = torch.empty(b, K, dtype=torch.long, device="cuda")
    ik.logits(q, w, base, ent, scores, config=cfg)
    t_logits = common.bench_graph_many([lambda p=p: ik.logits(q, w, p, ent, scores, config=cfg) for p in pools])
    t_select = common.bench_graph_many([lambda: ik.select(scores, ent.visible, out, E, config=cfg)] * len(pools))
    t_both = common.bench_graph_many([lambda p=p: ik.index_topk(q, w, p, ent, K, config=cfg) for p in pools])
    t_ref = common.bench_ms(lambda: indexer.index_topk_reference(q, w, base, ent, K), warmup=2, iters=5) \
        if with_ref else float("nan")
    nbytes = b * E * base.codec.record_bytes + q.numel() * 2 + w.numel() * 4 + b * E * 4
    return {"logits_us": t_logits * 1e3, "select_us": t_select * 1e3, "both_us": t_both * 1e3,
            "reference_us": t_ref * 1e3, "logits_bytes": nbytes, "copies": len(pools), **check}


def time_prefill(kind: str, fp8_q: bool, cfg: ik.Config | None) -> dict:
    pool = make_pool(kind, 1, seed=7)
    ent = entries_for(PREFILL_T, 1, decode=False)
    q, w, qs = queries(PREFILL_T, seed=2, fp8=fp8_q)
    check = validate(pool, ent, q, w, qs, n=256)
    scores = torch.empty(PREFILL_T, E, dtype=torch.float32, device="cuda")
    t_logits = common.bench_ms(lambda: ik.logits(q, w, pool, ent, scores, q_scale=qs, config=cfg))
    t_both = common.bench_ms(lambda: ik.index_topk(q, w, pool, ent, K, q_scale=qs, config=cfg))
    flops = 2 * H * D * float(ent.visible.sum())
    return {"logits_ms": t_logits, "both_ms": t_both, "flops": flops, "TFLOP_per_s": flops / t_logits / 1e9, **check}


DECODE_SWEEP = [ik.Config(1, be, 0, nw, ns, sb, sw) for be in (32, 64, 128) for nw in (4, 8) for ns in (1, 2)
                for sb, sw in ((1024, 4), (2048, 8), (4096, 16))]
PREFILL_SWEEP = [ik.Config(bt, be, 0, nw, ns) for bt in (1, 2, 4) for be in (64, 128) for nw in (4, 8)
                 for ns in (1, 2, 3)]


# the select launch alone (decode): (select_block, select_warps, select_digit). Wider position blocks: one or two
# loads of a 16K-entry row's scores a pass rather than eight (measured: 13% faster at 8192 x 16 warps). Narrower radix
# digits: more passes, each histogram cheaper (ik.Config.select_digit)
SELECT_SWEEP = [(2048, 8, 8), (4096, 8, 8), (4096, 16, 8), (8192, 16, 8), (16384, 16, 8), (16384, 32, 8),
                (8192, 16, 6), (8192, 16, 5), (8192, 16, 4), (4096, 8, 5), (16384, 16, 5)]


# shorter rows (entries visible), where the prepared variants apply: select_narrow (<= 256 picks sort 256 slots) and
# select_resident (a row of <= select_block positions keeps its keys in registers through the passes)
SHORT_ROWS = (200, 4000)
SHORT_VARIANTS = {"default": {}, "narrow": {"select_narrow": True},
                  "resident-4096w16": {"select_resident": True, "select_block": 4096},
                  "resident-narrow-4096w16": {"select_resident": True, "select_narrow": True, "select_block": 4096}}


def time_select(scores: torch.Tensor, visible: torch.Tensor, cfg: ik.Config, label: str
                ) -> tuple[float, torch.Tensor] | None:
    """`ik.select` alone with cfg, from a graph of 8 calls -> (us a call, its picks), or None (reported) where the
    config does not compile or run."""
    out = torch.empty(scores.shape[0], K, dtype=torch.long, device="cuda")
    try:
        ik.select(scores, visible, out, E, config=cfg)
        us = common.bench_graph_many([lambda: ik.select(scores, visible, out, E, config=cfg)] * 8) * 1e3
    except Exception as exc:  # noqa: BLE001 - reported, the other configs go on
        print(f"select {label}: {type(exc).__name__} {str(exc)[:160]}", flush=True)
        return None
    return us, out


def short_row_variants(b: int) -> list[dict]:
    """The select alone on rows of SHORT_ROWS visible entries, per variant (from the decode default config), from a
    graph; each variant's picks against the default's. Their first GPU run."""
    pool = make_pool("mxfp4", b, seed=b)
    base = entries_for(b, b, decode=True)
    q, w, _ = queries(b, seed=1, fp8=False)
    default = ik.default_config(b, False, True)
    rows = []
    for visible in SHORT_ROWS:
        ent = indexer.Entries(base.block_table, base.token_row, torch.full_like(base.visible, visible), RATIO, BLOCK,
                              base.num_blocks, E)
        scores = torch.empty(b, E, dtype=torch.float32, device="cuda")
        ik.logits(q, w, pool, ent, scores)
        want = None
        for name, change in SHORT_VARIANTS.items():
            got = time_select(scores, ent.visible, replace(default, **change), f"{name} B={b} visible {visible}")
            if got is None:
                continue
            us, out = got
            want = out if want is None else want
            same = bool(torch.equal(out, want))
            rows.append({"keys": "mxfp4", "batch": b, "visible": visible, "variant": name, "select_us": us,
                         "same_as_default": same})
            print(f"select B={b:<3} visible {visible:>5} {name:<24} {us:7.1f} us  same picks {same}", flush=True)
    return rows


def select_sweep(kind: str, b: int) -> list[dict]:
    """Scores from the logits launch once, then `ik.select` alone per (select_block, select_warps, select_digit),
    from a graph; each config's picks must equal the default's."""
    pool = make_pool(kind, b, seed=b)
    ent = entries_for(b, b, decode=True)
    q, w, _ = queries(b, seed=1, fp8=False)
    scores = torch.empty(b, E, dtype=torch.float32, device="cuda")
    ik.logits(q, w, pool, ent, scores)
    want = torch.empty(b, K, dtype=torch.long, device="cuda")
    ik.select(scores, ent.visible, want, E)
    rows = []
    for sb, sw, digit in SELECT_SWEEP:
        cfg = ik.Config(1, 64, 0, select_block=sb, select_warps=sw, select_digit=digit)
        got = time_select(scores, ent.visible, cfg, f"{kind} B={b} block {sb} warps {sw} digit {digit}")
        if got is None:
            continue
        us, out = got
        same = bool(torch.equal(out, want))
        rows.append({"keys": kind, "batch": b, "select_block": sb, "select_warps": sw, "select_digit": digit,
                     "select_us": us, "same_as_default": same})
        print(f"select {kind} B={b:<3} block {sb:>5} warps {sw:>2} digit {digit}: {us:7.1f} us  same picks {same}",
              flush=True)
    return rows


# logits + select (index_topk) per config: changes to the decode default (which has the score bins on). At batch 32
# the logits launch dominates: its programs walk ~28 entry tiles each, one after the other (a block-table load, then
# the dependent record loads, a tile), so more programs per token (split) may hide more of that latency
BINNED_SWEEP = {"default": {}, "unsorted": {"select_sorted": False}, "no bins": {"select_hist": False},
                "bins 4096x8 cap 4096": {"select_block": 4096, "select_warps": 8, "select_cap": 4096},
                "bins 8192x16 cap 2048": {"select_block": 8192, "select_cap": 2048},
                "bins 16384x16 cap 4096": {"select_block": 16384, "select_cap": 4096},
                "bins digit 5": {"select_digit": 5},
                "bins 2048x8 cap 2048": {"select_block": 2048, "select_warps": 8, "select_cap": 2048},
                "split 16": {"split": 16}, "split 32": {"split": 32}, "split 64": {"split": 64},
                "split 32, 8 warps": {"split": 32, "num_warps": 8},
                "block_e 32, split 64": {"block_e": 32, "split": 64},
                "stages 3": {"num_stages": 3}, "split 32, stages 3": {"split": 32, "num_stages": 3},
                # the unsorted picks with the other knobs (nineteenth session: unsorted alone 26.6 against 29.3 us);
                # labels without commas, which --only splits at
                "unsorted+2048x8 cap 2048": {"select_sorted": False, "select_block": 2048, "select_warps": 8,
                                             "select_cap": 2048},
                "unsorted+cap 512": {"select_sorted": False, "select_cap": 512},
                "unsorted+cap 2048": {"select_sorted": False, "select_cap": 2048},
                "unsorted+split 32": {"select_sorted": False, "split": 32},
                "unsorted+8 warps": {"select_sorted": False, "select_warps": 8},
                # the binned select over several programs a token (ik.Config.select_split; thirty-fifth session)
                "select split 2": {"select_split": 2}, "select split 4": {"select_split": 4},
                "select split 8": {"select_split": 8}, "select split 16": {"select_split": 16},
                "select split 4 2048x8": {"select_split": 4, "select_block": 2048, "select_warps": 8},
                "select split 8 2048x8": {"select_split": 8, "select_block": 2048, "select_warps": 8},
                "select split 16 1024x4": {"select_split": 16, "select_block": 1024, "select_warps": 4},
                "select split 8 2048x4": {"select_split": 8, "select_block": 2048, "select_warps": 4}}


def binned_sweep(kind: str, b: int, visible: int = E, only: list[str] | None = None) -> list[dict]:
    """index_topk (logits + select) per BINNED_SWEEP config from a graph over key-pool copies past the L2, rows of
    `visible` entries; each config's picks against the reference's (rows identical as sets). `only`: these labels."""
    base = make_pool(kind, b, seed=b)
    full = entries_for(b, b, decode=True)
    ent = indexer.Entries(full.block_table, full.token_row, torch.full_like(full.visible, visible), RATIO, BLOCK,
                          full.num_blocks, E)
    q, w, _ = queries(b, seed=1, fp8=False)
    want = indexer.index_topk_reference(q, w, base, ent, K)[0]
    pools = [base] + [copy_pool(base) for _ in range(common.copies_past_l2(base.data.numel()) - 1)]
    default = ik.default_config(b, False, True)
    rows = []
    for label, change in BINNED_SWEEP.items():
        if only and label not in only:
            continue
        if ("split" in change or "num_stages" in change) and b == 1:
            continue  # one token's 256 tiles already fill the GPU
        cfg = replace(default, **change)
        try:
            got = ik.index_topk(q, w, base, ent, K, config=cfg)[0]
            us = common.bench_graph_many([lambda p=p: ik.index_topk(q, w, p, ent, K, config=cfg) for p in pools]) * 1e3
        except Exception as exc:  # noqa: BLE001 - reported, the other configs go on
            print(f"index_topk {kind} B={b} visible {visible} {label}: {type(exc).__name__} {str(exc)[:160]}")
            continue
        same = int((got.sort(-1).values == want.sort(-1).values).all(-1).sum())  # the picks as sets ("unsorted")
        rows.append({"keys": kind, "batch": b, "visible": visible, "variant": label, "config": asdict(cfg),
                     "both_us": us, "rows_identical": same})
        print(f"index_topk {kind} B={b:<3} visible {visible:>5} {label:<24} {us:7.1f} us  rows {same}/{b}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default configs only, no reference timing")
    ap.add_argument("--sweep", action="store_true", help="also time alternative tile configs")
    ap.add_argument("--select-sweep", action="store_true", help="only the select launch's block / warp variants")
    ap.add_argument("--binned-sweep", action="store_true", help="only logits + select with and without score bins")
    ap.add_argument("--only", default=None, help="--binned-sweep's variants (BINNED_SWEEP labels), comma-separated")
    a = ap.parse_args()
    if a.binned_sweep:
        only = a.only.split(",") if a.only else None
        rows = [r for b, vis in ((1, E), (32, E), (1, 200), (1, 4000)) for r in binned_sweep("mxfp4", b, vis, only)]
        common.write_json(a.out, "indexer_binned_sweep", {"context": CONTEXT, "entries": E, "k": K, "rows": rows})
        return
    if a.select_sweep:
        rows = [r for b in DECODE for r in select_sweep("mxfp4", b) + short_row_variants(b)]
        common.write_json(a.out, "indexer_select_sweep", {"context": CONTEXT, "entries": E, "k": K, "rows": rows})
        return
    ceil = common.measure_ceilings()
    hbm, fp8, bf16 = ceil["hbm_bytes_per_s"], ceil["fp8_flops"], ceil["bf16_flops"]
    print(common.describe(ceil), flush=True)
    rows, sweeps = [], []
    for kind in ("mxfp4", "fp8_row"):
        for b in DECODE:
            r = {"regime": "decode", "keys": kind, "batch": b, **time_decode(kind, b, None, not a.quick)}
            r["pct_hbm"] = 100 * r["logits_bytes"] / (r["logits_us"] * 1e-6) / hbm
            rows.append(r)
            print(f"decode {kind:<8} B={b:<3} logits {r['logits_us']:7.1f} us ({r['pct_hbm']:4.1f}% HBM)  select "
                  f"{r['select_us']:7.1f} us  both {r['both_us']:7.1f} us  ref {r['reference_us']:9.1f} us  rows "
                  f"{r['rows_identical']}/{r['rows']} recall {r['recall']:.4f}", flush=True)
            if a.sweep and b == 1:
                for cfg in DECODE_SWEEP:
                    try:
                        s = time_decode(kind, b, cfg, False)
                    except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
                        sweeps.append({"keys": kind, "batch": b, "config": asdict(cfg), "error": repr(exc)[:200]})
                        continue
                    sweeps.append({"keys": kind, "batch": b, "config": asdict(cfg), **s})
                    print(f"  sweep {cfg}: logits {s['logits_us']:.1f} select {s['select_us']:.1f} both "
                          f"{s['both_us']:.1f} us", flush=True)
        for fp8_q in ((False, True) if kind == "fp8_row" else (False,)):
            r = {"regime": "prefill", "keys": kind, "fp8_queries": fp8_q, "T": PREFILL_T,
                 **time_prefill(kind, fp8_q, None)}
            r["pct_fp8"] = 100 * r["TFLOP_per_s"] * 1e12 / fp8
            r["pct_bf16"] = 100 * r["TFLOP_per_s"] * 1e12 / bf16
            rows.append(r)
            print(f"prefill {kind:<8} q {'fp8' if fp8_q else 'bf16'}: logits {r['logits_ms']:.3f} ms "
                  f"{r['TFLOP_per_s']:.0f} TFLOP/s ({r['pct_fp8']:.1f}% FP8, {r['pct_bf16']:.1f}% bf16)  logits+select "
                  f"{r['both_ms']:.3f} ms  rows {r['rows_identical']}/{r['rows']} recall {r['recall']:.4f}", flush=True)
            if a.sweep:
                for cfg in PREFILL_SWEEP:
                    try:
                        s = time_prefill(kind, fp8_q, cfg)
                    except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
                        sweeps.append({"keys": kind, "fp8_queries": fp8_q, "config": asdict(cfg), "error": repr(exc)})
                        continue
                    sweeps.append({"keys": kind, "fp8_queries": fp8_q, "config": asdict(cfg), **s})
                    print(f"  sweep {cfg}: {s['TFLOP_per_s']:.0f} TFLOP/s", flush=True)
    common.write_json(a.out, "indexer", {"ceilings": ceil, "H": H, "d": D, "k": K, "ratio": RATIO,
                                         "context": CONTEXT, "entries": E, "targets": {
                                             "decode_b1_us": TARGET_DECODE_US,
                                             "prefill_pct_fp8": TARGET_PREFILL_PCT_FP8},
                                         "rows": rows, "sweeps": sweeps})
    print(f"\nindexer H={H} d={D} top-{K}, {CONTEXT // 1024}K context ({E} entries); {common.describe(ceil)}")
    for r in rows:
        if r["regime"] == "decode":
            ok = "meets" if r["batch"] > 1 or r["both_us"] <= TARGET_DECODE_US else "MISSES"
            print(f"decode  {r['keys']:<8} B={r['batch']:<3} {r['both_us']:8.1f} us/layer "
                  f"(logits {r['logits_us']:.1f} + select {r['select_us']:.1f}), reference {r['reference_us']:.1f} us"
                  + (f"  [{ok} the {TARGET_DECODE_US:.0f} us target]" if r["batch"] == 1 else ""))
        else:
            ok = "meets" if r["pct_fp8"] >= TARGET_PREFILL_PCT_FP8 else "MISSES"
            print(f"prefill {r['keys']:<8} q {'fp8 ' if r['fp8_queries'] else 'bf16'} {r['TFLOP_per_s']:6.0f} TFLOP/s "
                  f"= {r['pct_fp8']:.1f}% FP8 peak [{ok} {TARGET_PREFILL_PCT_FP8:.0f}%]")


if __name__ == "__main__":
    main()
