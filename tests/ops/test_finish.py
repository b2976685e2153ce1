"""The fused finishing kernel (ops/kernels/finish.py) against ops.finish.finish_rows_reference.

Every chain the models run: the window KV row (norm, RoPE, window format), the compressed entry (norm, RoPE, entry
format, stored), the index key (norm, RoPE, Hadamard, MXFP4, stored), the index query [N, H, D] (RoPE, Hadamard, MXFP4),
the norm alone and the bare store (the window write) into every record format. Inputs have rows of very different
scales, a zero row, a negative zero, a group of tiny values (the FP8 amax floor, NVFP4's floored and subnormal e4m3
scales) and, in bf16, many exact ties of the FP8/FP4 roundings.

What is asserted:
* float64 (the interpreter's exactness runs): values within 1e-12 of the reference and records byte-identical to the
  reference's (only a float64 plain pool is compared to 1e-12: its bytes are the values).
* every dtype: the stored records are byte-identical to `codec.encode(finished values)`, rows not written are
  untouched, and the finished values equal `simulate(kernel's own pre-quantization values)` exactly.
* float32 / bf16: the pre-quantization values (the kernel's, before its simulation) are within float32 rounding (a few ulps:
  the sums of the norm and the rotation run in another order) or bf16 rounding of the reference's. In bf16 an ulp
  of float32 difference flips a rounding to bf16 when the value sits on a bf16 midpoint; the FP8/FP4 steps after it
  then may differ by one step (one group's scale, if it is the amax). That does happen (rarely: about 2^-16 per
  element per rounding), so bf16 values must agree exactly on nearly all elements, and the quantized outputs must
  equal the simulation of the kernel's own pre-quantization values (written by the same launch), never a loosened
  tolerance.

On the CPU the kernel runs under Triton's interpreter at small shapes; with V4SERVE_TEST_DEVICE=cuda the same cases
run at V4's shapes (D=512 / rope 64 rows, D=128 index rows, 64 query heads, up to a few thousand rows) in bf16/fp32.
"""

from __future__ import annotations

import os

import pytest
import torch

from v4serve.cache.formats import Codec
from v4serve.cache.pool import RowPool
from v4serve.ops import finish as ops_finish
from v4serve.ops.backend import TRITON
from v4serve.ops.finish import finish_rows_reference, simulate
from v4serve.ops.kernels import finish as kernel
from v4serve.ops.rope import rope_cos_sin

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

D_KV, RD = (512, 64) if ON_GPU else (128, 64)
D_IDX = 128
HEADS = 64 if ON_GPU else 4
NS = (1, 33, 3000) if ON_GPU else (19, 300)  # rows (19: part of a block masked; 300: more roundings)
NS_HEADS = (1, 33, 3000) if ON_GPU else (5,)
DTYPES = (torch.float32, torch.bfloat16) if ON_GPU else (torch.float64, torch.float32, torch.bfloat16)
EPS = 1e-6
TOL = {torch.float64: 1e-12, torch.float32: 4e-6, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}  # of the row max


