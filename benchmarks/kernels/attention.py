"""Microbenchmark of the fused sparse attention (ops/kernels/attention.py) at V4-Flash / V4.1-Flash shapes, one GPU.

    python benchmarks/kernels/attention.py [--out DIR] [--quick] [--format v4] [--variants default f64 f32]

Decode: R rows of one token each at 64K context; each token reads its 128 window rows from the ring and 512 compressed
entries (CSA picks out of 16K, or HCA's 512 visible entries), from pools in their stored formats. Achieved GB/s is on the
bytes the step must read (window + entry records, queries, outputs) against the HBM copy ceiling measured in the same
run (issue target: >= 60% at batch 32). Prefill: one 4K-token chunk, TFLOP/s on QK + PV against the bf16 matmul
ceiling (target: >= 35%). Each case is checked against the plain-torch reference first; tile variants are timed side by
side so the committed config can be chosen from one run. Prompt chunks over stored records are staged by default
(ops/kernels/attention_stage.py, its decode timed with the attention, and alone in GB/s), and so are decode launches'
CSA picks over NVFP4 entries (V4.1); the "unstaged" variant decodes in registers everywhere. "staged-picks" stages a
decode launch's window rings and CSA picks in every stored format (`V4SERVE_ATTN_STAGE=picks`).
`--swa` adds window-only layers, `--decode-only` / `--prefill-only` pick the shapes, `--decode-rows` the decode row
counts and `--layers` the layer kinds.
"""

from __future__ import annotations

import argparse
import math

import torch
from common import bench_graph_many, bench_ms, describe, measure_ceilings, write_json

from v4serve.cache.formats import Codec
from v4serve.cache.pool import RowPool
from v4serve.ops import attention as attn
from v4serve.ops.indexer import Entries
from v4serve.ops.kernels import attention as kernel
from v4serve.ops.kernels import attention_stage as stage

H, D, RD, W = 64, 512, 64, 128
CONTEXT, BLOCK = 65536, 256
FORMATS = {"v4": ("v4_fp8", "v4_fp8"), "v41": ("fp8_b32", "nvfp4"), "bf16": ("plain", "plain")}
# Config(heads, rows, dsplit, warps, stages)
VARIANTS = {"default": None, "n16": kernel.Config(16, 16, 4, 4, 1), "n64w8": kernel.Config(16, 64, 4, 8, 1),
            "w8": kernel.Config(16, 32, 4, 8, 1), "d2w8": kernel.Config(16, 32, 2, 8, 1),
            "d8": kernel.Config(16, 32, 8, 4, 1), "s2": kernel.Config(16, 32, 4, 4, 2),
            "h32w8": kernel.Config(32, 32, 4, 8, 1), "h64w8": kernel.Config(64, 32, 4, 8, 1),
            # single decode rows: GPU_CONFIG with explicit KV splits (0 = the one-wave rule: 16 at T=1) and wider
            # D halves, fewer programs to combine
            "hk2": kernel.Config(16, 32, 2, 8, 1, kv_splits=2), "hk4": kernel.Config(16, 32, 2, 8, 1, kv_splits=4),
            "hk8": kernel.Config(16, 32, 2, 8, 1, kv_splits=8), "hk32": kernel.Config(16, 32, 2, 8, 1, kv_splits=32),
            "hd1k8": kernel.Config(16, 32, 1, 8, 1, kv_splits=8), "h32d1k8": kernel.Config(32, 32, 1, 8, 1, kv_splits=8),
            # single rows over staged picks (640 rows a token at 64K): one tile a split (64-row tiles over 10 or 16
            # splits, 32-row ones over 20), or 16-row tiles over 40 (a shorter chain per program)
            "r64k10": kernel.Config(16, 64, 2, 8, 1, kv_splits=10),
            "r64k16": kernel.Config(16, 64, 2, 8, 1, kv_splits=16),
            "r32k20": kernel.Config(16, 32, 2, 8, 1, kv_splits=20),
            "r16k40": kernel.Config(16, 16, 2, 4, 1, kv_splits=40),
            "r32k20w4": kernel.Config(16, 32, 2, 4, 1, kv_splits=20),
            "heads": kernel.GPU_CONFIG,  # the "heads" mode's default (prefill over V4 / V4.1 records until 2026-12-04)
            "unstaged": None,  # the default config with the records decoded in registers at prefill too
            "staged-picks": None}  # decode: the window rings and the CSA picks staged first, then gpu_config's choice
# variants that force the staging of records (ops/kernels/attention_stage.py) off, or on for decode's picks
STAGE = {"unstaged": False, "staged-picks": stage.PICKS}


