"""The Triton routed-experts kernels (ops/kernels/moe.py) against the plain-torch reference (ops.moe).

On the CPU they run under Triton's interpreter at tiny shapes (float32 ~1e-5, float64 ~1e-12 relative to the largest
reference value; bf16 through the interpreter's float32 dots). With V4SERVE_TEST_DEVICE=cuda on a GPU the same tests
run there, plus V4-Flash shapes in bf16, the PTX dequant against the portable one, and a CUDA-graph replay.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import triton
import triton.language as tl
from sm90_compile import run_compile

from v4serve.ops import moe, quant
from v4serve.ops.kernels import moe as mk
from v4serve.ops.kernels.moe_decode import _fold_e4m3, _fp4_e4m3

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEV = torch.device("cuda" if ON_GPU else "cpu")
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda and a GPU")

# small tiles keep the interpreter fast; K/N tiles that do not divide D=96 / I=64 exercise the masks
SMALL = mk.MoeConfig(16, mk.GemmConfig(32, 64), mk.GemmConfig(32, 64))
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}


def fp4_stack(E: int, out_f: int, in_f: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ws, ss = [], []
    for _ in range(E):
        w = torch.randn(out_f, in_f, generator=gen).to(DEV) * (in_f ** -0.5)
        q, s = quant.fp4_quantize_weight(w, 32)
        ws.append(q.view(torch.uint8))
        ss.append(s.view(torch.uint8))
    return torch.stack(ws), torch.stack(ss)


def make_experts(E: int, D: int, I: int, seed: int = 0) -> moe.ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    w1, s1 = fp4_stack(E, I, D, gen)
    w3, s3 = fp4_stack(E, I, D, gen)
    w2, s2 = fp4_stack(E, D, I, gen)
    return moe.ExpertWeights(w1, w2, w3, s1, s2, s3, 128)


def routing(T: int, k: int, E: int, seed: int, skew: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token; with `skew`, slot 0 of every token goes to that expert (a long, ragged run)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(T, E, generator=gen).argsort(-1)[:, :k]
    if skew is not None:
        ids = torch.where(ids == skew, ids[:, :1], ids)
        ids[:, 0] = skew
    weights = torch.rand(T, k, generator=gen) + 0.1
    return weights.to(DEV), ids.to(DEV)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.dtype == ref.dtype and out.shape == ref.shape and torch.isfinite(out).all()
    return ((out - ref).abs().max() / ref.abs().max()).item()


def check(T, D, I, E, k, dtype, act_group, before, limit, config=SMALL, seed=0, skew=None, experts=None):
    if ON_GPU and dtype == torch.float64:
        pytest.skip("float64 runs under the CPU interpreter only")
    experts = experts or make_experts(E, D, I, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(T, D, generator=gen).to(DEV, dtype)
    weights, ids = routing(T, k, E, seed + 2, skew)
    out = mk.experts_forward(x, experts, weights, ids, limit, act_group, before, config)
    ref = moe.experts_reference(x, experts, weights, ids, limit, act_group, before)
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"relative error {err:.3g}"
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("act_group", [0, 32])
@pytest.mark.parametrize("before,limit", [(True, 1.0), (False, 1.0), (True, 0.0), (False, 0.0)])
def test_tiny_preset_shapes(dtype, act_group, before, limit):
    # tiny-v4-flash: D=64, I=32, E=8, k=2, SwiGLU limit 1 (clips for real)
    check(5, 64, 32, 8, 2, dtype, act_group, before, limit)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("act_group,D,I", [(0, 96, 64), (32, 96, 64), (64, 192, 192)])
def test_shapes_not_multiples_of_the_tiles(dtype, act_group, D, I):
    # D and I against 64/128-wide K tiles and 32-wide N tiles (I=192 = 6 tiles, a 64-wide tail of the down K loop); act_group 64 > BN=32 puts h's
    # quantization in the down kernel's A-tile load instead of the gate-up epilogue
    cfg = SMALL if act_group < 64 else mk.MoeConfig(16, mk.GemmConfig(32, 128), mk.GemmConfig(32, 128))
    check(7, D, I, 6, 3, dtype, act_group, act_group != 32, 2.0, config=cfg)


@pytest.mark.parametrize("bk", [32, 64])  # whole K tiles (EVEN_K) at 32; a K tail at 64
@pytest.mark.parametrize("row_loads", [True, False])
def test_weight_rows_clamped_or_masked_same_bits(bk, row_loads):
    """`GemmConfig.clamp_rows`: a tile's weight rows past N (I = D = 96 on 64-wide N tiles: a half-empty last tile in
    both GEMMs) loaded as copies of the last row, without masks, give the bits of the masked loads."""
    gemm = mk.GemmConfig(64, bk, row_loads=row_loads)
    clamped = mk.MoeConfig(16, gemm, gemm)
    masked = dataclasses.replace(clamped, gate_up=dataclasses.replace(gemm, clamp_rows=False),
                                 down=dataclasses.replace(gemm, clamp_rows=False))
    out = check(7, 96, 96, 6, 3, torch.float32, 32, True, 1.0, config=clamped)
    assert torch.equal(out, check(7, 96, 96, 6, 3, torch.float32, 32, True, 1.0, config=masked))


def test_single_token_most_experts_idle():
    check(1, 64, 32, 8, 2, torch.float32, 32, True, 1.0)


def test_ragged_runs_longer_than_a_block():
    # every token sends slot 0 to expert 3: a 40-row run (3 blocks of 16), the rest scattered, some experts idle
    check(40, 64, 32, 8, 2, torch.float64, 32, False, 1.0, skew=3)


@pytest.mark.parametrize("act_group", [0, 32])
def test_prefill_style_config(act_group):
    # grouped block order (GROUP_M row blocks sweep the column tiles together), 32-row blocks, h quantized in the
    # gate-up epilogue
    cfg = mk.MoeConfig(32, mk.GemmConfig(32, 64, 4, 2), mk.GemmConfig(64, 32, 4, 2), group_m=2)
    check(24, 64, 32, 8, 2, torch.float32, act_group, True, 1.0, config=cfg, skew=5)


@pytest.mark.parametrize("dtype,act_group,before", [(torch.float64, 32, True), (torch.float32, 0, False)])
def test_split_k(dtype, act_group, before):
    # 3 K tiles over 3 (gate-up) and 2 (down, shares of 2 and 1 tiles) programs; the partials are summed in order
    cfg = mk.MoeConfig(16, mk.GemmConfig(32, 32, split_k=3), mk.GemmConfig(32, 32, split_k=2))
    check(5, 96, 64, 6, 3, dtype, act_group, before, 2.0, config=cfg, skew=2)


@pytest.mark.parametrize("D,I,split", [(96, 64, 1), (96, 64, 3), (160, 96, 2), (128, 64, 3), (256, 192, 2)])
def test_scales_loaded_ahead(D, I, split):
    """MoeConfig.ahead: each K tile's scale bytes loaded an iteration before their use (and the ones past a K share's
    end masked, or with whole K tiles read from the share's last tile and dropped) give the bits of the loads in place
    — whole and ragged last K tiles (D = 96, 160 on 64-wide ones), split K (D = 128 over 3 shares: one share empty),
    several row blocks of an expert; only the dot body takes it."""
    if ON_GPU:
        pytest.skip("float64 under the CPU interpreter (the GPU runs it in test_v41_flash_one_row_an_expert_bf16)")
    cfg = mk.MoeConfig(16, mk.GemmConfig(32, 64, split_k=split), mk.GemmConfig(32, 64, split_k=split))
    ahead = dataclasses.replace(cfg, ahead=True)
    out = check(5, D, I, 6, 3, torch.float64, 32, True, 2.0, config=ahead, skew=2)
    assert torch.equal(out, check(5, D, I, 6, 3, torch.float64, 32, True, 2.0, config=cfg, skew=2))
    with pytest.raises(ValueError, match="ahead"):
        dataclasses.replace(cfg, body="swap", ahead=True)


@pytest.mark.parametrize("body", ["dot", "swap", "fma"])
@pytest.mark.parametrize("dtype,act_group,before", [(torch.float64, 32, True), (torch.float32, 0, False)])
def test_gate_up_split_k_finished_in_the_kernel(body, dtype, act_group, before):
    """finish="kernel": each gate-up tile's last program to arrive sums the split-K partials and applies the SwiGLU
    epilogue (no `_swiglu_kernel` launch): the reference, and bit for bit the two-launch form (the same sums in the same
    order, the same epilogue on whole FP8 groups), twice (counters re-zeroed)."""
    if body == "dot":
        cfg = mk.MoeConfig(16, mk.GemmConfig(32, 32, split_k=3), mk.GemmConfig(32, 32, split_k=2))
    else:
        cfg = dataclasses.replace(BODIES["swap" if body == "swap" else "fma-m4"], **SPLIT)
    kernel, launch = dataclasses.replace(cfg, finish="kernel"), dataclasses.replace(cfg, finish="launch")
    out = check(5, 96, 64, 6, 3, dtype, act_group, before, 2.0, config=kernel, skew=2)
    again = check(5, 96, 64, 6, 3, dtype, act_group, before, 2.0, config=kernel, skew=2)
    two = check(5, 96, 64, 6, 3, dtype, act_group, before, 2.0, config=launch, skew=2)
    assert torch.equal(out, again) and torch.equal(out, two)
    with pytest.raises(ValueError, match="finish"):
        dataclasses.replace(cfg, finish="atomic")


def test_default_config_selection(monkeypatch):
    # V4-Flash at T=1 hits 6 experts: K split so the grids fill the GPU; T=8 does not need it
    monkeypatch.delenv(mk.DECODE_BODY_ENV, raising=False)
    monkeypatch.delenv(mk.PREFILL_ENV, raising=False)
    one = mk.select_config(6, 256, 4096, 2048)
    assert (one.block_m, one.gate_up.split_k, one.down.split_k) == (16, 4, 2)
    assert mk.select_config(48, 256, 4096, 2048) == mk.DECODE and mk.select_config(8192 * 6, 256) is mk.PREFILL
    # the grouped body from GROUPED_MIN_ROWS rows an expert (16 experts: 8K tokens 3,072 rows, 1K 384)
    assert mk.select_config(8192 * 6, 16) is mk.PREFILL_CONFIGS["grouped"]
    assert mk.select_config(1024 * 6, 16) is mk.PREFILL
    # with 1 x 32 activation groups (V4.1) from GROUPED_MIN_ROWS_G32: 640 tokens give 240 rows an expert, 512 give 192
    assert mk.select_config(640 * 6, 16, 5120, 2304, act_group=32) is mk.PREFILL_CONFIGS["grouped"]
    assert mk.select_config(512 * 6, 16, 5120, 2304, act_group=32) is mk.PREFILL
    assert mk.select_config(640 * 6, 16, 5120, 2304, act_group=128) is mk.PREFILL
    # 16 experts: 3 rows each at T=8 keep one wave; 12 rows each at T=32 split K for about two
    eight, thirty_two = mk.select_config(8 * 6, 16), mk.select_config(32 * 6, 16)
    assert (eight.gate_up.split_k, eight.down.split_k) == (1, 1)
    assert (thirty_two.block_m, thirty_two.gate_up.split_k, thirty_two.down.split_k) == (16, 3, 2)
    # one row an expert with 1 x 32 groups (V4.1): the narrow tiles, K shares for 6 / 5 CTAs an SM; not with 1 x 128
    narrow = mk.select_config(6, 384, 5120, 2304, act_group=32)
    assert (narrow.gate_up, narrow.down) == (dataclasses.replace(mk.NARROW_GATE_UP, split_k=3), mk.NARROW_DOWN)
    assert mk.select_config(6, 384, 5120, 2304, act_group=128).gate_up.block_n == 128
    assert mk.select_config(12, 384, 5120, 2304, act_group=32).gate_up.block_n == 64  # 12 experts, a row each
    assert mk.select_config(32 * 6, 16, 5120, 2304, act_group=32).gate_up.block_n == 128  # 12 rows an expert
    assert narrow.ahead  # the scale bytes an iteration ahead (V4SERVE_MOE_AHEAD=0: in place)
    # FP4 tiles copied as whole rows where that was timed faster (the decode tiles, their gate-up capped at 168
    # registers: 3 CTAs an SM; the narrow down, uncapped); the narrow gate-up keeps the [BN, BK/32, 16] copies
    assert thirty_two.gate_up.row_loads and thirty_two.down.row_loads and thirty_two.gate_up.max_regs == 168
    assert one.gate_up.max_regs == 168 and not one.down.max_regs
    assert not narrow.gate_up.row_loads and narrow.down.row_loads and not narrow.down.max_regs
    assert not (mk.MID.gate_up.row_loads or mk.PREFILL.gate_up.row_loads)
    assert not mk.select_config(6, 256, 4096, 2048).ahead  # DECODE's 4-byte scale rows are async copies already
    monkeypatch.setenv(mk.AHEAD_ENV, "0")
    assert not mk.select_config(6, 384, 5120, 2304, act_group=32).ahead
    monkeypatch.delenv(mk.AHEAD_ENV)
    monkeypatch.setenv(mk.NARROW_ENV, "0")
    assert mk.select_config(6, 384, 5120, 2304, act_group=32).gate_up.block_n == 128
    monkeypatch.delenv(mk.NARROW_ENV)
    # the production decode tiles (larger than this problem): masks only (T=3, k=2: a row an expert, narrow tiles)
    check(3, 64, 32, 8, 2, torch.float32, 32, True, 1.0, config=None)
    # the decode body from the environment (an A/B switch for the step), never for the prefill configs
    monkeypatch.setenv(mk.DECODE_BODY_ENV, "fp8")
    assert mk.select_config(6, 256).body == "fp8" and mk.select_config(8192 * 6, 256).body == "dot"
    assert mk.decode_config(6, 256, body="dot").body == "dot"
    if ON_GPU:  # the FP8 tensor core keeps ~14 bits in its own accumulation (test_fp8_body; H200: 4.7e-5 here)
        monkeypatch.setitem(TOL, torch.float32, 1e-4)
    check(3, 64, 32, 8, 2, torch.float32, 32, True, 1.0, config=None)
    monkeypatch.setenv(mk.DECODE_BODY_ENV, "fma")
    with pytest.raises(ValueError, match="one of dot, swap, fp8"):
        mk.select_config(6, 256)


def test_gemm_config_launch_options():
    """A dot-body config's launch: ROWS where its tiles are copied as rows, CLAMP_N where its weight rows are clamped
    (every default), Triton's maxnreg where it caps registers — on CUDA only (the interpreter takes no register cap);
    the other bodies take none of them."""
    x = torch.zeros(2, 64, device=DEV)
    cfg = mk.select_config(32 * 6, 16)
    want = {"ROWS": True, "CLAMP_N": True} | ({"maxnreg": 168} if x.is_cuda else {})
    assert mk._body(cfg, cfg.gate_up, x) == want and mk._body(cfg, cfg.down, x) == {"ROWS": True, "CLAMP_N": True}
    narrow = mk.select_config(6, 384, 5120, 2304, act_group=32)
    assert mk._body(narrow, narrow.gate_up, x) == {"AHEAD": True, "CLAMP_N": True}
    masked = dataclasses.replace(cfg.down, clamp_rows=False)
    assert mk._body(cfg, masked, x) == {"ROWS": True}
    assert not {"ROWS", "CLAMP_N"} & set(mk._body(dataclasses.replace(cfg, body="swap"), cfg.gate_up, x))


def test_prefill_config_from_the_environment(monkeypatch, fp8_taken):
    """V4SERVE_MOE_PREFILL names the prefill config (an A/B switch for the whole step): the decode configs stay, an
    unknown name is refused, and the fold's config runs (here on tiles whose rows exceed the prefill threshold)."""
    assert mk.select_config(8192 * 6, 256) == mk.PREFILL
    monkeypatch.setenv(mk.PREFILL_ENV, "fp8-tile")
    cfg = mk.select_config(8192 * 6, 256)
    assert (cfg.body, cfg.fold, cfg.block_m) == ("fp8", "tile", 64)
    assert mk.select_config(6, 256).body == "dot"
    assert mk.select_config(8192 * 6, 256) is mk.PREFILL_CONFIGS["fp8-tile"]
    monkeypatch.setenv(mk.PREFILL_ENV, "fp8-group")
    assert mk.select_config(8192 * 6, 256).fold == "group"
    # 200 tokens x top-2 over 4 experts: 100 rows an expert, the prefill config (D, I: whole 128-wide tiles)
    if ON_GPU:  # as test_fp8_body: the tensor core's FP8 accumulation is not float32's
        monkeypatch.setitem(TOL, torch.bfloat16, 4e-2)
    check(200, 256, 128, 4, 2, torch.bfloat16 if ON_GPU else torch.float32, 128, True, 1.0, config=None)
    assert fp8_taken and all(fp8_taken)
    # V4.1's 1 x 32 activation groups on the per-group fp8 body's 32-wide K tiles
    monkeypatch.setenv(mk.PREFILL_ENV, "fp8-k32")
    check(200, 128, 128, 4, 2, torch.bfloat16 if ON_GPU else torch.float32, 32, True, 1.0, config=None)
    assert len(fp8_taken) == 2 and all(fp8_taken)
    monkeypatch.setenv(mk.PREFILL_ENV, "fp9")
    with pytest.raises(ValueError, match="one of dot, grouped, fp8-tile, fp8-group, fp8-k32"):
        mk.select_config(8192 * 6, 256)


