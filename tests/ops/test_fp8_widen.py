"""kernels/fp8_widen.py against ops.linear.dequantize: exact, for V4's 128 and V4.1's 32 blocks, ragged edges."""

from __future__ import annotations

import pytest
import torch

from v4serve.ops import quant
from v4serve.ops.kernels import fp8_widen
from v4serve.ops.linear import dequantize

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _weight(rows: int, cols: int, block: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(rows, cols, generator=g) * 0.05
    q, s = quant.fp8_block_quantize_weight(w, block)
    return q.to(DEVICE), s.to(DEVICE)


@pytest.mark.parametrize("rows,cols,block", [(256, 384, 128), (200, 96, 32), (64, 130, 32)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_widen_equals_dequantize(rows: int, cols: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(rows + cols)
    q, s = _weight(rows, cols, block, g)
    got = fp8_widen.widen(q, s, block, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, dequantize(q, s, block, dtype))


def test_widen_into_a_view_and_the_extreme_scales() -> None:
    """Rows of a wider buffer; scale bytes 0 (2**-127, subnormal in float32) and 254 read as the reference does."""
    g = torch.Generator().manual_seed(3)
    q, s = _weight(64, 64, 32, g)
    s = s.view(torch.uint8).clone()
    s[0, 0], s[1, 1] = 0, 135
    buf = torch.zeros(64, 96, dtype=torch.float32, device=DEVICE)
    fp8_widen.widen(q, s, 32, out=buf[:, :64])
    assert torch.equal(buf[:, :64], dequantize(q, s, 32, torch.float32))
    assert not buf[:, 64:].any()
