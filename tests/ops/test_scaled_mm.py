"""The cuBLAS prefill GEMM (ops/kernels/scaled_mm.py) for 128 x 128-block FP8 weights.

On the CPU: the operands handed to `torch._scaled_mm` are checked by evaluating the recipe's definition over them
(sum over K blocks of a_blk @ b_blk times scale_a's column times scale_b's entry) against the plain-torch reference
of the same linear, in float64, ragged M (padding rows) included. On a GPU
(V4SERVE_TEST_DEVICE=cuda): cuBLAS itself against the reference and the Triton kernel, through `fp8_gemm.linear`.
"""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.ops import quant
from v4serve.ops.kernels import fp8_gemm, scaled_mm
from v4serve.ops.linear import linear_reference

GPU = os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda") and torch.cuda.is_available()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def _weight(n: int, k: int, g: torch.Generator, dev: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=g) * k ** -0.5 * torch.logspace(-3, 1, k)[None, :].roll(n % 5, 1)
    q, s = quant.fp8_block_quantize_weight(w, 128)
    return q.to(dev), s.view(torch.uint8).to(dev)


def _recipe(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """What cuBLAS computes for (1 x 128, 128 x 128) block scaling, in float64."""
    mp, k = a.shape
    n = b.shape[1]
    out = torch.zeros(mp, n, dtype=torch.float64)
    cols = torch.arange(n) // 128
    for kb in range(k // 128):
        blk = a[:, kb * 128:(kb + 1) * 128].double() @ b[kb * 128:(kb + 1) * 128].double()
        out += blk * sa[:, kb].double()[:, None] * sb[kb, cols].double()[None, :]
    return out


@pytest.mark.parametrize("M", [1, 6, 8])
def test_operands_carry_the_recipe(M: int) -> None:
    g = torch.Generator().manual_seed(M)
    N, K = 384, 512
    q, s = _weight(N, K, g)
    x = (torch.randn(M, K, generator=g) * torch.logspace(-2, 2, K)).to(torch.float64)
    xq, xs = quant.fp8_quantize(x, 128)
    a, b, sa, sb, rows = scaled_mm.operands(xq, xs, q, s)
    assert rows == M and a.shape[0] % 4 == 0 and a.shape[0] - M < 4
    assert sa.shape == (a.shape[0], K // 128) and sa.stride() == (1, a.shape[0])  # column-major
    assert sb.shape == (K // 128, N // 128) and sb.t().is_contiguous()
    assert b.shape == (K, N) and b.stride() == (1, K)  # the stored weight, transposed
    y = _recipe(a, b, sa, sb)
    assert torch.equal(y[M:], torch.zeros_like(y[M:]))  # padding rows are zeros
    ref = linear_reference(x, q, s, 128, 128)
    assert rel(y[:M], ref) < 1e-12


def test_not_taken_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    q, _ = _weight(256, 512, g)
    xq = torch.zeros(512, 512).to(torch.float8_e4m3fn)
    assert not scaled_mm.supports(xq, q, 128, torch.bfloat16)


@pytest.mark.skipif(not GPU, reason="cuBLAS needs a CUDA GPU (V4SERVE_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("M", [256, 1027, 4096])
@pytest.mark.parametrize("NK", [(1024, 4096), (4096, 8192), (576, 1024)])
def test_cublas_matches_the_reference_and_the_kernel(M: int, NK: tuple[int, int],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(M + NK[0])
    N, K = NK
    q, s = _weight(N, K, g, "cuda")
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).cuda()
    xq, xs = quant.fp8_quantize(x.float(), 128)
    if M * N * K < scaled_mm.MIN_WORK:
        assert not scaled_mm.supports(xq.cuda(), q, 128, torch.bfloat16)  # too small a GEMM: the Triton kernel
        monkeypatch.setattr(scaled_mm, "MIN_WORK", 0)
    assert scaled_mm.supports(xq.cuda(), q, 128, torch.bfloat16), "the recipe is not taken on this GPU"
    out = fp8_gemm.linear(x, q, s, 128, 128)  # through the dispatch: cuBLAS
    ref = linear_reference(x.float(), q, s, 128, 128)
    kernel = fp8_gemm.general(x.view(M, 1, K), q, s, 128, 128, torch.bfloat16, cfg={}).view(M, N)  # Triton
    assert rel(out, ref) < 1e-2 and rel(kernel, ref) < 1e-2
    assert rel(out, kernel) < 1e-2
    direct = scaled_mm.gemm(xq.cuda(), xs.cuda(), q, s, torch.bfloat16)
    assert torch.equal(direct, out)
