"""A step's addressing (ops/addressing.py): the Triton bodies (ops/kernels/addressing.py, one launch for the window
and one per ratio) against the plain-torch references, on steps built the way the runner builds them
(models.step.build_step): prefill rows, decode rows, an empty row (V4.1's trimmed sub-steps), a window floor (a
bounded replay's start), cached prefixes and unmapped blocks. Integers and masks equal; RoPE tables to float32
rounding."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.cache.pool import KVPools
from v4serve.models.step import RowSpec, build_step
from v4serve.ops import addressing
from v4serve.ops.backend import TRITON
from v4serve.ops.kernels import addressing as kernel

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _rows(kind: str, g: torch.Generator) -> list[RowSpec]:
    def ids(n: int) -> list[int]:
        return torch.randint(0, 1000, (n,), generator=g).tolist()

    if kind == "decode":  # one token a row, the graphed decode step
        starts = [3, 127, 128, 511, 1000, 4095, 0, 64]
        return [RowSpec(ids(1), s, slot=i, blocks=list(range(8 * i, 8 * i + 8)), cached_len=min(s, 64) * (i % 2))
                for i, s in enumerate(starts)]
    return [
        RowSpec(ids(37), 0, slot=2, blocks=[5, 1, 7]),
        RowSpec(ids(9), 130, slot=0, blocks=[3, -1, 4, 6, 2], window_floor=120, cached_len=128),
        RowSpec(ids(1), 515, slot=4, blocks=[0, 8, 9, 10, 11, 12, 13, 14, 15]),
        RowSpec([], 40, slot=1, blocks=[16]),  # a row with no token this (sub-)step
        RowSpec(ids(20), 250, slot=3, blocks=[17, 18, 19, 20]),
    ]


def _step(kind: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return build_step(_rows(kind, g), DEVICE)


class Ring:
    """A window ring of the KV pools' layout (cache.pool.KVPools.window_rows), at any width."""

    window_rows = KVPools.window_rows

    def __init__(self, window_size: int, trash_slot: int):
        self.window_size, self.trash_slot = window_size, trash_slot


def _freqs(half: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (1.0 / 10000 ** (torch.arange(half, dtype=torch.float32) / half) * (1 + torch.rand(half, generator=g))
            ).to(DEVICE)


@pytest.mark.parametrize("kind", ["prefill", "decode"])
@pytest.mark.parametrize("window", [8, 128])
def test_window_addressing_kernel_matches_reference(kind: str, window: int) -> None:
    step = _step(kind)
    freqs = [_freqs(32, 1), _freqs(32, 2)]
    trash = 9
    ring = Ring(window, trash)
    ref = addressing.window_addressing_reference(step, ring, freqs)
    got = addressing.window_addressing(step, ring, freqs, TRITON)
    assert kernel.supports(step)
    for name in ("src", "valid", "ring_rows", "write"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert len(got.rope) == 2
    for (c, s), (rc, rs) in zip(got.rope, ref.rope):
        torch.testing.assert_close(c, rc, rtol=0, atol=2e-6)
        torch.testing.assert_close(s, rs, rtol=0, atol=2e-6)


@pytest.mark.parametrize("kind", ["prefill", "decode"])
@pytest.mark.parametrize("ratio,block_size", [(4, 16), (16, 64), (128, 256)])
def test_compression_addressing_kernel_matches_reference(kind: str, ratio: int, block_size: int) -> None:
    step = _step(kind)
    freqs = _freqs(16, 3)
    num_blocks = 40
    assert kernel.supports(step)
    ref = addressing.compression_addressing_reference(step, ratio, block_size, num_blocks, 64, freqs)
    got = addressing.compression_addressing(step, ratio, block_size, num_blocks, 64, freqs, TRITON)
    for name in ("row", "entry", "valid"):
        a, b = getattr(got.groups, name), getattr(ref.groups, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(got.rows, ref.rows) and torch.equal(got.visible, ref.visible)
    assert int(ref.groups.valid.sum()) > 0  # the case completes groups
    torch.testing.assert_close(got.cos, ref.cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(got.sin, ref.sin, rtol=0, atol=2e-6)


def test_kernel_declines_what_it_cannot_take() -> None:
    """No token (a V4.1 sub-step whose rows are all trimmed) or more rows than its registers hold: the reference."""
    step = build_step([RowSpec([], 5, slot=0, blocks=[1])])
    assert not kernel.supports(step)
    got = addressing.compression_addressing(step, 4, 16, 8, 4, _freqs(8, 0).cpu(), TRITON)
    assert got.groups.row.shape == (1,) and got.visible.shape == (0,)
