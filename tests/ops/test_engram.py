"""Engram's gated stream update in one launch (ops/kernels/engram.py) against ops.engram.engram_mix_reference (the
layer's torch code), and the entry point's dispatch by backend."""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.ops import backend
from v4serve.ops.engram import GATE_FLOOR, engram_mix, engram_mix_reference
from v4serve.ops.kernels import engram as kernel

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.float32, torch.bfloat16) if ON_GPU else (torch.float64, torch.float32, torch.bfloat16)
HC = 4
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _inputs(t: int, d: int, dtype: torch.dtype, seed: int):
    """Streams x [t, hc, d] in `dtype`; key and value as the layer's views of one projection [t, (hc + 1) d] (float32,
    float64 for a float64 model); bf16 q / k weights [hc, d] (as loaded); token 1 dead; stream 2 of token 0 with a
    negative dot inside the floor's clamp, exactly so: its key is one-hot, against an x value of ~1e-7 of the rms."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(t, HC, d, generator=g, dtype=torch.float64) * 3
    x[0, 2, 5] = -3e-7
    x = x.to(dtype)
    kv = torch.randn(t, (HC + 1) * d, generator=g, dtype=torch.float64).to(acc)
    q_w = (1 + 0.1 * torch.randn(HC, d, generator=g)).to(torch.bfloat16)
    k_w = (1 + 0.1 * torch.randn(HC, d, generator=g)).to(torch.bfloat16)
    key, value = kv[:, : HC * d].view(t, HC, d), kv[:, HC * d:]
    key[0, 2] = 0
    key[0, 2, 5] = 1  # the dot: one product, its sign exact
    live = torch.ones(t, dtype=torch.bool)
    if t > 1:
        live[1] = False
    dev = torch.device(DEVICE)
    kv = kv.to(dev)
    key, value = kv[:, : HC * d].view(t, HC, d), kv[:, HC * d:]
    return x.to(dev), key, value, q_w.to(dev), k_w.to(dev), live.to(dev)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    elif dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # a bf16 result may land one bf16 step apart where the float32 sum rounds across a tie
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("d", [64, 96])
@pytest.mark.parametrize("block", [None, 32])
def test_kernel_matches_reference(dtype: torch.dtype, t: int, d: int, block: int | None) -> None:
    """Whole rows in one chunk (96: a masked tail) and 32-wide chunks (several per pass)."""
    x, key, value, qw, kw, live = _inputs(t, d, dtype, seed=d + t)
    got = kernel.engram_mix(x, key, value, qw, kw, live, 1e-6, block=block)
    want = engram_mix_reference(x, key, value, qw, kw, live, 1e-6)
    _close(got, want, dtype)
    if t > 1:  # the dead token: its streams as they came (the update's gate is 0)
        assert torch.equal(got[1], x[1])
    # the clamp case really is one: the reference's dot for token 0, stream 2 lies in (-GATE_FLOOR, 0)
    h = x[0, 2].to(key.dtype)
    rstd = torch.rsqrt(h.square().mean() + 1e-6) * torch.rsqrt(key[0, 2].square().mean() + 1e-6)
    dot = float((h * (qw.float() * kw.float())[2] * key[0, 2]).sum() * rstd * d ** -0.5)
    assert -GATE_FLOOR < dot < 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_streams(dtype: torch.dtype) -> None:
    """x read through strides (a view of wider streams)."""
    x, key, value, qw, kw, live = _inputs(3, 96, dtype, seed=7)
    wide_x = torch.zeros(3, HC, 128, dtype=dtype, device=x.device)
    wide_x[..., :96] = x
    xs = wide_x[..., :96]
    got = kernel.engram_mix(xs, key, value, qw, kw, live, 1e-6, block=64)
    _close(got, engram_mix_reference(x, key, value, qw, kw, live, 1e-6), dtype)
    assert got.is_contiguous()


def test_zero_streams_take_the_floor() -> None:
    """x = 0: every dot is 0, the floor gives each live stream the gate sigmoid(+sqrt(GATE_FLOOR)), as the reference."""
    x, key, value, qw, kw, live = _inputs(2, 64, torch.float32, seed=3)
    x = torch.zeros_like(x)
    got = kernel.engram_mix(x, key, value, qw, kw, live, 1e-6)
    torch.testing.assert_close(got, engram_mix_reference(x, key, value, qw, kw, live, 1e-6), rtol=1e-6, atol=0)
    gate = torch.sigmoid(torch.tensor(GATE_FLOOR).sqrt()).item()
    torch.testing.assert_close(got[0], gate * value[0].expand(HC, -1), rtol=1e-6, atol=0)
    assert torch.equal(got[1], x[1])  # dead


def test_entry_point_dispatches_by_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    x, key, value, qw, kw, live = _inputs(3, 96, torch.float32, seed=11)
    calls = []
    real = kernel.engram_mix
    monkeypatch.setattr(kernel, "engram_mix", lambda *a: calls.append(1) or real(*a))
    ref = engram_mix(x, key, value, qw, kw, live, 1e-6)
    assert not calls and torch.equal(ref, engram_mix_reference(x, key, value, qw, kw, live, 1e-6))
    got = engram_mix(x, key, value, qw, kw, live, 1e-6, backend.TRITON)
    assert calls == [1]
    _close(got, ref, torch.float32)
    # inputs the kernel does not take run the reference: a float liveness mask
    assert not kernel.supports(x, key, value, qw, kw, live.float())
    assert torch.equal(engram_mix(x, key, value, qw, kw, live.float(), 1e-6, backend.TRITON), ref)
    assert calls == [1]


def test_no_tokens() -> None:
    x, key, value, qw, kw, live = _inputs(1, 64, torch.float32, seed=1)
    got = kernel.engram_mix(x[:0], key[:0], value[:0], qw, kw, live[:0], 1e-6)
    assert got.shape == (0, HC, 64) and got.dtype == x.dtype


SM90 = """
import torch
from v4serve.ops.kernels import engram as kernel
x = torch.randn(1, 4, 5120).to(torch.bfloat16)
kv = torch.randn(1, 5 * 5120)
w = torch.ones(4, 5120, dtype=torch.bfloat16)
done = compile_launches(lambda: kernel.engram_mix(x, kv[:, :4 * 5120].view(1, 4, 5120), kv[:, 4 * 5120:], w, w,
                                                  torch.ones(1, dtype=torch.bool), 1e-6))
ptx = done[0][1].asm["ptx"]
print(len(done), done[0][0], "griddepcontrol.wait" in ptx, "sqrt.rn.f32" in ptx, "div.rn.f32" in ptx)
"""


def test_the_kernel_compiles_for_sm90() -> None:
    """As a bf16 decode step launches it (D = 5120, PDL on), compiled for sm_90 without a GPU: IEEE square root and
    division, the wait before any access."""
    from sm90_compile import RECORD_AND_COMPILE, run_compile

    out = run_compile(RECORD_AND_COMPILE + SM90).strip().splitlines()[-1]
    assert out == "1 _engram_mix_kernel True True True"