def _inputs(n: int, d: int, dtype: torch.dtype, seed: int, heads: int | None = None):
    """x [n, d] or [n, heads, d], a norm weight [d], and cos/sin [n, RD/2] of random positions."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, d) if heads is None else (n, heads, d)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp(torch.randn(shape[:-1], generator=g,
                                                                                   dtype=torch.float64) * 2)[..., None]
    x[..., :16] *= 0.02  # a group of small values: subnormal NVFP4 scales (with or without the norm)
    x[..., 16:32] *= 1e-6  # below the FP8 amax floor (1e-4) and NVFP4's (6 * 2^-9)
    x[0] = 0.0  # a zero row
    if n > 2:
        x[1, ..., 40] = -0.0
        # a float64 value that float32 rounds onto a bf16 midpoint: torch's float64 -> bf16 cast goes through
        # float32 (rounds it down to even, where one rounding would go up); the kernel must do the same
        x[2, ..., -1] = 1 + 2.0**-8 + 2.0**-30
    w = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
    w[16:32] *= 1e-3
    pos = torch.randint(0, 100_000, (n,), generator=g)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, RD, 2, dtype=torch.float32) / RD))
    cos, sin = rope_cos_sin(pos, freqs)
    return x.to(DEVICE, dtype), w.to(DEVICE, torch.float32), cos.to(DEVICE), sin.to(DEVICE)


def _pools(kind: str, d: int, pool_dtype: torch.dtype, n: int, seed: int, trash_writes: int = 1):
    """Two identical pools (reference, kernel) with random contents, and n duplicate-free rows of which
    `trash_writes` go to the trash row."""
    g = torch.Generator().manual_seed(seed + 1)
    codec = Codec(kind, d, RD if kind == "v4_fp8" else 0, pool_dtype)
    ref, got = RowPool(codec, 2 * n + 3, DEVICE), RowPool(codec, 2 * n + 3, DEVICE)
    if kind == "plain":
        init = torch.randn(ref.data.shape, generator=g, dtype=torch.float64).to(pool_dtype)
    else:
        init = torch.randint(0, 256, ref.data.shape, generator=g, dtype=torch.uint8)
    ref.data.copy_(init)
    got.data.copy_(init)
    rows = torch.randperm(ref.rows, generator=g)[: n - trash_writes]
    rows = torch.cat([rows, torch.full((trash_writes,), ref.trash)])
    rows = rows[torch.randperm(n, generator=g)]
    return ref, got, rows.to(DEVICE)


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    g, r = got.double(), ref.double()
    scale = r.abs().amax(-1, keepdim=True)
    err = (g - r).abs()
    assert (err <= TOL[dtype] * scale).all(), f"max error {float((err / scale.clamp_min(1e-300)).max()):.3g}"
    if dtype in (torch.bfloat16, torch.float16):  # different roundings only where a value sits on a midpoint
        assert (got == ref).double().mean() >= 0.98


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _run(x, w, cos, sin, rotate: bool, fmt: str | None, kind: str | None = None, pool_dtype=torch.float32,
         seed: int = 0, trash_writes: int = 1, config: kernel.Config | None = None):
    """Runs both bodies and asserts as the module docstring says; returns (finished values, the kernel's pool)."""
    dtype = x.dtype
    pref = pgot = rows = None
    if kind is not None:
        pref, pgot, rows = _pools(kind, x.shape[-1], pool_dtype, x.shape[0], seed, trash_writes)
        init = pgot.data.clone()
    if ON_GPU and not kernel.supports(x, fmt, pgot, rotate):
        # declined on the GPU (kernel.supports says why): only these, and the entry point runs the reference
        assert kind == "fp8_row" or (rotate and x.shape[-1] > 256), "the kernel declined an unexpected case"
        ref = finish_rows_reference(x, w, EPS, cos, sin, rotate, fmt, RD, pref, rows)
        got = ops_finish.finish_rows(x, w, EPS, cos, sin, rotate, fmt, RD, pgot, rows, backend=TRITON)
        assert torch.equal(got, ref) and (pgot is None or torch.equal(_bytes(pgot.data), _bytes(pref.data)))
        return got, pgot
    assert kernel.supports(x, fmt, pgot, rotate)
    ref = finish_rows_reference(x, w, EPS, cos, sin, rotate, fmt, RD, pref, rows)
    pre = torch.empty_like(x, memory_format=torch.contiguous_format)
    got = kernel.finish_rows(x, w, EPS, cos, sin, rotate, fmt, RD, pgot, rows, config=config, pre=pre)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    # the kernel's own values before the simulation (same launch), against the reference's
    _close(pre, finish_rows_reference(x, w, EPS, cos, sin, rotate, None, RD), dtype)
    # the simulation is exact on them, and agrees with the reference's end to end
    assert torch.equal(got, simulate(pre, fmt, RD))
    if not ON_GPU:  # the launch without `pre` is the same computation (the GPU compiler may order sums otherwise)
        assert torch.equal(got, kernel.finish_rows(x, w, EPS, cos, sin, rotate, fmt, RD, config=config))
    if dtype == torch.float64 or fmt is None:
        _close(got, ref, dtype)
    else:  # one FP8/FP4 step apart only where the pre-quantization values differ (see the module docstring)
        assert (got == ref).double().mean() >= 0.95
    if kind is not None:
        trash = pgot.trash
        single = rows != trash if trash_writes > 1 else torch.ones_like(rows, dtype=torch.bool)
        stored = pgot.data[rows[single]]
        assert torch.equal(_bytes(stored), _bytes(pgot.codec.encode(got[single].reshape(-1, x.shape[-1]))))
        untouched = torch.ones(pgot.data.shape[0], dtype=torch.bool, device=DEVICE)
        untouched[rows] = False
        assert torch.equal(_bytes(pgot.data[untouched]), _bytes(init[untouched]))
        if trash_writes > 1 and not ON_GPU:  # the interpreter runs rows in order: the last trash write stays
            last = torch.nonzero(rows == trash).max()
            assert torch.equal(_bytes(pgot.data[trash]), _bytes(pgot.codec.encode(got[last:last + 1])[0]))
        if dtype == torch.float64:
            keep = ~(rows == trash) if trash_writes > 1 else slice(None)
            if kind == "plain" and pool_dtype == torch.float64:
                _close(pgot.data[rows][keep], pref.data[rows][keep], dtype)
            else:
                assert torch.equal(_bytes(pgot.data[rows][keep]), _bytes(pref.data[rows][keep]))
    return got, pgot


# --- (a) the window KV row: norm, RoPE, the window format, no store ---------------------------------------------------

@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", [None, "v4_fp8", "fp8_b32"])
def test_window_kv(fmt: str | None, dtype: torch.dtype, n: int) -> None:
    x, w, cos, sin = _inputs(n, D_KV, dtype, seed=1)
    _run(x, w, cos, sin, False, fmt)


# --- (b) the compressed entry: norm, RoPE, the entry format, stored in its codec --------------------------------------

ENTRY = [(None, "plain", torch.float32), (None, "plain", torch.bfloat16), ("v4_fp8", "v4_fp8", None),
         ("fp8_b32", "fp8_b32", None), ("nvfp4", "nvfp4", None)]
if not ON_GPU:
    ENTRY.append((None, "plain", torch.float64))


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,kind,pool_dtype", ENTRY)
def test_compressed_entry(fmt, kind, pool_dtype, dtype: torch.dtype, n: int) -> None:
    x, w, cos, sin = _inputs(n, D_KV, dtype, seed=2)
    _run(x, w, cos, sin, False, fmt, kind, pool_dtype or torch.float32, seed=2)


# --- (c) the index key: norm, RoPE, Hadamard (V4; not V4.1), MXFP4, stored --------------------------------------------

@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotate", [True, False])
@pytest.mark.parametrize("kind", ["plain", "mxfp4", "fp8_row"])
def test_index_key(kind: str, rotate: bool, dtype: torch.dtype, n: int) -> None:
    x, w, cos, sin = _inputs(n, D_IDX, dtype, seed=3)
    _run(x, w, cos, sin, rotate, "mxfp4", kind, dtype, seed=3)


# --- (d) the index query [N, H, 128]: RoPE, Hadamard, MXFP4, no norm --------------------------------------------------

@pytest.mark.parametrize("n", NS_HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotate,fmt", [(True, "mxfp4"), (True, None), (False, "mxfp4")])
def test_index_query(rotate: bool, fmt: str | None, dtype: torch.dtype, n: int) -> None:
    x, _, cos, sin = _inputs(n, D_IDX, dtype, seed=4, heads=HEADS)
    _run(x, None, cos, sin, rotate, fmt)


# --- (e) the norm alone ([N, D] rows and per-head [N, H, D]) ---------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,weight", [(None, torch.float32), (HEADS, torch.float32), (None, torch.bfloat16),
                                          (None, "x")])
