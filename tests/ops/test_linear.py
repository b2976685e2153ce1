"""The linear family: the Triton kernels (ops/kernels/fp8_gemm.py, kernels/quant.py) against the plain-torch
reference (ops/linear.py) on fresh random inputs, under Triton's interpreter on the CPU and at real shapes on a GPU.

* FP8 activation quantization is bit-exact with `quant.fp8_quantize` (values and power-of-two scales).
* W8A8 / W8A16 / wide-dot GEMMs over FP8 block-scaled (32 and 128) and plain float weights: M = 1, ragged M, N and K
  not multiples of the tiles, split-K, the grouped `wo_a` form; fp32/fp64 equal the reference to rounding.
* A `Linear` keeps the stored tensors (no full-precision copy) and dispatches by the backend it was built under.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from sm90_compile import run_compile

from v4serve.ops import backend, quant
from v4serve.ops.kernels import fp8_gemm, fp8_gemv
from v4serve.ops.kernels import quant as kquant
from v4serve.ops.linear import Linear, RowStack, grouped_linear, grouped_linear_reference, linear, linear_reference

GPU = os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") and torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
# float32 activations: exact IEEE dots under the interpreter; on the GPU the kernel splits x into two bf16 halves for the
# tensor cores (16 of its 24 mantissa bits), which the H200 run measured at up to 3.5e-6 relative
F32_TOL = 2e-5 if GPU else 2e-6


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def fp8_weight(n: int, k: int, block: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=g) * k ** -0.5 * torch.logspace(-2, 1, k)[None, :].roll(n % 7, 1)
    q, s = quant.fp8_block_quantize_weight(w, block)
    return q.to(DEV), s.view(torch.uint8).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 128])
def test_act_quant_is_bit_exact(dtype: torch.dtype, group: int) -> None:
    g = torch.Generator().manual_seed(group)
    x = (torch.randn(7, 512, generator=g) * torch.logspace(-7, 3, 512)).to(dtype)
    x[2, :group] = 0  # an all-zero group: the 1e-4 amax floor
    x[3, 5] = 448.0 * 2.0**-3  # a value on a binade edge
    x = x.to(DEV)
    if dtype == torch.float64 and GPU:
        pytest.skip("fp64 kernels run only under the CPU interpreter")
    q, s = kquant.act_quant(x, group)
    rq, rs = quant.fp8_quantize(x, group)
    assert torch.equal(q.float(), rq.float()) and torch.equal(s, rs)
    assert torch.equal(kquant.act_simulate(x, group), quant.fp8_simulate(x, group))


def test_e4m3_rounding_ties_to_even_and_carries() -> None:
    # ties (17 between 16 and 18 -> 16; 29 between 28 and 30 -> 28), a carry into the next binade (31.3 -> 32) and
    # subnormals (2**-9 steps): the cases Triton's interpreter cast gets wrong and the kernels round by hand
    x = torch.tensor([17.0, 29.0, 31.3, -31.3, 0.001, 0.0029, 300.0, 440.0] * 4).view(1, 32).to(DEV)
    q, s = kquant.act_quant(x, 32)
    rq, rs = quant.fp8_quantize(x, 32)
    assert torch.equal(q.float(), rq.float()) and torch.equal(s, rs)


SHAPES = [(1, 96, 256), (5, 64, 128), (70, 200, 384), (3, 48, 96), (130, 72, 256)]


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp8_gemm_matches_reference(block: int, dtype: torch.dtype) -> None:
    if dtype == torch.float64 and GPU:
        pytest.skip("fp64 kernels run only under the CPU interpreter")
    g = torch.Generator().manual_seed(block)
    tol = {torch.float32: F32_TOL, torch.float64: 1e-12, torch.bfloat16: 1.6e-2}[dtype]
    for M, N, K in SHAPES:
        if K % block:
            continue
        q, s = fp8_weight(N, K, block, g)
        for act in (0, block):
            x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
            out = fp8_gemm.linear(x, q, s, block, act)
            ref = linear_reference(x, q, s, block, act)
            assert out.dtype == x.dtype and out.shape == ref.shape
            assert torch.isfinite(out).all()
            assert rel(out, ref) < tol, (M, N, K, act, rel(out, ref))


@pytest.mark.parametrize("block", [32, 128])
def test_w8a8_values_on_the_half_precision_dot(block: int) -> None:
    """cfg {"a_fp8": False}: the W8A8 linear's values (x FP8-simulated per the block) through the bf16 dot with the
    weight widened per tile, instead of FP8 dots rescaled per block: the reference's result, ragged M / N."""
    g = torch.Generator().manual_seed(40 + block)
    for M, N, K in ((70, 200, 384), (5, 64, 256)):
        q, s = fp8_weight(N, K, block, g)
        x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(DEV)
        out = fp8_gemm.general(x.view(M, 1, K), q, s, block, block, torch.bfloat16, cfg={"a_fp8": False})
        ref = linear_reference(x.float(), q, s, block, block)
        assert rel(out.view(M, N), ref) < 1e-2, (M, N, K)
        fp8 = fp8_gemm.general(x.view(M, 1, K), q, s, block, block, torch.bfloat16, cfg={})
        assert rel(out.view(M, N), fp8.view(M, N)) < 1e-2


@pytest.mark.parametrize("act", [0, 32])
def test_no_scale_read_past_k(act: int) -> None:
    """K (32) smaller than the kernel's K tile: the sub-blocks past K must not read scales. The scale tensors are
    views into buffers whose next columns hold 255 (2**128): a read past K would turn the output into inf/NaN."""
    g = torch.Generator().manual_seed(8)
    q, s = fp8_weight(512, 32, 32, g)
    poisoned = torch.full((s.shape[0], s.shape[1] + 8), 255, dtype=torch.uint8, device=DEV)
    poisoned[:, : s.shape[1]] = s
    x = torch.randn(60, 32, generator=g).to(torch.bfloat16 if GPU else torch.float32).to(DEV)
    out = fp8_gemm.linear(x, q, poisoned[:, : s.shape[1]], 32, act)
    assert torch.isfinite(out).all()
    assert rel(out, linear_reference(x, q, s, 32, act)) < (1.6e-2 if GPU else 2e-6)


def test_short_prefill_grids_split_k() -> None:
    """Prefill grids under one wave (V4.1's 128-token decoder suffixes: `wq_a` 14 tiles, `wo_b` 40) split K into as
    many shares as still fit one wave, keeping 2 K blocks a share; full grids do not split."""
    assert fp8_gemm.prefill_splits(14, 40) == 9 and fp8_gemm.prefill_splits(40, 64) == 3
    assert fp8_gemm.prefill_splits(64, 32) == 2 and fp8_gemm.prefill_splits(80, 64) == 1
    assert fp8_gemm.prefill_splits(256, 10) == 1 and fp8_gemm.prefill_splits(14, 3) == 1
    assert fp8_gemm.prefill_splits(1, 400) == 16


