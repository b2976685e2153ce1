"""The mHC kernels (ops/kernels/mhc.py: hc_pre, hc_post, hc_post_pre) against the reference bodies in ops/mhc.py.

On the CPU the kernels run under Triton's interpreter on small shapes (n=4; D=64 and 96, not a power of two; T=1
and 37, not a multiple of the token block; 20 Sinkhorn iterations). pre/post/comb must agree elementwise within 1e-5
relative in float32 and 1e-12 in float64. y and the expansion are sums of signed terms (a collapsed element can
cancel to ~0), so they are compared relative to their largest magnitude. With V4SERVE_TEST_DEVICE=cuda* the GPU
cases run at real shapes with bf16 streams.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from v4serve.ops import backend, mhc
from v4serve.ops.kernels import mhc as mk

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"  # the small cases run on the GPU too there (no interpreter)
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
N, ITERS, NORM_EPS, HC_EPS = 4, 20, 1e-6, 1e-6
# the interpreter's own `int(array)` on loop bounds
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _inputs(t: int, d: int, dtype: torch.dtype, seed: int, device: str = DEVICE):
    """x [t, N, d] in dtype; fn, base, scale at the checkpoint's magnitudes (float32, float64 for float64 x); a norm
    weight ~ 1; a positive collapse_pre in the coefficients' dtype."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    m = (2 + N) * N
    x = torch.randn(t, N, d, generator=g, dtype=torch.float64)
    fn = torch.randn(m, N * d, generator=g, dtype=torch.float64) * (N * d) ** -0.5
    base = torch.randn(m, generator=g, dtype=torch.float64)
    scale = torch.randn(3, generator=g, dtype=torch.float64) * 0.1 + 1
    w = torch.randn(d, generator=g, dtype=torch.float64) * 0.1 + 1
    cpre = torch.rand(t, N, generator=g, dtype=torch.float64) + HC_EPS
    return (x.to(device, dtype), fn.to(device, acc), base.to(device, acc), scale.to(device, acc),
            w.to(device, acc), cpre.to(device, acc))


def _scaled_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def _check_pre(got, want, tol_y: float, tol_c: float) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
    assert _scaled_err(got[0], want[0]) <= tol_y, f"y: error {_scaled_err(got[0], want[0]):.3g} of its largest value"
    for name, g, w in zip(("pre", "post", "comb"), got[1:], want[1:]):
        rel = (g - w).abs() / w.abs()
        assert torch.allclose(g, w, rtol=tol_c, atol=0), (
            f"{name}: max relative error {rel.max().item():.3g} at {divmod(int(rel.argmax()), w.shape[-1])} "
            f"(value {w.flatten()[rel.argmax()].item():.3g}), {(rel > tol_c).sum().item()} of {w.numel()} over {tol_c}")


def _kwargs(x, w, cpre, lagged: bool, normed: bool) -> dict:
    return {"collapse_pre": cpre if lagged else None, "norm_weight": w if normed else None,
            "norm_eps2": 1e-6 if normed else None}