@pytest.mark.parametrize("body", ["reference", "kernels"])
def test_join_runs_before_the_shared_output_is_read(body):
    """`join` (ops/streams.py: the shared expert may still be running on a side stream) is called before the combine
    reads `shared`: here it writes the shared output into a zeroed buffer, and the result has it."""
    if ON_GPU:
        pytest.skip("the CPU check of the call order (on the GPU: tests/gpu/test_cuda.py, a real side stream)")
    T, D, I, E, k = 5, 64, 32, 8, 2
    experts = make_experts(E, D, I, seed=3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(T, D, generator=gen, dtype=torch.float64)
    real = torch.randn(T, D, generator=gen, dtype=torch.float64)
    weights, ids = routing(T, k, E, seed=5)
    buf = torch.zeros_like(real)
    fwd = mk.experts_forward if body == "kernels" else moe.experts_reference
    out = fwd(x, experts, weights, ids, 1.0, 32, True, shared=buf, join=lambda: buf.copy_(real))
    ref = moe.experts_reference(x, experts, weights, ids, 1.0, 32, True, shared=real)
    assert rel_err(out, ref) <= 1e-12


def test_bf16():
    check(6, 64, 32, 8, 2, torch.bfloat16, 32, True, 1.0)


@pytest.mark.parametrize("dtype,split", [(torch.float32, 1), (torch.float32, 2), (torch.bfloat16, 1),
                                         (torch.float64, 2)])
def test_shared_output_added_and_rounded_in_the_combine(dtype, split):
    """The layer's output in one pass: the shared expert's [T, D] (x's dtype) added to the routed sum in the combine and
    the result rounded once to x's dtype, as the reference adds and rounds; with split-K partials too."""
    if ON_GPU and dtype == torch.float64:
        pytest.skip("float64 runs under the CPU interpreter only")
    T, D, I, E, k = 5, 96, 64, 6, 3
    experts = make_experts(E, D, I, seed=4)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(T, D, generator=gen).to(DEV, dtype)
    shared = (torch.randn(T, D, generator=gen) * 4).to(DEV, dtype)
    weights, ids = routing(T, k, E, seed=6)
    cfg = mk.MoeConfig(16, mk.GemmConfig(32, 32, split_k=split), mk.GemmConfig(32, 32, split_k=split))
    out = mk.experts_forward(x, experts, weights, ids, 1.0, 32, True, cfg, shared=shared, out_dtype=dtype)
    ref = moe.experts_reference(x, experts, weights, ids, 1.0, 32, True, shared, dtype)
    plain = moe.experts_reference(x, experts, weights, ids, 1.0, 32, True)
    assert out.dtype == dtype and ref.dtype == dtype
    assert torch.equal(ref, (plain + shared.to(plain.dtype)).to(dtype))
    assert rel_err(out.to(plain.dtype), ref.to(plain.dtype)) <= max(TOL[dtype], torch.finfo(dtype).eps)
    # the shared term is really in: without it the result is far off
    assert rel_err(out.to(plain.dtype), plain) > 0.1


# ------------------------------------------------------------------------------------------------------------
# The decode bodies (ops/kernels/moe_decode.py): swap (W @ x^T on tensor cores) and fma (no tensor cores, 1-8 rows)
# ------------------------------------------------------------------------------------------------------------

G = mk.GemmConfig
BODIES = {
    "swap": mk.MoeConfig(16, G(32, 64), G(32, 64), body="swap"),
    "fma-m1": mk.MoeConfig(1, G(32, 64), G(32, 64), body="fma"),  # one row per block: no capacity padding
    "fma-m4": mk.MoeConfig(4, G(16, 32), G(64, 64), body="fma"),
}
SPLIT = {"gate_up": G(32, 32, split_k=3), "down": G(32, 32, split_k=2)}  # 3 / 2 K shares over D=96 / I=64


CASES = ["one-token", "ragged", "tails", "split-k", "h-quant-in-down"]


# fma-m1 skips "tails": fma-m4's 64-wide down N tile covers them (the interpreter is slow on one-row blocks)
@pytest.mark.parametrize("body,case", [(b, c) for b in BODIES for c in CASES if (b, c) != ("fma-m1", "tails")])
def test_decode_bodies(body, case):
    cfg = BODIES[body]
    if case == "one-token":  # T=1: 2 of 8 experts hit, the rest of the blocks exit
        check(1, 64, 32, 8, 2, torch.float32, 32, True, 1.0, config=cfg)
    elif case == "ragged":  # a 20-row run (several blocks for fma, 2 for swap), the rest scattered, some idle
        check(20, 64, 32, 8, 2, torch.float64, 32, False, 1.0, config=cfg, skew=3)
    elif case == "tails":  # D=96 / I=64 against 64-wide K tiles and 32/64-wide N tiles; no FP8, no clamp
        check(7, 96, 64, 6, 3, torch.float32, 0, True, 0.0, config=cfg)
    elif case == "split-k":  # float partials summed in order by the SwiGLU and combine kernels
        check(5, 96, 64, 6, 3, torch.float64, 32, True, 2.0, config=dataclasses.replace(cfg, **SPLIT), skew=2)
    else:  # act_group 64 > the gate-up N tile: h FP8-simulated on the down kernel's A-tile load
        check(6, 128, 64, 4, 2, torch.float32, 64, False, 1.0, config=cfg)


@pytest.mark.parametrize("body", ["swap", "fma-m4"])
def test_decode_bodies_bf16_and_poisoned_buffers(body, monkeypatch):
    check(6, 64, 32, 8, 2, torch.bfloat16, 32, True, 1.0, config=BODIES[body])

    def poisoned(shape, dtype, device):
        if dtype.is_floating_point:
            return torch.full(shape, float("nan"), dtype=dtype, device=device)
        return torch.full(shape, 2**30, dtype=dtype, device=device)

    monkeypatch.setattr(mk, "_empty", poisoned)
    check(9, 64, 32, 8, 2, torch.float32, 32, False, 1.0, config=BODIES[body], skew=1)


FP8 = mk.MoeConfig(16, G(32, 64), G(32, 64), body="fp8")


@pytest.fixture
def fp8_taken(monkeypatch):
    """Records whether each call's fp8 body applied (else it falls back to swap)."""
    taken: list[bool] = []
    real = mk._fp8_body_applies
    monkeypatch.setattr(mk, "_fp8_body_applies", lambda *a: taken.append(real(*a)) or taken[-1])
    return taken


@pytest.mark.parametrize("case", ["one-token", "ragged", "tails", "split-k", "group-64", "prefill-tiles"])
def test_fp8_body(case, fp8_taken, monkeypatch):
    """W4A8 on FP8 tensor cores (moe_decode.py "fp8"): FP4 bytes turned into e4m3 (value * 2^-6) in registers and the
    FP8-simulated activations re-quantized to e4m3 per 32-group with their own scales, exactly; float32 sums (under
    the interpreter the FP8 dot is exact, so float32's tolerance holds). On the GPU: bf16 within 4e-2 (the tensor
    core's FP8 accumulation is not float32's; H200: the tails case 0.032 where bf16's 3e-2 holds the other bodies)."""
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    if ON_GPU:
        monkeypatch.setitem(TOL, torch.bfloat16, 4e-2)
    if case == "one-token":
        check(1, 64, 32, 8, 2, dtype, 32, True, 1.0, config=FP8)
    elif case == "ragged":  # a 20-row run over two 16-row blocks, the rest scattered
        check(20, 64, 32, 8, 2, dtype, 32, False, 1.0, config=FP8, skew=3)
    elif case == "tails":  # D=96 / I=64 against 64-wide K tiles: the last K tile's second 32-group is past K
        check(7, 96, 64, 6, 3, dtype, 32, True, 0.0, config=FP8)
    elif case == "split-k":  # partials summed by the tile's last program, and by the combine
        check(5, 96, 64, 6, 3, dtype, 32, True, 2.0, config=dataclasses.replace(FP8, **SPLIT), skew=2)
    elif case == "group-64":  # act_group 64 over 64-wide gate-up tiles: each 32-slice re-quantized within its 64-group
        check(6, 128, 64, 4, 2, dtype, 64, False, 1.0, config=mk.MoeConfig(16, G(64, 64), G(32, 64), body="fp8"))
    else:  # the prefill grid's shape (benchmarks/kernels/moe.py pf-fp8*): 32-row blocks, several per expert, in
        # GROUP_M sweeps over the column tiles
        check(70, 128, 64, 4, 2, dtype, 32, True, 1.0,
              config=mk.MoeConfig(32, G(64, 64), G(64, 64), group_m=2, body="fp8"), skew=1)
    assert fp8_taken and all(fp8_taken)


def test_fp8_body_bf16_and_where_it_does_not_apply(fp8_taken):
    check(6, 64, 32, 8, 2, torch.bfloat16, 32, True, 1.0, config=FP8)
    assert fp8_taken == [True]
    # no activation quantization, a group that 32-slices do not tile, h quantized in the down kernel: swap instead
    check(5, 64, 32, 8, 2, torch.float32, 0, True, 1.0, config=FP8)
    check(5, 128, 64, 4, 2, torch.float32, 64, False, 1.0, config=FP8)  # 64-groups > the 32-wide gate-up tile
    assert fp8_taken == [True, False, False]
    if not ON_GPU:
        check(5, 64, 32, 8, 2, torch.float64, 32, True, 1.0, config=FP8)
        assert fp8_taken[-1] is False


@triton.jit
def _e4m3_of_bytes(p_ptr, lo_ptr, hi_ptr, ASM: tl.constexpr):
    offs = tl.arange(0, 256)
    lo, hi = _fp4_e4m3(tl.load(p_ptr + offs), ASM)
    tl.store(lo_ptr + offs, lo.to(tl.float32))
    tl.store(hi_ptr + offs, hi.to(tl.float32))


@pytest.mark.parametrize("asm", [False, True] if ON_GPU else [False])
def test_fp4_to_e4m3_is_exact(asm):
    """Every byte: the two e4m3 values from `_fp4_e4m3` (portable form; PTX on the GPU) are the e2m1 nibbles times
    2^-6."""
    p = torch.arange(256, dtype=torch.uint8, device=DEV)
    lo, hi = torch.empty(256, device=DEV), torch.empty(256, device=DEV)
    _e4m3_of_bytes[(1,)](p, lo, hi, ASM=asm)
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6] + [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6], device=DEV)
    assert torch.equal(lo * 64, table[(p & 15).long()]) and torch.equal(hi * 64, table[(p >> 4).long()])


