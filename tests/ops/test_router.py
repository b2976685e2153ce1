"""The Mega-Gate router kernel (ops/kernels/router.py) against ops.router.route_reference.

On the CPU the kernel runs under Triton's interpreter (tests/conftest.py) on small shapes; float32 must give the
same expert ids and weights within 1e-5 relative, float64 within 1e-12. With V4SERVE_TEST_DEVICE=cuda* the GPU
cases run at real shapes in bf16 (ids may differ only at near-ties: two of the reference's top k+1 biased scores
within 1e-4, which the kernel's fp32 summation order may rank the other way).
"""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.ops import backend, quant, router
from v4serve.ops.kernels import router as rk

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
SCORES = ("sqrtsoftplus", "softmax", "sigmoid")
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
# the interpreter's own `int(array)` on loop bounds
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _inputs(t: int, e: int, d: int, dtype: torch.dtype, bias: str, seed: int, device: str = "cpu",
            w_dtype: torch.dtype | None = None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g, dtype=torch.float64)
    w = torch.randn(e, d, generator=g, dtype=torch.float64) * d**-0.5 * 2  # logits ~ N(0, 4): all regimes of softplus
    b = {"none": None, "e": torch.randn(e, generator=g) * 0.3, "te": torch.randn(t, e, generator=g) * 0.3}[bias]
    b = b.to(device) if b is not None else None
    return x.to(device, dtype), w.to(device, w_dtype or dtype), b


def _check(got, want, dtype):
    (gw, gi), (rw, ri) = got, want
    assert gi.dtype == torch.int64 and gw.dtype == rw.dtype and gw.shape == rw.shape
    assert torch.equal(gi, ri)
    assert torch.allclose(gw, rw, rtol=TOL[dtype], atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("bias", ["none", "e", "te"])
@pytest.mark.parametrize("score", SCORES)
def test_topk_matches_reference(score, bias, dtype):
    """Every T (1; 37, not a multiple of the token block), E (8, 16 and 12, padded to 16), k (2, 6); norm on and
    off alternate so that each (T, E, k) meets both across the bias cases."""
    i = 0
    for t in (1, 37):
        for e in (8, 16, 12):
            for k in (2, 6):
                i += 1
                norm = (i + ["none", "e", "te"].index(bias)) % 2 == 0
                x, w, b = _inputs(t, e, 64, dtype, bias, seed=1000 * SCORES.index(score) + i)
                args = (x, w, b, None, None, k, score, 1.5, 1e-20, norm)
                _check(rk.route(*args), router.route_reference(*args), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("score", SCORES)
def test_hash_routing_reads_tid2eid(score, dtype):
    t, e, k, vocab = 37, 12, 6, 50
    x, w, b = _inputs(t, e, 64, dtype, "e", seed=7)
    g = torch.Generator().manual_seed(8)
    tid2eid = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(vocab)])  # int64 [vocab, k]
    token_ids = torch.randint(0, vocab, (t,), generator=g)
    args = (x, w, b, tid2eid, token_ids, k, score, 2.5, 1e-20, score != "softmax")
    got = rk.route(*args)
    _check(got, router.route_reference(*args), dtype)
    assert torch.equal(got[1], tid2eid[token_ids])