def flash(heads: int, rows: int, warps: int, stages: int = 1, splits: int = 0, dchunk: int = 128,
          prefetch: int = 0, halves: bool = False) -> kernel.Config:
    """A "flash" mode config (split-KV flash decoding over all heads); splits 0 = by the grid size; halves: two
    programs per token and head block, each owning half of D's outputs (one KV split)."""
    return kernel.Config(heads, rows, 2 if halves else 1, warps, stages, splits, mode="flash", dchunk=dchunk,
                         prefetch=prefetch)


# Flash variants, named f<heads>r<rows>w<warps>[c<dchunk>][s<stages>][k<splits>][p = L2 prefetch]. `--ptxas` (no GPU)
# at V4 CSA, 4 splits: every 64-head variant spills (w16: 128 regs + 1.4-3.2 KB/thread; w8: 255 + 1.0-1.5 KB), the
# 32-head ones (M = 32: mma.sync, not wgmma) hardly (w8: 255 regs + 36-64 B); num_stages 2 compiles to the same code.
FLASH_VARIANTS = {
    "f64r16w16": flash(64, 16, 16), "f64r32w16": flash(64, 32, 16), "f64r16w8": flash(64, 16, 8),
    "f64r32w8": flash(64, 32, 8), "f64r16w16c256": flash(64, 16, 16, dchunk=256),
    "f64r16w16s2": flash(64, 16, 16, stages=2), "f64r16w16p": flash(64, 16, 16, prefetch=1),
    "f64r32w16p": flash(64, 32, 16, prefetch=1), "f64r16w16k2": flash(64, 16, 16, splits=2),
    "f64r16w16k4": flash(64, 16, 16, splits=4), "f64r16w16k8": flash(64, 16, 16, splits=8),
    "f32r32w8": flash(32, 32, 8), "f32r16w4": flash(32, 16, 4), "f32r32w8p": flash(32, 32, 8, prefetch=1),
    # the batched-decode default (FLASH_DECODE_CONFIG: 32 heads, 32 rows, L2 prefetch) with more KV splits than the
    # one-wave rule's (2 at T=32): shorter per-program gather chains against more partials to combine
    "f32r32w8pk4": flash(32, 32, 8, prefetch=1, splits=4), "f32r32w8pk8": flash(32, 32, 8, prefetch=1, splits=8),
    "f32r32w8pk16": flash(32, 32, 8, prefetch=1, splits=16), "f32r16w4pk8": flash(32, 16, 4, prefetch=1, splits=8),
    "f32r16w8pk8": flash(32, 16, 8, prefetch=1, splits=8),
    # output halves (suffix h: dsplit 2, _flash_tile_half): 64 heads on wgmma with half the accumulators. `--ptxas`
    # at bf16 CSA (twenty-first session): r16 236 registers, no spills; r32 255 + 48 B; r64 255 + 488 B; c256 r32
    # 255 + 244 B
    "f64r16w8h": flash(64, 16, 8, halves=True), "f64r32w8h": flash(64, 32, 8, halves=True),
    "f64r16w8hp": flash(64, 16, 8, prefetch=1, halves=True), "f64r32w8hp": flash(64, 32, 8, prefetch=1, halves=True),
    "f64r64w8h": flash(64, 64, 8, halves=True), "f64r16w8hc256": flash(64, 16, 8, dchunk=256, halves=True),
    # 16 heads a program on 4 warps (mma.sync): a quarter of the registers, several programs an SM to overlap the
    # gathers' latency, for each record read by four head blocks (from L2 after the first)
    "f16r32w4": flash(16, 32, 4), "f16r64w4": flash(16, 64, 4), "f16r32w4p": flash(16, 32, 4, prefetch=1),
    "f16r64w4p": flash(16, 64, 4, prefetch=1), "f16r32w4s2": flash(16, 32, 4, stages=2),
    "f16r32w4c256": flash(16, 32, 4, dchunk=256), "f16r32w4c512": flash(16, 32, 4, dchunk=512),
    "f32r32w4p": flash(32, 32, 4, prefetch=1), "f32r64w8p": flash(32, 64, 8, prefetch=1),
    # 16 warps on one program: more of the gathers in flight per SM, 128 registers a thread at most
    "f32r32w16p": flash(32, 32, 16, prefetch=1), "f32r64w16p": flash(32, 64, 16, prefetch=1),
    "f64r32w16hp": flash(64, 32, 16, prefetch=1, halves=True), "f64r64w16hp": flash(64, 64, 16, prefetch=1, halves=True),
    "f64r64w16h": flash(64, 64, 16, halves=True),
    # around the prefill default (FLASH_PREFILL_CONFIG = f32r64w8p): no prefetch, 128-row tiles, 16 heads on 8 warps
    "f32r64w8": flash(32, 64, 8), "f32r128w8p": flash(32, 128, 8, prefetch=1), "f16r64w8": flash(16, 64, 8),
    "f16r128w8": flash(16, 128, 8), "f32r64w8c256p": flash(32, 64, 8, dchunk=256, prefetch=1),
}
# twopass mode (attention_twopass.py: scores, softmax, P.V over a scratch), named t<rows>c<dchunk>w<warps>. `--ptxas`-
# like sm_90a compiles at bf16 CSA (twenty-first session): every kernel on wgmma, no spills; scores 139-240 registers,
# P.V 98-180
TWOPASS_VARIANTS = {f"t{r}c{c}w{w}": kernel.Config(64, r, 1, w, 1, mode="twopass", dchunk=c)
                    for r, c, w in ((64, 128, 4), (64, 128, 8), (32, 128, 4), (64, 256, 8), (128, 128, 8))}