@triton.jit
def _folded_codes(c_ptr, e_ptr, out_ptr):
    offs = tl.arange(0, 256)
    v = _fold_e4m3(tl.load(c_ptr + offs), tl.load(e_ptr + offs))
    tl.store(out_ptr + offs, v.to(tl.float32))


def test_fold_e4m3_is_exact():
    """Every FP4 code at every exponent offset the fold uses (and two below it): the e4m3 value is the e2m1 value times
    2^(e0 - 6), up to 6 * 2^6 = 384 at e0 = 12 (no NaN code), and 0 for a group more than 2^12 below the tile's
    largest (e0 < 0)."""
    code = torch.arange(16, dtype=torch.int32).repeat(16)
    e0 = torch.arange(-2, 14, dtype=torch.int32).repeat_interleave(16)
    e0 = torch.where(e0 > 12, 12, e0)
    out = torch.empty(256, device=DEV)
    _folded_codes[(1,)](code.to(DEV), e0.to(DEV), out)
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    want = torch.where(e0 >= 0, table[code.long()] * torch.exp2(e0.double() - 6).float(), 0.0)
    assert torch.equal(out.cpu(), want), (out.cpu() - want).abs().max()
    assert out.abs().max().item() == 384.0


def spread_scales(experts: moe.ExpertWeights, seed: int, flush: bool = False) -> moe.ExpertWeights:
    """Each 32-group's e8m0 scale moved down by 0..10, so that a K tile's groups lie far apart (within the fold's
    exact range); with `flush`, also every fifth group 20 below its row's first (the fold reads it as 0), and the
    first 4 rows of expert 2 (every token's slot 0) scaled by 2^-122 (b = 5: a row factor under float32's normals)."""
    gen = torch.Generator().manual_seed(seed)

    def spread(sc: torch.Tensor) -> torch.Tensor:
        s = sc.cpu().to(torch.int32) - torch.randint(0, 11, sc.shape, generator=gen, dtype=torch.int32)
        if flush:
            s[..., 1::5] = s[..., :1] - 20
            s[2, :4] = 5
        return s.clamp(1, 254).to(torch.uint8).to(sc.device)

    return dataclasses.replace(experts, s1=spread(experts.s1), s2=spread(experts.s2), s3=spread(experts.s3))