@pytest.mark.parametrize("cfg,t", [(rk.Config(block_t=16, block_e=16, block_d=16, split_d=3, epi_t=4), 37),
                                   (rk.Config(block_t=32, block_e=32, block_d=32, split_d=1), 37),
                                   (rk.Config(block_t=4, block_e=16, block_d=32, split_d=2, epi_t=4), 37),
                                   (rk.Config(block_t=1, block_e=16, block_d=32, split_d=2, epi_t=1), 5)],
                         ids=["e+d,chunked", "e", "t4", "t1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_split_grid_matches_reference(cfg, t, dtype):
    """The decode grid: expert blocks and D chunks in separate programs, the last arrival finishes the tokens."""
    x, w, b = _inputs(t, 40, 64, dtype, "te", seed=11)
    args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
    _check(rk.route(*args, config=cfg), router.route_reference(*args), dtype)


@pytest.mark.parametrize("cfg", [None, rk.Config(block_t=4, block_e=16, block_d=32, split_d=2, epi_t=4)],
                         ids=["one-pass", "split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_alternative_bias_per_token(cfg, dtype):
    """Flagged tokens (V4.1's image tokens) select with the alternative [E] bias inside the kernel: the reference's
    where-selected [T, E] bias; the flags bool or integer, none or all set; through the entry point too."""
    x, w, b = _inputs(37, 16, 64, dtype, "e", seed=21)
    g = torch.Generator().manual_seed(22)
    b2 = torch.randn(16, generator=g) * 3.0  # large enough to change the picks
    flags = (torch.rand(37, generator=g) < 0.5, torch.zeros(37, dtype=torch.bool), torch.ones(37, dtype=torch.int8))
    for alt in flags:
        args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
        want = router.route_reference(*args, alt_bias=b2, alt=alt)
        per_token = torch.where(alt.bool().unsqueeze(1), b2.unsqueeze(0), b.unsqueeze(0))
        _check(want, router.route_reference(x, w, per_token, *args[3:]), dtype)
        assert rk.supports(x, w, b, b2, alt)
        _check(rk.route(*args, config=cfg, alt_bias=b2, alt=alt), want, dtype)
        _check(router.route(*args, backend=backend.TRITON, alt_bias=b2, alt=alt), want, dtype)
    assert not rk.supports(x, w, b, b2, torch.ones(37))  # float flags are refused (the reference path takes them)


def test_mixed_weight_dtype_and_strides():
    """bf16 gate weight with float32 x (upcast in the kernel), x a non-contiguous view."""
    x, w, b = _inputs(37, 16, 64, torch.float32, "e", seed=5, w_dtype=torch.bfloat16)
    x = torch.cat([x, x], 1)[:, ::2]
    args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
    _check(rk.route(*args), router.route_reference(*args), torch.float32)


def test_ties_pick_the_lower_expert_index():
    x, w, _ = _inputs(5, 16, 64, torch.float32, "none", seed=3)
    w[9] = w[2]  # experts 2 and 9 tie exactly; make them the top two with a bias
    w[4] = w[13]
    bias = torch.zeros(16)
    bias[[2, 9]] = 10.0
    bias[[4, 13]] = 5.0
    weights, ids = rk.route(x, w, bias, None, None, 4, "sigmoid", 1.0, 1e-20, True)
    assert ids.tolist() == [[2, 9, 4, 13]] * 5
    assert torch.equal(weights[:, 0], weights[:, 1]) and torch.equal(weights[:, 2], weights[:, 3])


def test_entry_point_dispatches():
    x, w, b = _inputs(37, 16, 64, torch.float32, "te", seed=9)
    args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
    got = router.route(*args, backend=backend.TRITON)
    want = rk.route(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ref = router.route(*args, backend=backend.REFERENCE)
    want = router.route_reference(*args)
    assert torch.equal(ref[0], want[0]) and torch.equal(ref[1], want[1])
    assert rk.supports(x, w, b) and rk.supports(x, w, None)
    assert not rk.supports(x, w, torch.zeros(3))  # a bias of the wrong shape falls back to the reference


@pytest.mark.parametrize("cfg,t", [(None, 37), (None, 1),
                                   (rk.Config(block_t=1, block_e=16, block_d=32, split_d=2, epi_t=1), 1),
                                   (rk.Config(block_t=4, block_e=16, block_d=64, split_d=3, epi_t=4), 5)],
                         ids=["one-pass", "one-pass-t1", "split-t1", "split-uneven-d"])
@pytest.mark.parametrize("dtype,group", [(torch.float32, 32), (torch.float64, 32), (torch.bfloat16, 16)],
                         ids=["fp32-g32", "fp64-g32", "bf16-g16"])
def test_router_writes_the_experts_simulated_input(cfg, t, dtype, group):
    """xq: x's FP8 quant-dequant per 1 x group (quant.fp8_simulate, bit for bit) from programs of their own in the
    router's launch (the split grid's arrival count leaves them out: the routing is the same as without); D = 160
    is not a multiple of the split's D share (split-uneven-d: 64 + 64 + 32) and x spans 2^-12..2^5 so that the
    groups' scales differ; every element of the poisoned buffer is written."""
    if ON_GPU and dtype == torch.float64:
        pytest.skip("float64 runs under the CPU interpreter only")
    dev = "cuda" if ON_GPU else "cpu"
    g = torch.Generator().manual_seed(31 + t)
    d = 160
    x = (torch.randn(t, d, generator=g, dtype=torch.float64)
         * torch.exp2(torch.randint(-12, 6, (t, d // group, 1), generator=g)).repeat_interleave(group, 1)
         .view(t, d)).to(dev, dtype)
    w = (torch.randn(40, d, generator=g, dtype=torch.float64) * d**-0.5).to(dev, dtype)
    b = (torch.randn(40, generator=g) * 0.3).to(dev)
    args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
    xq = torch.full_like(x, float("nan"))
    got = rk.route(*args, config=cfg, xq=xq, quant_group=group)
    assert torch.equal(xq, quant.fp8_simulate(x, group))
    want = rk.route(*args, config=cfg)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert rk.simulates(x, w, group) and not rk.simulates(x, w, 48)  # 48: not a power of two
    with pytest.raises(ValueError, match="does not fit"):  # groups wider than the config's D chunk
        rk.route(*args, config=rk.Config(block_t=1, block_e=16, block_d=32, split_d=2, epi_t=1), xq=xq,
                 quant_group=64)


@pytest.mark.parametrize("backend_name", [backend.TRITON, backend.REFERENCE])
def test_entry_point_fills_the_simulated_input_everywhere(backend_name):
    """ops.router.route fills xq on every path: in the kernel's launch, or (a group the kernel's D chunks do not
    tile; the reference backend) by quant.fp8_simulate beside it."""
    x, w, b = _inputs(3, 16, 256, torch.float32, "e", seed=41)
    args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
    want = router.route_reference(*args)
    for group in (32, 128):
        xq = torch.full_like(x, float("nan"))
        got = router.route(*args, backend=backend_name, xq=xq, quant_group=group)
        assert torch.equal(xq, quant.fp8_simulate(x, group))
        _check(got, want, torch.float32)


def _near_tie_tokens(x, w, b, k: int) -> torch.Tensor:
    """Tokens whose reference biased scores have two neighbours within 1e-4 among the top k+1: the kernel's fp32 sum
    order may rank those differently (the k-th/(k+1)-th pair changes the set, a pair inside the top-k the order)."""
    sel = torch.nn.functional.softplus(x.float() @ w.float().t()).sqrt() + b
    top = sel.topk(k + 1, dim=-1).values
    return ((top[:, :-1] - top[:, 1:]).abs() <= 1e-4).any(-1)


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
@pytest.mark.parametrize("bias", ["e", "te", "alt"])
@pytest.mark.parametrize("t", [1, 64, 256, 4096])
def test_gpu_real_shapes(t, bias):
    """alt: V4.1's per-token alternative bias (image tokens' bias_vl), chosen inside the kernel."""
    e, d, k = 256, 4096, 6
    x, w, b = _inputs(t, e, d, torch.bfloat16, "e" if bias == "alt" else bias, seed=t, device="cuda")
    b = b.float()
    assert rk.supports(x, w, b) and not rk.supports(x.double(), w.double(), b)
    alt = {}
    if bias == "alt":
        g = torch.Generator().manual_seed(t + 1)
        alt = {"alt_bias": (torch.randn(e, generator=g) * 0.3).cuda(),
               "alt": (torch.rand(t, generator=g) < 0.5).cuda()}
        assert rk.supports(x, w, b, alt["alt_bias"], alt["alt"])
    args = (x, w, b, None, None, k, "sqrtsoftplus", 1.5, 1e-20, True)
    gw, gi = rk.route(*args, **alt)
    rw, ri = router.route_reference(*args, **alt)
    bad = (gi != ri).any(-1)
    per_token = torch.where(alt["alt"].unsqueeze(1), alt["alt_bias"].unsqueeze(0), b.unsqueeze(0)) if alt else b
    near = _near_tie_tokens(x, w, per_token, k)
    assert not (bad & ~near).any(), f"{int((bad & ~near).sum())} tokens differ outside near-ties ({int(bad.sum())} all)"
    same = ~bad
    assert torch.allclose(gw[same], rw[same], rtol=1e-4, atol=0)
    gw2, gi2 = rk.route(*args, **alt)  # the split grid's reduction order is fixed: bitwise repeatable
    assert torch.equal(gw, gw2) and torch.equal(gi, gi2)


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
@pytest.mark.parametrize("e,d,t", [(384, 7168, 37), (384, 7168, 2048), (16, 64, 5)])
def test_gpu_other_presets(e, d, t):
    """V4.1-Flash's E=384 (pads to 512: two expert blocks even in prefill) and a reduced preset; [T, E] bias."""
    x, w, b = _inputs(t, e, d, torch.bfloat16, "te", seed=e + t, device="cuda")
    b = b.float()
    args = (x, w, b, None, None, 6, "sqrtsoftplus", 1.5, 1e-20, True)
    gw, gi = rk.route(*args)
    rw, ri = router.route_reference(*args)
    bad = (gi != ri).any(-1)
    assert not (bad & ~_near_tie_tokens(x, w, b, 6)).any()
    assert torch.allclose(gw[~bad], rw[~bad], rtol=1e-4, atol=0)


@pytest.mark.skipif(not ON_GPU, reason="needs V4SERVE_TEST_DEVICE=cuda* and a GPU")
@pytest.mark.parametrize("t", [1, 64])
def test_gpu_graph_replay(t):
    """Captured once, replayed on new inputs: the split grid's counters reset themselves."""
    e, d, k = 256, 4096, 6
    x, w, b = _inputs(t, e, d, torch.bfloat16, "e", seed=1, device="cuda")
    args = (x, w, b.float(), None, None, k, "sqrtsoftplus", 1.5, 1e-20, True)
    rk.route(*args)  # compile and allocate the counters outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = rk.route(*args)
    for seed in range(3):
        x.copy_(_inputs(t, e, d, torch.bfloat16, "e", seed=100 + seed, device="cuda")[0])
        g.replay()
        want = rk.route(*args)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