@pytest.mark.parametrize("block", [32, 128])
def test_prefill_rows_split_k_finished_in_the_kernel(block: int) -> None:
    """Prefill rows (M > 64, two row tiles) with K split as short grids take it: W8A8 on the FP8 dots, the partials
    added by each tile's last program in split order (the same bits as the sum launch, deterministic) = the reference
    to bf16 rounding; ragged M and N, a short last share."""
    g = torch.Generator().manual_seed(60 + block)
    M, N, K = 80, 72, 11 * 32 if block == 32 else 5 * 128
    q, s = fp8_weight(N, K, block, g)
    x = torch.randn(M, 1, K, generator=g).to(torch.bfloat16 if GPU else torch.float32).to(DEV)
    cfg = {"splits": 3, "BK": max(block, 64)}
    fused = fp8_gemm.general(x, q, s, block, block, torch.float32, cfg)
    two = fp8_gemm.general(x, q, s, block, block, torch.float32, {**cfg, "finish": False})
    assert torch.equal(fused, two)
    assert torch.equal(fused, fp8_gemm.general(x, q, s, block, block, torch.float32, cfg))
    ref = linear_reference(x.view(M, K).float(), q, s, block, block)
    assert rel(fused.view(M, N), ref) < (1e-2 if GPU else F32_TOL)
    if GPU:
        assert int(fp8_gemm._COUNTERS.get(x.device).abs().sum()) == 0