@pytest.mark.parametrize("fold", ["tile", "group"])
@pytest.mark.parametrize("case", ["bk64", "bk128", "flush", "split-k"])
def test_fp8_body_folded_scales(case, fold, fp8_taken, monkeypatch):
    """The fp8 body's fold (MoeConfig.fold): a K tile inside one activation group as one FP8 dot over weights whose
    group scales are folded into the e4m3 exponents, the row's largest and the activation scale applied once a tile.
    Against the reference with scales spread 0..10 apart within a tile (exact there: float32's tolerance under the
    interpreter), and with groups 20 below (read as 0: their values are < 2^-19 of the tile's largest); both forms
    (one dot a tile, the groups' dots chained)."""
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    if ON_GPU:  # as test_fp8_body: the tensor core's FP8 accumulation is not float32's
        monkeypatch.setitem(TOL, torch.bfloat16, 4e-2)
    if case == "bk64":  # act_group 64 = the 64-wide K tiles of both GEMMs
        cfg, D, I, g = mk.MoeConfig(16, G(64, 64), G(64, 64), body="fp8", fold=fold), 128, 128, 64
    elif case == "bk128" or case == "flush":  # V4's act_group 128 over 128-wide K tiles
        cfg, D, I, g = mk.MoeConfig(16, G(128, 128), G(64, 128), body="fp8", fold=fold), 256, 128, 128
    else:
        cfg = mk.MoeConfig(16, G(64, 64, split_k=2), G(64, 64, split_k=2), body="fp8", fold=fold)
        D, I, g = 256, 128, 64
    experts = spread_scales(make_experts(6, D, I, seed=5), seed=6, flush=case == "flush")
    check(9, D, I, 6, 2, dtype, g, True, 1.0, config=cfg, skew=2, experts=experts)
    assert fp8_taken and all(fp8_taken)


