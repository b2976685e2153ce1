"""The fused sparse-attention kernel (ops/kernels/attention.py) against ops.attention.attend_reference.

Each case builds real pools (cache.pool.RowPool with the record formats of cache/formats.py) holding encoded random
rows, a paged block table with holes and shuffled blocks, window addressing that mixes ring rows, fresh rows and
invisible slots, and CSA picks (with -1s) or dense HCA visibility. On the CPU the kernel runs under Triton's
interpreter at small shapes: float64 must match the reference to 1e-12 (the stored formats decode exactly), bf16
within its rounding. With V4SERVE_TEST_DEVICE=cuda the same cases run at V4's real shapes in bf16.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from v4serve.cache.formats import Codec
from v4serve.cache.pool import RowPool
from v4serve.ops import attention as attn
from v4serve.ops.indexer import Entries
from v4serve.ops.kernels import attention as kernel
from v4serve.ops.kernels import attention_stage
from v4serve.ops.rope import rope_cos_sin

ON_GPU = torch.cuda.is_available() and os.environ.get("V4SERVE_TEST_DEVICE", "").startswith("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

# (heads, head dim, rope dims, window): V4's real geometry on the GPU, a small one under the interpreter
SHAPE = (64, 512, 64, 128) if ON_GPU else (4, 128, 64, 16)


def _pool(kind: str, dtype: torch.dtype, rows: int, g: torch.Generator) -> RowPool:
    H, D, RD, W = SHAPE
    codec = Codec(kind, D, RD, dtype if kind == "plain" else torch.float32)
    pool = RowPool(codec, rows, DEVICE)
    vals = torch.randn(rows + 1, D, generator=g, dtype=torch.float64) * 2
    pool.data[:] = codec.encode(vals.to(DEVICE, torch.float32 if kind != "plain" else dtype))
    return pool


def _case(wkind: str, ckind: str | None, mode: str, dtype: torch.dtype, seed: int, rows_tokens=(3, (1, 4, 1))):
    """A step of R rows with the given tokens per row; mode: 'picks' (CSA), 'dense' (HCA) or 'none'."""
    H, D, RD, W = SHAPE
    g = torch.Generator().manual_seed(seed)
    R, per_row = rows_tokens
    T = sum(per_row)
    token_row = torch.repeat_interleave(torch.arange(R), torch.tensor(per_row))
    wpool = _pool(wkind, dtype, R * W + 7, g)
    ring_rows = torch.randperm(R * W + 7, generator=g)[: R * W]
    src = torch.randint(0, R * W + T, (T, W), generator=g)
    valid = torch.rand(T, W, generator=g) < 0.8
    valid[0] = False  # a token that sees no window row
    q = torch.randn(T, H, D, generator=g, dtype=torch.float64)
    fresh = torch.randn(T, D, generator=g, dtype=torch.float64)
    sink = torch.randn(H, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 5000, (T,), generator=g)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, RD, 2, dtype=torch.float32) / RD))
    cos, sin = rope_cos_sin(pos, freqs)
    entries = None
    if mode != "none":
        ratio, block_size, nblocks = 4, 32, 12
        epb = block_size // ratio
        cpool = _pool(ckind, dtype, nblocks * epb + epb - 1, g)
        bt = torch.stack([torch.randperm(nblocks, generator=g)[:6] for _ in range(R)])
        bt[:, 4:] = -1  # unallocated tail: 4 blocks = 32 entries per row are real
        bt[R - 1, 1] = -1  # a hole
        if mode == "picks":
            picks = torch.randint(0, 32, (T, 20), generator=g)
            picks[torch.rand(T, 20, generator=g) < 0.3] = -1
            picks[-1] = -1  # an empty selection
            visible = None
        else:
            picks = None
            visible = torch.randint(0, 33, (T,), generator=g)
            visible[0] = 0
        if visible is None:  # CSA: the picks say what is read
            visible = torch.full((T,), 32)
        where = Entries(bt.to(DEVICE), token_row.to(DEVICE), visible.to(DEVICE), ratio, block_size, nblocks, 40)
        entries = attn.EntryRefs(cpool, where, picks.to(DEVICE) if picks is not None else None)
    window = attn.WindowRefs(wpool, src.to(DEVICE), valid.to(DEVICE), ring_rows.to(DEVICE))
    d = dict(device=DEVICE)
    return (q.to(dtype=dtype, **d), cos.to(DEVICE), sin.to(DEVICE), fresh.to(dtype=dtype, **d),
            sink.to(torch.float32).to(DEVICE), D ** -0.5, window, entries)


def _run(args, q_norm_eps, cfg=None):
    q, cos, sin, fresh, sink, scale, window, entries = args
    ref = attn.attend_reference(q, cos, sin, fresh, sink, scale, q_norm_eps, window, entries)
    got = kernel.attend(q, cos, sin, fresh, sink, scale, q_norm_eps, window, entries, config=cfg)
    return got, ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


EXACT = torch.bfloat16 if ON_GPU else torch.float64
TOL = 2e-2 if ON_GPU else 1e-12
FORMATS = [("plain", "plain"), ("v4_fp8", "v4_fp8"), ("fp8_b32", "nvfp4"), ("fp8_b32", "fp8_b32")]
# The "flash" mode (split-KV flash decoding, one program covering every head): all heads in one program, two KV
# splits (the last-arriver combine), QK^T over two D chunks then the full-width re-decode for P.V
_D = SHAPE[1]
FLASH = kernel.Config(64 if ON_GPU else 16, 16, 1, 8 if ON_GPU else 1, 1, 2, mode="flash", dchunk=_D // 2)
CONFIGS = pytest.mark.parametrize("cfg", [None, FLASH], ids=["default", "flash"])


@CONFIGS
@pytest.mark.parametrize("wkind,ckind", FORMATS)
@pytest.mark.parametrize("mode", ["picks", "dense"])
def test_kernel_equals_reference_on_every_format(wkind: str, ckind: str, mode: str, cfg) -> None:
    args = _case(wkind, ckind, mode, EXACT, seed=hash((wkind, ckind, mode)) % 1000)
    got, ref = _run(args, None, cfg)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert _rel(got, ref) < TOL


@CONFIGS
@pytest.mark.parametrize("q_norm", [None, 1e-6])
def test_window_only_layers_and_the_query_norm(q_norm: float | None, cfg) -> None:
    got, ref = _run(_case("plain", None, "none", EXACT, seed=5), q_norm, cfg)
    assert _rel(got, ref) < TOL


@CONFIGS
def test_bf16_within_its_rounding(cfg) -> None:
    got, ref = _run(_case("v4_fp8", "v4_fp8", "picks", torch.bfloat16, seed=7), 1e-6, cfg)
    assert _rel(got, ref) < 2e-2


@CONFIGS
def test_float32(cfg) -> None:
    got, ref = _run(_case("fp8_b32", "nvfp4", "dense", torch.float32, seed=8), None, cfg)
    assert _rel(got, ref) < (2e-2 if ON_GPU else 1e-5)


@CONFIGS
def test_a_token_that_sees_nothing_gets_zeros(cfg) -> None:
    """Only the sink in the denominator: the output is exactly zero (no NaN from an empty softmax)."""
    q, cos, sin, fresh, sink, scale, window, entries = _case("plain", "plain", "picks", EXACT, seed=9)
    window.valid[:] = False
    entries.picks[:] = -1
    got = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg)
    assert torch.equal(got, torch.zeros_like(got))


@CONFIGS
def test_work_does_not_depend_on_the_dense_width(cfg) -> None:
    """HCA: the kernel loops to each token's visible count; the reference's static width only pads."""
    args = _case("plain", "plain", "dense", EXACT, seed=10)
    got = kernel.attend(*args[:6], None, *args[6:], config=cfg)
    args[7].where = dataclasses.replace(args[7].where, max_entries=400)
    again = kernel.attend(*args[:6], None, *args[6:], config=cfg)
    assert torch.equal(got, again)
    ref = attn.attend_reference(*args[:6], None, *args[6:])
    assert _rel(got, ref) < TOL


def test_entry_point_dispatches_by_backend() -> None:
    args = _case("plain", "plain", "picks", EXACT, seed=11)
    q, cos, sin, fresh, sink, scale, window, entries = args
    a = attn.attend(q, cos, sin, fresh, sink, scale, None, window, entries, backend="triton")
    b = attn.attend(q, cos, sin, fresh, sink, scale, None, window, entries, backend="reference")
    assert _rel(a, b) < TOL


@pytest.mark.parametrize("cfg", [kernel.Config(16, 16, 1, 1, 1, 1), kernel.Config(16, 32, 2, 1, 1, 1),
                                 kernel.Config(32, 16, 2, 1, 1, 3), kernel.Config(16, 16, 2, 1, 1, 5),
                                 kernel.V41_DECODE_CONFIG, kernel.SINGLE_PICKS_CONFIG])
def test_tile_configs_agree(cfg: kernel.Config) -> None:
    """One D chunk or several, other row tiles and head blocks, a token's rows in one program or split over several
    (partials combined by the last to arrive, some splits empty): the same attention."""
    q, cos, sin, fresh, sink, scale, window, entries = _case("v4_fp8", "v4_fp8", "picks", EXACT, seed=12)
    got = kernel.attend(q, cos, sin, fresh, sink, scale, 1e-6, window, entries, config=cfg)
    ref = attn.attend_reference(q, cos, sin, fresh, sink, scale, 1e-6, window, entries)
    assert _rel(got, ref) < TOL


# flash mode: (heads per program, rows per tile, kv splits, D chunk). On the CPU the interpreter takes tiles below
# tl.dot's GPU minimum: 4-row tiles give the window 4 tiles and the selection 5-8 (every stage of the address
# pipeline, up to three tiles ahead, carries real rows), 2-head blocks exercise head blocks (combine slots per
# (token, head block); the interpreter runs programs one after another, so it cannot show a slot collision).
FLASH_CONFIGS = ([(64, 16, 1, 0), (64, 32, 3, 128), (32, 16, 5, 0), (16, 64, 2, 256)] if ON_GPU else
                 [(16, 16, 1, 0), (2, 4, 1, 0), (4, 8, 7, 32), (2, 4, 3, 64)])


@pytest.mark.parametrize("heads,rows,splits,dchunk", FLASH_CONFIGS)
@pytest.mark.parametrize("mode,tokens", [("picks", (3, (1, 4, 1))), ("dense", (2, (1, 9)))])
def test_flash_configs_agree(heads: int, rows: int, splits: int, dchunk: int, mode: str, tokens) -> None:
    """Flash mode over head blocks, row tiles (deep address pipelines), KV splits (some empty: every split's partial
    combined by the last to arrive) and D chunks, for decode rows and a short prefill: the same attention."""
    cfg = kernel.Config(heads, rows, 1, 8 if ON_GPU else 1, 1, splits, mode="flash", dchunk=dchunk)
    args = _case("v4_fp8", "v4_fp8", mode, EXACT, seed=13, rows_tokens=tokens)
    got, ref = _run(args, 1e-6, cfg)
    assert _rel(got, ref) < TOL


@pytest.mark.parametrize("cfg", [kernel.Config(16, 16, 1, 1, 1, 0, mode="flash"),
                                 kernel.Config(16, 16, 1, 1, 1, 0, mode="flash", dchunk=64)],
                         ids=["auto", "auto-chunked"])
def test_flash_mode_reads_each_token_rows_in_one_launch(cfg) -> None:
    """kv_splits 0 picks the splits from the grid (1 here: few rows per token)."""
    got, ref = _run(_case("fp8_b32", "nvfp4", "picks", EXACT, seed=14), None, cfg)
    assert _rel(got, ref) < TOL


def test_single_picks_switch(monkeypatch) -> None:
    """V4SERVE_ATTN_SINGLE=0 gives a single row over staged picks GPU_CONFIG again (the A/B switch)."""
    from types import SimpleNamespace as NS

    window = NS(pool=NS(codec=NS(kind="plain")))
    staged = NS(pool=attention_stage.StagedPool(torch.zeros(1, 1)), picks=torch.zeros(1))
    assert kernel.gpu_config(1, window, staged) is kernel.SINGLE_PICKS_CONFIG
    monkeypatch.setenv(kernel.SINGLE_ENV, "0")
    assert kernel.gpu_config(1, window, staged) is kernel.GPU_CONFIG


def test_gpu_config_takes_flash_mode_where_it_was_timed() -> None:
    """Batched decode (16-128 query tokens) over CSA picks in V4's records or bf16, and over HCA's visible entries in
    bf16, takes flash mode; prefill chunks take the prefill config in every format (window-only layers too); single
    rows, window-only decode rows and the untimed decode cases keep GPU_CONFIG."""
    from types import SimpleNamespace as NS

    def refs(kind: str, wkind: str | None = None, picks: bool = True):
        window = NS(pool=NS(codec=NS(kind=wkind or kind)))
        return window, NS(pool=NS(codec=NS(kind=kind)), picks=torch.zeros(1) if picks else None)

    flash, heads = kernel.FLASH_DECODE_CONFIG, kernel.GPU_CONFIG
    assert kernel.gpu_config(32, *refs("plain")) is flash and kernel.gpu_config(32, *refs("v4_fp8")) is flash
    assert kernel.gpu_config(64, *refs("plain", picks=False)) is flash  # HCA over bf16 records
    assert kernel.gpu_config(64, *refs("v4_fp8", picks=False)) is heads  # HCA over V4's records: not timed
    assert kernel.gpu_config(32, *refs("nvfp4", "fp8_b32")) is kernel.V41_DECODE_CONFIG  # V4.1's formats
    assert kernel.gpu_config(1, *refs("nvfp4", "fp8_b32")) is heads
    assert kernel.gpu_config(1, *refs("plain")) is heads and kernel.gpu_config(15, *refs("plain")) is heads
    prefill = kernel.FLASH_PREFILL_CONFIG  # prefill over bf16 records: CSA and HCA
    assert kernel.gpu_config(4096, *refs("plain")) is prefill
    assert kernel.gpu_config(129, *refs("plain", picks=False)) is prefill
    assert kernel.gpu_config(4096, *refs("v4_fp8")) is prefill  # prefill over V4's records
    assert kernel.gpu_config(2048, *refs("nvfp4", "fp8_b32")) is prefill  # and V4.1's
    assert kernel.gpu_config(129, *refs("nvfp4", "fp8_b32", picks=False)) is prefill
    assert kernel.gpu_config(32, refs("plain")[0], None) is heads  # window-only layers' decode rows
    staged = NS(pool=attention_stage.StagedPool(torch.zeros(1, 1)), picks=torch.zeros(1))
    assert kernel.gpu_config(1, refs("plain")[0], staged) is kernel.SINGLE_PICKS_CONFIG  # a row over staged picks
    assert kernel.gpu_config(2, refs("plain")[0], staged) is heads
    assert kernel.gpu_config(4096, refs("plain")[0], None) is prefill  # and their prompt chunks


def test_batched_decode_switch(monkeypatch) -> None:
    """V4SERVE_ATTN_BATCHED=heads gives batched decode over plain picks (staged V4.1 records, bf16 ones) GPU_CONFIG
    instead of flash mode; HCA's dense entries, stored formats and single rows are left alone."""
    from types import SimpleNamespace as NS

    window = NS(pool=NS(codec=NS(kind="plain")))
    staged = NS(pool=attention_stage.StagedPool(torch.zeros(1, 1)), picks=torch.zeros(1))
    dense = NS(pool=attention_stage.StagedPool(torch.zeros(1, 1)), picks=None)
    v4 = NS(pool=NS(codec=NS(kind="v4_fp8")), picks=torch.zeros(1))
    assert kernel.gpu_config(32, window, staged) is kernel.FLASH_DECODE_CONFIG
    monkeypatch.setenv(kernel.BATCHED_ENV, "heads")
    assert kernel.gpu_config(32, window, staged) is kernel.GPU_CONFIG
    assert kernel.gpu_config(128, window, staged) is kernel.GPU_CONFIG
    assert kernel.gpu_config(32, window, dense) is kernel.FLASH_DECODE_CONFIG
    assert kernel.gpu_config(32, NS(pool=NS(codec=NS(kind="v4_fp8"))), v4) is kernel.FLASH_DECODE_CONFIG
    assert kernel.gpu_config(1, window, staged) is kernel.SINGLE_PICKS_CONFIG


