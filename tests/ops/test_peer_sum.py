"""A tensor-parallel sum left to the mHC expansion (ops/peer_sum.py): the kernels read the ranks' partials through
their address table and sum them as they load f. The "ranks' partials" are tensors of this process (the table holds
their addresses, as on a GPU it holds the peers' mapped buffers); the result must be bit for bit the expansion of the
summed tensor, in float32 and float64, for hc_post and the fused hc_post + hc_pre. Under the interpreter on the CPU;
with V4SERVE_TEST_DEVICE=cuda the same cases on the GPU (tests/dist/test_allreduce.py: real peers on two GPUs)."""

from __future__ import annotations

import pytest
import torch

from v4serve.ops import backend, mhc
from v4serve.ops.kernels import mhc as mk
from v4serve.ops.peer_sum import PartialSum, resolve

from test_mhc import HC_EPS, ITERS, NORM_EPS, N, POST_PRE_CONFIGS, _expansion, _kwargs

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _partial(f: torch.Tensor, ranks: int, out_dtype: torch.dtype | None = None, seed: int = 0) -> PartialSum:
    """f split into `ranks` random partials (each of f's dtype) whose sum is about f."""
    g = torch.Generator().manual_seed(seed)
    noise = [torch.randn(f.shape, generator=g, dtype=torch.float64).to(f.device, f.dtype) for _ in range(ranks - 1)]
    parts = [f - sum(n.to(torch.float64) for n in noise).to(f.dtype), *noise]
    return PartialSum(parts, out_dtype or f.dtype)


def test_total_sums_in_rank_order_and_rounds() -> None:
    parts = [torch.tensor([1.0, 2.0**-30]), torch.tensor([2.0**-30, 1.0])]
    p = PartialSum(parts, torch.bfloat16)
    assert p.total().dtype == torch.bfloat16 and p.total().tolist() == [1.0, 1.0]
    assert torch.equal(resolve(p), p.total()) and resolve(parts[0]) is parts[0]
    assert p.pointers().tolist() == [t.data_ptr() for t in parts]
    assert not PartialSum([parts[0], torch.zeros(4)[::2]], torch.float32).fusable()


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_hc_post_sums_the_partials_as_it_loads(dtype: torch.dtype, ranks: int) -> None:
    f, x, post, comb, *_ = _expansion(37, 96, dtype, seed=5 + ranks)
    p = _partial(f, ranks, seed=ranks)
    assert torch.equal(mk.hc_post(p, x, post, comb), mk.hc_post(p.total(), x, post, comb))
    # the family's fast path: the kernel where it runs (not float64 on a GPU: mk.supports), else the summed reference
    fast = mk.hc_post(p.total(), x, post, comb) if mk.supports(x) else mhc.hc_expand(p.total(), x, post, comb)
    assert torch.equal(mhc.hc_post(p, x, post, comb, backend.TRITON), fast)
    assert torch.equal(mhc.hc_post(p, x, post, comb), mhc.hc_expand(p.total(), x, post, comb))  # reference: summed


