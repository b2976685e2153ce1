"""The one-launch RMS norm for wide rows (ops/kernels/norm.py) against ops.norm.rms_norm, its dispatch from
ops.finish.finish_rows (norm-only calls on rows wider than the finish kernel's tiles), and its FP8 output for the GEMM
it feeds (ops.norm.rms_norm_fp8)."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.ops import quant
from v4serve.ops.finish import finish_rows
from v4serve.ops.kernels import norm as kernel
from v4serve.ops.norm import rms_norm, rms_norm_fp8

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.float32, torch.bfloat16) if ON_GPU else (torch.float64, torch.float32, torch.bfloat16)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1024, 1536, 4096, 7168] if ON_GPU else [96, 1024])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_kernel_matches_reference(dtype: torch.dtype, d: int, weighted: bool) -> None:
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(5, d, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 5, dtype=torch.float64)[:, None])
    x = x.to(DEVICE, dtype)
    x[2] = 0  # a zero row: eps keeps it finite (0)
    w = (torch.randn(d, generator=g) + 1).to(DEVICE, dtype) if weighted else None
    got = kernel.rms_norm(x, w, 1e-6)
    want = rms_norm(x, w, 1e-6)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.float64:
        assert torch.allclose(got, want, rtol=1e-13, atol=0)
    else:
        ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 23)
        assert torch.allclose(got.double(), want.double(), rtol=4 * ulp, atol=0)
    assert torch.equal(got[2], torch.zeros_like(got[2]))


def test_finish_rows_dispatches_wide_norms_to_the_norm_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, 2, 1024, dtype=torch.float64 if not ON_GPU else torch.float32).to(DEVICE)
    w = torch.rand(1024, dtype=x.dtype).to(DEVICE)
    calls = []
    real = kernel.rms_norm
    monkeypatch.setattr(kernel, "rms_norm", lambda *a: calls.append(1) or real(*a))
    out = finish_rows(x, w, 1e-6, None, None, False, None, 0, backend="triton")
    assert calls and torch.allclose(out, rms_norm(x, w, 1e-6), rtol=1e-6 if ON_GPU else 1e-13)
    assert finish_rows(x, None, 1e-6, None, None, False, None, 0, backend="triton") is x  # nothing to do


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] if ON_GPU else [torch.bfloat16])
@pytest.mark.parametrize("d,group", [(1024, 128), (1536, 128), (96, 32)] if ON_GPU else [(96, 32), (384, 128)])
def test_rms_norm_fp8_quantizes_the_rows_it_returns(dtype: torch.dtype, d: int, group: int) -> None:
    """The norm's launch also quantizes its rounded rows per 1 x group (the q latent for wq_b): the rows are the norm
    kernel's own, bit for bit, and values and scales are those of quant.fp8_quantize on them (a zero row included:
    amax floored, zeros); the reference entry point composes rms_norm and quant.fp8_rows."""
    g = torch.Generator().manual_seed(d + group)
    x = (torch.randn(6, d, generator=g) * torch.logspace(-3, 2, d)[None, :]).to(DEVICE, dtype)
    x[3] = 0
    w = (torch.rand(d, generator=g) + 0.5).to(DEVICE, dtype)
    y, q = rms_norm_fp8(x, w, 1e-6, group, backend="triton")
    assert torch.equal(y, kernel.rms_norm(x, w, 1e-6))
    values, scales = quant.fp8_quantize(y, group)
    assert isinstance(q, quant.Quantized) and q.group == group and q.dtype == dtype
    assert torch.equal(q.values.float(), values.float()) and torch.equal(q.scales, scales)
    assert q.scales.shape == (6, d // group) and torch.equal(q.values[3].float(), torch.zeros(d, device=DEVICE))
    y_ref, q_ref = rms_norm_fp8(x, w, 1e-6, group)
    assert torch.equal(y_ref, rms_norm(x, w, 1e-6))
    assert torch.equal(q_ref.dequantize(), quant.fp8_simulate(y_ref, group))
    assert kernel.supports_quant(x, group) and not kernel.supports_quant(x, 48)
    assert not kernel.supports_quant(x.float(), group)