FLASH_VARIANTS.update(TWOPASS_VARIANTS)
VARIANTS.update(FLASH_VARIANTS)


def ptxas_report(variants: dict, fmt: str = "v4_fp8", cmode: int = kernel.PICKED, nsplit: int = 4) -> None:
    """No GPU needed: compile each flash variant's kernel for sm_90a at the V4 geometry (the specialisations a real
    launch gets: 16-divisible pointers and strides, the 584-B record stride divisible by 8) and print ptxas's
    registers / spills and Triton's shared memory."""
    import os
    import subprocess
    import tempfile

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel._flash_kernel
    names = fn.arg_names
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    types = {"q_ptr": "*bf16", "qp_ptr": "*bf16", "fresh_ptr": "*bf16", "out_ptr": "*bf16", "cos_ptr": "*fp32",
             "sin_ptr": "*fp32", "sink_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32", "wh16_ptr": "*bf16",
             "ch16_ptr": "*bf16", "wu8_ptr": "*u8", "cu8_ptr": "*u8", "wval_ptr": "*u8", "cval_ptr": "*u8",
             "scale_hi": "fp32", "scale_lo": "fp32", "eps": "fp32"}
    div16 = {"stride_qt", "stride_qh", "stride_ct", "stride_ft", "stride_ot", "stride_oh", "bt_stride", "pick_stride",
             "H", "RW", "n_picks", "block_size", "epb", "trash_block"}
    record = Codec(fmt, D, RD, torch.bfloat16).record_bytes
    for name, cfg in variants.items():
        if cfg is None or cfg.mode != "flash":
            continue
        dc, ds = kernel.flash_chunks(cfg, D)
        consts = {"D": D, "RD": RD, "W": W, "BH": cfg.heads, "BN": cfg.rows, "DC": dc, "DS": ds,
                  "NSPLIT": 1 if ds == 2 else nsplit,
                  "WFMT": kernel.FORMATS[fmt], "CFMT": kernel.FORMATS[fmt], "CMODE": cmode, "QNORM": True,
                  "DT": tl.bfloat16, "ACC": tl.float32, "HALF": True, "INTERPRET": False,
                  "PREFETCH": bool(cfg.prefetch), "WNL": kernel._lines(record), "CNL": kernel._lines(record),
                  "WAL": math.gcd(record, 16), "CAL": math.gcd(record, 16)}
        sig = {n: "constexpr" if n in consts else types.get(n, "*i64" if n.endswith("_ptr") else "i32")
               for n in names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if n not in consts and (n.endswith("_ptr") or n in div16)}
        src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
        try:
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
        except Exception as e:  # noqa: BLE001 - a config the compiler rejects
            print(f"{name:14s} failed ({type(e).__name__}: {e})"[:300], flush=True)
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ck.asm["ptx"])
            f.flush()
            r = subprocess.run([ptxas, "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True,
                               check=False)
        info = [ln.split(":", 1)[-1].strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
        print(f"{name:14s} smem {ck.metadata.shared:6d} B, wgmma {'wgmma' in ck.asm['ptx']}: {'; '.join(info)}",
              flush=True)


def pool(kind: str, rows: int) -> RowPool:
    codec = Codec(kind, D, RD, torch.bfloat16)
    p = RowPool(codec, rows, "cuda")
    for lo in range(0, rows + 1, 1 << 16):
        hi = min(rows + 1, lo + (1 << 16))
        p.data[lo:hi] = codec.encode(torch.randn(hi - lo, D, device="cuda"))
    return p


def case(wkind: str, ckind: str, rows: int, tokens_per_row: int, layer: str, copies: int = 1):
    """Rows at CONTEXT with their last `tokens_per_row` positions in this step; CSA picks, HCA dense entries or
    (swa) the window alone."""
    dense = layer == "hca"
    ratio = 128 if dense else 4
    T = rows * tokens_per_row
    ring = pool(wkind, rows * W)
    ring_rows = torch.randperm(rows * W, device="cuda")
    r = torch.arange(rows, device="cuda").repeat_interleave(tokens_per_row)
    pos = CONTEXT - tokens_per_row + torch.arange(T, device="cuda") % tokens_per_row
    k = torch.arange(W, device="cuda")
    p = pos.unsqueeze(1) - (W - 1) + k
    start = CONTEXT - tokens_per_row
    fresh_idx = r.unsqueeze(1) * tokens_per_row + (p - start)
    src = torch.where(p >= start, rows * W + fresh_idx, r.unsqueeze(1) * W + p % W)
    window = attn.WindowRefs(ring, src, torch.ones(T, W, dtype=torch.bool, device="cuda"), ring_rows)
    entries_per_row = CONTEXT // ratio
    blocks_per_row = CONTEXT // BLOCK
    comp = pool(ckind, rows * entries_per_row)
    visible = torch.div(pos + 1, ratio, rounding_mode="floor")
    variants = []  # rotations of block tables (and picks): each call reads other rows of the pools than the last
    for _ in range(copies):
        bt = torch.randperm(rows * blocks_per_row, device="cuda").view(rows, blocks_per_row)
        picks = None
        if not dense:
            picks = torch.rand(T, entries_per_row, device="cuda").argsort(dim=1)[:, :512].contiguous()
        where = Entries(bt, r, visible, ratio, BLOCK, rows * blocks_per_row, entries_per_row)
        variants.append(attn.EntryRefs(comp, where, picks) if layer != "swa" else None)
    entries = variants[0]
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    fresh = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, RD, 2, dtype=torch.float32, device="cuda") / RD))
    ang = pos.float().unsqueeze(1) * freqs
    sink = torch.randn(H, device="cuda")
    n_entries = 0 if layer == "swa" else 512 if not dense else int(visible.max())
    read = T * (W * ring.codec.record_bytes + n_entries * comp.codec.record_bytes) + 2 * q.numel() * 2
    flops = 4 * T * H * D * (W + n_entries)
    args = (q, ang.cos(), ang.sin(), fresh, sink, D ** -0.5, None, window)
    return [args + (e,) for e in variants], read, flops