def test_fold_is_the_fp8_body_option():
    with pytest.raises(ValueError, match="fold is the fp8 body's option"):
        mk.MoeConfig(16, G(64, 64), G(64, 64), fold="tile")
    with pytest.raises(ValueError, match="unknown MoE fold"):
        mk.MoeConfig(16, G(64, 64), G(64, 64), body="fp8", fold="yes")


def test_decode_config():
    # V4-Flash, E=256, k=6: swap keeps 16-row blocks; fma takes the mean rows per expert hit, a power of two <= 8
    for t in (1, 8, 32, 64):
        swap, fma = (mk.decode_config(6 * t, 256, 4096, 2048, b) for b in ("swap", "fma"))
        assert (swap.body, swap.block_m, fma.body) == ("swap", 16, "fma")
        assert fma.block_m == (2 if t == 64 else 1)
        assert fma.gate_up.block_n % (32 * fma.gate_up.num_warps) == 0  # a weight row per thread
    assert mk.decode_config(6, 256, body="swap").gate_up.split_k == 4  # T=1: 6 experts, K split
    assert mk.decode_config(6 * 512, 16, body="fma").block_m == 8
    assert mk.decode_config(6, 256, body="dot") == mk.select_config(6, 256)
    with pytest.raises(ValueError):
        mk.MoeConfig(8, G(32, 64), G(32, 64), body="swap")  # the dot's N would be 8
    with pytest.raises(ValueError):
        mk.MoeConfig(16, G(32, 64), G(32, 64), body="nope")
    # the decode tiles (larger than this problem): masks only
    check(3, 64, 32, 8, 2, torch.float32, 32, True, 1.0, config=mk.decode_config(6, 8, 64, 32, "fma"))


def test_act_group_that_does_not_tile_falls_back_to_the_reference():
    check(3, 96, 96, 4, 2, torch.float32, 48, True, 1.0)


