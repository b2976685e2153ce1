"""Routed experts over FP4 stacks (ops/kernels/moe.py) vs the plain-torch reference on one GPU, V4-Flash shapes.

    python benchmarks/kernels/moe.py --out DIR [--quick]

D=4096, I=2048, E=256, k=6, bf16 x, act_group 128, routing weight before W2, SwiGLU limit 10. Weights are random
FP4 codes with e8m0 scales near 2^-7 (256 experts x 12.6 MB = 3.2 GB). Decode (T = 1, 8, 32, 64, random routing)
is timed from a CUDA graph of ROUTINGS calls on different routings (more expert bytes than the 60 MB L2), divided
by ROUTINGS; bytes = distinct experts hit x (packed w1+w2+w3 + their scales) + x and the output, per call; at one
token x's FP8 simulation is made before the timed calls and handed over, as the step's router does (then the calls
launch no sort: since the thirty-fourth session; before, T=1 included the sort launch, "align only"). Prefill
(T = 8192) is timed eagerly (`common.bench_ms`); FLOPs = 2 T k 3 D I. Every config variant is timed; the kernel's
output is first compared with the reference at two decode sizes (T=1 splits K) and one prefill size, and (unless
--quick) every decode variant's at each T (rel_err in its row). --compile-only builds the decode variants for sm_90
with ptxas on any machine (no GPU; without TRITON_INTERPRET) and prints registers, spills, shared memory, the MMA and
the K loop's SASS instructions a warp.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path

import common
import torch

from v4serve.ops import moe, quant
from v4serve.ops.kernels import moe as mk

E, D, I, K = 256, 4096, 2048, 6
ACT_GROUP, LIMIT, BEFORE = 128, 10.0, True
DECODE, PREFILL = (1, 8, 32, 64), (8192,)
ROUTINGS = 8
EXPERT_BYTES = 3 * (I * D // 2 + I * D // 32)  # w1, w2, w3 packed + e8m0 scales

G = mk.GemmConfig
CONFIG_DEVICE: torch.device | None = torch.device("cuda")  # its SM count sizes split-K (None: 132, --compile-only)


def auto(t: int) -> mk.MoeConfig:
    return mk.select_config(t * K, E, D, I, CONFIG_DEVICE, act_group=ACT_GROUP)


def fp8_variant(block_m: int, gate_up: mk.GemmConfig, down: mk.GemmConfig | None = None, fold: str = ""):
    """A prefill variant on the fp8 body: gate-up and down tiles (down = gate-up's unless given), GROUP_M 8."""
    return lambda t: mk.MoeConfig(block_m, gate_up, down or gate_up, group_m=8, body="fp8", fold=fold)


def with_split(cfg: mk.MoeConfig, up: int, down: int) -> mk.MoeConfig:
    return replace(cfg, gate_up=replace(cfg.gate_up, split_k=up), down=replace(cfg.down, split_k=down))


def tweak(t: int, gu: dict | None = None, dn: dict | None = None, **moe_fields) -> mk.MoeConfig:
    """The default config at T with GemmConfig fields replaced in the gate-up (gu) and the down (dn), and MoeConfig
    fields in moe_fields."""
    cfg = auto(t)
    return replace(cfg, gate_up=replace(cfg.gate_up, **(gu or {})), down=replace(cfg.down, **(dn or {})),
                   **moe_fields)


def body(t: int, name: str, block_m: int | None = None, **tile) -> mk.MoeConfig:
    """`mk.decode_config` for a body (swap / fma), with GemmConfig fields overridden in both GEMMs."""
    cfg = mk.decode_config(t * K, E, D, I, name, block_m, CONFIG_DEVICE)
    return replace(cfg, gate_up=replace(cfg.gate_up, **tile), down=replace(cfg.down, **tile))


def fit(t: int, gu: mk.GemmConfig, dn: mk.GemmConfig | None, gu_per_sm: int, dn_per_sm: int) -> mk.MoeConfig:
    """Tiles (dn None: the default's) with K shares sized to fill gu_per_sm / dn_per_sm CTAs an SM (0: the default
    split) at T tokens (row blocks of 16: about the experts hit x their rows' blocks, as `mk.decode_config`)."""
    base = auto(t)
    dn = dn or base.down
    hit = min(E, t * K)
    rows_per_expert = -(-t * K // hit)
    blocks = hit * -(-rows_per_expert // 16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if CONFIG_DEVICE else 132

    def split(g: mk.GemmConfig, n: int, k: int, per_sm: int, default: int) -> int:
        if not per_sm:
            return default
        return max(1, min(8, per_sm * sms // (blocks * -(-n // g.block_n)), k // g.block_k // 4))

    return mk.MoeConfig(16, replace(gu, split_k=split(gu, I, D, gu_per_sm, base.gate_up.split_k)),
                        replace(dn, split_k=split(dn, D, I, dn_per_sm, base.down.split_k)))


# name -> T -> config (None: experts_forward's own choice)
VARIANTS = {
    "decode": {
        "default": lambda t: None,
        "bits": lambda t: replace(auto(t), dequant="bits"),
        # gate-up split-K summed by `_swiglu_kernel` (one launch more) instead of each tile's last program
        "launch": lambda t: replace(auto(t), finish="launch"),
        "no-split": lambda t: mk.DECODE,
        "s2/1": lambda t: with_split(auto(t), 2, 1),  # K shares where few experts leave the grid short (E=16, T=32)
        "s2/2": lambda t: with_split(auto(t), 2, 2),
        "s3/2": lambda t: with_split(auto(t), 3, 2),
        "mid": lambda t: mk.MID,
        "split8/4": lambda t: with_split(mk.DECODE, 8, 4),
        "k64s6": lambda t: with_split(mk.MoeConfig(16, G(128, 64, 4, 6), G(128, 64, 4, 6)),
                                      auto(t).gate_up.split_k, auto(t).down.split_k),
        "up-n64": lambda t: mk.MoeConfig(16, G(64, 128, 4, 4), G(128, 128, 4, 3)),  # h quantized in the down load
        "dn-n64": lambda t: mk.MoeConfig(16, G(128, 128, 4, 3), G(64, 128, 4, 4)),
        "w8": lambda t: with_split(mk.MoeConfig(16, G(128, 128, 8, 3), G(128, 128, 8, 3)),
                                   auto(t).gate_up.split_k, auto(t).down.split_k),
        # occupancy (ncu, T=1: gate-up 168 registers with spills -> 3 CTAs an SM, 2.7 warps a scheduler, one issue
        # per 6.7 cycles; down 72 registers but 2.9 CTAs an SM for want of programs): smaller tiles, fewer
        # registers, K shares sized to the CTAs an SM then holds (`fit`)
        # the decode gate-up's register cap (row copies took ptxas to 184: 2 CTAs an SM): "regs168" is the default
        # since 48ce6ca (kept: gpu_session.sh fortyfirst1/2/4 timed it against the uncapped rows), "gu-rows-free"
        # the uncapped form
        "regs168": lambda t: tweak(t, gu=dict(max_regs=168)),
        "gu-rows-free": lambda t: tweak(t, gu=dict(max_regs=0)),
        # the narrow down (row copies uncapped, the default since the forty-second session; "nw-dn-rows" is it) with
        # its old [BN, BK/32, 16] copies: capped at 96 registers as before ("nw-dn-old"), or uncapped
        "nw-dn-old": lambda t: tweak(t, dn=dict(row_loads=False, max_regs=96)),
        "nw-dn-free": lambda t: tweak(t, dn=dict(row_loads=False, max_regs=0)),
        "nw-dn-rows": lambda t: tweak(t, dn=dict(row_loads=True, max_regs=0)),
        "nw-rows": lambda t: tweak(t, gu=dict(row_loads=True), dn=dict(row_loads=True)),
        # the decode tiles' copies as before 48ce6ca ([BN, BK/32, 16], no register cap), in both GEMMs or the
        # gate-up's alone (V4's one token, 16 experts: 65.7 / 64.8 us against 60.5 with rows, forty-second session)
        "norows": lambda t: tweak(t, gu=dict(row_loads=False, max_regs=0), dn=dict(row_loads=False, max_regs=0)),
        "gu-norows": lambda t: tweak(t, gu=dict(row_loads=False, max_regs=0)),
        # more FP4 bytes in flight an SM (ncu, forty-second session: the batch-32 gate-up's top stall is the loop top's
        # wait for its async copies, 3 CTAs x 2 tiles ahead): deeper pipelines on two CTAs (uncapped registers), or
        # 64-deep K tiles on 3-4 CTAs (with the scale bytes ahead: "a")
        "gu-2cta-s5": lambda t: tweak(t, gu=dict(max_regs=0, num_stages=5)),
        "gu-2cta-s4": lambda t: tweak(t, gu=dict(max_regs=0, num_stages=4)),
        "gu-k64s6": lambda t: tweak(t, gu=dict(block_k=64, num_stages=6, max_regs=0)),
        "gu-k64s6a": lambda t: tweak(t, gu=dict(block_k=64, num_stages=6, max_regs=0), ahead=True),
        "gu-k64s5-r128": lambda t: tweak(t, gu=dict(block_k=64, num_stages=5, max_regs=128)),
        # weight rows past N masked in every load instead of clamped (`GemmConfig.clamp_rows`, the default since the
        # forty-second session; untimed: sm_90 SASS only)
        "masked": lambda t: tweak(t, gu=dict(clamp_rows=False), dn=dict(clamp_rows=False)),
        "dn-s4": lambda t: with_split(auto(t), auto(t).gate_up.split_k, 2 * auto(t).down.split_k),
        "gu-n64k64": lambda t: fit(t, G(64, 64, 4, 4), None, 6, 0),
        "gu-n64k64-dn7": lambda t: fit(t, G(64, 64, 4, 4), G(128, 128, 4, 3), 6, 7),
        "gu-n64k64s3": lambda t: fit(t, G(64, 64, 4, 3), None, 6, 0),
        "gu-n64k64s6": lambda t: fit(t, G(64, 64, 4, 6), None, 6, 0),
        "gu-k64": lambda t: fit(t, G(128, 64, 4, 4), None, 4, 0),
        "gu-n64": lambda t: fit(t, G(64, 128, 4, 3), None, 4, 0),
        "gu-n64k64-dn64": lambda t: fit(t, G(64, 64, 4, 4), G(64, 128, 4, 3), 6, 5),
        "gu-n32k64": lambda t: fit(t, G(32, 64, 4, 4), None, 8, 0),
        # around the narrow tiles (V4.1's one row an expert, mk.NARROW_*: 64 x 64 gate-up for 6 CTAs an SM, 64 x 128
        # down for 5): narrower or shallower down tiles, two warps a CTA, deeper gate-up pipelines, more K shares
        "nw-dn-k64": lambda t: fit(t, G(64, 64, 4, 4), G(64, 64, 4, 4), 6, 6),
        "nw-dn-n32": lambda t: fit(t, G(64, 64, 4, 4), G(32, 128, 4, 3), 6, 8),
        "nw-w2": lambda t: fit(t, G(64, 64, 2, 4), G(64, 128, 2, 3), 8, 8),
        "nw-gu-s6": lambda t: fit(t, G(64, 64, 4, 6), G(64, 128, 4, 3), 6, 5),
        "nw-split": lambda t: fit(t, G(64, 64, 4, 4), G(64, 128, 4, 3), 8, 7),
        # the narrow tiles with each K tile's scale bytes loaded an iteration ahead (MoeConfig.ahead): under 4 bytes a
        # thread they are no async copy, so each iteration waits for them (compile-only: "sync-loads")
        "nw-ahead": lambda t: replace(fit(t, G(64, 64, 4, 4), G(64, 128, 4, 3), 6, 5), ahead=True),
        "nw-ahead-dn-k64": lambda t: replace(fit(t, G(64, 64, 4, 4), G(64, 64, 4, 4), 6, 6), ahead=True),
        # with every K-loop load an async copy (EVEN_K): deeper pipelines, wider K tiles
        "s4": lambda t: with_split(mk.MoeConfig(16, G(128, 128, 4, 4), G(128, 128, 4, 4)),
                                   auto(t).gate_up.split_k, auto(t).down.split_k),
        "k256s2": lambda t: with_split(mk.MoeConfig(16, G(128, 256, 4, 2), G(128, 256, 4, 2)),
                                       max(1, auto(t).gate_up.split_k // 2), max(1, auto(t).down.split_k // 2)),
        # the decode bodies (ops/kernels/moe_decode.py): swap = W @ x^T (wgmma, the weight from registers), fma =
        # no tensor cores, 1-8 rows per block (a weight row per thread)
        "swap": lambda t: body(t, "swap"),
        "swap-n64": lambda t: body(t, "swap", block_n=64),
        "swap-k64s4": lambda t: body(t, "swap", block_k=64, num_stages=4),
        "swap-n256w8": lambda t: body(t, "swap", block_n=256, num_warps=8),
        "swap-s4": lambda t: body(t, "swap", num_stages=4),
        "swap-w8": lambda t: body(t, "swap", num_warps=8),
        # fp8 = W4A8: FP4 bytes -> e4m3 in registers, FP8 wgmma per 32-group with both scales on the product
        "fp8": lambda t: body(t, "fp8"),
        "fp8-k64s4": lambda t: body(t, "fp8", block_k=64, num_stages=4),
        "fp8-s4": lambda t: body(t, "fp8", num_stages=4),
        "fp8-w8": lambda t: body(t, "fp8", num_warps=8),
        "fp8-n256w8": lambda t: body(t, "fp8", block_n=256, num_warps=8),
        "fma": lambda t: body(t, "fma"),  # block_m from the rows per expert hit
        "fma-m1": lambda t: body(t, "fma", 1),
        "fma-m1-k128w4": lambda t: body(t, "fma", 1, block_n=128, block_k=128, num_warps=4),
        "fma-m1-s5": lambda t: body(t, "fma", 1, num_stages=5),
        "fma-m2": lambda t: body(t, "fma", 2),
        "fma-m4": lambda t: body(t, "fma", 4),
        "fma-m4-k64": lambda t: body(t, "fma", 4, block_k=64),
        "fma-m8": lambda t: body(t, "fma", 8),
    },
    "prefill": {
        "default": lambda t: None,
        "dot": lambda t: mk.PREFILL,
        # bf16 copies of the experts and torch's grouped GEMM (moe_grouped.py; over its scratch budget: dot)
        "pf-grouped": lambda t: mk.PREFILL_CONFIGS["grouped"],
        "bits": lambda t: replace(mk.PREFILL, dequant="bits"),
        "m128k128s2": lambda t: mk.MoeConfig(128, G(128, 128, 8, 2), G(128, 128, 8, 2), group_m=8),
        "m64n128k64": lambda t: mk.MoeConfig(64, G(128, 64, 4, 3), G(128, 64, 4, 3), group_m=8),
        "m64n128k128w8": lambda t: mk.MoeConfig(64, G(128, 128, 8, 3), G(128, 128, 8, 3), group_m=8),
        "m128-dn-n256": lambda t: mk.MoeConfig(128, G(128, 64, 8, 3), G(256, 64, 8, 3), group_m=8),
        "mid": lambda t: mk.MID,
        # W4A8 on the FP8 tensor cores (moe_decode.py's fp8 body: FP4 -> e4m3 in registers, per-32-group weight scales
        # on each group's partial product) with prefill tiles, against the bf16 W4A16 default (12% of the FP8 peak)
        "pf-fp8": lambda t: replace(mk.PREFILL, body="fp8"),
        "pf-fp8-k128": lambda t: mk.MoeConfig(128, G(128, 128, 8, 3), G(128, 128, 8, 3), group_m=8, body="fp8"),
        "pf-fp8-m64": lambda t: mk.MoeConfig(64, G(128, 64, 4, 3), G(128, 64, 4, 3), group_m=8, body="fp8"),
        "pf-fp8-n64": lambda t: mk.MoeConfig(128, G(64, 64, 4, 3), G(64, 64, 4, 3), group_m=8, body="fp8"),
        # the fp8 body's fold (MoeConfig.fold): a 128-wide K tile inside one 1 x 128 activation group as ONE FP8 wgmma
        # over weights whose 32-group scales are folded into the e4m3 exponents, the scales applied once a tile (the
        # per-group form above waits for each 32-group's wgmma before its scale FMAs). Gate-up N tiles stay >= 128 (h's
        # 1 x 128 groups quantized in its epilogue)
        "pf-fp8f": fp8_variant(128, G(128, 128, 8, 3), fold="tile"),
        "pf-fp8f-s4": fp8_variant(128, G(128, 128, 8, 4), fold="tile"),
        "pf-fp8f-s2": fp8_variant(128, G(128, 128, 8, 2), fold="tile"),
        "pf-fp8f-m64": fp8_variant(64, G(128, 128, 8, 3), fold="tile"),
        "pf-fp8f-dn256": fp8_variant(128, G(128, 128, 8, 3), G(256, 128, 8, 3), fold="tile"),
        "pf-fp8f-w16": fp8_variant(128, G(128, 128, 16, 3), G(128, 128, 8, 3), fold="tile"),
        "pf-fp8f-m64-s2": fp8_variant(64, G(128, 128, 8, 2), fold="tile"),
        "pf-fp8f-m64-w4": fp8_variant(64, G(128, 128, 4, 3), fold="tile"),
        "pf-fp8f-m32": fp8_variant(32, G(128, 128, 4, 3), fold="tile"),
        "pf-fp8f-k64": fp8_variant(128, G(128, 64, 8, 3), fold="tile"),
        "pf-fp8f-m64-k64": fp8_variant(64, G(128, 64, 8, 3), G(128, 128, 8, 3), fold="tile"),
        # the per-group fp8 body on smaller blocks (V4.1: 1 x 32 activation groups, the fold does not apply; at
        # 128-row blocks its gate-up spills 1.6 KB a thread, sm_90 ptxas)
        "pf-fp8-m32": fp8_variant(32, G(128, 64, 4, 3)),
        "pf-fp8-m64-k32": fp8_variant(64, G(128, 32, 8, 4)),
        "pf-fp8-m64w8": fp8_variant(64, G(128, 64, 8, 3)),
        # the fold's "group" form: the groups' dots chained, a group converted at a time
        "pf-fp8g": fp8_variant(128, G(128, 128, 8, 3), fold="group"),
        "pf-fp8g-m64": fp8_variant(64, G(128, 128, 8, 3), fold="group"),
        "pf-fp8g-m64-s2": fp8_variant(64, G(128, 128, 8, 2), fold="group"),
        "pf-fp8g-m64-k64": fp8_variant(64, G(128, 64, 8, 3), G(128, 128, 8, 3), fold="group"),
    },
}
# every K-share pair "sU/D" (gate-up U, down D) on the default tiles: the split rule against the grid's waves
for _u in (1, 2, 3, 4, 5, 6, 8):
    for _d in (1, 2, 3, 4):
        VARIANTS["decode"].setdefault(f"s{_u}/{_d}", lambda t, u=_u, d=_d: with_split(auto(t), u, d))


def make_experts() -> moe.ExpertWeights:
    def stack(out_f: int, in_f: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.randint(0, 256, (E, out_f, in_f // 2), dtype=torch.uint8, device="cuda")
        s = torch.randint(119, 123, (E, out_f, in_f // 32), dtype=torch.uint8, device="cuda")
        return w, s

    (w1, s1), (w3, s3), (w2, s2) = stack(I, D), stack(I, D), stack(D, I)
    return moe.ExpertWeights(w1, w2, w3, s1, s2, s3, 128)


def routing(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.rand(t, E, device="cuda", generator=g).argsort(-1)[:, :K]
    w = torch.rand(t, K, device="cuda", generator=g)
    return w / w.sum(-1, keepdim=True), ids


def inputs(t: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(t, D, device="cuda", generator=g).bfloat16(), *routing(t, seed)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).abs().max() / ref.abs().max()).item()


def validate(ex: moe.ExpertWeights, t: int) -> dict[str, float]:
    """Relative error vs the reference of the default config and of the portable dequant."""
    x, w, ids = inputs(t, seed=100 + t)
    ref = moe.experts_reference(x, ex, w, ids, LIMIT, ACT_GROUP, BEFORE)
    errs = {}
    for dq in ("auto", "bits"):
        cfg = replace(auto(t), dequant=dq)
        try:
            errs[dq] = rel_err(mk.experts_forward(x, ex, w, ids, LIMIT, ACT_GROUP, BEFORE, cfg), ref)
        except Exception as exc:  # noqa: BLE001 - reported, the timings go on
            print(f"T={t} dequant {dq} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            errs[dq] = float("nan")
    return errs


def simulated(x: torch.Tensor, ex: moe.ExpertWeights) -> torch.Tensor | None:
    """x's FP8 simulation where the step's router hands it to the experts (one token: then no sort launch either),
    made outside the timed calls as the router's launch makes it in the step."""
    return quant.fp8_simulate(x, ACT_GROUP) if mk.takes_simulated_input(x, ex, ACT_GROUP) else None


def time_decode(ex, t: int, fn) -> tuple[float, float]:
    """-> (ms per call, bytes per call) over ROUTINGS routings replayed from one graph."""
    calls = [(x, w, i, simulated(x, ex)) for x, w, i in (inputs(t, seed=r) for r in range(ROUTINGS))]
    ms = common.bench_graph_ms(lambda: [fn(x, ex, w, i, xq) for x, w, i, xq in calls]) / ROUTINGS
    hit = sum(int(torch.unique(i).numel()) for _, _, i, _ in calls) / ROUTINGS
    return ms, hit * EXPERT_BYTES + t * D * (2 + 4)


def time_prefill(ex, t: int, fn, **kw) -> float:
    x, w, i = inputs(t, seed=0)
    return common.bench_ms(lambda: fn(x, ex, w, i), **kw)


def kernel(cfg: mk.MoeConfig | None):
    return lambda x, ex, w, i, xq=None: mk.experts_forward(x, ex, w, i, LIMIT, ACT_GROUP, BEFORE, cfg, xq=xq)


def grouped_dequant(ex: moe.ExpertWeights) -> None:
    """The grouped body's bf16 copies of W1, W3 and W2 (moe_grouped.py), alone: bytes = FP4 read + bf16 written."""
    from v4serve.ops.kernels import moe_grouped as mg

    w13 = torch.empty(E, 2 * I, D, dtype=torch.bfloat16, device="cuda")
    mg.dequantize_into(ex.w1, ex.s1, w13[:, :I])
    mg.dequantize_into(ex.w3, ex.s3, w13[:, I:])
    mg.dequantize_into(ex.w2, ex.s2, torch.empty(E, D, I, dtype=torch.bfloat16, device="cuda"))


def reference(x, ex, w, i):
    return moe.experts_reference(x, ex, w, i, LIMIT, ACT_GROUP, BEFORE)


def mma_loop_size(sass: str) -> int:
    """SASS instructions of the largest loop holding MMAs (a backward branch's target to the branch): a warp's
    instructions per K tile of the GEMM's main loop. 0 where there is none."""
    import re

    ins = [(int(a, 16), text) for a, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    best = 0
    for a, text in ins:
        target = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < a:
            body = [t for b, t in ins if int(target.group(1), 16) <= b <= a]
            if any("MMA" in t for t in body):
                best = max(best, len(body))
    return best


def compile_only(names: list[str] | None, sass_dir: str | None = None) -> None:
    """--compile-only, no GPU needed (run without TRITON_INTERPRET): each variant's gate-up and down kernels
    built for sm_90 by Triton and ptxas with the constexprs and 16-divisible pointers/strides `experts_forward`
    would launch them with at these shapes. Prints registers, local memory (spills), shared memory, the MMA the
    body gets, and "W-smem" where a bf16 weight tile is staged through shared memory for its dot."""
    import re
    import subprocess
    import tempfile

    import triton
    import triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from v4serve.ops.kernels import moe_decode

    def build(fn, ptrs: dict[str, str], const: dict, gemm: mk.GemmConfig) -> str:
        sig, attrs = {}, {}
        for i, n in enumerate(fn.arg_names):
            sig[n] = "constexpr" if n in const else ptrs.get(n, "fp32" if n == "limit" else "i32")
            if sig[n].startswith("*") or n.startswith("stride") or n in ("D", "I"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": gemm.num_warps, "num_stages": gemm.num_stages}
                           | ({"maxnreg": gemm.max_regs} if gemm.max_regs else {}))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            use, sass = (subprocess.run([knobs.nvidia.cuobjdump.path, flag, f.name], check=True, capture_output=True,
                                        text=True).stdout for flag in ("--dump-resource-usage", "-sass"))
        if sass_dir:  # --sass DIR: each kernel's SASS, for reading its K loop, and the layouts Triton chose
            n = len(list(Path(sass_dir).iterdir()))
            out = Path(sass_dir) / f"{fn.__name__}-w{gemm.num_warps}-s{gemm.num_stages}-{n}.sass"
            out.write_text(sass)
            out.with_suffix(".ttgir").write_text(k.asm["ttgir"])
        ir = k.asm["ttgir"]
        regs, stack = re.search(r"REG:(\d+)", use).group(1), re.search(r"STACK:(\d+)", use).group(1)
        mma = "wgmma" if "warp_group_dot" in ir else "mma.sync" if "nvidia_mma" in ir else "no-mma"
        staged = any(int(n) == gemm.block_n for n in re.findall(r"local_alloc %\S+ : \(tensor<(\d+)x\d+xbf16", ir))
        # loads inside the K loop that are not async copies: each iteration waits a memory latency for them
        loop = ir[ir.find("scf.for"):]
        sync = len(re.findall(r" tt\.load ", loop[:loop.find("scf.yield")]))
        return (f"regs {regs:>3} local {stack:>4} smem {k.metadata.shared:>6} {mma}{' W-smem' if staged else ''} "
                f"sync-loads {sync} loop {mma_loop_size(sass)}")

    seen = set()
    todo = [(name, make, t) for regime, ts in (("decode", DECODE), ("prefill", PREFILL))
            for name, make in VARIANTS[regime].items() for t in ts]
    for name, make, t in todo:
        if names and name not in names:
            continue
        cfg = make(t) or auto(t)
        gu, dn, dot = cfg.gate_up, cfg.down, cfg.body == "dot"
        quant_h = I % ACT_GROUP == 0 and (gu.block_n % ACT_GROUP == 0 or gu.split_k > 1)
        body = {"AHEAD": cfg.ahead} if dot else {"BODY": cfg.body, "FOLD": mk.FOLDS[cfg.fold]}
        fp8 = cfg.body == "fp8"  # x and h as e4m3 bytes with float32 scales
        act = {"x_ptr": "*fp8e4nv", "h_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "hs_ptr": "*fp32"} if fp8 else {
            "x_ptr": "*bf16", "h_ptr": "*bf16"}
        common_c = dict(BM=cfg.block_m, GROUP_M=cfg.group_m, G=ACT_GROUP, ASM=cfg.dequant != "bits", PREC="tf32",
                        ACC=tl.float32, F32=False, EVEN_K=True, PDL=True, **body)
        jobs = [("gate-up", mk._gate_up_kernel if dot else moe_decode.gate_up_kernel, gu,
                 act | {"part_ptr": "*fp32", "rw_ptr": "*fp32"},
                 dict(BN=gu.block_n, BK=gu.block_k, SPLIT=gu.split_k, QUANT_H=quant_h, WEIGHT_H=BEFORE,
                      CLAMP=LIMIT > 0, FINISH=False,
                      **({"ROWS": gu.row_loads, "CLAMP_N": gu.clamp_rows} if dot else {"STAGES": gu.num_stages}),
                      **({} if dot else {"HDT": tl.bfloat16 if fp8 else None}),
                      **({} if dot or fp8 else {"xs_ptr": None, "hs_ptr": None}))),
                ("down", mk._down_kernel if dot else moe_decode.down_kernel, dn,
                 {"h_ptr": act["h_ptr"], "y_ptr": "*bf16" if dn.split_k == 1 else "*fp32"} | (
                     {"hs_ptr": "*fp32"} if fp8 else {}),
                 dict(BN=dn.block_n, BK=dn.block_k if quant_h else max(dn.block_k, ACT_GROUP), SPLIT=dn.split_k,
                      QUANT_A=not quant_h,
                      **({"ROWS": dn.row_loads, "CLAMP_N": dn.clamp_rows} if dot else {"STAGES": dn.num_stages}),
                      **({"COMBINE": False, "TOPK": K, "APPLY_W": False, "ADD": False, "BT": 16} if dot else {}),
                      **({} if dot or fp8 else {"hs_ptr": None})))]
        for gemm_name, fn, gemm, ptrs, const in jobs:
            key = (fn, gemm.num_warps, gemm.num_stages, tuple(sorted({**common_c, **const}.items(), key=str)))
            if key in seen:
                continue
            seen.add(key)
            ptrs = {n: "*u8" for n in fn.arg_names if n[:2] in ("w1", "w2", "w3", "s1", "s2", "s3")} | {
                "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "cnt_ptr": "*i32"} | ptrs
            try:
                out = build(fn, ptrs, {**common_c, **const}, gemm)
            except Exception as exc:  # noqa: BLE001 - reported, the others go on
                out = f"FAILED {type(exc).__name__}: {str(exc)[:300]}"
            print(f"{name:<14} T={t:<3} {gemm_name:<8} m{cfg.block_m} n{gemm.block_n} k{const['BK']} "
                  f"s{gemm.split_k} w{gemm.num_warps} st{gemm.num_stages}: {out}", flush=True)


def main() -> None:
    global E, DECODE, PREFILL
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="default configs only, no reference timing")
    ap.add_argument("--variants", default=None, help="comma-separated variant names to time (default: all)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--compile-only", action="store_true", help="build the decode variants for sm_90, no GPU needed")
    ap.add_argument("--sass", default=None, help="with --compile-only: write each kernel's SASS and TTGIR into this "
                    "folder")
    ap.add_argument("--experts", type=int, default=E, help="routed experts (16: the e16 presets, every expert hit)")
    ap.add_argument("--tokens", default=None, help="comma-separated decode token counts (default 1,8,32,64)")
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--prefill-tokens", default=None, help="comma-separated prefill token counts (default 8192)")
    ap.add_argument("--model", default=None, help="a preset's MoE geometry: dim, expert width, routed experts (unless "
                    "--experts is given), top-k, activation group (v41-flash: 5120, 2304, 384, 6, 1 x 32)")
    a = ap.parse_args()
    if a.model:
        global D, I, K, ACT_GROUP, EXPERT_BYTES
        from v4serve.presets import get_preset

        c = get_preset(a.model)
        D, I, K, ACT_GROUP = c.dim, c.moe_inter_dim, c.n_activated_experts, c.weight_block
        EXPERT_BYTES = 3 * (I * D // 2 + I * D // 32)
        E = c.n_routed_experts if a.experts == E else a.experts
    else:
        E = a.experts
    DECODE = tuple(int(t) for t in a.tokens.split(",")) if a.tokens else DECODE
    PREFILL = tuple(int(t) for t in a.prefill_tokens.split(",")) if a.prefill_tokens else PREFILL
    PREFILL = () if a.no_prefill else PREFILL
    DECODE = () if a.no_decode else DECODE
    if a.compile_only:
        global CONFIG_DEVICE
        CONFIG_DEVICE = None
        return compile_only(a.variants.split(",") if a.variants else None, a.sass)
    ceil = common.measure_ceilings()
    hbm, fp8 = ceil["hbm_bytes_per_s"], ceil["fp8_flops"]
    print(common.describe(ceil), flush=True)
    ex = make_experts()
    checks = {f"T={t}": validate(ex, t) for t in (1, 8) + PREFILL[-1:]}  # T=1 takes the split-K path
    print(f"relative error vs reference (max abs diff / max abs ref): {checks}", flush=True)

    rows = []

    def add(t: int, variant: str, ms: float, nbytes: float | None, flops: float | None,
            cfg: mk.MoeConfig | None = None, err: float | None = None) -> None:
        r = {"T": t, "variant": variant, "ms": ms, **({"config": asdict(cfg)} if cfg else {}),
             **({"rel_err": err} if err is not None else {})}
        if nbytes:
            r.update(bytes=nbytes, GB_per_s=nbytes / ms / 1e6, pct_hbm=100 * nbytes / (ms * 1e-3) / hbm)
        if flops:
            r.update(flops=flops, TFLOP_per_s=flops / ms / 1e9, pct_fp8=100 * flops / (ms * 1e-3) / fp8)
        rows.append(r)
        print(f"T={t:>5} {variant:<16} {ms * 1e3:9.1f} us " + (f"{r['GB_per_s']:7.0f} GB/s {r['pct_hbm']:5.1f}% HBM "
              if nbytes else "") + (f"{r['TFLOP_per_s']:6.1f} TFLOP/s {r['pct_fp8']:5.1f}% FP8" if flops else "")
              + (f" err {err:.2g}" if err is not None else ""), flush=True)

    for regime, sizes in (("decode", DECODE), ("prefill", PREFILL)):
        variants = {"default": VARIANTS[regime]["default"]} if a.quick else VARIANTS[regime]
        if a.variants:
            variants = {n: c for n, c in variants.items() if n in a.variants.split(",")}
        for t in sizes:
            flops = 2 * t * K * 3 * D * I
            # every decode variant vs the reference first; at prefill the variants with another body than the default
            check = not a.quick and (regime == "decode" or any(n.startswith("pf-") for n in variants))
            if check:
                xc, wc, ic = inputs(t, seed=100 + t)
                ref = reference(xc, ex, wc, ic)
            for name, make in variants.items():
                cfg, err = make(t), None
                try:
                    if check and (regime == "decode" or name.startswith("pf-") or name == "default"):
                        err = rel_err(kernel(cfg)(xc, ex, wc, ic), ref)
                    if regime == "decode":
                        ms, nbytes = time_decode(ex, t, kernel(cfg))
                    else:
                        ms, nbytes = time_prefill(ex, t, kernel(cfg)), None
                except Exception as exc:  # noqa: BLE001 - a variant that does not compile (shared memory) is skipped
                    print(f"T={t:>5} {name:<16} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                add(t, name, ms, nbytes, flops, cfg or auto(t), err)
            if regime == "prefill" and t == sizes[0] and "pf-grouped" in variants:  # its per-call weight copies
                add(t, "grouped dequant", time_prefill(ex, t, lambda *_: grouped_dequant(ex)), E * EXPERT_BYTES
                    + 3 * E * D * I * 2, None)
            if t == sizes[0] or t == 64:  # the align kernel alone: the sort's share of a call
                ids = inputs(t, seed=0)[2].reshape(-1)
                bm = auto(t).block_m
                add(t, "align only", common.bench_graph_ms(lambda ids=ids, bm=bm: mk.align(ids, E, bm)), None, None)
    if not (a.quick or a.no_reference):  # eager, one routing: on CUDA the reference runs all E experts with zero weights
        for t in (1, 64):
            nbytes = int(torch.unique(inputs(t, seed=0)[2]).numel()) * EXPERT_BYTES + t * D * (2 + 4)
            add(t, "reference", time_prefill(ex, t, reference, warmup=1, iters=1), nbytes, 2 * t * K * 3 * D * I)

    common.write_json(a.out, "moe", {"ceilings": ceil, "E": E, "D": D, "I": I, "k": K, "dtype": "bf16",
                                     "act_group": ACT_GROUP, "weight_before_w2": BEFORE, "rel_err": checks,
                                     "decode_routings_per_graph": ROUTINGS, "rows": rows})
    print(f"\nmoe experts E={E} D={D} I={I} k={K} bf16, FP4 weights, act_group {ACT_GROUP}; {common.describe(ceil)}")
    print(f"{'T':>6} {'variant':<16} {'ms':>9} {'GB/s':>7} {'% HBM':>6} {'TFLOP/s':>8} {'% FP8':>6}")
    for r in rows:
        print(f"{r['T']:>6} {r['variant']:<16} {r['ms']:>9.4f} {r.get('GB_per_s', 0):>7.0f} {r.get('pct_hbm', 0):>6.1f} "
              f"{r.get('TFLOP_per_s', 0):>8.1f} {r.get('pct_fp8', 0):>6.1f}")


if __name__ == "__main__":
    main()