def test_split_k_partials_sum_in_a_fixed_order() -> None:
    g = torch.Generator().manual_seed(3)
    q, s = fp8_weight(64, 2048, 128, g)  # 1 row x 1 column tile: K splits across programs
    x = torch.randn(2, 2048, generator=g).to(DEV)
    assert fp8_gemm._config(2, 64, 2048, 1, 128, False)["splits"] > 1
    a, b = fp8_gemm.linear(x, q, s, 128), fp8_gemm.linear(x, q, s, 128)
    assert torch.equal(a, b)
    assert rel(a, linear_reference(x, q, s, 128, 0)) < F32_TOL


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("swap", [False, True])
def test_one_launch_decode_gemm(block: int, act: int, swap: bool) -> None:
    """fp8_gemv (M <= 64, in-register activation quantization, split-K finished by the last program to arrive) equals
    the reference, gives the same bits twice, and leaves its arrival counters zeroed (graph replays reuse them); with
    `swap` the weight is the dot's first operand (the accumulator transposed)."""
    g = torch.Generator().manual_seed(block + act)
    act = act * block
    for M, G, N, K in ((1, 1, 96, 1024), (5, 1, 200, 768), (64, 1, 64, 2048), (3, 4, 48, 512)):
        q, s = fp8_weight(G * N, K, block, g)
        x = torch.randn(M, G, K, generator=g).to(torch.bfloat16).to(DEV)
        assert fp8_gemv.supports(x, q, block, act) and fp8_gemv.config(M, N, K, G, block)["splits"] > 1
        out = fp8_gemv.run(x, q, s, block, act, torch.bfloat16, {"swap": swap})
        again = fp8_gemv.run(x, q, s, block, act, torch.bfloat16, {"swap": swap})
        assert torch.equal(out, again)
        ref = grouped_linear_reference(x.float(), q, s, block, act)
        assert rel(out, ref) < 1e-2, (M, G, N, K, rel(out, ref))
        if GPU:
            assert int(fp8_gemv._COUNTERS.get(x.device).abs().sum()) == 0


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("swap", [False, True])
def test_decode_gemm_dequantized_bf16_dots(block: int, swap: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8_gemv's `deq` form (W8A8 on bf16 tensor cores: both e4m3 operands times their power-of-two scales, exact in
    bf16, one dot chained over K) equals the reference as the FP8 dots do, with in-register and prequantized
    activations, the same bits twice; V4SERVE_GEMV_DEQ=1 gives the tensor-core configs it (not the one-row CUDA-core
    form, not W8A16)."""
    g = torch.Generator().manual_seed(3 * block + swap)
    for M, G, N, K in ((2, 1, 96, 1024), (5, 1, 200, 768), (32, 1, 64, 512), (3, 4, 48, 512)):
        q, s = fp8_weight(G * N, K, block, g)
        x = torch.randn(M, G, K, generator=g).to(torch.bfloat16).to(DEV)
        ref = grouped_linear_reference(x.float(), q, s, block, block)
        cfg = {"deq": True, "swap": swap}
        out = fp8_gemv.run(x, q, s, block, block, torch.float32, cfg)
        assert rel(out, ref) < F32_TOL, (M, G, N, K, rel(out, ref))
        assert torch.equal(out, fp8_gemv.run(x, q, s, block, block, torch.float32, cfg))
        assert rel(fp8_gemv.run(x, q, s, block, block, torch.float32, cfg, prequant=True), ref) < F32_TOL
    if not GPU:
        monkeypatch.setattr(fp8_gemv, "interpreting", lambda: False)  # the GPU's configs
    assert not fp8_gemv.config(32, 4096, 8192, 1, 32)["deq"]
    monkeypatch.setenv(fp8_gemv.DEQ_ENV, "1")
    assert fp8_gemv.config(32, 4096, 8192, 1, 32)["deq"] and fp8_gemv.config(2, 4096, 8192, 1, 128)["deq"]
    assert not fp8_gemv.config(32, 4096, 8192, 8, 128, w8a8=False)["deq"]
    one = fp8_gemv.config(1, 4096, 8192, 1, 32)  # one row: the CUDA-core form (by default), else deq too
    assert one["fma"] != bool(one.get("deq"))


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("act", [0, 1])
def test_few_row_gemv_on_the_cuda_cores(block: int, act: int) -> None:
    """fp8_gemv's `fma` form (up to FMA_MAX_ROWS rows: whole weight tiles widened in registers once for all rows,
    float32 products summed per scale block) equals the reference at every tile and split, with in-register and
    prequantized activations, ragged N and a K that ends inside a tile; it refuses more rows."""
    g = torch.Generator().manual_seed(7 * block + act)
    act = act * block
    for M, G, N, K in ((1, 1, 96, 1024), (3, 4, 48, 512), (1, 1, 200, 3 * block), (4, 1, 40, 2 * block),
                       (2, 1, 64, 256)):
        q, s = fp8_weight(G * N, K, block, g)
        x = torch.randn(M, G, K, generator=g).to(torch.bfloat16).to(DEV)
        ref = grouped_linear_reference(x.float(), q, s, block, act)
        for cfg in ({"BK": 256}, {"BK": 512, "splits": 1}, {"BN": 32, "BK": 128, "splits": 3},
                    {"BN": 32, "BK": 128, "splits": 2, "fma_stages": 3}):  # (the weight loads pipelined on the GPU)
            cfg = {**cfg, "fma": True}
            out = fp8_gemv.run(x, q, s, block, act, torch.float32, cfg)
            assert rel(out, ref) < F32_TOL, (M, G, N, K, cfg, rel(out, ref))
            assert torch.equal(out, fp8_gemv.run(x, q, s, block, act, torch.float32, cfg))
            if act:
                assert rel(fp8_gemv.run(x, q, s, block, act, torch.float32, cfg, prequant=True), ref) < F32_TOL
        if GPU:
            assert int(fp8_gemv._COUNTERS.get(x.device).abs().sum()) == 0
    with pytest.raises(ValueError, match="at most"):
        fp8_gemv.run(x[:1].expand(fp8_gemv.FMA_MAX_ROWS + 1, -1, -1), q, s, block, act, torch.float32, {"fma": True})


@pytest.mark.parametrize("wdtype", ["fp8", "bf16"])
def test_decode_split_k_finished_in_the_kernel(wdtype: str) -> None:
    """Decode rows of the general kernel (float32 x: the compressors' bf16 weights, FP8 weights without the GEMV) add
    their split-K partials in the last program to arrive, in split order: the same bits as the separate sum launch,
    deterministic, counters left zeroed."""
    g = torch.Generator().manual_seed(5)
    N, K = 96, 2048
    if wdtype == "fp8":
        q, s = fp8_weight(N, K, 128, g)
    else:
        q, s = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16).to(DEV), None
    for M, G in ((1, 1), (5, 1), (3, 2)):
        x = torch.randn(M, G, K // G if G > 1 else K, generator=g).to(DEV)
        w = q if G == 1 else q[:, : K // G].repeat(G, 1).contiguous()
        ws = s if G == 1 or s is None else s[:, : (K // G) // 128].repeat(G, 1).contiguous()
        cfg = fp8_gemm._config(M, N, x.shape[-1], G, 128, False, True)
        assert cfg["splits"] > 1, (M, G)
        fused = fp8_gemm.general(x, w, ws, 128, 0, torch.float32, {"finish": True})
        two = fp8_gemm.general(x, w, ws, 128, 0, torch.float32, {"finish": False})
        assert torch.equal(fused, two)
        assert torch.equal(fused, fp8_gemm.general(x, w, ws, 128, 0, torch.float32, {"finish": True}))
        ref = grouped_linear_reference(x, w, ws, 128, 0)
        tol = 1e-4 if GPU and wdtype == "bf16" else F32_TOL  # GPU: x as two bf16 halves on the tensor cores
        assert rel(fused, ref) < tol, rel(fused, ref)
        if GPU:
            assert int(fp8_gemm._COUNTERS.get(x.device).abs().sum()) == 0


@pytest.mark.parametrize("block", [32, 128])
def test_decode_gemm_with_prequantized_activations(block: int) -> None:
    """Large W8A8 weights: the activations quantized by act_quant first, the split-K still finished in the kernel. The
    same values as the in-register quantization (both are kernels/quant's rounding), so the outputs agree bit for bit
    up to the order of the scale products; and the automatic choice takes this path above MAX_WEIGHT_BYTES."""
    g = torch.Generator().manual_seed(block)
    for M, G, N, K in ((1, 1, 96, 1024), (7, 1, 200, 768), (3, 2, 48, 512)):
        q, s = fp8_weight(G * N, K, block, g)
        x = torch.randn(M, G, K, generator=g).to(torch.bfloat16).to(DEV)
        pre = fp8_gemv.run(x, q, s, block, block, torch.float32, prequant=True)
        inreg = fp8_gemv.run(x, q, s, block, block, torch.float32, prequant=False)
        assert torch.equal(pre, fp8_gemv.run(x, q, s, block, block, torch.float32, prequant=True))
        assert rel(pre, inreg) < 1e-6, rel(pre, inreg)
        assert rel(pre, grouped_linear_reference(x.float(), q, s, block, block)) < 1e-2
    assert fp8_gemv.prequantize(torch.empty(fp8_gemv.MAX_WEIGHT_BYTES + 1, dtype=torch.uint8), block)
    assert not fp8_gemv.prequantize(torch.empty(16, dtype=torch.uint8), block)
    assert not fp8_gemv.prequantize(torch.empty(fp8_gemv.MAX_WEIGHT_BYTES + 1, dtype=torch.uint8), 0)


@pytest.mark.parametrize("block", [32, 128])
def test_decode_gemm_lean_addressing(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leaner K loop (cfg "full": no K masks when K is a multiple of the K tile; "scales_t": the prequantized x's
    scales transposed by act_quant; "pair_scales": the two scales multiplied first) gives the same bits as the masked,
    row-major form: prequantized or in registers, swapped or not, K ragged against the tile (then "full" stays off),
    rows not a power of two; the transposed scales equal act_quant's; all three are the default for 32-wide blocks
    only, and V4SERVE_GEMV_LEAN=1 / 0 forces them on / off."""
    g = torch.Generator().manual_seed(3 * block)
    ragged_k = 544 if block == 32 else 640  # 544: not a multiple of the 128-wide K tile ("full" stays off)
    for M, G, N, K in ((1, 1, 96, 1024), (7, 1, 200, 768), (19, 1, 64, ragged_k), (3, 2, 48, 512)):
        q, s = fp8_weight(G * N, K, block, g)
        x = torch.randn(M, G, K, generator=g).to(torch.bfloat16).to(DEV)
        for pre in (True, False):
            for swap in (True, False):
                plain_loop = {"swap": swap, "full": False, "scales_t": False, "pair_scales": False}
                base = fp8_gemv.run(x, q, s, block, block, torch.float32, plain_loop, prequant=pre)
                for lean_cfg in ({"full": True, "scales_t": True}, {"pair_scales": True},
                                 {"full": True, "scales_t": True, "pair_scales": True}):
                    lean = fp8_gemv.run(x, q, s, block, block, torch.float32, {**plain_loop, **lean_cfg},
                                        prequant=pre)
                    assert torch.equal(lean, base), (M, G, N, K, pre, swap, lean_cfg)
    x = torch.randn(5, 1, 256, generator=g).to(DEV)
    rq, rs = kquant.act_quant(x, block)
    tq, ts = kquant.act_quant(x, block, scale_rows=16)
    assert torch.equal(tq.float(), rq.float()) and torch.equal(ts, rs) and ts.stride()[-1] == 16 and ts.stride(0) == 1
    with pytest.raises(ValueError, match="do not fit"):
        kquant.act_quant(x, block, scale_rows=4)
    keys = ("full", "scales_t", "pair_scales")
    monkeypatch.delenv(fp8_gemv.LEAN_ENV, raising=False)
    assert all(fp8_gemv.config(32, 5120, 8192, 1, 32)[k] for k in keys)  # the default for 32-wide blocks
    assert not any(fp8_gemv.config(32, 4096, 8192, 1, 128)[k] for k in keys)
    assert not any(fp8_gemv.config(32, 4096, 8192, 1, 128, plain=True)[k] for k in keys)
    monkeypatch.setenv(fp8_gemv.LEAN_ENV, "1")
    assert all(fp8_gemv.config(32, 4096, 8192, 1, 128)[k] for k in keys)
    monkeypatch.setenv(fp8_gemv.LEAN_ENV, "0")
    assert not any(fp8_gemv.config(32, 5120, 8192, 1, 32)[k] for k in keys)


def test_deep_pipeline_for_long_lean_k_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in (V4SERVE_GEMV_DEEP=1): six stages only for the lean swapped loop over 32 rows walking >= DEEP_MIN_TILES
    K tiles a program (V4.1's wo_b); four otherwise and by default. (Stages change the schedule, not the arithmetic.)"""
    monkeypatch.setattr(fp8_gemv, "interpreting", lambda: False)  # the GPU's configs
    monkeypatch.delenv(fp8_gemv.LEAN_ENV, raising=False)
    monkeypatch.delenv(fp8_gemv.DEEP_ENV, raising=False)

    def stages(M: int, N: int, K: int, sb: int) -> int:
        return fp8_gemv.config(M, N, K, 1, sb)["num_stages"]

    assert stages(32, 5120, 8192, 32) == 4  # off by default
    monkeypatch.setenv(fp8_gemv.DEEP_ENV, "1")
    assert stages(32, 5120, 8192, 32) == 6  # V4.1 wo_b: 16 K tiles a program
    assert stages(8, 5120, 8192, 32) == 4 and stages(32, 32768, 1280, 32) == 4  # 8 rows; wq_b's 10 tiles
    assert stages(32, 4096, 8192, 128) == 4  # V4's 128-wide blocks: no lean loop


@pytest.mark.parametrize("block", [32, 128])
def test_grouped_linear_matches_reference(block: int) -> None:
    g = torch.Generator().manual_seed(11)
    G, N, K = 4, 48, 256  # N not a multiple of the scale block: a group's rows start mid-block
    q, s = fp8_weight(G * N, K, block, g)
    x = torch.randn(9, G, K, generator=g).to(DEV)
    out = fp8_gemm.grouped_linear(x, q, s, block)
    assert rel(out, grouped_linear_reference(x, q, s, block, 0)) < F32_TOL


@pytest.mark.parametrize("block,act", [(32, 0), (128, 128), (32, 32)])
def test_grouped_prefill_rows_as_one_batched_gemm(block: int, act: int) -> None:
    """Grouped prefill rows (G > 1, from BMM_MIN_ROWS on the GPU): the weight widened exactly, x FP8-simulated, the G
    products in one batched GEMM written in place: the reference's own computation (its einsum is the same bmm)."""
    g = torch.Generator().manual_seed(12)
    G, N, K = 4, 48, 256
    q, s = fp8_weight(G * N, K, block, g)
    x = torch.randn(40, G, K, generator=g).to(DEV, torch.bfloat16)
    bf16 = torch.bfloat16
    assert fp8_gemm._takes_bmm(x[:1].expand(fp8_gemm.BMM_MIN_ROWS, G, K), q, s, block, None, bf16) == GPU
    assert not fp8_gemm._takes_bmm(x[:1].expand(fp8_gemm.BMM_MIN_ROWS - 1, G, K), q, s, block, None, bf16)
    assert not fp8_gemm._takes_bmm(x, q, s, block, None, bf16)
    assert not fp8_gemm._takes_bmm(x, q, s, block, {"BN": 64}, bf16)
    assert not fp8_gemm._takes_bmm(x.float(), q, s, block, {"bmm": True}, torch.float32)
    got = fp8_gemm.general(x, q, s, block, act, torch.bfloat16, cfg={"bmm": True})
    ref = grouped_linear_reference(x, q, s, block, act)
    assert got.shape == (40, G, N) and got.is_contiguous() and got.dtype == torch.bfloat16
    assert rel(got, ref) < (1e-2 if GPU else 1e-6)
    assert rel(got, fp8_gemm.general(x, q, s, block, act, torch.bfloat16, cfg={"BM": 16})) < 1e-2


@pytest.mark.parametrize("block,act", [(32, 32), (32, 0)])
def test_prefill_rows_of_32_blocks_on_the_widened_weight(block: int, act: int) -> None:
    """V4.1's plain linears (G = 1, 32 x 32 blocks: no cuBLAS FP8 recipe) take the widened weight from
    BMM_MIN_ROWS_B32 on the GPU, V4's 128 x 128 ones keep the FP8 paths; the widened product is the reference's
    computation."""
    g = torch.Generator().manual_seed(13)
    N, K = 80, 256
    q, s = fp8_weight(N, K, block, g)
    x = torch.randn(33, K, generator=g).to(DEV, torch.bfloat16)
    rows = x[:1].expand(fp8_gemm.BMM_MIN_ROWS_B32, K).unsqueeze(1)
    assert fp8_gemm._takes_bmm(rows, q, s, block, None, torch.bfloat16) == GPU
    assert not fp8_gemm._takes_bmm(rows[1:], q, s, block, None, torch.bfloat16)
    q128, s128 = fp8_weight(N, K, 128, g)
    assert not fp8_gemm._takes_bmm(rows, q128, s128, 128, None, torch.bfloat16)
    got = fp8_gemm.general(x.unsqueeze(1), q, s, block, act, torch.bfloat16, cfg={"bmm": True})
    ref = linear_reference(x, q, s, block, act)
    assert got.shape == (33, 1, N) and got.dtype == torch.bfloat16
    assert rel(got[:, 0], ref) < (1e-2 if GPU else 1e-6)
    assert rel(got[:, 0], fp8_gemm.linear(x, q, s, block, act)) < 1e-2
    if act:  # rows quantized by their producer (the norm's fused quantization): the same values, the same product
        xq, xs = kquant.act_quant(x, act)
        fed = fp8_gemm.general(xq.unsqueeze(1), q, s, block, act, torch.bfloat16, cfg={"bmm": True},
                               xs=xs.unsqueeze(1))
        assert torch.equal(fed, got)


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32])
def test_plain_float_weight_with_wider_activations(wdtype: torch.dtype) -> None:
    """The LM head and the compressors: a bf16 weight read as stored under float32 math (no upcast copy)."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(300, 64, generator=g).to(wdtype).to(DEV)
    x = torch.randn(3, 64, generator=g).to(DEV)
    out = fp8_gemm.linear(x, w, None, 0)
    assert out.dtype == torch.float32
    assert rel(out, linear_reference(x, w, None, 0, 0)) < F32_TOL


@pytest.mark.parametrize("name", sorted(fp8_gemm.HEAD_TILES))
def test_head_tiles(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LM head's decode tiles (float32 x over a bf16 weight, K tiles of 64 as well as 128), each choice against
    the reference with N and K ragged against the tiles. On the GPU through the rule (HEAD_TILES_ENV, rows and N past
    its thresholds); under the interpreter, whose config is its own, the tiles are handed to the kernel."""
    g = torch.Generator().manual_seed(7)
    N, K, M = (fp8_gemm.HEAD_MIN_N + 72, 1000, 19) if GPU else (200, 200, 3)
    w = torch.randn(N, K, generator=g).bfloat16().to(DEV)
    x = torch.randn(M, K, generator=g).to(DEV)
    monkeypatch.setenv(fp8_gemm.HEAD_TILES_ENV, name)
    if GPU:
        assert fp8_gemm.head_tiles(M, N) == fp8_gemm.HEAD_TILES[name]
        out = fp8_gemm.linear(x, w, None, 0)
    else:
        cfg = {"BM": 16, "splits": 1, **fp8_gemm.HEAD_TILES[name]}
        out = fp8_gemm.general(x.unsqueeze(1), w, None, 0, 0, torch.float32, cfg=cfg)[:, 0]
    assert out.dtype == torch.float32
    assert rel(out, linear_reference(x, w, None, 0, 0)) < F32_TOL


def test_head_tiles_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to 16 rows and narrow outputs keep the general tiles; "off" keeps them everywhere; a name not known is
    refused."""
    monkeypatch.delenv(fp8_gemm.HEAD_TILES_ENV, raising=False)
    big = fp8_gemm.HEAD_MIN_N
    assert fp8_gemm.head_tiles(32, big) is not None
    assert fp8_gemm.head_tiles(17, big) is not None and fp8_gemm.head_tiles(64, big) is not None
    assert fp8_gemm.head_tiles(1, big) is None and fp8_gemm.head_tiles(32, big - 1) is None
    assert fp8_gemm.head_tiles(16, big) is None and fp8_gemm.head_tiles(2, big) is None  # 16-row general tiles
    monkeypatch.setenv(fp8_gemm.HEAD_TILES_ENV, "off")
    assert fp8_gemm.head_tiles(32, big) is None
    monkeypatch.setenv(fp8_gemm.HEAD_TILES_ENV, "n512")
    with pytest.raises(ValueError, match="V4SERVE_HEAD_TILES"):
        fp8_gemm.head_tiles(32, big)


@pytest.mark.parametrize("kind", ["w8a8", "bf16-head"])
def test_zero_rows(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose rows want no logits runs the head on zero rows: an empty output, no launch, no tile config (the
    GPU's config divides by the tile count). The GPU's config path is taken here as well."""
    g = torch.Generator().manual_seed(6)
    if kind == "w8a8":
        w, s = fp8_weight(256, 256, 128, g)
        x, act = torch.randn(0, 256, generator=g).bfloat16().to(DEV), 128
    else:
        w, s = torch.randn(300, 64, generator=g).bfloat16().to(DEV), None
        x, act = torch.randn(0, 64, generator=g).to(DEV), 0
    monkeypatch.setattr(fp8_gemm, "interpreting", lambda: False)
    out = fp8_gemm.linear(x, w, s, 128 if s is not None else 0, act)
    assert out.shape == (0, w.shape[0]) and out.dtype == x.dtype


def test_linear_module_keeps_stored_tensors_and_dispatches() -> None:
    g = torch.Generator().manual_seed(9)
    q, s = fp8_weight(64, 128, 32, g)
    with backend.use(backend.TRITON):
        fast = Linear(128, 64)
    ref = Linear(128, 64)
    for m in (fast, ref):
        m.set_weight(q, s.view(torch.float8_e8m0fnu), 32)
        assert m.weight.dtype == torch.float8_e4m3fn and m.scale.dtype == torch.uint8  # stored, e8m0 as bytes
        m.act_group = 32
    assert fast.backend == backend.TRITON and ref.backend == backend.REFERENCE
    x = torch.randn(4, 128, generator=g).to(DEV)
    assert rel(fast(x), ref(x)) < F32_TOL
    assert torch.equal(ref(x), linear_reference(x, q, s, 32, 32))
    assert torch.equal(linear(x, q, s, 32, 32, backend.TRITON), fp8_gemm.linear(x, q, s, 32, 32))
    with pytest.raises(ValueError, match="does not fit"):
        Linear(64, 64).set_weight(q, s, 32)


def test_backend_resolution() -> None:
    assert backend.resolve("auto", "cpu") == backend.REFERENCE
    assert backend.resolve("auto", "cuda") == backend.TRITON
    assert backend.resolve("reference", "cuda") == backend.REFERENCE
    with pytest.raises(ValueError, match="--kernels"):
        backend.resolve("fast", "cpu")


@pytest.mark.skipif(not GPU, reason="real shapes need a CUDA GPU (V4SERVE_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("M", [1, 16, 64, 512, 4096])
@pytest.mark.parametrize("NK", [(1024, 4096), (32768, 1024), (4096, 8192)])
def test_real_shapes_on_gpu(M: int, NK: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(M)
    N, K = NK
    for block in (128, 32):
        q, s = fp8_weight(N, K, block, g)
        x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(DEV)
        for act in (0, block):
            out = fp8_gemm.linear(x, q, s, block, act)
            ref = linear_reference(x.float(), q, s, block, act)  # float32 reference of the same quantized values
            assert rel(out, ref) < 1e-2, (M, N, K, block, act)


@pytest.mark.parametrize("kernels", [backend.REFERENCE, backend.TRITON])
def test_row_stack_is_one_gemm_over_the_same_weights(kernels: str) -> None:
    """Projections of one input (the compressors' wkv / wgate): after stack() their weights are row blocks of one
    tensor (each Linear keeps a view: nothing held twice) and one GEMM gives every output as a column view, equal to
    the projections run one by one (bf16 weights under float32 math, as the compressors)."""
    g = torch.Generator().manual_seed(12)
    with backend.use(kernels):
        mods = [Linear(64, n) for n in (48, 48, 16, 16)]
    for m in mods:
        m.set_weight(torch.randn(m.out_features, 64, generator=g).bfloat16().to(DEV), None, 0)
    x = torch.randn(5, 64, generator=g).to(DEV)
    alone = [m(x) for m in mods]
    stack = RowStack(mods)
    assert stack(x)[0].shape == (5, 48) and stack.weight is None  # not stacked yet: one by one
    before = sum(m.weight.numel() for m in mods)
    assert stack.stack()
    assert all(m.weight.untyped_storage().data_ptr() == stack.weight.untyped_storage().data_ptr() for m in mods)
    assert sum(m.weight.numel() for m in mods) == before == stack.weight.numel()
    outs = stack(x)
    assert [o.shape[1] for o in outs] == [48, 48, 16, 16]
    for got, want in zip(outs, alone):
        assert rel(got, want) < F32_TOL
    assert all(torch.equal(m(x), o) for m, o in zip(mods, alone))  # each Linear alone reads its view


def test_row_stack_leaves_mixed_formats_alone() -> None:
    g = torch.Generator().manual_seed(13)
    mods = [Linear(256, 256), Linear(256, 128)]
    w, s = fp8_weight(256, 256, 128, g)
    mods[0].set_weight(w, s, 128)
    mods[1].set_weight(torch.randn(128, 256, generator=g).bfloat16().to(DEV), None, 0)
    stack = RowStack(mods)
    assert not stack.stack() and stack.weight is None and mods[0].weight is w
    assert not RowStack(mods[1:]).stack() and not RowStack([]).stack()  # nothing to stack
    x = torch.randn(2, 256, generator=g).bfloat16().to(DEV)
    assert all(torch.equal(o, m(x)) for o, m in zip(stack(x), mods))


@pytest.mark.parametrize("kernels", [backend.REFERENCE, backend.TRITON])
@pytest.mark.parametrize("block", [128, 32])
def test_row_stack_of_fp8_weights(kernels: str, block: int) -> None:
    """wq_a and wkv (V4: 128 x 128 scale blocks, V4.1: 32 x 32) with FP8 activations: stacked with their scale rows
    (each Linear keeps views of both), one GEMM equals the two run alone (on the GPU the split-K count follows N, so
    the float32 sums may round to a neighbouring bf16). A weight whose rows do not fill whole scale blocks is not
    stacked."""
    g = torch.Generator().manual_seed(14)
    K = 256
    with backend.use(kernels):
        mods = [Linear(K, n) for n in (2 * block, block)]
    for m in mods:
        m.set_weight(*fp8_weight(m.out_features, K, block, g), block)
        m.act_group = block
    x = torch.randn(3, K, generator=g).bfloat16().to(DEV)
    alone = [m(x) for m in mods]
    scales = [m.scale.clone() for m in mods]
    stack = RowStack(mods)
    assert stack.stack()
    assert all(m.weight.untyped_storage().data_ptr() == stack.weight.untyped_storage().data_ptr()
               and m.scale.untyped_storage().data_ptr() == stack.scale.untyped_storage().data_ptr() for m in mods)
    assert all(torch.equal(m.scale, s) for m, s in zip(mods, scales))
    outs = stack(x)
    for got, want in zip(outs, alone):
        assert got.shape == want.shape and rel(got, want) < (1e-2 if GPU else 1e-6)
    ragged = [Linear(K, block), Linear(K, block + 16)]
    for m in ragged:
        m.set_weight(*fp8_weight(m.out_features, K, block, g), block)
    assert not RowStack(ragged).stack()


def test_row_stack_of_fp4_weights() -> None:
    """FP4 (e2m1 + per-32 scales, a scale row per weight row) linears stack with their scales too."""
    g = torch.Generator().manual_seed(15)
    K = 128
    mods = [Linear(K, n) for n in (48, 16)]
    for m in mods:
        w = torch.randint(0, 256, (m.out_features, K // 2), dtype=torch.uint8, generator=g).to(DEV)
        s = torch.randint(119, 124, (m.out_features, K // 32), dtype=torch.uint8, generator=g).to(DEV)
        m.set_weight(w, s, 32)
    x = torch.randn(2, K, generator=g).to(DEV)
    alone = [m(x) for m in mods]
    stack = RowStack(mods)
    assert stack.stack() and stack.scale.shape == (64, K // 32)
    assert all(torch.equal(o, a) for o, a in zip(stack(x), alone))


def test_wider_out_dtype_spares_the_widened_copy() -> None:
    """`out_dtype` wider than x (the compressors: bf16 x, a bf16 weight, float32 out) equals widening x first: the same
    reference, and through the kernels the same products summed in float32 (bf16 values times bf16 weights are exact),
    without the float32 copy of x. FP8 weights too (W8A8 quantizes the same values); narrower is refused."""
    g = torch.Generator().manual_seed(29)
    w = (torch.randn(96, 256, generator=g) * 0.05).to(torch.bfloat16).to(DEV)
    q, s = fp8_weight(128, 256, 128, g)
    for M in (1, 5):
        x = torch.randn(M, 256, generator=g).to(torch.bfloat16).to(DEV)
        for kernels in (backend.REFERENCE, backend.TRITON):
            got = linear(x, w, None, 0, 0, kernels, torch.float32)
            assert got.dtype == torch.float32
            widened = linear(x.float(), w, None, 0, 0, kernels)
            assert rel(got, widened) < F32_TOL, (M, kernels, rel(got, widened))
            assert rel(got, linear_reference(x.float(), w, None, 0, 0)) < F32_TOL
            fp8 = linear(x, q, s, 128, 128, kernels, torch.float32)
            assert fp8.dtype == torch.float32
            assert rel(fp8, linear_reference(x.float(), q, s, 128, 128)) < 1e-2
        assert torch.equal(linear(x, w, None, 0, 0, backend.REFERENCE, torch.float32),
                           linear_reference(x.float(), w, None, 0, 0))
    with pytest.raises(ValueError, match="narrower"):
        linear(x.float(), w, None, 0, 0, backend.TRITON, torch.bfloat16)


@pytest.mark.parametrize("M", [1, 7, 64])
def test_plain_weight_decode_rows_take_the_gemv(M: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain bf16 weight with a float32 output (the compressors' stacked wkv / wgate and the indexer's
    weights_proj) runs through fp8_gemv at decode rows, without scales: exact bf16 products summed in float32, so
    within float32 rounding of the reference; N and K ragged against the tiles, split-K included. 65 rows and a bf16
    output keep their old paths (the general GEMM, cuBLAS)."""
    g = torch.Generator().manual_seed(31 + M)
    N, K = (2624, 4096) if GPU else (200, 416)
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16).to(DEV)
    calls = []
    run = fp8_gemv.run
    monkeypatch.setattr(fp8_gemv, "run", lambda *a, **k: calls.append(a[1].dtype) or run(*a, **k))
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(DEV)
    got = linear(x, w, None, 32, 0, backend.TRITON, torch.float32)
    assert calls == [torch.bfloat16] and got.dtype == torch.float32 and got.shape == (M, N)
    assert rel(got, linear_reference(x, w, None, 32, 0, torch.float32)) < F32_TOL
    for cfg in ({"splits": 1}, {"splits": 3, "BN": 64 if GPU else 128}):  # one split, and a split with a short tail
        y = fp8_gemv.run(x[:, None], w, None, 32, 0, torch.float32, cfg)[:, 0]
        assert rel(y, got) < F32_TOL, cfg
    x65 = torch.randn(65, K, generator=g).to(torch.bfloat16).to(DEV)
    assert rel(linear(x65, w, None, 32, 0, backend.TRITON, torch.float32),
               linear_reference(x65, w, None, 32, 0, torch.float32)) < F32_TOL
    assert linear(x, w, None, 32, 0, backend.TRITON).dtype == torch.bfloat16
    assert len(calls) == 3  # neither the 65 rows nor the bf16 output went through the GEMV
    assert not fp8_gemv.supports(x[:, None], w, 32, 32)  # activation quantization needs an FP8 weight
    assert not fp8_gemv.supports(x[:, None].half(), w, 32, 0)  # a weight in another dtype than x
    # stacked projections of a plain weight (a bf16 `wo_a` from convert.py): G groups, x's dtype out
    G = 4
    xg = torch.randn(M, G, K // G, generator=g).to(torch.bfloat16).to(DEV)
    wg = w[:N - N % G, :K // G]
    got = grouped_linear(xg, wg, None, 32, 0, backend.TRITON)
    assert calls[-1] == torch.bfloat16 and len(calls) == 4 and got.dtype == torch.bfloat16
    want = grouped_linear_reference(xg.float(), wg.float(), None, 32, 0)
    assert (got.float() - want).abs().max() <= 2 ** -7 * want.abs().max()  # within bf16 rounding


@pytest.mark.parametrize("M", [1, 5, 64, 65])
@pytest.mark.parametrize("block", [32, 128])
def test_producer_quantized_activations_give_the_same_output(M: int, block: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A W8A8 linear fed activations its producer already quantized (quant.Quantized, e.g. by the q latent's norm)
    returns exactly what it returns for the activations themselves, on both paths: decode rows (the GEMV) and more
    (the general GEMM), with no activation quantization launch of its own; the reference dequantizes them (values
    that quantize to themselves). Another group than the linear's raises."""
    g = torch.Generator().manual_seed(7 * M + block)
    N, K = (4096, 1024) if GPU else (192, 256)
    w, s = fp8_weight(N, K, block, g)
    x = (torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)).to(torch.bfloat16).to(DEV)
    xq = quant.fp8_rows(x, block)
    launches = []
    real = kquant.act_quant
    monkeypatch.setattr(fp8_gemv, "act_quant", lambda *a, **k: launches.append(1) or real(*a, **k))
    monkeypatch.setattr(fp8_gemm, "act_quant", lambda *a, **k: launches.append(1) or real(*a, **k))
    for prequant in (False, True):  # the GEMV's in-register quantization, and the launch before (large weights)
        monkeypatch.setattr(fp8_gemv, "prequantize", lambda *a, p=prequant: p)
        want = linear(x, w, s, block, block, backend.TRITON)
        launches.clear()
        got = linear(xq, w, s, block, block, backend.TRITON)
        assert not launches and got.dtype == torch.bfloat16 and torch.equal(got, want), prequant
    three = quant.Quantized(xq.values.view(M, 1, K), xq.scales.view(M, 1, -1), block, x.dtype)
    assert torch.equal(linear(three, w, s, block, block, backend.TRITON)[:, 0], want)  # leading dims kept
    assert torch.equal(linear(xq, w, s, block, block, backend.REFERENCE),
                       linear_reference(x, w, s, block, block))
    with pytest.raises(ValueError, match="quantized per"):
        linear(quant.fp8_rows(x, 16), w, s, block, block, backend.TRITON)


def test_short_prefill_rows_of_32_blocks_take_the_half_dot() -> None:
    """On the GPU, W8A8 rows between the GEMV's 64 and BMM_MIN_ROWS of 32-block weights (V4.1's decoder suffixes) run
    W8A16 on the bf16 dot; 128-block weights (cuBLAS's recipe), decode rows and the CPU keep their paths. Activations
    quantized by their producer are dequantized for it (their own values): the same bits as the plain activations."""
    assert fp8_gemm.half_dot_default(128, 32, True) and fp8_gemm.half_dot_default(511, 32, True)
    assert not any((fp8_gemm.half_dot_default(64, 32, True), fp8_gemm.half_dot_default(512, 32, True),
                    fp8_gemm.half_dot_default(128, 128, True), fp8_gemm.half_dot_default(128, 32, False)))
    g = torch.Generator().manual_seed(77)
    M, N, K = 70, 96, 256
    w, s = fp8_weight(N, K, 32, g)
    x = (torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)).to(torch.bfloat16).to(DEV)
    xq = quant.fp8_rows(x, 32)
    cfg = {"a_fp8": False}
    want = fp8_gemm.general(x.view(M, 1, K), w, s, 32, 32, torch.bfloat16, cfg=cfg)
    got = fp8_gemm.general(xq.values.view(M, 1, K), w, s, 32, 32, torch.bfloat16, cfg=cfg,
                           xs=xq.scales.view(M, 1, -1))
    assert torch.equal(got, want)
    assert rel(got.view(M, N), linear_reference(x.float(), w, s, 32, 32)) < 1e-2


@pytest.mark.parametrize("K", [256, 352])
def test_half_dot_whole_tile(K: int) -> None:
    """cfg {"whole": True}: the half dot widens a K tile of a 32-block FP8 weight at once (the scales broadcast over
    the tile's blocks, one dot) = the per-block form to float32 rounding and the reference to bf16 rounding; a K tail
    (352: 2.75 tiles of 128) with a split and its short last share, ragged M and N."""
    g = torch.Generator().manual_seed(K)
    M, N = 70, 96
    w, s = fp8_weight(N, K, 32, g)
    x = torch.randn(M, 1, K, generator=g).to(torch.bfloat16).to(DEV)
    for extra in ({}, {"splits": 2}):
        whole = fp8_gemm.general(x, w, s, 32, 32, torch.float32, {"a_fp8": False, "whole": True, **extra})
        per_block = fp8_gemm.general(x, w, s, 32, 32, torch.float32, {"a_fp8": False, "whole": False, **extra})
        assert rel(whole, per_block) < 1e-5, extra
        assert rel(whole.view(M, N), linear_reference(x.view(M, K).float(), w, s, 32, 32)) < 1e-2


def test_half_dot_takes_whole_tiles_from_five_k_tiles_a_program() -> None:
    """Unless cfg says, the half dot widens whole K tiles where a program walks WHOLE_MIN_TILES (5) K tiles of 128 or
    more (V4.1's wq_a at 128 rows walks 4 in each of its 13 shares, where whole tiles were slower): the default's
    bits are the whole form's at 5 tiles and the per-block form's at 4 (which differ under the interpreter: another
    order of sums; the GPU's tensor cores may give both the same bits)."""
    g = torch.Generator().manual_seed(5)
    M, N = 8, 32
    for tiles, whole in ((5, True), (4, False)):
        K = tiles * 128
        w, s = fp8_weight(N, K, 32, g)
        x = torch.randn(M, 1, K, generator=g).to(torch.bfloat16).to(DEV)
        cfg = {"a_fp8": False, "splits": 1}
        got = fp8_gemm.general(x, w, s, 32, 32, torch.float32, cfg)
        forms = {f: fp8_gemm.general(x, w, s, 32, 32, torch.float32, {**cfg, "whole": f}) for f in (True, False)}
        assert GPU or not torch.equal(forms[True], forms[False])
        assert torch.equal(got, forms[whole]), tiles
    # V4.1's linears at 128 rows on the GPU's tiles: whole tiles but for wq_a's 4 K tiles a program
    for (N, K, G), whole in (((1280, 5120, 1), False), ((5120, 2304, 1), True), ((5120, 8192, 1), True),
                             ((1024, 4096, 8), True), ((32768, 1280, 1), True)):
        splits = fp8_gemm.prefill_splits(N // 128 * G, K // 128)
        assert fp8_gemm.whole_tiles(fp8_gemm.k_share(K, splits, 128), 128) == whole, (N, K, G)


SM90_WHOLE = """
import json, torch
from v4serve.ops import quant
from v4serve.ops.kernels import fp8_gemm
w = torch.randn(5120, 8192)
q, s = quant.fp8_block_quantize_weight(w, 32)
x = torch.randn(128, 1, 8192).to(torch.bfloat16)
res = {}
for whole in (False, True):
    done = compile_launches(lambda: fp8_gemm.general(x, q, s.view(torch.uint8), 32, 32, torch.bfloat16,
                                                     {"a_fp8": False, "whole": whole}))
    ptx = [c.asm["ptx"] for name, c in done if name == "_gemm_kernel"][0]
    res[str(whole)] = {"wgmma": ptx.count("wgmma.mma_async"), "mma_sync": ptx.count("mma.sync"),
                       "waits": ptx.count("wgmma.wait_group"), "bar": ptx.count("bar.sync")}
print(json.dumps(res))
"""


def test_half_dot_whole_tile_compiles_to_wgmma_on_sm90() -> None:
    """The whole-tile half dot as `general` launches it for 128 rows of V4.1's `wo_b` (GPU tiles: 128 x 128, BK 128,
    K split), compiled for sm_90 on the CPU: both forms reach wgmma with the same instructions a K tile, the whole
    tile waiting for them once a tile (the per-block form: once per 32 of K, 4 waits; Triton 3.6: 1, with 8 barriers
    against 12)."""
    from sm90_compile import RECORD_AND_COMPILE, run_compile

    dots = json.loads(run_compile(RECORD_AND_COMPILE + SM90_WHOLE).strip().splitlines()[-1])
    assert dots["False"]["wgmma"] > 0 and dots["True"]["wgmma"] > 0, dots
    assert dots["True"]["mma_sync"] == dots["False"]["mma_sync"] == 0, dots
    assert dots["True"]["waits"] < dots["False"]["waits"], dots


@pytest.mark.parametrize("M", [1, 3, 16, 64, 65])
@pytest.mark.parametrize("block", [32, 128])
def test_grouped_output_quantized_for_its_consumer(M: int, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped `wo_a` (W8A16, G projections) with its output quantized per 1 x block for `wo_b`: the decode GEMV
    writes e4m3 values and scales as it finishes the output, bit for bit what quantizing its bf16 output gives, split-K
    or not, groups inside a tile or across tiles (for any rows when asked directly; by default up to QUANT_OUT_ROWS);
    more rows, the general GEMM (65) and groups that do not tile N give the plain output; the reference quantizes its
    own output. Flattened, it feeds the consumer as its plain output would. (On only with V4SERVE_FUSIONS naming it.)"""
    monkeypatch.setenv("V4SERVE_FUSIONS", "gemv_quant_out")
    g = torch.Generator().manual_seed(11 * M + block)
    G, N, K = (8, 1024, 4096) if GPU else (4, 128, 256)
    w, s = fp8_weight(G * N, K, block, g)
    x = torch.randn(M, G, K, generator=g).to(torch.bfloat16).to(DEV)
    plain = grouped_linear(x, w, s, block, 0, backend.TRITON)
    got = grouped_linear(x, w, s, block, 0, backend.TRITON, quant_out=block)
    assert torch.equal(grouped_linear(x[:, :, :2 * block], w[:G * 3 * block // 2, :2 * block], s, block, 0,
                                      backend.TRITON, quant_out=2 * block), grouped_linear(  # N = 1.5 groups
        x[:, :, :2 * block], w[:G * 3 * block // 2, :2 * block], s, block, 0, backend.TRITON))
    if M > fp8_gemv.QUANT_OUT_ROWS:  # the plain output, which its consumer quantizes (the general GEMM past 64 rows)
        assert torch.equal(got, plain)
    else:
        assert isinstance(got, quant.Quantized) and got.group == block and got.dtype == torch.bfloat16
        assert got.scales.shape == (M, G, N // block)
        want = quant.fp8_rows(plain, block)
        assert torch.equal(got.values.float(), want.values.float())  # (zeros' signs may differ)
        assert torch.equal(got.scales, want.scales)
    if M > 64:
        return
    # one split or three; tiles holding groups, and groups spanning two or four tiles (finished by the last of all
    # their programs), on the tensor cores or the CUDA cores: each against the plain output of the same tiles and splits
    cfgs = [{"splits": 1}, {"splits": 3}, {"splits": 1, "BN": block // 2}, {"splits": 3, "BN": block // 2},
            {"splits": 2, "BN": block // 4}]
    if M <= fp8_gemv.FMA_MAX_ROWS:  # the CUDA-core form (one row's default on the GPU) finishes the same way
        cfgs += [{"fma": True, "BK": 256}, {"fma": True, "BN": block // 2, "BK": 256, "splits": 3}]
    for cfg in cfgs:
        want = quant.fp8_rows(fp8_gemv.run(x, w, s, block, 0, torch.bfloat16, cfg), block)
        one = fp8_gemv.run(x, w, s, block, 0, torch.bfloat16, cfg, quant_out=block)
        assert torch.equal(one.values.float(), want.values.float()), cfg
        assert torch.equal(one.scales, want.scales), cfg
    with pytest.raises(ValueError, match="neither hold nor tile"):
        fp8_gemv.run(x, w, s, block, 0, torch.bfloat16, {"BN": 3 * block // 4 if block > 32 else 48},
                     quant_out=block)
    ref = grouped_linear(x, w, s, block, 0, backend.REFERENCE, quant_out=block)
    plain_ref = grouped_linear_reference(x, w, s, block, 0)
    assert torch.equal(ref.dequantize(), quant.fp8_simulate(plain_ref, block))
    flat = fp8_gemv.run(x, w, s, block, 0, torch.bfloat16, quant_out=block).flatten(1)  # (past QUANT_OUT_ROWS too)
    assert flat.values.shape == (M, G * N) and flat.scales.shape == (M, G * N // block)
    w2, s2 = fp8_weight(64, G * N, block, g)
    assert torch.equal(linear(flat, w2, s2, block, block, backend.TRITON),
                       linear(plain.flatten(1), w2, s2, block, block, backend.TRITON))
    with pytest.raises(ValueError, match="cannot quantize"):
        fp8_gemv.run(x, w, s, block, 0, torch.bfloat16, quant_out=48)
    monkeypatch.setenv("V4SERVE_FUSIONS", "norm_quant")  # the switch: the plain output unless gemv_quant_out is on
    assert torch.equal(grouped_linear(x, w, s, block, 0, backend.TRITON, quant_out=block), plain)


# The decode GEMV compiled for sm_90 (tests/ops/sm90_compile.py: Triton's ptxas, no GPU), plain and swapped
SM90_GEMV = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import fp8_gemv
fn = fp8_gemv._decode_gemm_kernel
ptrs = {"x_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*u8", "part_ptr": "*fp32",
        "y_ptr": "*bf16", "ys_ptr": "*fp32", "cnt_ptr": "*i32"}
# the fma case as Triton's launcher specializes it on the GPU: 16-byte aligned pointers, sizes and strides that are
# multiples of 16 (the others without: their checks read the unvectorized form)
aligned = ("x_ptr", "xs_ptr", "w_ptr", "ws_ptr", "part_ptr", "y_ptr", "ys_ptr", "cnt_ptr", "N", "K", "k_per_split",
           "stride_xm", "stride_xg", "stride_wn", "stride_ym", "stride_yg")
attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
out = {}
for case in ("False", "True", "quant_out", "fma", "deq"):
    const = dict(SB=32 if case == "deq" else 128, A_FP8=case == "fma", A_PRE=case not in ("quant_out", "fma"),
                 BM=1 if case == "fma" else 32 if case == "deq" else 16,
                 BN=64, BK=512 if case == "fma" else 128, SPLITS=4, INTERPRET=False, PDL=False, PREFETCH=False,
                 SWAP=case in ("True", "deq"), W_SCALED=True, QG=128 if case == "quant_out" else 0,
                 OUT_DT=triton.language.bfloat16, FMA=case == "fma", EVEN_K=True, FMA_STAGES=1, DEQ=case == "deq",
                 FULL=False, PAIR=False)
    types = {**ptrs, "x_ptr": "*bf16", "y_ptr": "*fp8e4nv"} if case == "quant_out" else ptrs
    types = {**ptrs, "x_ptr": "*bf16", "y_ptr": "*bf16"} if case == "fma" else types
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in fn.arg_names}
    ptx = triton.compile(ASTSource(fn, sig, const, attrs if case == "fma" else None), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 4}).asm["ptx"]
    out[case] = {"wgmma": ptx.count("wgmma.mma_async"), "mma_sync": ptx.count("mma.sync"),
                 "e4m3_stores": ptx.count("st.global.b8") + ptx.count("st.global.v2.b8") + ptx.count("st.global.v4.b8"),
                 "loads_16B": ptx.count("ld.global.v4"), "byte_loads": ptx.count("ld.global.b8"),
                 "e4m3_cvt": ptx.count("cvt.rn.f16x2.e4m3x2"), "bf16_wgmma": ptx.count(".bf16.bf16"),
                 "waits": ptx.count("wgmma.wait_group")}
print(json.dumps(out))
"""


def test_decode_gemv_fp8_dot_is_wgmma_when_swapped_on_sm90() -> None:
    """sm_90 has FP8 tensor-core MMAs only as wgmma (64-row tiles): the GEMV's 16-row x tile first makes its FP8 dot
    an mma.sync, which ptxas runs as FP8 -> f16 conversions + f16 MMAs. With `swap` the weight tile is the first
    operand and the dot a wgmma (what the decode config picks for W8A8 up to 32 rows)."""
    dots = json.loads(run_compile(SM90_GEMV).strip().splitlines()[-1])
    assert dots["False"]["mma_sync"] > 0 and dots["False"]["wgmma"] == 0, dots
    assert dots["True"]["wgmma"] > 0 and dots["True"]["mma_sync"] == 0, dots
    assert dots["quant_out"]["e4m3_stores"] > 0, dots  # wo_a's output quantized for wo_b (a group over 2 tiles)
    # the one-row CUDA-core form: no MMA, the weight in 16-byte loads (a 64 x 512 tile: 16 per thread; byte loads
    # only for the few e8m0 scales), widened by the paired e4m3 -> f16 conversion
    fma = dots["fma"]
    assert fma["wgmma"] == fma["mma_sync"] == 0 and fma["loads_16B"] >= 16 and fma["byte_loads"] <= 4, dots
    assert fma["e4m3_cvt"] >= 64 * 512 // 128 // 2, dots
    # the dequantized form (cfg "deq", 32-wide blocks, 32 rows): bf16 wgmma on the weight tile, no FP8 MMA
    assert dots["deq"]["bf16_wgmma"] == dots["deq"]["wgmma"] > 0 and dots["deq"]["mma_sync"] == 0, dots
    one = fp8_gemv.config(1, 4096, 8192, 1, 128)  # one row: swapped, or on the CUDA cores (the GPU's default)
    assert (one["swap"] or one["fma"]) and fp8_gemv.config(32, 4096, 8192, 1, 128)["swap"]
    assert not fp8_gemv.config(64, 4096, 8192, 1, 128)["swap"]
    assert not fp8_gemv.config(1, 4096, 8192, 8, 128, w8a8=False)["swap"]