def test_prefill_config_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """$V4SERVE_ATTN_PREFILL (A/B runs) names the prefill chunks' flash config; decode rows keep theirs; a malformed
    value is an error that says the form."""
    window, entries = _case("plain", "plain", "picks", EXACT, seed=16)[6:]
    monkeypatch.setenv(kernel.PREFILL_ENV, "64,32,8,1,1")
    cfg = kernel.gpu_config(4096, window, entries)
    assert (cfg.heads, cfg.rows, cfg.num_warps, cfg.prefetch, cfg.dsplit, cfg.mode) == (64, 32, 8, 1, 2, "flash")
    assert kernel.gpu_config(32, window, entries) is kernel.FLASH_DECODE_CONFIG
    monkeypatch.setenv(kernel.PREFILL_ENV, "16,32,4")
    assert kernel.gpu_config(4096, window, entries).dsplit == 1
    monkeypatch.setenv(kernel.PREFILL_ENV, "twopass,64,8,128")
    cfg = kernel.gpu_config(4096, window, entries)
    assert (cfg.mode, cfg.rows, cfg.num_warps, cfg.dchunk) == ("twopass", 64, 8, 128)
    for bad in ("64,32", "64,x,8", "48,32,8", "64,32,8,1,1,1", "twopass,64,8", "twopass,48,8,128"):
        monkeypatch.setenv(kernel.PREFILL_ENV, bad)
        with pytest.raises(ValueError, match="V4SERVE_ATTN_PREFILL"):
            kernel.gpu_config(4096, window, entries)
    monkeypatch.delenv(kernel.PREFILL_ENV)
    assert kernel.gpu_config(4096, window, entries) is kernel.FLASH_PREFILL_CONFIG