def test_norm_only(heads: int | None, weight, dtype: torch.dtype) -> None:
    x, w, _, _ = _inputs(NS[-1] if heads is None else NS_HEADS[-1], D_KV, dtype, seed=5, heads=heads)
    _run(x, w.to(dtype if weight == "x" else weight), None, None, False, None)


# --- (f) the bare store (the window write) into every record format ----------------------------------------------------

STORE = [("plain", torch.float32, D_KV), ("plain", torch.bfloat16, D_KV), ("v4_fp8", None, D_KV),
         ("fp8_b32", None, D_KV), ("nvfp4", None, D_KV), ("mxfp4", None, D_IDX), ("fp8_row", None, D_IDX)]


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,pool_dtype,d", STORE)
def test_store_only(kind: str, pool_dtype, d: int, dtype: torch.dtype, n: int) -> None:
    x, _, _, _ = _inputs(n, d, dtype, seed=6)
    _run(x, None, None, None, False, None, kind, pool_dtype or torch.float32, seed=6)


# --- the rest: several writes to the trash row, several blocks per program, wide rotations, the entry point -----------

@pytest.mark.parametrize("fmt,kind,rotate,d", [("v4_fp8", "v4_fp8", False, D_KV), ("mxfp4", "fp8_row", True, D_IDX)])
def test_float16_rows(fmt: str, kind: str, rotate: bool, d: int) -> None:
    x, w, cos, sin = _inputs(NS[-1], d, torch.float16, seed=12)
    _run(x, w, cos, sin, rotate, fmt, kind, seed=12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_sent_to_the_trash_row(dtype: torch.dtype) -> None:
    x, w, cos, sin = _inputs(NS[-1], D_KV, dtype, seed=7)
    _run(x, w, cos, sin, False, "v4_fp8", "v4_fp8", seed=7, trash_writes=5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_programs_loop_over_blocks(dtype: torch.dtype) -> None:
    x, w, cos, sin = _inputs(45, D_IDX, dtype, seed=8)
    _run(x, w, cos, sin, True, "mxfp4", "mxfp4", seed=8, config=kernel.Config(rows=16, num_warps=4, programs=2))


@pytest.mark.parametrize("d", [256, 512])
def test_rotation_wider_than_one_hadamard_block(d: int) -> None:
    dtype = torch.float32 if ON_GPU else torch.float64
    x, w, cos, sin = _inputs(6, d, dtype, seed=9, heads=3)
    _run(x, w, cos, sin, True, "mxfp4")


def test_record_reencodes_the_simulated_values() -> None:
    """A group whose amax (225) rounds down to 224 * s is stored with scale s / 2, as encode(simulate(x)) is."""
    x = torch.zeros(2, D_IDX, dtype=torch.float32, device=DEVICE)
    x[:, 0], x[:, 1] = 225.0, 3.0
    _run(x, None, None, None, False, "fp8_b32", "fp8_b32", seed=10, trash_writes=0)
    pool = RowPool(Codec("fp8_b32", D_IDX), 3, DEVICE)
    rows = torch.tensor([2, 0], device=DEVICE)
    got = kernel.finish_rows(x, None, EPS, None, None, False, "fp8_b32", 0, pool, rows)
    assert got[:, 0].tolist() == [224.0, 224.0]
    assert pool.data[rows, D_IDX].tolist() == [126, 126]  # e8m0 of 2^-1, not the 2^0 that quantizing x gives


def test_entry_point_dispatches_to_the_kernel() -> None:
    x, w, cos, sin = _inputs(NS[-1], D_IDX, DTYPES[0], seed=11)
    got = ops_finish.finish_rows(x, w, EPS, cos, sin, True, "mxfp4", 0, backend=TRITON)
    assert torch.equal(got, kernel.finish_rows(x, w, EPS, cos, sin, True, "mxfp4", 0))


def test_empty_batch_and_supports() -> None:
    x = torch.zeros(0, D_KV, dtype=DTYPES[0], device=DEVICE)
    assert kernel.finish_rows(x, None, EPS, None, None, False, "v4_fp8", RD).shape == (0, D_KV)
    assert not kernel.supports(torch.zeros(4, 96, device=DEVICE), None)  # not a power of two
    assert not kernel.supports(torch.zeros(4, D_KV, device=DEVICE), "int4")
    assert not kernel.supports(torch.zeros(4, D_KV, dtype=torch.int32, device=DEVICE), None)