@pytest.mark.parametrize("normed", [False, True], ids=["raw", "normed"])
@pytest.mark.parametrize("lagged", [False, True], ids=["own-pre", "lagged"])
@pytest.mark.parametrize("t,d", [(1, 64), (37, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_pre_matches_reference(dtype, t, d, lagged, normed):
    x, fn, base, scale, w, cpre = _inputs(t, d, dtype, seed=100 * t + d + 2 * lagged + normed)
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged, normed)
    _check_pre(mk.hc_pre(*args, **kw), mhc.hc_pre_reference(*args, **kw), TOL[dtype], TOL[dtype])


@pytest.mark.parametrize("t,d", [(1, 64), (37, 96), (37, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_post_matches_reference(dtype, t, d):
    x, _, _, _, _, _ = _inputs(t, d, dtype, seed=7 + t + d)
    g = torch.Generator().manual_seed(t)
    f = torch.randn(t, d, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    post = (2 * torch.rand(t, N, generator=g, dtype=torch.float64)).to(DEVICE, x.dtype)
    comb = torch.rand(t, N, N, generator=g, dtype=torch.float64).to(DEVICE, x.dtype)
    got = mk.hc_post(f, x, post, comb)
    want = mhc.hc_expand(f, x, post, comb)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert _scaled_err(got, want) <= TOL[dtype]


@pytest.mark.parametrize("cfg,t", [(mk.PreConfig(block_t=16, block_d=32, split_d=2), 37),
                                   (mk.PreConfig(block_t=1, block_d=16, split_d=4, block_dc=64), 3),
                                   (mk.PreConfig(block_t=2, block_d=16, split_d=4, block_dc=128, fma=True), 3),
                                   (mk.PreConfig(block_t=1, block_d=16, split_d=4, block_dc=128, fma=True), 3),
                                   (mk.PreConfig(block_t=1, block_d=16, split_d=4, block_dc=128, fma=True,
                                                 flat=False), 3),
                                   (mk.PreConfig(block_t=1, block_d=16, split_d=4, block_dc=128, fma=True,
                                                 hoist=True), 3)],
                         ids=["t16,split2", "t1,split3", "t2,split3,fma,one-chunk", "t1,split3,flat",
                              "t1,split3,fma-3d", "t1,split3,flat,hoist"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_split_grid_matches_reference(cfg, t, dtype):
    """The decode grid: D slices in separate programs, the last arrival finishes the token block (D=96 leaves
    the last slice short: 4 requested slices of 32 become 3; the collapse in chunks of 64, the last one short, or in
    one chunk of 128 with y kept for the norm; the mixes by tensor-core dots or by FMAs). Bitwise repeatable."""
    x, fn, base, scale, w, cpre = _inputs(t, 96, dtype, seed=11)
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged=True, normed=True)
    got = mk.hc_pre(*args, **kw, config=cfg)
    _check_pre(got, mhc.hc_pre_reference(*args, **kw), TOL[dtype], TOL[dtype])
    again = mk.hc_pre(*args, **kw, config=cfg)
    assert all(torch.equal(a, b) for a, b in zip(got, again))


@pytest.mark.parametrize("lagged_normed", [False, True], ids=["own-pre", "lagged+normed"])
@pytest.mark.parametrize("t", [1, 3])
def test_hoisted_streams_give_the_same_bits(t, lagged_normed):
    """PreConfig.hoist (the finishing program loads the streams before the coefficients): hc_pre and hc_post_pre
    bit for bit as without it, with the collapse's own pre or V4.1's lagged one, normed or not."""
    base_cfg = mk.PreConfig(block_t=1, block_d=16, split_d=4, block_dc=128, fma=True)
    hoisted = replace(base_cfg, hoist=True)
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(t, 96, torch.float32, seed=51 + t)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged_normed, lagged_normed)
    for call in (lambda cfg: mk.hc_pre(x, *pre_args, **kw, config=cfg),
                 lambda cfg: mk.hc_post_pre(f, x, post, comb, *pre_args, **kw, config=cfg)):
        assert all(torch.equal(a, b) for a, b in zip(call(hoisted), call(base_cfg)))


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda and a GPU")
@pytest.mark.parametrize("t", [1, 4])
def test_gpu_hoisted_streams_give_the_same_bits(t):
    """The decode grid (one 8192-wide collapse chunk over D = 5,120) hoisted against the same grid without the
    hoist, bf16 streams, V4.1's lagged pre and the norm: bit for bit, hc_pre and hc_post_pre."""
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(t, 5120, torch.bfloat16, seed=61 + t)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w.bfloat16(), cpre, lagged=True, normed=True)
    cfg = replace(mk.default_pre_config(t, 5120, on_gpu=True), hoist=True)
    for call in (lambda c: mk.hc_pre(x, *pre_args, **kw, config=c),
                 lambda c: mk.hc_post_pre(f, x, post, comb, *pre_args, **kw, config=c)):
        assert all(torch.equal(a, b) for a, b in zip(call(cfg), call(replace(cfg, hoist=False))))


def test_hoist_switch(monkeypatch):
    """V4SERVE_MHC_HOIST=1 makes the decode grids of up to 4 tokens hoist the streams' loads (255 registers: not for
    larger grids); without it none does (opt-in until timed on a GPU)."""
    assert not any(mk.default_pre_config(t, 5120, on_gpu=True).hoist for t in (1, 4, 5, 32))
    monkeypatch.setenv(mk.HOIST_ENV, "1")
    assert [mk.default_pre_config(t, 5120, on_gpu=True).hoist for t in (1, 4, 5, 32)] == [True, True, False, False]


def test_flat_switch(monkeypatch):
    """The decode grids' 1-token FMA mixes are 2-D unless V4SERVE_MHC_FLAT=0 (the A/B switch)."""
    assert mk.default_pre_config(1, 5120, on_gpu=True).flat
    monkeypatch.setenv(mk.FLAT_ENV, "0")
    assert not mk.default_pre_config(1, 5120, on_gpu=True).flat


def test_gpu_default_configs():
    """The GPU's default grids (split D, wide collapse chunks; bf16x3 off for float32 x), run by the interpreter."""
    # bf16 prefill chunks: the bf16x3 GEMM promoted per D chunk (chained through the tensor cores' accumulator it
    # missed the coefficients' 1e-4 at T=4096 on the H200), hc_post_pre as two launches; float32 x: fp32 dots
    for t in (2048, 4096, 8192):
        cfg = mk.default_pre_config(t, 4096, on_gpu=True)
        assert cfg.bf16x3 and cfg.promote and cfg.post_apart, cfg
        assert mk.default_pre_config(t, 4096, on_gpu=True, bf16=False).bf16x3 is False
    # above 64 tokens hc_post_pre as hc_post then hc_pre (fused, twice hc_pre's time on the H100 at D = 5120)
    assert [mk.default_pre_config(t, 5120, on_gpu=True).post_apart for t in (1, 64, 65, 640, 1024)] == [
        False, False, True, True, True]
    assert [mk.default_pre_config(t, 5120, on_gpu=True).block_t for t in (1, 32, 33, 64, 65, 128, 129)] == [
        1, 1, 1, 1, 1, 1, 64]
    # the A/B switch of the 1-token edge: "4" is the rule before (2-token blocks from 5 tokens)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(mk.ONE_TOKEN_ENV, "4")
        assert [mk.default_pre_config(t, 5120, on_gpu=True).block_t for t in (1, 4, 5, 32, 33)] == [1, 1, 2, 2, 2]
    # 129-4096 bf16 tokens: 64-token tensor-core mixes, the collapse apart; float32 streams keep the FMA grids
    assert [mk.default_pre_config(t, 5120, on_gpu=True).collapse_apart for t in (128, 129, 4096, 4097)] == [
        False, True, True, False]
    assert mk.default_pre_config(640, 5120, on_gpu=True, bf16=False).block_t == 8
    for t in (1, 5, 1100):  # 1100: a prefill chunk's grid (16-token blocks over D slices)
        cfg = mk.default_pre_config(t, 512, on_gpu=True, bf16=False)
        assert cfg.split_d > 1
        x, fn, base, scale, w, cpre = _inputs(t, 512, torch.float32, seed=29 + t)
        args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
        kw = _kwargs(x, w, cpre, lagged=t > 1, normed=True)
        _check_pre(mk.hc_pre(*args, **kw, config=cfg), mhc.hc_pre_reference(*args, **kw), 1e-5, 1e-5)
        f = torch.randn(t, 512, device=DEVICE)
        _, _, post, comb = mhc.hc_pre_reference(*args)
        got = mk.hc_post(f, x, post, comb, config=mk.default_post_config(t, 512, on_gpu=True))
        assert _scaled_err(got, mhc.hc_expand(f, x, post, comb)) <= 1e-5


@pytest.mark.parametrize("t", [1100, 4100])
def test_gpu_prefill_defaults_on_ragged_chunks(t: int):
    """The GPU's bf16 prefill grids (bf16x3 promoted, 64-token blocks over 64-wide D chunks, post + pre apart, the
    collapse apart up to 4096 tokens): chunks that are not whole token blocks, D = 96 (a short last slice), lagged
    and normed. Under the interpreter the streams are float32 holding bf16 values, the split parts go through fp32
    dots, and hc_post_pre is checked against the reference composition (within 1e-5). On a GPU the streams are bf16,
    as the model's (the bf16 dots read x as bf16): the coefficients within the 1e-4 of the GPU's bf16 tests (the
    tensor cores' fp32 accumulation is not IEEE round-to-nearest), y and the new streams within bf16 rounding, and
    hc_post_pre's pre side against the reference on the new streams it wrote."""
    d = 96
    cfg = mk.default_pre_config(t, d, on_gpu=True)
    assert cfg.block_t == 64 and cfg.post_apart and cfg.promote and cfg.collapse_apart == (t <= 4096)
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(t, d, torch.float32, seed=43 + t)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    if ON_GPU:
        x, f, w, tol_y, tol_c = x.bfloat16(), f.bfloat16(), w.bfloat16(), 1e-2, 1e-4
    else:
        x, f, tol_y, tol_c = x.bfloat16().float(), f.bfloat16().float(), 1e-5, 1e-5
    kw = _kwargs(x, w, cpre, lagged=True, normed=True)
    _check_pre(mk.hc_pre(x, *pre_args, **kw, config=cfg), mhc.hc_pre_reference(x, *pre_args, **kw), tol_y, tol_c)
    got = mk.hc_post_pre(f, x, post, comb, *pre_args, **kw, config=cfg)
    expanded = mhc.hc_expand(f, x, post, comb)
    assert _scaled_err(got[0], expanded) <= tol_y
    # the pre side: on a GPU over the bf16 streams the kernel wrote (the reference's may round a ulp apart), under
    # the interpreter over the reference's own (hc_post_pre_reference's composition)
    _check_pre(got[1:], mhc.hc_pre_reference(got[0] if ON_GPU else expanded, *pre_args, **kw), tol_y, tol_c)


@pytest.mark.parametrize("promote", [False, True], ids=["chained", "promoted"])
def test_bf16x3_gemm_split(promote: bool):
    """The GPU's bf16 path splits fn into three bf16 parts; under the interpreter the parts go through fp32 dots,
    which checks the split itself (x holds bf16 values, as the GPU's streams do). `promote`: each D chunk's three
    dots summed apart and added in float32 (the prefill grid's candidate), hc_pre and the fused post + pre alike."""
    x, fn, base, scale, w, _ = _inputs(37, 96, torch.float32, seed=13)
    x = x.bfloat16().float()
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    cfg = mk.PreConfig(block_t=16, block_d=32, split_d=1, bf16x3=True, promote=promote)
    got = mk.hc_pre(*args, norm_weight=w, config=cfg)
    _check_pre(got, mhc.hc_pre_reference(*args, norm_weight=w), 1e-5, 1e-5)
    f = torch.randn(37, 96, device=DEVICE).bfloat16().float()
    fused = mk.hc_post_pre(f, x, got[2], got[3], fn, base, scale, N, ITERS, NORM_EPS, HC_EPS, norm_weight=w,
                           config=cfg)
    new = mk.hc_post(f, x, got[2], got[3])
    assert torch.equal(fused[0], new)
    _check_pre(fused[1:], mhc.hc_pre_reference(new, *args[1:], norm_weight=w), 1e-5, 1e-5)


def test_float64_streams_with_float32_lagged_pre():
    """V4.1's first sub-layer collapses with a float32 one-hot pre: the reference rounds x to float32 there."""
    x, fn, base, scale, _, _ = _inputs(5, 64, torch.float64, seed=17)
    onehot = torch.zeros(5, N, device=DEVICE)
    onehot[:, 0] = 1
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    got = mk.hc_pre(*args, collapse_pre=onehot)
    want = mhc.hc_pre_reference(*args, collapse_pre=onehot)
    assert torch.equal(got[0], want[0]) and torch.equal(got[0], x[:, 0].float().double())
    _check_pre(got, want, 1e-12, 1e-12)


def test_strided_inputs_and_empty():
    x, fn, base, scale, w, cpre = _inputs(9, 64, torch.float32, seed=19)
    xs = torch.stack([x, x], -1)[..., 0]  # non-contiguous views of the same values
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    want = mhc.hc_pre_reference(*args, collapse_pre=cpre, norm_weight=w)
    got = mk.hc_pre(xs, *args[1:], collapse_pre=torch.stack([cpre, cpre], -1)[..., 0], norm_weight=w)
    _check_pre(got, want, 1e-5, 1e-5)
    post, comb = want[2], want[3]
    f = torch.randn(9, 64, device=DEVICE)
    assert _scaled_err(mk.hc_post(torch.stack([f, f], -1)[..., 0], xs, post.t().contiguous().t(), comb),
                       mhc.hc_expand(f, x, post, comb)) <= 1e-5
    y, pre, post, comb = mk.hc_pre(x[:0], *args[1:])
    assert y.shape == (0, 64) and pre.shape == (0, N) and comb.shape == (0, N, N)
    assert mk.hc_post(f[:0], x[:0], post, comb).shape == (0, N, 64)


def test_entry_points_dispatch(monkeypatch):
    x, fn, base, scale, w, cpre = _inputs(6, 64, torch.float32, seed=23)
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged=True, normed=True)
    got = mhc.hc_pre(*args, **kw, backend=backend.TRITON)
    assert all(torch.equal(a, b) for a, b in zip(got, mk.hc_pre(*args, **kw)))
    ref = mhc.hc_pre(*args, **kw, backend=backend.REFERENCE)
    assert all(torch.equal(a, b) for a, b in zip(ref, mhc.hc_pre_reference(*args, **kw)))
    f = torch.randn(6, 64, device=DEVICE)
    _, _, post, comb = ref
    assert torch.equal(mhc.hc_post(f, x, post, comb, backend=backend.TRITON), mk.hc_post(f, x, post, comb))
    assert torch.equal(mhc.hc_post(f, x, post, comb), mhc.hc_expand(f, x, post, comb))
    # what the kernels do not take falls back to the reference body
    assert mk.supports(x) and mk.supports(x, cpre)
    assert not mk.supports(x, cpre.bfloat16()) and not mk.supports(x, cpre[:, :2])
    x2 = x[:, :2]
    assert not mk.supports(x2)
    a2 = (x2, fn[:8, :128], base[:8], scale, 2, ITERS, NORM_EPS, HC_EPS)
    assert all(torch.equal(a, b) for a, b in zip(mhc.hc_pre(*a2, backend=backend.TRITON),
                                                 mhc.hc_pre_reference(*a2)))
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # no interpreter: no kernels on the CPU
    assert not mk.supports(x.cpu())


def _expansion(t: int, d: int, dtype: torch.dtype, seed: int, device: str = DEVICE):
    """A sub-layer output f [t, d] and the (post, comb) of the sub-layer before, from the reference on x."""
    x, fn, base, scale, w, cpre = _inputs(t, d, dtype, seed, device)
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(t, d, generator=g, dtype=torch.float64).to(device, dtype)
    _, _, post, comb = mhc.hc_pre_reference(x, fn.roll(1, 0), base, scale, N, ITERS, NORM_EPS, HC_EPS)
    return f, x, post, comb, fn, base, scale, w, cpre


POST_PRE_CONFIGS = {"token-blocks": mk.PreConfig(block_t=16, block_d=32, split_d=1),
                    "split": mk.PreConfig(block_t=1, block_d=16, split_d=4, block_dc=64),
                    "split,fma,one-chunk": mk.PreConfig(block_t=1, block_d=32, split_d=2, block_dc=128, fma=True),
                    "split,fma-3d": mk.PreConfig(block_t=1, block_d=32, split_d=2, block_dc=128, fma=True, flat=False),
                    "split,fma,one-chunk,hoist": mk.PreConfig(block_t=1, block_d=32, split_d=2, block_dc=128, fma=True,
                                                              hoist=True),
                    "split,fma,t2": mk.PreConfig(block_t=2, block_d=32, split_d=2, block_dc=64, fma=True),
                    "post-apart": mk.PreConfig(block_t=8, block_d=32, split_d=2, post_apart=True)}


@pytest.mark.parametrize("cfg", POST_PRE_CONFIGS.values(), ids=POST_PRE_CONFIGS.keys())
@pytest.mark.parametrize("lagged_normed", [False, True], ids=["own-pre", "lagged+normed"])
@pytest.mark.parametrize("t,d", [(1, 64), (37, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_post_pre_matches_reference_and_the_two_launches(dtype, t, d, lagged_normed, cfg):
    """One launch for a sub-layer's expansion and the next one's pre side: against the reference composition, and
    bit for bit the two launches it replaces with the same grid (the same expansion bits, the same mixes partials
    in the same order). D=96 leaves the last D slice / chunk short."""
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(t, d, dtype, seed=31 + t + d + lagged_normed)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged_normed, lagged_normed)
    got = mk.hc_post_pre(f, x, post, comb, *pre_args, **kw, config=cfg)
    want = mhc.hc_post_pre_reference(f, x, post, comb, *pre_args, **kw)
    assert got[0].dtype == x.dtype and _scaled_err(got[0], want[0]) <= TOL[dtype]
    _check_pre(got[1:], want[1:], TOL[dtype], TOL[dtype])
    new = mk.hc_post(f, x, post, comb)
    two = (new, *mk.hc_pre(new, *pre_args, **kw, config=cfg))
    assert all(torch.equal(a, b) for a, b in zip(got, two))
    assert all(torch.equal(a, b) for a, b in zip(got, mk.hc_post_pre(f, x, post, comb, *pre_args, **kw, config=cfg)))


COLLAPSE_APART = {"token-blocks": mk.PreConfig(block_t=16, block_d=32, split_d=1, block_dc=64),
                  "split": mk.PreConfig(block_t=4, block_d=16, split_d=4, block_dc=32),
                  "split,one-chunk": mk.PreConfig(block_t=1, block_d=32, split_d=2, block_dc=128)}


@pytest.mark.parametrize("cfg", COLLAPSE_APART.values(), ids=COLLAPSE_APART.keys())
@pytest.mark.parametrize("lagged_normed", [False, True], ids=["own-pre", "lagged+normed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_collapse_apart(dtype, lagged_normed, cfg):
    """PreConfig.collapse_apart: the collapse and norm in a launch of their own after the mixes and coefficients.
    With the fused grid's token block, D chunk and warps it gives the fused launch's bits (the same arithmetic); with
    its own defaults (one token a program, one D chunk) the reference's values; hc_post_pre runs it as hc_post then
    hc_pre. T=37 leaves the last token block short, D=96 the last D slice."""
    t, d = 37, 96
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(t, d, dtype, seed=53 + lagged_normed)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged_normed, lagged_normed)
    fused = mk.hc_pre(x, *pre_args, **kw, config=cfg)
    same = replace(cfg, collapse_apart=True, collapse_t=cfg.block_t, collapse_dc=cfg.block_dc,
                   collapse_warps=cfg.num_warps)
    assert all(torch.equal(a, b) for a, b in zip(mk.hc_pre(x, *pre_args, **kw, config=same), fused))
    own = replace(cfg, collapse_apart=True)
    got = mk.hc_pre(x, *pre_args, **kw, config=own)
    _check_pre(got, mhc.hc_pre_reference(x, *pre_args, **kw), TOL[dtype], TOL[dtype])
    assert all(torch.equal(a, b) for a, b in zip(got[1:], fused[1:]))  # the coefficients: one launch's either way
    both = mk.hc_post_pre(f, x, post, comb, *pre_args, **kw, config=own)
    new = mk.hc_post(f, x, post, comb)
    assert all(torch.equal(a, b) for a, b in zip(both, (new, *mk.hc_pre(new, *pre_args, **kw, config=own))))
    with pytest.raises(ValueError, match="power of two"):
        mk.hc_pre(x, *pre_args, **kw, config=replace(own, collapse_t=3))


def test_post_pre_entry_point_and_empty():
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(5, 64, torch.float32, seed=37)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged=True, normed=True)
    got = mhc.hc_post_pre(f, x, post, comb, *pre_args, **kw, backend=backend.TRITON)
    assert all(torch.equal(a, b) for a, b in zip(got, mk.hc_post_pre(f, x, post, comb, *pre_args, **kw)))
    ref = mhc.hc_post_pre(f, x, post, comb, *pre_args, **kw)
    assert all(torch.equal(a, b) for a, b in zip(ref, mhc.hc_post_pre_reference(f, x, post, comb, *pre_args, **kw)))
    empty = mk.hc_post_pre(f[:0], x[:0], post[:0], comb[:0], *pre_args)
    assert [tuple(e.shape) for e in empty] == [(0, N, 64), (0, 64), (0, N), (0, N), (0, N, N)]
    with pytest.raises(ValueError, match="expand shapes"):
        mk.hc_post_pre(f[:, :32], x, post, comb, *pre_args)


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda and a GPU")
@pytest.mark.parametrize("t", [1, 64, 528, 2048, 4096])
def test_gpu_post_pre_bf16(t):
    """Real shapes, bf16 streams, the default grids: the expansion within bf16 rounding of the reference's, the pre
    side within the hc_pre tolerances of the reference on those streams (a stream one bf16 ulp apart moves the
    coefficients by ~1e-4 at T=4096), and the two launches it replaces bit for bit."""
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(t, 4096, torch.bfloat16, seed=41 + t, device="cuda")
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w.bfloat16(), cpre, lagged=False, normed=True)
    got = mk.hc_post_pre(f, x, post, comb, *pre_args, **kw)
    assert _scaled_err(got[0], mhc.hc_expand(f, x, post, comb)) <= 1e-2
    _check_pre(got[1:], mhc.hc_pre_reference(got[0], *pre_args, **kw), 1e-2, 1e-4)
    new = mk.hc_post(f, x, post, comb)
    assert all(torch.equal(a, b) for a, b in zip(got, (new, *mk.hc_pre(new, *pre_args, **kw))))


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda and a GPU")
@pytest.mark.parametrize("lagged_normed", [False, True], ids=["own-pre", "lagged+normed"])
@pytest.mark.parametrize("t", [1, 64, 100, 528, 2048, 4096])
@pytest.mark.parametrize("d", [4096, 5120])
def test_gpu_bf16(d, t, lagged_normed):
    x, fn, base, scale, w, cpre = _inputs(t, d, torch.bfloat16, seed=t + d, device="cuda")
    args = (x, fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w.bfloat16(), cpre, lagged_normed, lagged_normed)
    got = mk.hc_pre(*args, **kw)
    _check_pre(got, mhc.hc_pre_reference(*args, **kw), 1e-2, 1e-4)
    f = torch.randn(t, d, device="cuda").bfloat16()
    _, _, post, comb = got
    assert _scaled_err(mk.hc_post(f, x, post, comb), mhc.hc_expand(f, x, post, comb)) <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64] + ([torch.bfloat16] if ON_GPU else []))
@pytest.mark.parametrize("t", [1, 37])
def test_hc_head_kernel_matches_reference(dtype: torch.dtype, t: int) -> None:
    """The head's collapse + norm (ops.mhc.hc_head): the Triton body is hc_pre's launch over the head's pre rows padded
    to a sub-layer's layout; the reference is hc_head_collapse then rms_norm. A write to the head's parameters (a new
    checkpoint loaded in place) rebuilds the padded copy."""
    x, fn, base, scale, w, _ = _inputs(t, 64, dtype, seed=5)
    hfn, hbase, hscale = fn[:N].contiguous(), base[:N].contiguous(), scale[:1].contiguous()
    want = mhc.hc_head(x, hfn, hbase, hscale, NORM_EPS, HC_EPS, w, 1e-5, backend.REFERENCE)
    got = mhc.hc_head(x, hfn, hbase, hscale, NORM_EPS, HC_EPS, w, 1e-5, backend.TRITON)
    assert got.dtype == want.dtype and got.shape == want.shape == (t, 64)
    tol = 2e-2 if dtype == torch.bfloat16 else TOL[dtype] * 10
    assert _scaled_err(got, want) <= tol
    hfn.mul_(-1)
    hscale.add_(0.5)
    want2 = mhc.hc_head(x, hfn, hbase, hscale, NORM_EPS, HC_EPS, w, 1e-5, backend.REFERENCE)
    assert _scaled_err(want2, want) > 10 * tol  # the change matters
    assert _scaled_err(mhc.hc_head(x, hfn, hbase, hscale, NORM_EPS, HC_EPS, w, 1e-5, backend.TRITON), want2) <= tol
    with torch.inference_mode():  # parameters made there keep no version counter
        ifn, ibase, iscale = hfn.clone(), hbase.clone(), hscale.clone()
        got = mhc.hc_head(x, ifn, ibase, iscale, NORM_EPS, HC_EPS, w, 1e-5, backend.TRITON)
    assert _scaled_err(got, want2) <= tol