@pytest.mark.parametrize("M,BM", [(300, 16), (5000, 128), (300, 1), (300, 4)])
def test_align_sorts_and_pads_by_expert(M, BM):
    E = 12
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 7, (M,), generator=gen)  # experts 7..11 idle; 3 chunks of 128 / 5 of 1024 ids
    ids[:300] = 2  # a run of > 2 blocks
    sorted_ids, block_expert = mk.align(ids.to(DEV), E, BM)
    sorted_ids, block_expert = sorted_ids.cpu(), block_expert.cpu()
    counts = torch.bincount(ids, minlength=E)
    padded = (counts + BM - 1) // BM * BM
    total = int(padded.sum())
    assert block_expert.numel() == -(-(M + min(E, M) * (BM - 1)) // BM)
    assert (block_expert[total // BM:] == -1).all()
    pos = 0
    for e in range(E):
        run = sorted_ids[pos:pos + padded[e]]
        real = torch.nonzero(ids == e).flatten().to(torch.int32)
        assert torch.equal(run[:counts[e]].sort().values, real)  # each assignment once (any order inside the run)
        assert (run[counts[e]:] == M).all()
        assert (block_expert[pos // BM:(pos + padded[e]) // BM] == e).all()
        pos += int(padded[e])


SPLIT2 = mk.MoeConfig(16, mk.GemmConfig(32, 32, split_k=2), mk.GemmConfig(32, 32, split_k=2))


@pytest.mark.parametrize("case", ["g32", "g32-split", "g0", "g32-split-combine", "fp64"])
def test_one_token_blocks_straight_from_the_routing(case, monkeypatch):
    """One token, x's FP8 simulation given (the router writes it): no launch before the gate-up (the prologue would
    raise), each block one assignment straight from the routing, the same bits as the sorted path
    (V4SERVE_MOE_DIRECT=0); with no activation groups none is needed. Split K finished in the kernel; the combine in
    the down kernel (fusion moe_combine)."""
    dtype = torch.float64 if case == "fp64" else torch.float32
    if ON_GPU and dtype == torch.float64:
        pytest.skip("float64 runs under the CPU interpreter only")
    G = 0 if case == "g0" else 32
    cfg = SPLIT2 if "split" in case else SMALL
    if "combine" in case:
        monkeypatch.setenv("V4SERVE_FUSIONS", "moe_combine")
    experts = make_experts(8, 96, 64, seed=5)
    x = torch.randn(1, 96, generator=torch.Generator().manual_seed(6)).to(DEV, dtype)
    weights, ids = routing(1, 3, 8, 7)
    xq = quant.fp8_simulate(x, G) if G else None
    assert mk.takes_simulated_input(x, experts, G) == bool(G)
    monkeypatch.setenv(mk.DIRECT_ENV, "0")
    assert not mk.takes_simulated_input(x, experts, 32)
    want = mk.experts_forward(x, experts, weights, ids, 1.0, G, True, cfg, shared=x.clone())
    monkeypatch.delenv(mk.DIRECT_ENV)
    prologue = mk._prologue
    monkeypatch.setattr(mk, "_prologue", lambda *a, **kw: pytest.fail("a launch before the gate-up"))
    got = mk.experts_forward(x, experts, weights, ids, 1.0, G, True, cfg, shared=x.clone(), xq=xq)
    assert torch.equal(got, want)
    ref = moe.experts_reference(x, experts, weights, ids, 1.0, G, True, shared=x.clone(), xq=xq)
    assert rel_err(got, ref) <= TOL[dtype]
    if G:  # without the simulation given, the one token is sorted and simulated by the prologue as before
        monkeypatch.setattr(mk, "_prologue", prologue)
        assert torch.equal(mk.experts_forward(x, experts, weights, ids, 1.0, G, True, cfg, shared=x.clone()), want)


def test_simulated_input_given_to_a_sorted_step(monkeypatch):
    """Several tokens with x's simulation given: the prologue sorts but simulates nothing (it gets no x), the same
    bits; an idle-block and a split-K SwiGLU launch path too (blocks from the sort)."""
    experts = make_experts(8, 96, 64, seed=8)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(9)).to(DEV)
    weights, ids = routing(5, 3, 8, 10, skew=2)
    xq = quant.fp8_simulate(x, 32)
    seen = []
    prologue = mk._prologue
    monkeypatch.setattr(mk, "_prologue", lambda ids, E, BM, x=None, *a, **kw: seen.append(x is None)
                        or prologue(ids, E, BM, x, *a, **kw))
    apart = dataclasses.replace(SPLIT2, finish="launch")
    for cfg in (SMALL, apart):
        want = mk.experts_forward(x, experts, weights, ids, 1.0, 32, True, cfg)
        assert torch.equal(mk.experts_forward(x, experts, weights, ids, 1.0, 32, True, cfg, xq=xq), want)
    one = x[:1].contiguous()  # one token whose gate-up split is summed by the SwiGLU launch: sorted too
    want = mk.experts_forward(one, experts, weights[:1], ids[:1], 1.0, 32, True, apart)
    got = mk.experts_forward(one, experts, weights[:1], ids[:1], 1.0, 32, True, apart, xq=xq[:1].contiguous())
    assert torch.equal(got, want)
    assert seen == [False, True, False, True, False, True]


def test_router_simulated_input_buffer(monkeypatch):
    """ops.moe hands out the buffer only where the kernels take it: the Triton backend, one token, activation
    groups; the reference reads it as its own simulation."""
    experts = make_experts(8, 96, 64, seed=11)
    x = torch.randn(1, 96, generator=torch.Generator().manual_seed(12)).to(DEV)
    assert moe.router_simulated_input(x, experts, 32, "triton").shape == x.shape
    assert moe.router_simulated_input(x, experts, 32) is None  # the reference backend
    assert moe.router_simulated_input(x, experts, 0, "triton") is None
    assert moe.router_simulated_input(x.expand(2, 96), experts, 32, "triton") is None
    monkeypatch.setenv(mk.DIRECT_ENV, "0")
    assert moe.router_simulated_input(x, experts, 32, "triton") is None


def test_every_read_buffer_is_written(monkeypatch):
    # poison every buffer the call allocates: NaN (floats), a huge index (ints); a read of an unwritten element
    # would show up in the output or fault
    def poisoned(shape, dtype, device):
        if dtype.is_floating_point:
            return torch.full(shape, float("nan"), dtype=dtype, device=device)
        return torch.full(shape, 2**30, dtype=dtype, device=device)

    monkeypatch.setattr(mk, "_empty", poisoned)
    check(9, 64, 32, 8, 2, torch.float32, 32, False, 1.0, skew=1)
    check(9, 128, 64, 8, 2, torch.float32, 64, True, 1.0)  # h quantized in the down kernel's A-tile load
    check(9, 64, 32, 8, 2, torch.float32, 0, True, 1.0,
          config=mk.MoeConfig(16, mk.GemmConfig(32, 32, split_k=2), mk.GemmConfig(32, 32, split_k=2)))


def test_entry_point_dispatches_to_the_kernel(monkeypatch):
    experts = make_experts(8, 64, 32)
    x = torch.randn(4, 64).to(DEV)
    weights, ids = routing(4, 2, 8, 0)
    calls = []
    forward = mk.experts_forward
    monkeypatch.setattr(mk, "experts_forward", lambda *a, **kw: calls.append(1) or forward(*a, SMALL, **kw))
    out = moe.experts_forward(x, experts, weights, ids, 1.0, 32, True, backend="triton")
    assert calls and torch.equal(out, forward(x, experts, weights, ids, 1.0, 32, True, SMALL))
    moe.experts_forward(x, experts, weights, ids, 1.0, 32, True)  # the reference backend does not call it
    assert len(calls) == 1


def test_supports_only_fp4_stacks():
    E, D, I = 2, 64, 32
    fp4 = make_experts(E, D, I)
    x = torch.randn(1, D).to(DEV)
    assert mk.supports(x, fp4) and mk.supports(x.bfloat16(), fp4)
    assert mk.supports(x.double(), fp4) != ON_GPU  # float64 only under the interpreter
    assert not mk.supports(x.half(), fp4)
    f = torch.randn(E, I, D).to(DEV)
    assert not mk.supports(x, moe.ExpertWeights(f, torch.randn(E, D, I).to(DEV), f, None, None, None, 128))
    q = f.to(torch.float8_e4m3fn)
    s = torch.full((E, 1, 1), 127, dtype=torch.uint8, device=DEV)
    q2 = torch.randn(E, D, I).to(DEV, torch.float8_e4m3fn)
    assert not mk.supports(x, moe.ExpertWeights(q, q2, q, s, s, s, 128))


# ------------------------------------------------------------------------------------------------------------
# GPU only: real shapes, the PTX dequant, graph capture
# ------------------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("T", [1, 64, 512])
def test_v4_flash_shapes_bf16(T):
    # D=4096, I=2048, 16 experts, k=6: T=1/64 take the decode config, T=512 (192 rows per expert) the prefill one
    check(T, 4096, 2048, 16, 6, torch.bfloat16, 128, True, 10.0, config=None, experts=_flash_experts())


@gpu_only
@pytest.mark.parametrize("narrow,ahead", [("1", "0"), ("1", "1"), ("0", "0")])
def test_v41_flash_one_row_an_expert_bf16(narrow, ahead, monkeypatch):
    # D=5120, I=2304, 1 x 32 activation groups, 8 experts, k=6: one row an expert hit, the narrow tiles (split K 3),
    # with the scale bytes loaded an iteration ahead (V4SERVE_MOE_AHEAD) or in place
    monkeypatch.setenv(mk.NARROW_ENV, narrow)
    monkeypatch.setenv(mk.AHEAD_ENV, ahead)
    cfg = mk.select_config(6, 8, 5120, 2304, DEV, act_group=32)
    assert (cfg.gate_up.block_n == 64, cfg.ahead) == (narrow == "1", ahead == "1" and narrow == "1")
    out = check(1, 5120, 2304, 8, 6, torch.bfloat16, 32, True, 10.0, config=None, experts=_v41_experts(), seed=3)
    if ahead == "1":  # the same bits as the loads in place
        monkeypatch.setenv(mk.AHEAD_ENV, "0")
        assert torch.equal(out, check(1, 5120, 2304, 8, 6, torch.bfloat16, 32, True, 10.0, config=None,
                                      experts=_v41_experts(), seed=3))


@gpu_only
@pytest.mark.parametrize("body", ["swap", "fma", "fp8"])
@pytest.mark.parametrize("T", [1, 8, 64])
def test_v4_flash_decode_bodies_bf16(body, T):
    # E=256, k=6 as released: T=1 hits 6 experts (split K), T=64 ~1.5 rows per expert hit (fma: 2-row blocks)
    cfg = mk.decode_config(T * 6, 256, 4096, 2048, body, device=DEV)
    check(T, 4096, 2048, 256, 6, torch.bfloat16, 128, True, 10.0, config=cfg, experts=_flash_experts(256))


@gpu_only
@pytest.mark.parametrize("T,body", [(1, "dot"), (8, "dot"), (512, "dot"), (1, "swap"), (64, "swap"), (1, "fma"),
                                    (64, "fma"), (1, "fp8"), (8, "fp8")])
def test_ptx_dequant_matches_the_portable_one(T, body):
    experts = _flash_experts()
    x = torch.randn(T, 4096, device=DEV, dtype=torch.bfloat16)
    weights, ids = routing(T, 6, 16, 4)
    cfg = mk.decode_config(T * 6, 16, 4096, 2048, body, device=DEV)
    bits, asm = (mk.experts_forward(x, experts, weights, ids, 10.0, 128, False, dataclasses.replace(cfg, dequant=d))
                 for d in ("bits", "asm"))
    # the same bf16 weights (the PTX path's 2^-32 offset is undone exactly): equal up to accumulation order
    assert rel_err(asm, bits) <= 1e-6


@gpu_only
@pytest.mark.parametrize("T,body", [(1, "dot"), (8, "dot"), (1, "swap"), (8, "fma"), (1, "fp8"), (8, "fp8")])
def test_cuda_graph_replay(T, body):  # T=1 splits K
    experts = _flash_experts()
    x = torch.randn(T, 4096, device=DEV, dtype=torch.bfloat16)
    weights, ids = routing(T, 6, 16, 5)
    cfg = None if body == "dot" else mk.decode_config(T * 6, 16, 4096, 2048, body, device=DEV)
    fwd = lambda: mk.experts_forward(x, experts, weights, ids, 10.0, 128, True, cfg)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fwd()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fwd()
    w2, ids2 = routing(T, 6, 16, 6)  # new routing, same buffers
    weights.copy_(w2)
    ids.copy_(ids2)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fwd())


@gpu_only
@pytest.mark.parametrize("T", [1, 2])
def test_gate_up_finish_in_the_kernel_at_real_shapes(T):
    """V4-Flash shapes at decode (split K): the in-kernel split-K finish bit for bit the two-launch form, eagerly and
    replayed from a CUDA graph (its arrival counters re-zeroed by every launch)."""
    experts = _flash_experts()
    x = torch.randn(T, 4096, device=DEV, dtype=torch.bfloat16)
    weights, ids = routing(T, 6, 16, 8)
    cfg = mk.select_config(T * 6, 16, 4096, 2048, DEV)
    assert cfg.gate_up.split_k > 1
    kernel = dataclasses.replace(cfg, finish="kernel")
    want = mk.experts_forward(x, experts, weights, ids, 10.0, 128, True, dataclasses.replace(cfg, finish="launch"))
    assert torch.equal(mk.experts_forward(x, experts, weights, ids, 10.0, 128, True, kernel), want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = mk.experts_forward(x, experts, weights, ids, 10.0, 128, True, kernel)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


_FLASH: dict[int | str, moe.ExpertWeights] = {}


def _flash_experts(E: int = 16) -> moe.ExpertWeights:
    """E V4-Flash experts, quantized once per session (E > 16: weights drawn on the GPU, the CPU would take minutes)."""
    if E not in _FLASH:
        if E <= 16:
            _FLASH[E] = make_experts(E, 4096, 2048, seed=7)
        else:
            gen = torch.Generator(device=DEV).manual_seed(7)

            def stack(out_f: int, in_f: int) -> tuple[torch.Tensor, torch.Tensor]:
                qs = [quant.fp4_quantize_weight(torch.randn(out_f, in_f, device=DEV, generator=gen) * in_f ** -0.5)
                      for _ in range(E)]
                return (torch.stack([q.view(torch.uint8) for q, _ in qs]),
                        torch.stack([s.view(torch.uint8) for _, s in qs]))

            (w1, s1), (w3, s3), (w2, s2) = stack(2048, 4096), stack(2048, 4096), stack(4096, 2048)
            _FLASH[E] = moe.ExpertWeights(w1, w2, w3, s1, s2, s3, 128)
    return _FLASH[E]


def _v41_experts() -> moe.ExpertWeights:
    """8 experts of V4.1-Flash's shapes (D=5120, I=2304), quantized once per session."""
    if "v41" not in _FLASH:
        _FLASH["v41"] = make_experts(8, 5120, 2304, seed=8)
    return _FLASH["v41"]


SM90_LOOP = """
import json, re, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import moe as mk, moe_decode as md
cfg = mk.select_config(6, 256, body="dot")  # one decode row, top-6 of 256 experts
out = {}
gu_ptrs = {"x_ptr": "*bf16", "h_ptr": "*bf16", "part_ptr": "*fp32", "rw_ptr": "*fp32", "limit": "fp32"}
for name, fn, gemm, extra, ptrs in (
        ("gate_up", mk._gate_up_kernel, cfg.gate_up, dict(QUANT_H=True, WEIGHT_H=True, CLAMP=True), gu_ptrs),
        ("gate_up+finish", mk._gate_up_kernel, cfg.gate_up, dict(QUANT_H=True, WEIGHT_H=True, CLAMP=True,
                                                                FINISH=True), gu_ptrs),
        ("down", mk._down_kernel, cfg.down, dict(QUANT_A=False, COMBINE=False, TOPK=6, APPLY_W=False, ADD=False,
                                                 BT=16), {"h_ptr": "*bf16", "y_ptr": "*fp32"}),
        ("down+combine", mk._down_kernel, cfg.down, dict(QUANT_A=False, COMBINE=True, TOPK=6, APPLY_W=False,
                                                         ADD=True, BT=16),
         {"h_ptr": "*bf16", "y_ptr": "*fp32", "rw_ptr": "*fp32", "add_ptr": "*bf16", "out_ptr": "*bf16"}),
        ("fp8 gate_up+finish", md.gate_up_kernel, cfg.gate_up, dict(QUANT_H=True, WEIGHT_H=True, CLAMP=True,
                                                                   FINISH=True, BODY="fp8", STAGES=3,
                                                                   HDT=tl.bfloat16, FOLD=False),
         gu_ptrs | {"x_ptr": "*fp8e4nv", "h_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "hs_ptr": "*fp32"}),
        ("fp8 down", md.down_kernel, cfg.down, dict(QUANT_A=False, BODY="fp8", STAGES=3, FOLD=False),
         {"h_ptr": "*fp8e4nv", "hs_ptr": "*fp32", "y_ptr": "*fp32"}),
        # V4.1's down (I = 2304): 1152-byte weight rows, 72-byte scale rows (not a multiple of 16: Triton knows
        # nothing of their alignment)
        ("v41 down", mk._down_kernel, cfg.down, dict(QUANT_A=False, COMBINE=False, TOPK=6, APPLY_W=False, ADD=False,
                                                     BT=16, unaligned="stride_sn"),
         {"h_ptr": "*bf16", "y_ptr": "*fp32"})):
    unaligned = extra.pop("unaligned", "")
    const = dict(BM=cfg.block_m, BN=gemm.block_n, BK=gemm.block_k, GROUP_M=1, SPLIT=gemm.split_k, G=128, ASM=True,
                 PREC="tf32", ACC=tl.float32, F32=False, EVEN_K=True, **extra)
    if "AHEAD" in fn.arg_names:  # constexprs with defaults: the launch's values (`moe._body`)
        const.setdefault("AHEAD", False)
    if "ROWS" in fn.arg_names:
        const.setdefault("ROWS", gemm.row_loads)
    if "CLAMP_N" in fn.arg_names:
        const.setdefault("CLAMP_N", gemm.clamp_rows)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        weights = re.fullmatch(r"[ws][123]_ptr", n)  # FP4 bytes and their e8m0 scales
        sig[n] = "constexpr" if n in const else ptrs.get(n, "*u8" if weights else "*i32" if n.endswith("_ptr") else
                                                        "i32")
        if (sig[n].startswith("*") or n.startswith("stride") or n in ("D", "I")) and n != unaligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": gemm.num_warps, "num_stages": gemm.num_stages})
    ir = k.asm["ttgir"]
    loop = ir[ir.index("scf.for"):]
    loop = loop[:loop.index("scf.yield")]
    out[name] = {"sync": len(re.findall(r" tt[.]load ", loop)), "async": loop.count("async_copy_global_to_local")}
    # selects over tensors in the loop: a masked copy's `other` applied after it lands (scalar selects are the
    # pipeline's buffer indices)
    out.setdefault("selects", {})[name] = len(re.findall(r"arith[.]select [^\\n]*tensor<", loop))
    # the FP4 weight tiles' copies [BN, BK/2]: does a warp's lanes x vector span a row's BK/2 bytes (coalesced)?
    rows = []
    for layout in re.findall(r"async_copy_global_to_local .*: tensor<\\d+x" + str(gemm.block_k // 2)
                             + r"x!tt[.]ptr<i8>, (#\\w+)>", loop):
        spt, tpw = re.search("^" + layout + r" = #ttg[.]blocked<[{]sizePerThread = \\[\\d+, (\\d+)\\], "
                             r"threadsPerWarp = \\[\\d+, (\\d+)\\]", ir, re.M).groups()
        rows.append(int(spt) * int(tpw) == gemm.block_k // 2)
    out[name]["row_copies"] = rows
    out.setdefault("cg", {})[name] = "ld.global.cg" in k.asm["ptx"]
sig = {"y_ptr": "*fp32", "rw_ptr": "*fp32", "add_ptr": "*bf16", "out_ptr": "*bf16", "T": "i32", "D": "i32",
       "TOPK": "i32", "stride_y": "i32", "stride_ys": "i32", "stride_add": "i32", "stride_out": "i32",
       "BD": "constexpr", "SPLIT": "constexpr", "APPLY_W": "constexpr", "DT": "constexpr", "ACC": "constexpr",
       "ADD": "constexpr", "PDL": "constexpr"}
const = dict(BD=1024, SPLIT=2, APPLY_W=True, DT=tl.bfloat16, ACC=tl.float32, ADD=True, PDL=True)
k = triton.compile(ASTSource(mk._combine_kernel, sig, const), target=GPUTarget("cuda", 90, 32))
out["cg"]["combine"] = "ld.global.cg" in k.asm["ptx"]
print(json.dumps(out))
"""


def test_decode_k_loop_loads_are_all_async_copies_on_sm90() -> None:
    """Compiled for sm_90 (Triton's bundled ptxas, no GPU needed; a fresh process, outside the interpreter): in the
    decode gate-up and down kernels every load of the K loop (x, the FP4 weights and their e8m0 scales) is an async
    copy that the pipeliner issues stages ahead. A scale load masked per byte stays a plain load that each iteration
    waits for (EVEN_K drops that mask): on the H200 that wait cost the gate-up 48 -> 36 us per layer."""
    loops = json.loads(run_compile(SM90_LOOP).strip().splitlines()[-1])
    # x, w1, w3, s1, s3; each weight tile copied as whole rows: a warp reads 64-byte rows, not a 16-byte piece of 32
    # rows (the [BN, BK/32, 16] load did that: ncu, V4.1 gate-up at 32 tokens: 2x the L2 sectors and 7x the shared
    # memory wavefronts of its weight copies)
    assert loops["gate_up"] == {"sync": 0, "async": 5, "row_copies": [True, True]}, loops
    assert loops["gate_up+finish"] == loops["gate_up"], loops  # the in-kernel split-K finish leaves the loop alone
    assert loops["down"] == {"sync": 0, "async": 3, "row_copies": [True]}, loops  # h, w2, s2
    assert loops["down+combine"] == loops["down"], loops  # the fused combine (after the loop) leaves it alone
    # scale rows Triton cannot know aligned still one vector a row (their offsets written as multiples of BK/32)
    assert loops["v41 down"] == loops["down"], loops
    # the weight rows clamped (`GemmConfig.clamp_rows`): no row masks, so no select after a copy lands (the masked
    # scale copies' `other` had been 32 of the 954 SASS instructions of a warp's K tile in V4.1's gate-up)
    assert not any(loops["selects"][n] for n in ("gate_up", "gate_up+finish", "down", "down+combine", "v41 down")), \
        loops["selects"]
    # the combine reads the rows other programs wrote past L1 (not coherent across SMs): in the fused down and alone
    assert loops["cg"]["down+combine"] and loops["cg"]["combine"], loops["cg"]
    # the fp8 body: per 32-group of a 128-wide K tile, x's e4m3 rows and each weight's 16 bytes a row (no [BN, BK/2]
    # copy); a tile's scales
    assert loops["fp8 gate_up+finish"] == {"sync": 0, "async": 4 * 3 + 3, "row_copies": []}, loops  # + s1, s3, xs
    assert loops["fp8 down"] == {"sync": 0, "async": 4 * 2 + 2, "row_copies": []}, loops  # + s2, hs


@pytest.mark.parametrize("T,split,before,with_shared", [(1, 1, True, True), (5, 2, False, True), (37, 2, True, False),
                                                        (6, 1, False, False)])
def test_combine_in_the_down_kernel(T, split, before, with_shared, monkeypatch):
    """Fusion `moe_combine`: the down kernel's last program of each column tile runs the combine's sums over every
    token (blocks of 16: T = 37 takes three), idle row blocks still arriving. The layer's output bit for bit that of
    the combine launch, with split-K partials or without, the routing weights applied there or before w2, the shared
    output added or not; `join` runs before the down launch, and the combine kernel does not run."""
    if ON_GPU:
        pytest.skip("float64 under the CPU interpreter (the GPU runs it in the model tests with V4SERVE_FUSIONS)")
    D, I, E, k = 96, 64, 6, 3
    experts = make_experts(E, D, I, seed=8)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(T, D, generator=gen, dtype=torch.float64)
    shared = torch.randn(T, D, generator=gen, dtype=torch.float64) if with_shared else None
    weights, ids = routing(T, k, E, seed=10)
    cfg = mk.MoeConfig(16, mk.GemmConfig(32, 32, split_k=split), mk.GemmConfig(32, 32, split_k=split))

    def run(fusions: str) -> tuple[torch.Tensor, int, list[str]]:
        monkeypatch.setenv("V4SERVE_FUSIONS", fusions)
        launches, order = [0], []
        real = mk._combine_kernel

        class Counted:
            def __getitem__(self, grid):
                launches[0] += 1
                return real[grid]

        monkeypatch.setattr(mk, "_combine_kernel", Counted())
        buf = torch.zeros(T, D, dtype=torch.float64) if with_shared else None
        real_down = mk._down_kernel

        class Down:
            def __getitem__(self, grid):
                order.append("down")
                return real_down[grid]

        monkeypatch.setattr(mk, "_down_kernel", Down())

        def join():
            order.append("join")
            if buf is not None:
                buf.copy_(shared)

        out = mk.experts_forward(x, experts, weights, ids, 1.0, 32, before, cfg, shared=buf, join=join)
        monkeypatch.setattr(mk, "_combine_kernel", real)
        monkeypatch.setattr(mk, "_down_kernel", real_down)
        return out, launches[0], order

    plain, n_plain, order_plain = run("none")
    fused, n_fused, order_fused = run("moe_combine")
    assert n_plain == 1 and n_fused == 0
    assert order_plain == ["down", "join"] and order_fused == ["join", "down"]
    assert torch.equal(fused, plain)
    ref = moe.experts_reference(x, experts, weights, ids, 1.0, 32, before, shared)
    assert rel_err(fused, ref) <= TOL[torch.float64]


SM90_FOLD = """
import json, re, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import moe_decode as md
gemm = dict(BM=128, BN=128, BK=128, GROUP_M=8, SPLIT=1, G=128, ASM=True, PREC="tf32", ACC=tl.float32, F32=False,
            EVEN_K=True, BODY="fp8", STAGES=3, FOLD=FOLD_FLAG)
gu_ptrs = {"x_ptr": "*fp8e4nv", "h_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "hs_ptr": "*fp32", "part_ptr": "*fp32",
           "rw_ptr": "*fp32", "limit": "fp32"}
out = {}
for name, fn, extra, ptrs in (
        ("gate_up", md.gate_up_kernel, dict(QUANT_H=True, WEIGHT_H=True, CLAMP=True, HDT=tl.bfloat16), gu_ptrs),
        ("down", md.down_kernel, dict(QUANT_A=False), {"h_ptr": "*fp8e4nv", "hs_ptr": "*fp32", "y_ptr": "*bf16"})):
    const = gemm | extra
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        weights = re.fullmatch(r"[ws][123]_ptr", n)
        sig[n] = "constexpr" if n in const else ptrs.get(n, "*u8" if weights else "*i32" if n.endswith("_ptr") else
                                                        "i32")
        if sig[n].startswith("*") or n.startswith("stride") or n in ("D", "I"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 8, "num_stages": 3})
    ir = k.asm["ttgir"]
    loop = ir[ir.index("scf.for"):]
    loop = loop[:loop.index("scf.yield")]
    dots = re.findall(r"warp_group_dot [^\\n]*", loop)
    out[name] = {"sync": len(re.findall(r" tt[.]load ", loop)), "async": loop.count("async_copy_global_to_local"),
                 "wgmma": len(dots), "fp8": all("f8E4M3FN" in d for d in dots),
                 "waits": loop.count("warp_group_dot_wait")}
print(json.dumps(out))
"""


def test_folded_fp8_body_compiles_for_sm90() -> None:
    """The fold at the prefill tiles (128 x 128 x 128, 8 warps, 3 stages), compiled for sm_90 without a GPU, against
    the per-group fp8 body at the same tiles (one FP8 wgmma per 32-group, each waited for and scaled): "tile" is one
    FP8 wgmma a K tile per GEMM (w1, w3; w2), so one wait; "group" keeps a wgmma per group, chained without scales
    between them. (Register spills show only when a GPU loads the kernel, or in `benchmarks/kernels/moe.py
    --compile-only`.)"""
    got = {name: json.loads(run_compile(SM90_FOLD.replace("FOLD_FLAG", str(flag))).strip().splitlines()[-1])
           for name, flag in (("tile", 1), ("group", 2), ("per-group", 0))}
    assert [got[n]["gate_up"]["wgmma"] for n in got] == [2, 8, 8], got
    assert [got[n]["down"]["wgmma"] for n in got] == [1, 4, 4], got
    assert got["tile"]["gate_up"]["waits"] == 2 and got["tile"]["down"]["waits"] == 1, got
    assert all(got[n][k]["fp8"] for n in got for k in ("gate_up", "down")), got
    # async: x (h) and the FP4 bytes, the activation scales; plain loads: the e8m0 bytes, 4 a row (2 a thread over 8
    # warps, under cp.async's 4), loaded a tile ahead by hand (moe_decode._scales)
    assert (got["tile"]["gate_up"]["async"], got["tile"]["gate_up"]["sync"]) == (4, 2), got
    assert (got["tile"]["down"]["async"], got["tile"]["down"]["sync"]) == (3, 1), got
    assert (got["group"]["gate_up"]["async"], got["group"]["gate_up"]["sync"]) == (4 * 3 + 1, 2), got
    assert (got["group"]["down"]["async"], got["group"]["down"]["sync"]) == (4 * 2 + 1, 1), got