@pytest.mark.parametrize("cfg", POST_PRE_CONFIGS.values(), ids=POST_PRE_CONFIGS.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_hc_post_pre_sums_the_partials_as_it_loads(dtype: torch.dtype, cfg) -> None:
    """Every grid (token blocks, D split over programs, the one-chunk FMA form): the same bits as the expansion and
    pre side of the summed f."""
    f, x, post, comb, fn, base, scale, w, cpre = _expansion(5, 96, dtype, seed=17)
    pre_args = (fn, base, scale, N, ITERS, NORM_EPS, HC_EPS)
    kw = _kwargs(x, w, cpre, lagged=True, normed=True)
    p = _partial(f, 2, seed=3)
    got = mk.hc_post_pre(p, x, post, comb, *pre_args, **kw, config=cfg)
    want = mk.hc_post_pre(p.total(), x, post, comb, *pre_args, **kw, config=cfg)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_narrower_sum_is_rounded_before_the_expansion() -> None:
    """The MoE's case: float32 partials whose sum the model rounds to the streams' dtype (here float32 partials of a
    float64 sum would widen; the test rounds float64 partials to a float32 sum, the same step)."""
    f, x, post, comb, *_ = _expansion(9, 64, torch.float64, seed=23)
    p = _partial(f, 2, out_dtype=torch.float32, seed=4)
    got = mk.hc_post(p, x, post, comb)
    assert torch.equal(got, mk.hc_post(p.total(), x, post, comb))
    assert not torch.equal(got, mk.hc_post(PartialSum(p.parts, torch.float64).total(), x, post, comb))


def test_unfusable_partials_are_summed_first() -> None:
    f, x, post, comb, *_ = _expansion(4, 64, torch.float32, seed=29)
    wide = torch.zeros(4, 128, device=f.device)
    wide[:, ::2] = f
    p = PartialSum([wide[:, ::2], torch.zeros(4, 64, device=f.device)], torch.float32)  # strided: no one row stride
    assert not p.fusable()
    assert torch.equal(mhc.hc_post(p, x, post, comb, backend.TRITON), mk.hc_post(p.total(), x, post, comb))


SM90_PEERS = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from v4serve.ops.kernels import mhc as mk
const = dict(N=4, BLOCK_T=1, BLOCK_D=512, ACC=tl.float32, PEERS=2, FDT=tl.bfloat16, PDL=True)
sig = {n: "constexpr" if n in const else "*i64" if n == "peers_ptr" else "*fp32" if n == "f_ptr" else
       "*bf16" if n in ("x_ptr", "out_ptr") else "*fp32" if n.endswith("_ptr") else "i32"
       for n in mk._hc_post_kernel.arg_names}
k = triton.compile(ASTSource(mk._hc_post_kernel, sig, const), target=GPUTarget("cuda", 90, 32))
print("cvt.rn.bf16.f32" in k.asm["ptx"], k.asm["ptx"].count("ld.global.b64"))
"""


def test_the_fused_load_compiles_for_sm90() -> None:
    """The expansion with two ranks' float32 partials rounded to bf16 (the MoE's sum), compiled for sm_90 without a
    GPU: the address table's loads and the rounding are there."""
    from sm90_compile import run_compile

    rounds, table_loads = run_compile(SM90_PEERS).split()[-2:]
    assert rounds == "True" and int(table_loads) >= 1


SM90_PLAIN = """
import dataclasses, torch
from v4serve.ops.kernels import mhc as mk
n, d = 4, 4096


def launch(t, fma):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, n, d, generator=g).to(torch.bfloat16)
    f = torch.randn(t, d, generator=g).to(torch.bfloat16)
    post, comb = torch.rand(t, n, generator=g), torch.rand(t, n, n, generator=g)
    fn, base, scale = torch.randn((2 + n) * n, n * d, generator=g), torch.randn((2 + n) * n), torch.ones(3)
    pre = dataclasses.replace(mk.default_pre_config(t, d, True), fma=fma)
    mk.hc_post(f, x, post, comb, mk.default_post_config(t, d, True))
    mk.hc_post_pre(f, x, post, comb, fn, base, scale, n, 20, 1e-6, 1e-6, norm_weight=torch.ones(d), config=pre)


done = compile_launches(lambda: (launch(1, True), launch(8192, False)))
print(sorted({name for name, _ in done}), len(done))
"""


def test_the_plain_expansion_compiles_for_sm90() -> None:
    """The expansions as one GPU launches them (f a tensor: no partials, peers_ptr left out), at a decode and a prefill
    config, compiled for sm_90 with the arguments their launchers pass. The fused load once typed the partials' code
    after the plain load's early return as well, and every mHC expansion then failed to compile on the GPU while the
    interpreter ran it."""
    from sm90_compile import RECORD_AND_COMPILE, run_compile

    out = run_compile(RECORD_AND_COMPILE + SM90_PLAIN).strip().splitlines()[-1]
    # decode: the expansion, then the fused post + pre; the 8K prefill: the expansion, then post + pre as two launches
    # (the default prefill grid's PreConfig.post_apart)
    assert out == "['_hc_post_kernel', '_hc_post_pre_kernel', '_hc_pre_kernel'] 5"