def test_computed_split_counts_are_powers_of_two() -> None:
    # NSPLIT is a constexpr: a count per token count was a kernel variant per step size, compiled while serving
    counts = {kernel._kv_splits(kernel.GPU_CONFIG, programs, rows) for programs in range(1, 300)
              for rows in (64, 640, 4096)}
    counts |= {kernel._flash_splits(kernel.FLASH_DECODE_CONFIG, tokens, 1, rows) for tokens in range(1, 200)
               for rows in (64, 640, 4096)}
    assert counts <= {1, 2, 4, 8, 16} and len(counts) >= 4, counts
    explicit = dataclasses.replace(kernel.GPU_CONFIG, kv_splits=3)
    assert kernel._kv_splits(explicit, 8, 4096) == 3  # an explicit count is taken as given


@pytest.mark.parametrize("chunks", [2, 4])
@pytest.mark.parametrize("wkind,ckind,mode", [("plain", "plain", "picks"), ("plain", "plain", "dense"),
                                              ("v4_fp8", "v4_fp8", "picks"), ("fp8_b32", "nvfp4", "dense")])
def test_flash_output_halves_equal_the_whole(chunks: int, wkind: str, ckind: str, mode: str) -> None:
    """dsplit = 2 in flash mode: two programs per token, each keeping one half of D for P.V over the same scores (QK^T
    in the same chunk order). Bit for bit the one-program result, and the reference's within the tolerance."""
    heads, rows = (64, 16) if ON_GPU else (4, 4)
    whole = kernel.Config(heads, rows, 1, 8 if ON_GPU else 1, 1, 1, mode="flash", dchunk=_D // chunks)
    halves = dataclasses.replace(whole, dsplit=2, kv_splits=0)
    args = _case(wkind, ckind, mode, EXACT, seed=15 + chunks, rows_tokens=(3, (1, 4, 1)))
    got, ref = _run(args, 1e-6, halves)
    one, _ = _run(args, 1e-6, whole)
    assert torch.equal(got, one)
    assert _rel(got, ref) < TOL


# twopass mode (attention_twopass.py): row tiles that divide the window (16 on the CPU), P.V's output in D chunks
TWOPASS = [(16, 128), (64, 256)] if ON_GPU else [(4, 32), (8, 64), (16, 128)]


@pytest.mark.parametrize("rows,dchunk", TWOPASS)
@pytest.mark.parametrize("wkind,ckind,mode", [("plain", "plain", "picks"), ("plain", "plain", "dense"),
                                              ("v4_fp8", "v4_fp8", "picks"), ("fp8_b32", "nvfp4", "dense"),
                                              ("plain", None, "none")])
def test_twopass_equals_reference(rows: int, dchunk: int, wkind: str, ckind: str | None, mode: str) -> None:
    """Scores, softmax and P.V as three launches over every format, CSA picks, HCA's per-token visible counts and
    window-only layers, with the query norm: the reference's attention."""
    cfg = kernel.Config(64 if ON_GPU else 4, rows, 1, 4, 1, mode="twopass", dchunk=dchunk)
    args = _case(wkind, ckind, mode, EXACT, seed=20 + rows, rows_tokens=(3, (1, 4, 1)))
    got, ref = _run(args, 1e-6, cfg)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert _rel(got, ref) < TOL


def test_twopass_token_that_sees_nothing_and_scratch_bounded_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the sink in the denominator: zeros. A scratch budget of one token a launch: the same bits as one launch."""
    cfg = kernel.Config(4, 16 if ON_GPU else 8, 1, 4, 1, mode="twopass", dchunk=64)  # tensor-core dots: K >= 16
    q, cos, sin, fresh, sink, scale, window, entries = _case("plain", "plain", "picks", EXACT, seed=21)
    whole = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg)
    from v4serve.ops.kernels import attention_twopass

    monkeypatch.setattr(attention_twopass, "SCRATCH_BYTES", 1)
    assert torch.equal(kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg), whole)
    window.valid[:] = False
    entries.picks[:] = -1
    got = kernel.attend(q, cos, sin, fresh, sink, scale, None, window, entries, config=cfg)
    assert torch.equal(got, torch.zeros_like(got))