def stage_row(fname: str, layer: str, args: tuple, hbm: float) -> dict:
    """The staging alone (ops/kernels/attention_stage.py) for a prompt chunk's arguments: the records it reads and the
    rows it writes, in GB/s against the same-run HBM copy ceiling."""
    q, window, entries = args[0], args[7], args[8]
    if not stage.wanted(q.shape[0], window, entries, q.dtype, q.device):
        return {"format": fname, "layer": layer, "phase": "stage", "variant": "not taken"}
    rec = window.pool.codec.record_bytes * window.ring_rows.shape[0] if window.pool.codec.kind != "plain" else 0
    if entries is not None and entries.pool.codec.kind != "plain":
        bt = entries.where.block_table
        rec += entries.pool.codec.record_bytes * bt.shape[0] * bt.shape[1] * entries.where.per_block
    moved = rec + stage.staged_bytes(window, entries, q.dtype)
    ms = bench_ms(lambda: stage.stage(window, entries, q.dtype))
    row = {"format": fname, "layer": layer, "phase": "stage", "variant": "stage", "ms": ms,
           "gb_s": moved / ms / 1e6, "pct_hbm": moved / ms / 1e-3 / hbm * 100}
    print(f"{fname:15s} {layer} staging  {ms * 1e3:9.1f} us  {moved / 1e6:8.1f} MB read + written  "
          f"{row['gb_s']:7.0f} GB/s ({row['pct_hbm']:5.1f}% HBM)", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default config only")
    ap.add_argument("--variants", nargs="*", default=None,
                    help="time only the variants whose names start with one of these (e.g. default f64)")
    ap.add_argument("--flash-prefill", action="store_true",
                    help="also time the flash variants (decode-oriented) on the 4K prefill")
    ap.add_argument("--format", choices=sorted(FORMATS), action="append",
                    help="record formats to time (default: all; a CUDA fault ends the process, so the session script "
                         "runs one format per process)")
    ap.add_argument("--prefill-only", action="store_true", help="only the 4K prefill chunk (implies --flash-prefill)")
    ap.add_argument("--decode-only", action="store_true", help="only the decode rows (--decode-rows)")
    ap.add_argument("--swa", action="store_true", help="also time window-only layers (V4.1's first two)")
    ap.add_argument("--decode-rows", default="1,32,64", help="decode rows (one token each) to time, comma-separated")
    ap.add_argument("--layers", default="", help="only these layer kinds, comma-separated (csa, hca, swa)")
    ap.add_argument("--ptxas", action="store_true",
                    help="no GPU: compile the chosen flash variants for sm_90a and print registers / spills / smem")
    args = ap.parse_args()
    chosen = VARIANTS
    if args.quick:
        chosen = {"default": None}
    elif args.variants:
        chosen = {k: v for k, v in VARIANTS.items() if any(k.startswith(p) for p in args.variants)}
    if args.ptxas:
        ptxas_report(chosen, FORMATS[args.format[0]][1] if args.format else "v4_fp8")
        return
    ceil = measure_ceilings()
    print(describe(ceil), flush=True)
    hbm, bf16 = ceil["hbm_bytes_per_s"], ceil["bf16_flops"]
    rows = []
    shapes = [("decode", int(r), 1) for r in args.decode_rows.split(",")] + [("prefill", 1, 4096)]
    if args.prefill_only:
        shapes, args.flash_prefill = shapes[-1:], True
    elif args.decode_only:
        shapes = shapes[:-1]
    flash_only = all(v is not None and v.mode != "heads" for v in chosen.values())
    for fname, (wkind, ckind) in FORMATS.items():
        if args.format and fname not in args.format:
            continue
        for layer in ("csa", "hca") + (("swa",) if args.swa else ()):
            if args.layers and layer not in args.layers.split(","):
                continue
            for phase, R, tpr in shapes:
                if (args.quick and phase == "decode" and R == 64) or (
                        flash_only and phase == "prefill" and not args.flash_prefill):
                    continue
                many, read, flops = case(wkind, ckind, R, tpr, layer, 8 if phase == "decode" else 1)
                a = many[0]
                ref = attn.attend_reference(*a)
                got = kernel.attend(*a)
                scale = ref.float().abs().max()
                err0 = float((got.float() - ref.float()).abs().max() / scale)
                if phase == "prefill":
                    rows.append(stage_row(fname, layer, a, hbm))
                for vname, cfg in chosen.items():
                    if phase == "prefill" and (STAGE.get(vname) == stage.PICKS or (
                            cfg is not None and cfg.mode != "heads" and not args.flash_prefill)):
                        continue
                    try:
                        err = err0
                        st = STAGE.get(vname)
                        if cfg is not None or st is not None:  # every variant is checked, not only the default
                            err = float((kernel.attend(*a, config=cfg, stage=st).float() - ref.float()).abs().max()
                                        / scale)
                        fns = [lambda b=b: kernel.attend(*b, config=cfg, stage=st) for b in many]
                        ms = bench_graph_many(fns) if phase == "decode" else bench_ms(fns[0])
                    except Exception as e:  # noqa: BLE001 - a config the compiler rejects
                        print(f"{fname} {layer} {phase} R={R} {vname}: failed ({type(e).__name__}: {e})"[:200])
                        continue
                    row = {"format": fname, "layer": layer, "phase": phase, "rows": R, "tokens": R * tpr,
                           "variant": vname, "ms": ms, "gb_s": read / ms / 1e6, "pct_hbm": read / ms / 1e-3 / hbm * 100,
                           "tflops": flops / ms / 1e9, "pct_bf16": flops / ms / 1e-3 / bf16 * 100, "rel_err": err}
                    rows.append(row)
                    print(f"{fname:15s} {layer} {phase:7s} T={R * tpr:5d} {vname:14s} {ms * 1e3:9.1f} us "
                          f"{row['gb_s']:7.0f} GB/s ({row['pct_hbm']:5.1f}% HBM) {row['tflops']:6.1f} TFLOP/s "
                          f"({row['pct_bf16']:5.1f}% bf16)  err {err:.1e}", flush=True)
                if phase == "decode" and R == 32:
                    ms_ref = bench_ms(lambda: attn.attend_reference(*a))
                    print(f"{'':15s} reference (torch gathers) {ms_ref * 1e3:9.1f} us", flush=True)
                del a, many
                torch.cuda.empty_cache()
    write_json(args.out, "attention-" + "-".join(args.format or ["all"]), {"ceilings": ceil, "rows": rows})


if __name__ == "__main__":
    main()
